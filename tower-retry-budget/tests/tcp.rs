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
