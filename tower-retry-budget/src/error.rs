//! Error types.
//!
//! The retry layer fails with a [`BoxError`]: the last attempt's own error,
//! or one of these when it ends the loop for a reason of its own (downcast
//! to tell them apart).
//!
//! # What other layers see
//!
//! Each error returns a [`Classified`] from [`Error::source`], so a circuit
//! breaker or dead-letter layer *outside* the retry layer classifies it through
//! `tower-classify` without depending on this crate:
//!
//! | error | kind | hint |
//! |---|---|---|
//! | [`BudgetExhausted`] | the last failure's kind (e.g. `server_error`) | `DoNotRetry` |
//! | [`WaitTooLong`] | the last failure's kind (e.g. `rate_limited`) | `DoNotRetry` |
//! | [`DeadlineExceeded`] | `timeout` | `DoNotRetry` |
//! | [`FailedSuccess`] | the response's failure kind (e.g. `rate_limited`) | `DoNotRetry` |
//!
//! A spent budget is **not** `Shed`: it ran out *because the dependency kept
//! failing*, and a breaker outside must count it. The last attempt's error,
//! if any, is the `Classified`'s own source.

use std::any::Any;
use std::error::Error;
use std::fmt;
use std::time::Duration;

use tower_classify::duration::format_duration;
use tower_classify::{BoxError, Classified, Failure, RetryHint};

use crate::events::RetryStopped;

fn given_up(failure: Failure, message: &'static str, cause: Option<BoxError>) -> Classified {
    let classified = Classified::new(failure.with_hint(RetryHint::DoNotRetry), message);
    match cause {
        Some(cause) => classified.with_source(cause),
        None => classified,
    }
}

/// "1 attempt", "2 attempts".
fn attempts(n: u32) -> String {
    format!("{n} attempt{}", if n == 1 { "" } else { "s" })
}

/// What an error kept of the response it replaced: for `http::Response`s
/// (with [`HttpReplay`](crate::replay::HttpReplay)), its
/// [`http::response::Parts`]: status, headers (a `Retry-After`), extensions,
/// read with `downcast_ref::<http::response::Parts>()`.
pub struct ResponseHead(Box<dyn Any + Send + Sync>);

impl ResponseHead {
    /// Keeps `head`.
    pub fn new<T: Any + Send + Sync>(head: T) -> Self {
        ResponseHead(Box::new(head))
    }

    /// The head, if it is a `T`.
    pub fn downcast_ref<T: Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl fmt::Debug for ResponseHead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        #[cfg(feature = "http")]
        if let Some(parts) = self.downcast_ref::<http::response::Parts>() {
            return f
                .debug_struct("ResponseHead")
                .field("status", &parts.status)
                .field("headers", &parts.headers)
                .finish();
        }
        f.write_str("ResponseHead(..)")
    }
}

/// The retry budget was spent: the layer returned at once instead of retrying.
///
/// Only for a last attempt that ended in an error: a failed *response* is
/// handed back marked with a [`RetryStopped`] of reason
/// [`Budget`](crate::StopReason::Budget).
#[derive(Debug)]
pub struct BudgetExhausted {
    stopped: RetryStopped,
    classified: Classified,
}

impl BudgetExhausted {
    pub(crate) fn new(stopped: RetryStopped, cause: Option<BoxError>) -> Self {
        BudgetExhausted {
            stopped,
            classified: given_up(stopped.failure, "retry budget exhausted", cause),
        }
    }

    /// The attempts made before giving up and the last one's failure (the
    /// [`Classified`] source carries it with a `DoNotRetry` hint).
    pub fn stopped(&self) -> RetryStopped {
        self.stopped
    }
}

impl fmt::Display for BudgetExhausted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "retry budget exhausted after {} ({})",
            attempts(self.stopped.attempts),
            self.stopped.failure.kind
        )
    }
}

impl Error for BudgetExhausted {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.classified)
    }
}

/// The server answered `2xx`, but the classifier calls the call a failure (a
/// response rule with `match_success` caught a throttled answer) and retrying
/// stopped: the answer is not handed back, so no caller reads a throttled or
/// failed response as its data.
#[derive(Debug)]
pub struct FailedSuccess {
    stopped: RetryStopped,
    classified: Classified,
    head: ResponseHead,
}

impl FailedSuccess {
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn new(stopped: RetryStopped, head: ResponseHead) -> Self {
        FailedSuccess {
            stopped,
            classified: given_up(
                stopped.failure,
                "a successful status classified as a failure",
                None,
            ),
            head,
        }
    }

    /// Why retrying stopped, after how many attempts, and how the
    /// classifier judged the response.
    pub fn stopped(&self) -> RetryStopped {
        self.stopped
    }

    /// The response's head (status, headers).
    pub fn response_head(&self) -> &ResponseHead {
        &self.head
    }
}

impl fmt::Display for FailedSuccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the server answered with a success classified as {} ({}, {})",
            self.stopped.failure.kind,
            attempts(self.stopped.attempts),
            self.stopped.reason.as_str()
        )
    }
}

impl Error for FailedSuccess {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.classified)
    }
}

/// Why a wait was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitLimit {
    /// The wait is longer than `max_wait`.
    MaxWait,
    /// The wait would end past the loop's deadline.
    Deadline,
}

/// The server asked for a wait (`Retry-After`, gRPC pushback, a response rule)
/// longer than `max_wait` or past the deadline: the layer returned at once
/// rather than sleep.
///
/// When the last attempt answered with a response, the error keeps its head
/// ([`response_head`](Self::response_head)); when it failed with an error,
/// that error is the source of the [`Classified`] source.
#[derive(Debug)]
pub struct WaitTooLong {
    wait: Duration,
    limit: Duration,
    reason: WaitLimit,
    stopped: RetryStopped,
    classified: Classified,
    head: Option<ResponseHead>,
}

