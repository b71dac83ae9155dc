use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Request, Response};
use http_body::Body;
use tower_classify::http::{Idempotency, IDEMPOTENCY_KEY};
use tower_classify::{BoxError, Classify, FailureKind, Outcome};
use tower_service::Service;

use crate::body::{read_ahead, Ending, GuardBody};
use crate::error::{chain, StoreErrorKind};
use crate::future::ResponseFuture;
use crate::key;
use crate::rejection::Rejection;
use crate::store::{
    bounded, Claim, ClaimToken, Completion, IdempotencyStore, NotKept, StoredResponse,
};

/// The header a replayed response carries.
pub const IDEMPOTENT_REPLAYED: http::HeaderName =
    http::HeaderName::from_static("idempotent-replayed");

/// A function reading a client identity from a request.
type Identity = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// Reads the client identity that scopes keys.
#[derive(Clone)]
pub(crate) struct ScopeFn(pub(crate) Arc<Identity>);

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) ttl: Duration,
    pub(crate) in_flight_ttl: Duration,
    pub(crate) response_body_limit: usize,
    pub(crate) fingerprint_body_limit: usize,
    pub(crate) all_methods: bool,
    pub(crate) release_on_transient: bool,
    pub(crate) release_on_shed: bool,
    pub(crate) scope: Option<ScopeFn>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            ttl: Duration::from_secs(24 * 3600),
            in_flight_ttl: Duration::from_secs(300),
            response_body_limit: 1024 * 1024,
            fingerprint_body_limit: 1024 * 1024,
            all_methods: false,
            release_on_transient: false,
            release_on_shed: true,
            scope: None,
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("ttl", &self.ttl)
            .field("in_flight_ttl", &self.in_flight_ttl)
            .field("response_body_limit", &self.response_body_limit)
            .field("fingerprint_body_limit", &self.fingerprint_body_limit)
            .field("all_methods", &self.all_methods)
            .field("release_on_transient", &self.release_on_transient)
            .field("release_on_shed", &self.release_on_shed)
            .field("scoped", &self.scope.is_some())
            .finish()
    }
}

/// Runs each keyed request at most once and replays its response to
/// repeats.
///
/// Made by [`IdempotencyGuardLayer`](crate::IdempotencyGuardLayer); see the
/// [crate docs](crate) for the rules.
///
/// It takes `Request<B>` and hands the inner service `Request<GuardBody<B>>`
/// (the body with the bytes read for the fingerprint put back in front); it
/// returns `Response<GuardBody<ResB>>` (the inner response's body, a stored
/// body, or the guard's own answer). Its error is the inner service's: the
/// guard's own refusals, store failures included, are responses.
///
/// # Clones
///
/// The guard awaits its store before calling the inner service, so for a
/// guarded request the service driven to readiness moves into the response
/// future and a clone takes its place; the inner service must be `Clone` (as
/// axum routers, hyper services and tower's `Buffer` are). Clones share the
/// store.
pub struct IdempotencyGuard<S, St, C> {
    inner: S,
    shared: Arc<Shared<St, C>>,
}

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

    /// The store keys are kept in.
    pub fn store(&self) -> &St {
        &self.shared.store
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

impl<S: fmt::Debug, St: fmt::Debug, C: fmt::Debug> fmt::Debug for IdempotencyGuard<S, St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyGuard")
            .field("inner", &self.inner)
            .field("store", &self.shared.store)
            .field("classifier", &self.shared.classifier)
            .field("config", &self.shared.config)
            .finish()
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
                return ResponseFuture::guarded(Box::pin(std::future::ready(Ok(reject(rejection)))))
            }
        };
        let identity = config
            .scope
            .as_ref()
            .and_then(|ScopeFn(identity)| identity(&parts));
        let key = key::namespaced(identity.as_deref(), key);
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        ResponseFuture::guarded(Box::pin(guarded_call(inner, shared, key, parts, body)))
    }
}

