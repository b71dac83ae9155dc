//! The `Http503` answer: an open circuit answers `503 CIRCUIT_OPEN` with `Retry-After`.
#![cfg(feature = "http")]

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tower::{service_fn, Layer, ServiceExt};
use tower_breaker::answer::Http503;
use tower_breaker::CircuitBreakerLayer;
use tower_breaker::Policy;
use tower_classify::status::HttpStatusLayer;
use tower_classify::{BoxError, Classify, Failure, FailureKind, HttpClassifier, RefusalToken};

#[tokio::test(start_paused = true)]
async fn an_open_circuit_answers_503_with_retry_after_and_circuit_open() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(2))
        .recovery_timeout(Duration::from_secs(20))
        .build(HttpClassifier::new())
        .unwrap()
        .answer(Http503);
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = layer.layer(service_fn({
        let calls = Arc::clone(&calls);
        move |_: Request<()>| {
            calls.fetch_add(1, Ordering::SeqCst);
            async {
                Ok::<_, Infallible>(
                    Response::builder()
                        .status(502)
                        .body(String::from("bad gateway"))
                        .unwrap(),
                )
            }
        }
    }));
    for _ in 0..2 {
        let response = svc.clone().oneshot(Request::new(())).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_GATEWAY, "passed through");
        assert_eq!(response.body(), "bad gateway");
    }
    tokio::time::advance(Duration::from_millis(16_500)).await;

    let response = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the dependency was not called"
    );
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        response.headers()["retry-after"],
        "18",
        "3.5 s left (the period's last fifth), plus four times that (its place in the release ramp)"
    );
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let body: serde_json::Value = serde_json::from_str(response.body()).unwrap();
    assert_eq!(
        body,
        serde_json::json!({
            "type": "about:blank",
            "title": "Service Unavailable",
            "status": 503,
            "detail": "circuit open",
            "code": "CIRCUIT_OPEN",
        })
    );

    // Layers around it see the answer as shed load, not as a server error.
    let outcome = Classify::<_, BoxError>::classify(&HttpClassifier::new(), Ok(&response));
    let failure = outcome.as_failure().expect("a failure");
    assert_eq!(failure.kind, FailureKind::Shed);
    assert_eq!(failure.retry_after(), Some(Duration::from_millis(17_500)));
}

/// A call refused before the last fifth of an open period has no place on
/// the release ramp (the refusal's `failure().retry_after()` is `None`), but the `503`
/// still tells an HTTP caller what an open circuit promises: the time left,
/// rounded up. Layers around it see no hint in its `Failure`, as a retry
/// layer in process would: they give up at once rather than pile onto the
/// close.
#[tokio::test(start_paused = true)]
async fn an_early_refusals_503_says_the_time_left() {
    let layer = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .recovery_timeout(Duration::from_secs(20))
        .build(HttpClassifier::new())
        .unwrap()
        .answer(Http503);
    let svc = layer.layer(service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::builder().status(502).body(String::new()).unwrap())
    }));
    let opened = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(opened.status(), StatusCode::BAD_GATEWAY);
    tokio::time::advance(Duration::from_millis(5_500)).await;

    let response = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        response.headers()["retry-after"],
        "15",
        "14.5 s left, rounded up; no ramp place this early"
    );
    let body: serde_json::Value = serde_json::from_str(response.body()).unwrap();
    assert_eq!(body["code"], "CIRCUIT_OPEN");
    let failure = response
        .extensions()
        .get::<Failure>()
        .expect("the refusal's failure");
    assert_eq!(failure.kind, FailureKind::Shed);
    assert_eq!(failure.retry_after(), None, "{failure:?}");
}

/// Issue 31, item 5: an open HTTP breaker copies the refused request's
/// `RefusalToken` into its 503's `Failure`, the proof an idempotency guard
/// in front of it needs; a request without one gets a refusal without one.
#[tokio::test(start_paused = true)]
async fn item_5_an_open_circuits_503_carries_the_refused_requests_token() {
    let layer = CircuitBreakerLayer::builder()
        .build(HttpClassifier::new())
        .unwrap()
        .answer(Http503);
    assert!(layer.handle().force_open("default"));
    let svc = layer.layer(service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    }));

    let token = RefusalToken::issue();
    let mut request = Request::new(());
    request.extensions_mut().insert(token);
    let refused = svc.clone().oneshot(request).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    let failure = refused.extensions().get::<Failure>().unwrap();
    assert_eq!(
        (failure.kind, failure.refusal),
        (FailureKind::Shed, Some(token))
    );

    let refused = svc.clone().oneshot(Request::new(())).await.unwrap();
    let failure = refused.extensions().get::<Failure>().unwrap();
    assert_eq!((failure.kind, failure.refusal), (FailureKind::Shed, None));
}

/// Issue 36: an open circuit's refusal answered by tower-classify's
/// `HttpStatusLayer` (a plain breaker under an axum route) carries the same
/// `Retry-After` as the breaker's own `503`: the time left, early in the
/// open period too, where the refusal gives a retry layer no hint. The body
/// is the same problem but for the breaker's stable `code`.
#[tokio::test(start_paused = true)]
async fn first_hour_3_http_status_layer_says_an_open_circuits_time_left_early_in_the_period() {
    let breaker = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(1))
        .recovery_timeout(Duration::from_secs(20))
        .build(HttpClassifier::new())
        .unwrap();
    let failing = service_fn(|_: Request<()>| async {
        Ok::<_, BoxError>(Response::builder().status(502).body(String::new()).unwrap())
    });
    let plain = HttpStatusLayer::new().layer(breaker.layer(failing));
    let answered = breaker.clone().answer(Http503).layer(failing);

    let opened = plain.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(opened.status(), StatusCode::BAD_GATEWAY);
    // 2 s into a 20 s period: far from its last fifth.
    tokio::time::advance(Duration::from_millis(2_000)).await;

    let response = plain.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "18", "18 s left");
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let failure = response.extensions().get::<Failure>().unwrap();
    assert_eq!(failure.kind, FailureKind::Shed);
    assert_eq!(
        failure.retry_after(),
        None,
        "a retry layer is still told to fail at once"
    );

    // The breaker's own answer, at the same moment: the same wait and
    // problem, plus the code.
    let own = answered.oneshot(Request::new(())).await.unwrap();
    assert_eq!(own.headers()["retry-after"], "18");
    let mut own_body: serde_json::Value = serde_json::from_str(own.body()).unwrap();
    assert_eq!(own_body["code"], "CIRCUIT_OPEN");
    own_body.as_object_mut().unwrap().remove("code");
    let body: serde_json::Value = serde_json::from_str(response.body()).unwrap();
    assert_eq!(own_body, body);

    // 300 ms before the end, in the last fifth: the refusal's place on the
    // release ramp, the hint a retry layer reads too.
    tokio::time::advance(Duration::from_millis(17_700)).await;
    let late = plain.oneshot(Request::new(())).await.unwrap();
    assert_eq!(
        late.headers()["retry-after"],
        "2",
        "0.3 s left, ×5 = 1.5 s, rounded up"
    );
}
