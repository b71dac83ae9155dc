//! Retry settings read from a configuration file (feature `serde`).
//!
//! Unknown keys are refused, not ignored, and every invalid value gives a
//! [`ConfigError`] that names the field (`max_retries`, `backoff.multiplier`,
//! `budget.retry_percent`). Durations are written in human form (`"200ms"`,
//! `"1m30s"`).
//!
//! ```
//! use tower_retry_budget::config::RetryConfig;
//!
//! let config: RetryConfig = serde_json::from_str(r#"{
//!     "max_retries": 5,
//!     "backoff": { "kind": "exponential", "initial_delay": "1s", "multiplier": 1.25, "max_delay": "60s", "jitter": "none" },
//!     "attempt_timeout": "2s",
//!     "deadline_from_attempt_timeout": true,
//!     "retryable_statuses": [429, 502, 503, 504],
//!     "budget": { "kind": "tps", "retry_percent": 0.2 }
//! }"#).unwrap();
//! // The whole call's deadline follows from the attempt timeout: 2 s for
//! // each of the 6 attempts, 12 s.
//! let layer = config.http_builder().unwrap().build().unwrap();
//!
//! let err = serde_json::from_str::<RetryConfig>(r#"{ "max_retries": 17 }"#)
//!     .unwrap()
//!     .http_builder()
//!     .unwrap_err();
//! assert_eq!(err.field(), "max_retries");
//! ```

use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use serde::{Deserialize, Serialize};
use tower_classify::config::HttpClassifierConfig;
use tower_classify::duration;
use tower_classify::{ConfigError, HttpClassifier, RetryOn};

use crate::backoff::{Backoff, BackoffKind, Jitter};
use crate::budget::{TokenBucketBudget, TpsBudget};
use crate::layer::{ensure, RetryBuilder, MAX_RETRIES_LIMIT};
use crate::replay::HttpReplay;

/// The retry settings of one layer. Every field is optional; what is left
/// out keeps the [builder's default](crate::RetryBuilder).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RetryConfig {
    /// Retries after the first attempt (0–16).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<u32>,
    /// Total attempts including the first (1–17). Set this or `max_retries`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// The backoff between attempts.
    pub backoff: BackoffConfig,
    /// One deadline for the whole loop, attempts and sleeps together.
    #[serde(with = "duration::serde", skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Duration>,
    /// A timeout for each attempt.
    #[serde(with = "duration::serde", skip_serializing_if = "Option::is_none")]
    pub attempt_timeout: Option<Duration>,
    /// The deadline is `attempt_timeout × (max_retries + 1)`.
    /// Needs `attempt_timeout` and excludes `deadline`.
    pub deadline_from_attempt_timeout: bool,
    /// The longest server-requested wait honoured (default 1 h).
    #[serde(with = "duration::serde", skip_serializing_if = "Option::is_none")]
    pub max_wait: Option<Duration>,
    /// The classes retried: `http_5xx`, `rate_limited`, `connection`,
    /// `timeout` (default all four; an empty list is refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_on: Option<Vec<String>>,
    /// HTTP only: the only statuses that are transient (e.g. `[429, 502, 503, 504]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retryable_statuses: Option<Vec<u16>>,
    /// HTTP only: retry POST and PATCH too.
    pub retry_non_idempotent: bool,
    /// HTTP only: mark retries with this header (e.g. `grpc-previous-rpc-attempts`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt_header: Option<String>,
    /// The retry budget (default: a TPS budget of 10 s, 10/s, 20 %).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetConfig>,
}

