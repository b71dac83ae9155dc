//! Reading a configuration: every format is parsed into one JSON value, and
//! that value is checked key by key.
//!
//! Checking the value by hand, rather than deriving `Deserialize`, is what
//! lets every error name the exact key in every format and say what the key
//! needs in words ("a whole number of milliseconds, 0 or more") instead of a
//! parser's type name ("expected u64"), which serde's derived errors cannot:
//! they know neither the path nor the unit.

use std::borrow::Cow;
use std::str::FromStr;

use http::HeaderName;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};
use tower_classify::{ConfigError, RetryOn};
use tower_retry_budget::{Backoff, Jitter, MAX_RETRIES_LIMIT};

use crate::config::{CircuitBreakerSection, PoisonSection, ResilienceConfig, RetrySection};
#[cfg(any(feature = "yaml", feature = "toml", feature = "json"))]
use crate::error::LoadError;

/// The key a document may wrap the block in.
pub(crate) const WRAPPER_KEY: &str = "resilience";
/// The keys of the block itself.
pub(crate) const BLOCK_KEYS: [&str; 3] = ["retry", "circuit_breaker", "poison"];
/// The keys of the `retry` section.
pub(crate) const RETRY_KEYS: [&str; 8] = [
    "max_attempts",
    "backoff",
    "base_ms",
    "max_ms",
    "jitter",
    "retry_on",
    "deadline_ms",
    "attempt_timeout_ms",
];
/// The keys of the `circuit_breaker` section.
pub(crate) const CIRCUIT_BREAKER_KEYS: [&str; 2] = ["consecutive_failures", "cooldown_secs"];
/// The keys of the `poison` section.
pub(crate) const POISON_KEYS: [&str; 4] = [
    "max_row_attempts",
    "action",
    "message_id_header",
    "store_refusals",
];

/// The most tries `max_attempts` allows: the first and the retry layer's
/// largest number of retries.
pub(crate) const MAX_ATTEMPTS_LIMIT: u32 = MAX_RETRIES_LIMIT + 1;

impl ResilienceConfig {
    /// Reads a configuration from YAML: the `resilience:` block, or the
    /// document's top-level `resilience:` key holding it.
    #[cfg(feature = "yaml")]
    pub fn from_yaml_str(text: &str) -> Result<Self, LoadError> {
        load("YAML", yaml_serde::from_str(text))
    }

    /// Reads a configuration from TOML: the block's tables (`[retry]`, …)
    /// or the same under `[resilience.retry]`, ….
    #[cfg(feature = "toml")]
    pub fn from_toml_str(text: &str) -> Result<Self, LoadError> {
        load("TOML", toml::from_str(text))
    }

    /// Reads a configuration from JSON: the block's object, or an object
    /// whose only key `resilience` holds it.
    #[cfg(feature = "json")]
    pub fn from_json_str(text: &str) -> Result<Self, LoadError> {
        load("JSON", serde_json::from_str(text))
    }

    /// Checks a configuration already parsed into a JSON value, with or
    /// without the `resilience` wrapper. Errors name the key's path as
    /// written (`resilience.retry.base_ms` in a wrapped document,
    /// `retry.base_ms` in a bare one).
    pub fn from_value(value: &Value) -> Result<Self, ConfigError> {
        match value {
            Value::Object(map) if map.contains_key(WRAPPER_KEY) => {
                refuse_unknown(map, "", &[WRAPPER_KEY])?;
                block(&map[WRAPPER_KEY], WRAPPER_KEY)
            }
            other => block(other, ""),
        }
    }
}

/// `Deserialize` runs the same checks as the loaders, so the block can sit
/// inside an application's own configuration struct. Paths in its errors
/// start at the block (`retry.base_ms`).
impl<'de> Deserialize<'de> for ResilienceConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        ResilienceConfig::from_value(&value).map_err(D::Error::custom)
    }
}

