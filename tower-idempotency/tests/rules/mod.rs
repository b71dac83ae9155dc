//! The guard's rules, written once for any store: `tests/guard.rs` runs them
//! on the in-memory store (paused time), `tests/redis.rs` on Redis (real,
//! short TTLs).
//!
//! Request bodies arrive in chunks ([`Chunks`]) that report no length, as a
//! streamed upload does, so the guard learns a body only by reading it.

#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use serde_json::Value;
use tokio::sync::Semaphore;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};
use tower_classify::{BoxError, Classified, Failure, FailureKind, RefusalToken};
use tower_idempotency::store::{Claim, ClaimToken, Completion, IdempotencyStore, StoredResponse};
use tower_idempotency::{GuardBody, IdempotencyGuardLayer};

pub type InBody = GuardBody<Chunks>;
pub type Guarded = BoxCloneService<Request<Chunks>, Response<GuardBody<OrderBody>>, BoxError>;

/// A request body of the given chunks, one frame each, with no declared
/// length.
pub struct Chunks(VecDeque<Bytes>);

impl Chunks {
    pub fn new(chunks: &[&'static str]) -> Self {
        Chunks(
            chunks
                .iter()
                .map(|c| Bytes::from_static(c.as_bytes()))
                .collect(),
        )
    }
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(self.0.pop_front().map(|c| Ok(Frame::data(c))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

/// The service behind the guard: an order API whose behaviour depends on the
/// path, counting how often each path was really called.
#[derive(Clone)]
pub struct Orders {
    calls: Arc<Mutex<HashMap<String, usize>>>,
    /// Paths refused once as a layer below the guard would (an open
    /// breaker, with the request's `RefusalToken`): before the handler,
    /// which does not count the call.
    refused: Arc<Mutex<HashMap<String, usize>>>,
    /// `/slow` waits for a permit, so a test can hold a request in flight;
    /// the bodies of `/trickle` and `/flood` wait for one before their last
    /// chunk.
    pub gate: Arc<Semaphore>,
}

impl Default for Orders {
    fn default() -> Self {
        Orders {
            calls: Arc::default(),
            refused: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }
}

/// The order API's response body: whole, or chunks whose last one comes
/// once the gate opens (a response the handler is still producing).
pub struct OrderBody {
    chunks: Vec<Bytes>,
    gate: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    trailers: Option<http::HeaderMap>,
}

impl Body for OrderBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.chunks.len() == 1 {
            if let Some(gate) = self.gate.as_mut() {
                std::task::ready!(gate.as_mut().poll(cx));
                self.gate = None;
            }
        }
        if self.chunks.is_empty() {
            return Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))));
        }
        Poll::Ready(Some(Ok(Frame::data(self.chunks.remove(0)))))
    }
}

