//! The configuration types: one per section of the `resilience:` block.
//!
//! Values of these types exist only after every rule was checked (by a
//! loader such as [`ResilienceConfig::from_yaml_str`], by `Deserialize`, or
//! as the [`Default`]s), so building a stack from one cannot fail.

use std::time::Duration;

use schemars::JsonSchema;
use serde::Serialize;
use tower_classify::FailureKind;
use tower_poison::Action;

/// The whole `resilience:` block: how calls are retried, when the circuit
/// opens, and what happens to a call that finally failed.
///
/// Every section and every key may be left out, and then takes its
/// default. Unknown keys are refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
#[schemars(title = "resilience")]
#[non_exhaustive]
pub struct ResilienceConfig {
    /// How failed calls are retried.
    pub(crate) retry: RetrySection,
    /// When the circuit opens and how long it stays open.
    pub(crate) circuit_breaker: CircuitBreakerSection,
    /// What happens to a call that failed after every retry.
    pub(crate) poison: PoisonSection,
}

impl ResilienceConfig {
    /// The `retry` section.
    pub fn retry(&self) -> &RetrySection {
        &self.retry
    }

    /// The `circuit_breaker` section.
    pub fn circuit_breaker(&self) -> &CircuitBreakerSection {
        &self.circuit_breaker
    }

    /// The `poison` section.
    pub fn poison(&self) -> &PoisonSection {
        &self.poison
    }
}

/// The `retry` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct RetrySection {
    /// Total tries including the first (1 = no retry), 1 to 17.
    #[schemars(range(min = 1, max = 17))]
    pub(crate) max_attempts: u32,
    /// How the wait between tries grows: `none` (no wait), `fixed` (always
    /// `base_ms`) or `exponential` (`base_ms × 2^n` before retry n + 1).
    pub(crate) backoff: BackoffKind,
    /// The base wait, in milliseconds; not more than `max_ms`.
    pub(crate) base_ms: u64,
    /// The cap on each wait, in milliseconds, applied before jitter.
    pub(crate) max_ms: u64,
    /// `true`: each wait is multiplied by a random factor in [0.5, 1.5).
    pub(crate) jitter: bool,
    /// The failure classes that are retried (at least one). Anything else,
    /// and anything that is not transient (4xx other than 408 and 429),
    /// fails at once.
    #[schemars(length(min = 1))]
    pub(crate) retry_on: Vec<RetryClass>,
}

impl Default for RetrySection {
    fn default() -> Self {
        RetrySection {
            max_attempts: 5,
            backoff: BackoffKind::Exponential,
            base_ms: 200,
            max_ms: 30_000,
            jitter: true,
            retry_on: RetryClass::ALL.to_vec(),
        }
    }
}

impl RetrySection {
    /// Total tries including the first.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// How the wait grows.
    pub fn backoff(&self) -> BackoffKind {
        self.backoff
    }

    /// The base wait.
    pub fn base(&self) -> Duration {
        Duration::from_millis(self.base_ms)
    }

    /// The cap on each wait, before jitter.
    pub fn max(&self) -> Duration {
        Duration::from_millis(self.max_ms)
    }

    /// Whether each wait is jittered by a factor in [0.5, 1.5).
    pub fn jitter(&self) -> bool {
        self.jitter
    }

    /// The classes retried, as written (duplicates removed).
    pub fn retry_on(&self) -> &[RetryClass] {
        &self.retry_on
    }
}

/// How the wait between tries grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BackoffKind {
    /// No wait: retry at once.
    None,
    /// Always `base_ms`.
    Fixed,
    /// `base_ms` before the first retry, doubling on each retry after it,
    /// capped at `max_ms`.
    Exponential,
}

impl BackoffKind {
    /// Every kind, in the order the documentation lists them.
    pub const ALL: [BackoffKind; 3] = [
        BackoffKind::None,
        BackoffKind::Fixed,
        BackoffKind::Exponential,
    ];

    /// The configuration name: `none`, `fixed` or `exponential`.
    pub const fn as_str(self) -> &'static str {
        match self {
            BackoffKind::None => "none",
            BackoffKind::Fixed => "fixed",
            BackoffKind::Exponential => "exponential",
        }
    }
}

/// A class of transient failure that `retry_on` can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RetryClass {
    /// HTTP 5xx server errors.
    #[serde(rename = "http_5xx")]
    Http5xx,
    /// HTTP 429 and other rate-limit signals (`Retry-After` is honoured).
    RateLimited,
    /// Connection-level failures: DNS, refused, reset.
    Connection,
    /// Timeouts (HTTP 408 and timed-out calls).
    Timeout,
}

