//! gRPC service config retry settings ([gRFC A6]), feature
//! `grpc-service-config`.
//!
//! A gRPC service owner publishes a *service config*: JSON with a
//! `methodConfig` list (which methods get which `retryPolicy`,
//! `hedgingPolicy` and `timeout`) and a `retryThrottling` section for the
//! whole server. This module reads it with A6's validation rules, picks the
//! method config of a request path, and turns a retry policy into this
//! crate's [`RetryBuilder`](crate::RetryBuilder).
//!
//! # Validation
//!
//! [`ServiceConfig::from_json`] refuses a config that breaks a rule of A6 or
//! of gRPC's `service_config.proto`, with a [`ConfigError`] whose
//! [`field`](ConfigError::field) is the JSON path of the value
//! (`methodConfig[0].retryPolicy.maxAttempts`) and whose
//! [`reason`](ConfigError::reason) says which rule. Fields this module does
//! not use (`loadBalancingConfig`, `maxRequestMessageBytes`, ...) are
//! ignored, as gRPC ignores fields it does not know.
//!
//! | field | rule |
//! |---|---|
//! | `retryPolicy.maxAttempts`, `hedgingPolicy.maxAttempts` | required integer ≥ 2; above 5 (A6's client-side limit) is read as 5, not refused |
//! | `retryPolicy.initialBackoff`, `.maxBackoff` | required duration > 0 |
//! | `retryPolicy.backoffMultiplier` | required number > 0 |
//! | `retryPolicy.retryableStatusCodes` | required, non-empty; each a code 1–16 or its name in any case (`OK` is refused: a success is never retried) |
//! | `hedgingPolicy.hedgingDelay` | optional duration ≥ 0 (default 0) |
//! | `hedgingPolicy.nonFatalStatusCodes` | optional, may be empty; codes as above |
//! | a method config | at most one of `retryPolicy` and `hedgingPolicy` |
//! | `timeout` | optional duration > 0 |
//! | `name[].service`, `name[].method` | strings; `""`, `null` and absent are the same; a name without a service is the default and has no method; every name appears once in the whole config |
//! | `retryThrottling.maxTokens` | required integer in (0, 1000] |
//! | `retryThrottling.tokenRatio` | required number > 0; decimals past the third are cut (0.5466 is 0.546), and a ratio that is 0 once cut is refused |
//!
//! Durations are negative-free [protobuf JSON durations] (`"0.1s"`,
//! `"1.000340012s"`: seconds with at most nine fractional digits, then
//! `s`; not the family's human syntax, `"1m30s"`, since a service config
//! is read exactly as gRPC reads it); status codes are numbers or
//! case-insensitive names (`14`, `"UNAVAILABLE"`, `"unavailable"`).
//!
//! [protobuf JSON durations]: https://protobuf.dev/programming-guides/proto3/#json
//!
//! # Using a config
//!
//! [`ServiceConfig::method_config`] picks a request path's method config as
//! gRPC does. [`MethodConfig::retry_builder`] and
//! [`MethodConfig::hedge_builder`] build its layers with A6's semantics (see
//! [`retry`] and [`hedge`] for each rule); throttling (`retryThrottling`) is
//! a [`TokenBucketBudget`], one per server, shared by the layers of all its
//! methods. [`ServiceConfig::layer`] applies the whole config in one layer
//! ([`ServiceConfigLayer`]): in a tonic client, put it where the retry layer
//! goes, between a [`ReplayBodyLayer`](crate::body::ReplayBodyLayer) and the
//! conversion back to tonic's body (see [the body module](crate::body#tonic)).
//!
//! [gRFC A6]: https://github.com/grpc/proposal/blob/master/A6-client-retries.md

use std::collections::HashMap;
use std::time::Duration;

use crate::budget::TokenBucketBudget;
use tower_classify::ConfigError;

mod classifier;
mod duration;
pub mod hedge;
mod parse;
pub mod retry;
mod router;
mod status;
#[cfg(test)]
mod tests;

pub use self::classifier::GrpcRetryClassifier;
pub use self::router::{PerMethod, PerMethodFuture, ServiceConfigLayer};
pub use self::status::StatusCodes;

/// The most attempts a policy gets: A6's client-side limit. A larger
/// `maxAttempts` is read as this value.
pub(crate) const MAX_ATTEMPTS_LIMIT: u32 = 5;

/// A parsed and validated gRPC service config: its method configs and its
/// retry throttling.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceConfig {
    method_configs: Vec<MethodConfig>,
    retry_throttling: Option<RetryThrottlingConfig>,
    index: NameIndex,
}

