//! Sending dead-letter entries through a service again.
//!
//! [`Replayer::replay`] sends one entry: when the service succeeds (as the
//! classifier sees it) the entry is removed; when it fails the entry stays, with its
//! attempt count, last failure time, error and kind updated. [`http_request`]
//! turns an HTTP entry back into a request for a given destination; the
//! `tower-poison replay` command uses both.
//!
//! # Delivered once
//!
//! Two operators, or two machines, replaying one entry must not send it
//! twice. A replay first *claims* the entry ([`DeadLetterStore::claim`]) for
//! a lease ([`Replayer::lease`], five minutes by default); a replay of a
//! claimed entry sends nothing and answers [`ReplayOutcome::InProgress`]. A
//! success removes the entry, and so its claim; a failure updates the entry,
//! then releases the claim with its [`ClaimToken`](crate::store::ClaimToken),
//! so a replay whose lease ran out mid-call cannot end the claim of the one
//! that took over, and a layer recording the failure in the service does not
//! free the entry for another replayer.
//!
//! A replayer that crashes after sending leaves the entry claimed until the
//! lease ends, and a later replay sends it again. So [`http_request`] sends
//! an `Idempotency-Key`, when the request had none, of the entry id and the
//! number of replays a server answered with a 5xx of its own (`<id>-<n>`): a
//! server that honours keys answers a second delivery from the first. Once a
//! replay got no answer from the server itself (a timeout, a lost
//! connection, a gateway's 502 or 504) the key never moves again
//! ([`replay_key_pinned`](crate::DeadLetterEntry::replay_key_pinned)), nor
//! after a claim that lapsed unreleased
//! ([`Claim::Claimed`]`{ previous_claim_lapsed: true, .. }`): the replay pins
//! the key before it sends, and when it cannot record the pin (the request
//! cannot be built, the update fails) it lets its own claim lapse, so the
//! next replay is told again.
//!
//! # A replay that fails again
//!
//! [`http_request`] also marks the request with [`REPLAY_HEADER`] (the entry
//! id). A [`DeadLetter`](crate::DeadLetter) layer whose store holds that
//! entry under the same label, *for the same request* (method, path and
//! query, body), adds a failure of the call to the entry's history instead of
//! storing a second entry. Anything else carrying a copied mark is stored as
//! a new entry: the mark can neither hide a failure nor rewrite an entry's
//! request, so ids need not be secret.
//!
//! # Replay history
//!
//! A failed replay never overwrites the original failure's
//! [`error`](crate::DeadLetterEntry::error), [`kind`](crate::DeadLetterEntry::kind)
//! and [`first_failed_at`](crate::DeadLetterEntry::first_failed_at): it raises
//! [`attempts`](crate::DeadLetterEntry::attempts) (by one for a [`Replayer`])
//! and adds a [`ReplayRecord`] to the entry's bounded
//! [`replays`](crate::DeadLetterEntry::replays), which the CLI's `show` prints.

use std::fmt;
use std::future::poll_fn;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONNECTION, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{Method, Request, Uri};
use http_body_util::Full;
use tower_classify::{BoxError, Classify, FailureKind, Outcome};
use tower_service::Service;

use crate::capture::DescribeResponse;
use crate::entry::{error_chain, DeadLetterEntry, EntryId, ReplayAnswer, ReplayRecord};
use crate::redact::REDACTED;
use crate::store::{Claim, DeadLetterStore, StoreError};

/// The header that marks a request as the replay of a dead-letter entry; its
/// value is the entry id.
///
/// [`http_request`] sets it, and a [`DeadLetter`](crate::DeadLetter) layer
/// that sees it adds a failure to that entry instead of storing a new one.
pub const REPLAY_HEADER: &str = "dead-letter-replay";

/// How long a replay holds an entry before another replay may send it, when
/// [`Replayer::lease`] does not say.
const DEFAULT_LEASE: Duration = Duration::from_secs(300);

/// What [`Replayer::replay`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplayOutcome {
    /// The service succeeded; the entry was removed.
    Delivered,
    /// The service failed again; the entry was kept, this failure added to
    /// its [replay history](crate::DeadLetterEntry::replays).
    Failed {
        /// The entry's attempt count now.
        attempts: u32,
        /// How the replay's failure was classified.
        kind: FailureKind,
        /// The replay's failure, in one line.
        error: String,
    },
    /// The service failed again, but the entry was removed while the
    /// replay ran (purged, or delivered by a replay that took over once this
    /// one's lease ran out): nothing was written back, so the removal
    /// stands.
    Gone {
        /// How the replay's failure was classified.
        kind: FailureKind,
        /// The replay's failure, in one line.
        error: String,
    },
    /// There is no entry with that id.
    NotFound,
    /// Another replay holds the entry until `until`; nothing was sent.
    InProgress {
        /// When the other replay's claim runs out.
        until: SystemTime,
    },
}

