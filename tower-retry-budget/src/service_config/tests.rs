//! gRPC service configs (gRFC A6): the examples of the A6 text and of
//! gRPC's service config docs as fixtures, every validation rule, method
//! selection, throttling, pushback, and the retry layer built from a policy.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::budget::TokenBucketBudget;
use crate::error::WaitTooLong;
use crate::service_config::{GrpcRetryClassifier, MethodConfig, ServiceConfig, StatusCodes};
use http::{HeaderMap, Request, Response, StatusCode};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_classify::hint::parse_grpc_pushback;
use tower_classify::{BoxError, Classify, GrpcClassifier, Outcome, RetryHint};

const MS: fn(u64) -> Duration = Duration::from_millis;

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{path}: {err}"))
}

fn config(name: &str) -> ServiceConfig {
    ServiceConfig::from_json(&fixture(name)).unwrap_or_else(|err| panic!("{name}: {err}"))
}

fn codes(list: &[u32]) -> StatusCodes {
    list.iter()
        .fold(StatusCodes::EMPTY, |set, &code| set.with(code).unwrap())
}

// ===== the examples of the A6 text

#[test]
fn a6_retry_policy_example() {
    let config = config("a6_retry_policy.json");
    let method = config.method_config("/example.Service/Any").unwrap();
    let retry = method.retry_policy().unwrap();
    assert_eq!(retry.max_attempts, 4);
    assert_eq!(retry.initial_backoff, MS(100));
    assert_eq!(retry.max_backoff, Duration::from_secs(1));
    assert_eq!(retry.backoff_multiplier, 2.0);
    assert_eq!(retry.retryable_status_codes, codes(&[14]));
    assert!(method.hedging_policy().is_none());
    assert_eq!(method.timeout(), None);
    assert!(config.retry_throttling().is_none());
}

#[test]
fn a6_hedging_policy_examples() {
    let spaced = config("a6_hedging_policy.json");
    let hedging = spaced.method_configs()[0].hedging_policy().unwrap();
    assert_eq!(hedging.max_attempts, 4);
    assert_eq!(hedging.hedging_delay, MS(500));
    assert_eq!(hedging.non_fatal_status_codes, codes(&[14, 13, 10]));
    assert!(spaced.method_configs()[0].retry_policy().is_none());

    let at_once = config("a6_hedging_all_at_once.json");
    let hedging = at_once.method_configs()[0].hedging_policy().unwrap();
    assert_eq!(hedging.hedging_delay, Duration::ZERO);
    assert_eq!(hedging.max_attempts, 4);

    // Both fields but maxAttempts are optional; an empty list is allowed.
    let bare = ServiceConfig::from_json(
        r#"{"methodConfig": [{"name": [{"service": "s"}],
            "hedgingPolicy": {"maxAttempts": 3, "nonFatalStatusCodes": []}}]}"#,
    )
    .unwrap();
    let hedging = bare.method_configs()[0].hedging_policy().unwrap();
    assert_eq!(hedging.hedging_delay, Duration::ZERO);
    assert!(hedging.non_fatal_status_codes.is_empty());
}

#[test]
fn a6_throttling_example_and_the_half_rule() {
    let config = config("a6_retry_throttling.json");
    let throttling = config.retry_throttling().unwrap();
    assert_eq!(throttling.max_tokens, 10);
    assert_eq!(throttling.token_ratio_thousandths, 100);
    assert!(config.method_configs().is_empty());

    // A6: "If token_count is less than or equal to the threshold, defined to
    // be (maxTokens / 2), then RPCs will not be retried until token_count
    // rises over the threshold."
    let throttle = config.retry_throttle().unwrap();
    assert_eq!(throttle.tokens(), 10.0, "starts at maxTokens");
    for left in [9.0, 8.0, 7.0, 6.0] {
        throttle.record_failure();
        assert_eq!(throttle.tokens(), left);
        assert!(throttle.allows_retry(), "{left} > 5");
    }
    throttle.record_failure();
    assert_eq!(throttle.tokens(), 5.0);
    assert!(!throttle.allows_retry(), "5 is the threshold itself");
    throttle.record_success();
    assert!(throttle.allows_retry(), "5.1 rose over it");

    // Each call makes a new throttle: one per server, shared by its methods.
    assert_eq!(config.retry_throttle().unwrap().tokens(), 10.0);
}

#[test]
fn a6_integration_example_with_every_field() {
    let config = config("a6_integration.json");
    let method = config.method_config("/example.Greeter/SayHello").unwrap();
    let retry = method.retry_policy().unwrap();
    assert_eq!(
        retry.max_attempts, 5,
        "maxAttempts 10 is read as 5, not refused"
    );
    assert_eq!(retry.initial_backoff, MS(500));
    assert_eq!(retry.max_backoff, Duration::from_secs(30));
    assert_eq!(retry.backoff_multiplier, 1.5);
    assert_eq!(
        retry.retryable_status_codes,
        codes(&[14, 8, 10]),
        "a number, a lower-case and a mixed-case name"
    );
    assert_eq!(method.timeout(), Some(Duration::new(1, 340_012)));
    assert_eq!(method.wait_for_ready(), Some(true));
    let throttling = config.retry_throttling().unwrap();
    assert_eq!(throttling.max_tokens, 100);
    assert_eq!(
        throttling.token_ratio_thousandths, 546,
        "0.5466 is cut to 0.546"
    );
    assert!(config.method_config("/example.Greeter/Other").is_none());
    assert!(config.default_method_config().is_none());
}

#[test]
fn max_attempts_above_five_is_five_however_large() {
    for attempts in ["6", "10", "4294967296", "1e300"] {
        let json = format!(
            r#"{{"methodConfig": [{{"name": [{{"service": "s"}}],
                "retryPolicy": {{"maxAttempts": {attempts}, "initialBackoff": "1s",
                "maxBackoff": "1s", "backoffMultiplier": 1, "retryableStatusCodes": [14]}}}}]}}"#
        );
        let config = ServiceConfig::from_json(&json).unwrap();
        assert_eq!(
            config.method_configs()[0]
                .retry_policy()
                .unwrap()
                .max_attempts,
            5,
            "{attempts}"
        );
        let hedging = json.replace("retryPolicy", "hedgingPolicy");
        let config = ServiceConfig::from_json(&hedging).unwrap();
        assert_eq!(
            config.method_configs()[0]
                .hedging_policy()
                .unwrap()
                .max_attempts,
            5,
            "{attempts}"
        );
    }
}

