use std::fmt;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use tower_classify::{BoxError, Classify, Failure, FailureKind, LogLimit, Outcome};
use tower_service::Service;

use crate::action::Action;
use crate::attempts::Attempts;
use crate::capture::{
    BodyRecording, CaptureRequest, DescribeResponse, PendingRecord, RequestRecord, BODY_WAIT,
};
use crate::counts::DynFailureCountStore;
use crate::entry::{clip_chain, error_chain, DeadLetterEntry, EntryId, ReplayAnswer, ReplayRecord};
use crate::error::{not_kept, PoisonMessage};
use crate::future::ResponseFuture;
use crate::observability::{ForgetfulMap, DEAD_LETTERED_TOTAL, DLQ_DEPTH, STORE_FULL_TOTAL};
use crate::poison::{Admission, Counted, Decision, PoisonCounting, Stop};
use crate::redact::{uri_path, Redactor};
use crate::replay::REPLAY_HEADER;
use crate::store::{DeadLetterStore, StoreError, StoreErrorKind};

/// Writes calls that finally failed to a dead-letter store.
///
/// Made by [`DeadLetterLayer`](crate::DeadLetterLayer). The [crate docs](crate)
/// say what it does on each outcome, which errors it adds (the inner
/// service's comes back unchanged in the [`BoxError`]), which body types it
/// hands on, and why the inner service must be `Clone + Send + 'static`.
pub struct DeadLetter<S, St, C, Cap> {
    inner: S,
    shared: Arc<Shared<St, C, Cap>>,
}

/// The layer's settings; the layer holds one and each service it makes shares
/// a copy through an `Arc`.
#[derive(Clone)]
pub(crate) struct Shared<St, C, Cap> {
    pub(crate) classifier: C,
    pub(crate) capture: Cap,
    pub(crate) settings: Settings<St>,
}

/// The settings that keep their type while the layer is built (its
/// classifier and capture change it): what is done with a failed call.
#[derive(Clone)]
pub(crate) struct Settings<St> {
    pub(crate) store: St,
    pub(crate) label: Arc<str>,
    pub(crate) action: Action,
    pub(crate) redactor: Redactor,
    pub(crate) poison: Option<Arc<PoisonCounting>>,
    /// The store poison detection counts in (memory when `None`).
    pub(crate) count_store: Option<Arc<dyn DynFailureCountStore>>,
    /// The keys a `drop` action has logged, so each is logged once.
    pub(crate) drops: Arc<ForgetfulMap<String, ()>>,
    /// The failure kinds this layer stores.
    pub(crate) stored: Vec<FailureKind>,
}

/// How many keys a `drop` action remembers having logged, and how many
/// labels remember their last "store is full" warning: past it they start
/// over, logging each once more.
pub(crate) const LOGGED_KEYS: usize = 4096;

/// How often a label warns that its store is full: once per interval, the
/// other refusals are logged at `debug` (the metric counts every one).
const FULL_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// Each label's limit on "store is full" warnings. Process-wide, by label:
/// layers sharing a label share a queue, and one warning tells about all of
/// them. Only a refusal (a full store) looks here.
static FULL_WARNINGS: LazyLock<ForgetfulMap<Box<str>, Arc<LogLimit>>> =
    LazyLock::new(|| ForgetfulMap::new(LOGGED_KEYS));

