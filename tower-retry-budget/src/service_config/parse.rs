//! Reading a service config from JSON, with A6's validation rules; every
//! error names the JSON path of the value it refuses.

use std::time::Duration;

use serde_json::{Map, Value};
use tower_classify::ConfigError;

use crate::budget::token_bucket::thousandths;

use super::duration::parse_proto_duration;
use super::status::{status_code_from_name, StatusCodes, STATUS_CODE_NAMES};
use super::{
    HedgingPolicyConfig, MethodConfig, MethodName, Policy, RetryPolicyConfig,
    RetryThrottlingConfig, ServiceConfig, MAX_ATTEMPTS_LIMIT,
};

/// Past this many thousandths a token ratio refills any bucket (at most
/// 1000 tokens) in one success, so larger ratios are kept as this.
const MAX_TOKEN_RATIO_THOUSANDTHS: u64 = 1_000_000;

pub(super) fn service_config(value: &Value) -> Result<ServiceConfig, ConfigError> {
    let root = object(value, "serviceConfig")?;
    // The root's fields are named without it.
    let method_configs = optional(root, "", "methodConfig", |entries, path| {
        array(entries, path, method_config)
    })?;
    let retry_throttling = optional(root, "", "retryThrottling", retry_throttling)?;
    ServiceConfig::new(method_configs.unwrap_or_default(), retry_throttling)
}

fn method_config(value: &Value, path: &str) -> Result<MethodConfig, ConfigError> {
    let entry = object(value, path)?;
    let names = optional(entry, path, "name", |names, path| {
        array(names, path, method_name)
    })?;
    // Both present is refused before either is read.
    let policy = match (field(entry, "retryPolicy"), field(entry, "hedgingPolicy")) {
        (Some(_), Some(_)) => {
            return refuse(
                path,
                "has both a retryPolicy and a hedgingPolicy; A6 allows at most one",
            )
        }
        (Some(_), None) => optional(entry, path, "retryPolicy", retry_policy)?.map(Policy::Retry),
        (None, _) => optional(entry, path, "hedgingPolicy", hedging_policy)?.map(Policy::Hedging),
    };
    let timeout = optional(entry, path, "timeout", |value, path| {
        positive_duration(
            value,
            path,
            "must be more than zero (a zero deadline fails every call)",
        )
    })?;
    let wait_for_ready = optional(entry, path, "waitForReady", |value, path| {
        value
            .as_bool()
            .map_or_else(|| refuse(path, "must be true or false"), Ok)
    })?;
    Ok(MethodConfig {
        names: names.unwrap_or_default(),
        policy,
        timeout,
        wait_for_ready,
    })
}

/// `{service, method}`: `""`, `null` and absent are the same.
fn method_name(value: &Value, path: &str) -> Result<MethodName, ConfigError> {
    let name = object(value, path)?;
    let text = |key: &str| match field(name, key) {
        None => Ok(String::new()),
        Some(Value::String(text)) => Ok(text.clone()),
        Some(_) => refuse(&format!("{path}.{key}"), "must be a string"),
    };
    let service = text("service")?;
    let method = text("method")?;
    if service.is_empty() && !method.is_empty() {
        return refuse(
            &format!("{path}.method"),
            format!(
                "{method:?} has no service; a name without a service is the default and \
                 cannot name a method"
            ),
        );
    }
    Ok(MethodName {
        service,
        method: (!method.is_empty()).then_some(method),
    })
}

