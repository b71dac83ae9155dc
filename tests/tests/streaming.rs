//! Streaming bodies through the family, over real HTTP/2 on 127.0.0.1.
//!
//! The shape of a gRPC client- or bidi-streaming call: the client sends
//! frame 2 only after the server echoed frame 1. A layer that read the
//! request body before calling the service below it would wait for ever;
//! every stack here must complete. Then: a slow upload must not hold the slot
//! `Buffer(1)` reserved below the stack, and the upstream must see the first
//! chunk of a slow body as soon as it is sent.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::channel::Channel;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::buffer::BufferLayer;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_breaker::CircuitBreakerLayer;
use tower_breaker::Policy;
use tower_classify::HttpClassifier;
use tower_poison::store::{DeadLetterStore, MemoryStore};
use tower_poison::{CountAttemptsLayer, DeadLetterLayer};
use tower_retry_budget::body::ReplayBodyLayer;
use tower_retry_budget::RetryLayer;

/// How long a step may take before the test calls it a hang.
const PATIENCE: Duration = Duration::from_secs(10);

type Upload = Channel<Bytes, BoxError>;
type Stack<B = Incoming> = BoxCloneSyncService<Request<Upload>, Response<B>, BoxError>;
/// The response body of a stack with a dead-letter layer outermost.
type Settled = tower_poison::SettleBody<Incoming, tower_poison::OpenCall>;

/// An HTTP/2 server on 127.0.0.1 that answers at once and echoes each
/// request frame back as a response frame the moment it arrives. It notes
/// when the first frame of each request arrived.
async fn echo_server() -> (SocketAddr, Arc<Mutex<Vec<Instant>>>) {
    let first_frames = Arc::new(Mutex::new(Vec::new()));
    let log = first_frames.clone();
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let log = log.clone();
        async move {
            let (mut echo, body) = Channel::<Bytes, Infallible>::new(1);
            tokio::spawn(async move {
                let mut incoming = request.into_body();
                let mut first = true;
                while let Some(Ok(frame)) = incoming.frame().await {
                    if let Ok(data) = frame.into_data() {
                        if std::mem::take(&mut first) {
                            log.lock().unwrap().push(Instant::now());
                        }
                        if echo.send_data(data).await.is_err() {
                            return;
                        }
                    }
                }
            });
            Ok::<_, Infallible>(Response::new(body))
        }
    });
    serve_h2(service)
        .await
        .map(|addr| (addr, first_frames))
        .unwrap()
}

/// An HTTP/2 server that reads each request body to its end, then answers
/// with its length: an upload endpoint.
async fn upload_server() -> SocketAddr {
    let service = hyper::service::service_fn(|request: Request<Incoming>| async move {
        let bytes = request.into_body().collect().await?.to_bytes();
        Ok::<_, hyper::Error>(Response::new(http_body_util::Full::new(Bytes::from(
            bytes.len().to_string(),
        ))))
    });
    serve_h2(service).await.unwrap()
}