async fn guarded_call<S, St, C, B, ResB>(
    mut inner: S,
    shared: Arc<Shared<St, C>>,
    key: String,
    parts: Parts,
    body: B,
) -> Result<Response<GuardBody<ResB>>, S::Error>
where
    S: Service<Request<GuardBody<B>>, Response = Response<ResB>>,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
    ResB: Body<Data = Bytes>,
    ResB::Error: Into<BoxError>,
    St: IdempotencyStore,
    C: Classify<Response<ResB>, S::Error>,
{
    let config = &shared.config;
    let (body, prefix, ending) = read_ahead(body, config.fingerprint_body_limit).await;
    if ending == Ending::Failed {
        return Ok(reject(Rejection::BodyUnreadable));
    }
    let fingerprint = key::fingerprint(
        &parts.method,
        &parts.uri,
        &prefix,
        ending == Ending::OverLimit,
    );
    drop(prefix);

    let claim = match shared
        .store
        .claim(&key, &fingerprint, config.in_flight_ttl)
        .await
    {
        Ok(claim) => claim,
        Err(error) if error.kind() == StoreErrorKind::Full => {
            tracing::warn!(
                key,
                error = chain(&error),
                "idempotency store full of requests in flight; request refused"
            );
            return Ok(reject(Rejection::StoreFull));
        }
        Err(error) => {
            tracing::error!(
                key,
                error = chain(&error),
                "idempotency store failed to claim a key; request refused"
            );
            return Ok(reject(Rejection::StoreUnavailable));
        }
    };
    let token = match claim {
        Claim::Acquired(token) => token,
        Claim::InFlight { fingerprint: other }
        | Claim::Completed {
            fingerprint: other, ..
        } if other != fingerprint => return Ok(reject(Rejection::Mismatch)),
        Claim::InFlight { .. } => return Ok(reject(Rejection::InFlight)),
        Claim::Completed {
            completion: Completion::NotKept(reason),
            ..
        } => return Ok(reject(Rejection::NotKept(reason))),
        Claim::Completed {
            completion: Completion::Response(response),
            ..
        } => {
            count("replayed");
            let trailers = response.trailer_map();
            let mut replay = response.to_response(|body| GuardBody::replay(body, trailers));
            replay
                .headers_mut()
                .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            return Ok(replay);
        }
    };
    count("claimed");
    // From here on the handler may run: dropping `held` (a cancelled call)
    // records the key as not kept, never frees it.
    let mut held = Held::new(shared.store.clone(), key, token, config.ttl);

    let in_flight_ttl = config.in_flight_ttl;
    let call = inner.call(Request::from_parts(parts, body));
    let result = held.renewing(call, in_flight_ttl).await;
    let release = match Classify::<_, S::Error>::classify(&shared.classifier, result.as_ref()) {
        // Refused below the guard before the handler ran (an open breaker,
        // a load shedder): nothing happened, the client may try again.
        Outcome::Failure(failure) if failure.kind == FailureKind::Shed => config.release_on_shed,
        Outcome::Failure(failure) => config.release_on_transient && failure.kind.is_transient(),
        Outcome::Success | Outcome::Ignored => false,
    };
    let response = match result {
        Ok(response) => response,
        Err(error) => {
            if release {
                held.release().await;
            } else {
                held.complete(Completion::NotKept(NotKept::ServiceError))
                    .await;
            }
            return Err(error);
        }
    };
    if release {
        held.release().await;
        return Ok(response.map(GuardBody::new));
    }
    let (parts, body) = response.into_parts();
    let read = read_ahead(body, config.response_body_limit);
    let (body, recorded, ending) = held.renewing(read, in_flight_ttl).await;
    let completion = match ending {
        Ending::Whole => {
            let stored = StoredResponse::new(parts.status, &parts.headers, recorded);
            Completion::Response(match body.trailers() {
                Some(trailers) => stored.with_trailers(trailers),
                None => stored,
            })
        }
        Ending::OverLimit => {
            tracing::warn!(
                key = held.key(),
                limit = config.response_body_limit,
                "response too large to store for replay; repeats of its key get 409"
            );
            Completion::NotKept(NotKept::TooLarge)
        }
        Ending::Failed => Completion::NotKept(NotKept::BodyFailed),
    };
    held.complete(completion).await;
    Ok(Response::from_parts(parts, body))
}

fn reject<B>(rejection: Rejection) -> Response<GuardBody<B>> {
    count(rejection.code());
    rejection.response(GuardBody::full)
}

fn count(outcome: &'static str) {
    metrics::counter!("tower_idempotency_total", "outcome" => outcome).increment(1);
}

/// A key this call holds, from the moment the service may run. Dropped
/// without [`complete`](Self::complete) or [`release`](Self::release) (the
/// call was cancelled), it records [`NotKept::Cancelled`] in a spawned task.
struct Held<St: IdempotencyStore> {
    held: Option<(St, String, ClaimToken)>,
    ttl: Duration,
    /// Set once the key is completed or released, so that an extension
    /// spawned just before does not report the claim as lapsed. Made with
    /// the first extension: most calls finish before one is due.
    settled: Option<Arc<AtomicBool>>,
}

impl<St: IdempotencyStore> Held<St> {
    fn new(store: St, key: String, claim: ClaimToken, ttl: Duration) -> Self {
        Held {
            held: Some((store, key, claim)),
            ttl,
            settled: None,
        }
    }

    fn key(&self) -> &str {
        self.held.as_ref().map_or("", |(_, key, _)| key)
    }

