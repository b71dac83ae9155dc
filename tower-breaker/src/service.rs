//! [`CircuitBreaker`], the service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::futures::OwnedNotified;
use tokio::time::Sleep;
use tower_classify::{BoxError, Classify};
use tower_service::Service;

use crate::error::CircuitOpen;
use crate::future::{Recorder, ResponseFuture};
use crate::machine::{Breaker, Readiness};
use crate::permit::Permit;
use crate::share::BreakerRef;
use crate::state::State;

/// A service guarded by a circuit breaker; see [`CircuitBreakerLayer`](crate::CircuitBreakerLayer).
///
/// `poll_ready` forwards the inner service's readiness; `call` fails at once
/// with [`CircuitOpen`] when the breaker refuses the call, without touching
/// the inner service (tower's load-shed pattern). With
/// [`pending_when_open`](crate::Builder::pending_when_open), `poll_ready`
/// instead returns `Pending` while the breaker is open.
///
/// While the breaker refuses calls, `poll_ready` does not wait for the inner
/// service at all: a dependency that is down often has a client that is not
/// ready either (a full buffer, a saturated concurrency limit), and the point
/// of an open circuit is not to wait for it. The call that follows is then
/// refused, even if the circuit half-opened in between, because the inner
/// service was not made ready for it.
///
/// Clones share the breaker; a clone inherits neither a pending wait nor a
/// refusal decided by `poll_ready`.
pub struct CircuitBreaker<S, C> {
    inner: S,
    breaker: BreakerRef,
    classifier: C,
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

impl<S, C> CircuitBreaker<S, C> {
    pub(crate) fn new(inner: S, breaker: BreakerRef, classifier: C) -> Self {
        CircuitBreaker {
            inner,
            breaker,
            classifier,
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

    /// The breaker's current state.
    pub fn state(&self) -> State {
        self.breaker().state()
    }

    #[inline]
    fn breaker(&self) -> &Breaker {
        self.breaker.breaker()
    }

    /// Admits or refuses one call. `Ok(None)` in disabled mode.
    #[inline]
    pub(crate) fn admit(&mut self) -> Result<Option<Permit>, CircuitOpen> {
        if self.refuse_next {
            self.refuse_next = false;
            return Err(self.breaker().rejection());
        }
        if self.breaker().disabled {
            return Ok(None);
        }
        Breaker::admit(&self.breaker).map(Some)
    }

    /// `poll_ready` for both service flavours: the breaker first (pending
    /// mode, or a refusal that makes the inner service's readiness moot),
    /// then the inner service.
    #[inline]
    pub(crate) fn poll_ready_with<E>(
        &mut self,
        cx: &mut Context<'_>,
        poll_inner: impl FnOnce(&mut S, &mut Context<'_>) -> Poll<Result<(), E>>,
    ) -> Poll<Result<(), E>> {
        if self.poll_breaker(cx).is_pending() {
            return Poll::Pending;
        }
        if !self.breaker().disabled && self.breaker().refusing().is_some() {
            self.refuse_next = true;
            return Poll::Ready(Ok(()));
        }
        self.refuse_next = false;
        poll_inner(&mut self.inner, cx)
    }

    #[cfg(feature = "http")]
    pub(crate) fn classifier(&self) -> &C {
        &self.classifier
    }

    #[cfg(feature = "http")]
    pub(crate) fn inner_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Pending mode: `Ready` once the breaker would admit a call.
    #[inline]
    pub(crate) fn poll_breaker(&mut self, cx: &mut Context<'_>) -> Poll<()> {
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
            self.waiting = match self.breaker().readiness() {
                Readiness::Ready => return Poll::Ready(()),
                Readiness::Until(at) => Some(Box::new(Wait {
                    changed,
                    until: Some(Box::pin(tokio::time::sleep_until(at))),
                })),
                Readiness::Change => Some(Box::new(Wait {
                    changed,
                    until: None,
                })),
            };
        }
    }
}

impl<S: Clone, C: Clone> Clone for CircuitBreaker<S, C> {
    fn clone(&self) -> Self {
        CircuitBreaker {
            inner: self.inner.clone(),
            breaker: self.breaker.clone(),
            classifier: self.classifier.clone(),
            waiting: None,
            refuse_next: false,
        }
    }
}

impl<S: fmt::Debug, C: fmt::Debug> fmt::Debug for CircuitBreaker<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("inner", &self.inner)
            .field("breaker", self.breaker())
            .field("classifier", &self.classifier)
            .field("waiting", &self.waiting.is_some())
            .finish()
    }
}

impl<S, C, Req> Service<Req> for CircuitBreaker<S, C>
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
        match self.admit() {
            Ok(permit) => {
                let recorder = permit.map(|p| Recorder::new(p, self.classifier.clone()));
                ResponseFuture::called(self.inner.call(req), recorder)
            }
            Err(open) => ResponseFuture::rejected(open),
        }
    }
}