// ===== gRPC's service config docs: which method config a call uses

#[test]
fn exact_method_then_service_then_default() {
    let config = config("service_config_doc.json");
    let timeout = |path: &str| config.method_config(path).and_then(MethodConfig::timeout);
    // service_config.md: MyService/Foo uses its own entry, MyService/Bar the
    // service's; service_config.proto: AnotherService/Baz the default.
    assert_eq!(timeout("/MyService/Foo"), Some(Duration::from_secs(1)));
    assert_eq!(timeout("/MyService/Bar"), Some(Duration::from_secs(5)));
    assert_eq!(
        timeout("/AnotherService/Baz"),
        Some(Duration::from_secs(30))
    );
    assert!(config
        .method_config("/MyService/Foo")
        .unwrap()
        .retry_policy()
        .is_some());
    assert!(config
        .method_config("/MyService/Bar")
        .unwrap()
        .retry_policy()
        .is_none());
    // `"method": null` and `"method": ""` are the whole service.
    assert_eq!(timeout("/pkg.Other/Anything"), Some(Duration::from_secs(2)));
    assert_eq!(timeout("/pkg.Third/Anything"), Some(Duration::from_secs(2)));
    // Names are matched exactly: case and package matter.
    assert_eq!(timeout("/myservice/Foo"), Some(Duration::from_secs(30)));
    assert_eq!(timeout("/pkg.MyService/Foo"), Some(Duration::from_secs(30)));
    assert_eq!(
        config
            .method_config_for("MyService", "Foo")
            .unwrap()
            .timeout(),
        Some(Duration::from_secs(1))
    );
    // An entry without names applies to no call.
    assert!(config.method_configs()[4].names.is_empty());
    assert_eq!(
        config.method_configs()[4].timeout(),
        Some(Duration::from_secs(9))
    );
    let default = config.default_method_config().unwrap();
    assert_eq!(default.names[0].service, "");
    assert_eq!(default.names[0].method, None);
}

#[test]
fn hostile_paths_get_the_default_or_none() {
    let with_default = config("service_config_doc.json");
    let without_default = config("a6_retry_policy.json");
    let long = format!("/{}/{}", "a".repeat(1 << 20), "b".repeat(1 << 20));
    let hostile = [
        "",
        "/",
        "//",
        "///",
        "MyService/Foo",
        "/MyService",
        "/MyService/Foo/extra",
        "\0/\0",
        "/\u{feff}MyService/Foo",
        long.as_str(),
    ];
    for path in hostile {
        let shown = &path[..path.len().min(40)];
        assert_eq!(
            with_default
                .method_config(path)
                .and_then(MethodConfig::timeout),
            Some(Duration::from_secs(30)),
            "{shown:?} gets the default"
        );
        assert!(without_default.method_config(path).is_none(), "{shown:?}");
    }
    // An empty method name under a known service is that service's.
    assert_eq!(
        with_default
            .method_config("/MyService/")
            .and_then(MethodConfig::timeout),
        Some(Duration::from_secs(5))
    );
    assert!(without_default
        .method_config("/example.Service/Call")
        .is_some());
}

// ===== validation

#[test]
fn every_invalid_fixture_is_refused_naming_its_field() {
    let cases: Vec<serde_json::Value> = serde_json::from_str(&fixture("invalid.json")).unwrap();
    assert!(cases.len() >= 50);
    for case in &cases {
        let why = case["why"].as_str().unwrap();
        let err = super::parse::service_config(&case["config"])
            .err()
            .unwrap_or_else(|| panic!("{why}: accepted"));
        assert_eq!(err.field(), case["field"].as_str().unwrap(), "{why}: {err}");
        let reason = case["reason"].as_str().unwrap();
        assert!(
            err.reason().contains(reason),
            "{why}: {:?} lacks {reason:?}",
            err.reason()
        );
        // The same text through `from_json`.
        let text = ServiceConfig::from_json(&case["config"].to_string()).unwrap_err();
        assert_eq!(text.field(), err.field(), "{why}");
    }
}

#[test]
fn the_fields_the_task_names_are_refused() {
    // The cases called for by name, so that none can drop out of the
    // fixture unnoticed.
    let cases: Vec<serde_json::Value> = serde_json::from_str(&fixture("invalid.json")).unwrap();
    for why in [
        "maxAttempts 1",
        "initialBackoff missing",
        "backoffMultiplier 0",
        "retryableStatusCodes empty",
        "unknown status name",
        "both retryPolicy and hedgingPolicy",
        "initialBackoff negative",
        "hedgingDelay negative",
        "maxTokens 0",
        "maxTokens 1001",
        "duplicate method name",
    ] {
        assert!(
            cases.iter().any(|case| case["why"] == why),
            "{why} is in invalid.json"
        );
    }
}

