use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use tower_classify::HttpClassifier;
use tower_layer::Layer;

use crate::service::{Config, IdempotencyGuard, ScopeFn};

/// Applies [`IdempotencyGuard`] to an HTTP service: each `Idempotency-Key`
/// runs its request at most once, and repeats get the stored response.
///
/// The shortest [`ttl`](IdempotencyGuardLayer::ttl) and
/// [`in_flight_ttl`](IdempotencyGuardLayer::in_flight_ttl) the guard uses;
/// shorter ones (zero would let a repeat run again at once) are raised to it.
pub const MIN_TTL: Duration = Duration::from_millis(100);

/// Defaults: the name `"default"`, a 24 h TTL for completed keys, a 5 min in-flight TTL (a claim
/// whose node crashed lapses after it), responses up to 1 MiB stored, only
/// non-idempotent methods guarded (POST, PATCH and extension methods), no client scope,
/// transient answers stored like any other, keys freed for refusals proven
/// to be made before the handler ran, [`HttpClassifier`] classifying
/// answers.
///
/// Clones of the layer and the services it makes share the store.
#[derive(Clone)]
pub struct IdempotencyGuardLayer<St, C = HttpClassifier> {
    store: St,
    classifier: C,
    config: Config,
}

impl<St> IdempotencyGuardLayer<St> {
    /// A guard keeping its keys in `store`, with the defaults above.
    ///
    /// It describes the crate's metrics (name, unit, help text) to the
    /// `metrics` recorder installed then ([`describe_metrics`](crate::describe_metrics)).
    pub fn new(store: St) -> Self {
        crate::observability::describe_metrics();
        IdempotencyGuardLayer {
            store,
            classifier: HttpClassifier::new(),
            config: Config::default(),
        }
    }
}

impl<St, C> IdempotencyGuardLayer<St, C> {
    /// The guard's name in metrics labels (`idempotency="…"`) and in its
    /// events (default `"default"`). Name each guard whose series should
    /// stay apart; names are labels, so keep them few and never derived
    /// from requests.
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.config.name = name.into();
        self
    }

    /// Keeps a completed key for `ttl` (default 24 h): repeats within it
    /// are replayed (or refused, when the response was not kept), later ones
    /// run again. Values above [`MAX_TTL`](crate::store::MAX_TTL) are cut
    /// to it, values below [`MIN_TTL`] raised to it.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.config.ttl = ttl.max(MIN_TTL);
        self
    }

    /// Lets an unfinished claim lapse after `ttl` (default 5 min), for a node
    /// that crashed while holding it. While a request runs and until its
    /// response body ends, the guard extends its claim every third of this
    /// TTL, so a request or a response stream slower than the TTL keeps its
    /// key; only a claim nobody extends lapses. A claim whose reply
    /// was lost (the store timed out after taking it) also holds its key
    /// until then, answering repeats with 409. Values below [`MIN_TTL`] are
    /// raised to it.
    pub fn in_flight_ttl(mut self, ttl: Duration) -> Self {
        self.config.in_flight_ttl = ttl.max(MIN_TTL);
        self
    }

    /// Stores responses whose body is at most `limit` bytes (default 1 MiB).
    /// The body streams to the client as it comes while the guard keeps a
    /// reference to each chunk; once it passes `limit` (or at once, when its
    /// `Content-Length` says it will) the guard lets go of the chunks and
    /// records the key as [not kept](crate::store::NotKept::TooLarge):
    /// the response still reaches the client whole, and repeats get 409,
    /// never a second run.
    pub fn response_body_limit(mut self, limit: usize) -> Self {
        self.config.response_body_limit = limit;
        self
    }

    /// Also guards idempotent methods (GET, PUT, DELETE, …) that carry a key
    /// (default `false`: by RFC 9110 repeating them is already safe).
    pub fn all_methods(mut self, yes: bool) -> Self {
        self.config.all_methods = yes;
        self
    }

    /// Frees the key when the handler answers with a transient failure (what
    /// the classifier calls one: 5xx, 429, 408, or an error such as a lost
    /// connection), so the client's retry runs the request again. Default
    /// `false`: such answers are stored and replayed like any other.
    ///
    /// **A risk**: a handler that failed *after* a side effect (the order
    /// was written, then the reply failed) runs again on the retry. Turn it
    /// on only for handlers whose transient failures happen before any side
    /// effect, or that are idempotent themselves.
    pub fn release_on_transient(mut self, yes: bool) -> Self {
        self.config.release_on_transient = yes;
        self
    }

    /// Frees the key when a layer between the guard and the handler refused
    /// the request *before the handler ran*, and proves it (default
    /// `true`): the client's retry then runs the request once the
    /// dependency is back, instead of being answered the stored refusal for
    /// the whole TTL.
    ///
    /// The proof is a [`RefusalToken`]: the guard hands each request down
    /// with a fresh one in its extensions, and a refusing layer that never
    /// passed the request on copies it into its refusal's
    /// [`Failure`](tower_classify::Failure) (a tower-breaker answering HTTP
    /// requests, `Http503` or `HttpError`, does). Only a failure carrying
    /// the token of this very request frees the key. A refusal the handler
    /// passes on from a dependency it called (a `CircuitOpen` returned with
    /// `?`, that dependency's `503 CIRCUIT_OPEN`) answers a request the
    /// handler built, which carries no token: the handler ran, and the key
    /// is kept like any other answer's; a handler that refused before acting
    /// answers with [`not_run`](tower_classify::status::not_run), which
    /// copies the token for it. A refusal without the proof
    /// (tower's `LoadShed`, a breaker with the `Plain` answer, which takes
    /// any request type) keeps the key too. A handler that forwards the
    /// guarded request itself, extensions included (a proxy), forwards the
    /// token with it; see [`RefusalToken`] for what that means.
    ///
    /// [`RefusalToken`]: tower_classify::RefusalToken
    pub fn release_on_shed(mut self, yes: bool) -> Self {
        self.config.release_on_shed = yes;
        self
    }

    /// Scopes keys by a client identity read from the request (an API key id,
    /// an authenticated tenant), so two clients choosing the same key do not
    /// see each other's responses. `None` puts the request in the shared,
    /// unscoped key space, which no scoped key can reach (and the other way
    /// round).
    pub fn scope_by<F>(mut self, identity: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.config.scope = Some(ScopeFn(Arc::new(identity)));
        self
    }

    /// Uses `classifier` to recognise outcomes: a failure carrying this
    /// request's refusal token frees the key (see
    /// [`release_on_shed`](Self::release_on_shed); a classifier that drops
    /// the token frees none), and with
    /// [`release_on_transient`](Self::release_on_transient) so does a
    /// transient failure.
    pub fn classifier<C2>(self, classifier: C2) -> IdempotencyGuardLayer<St, C2> {
        IdempotencyGuardLayer {
            store: self.store,
            classifier,
            config: self.config,
        }
    }
}

impl<S, St: Clone, C: Clone> Layer<S> for IdempotencyGuardLayer<St, C> {
    type Service = IdempotencyGuard<S, St, C>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyGuard::new(
            inner,
            self.store.clone(),
            self.classifier.clone(),
            self.config.clone(),
        )
    }
}

impl<St: fmt::Debug, C: fmt::Debug> fmt::Debug for IdempotencyGuardLayer<St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyGuardLayer")
            .field("store", &self.store)
            .field("classifier", &self.classifier)
            .field("config", &self.config)
            .finish()
    }
}