/// A replay could not be carried out (as opposed to a replayed call that
/// failed, which is [`ReplayOutcome::Failed`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum ReplayError {
    /// The store failed; the entry is unchanged.
    Store(StoreError),
    /// The entry cannot be turned into a request (a truncated body, an
    /// unreadable method or URI).
    Request(BoxError),
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayError::Store(_) => f.write_str("dead-letter store failed during replay"),
            ReplayError::Request(error) => write!(f, "entry cannot be replayed: {error}"),
        }
    }
}

impl std::error::Error for ReplayError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReplayError::Store(error) => Some(error),
            ReplayError::Request(error) => Some(&**error),
        }
    }
}

impl From<StoreError> for ReplayError {
    fn from(error: StoreError) -> Self {
        ReplayError::Store(error)
    }
}

/// Replays entries of one store: [`replay`](Self::replay) sends one entry,
/// claiming it first for a lease of five minutes, or
/// [another](Self::lease) (an example is on [`replay`](Self::replay)).
#[derive(Debug, Clone, Copy)]
pub struct Replayer<'a, St, D = ()> {
    store: &'a St,
    lease: Duration,
    describe: D,
}

/// The default way a [`Replayer`] records a failed response (`()`, no
/// description): by its classification alone (`replay response classified
/// as rate_limited`), since nothing is known about the response type.
/// [`HttpCapture`](crate::HttpCapture) records an HTTP response's status
/// line and code instead ([`Replayer::describe`]).
impl<Res> DescribeResponse<Res> for () {
    type Response = Res;

    fn hand_back(&self, response: Res, _open: Option<crate::OpenCall>) -> Res {
        response
    }

    fn describe_response(&self, _response: &Res) -> String {
        String::new()
    }
}

impl<'a, St: DeadLetterStore> Replayer<'a, St> {
    /// Replays entries of `store`, holding each for five minutes.
    ///
    /// Each replay that sends its entry is counted in
    /// `tower_poison_replayed_total` (see
    /// [`describe_metrics`](crate::describe_metrics)).
    pub fn new(store: &'a St) -> Self {
        crate::observability::describe_metrics();
        Replayer {
            store,
            lease: DEFAULT_LEASE,
            describe: (),
        }
    }
}