fn retry_policy(value: &Value, path: &str) -> Result<RetryPolicyConfig, ConfigError> {
    let policy = object(value, path)?;
    let backoff =
        |value: &Value, path: &str| positive_duration(value, path, "must be more than zero");
    Ok(RetryPolicyConfig {
        max_attempts: required(policy, path, "maxAttempts", max_attempts)?,
        initial_backoff: required(policy, path, "initialBackoff", backoff)?,
        max_backoff: required(policy, path, "maxBackoff", backoff)?,
        backoff_multiplier: required(policy, path, "backoffMultiplier", |value, path| {
            match value.as_f64() {
                None => refuse(path, "must be a number"),
                // A JSON number is finite: no NaN to slip past this comparison.
                Some(multiplier) if multiplier <= 0.0 => {
                    refuse(path, format!("{multiplier} must be more than zero"))
                }
                Some(multiplier) => Ok(multiplier),
            }
        })?,
        retryable_status_codes: required(policy, path, "retryableStatusCodes", |value, path| {
            match status_codes(value, path)? {
                codes if codes.is_empty() => refuse(path, "must list at least one status code"),
                codes if codes.contains(0) => {
                    refuse(path, "must not contain OK: a success is never retried")
                }
                codes => Ok(codes),
            }
        })?,
    })
}

fn hedging_policy(value: &Value, path: &str) -> Result<HedgingPolicyConfig, ConfigError> {
    let policy = object(value, path)?;
    Ok(HedgingPolicyConfig {
        max_attempts: required(policy, path, "maxAttempts", max_attempts)?,
        hedging_delay: optional(policy, path, "hedgingDelay", duration)?.unwrap_or_default(),
        non_fatal_status_codes: optional(policy, path, "nonFatalStatusCodes", status_codes)?
            .unwrap_or_default(),
    })
}

fn retry_throttling(value: &Value, path: &str) -> Result<RetryThrottlingConfig, ConfigError> {
    let throttling = object(value, path)?;
    let max_tokens = required(throttling, path, "maxTokens", |value, path| match integer(
        value, path,
    )? {
        tokens if tokens > 0.0 && tokens <= 1000.0 => Ok(tokens as u32),
        tokens => refuse(path, format!("{tokens} must be in (0, 1000]")),
    })?;
    let token_ratio = required(throttling, path, "tokenRatio", |value, path| {
        let Value::Number(ratio) = value else {
            return refuse(path, "must be a number");
        };
        let Some(positive) = ratio.as_f64().filter(|ratio| *ratio > 0.0) else {
            return refuse(path, format!("{ratio} must be more than zero"));
        };
        match thousandths(positive) {
            0 => refuse(
                path,
                format!(
                    "{ratio} is 0 once cut to three decimals, as A6 reads it; use at least 0.001"
                ),
            ),
            cut => Ok(cut),
        }
    })?;
    Ok(RetryThrottlingConfig {
        max_tokens,
        token_ratio_thousandths: token_ratio.min(MAX_TOKEN_RATIO_THOUSANDTHS) as u32,
    })
}

/// `maxAttempts`: an integer of at least 2; above the limit it is the limit.
fn max_attempts(value: &Value, path: &str) -> Result<u32, ConfigError> {
    match integer(value, path)? {
        attempts if attempts < 2.0 => refuse(
            path,
            format!("{attempts} must be at least 2 (the first attempt and one retry)"),
        ),
        attempts => Ok(attempts.min(f64::from(MAX_ATTEMPTS_LIMIT)) as u32),
    }
}

/// A JSON integer, as an `f64` so that huge values compare without
/// overflow (`1e300` is an integer too, and capped by the caller).
fn integer(value: &Value, path: &str) -> Result<f64, ConfigError> {
    match value.as_f64() {
        None => refuse(path, "must be an integer"),
        Some(number) if number.fract() != 0.0 => {
            refuse(path, format!("{number} must be an integer"))
        }
        Some(number) => Ok(number),
    }
}

/// A duration of more than zero; `zero` is the error for zero.
fn positive_duration(value: &Value, path: &str, zero: &str) -> Result<Duration, ConfigError> {
    match duration(value, path)? {
        duration if duration.is_zero() => refuse(path, zero),
        duration => Ok(duration),
    }
}

fn duration(value: &Value, path: &str) -> Result<Duration, ConfigError> {
    let Some(text) = value.as_str() else {
        return refuse(path, "must be a duration string such as \"0.1s\"");
    };
    parse_proto_duration(text).or_else(|reason| {
        let hint = "write a decimal number of seconds followed by `s`, e.g. \"0.1s\"";
        refuse(path, format!("{text:?}: {reason} ({hint})"))
    })
}

