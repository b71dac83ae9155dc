use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_classify::{BoxError, Classify};
use tower_service::Service;

use crate::future::{self, ResponseFuture};
use crate::policy::Policy;
use crate::replay::{Replay, StopReport};

/// Retries failed calls of `S`; made by a [`RetryLayer`](crate::RetryLayer).
///
/// Clones share the layer's settings and budget. Each call clones the inner
/// service once, for the retries: the clone is driven ready again
/// (`poll_ready`) before every retry, as the `Service` contract requires.
pub struct Retry<S, C, R> {
    inner: S,
    policy: Arc<Policy<C, R>>,
}

impl<S, C, R> Retry<S, C, R> {
    pub(crate) fn from_policy(inner: S, policy: Arc<Policy<C, R>>) -> Self {
        Retry { inner, policy }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming `self`.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, C, R> Clone for Retry<S, C, R> {
    fn clone(&self) -> Self {
        Retry {
            inner: self.inner.clone(),
            policy: Arc::clone(&self.policy),
        }
    }
}

impl<S: fmt::Debug, C: fmt::Debug, R: fmt::Debug> fmt::Debug for Retry<S, C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("inner", &self.inner)
            .field("policy", &self.policy)
            .finish()
    }
}

impl<S, C, R, Req> Service<Req> for Retry<S, C, R>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    C: Classify<S::Response, BoxError>,
    R: Replay<Req> + StopReport<S::Response>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, Req, C, R>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        // The service made ready by `poll_ready` takes this call and goes with
        // the future for the retries; a fresh clone stays here.
        start(&self.policy, &mut self.inner, request)
    }
}

/// The service made ready for a call: a `Retry`'s or a `Hedge`'s own,
/// or one the caller hands over to the call, as the per-method router does
/// rather than have it cloned once more.
pub(crate) trait ReadyService<S> {
    /// The service, for a first attempt the future does not keep it for
    /// (a call that will not be hedged).
    fn service(&mut self) -> &mut S;

    /// The ready service, for the future to keep for its attempts; a
    /// layer's own is replaced by a fresh clone.
    fn take_ready(self) -> S;

    /// A clone, for a future that sends nothing (its deadline is past);
    /// the ready service stays ready in the layer, or, handed over, is
    /// dropped at once: what `poll_ready` reserved (a concurrency permit,
    /// a queue slot) is not held by a call that will not use it.
    fn spare(self) -> S;
}

impl<S: Clone> ReadyService<S> for &mut S {
    fn service(&mut self) -> &mut S {
        self
    }

    fn take_ready(self) -> S {
        let clone = self.clone();
        std::mem::replace(self, clone)
    }

    fn spare(self) -> S {
        self.clone()
    }
}

/// A service handed over to the call (see [`ReadyService`]).
#[cfg(feature = "grpc-service-config")]
pub(crate) struct HandedOver<S>(pub(crate) S);

#[cfg(feature = "grpc-service-config")]
impl<S: Clone> ReadyService<S> for HandedOver<S> {
    fn service(&mut self) -> &mut S {
        &mut self.0
    }

    fn take_ready(self) -> S {
        self.0
    }

    fn spare(self) -> S {
        self.0.clone()
    }
}

/// [`Retry::call`], on the service `ready` gives, which the future keeps
/// for the retries.
///
/// The service is taken where it is needed, after the request is kept:
/// taken first, it is one more value held across the copy of the
/// request's head (36 instructions a call over HTTP).
#[inline]
pub(crate) fn start<S, C, R, Req>(
    policy: &Arc<Policy<C, R>>,
    ready: impl ReadyService<S>,
    request: Req,
) -> ResponseFuture<S, Req, C, R>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    C: Classify<S::Response, BoxError>,
    R: Replay<Req> + StopReport<S::Response>,
{
    let cold = match future::cold_state(policy, policy.replay.deadline(&request)) {
        Some(cold) if policy.no_time_for_an_attempt(cold.deadline()) => {
            // Not sent at all (nor deposited as traffic): the caller
            // could not use its answer.
            return ResponseFuture::expired(ready.spare(), Arc::clone(policy), cold);
        }
        cold => cold,
    };
    if let Some(budget) = &policy.budget {
        budget.deposit();
    }
    // What the retries are made from is kept now: the call consumes `request`.
    let kept = if policy.max_retries > 0 {
        policy.replay.keep(&request)
    } else {
        None
    };
    let mut request = request;
    if let Some(cold) = &cold {
        policy.replay.before_send(&mut request, cold.deadline());
    }
    let mut service = ready.take_ready();
    let first = future::first_call(&cold, &mut service, request);
    ResponseFuture::new(first, service, kept, Arc::clone(policy), cold)
}
