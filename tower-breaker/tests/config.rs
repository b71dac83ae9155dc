//! Configuration from files: unknown keys refused, errors name the field.
#![cfg(feature = "serde")]

use std::time::Duration;

use tower_breaker::{BreakerConfig, Mode};
use tower_classify::ErrorChainClassifier;

fn parse(json: &str) -> Result<BreakerConfig, serde_json::Error> {
    serde_json::from_str(json)
}

#[test]
fn defaults_and_human_durations() {
    let config = parse("{}").unwrap();
    assert_eq!(config, BreakerConfig::default());
    assert_eq!(
        config.recovery_timeout, None,
        "the default backing-off schedule"
    );
    let config = parse(
        r#"{"mode": "metrics_only", "failure_threshold": 3, "recovery_timeout": "1m30s",
            "slow_call_threshold": "250ms", "probes": 2, "slow_start": "2s"}"#,
    )
    .unwrap();
    assert_eq!(config.mode, Mode::MetricsOnly);
    assert_eq!(config.recovery_timeout, Some(Duration::from_secs(90)));
    assert_eq!(config.slow_call_threshold, Some(Duration::from_millis(250)));
    assert_eq!(config.slow_start, Some(Duration::from_secs(2)));
    config
        .builder()
        .unwrap()
        .build(ErrorChainClassifier::new())
        .unwrap();
}

#[test]
fn unknown_keys_are_refused() {
    let err = parse(r#"{"failure_treshold": 3}"#).unwrap_err();
    assert!(err.to_string().contains("failure_treshold"), "{err}");
    let err = parse(r#"{"failure_rate": {"rate": 0.5, "minimum_calls": 5, "window": {"calls": 10, "size": 3}}}"#)
        .unwrap_err();
    assert!(err.to_string().contains("size"), "{err}");
    let err = parse(r#"{"recovery_timeout": "30"}"#).unwrap_err();
    assert!(err.to_string().contains("unit"), "{err}");
}

#[test]
fn an_adaptive_throttle_from_a_file() {
    let config = parse(r#"{"adaptive_throttle": {"window": {"calls": 100}}}"#).unwrap();
    let throttle = config.adaptive_throttle.as_ref().unwrap();
    assert_eq!(throttle.k, 2.0, "the SRE book's k by default");
    config
        .builder()
        .unwrap()
        .build(ErrorChainClassifier::new())
        .unwrap();
}

#[test]
fn invalid_values_name_their_field() {
    let field = |json: &str| {
        let config = parse(json).unwrap();
        match config.builder() {
            Err(err) => err.field().to_owned(),
            Ok(builder) => builder
                .build(ErrorChainClassifier::new())
                .unwrap_err()
                .field()
                .to_owned(),
        }
    };
    assert_eq!(field(r#"{"failure_threshold": 0}"#), "failure_threshold");
    assert_eq!(field(r#"{"probes": 0}"#), "probes");
    assert_eq!(field(r#"{"recovery_jitter": 1.5}"#), "recovery_jitter");
    assert_eq!(
        field(r#"{"recovery_timeout": "1m", "max_recovery_timeout": "10s"}"#),
        "max_recovery_timeout"
    );
    assert_eq!(
        field(
            r#"{"failure_threshold": 3, "failure_rate": {"rate": 0.5, "minimum_calls": 5, "window": {"calls": 10}}}"#
        ),
        "failure_rate"
    );
    assert_eq!(
        field(r#"{"failure_threshold": 3, "adaptive_throttle": {"window": {"calls": 100}}}"#),
        "adaptive_throttle"
    );
    assert_eq!(
        field(r#"{"adaptive_throttle": {"k": 0.5, "window": {"calls": 100}}}"#),
        "adaptive_throttle.k"
    );
    assert_eq!(
        field(r#"{"adaptive_throttle": {"window": {"calls": 0}}}"#),
        "adaptive_throttle.window"
    );
    assert_eq!(
        field(r#"{"failure_rate": {"rate": 0.5, "minimum_calls": 5, "window": {}}}"#),
        "failure_rate.window.calls"
    );
    assert_eq!(
        field(r#"{"failure_rate": {"rate": 0, "minimum_calls": 5, "window": {"length": "1m"}}}"#),
        "failure_rate.rate"
    );
    assert_eq!(
        field(
            r#"{"failure_rate": {"rate": 0.5, "minimum_calls": 5, "window": {"length": "1m", "buckets": 0}}}"#
        ),
        "failure_rate.window.buckets"
    );
    assert_eq!(field(r#"{"max_breakers": 0}"#), "max_breakers");
}

/// `metrics_label_per_key` labels each keyed breaker's metrics with its key;
/// without it, they carry the layer's name.
#[test]
fn metrics_label_per_key_labels_keyed_breakers_by_key() {
    use futures_util::FutureExt;
    use metrics_util::debugging::DebuggingRecorder;
    use tower::{service_fn, Layer, Service};

    let state_labels = |json: &str| {
        let config = parse(json).unwrap();
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            let layer = config
                .builder()
                .unwrap()
                .build_keyed(ErrorChainClassifier::new(), |req: &&'static str| *req)
                .unwrap();
            let mut svc = layer.layer(service_fn(|_: &'static str| async {
                Ok::<_, std::io::Error>(())
            }));
            svc.call("crm.example").now_or_never().unwrap().unwrap();
        });
        let mut labels: Vec<String> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == "tower_breaker_state")
            .flat_map(|(key, ..)| {
                key.key()
                    .labels()
                    .map(|label| label.value().to_owned())
                    .collect::<Vec<_>>()
            })
            .collect();
        labels.sort();
        labels
    };
    assert_eq!(
        state_labels(r#"{"name": "upstreams", "metrics_label_per_key": true}"#),
        ["crm.example"]
    );
    assert_eq!(state_labels(r#"{"name": "upstreams"}"#), ["upstreams"]);
}
