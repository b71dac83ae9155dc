use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::Instant;
use tower_classify::{BoxError, Classify};
use tower_service::Service;

use super::future::ResponseFuture;
use super::policy::HedgePolicy;
use crate::policy::too_little_left;
use crate::replay::Replay;
use crate::service::take_ready;

/// Hedges slow calls of `S`; made by a [`HedgeLayer`](super::HedgeLayer).
///
/// Clones share the layer's settings, latency window and budget. A call
/// that may be hedged clones the inner service once, for its hedges: the
/// clone is driven ready (`poll_ready`) before each hedge, as the
/// `Service` contract requires, and dropped as soon as no further hedge
/// can be sent.
#[derive(Debug)]
pub struct Hedge<S, C, R> {
    inner: S,
    policy: Arc<HedgePolicy<C, R>>,
}

impl<S, C, R> Hedge<S, C, R> {
    pub(crate) fn from_policy(inner: S, policy: Arc<HedgePolicy<C, R>>) -> Self {
        Hedge { inner, policy }
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

impl<S: Clone, C, R> Clone for Hedge<S, C, R> {
    fn clone(&self) -> Self {
        Hedge {
            inner: self.inner.clone(),
            policy: Arc::clone(&self.policy),
        }
    }
}

impl<S, C, R, Req> Service<Req> for Hedge<S, C, R>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    C: Classify<S::Response, BoxError>,
    R: Replay<Req>,
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

/// [`Hedge::call`], on the layer's service `inner` (the per-method
/// router's, for a hedged method): a call that may be hedged takes it
/// for its future, any other is made on it in place.
#[inline]
pub(crate) fn start<S, C, R, Req>(
    policy: &Arc<HedgePolicy<C, R>>,
    inner: &mut S,
    request: Req,
) -> ResponseFuture<S, Req, C, R>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    C: Classify<S::Response, BoxError>,
    R: Replay<Req>,
{
    let deadline = policy.replay.deadline(&request).map(|d| d.instant());
    if let Some(left) = too_little_left(deadline, policy.min_attempt_time) {
        // Not sent at all (nor counted as load): the caller could not use
        // its answer.
        return ResponseFuture::expired(left, Arc::clone(policy));
    }
    policy.deposit();
    // Claimed before the first attempt, as `Retry` claims it (see
    // `tower_classify::attempts`).
    let reports = tower_classify::attempts::claim_reports();
    // A hedge needs a delay (a percentile one is unknown until the
    // window has enough samples) and what it is made from, kept now:
    // the first attempt consumes `request`.
    let hedge = policy
        .delay
        .current()
        .and_then(|delay| Some((delay, policy.replay.keep(&request)?)));
    let mut request = request;
    policy.replay.before_send(&mut request, deadline);
    let started = policy.delay.records().then(Instant::now);
    match hedge {
        None => {
            let first = inner.call(request);
            ResponseFuture::unhedged(first, started, reports, Arc::clone(policy))
        }
        Some((delay, kept)) => {
            // The service made ready by `poll_ready` takes the first
            // attempt and goes with the future for the hedges.
            let mut service = take_ready(inner);
            let first = service.call(request);
            ResponseFuture::hedged(
                first,
                service,
                kept,
                delay,
                deadline,
                started,
                reports,
                Arc::clone(policy),
            )
        }
    }
}
