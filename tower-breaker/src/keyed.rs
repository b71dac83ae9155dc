//! Keyed breakers: one breaker per dependency, in a bounded map.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use tower_classify::{BoxError, Classify};
use tower_layer::Layer;
use tower_service::Service;

use crate::admin::BreakerHandle;
use crate::future::{Recorder, ResponseFuture};
use crate::layer::Builder;
use crate::state::{Breaker, Settings, State};

/// One breaker per key, computed from each request by a key function: a host,
/// a route, a `channel:connector` pair. A dependency that fails opens only its
/// own breaker; the others keep passing.
///
/// The map is bounded at [`max_breakers`](Builder::max_breakers). A new key
/// beyond that evicts the least recently used breaker that is **closed**:
/// evicting an open breaker would re-admit full load to a dependency known to
/// be broken. Only when every breaker is open (or half-open) does plain LRU
/// apply, with a `tracing` warning. A breaker an operator forced open or
/// closed is never evicted; when every breaker is forced, a new key gets a
/// breaker of its own for that call that is not kept. State is per process.
///
/// The key function sees `&Req` and returns anything that is `AsRef<str>`:
/// return a `&'static str` or a cheap clone (an `http::uri::Authority`) where
/// you can, since it runs on every call. The map lookup takes a short lock;
/// the breakers themselves are lock-free as in [`CircuitBreakerLayer`](crate::CircuitBreakerLayer).
///
/// ```
/// use tower::{service_fn, Layer, ServiceExt};
/// use tower_breaker::CircuitBreakerLayer;
/// use tower_classify::{BoxError, ErrorChainClassifier};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// // Requests are (host, path) pairs here; one breaker per host.
/// let layer = CircuitBreakerLayer::builder()
///     .max_breakers(100)
///     .build_keyed(ErrorChainClassifier::new(), |req: &(&'static str, &str)| req.0)?;
/// let handle = layer.handle();
/// let service = layer.layer(service_fn(|_req: (&'static str, &str)| async {
///     Ok::<_, BoxError>("ok")
/// }));
/// service.oneshot(("crm.example", "/tickets")).await?;
/// assert_eq!(handle.list()[0].key, "crm.example");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct KeyedCircuitBreakerLayer<C, F> {
    registry: Arc<Registry>,
    classifier: C,
    key_fn: F,
}

impl<C: fmt::Debug, F> fmt::Debug for KeyedCircuitBreakerLayer<C, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedCircuitBreakerLayer")
            .field("registry", &self.registry)
            .field("classifier", &self.classifier)
            .field("key_fn", &std::any::type_name::<F>())
            .finish()
    }
}

impl<C, F> KeyedCircuitBreakerLayer<C, F> {
    /// Keyed breakers with the defaults; see [`Builder::build_keyed`] for the rest.
    pub fn new(classifier: C, key_fn: F) -> Self {
        Builder::new()
            .build_keyed(classifier, key_fn)
            .expect("the default configuration is valid")
    }

    pub(crate) fn from_parts(registry: Arc<Registry>, classifier: C, key_fn: F) -> Self {
        KeyedCircuitBreakerLayer {
            registry,
            classifier,
            key_fn,
        }
    }

    /// The admin handle of these breakers.
    pub fn handle(&self) -> BreakerHandle {
        BreakerHandle::new(Arc::clone(&self.registry))
    }
}

impl<S, C: Clone, F: Clone> Layer<S> for KeyedCircuitBreakerLayer<C, F> {
    type Service = KeyedCircuitBreaker<S, C, F>;

    fn layer(&self, inner: S) -> Self::Service {
        KeyedCircuitBreaker {
            inner,
            registry: Arc::clone(&self.registry),
            classifier: self.classifier.clone(),
            key_fn: self.key_fn.clone(),
        }
    }
}

/// A service guarded by one breaker per key; see [`KeyedCircuitBreakerLayer`].
#[derive(Clone)]
pub struct KeyedCircuitBreaker<S, C, F> {
    inner: S,
    registry: Arc<Registry>,
    classifier: C,
    key_fn: F,
}

impl<S, C, F> KeyedCircuitBreaker<S, C, F> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming the breaker.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The admin handle of these breakers.
    pub fn handle(&self) -> BreakerHandle {
        BreakerHandle::new(Arc::clone(&self.registry))
    }
}

impl<S: fmt::Debug, C: fmt::Debug, F> fmt::Debug for KeyedCircuitBreaker<S, C, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedCircuitBreaker")
            .field("inner", &self.inner)
            .field("registry", &self.registry)
            .field("classifier", &self.classifier)
            .finish()
    }
}

