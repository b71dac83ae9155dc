//! Future types

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tower_classify::BoxError;

/// Response future of [`IdempotencyGuard`](super::IdempotencyGuard).
///
/// A guarded call awaits the request body, the store's claim, the inner
/// service, the response body and the store's completion, and the stores'
/// futures are not nameable (`impl Future`), so the steps run in one boxed
/// future, as in [`DeadLetter`](crate::DeadLetter).
///
/// Dropping it before it finishes (the client went away, a timeout above it)
/// releases the key the call holds, so a cancelled request does not lock its
/// key until the in-flight TTL.
pub struct ResponseFuture<T> {
    inner: Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>,
}

impl<T> ResponseFuture<T> {
    pub(crate) fn new(future: impl Future<Output = Result<T, BoxError>> + Send + 'static) -> Self {
        ResponseFuture {
            inner: Box::pin(future),
        }
    }
}

impl<T> Future for ResponseFuture<T> {
    type Output = Result<T, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<T> fmt::Debug for ResponseFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