    /// Runs `future` while extending the claim every third of
    /// `in_flight_ttl`, so that a request slower than the TTL keeps its key
    /// (a repeat gets 409, never a second run). Each extension is spawned,
    /// so the call is never held up by the store; the timer is only made
    /// once `future` has to wait.
    async fn renewing<F: Future>(&mut self, future: F, in_flight_ttl: Duration) -> F::Output {
        let period = bounded(in_flight_ttl) / 3;
        let mut future = pin!(future);
        let mut renew = pin!(None::<tokio::time::Sleep>);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(output) = future.as_mut().poll(cx) {
                return Poll::Ready(output);
            }
            if renew.is_none() {
                renew.set(Some(tokio::time::sleep(period)));
            }
            let mut timer = renew.as_mut().as_pin_mut().expect("just set");
            while timer.as_mut().poll(cx).is_ready() {
                self.extend_in_background(in_flight_ttl);
                timer.as_mut().reset(tokio::time::Instant::now() + period);
            }
            Poll::Pending
        })
        .await
    }

    fn extend_in_background(&mut self, in_flight_ttl: Duration) {
        let Some((store, key, claim)) = self.held.clone() else {
            return;
        };
        let settled = Arc::clone(self.settled.get_or_insert_with(Arc::default));
        tokio::spawn(async move {
            match store.extend(&key, &claim, in_flight_ttl).await {
                Ok(true) => {}
                Ok(false) if settled.load(Ordering::Acquire) => {}
                Ok(false) => tracing::warn!(
                    key,
                    "idempotency claim lapsed while its request ran; a repeat may run it again"
                ),
                Err(error) => tracing::warn!(
                    key,
                    error = chain(&error),
                    "idempotency store failed to extend a claim; it lapses after the in-flight TTL"
                ),
            }
        });
    }

    fn settle(&mut self) -> Option<(St, String, ClaimToken)> {
        if let Some(settled) = &self.settled {
            settled.store(true, Ordering::Release);
        }
        self.held.take()
    }

    /// Frees the key. Like [`complete`](Self::complete), the write runs in
    /// its own task, so a caller going away does not leave the key held
    /// until the in-flight TTL.
    async fn release(mut self) {
        let Some((store, key, claim)) = self.settle() else {
            return;
        };
        detached(async move {
            match store.release(&key, &claim).await {
                Ok(true) => count("released"),
                Ok(false) => count("lapsed"),
                Err(error) => tracing::error!(
                    key,
                    error = chain(&error),
                    "idempotency store failed to release a key; it lapses after the in-flight TTL"
                ),
            }
        })
        .await;
    }

    /// Records `completion`. The write runs in its own task: if the caller
    /// goes away while it is under way, it still lands (the handler ran; a
    /// write cut short would leave the claim to lapse and a repeat to run
    /// again).
    async fn complete(mut self, completion: Completion) {
        let Some((store, key, claim)) = self.settle() else {
            return;
        };
        detached(record_outcome(store, key, claim, completion, self.ttl)).await;
    }
}

/// Runs `write` to the end even if the caller is dropped meanwhile: polled
/// once here (a write to an in-memory store is done then, with no task to
/// spawn), then, if it has to wait, in a task of its own that the caller
/// awaits; inline outside a tokio runtime.
async fn detached<F>(write: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let mut write = Box::pin(write);
    if std::future::poll_fn(|cx| Poll::Ready(write.as_mut().poll(cx)))
        .await
        .is_ready()
    {
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            let _ = runtime.spawn(write).await;
        }
        Err(_) => write.await,
    }
}

/// Writes what a guarded call came to, and counts and logs how that went.
async fn record_outcome<St: IdempotencyStore>(
    store: St,
    key: String,
    claim: ClaimToken,
    completion: Completion,
    ttl: Duration,
) {
    let outcome = match &completion {
        Completion::Response(_) => "stored",
        Completion::NotKept(reason) => reason.as_str(),
    };
    match store.complete(&key, &claim, completion, ttl).await {
        Ok(true) => count(outcome),
        Ok(false) => {
            // The claim lapsed (in-flight TTL): another request may own the
            // key now, so leave it alone.
            count("lapsed");
            tracing::warn!(
                key,
                "idempotency claim lapsed before its outcome was recorded"
            );
        }
        Err(error) => {
            // Keep the claim rather than release it: the request may have
            // been applied, and running it again would duplicate it. Repeats
            // get 409 until the in-flight TTL.
            count("store_failed");
            tracing::error!(
                key,
                error = chain(&error),
                "idempotency store failed to record an outcome; the key stays in flight until the in-flight TTL"
            );
        }
    }
}

impl<St: IdempotencyStore> Drop for Held<St> {
    fn drop(&mut self) {
        let Some((store, key, claim)) = self.settle() else {
            return;
        };
        let cancelled = Completion::NotKept(NotKept::Cancelled);
        // Outside a runtime (it is shutting down) the claim stays in flight
        // and lapses after the in-flight TTL.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(record_outcome(store, key, claim, cancelled, self.ttl));
        }
    }
}
