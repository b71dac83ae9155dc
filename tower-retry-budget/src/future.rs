//! Future types

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tower_classify::attempts::report_attempts;
use tower_classify::duration::format_duration;
use tower_classify::{BoxError, Classify, Failure, FailureKind, Outcome};
use tower_service::Service;

use crate::cold::{deadline_exceeded, in_span, Answer, Cold, Limit};
use crate::error::{BudgetExhausted, WaitTooLong};
use crate::events::{RetryEvent, RetryStopped, StopReason};
use crate::policy::{too_little_left, Decision, Policy, Stop};
use crate::replay::{lost_its_body, Replay, StopReport};
use crate::telemetry::{self, Telemetry};

pin_project! {
    /// The response future of [`Retry`](crate::Retry).
    ///
    /// Dropping it drops the attempt in flight and any pending sleep at once:
    /// nothing keeps running, no task is spawned and no timer stays registered.
    #[project = ResponseFutureProj]
    pub struct ResponseFuture<S, Req, C, R>
    where
        S: Service<Req>,
        R: Replay<Req>,
    {
        #[pin]
        state: State<S::Future>,
        service: S,
        // What each retry is made from, kept before the first attempt
        // consumed the request; `None` when no retry may be made.
        kept: Option<R::Kept>,
        policy: Arc<Policy<C, R>>,
        attempts: u32,
        // What the timer enforces while an attempt is in flight.
        limit: Limit,
        // Called by a dead-letter layer (or another recorder of attempts)
        // calling its inner service: the attempts are reported to it.
        reports: bool,
        // Everything only a call with a limit, spans or a retry needs. A
        // call without them that succeeds allocates nothing, and the future
        // it moves around stays small.
        cold: Option<Box<Cold<S::Response>>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // An attempt in flight, bounded by the timer when `limit` says so.
        Called { #[pin] future: F },
        // Sleeping before the next attempt.
        Waiting,
        // Driving the service ready for the next attempt.
        Readying,
        // The deadline left less than the minimum attempt time before the
        // first attempt: none was sent.
        Expired,
        Done,
    }
}

/// How an attempt ended, before the error is boxed.
enum AttemptError<E> {
    Inner(E),
    TimedOut,
}

impl<E: Into<BoxError>> AttemptError<E> {
    fn into_box(self) -> BoxError {
        match self {
            AttemptError::Inner(err) => err.into(),
            AttemptError::TimedOut => Box::new(tower::timeout::error::Elapsed::new()),
        }
    }
}

impl<S, Req, C, R> ResponseFuture<S, Req, C, R>
where
    S: Service<Req>,
    R: Replay<Req>,
{
    /// The future of a call whose deadline left no time for a first
    /// attempt: it ends with [`DeadlineExceeded`] when first polled.
    pub(crate) fn expired(
        service: S,
        policy: Arc<Policy<C, R>>,
        cold: Box<Cold<S::Response>>,
    ) -> Self {
        ResponseFuture {
            state: State::Expired,
            service,
            kept: None,
            policy,
            attempts: 0,
            limit: Limit::None,
            reports: false,
            cold: Some(cold),
        }
    }

    /// The future of a call whose first attempt is `future`. `cold` is
    /// `Some` when the call has a limit or spans; `reports` when the call
    /// reports its attempts to the recording layer that called it.
    pub(crate) fn new(
        future: S::Future,
        service: S,
        kept: Option<R::Kept>,
        policy: Arc<Policy<C, R>>,
        mut cold: Option<Box<Cold<S::Response>>>,
        reports: bool,
    ) -> Self {
        let limit = match cold.as_mut() {
            Some(cold) => cold.arm_attempt(policy.attempt_timeout),
            None => Limit::None,
        };
        ResponseFuture {
            state: State::Called { future },
            service,
            kept,
            policy,
            attempts: 1,
            limit,
            reports,
            cold,
        }
    }
}

impl<S, Req, C, R> Future for ResponseFuture<S, Req, C, R>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    C: Classify<S::Response, BoxError>,
    R: Replay<Req> + StopReport<S::Response>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        // The first attempt of a call with no limit and no spans, as most
        // are: polled, classified and a success handed back here, in a few
        // instructions; a failure goes on to the retry loop.
        if this.cold.is_none() {
            if let StateProj::Called { future } = this.state.as_mut().project() {
                // Boxed before it is classified, so one classifier over
                // `BoxError` serves any client's error type.
                let result = ready!(future.poll(cx)).map_err(|err| AttemptError::Inner(err.into()));
                let outcome = classify(&this.policy.classifier, &result);
                if !matches!(outcome, Outcome::Failure(_)) {
                    this.state.set(State::Done);
                    return Poll::Ready(result.map_err(AttemptError::into_box));
                }
                return drive(this, cx, Some((result, outcome)));
            }
        }
        drive(this, cx, None)
    }
}

