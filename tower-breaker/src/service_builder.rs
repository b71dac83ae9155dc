//! [`ServiceBuilderExt`]: `.circuit_breaker(..)` on tower's `ServiceBuilder`.

use tower::ServiceBuilder;
use tower_layer::Stack;

use crate::hold::Hold;
use crate::keyed::KeyedCircuitBreakerLayer;
use crate::layer::CircuitBreakerLayer;

mod sealed {
    /// Only `tower::ServiceBuilder` implements [`ServiceBuilderExt`]: the
    /// trait can gain methods without breaking anyone.
    ///
    /// [`ServiceBuilderExt`]: super::ServiceBuilderExt
    pub trait Sealed {}

    impl<L> Sealed for tower::ServiceBuilder<L> {}
}

/// Adds this crate's layers to [`tower::ServiceBuilder`], as tower-http's
/// `ServiceBuilderExt` does for its own. Sealed: implemented for
/// `ServiceBuilder` only.
///
/// Each method is `.layer(layer)` under a name that says what it adds: the
/// layer goes *inside* the layers added before it, as with `.layer`.
///
/// ```
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_breaker::{CircuitBreakerLayer, ServiceBuilderExt};
/// use tower_classify::{BoxError, ErrorChainClassifier};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// let breaker = CircuitBreakerLayer::new(ErrorChainClassifier::new());
/// let handle = breaker.handle();
/// let service = ServiceBuilder::new()
///     .circuit_breaker(breaker)
///     .service(service_fn(|req: u32| async move { Ok::<_, BoxError>(req * 2) }));
/// assert_eq!(service.oneshot(21).await?, 42);
/// assert_eq!(handle.list()[0].failures, 0);
/// # Ok(())
/// # }
/// ```
pub trait ServiceBuilderExt<L>: sealed::Sealed + Sized {
    /// Adds a [`CircuitBreakerLayer`] (or one built with
    /// [`Builder::build`](crate::Builder::build), leaked or not).
    fn circuit_breaker<C, H: Hold>(
        self,
        layer: CircuitBreakerLayer<C, H>,
    ) -> ServiceBuilder<Stack<CircuitBreakerLayer<C, H>, L>>;

    /// Adds a [`KeyedCircuitBreakerLayer`]: one breaker per key.
    fn keyed_circuit_breaker<C, F>(
        self,
        layer: KeyedCircuitBreakerLayer<C, F>,
    ) -> ServiceBuilder<Stack<KeyedCircuitBreakerLayer<C, F>, L>>;
}

impl<L> ServiceBuilderExt<L> for ServiceBuilder<L> {
    fn circuit_breaker<C, H: Hold>(
        self,
        layer: CircuitBreakerLayer<C, H>,
    ) -> ServiceBuilder<Stack<CircuitBreakerLayer<C, H>, L>> {
        self.layer(layer)
    }

    fn keyed_circuit_breaker<C, F>(
        self,
        layer: KeyedCircuitBreakerLayer<C, F>,
    ) -> ServiceBuilder<Stack<KeyedCircuitBreakerLayer<C, F>, L>> {
        self.layer(layer)
    }
}
