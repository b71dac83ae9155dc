//! Configuration from files.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tower_classify::{duration, ConfigError};

use crate::instruments::MetricsLabel;
use crate::layer::Builder;
use crate::policy::{Policy, Window};
use crate::state::Mode;

/// A breaker's settings as they appear in a configuration file. Unknown keys
/// are refused; durations are written in human form (`"30s"`, `"1m30s"`).
///
/// ```
/// use tower_breaker::BreakerConfig;
/// use tower_classify::ErrorChainClassifier;
///
/// let config: BreakerConfig = serde_json::from_str(r#"{
///     "failure_rate": { "rate": 0.5, "minimum_calls": 20, "window": { "length": "60s" } },
///     "recovery_timeout": "10s",
///     "max_recovery_timeout": "5m"
/// }"#).unwrap();
/// let layer = config.builder()?.build(ErrorChainClassifier::new())?;
/// # drop(layer);
/// # Ok::<(), tower_classify::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct BreakerConfig {
    /// See [`Builder::name`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// See [`Builder::mode`].
    pub mode: Mode,
    /// Consecutive failures that open the breaker (default 5). Exclusive with
    /// `failure_rate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<u32>,
    /// A failure-rate policy instead of consecutive failures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_rate: Option<FailureRateConfig>,
    /// Adaptive throttling instead of opening; see
    /// [`Policy::AdaptiveThrottle`]. Exclusive with the two above.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adaptive_throttle: Option<AdaptiveThrottleConfig>,
    /// A fixed open period; see [`Builder::recovery_timeout`]. Absent: the
    /// default schedule.
    #[serde(with = "duration::serde", skip_serializing_if = "Option::is_none")]
    pub recovery_timeout: Option<Duration>,
    /// See [`Builder::max_recovery_timeout`].
    #[serde(with = "duration::serde", skip_serializing_if = "Option::is_none")]
    pub max_recovery_timeout: Option<Duration>,
    /// See [`Builder::recovery_multiplier`] (default 2).
    pub recovery_multiplier: f64,
    /// See [`Builder::recovery_jitter`] (default 0.2, or 0 with a fixed
    /// `recovery_timeout`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery_jitter: Option<f64>,
    /// See [`Builder::probes`] (default 1).
    pub probes: u32,
    /// See [`Builder::probe_timeout`] (default `"60s"`).
    #[serde(with = "duration::serde")]
    pub probe_timeout: Duration,
    /// See [`Builder::slow_start`] (default none).
    #[serde(with = "duration::serde", skip_serializing_if = "Option::is_none")]
    pub slow_start: Option<Duration>,
    /// See [`Builder::slow_call_threshold`].
    #[serde(with = "duration::serde", skip_serializing_if = "Option::is_none")]
    pub slow_call_threshold: Option<Duration>,
    /// See [`Builder::slow_call_rate`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slow_call_rate: Option<f64>,
    /// See [`Builder::pending_when_open`].
    pub pending_when_open: bool,
    /// See [`Builder::max_breakers`] (default 1 000).
    pub max_breakers: usize,
    /// `true`: each keyed breaker's metrics are labelled with its key
    /// ([`MetricsLabel::key`]); `false` (the default): with the layer's name.
    /// Mind the cardinality rule of [`MetricsLabel`]. A mapped label is set
    /// in code, on the [`builder`](Self::builder).
    pub metrics_label_per_key: bool,
}

/// The `failure_rate` table of a [`BreakerConfig`].
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct FailureRateConfig {
    /// The failure share that opens the breaker, in `(0, 1]`.
    pub rate: f64,
    /// Calls the window must hold before a decision.
    pub minimum_calls: u32,
    /// The window.
    pub window: WindowConfig,
}

/// The `adaptive_throttle` table: `{ "k": 2, "window": { "calls": 100 } }`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct AdaptiveThrottleConfig {
    /// Requests allowed per accept before any is refused (default 2).
    #[serde(default = "default_throttle_k")]
    pub k: f64,
    /// The window requests and accepts are counted over.
    pub window: WindowConfig,
}

