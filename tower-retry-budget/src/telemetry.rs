//! Metrics, events and spans, all under the layer's name.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use metrics::Unit;
use tower_classify::duration::format_duration;
use tower_classify::{Failure, LogLimit};
use tracing::field::Empty;
use tracing::Span;

use crate::events::StopReason;

/// The metrics the retry layer emits, with their descriptions.
const COUNTERS: [(&str, &str); 3] = [
    (
        "tower_retry_retries_total",
        "Retries sent, by the class of failure that caused them.",
    ),
    (
        "tower_retry_giveups_total",
        "Calls that ended failed because a retry was not allowed, by reason \
         (attempts, deadline, budget, wait_too_long, shed).",
    ),
    (
        "tower_retry_budget_exhausted_total",
        "Retries refused by the retry budget.",
    ),
];
const SLEEP_HISTOGRAM: (&str, &str) = (
    "tower_retry_sleep_seconds",
    "Time slept before a retry (backoff or a server's Retry-After).",
);

/// How often a give-up is logged at `warn`; the rest go to `debug`.
const GIVE_UP_WARN_INTERVAL: Duration = Duration::from_secs(10);

/// Registers the retry layer's metric descriptions (see
/// [`describe_metrics`](crate::describe_metrics)).
pub(crate) fn describe_retry_metrics() {
    for (name, description) in COUNTERS {
        metrics::describe_counter!(name, Unit::Count, description);
    }
    let (name, description) = SLEEP_HISTOGRAM;
    metrics::describe_histogram!(name, Unit::Seconds, description);
}

/// A layer's name and its rate limit on give-up warnings, shared by every
/// call through the layer; a hedge layer's methods are in `hedge`.
pub(crate) struct Telemetry {
    name: Arc<str>,
    give_up_warning: LogLimit,
}

impl fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Telemetry")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A call's spans: the logical call and the attempt in flight.
///
/// Made only when a subscriber wants them, and kept in the response
/// future's boxed cold state: a call with spans disabled carries none.
pub(crate) struct CallSpans {
    // Declared first so it is dropped (closed) first: an attempt ends
    // before its call.
    pub(crate) attempt: Span,
    pub(crate) call: Span,
}

impl Telemetry {
    pub(crate) fn new(name: Arc<str>) -> Self {
        Telemetry {
            name,
            give_up_warning: LogLimit::new(GIVE_UP_WARN_INTERVAL),
        }
    }

    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Whether a subscriber may record the call's spans: one relaxed load,
    /// `false` when no subscriber takes `debug` (one at `info`, or none).
    #[inline]
    pub(crate) fn spans_wanted(&self) -> bool {
        tracing::level_enabled!(tracing::Level::DEBUG)
    }

    /// The spans of a new call, `None` when no subscriber records them.
    /// Field names follow OpenTelemetry's where it has one:
    /// `http.request.resend_count` on every attempt after the first and
    /// `error.type` for the class of a failure.
    pub(crate) fn call_spans(&self) -> Option<CallSpans> {
        let call = tracing::debug_span!(
            "retry",
            retry = %self.name,
            attempts = Empty,
            outcome = Empty,
            "error.type" = Empty,
            stop_reason = Empty,
        );
        if call.is_disabled() {
            return None;
        }
        let attempt = Self::attempt_span(&call, 1);
        Some(CallSpans { attempt, call })
    }

    /// The span of attempt `attempt`. Its `wait` is the sleep after it,
    /// recorded when it failed and is retried.
    pub(crate) fn attempt_span(call: &Span, attempt: u32) -> Span {
        let span = tracing::debug_span!(
            parent: call,
            "retry_attempt",
            attempt,
            "http.request.resend_count" = Empty,
            wait = Empty,
            outcome = Empty,
            "error.type" = Empty,
        );
        if attempt > 1 {
            span.record("http.request.resend_count", attempt - 1);
        }
        span
    }

    /// A retry about to sleep `wait` before attempt `attempt`.
    pub(crate) fn retrying(&self, attempt: u32, failure: Failure, wait: Duration) {
        let class = failure.kind.as_str();
        metrics::counter!(
            COUNTERS[0].0,
            "retry" => Arc::clone(&self.name),
            "class" => class
        )
        .increment(1);
        metrics::histogram!(SLEEP_HISTOGRAM.0, "retry" => Arc::clone(&self.name))
            .record(wait.as_secs_f64());
        tracing::debug!(
            retry = %self.name,
            attempt,
            class,
            wait = %format_duration(wait),
            "retrying"
        );
    }

    /// A call that ends failed because no further attempt was allowed.
    ///
    /// During an outage this happens on every call: it is logged at `debug`
    /// each time and at `warn` at most once per 10 s per layer, with the
    /// number of give-ups since the last warning.
    pub(crate) fn gave_up(&self, reason: StopReason, attempts: u32, failure: Failure) {
        let reason = reason.as_str();
        metrics::counter!(
            COUNTERS[1].0,
            "retry" => Arc::clone(&self.name),
            "reason" => reason
        )
        .increment(1);
        let class = failure.kind.as_str();
        match self.give_up_warning.check() {
            Some(held_back) => tracing::warn!(
                retry = %self.name,
                attempts,
                class,
                reason,
                since_last_warning = held_back,
                "giving up retrying (logged at most once per 10 s per layer; every give-up at debug)"
            ),
            None => tracing::debug!(
                retry = %self.name,
                attempts,
                class,
                reason,
                "giving up retrying"
            ),
        }
    }

    pub(crate) fn budget_exhausted(&self) {
        metrics::counter!(COUNTERS[2].0, "retry" => Arc::clone(&self.name)).increment(1);
    }
}

/// Records how a call or an attempt ended on its `span`.
pub(crate) fn record_outcome(span: &Span, failure: Option<Failure>) {
    match failure {
        None => {
            span.record("outcome", "success");
        }
        Some(failure) => {
            span.record("outcome", "failure");
            span.record("error.type", failure.kind.as_str());
        }
    }
}