impl Orders {
    pub fn calls(&self, path: &str) -> usize {
        self.calls.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    pub fn refused(&self, path: &str) -> usize {
        self.refused.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    async fn handle(self, request: Request<InBody>) -> Result<Response<OrderBody>, BoxError> {
        let path = request.uri().path().to_owned();
        if path.starts_with("/shed") {
            let first = {
                let mut refused = self.refused.lock().unwrap();
                let n = refused.entry(path.clone()).or_default();
                *n += 1;
                *n == 1
            };
            // Refused as a layer between the guard and the handler refuses:
            // with the token the guard gave this request.
            let refused = Failure::new(FailureKind::Shed)
                .with_refusal(request.extensions().get::<RefusalToken>().copied());
            if first && path == "/shed" {
                return Err(Classified::new(refused, "circuit open").into());
            }
            if first {
                let mut response = Response::new(OrderBody {
                    chunks: vec![Bytes::from("circuit open")],
                    gate: None,
                    trailers: None,
                });
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                response.extensions_mut().insert(refused);
                return Ok(response);
            }
        }
        if path.starts_with("/acted-then") {
            // The handler acted (the order is written), then called a
            // dependency whose breaker was open, and passes its refusal on
            // as its own answer.
            self.count(&path);
            if path == "/acted-then-circuit-open" {
                return Err(Classified::shed("circuit open", None).into());
            }
            // A refusal that proves something, but of another call's request.
            let another_call =
                (path == "/acted-then-503-of-another-call").then(RefusalToken::issue);
            let mut response = Response::new(OrderBody {
                chunks: vec![Bytes::from("circuit open")],
                gate: None,
                trailers: None,
            });
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            response
                .extensions_mut()
                .insert(Failure::new(FailureKind::Shed).with_refusal(another_call));
            return Ok(response);
        }
        let mut body = request.into_body();
        if path == "/peek" {
            // Answers from the first chunk alone, leaving the rest unread.
            let first = body.frame().await.transpose()?;
            let first = first.and_then(|f| f.into_data().ok()).unwrap_or_default();
            let n = self.count(&path);
            return Ok(whole(format!(
                "peeked order {n} for {}",
                String::from_utf8_lossy(&first)
            )));
        }
        // The guard hashes the body as it is read; the handler gets all of
        // it.
        let body = body.collect().await?.to_bytes();
        let n = self.count(&path);
        let mut gate = None;
        let (status, text) = match path.as_str() {
            "/slow" => {
                self.gate.acquire().await?.forget();
                (201, format!("slow order {n}"))
            }
            "/sleepy" => {
                let millis = String::from_utf8_lossy(&body).parse::<u64>()?;
                tokio::time::sleep(Duration::from_millis(millis)).await;
                (201, format!("sleepy order {n}"))
            }
            "/flaky" if n == 1 => (503, "try again".to_owned()),
            "/throttled" if n == 1 => (429, "slow down".to_owned()),
            "/error" if n == 1 => return Err("the order table is gone".into()),
            "/reset" if n == 1 => {
                return Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset).into())
            }
            "/invalid" => (400, "unknown sku".to_owned()),
            "/big" => (201, "x".repeat(2048)),
            "/trickle" | "/flood" => {
                let gate_source = self.gate.clone();
                gate = Some(Box::pin(async move {
                    gate_source.acquire().await.unwrap().forget();
                })
                    as Pin<Box<dyn Future<Output = ()> + Send>>);
                if path == "/flood" {
                    (201, "y".repeat(1800))
                } else {
                    (201, format!("trickled order {n}"))
                }
            }
            _ => (
                201,
                format!("order {n} for {}", String::from_utf8_lossy(&body)),
            ),
        };
        let bytes = Bytes::from(text);
        let chunks = match path.as_str() {
            // Three chunks of 600: past a 1024-byte limit before the last.
            "/flood" => vec![
                bytes.slice(..600),
                bytes.slice(600..1200),
                bytes.slice(1200..),
            ],
            "/trickle" => vec![bytes.slice(..4), bytes.slice(4..)],
            _ => vec![bytes],
        };
        let trailers = (path == "/grpc").then(|| {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", "0".parse().unwrap());
            trailers.insert("grpc-message", format!("order {n}").parse().unwrap());
            trailers
        });
        let mut response = Response::new(OrderBody {
            chunks,
            gate,
            trailers,
        });
        *response.status_mut() = StatusCode::from_u16(status).unwrap();
        let headers = response.headers_mut();
        headers.insert("x-order-number", n.into());
        headers.insert("content-type", "text/plain".parse().unwrap());
        headers.insert("set-cookie", format!("session=order-{n}").parse().unwrap());
        Ok(response)
    }
}

impl Orders {
    fn count(&self, path: &str) -> usize {
        let mut calls = self.calls.lock().unwrap();
        let n = calls.entry(path.to_owned()).or_default();
        *n += 1;
        *n
    }
}

fn whole(text: String) -> Response<OrderBody> {
    let mut response = Response::new(OrderBody {
        chunks: vec![Bytes::from(text)],
        gate: None,
        trailers: None,
    });
    *response.status_mut() = StatusCode::CREATED;
    response
}

pub fn guarded<St: IdempotencyStore>(layer: IdempotencyGuardLayer<St>, orders: &Orders) -> Guarded {
    let orders = orders.clone();
    let service = layer.layer(service_fn(move |req| orders.clone().handle(req)));
    BoxCloneService::new(service)
}

pub fn post(path: &str, key: &str, body: &'static str) -> Request<Chunks> {
    post_chunks(path, key, &[body])
}

