//! Future types

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_classify::duration::format_duration;
use tower_classify::{BoxError, Classify, Failure, FailureKind, Outcome, RetryHint};
use tower_service::Service;

use crate::backoff::BackoffIter;
use crate::error::{BudgetExhausted, DeadlineExceeded, PreviousFailure, WaitLimit, WaitTooLong};
use crate::policy::{is_shed, Policy, RetryEvent, RetryStopped, StopReason};
use crate::replay::{Replay, StopReport};
use crate::telemetry::{self, CallSpans, Telemetry};

pin_project! {
    /// The response future of [`Retry`](crate::Retry).
    ///
    /// Dropping it drops the attempt in flight and any pending sleep at once:
    /// nothing keeps running, no task is spawned and no timer stays registered.
    pub struct ResponseFuture<S, Req, C, R>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S::Future>,
        service: S,
        // The copy to send as the next attempt, made before the previous one
        // consumed its request; `None` when no further attempt may be made.
        replay: Option<Req>,
        policy: Arc<Policy<C, R>>,
        attempts: u32,
        deadline: Option<Instant>,
        // Created on the first retry: the success path needs no random
        // generator.
        backoff: Option<BackoffIter>,
        // One timer, reused: the attempt's limit while `Called`, the backoff
        // while `Waiting`, the deadline while `Readying`. Boxed so that the
        // future stays small and a call without limits allocates nothing.
        timer: Option<Pin<Box<Sleep>>>,
        // What the timer enforces while an attempt is in flight.
        limit: Limit,
        waited_for_shed: bool,
        // How the attempt before the one in flight failed, for the error
        // that may end the loop; boxed, as only a retried call with a deadline has one.
        previous: Option<Box<PreviousFailure>>,
        // The call's and the attempt's spans; `None` unless a subscriber
        // records them.
        spans: Option<Box<CallSpans>>,
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
        Done,
    }
}

/// Which limit the timer enforces on the attempt in flight.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Limit {
    None,
    /// The per-attempt timeout: the attempt fails as a timeout.
    AttemptTimeout,
    /// The loop's deadline: the whole call ends.
    Deadline,
}

const FOREVER: Duration = Duration::from_secs(30 * 365 * 86_400);

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

/// What to do with an attempt's result.
enum Decision {
    /// A success: hand it back as it is.
    Return,
    /// A failure not retried: hand it back, a response marked with why.
    Stop(StopReason),
    /// Sleep this long, then make the next attempt.
    Retry(Duration),
    /// Stop with [`BudgetExhausted`].
    Budget(Failure),
    /// Stop with [`WaitTooLong`].
    TooLong {
        wait: Duration,
        limit: Duration,
        reason: WaitLimit,
        failure: Failure,
    },
}

/// The share of a waited-out refusal added at random, so that the callers
/// refused together do not all come back on the same tick.
const SHED_JITTER: f64 = 0.25;

/// Runs `poll` inside the span `which` picks, if the call has spans: the
/// attempt's span is the parent of whatever the service below logs or
/// traces.
#[inline]
fn poll_in<T>(
    spans: &Option<Box<CallSpans>>,
    which: fn(&CallSpans) -> &tracing::Span,
    poll: impl FnOnce() -> T,
) -> T {
    match spans {
        Some(spans) => which(spans).in_scope(poll),
        None => poll(),
    }
}

/// Records how the call ended on its span, if it has one.
fn end_span(
    spans: &Option<Box<CallSpans>>,
    attempts: u32,
    failure: Option<Failure>,
    stop: Option<StopReason>,
) {
    if let Some(spans) = spans {
        telemetry::record_end(spans, attempts, failure);
        if let Some(stop) = stop {
            spans.call.record("stop_reason", stop.as_str());
        }
    }
}

/// The failure of an outcome already known to be one.
fn failure_of(outcome: &Outcome) -> Failure {
    outcome
        .as_failure()
        .copied()
        .unwrap_or(Failure::new(FailureKind::ServerError))
}

