//! An axum app on a real socket, `CircuitOpen` mapped to `503` by
//! `HandleErrorLayer`, called over plain HTTP/1.1.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceBuilder;
use tower_breaker::Policy;
use tower_breaker::{CircuitBreakerLayer, CircuitOpen};
use tower_classify::{BoxError, HttpClassifier};

async fn handle_error(err: BoxError) -> Response {
    match err.downcast_ref::<CircuitOpen>() {
        Some(open) => {
            let secs = open.remaining().map_or(1, |d| d.as_secs().max(1));
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [("retry-after", secs.to_string())],
                "CIRCUIT_OPEN",
            )
                .into_response()
        }
        None => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response(),
    }
}

/// One `GET /` over a fresh connection: status, headers (lowercased) and body.
async fn get_root(addr: std::net::SocketAddr) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head[9..12].parse().unwrap();
    (status, head.to_ascii_lowercase(), body.to_owned())
}

#[tokio::test]
async fn axum_app_maps_circuit_open_to_503_over_a_real_socket() {
    let hits = Arc::new(AtomicUsize::new(0));
    let breaker = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(3))
        .recovery_timeout(Duration::from_secs(30))
        .build(HttpClassifier::new())
        .unwrap();
    let app = Router::new()
        .route(
            "/",
            get({
                let hits = Arc::clone(&hits);
                move || async move {
                    hits.fetch_add(1, Ordering::SeqCst);
                    (StatusCode::BAD_GATEWAY, "upstream down")
                }
            }),
        )
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(handle_error))
                .layer(breaker),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    // axum clones the service per request: the breaker still sees all three.
    for _ in 0..3 {
        let (status, _, body) = get_root(addr).await;
        assert_eq!((status, body.as_str()), (502, "upstream down"));
    }
    let (status, head, body) = get_root(addr).await;
    assert_eq!(status, 503);
    assert!(
        head.contains("retry-after: 30") || head.contains("retry-after: 29"),
        "{head}"
    );
    assert_eq!(body, "CIRCUIT_OPEN");
    assert_eq!(
        hits.load(Ordering::SeqCst),
        3,
        "the handler was not called while open"
    );
    server.abort();
}
