use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_classify::{BoxError, Classify, FailureKind, Outcome, RetryHint};
use tower_service::Service;
use tracing::Span;

use super::policy::{HedgePolicy, Refusal};
use crate::error::DeadlineExceeded;
use crate::replay::{lost_its_body, Replay};

pin_project! {
    /// The response future of [`Hedge`](super::Hedge).
    ///
    /// It resolves with the first answer that wins; every other attempt is
    /// dropped before it resolves. Dropping it drops every attempt in flight
    /// and the hedge timer at once.
    pub struct ResponseFuture<S, Req, C, R>
    where
        S: Service<Req>,
        R: Replay<Req>,
    {
        #[pin]
        first: Option<S::Future>,
        // Everything a call that may be hedged needs; `None` for the others,
        // which allocate nothing.
        hedging: Option<Pin<Box<Hedging<S, Req, R::Kept>>>>,
        // When the first attempt was sent, for the latency window.
        started: Option<Instant>,
        // The caller's deadline left less than the minimum attempt time (this
        // much) at the call: no attempt was sent.
        expired: Option<Duration>,
        // The attempts are reported to the recording layer that called this
        // one (`tower_classify::attempts`): each failed attempt and each
        // hedge sent.
        reports: bool,
        policy: Arc<HedgePolicy<C, R>>,
    }
}

pin_project! {
    #[project = HedgingProj]
    struct Hedging<S, Req, K>
    where
        S: Service<Req>,
    {
        // The service and what the next hedge is made from; dropped as soon
        // as no further hedge can be sent, so that a readiness the service
        // holds (a concurrency permit, a buffer slot) is freed.
        next: Option<(S, K)>,
        delay: Duration,
        deadline: Option<Instant>,
        // When the next hedge is due; its timer is made on the first poll,
        // inside the runtime, not in `call`.
        due_at: Instant,
        #[pin]
        timer: Option<Sleep>,
        // The timer fired and the service is being driven ready.
        due: bool,
        // Attempts sent, the first included.
        sent: u32,
        // Attempts that answered.
        answered: u32,
        hedges: Vec<InFlight<S::Future>>,
        // The latest retryable failure, kept while other attempts run.
        failed: Option<Result<S::Response, BoxError>>,
    }
}

struct InFlight<F> {
    future: Pin<Box<F>>,
    attempt: u32,
    span: Span,
}