/// A POST whose body arrives in `chunks`.
pub fn post_chunks(path: &str, key: &str, chunks: &[&'static str]) -> Request<Chunks> {
    Request::post(format!("http://orders.internal{path}"))
        .header("idempotency-key", key)
        .body(Chunks::new(chunks))
        .unwrap()
}

pub async fn send(service: &Guarded, request: Request<Chunks>) -> Response<GuardBody<OrderBody>> {
    service.clone().oneshot(request).await.unwrap()
}

/// Sends `request` and reads the whole response, as a client does: a
/// guarded response is recorded when its body ends, so a repeat sent after
/// this returns finds it.
pub async fn call(service: &Guarded, request: Request<Chunks>) -> Response<Bytes> {
    let (parts, body) = send(service, request).await.into_parts();
    Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
}

pub async fn text(response: Response<GuardBody<OrderBody>>) -> (StatusCode, String) {
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// The guard's own answer: its status and its problem body.
pub async fn problem(response: Response<GuardBody<OrderBody>>) -> (StatusCode, Value) {
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let (status, body) = text(response).await;
    let json: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["status"], status.as_u16());
    assert!(json["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(json["detail"].as_str().is_some_and(|d| !d.is_empty()));
    assert!(json["type"]
        .as_str()
        .is_some_and(|t| t.starts_with("https://")));
    (status, json)
}

/// The status and `code` of the guard's own answer.
pub async fn rejection(response: Response<GuardBody<OrderBody>>) -> (StatusCode, String) {
    let (status, json) = problem(response).await;
    (status, json["code"].as_str().unwrap().to_owned())
}

pub fn replayed<B>(response: &Response<B>) -> bool {
    response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

/// Waits (on paused or real time) until `done` holds, for at most 10 s.
pub async fn eventually(mut done: impl FnMut() -> bool) {
    let started = tokio::time::Instant::now();
    while !done() {
        assert!(started.elapsed() < Duration::from_secs(10), "timed out");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A repeat of a key whose request ran but whose response was not kept:
/// 409 with the reason, and the handler is not called again.
pub async fn assert_not_kept(service: &Guarded, request: Request<Chunks>, reason: &str) {
    let response = send(service, request).await;
    assert!(response.headers().get("retry-after").is_none());
    let (status, json) = problem(response).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(json["code"], "idempotency_response_not_kept");
    assert_eq!(json["reason"], reason);
}

// ===== The rules =====

pub async fn replays_the_first_response<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store), &orders);

    let first = send(&service, post("/orders", "k-replay", r#"{"sku":1}"#)).await;
    assert!(!replayed(&first));
    assert_eq!(first.headers()["x-order-number"], "1");
    let first = text(first).await;
    assert_eq!(
        first,
        (StatusCode::CREATED, r#"order 1 for {"sku":1}"#.to_owned())
    );

    for _ in 0..3 {
        let repeat = send(&service, post("/orders", "k-replay", r#"{"sku":1}"#)).await;
        assert!(replayed(&repeat), "a repeat is marked as replayed");
        assert_eq!(repeat.headers()["x-order-number"], "1");
        assert_eq!(repeat.headers()["content-type"], "text/plain");
        assert_eq!(repeat.headers()["set-cookie"], "session=order-1");
        assert_eq!(text(repeat).await, first);
    }
    assert_eq!(orders.calls("/orders"), 1, "the order was created once");

    // Another key is another request.
    let other = send(&service, post("/orders", "k-replay-2", r#"{"sku":1}"#)).await;
    assert!(!replayed(&other));
    assert_eq!(orders.calls("/orders"), 2);
}

pub async fn conflicts_while_in_flight<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store), &orders);

    let first = tokio::spawn(service.clone().oneshot(post("/slow", "k-busy", "{}")));
    eventually(|| orders.calls("/slow") == 1).await;
    let repeat = send(&service, post("/slow", "k-busy", "{}")).await;
    assert_eq!(repeat.headers()["retry-after"], "1");
    assert_eq!(
        rejection(repeat).await,
        (StatusCode::CONFLICT, "idempotency_key_in_use".to_owned())
    );

    orders.gate.add_permits(1);
    let first = first.await.unwrap().unwrap();
    assert_eq!(text(first).await.0, StatusCode::CREATED);
    let after = send(&service, post("/slow", "k-busy", "{}")).await;
    assert!(replayed(&after));
    assert_eq!(orders.calls("/slow"), 1);
}

pub async fn refuses_a_reused_key_for_another_request<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store), &orders);
    let first = call(&service, post("/orders", "k-reuse", r#"{"sku":1}"#)).await;
    assert_eq!(first.status(), StatusCode::CREATED);

    let mismatch = (
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency_key_reused".to_owned(),
    );
    // Another body, another path, another method: each is refused.
    let other_body = send(&service, post("/orders", "k-reuse", r#"{"sku":2}"#)).await;
    assert_eq!(rejection(other_body).await, mismatch);
    let other_path = send(&service, post("/orders/2", "k-reuse", r#"{"sku":1}"#)).await;
    assert_eq!(rejection(other_path).await, mismatch);
    let mut patch = post("/orders", "k-reuse", r#"{"sku":1}"#);
    *patch.method_mut() = http::Method::PATCH;
    assert_eq!(rejection(send(&service, patch).await).await, mismatch);
    assert_eq!(orders.calls("/orders"), 1);
    assert_eq!(orders.calls("/orders/2"), 0);

    // While the first is in flight its handler may still be reading its
    // body: another path is refused, another body is told to wait.
    let slow = tokio::spawn(service.clone().oneshot(post("/slow", "k-reuse-busy", "a")));
    eventually(|| orders.calls("/slow") == 1).await;
    let during = send(&service, post("/slow?again", "k-reuse-busy", "a")).await;
    assert_eq!(rejection(during).await, mismatch);
    let during = send(&service, post("/slow", "k-reuse-busy", "b")).await;
    assert_eq!(
        rejection(during).await,
        (StatusCode::CONFLICT, "idempotency_key_in_use".to_owned())
    );
    orders.gate.add_permits(1);
    text(slow.await.unwrap().unwrap()).await;
    // Once it is done its body is known: another body is refused.
    let after = send(&service, post("/slow", "k-reuse-busy", "b")).await;
    assert_eq!(rejection(after).await, mismatch);
    assert!(replayed(
        &send(&service, post("/slow", "k-reuse-busy", "a")).await
    ));
    assert_eq!(orders.calls("/slow"), 1);
}

/// The fingerprint covers the body as far as the handler read it. A body in
/// other chunks is the same body; a longer or shorter one is not. A handler
/// that answered from the first chunk alone saw only that: repeats that
/// start with the same bytes are the same request, whatever follows.
pub async fn the_body_counts_as_far_as_the_handler_read_it<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store), &orders);
    let mismatch = (
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency_key_reused".to_owned(),
    );

    let first = send(&service, post_chunks("/orders", "k-whole", &["ab", "cd"])).await;
    assert_eq!(text(first).await.1, "order 1 for abcd");
    for chunks in [&["abcd"][..], &["a", "bc", "d"], &["", "abcd", ""]] {
        let repeat = send(&service, post_chunks("/orders", "k-whole", chunks)).await;
        assert!(replayed(&repeat), "{chunks:?} is the same body");
    }
    for chunks in [&["abcde"][..], &["ab", "cd", "e"], &["abc"], &["abdc"], &[]] {
        let repeat = send(&service, post_chunks("/orders", "k-whole", chunks)).await;
        assert_eq!(rejection(repeat).await, mismatch, "{chunks:?}");
    }
    assert_eq!(orders.calls("/orders"), 1);

    let first = send(&service, post_chunks("/peek", "k-peek", &["abc", "def"])).await;
    assert_eq!(text(first).await.1, "peeked order 1 for abc");
    for chunks in [
        &["abc", "def"][..],
        &["abc", "xyz"],
        &["abc"],
        &["abcdef"],
        &["a", "bc"],
    ] {
        let repeat = send(&service, post_chunks("/peek", "k-peek", chunks)).await;
        assert!(replayed(&repeat), "{chunks:?} starts with what was read");
        assert_eq!(text(repeat).await.1, "peeked order 1 for abc");
    }
    for chunks in [&["abd", "def"][..], &["ab"], &[]] {
        let repeat = send(&service, post_chunks("/peek", "k-peek", chunks)).await;
        assert_eq!(rejection(repeat).await, mismatch, "{chunks:?}");
    }
    assert_eq!(orders.calls("/peek"), 1);
}

/// A streamed response reaches the client as it comes, and is recorded when
/// it ends: a repeat meanwhile is told the key is in use, a repeat after is
/// the stored response, a repeat with another body is refused.
pub async fn a_streamed_response_is_recorded_when_it_ends<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store), &orders);
    let first = send(&service, post("/trickle", "k-stream", "{}")).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let mut body = first.into_body();
    let chunk = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(
        chunk, "tric",
        "the first chunk, while the handler holds the rest"
    );
    let during = send(&service, post("/trickle", "k-stream", "{}")).await;
    assert_eq!(
        rejection(during).await,
        (StatusCode::CONFLICT, "idempotency_key_in_use".to_owned())
    );
    orders.gate.add_permits(1);
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "kled order 1");
    let repeat = send(&service, post("/trickle", "k-stream", "{}")).await;
    assert!(
        replayed(&repeat),
        "recorded by the time the client saw the end"
    );
    assert_eq!(text(repeat).await.1, "trickled order 1");
    let other = send(&service, post("/trickle", "k-stream", "{ }")).await;
    assert_eq!(
        rejection(other).await,
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_key_reused".to_owned()
        )
    );
    assert_eq!(orders.calls("/trickle"), 1);
}

pub async fn refuses_a_key_over_255_characters<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store), &orders);
    let long = "k".repeat(256);
    let response = send(&service, post("/orders", &long, "{}")).await;
    assert_eq!(
        rejection(response).await,
        (
            StatusCode::BAD_REQUEST,
            "idempotency_key_too_long".to_owned()
        )
    );
    assert_eq!(orders.calls("/orders"), 0, "the request did not run");

    let longest = "k".repeat(255);
    let response = call(&service, post("/orders", &longest, "{}")).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert!(replayed(
        &send(&service, post("/orders", &longest, "{}")).await
    ));
}