#[test]
fn a_bad_duration_is_refused_with_its_text_why_and_how_to_write_one() {
    let err = ServiceConfig::from_json(r#"{"methodConfig": [{"name": [{}], "timeout": "1m"}]}"#)
        .unwrap_err();
    assert_eq!(err.field(), "methodConfig[0].timeout");
    assert_eq!(
        err.reason(),
        "\"1m\": it does not end in `s` \
         (write a decimal number of seconds followed by `s`, e.g. \"0.1s\")"
    );
}

#[test]
fn broken_json_is_refused_at_the_root() {
    let err = ServiceConfig::from_json(r#"{"methodConfig": [}"#).unwrap_err();
    assert_eq!(err.field(), "serviceConfig");
    assert!(
        err.reason().starts_with("not valid JSON"),
        "{}",
        err.reason()
    );
    let deep = "[".repeat(100_000);
    assert_eq!(
        ServiceConfig::from_json(&deep).unwrap_err().field(),
        "serviceConfig"
    );
}

#[test]
fn fields_outside_a6_are_ignored() {
    let config = ServiceConfig::from_json(
        r#"{
            "loadBalancingConfig": [{"pick_first": {}}],
            "healthCheckConfig": {"serviceName": "x"},
            "methodConfig": [{
                "name": [{"service": "s", "unknownNameField": 1}],
                "maxRequestMessageBytes": 1024,
                "retryPolicy": {"maxAttempts": 2, "initialBackoff": "1s", "maxBackoff": "2s",
                    "backoffMultiplier": 3, "retryableStatusCodes": ["unavailable"],
                    "perAttemptRecvTimeout": "1s"}
            }],
            "retryThrottling": {"maxTokens": 1000, "tokenRatio": 1000, "other": true}
        }"#,
    )
    .unwrap();
    assert_eq!(
        config.method_configs()[0]
            .retry_policy()
            .unwrap()
            .max_attempts,
        2
    );
    assert_eq!(config.retry_throttling().unwrap().max_tokens, 1000);
    // `null` is the same as absent, as in proto3 JSON.
    let config =
        ServiceConfig::from_json(r#"{"methodConfig": null, "retryThrottling": null}"#).unwrap();
    assert!(config.method_configs().is_empty() && config.retry_throttling().is_none());
    assert!(ServiceConfig::from_json("{}")
        .unwrap()
        .method_config("/a/b")
        .is_none());
}

// ===== pushback (A6 "Pushback")

#[test]
fn pushback_negative_or_malformed_means_do_not_retry() {
    // A6: "If the value for pushback is negative or unparseble, then it
    // will be seen as the server asking the client not to retry at all."
    for value in [
        "-1",
        "-2147483648",
        "",
        "abc",
        "1.5",
        "1e3",
        "+5",
        "5ms",
        "0x10",
        "--1",
    ] {
        assert_eq!(
            parse_grpc_pushback(value.as_bytes()),
            RetryHint::DoNotRetry,
            "{value:?}"
        );
    }
    assert_eq!(parse_grpc_pushback(b"0"), RetryHint::After(Duration::ZERO));
    assert_eq!(parse_grpc_pushback(b"250"), RetryHint::After(MS(250)));
    assert_eq!(
        parse_grpc_pushback(b"2147483647"),
        RetryHint::After(MS(2_147_483_647))
    );

    // Both classifiers carry it as the failure's hint.
    let response = grpc_response(14, Some("-1"));
    let hint = |outcome: Outcome| outcome.as_failure().unwrap().hint;
    let grpc = Classify::<_, BoxError>::classify(&GrpcClassifier::new(), Ok(&response));
    assert_eq!(hint(grpc), Some(RetryHint::DoNotRetry));
    let a6 = GrpcRetryClassifier::new(codes(&[14]));
    let outcome = Classify::<_, BoxError>::classify(&a6, Ok(&response));
    assert_eq!(hint(outcome), Some(RetryHint::DoNotRetry));
    assert!(!outcome.is_retryable());
    let outcome = Classify::<_, BoxError>::classify(&a6, Ok(&grpc_response(14, Some("30"))));
    assert_eq!(outcome.as_failure().unwrap().retry_after(), Some(MS(30)));
}

#[test]
fn pushback_past_a_signed_32_bit_integer_is_not_a_wait() {
    // A6 defines the value as a signed 32-bit integer, so 2147483648 is
    // unparseable, "do not retry". tower-classify reads it as a wait of
    // 24.8 days; the retry layer then refuses to wait that long (past
    // `max_wait`, 1 h by default) and does not retry either, ending the
    // call with `WaitTooLong` instead of handing the response back.
    assert_eq!(
        parse_grpc_pushback(b"2147483648"),
        RetryHint::After(MS(2_147_483_648))
    );
    let rt = paused_runtime();
    rt.block_on(async {
        let (service, seen) = grpc_server(|_| grpc_response(14, Some("2147483648")));
        let layer = retry_policy_layer(2, &["UNAVAILABLE"]);
        let err = layer.layer(service).oneshot(request()).await.unwrap_err();
        assert!(err.downcast_ref::<WaitTooLong>().is_some(), "{err}");
        assert_eq!(seen.lock().unwrap().len(), 1, "not retried");
    });
}

// ===== the retry layer built from a policy

/// What the server saw: when, and the request's headers.
type Seen = Arc<Mutex<Vec<(Instant, HeaderMap)>>>;

/// Logs a request's arrival in `seen`; its number, from 0.
fn arrived(seen: &Seen, request: &Request<String>) -> usize {
    let mut seen = seen.lock().unwrap();
    seen.push((Instant::now(), request.headers().clone()));
    seen.len() - 1
}

fn grpc_server(
    respond: impl Fn(usize) -> Response<()> + Clone + Send + 'static,
) -> (
    impl Service<Request<String>, Response = Response<()>, Error = BoxError, Future = impl Send> + Clone,
    Seen,
) {
    let seen: Seen = Arc::default();
    let log = Arc::clone(&seen);
    let service = tower::service_fn(move |request: Request<String>| {
        let n = arrived(&log, &request);
        let response = respond(n);
        async move { Ok::<_, BoxError>(response) }
    });
    (service, seen)
}

/// A trailers-only gRPC response with `code` and an optional pushback.
fn grpc_response(code: u32, pushback: Option<&str>) -> Response<()> {
    let mut response = Response::builder()
        .header("content-type", "application/grpc")
        .header("grpc-status", code.to_string());
    if let Some(pushback) = pushback {
        response = response.header("grpc-retry-pushback-ms", pushback);
    }
    response.body(()).unwrap()
}

fn request() -> Request<String> {
    Request::post("/example.Service/Call")
        .header("content-type", "application/grpc")
        .body(String::from("message"))
        .unwrap()
}

fn method_config(retry_policy: &str) -> ServiceConfig {
    ServiceConfig::from_json(&format!(
        r#"{{"methodConfig": [{{"name": [{{"service": "example.Service"}}], "retryPolicy": {retry_policy}}}],
            "retryThrottling": {{"maxTokens": 10, "tokenRatio": 0.1}}}}"#
    ))
    .unwrap()
}

