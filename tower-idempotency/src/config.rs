//! Configuration that deserializes with `serde`.
//!
//! Unknown keys are refused, and every invalid value gives a
//! [`ConfigError`] naming the field.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tower_classify::config::HttpClassifierConfig;
use tower_classify::{ConfigError, HttpClassifier};

use crate::layer::{IdempotencyGuardLayer, MIN_TTL};
use crate::service::Config;

/// The configuration of an [`IdempotencyGuardLayer`].
///
/// ```
/// use tower_idempotency::config::IdempotencyConfig;
/// use tower_idempotency::store::MemoryIdempotencyStore;
///
/// let config: IdempotencyConfig = serde_json::from_str(r#"{
///     "name": "orders",
///     "ttl": "24h",
///     "in_flight_ttl": "2m",
///     "response_body_limit": 262144,
///     "release_on_transient": false,
///     "classifier": { "retryable_statuses": [429, 502, 503, 504] }
/// }"#).unwrap();
/// let guard = config.build(MemoryIdempotencyStore::new(100_000)).unwrap();
/// # let _ = guard;
///
/// let bad: IdempotencyConfig = serde_json::from_str(r#"{ "in_flight_ttl": "0s" }"#).unwrap();
/// assert_eq!(bad.build(MemoryIdempotencyStore::new(1)).unwrap_err().field(), "in_flight_ttl");
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct IdempotencyConfig {
    /// The guard's name in its metrics and events (default `"default"`;
    /// see [`IdempotencyGuardLayer::name`]).
    pub name: String,
    /// How long a completed key is kept (default `24h`).
    #[serde(with = "tower_classify::duration::serde")]
    pub ttl: Duration,
    /// How long an unfinished claim holds its key (default `5m`).
    #[serde(with = "tower_classify::duration::serde")]
    pub in_flight_ttl: Duration,
    /// The largest response body stored for replay (default 1 MiB).
    pub response_body_limit: usize,
    /// Guard idempotent methods too (default `false`).
    pub all_methods: bool,
    /// Free the key on a transient answer (default `false`; see
    /// [`IdempotencyGuardLayer::release_on_transient`] for the risk).
    pub release_on_transient: bool,
    /// Free the key on a refusal proven to be made before the handler ran
    /// (default `true`; see [`IdempotencyGuardLayer::release_on_shed`]).
    pub release_on_shed: bool,
    /// What counts as a transient or shed answer (the shared HTTP classifier
    /// configuration).
    pub classifier: HttpClassifierConfig,
}

impl Default for IdempotencyConfig {
    /// The layer's own defaults.
    fn default() -> Self {
        let layer = Config::default();
        IdempotencyConfig {
            name: layer.name.to_string(),
            ttl: layer.ttl,
            in_flight_ttl: layer.in_flight_ttl,
            response_body_limit: layer.response_body_limit,
            all_methods: layer.all_methods,
            release_on_transient: layer.release_on_transient,
            release_on_shed: layer.release_on_shed,
            classifier: HttpClassifierConfig::default(),
        }
    }
}

impl IdempotencyConfig {
    /// Checks the configuration and builds the guard keeping keys in `store`.
    pub fn build<St>(
        &self,
        store: St,
    ) -> Result<IdempotencyGuardLayer<St, HttpClassifier>, ConfigError> {
        let classifier = self
            .classifier
            .build()
            .map_err(|e| e.within("classifier"))?;
        for (field, ttl) in [("ttl", self.ttl), ("in_flight_ttl", self.in_flight_ttl)] {
            if ttl < MIN_TTL {
                return Err(ConfigError::new(
                    field,
                    format!("must be at least {MIN_TTL:?}"),
                ));
            }
        }
        Ok(IdempotencyGuardLayer::new(store)
            .name(self.name.as_str())
            .classifier(classifier)
            .ttl(self.ttl)
            .in_flight_ttl(self.in_flight_ttl)
            .response_body_limit(self.response_body_limit)
            .all_methods(self.all_methods)
            .release_on_transient(self.release_on_transient)
            .release_on_shed(self.release_on_shed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryIdempotencyStore;

    #[test]
    fn defaults_match_the_layer_and_errors_name_the_field() {
        let field = |json: &str| {
            let config: IdempotencyConfig = serde_json::from_str(json).unwrap();
            config
                .build(MemoryIdempotencyStore::new(1))
                .unwrap_err()
                .field()
                .to_owned()
        };
        let defaults: IdempotencyConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(defaults, IdempotencyConfig::default());
        let store = MemoryIdempotencyStore::new(1);
        let built = format!("{:?}", defaults.build(store.clone()).unwrap());
        let layer = format!("{:?}", IdempotencyGuardLayer::new(store.clone()));
        assert_eq!(built, layer, "the defaults are the layer's");
        let named: IdempotencyConfig = serde_json::from_str(r#"{"name": "orders"}"#).unwrap();
        let built = format!("{:?}", named.build(store.clone()).unwrap());
        let layer = format!(
            "{:?}",
            IdempotencyGuardLayer::new(store.clone()).name("orders")
        );
        assert_eq!(built, layer, "the name reaches the layer");
        assert!(built.contains("\"orders\""), "{built}");
        assert_eq!(field(r#"{"ttl": "0s"}"#), "ttl");
        assert_eq!(field(r#"{"in_flight_ttl": "0ms"}"#), "in_flight_ttl");
        assert_eq!(field(r#"{"in_flight_ttl": "99ms"}"#), "in_flight_ttl");
        assert_eq!(
            field(r#"{"classifier": {"retryable_statuses": []}}"#),
            "classifier.retryable_statuses"
        );
        let err = serde_json::from_str::<IdempotencyConfig>(r#"{"tll": "1h"}"#).unwrap_err();
        assert!(err.to_string().contains("tll"), "{err}");
        // The guard reads no request body ahead any more, so there is no
        // fingerprint limit to set: a configuration naming one is told so.
        let gone = r#"{"fingerprint_body_limit": 1024}"#;
        let err = serde_json::from_str::<IdempotencyConfig>(gone).unwrap_err();
        assert!(err.to_string().contains("fingerprint_body_limit"), "{err}");
    }
}
