//! `.dead_letter(…)` on tower's `ServiceBuilder`.

use tower::layer::util::Stack;
use tower::ServiceBuilder;

use crate::layer::DeadLetterLayer;

/// Adds the dead-letter layer to [`tower::ServiceBuilder`] by name, as
/// tower-http's `ServiceBuilderExt` does for its layers.
///
/// `.dead_letter(layer)` is `.layer(layer)` that reads as what it is and
/// takes only a [`DeadLetterLayer`]. The trait is sealed: it is implemented
/// for `ServiceBuilder` alone, so methods can be added without breaking
/// anyone.
///
/// ```
/// # tokio_test::block_on(async {
/// use bytes::Bytes;
/// use http::{Request, Response};
/// use http_body_util::Full;
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_poison::store::{DeadLetterStore, MemoryStore};
/// use tower_poison::{DeadLetterLayer, ServiceBuilderExt};
///
/// let store = MemoryStore::new(1_000);
/// let service = ServiceBuilder::new()
///     .dead_letter(DeadLetterLayer::new(store.clone()).label("orders"))
///     .service_fn(|_request: Request<_>| async {
///         let unavailable = Response::builder().status(503).body(Bytes::new()).unwrap();
///         Ok::<_, std::io::Error>(unavailable)
///     });
/// let request = Request::post("http://orders.internal/orders")
///     .body(Full::new(Bytes::from("{}")))
///     .unwrap();
/// let response = service.oneshot(request).await.unwrap();
/// assert_eq!(response.status(), 503);
/// assert_eq!(store.depth().await.unwrap(), 1);
/// # });
/// ```
pub trait ServiceBuilderExt<L>: sealed::Sealed<L> + Sized {
    /// Adds `layer`: failed calls of the services below are written to its
    /// store (see [`DeadLetterLayer`]).
    fn dead_letter<St, C, Cap>(
        self,
        layer: DeadLetterLayer<St, C, Cap>,
    ) -> ServiceBuilder<Stack<DeadLetterLayer<St, C, Cap>, L>>;
}

impl<L> ServiceBuilderExt<L> for ServiceBuilder<L> {
    fn dead_letter<St, C, Cap>(
        self,
        layer: DeadLetterLayer<St, C, Cap>,
    ) -> ServiceBuilder<Stack<DeadLetterLayer<St, C, Cap>, L>> {
        self.layer(layer)
    }
}

mod sealed {
    /// Only `ServiceBuilder` implements
    /// [`ServiceBuilderExt`](super::ServiceBuilderExt).
    pub trait Sealed<L> {}

    impl<L> Sealed<L> for tower::ServiceBuilder<L> {}
}
