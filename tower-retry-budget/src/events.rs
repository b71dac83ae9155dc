//! What the retry loop tells callbacks and the responses it hands back: a
//! retry about to happen, a give-up and why, a success after retries.

use std::sync::Arc;
use std::time::Duration;

use tower_classify::Failure;

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

/// Why a call ended failed: passed to an
/// [`on_give_up`](crate::RetryBuilder::on_give_up) callback, kept by a
/// [`FailedSuccess`](crate::error::FailedSuccess), and put in a failed
/// response's extensions when it is handed back (by the
/// [`HttpReplay`](crate::replay::HttpReplay) strategy).
///
/// A retry layer *outside* this one hands a response that carries
/// [`StopReason::Budget`] back as it is, so two retry layers cannot multiply
/// the load the inner budget just refused to add.
///
/// ```
/// use tower_retry_budget::{RetryStopped, StopReason};
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
    pub(crate) give_up: Vec<Callback<RetryStopped>>,
    pub(crate) recovered: Vec<Callback<SuccessAfterRetries>>,
}

impl Listeners {
    pub(crate) fn retried(&self, event: &RetryEvent) {
        for callback in &self.retry {
            callback(event);
        }
    }

    /// Tells the callbacks why the call gave up: the event its answer is marked with.
    pub(crate) fn gave_up(
        &self,
        attempts: u32,
        reason: StopReason,
        failure: Failure,
    ) -> RetryStopped {
        let event = RetryStopped {
            reason,
            attempts,
            failure,
        };
        for callback in &self.give_up {
            callback(&event);
        }
        event
    }

    pub(crate) fn recovered(&self, attempts: u32) {
        let event = SuccessAfterRetries { attempts };
        for callback in &self.recovered {
            callback(&event);
        }
    }
}
