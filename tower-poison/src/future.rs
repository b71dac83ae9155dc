//! Future types

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tower_classify::BoxError;

/// Response future of [`DeadLetter`](crate::DeadLetter).
///
/// A dead-letter call has up to three asynchronous steps (capture the request,
/// call the inner service, write the entry), and the stores' futures are not
/// nameable (stores return `impl Future`), so the steps run in one boxed
/// future. The box is one allocation per call, small next to the store I/O it
/// replaces a state machine for.
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
