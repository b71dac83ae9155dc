//! The idempotency guard in front of the family's real refusing layers
//! (issue 31, item 5): only a refusal that proves the handler never ran
//! frees a key.
//!
//! ```text
//! IdempotencyGuard → handler → CircuitBreaker → dependency     (a), (b)
//! IdempotencyGuard → CircuitBreaker → handler                  (c)
//! ```
//!
//! In (a) and (b) the handler acts (writes the order), then calls a
//! dependency whose breaker is open and passes the refusal on as its own
//! answer: the key is kept and a repeat does not run the handler again. In
//! (c) the breaker between the guard and the handler refuses the request
//! itself: the key is freed and the repeat runs. No sockets, paused time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::util::BoxCloneService;
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_breaker::answer::{Http503, HttpError};
use tower_breaker::{BreakerHandle, CircuitBreakerLayer, CircuitOpen};
use tower_classify::{ErrorChainClassifier, HttpClassifier};
use tower_idempotency::store::MemoryIdempotencyStore;
use tower_idempotency::{GuardBody, IdempotencyGuardLayer};

type Body = Full<Bytes>;

/// The handler's client for its dependency, boxed as a client usually is.
type Inventory = BoxCloneService<Request<Body>, Response<Body>, BoxError>;

fn order(key: &str) -> Request<Body> {
    Request::post("http://orders.internal/orders")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(br#"{"sku":42}"#)))
        .unwrap()
}

fn created() -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from_static(b"order written")));
    *response.status_mut() = StatusCode::CREATED;
    response
}

fn guard() -> IdempotencyGuardLayer<MemoryIdempotencyStore> {
    IdempotencyGuardLayer::new(MemoryIdempotencyStore::new(100))
}

fn replayed<B>(response: &Response<B>) -> bool {
    response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

/// Reads a response to its end, as a client does (the guard records it
/// there), and returns its status and the guard's `code`, if any.
async fn read<B>(response: Response<GuardBody<B>>) -> (StatusCode, String)
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let code = serde_json_code(&body);
    (status, code)
}