impl<S, Req, C, R> ResponseFuture<S, Req, C, R>
where
    S: Service<Req>,
    R: Replay<Req>,
{
    pub(crate) fn unhedged(
        first: S::Future,
        started: Option<Instant>,
        reports: bool,
        policy: Arc<HedgePolicy<C, R>>,
    ) -> Self {
        ResponseFuture {
            first: Some(first),
            hedging: None,
            started,
            expired: None,
            reports,
            policy,
        }
    }

    /// A call whose deadline left `left`, less than the minimum attempt
    /// time: it ends with [`DeadlineExceeded`] when first polled.
    pub(crate) fn expired(left: Duration, policy: Arc<HedgePolicy<C, R>>) -> Self {
        ResponseFuture {
            first: None,
            hedging: None,
            started: None,
            expired: Some(left),
            reports: false,
            policy,
        }
    }

    /// The attempts this call has sent so far, the first included.
    #[cfg(feature = "grpc-service-config")]
    pub(crate) fn attempts_sent(&self) -> u32 {
        match (&self.hedging, self.expired) {
            (Some(hedging), _) => hedging.sent,
            (None, Some(_)) => 0,
            (None, None) => 1,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn hedged(
        first: S::Future,
        service: S,
        kept: R::Kept,
        delay: Duration,
        deadline: Option<Instant>,
        started: Option<Instant>,
        reports: bool,
        policy: Arc<HedgePolicy<C, R>>,
    ) -> Self {
        let due_at = started.unwrap_or_else(Instant::now) + delay;
        let mut future = Self::unhedged(first, started, reports, policy);
        future.hedging = Some(Box::pin(Hedging {
            next: Some((service, kept)),
            delay,
            deadline,
            due_at,
            timer: None,
            due: false,
            sent: 1,
            answered: 0,
            hedges: Vec::new(),
            failed: None,
        }));
        future
    }
}

impl<S, Req, C, R> Future for ResponseFuture<S, Req, C, R>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    C: Classify<S::Response, BoxError>,
    R: Replay<Req>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let policy = &**this.policy;
        if let Some(left) = this.expired.take() {
            return Poll::Ready(Err(Box::new(DeadlineExceeded::new(
                left, 0, None, None, None,
            ))));
        }
        let Some(hedging) = this.hedging.as_mut() else {
            // No hedge for this call: the first attempt's answer is the call's.
            assert!(
                this.first.is_some(),
                "hedge future polled after it completed"
            );
            let (result, outcome) = ready!(poll_first(this.first, cx, policy, *this.started));
            if *this.reports && outcome.as_failure().is_some() {
                tower_classify::attempts::report_attempts(1, 1);
            }
            return Poll::Ready(result);
        };
        let reports = *this.reports;
        let mut hedging = hedging.as_mut().project();
        loop {
            let first = poll_first(this.first.as_mut(), cx, policy, *this.started);
            if let Poll::Ready((result, outcome)) = first {
                if let Some(result) = answered(&mut hedging, reports, &outcome, result, true) {
                    cancel_hedges(policy, hedging.hedges);
                    return Poll::Ready(result);
                }
            }

            let mut i = 0;
            while i < hedging.hedges.len() {
                let in_flight = &mut hedging.hedges[i];
                let polled = {
                    let _entered = in_flight.span.enter();
                    in_flight.future.as_mut().poll(cx)
                };
                let Poll::Ready(result) = polled else {
                    i += 1;
                    continue;
                };
                let in_flight = hedging.hedges.swap_remove(i);
                let result: Result<S::Response, BoxError> = result.map_err(Into::into);
                let outcome = policy.classifier.classify(result.as_ref());
                let answer = answered(&mut hedging, reports, &outcome, result, false);
                in_flight
                    .span
                    .record("outcome", if answer.is_some() { "won" } else { "failed" });
                let Some(result) = answer else { continue };
                policy.telemetry.won(in_flight.attempt);
                if this.first.is_some() {
                    // The first attempt ran at least this long: a lower bound
                    // of its latency, above the delay, so the percentile
                    // stays where it is.
                    policy.record_latency(*this.started);
                    this.first.set(None);
                    policy.telemetry.cancelled(1);
                }
                cancel_hedges(policy, hedging.hedges);
                return Poll::Ready(result);
            }

            if this.first.is_none() && hedging.hedges.is_empty() {
                // Every attempt failed retryably: the latest failure is the
                // call's answer, for a retry layer above to judge.
                match hedging.failed.take() {
                    Some(failed) => return Poll::Ready(failed),
                    None => panic!("hedge future polled after it completed"),
                }
            }

            let Some((service, kept)) = hedging.next.as_mut() else {
                return Poll::Pending;
            };
            if !*hedging.due {
                if hedging.timer.is_none() {
                    let due_at = *hedging.due_at;
                    hedging.timer.set(Some(tokio::time::sleep_until(due_at)));
                }
                let timer = hedging.timer.as_mut().as_pin_mut().expect("set above");
                ready!(timer.poll(cx));
                *hedging.due = true;
            }
            let attempt = *hedging.sent + 1;
            let sendable = match service.poll_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(error)) => {
                    let error: BoxError = error.into();
                    tracing::debug!(hedge = %policy.telemetry.name(), %error, "service not ready for a hedge");
                    Err(Refusal::NotReady)
                }
                // A streamed body that outgrew its recording cannot be sent
                // again, and the attempts in flight carry on.
                Poll::Ready(Ok(())) => match policy.replay.can_replay(kept) {
                    true => policy.replay.replay(kept, attempt - 1).ok(),
                    false => None,
                }
                .ok_or(Refusal::NotReplayable)
                .and_then(|request| policy.allow_hedge(*hedging.deadline).map(|()| request)),
            };
            let mut request = match sendable {
                Ok(request) => request,
                Err(refusal) => {
                    policy.telemetry.refused(attempt, refusal);
                    *hedging.next = None;
                    continue;
                }
            };
            *hedging.sent = attempt;
            policy.replay.before_send(&mut request, *hedging.deadline);
            let span = policy.telemetry.hedge_span(attempt, *hedging.delay);
            let future = span.in_scope(|| service.call(request));
            policy.telemetry.sent(attempt);
            if reports {
                tower_classify::attempts::report_attempts(attempt, *hedging.answered);
            }
            hedging.hedges.push(InFlight {
                future: Box::pin(future),
                attempt,
                span,
            });
            if attempt < policy.max_attempts {
                // One delay after this hedge went out, not after it was due:
                // a readiness stall does not bunch the next hedges together.
                *hedging.due = false;
                let next = Instant::now() + *hedging.delay;
                *hedging.due_at = next;
                if let Some(timer) = hedging.timer.as_mut().as_pin_mut() {
                    timer.reset(next);
                }
            } else {
                *hedging.next = None;
            }
            // Loop to poll the new hedge once, so it can wake the call.
        }
    }
}

