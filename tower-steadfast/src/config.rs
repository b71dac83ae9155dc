//! The configuration types, one per section of the `resilience:` block
//! ([table](crate#the-block)). A value exists only after every rule was
//! checked (by a loader, `Deserialize`, or as the [`Default`]), so building
//! a stack from one cannot fail.

use std::fmt;
use std::time::Duration;

#[cfg(feature = "json-schema")]
use schemars::JsonSchema;
use serde::{Serialize, Serializer};
use tower_classify::RetryOn;
use tower_poison::Action;
use tower_retry_budget::{Backoff, BackoffKind, Jitter};

/// The whole `resilience:` block: how calls are retried, when the circuit
/// opens, and what happens to a call that finally failed.
///
/// Every section and every key may be left out, and then takes its layer's
/// default. Unknown keys are refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "json-schema", derive(JsonSchema))]
#[serde(deny_unknown_fields, default)]
#[cfg_attr(feature = "json-schema", schemars(title = "resilience"))]
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
    /// The keys the block set that have no effect given the others, one
    /// sentence each, starting with the key's path in the block
    /// (`poison.max_row_attempts has no effect without …`). Loading a
    /// block logs each as a `tracing` warning; empty for a block whose
    /// every key does something.
    ///
    /// ```
    /// # #[cfg(feature = "yaml")] {
    /// use tower_steadfast::ResilienceConfig;
    ///
    /// let config = ResilienceConfig::from_yaml_str("poison: {max_row_attempts: 5}").unwrap();
    /// assert!(config.warnings()[0].starts_with("poison.max_row_attempts has no effect"));
    /// # }
    /// ```
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        let retry = &self.retry;
        let poison = &self.poison;
        if poison.max_row_attempts.is_some() && poison.message_id_header.is_none() {
            warnings.push(
                "poison.max_row_attempts has no effect without poison.message_id_header: \
                 calls have no identity across deliveries, so each call that finally \
                 failed goes to the action once"
                    .to_owned(),
            );
        }
        // Every key that shapes the retries, and whether the block set it.
        let shaping = [
            ("backoff", retry.backoff.is_some()),
            ("base_ms", retry.base_ms.is_some()),
            ("max_ms", retry.max_ms.is_some()),
            ("jitter", retry.jitter.is_some()),
            ("retry_on", retry.retry_on.is_some()),
        ];
        let (unused, because) = if retry.max_attempts == Some(1) {
            (&shaping[..], "retry.max_attempts: 1, which makes no retry")
        } else if retry.backoff == Some(BackoffKind::None) {
            (&shaping[1..4], "retry.backoff: none, which retries at once")
        } else {
            (&[][..], "")
        };
        for (key, _) in unused.iter().filter(|(_, set)| *set) {
            warnings.push(format!("retry.{key} has no effect with {because}"));
        }
        if retry.deadline_ms.is_some() || retry.attempt_timeout_ms.is_some() {
            let (deadline, timeout) = retry.bounds();
            if timeout >= deadline {
                warnings.push(format!(
                    "retry.attempt_timeout_ms ({}{}) has no effect: retry.deadline_ms ({}{}) \
                     ends every attempt first",
                    timeout.as_millis(),
                    its_default(retry.attempt_timeout_ms),
                    deadline.as_millis(),
                    its_default(retry.deadline_ms),
                ));
            }
        }
        warnings
    }
}

/// `, its default` after a value the block left out, so a message says
/// where the value came from.
pub(crate) fn its_default(set: Option<u64>) -> &'static str {
    set.map_or(", its default", |_| "")
}

