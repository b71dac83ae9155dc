//! Reading a service config from JSON, with A6's validation rules; every
//! error names the JSON path of the value it refuses.

use serde_json::{Map, Number, Value};
use tower_classify::ConfigError;

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
    let mut method_configs = Vec::new();
    if let Some(entries) = field(root, "methodConfig") {
        let entries = entries
            .as_array()
            .ok_or_else(|| ConfigError::new("methodConfig", "must be an array"))?;
        for (i, entry) in entries.iter().enumerate() {
            method_configs.push(method_config(entry, &format!("methodConfig[{i}]"))?);
        }
    }
    let retry_throttling = field(root, "retryThrottling")
        .map(|value| retry_throttling(value, "retryThrottling"))
        .transpose()?;
    ServiceConfig::new(method_configs, retry_throttling)
}

fn method_config(value: &Value, path: &str) -> Result<MethodConfig, ConfigError> {
    let entry = object(value, path)?;
    let names = match field(entry, "name") {
        None => Vec::new(),
        Some(names) => {
            let names = names
                .as_array()
                .ok_or_else(|| ConfigError::new(format!("{path}.name"), "must be an array"))?;
            names
                .iter()
                .enumerate()
                .map(|(i, name)| method_name(name, &format!("{path}.name[{i}]")))
                .collect::<Result<_, _>>()?
        }
    };
    let policy = match (field(entry, "retryPolicy"), field(entry, "hedgingPolicy")) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::new(
                path.to_owned(),
                "has both a retryPolicy and a hedgingPolicy; A6 allows at most one",
            ))
        }
        (Some(retry), None) => Some(Policy::Retry(retry_policy(
            retry,
            &format!("{path}.retryPolicy"),
        )?)),
        (None, Some(hedging)) => Some(Policy::Hedging(hedging_policy(
            hedging,
            &format!("{path}.hedgingPolicy"),
        )?)),
        (None, None) => None,
    };
    let timeout = match field(entry, "timeout") {
        None => None,
        Some(value) => {
            let timeout_path = format!("{path}.timeout");
            let timeout = duration(value, &timeout_path)?;
            if timeout.is_zero() {
                return Err(ConfigError::new(
                    timeout_path,
                    "must be more than zero (a zero deadline fails every call)",
                ));
            }
            Some(timeout)
        }
    };
    let wait_for_ready = field(entry, "waitForReady")
        .map(|value| {
            value.as_bool().ok_or_else(|| {
                ConfigError::new(format!("{path}.waitForReady"), "must be true or false")
            })
        })
        .transpose()?;
    Ok(MethodConfig {
        names,
        policy,
        timeout,
        wait_for_ready,
    })
}

/// `{service, method}`: `""`, `null` and absent are the same.
fn method_name(value: &Value, path: &str) -> Result<MethodName, ConfigError> {
    let name = object(value, path)?;
    let text = |key: &str| -> Result<String, ConfigError> {
        match field(name, key) {
            None => Ok(String::new()),
            Some(Value::String(text)) => Ok(text.clone()),
            Some(_) => Err(ConfigError::new(
                format!("{path}.{key}"),
                "must be a string",
            )),
        }
    };
    let service = text("service")?;
    let method = text("method")?;
    if service.is_empty() && !method.is_empty() {
        return Err(ConfigError::new(
            format!("{path}.method"),
            format!(
                "{method:?} has no service; a name without a service is the default and \
                 cannot name a method"
            ),
        ));
    }
    Ok(MethodName {
        service,
        method: (!method.is_empty()).then_some(method),
    })
}