/// By default a transient answer is the answer: stored and replayed, the
/// handler runs once. An error after the handler started is recorded as not
/// kept: the repeat gets 409, the handler runs once.
pub async fn transient_answers_and_errors_run_once<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store), &orders);
    for (path, transient) in [
        ("/flaky", StatusCode::SERVICE_UNAVAILABLE),
        ("/throttled", StatusCode::TOO_MANY_REQUESTS),
        ("/invalid", StatusCode::BAD_REQUEST),
    ] {
        let key = format!("k-once{path}");
        let first = call(&service, post(path, &key, "{}")).await;
        assert_eq!(first.status(), transient);
        let repeat = send(&service, post(path, &key, "{}")).await;
        assert!(replayed(&repeat), "{path}: the stored answer is replayed");
        assert_eq!(repeat.status(), transient);
        assert_eq!(orders.calls(path), 1, "{path} ran once");
    }

    for path in ["/error", "/reset"] {
        let key = format!("k-once{path}");
        let error = service
            .clone()
            .oneshot(post(path, &key, "{}"))
            .await
            .expect_err("the service's error comes back as it is");
        assert!(!error.to_string().is_empty());
        assert_not_kept(&service, post(path, &key, "{}"), "service_error").await;
        assert_eq!(orders.calls(path), 1, "{path} ran once");
    }
}

