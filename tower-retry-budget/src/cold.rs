//! A call's cold state: what only a call with a limit, spans or a retry
//! needs, boxed so that a call without them allocates nothing and its
//! response future stays small.

use std::pin::Pin;
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower_classify::{BoxError, Failure};

use crate::error::{DeadlineExceeded, ResponseHead};
use crate::events::StopReason;
use crate::policy::{Policy, RetryState};
use crate::replay::StopReport;
use crate::telemetry::{self, CallSpans};

/// The state of a call past its simple first attempt, whose attempts
/// answer `Res`.
pub(crate) struct Cold<Res> {
    pub(crate) retry: RetryState,
    // One timer, reused: the attempt's limit while `Called`, the backoff
    // while `Waiting`, while `Readying` the last moment a retry may
    // start (`arm_readiness`).
    timer: Option<Pin<Box<Sleep>>>,
    // What is kept of the attempt being retried: one field, so that the
    // whole answer and its head can never be of two attempts.
    pub(crate) answer: Option<Answer<Res>>,
    // How the attempt being retried failed, for a give-up that comes
    // before the retry is sent and for `DeadlineExceeded`.
    pub(crate) retried: Option<Failure>,
    pub(crate) spans: Option<CallSpans>,
}

// Written out: derived, it would ask `Res: Default`.
impl<Res> Default for Cold<Res> {
    fn default() -> Self {
        Cold {
            retry: RetryState::default(),
            timer: None,
            answer: None,
            retried: None,
            spans: None,
        }
    }
}

/// What is kept of the answer of the attempt being retried.
pub(crate) enum Answer<Res> {
    /// The whole answer, while that attempt may still be streaming the
    /// request's body (see `Replay::still_streaming`): if the retry loses
    /// the body, it is the call's answer. Boxed: a response would grow the
    /// cold state of every call with a limit or spans.
    Whole(Box<Result<Res, BoxError>>),
    /// Its error or its response's head, for the `DeadlineExceeded` that
    /// may end the loop; kept only when the call has a deadline.
    Head {
        error: Option<BoxError>,
        head: Option<ResponseHead>,
    },
}

/// Which limit the timer enforces on the attempt in flight.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    None,
    /// The per-attempt timeout: the attempt fails as a timeout.
    AttemptTimeout,
    /// The loop's deadline: the whole call ends.
    Deadline,
}

/// A wait past the end of `Instant` is armed this far ahead instead.
const FOREVER: Duration = Duration::from_secs(30 * 365 * 86_400);

impl<Res> Cold<Res> {
    /// Keeps `answer`, of the attempt being retried, in place of what was
    /// kept of the attempt before it: whole while the request's body may
    /// still be lost under it (`streaming`), else only what an error ending
    /// the loop needs (a response's head, or the error; only when the call
    /// has a deadline).
    pub(crate) fn keep_answer(
        &mut self,
        answer: Result<Res, BoxError>,
        streaming: bool,
        report: &impl StopReport<Res>,
    ) {
        self.answer = if streaming {
            Some(Answer::Whole(Box::new(answer)))
        } else if self.retry.deadline.is_none() {
            None
        } else {
            let (error, head) = match answer {
                Ok(response) => (None, report.keep_head(response)),
                Err(error) => (Some(error), None),
            };
            Some(Answer::Head { error, head })
        };
    }

    /// Whether the answer of the attempt being retried is kept whole.
    pub(crate) fn keeps_whole(&self) -> bool {
        matches!(self.answer, Some(Answer::Whole(_)))
    }

    /// Lets go of the answer kept whole (its body, and the connection that
    /// may hold), keeping only its head: once the request's body can no
    /// longer be lost, or when the deadline ends the call.
    pub(crate) fn settle(&mut self, report: &impl StopReport<Res>) {
        if let Some(Answer::Whole(answer)) = self
            .answer
            .take_if(|answer| matches!(answer, Answer::Whole(_)))
        {
            self.keep_answer(*answer, false, report);
        }
    }

    /// Arms the timer for an attempt starting now and says what it enforces.
    pub(crate) fn arm_attempt(&mut self, attempt_timeout: Option<Duration>) -> Limit {
        let deadline = self.retry.deadline;
        let attempt_end = attempt_timeout.and_then(|t| Instant::now().checked_add(t));
        let (end, limit) = match (attempt_end, deadline) {
            (None, None) => return Limit::None,
            (Some(end), Some(deadline)) if deadline <= end => (deadline, Limit::Deadline),
            (Some(end), _) => (end, Limit::AttemptTimeout),
            (None, Some(deadline)) => (deadline, Limit::Deadline),
        };
        self.arm(end);
        limit
    }

