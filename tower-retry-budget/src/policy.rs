//! What is retried, how often and for how long: the settings every clone of
//! a [`RetryLayer`](crate::RetryLayer) shares, and the presets.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_classify::{Failure, FailureKind, RetryHint, RetryOn};

use tokio::time::Instant;

use crate::backoff::{Backoff, BackoffIter};
use crate::budget::Budget;
use crate::error::WaitLimit;

/// One retry about to happen, as passed to an
/// [`on_retry`](crate::RetryBuilder::on_retry) callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryEvent {
    /// The attempt about to be made (2 for the first retry).
    pub attempt: u32,
    /// Why the previous attempt failed.
    pub failure: Failure,
    /// How long the layer sleeps before it.
    pub wait: Duration,
}

/// Why the loop handed a failed result back instead of retrying it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StopReason {
    /// The failure is not one this layer retries (a client error, a
    /// `DoNotRetry` hint, a class outside `retry_on`).
    NotRetried,
    /// `max_retries` retries were made.
    Attempts,
    /// The next sleep would have crossed the loop's deadline.
    Deadline,
    /// The retry budget was spent: the dependency is failing for many
    /// callers, and retrying would add load to an outage.
    Budget,
    /// A load-shedding refusal below (an open circuit) that did not fit in
    /// the deadline.
    Shed,
    /// The request could not be sent again (not idempotent, or its body
    /// outgrew the replay limit).
    NotReplayable,
    /// The server asked for a wait longer than `max_wait` or past the
    /// deadline ([`WaitTooLong`](crate::error::WaitTooLong)).
    WaitTooLong,
}

impl StopReason {
    /// A short, stable name for logs and metric labels (`budget`, …).
    pub const fn as_str(self) -> &'static str {
        match self {
            StopReason::NotRetried => "not_retried",
            StopReason::Attempts => "attempts",
            StopReason::Deadline => "deadline",
            StopReason::Budget => "budget",
            StopReason::Shed => "shed",
            StopReason::NotReplayable => "not_replayable",
            StopReason::WaitTooLong => "wait_too_long",
        }
    }
}

/// A failed response's note of why it was handed back: the
/// [`HttpReplay`](crate::replay::HttpReplay) strategy puts it in the
/// response's extensions.
///
/// A retry layer *outside* this one hands a response that carries
/// [`StopReason::Budget`] back as it is, so two retry layers cannot multiply
/// the load the inner budget just refused to add.
///
/// ```
/// use tower_retry_budget::policy::{RetryStopped, StopReason};
///
/// fn why(response: &http::Response<()>) -> Option<StopReason> {
///     response.extensions().get::<RetryStopped>().map(|stopped| stopped.reason)
/// }
/// # assert_eq!(why(&http::Response::new(())), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryStopped {
    /// Why retrying stopped.
    pub reason: StopReason,
    /// The attempts made, the first included.
    pub attempts: u32,
}

/// Which failures are retried.
#[derive(Clone)]
pub(crate) enum RetryIf {
    /// Retryable failures ([`Failure::is_retryable`]) of these classes.
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
            RetryIf::Classes(classes) => failure.is_retryable() && classes.contains(failure.kind),
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

/// A call that ended in failure, as passed to an
/// [`on_give_up`](crate::RetryBuilder::on_give_up) callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct GiveUpEvent {
    /// The attempts made, the first included.
    pub attempts: u32,
    /// Why retrying stopped.
    pub reason: StopReason,
    /// How the last attempt failed.
    pub failure: Failure,
}

/// A call that succeeded after retries, as passed to an
/// [`on_success_after_retries`](crate::RetryBuilder::on_success_after_retries)
/// callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SuccessAfterRetries {
    /// The attempts made, the successful one included (at least 2).
    pub attempts: u32,
}

/// A registered callback for events of type `E`.
pub(crate) type Callback<E> = Arc<dyn Fn(&E) + Send + Sync>;

/// Every registered callback, each kind called in the order added.
#[derive(Clone, Default)]
pub(crate) struct Listeners {
    pub(crate) retry: Vec<Callback<RetryEvent>>,
    pub(crate) give_up: Vec<Callback<GiveUpEvent>>,
    pub(crate) recovered: Vec<Callback<SuccessAfterRetries>>,
}

impl Listeners {
    pub(crate) fn retried(&self, event: &RetryEvent) {
        for callback in &self.retry {
            callback(event);
        }
    }

    pub(crate) fn gave_up(&self, attempts: u32, reason: StopReason, failure: Failure) {
        let event = GiveUpEvent {
            attempts,
            reason,
            failure,
        };
        for callback in &self.give_up {
            callback(&event);
        }
    }