fn retry_policy(value: &Value, path: &str) -> Result<RetryPolicyConfig, ConfigError> {
    let policy = object(value, path)?;
    let max_attempts = max_attempts(
        required(policy, "maxAttempts", path)?,
        &format!("{path}.maxAttempts"),
    )?;
    let backoff = |key: &str| -> Result<std::time::Duration, ConfigError> {
        let field_path = format!("{path}.{key}");
        let backoff = duration(required(policy, key, path)?, &field_path)?;
        if backoff.is_zero() {
            return Err(ConfigError::new(field_path, "must be more than zero"));
        }
        Ok(backoff)
    };
    let initial_backoff = backoff("initialBackoff")?;
    let max_backoff = backoff("maxBackoff")?;
    let multiplier_path = format!("{path}.backoffMultiplier");
    let backoff_multiplier = required(policy, "backoffMultiplier", path)?
        .as_f64()
        .ok_or_else(|| ConfigError::new(multiplier_path.clone(), "must be a number"))?;
    // A JSON number is finite: no NaN to slip past this comparison.
    if backoff_multiplier <= 0.0 {
        return Err(ConfigError::new(
            multiplier_path,
            format!("{backoff_multiplier} must be more than zero"),
        ));
    }
    let codes_path = format!("{path}.retryableStatusCodes");
    let retryable_status_codes =
        status_codes(required(policy, "retryableStatusCodes", path)?, &codes_path)?;
    if retryable_status_codes.is_empty() {
        return Err(ConfigError::new(
            codes_path,
            "must list at least one status code",
        ));
    }
    if retryable_status_codes.contains(0) {
        return Err(ConfigError::new(
            codes_path,
            "must not contain OK: a success is never retried",
        ));
    }
    Ok(RetryPolicyConfig {
        max_attempts,
        initial_backoff,
        max_backoff,
        backoff_multiplier,
        retryable_status_codes,
    })
}

fn hedging_policy(value: &Value, path: &str) -> Result<HedgingPolicyConfig, ConfigError> {
    let policy = object(value, path)?;
    let max_attempts = max_attempts(
        required(policy, "maxAttempts", path)?,
        &format!("{path}.maxAttempts"),
    )?;
    let hedging_delay = field(policy, "hedgingDelay")
        .map(|value| duration(value, &format!("{path}.hedgingDelay")))
        .transpose()?
        .unwrap_or_default();
    let non_fatal_status_codes = field(policy, "nonFatalStatusCodes")
        .map(|value| status_codes(value, &format!("{path}.nonFatalStatusCodes")))
        .transpose()?
        .unwrap_or_default();
    Ok(HedgingPolicyConfig {
        max_attempts,
        hedging_delay,
        non_fatal_status_codes,
    })
}

fn retry_throttling(value: &Value, path: &str) -> Result<RetryThrottlingConfig, ConfigError> {
    let throttling = object(value, path)?;
    let tokens_path = format!("{path}.maxTokens");
    let max_tokens = integer(required(throttling, "maxTokens", path)?, &tokens_path)?;
    if !(max_tokens > 0.0 && max_tokens <= 1000.0) {
        return Err(ConfigError::new(
            tokens_path,
            format!("{max_tokens} must be in (0, 1000]"),
        ));
    }
    let ratio_path = format!("{path}.tokenRatio");
    let ratio = match required(throttling, "tokenRatio", path)? {
        Value::Number(number) => number,
        _ => return Err(ConfigError::new(ratio_path, "must be a number")),
    };
    if !(ratio.as_f64().is_some_and(|ratio| ratio > 0.0)) {
        return Err(ConfigError::new(
            ratio_path,
            format!("{ratio} must be more than zero"),
        ));
    }
    let thousandths = truncated_thousandths(ratio).ok_or_else(|| {
        ConfigError::new(
            ratio_path.clone(),
            format!("{ratio} is not a decimal number"),
        )
    })?;
    if thousandths == 0 {
        return Err(ConfigError::new(
            ratio_path,
            format!("{ratio} is 0 once cut to three decimals, as A6 reads it; use at least 0.001"),
        ));
    }
    Ok(RetryThrottlingConfig {
        max_tokens: max_tokens as u32,
        token_ratio_thousandths: thousandths.min(MAX_TOKEN_RATIO_THOUSANDTHS) as u32,
    })
}

/// `maxAttempts`: an integer of at least 2; above the limit it is the limit.
fn max_attempts(value: &Value, path: &str) -> Result<u32, ConfigError> {
    let attempts = integer(value, path)?;
    if attempts < 2.0 {
        return Err(ConfigError::new(
            path.to_owned(),
            format!("{attempts} must be at least 2 (the first attempt and one retry)"),
        ));
    }
    Ok(attempts.min(f64::from(MAX_ATTEMPTS_LIMIT)) as u32)
}

/// A JSON integer, as an `f64` so that huge values compare without
/// overflow (`1e300` is an integer too, and capped by the caller).
fn integer(value: &Value, path: &str) -> Result<f64, ConfigError> {
    let number = value
        .as_f64()
        .ok_or_else(|| ConfigError::new(path.to_owned(), "must be an integer"))?;
    if number.fract() != 0.0 {
        return Err(ConfigError::new(
            path.to_owned(),
            format!("{number} must be an integer"),
        ));
    }
    Ok(number)
}

