//! Response rules and request idempotency.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use serde_json::json;
use tower_classify::hint::{BackoffFrom, WaitUnit};
use tower_classify::http::{Idempotency, ResponseRule};
use tower_classify::{BoxError, Classify, FailureKind, HttpClassifier, Outcome, RetryHint};

fn classify<B: 'static>(classifier: &HttpClassifier, response: Response<B>) -> Outcome {
    Classify::<_, BoxError>::classify(classifier, Ok(&response))
}

fn json_response(status: u16, body: &'static str) -> Response<Bytes> {
    Response::builder()
        .status(status)
        .body(Bytes::from_static(body.as_bytes()))
        .unwrap()
}

#[test]
fn status_and_header_rule() {
    let rule = ResponseRule::builder()
        .statuses([403, 429])
        .header_equals("x-ratelimit-remaining", ["0"])
        .build()
        .unwrap();
    let classifier = HttpClassifier::new().with_rules([rule]);
    let response = |status, remaining| {
        Response::builder()
            .status(status)
            .header("x-ratelimit-remaining", remaining)
            .body(())
            .unwrap()
    };
    assert_eq!(
        classify(&classifier, response(403, "0")),
        Outcome::failure(FailureKind::RateLimited),
        "403 + header match is throttling"
    );
    assert_eq!(
        classify(&classifier, response(403, "12")),
        Outcome::failure(FailureKind::Rejected),
        "a header mismatch falls back to the status table"
    );
    assert_eq!(
        classify(&classifier, response(400, "0")),
        Outcome::failure(FailureKind::Rejected),
        "a status outside the rule's set falls back"
    );

    let present = ResponseRule::builder()
        .statuses([400])
        .header_present("x-throttled")
        .build()
        .unwrap();
    let classifier = HttpClassifier::new().with_rules([present]);
    let flagged = Response::builder()
        .status(400)
        .header("x-throttled", "whatever")
        .body(())
        .unwrap();
    assert_eq!(
        classify(&classifier, flagged),
        Outcome::failure(FailureKind::RateLimited)
    );
}