/// The `retry` section. A key left out keeps the retry layer's default
/// (see [`RetryBuilder`](tower_retry_budget::RetryBuilder)).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "json-schema", derive(JsonSchema))]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub(crate) struct RetrySection {
    /// Total tries including the first (1 = no retry), 1 to 17.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "json-schema",
        schemars(with = "u32", range(min = 1, max = 17))
    )]
    pub(crate) max_attempts: Option<u32>,
    /// How the wait between tries grows: `none` (no wait), `fixed` (always
    /// `base_ms`), `linear` (`base_ms × n` before retry n) or `exponential`
    /// (`base_ms × 2^(n−1)` before retry n).
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "by_name")]
    #[cfg_attr(feature = "json-schema", schemars(with = "BackoffName"))]
    pub(crate) backoff: Option<BackoffKind>,
    /// The base wait, in milliseconds; not more than `max_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "json-schema", schemars(with = "u64"))]
    pub(crate) base_ms: Option<u64>,
    /// The cap on each wait, in milliseconds, applied before jitter.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "json-schema", schemars(with = "u64"))]
    pub(crate) max_ms: Option<u64>,
    /// Randomness in each wait, so that clients that failed together do not
    /// retry together: `full` (uniform in [0, wait]), `equal` (in
    /// [wait/2, wait]), `decorrelated`, `none`, or factors such as
    /// `0.5..1.5`; `true` is `0.5..1.5` and `false` is `none`.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "by_name")]
    #[cfg_attr(feature = "json-schema", schemars(with = "JitterSetting"))]
    pub(crate) jitter: Option<Jitter>,
    /// The failure classes that are retried (at least one): `http_5xx`,
    /// `rate_limited`, `connection`, `timeout`, `not_sent`. Anything else,
    /// and anything that is not transient (4xx other than 408 and 429),
    /// fails at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "json-schema",
        schemars(with = "Vec<RetryClassName>", length(min = 1))
    )]
    pub(crate) retry_on: Option<RetryOn>,
    /// The call's deadline, in milliseconds, at least 1 (default 10 000):
    /// every attempt and every wait together, from the first attempt. A
    /// wait that would cross it (a `Retry-After` included) is not started:
    /// the call answers at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "json-schema",
        schemars(with = "u64", range(min = 1), extend("default" = DEFAULT_DEADLINE_MS))
    )]
    pub(crate) deadline_ms: Option<u64>,
    /// Each attempt's timeout, in milliseconds, at least 1 (default
    /// 3 000); an attempt that takes longer fails as a `timeout` and may
    /// be retried.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "json-schema",
        schemars(with = "u64", range(min = 1), extend("default" = DEFAULT_ATTEMPT_TIMEOUT_MS))
    )]
    pub(crate) attempt_timeout_ms: Option<u64>,
}

/// The call's deadline when the block does not say: the retry layer has
/// none (a queue consumer may wait), but a request handler must answer
/// before the proxies in front of it give up (30–60 s).
pub(crate) const DEFAULT_DEADLINE: Duration = Duration::from_millis(DEFAULT_DEADLINE_MS);
const DEFAULT_DEADLINE_MS: u64 = 10_000;

/// Each attempt's timeout when the block does not say: about a third of the
/// deadline, so one hung connection leaves time for a retry.
pub(crate) const DEFAULT_ATTEMPT_TIMEOUT: Duration =
    Duration::from_millis(DEFAULT_ATTEMPT_TIMEOUT_MS);
const DEFAULT_ATTEMPT_TIMEOUT_MS: u64 = 3_000;

impl RetrySection {
    /// The base wait and the cap on each wait, the backoff's defaults where
    /// the block left them out.
    pub(crate) fn base_and_max(&self) -> (Duration, Duration) {
        let defaults = Backoff::default();
        let base = millis_or(self.base_ms, defaults.initial_delay());
        (base, millis_or(self.max_ms, defaults.max_delay()))
    }

    /// The call's deadline and each attempt's timeout, the block's defaults
    /// where it left them out.
    pub(crate) fn bounds(&self) -> (Duration, Duration) {
        let deadline = millis_or(self.deadline_ms, DEFAULT_DEADLINE);
        (
            deadline,
            millis_or(self.attempt_timeout_ms, DEFAULT_ATTEMPT_TIMEOUT),
        )
    }
}

fn millis_or(millis: Option<u64>, default: Duration) -> Duration {
    millis.map_or(default, Duration::from_millis)
}

/// The `circuit_breaker` section. A key left out keeps the breaker's
/// default (see [`Builder`](tower_breaker::Builder)).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "json-schema", derive(JsonSchema))]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub(crate) struct CircuitBreakerSection {
    /// Consecutive failed calls (each after all its retries) that open the
    /// circuit; at least 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "json-schema", schemars(with = "u32", range(min = 1)))]
    pub(crate) consecutive_failures: Option<u32>,
    /// Seconds the circuit stays open before one trial call is let through,
    /// every time it opens; at least 1. Absent: the breaker's open period,
    /// which starts short and backs off after each failed trial call,
    /// jittered, so a dependency that is back is seen soon.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "json-schema", schemars(with = "u64", range(min = 1)))]
    pub(crate) cooldown_secs: Option<u64>,
}