fn retry_policy_layer(
    attempts: u32,
    codes: &[&str],
) -> crate::RetryLayer<GrpcRetryClassifier, crate::replay::HttpReplay> {
    let codes = serde_json::to_string(codes).unwrap();
    let config = method_config(&format!(
        r#"{{"maxAttempts": {attempts}, "initialBackoff": "0.1s", "maxBackoff": "1s",
            "backoffMultiplier": 2, "retryableStatusCodes": {codes}}}"#
    ));
    let method = &config.method_configs()[0];
    method
        .retry_builder(None)
        .unwrap()
        .no_budget()
        .build()
        .unwrap()
}

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn retries_a_retryable_code_with_a6_backoff_and_attempt_header() {
    let (service, seen) = grpc_server(|n| grpc_response(if n < 2 { 14 } else { 0 }, None));
    let layer = retry_policy_layer(4, &["UNAVAILABLE"]);
    let response = layer.layer(service).oneshot(request()).await.unwrap();
    assert_eq!(response.headers()["grpc-status"], "0");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    // grpc-previous-rpc-attempts: absent on the first, then 1, 2.
    let header = |i: usize| {
        seen[i]
            .1
            .get("grpc-previous-rpc-attempts")
            .map(|v| v.to_str().unwrap().to_owned())
    };
    assert_eq!(
        (header(0), header(1).as_deref(), header(2).as_deref()),
        (None, Some("1"), Some("2"))
    );
    // initialBackoff × [0.8, 1.2), then initialBackoff × 2 × [0.8, 1.2);
    // tokio's timer rounds a sleep up to the next whole millisecond.
    let first = seen[1].0 - seen[0].0;
    let second = seen[2].0 - seen[1].0;
    assert!(MS(80) <= first && first <= MS(120), "{first:?}");
    assert!(MS(160) <= second && second <= MS(240), "{second:?}");
}

/// `map_replay` changes the replay a method's config chose and keeps what
/// it set: a gRPC call (a POST) is still retried, with its attempt header,
/// after `grpc_timeout` is turned on.
#[tokio::test(start_paused = true)]
async fn map_replay_keeps_what_the_method_config_set_on_the_replay() {
    let (service, seen) = grpc_server(|n| grpc_response(if n < 1 { 14 } else { 0 }, None));
    let config = method_config(
        r#"{"maxAttempts": 2, "initialBackoff": "0.1s", "maxBackoff": "1s",
            "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}"#,
    );
    let layer = config.method_configs()[0]
        .retry_builder(None)
        .unwrap()
        .no_budget()
        .map_replay(|replay| replay.grpc_timeout(true))
        .build()
        .unwrap();
    let response = layer.layer(service).oneshot(request()).await.unwrap();
    assert_eq!(response.headers()["grpc-status"], "0");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "the POST is retried");
    assert_eq!(seen[1].1["grpc-previous-rpc-attempts"], "1");
}

#[test]
fn the_backoff_is_capped_at_max_backoff_before_jitter() {
    let config = method_config(
        r#"{"maxAttempts": 5, "initialBackoff": "1s", "maxBackoff": "2s",
            "backoffMultiplier": 10, "retryableStatusCodes": [14]}"#,
    );
    let backoff = config.method_configs()[0]
        .retry_policy()
        .unwrap()
        .backoff()
        .unwrap();
    for (n, sleep) in backoff.iter_seeded(7).take(4).enumerate() {
        let cap = if n == 0 {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(2)
        };
        assert!(
            cap.mul_f64(0.8) <= sleep && sleep < cap.mul_f64(1.2),
            "retry {}: {sleep:?}",
            n + 1
        );
    }
}

#[tokio::test(start_paused = true)]
async fn only_the_configured_codes_are_retried() {
    let (service, seen) = grpc_server(|_| grpc_response(13, None));
    let layer = retry_policy_layer(4, &["UNAVAILABLE"]);
    let response = layer.layer(service).oneshot(request()).await.unwrap();
    assert_eq!(response.headers()["grpc-status"], "13");
    assert_eq!(seen.lock().unwrap().len(), 1, "INTERNAL is not in the set");

    // A code GrpcClassifier calls permanent is retried when configured.
    let (service, seen) = grpc_server(|n| grpc_response(if n == 0 { 10 } else { 0 }, None));
    let layer = retry_policy_layer(4, &["ABORTED"]);
    let response = layer.layer(service).oneshot(request()).await.unwrap();
    assert_eq!(response.headers()["grpc-status"], "0");
    assert_eq!(seen.lock().unwrap().len(), 2, "ABORTED is in the set");
}

#[tokio::test(start_paused = true)]
async fn ten_attempts_are_five() {
    let (service, seen) = grpc_server(|_| grpc_response(14, None));
    let layer = retry_policy_layer(10, &["UNAVAILABLE"]);
    assert_eq!(layer.shared().max_retries, 4);
    let response = layer.layer(service).oneshot(request()).await.unwrap();
    assert_eq!(response.headers()["grpc-status"], "14");
    assert_eq!(seen.lock().unwrap().len(), 5);
}

#[tokio::test(start_paused = true)]
async fn a_pushback_is_the_exact_wait_and_a_negative_one_stops() {
    let (service, seen) = grpc_server(|n| grpc_response(if n == 0 { 14 } else { 0 }, Some("50")));
    let layer = retry_policy_layer(3, &["UNAVAILABLE"]);
    layer.layer(service).oneshot(request()).await.unwrap();
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2);
        assert_eq!(
            seen[1].0 - seen[0].0,
            MS(50),
            "exactly the pushback, no jitter"
        );
    }

    let (service, seen) = grpc_server(|_| grpc_response(14, Some("-1")));
    let layer = retry_policy_layer(3, &["UNAVAILABLE"]);
    layer.layer(service).oneshot(request()).await.unwrap();
    assert_eq!(seen.lock().unwrap().len(), 1, "pushback -1: do not retry");
}

