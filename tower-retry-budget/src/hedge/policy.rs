use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::latency::LatencyWindow;
use crate::budget::{Budget, TpsBudget};
use crate::policy::too_little_left;
use crate::telemetry::Telemetry;

/// Where a call's hedge delay comes from.
pub(crate) enum DelaySource {
    Fixed(Duration),
    Window(LatencyWindow),
}

impl DelaySource {
    #[inline]
    pub(crate) fn current(&self) -> Option<Duration> {
        match self {
            DelaySource::Fixed(delay) => Some(*delay),
            DelaySource::Window(window) => window.delay(),
        }
    }

    /// Whether first attempts' latencies are recorded (and so timed).
    #[inline]
    pub(crate) fn records(&self) -> bool {
        matches!(self, DelaySource::Window(_))
    }
}

/// What every call through one [`HedgeLayer`](super::HedgeLayer) shares.
pub(crate) struct HedgePolicy<C, R> {
    pub(crate) classifier: C,
    pub(crate) replay: R,
    pub(crate) max_attempts: u32,
    pub(crate) delay: DelaySource,
    pub(crate) own_budget: Option<TpsBudget>,
    pub(crate) shared: Vec<Arc<dyn Budget + Send + Sync>>,
    pub(crate) min_attempt_time: Duration,
    pub(crate) telemetry: Telemetry,
}

impl<C: fmt::Debug, R: fmt::Debug> fmt::Debug for HedgePolicy<C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HedgePolicy")
            .field("classifier", &self.classifier)
            .field("replay", &self.replay)
            .field("max_attempts", &self.max_attempts)
            .field("current_delay", &self.delay.current())
            .field("budgeted", &self.own_budget.is_some())
            .field("shared_budgets", &self.shared.len())
            .field("min_attempt_time", &self.min_attempt_time)
            .field("name", &self.telemetry.name())
            .finish()
    }
}

/// Why a hedge that was due was not sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The layer's budget, a shared one or A6 throttling said no.
    Budget,
    /// Less than `min_attempt_time` was left before the caller's deadline.
    Deadline,
    /// The service failed to become ready for the hedge.
    NotReady,
    /// The request's body cannot be sent again (a streamed body that
    /// outgrew its recording).
    NotReplayable,
}

impl Refusal {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Refusal::Budget => "budget",
            Refusal::Deadline => "deadline",
            Refusal::NotReady => "not_ready",
            Refusal::NotReplayable => "not_replayable",
        }
    }
}

impl<C, R> HedgePolicy<C, R> {
    /// A call is starting: it counts toward the extra-load budget.
    #[inline]
    pub(crate) fn deposit(&self) {
        if let Some(budget) = &self.own_budget {
            budget.deposit();
        }
    }

    /// Whether a hedge may be sent now, withdrawing from every budget when
    /// it may. The layer's own budget is asked first, as Finagle asks its
    /// backup budget before the client's retry budget, and is given its
    /// withdrawal back when a shared budget then refuses.
    pub(crate) fn allow_hedge(&self, deadline: Option<Instant>) -> Result<(), Refusal> {
        if too_little_left(deadline, self.min_attempt_time).is_some() {
            return Err(Refusal::Deadline);
        }
        if let Some(own) = &self.own_budget {
            if !own.withdraw() {
                return Err(Refusal::Budget);
            }
        }
        if self.shared.iter().all(|budget| budget.withdraw()) {
            return Ok(());
        }
        if let Some(own) = &self.own_budget {
            own.refund();
        }
        Err(Refusal::Budget)
    }

    /// Records how long a call's first attempt, timed from `started`, ran:
    /// until it answered, or until another attempt won (a lower bound, and
    /// above the delay).
    pub(crate) fn record_latency(&self, started: Option<Instant>) {
        if let (DelaySource::Window(window), Some(started)) = (&self.delay, started) {
            let before = window.delay();
            let now = Instant::now();
            window.record(now.saturating_duration_since(started), now);
            let after = window.delay();
            if after != before {
                self.telemetry.delay_changed(after);
            }
        }
    }
}