/// The `window` table: `{ "calls": 100 }` for the last 100 calls, or
/// `{ "length": "60s" }` (optionally `"buckets": 10`) for the last minute.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct WindowConfig {
    /// A count window of this many calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls: Option<u32>,
    /// A time window this long.
    #[serde(
        default,
        with = "duration::serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub length: Option<Duration>,
    /// Buckets of a time window (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buckets: Option<u32>,
}

fn default_throttle_k() -> f64 {
    2.0
}

/// The builder's defaults, so each is written once.
impl Default for BreakerConfig {
    fn default() -> Self {
        let defaults = Builder::default().settings;
        BreakerConfig {
            name: None,
            mode: defaults.mode,
            failure_threshold: None,
            failure_rate: None,
            adaptive_throttle: None,
            recovery_timeout: None,
            max_recovery_timeout: None,
            recovery_multiplier: defaults.recovery_multiplier,
            recovery_jitter: None,
            probes: defaults.probes,
            probe_timeout: defaults.probe_timeout,
            slow_start: None,
            slow_call_threshold: None,
            slow_call_rate: None,
            pending_when_open: defaults.pending_when_open,
            max_breakers: defaults.max_breakers,
            metrics_label_per_key: false,
        }
    }
}

impl WindowConfig {
    fn window(&self) -> Result<Window, ConfigError> {
        match (self.calls, self.length) {
            (Some(calls), None) if self.buckets.is_none() => Ok(Window::Count(calls)),
            (Some(_), None) => Err(ConfigError::new(
                "buckets",
                "only a time window (`length`) has buckets",
            )),
            (None, Some(length)) => Ok(Window::Time {
                length,
                buckets: self.buckets.unwrap_or(10),
            }),
            _ => Err(ConfigError::new(
                "calls",
                "set exactly one of `calls` (a count window) or `length` (a time window)",
            )),
        }
    }
}

impl BreakerConfig {
    /// A [`Builder`] with these settings, for adding what files cannot hold (a
    /// state-change callback) before [`build`](Builder::build), which checks
    /// every value again.
    pub fn builder(&self) -> Result<Builder, ConfigError> {
        let window = |window: &WindowConfig, table: &str| {
            window
                .window()
                .map_err(|e| e.within("window").within(table))
        };
        let policy = match (
            self.failure_threshold,
            &self.failure_rate,
            &self.adaptive_throttle,
        ) {
            (None, None, None) => None,
            (Some(threshold), None, None) => Some(Policy::consecutive_failures(threshold)),
            (None, Some(rate), None) => {
                let window = window(&rate.window, "failure_rate")?;
                Some(Policy::failure_rate(rate.rate, rate.minimum_calls, window))
            }
            (None, None, Some(throttle)) => {
                let window = window(&throttle.window, "adaptive_throttle")?;
                Some(Policy::adaptive_throttle(throttle.k, window))
            }
            (_, _, throttle) => {
                let field = match throttle {
                    Some(_) => "adaptive_throttle",
                    None => "failure_rate",
                };
                let reason =
                    "set one of `failure_threshold`, `failure_rate` and `adaptive_throttle`";
                return Err(ConfigError::new(field, reason));
            }
        };
        let label = self.metrics_label_per_key.then(MetricsLabel::key);
        Ok(Builder::default()
            .mode(self.mode)
            .recovery_multiplier(self.recovery_multiplier)
            .probes(self.probes)
            .probe_timeout(self.probe_timeout)
            .pending_when_open(self.pending_when_open)
            .max_breakers(self.max_breakers)
            .given(label, Builder::metrics_label)
            .given(self.name.as_deref(), Builder::name)
            .given(policy, Builder::policy)
            .given(self.recovery_timeout, Builder::recovery_timeout)
            .given(self.recovery_jitter, Builder::recovery_jitter)
            .given(self.max_recovery_timeout, Builder::max_recovery_timeout)
            .given(self.slow_start, Builder::slow_start)
            .given(self.slow_call_threshold, Builder::slow_call_threshold)
            .given(self.slow_call_rate, Builder::slow_call_rate))
    }
}

impl Builder {
    /// `self`, then `set` to `value` when the file gives one.
    fn given<T>(self, value: Option<T>, set: fn(Self, T) -> Self) -> Self {
        match value {
            Some(value) => set(self, value),
            None => self,
        }
    }
}
