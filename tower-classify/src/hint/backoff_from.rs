//! `backoff_from`: reading the wait an API states in its response.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName};
use serde_json::Value;

use super::instant::{epoch_ms, parse_rfc3339, wait_until};
use super::json_path::JsonPath;
use super::parse_http_date;
use crate::error::ConfigError;

/// How a stated wait is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize, serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum WaitUnit {
    /// A relative wait in seconds.
    Seconds,
    /// A relative wait in milliseconds.
    Ms,
    /// A relative wait in minutes.
    Minutes,
    /// An absolute instant in seconds since the Unix epoch.
    EpochS,
    /// An absolute instant in milliseconds since the Unix epoch.
    EpochMs,
    /// An absolute instant as an RFC 3339 timestamp.
    Rfc3339,
}

impl WaitUnit {
    /// Reads `value` (a JSON number, or a string holding one or a timestamp)
    /// as a wait. Absolute instants are measured from `base` (the response's
    /// `Date`, or the local clock); an instant in the past is zero. `None` when
    /// the value is missing, negative or unreadable.
    pub(crate) fn wait(self, value: &Value, base: SystemTime) -> Option<Duration> {
        let (unit_ms, absolute) = match self {
            WaitUnit::Rfc3339 => {
                let at = parse_rfc3339(value.as_str()?)?;
                return Some(wait_until(at, epoch_ms(base)));
            }
            WaitUnit::Seconds => (1_000.0, false),
            WaitUnit::Ms => (1.0, false),
            WaitUnit::Minutes => (60_000.0, false),
            WaitUnit::EpochS => (1_000.0, true),
            WaitUnit::EpochMs => (1.0, true),
        };
        let number = json_number(value)?;
        // `as` saturates: an absurd instant or wait is a very long wait (a
        // relative one that is not finite, or negative, is none).
        let ms = number * unit_ms;
        if absolute {
            number
                .is_finite()
                .then(|| wait_until(ms.ceil() as i128, epoch_ms(base)))
        } else {
            (ms.is_finite() && ms >= 0.0).then(|| Duration::from_millis(ms.ceil() as u64))
        }
    }
}

/// A JSON number, or a string holding one: configuration formats and APIs
/// often cannot say which one they meant.
pub(crate) fn json_number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(number) => number.as_f64(),
        Value::String(text) => text.trim().parse().ok(),
        _ => None,
    }
}

/// Where a response states how long to wait.
///
/// A missing or unreadable value reads as no hint, so the next source in line
/// (`Retry-After`, then the computed backoff) decides.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum BackoffFrom {
    /// A header value.
    Header {
        /// The header.
        name: HeaderName,
        /// How the value is written.
        unit: WaitUnit,
    },
    /// A JSON-valued header, at a path.
    HeaderJson {
        /// The header.
        name: HeaderName,
        /// Where in the header's JSON the value is.
        path: JsonPath,
        /// How the value is written.
        unit: WaitUnit,
    },
    /// A value in the JSON body.
    Body {
        /// Where in the body the value is.
        path: JsonPath,
        /// How the value is written.
        unit: WaitUnit,
    },
    /// A leaky-bucket cost report in the JSON body: wait
    /// `ceil((requested − available) / restore_rate)` seconds.
    CostBucket {
        /// The cost the request asked for.
        requested: JsonPath,
        /// The cost currently available.
        available: JsonPath,
        /// Cost restored per second.
        restore_rate: JsonPath,
    },
}

impl BackoffFrom {
    /// Reads from a header; a bad header name is refused naming `backoff_from.name`.
    pub fn header(name: &str, unit: WaitUnit) -> Result<Self, ConfigError> {
        let name = header_name("backoff_from.name", name)?;
        Ok(BackoffFrom::Header { name, unit })
    }

