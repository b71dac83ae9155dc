//! Reading a configuration: every format is parsed into one JSON value,
//! checked key by key by hand, so that every error names the exact key and
//! says what it needs in words ("a whole number of milliseconds, 0 or
//! more"), which a derived `Deserialize` cannot.

use std::str::FromStr;

use http::HeaderName;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};
use tower_classify::{ConfigError, RetryOn};
use tower_poison::PoisonPolicy;
use tower_retry_budget::{Jitter, MAX_RETRIES_LIMIT};

use crate::config::{
    its_default, CircuitBreakerSection, PoisonSection, ResilienceConfig, RetrySection,
};
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
    let map = section(value, path, &BLOCK_KEYS)?;
    let config = ResilienceConfig {
        retry: key(map, path, "retry", retry)?.unwrap_or_default(),
        circuit_breaker: key(map, path, "circuit_breaker", circuit_breaker)?.unwrap_or_default(),
        poison: key(map, path, "poison", poison)?.unwrap_or_default(),
    };
    // The layers' own builders check their settings too; running them here
    // keeps the promise that nothing is refused later, at build time.
    check_with_layers(&config, path)?;
    for warning in config.warnings() {
        // The block's own path (`resilience.`) in front, as errors have it.
        tracing::warn!("resilience configuration: {}", join(path, &warning));
    }
    Ok(config)
}

fn retry(value: &Value, path: &str) -> Result<RetrySection, ConfigError> {
    let mut retry = RetrySection::default();
    let map = section(value, path, &RETRY_KEYS)?;
    let range = format!("from 1 (no retry) to {MAX_ATTEMPTS_LIMIT}");
    let attempts = whole("", 1, MAX_ATTEMPTS_LIMIT.into(), Some(range));
    retry.max_attempts = key(map, path, "max_attempts", attempts)?.map(|n| n as u32);
    retry.backoff = key(map, path, "backoff", |v, at| named(v, at, "`exponential`"))?;
    let millis = whole(" of milliseconds", 0, u64::MAX, None);
    retry.base_ms = key(map, path, "base_ms", &millis)?;
    retry.max_ms = key(map, path, "max_ms", millis)?;
    let (base, max) = retry.base_and_max();
    if base > max {
        // Name the key the block set: when only one of the two was set, the
        // other is the retry layer's default, and the one set is to change.
        let (field, problem) = if retry.base_ms.is_some() {
            let max = format!("{}{}", max.as_millis(), its_default(retry.max_ms));
            let problem = format!("must not be more than max_ms ({max}), the cap on every wait");
            ("base_ms", format!("{problem} (got {})", base.as_millis()))
        } else {
            let base = base.as_millis();
            let problem = format!("must not be less than base_ms ({base}, its default)");
            (
                "max_ms",
                format!("{problem}, the first wait (got {})", max.as_millis()),
            )
        };
        return Err(ConfigError::new(join(path, field), problem));
    }
    retry.jitter = key(map, path, "jitter", |value, at| match value {
        // A switch: on is ±50 % around each wait, off is none.
        Value::Bool(true) => Ok(Jitter::Proportional {
            low: 0.5,
            high: 1.5,
        }),
        Value::Bool(false) => Ok(Jitter::None),
        other => named(other, at, "true, false or `full`"),
    })?;
    retry.retry_on = key(map, path, "retry_on", retry_on)?;
    let millis = whole(" of milliseconds", 1, u64::MAX, None);
    retry.deadline_ms = key(map, path, "deadline_ms", &millis)?;
    retry.attempt_timeout_ms = key(map, path, "attempt_timeout_ms", millis)?;
    Ok(retry)
}

fn retry_on(value: &Value, path: &str) -> Result<RetryOn, ConfigError> {
    let Value::Array(items) = value else {
        let classes = "a list of classes such as [http_5xx, timeout]";
        return Err(refuse(path, classes, value));
    };
    // Each item alone, so the parser's refusal names it; a value that is
    // not text is read as its description, which names no class.
    let names = items.iter().enumerate().map(|(i, item)| {
        let text = item.as_str().map_or_else(|| describe(item), str::to_owned);
        let error =
            |e: ConfigError| ConfigError::new(format!("{path}[{i}]"), e.reason().to_owned());
        RetryOn::from_names([&text]).map(|_| text).map_err(error)
    });
    let names = names.collect::<Result<Vec<_>, _>>()?;
    // Only an empty list is left to refuse: the refusal also says how to
    // get every class.
    RetryOn::from_names(names).map_err(|error| {
        let problem = format!("{}; leave the key out to retry every class", error.reason());
        ConfigError::new(path.to_owned(), problem)
    })
}

fn circuit_breaker(value: &Value, path: &str) -> Result<CircuitBreakerSection, ConfigError> {
    let map = section(value, path, &CIRCUIT_BREAKER_KEYS)?;
    let failures = count(" of failed calls");
    let seconds = whole(" of seconds", 1, u64::MAX, None);
    Ok(CircuitBreakerSection {
        consecutive_failures: key(map, path, "consecutive_failures", failures)?,
        cooldown_secs: key(map, path, "cooldown_secs", seconds)?,
    })
}