impl RetryClass {
    /// The four classes, the default of `retry_on`.
    pub const ALL: [RetryClass; 4] = [
        RetryClass::Http5xx,
        RetryClass::RateLimited,
        RetryClass::Connection,
        RetryClass::Timeout,
    ];

    /// The configuration name: `http_5xx`, `rate_limited`, `connection` or
    /// `timeout`.
    pub const fn as_str(self) -> &'static str {
        match self {
            RetryClass::Http5xx => "http_5xx",
            RetryClass::RateLimited => "rate_limited",
            RetryClass::Connection => "connection",
            RetryClass::Timeout => "timeout",
        }
    }

    /// The failure kind the family's classifiers report for this class.
    pub const fn failure_kind(self) -> FailureKind {
        match self {
            RetryClass::Http5xx => FailureKind::ServerError,
            RetryClass::RateLimited => FailureKind::RateLimited,
            RetryClass::Connection => FailureKind::Connection,
            RetryClass::Timeout => FailureKind::Timeout,
        }
    }
}

/// The `circuit_breaker` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct CircuitBreakerSection {
    /// Consecutive failed calls (each after all its retries) that open the
    /// circuit; at least 1.
    #[schemars(range(min = 1))]
    pub(crate) consecutive_failures: u32,
    /// Seconds the circuit stays open before one trial call is let through,
    /// every time it opens; at least 1. Absent (the default): the open
    /// period backs off, 500 ms the first time, doubling after each failed
    /// trial call up to 1 s, jittered, so a dependency that is back is seen
    /// within a second.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "u64", range(min = 1))]
    pub(crate) cooldown_secs: Option<u64>,
}

impl Default for CircuitBreakerSection {
    fn default() -> Self {
        CircuitBreakerSection {
            consecutive_failures: 5,
            cooldown_secs: None,
        }
    }
}

impl CircuitBreakerSection {
    /// Consecutive failed calls that open the circuit.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// How long the circuit stays open before a trial call, when a fixed
    /// period was asked for; `None`: the breaker's backing-off schedule.
    pub fn cooldown(&self) -> Option<Duration> {
        self.cooldown_secs.map(Duration::from_secs)
    }
}

/// The `poison` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct PoisonSection {
    /// Failed deliveries of one message (requests carrying the same
    /// `message_id_header` value) after which it is diverted without
    /// calling the service again; at least 1. Needs `message_id_header`
    /// to have an effect.
    #[schemars(range(min = 1))]
    pub(crate) max_row_attempts: u32,
    /// What happens to a call that finally failed: `dlq` (store it; the
    /// store is passed when the stack is built), `drop` (count it, log it
    /// once) or `fail` (return the failure only).
    pub(crate) action: PoisonAction,
    /// The request header that carries a message id (for example
    /// `x-message-id`). Absent: calls have no identity across deliveries
    /// and `max_row_attempts` does not apply.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub(crate) message_id_header: Option<String>,
}

impl Default for PoisonSection {
    fn default() -> Self {
        PoisonSection {
            max_row_attempts: 3,
            action: PoisonAction::Dlq,
            message_id_header: None,
        }
    }
}

impl PoisonSection {
    /// Failed deliveries of one message before it is diverted.
    pub fn max_row_attempts(&self) -> u32 {
        self.max_row_attempts
    }

    /// What happens to a call that finally failed.
    pub fn action(&self) -> PoisonAction {
        self.action
    }

    /// The header carrying a message id, if any.
    pub fn message_id_header(&self) -> Option<&str> {
        self.message_id_header.as_deref()
    }
}

/// What happens to a call that finally failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PoisonAction {
    /// Store it in the dead-letter store (the default).
    Dlq,
    /// Discard it: counted, logged once per key.
    Drop,
    /// Store nothing: the failure goes back to the caller only.
    Fail,
}

impl PoisonAction {
    /// Every action, in the order the documentation lists them.
    pub const ALL: [PoisonAction; 3] = [PoisonAction::Dlq, PoisonAction::Drop, PoisonAction::Fail];

    /// The configuration name: `dlq`, `drop` or `fail`.
    pub const fn as_str(self) -> &'static str {
        match self {
            PoisonAction::Dlq => "dlq",
            PoisonAction::Drop => "drop",
            PoisonAction::Fail => "fail",
        }
    }

    /// The dead-letter layer's action.
    pub const fn to_action(self) -> Action {
        match self {
            PoisonAction::Dlq => Action::Dlq,
            PoisonAction::Drop => Action::Drop,
            PoisonAction::Fail => Action::Fail,
        }
    }
}
