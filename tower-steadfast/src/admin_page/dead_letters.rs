//! One dead-letter store as the page sees it: a summary, one entry, replay
//! and purge, behind one object-safe trait so the router holds stores of
//! any type.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::Full;
use serde_json::{json, Value};
use tower_classify::{BoxError, HttpClassifier};
use tower_poison::replay::{http_request, ReplayOutcome, Replayer};
use tower_poison::store::{DeadLetterStore, ListQuery, StoreError};
use tower_poison::{DeadLetterEntry, EntryId, HttpCapture};
use tower_service::Service;

/// Entries read per store page while summarising.
const SCAN_PAGE: usize = 500;
/// Entries a summary reads at most: past this, per-label depths are
/// reported as partial and the newest entries are the newest of those read.
pub(crate) const SCAN_LIMIT: usize = 10_000;
/// The most entries one summary lists.
pub(crate) const MAX_NEWEST: usize = 50;
/// The most body bytes one entry shows.
const MAX_BODY_SHOWN: usize = 16 * 1024;
/// The most entries one purge of a label removes.
const MAX_PURGE: usize = 10_000;

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A store and where its entries are replayed to.
pub(crate) trait DeadLetters: Send + Sync {
    /// Depth, depth per label and the newest `newest` entries (of `label`
    /// when given).
    fn summary(
        &self,
        label: Option<String>,
        newest: usize,
    ) -> BoxFuture<'_, Result<Value, StoreError>>;
    /// One entry, as stored; `None` when there is none.
    fn show(&self, id: EntryId) -> BoxFuture<'_, Result<Option<Value>, StoreError>>;
    /// Sends one entry again; what happened.
    fn replay(&self, id: EntryId) -> BoxFuture<'_, Result<Value, BoxError>>;
    /// Removes one entry; `true` when there was one.
    fn remove(&self, id: EntryId) -> BoxFuture<'_, Result<bool, StoreError>>;
    /// Removes the entries of `label` (at most [`MAX_PURGE`]); how many.
    fn purge_label(&self, label: String) -> BoxFuture<'_, Result<u64, StoreError>>;
}

pub(crate) struct StoreAndTarget<St, S> {
    pub(crate) store: St,
    pub(crate) service: S,
    pub(crate) destination: Uri,
}

/// `time` in milliseconds since the Unix epoch, as the page shows times.
pub(crate) fn millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

/// The fields a listing shows; the error as its stored chain, joined.
fn summary_json(entry: &DeadLetterEntry) -> Value {
    json!({
        "id": entry.id.to_string(),
        "label": entry.label,
        "kind": entry.kind.as_str(),
        "attempts": entry.attempts,
        "method": entry.method,
        "uri": entry.uri,
        "error": entry.error.join(": "),
        "first_failed_at_ms": millis(entry.first_failed_at),
        "last_failed_at_ms": millis(entry.last_failed_at),
        "failed_replays": entry.failed_replays,
    })
}

/// Everything the store keeps, as stored (headers already redacted by the
/// layer); the body as text, cut to [`MAX_BODY_SHOWN`] bytes.
fn entry_json(entry: &DeadLetterEntry) -> Value {
    let shown = &entry.body[..entry.body.len().min(MAX_BODY_SHOWN)];
    let mut value = summary_json(entry);
    let extra = json!({
        "message_id": entry.message_id,
        "headers": entry.headers.iter().map(|h| [h.name.as_str(), h.value.as_str()]).collect::<Vec<_>>(),
        "body": String::from_utf8_lossy(shown),
        "body_shown_bytes": shown.len(),
        "body_bytes": entry.body.len(),
        "body_truncated": entry.body_truncated,
        "error_chain": entry.error,
        "replays": entry.replays.iter().map(|r| json!({
            "at_ms": millis(r.at),
            "attempt": r.attempt,
            "kind": r.kind.as_str(),
            "status": r.status,
            "error": r.error.join(": "),
        })).collect::<Vec<_>>(),
    });
    if let (Value::Object(base), Value::Object(extra)) = (&mut value, extra) {
        base.extend(extra);
    }
    value
}