/// A document parsed by its format's parser, then checked key by key.
#[cfg(any(feature = "yaml", feature = "toml", feature = "json"))]
fn load<E: std::fmt::Display>(
    format: &'static str,
    parsed: Result<Value, E>,
) -> Result<ResilienceConfig, LoadError> {
    let value = parsed.map_err(|e| LoadError::Syntax {
        format,
        message: e.to_string(),
    })?;
    Ok(ResilienceConfig::from_value(&value)?)
}

fn block(value: &Value, path: &str) -> Result<ResilienceConfig, ConfigError> {
    let Some(map) = section(value, path, &BLOCK_KEYS)? else {
        return Ok(ResilienceConfig::default());
    };
    let config = ResilienceConfig {
        retry: match map.get("retry") {
            Some(value) => retry(value, &join(path, "retry"))?,
            None => RetrySection::default(),
        },
        circuit_breaker: match map.get("circuit_breaker") {
            Some(value) => circuit_breaker(value, &join(path, "circuit_breaker"))?,
            None => CircuitBreakerSection::default(),
        },
        poison: match map.get("poison") {
            Some(value) => poison(value, &join(path, "poison"))?,
            None => PoisonSection::default(),
        },
    };
    // The layers' own builders check their settings too; running them here
    // keeps the promise that nothing is refused later, at build time.
    crate::layer::check_with_layers(&config, path)?;
    for warning in config.warnings() {
        // The block's own path (`resilience.`) in front, as errors have it.
        let at = if path.is_empty() {
            String::new()
        } else {
            format!("{path}.")
        };
        tracing::warn!("resilience configuration: {at}{warning}");
    }
    Ok(config)
}

fn retry(value: &Value, path: &str) -> Result<RetrySection, ConfigError> {
    let mut retry = RetrySection::default();
    let Some(map) = section(value, path, &RETRY_KEYS)? else {
        return Ok(retry);
    };
    if let Some(value) = map.get("max_attempts") {
        retry.max_attempts = Some(whole(
            value,
            &join(path, "max_attempts"),
            &WholeRule {
                unit: "",
                min: 1,
                max: u64::from(MAX_ATTEMPTS_LIMIT),
                range: Cow::Owned(format!("from 1 (no retry) to {MAX_ATTEMPTS_LIMIT}")),
            },
        )? as u32);
    }
    if let Some(value) = map.get("backoff") {
        retry.backoff = Some(named(value, &join(path, "backoff"), "`exponential`")?);
    }
    let millis = WholeRule {
        unit: " of milliseconds",
        min: 0,
        max: u64::MAX,
        range: Cow::Borrowed("0 or more"),
    };
    if let Some(value) = map.get("base_ms") {
        retry.base_ms = Some(whole(value, &join(path, "base_ms"), &millis)?);
    }
    if let Some(value) = map.get("max_ms") {
        retry.max_ms = Some(whole(value, &join(path, "max_ms"), &millis)?);
    }
    let defaults = Backoff::default();
    let base = retry.base().unwrap_or(defaults.initial_delay());
    let max = retry.max().unwrap_or(defaults.max_delay());
    if base > max {
        // Name the key the block set: when only one of the two was set, the
        // other is the retry layer's default, and the one set is to change.
        let (field, problem) = if retry.base_ms.is_some() {
            let max = match retry.max_ms {
                Some(_) => format!("{}", max.as_millis()),
                None => format!("{}, its default", max.as_millis()),
            };
            (
                "base_ms",
                format!(
                    "must not be more than max_ms ({max}), the cap on every wait (got {})",
                    base.as_millis()
                ),
            )
        } else {
            (
                "max_ms",
                format!(
                    "must not be less than base_ms ({}, its default), the first wait (got {})",
                    base.as_millis(),
                    max.as_millis()
                ),
            )
        };
        return Err(ConfigError::new(join(path, field), problem));
    }
    if let Some(value) = map.get("jitter") {
        retry.jitter = Some(match value {
            // A switch: on is ±50 % around each wait, off is none.
            Value::Bool(true) => Jitter::Proportional {
                low: 0.5,
                high: 1.5,
            },
            Value::Bool(false) => Jitter::None,
            other => named(other, &join(path, "jitter"), "true, false or `full`")?,
        });
    }
    if let Some(value) = map.get("retry_on") {
        retry.retry_on = Some(retry_on(value, &join(path, "retry_on"))?);
    }
    let positive_millis = WholeRule {
        unit: " of milliseconds",
        min: 1,
        max: u64::MAX,
        range: Cow::Borrowed("1 or more"),
    };
    if let Some(value) = map.get("deadline_ms") {
        retry.deadline_ms = Some(whole(value, &join(path, "deadline_ms"), &positive_millis)?);
    }
    if let Some(value) = map.get("attempt_timeout_ms") {
        retry.attempt_timeout_ms = Some(whole(
            value,
            &join(path, "attempt_timeout_ms"),
            &positive_millis,
        )?);
    }
    Ok(retry)
}