/// Where each name points: `service → (whole-service entry, method → entry)`
/// and the default entry, each as the method config's index and the name's
/// position in it (to name both places of a duplicate; a method's is `Some`
/// once filled).
#[derive(Debug, Clone, Default, PartialEq)]
struct NameIndex {
    services: HashMap<String, ServiceEntries>,
    default: Option<(usize, usize)>,
}

#[derive(Debug, Clone, Default, PartialEq)]
struct ServiceEntries {
    whole_service: Option<(usize, usize)>,
    methods: HashMap<String, Option<(usize, usize)>>,
}

impl ServiceConfig {
    /// Reads and validates a service config; the error names the field
    /// path and the rule it breaks (see the [module docs](self)).
    pub fn from_json(json: &str) -> Result<Self, ConfigError> {
        let value: serde_json::Value = serde_json::from_str(json)
            .map_err(|err| ConfigError::new("serviceConfig", format!("not valid JSON: {err}")))?;
        parse::service_config(&value)
    }

    fn new(
        method_configs: Vec<MethodConfig>,
        retry_throttling: Option<RetryThrottlingConfig>,
    ) -> Result<Self, ConfigError> {
        let mut index = NameIndex::default();
        for (entry, config) in method_configs.iter().enumerate() {
            for (position, name) in config.names.iter().enumerate() {
                let slot = match (&name.service[..], &name.method) {
                    ("", _) => &mut index.default,
                    (service, method) => {
                        let service = index.services.entry(service.to_owned()).or_default();
                        match method {
                            None => &mut service.whole_service,
                            Some(method) => service.methods.entry(method.clone()).or_default(),
                        }
                    }
                };
                if let Some((first_entry, first_position)) = slot.replace((entry, position)) {
                    return Err(ConfigError::new(
                        format!("methodConfig[{entry}].name[{position}]"),
                        format!(
                            "{name} is also methodConfig[{first_entry}].name[{first_position}]; \
                             each name may appear once in a service config"
                        ),
                    ));
                }
            }
        }
        Ok(ServiceConfig {
            method_configs,
            retry_throttling,
            index,
        })
    }

    /// The method configs, in the order of the JSON.
    #[cfg(test)]
    pub(crate) fn method_configs(&self) -> &[MethodConfig] {
        &self.method_configs
    }

    /// The `retryThrottling` section, if any.
    #[cfg(test)]
    pub(crate) fn retry_throttling(&self) -> Option<&RetryThrottlingConfig> {
        self.retry_throttling.as_ref()
    }

    /// A new, full [`TokenBucketBudget`] for this config's `retryThrottling`
    /// (`None` without one). A6 throttles per server: make one per server
    /// and give the same `Arc` to the layers of all its methods, through
    /// [`layer`](Self::layer) only: the service config's classifier counts
    /// it, so as a retry or hedge layer's own `budget` it would be counted
    /// twice.
    pub fn retry_throttle(&self) -> Option<std::sync::Arc<TokenBucketBudget>> {
        self.retry_throttling.as_ref().map(|config| {
            std::sync::Arc::new(TokenBucketBudget::with_thousandths(
                config.max_tokens,
                u64::from(config.token_ratio_thousandths),
            ))
        })
    }

    /// The method config for a request path `/package.Service/Method`:
    /// the exact `{service, method}` name, else the whole `{service}`,
    /// else the default; `None` when none applies.
    ///
    /// A path without a leading `/` or without a `/` between service and
    /// method, or with more than two, names no service: it gets the default.
    /// Nothing is allocated and nothing panics, whatever the path.
    ///
    /// ```
    /// use tower_retry_budget::service_config::ServiceConfig;
    ///
    /// let config = ServiceConfig::from_json(r#"{ "methodConfig": [
    ///     { "name": [{}], "timeout": "30s" },
    ///     { "name": [{ "service": "pkg.Svc" }], "timeout": "5s" },
    ///     { "name": [{ "service": "pkg.Svc", "method": "Get" }], "timeout": "1s" }
    /// ]}"#).unwrap();
    /// let timeout = |path| config.method_config(path).and_then(|m| m.timeout()).unwrap().as_secs();
    /// assert_eq!(timeout("/pkg.Svc/Get"), 1);
    /// assert_eq!(timeout("/pkg.Svc/Put"), 5);
    /// assert_eq!(timeout("/other.Svc/Get"), 30);
    /// assert_eq!(timeout("not a path"), 30);
    /// ```
    pub fn method_config(&self, path: &str) -> Option<&MethodConfig> {
        self.method_configs.get(self.entry_for_path(path)?)
    }

