//! What is retried, how often and for how long: the settings every clone of
//! a [`RetryLayer`](crate::RetryLayer) shares, and the decision after each
//! attempt.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_classify::{Failure, FailureKind, RetryHint, RetryOn};

use tokio::time::Instant;

use crate::backoff::{Backoff, BackoffIter};
use crate::budget::Budget;
use crate::error::WaitLimit;
use crate::events::{Listeners, StopReason};

/// Which failures are retried.
#[derive(Clone)]
pub(crate) enum RetryIf {
    /// Retryable failures ([`Outcome::is_retryable`](tower_classify::Outcome::is_retryable)) of these classes.
    Classes(RetryOn),
    /// A caller's predicate; a hint that forbids a retry still wins.
    Predicate(Arc<dyn Fn(&Failure) -> bool + Send + Sync>),
}

impl RetryIf {
    pub(crate) fn allows(&self, failure: &Failure) -> bool {
        if failure.forbids_retry() {
            return false;
        }
        match self {
            RetryIf::Classes(classes) => {
                failure.kind.is_transient() && classes.contains(failure.kind)
            }
            RetryIf::Predicate(predicate) => predicate(failure),
        }
    }
}

impl fmt::Debug for RetryIf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RetryIf::Classes(classes) => classes.fmt(f),
            RetryIf::Predicate(_) => f.write_str("<predicate>"),
        }
    }
}

/// The resolved settings, behind one `Arc` shared by every clone.
pub(crate) struct Policy<C, R> {
    pub(crate) classifier: C,
    pub(crate) replay: R,
    pub(crate) retry_if: RetryIf,
    pub(crate) max_retries: u32,
    pub(crate) backoff: Backoff,
    pub(crate) deadline: Option<Duration>,
    pub(crate) attempt_timeout: Option<Duration>,
    pub(crate) max_wait: Duration,
    pub(crate) min_attempt_time: Duration,
    /// Whether a server's wait restarts the computed backoff (gRFC A6).
    pub(crate) restart_backoff_after_hint: bool,
    pub(crate) budget: Option<Arc<dyn Budget + Send + Sync>>,
    pub(crate) listeners: Listeners,
    pub(crate) telemetry: crate::telemetry::Telemetry,
}

impl<C: fmt::Debug, R: fmt::Debug> fmt::Debug for Policy<C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("classifier", &self.classifier)
            .field("replay", &self.replay)
            .field("retry_if", &self.retry_if)
            .field("max_retries", &self.max_retries)
            .field("backoff", &self.backoff)
            .field("deadline", &self.deadline)
            .field("attempt_timeout", &self.attempt_timeout)
            .field("max_wait", &self.max_wait)
            .field("budget", &self.budget.is_some())
            .field("on_retry", &self.listeners.retry.len())
            .field("on_give_up", &self.listeners.give_up.len())
            .field("on_success_after_retries", &self.listeners.recovered.len())
            .field("name", self.telemetry.name())
            .finish()
    }
}

/// The share of a waited-out refusal added at random, so that the callers
/// refused together do not all come back on the same tick.
const SHED_JITTER: f64 = 0.25;

/// What to do after a failed attempt.
pub(crate) enum Decision {
    /// Sleep this long, then make the next attempt.
    Retry(Duration),
    /// End the call.
    Stop(Stop),
}

/// How a call that stops retrying ends.
pub(crate) enum Stop {
    /// A failure not retried: hand it back, a response marked with why.
    HandBack(StopReason),
    /// The budget is spent: an error becomes
    /// [`BudgetExhausted`](crate::error::BudgetExhausted), a response is
    /// handed back marked.
    Budget,
    /// Stop with [`WaitTooLong`](crate::error::WaitTooLong).
    TooLong {
        wait: Duration,
        limit: Duration,
        reason: WaitLimit,
    },
}

impl Stop {
    /// Why retrying stopped.
    pub(crate) fn reason(&self) -> StopReason {
        match self {
            Stop::HandBack(reason) => *reason,
            Stop::Budget => StopReason::Budget,
            Stop::TooLong { .. } => StopReason::WaitTooLong,
        }
    }
}

/// What a call carries from one attempt to the next, for the decisions.
#[derive(Default)]
pub(crate) struct RetryState {
    /// When the whole loop must end, if it has a deadline: the earlier of
    /// the layer's and the caller's.
    pub(crate) deadline: Option<Instant>,
    /// How long the loop's deadline allowed, for `DeadlineExceeded`.
    pub(crate) deadline_total: Duration,
    /// Made on the first retry: a call that succeeds needs no random
    /// generator.
    pub(crate) backoff: Option<BackoffIter>,
    /// Whether a refusal below was already waited out once.
    pub(crate) waited_for_shed: bool,
}