async fn serve_h2<S, B>(service: S) -> std::io::Result<SocketAddr>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = service.clone();
            tokio::spawn(async move {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// A hyper-util HTTP/2 client for bodies of type `B`, its error boxed.
fn h2_client<B>() -> BoxCloneSyncService<Request<B>, Response<Incoming>, BoxError>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<B>();
    BoxCloneSyncService::new(
        ServiceBuilder::new()
            .map_err(BoxError::from)
            .service(client),
    )
}

fn retry() -> RetryLayer<HttpClassifier, tower_retry_budget::replay::HttpReplay> {
    RetryLayer::http_builder()
        .backoff(tower_retry_budget::Backoff::none())
        .build()
        .unwrap()
}

/// Sends three frames through `stack`, each only after the echo of the one
/// before came back.
async fn ping_pong<B>(stack: Stack<B>, addr: SocketAddr)
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    let (mut upload, body) = Upload::new(1);
    let request = Request::put(format!("http://{addr}/echo"))
        .body(body)
        .unwrap();
    let response = tokio::time::timeout(PATIENCE, stack.oneshot(request))
        .await
        .expect("the response head came back while the request body was still open")
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut echoes = response.into_body();
    for message in ["one", "two", "three"] {
        upload.send_data(Bytes::from(message)).await.unwrap();
        let echo = tokio::time::timeout(PATIENCE, echoes.frame())
            .await
            .unwrap_or_else(|_| panic!("no echo of {message:?}: the body was held back"))
            .unwrap()
            .unwrap();
        assert_eq!(echo.into_data().unwrap(), message);
    }
    drop(upload);
    // The echo ends with the request (an empty closing frame at most).
    let rest = echoes.collect().await.unwrap().to_bytes();
    assert!(rest.is_empty(), "{rest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_duplex_call_completes_through_replay_body_and_retry() {
    let (addr, _) = echo_server().await;
    let stack = ServiceBuilder::new()
        .layer(ReplayBodyLayer::new(64 * 1024))
        .layer(retry())
        .service(h2_client());
    ping_pong(BoxCloneSyncService::new(stack), addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_duplex_call_completes_through_the_dead_letter_layer() {
    let (addr, _) = echo_server().await;
    let store = MemoryStore::new(10);
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .service(h2_client());
    ping_pong(BoxCloneSyncService::new(stack), addr).await;
    assert_eq!(store.depth().await.unwrap(), 0);
}

/// The documented client stack, outermost first:
/// `DeadLetter → CircuitBreaker → Retry → CountAttempts → client`.
fn full_stack<S>(client: S, store: MemoryStore) -> Stack<Settled>
where
    S: Service<
            Request<tower_poison::ReplayBody<Upload>>,
            Response = Response<Incoming>,
            Error = BoxError,
        > + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let breaker = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(5))
        .build(HttpClassifier::new())
        .unwrap();
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store))
        .layer(breaker)
        .layer(retry())
        .layer(CountAttemptsLayer::new())
        .service(client);
    BoxCloneSyncService::new(stack)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_duplex_call_completes_through_the_documented_client_stack() {
    let (addr, _) = echo_server().await;
    let store = MemoryStore::new(10);
    ping_pong(full_stack(h2_client(), store.clone()), addr).await;
    assert_eq!(store.depth().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_sees_the_first_chunk_of_a_slow_body_at_once() {
    let (addr, first_frames) = echo_server().await;
    let stack = full_stack(h2_client(), MemoryStore::new(10));
    let (mut upload, body) = Upload::new(1);
    let request = Request::put(format!("http://{addr}/echo"))
        .body(body)
        .unwrap();
    // The head goes out and comes back first, so that only the body's own
    // path is measured below.
    let response = tokio::time::timeout(PATIENCE, stack.oneshot(request))
        .await
        .expect("the call started before its body")
        .unwrap();
    let sent = Instant::now();
    upload
        .send_data(Bytes::from("chunk 1 of many"))
        .await
        .unwrap();
    let mut echoes = response.into_body();
    tokio::time::timeout(PATIENCE, echoes.frame())
        .await
        .unwrap();
    let arrived = first_frames.lock().unwrap()[0];
    let delay = arrived.saturating_duration_since(sent);
    assert!(
        delay < Duration::from_millis(100),
        "the upstream saw the first chunk {delay:?} after it was sent"
    );
    drop(upload);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upload_does_not_hold_the_buffer_slot_below_the_stack() {
    let addr = upload_server().await;
    // `Buffer(1)`: one request at a time may hold the slot between
    // `poll_ready` and `call`.
    let client = ServiceBuilder::new()
        .layer(BufferLayer::new(1))
        .service(h2_client::<tower_poison::ReplayBody<Upload>>());
    let stack = full_stack(client, MemoryStore::new(10));

    let (mut upload, body) = Upload::new(1);
    let slow = Request::put(format!("http://{addr}/big"))
        .body(body)
        .unwrap();
    let slow_call = tokio::spawn(stack.clone().oneshot(slow));
    upload.send_data(Bytes::from(vec![1; 1024])).await.unwrap();

    // A small request while the upload is open.
    let (mut small_body, body) = Upload::new(1);
    small_body.send_data(Bytes::from("ping")).await.unwrap();
    drop(small_body);
    let small = Request::put(format!("http://{addr}/small"))
        .body(body)
        .unwrap();
    let response = tokio::time::timeout(PATIENCE, stack.oneshot(small))
        .await
        .expect("the small request was not held up by the upload")
        .unwrap();
    let length = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(length, "4");
    assert!(!slow_call.is_finished(), "the upload is still in progress");

    upload.send_data(Bytes::from(vec![2; 1024])).await.unwrap();
    drop(upload);
    let response = slow_call.await.unwrap().unwrap();
    let length = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(length, "2048");
}