fn outcome_json(outcome: ReplayOutcome) -> Value {
    match outcome {
        ReplayOutcome::Delivered => json!({"outcome": "delivered"}),
        ReplayOutcome::Failed {
            attempts,
            kind,
            error,
        } => {
            json!({"outcome": "failed", "attempts": attempts, "kind": kind.as_str(), "error": error})
        }
        ReplayOutcome::Gone { kind, error } => {
            json!({"outcome": "gone", "kind": kind.as_str(), "error": error})
        }
        ReplayOutcome::NotFound => json!({"outcome": "not_found"}),
        ReplayOutcome::InProgress { until } => {
            json!({"outcome": "in_progress", "until_ms": millis(until)})
        }
        // `ReplayOutcome` is non-exhaustive: a new outcome is reported by
        // its debug name rather than hidden.
        other => json!({"outcome": format!("{other:?}")}),
    }
}

impl<St, S, B> DeadLetters for StoreAndTarget<St, S>
where
    St: DeadLetterStore,
    S: Service<Request<Full<Bytes>>, Response = Response<B>> + Clone + Send + Sync + 'static,
    S::Future: Send,
    S::Error: Into<BoxError> + Send,
    B: Send + 'static,
{
    fn summary(
        &self,
        label: Option<String>,
        newest: usize,
    ) -> BoxFuture<'_, Result<Value, StoreError>> {
        Box::pin(async move {
            let depth = self.store.depth().await?;
            let mut by_label: BTreeMap<String, u64> = BTreeMap::new();
            let mut kept: VecDeque<DeadLetterEntry> = VecDeque::with_capacity(newest + 1);
            let mut scanned = 0;
            let mut query = ListQuery {
                limit: SCAN_PAGE,
                ..ListQuery::default()
            };
            let complete = loop {
                let page = self.store.list(query.clone()).await?;
                for entry in page.entries {
                    scanned += 1;
                    *by_label.entry(entry.label.clone()).or_default() += 1;
                    if label.as_ref().is_none_or(|label| *label == entry.label) {
                        // Ids grow with time: the last ones read are the newest.
                        kept.push_back(entry);
                        if kept.len() > newest {
                            kept.pop_front();
                        }
                    }
                }
                match page.next {
                    Some(_) if scanned >= SCAN_LIMIT => break false,
                    Some(next) => query.after = Some(next),
                    None => break true,
                }
            };
            Ok(json!({
                "depth": depth,
                "by_label": by_label,
                "by_label_complete": complete,
                "scanned": scanned,
                "newest": kept.iter().rev().map(summary_json).collect::<Vec<_>>(),
            }))
        })
    }

    fn show(&self, id: EntryId) -> BoxFuture<'_, Result<Option<Value>, StoreError>> {
        Box::pin(async move { Ok(self.store.get(id).await?.as_ref().map(entry_json)) })
    }

    fn replay(&self, id: EntryId) -> BoxFuture<'_, Result<Value, BoxError>> {
        Box::pin(async move {
            let mut service = self.service.clone();
            let outcome = Replayer::new(&self.store)
                .describe(HttpCapture::default())
                .replay(id, &mut service, &HttpClassifier::new(), |entry| {
                    http_request(entry, &self.destination, &[])
                })
                .await?;
            Ok(outcome_json(outcome))
        })
    }

    fn remove(&self, id: EntryId) -> BoxFuture<'_, Result<bool, StoreError>> {
        Box::pin(self.store.remove(id))
    }

    fn purge_label(&self, label: String) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let mut removed = 0;
            let query = ListQuery {
                label: Some(label),
                limit: SCAN_PAGE,
                ..ListQuery::default()
            };
            // Each page starts again from the first entry left: the ones
            // before were removed.
            while (removed as usize) < MAX_PURGE {
                let page = self.store.list(query.clone()).await?;
                if page.entries.is_empty() {
                    break;
                }
                let before = removed;
                for entry in page.entries {
                    if self.store.remove(entry.id).await? {
                        removed += 1;
                    }
                }
                if removed == before {
                    // Listed yet not removable: another purge won the race.
                    break;
                }
            }
            Ok(removed)
        })
    }
}