#[tokio::test(start_paused = true)]
async fn http_statuses_without_grpc_status_and_errors_map_to_grpc_codes() {
    // 503 from a proxy is UNAVAILABLE (gRPC's HTTP to gRPC status mapping).
    let (service, seen) = grpc_server(|n| {
        if n == 0 {
            Response::builder()
                .status(StatusCode::SERVICE_UNAVAILABLE)
                .body(())
                .unwrap()
        } else {
            grpc_response(0, None)
        }
    });
    retry_policy_layer(3, &["UNAVAILABLE"])
        .layer(service)
        .oneshot(request())
        .await
        .unwrap();
    assert_eq!(seen.lock().unwrap().len(), 2);

    // A lost connection is UNAVAILABLE: retried only when that is in the set.
    let attempts = Arc::new(Mutex::new(0));
    let counted = Arc::clone(&attempts);
    let failing = tower::service_fn(move |_: Request<String>| {
        *counted.lock().unwrap() += 1;
        async {
            Err::<Response<()>, BoxError>(Box::new(std::io::Error::from(
                std::io::ErrorKind::ConnectionReset,
            )))
        }
    });
    let err = retry_policy_layer(3, &["UNAVAILABLE"])
        .layer(failing.clone())
        .oneshot(request())
        .await
        .unwrap_err();
    assert!(
        err.downcast_ref::<std::io::Error>().is_some(),
        "the last error itself: {err}"
    );
    assert_eq!(*attempts.lock().unwrap(), 3);
    *attempts.lock().unwrap() = 0;
    retry_policy_layer(3, &["INTERNAL"])
        .layer(failing)
        .oneshot(request())
        .await
        .unwrap_err();
    assert_eq!(*attempts.lock().unwrap(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_throttle_stops_retries_at_half_and_successes_restore_them() {
    let config = method_config(
        r#"{"maxAttempts": 2, "initialBackoff": "0.1s", "maxBackoff": "1s",
            "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}"#,
    );
    let throttle: Arc<TokenBucketBudget> = config.retry_throttle().unwrap();
    let method = config.method_config("/example.Service/Call").unwrap();
    let layer = method
        .retry_builder(Some(&throttle))
        .unwrap()
        .build()
        .unwrap();

    let failing = Arc::new(Mutex::new(true));
    let fail = Arc::clone(&failing);
    let (service, seen) =
        grpc_server(move |_| grpc_response(if *fail.lock().unwrap() { 14 } else { 0 }, None));
    let service = layer.layer(service);
    let call = || service.clone().oneshot(request());
    // 10 tokens. Call 1: 10 → 9, retried (9 > 5), 9 → 8. Call 2: 8 → 7,
    // retried, 7 → 6. Call 3: 6 → 5, not retried (5 is not above 5).
    // Call 4: 5 → 4, not retried.
    let mut sent = Vec::new();
    for _ in 0..4 {
        let before = seen.lock().unwrap().len();
        call().await.unwrap();
        sent.push(seen.lock().unwrap().len() - before);
    }
    assert_eq!(sent, [2, 2, 1, 1]);
    assert_eq!(throttle.tokens(), 4.0);

    // Eleven successes: 4 + 11 × 0.1 = 5.1 > 5, so retries are back.
    *failing.lock().unwrap() = false;
    for _ in 0..10 {
        call().await.unwrap();
    }
    assert!(!throttle.allows_retry(), "5.0 after ten");
    call().await.unwrap();
    assert!(throttle.allows_retry(), "5.1 after eleven");
    // A failing call now spends its own token first (5.1 → 4.1), as A6
    // counts every failed attempt before deciding on its retry: not retried.
    let failing_call = || async {
        *failing.lock().unwrap() = true;
        let before = seen.lock().unwrap().len();
        call().await.unwrap();
        *failing.lock().unwrap() = false;
        seen.lock().unwrap().len() - before
    };
    assert_eq!(failing_call().await, 1);
    assert_eq!(throttle.milli_tokens(), 4_100);
    // Twenty successes: 6.1; a failure leaves 5.1, above half: retried.
    for _ in 0..20 {
        call().await.unwrap();
    }
    assert_eq!(failing_call().await, 2, "retried again");
    assert_eq!(
        throttle.milli_tokens(),
        4_100,
        "6.1, less one per failed attempt"
    );
}

#[test]
fn a_code_outside_the_set_does_not_count_against_the_throttle() {
    let throttle = Arc::new(TokenBucketBudget::new(10, 0.1).unwrap());
    let classifier = GrpcRetryClassifier::new(codes(&[14])).with_throttle(Some(&throttle));
    let classify =
        |response: &Response<()>| Classify::<_, BoxError>::classify(&classifier, Ok(response));
    classify(&grpc_response(3, None)); // INVALID_ARGUMENT: the request's fault
    assert_eq!(throttle.tokens(), 10.0);
    classify(&grpc_response(14, None));
    assert_eq!(throttle.tokens(), 9.0);
    // A pushback saying not to retry counts, whatever the code.
    classify(&grpc_response(13, Some("-1")));
    assert_eq!(throttle.tokens(), 8.0);
    classify(&grpc_response(0, None));
    assert_eq!(throttle.milli_tokens(), 8_100);
    // A request that never left the client (a transparent retry) counts
    // neither way, and is retryable whatever the set.
    let refused: BoxError = Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
    let outcome = Classify::<Response<()>, _>::classify(&classifier, Err(&refused));
    assert!(outcome.is_retryable());
    assert_eq!(throttle.milli_tokens(), 8_100);
}

#[test]
fn method_configs_become_builders() {
    let config = config("service_config_doc.json");
    // With a policy and a timeout: attempts, backoff and the whole call's deadline.
    let foo = config.method_config("/MyService/Foo").unwrap();
    let layer = foo.retry_builder(None).unwrap().build().unwrap();
    let policy = layer.shared();
    assert_eq!(policy.max_retries, 2);
    assert_eq!(policy.deadline, Some(Duration::from_secs(1)));
    assert_eq!(policy.backoff.initial_delay(), MS(10));
    assert_eq!(policy.backoff.max_delay(), MS(10));
    assert_eq!(
        policy.backoff.jitter(),
        crate::service_config::retry::A6_JITTER
    );
    // Without a policy: one attempt, as A6 says ("retries ... will not be enabled").
    let bar = config.method_config("/MyService/Bar").unwrap();
    let layer = bar.retry_builder(None).unwrap().build().unwrap();
    assert_eq!(layer.shared().max_retries, 0);
    assert_eq!(layer.shared().deadline, Some(Duration::from_secs(5)));

    // A multiplier below 1 is valid A6 but cannot be built here.
    let shrinking = method_config(
        r#"{"maxAttempts": 3, "initialBackoff": "1s", "maxBackoff": "1s",
            "backoffMultiplier": 0.5, "retryableStatusCodes": [14]}"#,
    );
    let method = &shrinking.method_configs()[0];
    assert_eq!(method.retry_policy().unwrap().backoff_multiplier, 0.5);
    let err = method.retry_builder(None).unwrap_err();
    assert_eq!(err.field(), "retryPolicy.backoffMultiplier");
    assert_eq!(
        method
            .retry_policy()
            .unwrap()
            .backoff()
            .unwrap_err()
            .field(),
        "backoffMultiplier"
    );
}

// ===== the hedge layer built from a hedging policy

fn hedging_config(policy: &str) -> ServiceConfig {
    ServiceConfig::from_json(&format!(
        r#"{{"methodConfig": [{{"name": [{{"service": "example.Service"}}], "hedgingPolicy": {policy}}}],
            "retryThrottling": {{"maxTokens": 10, "tokenRatio": 0.1}}}}"#
    ))
    .unwrap()
}