    /// Reads from a JSON-valued header at `path`.
    pub fn header_json(name: &str, path: &str, unit: WaitUnit) -> Result<Self, ConfigError> {
        Ok(BackoffFrom::HeaderJson {
            name: header_name("backoff_from.name", name)?,
            path: JsonPath::parse("backoff_from.path", path)?,
            unit,
        })
    }

    /// Reads from the JSON body at `path`.
    pub fn body(path: &str, unit: WaitUnit) -> Result<Self, ConfigError> {
        Ok(BackoffFrom::Body {
            path: JsonPath::parse("backoff_from.path", path)?,
            unit,
        })
    }

    /// Reads a leaky-bucket cost report from the JSON body.
    pub fn cost_bucket(
        requested: &str,
        available: &str,
        restore_rate: &str,
    ) -> Result<Self, ConfigError> {
        Ok(BackoffFrom::CostBucket {
            requested: JsonPath::parse("backoff_from.requested", requested)?,
            available: JsonPath::parse("backoff_from.available", available)?,
            restore_rate: JsonPath::parse("backoff_from.restore_rate", restore_rate)?,
        })
    }

    /// The wait this response states, if it states one readably. Absolute
    /// instants are measured from the response's `Date` header when present,
    /// else from `now`.
    pub fn read(
        &self,
        headers: &HeaderMap,
        body: Option<&[u8]>,
        now: SystemTime,
    ) -> Option<Duration> {
        let base = headers
            .get(http::header::DATE)
            .and_then(|date| parse_http_date(date.as_bytes()))
            .unwrap_or(now);
        // The two JSON readers: the value at `path` of the `json` document.
        let (json, path, unit) = match self {
            BackoffFrom::Header { name, unit } => {
                let text = headers.get(name)?.to_str().ok()?;
                return unit.wait(&Value::String(text.to_owned()), base);
            }
            BackoffFrom::HeaderJson { name, path, unit } => {
                (headers.get(name)?.as_bytes(), path, unit)
            }
            BackoffFrom::Body { path, unit } => (body?, path, unit),
            BackoffFrom::CostBucket {
                requested,
                available,
                restore_rate,
            } => {
                let document: Value = serde_json::from_slice(body?).ok()?;
                let number = |path: &JsonPath| path.first(&document)?.as_f64();
                return cost_bucket_wait(
                    number(requested)?,
                    number(available)?,
                    number(restore_rate)?,
                );
            }
        };
        let document: Value = serde_json::from_slice(json).ok()?;
        unit.wait(path.first(&document)?, base)
    }
}

/// The leaky-bucket wait: `ceil((requested − available) / restore_rate)`
/// seconds, zero when enough is available, `None` when the report makes no
/// sense (a rate that is not positive, a value that is not finite).
fn cost_bucket_wait(requested: f64, available: f64, restore_rate: f64) -> Option<Duration> {
    if !(requested.is_finite() && available.is_finite() && restore_rate.is_finite())
        || restore_rate <= 0.0
    {
        return None;
    }
    let missing = requested - available;
    if missing <= 0.0 {
        return Some(Duration::ZERO);
    }
    // Finite inputs can still divide to infinity; `as` saturates, so such a
    // report reads as the longest wait rather than as no hint.
    let seconds = (missing / restore_rate).ceil();
    Some(Duration::from_millis((seconds * 1_000.0) as u64))
}

/// `name` as a header name, or the configuration error naming `field`.
pub(crate) fn header_name(field: &'static str, name: &str) -> Result<HeaderName, ConfigError> {
    HeaderName::try_from(name)
        .map_err(|_| ConfigError::new(field, format!("{name:?} is not a header name")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cost_report_with_a_value_that_is_not_finite_states_no_wait() {
        assert_eq!(cost_bucket_wait(f64::NAN, 0.0, 1.0), None);
        assert_eq!(cost_bucket_wait(f64::INFINITY, 0.0, 1.0), None);
        assert_eq!(cost_bucket_wait(1.0, 0.0, f64::INFINITY), None);
    }
}