/// Polls the first attempt, if still in flight: its answer, classified
/// (even when nothing is recorded: a classifier may count, as gRFC A6
/// throttling counts every answer), its latency recorded on a success.
fn poll_first<F, T, E, C, R>(
    mut first: Pin<&mut Option<F>>,
    cx: &mut Context<'_>,
    policy: &HedgePolicy<C, R>,
    started: Option<Instant>,
) -> Poll<(Result<T, BoxError>, Outcome)>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
    C: Classify<T, BoxError>,
{
    let Some(future) = first.as_mut().as_pin_mut() else {
        return Poll::Pending;
    };
    let result = ready!(future.poll(cx)).map_err(Into::into);
    first.set(None);
    let outcome = policy.classifier.classify(result.as_ref());
    if outcome == Outcome::Success {
        policy.record_latency(started);
    }
    Poll::Ready((result, outcome))
}

/// One more attempt (the `first`, or a hedge) answered `result`,
/// classified `outcome`: handed back when it is the call's answer, else
/// kept as a failure (one that lost its body only if no other was) and no
/// further hedge is sent. A failure is reported when the call `reports`
/// its attempts.
fn answered<S, Req, K>(
    hedging: &mut HedgingProj<'_, S, Req, K>,
    reports: bool,
    outcome: &Outcome,
    result: Result<S::Response, BoxError>,
    first: bool,
) -> Option<Result<S::Response, BoxError>>
where
    S: Service<Req>,
{
    *hedging.answered += 1;
    if reports && outcome.as_failure().is_some() {
        tower_classify::attempts::report_attempts(*hedging.sent, *hedging.answered);
    }
    // By the rules of the module docs: a transient failure or a local
    // refusal waits for the other attempts, unless marked final (a status
    // a gRPC hedging policy calls fatal); any other answer wins.
    let lost = matches!(&result, Err(error) if lost_its_body(error));
    let waits = lost
        || outcome.as_failure().is_some_and(|failure| {
            failure.hint != Some(RetryHint::Final)
                && (failure.kind.is_transient() || failure.kind == FailureKind::Shed)
        });
    if !waits {
        return Some(result);
    }
    // A lost body says nothing of the request, nor does a refusal proving
    // the first attempt went no further (its `RefusalToken`: hedges carry
    // none) say anything of a hedge that was sent, which may have reached a
    // guard's handler: either is the answer only if no other attempt failed.
    let refused_first = first
        && *hedging.sent > 1
        && outcome
            .as_failure()
            .is_some_and(|failure| failure.refusal.is_some());
    if lost || refused_first {
        hedging.failed.get_or_insert(result);
    } else {
        *hedging.failed = Some(result);
    }
    // No further hedge: the service clone and the kept request go at once.
    *hedging.next = None;
    None
}

/// Drops every hedge still in flight: another attempt answered.
fn cancel_hedges<F, C, R>(policy: &HedgePolicy<C, R>, hedges: &mut Vec<InFlight<F>>) {
    if hedges.is_empty() {
        return;
    }
    policy.telemetry.cancelled(hedges.len() as u64);
    for in_flight in hedges.drain(..) {
        in_flight.span.record("outcome", "cancelled");
    }
}

impl<S, Req, C, R> fmt::Debug for ResponseFuture<S, Req, C, R>
where
    S: Service<Req>,
    R: Replay<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hedges = self
            .hedging
            .as_ref()
            .map_or(0, |hedging| hedging.hedges.len());
        f.debug_struct("ResponseFuture")
            .field("first_in_flight", &self.first.is_some())
            .field("hedges_in_flight", &hedges)
            .finish_non_exhaustive()
    }
}