#[test]
fn status_and_body_path_rule() {
    let rule = ResponseRule::builder()
        .statuses([400, 403])
        .body_path("$.error.code", [json!(17), json!(80004), json!("4")])
        .backoff(Duration::from_secs(60))
        .build()
        .unwrap();
    let classifier = HttpClassifier::new().with_rules([rule]);
    let throttled = classify(&classifier, json_response(400, r#"{"error":{"code":17}}"#));
    assert_eq!(
        throttled.as_failure().unwrap().kind,
        FailureKind::RateLimited
    );
    assert_eq!(
        throttled.as_failure().unwrap().retry_after(),
        Some(Duration::from_secs(60)),
        "the rule's fixed backoff is the hint"
    );
    // A configured "4" matches a body's 4: formats cannot always say which they meant.
    let string_number = classify(&classifier, json_response(403, r#"{"error":{"code":4}}"#));
    assert_eq!(
        string_number.as_failure().unwrap().kind,
        FailureKind::RateLimited
    );
    // And the reverse, as numbers; two texts compare as text.
    for (body, throttled) in [
        (r#"{"error":{"code":" 17 "}}"#, true),
        (r#"{"error":{"code":4.0}}"#, true),
        (r#"{"error":{"code":"4.0"}}"#, false),
        (r#"{"error":{"code":"x"}}"#, false),
    ] {
        let outcome = classify(&classifier, json_response(400, body));
        let kind = outcome.as_failure().unwrap().kind;
        assert_eq!(kind == FailureKind::RateLimited, throttled, "{body}");
    }
    assert_eq!(
        classify(&classifier, json_response(400, r#"{"error":{"code":100}}"#)),
        Outcome::failure(FailureKind::Rejected)
    );
    assert_eq!(
        classify(&classifier, json_response(400, "not json")),
        Outcome::failure(FailureKind::Rejected)
    );
    // A streaming body cannot be read: the body rule does not match.
    let streaming = Response::builder()
        .status(400)
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    assert_eq!(
        classify(&classifier, streaming),
        Outcome::failure(FailureKind::Rejected)
    );
}

#[test]
fn match_success_rule() {
    let rule = ResponseRule::builder()
        .match_success(true)
        .body_path("$.errors[*].extensions.code", [json!("THROTTLED")])
        .backoff_from(
            BackoffFrom::cost_bucket(
                "$.extensions.cost.requested",
                "$.extensions.cost.available",
                "$.extensions.cost.restore_rate",
            )
            .unwrap(),
        )
        .build()
        .unwrap();
    let classifier = HttpClassifier::new().with_rules([rule]);
    let body = r#"{"errors":[{"extensions":{"code":"THROTTLED"}}],
                   "extensions":{"cost":{"requested":100,"available":10,"restore_rate":50}}}"#;
    let outcome = classify(&classifier, json_response(200, body));
    assert_eq!(
        outcome.as_failure().unwrap().hint,
        Some(RetryHint::After(Duration::from_secs(2))),
        "a 200 carrying THROTTLED is rate limited, waiting ceil(90/50) s"
    );
    assert_eq!(
        classify(&classifier, json_response(200, r#"{"data":{}}"#)),
        Outcome::Success
    );

    let refused = ResponseRule::builder()
        .match_success(true)
        .build()
        .unwrap_err();
    assert_eq!(refused.field(), "match_success");
    let refused = ResponseRule::builder()
        .match_success(true)
        .statuses([400])
        .build()
        .unwrap_err();
    assert_eq!(refused.field(), "match_success");
}

#[test]
fn rule_hint_order_is_backoff_from_then_backoff_then_retry_after() {
    let rule = |with_reader: bool, with_fixed: bool| {
        let mut builder = ResponseRule::builder()
            .statuses([400])
            .header_present("x-limit");
        if with_reader {
            builder =
                builder.backoff_from(BackoffFrom::header("x-reset", WaitUnit::Seconds).unwrap());
        }
        if with_fixed {
            builder = builder.backoff(Duration::from_secs(60));
        }
        HttpClassifier::new().with_rules([builder.build().unwrap()])
    };
    let response = |reset: Option<&str>| {
        let mut builder = Response::builder()
            .status(400)
            .header("x-limit", "1")
            .header("retry-after", "5");
        if let Some(reset) = reset {
            builder = builder.header("x-reset", reset);
        }
        builder.body(()).unwrap()
    };
    let wait = |classifier: &HttpClassifier, reset| {
        classify(classifier, response(reset))
            .as_failure()
            .unwrap()
            .retry_after()
    };
    assert_eq!(
        wait(&rule(true, true), Some("9")),
        Some(Duration::from_secs(9))
    );
    assert_eq!(
        wait(&rule(true, true), Some("garbage")),
        Some(Duration::from_secs(60)),
        "an unreadable value falls through to the fixed backoff"
    );
    assert_eq!(
        wait(&rule(false, false), None),
        Some(Duration::from_secs(5)),
        "then Retry-After"
    );
}

#[test]
fn rules_refuse_bad_fields() {
    let err = ResponseRule::builder().build().unwrap_err();
    assert_eq!(err.field(), "status");
    let err = ResponseRule::builder().statuses([1]).build().unwrap_err();
    assert_eq!(err.field(), "status");
    let err = ResponseRule::builder()
        .statuses([400])
        .body_path("error.code", [json!(1)])
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "body_path");
    let err = ResponseRule::builder()
        .statuses([400])
        .header_present("bad header")
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "header");
}

#[test]
fn idempotency_rules() {
    let policy = Idempotency::new();
    let request = |method: Method| Request::builder().method(method).body(()).unwrap();
    for method in [
        Method::GET,
        Method::HEAD,
        Method::OPTIONS,
        Method::TRACE,
        Method::PUT,
        Method::DELETE,
    ] {
        assert!(policy.is_idempotent(&request(method.clone())), "{method}");
    }
    for method in [
        Method::POST,
        Method::PATCH,
        Method::CONNECT,
        Method::from_bytes(b"PURGE").unwrap(),
        // An extension method whatever the `http` crate knows of it (1.5
        // names QUERY and calls it idempotent; RFC 9110 does not list it).
        Method::from_bytes(b"QUERY").unwrap(),
    ] {
        assert!(!policy.is_idempotent(&request(method.clone())), "{method}");
        assert!(!Idempotency::method_is_idempotent(&method), "{method}");
    }
    let keyed = |method: Method| {
        Request::builder()
            .method(method)
            .header("Idempotency-Key", "k-1")
            .body(())
            .unwrap()
    };
    assert!(policy.is_idempotent(&keyed(Method::POST)));
    assert!(policy.is_idempotent(&keyed(Method::PATCH)));
    assert!(
        !policy.is_idempotent(&keyed(Method::CONNECT)),
        "a key makes only POST and PATCH repeatable"
    );
    let opted_in = Idempotency::new().retry_non_idempotent(true);
    assert!(opted_in.is_idempotent(&request(Method::POST)));
    let custom = Idempotency::new().key_header(http::HeaderName::from_static("x-request-id"));
    assert!(!custom.is_idempotent(&keyed(Method::POST)));
    let with_custom = Request::post("/")
        .header("x-request-id", "1")
        .body(())
        .unwrap();
    assert!(custom.is_idempotent(&with_custom));
}
