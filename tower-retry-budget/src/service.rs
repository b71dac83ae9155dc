use std::sync::Arc;
use std::task::{Context, Poll};

use tower_classify::{BoxError, Classify};
use tower_service::Service;

use crate::cold;
use crate::future::ResponseFuture;
use crate::policy::{too_little_left, Policy};
use crate::replay::{Replay, StopReport};

/// Retries failed calls of `S`; made by a [`RetryLayer`](crate::RetryLayer).
///
/// Clones share the layer's settings and budget. Each call clones the inner
/// service once, for the retries: the clone is driven ready again
/// (`poll_ready`) before every retry, as the `Service` contract requires.
#[derive(Debug)]
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
        start(&self.policy, &mut self.inner, request)
    }
}

/// The service made ready by `poll_ready`, for a future that keeps it for
/// its attempts; a fresh clone stays in the layer.
#[inline]
pub(crate) fn take_ready<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    std::mem::replace(inner, clone)
}

/// [`Retry::call`], on the layer's service `inner` (the per-method
/// router's, for a retried method), which the future takes for the
/// retries.
///
/// The service is taken where it is needed, after the request is kept:
/// taken first, it is one more value held across the copy of the
/// request's head (36 instructions a call over HTTP).
#[inline]
pub(crate) fn start<S, C, R, Req>(
    shared: &Arc<Policy<C, R>>,
    inner: &mut S,
    request: Req,
) -> ResponseFuture<S, Req, C, R>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    C: Classify<S::Response, BoxError>,
    R: Replay<Req> + StopReport<S::Response>,
{
    let policy = &**shared;
    let cold = match cold::cold_state(policy, policy.replay.deadline(&request)) {
        Some(cold) if too_little_left(cold.retry.deadline, policy.min_attempt_time).is_some() => {
            // Not sent at all (nor deposited as traffic): the caller
            // could not use its answer. The ready service stays ready
            // here: what `poll_ready` reserved (a concurrency permit, a
            // queue slot) is not held by a call that sends nothing.
            return ResponseFuture::expired(inner.clone(), Arc::clone(shared), cold);
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
        policy.replay.before_send(&mut request, cold.retry.deadline);
    }
    // Cloned before the first attempt is made, so that the attempt's
    // future goes into the response future without a move around it.
    let shared = Arc::clone(shared);
    let mut service = take_ready(inner);
    // Called by a dead-letter layer (or another recorder of attempts), the
    // call reports its attempts to it, and a reporting layer below (a
    // hedge) does not: claimed before the first attempt is made (see
    // `tower_classify::attempts`).
    let reports = tower_classify::attempts::claim_reports();
    let first = cold::in_span(&cold, |s| &s.attempt, || service.call(request));
    ResponseFuture::new(first, service, kept, shared, cold, reports)
}

#[cfg(test)]
mod tests {
    use std::future::{ready, Future, Ready};
    use std::pin::pin;
    use std::sync::Arc;
    use std::task::{Context, Waker};

    use tower_layer::Layer;
    use tower_service::Service;

    use crate::RetryLayer;

    type Answer = Ready<Result<u32, std::io::Error>>;

    fn echo(n: u32) -> Answer {
        ready(Ok(n))
    }

    /// Each clone of a service and each call's response future holds one
    /// count of the layer's settings, and gives it back when dropped.
    #[test]
    fn services_and_calls_share_the_layers_settings() {
        let layer = RetryLayer::builder().build().unwrap();
        let settings = Arc::clone(layer.shared());
        let strong = || Arc::strong_count(&settings);
        let service = layer.layer(tower::service_fn(echo as fn(u32) -> Answer));
        let start = strong();
        let mut clones: Vec<_> = (0..4).map(|_| service.clone()).collect();
        let futures: Vec<_> = clones.iter_mut().map(|clone| clone.call(7)).collect();
        assert_eq!(strong() - start, 8);
        let mut cx = Context::from_waker(Waker::noop());
        for future in futures {
            assert!(pin!(future).poll(&mut cx).is_ready());
        }
        drop(clones);
        assert_eq!(strong(), start);
    }
}
