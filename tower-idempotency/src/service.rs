use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Request, Response};
use http_body::Body;
use tower_classify::http::{Idempotency, IDEMPOTENCY_KEY};
use tower_classify::{BoxError, Classify, Outcome, RefusalToken};
use tower_service::Service;
use tracing::Instrument;

use crate::body::{compare, declared_len, GuardBody, Recorder, RequestHash};
use crate::error::chain;
use crate::future::ResponseFuture;
use crate::key;
use crate::rejection::Rejection;
use crate::run_to_end::{RunToEnd, Write};
use crate::store::{
    bounded, Claim, ClaimToken, Completion, IdempotencyStore, NotKept, StoredResponse,
};
use crate::{StoreError, StoreErrorKind};

/// The header a replayed response carries.
pub const IDEMPOTENT_REPLAYED: http::HeaderName =
    http::HeaderName::from_static("idempotent-replayed");

/// A function reading a client identity from a request.
type Identity = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// Reads the client identity that scopes keys.
#[derive(Clone)]
pub(crate) struct ScopeFn(pub(crate) Arc<Identity>);

impl fmt::Debug for ScopeFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ScopeFn")
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) name: Arc<str>,
    pub(crate) ttl: Duration,
    pub(crate) in_flight_ttl: Duration,
    pub(crate) response_body_limit: usize,
    pub(crate) all_methods: bool,
    pub(crate) release_on_transient: bool,
    pub(crate) release_on_shed: bool,
    pub(crate) scope: Option<ScopeFn>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            name: Arc::from("default"),
            ttl: Duration::from_secs(24 * 3600),
            in_flight_ttl: Duration::from_secs(300),
            response_body_limit: 1024 * 1024,
            all_methods: false,
            release_on_transient: false,
            release_on_shed: true,
            scope: None,
        }
    }
}

/// Runs each keyed request at most once and replays its response to
/// repeats; made by [`IdempotencyGuardLayer`](crate::IdempotencyGuardLayer)
/// (see the [crate docs](crate) for the rules).
///
/// The inner service gets `Request<GuardBody<B>>` (the original body, hashed
/// as the handler reads it, and a fresh
/// [`RefusalToken`](tower_classify::RefusalToken) in the extensions); the
/// guard returns `Response<GuardBody<ResB>>`. Its error is the inner
/// service's: its own refusals, store failures included, are responses.
///
/// The guard awaits its store before calling the inner service, so for a
/// guarded request the service driven to readiness moves into the response
/// future and a clone takes its place: the inner service must be `Clone` (as
/// axum routers, hyper services and tower's `Buffer` are). Clones share the
/// store.
#[derive(Debug)]
pub struct IdempotencyGuard<S, St, C> {
    inner: S,
    shared: Arc<Shared<St, C>>,
}

#[derive(Debug)]
struct Shared<St, C> {
    store: St,
    classifier: C,
    config: Config,
}