/// The `backoff` section.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct BackoffConfig {
    /// `none`, `fixed`, `linear` or `exponential` (default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The first delay (default 1 s).
    #[serde(with = "duration::serde", skip_serializing_if = "Option::is_none")]
    pub initial_delay: Option<Duration>,
    /// The exponential growth factor (default 2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub multiplier: Option<f64>,
    /// The cap, applied before jitter (default 60 s).
    #[serde(with = "duration::serde", skip_serializing_if = "Option::is_none")]
    pub max_delay: Option<Duration>,
    /// `none`, `full` (default), `equal`, `decorrelated`, or factors such as
    /// `0.5..1.5` (±50 %) and `0.5..1` (50–100 %).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jitter: Option<String>,
}

/// The `budget` section, tagged by `kind`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum BudgetConfig {
    /// [`TpsBudget`]: `ttl` (10 s), `min_per_sec` (10), `retry_percent` (0.2).
    Tps {
        /// The window.
        #[serde(default = "default_ttl", with = "duration::serde")]
        ttl: Duration,
        /// The floor, in retries per second.
        #[serde(default = "default_min_per_sec")]
        min_per_sec: u32,
        /// The fraction of requests that may be retried (0.2 is 20 %).
        #[serde(default = "default_retry_percent")]
        retry_percent: f64,
    },
    /// [`TokenBucketBudget`]: `max_tokens`, `token_ratio`.
    TokenBucket {
        /// The bucket size.
        max_tokens: u32,
        /// Tokens added per request.
        token_ratio: f64,
    },
    /// No budget: only the retry count limits retries.
    None,
}

fn default_ttl() -> Duration {
    Duration::from_secs(10)
}
fn default_min_per_sec() -> u32 {
    10
}
fn default_retry_percent() -> f64 {
    0.2
}

impl BackoffConfig {
    /// The backoff these settings describe; errors name `backoff.<field>`.
    pub fn to_backoff(&self) -> Result<Backoff, ConfigError> {
        let within = |e: ConfigError| e.within("backoff");
        let kind = match &self.kind {
            Some(kind) => kind.parse::<BackoffKind>().map_err(within)?,
            None => BackoffKind::Exponential,
        };
        let defaults = Backoff::default();
        let mut backoff =
            Backoff::new(kind, self.initial_delay.unwrap_or(defaults.initial_delay()))
                .with_multiplier(self.multiplier.unwrap_or(defaults.multiplier()))
                .with_max_delay(self.max_delay.unwrap_or(defaults.max_delay()));
        backoff = match &self.jitter {
            Some(jitter) => backoff.with_jitter(jitter.parse::<Jitter>().map_err(within)?),
            None if kind == BackoffKind::None => backoff.with_jitter(Jitter::None),
            None => backoff,
        };
        backoff.validate().map_err(within)?;
        Ok(backoff)
    }
}

impl RetryConfig {
    /// Applies the settings to an HTTP builder ([`RetryLayer::http_builder`](crate::RetryLayer::http_builder)'s),
    /// checking every field.
    pub fn http_builder(&self) -> Result<RetryBuilder<HttpClassifier, HttpReplay>, ConfigError> {
        // The classifier's own configuration checks the codes.
        let mut classifier = HttpClassifierConfig::default();
        classifier.retryable_statuses = self.retryable_statuses.clone();
        let classifier = classifier.build()?;
        let mut replay = HttpReplay::new().retry_non_idempotent(self.retry_non_idempotent);
        if let Some(name) = &self.attempt_header {
            let name = HeaderName::try_from(name.as_str()).map_err(|_| {
                ConfigError::new("attempt_header", format!("`{name}` is not a header name"))
            })?;
            replay = replay.attempt_header(name);
        }
        self.apply_common(RetryBuilder::new(classifier, replay))
    }

    /// Applies the settings that are not HTTP-specific to `builder`. Fails,
    /// naming the field, if an HTTP-only field is set: a setting is never
    /// silently ignored.
    pub fn apply<C, R>(
        &self,
        builder: RetryBuilder<C, R>,
    ) -> Result<RetryBuilder<C, R>, ConfigError> {
        let http_only = [
            ("retryable_statuses", self.retryable_statuses.is_some()),
            ("retry_non_idempotent", self.retry_non_idempotent),
            ("attempt_header", self.attempt_header.is_some()),
        ];
        if let Some((field, _)) = http_only.iter().find(|(_, set)| *set) {
            return Err(ConfigError::new(
                *field,
                "applies to HTTP layers only; use `RetryConfig::http_builder`",
            ));
        }
        self.apply_common(builder)
    }

