//! Configuration: unknown keys and invalid values are refused, naming the field.

use std::time::Duration;

use http::Response;
use serde_json::json;
use tower_classify::config::HttpClassifierConfig;
use tower_classify::{BoxError, Classify, FailureKind, RetryOn};

#[test]
fn config_refuses_unknown_keys_naming_them() {
    let err = serde_json::from_str::<HttpClassifierConfig>(r#"{"retry_on_responses": []}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("retry_on_responses"), "{err}");
    let err = serde_json::from_str::<HttpClassifierConfig>(
        r#"{"retry_on_response": [{"status": [400], "bodypath": "$.a"}]}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("bodypath"), "{err}");
    let err = serde_json::from_str::<HttpClassifierConfig>(
        r#"{"retry_on_response": [{"status": [400], "header": "x",
            "backoff_from": {"type": "header", "config": {"name": "x", "unit": "fortnights"}}}]}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("fortnights"), "{err}");
}

#[test]
fn config_refuses_an_empty_retry_on() {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Policy {
        retry_on: RetryOn,
    }
    let err = serde_json::from_str::<Policy>(r#"{"retry_on": []}"#)
        .err()
        .expect("an empty retry_on is refused")
        .to_string();
    assert!(err.contains("retry_on"), "{err}");
    let err = serde_json::from_str::<Policy>(r#"{"retry_on": ["http_5xx", "teapot"]}"#)
        .err()
        .expect("an unknown class is refused")
        .to_string();
    assert!(err.contains("teapot"), "{err}");
    let ok = serde_json::from_str::<Policy>(r#"{"retry_on": ["timeout"]}"#).unwrap();
    assert!(ok.retry_on.contains(FailureKind::Timeout));
    // Written as its names, in a fixed order, `connection` holding `not_sent`.
    assert_eq!(
        serde_json::to_value(RetryOn::default()).unwrap(),
        json!([
            "http_5xx",
            "rate_limited",
            "connection",
            "timeout",
            "not_sent"
        ])
    );
}

#[test]
fn config_validation_names_the_nested_field() {
    let config: HttpClassifierConfig = serde_json::from_value(json!({
        "retry_on_response": [
            {"status": [400], "header": "x-limit"},
            {"match_success": true}
        ]
    }))
    .unwrap();
    let err = config.build().unwrap_err();
    assert_eq!(err.field(), "retry_on_response[1].match_success");
    let config: HttpClassifierConfig =
        serde_json::from_value(json!({"retryable_statuses": [429, 42]})).unwrap();
    assert_eq!(config.build().unwrap_err().field(), "retryable_statuses");
    let config: HttpClassifierConfig =
        serde_json::from_value(json!({"retryable_statuses": [429, 1000]})).unwrap();
    assert_eq!(config.build().unwrap_err().field(), "retryable_statuses");
    let err = serde_json::from_value::<HttpClassifierConfig>(json!({
        "retry_on_response": [{"status": [400], "header": "x", "backoff": "soon"}]
    }))
    .unwrap_err()
    .to_string();
    assert!(err.contains("soon"), "{err}");
    // A rule that checks both a header and a body path is refused for that,
    // even when it has other faults (here: no status), naming `body_path`.
    let config: HttpClassifierConfig = serde_json::from_value(json!({
        "retry_on_response": [{"header": "x-limit", "body_path": "$.error"}]
    }))
    .unwrap();
    let err = config.build().unwrap_err();
    assert_eq!(err.field(), "retry_on_response[0].body_path");
    assert!(err.to_string().contains("not both"), "{err}");
}

#[test]
fn config_builds_a_working_classifier() {
    let config: HttpClassifierConfig = serde_json::from_value(json!({
        "retry_on_response": [{
            "status": [403, 429],
            "header": "x-ratelimit-remaining",
            "values": ["0"],
            "backoff_from": {"type": "header", "config": {"name": "x-ratelimit-reset", "unit": "seconds"}}
        }]
    }))
    .unwrap();
    let classifier = config.build().unwrap();
    let response = Response::builder()
        .status(403)
        .header("x-ratelimit-remaining", "0")
        .header("x-ratelimit-reset", "12")
        .body(())
        .unwrap();
    let outcome = Classify::<_, BoxError>::classify(&classifier, Ok(&response));
    let failure = *outcome.as_failure().unwrap();
    assert_eq!(failure.kind, FailureKind::RateLimited);
    assert_eq!(failure.retry_after(), Some(Duration::from_secs(12)));
    // Round trip: what serializes deserializes to the same configuration.
    let text = serde_json::to_string(&config).unwrap();
    assert_eq!(
        serde_json::from_str::<HttpClassifierConfig>(&text).unwrap(),
        config
    );
}
