//! The client side: give each logical call one `Idempotency-Key`.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderValue, Request};
use tower_classify::http::{Idempotency, IDEMPOTENCY_KEY};
use tower_layer::Layer;
use tower_service::Service;

type Generate = Arc<dyn Fn() -> HeaderValue + Send + Sync>;

/// Adds an `Idempotency-Key` to each request that has none, so that the
/// server's [`IdempotencyGuard`](crate::IdempotencyGuard) recognises repeats.
///
/// Put it **outside** the retry and dead-letter layers, so every retry and
/// an operator's replay of one logical call carry the same key. Only
/// non-idempotent methods get a key by default; a key the caller set is
/// kept. With a key, tower-classify's
/// [`Idempotency`](tower_classify::http::Idempotency) policy lets the retry
/// layer retry the POST.
///
/// ```
/// use http::Request;
/// use tower::{service_fn, Layer, ServiceExt};
/// use tower_idempotency::IdempotencyKeyLayer;
///
/// # tokio_test::block_on(async {
/// let service = IdempotencyKeyLayer::new().layer(service_fn(|req: Request<()>| async move {
///     Ok::<_, std::convert::Infallible>(req.headers()["idempotency-key"].clone())
/// }));
/// let key = service.oneshot(Request::post("/orders").body(()).unwrap()).await.unwrap();
/// assert_eq!(key.len(), 32);
/// # });
/// ```
#[derive(Clone)]
pub struct IdempotencyKeyLayer {
    generate: Generate,
    all_methods: bool,
}

impl Default for IdempotencyKeyLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl IdempotencyKeyLayer {
    /// Keys of 32 random hex digits (128 bits), for non-idempotent methods.
    pub fn new() -> Self {
        IdempotencyKeyLayer {
            generate: Arc::new(|| {
                HeaderValue::try_from(format!("{:032x}", fastrand::u128(..)))
                    .expect("hex digits are a valid header value")
            }),
            all_methods: false,
        }
    }

    /// Makes keys with `generate` (a UUID, a key derived from a business id)
    /// instead.
    pub fn generate<F>(mut self, generate: F) -> Self
    where
        F: Fn() -> HeaderValue + Send + Sync + 'static,
    {
        self.generate = Arc::new(generate);
        self
    }

    /// Adds a key to requests of every method (default `false`).
    pub fn all_methods(mut self, yes: bool) -> Self {
        self.all_methods = yes;
        self
    }
}

impl fmt::Debug for IdempotencyKeyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyKeyLayer")
            .field("all_methods", &self.all_methods)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for IdempotencyKeyLayer {
    type Service = SetIdempotencyKey<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SetIdempotencyKey {
            inner,
            layer: self.clone(),
        }
    }
}

/// Adds an `Idempotency-Key` to requests without one; made by
/// [`IdempotencyKeyLayer`].
#[derive(Clone, Debug)]
pub struct SetIdempotencyKey<S> {
    inner: S,
    layer: IdempotencyKeyLayer,
}

impl<S> SetIdempotencyKey<S> {
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

impl<S, B> Service<Request<B>> for SetIdempotencyKey<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let wanted = self.layer.all_methods || !Idempotency::method_is_idempotent(request.method());
        if wanted && !request.headers().contains_key(IDEMPOTENCY_KEY) {
            request
                .headers_mut()
                .insert(IDEMPOTENCY_KEY, (self.layer.generate)());
        }
        self.inner.call(request)
    }
}
