//! The dead-letter layer never reads a body before calling the service: it
//! streams, and the entry reads the recording only when the call failed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{channel::Channel, BodyExt, Full};
use tower::retry::{Policy, RetryLayer};
use tower::{service_fn, Layer, ServiceBuilder, ServiceExt};
use tower_classify::{BoxError, Classify, HttpClassifier};
use tower_poison::store::{DeadLetterStore, ListQuery, MemoryStore};
use tower_poison::{DeadLetterEntry, DeadLetterLayer, ReplayBody};

/// How long the layer waits for the rest of a body the service left unread
/// (its documented second).
const BODY_WAIT: Duration = Duration::from_secs(1);

async fn entries(store: &MemoryStore) -> Vec<DeadLetterEntry> {
    store.list(ListQuery::default()).await.unwrap().entries
}

fn status(code: StatusCode) -> Response<Bytes> {
    Response::builder().status(code).body(Bytes::new()).unwrap()
}

#[tokio::test]
async fn the_service_is_called_before_the_body_arrives_and_echoes_as_it_streams() {
    let store = MemoryStore::new(10);
    let (mut upload, body) = Channel::<Bytes, BoxError>::new(1);
    let (echo_tx, mut echo_rx) = tokio::sync::mpsc::channel(4);
    let service = DeadLetterLayer::new(store.clone()).layer(service_fn(
        move |req: Request<ReplayBody<Channel<Bytes, BoxError>>>| {
            let echo_tx = echo_tx.clone();
            async move {
                let mut body = req.into_body();
                while let Some(frame) = body.frame().await {
                    if let Ok(data) = frame?.into_data() {
                        echo_tx.send(data).await.unwrap();
                    }
                }
                Ok::<_, BoxError>(status(StatusCode::OK))
            }
        },
    ));
    let call = tokio::spawn(service.oneshot(Request::post("/stream").body(body).unwrap()));
    // Frame 2 is sent only after echo 1 came back: a layer reading the body
    // ahead would wait here for ever.
    for frame in ["one", "two", "three"] {
        upload.send_data(Bytes::from(frame)).await.unwrap();
        let echo = tokio::time::timeout(Duration::from_secs(5), echo_rx.recv())
            .await
            .expect("the frame reached the service as it was sent");
        assert_eq!(echo.unwrap(), frame);
    }
    drop(upload);
    assert_eq!(call.await.unwrap().unwrap().status(), 200);
    assert!(entries(&store).await.is_empty());
}

#[tokio::test]
async fn a_body_the_service_never_read_is_still_in_the_entry() {
    let store = MemoryStore::new(10);
    // Fails without reading the body, as a refused connection does.
    let service = DeadLetterLayer::new(store.clone()).layer(service_fn(
        |_: Request<ReplayBody<Full<Bytes>>>| async {
            Ok::<_, BoxError>(status(StatusCode::SERVICE_UNAVAILABLE))
        },
    ));
    let request = Request::post("/orders").body(Full::new(Bytes::from("{\"id\":7}")));
    service.oneshot(request.unwrap()).await.unwrap();
    let entry = entries(&store).await.remove(0);
    assert_eq!(entry.body, "{\"id\":7}");
    assert!(!entry.body_truncated);
    assert_eq!(entry.body_len, None);
}

#[tokio::test(start_paused = true)]
async fn a_body_still_arriving_after_the_wait_is_kept_as_far_as_it_came_and_flagged() {
    let store = MemoryStore::new(10);
    let (mut upload, body) = Channel::<Bytes, BoxError>::new(1);
    let service = DeadLetterLayer::new(store.clone()).layer(service_fn(
        |_: Request<ReplayBody<Channel<Bytes, BoxError>>>| async {
            Ok::<_, BoxError>(status(StatusCode::BAD_GATEWAY))
        },
    ));
    upload.send_data(Bytes::from("first half")).await.unwrap();
    let started = tokio::time::Instant::now();
    // The client stalls, never ending its upload.
    let response = service
        .oneshot(Request::post("/").body(body).unwrap())
        .await;
    assert_eq!(response.unwrap().status(), 502);
    assert_eq!(
        started.elapsed(),
        BODY_WAIT,
        "waited for the rest once, bounded"
    );
    let entry = entries(&store).await.remove(0);
    assert_eq!(entry.body, "first half");
    assert!(entry.body_truncated, "cannot be replayed as a whole body");
    assert_eq!(entry.body_len, Some(10));
    drop(upload);
}

