//! Response rules: throttling an API signals without a 429.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, StatusCode};
use serde_json::Value;

use super::status::StatusSet;
use crate::error::ConfigError;
use crate::hint::{header_name, json_number, BackoffFrom, JsonPath};
use crate::outcome::{Failure, FailureKind, RetryHint};

/// Turns a response an API uses to signal throttling (a 400 with
/// `error.code: 17`, a 200 with `THROTTLED` in its body) into
/// [`RateLimited`](FailureKind::RateLimited).
///
/// A rule matches when the status is in its set (or, with
/// [`match_success`](ResponseRuleBuilder::match_success), is 2xx) **and** its
/// condition holds: a header is present or equals one of some values, or a
/// JSON body path selects one of some values. A body rule reads only a
/// buffered body (`Bytes`, `Vec<u8>`, `String`); against a streaming one it
/// does not match.
///
/// ```
/// use http::{Response, StatusCode};
/// use serde_json::json;
/// use tower_classify::http::ResponseRule;
/// use tower_classify::{BoxError, Classify, FailureKind, HttpClassifier};
///
/// let rule = ResponseRule::builder()
///     .statuses([400, 403])
///     .body_path("$.error.code", [json!(17), json!(80004)])
///     .build()
///     .unwrap();
/// let classifier = HttpClassifier::new().with_rules([rule]);
///
/// let throttled = Response::builder()
///     .status(StatusCode::BAD_REQUEST)
///     .body(bytes::Bytes::from_static(br#"{"error":{"code":17}}"#))
///     .unwrap();
/// let outcome = Classify::<_, BoxError>::classify(&classifier, Ok(&throttled));
/// assert_eq!(outcome.as_failure().unwrap().kind, FailureKind::RateLimited);
/// ```
#[derive(Debug, Clone)]
pub struct ResponseRule {
    statuses: StatusSet,
    match_success: bool,
    condition: Condition,
    backoff: Option<Duration>,
    backoff_from: Option<BackoffFrom>,
}

#[derive(Debug, Clone)]
enum Condition {
    /// The header is present (`values` empty) or equals one of `values`.
    Header {
        name: HeaderName,
        values: Vec<String>,
    },
    /// The path selects one of `values`.
    BodyPath { path: JsonPath, values: Vec<Value> },
    /// The status alone decides.
    Status,
}

impl ResponseRule {
    /// Starts a rule.
    pub fn builder() -> ResponseRuleBuilder {
        ResponseRuleBuilder::default()
    }

    /// The failure this rule makes of a response, if it matches.
    pub(crate) fn check(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        body: Option<&[u8]>,
        now: SystemTime,
    ) -> Option<Failure> {
        let status_matches =
            self.statuses.contains(status) || (self.match_success && status.is_success());
        if !status_matches || !self.condition_holds(headers, body) {
            return None;
        }
        let hint = self
            .backoff_from
            .as_ref()
            .and_then(|reader| reader.read(headers, body, now))
            .or(self.backoff)
            .map(RetryHint::After);
        Some(Failure::new(FailureKind::RateLimited).with_hint_opt(hint))
    }

    fn condition_holds(&self, headers: &HeaderMap, body: Option<&[u8]>) -> bool {
        match &self.condition {
            Condition::Status => true,
            Condition::Header { name, values } => {
                let mut present = headers.get_all(name).iter().peekable();
                if values.is_empty() {
                    return present.peek().is_some();
                }
                present.any(|value| {
                    value
                        .to_str()
                        .is_ok_and(|value| values.iter().any(|v| v == value.trim()))
                })
            }
            Condition::BodyPath { path, values } => {
                let Some(document) = body.and_then(|b| serde_json::from_slice::<Value>(b).ok())
                else {
                    return false;
                };
                path.select(&document)
                    .into_iter()
                    .any(|found| values.iter().any(|want| json_equals(found, want)))
            }
        }
    }
}

/// JSON equality that also lets a configured `"17"` match a body's `17` (and
/// the reverse), read as [`json_number`] reads a wait.
fn json_equals(found: &Value, want: &Value) -> bool {
    match (found, want) {
        (Value::Number(_), Value::Number(_) | Value::String(_))
        | (Value::String(_), Value::Number(_)) => json_number(found) == json_number(want),
        _ => found == want,
    }
}

/// Builds a [`ResponseRule`]; [`build`](Self::build) checks it.
#[derive(Debug, Default)]
pub struct ResponseRuleBuilder {
    statuses: Vec<u16>,
    match_success: bool,
    header: Option<(String, Vec<String>)>,
    body_path: Option<(String, Vec<Value>)>,
    backoff: Option<Duration>,
    backoff_from: Option<BackoffFrom>,
}

impl ResponseRuleBuilder {
    /// The statuses the rule applies to.
    pub fn statuses(mut self, statuses: impl IntoIterator<Item = u16>) -> Self {
        self.statuses.extend(statuses);
        self
    }

    /// Also apply the rule to 2xx responses (a success rule must name a header
    /// or body path, or it would turn every success into a retry).
    pub fn match_success(mut self, yes: bool) -> Self {
        self.match_success = yes;
        self
    }

    /// The rule holds when header `name` is present.
    pub fn header_present(mut self, name: impl Into<String>) -> Self {
        self.header = Some((name.into(), Vec::new()));
        self
    }

    /// The rule holds when header `name` equals one of `values`.
    pub fn header_equals<V: Into<String>>(
        mut self,
        name: impl Into<String>,
        values: impl IntoIterator<Item = V>,
    ) -> Self {
        self.header = Some((name.into(), values.into_iter().map(Into::into).collect()));
        self
    }

    /// The rule holds when the JSON body's `path` selects one of `values`.
    pub fn body_path(
        mut self,
        path: impl Into<String>,
        values: impl IntoIterator<Item = Value>,
    ) -> Self {
        self.body_path = Some((path.into(), values.into_iter().collect()));
        self
    }

    /// A fixed wait for matching responses (`backoff_secs` in a configuration), used
    /// when [`backoff_from`](Self::backoff_from) reads nothing.
    pub fn backoff(mut self, wait: Duration) -> Self {
        self.backoff = Some(wait);
        self
    }

    /// Reads the wait from the response.
    pub fn backoff_from(mut self, reader: BackoffFrom) -> Self {
        self.backoff_from = Some(reader);
        self
    }

    /// Checks the rule. Every refusal names the field.
    pub fn build(self) -> Result<ResponseRule, ConfigError> {
        let statuses = StatusSet::from_codes("status", self.statuses)?;
        if statuses.is_empty() && !self.match_success {
            return Err(ConfigError::new(
                "status",
                "a rule must name at least one status, or set `match_success`",
            ));
        }
        let condition = match (self.header, self.body_path) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    "body_path",
                    "a rule checks either a header or a body path, not both",
                ))
            }
            (Some((name, values)), None) => Condition::Header {
                name: header_name("header", &name)?,
                values,
            },
            (None, Some((path, values))) => {
                if values.is_empty() {
                    return Err(ConfigError::new("values", "a body path needs values to match"));
                }
                Condition::BodyPath {
                    path: JsonPath::parse("body_path", &path)?,
                    values,
                }
            }
            (None, None) if self.match_success => {
                return Err(ConfigError::new(
                    "match_success",
                    "a success rule must set `header` or `body_path`; otherwise every success would be retried",
                ))
            }
            (None, None) => Condition::Status,
        };
        Ok(ResponseRule {
            statuses,
            match_success: self.match_success,
            condition,
            backoff: self.backoff,
            backoff_from: self.backoff_from,
        })
    }
}
