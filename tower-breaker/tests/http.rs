//! The `http` variant answers `503 CIRCUIT_OPEN` with `Retry-After`.
#![cfg(feature = "http")]

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tower::{service_fn, Layer, ServiceExt};
use tower_breaker::CircuitBreakerLayer;
use tower_classify::{BoxError, Classify, Failure, FailureKind, HttpClassifier, RefusalToken};

#[tokio::test(start_paused = true)]
async fn an_open_circuit_answers_503_with_retry_after_and_circuit_open() {
    let layer = CircuitBreakerLayer::builder()
        .failure_threshold(2)
        .recovery_timeout(Duration::from_secs(20))
        .build(HttpClassifier::new())
        .unwrap()
        .into_http();
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
    assert_eq!(response.headers()["content-type"], "application/json");
    let body: serde_json::Value = serde_json::from_str(response.body()).unwrap();
    assert_eq!(body["code"], "CIRCUIT_OPEN");
    assert_eq!(body["retry_after_secs"], 18);

    // Layers around it see the answer as shed load, not as a server error.
    let outcome = Classify::<_, BoxError>::classify(&HttpClassifier::new(), Ok(&response));
    let failure = outcome.as_failure().expect("a failure");
    assert_eq!(failure.kind, FailureKind::Shed);
    assert_eq!(failure.retry_after(), Some(Duration::from_millis(17_500)));
}

/// Issue 31, item 5: an open HTTP breaker copies the refused request's
/// `RefusalToken` into its 503's `Failure`, the proof an idempotency guard
/// in front of it needs; a request without one gets a refusal without one.
#[tokio::test(start_paused = true)]
async fn item_5_an_open_circuits_503_carries_the_refused_requests_token() {
    let layer = CircuitBreakerLayer::builder()
        .build(HttpClassifier::new())
        .unwrap()
        .into_http();
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
