//! Configuration that deserializes with `serde`.
//!
//! The shape follows a queue consumer's poison policy (`max_attempts`,
//! `action: dlq | drop | fail`). Unknown keys are refused, and every invalid
//! value gives a [`ConfigError`] naming the field.
//!
//! ```
//! use tower_poison::config::DeadLetterConfig;
//! use tower_poison::store::MemoryStore;
//!
//! let config: DeadLetterConfig = serde_json::from_str(r#"{
//!     "label": "orders",
//!     "action": "dlq",
//!     "body_limit": 16384,
//!     "redact_headers": ["x-tenant-token"],
//!     "message_id_header": "x-message-id",
//!     "poison": { "max_attempts": 3, "delivery_count": "sqs" },
//!     "classifier": { "retryable_statuses": [429, 502, 503, 504] }
//! }"#).unwrap();
//! let layer = config.build(MemoryStore::new(10_000)).unwrap();
//! # let _ = layer;
//!
//! let bad: DeadLetterConfig = serde_json::from_str(
//!     r#"{ "message_id_header": "x-message-id", "poison": { "max_attempts": 0 } }"#,
//! ).unwrap();
//! let err = bad.build(MemoryStore::new(10)).unwrap_err();
//! assert_eq!(err.field(), "poison.max_attempts");
//! ```

use http::header::HeaderName;
use serde::{Deserialize, Serialize};
use tower_classify::config::HttpClassifierConfig;
use tower_classify::{ConfigError, HttpClassifier};

use crate::action::Action;
use crate::capture::DEFAULT_BODY_LIMIT;
use crate::counts::DeliveryCount;
use crate::layer::{DeadLetterLayer, DEFAULT_LABEL};
use crate::poison::PoisonPolicy;
use crate::redact::Redactor;

/// The configuration of an HTTP [`DeadLetterLayer`].
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct DeadLetterConfig {
    /// The label of every entry (default `"default"`).
    pub label: String,
    /// What to do with a call that finally failed (default `dlq`).
    pub action: Action,
    /// Bytes of request body kept per entry (default 65536).
    pub body_limit: usize,
    /// Headers redacted on top of the built-in list.
    pub redact_headers: Vec<String>,
    /// The header carrying a message id, for poison detection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_id_header: Option<String>,
    /// Poison detection; absent: off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poison: Option<PoisonConfig>,
    /// What counts as a failure (the shared HTTP classifier configuration).
    pub classifier: HttpClassifierConfig,
    /// Store refusals that never reached the dependency, such as an open
    /// circuit's (default `false`: they are passed through to the caller;
    /// see [`DeadLetterLayer::store_refusals`] for why).
    pub store_refusals: bool,
}

impl Default for DeadLetterConfig {
    fn default() -> Self {
        DeadLetterConfig {
            label: DEFAULT_LABEL.to_owned(),
            action: Action::default(),
            body_limit: DEFAULT_BODY_LIMIT,
            redact_headers: Vec::new(),
            message_id_header: None,
            poison: None,
            classifier: HttpClassifierConfig::default(),
            store_refusals: false,
        }
    }
}

/// The configuration of [`PoisonPolicy`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct PoisonConfig {
    /// Failed deliveries after which a message is diverted (at least 1).
    pub max_attempts: u32,
    /// Message ids remembered at most (default 10 000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<usize>,
    /// Where requests carry the queue's own delivery count, which then
    /// replaces the layer's count (see [`DeliveryCount`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_count: Option<DeliveryCountConfig>,
}

/// The configuration of a [`DeliveryCount`] reader: `"sqs"`,
/// `"rabbitmq"`, `"redis-streams"`, `{"deliveries": "<header>"}` (1 on the
/// first delivery) or `{"redeliveries": "<header>"}` (absent or 0 on the
/// first delivery).
///
/// A count store shared by a fleet needs a connection, so it is not read
/// from a file: add it to the built layer with
/// [`count_store`](crate::DeadLetterLayer::count_store).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
#[non_exhaustive]
pub enum DeliveryCountConfig {
    /// [`DeliveryCount::sqs`].
    Sqs,
    /// [`DeliveryCount::rabbitmq`].
    Rabbitmq,
    /// [`DeliveryCount::redis_streams`].
    RedisStreams,
    /// [`DeliveryCount::deliveries`] of this header.
    Deliveries(String),
    /// [`DeliveryCount::redeliveries`] of this header.
    Redeliveries(String),
}

impl DeliveryCountConfig {
    /// The reader, or an error naming the field.
    pub(crate) fn build(&self) -> Result<DeliveryCount, ConfigError> {
        let named = |name: &str, field: &str| header_name(name).map_err(|e| e.within(field));
        Ok(match self {
            DeliveryCountConfig::Sqs => DeliveryCount::sqs(),
            DeliveryCountConfig::Rabbitmq => DeliveryCount::rabbitmq(),
            DeliveryCountConfig::RedisStreams => DeliveryCount::redis_streams(),
            DeliveryCountConfig::Deliveries(name) => {
                DeliveryCount::deliveries(named(name, "deliveries")?)
            }
            DeliveryCountConfig::Redeliveries(name) => {
                DeliveryCount::redeliveries(named(name, "redeliveries")?)
            }
        })
    }
}