    /// The index in [`method_configs`](Self::method_configs) of the entry
    /// for `path`, by the rules of [`method_config`](Self::method_config).
    pub(crate) fn entry_for_path(&self, path: &str) -> Option<usize> {
        let named = path
            .strip_prefix('/')
            .and_then(|rest| rest.split_once('/'))
            .filter(|(_, method)| !method.contains('/'));
        match named {
            Some((service, method)) => self.entry_for(service, method),
            None => self.index.default.map(|(entry, _)| entry),
        }
    }

    /// The method config for `service` and `method`, by the same rules as
    /// [`method_config`](Self::method_config).
    #[cfg(test)]
    pub(crate) fn method_config_for(&self, service: &str, method: &str) -> Option<&MethodConfig> {
        self.method_configs.get(self.entry_for(service, method)?)
    }

    fn entry_for(&self, service: &str, method: &str) -> Option<usize> {
        let entries = self.index.services.get(service);
        entries
            .and_then(|entries| entries.methods.get(method).copied().flatten())
            .or_else(|| entries.and_then(|entries| entries.whole_service))
            .or(self.index.default)
            .map(|(entry, _)| entry)
    }

    /// The default method config (a name without `service`), if any.
    #[cfg(test)]
    pub(crate) fn default_method_config(&self) -> Option<&MethodConfig> {
        self.method_configs.get(self.index.default?.0)
    }
}

/// One `methodConfig` entry: the names it applies to and its settings.
#[derive(Debug, Clone, PartialEq)]
pub struct MethodConfig {
    /// An entry without names applies to no call (gRPC skips it).
    names: Vec<MethodName>,
    policy: Option<Policy>,
    timeout: Option<Duration>,
    wait_for_ready: Option<bool>,
}

#[derive(Debug, Clone, PartialEq)]
enum Policy {
    Retry(RetryPolicyConfig),
    Hedging(HedgingPolicyConfig),
}

impl MethodConfig {
    /// The retry policy, if this config has one.
    pub(crate) fn retry_policy(&self) -> Option<&RetryPolicyConfig> {
        match &self.policy {
            Some(Policy::Retry(policy)) => Some(policy),
            _ => None,
        }
    }

    /// The hedging policy, if this config has one.
    pub(crate) fn hedging_policy(&self) -> Option<&HedgingPolicyConfig> {
        match &self.policy {
            Some(Policy::Hedging(policy)) => Some(policy),
            _ => None,
        }
    }

    /// The `timeout`: the deadline of a whole call, every attempt included.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// `waitForReady`, if set. The layers do not act on it (waiting for a
    /// connection is the channel's business): it is read and checked so
    /// that a caller who does can find it.
    pub fn wait_for_ready(&self) -> Option<bool> {
        self.wait_for_ready
    }
}

/// One `name` of a method config: a service and, optionally, one of its
/// methods. An empty `service` is the default name, which has no method.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MethodName {
    /// `package.Service`; empty for the default name.
    service: String,
    /// `None` for a name that covers the whole service.
    method: Option<String>,
}

impl std::fmt::Display for MethodName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.service[..], &self.method) {
            ("", _) => f.write_str("the default name"),
            (service, None) => write!(f, "service {service:?}"),
            (service, Some(method)) => write!(f, "method {service:?}/{method:?}"),
        }
    }
}

/// A validated `retryPolicy`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RetryPolicyConfig {
    /// Attempts in all, the first included: 2–5 (a larger `maxAttempts`
    /// is read as `MAX_ATTEMPTS_LIMIT`).
    max_attempts: u32,
    initial_backoff: Duration,
    max_backoff: Duration,
    backoff_multiplier: f64,
    retryable_status_codes: StatusCodes,
}

/// A validated `hedgingPolicy`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HedgingPolicyConfig {
    /// Attempts in all, the original included: 2–5.
    max_attempts: u32,
    /// The delay between hedged attempts (zero: all at once).
    hedging_delay: Duration,
    /// The codes after which the other hedged attempts go on (may be empty).
    non_fatal_status_codes: StatusCodes,
}

/// A validated `retryThrottling`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryThrottlingConfig {
    /// The size of the token bucket, 1–1000.
    max_tokens: u32,
    /// The tokens a success adds, in thousandths (A6 keeps three decimals:
    /// `0.1` is 100).
    token_ratio_thousandths: u32,
}