impl<S, C, F, K, Req> Service<Req> for KeyedCircuitBreaker<S, C, F>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    C: Classify<S::Response, S::Error> + Clone,
    F: Fn(&Req) -> K,
    K: AsRef<str>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let key = (self.key_fn)(&req);
        let breaker = self.registry.breaker(key.as_ref());
        if breaker.disabled {
            return ResponseFuture::called(self.inner.call(req), None);
        }
        match breaker.admit() {
            Ok(permit) => {
                let recorder = Recorder::new(permit, self.classifier.clone());
                ResponseFuture::called(self.inner.call(req), Some(recorder))
            }
            Err(open) => ResponseFuture::rejected(open),
        }
    }
}

/// The breakers of one layer, by key. A plain layer's registry holds its one
/// breaker (under the layer's name) so the admin handle treats both alike.
pub(crate) struct Registry {
    settings: Arc<Settings>,
    map: Mutex<Map>,
}

#[derive(Default)]
struct Map {
    entries: HashMap<Arc<str>, Entry>,
    /// A logical clock for LRU: bumped on every lookup.
    tick: u64,
}

struct Entry {
    breaker: Arc<Breaker>,
    last_used: u64,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("breakers", &self.lock().entries.len())
            .field("max_breakers", &self.settings.max_breakers)
            .finish()
    }
}

impl Registry {
    pub(crate) fn new(settings: Arc<Settings>) -> Self {
        Registry {
            settings,
            map: Mutex::new(Map::default()),
        }
    }

    /// The registry of a plain (unkeyed) layer and its one breaker.
    pub(crate) fn single(settings: Arc<Settings>) -> (Self, Arc<Breaker>) {
        let registry = Registry::new(Arc::clone(&settings));
        let breaker = Arc::new(Breaker::new(Arc::clone(&settings.name), settings));
        registry.lock().entries.insert(
            Arc::clone(&breaker.key),
            Entry {
                breaker: Arc::clone(&breaker),
                last_used: 0,
            },
        );
        (registry, breaker)
    }

    fn lock(&self) -> MutexGuard<'_, Map> {
        // A panic elsewhere while holding the lock leaves the map consistent
        // (every mutation is a single insert or remove), so keep serving.
        self.map
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The breaker for `key`, created (and a victim evicted) when new.
    pub(crate) fn breaker(&self, key: &str) -> Arc<Breaker> {
        let mut map = self.lock();
        map.tick += 1;
        let tick = map.tick;
        if let Some(entry) = map.entries.get_mut(key) {
            entry.last_used = tick;
            return Arc::clone(&entry.breaker);
        }
        let full = map.entries.len() >= self.settings.max_breakers;
        let key: Arc<str> = Arc::from(key);
        let breaker = Arc::new(Breaker::new(Arc::clone(&key), Arc::clone(&self.settings)));
        if full && !self.evict(&mut map) {
            // Every breaker is an operator's: none may go, and the map may
            // not grow. This call gets a fresh breaker that is not kept.
            return breaker;
        }
        map.entries.insert(
            key,
            Entry {
                breaker: Arc::clone(&breaker),
                last_used: tick,
            },
        );
        breaker
    }

    /// Evicts the least recently used closed breaker; only when there is none,
    /// the least recently used open one, with a warning. Never a forced one:
    /// `false` when every breaker is forced. A linear scan: it runs only when
    /// a new key arrives at a full map.
    fn evict(&self, map: &mut Map) -> bool {
        let lru = |closed_only: bool| {
            map.entries
                .iter()
                .filter(|(_, entry)| {
                    let state = entry.breaker.state();
                    !matches!(state, State::ForcedOpen | State::ForcedClosed)
                        && (!closed_only || !state.is_open())
                })
                .min_by_key(|(_, entry)| entry.last_used)
                .map(|(key, _)| Arc::clone(key))
        };
        let victim = match lru(true) {
            Some(victim) => {
                tracing::debug!(breaker = &*victim, "evicting closed circuit breaker");
                victim
            }
            None => {
                let Some(victim) = lru(false) else {
                    tracing::warn!(
                        max_breakers = self.settings.max_breakers,
                        "every circuit breaker is forced by an operator; a new key's breaker is not kept"
                    );
                    return false;
                };
                tracing::warn!(
                    breaker = &*victim,
                    max_breakers = self.settings.max_breakers,
                    "every circuit breaker is open; evicting the least recently used open one, \
                     which re-admits load to its dependency"
                );
                victim
            }
        };
        map.entries.remove(&victim);
        true
    }

    pub(crate) fn get(&self, key: &str) -> Option<Arc<Breaker>> {
        self.lock()
            .entries
            .get(key)
            .map(|entry| Arc::clone(&entry.breaker))
    }

    pub(crate) fn all(&self) -> Vec<Arc<Breaker>> {
        self.lock()
            .entries
            .values()
            .map(|entry| Arc::clone(&entry.breaker))
            .collect()
    }
}