/// A6's hedging for `example.Service`: 2 attempts, 50 ms apart,
/// UNAVAILABLE non-fatal; with the config's throttle when `throttled`.
fn two_attempt_hedge(
    throttled: bool,
) -> (
    crate::hedge::HedgeLayer<GrpcRetryClassifier, crate::replay::HttpReplay>,
    Option<Arc<TokenBucketBudget>>,
) {
    let config = hedging_config(
        r#"{"maxAttempts": 2, "hedgingDelay": "0.05s", "nonFatalStatusCodes": ["UNAVAILABLE"]}"#,
    );
    let throttle = config.retry_throttle().filter(|_| throttled);
    let method = config.method_config("/example.Service/Call").unwrap();
    let layer = method
        .hedge_builder(throttle.as_ref())
        .unwrap()
        .build()
        .unwrap();
    (layer, throttle)
}

/// A gRPC server whose attempt `n` answers `script[n]` (code, after ms).
fn slow_grpc_server(
    script: &'static [(u32, u64)],
) -> (
    impl Service<Request<String>, Response = Response<()>, Error = BoxError, Future = impl Send> + Clone,
    Seen,
) {
    let seen: Seen = Arc::default();
    let log = Arc::clone(&seen);
    let service = tower::service_fn(move |request: Request<String>| {
        let n = arrived(&log, &request);
        let (code, after) = script[n.min(script.len() - 1)];
        async move {
            tokio::time::sleep(MS(after)).await;
            Ok::<_, BoxError>(grpc_response(code, None))
        }
    });
    (service, seen)
}

fn grpc_code(response: &Response<()>) -> &str {
    response.headers()["grpc-status"].to_str().unwrap()
}

#[test]
fn a6_hedging_examples_become_hedge_layers() {
    let config = config("a6_hedging_policy.json");
    let method = &config.method_configs()[0];
    let layer = method.hedge_builder(None).unwrap().build().unwrap();
    assert_eq!(layer.shared().max_attempts, 4);
    assert_eq!(layer.current_delay(), Some(MS(500)));
    // A method with a retry policy has no hedging builder.
    let retrying = config_of_retry();
    assert!(retrying.method_configs()[0].hedge_builder(None).is_none());
}

fn config_of_retry() -> ServiceConfig {
    config("a6_retry_policy.json")
}

#[tokio::test(start_paused = true)]
async fn a6_hedges_go_out_a_delay_apart_with_the_attempt_header() {
    let config = hedging_config(
        r#"{"maxAttempts": 3, "hedgingDelay": "0.05s", "nonFatalStatusCodes": ["UNAVAILABLE"]}"#,
    );
    let method = config.method_config("/example.Service/Call").unwrap();
    let layer = method.hedge_builder(None).unwrap().build().unwrap();
    // Attempt 1 is slow, attempt 2 fails with a non-fatal code (the others
    // go on), attempt 3 is never sent after that failure; attempt 1 answers.
    let (service, seen) = slow_grpc_server(&[(0, 200), (14, 10), (0, 1)]);
    let start = Instant::now();
    let response = layer.layer(service).oneshot(request()).await.unwrap();
    assert_eq!(grpc_code(&response), "0");
    assert_eq!(start.elapsed(), MS(200));
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "no hedge after a failure answer");
    assert!(seen[0].1.get("grpc-previous-rpc-attempts").is_none());
    assert_eq!(seen[1].1["grpc-previous-rpc-attempts"], "1");
    assert_eq!(seen[1].0 - start, MS(50));
}

#[tokio::test(start_paused = true)]
async fn a6_a_fatal_code_wins_and_cancels_the_other_attempts() {
    let (layer, _) = two_attempt_hedge(false);
    // INVALID_ARGUMENT from the hedge is the call's answer at 60 ms.
    let (service, _) = slow_grpc_server(&[(0, 1000), (3, 10)]);
    let start = Instant::now();
    let response = layer.layer(service).oneshot(request()).await.unwrap();
    assert_eq!(grpc_code(&response), "3");
    assert_eq!(start.elapsed(), MS(60));
}

#[tokio::test(start_paused = true)]
async fn a6_throttling_at_half_sends_no_hedge() {
    let (layer, throttle) = two_attempt_hedge(true);
    let throttle = throttle.unwrap();
    let (service, seen) = slow_grpc_server(&[(0, 1000), (0, 10)]);
    let service = layer.layer(service);
    // Full (10 > 5): hedged.
    service.clone().oneshot(request()).await.unwrap();
    assert_eq!(seen.lock().unwrap().len(), 2);
    // At half (5 is not above 5): no hedge.
    for _ in 0..5 {
        throttle.record_failure();
    }
    assert!(!throttle.allows_retry());
    seen.lock().unwrap().clear();
    let start = Instant::now();
    service.clone().oneshot(request()).await.unwrap();
    assert_eq!(seen.lock().unwrap().len(), 1);
    assert_eq!(start.elapsed(), MS(1000));
}

#[tokio::test(start_paused = true)]
async fn after_a_pushback_the_backoff_starts_again_at_initial_backoff() {
    // UNAVAILABLE, then UNAVAILABLE with a 500 ms pushback, then UNAVAILABLE,
    // then OK: the third retry waits initialBackoff × [0.8, 1.2) again, not
    // initialBackoff × 4.
    let (service, seen) = grpc_server(|n| match n {
        1 => grpc_response(14, Some("500")),
        3 => grpc_response(0, None),
        _ => grpc_response(14, None),
    });
    let layer = retry_policy_layer(4, &["UNAVAILABLE"]);
    let response = layer.layer(service).oneshot(request()).await.unwrap();
    assert_eq!(response.headers()["grpc-status"], "0");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 4);
    let gap = |i: usize| seen[i].0 - seen[i - 1].0;
    // 100 ms × [0.8, 1.2), on tokio's timer, which rounds a sleep up to the
    // next whole millisecond: 80 to 120 ms.
    assert!(MS(80) <= gap(1) && gap(1) <= MS(120), "{:?}", gap(1));
    assert_eq!(gap(2), MS(500), "the pushback, exactly");
    assert!(
        MS(80) <= gap(3) && gap(3) <= MS(120),
        "restarted: {:?}",
        gap(3)
    );
}

