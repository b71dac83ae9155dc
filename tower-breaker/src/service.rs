//! [`CircuitBreaker`], the service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

#[cfg(feature = "http")]
use http::{Request, Response};
#[cfg(feature = "http")]
use http_body::Body;
use tokio::sync::futures::OwnedNotified;
use tokio::time::Sleep;
#[cfg(feature = "http")]
use tower_classify::SettleBody;
use tower_classify::{BoxError, Classify};
use tower_service::Service;

use crate::answer::Plain;
#[cfg(feature = "http")]
use crate::answer::{Http503, HttpError};
use crate::error::CircuitOpen;
use crate::future::{Recorder, ResponseFuture};
use crate::machine::{Breaker, Readiness};
#[cfg(feature = "http")]
use crate::open::OpenCall;
use crate::share::BreakerRef;

/// A service guarded by a circuit breaker; see [`CircuitBreakerLayer`](crate::CircuitBreakerLayer).
///
/// `A` is the breaker's [answer](crate::answer): what a refused call gets,
/// and whether a response is judged at its head or where its body ends.
///
/// While the breaker refuses calls, `poll_ready` is ready at once without
/// polling the inner service ([crate docs](crate#with-axum)): a dependency
/// that is down often has a client that is not ready either. The call that
/// follows is then refused, even if the circuit half-opened in between,
/// because the inner service was not made ready for it.
///
/// Clones share the breaker; a clone inherits neither a pending wait nor a
/// refusal decided by `poll_ready`.
pub struct CircuitBreaker<S, C, A = Plain> {
    inner: S,
    breaker: BreakerRef,
    classifier: C,
    answer: A,
    /// Boxed: pending mode is rare, and a null pointer is the cheapest
    /// thing for every clone of the service to carry and drop.
    waiting: Option<Box<Wait>>,
    /// `poll_ready` saw the circuit refusing and did not poll `inner`.
    refuse_next: bool,
}

/// What `poll_ready` waits on in pending mode: the next state change, and
/// the end of the open period when it is known.
struct Wait {
    changed: Pin<Box<OwnedNotified>>,
    until: Option<Pin<Box<Sleep>>>,
}

impl<S, C, A> CircuitBreaker<S, C, A> {
    pub(crate) fn new(inner: S, breaker: BreakerRef, classifier: C, answer: A) -> Self {
        CircuitBreaker {
            inner,
            breaker,
            classifier,
            answer,
            waiting: None,
            refuse_next: false,
        }
    }

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

    #[inline]
    fn breaker(&self) -> &Breaker {
        self.breaker.breaker()
    }

    /// `call` for every answer: the inner service's call with a recorder,
    /// or the refusal that `refused` makes of the breaker's and the
    /// request's.
    #[inline]
    fn call_with<Req>(
        &mut self,
        req: Req,
        refused: impl FnOnce(CircuitOpen, &Req) -> CircuitOpen,
    ) -> ResponseFuture<S::Future, C, A>
    where
        S: Service<Req>,
        C: Clone,
    {
        let admitted = if self.refuse_next {
            self.refuse_next = false;
            Err(self.breaker().rejection())
        } else {
            Recorder::admit(&self.breaker, &self.classifier)
        };
        match admitted {
            Ok(recorder) => ResponseFuture::called(self.inner.call(req), recorder),
            Err(open) => ResponseFuture::rejected(refused(open, &req)),
        }
    }

