//! Against real sockets on 127.0.0.1: a refused connection is a transient
//! failure, retried until the server comes up.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::{Layer, ServiceExt};
use tower_retry_budget::backoff::{Backoff, Jitter};
use tower_retry_budget::RetryLayer;

/// A minimal HTTP/1.1 client: connects, sends a GET, returns the status code.
async fn get(addr: SocketAddr) -> io::Result<u16> {
    let mut stream = TcpStream::connect(addr).await?;
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8_lossy(&response);
    text.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no status line"))
}

/// Serves `200 OK` to every connection on `listener`, a bounded number of times.
async fn serve(listener: TcpListener, connections: usize) {
    for _ in 0..connections {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        let mut request = [0u8; 1024];
        let _ = stream.read(&mut request).await;
        let _ = stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            .await;
    }
}

#[tokio::test]
async fn connection_refused_is_retried_until_the_server_is_up() {
    // Reserve a port, then close it: connecting is refused until it is bound again.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();

    let attempts = Arc::new(AtomicU32::new(0));
    let counter = attempts.clone();
    let client = tower::service_fn(move |addr: SocketAddr| {
        counter.fetch_add(1, Ordering::SeqCst);
        get(addr)
    });
    let service = RetryLayer::builder()
        .max_retries(16)
        .backoff(Backoff::fixed(Duration::from_millis(40)).with_jitter(Jitter::None))
        .deadline(Duration::from_secs(5))
        .build()
        .unwrap()
        .layer(client);

    let server = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let listener = TcpListener::bind(addr).await.unwrap();
        serve(listener, 1).await;
    });
    let start = Instant::now();
    let status = service.oneshot(addr).await.unwrap();
    assert_eq!(status, 200);
    assert!(
        attempts.load(Ordering::SeqCst) >= 2,
        "the first attempts were refused"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
    server.await.unwrap();
}

#[tokio::test]
async fn a_server_that_never_comes_up_ends_with_the_refusal_before_the_deadline() {
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let service = RetryLayer::builder()
        .max_retries(16)
        .backoff(Backoff::fixed(Duration::from_millis(60)).with_jitter(Jitter::None))
        .deadline(Duration::from_millis(400))
        .no_budget()
        .build()
        .unwrap()
        .layer(tower::service_fn(get));
    let start = Instant::now();
    let err = service.oneshot(addr).await.unwrap_err();
    let elapsed = start.elapsed();
    assert_eq!(
        err.downcast_ref::<io::Error>().map(io::Error::kind),
        Some(io::ErrorKind::ConnectionRefused)
    );
    assert!(elapsed < Duration::from_millis(400), "took {elapsed:?}");
}

/// A hyper-util client (the one tonic, reqwest and axum users have), boxed
/// errors, so the retry layer classifies its real error chains.
fn hyper_client() -> impl tower::Service<
    http::Request<http_body_util::Empty<bytes::Bytes>>,
    Response = http::Response<hyper::body::Incoming>,
    Error = tower_classify::BoxError,
    Future = impl Send,
> + Clone {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    tower::ServiceBuilder::new()
        .map_err(tower_classify::BoxError::from)
        .service(client)
}

fn request(
    method: http::Method,
    addr: SocketAddr,
) -> http::Request<http_body_util::Empty<bytes::Bytes>> {
    http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}/"))
        .body(http_body_util::Empty::new())
        .unwrap()
}

/// Accepts `connections` connections; the first reads the request and closes
/// without answering (a keep-alive connection the server dropped as idle),
/// the others answer `200`. Returns how many requests it read.
fn hang_up_once(listener: TcpListener, connections: usize) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut read = 0;
        for n in 0..connections {
            let Ok((mut stream, _)) = listener.accept().await else {
                break;
            };
            let mut buf = [0u8; 1024];
            if stream.read(&mut buf).await.unwrap_or(0) > 0 {
                read += 1;
            }
            if n > 0 {
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
            }
        }
        read
    })
}

#[tokio::test]
async fn item_14_a_get_that_meets_a_dropped_connection_is_retried_out_of_the_box() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = hang_up_once(listener, 2);
    let service = RetryLayer::http_builder()
        .backoff(Backoff::none())
        .build()
        .unwrap()
        .layer(hyper_client());
    let response = service
        .oneshot(request(http::Method::GET, addr))
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        200,
        "hyper's IncompleteMessage was retried"
    );
    assert_eq!(server.await.unwrap(), 2);
}

#[tokio::test]
async fn item_13_the_non_idempotent_preset_does_not_resend_a_post_the_server_read() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = hang_up_once(listener, 1);
    let service = tower_retry_budget::presets::default_retry_non_idempotent()
        .backoff(Backoff::none())
        .build()
        .unwrap()
        .layer(hyper_client());
    let err = service
        .oneshot(request(http::Method::POST, addr))
        .await
        .unwrap_err();
    assert_eq!(
        server.await.unwrap(),
        1,
        "sent once: the server may have acted on it"
    );
    let outcome = tower_classify::ErrorChainClassifier::new().classify_error(&*err);
    assert_eq!(
        outcome,
        tower_classify::Outcome::failure(tower_classify::FailureKind::Connection)
    );
}

#[tokio::test]
async fn item_13_the_non_idempotent_preset_resends_a_post_that_was_never_sent() {
    // Refused until the server comes up: the POST never left, so resending
    // it cannot apply it twice.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let server = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        serve(TcpListener::bind(addr).await.unwrap(), 1).await;
    });
    let service = tower_retry_budget::presets::default_retry_non_idempotent()
        .backoff(Backoff::fixed(Duration::from_millis(50)).with_jitter(Jitter::None))
        .max_retries(16)
        .deadline(Duration::from_secs(5))
        .build()
        .unwrap()
        .layer(hyper_client());
    let refused = hyper_client()
        .oneshot(request(http::Method::POST, addr))
        .await
        .unwrap_err();
    assert_eq!(
        tower_classify::ErrorChainClassifier::new().classify_error(&*refused),
        tower_classify::Outcome::failure(tower_classify::FailureKind::NotSent),
        "a refused connect is known not to have sent anything: {refused:?}"
    );
    let response = service
        .oneshot(request(http::Method::POST, addr))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    server.await.unwrap();
}