impl<'a, St: DeadLetterStore, D> Replayer<'a, St, D> {
    /// Holds each entry for `lease` while it is sent (default five
    /// minutes).
    ///
    /// Make it longer than the slowest call: when a call outlasts the lease,
    /// another replay may send the same entry meanwhile.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Describes a failed response with `describe` in the entry's
    /// [replay history](crate::ReplayRecord): for HTTP,
    /// [`HttpCapture`](crate::HttpCapture) records `HTTP 503 Service Unavailable` and the status
    /// code 503.
    pub fn describe<D2>(self, describe: D2) -> Replayer<'a, St, D2> {
        Replayer {
            store: self.store,
            lease: self.lease,
            describe,
        }
    }

    /// Sends entry `id` through `service` once, claiming it for the lease
    /// first.
    ///
    /// `to_request` builds the request from the entry (for HTTP,
    /// [`http_request`]); `classifier` decides whether the response is a
    /// success, exactly as in the layer. The service's errors are boxed
    /// before they are classified, so an
    /// [`HttpClassifier`](tower_classify::HttpClassifier) or
    /// [`ErrorChainClassifier`](tower_classify::ErrorChainClassifier) works
    /// as is.
    ///
    /// ```
    /// # tokio_test::block_on(async {
    /// use std::time::SystemTime;
    /// use tower_classify::{ErrorChainClassifier, FailureKind};
    /// use tower_poison::replay::{ReplayOutcome, Replayer};
    /// use tower_poison::store::{DeadLetterStore, MemoryStore};
    /// use tower_poison::DeadLetterEntry;
    ///
    /// let store = MemoryStore::new(100);
    /// let mut entry = DeadLetterEntry::new(
    ///     "jobs",
    ///     FailureKind::ServerError,
    ///     vec!["boom".into()],
    ///     SystemTime::now(),
    /// );
    /// entry.body = "payload".into();
    /// let id = entry.id;
    /// store.put(entry).await.unwrap();
    ///
    /// // The job handler works now: the entry is delivered and removed.
    /// let mut handler = tower::service_fn(|body: bytes::Bytes| async move {
    ///     Ok::<_, std::io::Error>(body.len())
    /// });
    /// let outcome = Replayer::new(&store)
    ///     .replay(id, &mut handler, &ErrorChainClassifier::new(), |entry| {
    ///         Ok(entry.body.clone())
    ///     })
    ///     .await
    ///     .unwrap();
    /// assert_eq!(outcome, ReplayOutcome::Delivered);
    /// assert_eq!(store.depth().await.unwrap(), 0);
    /// # });
    /// ```
    pub async fn replay<S, Req, C, F>(
        &self,
        id: EntryId,
        service: &mut S,
        classifier: &C,
        to_request: F,
    ) -> Result<ReplayOutcome, ReplayError>
    where
        S: Service<Req>,
        S::Error: Into<BoxError>,
        C: Classify<S::Response, BoxError>,
        D: DescribeResponse<S::Response>,
        F: FnOnce(&DeadLetterEntry) -> Result<Req, BoxError>,
    {
        let store = self.store;
        let (mut entry, token, previous_claim_lapsed) =
            match store.claim(id, SystemTime::now(), self.lease).await? {
                Claim::Claimed {
                    entry,
                    token,
                    previous_claim_lapsed,
                } => (entry, token, previous_claim_lapsed),
                Claim::Held { until } => return Ok(ReplayOutcome::InProgress { until }),
                Claim::NotFound => return Ok(ReplayOutcome::NotFound),
            };
        // The replayer before this one let its claim lapse unreleased: it
        // may have sent the entry and died before recording how that went,
        // so its send may have been applied. From now on the key stays the
        // one it sent, as after an answer that never came.
        let lapse_unrecorded = previous_claim_lapsed && !entry.replay_key_pinned;
        if previous_claim_lapsed {
            entry.note_replay_answer(ReplayAnswer::Unknown);
        }
        // A lapse the entry does not record yet is known only from this
        // claim: unless the entry was written with the pin, the claim is
        // left to lapse in turn, so that the next replay learns of it from
        // the store as this one did.
        let gives_back = |pin_written: bool| pin_written || !lapse_unrecorded;
        let request = match to_request(&entry) {
            Ok(request) => request,
            Err(error) => {
                if gives_back(false) {
                    store.release(id, token).await?;
                }
                return Err(ReplayError::Request(error));
            }
        };
        let ready = poll_fn(|cx| service.poll_ready(cx)).await;
        let sent = ready.is_ok();
        let result = match ready {
            Ok(()) => service.call(request).await.map_err(Into::into),
            Err(error) => Err(error.into()),
        };
        let failure = match classifier.classify(result.as_ref()) {
            Outcome::Failure(failure) => failure,
            Outcome::Success | Outcome::Ignored => {
                // Removing the entry ends every claim on it: it is
                // delivered, there is nothing left to replay.
                store.remove(id).await?;
                crate::observability::replayed(&entry.label, "delivered");
                return Ok(ReplayOutcome::Delivered);
            }
        };
        let (record, answer) = match &result {
            Err(error) => (
                ReplayRecord::new(SystemTime::now(), failure.kind, error_chain(&**error), None),
                match sent {
                    true => ReplayAnswer::new(false, None, failure.kind),
                    // The service was not ready: nothing left.
                    false => ReplayAnswer::Other,
                },
            ),
            Ok(response) => {
                let description = self.describe.describe_response(response);
                let line = if description.is_empty() {
                    format!("replay response classified as {}", failure.kind)
                } else {
                    description
                };
                let status = self.describe.status_code(response);
                (
                    ReplayRecord::new(SystemTime::now(), failure.kind, vec![line], status),
                    ReplayAnswer::new(true, status, failure.kind),
                )
            }
        };
        // The entry is read again before it is updated, for two reasons.
        match store.get(id).await? {
            // It was removed while the call ran (purged, or delivered by a
            // replay that took over after this one's lease ran out): `put`
            // would store it anew, undoing the purge or sending a delivered
            // entry again. (A removal between this read and the `put` is
            // not caught: the stores have no conditional update.)
            None => {
                store.release(id, token).await?;
                crate::observability::replayed(&entry.label, "gone");
                return Ok(ReplayOutcome::Gone {
                    kind: failure.kind,
                    error: record.error_text(),
                });
            }
            // A dead-letter layer in the service added this failure to the
            // entry already (it recognises the replay header); counting it
            // here as well would count it twice.
            Some(mut current) if current.attempts > entry.attempts => {
                // The layer knew nothing of a lapsed claim and may have
                // moved the key after a 5xx: the key this replay sent is
                // the one that stays.
                let mut pinned = Ok(());
                if lapse_unrecorded && !current.replay_key_pinned {
                    current.replay_server_errors = entry.replay_server_errors;
                    current.replay_key_pinned = true;
                    pinned = store.put(current.clone()).await;
                }
                if gives_back(pinned.is_ok()) {
                    store.release(id, token).await?;
                }
                pinned?;
                crate::observability::replayed(&entry.label, "failed");
                let (kind, error) = match current.replays.last() {
                    Some(last) => (last.kind, last.error_text()),
                    None => (failure.kind, current.error.join(": ")),
                };
                return Ok(ReplayOutcome::Failed {
                    attempts: current.attempts,
                    kind,
                    error,
                });
            }
            Some(_) => {}
        }
        let error = record.error_text();
        let label = entry.label.clone();
        entry.record_replay(record, 1);
        entry.note_replay_answer(answer);
        let outcome = ReplayOutcome::Failed {
            attempts: entry.attempts,
            kind: failure.kind,
            error,
        };
        // The update first, then the claim: released earlier, another
        // replay could send the entry before its new history (and so its
        // idempotency key, after a 5xx) is stored.
        let kept = store.put(entry).await;
        // Given back even when the update failed, so the entry does not
        // wait out the lease (unless the update was to record a lapsed
        // claim); the update's error is the one reported.
        let released = if gives_back(kept.is_ok()) {
            store.release(id, token).await
        } else {
            Ok(())
        };
        kept?;
        released?;
        crate::observability::replayed(&label, "failed");
        Ok(outcome)
    }
}