fn retry_on(value: &Value, path: &str) -> Result<RetryOn, ConfigError> {
    let Value::Array(items) = value else {
        return Err(ConfigError::new(
            path.to_owned(),
            format!(
                "must be a list of classes such as [http_5xx, timeout] (got {})",
                describe(value)
            ),
        ));
    };
    if items.is_empty() {
        // The parser refuses this too; here it also says how to get every class.
        let error = RetryOn::from_names(Vec::<&str>::new()).unwrap_err();
        return Err(ConfigError::new(
            path.to_owned(),
            format!("{}; leave the key out to retry every class", error.reason()),
        ));
    }
    let mut names = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let name = item
            .as_str()
            .filter(|name| RetryOn::from_names([name]).is_ok());
        match name {
            Some(name) => names.push(name),
            None => {
                // The retry layer's parser says what it expects.
                let text = item.as_str().map_or_else(|| describe(item), str::to_owned);
                let error = RetryOn::from_names([text]).unwrap_err();
                return Err(ConfigError::new(
                    format!("{path}[{i}]"),
                    error.reason().to_owned(),
                ));
            }
        }
    }
    Ok(RetryOn::from_names(names).expect("every name was read and the list is not empty"))
}

fn circuit_breaker(value: &Value, path: &str) -> Result<CircuitBreakerSection, ConfigError> {
    let mut breaker = CircuitBreakerSection::default();
    let Some(map) = section(value, path, &CIRCUIT_BREAKER_KEYS)? else {
        return Ok(breaker);
    };
    if let Some(value) = map.get("consecutive_failures") {
        breaker.consecutive_failures = Some(whole(
            value,
            &join(path, "consecutive_failures"),
            &WholeRule::at_least_one(" of failed calls"),
        )? as u32);
    }
    if let Some(value) = map.get("cooldown_secs") {
        breaker.cooldown_secs = Some(whole(
            value,
            &join(path, "cooldown_secs"),
            &WholeRule {
                unit: " of seconds",
                min: 1,
                max: u64::MAX,
                range: Cow::Borrowed("1 or more"),
            },
        )?);
    }
    Ok(breaker)
}

fn poison(value: &Value, path: &str) -> Result<PoisonSection, ConfigError> {
    let mut poison = PoisonSection::default();
    let Some(map) = section(value, path, &POISON_KEYS)? else {
        return Ok(poison);
    };
    if let Some(value) = map.get("max_row_attempts") {
        poison.max_row_attempts = Some(whole(
            value,
            &join(path, "max_row_attempts"),
            &WholeRule::at_least_one(" of failed deliveries"),
        )? as u32);
    }
    if let Some(value) = map.get("action") {
        poison.action = Some(named(value, &join(path, "action"), "`dlq`")?);
    }
    if let Some(value) = map.get("message_id_header") {
        let field = join(path, "message_id_header");
        let name = value.as_str().ok_or_else(|| {
            ConfigError::new(
                field.clone(),
                format!(
                    "must be a header name such as x-message-id (got {})",
                    describe(value)
                ),
            )
        })?;
        if HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(ConfigError::new(
                field,
                format!("`{name}` is not a valid HTTP header name"),
            ));
        }
        poison.message_id_header = Some(name.to_owned());
    }
    if let Some(value) = map.get("store_refusals") {
        poison.store_refusals = value.as_bool().ok_or_else(|| {
            ConfigError::new(
                join(path, "store_refusals"),
                format!("must be true or false (got {})", describe(value)),
            )
        })?;
    }
    Ok(poison)
}

