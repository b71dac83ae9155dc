//! The first hour under failure (issue 36): a new user's axum server, with
//! the idempotency guard in front of a handler that calls a flaky
//! dependency through the family's layers, on a real socket.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Router};
use bytes::Bytes;
use examples::client::http_client;
use http::{Request, StatusCode};
use http_body_util::Full;
use tower::util::BoxCloneSyncService;
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_breaker::{BreakerHandle, CircuitBreakerLayer};
use tower_classify::http_status::not_run;
use tower_classify::{ErrorChainClassifier, RefusalToken};
use tower_idempotency::store::MemoryIdempotencyStore;
use tower_idempotency::IdempotencyGuardLayer;

/// The handler's client for its dependency.
type Inventory = BoxCloneSyncService<(), (), BoxError>;

#[derive(Clone)]
struct Orders {
    inventory: Inventory,
    written: Arc<AtomicUsize>,
}

/// Reserves stock first, and writes the order only once that worked: when
/// the reservation is refused, nothing happened, and it says so.
async fn create_order(
    State(orders): State<Orders>,
    token: Option<Extension<RefusalToken>>,
) -> Response {
    if let Err(error) = orders.inventory.oneshot(()).await {
        return not_run(&error, token.map(|Extension(token)| token));
    }
    orders.written.fetch_add(1, Ordering::SeqCst);
    (StatusCode::CREATED, "order written").into_response()
}

/// An axum server on `127.0.0.1:0` with `POST /orders` behind the guard, the
/// inventory behind a breaker of the family; its URL, the breaker's handle
/// and the count of orders written.
async fn server() -> (String, BreakerHandle, Arc<AtomicUsize>) {
    let breaker = CircuitBreakerLayer::builder()
        .name("inventory")
        .build(ErrorChainClassifier::new())
        .unwrap();
    let handle = breaker.handle();
    let inventory = Inventory::new(breaker.layer(service_fn(|()| async { Ok::<_, BoxError>(()) })));
    let written = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/orders", post(create_order))
        .with_state(Orders {
            inventory,
            written: Arc::clone(&written),
        })
        .layer(IdempotencyGuardLayer::new(MemoryIdempotencyStore::new(100)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, handle, written)
}

fn order(url: &str, key: &str) -> Request<Full<Bytes>> {
    Request::post(format!("{url}/orders"))
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(br#"{"sku":42}"#)))
        .unwrap()
}

/// Item 2: a handler that answers a refusal with the one call `not_run`
/// frees its key, so the client's retry with the same key runs the handler
/// once the dependency is back (and the answer after that is replayed).
#[tokio::test]
async fn first_hour_2_a_handler_answering_not_run_frees_the_key() {
    let (url, breaker, written) = server().await;
    let client = http_client();
    assert!(breaker.force_open("inventory"));

    let refused = client.clone().oneshot(order(&url, "k-2")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    assert_eq!(written.load(Ordering::SeqCst), 0);

    // The dependency recovers; the client retries with the same key.
    assert!(breaker.force_closed("inventory"));
    let retried = client.clone().oneshot(order(&url, "k-2")).await.unwrap();
    assert_eq!(retried.status(), StatusCode::CREATED, "the handler ran");
    assert!(!retried.headers().contains_key("idempotent-replayed"));
    assert_eq!(written.load(Ordering::SeqCst), 1);

    let repeat = client.clone().oneshot(order(&url, "k-2")).await.unwrap();
    assert_eq!(repeat.status(), StatusCode::CREATED);
    assert_eq!(repeat.headers()["idempotent-replayed"], "true");
    assert_eq!(
        written.load(Ordering::SeqCst),
        1,
        "the order is written once"
    );
}