/// How the attempt's result is classified: a timeout of ours is one.
fn classify<Res, C>(classifier: &C, result: &Result<Res, AttemptError<BoxError>>) -> Outcome
where
    C: Classify<Res, BoxError>,
{
    match result {
        Ok(response) => classifier.classify(Ok(response)),
        Err(AttemptError::Inner(err)) => classifier.classify(Err(err)),
        Err(AttemptError::TimedOut) => Outcome::failure(FailureKind::Timeout),
    }
}

/// An attempt's result and its outcome.
type Classified<Res> = (Result<Res, AttemptError<BoxError>>, Outcome);

/// The retry loop: drives the attempts, the sleeps and the readiness in
/// between until the call ends (each way out breaks with its answer).
/// `first` is the first attempt's result when the fast path of `poll`
/// already has it.
#[inline(never)]
fn drive<S, Req, C, R>(
    mut this: ResponseFutureProj<'_, S, Req, C, R>,
    cx: &mut Context<'_>,
    mut first: Option<Classified<S::Response>>,
) -> Poll<Result<S::Response, BoxError>>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    C: Classify<S::Response, BoxError>,
    R: Replay<Req> + StopReport<S::Response>,
{
    let policy = &**this.policy;
    let ended = loop {
        let (result, outcome) = if let Some(ready) = first.take() {
            ready
        } else {
            let result = match this.state.as_mut().project() {
                StateProj::Called { future } => {
                    let polled = in_span(this.cold, |spans| &spans.attempt, || future.poll(cx));
                    match polled {
                        Poll::Ready(result) => result.map_err(|e| AttemptError::Inner(e.into())),
                        // As `tokio::time::Timeout` does: the attempt first, then its limit.
                        Poll::Pending if *this.limit == Limit::None => return Poll::Pending,
                        Poll::Pending => {
                            let cold = this.cold.as_mut().expect("a limit has cold state");
                            ready!(cold.timer().poll(cx));
                            // The attempt is abandoned: drop it now.
                            this.state.set(State::Done);
                            if *this.limit == Limit::Deadline {
                                let failure = Failure::new(FailureKind::Timeout);
                                let err = deadline_exceeded(policy, cold, *this.attempts, failure);
                                break Err(err);
                            }
                            Err(AttemptError::TimedOut)
                        }
                    }
                }
                StateProj::Waiting => {
                    let cold = this.cold.as_mut().expect("a retry has cold state");
                    ready!(cold.timer().poll(cx));
                    // An upload still streaming under the failed attempt
                    // may have outgrown its recording during the sleep:
                    // asked now, before readiness reserves what a retry
                    // would use (a slot, a connection) for one that
                    // cannot be made.
                    if cold.keeps_whole() {
                        let kept = this.kept.as_ref().expect("a retry has something kept");
                        if !policy.replay.can_replay(kept) {
                            break not_replayable(policy, cold, *this.attempts, None);
                        }
                        // Ended (or let go) during the sleep: nothing left
                        // to keep the answer for while readiness is awaited.
                        if !policy.replay.still_streaming(kept) {
                            cold.settle(&policy.replay);
                        }
                    }
                    // The same timer now bounds the wait for readiness.
                    cold.arm_readiness(policy.min_attempt_time);
                    this.state.set(State::Readying);
                    continue;
                }
                StateProj::Readying => {
                    let ready = in_span(this.cold, |s| &s.call, || this.service.poll_ready(cx));
                    let cold = this.cold.as_mut().expect("a retry has cold state");
                    match ready {
                        Poll::Ready(Err(err)) => {
                            cold.answer = None;
                            let failure = Failure::new(FailureKind::ServerError);
                            cold.end_span(*this.attempts, Some(failure), None);
                            break Err(err.into());
                        }
                        Poll::Ready(Ok(()))
                            if too_little_left(cold.retry.deadline, policy.min_attempt_time)
                                .is_none() => {}
                        Poll::Pending
                            if cold.retry.deadline.is_none()
                                || cold.timer().poll(cx).is_pending() =>
                        {
                            return Poll::Pending
                        }
                        // Ready too late for the minimum attempt time
                        // `decide` saw room for, or not ready by the last
                        // moment a retry could start: none is sent.
                        _ => {
                            let failure = cold.retried.expect("a retry follows a failure");
                            let err = deadline_exceeded(policy, cold, *this.attempts, failure);
                            break Err(err);
                        }
                    }
                    let kept = this
                        .kept
                        .as_ref()
                        .expect("a retry is decided only with something kept");
                    // Asked before the retry's own copy of the body exists.
                    let still_streaming = policy.replay.still_streaming(kept);
                    let mut request = match policy.replay.replay(kept, *this.attempts) {
                        Ok(request) => request,
                        // The body outgrew its recording since the retry
                        // was decided (a reader still streaming it).
                        Err(err) => {
                            let attempts = *this.attempts;
                            break not_replayable(policy, cold, attempts, Some(err));
                        }
                    };
                    // The answer being retried stays whole while the retry
                    // runs only if the body may yet be lost under it.
                    if !still_streaming {
                        cold.settle(&policy.replay);
                    }
                    *this.attempts += 1;
                    if *this.attempts > policy.max_retries {
                        // The last retry: nothing more is made from it.
                        *this.kept = None;
                    }
                    policy.replay.before_send(&mut request, cold.retry.deadline);
                    let future = match cold.spans.as_mut() {
                        Some(spans) => {
                            spans.attempt = Telemetry::attempt_span(&spans.call, *this.attempts);
                            spans.attempt.in_scope(|| this.service.call(request))
                        }
                        None => this.service.call(request),
                    };
                    // Reported once it is sent, as a hedge does: a layer
                    // below that counts the attempts going by
                    // (`CountAttempts`) has counted this one by now, and the
                    // report raises the tally to it rather than past it.
                    if *this.reports {
                        report_attempts(*this.attempts, *this.attempts - 1);
                    }
                    *this.limit = cold.arm_attempt(policy.attempt_timeout);
                    this.state.set(State::Called { future });
                    continue;
                }
                StateProj::Expired => {
                    let cold = this.cold.as_mut().expect("a deadline has cold state");
                    let failure = Failure::new(FailureKind::Timeout);
                    break Err(deadline_exceeded(policy, cold, 0, failure));
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            };

            let outcome = classify(&policy.classifier, &result);
            (result, outcome)
        };
        // The attempt is over: what its future holds (a connection, a
        // concurrency permit) goes now, before the listeners hear of it.
        this.state.set(State::Done);
        let failure = match outcome {
            Outcome::Failure(failure) => failure,
            Outcome::Success | Outcome::Ignored => {
                if let Some(cold) = this.cold.as_ref() {
                    if let Some(spans) = &cold.spans {
                        telemetry::record_outcome(&spans.attempt, None);
                    }
                    cold.end_span(*this.attempts, None, None);
                }
                if *this.attempts > 1 && outcome == Outcome::Success {
                    policy.listeners.recovered(*this.attempts);
                }
                break result.map_err(AttemptError::into_box);
            }
        };
        let cold = this.cold.get_or_insert_with(Box::default);
        if let Some(spans) = &cold.spans {
            telemetry::record_outcome(&spans.attempt, Some(failure));
        }
        let attempts = *this.attempts;
        // A dead-letter layer above records the attempts of a call that
        // fails; a call that succeeds at once never gets here.
        if *this.reports {
            report_attempts(attempts, attempts);
        }
        let report = &policy.replay;
        // A retry whose copy of the body was lost to the attempt before it,
        // still streaming the upload: the answer of that attempt, kept for
        // this, is the call's.
        if cold.keeps_whole()
            && matches!(&result, Err(AttemptError::Inner(err)) if lost_its_body(err))
        {
            break not_replayable(policy, cold, attempts, None);
        }
        let decision = match &result {
            // A retry layer below stopped on its spent budget: retrying
            // here would multiply what it refused to add.
            Ok(response) if report.spent_below(response) => {
                Decision::Stop(Stop::HandBack(StopReason::Budget))
            }
            _ => policy.decide(
                failure,
                attempts,
                this.kept
                    .as_ref()
                    .is_some_and(|kept| policy.replay.can_replay(kept)),
                &mut cold.retry,
            ),
        };
        let wait = match decision {
            Decision::Retry(wait) => wait,
            Decision::Stop(stop) => {
                let reason = stop.reason();
                cold.end_span(attempts, Some(failure), Some(reason));
                let marked = policy.listeners.gave_up(attempts, reason, failure);
                break stopped(stop, marked, result, report);
            }
        };

        let event = RetryEvent {
            attempt: attempts + 1,
            failure,
            wait,
        };
        policy.telemetry.retrying(event.attempt, failure, wait);
        // The failed attempt's span ends now, not after the sleep.
        if let Some(spans) = cold.spans.as_mut() {
            spans
                .attempt
                .record("wait", tracing::field::display(format_duration(wait)));
            spans.attempt = tracing::Span::none();
        }
        policy.listeners.retried(&event);
        cold.retried = Some(failure);
        let still_streaming = this
            .kept
            .as_ref()
            .is_some_and(|kept| report.still_streaming(kept));
        cold.keep_answer(
            result.map_err(AttemptError::into_box),
            still_streaming,
            report,
        );
        if wait.is_zero() {
            // No sleep: straight to readiness, with the timer (if any)
            // bounding the wait for it.
            cold.arm_readiness(policy.min_attempt_time);
            this.state.set(State::Readying);
        } else {
            cold.arm_wait(wait);
            this.state.set(State::Waiting);
        }
    };
    this.state.set(State::Done);
    Poll::Ready(ended)
}

/// Ends the call after `attempts` attempts when the request could not be
/// sent again: the body outgrew its recording before the retry could be
/// sent, or under the retry, which says nothing of the request. The answer
/// kept whole while the body streamed (`Answer::Whole`, the answer of the
/// attempt being retried) is handed back as a failure not retried, else
/// `replay_error`. Marked [`NotReplayable`](StopReason::NotReplayable), as
/// for a request found not replayable when the retry is decided: the
/// listeners hear of it, no metric counts it.
fn not_replayable<C, R, Res>(
    policy: &Policy<C, R>,
    cold: &mut Cold<Res>,
    attempts: u32,
    replay_error: Option<BoxError>,
) -> Result<Res, BoxError>
where
    R: StopReport<Res>,
{
    let reason = StopReason::NotReplayable;
    let failure = cold.retried.expect("a retry follows a failure");
    cold.end_span(attempts, Some(failure), Some(reason));
    let marked = policy.listeners.gave_up(attempts, reason, failure);
    match cold.answer.take() {
        Some(Answer::Whole(last)) => {
            let result = (*last).map_err(AttemptError::Inner);
            stopped(Stop::HandBack(reason), marked, result, &policy.replay)
        }
        _ => Err(replay_error.expect("an answer was kept, or the replay failed")),
    }
}

/// What the caller gets when the loop stops (`stop`, `marked` with why and
/// after how many attempts) with the last attempt's `result`:
///
/// - a failure not retried: handed back as it is, a response marked with
///   why retrying stopped;
/// - a spent budget: the upstream's own answer (a 503 with its body and
///   `Retry-After`) is worth more to the caller than an error of ours, so
///   only an error is replaced, by [`BudgetExhausted`];
/// - a wait longer than allowed: [`WaitTooLong`], holding the error or the
///   response's head.
fn stopped<Res, R>(
    stop: Stop,
    marked: RetryStopped,
    result: Result<Res, AttemptError<BoxError>>,
    report: &R,
) -> Result<Res, BoxError>
where
    R: StopReport<Res>,
{
    match (stop, result) {
        (Stop::HandBack(_) | Stop::Budget, Ok(response)) => report.hand_back(response, marked),
        (Stop::HandBack(_), Err(err)) => Err(err.into_box()),
        (Stop::Budget, Err(err)) => {
            Err(Box::new(BudgetExhausted::new(marked, Some(err.into_box()))))
        }
        (
            Stop::TooLong {
                wait,
                limit,
                reason: limited_by,
            },
            result,
        ) => {
            let (cause, head) = match result {
                Ok(response) => (None, report.keep_head(response)),
                Err(err) => (Some(err.into_box()), None),
            };
            Err(Box::new(WaitTooLong::new(
                wait, limit, limited_by, marked, cause, head,
            )))
        }
    }
}

impl<S, Req, C, R> fmt::Debug for ResponseFuture<S, Req, C, R>
where
    S: Service<Req>,
    R: Replay<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("attempts", &self.attempts)
            .field(
                "deadline",
                &self.cold.as_ref().and_then(|cold| cold.retry.deadline),
            )
            .finish_non_exhaustive()
    }
}