/// What `deadline` leaves when that is less than `min`, the minimum attempt
/// time, or nothing: no attempt, the first included, is started then.
pub(crate) fn too_little_left(deadline: Option<Instant>, min: Duration) -> Option<Duration> {
    let left = deadline?.saturating_duration_since(Instant::now());
    (left.is_zero() || left < min).then_some(left)
}

impl<C, R> Policy<C, R> {
    /// Decides what follows attempt number `attempts`, which failed with
    /// `failure`. `replayable` says whether a copy of the request can be
    /// sent again.
    pub(crate) fn decide(
        &self,
        failure: Failure,
        attempts: u32,
        replayable: bool,
        state: &mut RetryState,
    ) -> Decision {
        // A load-shedding refusal below us (a breaker's open circuit): never
        // retried at once. Its hint (when to come back) is waited out once, and only
        // when the caller set a deadline it fits in and it is no longer than
        // `max_delay`: with no deadline every caller would sleep out the whole
        // recovery and come back on the same tick.
        let shed = failure.kind == FailureKind::Shed;
        let mut shed_wait = None;
        if shed {
            shed_wait = match (failure.hint, state.deadline) {
                (Some(RetryHint::After(wait)), Some(deadline))
                    if !state.waited_for_shed
                        && wait <= self.backoff.max_delay()
                        && wait <= self.max_wait =>
                {
                    let left = deadline.saturating_duration_since(Instant::now());
                    left.checked_sub(wait)
                        .filter(|slack| !slack.is_zero())
                        .map(|slack| {
                            // Later, never sooner: before `wait` the refusal
                            // stands. Nor past `max_wait`, which the refusal
                            // itself fit: the jitter is ours, not asked for.
                            let jitter = wait.mul_f64(SHED_JITTER * fastrand::f64());
                            (wait + jitter.min(slack / 2)).min(self.max_wait)
                        })
                }
                _ => None,
            };
            if shed_wait.is_none() {
                return self.stop(Stop::HandBack(StopReason::Shed), attempts, failure);
            }
        } else if !self.retry_if.allows(&failure) {
            return Decision::Stop(Stop::HandBack(StopReason::NotRetried));
        }
        if attempts > self.max_retries {
            return self.stop(Stop::HandBack(StopReason::Attempts), attempts, failure);
        }
        if !replayable {
            tracing::debug!(
                retry = %self.telemetry.name(),
                attempts,
                class = failure.kind.as_str(),
                "request cannot be replayed; not retrying"
            );
            return Decision::Stop(Stop::HandBack(StopReason::NotReplayable));
        }
        let computed = state
            .backoff
            .get_or_insert_with(|| self.backoff.iter())
            .next()
            .unwrap_or_default();
        let hinted = if shed {
            shed_wait
        } else {
            failure.retry_after()
        };
        let wait = hinted.unwrap_or(computed);
        if hinted.is_some() && !shed && self.restart_backoff_after_hint {
            // gRFC A6: after a pushback the backoff starts again at its
            // initial delay.
            state.backoff = None;
        }
        if let Some(wait) = hinted.filter(|&wait| wait > self.max_wait) {
            let too_long = Stop::TooLong {
                wait,
                limit: self.max_wait,
                reason: WaitLimit::MaxWait,
            };
            return self.stop(too_long, attempts, failure);
        }
        if let Some(deadline) = state.deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            // The next attempt must start before the deadline, with at least
            // `min_attempt_time` left to run.
            if wait.saturating_add(self.min_attempt_time) >= left {
                if hinted.is_some() && !shed {
                    let too_long = Stop::TooLong {
                        wait,
                        limit: left,
                        reason: WaitLimit::Deadline,
                    };
                    return self.stop(too_long, attempts, failure);
                }
                // A computed sleep that would cross the deadline is not started.
                return self.stop(Stop::HandBack(StopReason::Deadline), attempts, failure);
            }
        }
        // A refusal below never reached the dependency, so the attempt after
        // waiting it out adds no load to it: it spends no budget.
        if let Some(budget) = self.budget.as_ref().filter(|_| !shed) {
            if !budget.withdraw() {
                self.telemetry.budget_exhausted();
                return self.stop(Stop::Budget, attempts, failure);
            }
        }
        if shed {
            state.waited_for_shed = true;
        }
        Decision::Retry(wait)
    }

    /// Stops, counted in the metrics (a failure not retried or not replayable is not).
    fn stop(&self, stop: Stop, attempts: u32, failure: Failure) -> Decision {
        self.telemetry.gave_up(stop.reason(), attempts, failure);
        Decision::Stop(stop)
    }
}