impl<S, St, C, Cap> DeadLetter<S, St, C, Cap> {
    pub(crate) fn from_shared(inner: S, shared: Arc<Shared<St, C, Cap>>) -> Self {
        DeadLetter { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, St, C, Cap> Clone for DeadLetter<S, St, C, Cap> {
    fn clone(&self) -> Self {
        DeadLetter {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, St: fmt::Debug, C, Cap> fmt::Debug for DeadLetter<S, St, C, Cap> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadLetter")
            .field("inner", &self.inner)
            .field("store", &self.shared.settings.store)
            .field("label", &self.shared.settings.label)
            .field("action", &self.shared.settings.action)
            .finish_non_exhaustive()
    }
}

impl<S, Req, St, C, Cap, Res> Service<Req> for DeadLetter<S, St, C, Cap>
where
    Cap:
        CaptureRequest<Req> + DescribeResponse<S::Response, Response = Res> + Send + Sync + 'static,
    Cap::Request: Send + 'static,
    S: Service<Cap::Request> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError> + Send,
    St: DeadLetterStore,
    C: Classify<S::Response, BoxError> + Send + Sync + 'static,
    Res: Send + 'static,
{
    type Response = Res;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, Res, St, C, Cap, Cap::Recording>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let shared = Arc::clone(&self.shared);
        // Nothing is awaited before the inner service is called but a
        // count store's decision: the body streams through, recorded on the
        // way, and is read back only if the call fails.
        let (request, pending) = shared.capture.capture(request);
        let decision = match shared.settings.admit(&pending) {
            Admission::Now(Decision::Stop(stop)) => {
                return ResponseFuture::boxed(async move {
                    Err(shared.settings.stop(stop, pending).await)
                });
            }
            Admission::Now(Decision::Process(counted)) => {
                // The inner future is made where the response future holds
                // it: made first and moved in, a stack's future (a few
                // hundred bytes) would be copied once more per call.
                let call = || self.inner.call(request);
                return ResponseFuture::calling(call, shared, pending, counted);
            }
            Admission::Later(decision) => decision,
        };
        // The count store has to be waited for, and a service that acts in
        // `call` (hyper's `SendRequest`, tonic's `Channel`, `RateLimit`)
        // must not see a message that is then diverted: the service made
        // ready is taken along and called only once the count decided, and
        // a clone stays here to be made ready for the next call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::boxed(async move {
            let counted = match decision.await {
                Decision::Process(counted) => counted,
                Decision::Stop(stop) => {
                    // The request's copy of the body goes first: the entry
                    // reads what is left of the body only once no other
                    // copy could be reading it. The service goes too,
                    // with whatever its readiness reserved.
                    drop((request, inner));
                    return Err(shared.settings.stop(stop, pending).await);
                }
            };
            ResponseFuture::calling(|| inner.call(request), shared, pending, counted).await
        })
    }
}

/// What a call's result asks of the layer, as its classifier says.
pub(crate) enum Verdict {
    /// Nothing: hand the result back as it is. A success with no poison
    /// count to forget, or a failure of a kind this layer does not store
    /// (its delivery stays counted, as it did not succeed).
    HandBack,
    /// A success (or an outcome to ignore) whose poison count is forgotten,
    /// which may await a count store.
    Succeeded,
    /// A failure to dispose of.
    Failed(Failure),
}

impl<St> Settings<St> {
    /// What a call's `outcome` asks of the layer, the call `counted` as it is.
    pub(crate) fn verdict(&self, outcome: Outcome, counted: &Option<Counted>) -> Verdict {
        match outcome {
            Outcome::Failure(failure) if self.stored.contains(&failure.kind) => {
                Verdict::Failed(failure)
            }
            Outcome::Success | Outcome::Ignored if self.poison.is_some() && counted.is_some() => {
                Verdict::Succeeded
            }
            _ => Verdict::HandBack,
        }
    }
}

impl<St, C, Cap> Shared<St, C, Cap> {
    /// A call's `failure` as its entry records it: the error's chain, or
    /// the response described in one line.
    pub(crate) fn failed<Res>(&self, failure: Failure, result: &Result<Res, BoxError>) -> Failed
    where
        Cap: DescribeResponse<Res>,
    {
        match result {
            Ok(response) => {
                let text = vec![self.capture.describe_response(response)];
                Failed::new(failure, text, true, self.capture.status_code(response))
            }
            Err(error) => Failed::new(failure, error_chain(&**error), false, None),
        }
    }
}

impl<St: DeadLetterStore> Settings<St> {
    /// Acts on a call the classifier settled: disposes of its `failed`, or,
    /// when it succeeded (`None`), forgets its poison count.
    pub(crate) async fn settle<T, R: BodyRecording>(
        &self,
        result: Result<T, BoxError>,
        failed: Option<Failed>,
        pending: PendingRecord<R>,
        counted: Option<Counted>,
        attempts: Attempts,
    ) -> Result<T, BoxError> {
        let Some(failed) = failed else {
            // The request's record (and its copy of the body) is not needed.
            drop(pending);
            self.forget(counted).await;
            return result;
        };
        self.on_failure(pending, attempts, failed, result, counted)
            .await
    }

    /// Forgets a message's poison count (after a success, or once it was
    /// disposed of): its count starts over.
    pub(crate) async fn forget(&self, counted: Option<Counted>) {
        if let (Some(poison), Some(counted)) = (&self.poison, counted) {
            poison.forget(counted).await;
        }
    }

    /// Poison detection's decision on the delivery `pending` describes.
    pub(crate) fn admit<R>(&self, pending: &PendingRecord<R>) -> Admission {
        match &self.poison {
            Some(poison) => poison.admit(pending.message_id.as_deref(), pending.delivery),
            None => Admission::Now(Decision::Process(None)),
        }
    }

