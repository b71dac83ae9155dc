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
        // Dropped as soon as no further hedge can be sent, so that a
        // readiness it holds (a concurrency permit, a buffer slot) is freed.
        service: Option<S>,
        // What the next hedge is made from; `None` once no further hedge
        // may be sent.
        kept: Option<K>,
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

/// What an answer does to the call.
enum Verdict {
    /// It is the call's answer: a success, an ignored result or a failure
    /// that another attempt cannot fix (the request itself is wrong).
    Wins,
    /// A transient failure, or a local refusal (an open circuit or a full
    /// queue below refused this attempt, not the request): the other
    /// attempts may still succeed, and no further hedge is sent (retrying
    /// failures is a retry layer's job). A server's "do not retry" stops
    /// further hedges too, but does not cancel an attempt already running.
    Waits,
    /// The attempt lost its body to another ([`lost_its_body`]): it
    /// waits as a failure does, and its error is the call's answer only if
    /// no other attempt failed, for it says nothing of the request. Taken
    /// as the call's answer, it cancelled an attempt that was sending the
    /// whole body.
    LostItsBody,
}

/// The verdict on an answer; `hedged_first` when it is the first
/// attempt's, after a hedge was sent.
fn verdict<T>(outcome: &Outcome, result: &Result<T, BoxError>, hedged_first: bool) -> Verdict {
    if matches!(result, Err(error) if lost_its_body(error)) {
        return Verdict::LostItsBody;
    }
    match outcome.as_failure() {
        // A status the policy calls fatal (gRFC A6): the call's answer.
        Some(failure) if failure.hint == Some(RetryHint::Final) => Verdict::Wins,
        Some(failure) if failure.kind.is_transient() || failure.kind == FailureKind::Shed => {
            // A refusal proving the first attempt went no further (its
            // `RefusalToken`: hedges carry none) says nothing of a hedge
            // that was sent, which may have reached a guard's handler: like
            // a lost body, it answers only if no other attempt failed.
            if hedged_first && failure.refusal.is_some() {
                Verdict::LostItsBody
            } else {
                Verdict::Waits
            }
        }
        _ => Verdict::Wins,
    }
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
        ResponseFuture {
            first: Some(first),
            hedging: Some(Box::pin(Hedging {
                service: Some(service),
                kept: Some(kept),
                delay,
                deadline,
                due_at,
                timer: None,
                due: false,
                sent: 1,
                answered: 0,
                hedges: Vec::new(),
                failed: None,
            })),
            started,
            expired: None,
            reports,
            policy,
        }
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
            return Poll::Ready(Err(Box::new(DeadlineExceeded::new(left, 0, None))));
        }
        let Some(hedging) = this.hedging.as_mut() else {
            // No hedge for this call: the first attempt's answer is the
            // call's, recorded in the window when it is a success.
            let first = this
                .first
                .as_mut()
                .as_pin_mut()
                .expect("hedge future polled after it completed");
            let result = ready!(first.poll(cx)).map_err(Into::into);
            this.first.set(None);
            // Classified even when nothing is recorded: a classifier may
            // count (gRFC A6 throttling counts every answer).
            let outcome = policy.classifier.classify(result.as_ref());
            if outcome == Outcome::Success {
                policy.record_latency(*this.started);
            }
            if *this.reports && outcome.as_failure().is_some() {
                tower_classify::attempts::report_attempts(1, 1);
            }
            return Poll::Ready(result);
        };
        let reports = *this.reports;
        let mut hedging = hedging.as_mut().project();
        loop {
            if let Some(first) = this.first.as_mut().as_pin_mut() {
                if let Poll::Ready(result) = first.poll(cx) {
                    this.first.set(None);
                    let result: Result<S::Response, BoxError> = result.map_err(Into::into);
                    let outcome = policy.classifier.classify(result.as_ref());
                    if outcome == Outcome::Success {
                        policy.record_latency(*this.started);
                    }
                    if let Some(result) = answered(&mut hedging, reports, &outcome, result, true) {
                        cancel_hedges(policy, hedging.hedges);
                        return Poll::Ready(result);
                    }
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

            // The next hedge, if one may still be sent.
            if hedging.service.is_none() {
                return Poll::Pending;
            }
            if !*hedging.due {
                if hedging.timer.is_none() {
                    let due_at = *hedging.due_at;
                    hedging.timer.set(Some(tokio::time::sleep_until(due_at)));
                }
                let timer = hedging.timer.as_mut().as_pin_mut().expect("set above");
                ready!(timer.poll(cx));
                *hedging.due = true;
            }
            let service = hedging.service.as_mut().expect("checked above");
            match service.poll_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(error)) => {
                    let error: BoxError = error.into();
                    tracing::debug!(hedge = %policy.telemetry.name(), %error, "service not ready for a hedge");
                    policy
                        .telemetry
                        .refused(*hedging.sent + 1, Refusal::NotReady);
                    stop(&mut hedging);
                    continue;
                }
                Poll::Ready(Ok(())) => {}
            }
            let attempt = *hedging.sent + 1;
            let Some(kept) = hedging.kept.as_ref() else {
                stop(&mut hedging);
                continue;
            };
            // A streamed body that outgrew its recording cannot be sent
            // again, and the attempts in flight carry on.
            let request = match policy.replay.can_replay(kept) {
                true => policy.replay.replay(kept, attempt - 1).ok(),
                false => None,
            };
            let Some(mut request) = request else {
                policy.telemetry.refused(attempt, Refusal::NotReplayable);
                stop(&mut hedging);
                continue;
            };
            if let Err(refusal) = policy.allow_hedge(*hedging.deadline) {
                policy.telemetry.refused(attempt, refusal);
                stop(&mut hedging);
                continue;
            }
            *hedging.sent = attempt;
            if attempt >= policy.max_attempts {
                *hedging.kept = None;
            }
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
            if hedging.kept.is_some() {
                // One delay after this hedge went out, not after it was due:
                // a readiness stall does not bunch the next hedges together.
                *hedging.due = false;
                let next = Instant::now() + *hedging.delay;
                *hedging.due_at = next;
                if let Some(timer) = hedging.timer.as_mut().as_pin_mut() {
                    timer.reset(next);
                }
            } else {
                stop(&mut hedging);
            }
            // Loop to poll the new hedge once, so it can wake the call.
        }
    }
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
    match verdict(outcome, &result, first && *hedging.sent > 1) {
        Verdict::Wins => return Some(result),
        Verdict::Waits => *hedging.failed = Some(result),
        Verdict::LostItsBody => {
            hedging.failed.get_or_insert(result);
        }
    }
    stop(hedging);
    None
}

/// No further hedge for this call: the service clone and what was kept of
/// the request go at once.
fn stop<S, Req, K>(hedging: &mut HedgingProj<'_, S, Req, K>)
where
    S: Service<Req>,
{
    *hedging.service = None;
    *hedging.kept = None;
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
