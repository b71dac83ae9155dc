//! The hedge layer's metrics, events and spans, under its name.

use std::sync::Arc;
use std::time::Duration;

use metrics::Unit;
use tracing::field::Empty;
use tracing::Span;

use super::policy::Refusal;
use crate::telemetry::Telemetry;

const SENT: (&str, &str) = (
    "tower_hedge_sent_total",
    "Hedges sent: attempts after a call's first.",
);
const WON: (&str, &str) = (
    "tower_hedge_won_total",
    "Calls answered by a hedge rather than by their first attempt.",
);
const CANCELLED: (&str, &str) = (
    "tower_hedge_cancelled_total",
    "Attempts dropped because another attempt of the same call answered first.",
);
const REFUSED: (&str, &str) = (
    "tower_hedge_refused_total",
    "Hedges that were due but not sent, by reason (budget, deadline, not_ready).",
);
const DELAY: (&str, &str) = (
    "tower_hedge_delay_seconds",
    "The current percentile delay before a hedge is sent (NaN before enough samples).",
);

/// Registers the hedge layer's metric descriptions; documented, with the
/// retry layer's, at [`describe_metrics`](crate::describe_metrics).
pub(crate) fn describe_metrics() {
    for (name, description) in [SENT, WON, CANCELLED, REFUSED] {
        metrics::describe_counter!(name, Unit::Count, description);
    }
    metrics::describe_gauge!(DELAY.0, Unit::Seconds, DELAY.1);
}

// A hedge layer's events: its name is the `hedge` label of each metric.
impl Telemetry {
    /// The span of hedge `attempt` (2 or more), which the inner service
    /// runs in; disabled (and free) when no subscriber takes `debug`.
    pub(crate) fn hedge_span(&self, attempt: u32, delay: Duration) -> Span {
        if !tracing::level_enabled!(tracing::Level::DEBUG) {
            return Span::none();
        }
        tracing::debug_span!(
            "hedge_attempt",
            hedge = %self.name(),
            attempt,
            "http.request.resend_count" = attempt - 1,
            delay = %tower_classify::duration::format_duration(delay),
            outcome = Empty,
        )
    }

    pub(crate) fn sent(&self, attempt: u32) {
        metrics::counter!(SENT.0, "hedge" => Arc::clone(self.name())).increment(1);
        tracing::debug!(hedge = %self.name(), attempt, "hedge sent");
    }

    pub(crate) fn won(&self, attempt: u32) {
        metrics::counter!(WON.0, "hedge" => Arc::clone(self.name())).increment(1);
        tracing::debug!(hedge = %self.name(), attempt, "hedge won");
    }

    pub(crate) fn cancelled(&self, attempts: u64) {
        metrics::counter!(CANCELLED.0, "hedge" => Arc::clone(self.name())).increment(attempts);
    }

    pub(crate) fn refused(&self, attempt: u32, reason: Refusal) {
        let reason = reason.as_str();
        metrics::counter!(REFUSED.0, "hedge" => Arc::clone(self.name()), "reason" => reason)
            .increment(1);
        tracing::debug!(hedge = %self.name(), attempt, reason, "hedge not sent");
    }

    pub(crate) fn delay_changed(&self, delay: Option<Duration>) {
        let seconds = delay.map_or(f64::NAN, |delay| delay.as_secs_f64());
        metrics::gauge!(DELAY.0, "hedge" => Arc::clone(self.name())).set(seconds);
    }
}