/// With `release_on_transient(true)`, a transient answer or error frees the
/// key and the retry runs again; a permanent one is still kept.
pub async fn release_on_transient_is_an_opt_in<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let layer = IdempotencyGuardLayer::new(store).release_on_transient(true);
    let service = guarded(layer, &orders);
    for path in ["/flaky", "/throttled"] {
        let key = format!("k-release{path}");
        let first = call(&service, post(path, &key, "{}")).await;
        assert!(first.status().is_server_error() || first.status() == 429);
        let retry = call(&service, post(path, &key, "{}")).await;
        assert!(!replayed(&retry));
        assert_eq!(retry.status(), StatusCode::CREATED);
        assert!(replayed(&send(&service, post(path, &key, "{}")).await));
        assert_eq!(orders.calls(path), 2);
    }
    // A connection reset is transient: released. An unknown error is not.
    let error = service
        .clone()
        .oneshot(post("/reset", "k-release-reset", "{}"))
        .await;
    assert!(error.is_err());
    let retry = call(&service, post("/reset", "k-release-reset", "{}")).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(orders.calls("/reset"), 2);
    let error = service
        .clone()
        .oneshot(post("/error", "k-release-error", "{}"))
        .await;
    assert!(error.is_err());
    assert_not_kept(
        &service,
        post("/error", "k-release-error", "{}"),
        "service_error",
    )
    .await;
    assert_eq!(orders.calls("/error"), 1);
}

/// A refusal made below the guard before the handler ran (an open breaker,
/// as an error or as its 503 response), carrying the request's
/// `RefusalToken`, frees the key: the retry runs, once. With
/// `release_on_shed(false)` the refusal is stored like any answer.
pub async fn shed_refusals_free_the_key<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store.clone()), &orders);
    let error = service.clone().oneshot(post("/shed", "k-shed", "{}")).await;
    assert!(error.is_err());
    let retry = call(&service, post("/shed", "k-shed", "{}")).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!((orders.refused("/shed"), orders.calls("/shed")), (2, 1));

    let refused = call(&service, post("/shed-response", "k-shed-2", "{}")).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    let retry = call(&service, post("/shed-response", "k-shed-2", "{}")).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(replayed(
        &send(&service, post("/shed-response", "k-shed-2", "{}")).await
    ));
    assert_eq!(orders.calls("/shed-response"), 1);

    let kept = Orders::default();
    let service = guarded(
        IdempotencyGuardLayer::new(store).release_on_shed(false),
        &kept,
    );
    let refused = call(&service, post("/shed-response", "k-shed-3", "{}")).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    let repeat = send(&service, post("/shed-response", "k-shed-3", "{}")).await;
    assert!(replayed(&repeat), "the refusal is the stored answer");
    assert_eq!(repeat.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        (kept.refused("/shed-response"), kept.calls("/shed-response")),
        (1, 0)
    );
}

/// A handler that acted and then passed on a dependency's refusal (an open
/// breaker's error, or its 503 carrying the `Failure` extension, with no
/// token or another call's) ran: its key is kept, and a repeat is answered
/// without running it again.
pub async fn a_refusal_passed_on_after_acting_keeps_the_key<St: IdempotencyStore>(
    store: St,
    path: &str,
) {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store), &orders);
    let key = format!("k{path}");
    match service.clone().oneshot(post(path, &key, "{}")).await {
        Err(error) => {
            assert_eq!(error.to_string(), "circuit open");
            assert_not_kept(&service, post(path, &key, "{}"), "service_error").await;
        }
        Ok(first) => {
            let (status, body) = text(first).await;
            assert_eq!((status.as_u16(), body.as_str()), (503, "circuit open"));
            let repeat = send(&service, post(path, &key, "{}")).await;
            assert!(replayed(&repeat), "the refusal is the stored answer");
            assert_eq!(repeat.status(), StatusCode::SERVICE_UNAVAILABLE);
        }
    }
    assert_eq!(orders.calls(path), 1, "the handler ran once");
}