impl<S, St, C> IdempotencyGuard<S, St, C> {
    pub(crate) fn new(inner: S, store: St, classifier: C, config: Config) -> Self {
        IdempotencyGuard {
            inner,
            shared: Arc::new(Shared {
                store,
                classifier,
                config,
            }),
        }
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

impl<S: Clone, St, C> Clone for IdempotencyGuard<S, St, C> {
    fn clone(&self) -> Self {
        IdempotencyGuard {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S, St, C, B, ResB> Service<Request<B>> for IdempotencyGuard<S, St, C>
where
    S: Service<Request<GuardBody<B>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
    St: IdempotencyStore,
    C: Classify<Response<ResB>, S::Error> + Send + Sync + 'static,
{
    type Response = Response<GuardBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let config = &self.shared.config;
        let guarded = config.all_methods || !Idempotency::method_is_idempotent(request.method());
        if !guarded || !request.headers().contains_key(IDEMPOTENCY_KEY) {
            return ResponseFuture::passthrough(self.inner.call(request.map(GuardBody::new)));
        }
        let (parts, body) = request.into_parts();
        let key = match key::parse(&parts.headers[IDEMPOTENCY_KEY]) {
            Ok(key) => key,
            Err(rejection) => {
                let rejected = reject(&config.name, rejection);
                return ResponseFuture::guarded(Box::pin(std::future::ready(Ok(rejected))));
            }
        };
        let identity = config
            .scope
            .as_ref()
            .and_then(|ScopeFn(identity)| identity(&parts));
        let key = key::namespaced(identity.as_deref(), key);
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        // A span for the guarded call, made only when a subscriber records
        // it; events outside it (spawned writes, the response body) carry
        // the guard's name themselves. Not the key: every event of the
        // handler would carry it, and a scoped key holds the caller's
        // identity.
        let span = tracing::debug_span!("idempotency", idempotency = %config.name);
        let shared = Arc::clone(&self.shared);
        let call = guarded_call(inner, shared, key, parts, body);
        if span.is_disabled() {
            ResponseFuture::guarded(Box::pin(call))
        } else {
            ResponseFuture::guarded(Box::pin(call.instrument(span)))
        }
    }
}

async fn guarded_call<S, St, C, B, ResB>(
    mut inner: S,
    shared: Arc<Shared<St, C>>,
    key: String,
    mut parts: Parts,
    body: B,
) -> Result<Response<GuardBody<ResB>>, S::Error>
where
    S: Service<Request<GuardBody<B>>, Response = Response<ResB>>,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
    ResB: Body<Data = Bytes>,
    ResB::Error: Into<BoxError>,
    St: IdempotencyStore,
    C: Classify<Response<ResB>, S::Error> + Send + Sync + 'static,
{
    let config = &shared.config;
    let name = &config.name;
    let head = key::head(&parts.method, &parts.uri);
    let claiming = run_claim(Arc::clone(&shared), key.clone(), head.clone());
    let mut held = match claiming.await {
        Some(Ok(Ok(held))) => held,
        // The first request's handler may still be reading its body: only
        // the heads can be compared.
        Some(Ok(Err(Claim::InFlight { fingerprint })))
            if key::parse_fingerprint(&fingerprint).0 != head =>
        {
            return Ok(reject(name, Rejection::Mismatch))
        }
        Some(Ok(Err(Claim::Completed {
            fingerprint,
            completion,
        }))) => return Ok(repeat(name, &key, &head, &fingerprint, completion, body).await),
        Some(Ok(Err(_))) => return Ok(reject(name, Rejection::InFlight)),
        None => {
            tracing::error!(
                idempotency = %name,
                key,
                "idempotency store panicked claiming a key; request refused"
            );
            return Ok(reject(name, Rejection::StoreUnavailable));
        }
        Some(Err(error)) if error.kind() == StoreErrorKind::Full => {
            tracing::warn!(
                idempotency = %name,
                key,
                error = chain(&error),
                "idempotency store full of requests in flight; request refused"
            );
            return Ok(reject(name, Rejection::StoreFull));
        }
        Some(Err(error)) => {
            tracing::error!(
                idempotency = %name,
                key,
                error = chain(&error),
                "idempotency store failed to claim a key; request refused"
            );
            return Ok(reject(name, Rejection::StoreUnavailable));
        }
    };
    count(name, "claimed");
    let hash = held.start(body.is_end_stream());
    let body = GuardBody::hashed(body, hash);
    // A response to HEAD has no body whatever its head says.
    let bodiless = parts.method == http::Method::HEAD;
    // Only a refusal carrying this token was made of this very request by a
    // layer that did not pass it on: a refusal the handler passes on from a
    // dependency it called answers another request (see `RefusalToken`).
    // It replaces any token an outer layer put in.
    let refusal = RefusalToken::issue();
    parts.extensions.insert(refusal);
    let result = inner.call(Request::from_parts(parts, body)).await;
    let release = match Classify::<_, S::Error>::classify(&shared.classifier, result.as_ref()) {
        // Refused below the guard before the handler ran (an open breaker
        // in front of it): nothing happened, the client may try again.
        Outcome::Failure(failure) if failure.refusal == Some(refusal) => config.release_on_shed,
        Outcome::Failure(failure) => config.release_on_transient && failure.kind.is_transient(),
        Outcome::Success | Outcome::Ignored => false,
    };
    let (parts, body) = match result {
        Ok(response) if !release => response.into_parts(),
        result => {
            // Released, or the service failed: answered as the inner
            // service answered.
            let failed = (!release).then_some(Completion::NotKept(NotKept::ServiceError));
            held.settle(failed).await;
            return result.map(|response| response.map(GuardBody::new));
        }
    };
    let limit = config.response_body_limit;
    let declared = declared_len(&parts.headers, &body);
    // Nothing to stream: recorded at once. A server never polls the body of
    // a response that has none (a `Content-Length: 0`, a 204 or 304, an
    // answer to HEAD) when the body does not say it has ended, so waiting
    // for its end would record the response as cancelled.
    let no_body = matches!(parts.status.as_u16(), 204 | 304) || declared == Some(0);
    let settled = if body.is_end_stream() || no_body || bodiless {
        Completion::Response(StoredResponse::new(
            parts.status,
            &parts.headers,
            Bytes::new(),
        ))
    } else if declared.unwrap_or(0).max(body.size_hint().lower()) > limit as u64 {
        Completion::NotKept(NotKept::TooLarge)
    } else {
        let record = Box::new(move |completion| held.settle(Some(completion)));
        let body = GuardBody::recorded(body, Recorder::new(record, &parts, declared, limit));
        return Ok(Response::from_parts(parts, body));
    };
    held.settle(Some(settled)).await;
    Ok(Response::from_parts(parts, GuardBody::new(body)))
}

/// The answer to a repeat of a completed key: its stored response, or the
/// refusal naming why it was not kept, once the repeat is known to be the
/// same request. The handler is not called, so the guard reads the repeat's
/// body itself, as far as the first request's handler read its own.
async fn repeat<B, ResB>(
    name: &Arc<str>,
    key: &str,
    head: &str,
    stored: &str,
    completion: Completion,
    body: B,
) -> Response<GuardBody<ResB>>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let (stored_head, part) = key::parse_fingerprint(stored);
    if stored_head != head {
        return reject(name, Rejection::Mismatch);
    }
    // No body part: the record predates this form; the heads decide.
    if let Some(part) = part {
        match compare(body, part).await {
            Ok(true) => {}
            Ok(false) => return reject(name, Rejection::Mismatch),
            Err(error) => {
                tracing::debug!(
                    idempotency = %name,
                    key,
                    error = chain(&*error),
                    "the body of a repeat failed while compared with the first request's"
                );
                return reject(name, Rejection::BodyUnreadable);
            }
        }
    }
    match completion {
        Completion::NotKept(reason) => reject(name, Rejection::NotKept(reason)),
        Completion::Response(response) => {
            count(name, "replayed");
            let mut replay = response.to_response(GuardBody::replay);
            replay
                .headers_mut()
                .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            replay
        }
    }
}

fn reject<B>(name: &Arc<str>, rejection: Rejection) -> Response<GuardBody<B>> {
    count(name, rejection.code());
    rejection.response(|bytes| GuardBody::replay(bytes, None))
}

/// Counts a guarded call's `outcome` under the guard's name.
fn count(name: &Arc<str>, outcome: &'static str) {
    metrics::counter!(
        crate::observability::TOTAL,
        crate::observability::NAME_LABEL => Arc::clone(name),
        "outcome" => outcome
    )
    .increment(1);
}

/// A key this call claimed, until its outcome is written: through the
/// handler, then inside the response body until it ends. Dropped before
/// [`start`](Self::start) (the call went away before its handler could
/// run), it frees the key; dropped after without being
/// [settled](Self::settle) (the call or its response body was dropped), it
/// records [`NotKept::Cancelled`], in a spawned task either way.
struct Held<St: IdempotencyStore, C: Send + Sync + 'static> {
    shared: Arc<Shared<St, C>>,
    key: String,
    /// `None` once settled.
    claim: Option<ClaimToken>,
    /// The fingerprint's head; the body part is read from `body` when the
    /// outcome is written.
    head: String,
    /// Set by [`start`](Self::start): the handler may have run.
    body: Option<Arc<RequestHash>>,
    keeper: Option<Keeper>,
}

struct Keeper {
    task: tokio::task::JoinHandle<()>,
    /// Set once the key is completed or released, so that an extension that
    /// raced with it does not report the claim as lapsed.
    settled: Arc<AtomicBool>,
}

impl<St: IdempotencyStore, C: Send + Sync + 'static> Held<St, C> {
    /// The handler may run from now on: a keeper task extends the claim
    /// while it is held, even while nobody polls it. Returns what the
    /// handler reads of the request body, for the fingerprint.
    fn start(&mut self, ended: bool) -> Arc<RequestHash> {
        let hash = Arc::new(RequestHash::new(ended));
        self.body = Some(Arc::clone(&hash));
        // Outside a runtime nothing extends the claim: it lapses after the
        // in-flight TTL.
        if let (Some(claim), Ok(runtime)) = (&self.claim, tokio::runtime::Handle::try_current()) {
            let settled = Arc::new(AtomicBool::new(false));
            let (shared, key) = (Arc::clone(&self.shared), self.key.clone());
            let task = runtime.spawn(keep(shared, key, claim.clone(), Arc::clone(&settled)));
            self.keeper = Some(Keeper { task, settled });
        }
        hash
    }

    /// Records `completion`, or frees the key for `None`. The write runs to
    /// its end even if the caller goes away while it is under way (the
    /// handler ran; a write cut short would leave the claim to lapse and a
    /// repeat to run again).
    fn settle(mut self, completion: Option<Completion>) -> Write {
        self.finish(completion).expect("held until settled")
    }

    /// Settles the claim, once: records `completion` with the request's
    /// fingerprint (its body part as far as the handler read the body), or
    /// frees the key for `None`; `None` if it was settled already.
    fn finish(&mut self, completion: Option<Completion>) -> Option<Write> {
        if let Some(keeper) = self.keeper.take() {
            keeper.settled.store(true, Ordering::Release);
            keeper.task.abort();
        }
        let claim = self.claim.take()?;
        let (shared, key) = (Arc::clone(&self.shared), std::mem::take(&mut self.key));
        let Some(completion) = completion else {
            return Some(Write::new(write(shared, key, claim, None)));
        };
        if completion == Completion::NotKept(NotKept::TooLarge) {
            tracing::warn!(
                idempotency = %shared.config.name,
                key,
                limit = shared.config.response_body_limit,
                "response too large to store for replay; repeats of its key get 409"
            );
        }
        let part = self.body.as_ref().map(|hash| hash.part());
        let fingerprint = key::fingerprint(&self.head, part.as_ref());
        let write = write(shared, key, claim, Some((fingerprint, completion)));
        Some(Write::new(write))
    }
}

impl<St: IdempotencyStore, C: Send + Sync + 'static> Drop for Held<St, C> {
    fn drop(&mut self) {
        let cancelled = self.body.is_some();
        let cancelled = cancelled.then_some(Completion::NotKept(NotKept::Cancelled));
        if let Some(write) = self.finish(cancelled) {
            write.detach();
        }
    }
}