    fn apply_common<C, R>(
        &self,
        mut builder: RetryBuilder<C, R>,
    ) -> Result<RetryBuilder<C, R>, ConfigError> {
        if let Some(retries) = self.max_retries {
            ensure(self.max_attempts.is_none(), "max_attempts", || {
                "set either `max_retries` or `max_attempts`, not both".into()
            })?;
            builder = builder.max_retries(retries);
        }
        if let Some(n) = self.max_attempts {
            let most = MAX_RETRIES_LIMIT + 1;
            ensure((1..=most).contains(&n), "max_attempts", || {
                format!("{n} must be between 1 (no retry) and {most}")
            })?;
            builder = builder.max_retries(n - 1);
        }
        builder = builder.backoff(self.backoff.to_backoff()?);
        if self.deadline_from_attempt_timeout {
            ensure(self.deadline.is_none(), "deadline", || {
                "set `deadline` or `deadline_from_attempt_timeout`, not both".into()
            })?;
            let timeout = self.attempt_timeout.ok_or_else(|| {
                ConfigError::new("deadline_from_attempt_timeout", "needs `attempt_timeout`")
            })?;
            builder = builder.deadline_from_timeout(timeout);
        } else {
            if let Some(timeout) = self.attempt_timeout {
                builder = builder.attempt_timeout(timeout);
            }
            if let Some(deadline) = self.deadline {
                builder = builder.deadline(deadline);
            }
        }
        if let Some(max_wait) = self.max_wait {
            builder = builder.max_wait(max_wait);
        }
        if let Some(names) = &self.retry_on {
            builder = builder.retry_on(RetryOn::from_names(names)?);
        }
        let within = |e: ConfigError| e.within("budget");
        builder = match &self.budget {
            None => builder,
            Some(BudgetConfig::None) => builder.no_budget(),
            Some(BudgetConfig::Tps {
                ttl,
                min_per_sec,
                retry_percent,
            }) => builder.budget(Arc::new(
                TpsBudget::new(*ttl, *min_per_sec, *retry_percent).map_err(within)?,
            )),
            Some(BudgetConfig::TokenBucket {
                max_tokens,
                token_ratio,
            }) => builder.budget(Arc::new(
                TokenBucketBudget::new(*max_tokens, *token_ratio).map_err(within)?,
            )),
        };
        // The builder checks the rest (zero durations) with the same field names.
        builder.check()?;
        Ok(builder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<RetryConfig, serde_json::Error> {
        serde_json::from_str(json)
    }

    fn field_of(json: &str) -> String {
        parse(json)
            .unwrap()
            .http_builder()
            .map(drop)
            .unwrap_err()
            .field()
            .to_owned()
    }

    #[test]
    fn max_retries_17_is_refused_naming_the_field() {
        assert_eq!(field_of(r#"{"max_retries": 17}"#), "max_retries");
        assert!(parse(r#"{"max_retries": 16}"#)
            .unwrap()
            .http_builder()
            .is_ok());
        // 17 attempts are the same 16 retries.
        let attempts = parse(r#"{"max_attempts": 17}"#).unwrap();
        let layer = attempts.http_builder().unwrap().build().unwrap();
        assert_eq!(layer.shared().max_retries, 16);
    }

    #[test]
    fn unknown_keys_are_refused_naming_the_key() {
        for json in [
            r#"{"retries": 3}"#,
            r#"{"backoff": {"base_ms": 200}}"#,
            r#"{"budget": {"kind": "tps", "percent": 0.2}}"#,
        ] {
            let err = parse(json).unwrap_err().to_string();
            assert!(err.contains("unknown field"), "{json}: {err}");
        }
        let err = parse(r#"{"retries": 3}"#).unwrap_err().to_string();
        assert!(err.contains("`retries`"), "{err}");
    }

    #[test]
    fn every_invalid_value_names_its_field() {
        for (json, field) in [
            (r#"{"max_attempts": 0}"#, "max_attempts"),
            (r#"{"max_attempts": 18}"#, "max_attempts"),
            (r#"{"max_retries": 2, "max_attempts": 3}"#, "max_attempts"),
            (r#"{"backoff": {"multiplier": 0.5}}"#, "backoff.multiplier"),
            (r#"{"backoff": {"kind": "quadratic"}}"#, "backoff.kind"),
            (r#"{"backoff": {"jitter": "lots"}}"#, "backoff.jitter"),
            (r#"{"retry_on": []}"#, "retry_on"),
            (r#"{"retry_on": ["teapot"]}"#, "retry_on"),
            (r#"{"retryable_statuses": [1000]}"#, "retryable_statuses"),
            (r#"{"retryable_statuses": []}"#, "retryable_statuses"),
            (r#"{"attempt_header": "bad header"}"#, "attempt_header"),
            (
                r#"{"budget": {"kind": "tps", "ttl": "500ms"}}"#,
                "budget.ttl",
            ),
            (
                r#"{"budget": {"kind": "tps", "retry_percent": -1}}"#,
                "budget.retry_percent",
            ),
            (
                r#"{"budget": {"kind": "token_bucket", "max_tokens": 0, "token_ratio": 0.1}}"#,
                "budget.max_tokens",
            ),
            (r#"{"deadline": "0s"}"#, "deadline"),
            (r#"{"attempt_timeout": "0s"}"#, "attempt_timeout"),
            (
                r#"{"deadline_from_attempt_timeout": true}"#,
                "deadline_from_attempt_timeout",
            ),
        ] {
            assert_eq!(field_of(json), field, "{json}");
        }
    }

    #[test]
    fn durations_are_human_and_seed_rules_resolve() {
        let config = parse(
            r#"{"max_attempts": 5, "attempt_timeout": "1500ms", "deadline_from_attempt_timeout": true,
                "backoff": {"kind": "linear", "initial_delay": "200ms", "max_delay": "30s", "jitter": "0.5..1.5"},
                "max_wait": "10m"}"#,
        )
        .unwrap();
        let layer = config.http_builder().unwrap().build().unwrap();
        let policy = layer.shared();
        assert_eq!(policy.max_retries, 4);
        assert_eq!(policy.deadline, Some(Duration::from_millis(7500)));
        assert_eq!(
            policy.backoff.jitter(),
            Jitter::Proportional {
                low: 0.5,
                high: 1.5
            }
        );
        assert_eq!(policy.backoff.kind(), BackoffKind::Linear);
        let err = parse(r#"{"deadline": "soon"}"#).unwrap_err().to_string();
        assert!(err.contains("soon"), "{err}");
    }

    #[test]
    fn http_only_fields_are_not_silently_ignored_elsewhere() {
        let config = parse(r#"{"retryable_statuses": [503]}"#).unwrap();
        let err = config
            .apply(crate::RetryLayer::builder())
            .map(drop)
            .unwrap_err();
        assert_eq!(err.field(), "retryable_statuses");
    }

    #[test]
    fn round_trips_through_serde() {
        let config = parse(
            r#"{"max_retries": 2, "deadline": "3s", "backoff": {"kind": "fixed", "initial_delay": "250ms"},
                "budget": {"kind": "token_bucket", "max_tokens": 10, "token_ratio": 0.1}}"#,
        )
        .unwrap();
        let text = serde_json::to_string(&config).unwrap();
        assert_eq!(parse(&text).unwrap(), config);
    }
}