    /// A delivery that does not reach the inner service: the error its
    /// caller gets.
    pub(crate) async fn stop<R: BodyRecording>(
        &self,
        stop: Stop,
        pending: PendingRecord<R>,
    ) -> BoxError {
        match stop {
            Stop::Divert(counted) => self.divert(pending, counted).await,
            Stop::Refuse(error) => error,
        }
    }

    /// A message over the poison limit is not called again: it is disposed
    /// of by the action and the caller gets [`PoisonMessage`].
    async fn divert<R: BodyRecording>(
        &self,
        pending: PendingRecord<R>,
        counted: Counted,
    ) -> BoxError {
        // Never called: no attempt was made.
        let record = pending.finish(BODY_WAIT, Attempts::default()).await;
        let id = record.message_id.clone().unwrap_or_default();
        let now = SystemTime::now();
        let failures = counted.deliveries.saturating_sub(1);
        let last = self.poison.as_ref().and_then(|p| p.last(&counted.key));
        let (error, last_at) = match last {
            Some(last) => (last.error, last.at.min(now)),
            // Counted by the queue or a shared store: the failures happened
            // elsewhere (or crashed their worker).
            None => (
                vec![format!(
                    "{failures} earlier deliveries did not succeed (this consumer saw none of their errors)"
                )],
                now,
            ),
        };
        let first = counted.first.min(last_at);
        let entry = self.entry(record, FailureKind::Poison, error, failures, first, last_at);
        let entry_id = entry.id;
        match self.dispose(entry, &id).await {
            Ok(()) => {
                if self.action != Action::Fail {
                    self.forget(Some(counted)).await;
                }
                let stored = (self.action == Action::Dlq).then_some(entry_id);
                PoisonMessage::new(id, failures, self.action, stored).into()
            }
            Err(store) => not_kept(entry_id, store, None, None),
        }
    }

    /// A call failed: count it towards poison detection, or dispose of it.
    pub(crate) async fn on_failure<T, R: BodyRecording>(
        &self,
        pending: PendingRecord<R>,
        attempts: Attempts,
        failed: Failed,
        result: Result<T, BoxError>,
        counted: Option<Counted>,
    ) -> Result<T, BoxError> {
        let Failed {
            failure,
            mut error,
            responded,
            status,
        } = failed;
        let kind = failure.kind;
        // Redacted, then bounded, before it is kept anywhere (the entry,
        // the poison detector's last failures): an error can quote a whole
        // body, and cut first, a secret across the cut would escape a hook
        // that matches it whole.
        self.redactor.redact_errors(&mut error);
        let error = clip_chain(error);
        let record = pending.finish(BODY_WAIT, attempts).await;
        let now = SystemTime::now();
        let counted = self.poison.as_ref().zip(counted);
        if let Some((poison, counted)) = &counted {
            if kind != FailureKind::Poison {
                // Under the limit the queue's redelivery is the retry; the
                // delivery was counted when it began.
                poison.note_failure(&counted.key, error);
                return result;
            }
        }
        let (attempts, first) = match &counted {
            Some((_, counted)) => (counted.deliveries, counted.first.min(now)),
            None => {
                let counter = record.attempts.as_ref();
                let attempts = counter.map_or(1, |c| c.attempts().max(1));
                let first = counter.and_then(|c| c.first_done()).unwrap_or(now);
                (attempts, first.min(now))
            }
        };
        let key = record.message_id.clone();
        let key = key.unwrap_or_else(|| format!("{}/{kind}", self.label));
        let entry = self.entry(record, kind, error, attempts, first, now);
        let entry = self.continue_replayed(entry, responded, status).await;
        let entry_id = entry.id;
        match self.dispose(entry, &key).await {
            Ok(()) => {
                if let Some((poison, counted)) = counted {
                    poison.forget(counted).await;
                }
                result
            }
            Err(store) => Err(not_kept(entry_id, store, result.err(), Some(failure))),
        }
    }

    fn entry(
        &self,
        record: RequestRecord,
        kind: FailureKind,
        error: Vec<String>,
        attempts: u32,
        first_failed_at: SystemTime,
        last_failed_at: SystemTime,
    ) -> DeadLetterEntry {
        let mut headers = record.headers;
        self.redactor.redact(&mut headers);
        // `error` comes redacted and bounded (`on_failure`).
        DeadLetterEntry {
            id: EntryId::generate(SystemTime::now()),
            message_id: record.message_id,
            method: record.method,
            uri: record.uri.map(|uri| self.redactor.redact_uri(&uri)),
            headers,
            body: self.redactor.redact_body(record.body),
            body_truncated: record.body_truncated,
            body_len: record.body_len,
            attempts,
            first_failed_at,
            ..DeadLetterEntry::new(&*self.label, kind, error, last_failed_at)
        }
    }