impl WaitTooLong {
    pub(crate) fn new(
        wait: Duration,
        limit: Duration,
        reason: WaitLimit,
        stopped: RetryStopped,
        cause: Option<BoxError>,
        head: Option<ResponseHead>,
    ) -> Self {
        WaitTooLong {
            wait,
            limit,
            reason,
            stopped,
            classified: given_up(
                stopped.failure,
                "server asked for a wait that is too long",
                cause,
            ),
            head,
        }
    }

    /// The head of the response that asked for the wait, when the
    /// [`Replay`](crate::replay::Replay) strategy keeps one
    /// ([`HttpReplay`](crate::replay::HttpReplay) does).
    pub fn response_head(&self) -> Option<&ResponseHead> {
        self.head.as_ref()
    }

    /// The wait the server asked for.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// The limit it broke: `max_wait`, or the time left before the deadline.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// Which limit it broke.
    pub fn reason(&self) -> WaitLimit {
        self.reason
    }

    /// The attempts made before giving up and the last one's failure (the
    /// [`Classified`] source carries it with a `DoNotRetry` hint).
    pub fn stopped(&self) -> RetryStopped {
        self.stopped
    }
}

impl fmt::Display for WaitTooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let wait = format_duration(self.wait);
        let limit = format_duration(self.limit);
        match self.reason {
            WaitLimit::MaxWait => write!(
                f,
                "server asked to wait {wait}, longer than max_wait {limit}"
            ),
            WaitLimit::Deadline => write!(
                f,
                "server asked to wait {wait}, but only {limit} is left before the retry deadline"
            ),
        }
    }
}

impl Error for WaitTooLong {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.classified)
    }
}

/// The deadline for the whole loop passed while an attempt was in flight or
/// the service was not yet ready for the next one, or left less than the
/// minimum attempt time before the first attempt, which was then not sent
/// ([`attempts`](Self::attempts) is 0).
///
/// The failure that led to the retry cut short is kept: its error is the
/// source of the [`Classified`] source, and a response's head is
/// [`response_head`](Self::response_head).
#[derive(Debug)]
pub struct DeadlineExceeded {
    deadline: Duration,
    attempts: u32,
    classified: Classified,
    previous: Option<Failure>,
    head: Option<ResponseHead>,
}

impl DeadlineExceeded {
    pub(crate) fn new(
        deadline: Duration,
        attempts: u32,
        previous: Option<Failure>,
        cause: Option<BoxError>,
        head: Option<ResponseHead>,
    ) -> Self {
        DeadlineExceeded {
            deadline,
            attempts,
            classified: given_up(
                Failure::new(tower_classify::FailureKind::Timeout),
                "retry deadline exceeded",
                cause,
            ),
            previous,
            head,
        }
    }

    /// How the attempt before the one cut short failed; `None` when the
    /// first attempt ran out of time.
    pub fn previous_failure(&self) -> Option<Failure> {
        self.previous
    }

    /// The head of that attempt's response, when it answered with one and
    /// the [`Replay`](crate::replay::Replay) strategy keeps it.
    pub fn response_head(&self) -> Option<&ResponseHead> {
        self.head.as_ref()
    }

    /// The deadline, measured from the first attempt.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// The attempts started, including the one cut short; 0 when the
    /// deadline left less than the minimum attempt time before the first.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
}

impl fmt::Display for DeadlineExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.attempts == 0 {
            return write!(
                f,
                "deadline too close ({} left): no attempt was sent",
                format_duration(self.deadline)
            );
        }
        write!(
            f,
            "retry deadline of {} exceeded after {}",
            format_duration(self.deadline),
            attempts(self.attempts)
        )
    }
}

impl Error for DeadlineExceeded {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.classified)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::StopReason;
    use tower_classify::{ErrorChainClassifier, FailureKind};

    #[test]
    fn outer_layers_see_the_last_failure_not_shed_and_do_not_retry() {
        let cause: BoxError = std::io::Error::from(std::io::ErrorKind::ConnectionReset).into();
        let stopped = RetryStopped {
            reason: StopReason::Budget,
            attempts: 2,
            failure: Failure::new(FailureKind::Connection),
        };
        let err = BudgetExhausted::new(stopped, Some(cause));
        assert_eq!(err.stopped(), stopped);
        let outcome = ErrorChainClassifier::new().classify_error(&err);
        let failure = outcome.as_failure().unwrap();
        assert_eq!(failure.kind, FailureKind::Connection);
        assert_eq!(failure.hint, Some(RetryHint::DoNotRetry));
        assert!(!outcome.is_retryable());
        assert!(err
            .source()
            .unwrap()
            .source()
            .unwrap()
            .is::<std::io::Error>());
        assert_eq!(
            err.to_string(),
            "retry budget exhausted after 2 attempts (connection)"
        );
    }

    #[test]
    fn wait_too_long_names_the_wait() {
        let err = WaitTooLong::new(
            Duration::from_secs(7200),
            Duration::from_secs(3600),
            WaitLimit::MaxWait,
            RetryStopped {
                reason: StopReason::WaitTooLong,
                attempts: 1,
                failure: Failure::new(FailureKind::RateLimited),
            },
            None,
            None,
        );
        assert_eq!(
            err.to_string(),
            "server asked to wait 2h, longer than max_wait 1h"
        );
        let deadline = DeadlineExceeded::new(Duration::from_secs(4), 3, None, None, None);
        assert_eq!(
            deadline.to_string(),
            "retry deadline of 4s exceeded after 3 attempts"
        );
        let outcome = ErrorChainClassifier::new().classify_error(&deadline);
        assert_eq!(outcome.as_failure().unwrap().kind, FailureKind::Timeout);
    }
}
