//! A 100 MB upload through the documented client stack grows the process by
//! less than twice the recording limit: nothing buffers the body past it.
//!
//! Its own test binary, with one test, so that nothing else allocates while
//! it measures the resident set (Linux `/proc/self/status`).

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::channel::Channel;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{ServiceBuilder, ServiceExt};
use tower_breaker::CircuitBreakerLayer;
use tower_breaker::Policy;
use tower_classify::HttpClassifier;
use tower_poison::store::{DeadLetterStore, ListQuery, MemoryStore};
use tower_poison::{CountAttemptsLayer, DeadLetterLayer};
use tower_retry_budget::RetryLayer;

const UPLOAD: usize = 100 * 1024 * 1024;
const CHUNK: usize = 64 * 1024;
const RECORDING_LIMIT: usize = 16 * 1024 * 1024;

fn resident_bytes() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Reads each upload to its end, counting it, and answers 503 with the count.
async fn sink() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = hyper::service::service_fn(|request: Request<Incoming>| async move {
                let mut body = request.into_body();
                let mut len = 0usize;
                while let Some(frame) = body.frame().await {
                    if let Ok(data) = frame?.into_data() {
                        len += data.len();
                    }
                }
                let mut response = Response::new(Full::new(Bytes::from(len.to_string())));
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                Ok::<_, hyper::Error>(response)
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100_mb_upload_through_the_full_stack_stays_within_twice_the_recording_limit() {
    let Some(before) = resident_bytes() else {
        eprintln!("SKIPPED: no /proc/self/status on this platform to read the resident set from");
        return;
    };
    let addr = sink().await;
    let store = MemoryStore::new(10);
    type Upload = Channel<Bytes, Infallible>;
    let client =
        Client::builder(TokioExecutor::new()).build_http::<tower_poison::ReplayBody<Upload>>();
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()).body_limit(RECORDING_LIMIT))
        .layer(
            CircuitBreakerLayer::builder()
                .policy(Policy::consecutive_failures(5))
                .build(HttpClassifier::new())
                .unwrap(),
        )
        .layer(
            RetryLayer::http_builder()
                .backoff(tower_retry_budget::Backoff::none())
                .build()
                .unwrap(),
        )
        .layer(CountAttemptsLayer::new())
        .service(client);

    let (mut upload, body) = Upload::new(4);
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(before));
    let sampler = peak.clone();
    let sender = tokio::spawn(async move {
        for n in 0..UPLOAD / CHUNK {
            // A fresh allocation per chunk, as a network read makes: a layer
            // holding on to chunks would show in the resident set.
            upload
                .send_data(Bytes::from(vec![n as u8; CHUNK]))
                .await
                .unwrap();
            if n % 64 == 0 {
                let now = resident_bytes().unwrap();
                sampler.fetch_max(now, std::sync::atomic::Ordering::Relaxed);
            }
        }
    });
    let request = Request::put(format!("http://{addr}/upload"))
        .body(body)
        .unwrap();
    let response = stack.oneshot(request).await.unwrap();
    assert!(Body::size_hint(response.body()).upper().is_some());
    sender.await.unwrap();
    assert_eq!(response.status(), 503);
    let length = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        length,
        UPLOAD.to_string(),
        "the upstream got every byte, once"
    );

    let after = resident_bytes().unwrap();
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed).max(after);
    let growth = peak.saturating_sub(before);
    eprintln!(
        "100 MiB upload: resident set {} MiB -> peak {} MiB (growth {} KiB, limit {} KiB)",
        before >> 20,
        peak >> 20,
        growth >> 10,
        (2 * RECORDING_LIMIT) >> 10
    );
    assert!(
        growth < 2 * RECORDING_LIMIT,
        "grew by {growth} bytes for a recording limit of {RECORDING_LIMIT}"
    );
    // Too large to record: sent once, not retried, stored as not captured.
    let entry = store
        .list(ListQuery::default())
        .await
        .unwrap()
        .entries
        .remove(0);
    assert_eq!(entry.attempts, 1);
    assert!(entry.body.is_empty() && entry.body_truncated);
    assert_eq!(entry.body_len, Some(UPLOAD as u64));
}