/// The key held, or what another request left under it.
type Claimed<St, C> = Result<Result<Held<St, C>, Claim>, StoreError>;

/// Claims `key`, to the end even if the call goes away meanwhile (see
/// [`RunToEnd`]): a claim cut short could be applied in the store with no
/// one left to know, holding the key for the whole in-flight TTL. A key
/// acquired for a call that is gone is freed by the dropped [`Held`]; a key
/// not acquired comes back as the [`Claim`] found.
fn run_claim<St: IdempotencyStore, C: Send + Sync + 'static>(
    shared: Arc<Shared<St, C>>,
    key: String,
    head: String,
) -> RunToEnd<Claimed<St, C>> {
    RunToEnd::new(async move {
        // The body part is not known until the handler has read the body.
        let fingerprint = key::fingerprint(&head, None);
        let (store, in_flight_ttl) = (&shared.store, shared.config.in_flight_ttl);
        match store.claim(&key, &fingerprint, in_flight_ttl).await? {
            Claim::Acquired(token) => Ok(Ok(Held {
                shared,
                key,
                claim: Some(token),
                head,
                body: None,
                keeper: None,
            })),
            found => Ok(Err(found)),
        }
    })
}

/// Extends `claim` every third of the in-flight TTL until aborted, or until
/// the claim is found gone.
async fn keep<St: IdempotencyStore, C>(
    shared: Arc<Shared<St, C>>,
    key: String,
    claim: ClaimToken,
    settled: Arc<AtomicBool>,
) {
    let (name, in_flight_ttl) = (&shared.config.name, shared.config.in_flight_ttl);
    let period = bounded(in_flight_ttl) / 3;
    loop {
        tokio::time::sleep(period).await;
        match shared.store.extend(&key, &claim, in_flight_ttl).await {
            Ok(true) => {}
            Ok(false) => {
                if !settled.load(Ordering::Acquire) {
                    tracing::warn!(
                        idempotency = %name,
                        key,
                        "idempotency claim lapsed while its request ran; a repeat may run it again"
                    );
                }
                return;
            }
            Err(error) => tracing::warn!(
                idempotency = %name,
                key,
                error = chain(&error),
                "idempotency store failed to extend a claim; it lapses after the in-flight TTL unless a later extension lands"
            ),
        }
    }
}