/// A response ended by trailers (gRPC's `grpc-status`) is replayed with
/// them.
pub async fn trailers_are_replayed<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store), &orders);
    let first = send(&service, post("/grpc", "k-grpc", "{}")).await;
    let first = first.into_body().collect().await.unwrap();
    let trailers = first.trailers().cloned().expect("the handler's trailers");
    let repeat = send(&service, post("/grpc", "k-grpc", "{}")).await;
    assert!(replayed(&repeat));
    let repeat = repeat.into_body().collect().await.unwrap();
    assert_eq!(repeat.trailers(), Some(&trailers));
    assert_eq!(repeat.to_bytes(), first.to_bytes());
    assert_eq!(orders.calls("/grpc"), 1);
}

/// `wait` lets the TTL pass: paused time for the memory store, a real (short)
/// sleep for Redis.
pub async fn keys_expire_after_the_ttl<St, W, F>(store: St, ttl: Duration, wait: W)
where
    St: IdempotencyStore,
    W: Fn(Duration) -> F,
    F: Future<Output = ()>,
{
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store).ttl(ttl), &orders);
    call(&service, post("/orders", "k-ttl", "{}")).await;
    wait(ttl / 2).await;
    assert!(replayed(
        &send(&service, post("/orders", "k-ttl", "{}")).await
    ));
    wait(ttl).await;
    let after = send(&service, post("/orders", "k-ttl", "{}")).await;
    assert!(!replayed(&after), "an expired key runs again");
    assert_eq!(orders.calls("/orders"), 2);
}

fn stored() -> Completion {
    Completion::Response(StoredResponse {
        status: 201,
        headers: Vec::new(),
        body: "ok".into(),
        trailers: Vec::new(),
    })
}

/// A claim whose request never finishes (its node died) lapses after the
/// in-flight TTL, and its owner can no longer complete over a new claim.
pub async fn in_flight_claims_lapse<St, W, F>(store: St, in_flight_ttl: Duration, wait: W)
where
    St: IdempotencyStore,
    W: Fn(Duration) -> F,
    F: Future<Output = ()>,
{
    let fingerprint = "POST /orders sha256:00";
    let Claim::Acquired(abandoned) = store
        .claim("u:k-lapse", fingerprint, in_flight_ttl)
        .await
        .unwrap()
    else {
        panic!("a fresh key is acquired");
    };
    assert!(matches!(
        store
            .claim("u:k-lapse", fingerprint, in_flight_ttl)
            .await
            .unwrap(),
        Claim::InFlight { .. }
    ));
    wait(in_flight_ttl + in_flight_ttl / 2).await;
    let Claim::Acquired(claim) = store
        .claim("u:k-lapse", fingerprint, in_flight_ttl)
        .await
        .unwrap()
    else {
        panic!("the lapsed claim can be taken over");
    };
    let day = Duration::from_secs(86_400);
    let done = "POST /orders body=complete;len=0;sha256=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    assert!(!store
        .complete("u:k-lapse", &abandoned, done, stored(), day)
        .await
        .unwrap());
    assert!(store
        .complete("u:k-lapse", &claim, done, stored(), day)
        .await
        .unwrap());
    // The completed record carries the fingerprint it was completed with,
    // not the one it was claimed with.
    let Claim::Completed { fingerprint, .. } = store
        .claim("u:k-lapse", fingerprint, in_flight_ttl)
        .await
        .unwrap()
    else {
        panic!("the key is completed");
    };
    assert_eq!(fingerprint, done);
}

/// A request that runs for three in-flight TTLs keeps its key all along:
/// the guard extends the claim while it runs, so a repeat in the middle is
/// refused with 409 and the handler runs once.
pub async fn a_request_slower_than_the_in_flight_ttl_keeps_its_key<St: IdempotencyStore>(
    store: St,
    in_flight_ttl: Duration,
) {
    let orders = Orders::default();
    let layer = IdempotencyGuardLayer::new(store).in_flight_ttl(in_flight_ttl);
    let service = guarded(layer, &orders);
    let millis = (3 * in_flight_ttl).as_millis().to_string();
    let body: &'static str = Box::leak(millis.into_boxed_str());
    let first = tokio::spawn(service.clone().oneshot(post("/sleepy", "k-sleepy", body)));
    eventually(|| orders.calls("/sleepy") == 1).await;
    for _ in 0..2 {
        tokio::time::sleep(in_flight_ttl).await;
        let repeat = send(&service, post("/sleepy", "k-sleepy", body)).await;
        assert_eq!(
            rejection(repeat).await,
            (StatusCode::CONFLICT, "idempotency_key_in_use".to_owned()),
            "the claim lapsed while its request ran"
        );
    }
    let first = text(first.await.unwrap().unwrap()).await;
    assert_eq!(first.0, StatusCode::CREATED);
    assert!(replayed(
        &send(&service, post("/sleepy", "k-sleepy", body)).await
    ));
    assert_eq!(orders.calls("/sleepy"), 1, "the handler ran once");
}