    /// A failed replay of an entry this layer's store holds (the request
    /// carried [`REPLAY_HEADER`]) continues that entry's history instead of
    /// starting a second entry.
    ///
    /// The mark is checked as the [replay module](crate::replay#a-replay-that-fails-again)
    /// states; an entry the store does not have, or a store that cannot be
    /// read, also makes a new entry. Whether the call got a response
    /// (`responded`) and its `status` are the replay's [answer](ReplayAnswer).
    async fn continue_replayed(
        &self,
        mut entry: DeadLetterEntry,
        responded: bool,
        status: Option<u16>,
    ) -> DeadLetterEntry {
        let mut replay_of = None;
        entry.headers.retain(|header| {
            let marker = header.name.eq_ignore_ascii_case(REPLAY_HEADER);
            if marker {
                replay_of = header.value.parse::<EntryId>().ok();
            }
            !marker
        });
        let Some(original) = replay_of.filter(|_| self.action == Action::Dlq) else {
            return entry;
        };
        match self.store.get(original).await {
            Ok(Some(mut stored)) if same_request(&stored, &entry) => {
                let record =
                    ReplayRecord::new(entry.last_failed_at, entry.kind, entry.error, status);
                stored.record_replay(record, entry.attempts);
                stored.note_replay_answer(ReplayAnswer::new(responded, status, entry.kind));
                stored
            }
            _ => entry,
        }
    }

    /// Applies the action to `entry`.
    async fn dispose(&self, entry: DeadLetterEntry, key: &str) -> Result<(), StoreError> {
        let (action, label, kind) = (self.action, &*self.label, entry.kind.as_str());
        match action {
            Action::Dlq => {
                let (id, attempts) = (entry.id, entry.attempts);
                // The path only: a query or userinfo may carry what the
                // store keeps redacted, and logs travel further.
                let uri = entry.uri.as_deref().unwrap_or_default();
                let path = uri_path(uri).to_owned();
                match self.store.put_with_depth(entry).await {
                    Ok(Some(depth)) => {
                        metrics::gauge!(DLQ_DEPTH, "label" => label.to_owned()).set(depth as f64);
                    }
                    Ok(None) => {}
                    Err(error) if error.kind() == StoreErrorKind::Full => {
                        metrics::counter!(STORE_FULL_TOTAL, "label" => label.to_owned())
                            .increment(1);
                        let new = || (label.into(), Arc::new(LogLimit::new(FULL_WARNING_INTERVAL)));
                        let (limit, _) = FULL_WARNINGS.get_or_insert(label, new);
                        if let Some(held_back) = limit.check() {
                            tracing::warn!(
                                entry_id = %id, label, kind, error = %error,
                                since_last_warning = held_back,
                                "dead-letter store is full: failing the call instead of keeping it \
                                 (logged once per 10 s per label; every refusal at debug)"
                            );
                        } else {
                            tracing::debug!(
                                entry_id = %id, label, kind, error = %error,
                                "dead-letter store is full: failing the call instead of keeping it"
                            );
                        }
                        return Err(error);
                    }
                    Err(error) => {
                        tracing::error!(
                            entry_id = %id, label, kind, error = %error,
                            "dead-letter store failed to keep a failed call"
                        );
                        return Err(error);
                    }
                }
                tracing::warn!(
                    entry_id = %id, label, kind, attempts, path,
                    "dead-lettered a failed call"
                );
            }
            Action::Drop if self.drops.get_or_insert(key, || (key.to_owned(), ())).1 => {
                tracing::warn!(
                    label,
                    key,
                    kind,
                    "dropped a failed call (logged once per key)"
                );
            }
            Action::Drop => tracing::debug!(label, key, kind, "dropped a failed call"),
            Action::Fail => tracing::debug!(label, kind, "failed call propagated, not stored"),
        }
        let (action, label) = (action.as_str(), label.to_owned());
        metrics::counter!(DEAD_LETTERED_TOTAL, "action" => action, "kind" => kind, "label" => label)
            .increment(1);
        Ok(())
    }
}

/// A call's failure as the layer records it: how it was classified, its
/// error chain (or the response described in one line), and the response's
/// HTTP status when there was one.
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) failure: Failure,
    pub(crate) error: Vec<String>,
    /// Whether the call got a response (rather than an error).
    pub(crate) responded: bool,
    pub(crate) status: Option<u16>,
}

