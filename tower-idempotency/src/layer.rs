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

/// Each setting's default is on its method; [`HttpClassifier`] classifies
/// answers. Clones of the layer and the services it make share the store.
#[derive(Clone, Debug)]
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
    /// events (default `"default"`); keep names few, never from requests.
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
    /// that crashed while holding it; the guard extends a live claim every
    /// third of it. Values below [`MIN_TTL`] are raised to it.
    pub fn in_flight_ttl(mut self, ttl: Duration) -> Self {
        self.config.in_flight_ttl = ttl.max(MIN_TTL);
        self
    }

    /// Stores responses whose body is at most `limit` bytes (default 1 MiB).
    /// A larger one still streams to the client whole, and the key is
    /// recorded as [not kept](crate::store::NotKept::TooLarge).
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

    /// Frees the key when the handler answers with a transient failure (5xx,
    /// 429, 408, a lost connection), so the client's retry runs the request
    /// again. Default `false`: such answers are stored and replayed.
    ///
    /// **A risk**: a handler that failed *after* a side effect runs again on
    /// the retry. Turn it on only for handlers whose transient failures
    /// happen before any side effect, or that are idempotent themselves.
    pub fn release_on_transient(mut self, yes: bool) -> Self {
        self.config.release_on_transient = yes;
        self
    }

    /// Frees the key when a layer between the guard and the handler refused
    /// the request *before the handler ran* and proves it with this
    /// request's [`RefusalToken`] (default `true`), so the client's retry
    /// runs once the dependency is back ([crate docs](crate#the-rules)).
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

    /// Uses `classifier` to recognise the refusals and transient failures
    /// that free a key (a classifier that drops the refusal token frees none).
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
        let (store, classifier) = (self.store.clone(), self.classifier.clone());
        IdempotencyGuard::new(inner, store, classifier, self.config.clone())
    }
}
