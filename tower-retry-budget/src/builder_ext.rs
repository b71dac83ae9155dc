//! [`ServiceBuilderExt`]: the retry layer as a `ServiceBuilder` method.

use tower::layer::util::Stack;
use tower::ServiceBuilder;

use crate::hold::Hold;
use crate::RetryLayer;

mod sealed {
    pub trait Sealed {}
    impl<L> Sealed for tower::ServiceBuilder<L> {}
}

/// Adds [`retry_with`](Self::retry_with) to [`tower::ServiceBuilder`].
///
/// The method is not called `retry`: `ServiceBuilder` has an inherent
/// `retry` method for tower's own retry policies, and an inherent method
/// always wins over a trait's.
///
/// Sealed: implemented for `ServiceBuilder` only.
///
/// ```
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_classify::BoxError;
/// use tower_retry_budget::{RetryLayer, ServiceBuilderExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// let retry = RetryLayer::builder().name("inventory").max_retries(2).build()?;
/// let service = ServiceBuilder::new()
///     .retry_with(retry)
///     .service(service_fn(|n: u32| async move { Ok::<_, BoxError>(n + 1) }));
/// assert_eq!(service.oneshot(41).await?, 42);
/// # Ok(()) }
/// ```
pub trait ServiceBuilderExt<L>: sealed::Sealed + Sized {
    /// Retries failed calls of the services below with `layer`.
    fn retry_with<C, R, H: Hold<C, R>>(
        self,
        layer: RetryLayer<C, R, H>,
    ) -> ServiceBuilder<Stack<RetryLayer<C, R, H>, L>>;
}

impl<L> ServiceBuilderExt<L> for ServiceBuilder<L> {
    fn retry_with<C, R, H: Hold<C, R>>(
        self,
        layer: RetryLayer<C, R, H>,
    ) -> ServiceBuilder<Stack<RetryLayer<C, R, H>, L>> {
        self.layer(layer)
    }
}