impl Failed {
    pub(crate) fn new(
        failure: Failure,
        error: Vec<String>,
        responded: bool,
        status: Option<u16>,
    ) -> Self {
        Failed {
            failure,
            error,
            responded,
            status,
        }
    }
}

/// `true` when `replayed` is the request `stored` holds, as far as a replay
/// reproduces it: the label, the method, the path and query (a replay goes to
/// another host), the body, and whether it was cut short.
fn same_request(stored: &DeadLetterEntry, replayed: &DeadLetterEntry) -> bool {
    // What follows `scheme://authority` in an absolute URI, else all of it:
    // an origin-form path may start with `//` (it names no host), and a
    // query may hold `://`, so only a `://` before any `/` or `?` counts.
    fn target(uri: &Option<String>) -> Option<(&str, &str)> {
        let uri = uri.as_deref()?.split('#').next().unwrap_or_default();
        let rest = match uri.find("://") {
            Some(at) if !uri[..at].contains(['/', '?']) => {
                let after = &uri[at + 3..];
                after.find(['/', '?']).map_or("", |start| &after[start..])
            }
            _ => uri,
        };
        let (path, query) = rest.split_at(rest.find('?').unwrap_or(rest.len()));
        Some((if path.is_empty() { "/" } else { path }, query))
    }
    stored.label == replayed.label
        && stored.method == replayed.method
        && target(&stored.uri) == target(&replayed.uri)
        && stored.body == replayed.body
        && stored.body_truncated == replayed.body_truncated
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(uri: &str, body: &'static str) -> DeadLetterEntry {
        let now = SystemTime::UNIX_EPOCH;
        DeadLetterEntry {
            id: EntryId::generate(now),
            label: "orders".into(),
            message_id: None,
            method: Some("POST".into()),
            uri: Some(uri.into()),
            headers: vec![],
            body: bytes::Bytes::from_static(body.as_bytes()),
            body_truncated: false,
            body_len: None,
            error: vec![],
            kind: FailureKind::ServerError,
            attempts: 1,
            first_failed_at: now,
            last_failed_at: now,
            replays: Vec::new(),
            failed_replays: 0,
            replay_server_errors: 0,
            replay_key_pinned: false,
        }
    }

    #[test]
    fn a_replay_is_the_same_request_on_another_host() {
        let stored = entry("http://orders.internal/orders/7?notify=false", "{}");
        for replayed in [
            "http://127.0.0.1:9/orders/7?notify=false",
            "/orders/7?notify=false",
            "https://user@replay.example:8443/orders/7?notify=false#frag",
        ] {
            assert!(same_request(&stored, &entry(replayed, "{}")), "{replayed}");
        }
        let bare = entry("http://orders.internal?page=2", "{}");
        assert!(same_request(&bare, &entry("http://other/?page=2", "{}")));
        assert!(same_request(
            &entry("http://a", ""),
            &entry("http://b/", "")
        ));
        // A query holding a URL, and an origin-form path that starts with
        // `//`, are the request's own: not a scheme, not a host.
        let callback = entry("http://orders.internal/hook?cb=https://x/y", "{}");
        assert!(same_request(
            &callback,
            &entry("/hook?cb=https://x/y", "{}")
        ));
        let double = entry("//x/orders/7", "{}");
        assert!(same_request(
            &double,
            &entry("http://other//x/orders/7", "{}")
        ));
    }

    #[test]
    fn another_request_is_not_the_same_request() {
        let stored = entry("http://orders.internal/orders/7?notify=false", "{}");
        let different = [
            entry("http://orders.internal/orders/8?notify=false", "{}"),
            entry("http://orders.internal/orders/7?notify=true", "{}"),
            entry("//junk/orders/7?notify=false", "{}"),
            entry("/y?notify=false&cb=http://orders.internal/orders/7", "{}"),
            entry(
                "http://orders.internal/orders/7?notify=false",
                "{\"qty\":9}",
            ),
            DeadLetterEntry {
                method: Some("PUT".into()),
                ..stored.clone()
            },
            DeadLetterEntry {
                label: "payments".into(),
                ..stored.clone()
            },
            DeadLetterEntry {
                body_truncated: true,
                ..stored.clone()
            },
        ];
        for replayed in different {
            assert!(!same_request(&stored, &replayed), "{replayed:?}");
        }
    }
}
