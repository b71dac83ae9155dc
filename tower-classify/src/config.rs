//! Configuration types that deserialize with `serde` (feature `serde`).
//!
//! Unknown keys are refused, not ignored, and every invalid value gives an
//! error that names the field. Durations are written in human form
//! (`"200ms"`, `"30s"`, see [`duration`](crate::duration)).
//!
//! ```
//! use tower_classify::config::HttpClassifierConfig;
//!
//! let config: HttpClassifierConfig = serde_json::from_str(r#"{
//!     "retryable_statuses": [429, 502, 503, 504],
//!     "retry_on_response": [{
//!         "status": [400, 403],
//!         "body_path": "$.error.code",
//!         "values": [17, 80004],
//!         "backoff": "60s"
//!     }]
//! }"#).unwrap();
//! let classifier = config.build().unwrap();
//! # let _ = classifier;
//!
//! let err = serde_json::from_str::<HttpClassifierConfig>(r#"{"retry_onn": []}"#).unwrap_err();
//! assert!(err.to_string().contains("retry_onn"));
//! ```

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::error::ConfigError;
use crate::hint::{BackoffFrom, WaitUnit};
use crate::http::{HttpClassifier, ResponseRule, StatusSet};
use crate::retry_on::RetryOn;

/// The configuration of an [`HttpClassifier`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct HttpClassifierConfig {
    /// Only these failing statuses are transient; every other status ≥ 400 is
    /// rejected. Absent: the default table (5xx, 408, 429).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retryable_statuses: Option<Vec<u16>>,
    /// Rules that turn throttling signalled without a 429 into `rate_limited`
    /// (`retry_on_response` in a configuration).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retry_on_response: Vec<ResponseRuleConfig>,
}

impl HttpClassifierConfig {
    /// Checks the configuration and builds the classifier. Errors name the
    /// field, for example `retry_on_response[1].match_success`.
    pub fn build(&self) -> Result<HttpClassifier, ConfigError> {
        let mut classifier = HttpClassifier::new();
        if let Some(statuses) = &self.retryable_statuses {
            let set = StatusSet::from_codes("retryable_statuses", statuses.iter().copied())?;
            if set.is_empty() {
                return Err(ConfigError::new(
                    "retryable_statuses",
                    "must name at least one status; omit it for the default table",
                ));
            }
            classifier = classifier.retryable_set(set);
        }
        let rules = self
            .retry_on_response
            .iter()
            .enumerate()
            .map(|(i, rule)| {
                rule.build()
                    .map_err(|e| e.within(&format!("retry_on_response[{i}]")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(classifier.with_rules(rules))
    }
}

/// One response rule; see [`ResponseRule`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ResponseRuleConfig {
    /// The statuses the rule applies to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub status: Vec<u16>,
    /// Also apply the rule to 2xx responses (needs `header` or `body_path`).
    #[serde(default)]
    pub match_success: bool,
    /// A header that must be present, or equal one of `values`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// A JSONPath into the body that must select one of `values`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_path: Option<String>,
    /// The values `header` or `body_path` must equal.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<Value>,
    /// A fixed wait for matching responses.
    #[serde(
        default,
        with = "crate::duration::serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub backoff: Option<Duration>,
    /// Where the response states its wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_from: Option<BackoffFromConfig>,
}

impl ResponseRuleConfig {
    /// Checks the rule and builds it.
    pub(crate) fn build(&self) -> Result<ResponseRule, ConfigError> {
        let mut builder = ResponseRule::builder()
            .statuses(self.status.iter().copied())
            .match_success(self.match_success);
        match (&self.header, &self.body_path) {
            // `header_equals` with no values is `header_present`.
            (Some(header), None) => {
                builder = builder.header_equals(header.clone(), self.values.iter().map(value_text))
            }
            (None, Some(path)) => builder = builder.body_path(path.clone(), self.values.clone()),
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    "body_path",
                    "a rule checks either `header` or `body_path`, not both",
                ))
            }
            (None, None) if !self.values.is_empty() => {
                return Err(ConfigError::new(
                    "values",
                    "`values` needs a `header` or `body_path` to compare against",
                ))
            }
            (None, None) => {}
        }
        if let Some(wait) = self.backoff {
            builder = builder.backoff(wait);
        }
        if let Some(reader) = &self.backoff_from {
            builder = builder.backoff_from(reader.build()?);
        }
        builder.build()
    }
}

fn value_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// A `backoff_from` reader, as a configuration writes it:
/// `{ "type": "header", "config": { "name": "x-ratelimit-reset", "unit": "epoch_s" } }`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(
    tag = "type",
    content = "config",
    rename_all = "snake_case",
    deny_unknown_fields
)]
#[non_exhaustive]
pub enum BackoffFromConfig {
    /// A header value.
    Header {
        /// The header.
        name: String,
        /// How the value is written.
        unit: WaitUnit,
    },
    /// A JSON-valued header at a path.
    HeaderJson {
        /// The header.
        name: String,
        /// The JSONPath inside the header's value.
        path: String,
        /// How the value is written.
        unit: WaitUnit,
    },
    /// A value in the JSON body.
    Body {
        /// The JSONPath into the body.
        path: String,
        /// How the value is written.
        unit: WaitUnit,
    },
    /// A leaky-bucket cost report in the JSON body.
    CostBucket {
        /// Path to the requested cost.
        requested: String,
        /// Path to the available cost.
        available: String,
        /// Path to the restore rate per second.
        restore_rate: String,
    },
}

impl BackoffFromConfig {
    /// Checks the reader and builds it.
    pub(crate) fn build(&self) -> Result<BackoffFrom, ConfigError> {
        match self {
            BackoffFromConfig::Header { name, unit } => BackoffFrom::header(name, *unit),
            BackoffFromConfig::HeaderJson { name, path, unit } => {
                BackoffFrom::header_json(name, path, *unit)
            }
            BackoffFromConfig::Body { path, unit } => BackoffFrom::body(path, *unit),
            BackoffFromConfig::CostBucket {
                requested,
                available,
                restore_rate,
            } => BackoffFrom::cost_bucket(requested, available, restore_rate),
        }
    }
}

/// `retry_on` is written as a list of class names; an empty list is refused.
impl<'de> Deserialize<'de> for RetryOn {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let names = Vec::<String>::deserialize(deserializer)?;
        RetryOn::from_names(&names).map_err(serde::de::Error::custom)
    }
}

impl Serialize for RetryOn {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.names())
    }
}