// ===== one layer for the whole config

#[tokio::test(start_paused = true)]
async fn one_layer_routes_each_path_to_its_methods_policy() {
    let config = ServiceConfig::from_json(
        r#"{"methodConfig": [
            {"name": [{"service": "example.Service"}],
             "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "1s",
                             "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}},
            {"name": [{"service": "example.Search", "method": "Find"}],
             "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.05s",
                               "nonFatalStatusCodes": ["UNAVAILABLE"]}}],
          "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}"#,
    )
    .unwrap();
    let layer = config.layer(config.retry_throttle()).unwrap();
    let post = |path: &str| {
        Request::post(path)
            .header("content-type", "application/grpc")
            .body(String::from("message"))
            .unwrap()
    };

    // The retry policy: UNAVAILABLE three times in all.
    let (service, seen) = grpc_server(|_| grpc_response(14, None));
    let response = layer
        .layer(service)
        .oneshot(post("/example.Service/Call"))
        .await
        .unwrap();
    assert_eq!(grpc_code(&response), "14");
    assert_eq!(seen.lock().unwrap().len(), 3);

    // The hedging policy: a slow first attempt, hedged after 50 ms.
    let (service, seen) = slow_grpc_server(&[(0, 1000), (0, 10)]);
    let start = Instant::now();
    let response = layer
        .layer(service)
        .oneshot(post("/example.Search/Find"))
        .await
        .unwrap();
    assert_eq!(grpc_code(&response), "0");
    assert_eq!(start.elapsed(), MS(60));
    assert_eq!(seen.lock().unwrap().len(), 2);

    // A path no method config covers: sent once, as it is.
    let (service, seen) = grpc_server(|_| grpc_response(14, None));
    let response = layer
        .layer(service)
        .oneshot(post("/example.Search/Other"))
        .await
        .unwrap();
    assert_eq!(grpc_code(&response), "14");
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[test]
fn a_bad_method_config_is_named_when_the_layer_is_built() {
    let config = ServiceConfig::from_json(
        r#"{"methodConfig": [
            {"name": [{"service": "a.A"}]},
            {"name": [{"service": "b.B"}],
             "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "1s",
                             "backoffMultiplier": 0.5, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
    )
    .unwrap();
    let error = config.layer(None).unwrap_err();
    assert_eq!(
        error.field(),
        "methodConfig[1].retryPolicy.backoffMultiplier"
    );
}

#[tokio::test(start_paused = true)]
async fn a6_a_non_fatal_code_with_do_not_retry_pushback_does_not_cancel_the_first_attempt() {
    let (layer, _) = two_attempt_hedge(false);
    let seen: Seen = Arc::default();
    let log = Arc::clone(&seen);
    let service = tower::service_fn(move |request: Request<String>| {
        let n = arrived(&log, &request);
        async move {
            // The first attempt answers OK at 100 ms; the hedge UNAVAILABLE
            // with a pushback of -1 ("do not retry") at 51 ms.
            let (after, response) = if n == 0 {
                (100, grpc_response(0, None))
            } else {
                (1, grpc_response(14, Some("-1")))
            };
            tokio::time::sleep(MS(after)).await;
            Ok::<_, BoxError>(response)
        }
    });
    let start = Instant::now();
    let response = layer.layer(service).oneshot(request()).await.unwrap();
    assert_eq!(grpc_code(&response), "0");
    assert_eq!(start.elapsed(), MS(100));
}

#[tokio::test(start_paused = true)]
async fn a6_answers_that_are_not_hedged_still_count_in_the_throttle() {
    let (layer, throttle) = two_attempt_hedge(true);
    let throttle = throttle.unwrap();
    // UNAVAILABLE at once, before any hedge is due: three tokens gone.
    let (service, _) = grpc_server(|_| grpc_response(14, None));
    let service = layer.layer(service);
    for _ in 0..3 {
        service.clone().oneshot(request()).await.unwrap();
    }
    assert_eq!(throttle.tokens(), 7.0);
}

#[tokio::test(start_paused = true)]
async fn the_methods_timeout_bounds_a_hedged_call() {
    let config = ServiceConfig::from_json(
        r#"{"methodConfig": [{"name": [{"service": "example.Service"}], "timeout": "0.1s",
            "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.08s",
                              "nonFatalStatusCodes": ["UNAVAILABLE"]}}]}"#,
    )
    .unwrap();
    let layer = config.layer(None).unwrap();
    let (service, seen) = slow_grpc_server(&[(0, 10_000)]);
    let start = Instant::now();
    let error = layer.layer(service).oneshot(request()).await.unwrap_err();
    let exceeded = error
        .downcast_ref::<crate::error::DeadlineExceeded>()
        .unwrap_or_else(|| panic!("DeadlineExceeded: {error}"));
    assert_eq!(start.elapsed(), MS(100));
    // The hedge at 80 ms had 20 ms left; the one due at 160 ms never went.
    assert_eq!(seen.lock().unwrap().len(), 2);
    assert_eq!(exceeded.attempts(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_callers_deadline_bounds_a_hedged_method_without_a_timeout() {
    let config = ServiceConfig::from_json(
        r#"{"methodConfig": [{"name": [{"service": "example.Service"}],
            "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.05s",
                              "nonFatalStatusCodes": ["UNAVAILABLE"]}}]}"#,
    )
    .unwrap();
    let layer = config.layer(None).unwrap();
    let (service, seen) = slow_grpc_server(&[(0, 10_000)]);
    let mut call = request();
    call.extensions_mut()
        .insert(tower_classify::deadline::Deadline::after(MS(100)));
    let start = Instant::now();
    let error = layer.layer(service).oneshot(call).await.unwrap_err();
    assert!(error.is::<crate::error::DeadlineExceeded>(), "{error}");
    assert_eq!(start.elapsed(), MS(100), "as a retried method would end");
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_hedged_call_cut_by_its_timeout_drops_its_attempts_at_once() {
    let config = ServiceConfig::from_json(
        r#"{"methodConfig": [{"name": [{"service": "example.Service"}], "timeout": "0.1s",
            "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.05s",
                              "nonFatalStatusCodes": ["UNAVAILABLE"]}}]}"#,
    )
    .unwrap();
    let alive = Arc::new(AtomicUsize::new(0));
    struct Alive(Arc<AtomicUsize>);
    impl Drop for Alive {
        fn drop(&mut self) {
            self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let live = Arc::clone(&alive);
    let service = tower::service_fn(move |_: Request<String>| {
        live.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let guard = Alive(Arc::clone(&live));
        async move {
            let _guard = guard;
            std::future::pending::<Result<Response<()>, BoxError>>().await
        }
    });
    let mut service = config.layer(None).unwrap().layer(service);
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    let mut call = tokio_test::task::spawn(service.call(request()));
    let result = loop {
        if let std::task::Poll::Ready(result) = call.poll() {
            break result;
        }
        tokio::time::advance(MS(10)).await;
    };
    assert!(result.is_err());
    assert_eq!(
        alive.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "both attempts dropped when the timeout fired, while the future still exists"
    );
    drop(call);
}

/// Answers `grpc-status: 0` at once, and counts how often it is cloned.
struct CountsClones {
    clones: Arc<AtomicUsize>,
}

impl CountsClones {
    fn new() -> (Self, Arc<AtomicUsize>) {
        let clones = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&clones);
        (CountsClones { clones }, counted)
    }
}

