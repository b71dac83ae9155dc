//! What a layer was configured with, shared by every breaker it creates.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::instruments::MetricsLabel;
use crate::policy::Policy;
use crate::state::{CallCallback, Callback, Mode};

/// Everything configured, shared by every breaker a layer creates.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) name: Arc<str>,
    pub(crate) policy: Policy,
    pub(crate) recovery_timeout: Duration,
    pub(crate) max_recovery_timeout: Option<Duration>,
    pub(crate) recovery_multiplier: f64,
    pub(crate) recovery_jitter: f64,
    pub(crate) probes: u32,
    pub(crate) probe_timeout: Duration,
    pub(crate) slow_start: Duration,
    pub(crate) slow_call_threshold: Option<Duration>,
    pub(crate) slow_call_rate: Option<f64>,
    pub(crate) mode: Mode,
    pub(crate) pending_when_open: bool,
    pub(crate) on_state_change: Callbacks<Callback>,
    pub(crate) on_call: Callbacks<CallCallback>,
    pub(crate) max_breakers: usize,
    pub(crate) metrics_label: MetricsLabel,
}

/// Callbacks in the order they were added; `Debug` shows how many.
pub(crate) struct Callbacks<F: ?Sized>(pub(crate) Vec<Arc<F>>);

impl<F: ?Sized> Clone for Callbacks<F> {
    fn clone(&self) -> Self {
        Callbacks(self.0.clone())
    }
}

impl<F: ?Sized> fmt::Debug for Callbacks<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0.len(), f)
    }
}

impl Settings {
    /// How long the breaker stays open after its `streak`-th reopen in a row
    /// (0 for an open from closed): the first period, grown exponentially
    /// when a maximum is configured, capped, then jittered downwards.
    pub(crate) fn open_duration(&self, streak: u32) -> Duration {
        let mut wait = self.recovery_timeout;
        if let Some(max) = self.max_recovery_timeout {
            let grown = self.recovery_timeout.as_secs_f64()
                * self.recovery_multiplier.powi(streak.min(1_000) as i32);
            wait = if grown.is_finite() && grown < max.as_secs_f64() {
                Duration::from_secs_f64(grown)
            } else {
                max
            };
        }
        if self.recovery_jitter > 0.0 {
            // Downwards only, so the cap stays a cap; it spreads the probes of
            // many processes that opened together.
            // A factor that rounds to 1 on a wait near `Duration::MAX` must
            // not overflow it (`mul_f64` panics): the wait stays as it is.
            let factor = 1.0 - self.recovery_jitter * fastrand::f64();
            wait = Duration::try_from_secs_f64(wait.as_secs_f64() * factor).unwrap_or(wait);
        }
        wait
    }
}
