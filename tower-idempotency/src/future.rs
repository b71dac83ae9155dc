//! Future types

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::Response;
use pin_project_lite::pin_project;

use crate::body::GuardBody;

/// The boxed steps of a guarded call.
pub(crate) type Guarded<ResB, E> =
    Pin<Box<dyn Future<Output = Result<Response<GuardBody<ResB>>, E>> + Send>>;

pin_project! {
    /// Response future of [`IdempotencyGuard`](crate::IdempotencyGuard).
    ///
    /// An unguarded request's is the inner future, unboxed; a guarded
    /// call's steps (claim, then call or compare) run in one boxed future,
    /// as the stores' futures cannot be named. Dropped after the service was
    /// called, it records the key as
    /// [`NotKept::Cancelled`](crate::store::NotKept::Cancelled).
    pub struct ResponseFuture<F, ResB, E> {
        #[pin]
        kind: Kind<F, ResB, E>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, ResB, E> {
        Passthrough { #[pin] future: F },
        Guarded { future: Guarded<ResB, E> },
    }
}

impl<F, ResB, E> ResponseFuture<F, ResB, E> {
    pub(crate) fn passthrough(future: F) -> Self {
        ResponseFuture {
            kind: Kind::Passthrough { future },
        }
    }

    pub(crate) fn guarded(future: Guarded<ResB, E>) -> Self {
        ResponseFuture {
            kind: Kind::Guarded { future },
        }
    }
}

impl<F, ResB, E> Future for ResponseFuture<F, ResB, E>
where
    F: Future<Output = Result<Response<ResB>, E>>,
{
    type Output = Result<Response<GuardBody<ResB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Passthrough { future } => {
                let response = ready!(future.poll(cx))?;
                Poll::Ready(Ok(response.map(GuardBody::new)))
            }
            KindProj::Guarded { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, ResB, E> fmt::Debug for ResponseFuture<F, ResB, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let guarded = matches!(self.kind, Kind::Guarded { .. });
        f.debug_struct("ResponseFuture")
            .field("guarded", &guarded)
            .finish_non_exhaustive()
    }
}