impl DeadLetterConfig {
    /// Checks the configuration and builds the layer writing to `store`.
    pub fn build<St>(&self, store: St) -> Result<DeadLetterLayer<St, HttpClassifier>, ConfigError> {
        let classifier = self
            .classifier
            .build()
            .map_err(|e| e.within("classifier"))?;
        if self.label.is_empty() {
            return Err(ConfigError::new("label", "must not be empty"));
        }
        let mut layer = DeadLetterLayer::new(store)
            .classifier(classifier)
            .label(self.label.as_str())
            .action(self.action)
            .body_limit(self.body_limit)
            .store_refusals(self.store_refusals);
        let mut redactor = Redactor::default();
        for (i, name) in self.redact_headers.iter().enumerate() {
            let name = header_name(name).map_err(|e| e.within(&format!("redact_headers[{i}]")))?;
            redactor = redactor.with_header(name);
        }
        layer = layer.redactor(redactor);
        if let Some(name) = &self.message_id_header {
            let name = header_name(name).map_err(|e| e.within("message_id_header"))?;
            layer = layer.message_id_header(name);
        }
        if let Some(poison) = &self.poison {
            let mut policy = PoisonPolicy::new(poison.max_attempts)?;
            if let Some(capacity) = poison.capacity {
                policy = policy.capacity(capacity)?;
            }
            if self.message_id_header.is_none() {
                return Err(ConfigError::new(
                    "poison",
                    "needs `message_id_header`: poison detection counts failures per message id",
                ));
            }
            if let Some(reader) = &poison.delivery_count {
                let reader = reader
                    .build()
                    .map_err(|e| e.within("poison.delivery_count"))?;
                layer = layer.delivery_count(reader);
            }
            layer = layer.poison(policy);
        }
        Ok(layer)
    }
}

fn header_name(name: &str) -> Result<HeaderName, ConfigError> {
    HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| ConfigError::new("name", format!("{name:?} is not a valid header name")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn build(json: &str) -> Result<(), ConfigError> {
        let config: DeadLetterConfig = serde_json::from_str(json).unwrap();
        config.build(MemoryStore::new(1)).map(drop)
    }

    #[test]
    fn defaults_build() {
        build("{}").unwrap();
        assert_eq!(DeadLetterConfig::default().action, Action::Dlq);
    }

    #[test]
    fn every_error_names_its_field() {
        let field = |json: &str| build(json).unwrap_err().field().to_owned();
        assert_eq!(
            field(r#"{"redact_headers": ["ok", "bad header"]}"#),
            "redact_headers[1].name"
        );
        assert_eq!(
            field(r#"{"message_id_header": "a b"}"#),
            "message_id_header.name"
        );
        assert_eq!(field(r#"{"poison": {"max_attempts": 3}}"#), "poison");
        assert_eq!(
            field(r#"{"message_id_header": "x-id", "poison": {"max_attempts": 3, "capacity": 0}}"#),
            "poison.capacity"
        );
        assert_eq!(field(r#"{"label": ""}"#), "label");
        assert_eq!(
            field(
                r#"{"message_id_header": "x-id",
                    "poison": {"max_attempts": 3, "delivery_count": {"deliveries": "a b"}}}"#
            ),
            "poison.delivery_count.deliveries.name"
        );
        assert_eq!(
            field(r#"{"classifier": {"retryable_statuses": []}}"#),
            "classifier.retryable_statuses"
        );
    }

    #[test]
    fn delivery_count_readers_parse() {
        let reader = |json: &str| {
            serde_json::from_str::<DeliveryCountConfig>(json)
                .unwrap()
                .build()
                .unwrap()
        };
        assert_eq!(reader(r#""sqs""#), DeliveryCount::sqs());
        assert_eq!(reader(r#""rabbitmq""#), DeliveryCount::rabbitmq());
        assert_eq!(reader(r#""redis-streams""#), DeliveryCount::redis_streams());
        assert_eq!(
            reader(r#"{"deliveries": "x-receive-count"}"#),
            DeliveryCount::deliveries(HeaderName::from_static("x-receive-count"))
        );
        assert_eq!(
            reader(r#"{"redeliveries": "x-redelivered"}"#),
            DeliveryCount::redeliveries(HeaderName::from_static("x-redelivered"))
        );
        assert!(serde_json::from_str::<DeliveryCountConfig>(r#""kafka""#).is_err());
        build(
            r#"{"message_id_header": "x-id",
                "poison": {"max_attempts": 3, "delivery_count": "sqs"}}"#,
        )
        .unwrap();
    }

    #[test]
    fn unknown_keys_and_actions_are_refused() {
        let err = serde_json::from_str::<DeadLetterConfig>(r#"{"acton": "dlq"}"#).unwrap_err();
        assert!(err.to_string().contains("acton"), "{err}");
        let err = serde_json::from_str::<DeadLetterConfig>(r#"{"action": "retry"}"#).unwrap_err();
        assert!(err.to_string().contains("retry"), "{err}");
    }
}