fn poison(value: &Value, path: &str) -> Result<PoisonSection, ConfigError> {
    let map = section(value, path, &POISON_KEYS)?;
    let failures = count(" of failed deliveries");
    let header_name = |value: &Value, at: &str| {
        let header = "a header name such as x-message-id";
        let name = value.as_str().ok_or_else(|| refuse(at, header, value))?;
        if HeaderName::from_bytes(name.as_bytes()).is_err() {
            let problem = format!("`{name}` is not a valid HTTP header name");
            return Err(ConfigError::new(at.to_owned(), problem));
        }
        Ok(name.to_owned())
    };
    let switch = |v: &Value, at: &str| v.as_bool().ok_or_else(|| refuse(at, "true or false", v));
    Ok(PoisonSection {
        max_row_attempts: key(map, path, "max_row_attempts", failures)?,
        action: key(map, path, "action", |v, at| named(v, at, "`dlq`"))?,
        message_id_header: key(map, path, "message_id_header", header_name)?,
        store_refusals: key(map, path, "store_refusals", switch)?.unwrap_or_default(),
    })
}

/// `key` of a section read by `read`, which is given the key's path;
/// `None` when the section (or the key) is left out.
fn key<T>(
    map: Option<&Map<String, Value>>,
    path: &str,
    key: &str,
    read: impl FnOnce(&Value, &str) -> Result<T, ConfigError>,
) -> Result<Option<T>, ConfigError> {
    map.and_then(|map| map.get(key))
        .map(|value| read(value, &join(path, key)))
        .transpose()
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
        other => {
            let at = if path.is_empty() { "(document)" } else { path };
            let needs = format!("a section with the keys {}", keys.join(", "));
            Err(refuse(at, &needs, other))
        }
    }
}

fn refuse_unknown(map: &Map<String, Value>, path: &str, keys: &[&str]) -> Result<(), ConfigError> {
    let Some(key) = map.keys().find(|key| !keys.contains(&key.as_str())) else {
        return Ok(());
    };
    let hint = if path.is_empty() && keys == BLOCK_KEYS {
        format!(" (or `{WRAPPER_KEY}` holding them)")
    } else {
        String::new()
    };
    let problem = format!("unknown key; expected {}{hint}", keys.join(", "));
    Err(ConfigError::new(join(path, key), problem))
}

/// Reads a whole number from `min` to `max`. A refusal says what the key
/// needs in words: the `unit` (` of milliseconds`, or empty) and the
/// `range` (`from 1 (no retry) to 17`; by default `1 or more`).
fn whole(
    unit: &'static str,
    min: u64,
    max: u64,
    range: Option<String>,
) -> impl Fn(&Value, &str) -> Result<u64, ConfigError> {
    move |value, path| {
        let n = value.as_u64();
        if let Some(n) = n.filter(|n| (min..=max).contains(n)) {
            return Ok(n);
        }
        let range = match &range {
            Some(range) => range.clone(),
            // "1 or more" is true but does not explain why 5 000 000 000 is refused.
            None if n > Some(max) => format!("{min} to {max}"),
            None => format!("{min} or more"),
        };
        let needs = format!("a whole number{unit}, {range}");
        Err(refuse(path, &needs, value))
    }
}

/// 1 to `u32::MAX`, for counts.
fn count(unit: &'static str) -> impl Fn(&Value, &str) -> Result<u32, ConfigError> {
    let whole = whole(unit, 1, u32::MAX.into(), None);
    move |value, path| whole(value, path).map(|n| n as u32)
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
        return Err(refuse(path, &format!("a name such as {example}"), value));
    };
    text.parse()
        .map_err(|error: ConfigError| ConfigError::new(path.to_owned(), error.reason().to_owned()))
}

/// `key` under `parent`, as errors name it: `resilience.retry.base_ms`.
pub(crate) fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// The key at `path` refused: it `must be` what `needs` says, and `value`
/// is not.
fn refuse(path: &str, needs: &str, value: &Value) -> ConfigError {
    ConfigError::new(
        path.to_owned(),
        format!("must be {needs} (got {})", describe(value)),
    )
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

/// Runs the layers' own builders over a loaded configuration, and reports
/// what they refuse under the key of the configuration that holds it.
pub(crate) fn check_with_layers(config: &ResilienceConfig, path: &str) -> Result<(), ConfigError> {
    // A refusal of a setting this crate does not set names the section and
    // the layer's own setting, rather than guessing at a key.
    let refusal = |section: &str, key: Option<&str>, error: ConfigError| {
        let section = join(path, section);
        match key {
            Some(key) => ConfigError::new(join(&section, key), error.reason().to_owned()),
            None => ConfigError::new(section, format!("{}: {}", error.field(), error.reason())),
        }
    };
    config.retry_builder().check().map_err(|error| {
        if error.field() == "max_retries" {
            // The builder counts retries; the block counts attempts.
            let problem = format!("must be from 1 (no retry) to {MAX_ATTEMPTS_LIMIT}");
            return ConfigError::new(join(path, "retry.max_attempts"), problem);
        }
        let key = match error.field() {
            "retry_on" => Some("retry_on"),
            "backoff.kind" => Some("backoff"),
            "deadline" => Some("deadline_ms"),
            "attempt_timeout" => Some("attempt_timeout_ms"),
            _ => None,
        };
        refusal("retry", key, error)
    })?;
    // Checked without building a layer: a built one would register its
    // metrics (and describe them) with whatever recorder
    // is current, and could reset a live breaker's gauges.
    config.breaker_builder().check().map_err(|error| {
        let key = match error.field() {
            "failure_threshold" => Some("consecutive_failures"),
            "recovery_timeout" => Some("cooldown_secs"),
            _ => None,
        };
        refusal("circuit_breaker", key, error)
    })?;
    PoisonPolicy::new(config.poison.max_row_attempts())
        .map_err(|error| refusal("poison", Some("max_row_attempts"), error))?;
    Ok(())
}