/// tower's retry with a policy that clones the `ReplayBody` the dead-letter
/// layer hands on.
#[derive(Clone)]
struct RetryTwice(usize);

type Body = ReplayBody<Full<Bytes>>;

impl Policy<Request<Body>, Response<Bytes>, BoxError> for RetryTwice {
    type Future = std::future::Ready<()>;

    fn retry(
        &mut self,
        _: &mut Request<Body>,
        result: &mut Result<Response<Bytes>, BoxError>,
    ) -> Option<Self::Future> {
        let retry = HttpClassifier::new()
            .classify(result.as_ref())
            .is_retryable()
            && self.0 > 0;
        self.0 = self.0.saturating_sub(1);
        retry.then(|| std::future::ready(()))
    }

    fn clone_request(&mut self, req: &Request<Body>) -> Option<Request<Body>> {
        let mut clone = Request::new(req.body().clone());
        *clone.uri_mut() = req.uri().clone();
        Some(clone)
    }
}

#[tokio::test]
async fn one_copy_of_the_body_serves_every_attempt_and_the_entry() {
    let store = MemoryStore::new(10);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let service = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .layer(RetryLayer::new(RetryTwice(2)))
        .service(service_fn(move |req: Request<Body>| {
            let log = log.clone();
            async move {
                let bytes = req.into_body().collect().await?.to_bytes();
                log.lock().unwrap().push(bytes);
                Ok::<_, BoxError>(status(StatusCode::SERVICE_UNAVAILABLE))
            }
        }));
    let payload = Bytes::from(vec![7u8; 4096]);
    let request = Request::put("/blob")
        .body(Full::new(payload.clone()))
        .unwrap();
    service.oneshot(request).await.unwrap();
    let entry = entries(&store).await.remove(0);
    assert_eq!(entry.body, payload);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    // The same allocation everywhere: the attempts and the entry share the
    // bytes the client sent.
    for attempt in seen.iter() {
        assert_eq!(attempt.as_ptr(), payload.as_ptr());
    }
}

#[tokio::test(start_paused = true)]
async fn a_service_still_reading_the_body_keeps_every_frame_and_is_not_waited_for() {
    let store = MemoryStore::new(10);
    let (mut upload, body) = Channel::<Bytes, std::io::Error>::new(1);
    let (rest_tx, rest_rx) = tokio::sync::oneshot::channel();
    let rest_tx = Arc::new(Mutex::new(Some(rest_tx)));
    // Answers 503 after the first frame, and goes on reading the upload (an
    // HTTP/2 client still sending after an early error status).
    let service = DeadLetterLayer::new(store.clone())
        .body_limit(8)
        .layer(service_fn(
            move |req: Request<ReplayBody<Channel<Bytes, std::io::Error>>>| {
                let rest_tx = rest_tx.clone();
                async move {
                    let mut body = req.into_body();
                    let first = body.frame().await.unwrap()?.into_data().unwrap();
                    tokio::spawn(async move {
                        let rest = body
                            .collect()
                            .await
                            .map(|c| c.to_bytes())
                            .map_err(|e| e.to_string());
                        let _ = rest_tx.lock().unwrap().take().unwrap().send((first, rest));
                    });
                    Ok::<_, BoxError>(status(StatusCode::SERVICE_UNAVAILABLE))
                }
            },
        ));
    upload.send_data(Bytes::from("12345")).await.unwrap();
    let started = tokio::time::Instant::now();
    let call = tokio::spawn(service.oneshot(Request::post("/").body(body).unwrap()));
    let response = call.await.unwrap().unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "no wait for a body still being read"
    );
    let entry = entries(&store).await.remove(0);
    assert_eq!(entry.body, "12345");
    assert!(entry.body_truncated);
    // The frame that takes the body past the limit goes to the service.
    upload.send_data(Bytes::from("6789012345")).await.unwrap();
    drop(upload);
    let (first, rest) = rest_rx.await.unwrap();
    assert_eq!(first, "12345");
    assert_eq!(rest.unwrap(), "6789012345");
}