    pub(crate) fn recovered(&self, attempts: u32) {
        let event = SuccessAfterRetries { attempts };
        for callback in &self.recovered {
            callback(&event);
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

/// `true` for the kinds the layer may wait out once without a classifier's
/// blessing: a local load-shedding refusal below the retry layer.
pub(crate) fn is_shed(kind: FailureKind) -> bool {
    kind == FailureKind::Shed
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

impl<C, R> Policy<C, R> {
    /// Whether `deadline` leaves less than the minimum attempt time (or
    /// nothing at all): no attempt, the first included, is started then.
    pub(crate) fn no_time_for_an_attempt(&self, deadline: Option<Instant>) -> bool {
        deadline.is_some_and(|deadline| {
            let left = deadline.saturating_duration_since(Instant::now());
            left.is_zero() || left < self.min_attempt_time
        })
    }

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
        let shed = is_shed(failure.kind);
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
                return self.stop(StopReason::Shed, attempts, failure);
            }
        } else if !self.retry_if.allows(&failure) {
            return Decision::Stop(Stop::HandBack(StopReason::NotRetried));
        }
        if attempts > self.max_retries {
            return self.stop(StopReason::Attempts, attempts, failure);
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
        if let Some(wait) = hinted {
            if wait > self.max_wait {
                self.telemetry
                    .gave_up(StopReason::WaitTooLong, attempts, failure);
                return Decision::Stop(Stop::TooLong {
                    wait,
                    limit: self.max_wait,
                    reason: WaitLimit::MaxWait,
                });
            }
        }
        if let Some(deadline) = state.deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            // The next attempt must start before the deadline, with at least
            // `min_attempt_time` left to run.
            if wait.saturating_add(self.min_attempt_time) >= left {
                if hinted.is_some() && !shed {
                    self.telemetry
                        .gave_up(StopReason::WaitTooLong, attempts, failure);
                    return Decision::Stop(Stop::TooLong {
                        wait,
                        limit: left,
                        reason: WaitLimit::Deadline,
                    });
                }
                // A computed sleep that would cross the deadline is not started.
                return self.stop(StopReason::Deadline, attempts, failure);
            }
        }
        // A refusal below never reached the dependency, so the attempt after
        // waiting it out adds no load to it: it spends no budget.
        if let Some(budget) = self.budget.as_ref().filter(|_| !shed) {
            if !budget.withdraw() {
                self.telemetry.budget_exhausted();
                self.telemetry
                    .gave_up(StopReason::Budget, attempts, failure);
                return Decision::Stop(Stop::Budget);
            }
        }
        if shed {
            state.waited_for_shed = true;
        }
        Decision::Retry(wait)
    }

    fn stop(&self, reason: StopReason, attempts: u32, failure: Failure) -> Decision {
        self.telemetry.gave_up(reason, attempts, failure);
        Decision::Stop(Stop::HandBack(reason))
    }
}

#[cfg(feature = "http")]
pub use self::presets::{default_retry, default_retry_non_idempotent};

#[cfg(feature = "http")]
mod presets {
    use std::time::Duration;

    use http::StatusCode;
    use tower_classify::http::StatusSet;
    use tower_classify::{FailureKind, HttpClassifier, RetryOn};

    use crate::backoff::{Backoff, Jitter};
    use crate::layer::RetryBuilder;
    use crate::replay::HttpReplay;

    /// Google's HTTP backoff: 1 s, ×1.25, at most 60 s, no jitter.
    const GOOGLE_BACKOFF: Backoff = Backoff::exponential(Duration::from_secs(1))
        .with_multiplier(1.25)
        .with_max_delay(Duration::from_secs(60))
        .with_jitter(Jitter::None);

    fn statuses(codes: &[StatusCode]) -> StatusSet {
        codes.iter().copied().collect()
    }

    /// Google Cloud Workflows' `http.default_retry` (documented at
    /// <https://cloud.google.com/workflows/docs/reference/stdlib/http/default_retry>): HTTP 429, 502,
    /// 503 and 504, connection errors and timeouts; 5 retries; backoff 1 s
    /// initial, multiplier 1.25, at most 60 s.
    ///
    /// Idempotency rules stay on: POST and PATCH are retried only with an
    /// `Idempotency-Key` header. Google's delays are stated without jitter, so
    /// the preset has none; add it with `.backoff(...)` if many clients share
    /// a dependency. Every setting can be changed before `build()`.
    ///
    /// ```
    /// use tower_retry_budget::policy::default_retry;
    /// let layer = default_retry().build().unwrap();
    /// # let _ = layer;
    /// ```
    pub fn default_retry() -> RetryBuilder<HttpClassifier, HttpReplay> {
        let classifier = HttpClassifier::new().retryable_statuses(statuses(&[
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::BAD_GATEWAY,
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::GATEWAY_TIMEOUT,
        ]));
        RetryBuilder::new(classifier, HttpReplay::new())
            .max_retries(5)
            .backoff(GOOGLE_BACKOFF)
    }

    /// Google Cloud Workflows' `http.default_retry_non_idempotent`: HTTP 429
    /// and 503 and connection *failures* only; 5 retries; the same backoff.
    ///
    /// This is the policy Google gives *non-idempotent* steps, so it retries
    /// POST and PATCH too (`retry_non_idempotent(true)`): the failures it
    /// retries are those where the server did not act on the request. So no
    /// timeouts (a timed-out call may have been applied) and, of connection
    /// errors, only [`NotSent`](FailureKind::NotSent) ones (refused, DNS, a
    /// failed connect): a connection lost after the request was written may
    /// have been acted on, and sending it again could apply it twice.
    pub fn default_retry_non_idempotent() -> RetryBuilder<HttpClassifier, HttpReplay> {
        let classifier = HttpClassifier::new().retryable_statuses(statuses(&[
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::SERVICE_UNAVAILABLE,
        ]));
        let classes = RetryOn::new([
            FailureKind::ServerError,
            FailureKind::RateLimited,
            FailureKind::NotSent,
        ])
        .expect("a non-empty set of transient kinds");
        RetryBuilder::new(classifier, HttpReplay::new().retry_non_idempotent(true))
            .max_retries(5)
            .backoff(GOOGLE_BACKOFF)
            .retry_on(classes)
    }
}