/// Arms `timer` for an attempt starting now and says what it enforces.
#[inline]
fn arm_attempt(
    timer: &mut Option<Pin<Box<Sleep>>>,
    attempt_timeout: Option<Duration>,
    deadline: Option<Instant>,
) -> Limit {
    if attempt_timeout.is_none() && deadline.is_none() {
        return Limit::None;
    }
    let attempt_end = attempt_timeout.and_then(|t| Instant::now().checked_add(t));
    let (end, limit) = match (attempt_end, deadline) {
        (None, None) => return Limit::None,
        (Some(end), Some(deadline)) if deadline <= end => (deadline, Limit::Deadline),
        (Some(end), _) => (end, Limit::AttemptTimeout),
        (None, Some(deadline)) => (deadline, Limit::Deadline),
    };
    arm(timer, end);
    limit
}

fn arm(timer: &mut Option<Pin<Box<Sleep>>>, end: Instant) {
    match timer {
        Some(sleep) => sleep.as_mut().reset(end),
        None => *timer = Some(Box::pin(tokio::time::sleep_until(end))),
    }
}

impl<S, Req, C, R> ResponseFuture<S, Req, C, R>
where
    S: Service<Req>,
{
    pub(crate) fn new(
        future: S::Future,
        service: S,
        replay: Option<Req>,
        policy: Arc<Policy<C, R>>,
        deadline: Option<Instant>,
        spans: Option<Box<CallSpans>>,
    ) -> Self {
        let mut timer = None;
        let limit = arm_attempt(&mut timer, policy.attempt_timeout, deadline);
        ResponseFuture {
            state: State::Called { future },
            service,
            replay,
            policy,
            attempts: 1,
            deadline,
            backoff: None,
            timer,
            limit,
            waited_for_shed: false,
            previous: None,
            spans,
        }
    }
}

impl<S, Req, C, R> ResponseFuture<S, Req, C, R>
where
    S: Service<Req>,
{
    fn deadline_exceeded(
        policy: &Policy<C, R>,
        attempts: u32,
        previous: Option<Box<PreviousFailure>>,
    ) -> BoxError {
        let deadline = policy.deadline.unwrap_or_default();
        // The attempt in flight ran out of time.
        let failure = Failure::new(FailureKind::Timeout);
        policy
            .telemetry
            .gave_up(StopReason::Deadline, attempts, failure);
        policy
            .listeners
            .gave_up(attempts, StopReason::Deadline, failure);
        Box::new(DeadlineExceeded::new(
            deadline,
            attempts,
            previous.map(|previous| *previous),
        ))
    }
}