    /// `poll_ready` for every answer: the breaker first (pending mode, or a
    /// refusal that makes the inner service's readiness moot), then the
    /// inner service.
    #[inline]
    fn poll_ready_with<E>(
        &mut self,
        cx: &mut Context<'_>,
        poll_inner: impl FnOnce(&mut S, &mut Context<'_>) -> Poll<Result<(), E>>,
    ) -> Poll<Result<(), E>> {
        if self.poll_breaker(cx).is_pending() {
            return Poll::Pending;
        }
        if !self.breaker().disabled && self.breaker().refusing() {
            self.refuse_next = true;
            return Poll::Ready(Ok(()));
        }
        self.refuse_next = false;
        poll_inner(&mut self.inner, cx)
    }

    /// Pending mode: `Ready` once the breaker would admit a call.
    #[inline]
    fn poll_breaker(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.breaker().pending_when_open {
            return Poll::Ready(());
        }
        loop {
            if let Some(wait) = &mut self.waiting {
                let changed = wait.changed.as_mut().poll(cx).is_ready();
                let elapsed = wait
                    .until
                    .as_mut()
                    .is_some_and(|sleep| sleep.as_mut().poll(cx).is_ready());
                if !changed && !elapsed {
                    return Poll::Pending;
                }
                self.waiting = None;
            }
            if self.breaker().readiness() == Readiness::Ready {
                return Poll::Ready(());
            }
            let Some(notify) = self.breaker().change_notifier() else {
                return Poll::Ready(());
            };
            // Register for the next change *before* looking again, so a
            // change between the two looks is not missed.
            let mut changed = Box::pin(Arc::clone(notify).notified_owned());
            changed.as_mut().enable();
            let until = match self.breaker().readiness() {
                Readiness::Ready => return Poll::Ready(()),
                Readiness::Until(at) => Some(Box::pin(tokio::time::sleep_until(at))),
                Readiness::Change => None,
            };
            self.waiting = Some(Box::new(Wait { changed, until }));
        }
    }
}

impl<S: Clone, C: Clone, A: Clone> Clone for CircuitBreaker<S, C, A> {
    fn clone(&self) -> Self {
        CircuitBreaker {
            inner: self.inner.clone(),
            breaker: self.breaker.clone(),
            classifier: self.classifier.clone(),
            answer: self.answer.clone(),
            waiting: None,
            refuse_next: false,
        }
    }
}

impl<S: fmt::Debug, C: fmt::Debug, A: fmt::Debug> fmt::Debug for CircuitBreaker<S, C, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("inner", &self.inner)
            .field("breaker", self.breaker())
            .field("classifier", &self.classifier)
            .field("answer", &self.answer)
            .field("waiting", &self.waiting.is_some())
            .finish()
    }
}

impl<S, C, Req> Service<Req> for CircuitBreaker<S, C, Plain>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    C: Classify<S::Response, BoxError> + Clone,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, C>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.poll_ready_with(cx, |inner, cx| inner.poll_ready(cx).map_err(Into::into))
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        self.call_with(req, |open, _| open)
    }
}

/// The refusal of `req`, carrying its
/// [`RefusalToken`](tower_classify::RefusalToken) when it has one.
#[cfg(feature = "http")]
fn refusing<B>(open: CircuitOpen, req: &Request<B>) -> CircuitOpen {
    open.refusing(req.extensions().get().copied())
}

#[cfg(feature = "http")]
impl<S, C, ReqB, B> Service<Request<ReqB>> for CircuitBreaker<S, C, Http503>
where
    S: Service<Request<ReqB>, Response = Response<B>>,
    C: Classify<Response<B>, S::Error> + Clone,
    B: From<String>,
{
    type Response = Response<B>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, C, Http503>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.poll_ready_with(cx, S::poll_ready)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        self.call_with(req, refusing)
    }
}

#[cfg(feature = "http")]
impl<S, C, ReqB, B> Service<Request<ReqB>> for CircuitBreaker<S, C, HttpError>
where
    S: Service<Request<ReqB>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    C: Classify<Response<B>, BoxError> + Clone,
    B: Body,
{
    type Response = Response<SettleBody<B, OpenCall<C>>>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, C, HttpError>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.poll_ready_with(cx, |inner, cx| inner.poll_ready(cx).map_err(Into::into))
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        self.call_with(req, refusing)
    }
}