/// The `"code"` of a JSON body (the guard's problem body, the breaker's
/// `CIRCUIT_OPEN`), or the empty string.
fn serde_json_code(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    text.split(r#""code":""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_default()
        .to_owned()
}

/// An open breaker of the family's in front of `dependency`.
fn open_breaker_layer<C>(classifier: C) -> (CircuitBreakerLayer<C>, BreakerHandle) {
    let layer = CircuitBreakerLayer::builder()
        .name("inventory")
        .build(classifier)
        .unwrap();
    let handle = layer.handle();
    assert!(handle.force_open("inventory"));
    (layer, handle)
}

/// (a) The handler writes the order, then asks the inventory service through
/// its client's breaker, which is open: the `CircuitOpen` comes back through
/// `?` as the handler's error. The order was written, so the key is kept.
#[tokio::test(start_paused = true)]
async fn item_5_a_handler_that_returns_a_downstream_circuit_open_runs_once() {
    let (breaker, _handle) = open_breaker_layer(ErrorChainClassifier::new());
    let inventory = Inventory::new(breaker.layer(service_fn(|_: Request<Body>| async {
        Ok::<_, BoxError>(Response::new(Full::new(Bytes::new())))
    })));
    let written = Arc::new(AtomicUsize::new(0));
    let handler = service_fn({
        let written = Arc::clone(&written);
        move |_: Request<GuardBody<Body>>| {
            let written = Arc::clone(&written);
            let inventory = inventory.clone();
            async move {
                written.fetch_add(1, Ordering::SeqCst);
                let reserve = Request::post("http://inventory.internal/reserve")
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                inventory.oneshot(reserve).await?;
                Ok::<_, BoxError>(created())
            }
        }
    });
    let service = guard().layer(handler);

    let error = service.clone().oneshot(order("a")).await.unwrap_err();
    assert!(error.is::<CircuitOpen>(), "{error}");
    let repeat = service.clone().oneshot(order("a")).await.unwrap();
    assert_eq!(
        read(repeat).await,
        (StatusCode::CONFLICT, "idempotency_response_not_kept".into())
    );
    assert_eq!(
        written.load(Ordering::SeqCst),
        1,
        "the order is written once"
    );
}

/// (b) The same with the breaker's `Http503` answer: the handler passes on the
/// dependency's `503 CIRCUIT_OPEN` (which carries the `Failure` extension)
/// as its own answer, after writing the order. It is stored and replayed.
#[tokio::test(start_paused = true)]
async fn item_5_a_handler_that_passes_on_a_downstream_503_circuit_open_runs_once() {
    let (breaker, _handle) = open_breaker_layer(HttpClassifier::new());
    let inventory = Inventory::new(breaker.answer(Http503).layer(service_fn(
        |_: Request<Body>| async { Ok::<_, BoxError>(Response::new(Full::new(Bytes::new()))) },
    )));
    let written = Arc::new(AtomicUsize::new(0));
    let handler = service_fn({
        let written = Arc::clone(&written);
        move |_: Request<GuardBody<Body>>| {
            let written = Arc::clone(&written);
            let inventory = inventory.clone();
            async move {
                written.fetch_add(1, Ordering::SeqCst);
                let reserve = Request::post("http://inventory.internal/reserve")
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                inventory.oneshot(reserve).await
            }
        }
    });
    let service = guard().layer(handler);

    let first = service.clone().oneshot(order("b")).await.unwrap();
    assert_eq!(
        read(first).await,
        (StatusCode::SERVICE_UNAVAILABLE, "CIRCUIT_OPEN".into())
    );
    let repeat = service.clone().oneshot(order("b")).await.unwrap();
    assert!(replayed(&repeat), "the handler's answer is replayed");
    assert_eq!(
        read(repeat).await,
        (StatusCode::SERVICE_UNAVAILABLE, "CIRCUIT_OPEN".into())
    );
    assert_eq!(
        written.load(Ordering::SeqCst),
        1,
        "the order is written once"
    );
}

/// (c) A breaker between the guard and the handler refuses the request
/// itself, before the handler: the key is freed, the repeat (once the
/// breaker is closed) runs the handler, and the one after that is replayed.
#[tokio::test(start_paused = true)]
async fn item_5_a_breaker_between_the_guard_and_the_handler_frees_the_key() {
    let (breaker, handle) = open_breaker_layer(HttpClassifier::new());
    let written = Arc::new(AtomicUsize::new(0));
    let handler = service_fn({
        let written = Arc::clone(&written);
        move |_: Request<GuardBody<Body>>| {
            written.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, BoxError>(created()) }
        }
    });
    let service = guard().layer(breaker.answer(Http503).layer(handler));

    let refused = service.clone().oneshot(order("c")).await.unwrap();
    assert_eq!(
        read(refused).await,
        (StatusCode::SERVICE_UNAVAILABLE, "CIRCUIT_OPEN".into())
    );
    assert_eq!(
        written.load(Ordering::SeqCst),
        0,
        "refused before the handler"
    );

    assert!(handle.reset("inventory"));
    let retry = service.clone().oneshot(order("c")).await.unwrap();
    assert!(!replayed(&retry));
    assert_eq!(read(retry).await.0, StatusCode::CREATED);
    let repeat = service.clone().oneshot(order("c")).await.unwrap();
    assert!(replayed(&repeat));
    assert_eq!(read(repeat).await.0, StatusCode::CREATED);
    assert_eq!(
        written.load(Ordering::SeqCst),
        1,
        "the order is written once"
    );
}

/// (c) with a gRPC breaker (a `GrpcClassifier`, the error-returning
/// `HttpError` answer) between the guard and the handler: its `CircuitOpen`
/// error frees the key too.
#[tokio::test(start_paused = true)]
async fn item_5_a_grpc_breakers_circuit_open_between_the_guard_and_the_handler_frees_the_key() {
    let (breaker, handle) = open_breaker_layer(tower_classify::GrpcClassifier::new());
    let written = Arc::new(AtomicUsize::new(0));
    let handler = service_fn({
        let written = Arc::clone(&written);
        move |_: Request<GuardBody<Body>>| {
            written.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, BoxError>(created()) }
        }
    });
    let service = guard().layer(breaker.answer(HttpError).layer(handler));

    let error = service.clone().oneshot(order("c-grpc")).await.unwrap_err();
    assert!(error.is::<CircuitOpen>(), "{error}");
    assert_eq!(
        written.load(Ordering::SeqCst),
        0,
        "refused before the handler"
    );

    assert!(handle.reset("inventory"));
    let retry = service.clone().oneshot(order("c-grpc")).await.unwrap();
    assert!(!replayed(&retry));
    assert_eq!(read(retry).await.0, StatusCode::CREATED);
    assert_eq!(written.load(Ordering::SeqCst), 1);
}