/// The client goes away while the handler runs: the handler may have acted,
/// so the key is recorded as cancelled and a repeat is refused, not run.
pub async fn a_call_dropped_in_the_handler_runs_once<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store), &orders);
    let first = tokio::spawn(service.clone().oneshot(post("/slow", "k-cancel", "{}")));
    eventually(|| orders.calls("/slow") == 1).await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    orders.gate.add_permits(10);
    // The cancellation is recorded by a spawned task.
    let mut answer = None;
    let started = tokio::time::Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        let response = send(&service, post("/slow", "k-cancel", "{}")).await;
        let (status, json) = problem(response).await;
        assert_eq!(status, StatusCode::CONFLICT);
        if json["code"] == "idempotency_response_not_kept" {
            answer = Some(json);
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let json = answer.expect("the cancellation is recorded");
    assert_eq!(json["reason"], "cancelled");
    assert_eq!(orders.calls("/slow"), 1, "the handler ran once");
}

/// The client goes away in the middle of the response body (after the
/// handler answered, before the body's end): a repeat is refused as
/// cancelled, the handler ran once.
pub async fn a_call_dropped_in_the_response_body_runs_once<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store), &orders);
    let first = send(&service, post("/trickle", "k-trickle", "{}")).await;
    let mut body = first.into_body();
    body.frame().await.unwrap().unwrap();
    drop(body);
    orders.gate.add_permits(10);
    let mut reason = None;
    let started = tokio::time::Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        let response = send(&service, post("/trickle", "k-trickle", "{}")).await;
        let (_, json) = problem(response).await;
        if json["code"] == "idempotency_response_not_kept" {
            reason = Some(json["reason"].clone());
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(reason.expect("the cancellation is recorded"), "cancelled");
    assert_eq!(orders.calls("/trickle"), 1, "the handler ran once");
}

/// A response over the limit is passed on whole but not stored; the repeat
/// is refused with the reason, not run again.
pub async fn an_over_limit_response_runs_once<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let layer = IdempotencyGuardLayer::new(store).response_body_limit(1024);
    let service = guarded(layer, &orders);
    let response = send(&service, post("/big", "k-big", "{}")).await;
    assert!(!replayed(&response));
    assert_eq!(text(response).await.1.len(), 2048, "passed on whole");
    assert_not_kept(&service, post("/big", "k-big", "{}"), "too_large").await;
    assert_eq!(orders.calls("/big"), 1);

    // A streamed one is recorded as too large the moment it passes the
    // limit, while it still streams.
    let first = send(&service, post("/flood", "k-flood", "{}")).await;
    let mut body = first.into_body();
    for _ in 0..2 {
        let chunk = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(chunk.len(), 600);
    }
    assert_not_kept(&service, post("/flood", "k-flood", "{}"), "too_large").await;
    orders.gate.add_permits(1);
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest.len(), 600, "passed on whole");
    assert_not_kept(&service, post("/flood", "k-flood", "{}"), "too_large").await;
    assert_eq!(orders.calls("/flood"), 1);
}

/// A response body that streams for three in-flight TTLs while the client
/// does not read it keeps its key all along: repeats are refused with 409,
/// never run; once it ends it is replayed.
pub async fn a_response_body_slower_than_the_in_flight_ttl_keeps_its_key<St: IdempotencyStore>(
    store: St,
    in_flight_ttl: Duration,
) {
    let orders = Orders::default();
    let layer = IdempotencyGuardLayer::new(store).in_flight_ttl(in_flight_ttl);
    let service = guarded(layer, &orders);
    let first = send(&service, post("/trickle", "k-slow-body", "{}")).await;
    let mut body = first.into_body();
    body.frame().await.unwrap().unwrap();
    for _ in 0..3 {
        // Nobody polls the body meanwhile.
        tokio::time::sleep(in_flight_ttl).await;
        let repeat = send(&service, post("/trickle", "k-slow-body", "{}")).await;
        assert_eq!(
            rejection(repeat).await,
            (StatusCode::CONFLICT, "idempotency_key_in_use".to_owned()),
            "the claim lapsed while its response streamed"
        );
    }
    orders.gate.add_permits(1);
    body.collect().await.unwrap();
    assert!(replayed(
        &send(&service, post("/trickle", "k-slow-body", "{}")).await
    ));
    assert_eq!(orders.calls("/trickle"), 1, "the handler ran once");
}