/// Decides what follows an attempt. Free of the future's pinning so it reads
/// as the policy it is.
#[inline(never)]
fn decide<C, R>(
    policy: &Policy<C, R>,
    outcome: Outcome,
    attempts: u32,
    replayable: bool,
    deadline: Option<Instant>,
    backoff: &mut Option<BackoffIter>,
    waited_for_shed: &mut bool,
) -> Decision {
    let failure = match outcome {
        Outcome::Failure(failure) => failure,
        Outcome::Success | Outcome::Ignored => return Decision::Return,
    };
    // A load-shedding refusal below us (a breaker's open circuit): never
    // retried at once. Its remaining time is waited out once, and only when
    // the caller set a deadline it fits in and it is no longer than
    // `max_delay`: with no deadline every caller would sleep out the whole
    // recovery and come back on the same tick.
    let shed = is_shed(failure.kind);
    let mut shed_wait = None;
    if shed {
        shed_wait = match (failure.hint, deadline) {
            (Some(RetryHint::After(wait)), Some(deadline))
                if !*waited_for_shed
                    && wait <= policy.backoff.max_delay()
                    && wait <= policy.max_wait =>
            {
                let left = deadline.saturating_duration_since(Instant::now());
                left.checked_sub(wait)
                    .filter(|slack| !slack.is_zero())
                    .map(|slack| {
                        // Later, never sooner: before `wait` the refusal stands.
                        wait + wait.mul_f64(SHED_JITTER * fastrand::f64()).min(slack / 2)
                    })
            }
            _ => None,
        };
        if shed_wait.is_none() {
            policy
                .telemetry
                .gave_up(StopReason::Shed, attempts, failure);
            return Decision::Stop(StopReason::Shed);
        }
    } else if !policy.retry_if.allows(&failure) {
        return Decision::Stop(StopReason::NotRetried);
    }
    if attempts > policy.max_retries {
        policy
            .telemetry
            .gave_up(StopReason::Attempts, attempts, failure);
        return Decision::Stop(StopReason::Attempts);
    }
    if !replayable {
        tracing::debug!(
            attempts,
            class = failure.kind.as_str(),
            "request cannot be replayed; not retrying"
        );
        return Decision::Stop(StopReason::NotReplayable);
    }
    let computed = backoff
        .get_or_insert_with(|| policy.backoff.iter())
        .next()
        .unwrap_or_default();
    let hinted = if shed {
        shed_wait
    } else {
        failure.retry_after()
    };
    let wait = hinted.unwrap_or(computed);
    if let Some(wait) = hinted {
        if wait > policy.max_wait {
            policy
                .telemetry
                .gave_up(StopReason::WaitTooLong, attempts, failure);
            return Decision::TooLong {
                wait,
                limit: policy.max_wait,
                reason: WaitLimit::MaxWait,
                failure,
            };
        }
    }
    if let Some(deadline) = deadline {
        let now = Instant::now();
        let left = deadline.saturating_duration_since(now);
        if wait >= left {
            if hinted.is_some() && !shed {
                policy
                    .telemetry
                    .gave_up(StopReason::WaitTooLong, attempts, failure);
                return Decision::TooLong {
                    wait,
                    limit: left,
                    reason: WaitLimit::Deadline,
                    failure,
                };
            }
            // A computed sleep that would cross the deadline is not started.
            policy
                .telemetry
                .gave_up(StopReason::Deadline, attempts, failure);
            return Decision::Stop(StopReason::Deadline);
        }
    }
    // A refusal below never reached the dependency, so the attempt after
    // waiting it out adds no load to it: it spends no budget.
    if let Some(budget) = policy.budget.as_ref().filter(|_| !shed) {
        if !budget.withdraw() {
            policy.telemetry.budget_exhausted();
            policy
                .telemetry
                .gave_up(StopReason::Budget, attempts, failure);
            return Decision::Budget(failure);
        }
    }
    if shed {
        *waited_for_shed = true;
    }
    Decision::Retry(wait)
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
        loop {
            let result = match this.state.as_mut().project() {
                StateProj::Called { future } => {
                    match poll_in(this.spans, |s| &s.attempt, || future.poll(cx)) {
                        // Boxed before it is classified, so one classifier over
                        // `BoxError` serves any client's error type.
                        Poll::Ready(result) => {
                            result.map_err(|err| AttemptError::Inner(err.into()))
                        }
                        // As `tokio::time::Timeout` does: the attempt first, then its limit.
                        Poll::Pending if *this.limit == Limit::None => return Poll::Pending,
                        Poll::Pending => {
                            let timer = this.timer.as_mut().expect("a timer is armed for a limit");
                            ready!(timer.as_mut().poll(cx));
                            // The attempt is abandoned: drop it now.
                            this.state.set(State::Done);
                            if *this.limit == Limit::Deadline {
                                let failure = Failure::new(FailureKind::Timeout);
                                end_span(
                                    this.spans,
                                    *this.attempts,
                                    Some(failure),
                                    Some(StopReason::Deadline),
                                );
                                return Poll::Ready(Err(Self::deadline_exceeded(
                                    this.policy,
                                    *this.attempts,
                                    this.previous.take(),
                                )));
                            }
                            Err(AttemptError::TimedOut)
                        }
                    }
                }
                StateProj::Waiting => {
                    let timer = this.timer.as_mut().expect("a timer is armed while waiting");
                    ready!(timer.as_mut().poll(cx));
                    // The same timer now guards readiness against the deadline.
                    if let Some(deadline) = *this.deadline {
                        timer.as_mut().reset(deadline);
                    }
                    this.state.set(State::Readying);
                    continue;
                }
                StateProj::Readying => {
                    let ready = poll_in(this.spans, |s| &s.call, || this.service.poll_ready(cx));
                    match ready {
                        Poll::Ready(Ok(())) => {}
                        Poll::Ready(Err(err)) => {
                            this.state.set(State::Done);
                            let err = err.into();
                            end_span(
                                this.spans,
                                *this.attempts,
                                Some(Failure::new(FailureKind::ServerError)),
                                None,
                            );
                            return Poll::Ready(Err(err));
                        }
                        Poll::Pending => {
                            if this.deadline.is_some() {
                                if let Some(timer) = this.timer.as_mut() {
                                    if timer.as_mut().poll(cx).is_ready() {
                                        this.state.set(State::Done);
                                        let failure = Failure::new(FailureKind::Timeout);
                                        end_span(
                                            this.spans,
                                            *this.attempts,
                                            Some(failure),
                                            Some(StopReason::Deadline),
                                        );
                                        return Poll::Ready(Err(Self::deadline_exceeded(
                                            this.policy,
                                            *this.attempts,
                                            this.previous.take(),
                                        )));
                                    }
                                }
                            }
                            return Poll::Pending;
                        }
                    }
                    let request = this
                        .replay
                        .take()
                        .expect("a replay is made before every retry");
                    *this.attempts += 1;
                    // The copy for the retry after this one, before `call`
                    // consumes the request.
                    if *this.attempts <= this.policy.max_retries {
                        *this.replay = this.policy.replay.replay(&request, *this.attempts);
                    }
                    let future = match this.spans.as_mut() {
                        Some(spans) => {
                            spans.attempt = Telemetry::attempt_span(&spans.call, *this.attempts);
                            spans.attempt.in_scope(|| this.service.call(request))
                        }
                        None => this.service.call(request),
                    };
                    *this.limit =
                        arm_attempt(this.timer, this.policy.attempt_timeout, *this.deadline);
                    this.state.set(State::Called { future });
                    continue;
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            };

            let outcome = match &result {
                Ok(response) => this.policy.classifier.classify(Ok(response)),
                Err(AttemptError::Inner(err)) => this.policy.classifier.classify(Err(err)),
                Err(AttemptError::TimedOut) => Outcome::failure(FailureKind::Timeout),
            };
            if let Some(spans) = this.spans.as_ref() {
                telemetry::record_attempt(spans, outcome.as_failure().copied());
            }
            // The success path: nothing to decide.
            if !matches!(outcome, Outcome::Failure(_)) {
                this.state.set(State::Done);
                end_span(this.spans, *this.attempts, None, None);
                if *this.attempts > 1 && outcome == Outcome::Success {
                    this.policy.listeners.recovered(*this.attempts);
                }
                return Poll::Ready(result.map_err(AttemptError::into_box));
            }
            let report = &this.policy.replay;
            let decision = match &result {
                // A retry layer below stopped on its spent budget: retrying
                // here would multiply what it refused to add.
                Ok(response) if report.spent_below(response) => Decision::Stop(StopReason::Budget),
                _ => decide(
                    this.policy,
                    outcome,
                    *this.attempts,
                    this.replay
                        .as_ref()
                        .is_some_and(|copy| report.can_replay(copy)),
                    *this.deadline,
                    this.backoff,
                    this.waited_for_shed,
                ),
            };
            let attempts = *this.attempts;
            let stopped = |reason| RetryStopped { reason, attempts };
            let listeners = &this.policy.listeners;
            match decision {
                Decision::Return => {
                    this.state.set(State::Done);
                    end_span(this.spans, attempts, None, None);
                    return Poll::Ready(result.map_err(AttemptError::into_box));
                }
                Decision::Stop(reason) => {
                    this.state.set(State::Done);
                    let failure = failure_of(&outcome);
                    end_span(this.spans, attempts, Some(failure), Some(reason));
                    listeners.gave_up(attempts, reason, failure);
                    return Poll::Ready(match result {
                        Ok(response) => report.hand_back(response, stopped(reason), failure),
                        Err(err) => Err(err.into_box()),
                    });
                }
                // The upstream's own answer (a 503 with its body and
                // `Retry-After`) is worth more to the caller than an error
                // of ours; only an error is replaced.
                Decision::Budget(failure) => {
                    this.state.set(State::Done);
                    end_span(
                        this.spans,
                        attempts,
                        Some(failure),
                        Some(StopReason::Budget),
                    );
                    listeners.gave_up(attempts, StopReason::Budget, failure);
                    return Poll::Ready(match result {
                        Ok(response) => {
                            report.hand_back(response, stopped(StopReason::Budget), failure)
                        }
                        Err(err) => Err(Box::new(BudgetExhausted::new(
                            attempts,
                            failure,
                            Some(err.into_box()),
                        ))),
                    });
                }
                Decision::TooLong {
                    wait,
                    limit,
                    reason,
                    failure,
                } => {
                    this.state.set(State::Done);
                    end_span(
                        this.spans,
                        attempts,
                        Some(failure),
                        Some(StopReason::WaitTooLong),
                    );
                    listeners.gave_up(attempts, StopReason::WaitTooLong, failure);
                    let (cause, head) = match result {
                        Ok(response) => (None, report.keep_head(response)),
                        Err(err) => (Some(err.into_box()), None),
                    };
                    return Poll::Ready(Err(Box::new(WaitTooLong::new(
                        wait, limit, reason, attempts, failure, cause, head,
                    ))));
                }
                Decision::Retry(wait) => {
                    let failure = failure_of(&outcome);
                    let event = RetryEvent {
                        attempt: attempts + 1,
                        failure,
                        wait,
                    };
                    this.policy.telemetry.retrying(event.attempt, failure, wait);
                    // The failed attempt's span ends now, not after the sleep.
                    if let Some(spans) = this.spans.as_mut() {
                        spans
                            .attempt
                            .record("wait", tracing::field::display(format_duration(wait)));
                        spans.attempt = tracing::Span::none();
                    }
                    this.policy.listeners.retried(&event);
                    // Kept for the `DeadlineExceeded` that may end the loop,
                    // which only a deadline can; a response's body is
                    // dropped here, its head kept.
                    if this.deadline.is_some() {
                        let (error, head) = match result {
                            Ok(response) => (None, report.keep_head(response)),
                            Err(err) => (Some(err.into_box()), None),
                        };
                        *this.previous = Some(Box::new(PreviousFailure {
                            failure,
                            error,
                            head,
                        }));
                    }
                    // No sleep: go straight to readiness, with the timer
                    // (if any) guarding the deadline.
                    let timer_end = if wait.is_zero() {
                        *this.deadline
                    } else {
                        // A wait past the end of `Instant` is as good as forever.
                        let now = Instant::now();
                        Some(now.checked_add(wait).unwrap_or_else(|| now + FOREVER))
                    };
                    if let Some(end) = timer_end {
                        arm(this.timer, end);
                    }
                    if wait.is_zero() {
                        this.state.set(State::Readying);
                    } else {
                        this.state.set(State::Waiting);
                    }
                }
            }
        }
    }
}

impl<S, Req, C, R> fmt::Debug for ResponseFuture<S, Req, C, R>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("attempts", &self.attempts)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}