/// Writes what a guarded call came to (its fingerprint and completion, or
/// `None` to free the key), and counts and logs how that went.
async fn write<St: IdempotencyStore, C>(
    shared: Arc<Shared<St, C>>,
    key: String,
    claim: ClaimToken,
    outcome: Option<(String, Completion)>,
) {
    let (store, name) = (&shared.store, &shared.config.name);
    let Some((fingerprint, completion)) = outcome else {
        match store.release(&key, &claim).await {
            Ok(true) => count(name, "released"),
            Ok(false) => count(name, "lapsed"),
            Err(error) => tracing::error!(
                idempotency = %name,
                key,
                error = chain(&error),
                "idempotency store failed to release a key; it lapses after the in-flight TTL"
            ),
        }
        return;
    };
    let outcome = match &completion {
        Completion::Response(_) => "stored",
        Completion::NotKept(reason) => reason.as_str(),
    };
    let ttl = shared.config.ttl;
    match store
        .complete(&key, &claim, &fingerprint, completion, ttl)
        .await
    {
        Ok(true) => count(name, outcome),
        Ok(false) => {
            // The claim lapsed (in-flight TTL): another request may own the
            // key now, so leave it alone.
            count(name, "lapsed");
            tracing::warn!(
                idempotency = %name,
                key,
                "idempotency claim lapsed before its outcome was recorded"
            );
        }
        Err(error) => {
            // Keep the claim rather than release it: the request may have
            // been applied, and running it again would duplicate it. Repeats
            // get 409 until the in-flight TTL.
            count(name, "store_failed");
            tracing::error!(
                idempotency = %name,
                key,
                error = chain(&error),
                "idempotency store failed to record an outcome; the key stays in flight until the in-flight TTL"
            );
        }
    }
}