pub async fn scopes_keys_by_client<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let layer = IdempotencyGuardLayer::new(store).scope_by(|parts| {
        parts
            .headers
            .get("x-client")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    });
    let service = guarded(layer, &orders);
    let from = |client: Option<&str>, key: &str| {
        let mut request = post("/orders", key, "{}");
        if let Some(client) = client {
            request
                .headers_mut()
                .insert("x-client", client.parse().unwrap());
        }
        request
    };
    assert!(!replayed(
        &call(&service, from(Some("tenant-a"), "order-1")).await
    ));
    assert!(
        !replayed(&call(&service, from(Some("bob"), "order-1")).await),
        "bob does not see tenant-a's order"
    );
    assert!(replayed(
        &call(&service, from(Some("tenant-a"), "order-1")).await
    ));
    assert_eq!(orders.calls("/orders"), 2);

    // The attack: no identity, and a key that spells tenant-a's scoped one
    // (in the old `{len}:{id}:{key}` form and in the new one). Each is a key
    // of the unscoped space: run as a new request, never tenant-a's answer.
    for spelled in ["8:tenant-a:order-1", "s:8:tenant-a:order-1"] {
        let response = call(&service, from(None, spelled)).await;
        assert!(!replayed(&response), "{spelled} reached tenant-a's record");
        assert_ne!(response.headers()["set-cookie"], "session=order-1");
    }
    assert_eq!(orders.calls("/orders"), 4);
}

pub async fn idempotent_methods_and_unkeyed_requests_pass_through<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store.clone()), &orders);
    for _ in 0..2 {
        let mut put = post("/orders", "k-put", "{}");
        *put.method_mut() = http::Method::PUT;
        assert!(!replayed(&send(&service, put).await));
        let mut unkeyed = post("/orders", "unused", "{}");
        unkeyed.headers_mut().remove("idempotency-key");
        assert!(!replayed(&send(&service, unkeyed).await));
    }
    assert_eq!(orders.calls("/orders"), 4);

    // With `all_methods`, a keyed PUT is guarded as well.
    let all = guarded(IdempotencyGuardLayer::new(store).all_methods(true), &orders);
    for _ in 0..2 {
        let mut put = post("/orders", "k-put-all", "{}");
        *put.method_mut() = http::Method::PUT;
        send(&all, put).await;
    }
    assert_eq!(orders.calls("/orders"), 5);
}

/// Many copies of one request at once, through two stacks sharing the store
/// (two nodes): exactly one runs, every other gets 409, and once it is done
/// every repeat on either node is a replay.
pub async fn concurrent_repeats_run_once<St: IdempotencyStore>(node_1: St, node_2: St) {
    let orders = Orders::default();
    let nodes = [
        guarded(IdempotencyGuardLayer::new(node_1), &orders),
        guarded(IdempotencyGuardLayer::new(node_2), &orders),
    ];
    let calls: Vec<_> = (0..20)
        .map(|i| tokio::spawn(nodes[i % 2].clone().oneshot(post("/slow", "k-race", "{}"))))
        .collect();
    // The one that runs waits at the gate; every other copy must be
    // answered meanwhile.
    eventually(|| calls.iter().filter(|c| c.is_finished()).count() == 19).await;
    let mut running = None;
    for call in calls {
        if call.is_finished() {
            let response = call.await.unwrap().unwrap();
            assert_eq!(response.status(), StatusCode::CONFLICT);
        } else {
            assert!(running.replace(call).is_none(), "only one runs");
        }
    }
    orders.gate.add_permits(1);
    let ran = text(running.unwrap().await.unwrap().unwrap()).await;
    assert_eq!(ran.0, StatusCode::CREATED);
    assert_eq!(orders.calls("/slow"), 1, "the request ran once");
    for node in &nodes {
        assert!(replayed(&send(node, post("/slow", "k-race", "{}")).await));
    }
}

/// A store whose every answer is an error.
#[derive(Clone)]
pub struct BrokenStore;

impl IdempotencyStore for BrokenStore {
    async fn claim(
        &self,
        _: &str,
        _: &str,
        _: Duration,
    ) -> Result<Claim, tower_idempotency::StoreError> {
        Err(tower_idempotency::StoreError::new(
            tower_idempotency::StoreErrorKind::Backend,
            "disk on fire",
        ))
    }

    async fn complete(
        &self,
        _: &str,
        _: &ClaimToken,
        _: &str,
        _: Completion,
        _: Duration,
    ) -> Result<bool, tower_idempotency::StoreError> {
        unreachable!("never claimed")
    }

    async fn extend(
        &self,
        _: &str,
        _: &ClaimToken,
        _: Duration,
    ) -> Result<bool, tower_idempotency::StoreError> {
        unreachable!("never claimed")
    }

    async fn release(
        &self,
        _: &str,
        _: &ClaimToken,
    ) -> Result<bool, tower_idempotency::StoreError> {
        unreachable!("never claimed")
    }
}
