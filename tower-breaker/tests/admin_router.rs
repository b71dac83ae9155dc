//! The admin router: JSON over the handle, only with the bearer token.
#![cfg(feature = "admin")]

use std::io;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_breaker::{BreakerHandle, CircuitBreakerLayer, State};
use tower_classify::ErrorChainClassifier;

const TOKEN: &str = "0123456789abcdef-operator";

fn handle() -> BreakerHandle {
    let layer = CircuitBreakerLayer::builder()
        .build_keyed(ErrorChainClassifier::new(), |req: &&'static str| *req)
        .unwrap();
    let handle = layer.handle();
    // Create two breakers by calling through them once.
    let mut svc = tower::Layer::layer(
        &layer,
        tower::service_fn(|_: &'static str| async { Ok::<_, io::Error>(()) }),
    );
    for key in ["route:/users", "crm"] {
        futures_util::FutureExt::now_or_never(tower::Service::call(&mut svc, key))
            .unwrap()
            .unwrap();
    }
    handle
}

async fn send(
    router: &axum::Router,
    method: &str,
    uri: &str,
    auth: Option<&str>,
    body: &str,
) -> (StatusCode, serde_json::Value) {
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(auth) = auth {
        request = request.header("authorization", auth);
    }
    if !body.is_empty() {
        request = request.header("content-type", "application/json");
    }
    let response = router
        .clone()
        .oneshot(request.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, json)
}

#[tokio::test]
async fn no_route_works_without_the_token() {
    let handle = handle();
    let router = handle.router(TOKEN).unwrap();
    let wrong = format!("Bearer {}", TOKEN.replace('0', "1"));
    let prefix = format!("Bearer {}", &TOKEN[..TOKEN.len() - 1]);
    let longer = format!("Bearer {TOKEN}x");
    for auth in [
        None,
        Some(wrong.as_str()),
        Some(prefix.as_str()),
        Some(longer.as_str()),
        Some(TOKEN),
        Some("Basic b3BlcmF0b3I6c2VjcmV0"),
    ] {
        for (method, uri, body) in [
            ("GET", "/breakers", ""),
            ("GET", "/breakers/one?key=crm", ""),
            ("POST", "/breakers/reset", r#"{"key":"crm"}"#),
            ("POST", "/breakers/reset-all", ""),
            ("POST", "/breakers/force-open", r#"{"key":"crm"}"#),
            ("POST", "/breakers/force-closed", r#"{"key":"crm"}"#),
            ("GET", "/no-such-path", ""),
        ] {
            let (status, _) = send(&router, method, uri, auth, body).await;
            assert_eq!(
                status,
                StatusCode::UNAUTHORIZED,
                "{method} {uri} with {auth:?}"
            );
        }
    }
    assert_eq!(
        handle.get("crm").unwrap().state,
        State::Closed,
        "nothing was forced"
    );
}

#[tokio::test]
async fn with_the_token_it_lists_forces_and_resets() {
    let handle = handle();
    let router = handle.router(TOKEN).unwrap();
    let auth = format!("Bearer {TOKEN}");
    let auth = Some(auth.as_str());

    let (status, json) = send(&router, "GET", "/breakers", auth, "").await;
    assert_eq!(status, StatusCode::OK);
    let breakers = json["breakers"].as_array().unwrap();
    assert_eq!(breakers.len(), 2);
    assert_eq!(breakers[0]["key"], "crm");
    assert_eq!(breakers[1]["key"], "route:/users");
    assert_eq!(breakers[0]["state"], "closed");
    assert!(breakers[0]["time_in_state_ms"].is_u64());
    assert_eq!(breakers[0]["forced"], false);
    // Only an open breaker has a time left open.
    assert!(breakers[0]["remaining_open_ms"].is_null());

    let (status, _) = send(
        &router,
        "POST",
        "/breakers/force-open",
        auth,
        r#"{"key":"crm"}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(handle.get("crm").unwrap().state, State::ForcedOpen);
    let (_, json) = send(&router, "GET", "/breakers/one?key=crm", auth, "").await;
    assert_eq!(json["state"], "forced_open");
    assert_eq!(json["forced"], true);

    let body = r#"{"key":"route:/users"}"#;
    send(&router, "POST", "/breakers/force-closed", auth, body).await;
    assert_eq!(
        handle.get("route:/users").unwrap().state,
        State::ForcedClosed
    );

    let (status, json) = send(&router, "POST", "/breakers/reset", auth, r#"{"key":"crm"}"#).await;
    assert_eq!(
        (status, json["reset"][0].as_str()),
        (StatusCode::OK, Some("crm"))
    );
    assert_eq!(handle.get("crm").unwrap().state, State::Closed);
    let (_, json) = send(&router, "POST", "/breakers/reset-all", auth, "").await;
    assert_eq!(json["reset_all"], 2);
    assert_eq!(handle.get("route:/users").unwrap().state, State::Closed);

    let (status, json) = send(
        &router,
        "POST",
        "/breakers/force-open",
        auth,
        r#"{"key":"nope"}"#,
    )
    .await;
    assert_eq!(
        (status, json["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("UNKNOWN_BREAKER"))
    );
    let (status, _) = send(&router, "POST", "/breakers/force-open", auth, "{}").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = send(&router, "GET", "/no-such-path", auth, "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[test]
fn a_short_token_is_refused() {
    let err = handle().router("short").unwrap_err();
    assert_eq!(err.field(), "admin.token");
}

/// The request of issue 13: a key in the body but no `Content-Type`. axum's
/// `Option<Json<_>>` reads that as no body at all, which used to mean "reset
/// every breaker".
#[tokio::test]
async fn a_body_without_its_content_type_is_refused_and_changes_nothing() {
    let handle = handle();
    let router = handle.router(TOKEN).unwrap();
    let auth = format!("Bearer {TOKEN}");
    assert!(handle.force_open("crm"));
    assert!(handle.force_open("route:/users"));
    for path in [
        "/breakers/reset",
        "/breakers/force-open",
        "/breakers/force-closed",
    ] {
        let request = Request::builder()
            .method("POST")
            .uri(path)
            .header("authorization", &auth)
            .body(Body::from(r#"{"key":"crm"}"#))
            .unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        assert_eq!(
            response.status(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{path}"
        );
        let (status, json) = send(&router, "POST", path, Some(&auth), "{}").await;
        assert_eq!(
            (status, json["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("KEY_REQUIRED")),
            "{path} with no key"
        );
        let (status, json) = send(&router, "POST", path, Some(&auth), "not json").await;
        assert_eq!(
            (status.is_client_error(), json["code"].as_str()),
            (true, Some("BAD_BODY")),
            "{path} with a body that does not parse"
        );
    }
    for key in ["crm", "route:/users"] {
        assert_eq!(
            handle.get(key).unwrap().state,
            State::ForcedOpen,
            "{key} is untouched"
        );
    }
}