/// Failed deliveries of one message before it is diverted, when the block
/// does not say (`poison.max_row_attempts`).
pub(crate) const DEFAULT_ROW_ATTEMPTS: u32 = 3;

/// The `poison` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "json-schema", derive(JsonSchema))]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub(crate) struct PoisonSection {
    /// Failed deliveries of one message (requests carrying the same
    /// `message_id_header` value) after which it is diverted without
    /// calling the service again; at least 1 (default 3). Needs
    /// `message_id_header` to have an effect.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "json-schema",
        schemars(with = "u32", range(min = 1), extend("default" = DEFAULT_ROW_ATTEMPTS))
    )]
    pub(crate) max_row_attempts: Option<u32>,
    /// What happens to a call that finally failed: `dlq` (store it; the
    /// store is passed when the stack is built), `drop` (count it, log it
    /// once) or `fail` (return the failure only).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "json-schema", schemars(with = "ActionName"))]
    pub(crate) action: Option<Action>,
    /// The request header that carries a message id (for example
    /// `x-message-id`). Absent: calls have no identity across deliveries
    /// and `max_row_attempts` does not apply.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "json-schema", schemars(with = "String"))]
    pub(crate) message_id_header: Option<String>,
    /// Store refusals that never reached the dependency, such as an open
    /// circuit's (default `false`: they are returned to the caller
    /// unstored, so an outage does not fill the store).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) store_refusals: bool,
}

impl PoisonSection {
    /// Failed deliveries of one message before it is diverted (3 when the
    /// block does not say).
    pub(crate) fn max_row_attempts(&self) -> u32 {
        self.max_row_attempts.unwrap_or(DEFAULT_ROW_ATTEMPTS)
    }
}

/// Writes a value by its configuration name (its `Display`).
fn by_name<T: fmt::Display, S: Serializer>(
    value: &Option<T>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(value) => serializer.collect_str(value),
        None => serializer.serialize_none(),
    }
}

// The schema's names for the layers' types, which carry no schema of their
// own. A test (`tests/schema.rs`) reads every name back through the layer's
// parser, so these cannot drift from it.

/// A backoff's name.
#[cfg(feature = "json-schema")]
#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)] // Only its schema is used.
enum BackoffName {
    /// No wait: retry at once.
    None,
    /// Always `base_ms`.
    Fixed,
    /// `base_ms × n` before retry n.
    Linear,
    /// `base_ms × 2^(n−1)` before retry n, capped at `max_ms`.
    Exponential,
}

/// A jitter: `true` (`0.5..1.5`), `false` (`none`), or a name.
#[cfg(feature = "json-schema")]
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)] // Only its schema is used.
enum JitterSetting {
    /// `true`: each wait times a random factor in [0.5, 1.5); `false`: none.
    Switch(bool),
    /// `full`, `equal`, `decorrelated`, `none`, or factors `LOW..HIGH`.
    Name(
        #[schemars(regex(pattern = r"^(none|full|equal|decorrelated|[0-9.]+\.\.[0-9.]+)$"))] String,
    ),
}

/// A class of transient failure.
#[cfg(feature = "json-schema")]
#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)] // Only its schema is used.
enum RetryClassName {
    /// HTTP 5xx server errors.
    #[serde(rename = "http_5xx")]
    Http5xx,
    /// HTTP 429 and other rate-limit signals (`Retry-After` is honoured).
    RateLimited,
    /// Connection-level failures: DNS, refused, reset (`not_sent` included).
    Connection,
    /// Timeouts (HTTP 408 and timed-out calls).
    Timeout,
    /// Failures where the request provably never reached the server.
    NotSent,
}

/// What happens to a call that finally failed.
#[cfg(feature = "json-schema")]
#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)] // Only its schema is used.
enum ActionName {
    /// Store it in the dead-letter store.
    Dlq,
    /// Discard it: counted, logged once per key.
    Drop,
    /// Store nothing: the failure goes back to the caller only.
    Fail,
}