/// Rebuilds an HTTP entry as a request to `destination`.
///
/// The request keeps the entry's method, path and query, headers and body;
/// its scheme and authority come from `destination` (and a path there, other
/// than `/`, is put in front of the entry's path). Redacted headers are
/// *left out* rather than sent as `[redacted]`; add credentials with
/// `extra_headers`. `Host`, `Content-Length`, `Transfer-Encoding` and
/// `Connection` are left for the client to set.
///
/// The request carries [`REPLAY_HEADER`] with the entry id, and
/// `<entry id>-<n>` as its `Idempotency-Key` when the entry has none, `n`
/// being [`replay_server_errors`](DeadLetterEntry::replay_server_errors)
/// (the [module docs](self) say why).
///
/// An entry whose body was truncated is refused: sending part of a body would
/// be a different request. So is one whose URI or body had a secret redacted
/// (a query token, a presigned URL's signature, a JSON `password`): sending
/// the placeholder would be a different request too, and the secret is not
/// kept anywhere to send instead.
pub fn http_request(
    entry: &DeadLetterEntry,
    destination: &Uri,
    extra_headers: &[(HeaderName, HeaderValue)],
) -> Result<Request<Full<Bytes>>, BoxError> {
    if entry.body_truncated {
        return Err(format!(
            "entry {} has a truncated body ({} bytes kept)",
            entry.id,
            entry.body.len()
        )
        .into());
    }
    let redacted = |text: &[u8]| {
        text.windows(REDACTED.len())
            .any(|w| w == REDACTED.as_bytes())
    };
    if redacted(entry.uri.as_deref().unwrap_or("").as_bytes()) || redacted(&entry.body) {
        return Err(format!(
            "entry {} had a secret redacted from its URI or body; it cannot be sent as it was",
            entry.id
        )
        .into());
    }
    let method = match &entry.method {
        Some(method) => Method::from_bytes(method.as_bytes())?,
        None => Method::POST,
    };
    let original: Uri = entry.uri.as_deref().unwrap_or("/").parse()?;
    let path_and_query = original.path_and_query().map_or("/", |pq| pq.as_str());
    let prefix = destination.path().trim_end_matches('/');
    let mut parts = destination.clone().into_parts();
    parts.path_and_query = Some(format!("{prefix}{path_and_query}").parse()?);
    let uri = Uri::from_parts(parts)?;

    let replay_header = HeaderName::from_static(REPLAY_HEADER);
    let idempotency_key = HeaderName::from_static("idempotency-key");
    let entry_id = HeaderValue::try_from(entry.id.to_string())?;
    let mut builder = Request::builder().method(method).uri(uri);
    let mut has_key = false;
    let left_to_client = [HOST, CONTENT_LENGTH, TRANSFER_ENCODING, CONNECTION];
    for header in entry.headers.iter().filter(|h| h.value != REDACTED) {
        let name = HeaderName::from_bytes(header.name.as_bytes())?;
        if left_to_client.contains(&name) || name == replay_header {
            continue;
        }
        has_key |= name == idempotency_key;
        builder = builder.header(name, HeaderValue::from_str(&header.value)?);
    }
    for (name, value) in extra_headers {
        has_key |= name == idempotency_key;
        builder = builder.header(name, value);
    }
    if !has_key {
        let key = HeaderValue::try_from(format!("{}-{}", entry.id, entry.replay_server_errors))?;
        builder = builder.header(idempotency_key, key);
    }
    builder = builder.header(replay_header, entry_id);
    Ok(builder.body(Full::new(entry.body.clone()))?)
}
