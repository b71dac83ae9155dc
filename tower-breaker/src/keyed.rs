//! Keyed breakers: one breaker per dependency, in a bounded map.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_classify::{BoxError, Classify};
use tower_layer::Layer;
use tower_service::Service;

use crate::admin::BreakerHandle;
use crate::future::{Recorder, ResponseFuture};
use crate::registry::Registry;
use crate::share::BreakerRef;

/// One breaker per key, computed from each request by a key function: a host,
/// a route, a `channel:connector` pair. A dependency that fails opens only its
/// own breaker; the others keep passing.
///
/// The map's bound, eviction order and metrics labels are in the [crate
/// docs](crate#keyed-breakers); "least recently used" is approximated as
/// the CLOCK page-replacement algorithm does (one used since it joined the
/// line goes to the back once instead of being evicted). When every breaker
/// is forced, new keys share one overflow breaker (its key is `<overflow>`;
/// it is not listed by the admin handle and has no state gauge) until an
/// operator resets one. State is per process.
///
/// The key function sees `&Req` and runs on every call: return a
/// `&'static str` or a cheap clone (an `Arc<str>`, an
/// `http::uri::Authority`) where you can.
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
    pub(crate) registry: Arc<Registry>,
    pub(crate) classifier: C,
    pub(crate) key_fn: F,
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
    C: Classify<S::Response, BoxError> + Clone,
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
        let breaker = BreakerRef(self.registry.breaker(key.as_ref()));
        match Recorder::admit(&breaker, &self.classifier) {
            Ok(recorder) => ResponseFuture::called(self.inner.call(req), recorder),
            Err(open) => ResponseFuture::rejected(open),
        }
    }
}