/// A section's keys, after refusing unknown ones. `None` for a section left
/// empty (`retry:` with nothing under it in YAML), which takes every default.
fn section<'a>(
    value: &'a Value,
    path: &str,
    keys: &[&str],
) -> Result<Option<&'a Map<String, Value>>, ConfigError> {
    match value {
        Value::Null => Ok(None),
        Value::Object(map) => {
            refuse_unknown(map, path, keys)?;
            Ok(Some(map))
        }
        other => Err(ConfigError::new(
            if path.is_empty() { "(document)" } else { path }.to_owned(),
            format!(
                "must be a section with the keys {} (got {})",
                list(keys),
                describe(other)
            ),
        )),
    }
}

fn refuse_unknown(map: &Map<String, Value>, path: &str, keys: &[&str]) -> Result<(), ConfigError> {
    match map.keys().find(|key| !keys.contains(&key.as_str())) {
        Some(key) => {
            let hint = if path.is_empty() && keys == BLOCK_KEYS {
                format!(" (or `{WRAPPER_KEY}` holding them)")
            } else {
                String::new()
            };
            Err(ConfigError::new(
                join(path, key),
                format!("unknown key; expected {}{hint}", list(keys)),
            ))
        }
        None => Ok(()),
    }
}

/// What a whole-number key accepts, and how to say so.
struct WholeRule {
    /// ` of milliseconds`, or empty.
    unit: &'static str,
    min: u64,
    max: u64,
    /// `0 or more`, `from 1 (no retry) to 17`.
    range: Cow<'static, str>,
}

impl WholeRule {
    /// 1 to `u32::MAX`, for counts.
    fn at_least_one(unit: &'static str) -> Self {
        WholeRule {
            unit,
            min: 1,
            max: u64::from(u32::MAX),
            range: Cow::Borrowed("1 or more"),
        }
    }
}

fn whole(value: &Value, path: &str, rule: &WholeRule) -> Result<u64, ConfigError> {
    let refuse = |range: &str| {
        ConfigError::new(
            path.to_owned(),
            format!(
                "must be a whole number{}, {range} (got {})",
                rule.unit,
                describe(value)
            ),
        )
    };
    let n = value.as_u64().ok_or_else(|| refuse(&rule.range))?;
    if n < rule.min {
        return Err(refuse(&rule.range));
    }
    if n > rule.max {
        // "1 or more" is true but does not explain why 5 000 000 000 is refused.
        let range = if rule.range.contains(" to ") {
            rule.range.to_string()
        } else {
            format!("{} to {}", rule.min, rule.max)
        };
        return Err(refuse(&range));
    }
    Ok(n)
}

/// A name in a layer's own vocabulary, read by the layer's own parser, whose
/// refusal says what it expects. `example` shows a right value when the
/// value is not text at all.
fn named<T: FromStr<Err = ConfigError>>(
    value: &Value,
    path: &str,
    example: &str,
) -> Result<T, ConfigError> {
    let Some(text) = value.as_str() else {
        return Err(ConfigError::new(
            path.to_owned(),
            format!("must be a name such as {example} (got {})", describe(value)),
        ));
    };
    text.parse()
        .map_err(|error: ConfigError| ConfigError::new(path.to_owned(), error.reason().to_owned()))
}

/// `a, b, c`.
fn list(keys: &[&str]) -> String {
    keys.join(", ")
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// A value as an operator would recognise it in their file.
fn describe(value: &Value) -> String {
    match value {
        Value::Null => "no value".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("the text {s:?}"),
        Value::Array(_) => "a list".to_owned(),
        Value::Object(_) => "a section".to_owned(),
    }
}