impl Service<Request<String>> for CountsClones {
    type Response = Response<()>;
    type Error = BoxError;
    type Future = std::future::Ready<Result<Response<()>, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<String>) -> Self::Future {
        std::future::ready(Ok(grpc_response(0, None)))
    }
}

impl Clone for CountsClones {
    fn clone(&self) -> Self {
        self.clones.fetch_add(1, Ordering::Relaxed);
        CountsClones {
            clones: Arc::clone(&self.clones),
        }
    }
}

/// The router lets the retry or hedge layer of a call's method take the
/// service made ready for it, as `Retry` and `Hedge` used alone do: one
/// clone per call that may send more than one attempt (the one left in
/// the router), none for a method without a policy.
#[tokio::test(start_paused = true)]
async fn a_routed_call_clones_the_inner_service_at_most_once() {
    let config = ServiceConfig::from_json(
        r#"{"methodConfig": [
            {"name": [{"service": "example.Retried"}],
             "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
                             "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}},
            {"name": [{"service": "example.Hedged"}],
             "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.05s"}}]}"#,
    )
    .unwrap();
    let layer = config.layer(None).unwrap();
    for (path, expected) in [
        ("/example.Retried/Call", 1),
        ("/example.Hedged/Call", 1),
        ("/example.Plain/Call", 0),
    ] {
        let (counting, clones) = CountsClones::new();
        let mut client = layer.layer(counting);
        let request = Request::post(path).body(String::new()).unwrap();
        let response = client.ready().await.unwrap().call(request).await.unwrap();
        assert_eq!(response.headers()["grpc-status"], "0");
        assert_eq!(clones.load(Ordering::Relaxed), expected, "{path}");
    }
}

/// A status outside `nonFatalStatusCodes` is fatal (gRFC A6): it is the
/// call's answer at once and the other attempt is cancelled. It used to
/// keep its default, transient kind and wait for the slow success.
#[tokio::test(start_paused = true)]
async fn a_fatal_status_of_a_transient_kind_answers_at_once() {
    let (layer, _) = two_attempt_hedge(false);
    // INTERNAL (13) is not in nonFatalStatusCodes ["UNAVAILABLE"].
    let (service, _) = slow_grpc_server(&[(0, 1000), (13, 10)]);
    let start = Instant::now();
    let response = layer.layer(service).oneshot(request()).await.unwrap();
    assert_eq!(grpc_code(&response), "13");
    assert_eq!(start.elapsed(), MS(60));
}

/// A call that failed with an error is judged by the error classifier the
/// classifier was given, then by the retryable codes: an error nothing
/// recognises is rejected by default, and retried once it is read as a
/// connection failure (`UNAVAILABLE`, in the set).
#[test]
fn the_error_classifier_decides_an_unrecognised_error() {
    #[derive(Debug)]
    struct Opaque;
    impl std::fmt::Display for Opaque {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("opaque")
        }
    }
    impl std::error::Error for Opaque {}
    let opaque: BoxError = Box::new(Opaque);
    let classify = |c: &GrpcRetryClassifier| Classify::<Response<()>, _>::classify(c, Err(&opaque));
    assert!(!classify(&GrpcRetryClassifier::new(codes(&[14]))).is_retryable());
    let connection = tower_classify::ErrorChainClassifier::new()
        .unknown_as(Outcome::failure(tower_classify::FailureKind::Connection));
    let classifier = GrpcRetryClassifier::new(codes(&[14])).with_error_classifier(connection);
    assert!(classify(&classifier).is_retryable());
}

/// The tonic stack: `ReplayBodyLayer`, the config's layer, the conversion
/// back to tonic's body, and a channel answering UNAVAILABLE once.
#[tokio::test(start_paused = true)]
async fn a_tonic_client_retries_by_its_service_config() {
    use crate::body::{ReplayBody, ReplayBodyLayer};
    use tower::ServiceBuilder;

    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let channel = tower::service_fn(move |_req: Request<tonic::body::Body>| {
        let status = if counted.fetch_add(1, Ordering::SeqCst) == 0 {
            "14"
        } else {
            "0"
        };
        async move {
            Ok::<_, std::io::Error>(
                Response::builder()
                    .header("content-type", "application/grpc")
                    .header("grpc-status", status)
                    .body(tonic::body::Body::default())
                    .unwrap(),
            )
        }
    });
    let config = ServiceConfig::from_json(
        r#"{
        "methodConfig": [{
            "name": [{ "service": "helloworld.Greeter", "method": "SayHello" }],
            "timeout": "5s",
            "retryPolicy": {
                "maxAttempts": 4,
                "initialBackoff": "0.1s",
                "maxBackoff": "1s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"]
            }
        }],
        "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.1 }
    }"#,
    )
    .unwrap();
    let retry = config.layer(config.retry_throttle()).unwrap();
    let client = ServiceBuilder::new()
        .layer(ReplayBodyLayer::new(64 * 1024))
        .layer(retry)
        .map_request(|r: Request<ReplayBody<tonic::body::Body>>| r.map(tonic::body::Body::new))
        .service(channel);
    let request = Request::post("/helloworld.Greeter/SayHello")
        .body(tonic::body::Body::default())
        .unwrap();
    let response = client.oneshot(request).await.unwrap();
    assert_eq!(response.headers()["grpc-status"], "0");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