    pub(crate) fn arm(&mut self, end: Instant) {
        match &mut self.timer {
            Some(sleep) => sleep.as_mut().reset(end),
            None => self.timer = Some(Box::pin(tokio::time::sleep_until(end))),
        }
    }

    /// Arms the timer, if the call has a deadline, for the last moment a
    /// retry may be sent: `min_attempt_time` before the deadline. A service
    /// that is not ready by then ends the call.
    pub(crate) fn arm_readiness(&mut self, min_attempt_time: Duration) {
        if let Some(deadline) = self.retry.deadline {
            self.arm(deadline.checked_sub(min_attempt_time).unwrap_or(deadline));
        }
    }

    /// Arms the timer for a wait starting now; a wait past the end of
    /// `Instant` is as good as forever.
    pub(crate) fn arm_wait(&mut self, wait: Duration) {
        let now = Instant::now();
        self.arm(now.checked_add(wait).unwrap_or_else(|| now + FOREVER));
    }

    pub(crate) fn timer(&mut self) -> Pin<&mut Sleep> {
        self.timer
            .as_mut()
            .expect("a timer is armed for a limit")
            .as_mut()
    }

    /// Records how the call ended on its span, if it has one.
    pub(crate) fn end_span(
        &self,
        attempts: u32,
        failure: Option<Failure>,
        stop: Option<StopReason>,
    ) {
        if let Some(spans) = &self.spans {
            spans.call.record("attempts", attempts);
            telemetry::record_outcome(&spans.call, failure);
            if let Some(stop) = stop {
                spans.call.record("stop_reason", stop.as_str());
            }
        }
    }
}

/// Runs `f` inside the span `which` picks, if the call has spans: the
/// attempt's span is the parent of whatever the service below logs or
/// traces.
#[inline]
pub(crate) fn in_span<Res, T>(
    cold: &Option<Box<Cold<Res>>>,
    which: fn(&CallSpans) -> &tracing::Span,
    f: impl FnOnce() -> T,
) -> T {
    match cold.as_ref().and_then(|cold| cold.spans.as_ref()) {
        Some(spans) => which(spans).in_scope(f),
        None => f(),
    }
}

/// The cold state of a new call: `None` unless it has a deadline (the
/// layer's or the caller's), an attempt timeout or spans. `call` makes it
/// before the first attempt, so that the attempt runs inside its span.
#[inline]
pub(crate) fn cold_state<C, R, Res>(
    policy: &Policy<C, R>,
    caller: Option<tower_classify::deadline::Deadline>,
) -> Option<Box<Cold<Res>>> {
    if policy.deadline.is_none()
        && caller.is_none()
        && policy.attempt_timeout.is_none()
        && !policy.telemetry.spans_wanted()
    {
        return None;
    }
    make_cold_state(policy, caller)
}

#[cold]
fn make_cold_state<C, R, Res>(
    policy: &Policy<C, R>,
    caller: Option<tower_classify::deadline::Deadline>,
) -> Option<Box<Cold<Res>>> {
    let spans = policy.telemetry.call_spans();
    let now = Instant::now();
    // The earlier of the layer's deadline and the caller's.
    let own = policy.deadline.and_then(|d| now.checked_add(d));
    let deadline = own.into_iter().chain(caller.map(|c| c.instant())).min();
    if spans.is_none() && deadline.is_none() && policy.attempt_timeout.is_none() {
        return None;
    }
    Some(Box::new(Cold {
        retry: RetryState {
            deadline,
            deadline_total: deadline
                .map(|deadline| deadline.saturating_duration_since(now))
                .unwrap_or_default(),
            ..RetryState::default()
        },
        spans,
        ..Cold::default()
    }))
}

/// Ends the call on its deadline after `attempts` attempts, the last of
/// which failed with `failure` (a timeout when the deadline cut it): its
/// span, its metrics and listeners, and the [`DeadlineExceeded`] the caller
/// gets.
pub(crate) fn deadline_exceeded<C, R, Res>(
    policy: &Policy<C, R>,
    cold: &mut Cold<Res>,
    attempts: u32,
    failure: Failure,
) -> BoxError
where
    R: StopReport<Res>,
{
    let reason = StopReason::Deadline;
    cold.settle(&policy.replay);
    cold.end_span(attempts, Some(failure), Some(reason));
    policy.telemetry.gave_up(reason, attempts, failure);
    policy.listeners.gave_up(attempts, reason, failure);
    // With a deadline, what is kept of a retried attempt is its head.
    let (error, head) = match cold.answer.take() {
        Some(Answer::Head { error, head }) => (error, head),
        _ => (None, None),
    };
    Box::new(DeadlineExceeded::new(
        cold.retry.deadline_total,
        attempts,
        cold.retried,
        error,
        head,
    ))
}