fn duration(value: &Value, path: &str) -> Result<std::time::Duration, ConfigError> {
    let text = value.as_str().ok_or_else(|| {
        ConfigError::new(
            path.to_owned(),
            "must be a duration string such as \"0.1s\"",
        )
    })?;
    parse_proto_duration(text)
        .map_err(|err| ConfigError::new(path.to_owned(), format!("{text:?}: {err}")))
}

fn status_codes(value: &Value, path: &str) -> Result<StatusCodes, ConfigError> {
    let codes = value
        .as_array()
        .ok_or_else(|| ConfigError::new(path.to_owned(), "must be an array of status codes"))?;
    let mut set = StatusCodes::EMPTY;
    for (i, code) in codes.iter().enumerate() {
        let number = match code {
            Value::String(name) => status_code_from_name(name).ok_or_else(|| {
                ConfigError::new(
                    format!("{path}[{i}]"),
                    format!(
                        "{name:?} is not a gRPC status code name (one of {})",
                        STATUS_CODE_NAMES.join(", ")
                    ),
                )
            })?,
            Value::Number(number) => number
                .as_u64()
                .and_then(|code| u32::try_from(code).ok())
                .filter(|&code| StatusCodes::EMPTY.with(code).is_some())
                .ok_or_else(|| {
                    ConfigError::new(
                        format!("{path}[{i}]"),
                        format!("{number} is not a gRPC status code (0-16)"),
                    )
                })?,
            _ => {
                return Err(ConfigError::new(
                    format!("{path}[{i}]"),
                    "must be a status code number or name",
                ))
            }
        };
        set = set.with(number).unwrap_or(set);
    }
    Ok(set)
}

/// `floor(ratio × 1000)`, computed on the number's decimal digits rather
/// than in floating point, where `0.29 × 1000` is `289.99…`. The digits
/// are those of the shortest form that reads back as the same `f64`, which
/// for any ratio written with up to 15 significant digits is the ratio as
/// written. `None` for a form that is not a plain decimal (cannot happen for
/// a JSON number).
fn truncated_thousandths(ratio: &Number) -> Option<u64> {
    let text = ratio.to_string();
    let (mantissa, exponent) = match text.split_once(['e', 'E']) {
        Some((mantissa, exponent)) => (mantissa, exponent.parse::<i64>().ok()?),
        None => (&text[..], 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if !whole
        .bytes()
        .chain(fraction.bytes())
        .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    // Keep the digits up to the third after the decimal point.
    let keep = whole.len() as i64 + exponent.clamp(-1000, 1000) + 3;
    if keep <= 0 {
        return Some(0);
    }
    let digits = whole.bytes().chain(fraction.bytes());
    let kept = digits.clone().count().min(keep as usize);
    let mut value = digits.take(kept).fold(0u64, |acc, digit| {
        acc.saturating_mul(10)
            .saturating_add(u64::from(digit - b'0'))
    });
    for _ in kept as i64..keep.min(40) {
        value = value.saturating_mul(10);
    }
    Some(value)
}

/// The value of `key`, `None` when absent or `null` (the same in proto3 JSON).
fn field<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    object.get(key).filter(|value| !value.is_null())
}

fn required<'a>(
    object: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<&'a Value, ConfigError> {
    field(object, key).ok_or_else(|| ConfigError::new(format!("{path}.{key}"), "is required"))
}

fn object<'a>(value: &'a Value, path: &str) -> Result<&'a Map<String, Value>, ConfigError> {
    value
        .as_object()
        .ok_or_else(|| ConfigError::new(path.to_owned(), "must be a JSON object"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thousandths(json: &str) -> Option<u64> {
        match serde_json::from_str::<Value>(json).unwrap() {
            Value::Number(number) => truncated_thousandths(&number),
            _ => unreachable!(),
        }
    }

    #[test]
    fn token_ratio_keeps_three_decimals_by_cutting() {
        assert_eq!(thousandths("0.5466"), Some(546), "A6's own example");
        assert_eq!(thousandths("0.1"), Some(100));
        assert_eq!(thousandths("0.29"), Some(290), "no floating-point 289.99…");
        assert_eq!(thousandths("0.0019"), Some(1));
        assert_eq!(thousandths("0.0009"), Some(0));
        assert_eq!(thousandths("1e-7"), Some(0));
        assert_eq!(thousandths("2"), Some(2000));
        assert_eq!(thousandths("1.5e2"), Some(150_000));
        assert_eq!(thousandths("1e300"), Some(u64::MAX));
    }
}