fn status_codes(value: &Value, path: &str) -> Result<StatusCodes, ConfigError> {
    let Some(codes) = value.as_array() else {
        return refuse(path, "must be an array of status codes");
    };
    let mut set = StatusCodes::EMPTY;
    for (i, code) in codes.iter().enumerate() {
        let code_path = format!("{path}[{i}]");
        let number = match code {
            Value::String(name) => match status_code_from_name(name) {
                Some(number) => number,
                None => {
                    let names = STATUS_CODE_NAMES.join(", ");
                    let reason =
                        format!("{name:?} is not a gRPC status code name (one of {names})");
                    return refuse(&code_path, reason);
                }
            },
            Value::Number(number) => match number
                .as_u64()
                .and_then(|code| u32::try_from(code).ok())
                .filter(|&code| StatusCodes::EMPTY.with(code).is_some())
            {
                Some(number) => number,
                None => {
                    return refuse(
                        &code_path,
                        format!("{number} is not a gRPC status code (0-16)"),
                    )
                }
            },
            _ => return refuse(&code_path, "must be a status code number or name"),
        };
        set = set.with(number).unwrap_or(set);
    }
    Ok(set)
}

/// The value of `key`, `None` when absent or `null` (the same in proto3 JSON).
fn field<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    object.get(key).filter(|value| !value.is_null())
}

/// Reads `key` of the object at `path` with `read`, given the value and its
/// path; `None` when the field is absent or `null`.
fn optional<'a, T>(
    object: &'a Map<String, Value>,
    path: &str,
    key: &str,
    read: impl FnOnce(&'a Value, &str) -> Result<T, ConfigError>,
) -> Result<Option<T>, ConfigError> {
    let path = if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    };
    field(object, key)
        .map(|value| read(value, &path))
        .transpose()
}

/// [`optional`], for a field that must be there.
fn required<'a, T>(
    object: &'a Map<String, Value>,
    path: &str,
    key: &str,
    read: impl FnOnce(&'a Value, &str) -> Result<T, ConfigError>,
) -> Result<T, ConfigError> {
    optional(object, path, key, read)?
        .map_or_else(|| refuse(&format!("{path}.{key}"), "is required"), Ok)
}

/// The error refusing the value at `path`, why: `reason`.
fn refuse<T>(path: &str, reason: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError::new(path.to_owned(), reason))
}

/// An array, each item read at its index's path.
fn array<T>(
    value: &Value,
    path: &str,
    read: impl Fn(&Value, &str) -> Result<T, ConfigError>,
) -> Result<Vec<T>, ConfigError> {
    let Some(items) = value.as_array() else {
        return refuse(path, "must be an array");
    };
    let read_at = |(i, item)| read(item, &format!("{path}[{i}]"));
    items.iter().enumerate().map(read_at).collect()
}

fn object<'a>(value: &'a Value, path: &str) -> Result<&'a Map<String, Value>, ConfigError> {
    value
        .as_object()
        .map_or_else(|| refuse(path, "must be a JSON object"), Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(json: &str) -> u64 {
        thousandths(
            serde_json::from_str::<Value>(json)
                .unwrap()
                .as_f64()
                .unwrap(),
        )
    }

    #[test]
    fn token_ratio_keeps_three_decimals_by_cutting() {
        assert_eq!(cut("0.5466"), 546, "A6's own example");
        assert_eq!(cut("0.1"), 100);
        assert_eq!(cut("0.29"), 290, "no floating-point 289.99…");
        assert_eq!(cut("0.0019"), 1);
        assert_eq!(cut("0.0009"), 0);
        assert_eq!(cut("1e-7"), 0);
        assert_eq!(cut("2"), 2000);
        assert_eq!(cut("1.5e2"), 150_000);
        assert_eq!(cut("1e300"), u64::MAX);
        assert_eq!(cut("18446744073709551615"), u64::MAX);
        assert_eq!(cut("-0.5"), 0);
    }
}
