//! The guard's rules on the in-memory store (paused time), the store's
//! bounds under a flood of keys, store failures, streaming in both
//! directions (a full-duplex echo, a response seen before its end), the
//! client key layer, and the guard in real servers on 127.0.0.1 (hyper over
//! HTTP/1.1 and HTTP/2, and axum's `Router::layer`).

mod rules;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::channel::{Channel, Sender};
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_classify::BoxError;
use tower_idempotency::store::{
    Claim, ClaimToken, Completion, IdempotencyStore, MemoryIdempotencyStore,
};
use tower_idempotency::{
    GuardBody, IdempotencyGuardLayer, IdempotencyKeyLayer, StoreError, StoreErrorKind,
};

use rules::*;

fn memory() -> MemoryIdempotencyStore {
    MemoryIdempotencyStore::new(1000)
}

async fn paused_wait(duration: Duration) {
    tokio::time::advance(duration).await;
}

#[tokio::test(start_paused = true)]
async fn memory_replays_the_first_response() {
    replays_the_first_response(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_conflicts_while_in_flight() {
    conflicts_while_in_flight(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_refuses_a_reused_key_for_another_request() {
    refuses_a_reused_key_for_another_request(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_the_body_counts_as_far_as_the_handler_read_it() {
    the_body_counts_as_far_as_the_handler_read_it(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_a_streamed_response_is_recorded_when_it_ends() {
    a_streamed_response_is_recorded_when_it_ends(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_a_response_body_slower_than_the_in_flight_ttl_keeps_its_key() {
    a_response_body_slower_than_the_in_flight_ttl_keeps_its_key(memory(), Duration::from_secs(60))
        .await;
}

#[tokio::test(start_paused = true)]
async fn memory_refuses_a_key_over_255_characters() {
    refuses_a_key_over_255_characters(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_transient_answers_and_errors_run_once() {
    transient_answers_and_errors_run_once(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_release_on_transient_is_an_opt_in() {
    release_on_transient_is_an_opt_in(memory()).await;
}

/// Issue 31, item 5 (a): a handler that did its side effect, then returned
/// a downstream breaker's `CircuitOpen` (a `Shed` error), keeps its key.
#[tokio::test(start_paused = true)]
async fn item_5_a_downstream_circuit_open_passed_on_after_the_side_effect_keeps_the_key() {
    a_refusal_passed_on_after_acting_keeps_the_key(memory(), "/acted-then-circuit-open").await;
}

/// Issue 31, item 5 (b): the same with a 503 carrying the `Failure`
/// extension.
#[tokio::test(start_paused = true)]
async fn item_5_a_downstream_503_with_the_failure_extension_keeps_the_key() {
    a_refusal_passed_on_after_acting_keeps_the_key(memory(), "/acted-then-503").await;
}

/// Issue 31, item 5: only this request's token proves anything; a refusal
/// carrying another call's keeps the key too.
#[tokio::test(start_paused = true)]
async fn item_5_a_refusal_of_another_calls_request_keeps_the_key() {
    a_refusal_passed_on_after_acting_keeps_the_key(memory(), "/acted-then-503-of-another-call")
        .await;
}

/// Issue 31, item 5 (c): a refusal by a layer between the guard and the
/// handler, carrying the request's token, frees the key (see also
/// `tests/tests/idempotency_refusals.rs` with the real breaker).
#[tokio::test(start_paused = true)]
async fn memory_shed_refusals_free_the_key() {
    shed_refusals_free_the_key(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_trailers_are_replayed() {
    trailers_are_replayed(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_keys_expire_after_the_ttl() {
    keys_expire_after_the_ttl(memory(), Duration::from_secs(24 * 3600), paused_wait).await;
}

#[tokio::test(start_paused = true)]
async fn memory_in_flight_claims_lapse() {
    in_flight_claims_lapse(memory(), Duration::from_secs(300), paused_wait).await;
}

#[tokio::test(start_paused = true)]
async fn memory_a_request_slower_than_the_in_flight_ttl_keeps_its_key() {
    a_request_slower_than_the_in_flight_ttl_keeps_its_key(memory(), Duration::from_secs(60)).await;
}

#[tokio::test(start_paused = true)]
async fn memory_a_call_dropped_in_the_handler_runs_once() {
    a_call_dropped_in_the_handler_runs_once(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_a_call_dropped_in_the_response_body_runs_once() {
    a_call_dropped_in_the_response_body_runs_once(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_an_over_limit_response_runs_once() {
    an_over_limit_response_runs_once(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_scopes_keys_by_client() {
    scopes_keys_by_client(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_idempotent_methods_and_unkeyed_requests_pass_through() {
    idempotent_methods_and_unkeyed_requests_pass_through(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_concurrent_repeats_run_once() {
    let store = memory();
    concurrent_repeats_run_once(store.clone(), store).await;
}

/// 100 requests in flight, then 10× the store's capacity in new keys: no
/// claim is evicted (each in-flight key still answers 409 to its duplicate),
/// and every one of the 100 runs once.
#[tokio::test(start_paused = true)]
async fn a_flood_of_new_keys_never_evicts_a_claim_in_flight() {
    const CAPACITY: usize = 200;
    let store = MemoryIdempotencyStore::new(CAPACITY);
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store.clone()), &orders);
    let in_flight: Vec<_> = (0..100)
        .map(|i| {
            let key = format!("slow-{i}");
            tokio::spawn(service.clone().oneshot(post("/slow", &key, "{}")))
        })
        .collect();
    eventually(|| orders.calls("/slow") == 100).await;

    for i in 0..10 * CAPACITY {
        let response = call(&service, post("/orders", &format!("flood-{i}"), "{}")).await;
        assert_eq!(response.status(), StatusCode::CREATED, "flood key {i}");
        assert!(store.len() <= CAPACITY);
    }
    for i in 0..100 {
        let duplicate = send(&service, post("/slow", &format!("slow-{i}"), "{}")).await;
        assert_eq!(
            rejection(duplicate).await,
            (StatusCode::CONFLICT, "idempotency_key_in_use".to_owned()),
            "slow-{i} was evicted while in flight"
        );
    }
    orders.gate.add_permits(100);
    for first in in_flight {
        assert_eq!(
            text(first.await.unwrap().unwrap()).await.0,
            StatusCode::CREATED
        );
    }
    assert_eq!(orders.calls("/slow"), 100, "no request ran twice");
    assert_eq!(orders.calls("/orders"), 10 * CAPACITY);
}

/// When every record left is a claim in flight, a new key is refused with
/// 503 and `Retry-After` (not run), and the claims are kept.
#[tokio::test(start_paused = true)]
async fn a_store_full_of_claims_in_flight_answers_503() {
    let store = MemoryIdempotencyStore::new(3);
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store), &orders);
    let in_flight: Vec<_> = (0..3)
        .map(|i| {
            tokio::spawn(
                service
                    .clone()
                    .oneshot(post("/slow", &format!("s{i}"), "{}")),
            )
        })
        .collect();
    eventually(|| orders.calls("/slow") == 3).await;
    let refused = send(&service, post("/orders", "one-more", "{}")).await;
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(
        rejection(refused).await,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "idempotency_store_full".to_owned()
        )
    );
    assert_eq!(orders.calls("/orders"), 0, "not run unguarded");
    orders.gate.add_permits(3);
    for first in in_flight {
        text(first.await.unwrap().unwrap()).await;
    }
    // Completed records can be evicted: the next key gets in.
    let admitted = send(&service, post("/orders", "one-more", "{}")).await;
    assert_eq!(admitted.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn a_store_that_cannot_answer_refuses_the_request_with_503() {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(BrokenStore), &orders);
    let response = send(&service, post("/orders", "k", "{}")).await;
    assert_eq!(response.headers()["retry-after"], "1");
    assert_eq!(
        rejection(response).await,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "idempotency_store_unavailable".to_owned()
        )
    );
    assert_eq!(orders.calls("/orders"), 0, "never run unguarded");
}

/// The memory store with one fault.
#[derive(Clone)]
struct Faulty(MemoryIdempotencyStore, Fault);

#[derive(Clone)]
enum Fault {
    /// The store went down mid-call: the completion write fails.
    CompleteFails,
    /// The completion write takes a second (a slow network); `Notify`
    /// tells when one has started.
    CompleteSlow(Arc<tokio::sync::Notify>),
    /// A claim is answered 100 ms after it was applied (a round trip to a
    /// remote store).
    ClaimAnsweredLate,
}

impl IdempotencyStore for Faulty {
    async fn claim(
        &self,
        key: &str,
        fingerprint: &str,
        ttl: Duration,
    ) -> Result<Claim, StoreError> {
        let claim = self.0.claim(key, fingerprint, ttl).await;
        if let Fault::ClaimAnsweredLate = self.1 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        claim
    }

    async fn complete(
        &self,
        key: &str,
        claim: &ClaimToken,
        fingerprint: &str,
        completion: Completion,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        match &self.1 {
            Fault::CompleteFails => {
                return Err(StoreError::new(StoreErrorKind::Backend, "connection reset"))
            }
            Fault::CompleteSlow(started) => {
                started.notify_one();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Fault::ClaimAnsweredLate => {}
        }
        self.0
            .complete(key, claim, fingerprint, completion, ttl)
            .await
    }

    async fn extend(
        &self,
        key: &str,
        claim: &ClaimToken,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.0.extend(key, claim, ttl).await
    }

    async fn release(&self, key: &str, claim: &ClaimToken) -> Result<bool, StoreError> {
        self.0.release(key, claim).await
    }
}

/// A call that goes away while its claim is on the wire (a timeout above
/// the guard) never ran its handler: the claim, applied in the store, is
/// released, and a repeat runs. Cut short with the call, it held the key
/// for the in-flight TTL (5 minutes) with no one to release it.
#[tokio::test(start_paused = true)]
async fn a_call_gone_while_its_claim_was_under_way_leaves_the_key_free() {
    let orders = Orders::default();
    let service = guarded(
        IdempotencyGuardLayer::new(Faulty(memory(), Fault::ClaimAnsweredLate)),
        &orders,
    );
    let cut = tokio::time::timeout(
        Duration::from_millis(50),
        send(&service, post("/orders", "k-cut", "{}")),
    )
    .await;
    assert!(cut.is_err(), "the call went away mid-claim");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let repeat = send(&service, post("/orders", "k-cut", "{}")).await;
    assert_eq!(text(repeat).await.0, StatusCode::CREATED);
    assert_eq!(orders.calls("/orders"), 1);
}

/// The request was applied but its response could not be stored: the client
/// still gets the response, and the key stays claimed (repeats get 409 until
/// the in-flight TTL) rather than being released for a second application.
#[tokio::test(start_paused = true)]
async fn a_response_the_store_cannot_keep_is_still_returned_and_the_key_stays_held() {
    let orders = Orders::default();
    let layer = IdempotencyGuardLayer::new(Faulty(memory(), Fault::CompleteFails))
        .in_flight_ttl(Duration::from_secs(60));
    let service = guarded(layer, &orders);
    let first = send(&service, post("/orders", "k-lost", "{}")).await;
    assert_eq!(text(first).await.0, StatusCode::CREATED);
    let repeat = send(&service, post("/orders", "k-lost", "{}")).await;
    assert_eq!(repeat.status(), StatusCode::CONFLICT);
    assert_eq!(orders.calls("/orders"), 1, "not applied twice");
    tokio::time::advance(Duration::from_secs(60)).await;
    let later = send(&service, post("/orders", "k-lost", "{}")).await;
    assert_eq!(text(later).await.0, StatusCode::CREATED, "the claim lapsed");
    assert_eq!(orders.calls("/orders"), 2);
}

/// The client goes away while the response is being written to the store
/// (the body's last frame waits for the write): the write still lands, so
/// once the in-flight TTL has passed the repeat is the stored response, not
/// a second run.
#[tokio::test(start_paused = true)]
async fn a_call_dropped_while_its_response_is_written_still_records_it() {
    let started = Arc::new(tokio::sync::Notify::new());
    let store = Faulty(memory(), Fault::CompleteSlow(started.clone()));
    let orders = Orders::default();
    let layer = IdempotencyGuardLayer::new(store).in_flight_ttl(Duration::from_secs(60));
    let service = guarded(layer, &orders);
    let first = send(&service, post("/orders", "k-write", "{}")).await;
    let reading = tokio::spawn(first.into_body().collect());
    started.notified().await;
    reading.abort();
    assert!(reading.await.unwrap_err().is_cancelled());
    tokio::time::sleep(Duration::from_secs(120)).await;
    let repeat = send(&service, post("/orders", "k-write", "{}")).await;
    assert!(
        replayed(&repeat),
        "the response written after the drop is replayed"
    );
    assert_eq!(orders.calls("/orders"), 1, "the handler ran once");
}

/// A request body that fails while the handler reads it: the guard read
/// nothing ahead, so the handler sees the failure and answers; its answer is
/// recorded by the usual rules (the handler ran). A repeat whose body fails
/// while the guard compares it is refused with 400 and runs nothing.
#[tokio::test(start_paused = true)]
async fn a_request_body_that_fails_reaches_the_handler_and_its_answer_is_kept() {
    use http_body_util::StreamBody;

    // An I/O error, as a server's body reports a reset upload.
    type Frames = Vec<Result<http_body::Frame<Bytes>, std::io::Error>>;
    type Upload = StreamBody<IterStream<Result<http_body::Frame<Bytes>, std::io::Error>>>;

    fn request(frames: Frames) -> Request<Upload> {
        Request::post("/orders")
            .header("idempotency-key", "k-upload")
            .body(StreamBody::new(futures_iter(frames)))
            .unwrap()
    }

    let calls = Arc::new(Mutex::new(0));
    let counted = calls.clone();
    let service = IdempotencyGuardLayer::new(memory()).layer(service_fn(
        move |req: Request<tower_idempotency::GuardBody<Upload>>| {
            *counted.lock().unwrap() += 1;
            async move {
                let answer = match req.into_body().collect().await {
                    Ok(body) => format!("read {} bytes", body.to_bytes().len()),
                    Err(error) => format!("upload failed: {error}"),
                };
                let mut response = Response::new(Full::new(Bytes::from(answer)));
                *response.status_mut() = StatusCode::BAD_REQUEST;
                Ok::<_, BoxError>(response)
            }
        },
    ));
    let data = |text: &'static str| Ok(http_body::Frame::data(Bytes::from(text)));
    let reset = || {
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "upload reset",
        ))
    };

    let first = service
        .clone()
        .oneshot(request(vec![data("abc"), reset()]))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::BAD_REQUEST);
    let body = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "upload failed: upload reset");
    assert_eq!(*calls.lock().unwrap(), 1);

    // The handler saw "abc" and then the failure: a repeat starting with
    // "abc" is the same request and gets its answer.
    let repeat = service
        .clone()
        .oneshot(request(vec![data("abcdef")]))
        .await
        .unwrap();
    assert_eq!(repeat.headers()["idempotent-replayed"], "true");
    let body = repeat.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "upload failed: upload reset");

    let repeat = service
        .clone()
        .oneshot(request(vec![data("a"), reset()]))
        .await
        .unwrap();
    assert_eq!(repeat.status(), StatusCode::BAD_REQUEST);
    let body = repeat.into_body().collect().await.unwrap().to_bytes();
    let json: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["code"], "idempotency_body_unreadable");
    assert_eq!(*calls.lock().unwrap(), 1, "the handler ran once");
}

/// Request bodies whose error is a `BoxError` (a `BoxBody`) are guarded as
/// any other: a repeat's body is compared, and the stored answer replayed.
/// (A handler that reads such a body inside its own future is held to a
/// rustc limitation on `Send`; the guard's own future is not.)
#[tokio::test(start_paused = true)]
async fn boxed_request_bodies_are_compared_on_repeats() {
    use http_body_util::combinators::BoxBody;

    let service = IdempotencyGuardLayer::new(memory()).layer(service_fn(
        |_req: Request<tower_idempotency::GuardBody<BoxBody<Bytes, BoxError>>>| async {
            Ok::<_, BoxError>(Response::new(Full::new(Bytes::from("ok"))))
        },
    ));
    let request = |body: &'static str| {
        let body = Full::new(Bytes::from(body)).map_err(|never| match never {});
        Request::post("/orders")
            .header("idempotency-key", "k-boxed")
            .body(BoxBody::new(body))
            .unwrap()
    };
    let first = service.clone().oneshot(request("")).await.unwrap();
    first.into_body().collect().await.unwrap();
    // The handler read nothing of an empty body: it is complete, so a
    // repeat with a body differs.
    let same = service.clone().oneshot(request("")).await.unwrap();
    assert_eq!(same.headers()["idempotent-replayed"], "true");
    let other = service.clone().oneshot(request("x")).await.unwrap();
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

/// A stream of the given items, without a futures dependency.
fn futures_iter<T: Unpin>(items: Vec<T>) -> IterStream<T> {
    IterStream(items.into_iter())
}

struct IterStream<T>(std::vec::IntoIter<T>);

impl<T: Unpin> futures_core::Stream for IterStream<T> {
    type Item = T;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<T>> {
        std::task::Poll::Ready(self.0.next())
    }
}

// ===== Streaming =====

/// What [`echo`] answers.
type Echoed = Result<Response<Channel<Bytes>>, BoxError>;

/// A handler that answers at once and streams its reply: `echo: {message}`
/// for each request frame, sent the moment the frame arrives, then a
/// trailer with the count once the request ends. It reads the request frame
/// by frame, as a gRPC bidirectional stream does; `calls` counts its runs.
fn echo<B>(
    calls: &Arc<AtomicUsize>,
) -> impl Service<
    Request<B>,
    Response = Response<Channel<Bytes>>,
    Error = BoxError,
    Future = std::future::Ready<Echoed>,
> + Clone
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Send,
{
    let calls = Arc::clone(calls);
    service_fn(move |request: Request<B>| {
        calls.fetch_add(1, Ordering::SeqCst);
        let (mut reply, body) = Channel::new(1);
        let mut messages = Box::pin(request.into_body());
        tokio::spawn(async move {
            let mut count = 0;
            while let Some(Ok(frame)) = messages.frame().await {
                // HTTP/2 may end the stream with an empty DATA frame.
                if let Some(message) = frame.into_data().ok().filter(|m| !m.is_empty()) {
                    count += 1;
                    let echoed = [&b"echo: "[..], &message].concat();
                    if reply.send_data(Bytes::from(echoed)).await.is_err() {
                        return;
                    }
                }
            }
            let mut trailers = http::HeaderMap::new();
            trailers.insert("x-echoed", count.into());
            let _ = reply.send_trailers(trailers).await;
        });
        std::future::ready(Ok(Response::new(body)))
    })
}

/// A request body whose frames were all sent already.
fn sent(messages: &[&'static str]) -> Channel<Bytes> {
    let (mut sender, body) = Channel::new(messages.len().max(1));
    for message in messages {
        sender
            .try_send(http_body::Frame::data(Bytes::from_static(
                message.as_bytes(),
            )))
            .unwrap();
    }
    body
}

/// The next data frame of `body`, failing instead of hanging.
async fn next_data<B>(body: &mut B) -> Bytes
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("the next frame never came")
        .expect("a frame, not the end")
        .unwrap();
    frame.into_data().expect("a data frame")
}

async fn send_message(sender: &mut Sender<Bytes>, message: &'static str) {
    sender
        .send_data(Bytes::from_static(message.as_bytes()))
        .await
        .unwrap();
}

/// The client reads the echo of message 1 before it sends message 2: the
/// guard hands the handler each request frame as it arrives and the client
/// each reply frame as it is sent. Once the exchange is over a repeat with
/// the same messages is replayed, trailers included; other messages get 422.
#[tokio::test(start_paused = true)]
async fn a_guarded_full_duplex_echo_completes() {
    let calls = Arc::new(AtomicUsize::new(0));
    let service = IdempotencyGuardLayer::new(memory()).layer(echo(&calls));
    let chat = |body: Channel<Bytes>| {
        Request::post("/chat")
            .header("idempotency-key", "k-chat")
            .body(body)
            .unwrap()
    };
    let (mut messages, body) = Channel::new(1);
    let first = tokio::time::timeout(Duration::from_secs(10), service.clone().oneshot(chat(body)))
        .await
        .expect("the reply's head comes before the request's body")
        .unwrap();
    let mut replies = first.into_body();
    send_message(&mut messages, "one").await;
    assert_eq!(next_data(&mut replies).await, "echo: one");
    send_message(&mut messages, "two").await;
    assert_eq!(next_data(&mut replies).await, "echo: two");
    drop(messages);
    let rest = replies.collect().await.unwrap();
    assert_eq!(rest.trailers().unwrap()["x-echoed"], "2");
    assert!(rest.to_bytes().is_empty());

    let repeat = service
        .clone()
        .oneshot(chat(sent(&["one", "two"])))
        .await
        .unwrap();
    assert_eq!(repeat.headers()["idempotent-replayed"], "true");
    let repeat = repeat.into_body().collect().await.unwrap();
    assert_eq!(repeat.trailers().unwrap()["x-echoed"], "2");
    assert_eq!(repeat.to_bytes(), "echo: oneecho: two");
    // The same bytes in other frames are the same body.
    let regrouped = service
        .clone()
        .oneshot(chat(sent(&["on", "etwo"])))
        .await
        .unwrap();
    assert_eq!(regrouped.headers()["idempotent-replayed"], "true");
    let other = service
        .clone()
        .oneshot(chat(sent(&["one", "three"])))
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the handler ran once");
}

/// A response the handler is still producing reaches the client chunk by
/// chunk: the client has the first one while the handler holds back the
/// rest. A repeat meanwhile is told the key is in use.
#[tokio::test(start_paused = true)]
async fn a_streamed_response_reaches_the_client_before_its_end() {
    let feed: Arc<Mutex<Option<Sender<Bytes>>>> = Arc::default();
    let handler_feed = Arc::clone(&feed);
    let service = IdempotencyGuardLayer::new(memory()).layer(service_fn(
        move |_: Request<GuardBody<Full<Bytes>>>| {
            let (mut events, body) = Channel::new(1);
            events
                .try_send(http_body::Frame::data(Bytes::from("event 1\n")))
                .unwrap();
            *handler_feed.lock().unwrap() = Some(events);
            std::future::ready(Ok::<_, BoxError>(Response::new(body)))
        },
    ));
    let request = || {
        Request::post("/events")
            .header("idempotency-key", "k-events")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let response = service.clone().oneshot(request()).await.unwrap();
    let mut events = response.into_body();
    assert_eq!(next_data(&mut events).await, "event 1\n");
    assert!(!events.is_end_stream());
    let busy = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(busy.status(), StatusCode::CONFLICT);

    let mut handler = feed
        .lock()
        .unwrap()
        .take()
        .expect("the handler holds the rest");
    send_message(&mut handler, "event 2\n").await;
    assert_eq!(next_data(&mut events).await, "event 2\n");
    drop(handler);
    assert!(events.frame().await.is_none());
    let repeat = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(repeat.headers()["idempotent-replayed"], "true");
    let replayed = repeat.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(replayed, "event 1\nevent 2\n");
}

/// A response whose `Content-Length` is over the limit is recorded as too
/// large as soon as the handler answers, before a byte of it is read; it
/// still reaches the client whole.
#[tokio::test(start_paused = true)]
async fn a_content_length_over_the_limit_is_not_kept_from_the_start() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let layer = IdempotencyGuardLayer::new(memory()).response_body_limit(1024);
    let service = layer.layer(service_fn(move |_: Request<GuardBody<Full<Bytes>>>| {
        counted.fetch_add(1, Ordering::SeqCst);
        let response = Response::builder()
            .header("content-length", "2048")
            .body(Full::new(Bytes::from(vec![b'z'; 2048])))
            .unwrap();
        std::future::ready(Ok::<_, BoxError>(response))
    }));
    let request = || {
        Request::post("/export")
            .header("idempotency-key", "k-export")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let first = service.clone().oneshot(request()).await.unwrap();
    let repeat = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(repeat.status(), StatusCode::CONFLICT);
    let json: Value =
        serde_json::from_slice(&repeat.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(json["reason"], "too_large");
    let body = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 2048);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A body that never says it has ended and is never polled (as a server
/// treats the body of a response that has none).
struct Unending;

impl http_body::Body for Unending {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        std::task::Poll::Pending
    }
}

/// A response with no body to send (`Content-Length: 0`, a 204 or 304, an
/// answer to HEAD) is recorded when the handler answers: a server never
/// polls such a body, so one that does not say it has ended was recorded as
/// cancelled, and every repeat got 409.
#[tokio::test(start_paused = true)]
async fn a_response_without_a_body_to_send_is_kept_at_once() {
    let cases = [
        ("POST", StatusCode::CREATED, Some("0")),
        ("POST", StatusCode::NO_CONTENT, None),
        ("POST", StatusCode::NOT_MODIFIED, None),
        ("HEAD", StatusCode::OK, Some("7")),
    ];
    for (method, status, length) in cases {
        let layer = IdempotencyGuardLayer::new(memory()).all_methods(true);
        let service = layer.layer(service_fn(move |_: Request<GuardBody<Full<Bytes>>>| {
            let mut response = Response::builder().status(status);
            if let Some(length) = length {
                response = response.header("content-length", length);
            }
            std::future::ready(Ok::<_, BoxError>(response.body(Unending).unwrap()))
        }));
        let request = || {
            Request::builder()
                .method(method)
                .uri("/orders")
                .header("idempotency-key", "k-empty")
                .body(Full::new(Bytes::new()))
                .unwrap()
        };
        let first = service.clone().oneshot(request()).await.unwrap();
        assert_eq!(first.status(), status);
        drop(first);
        let repeat = service.clone().oneshot(request()).await.unwrap();
        assert_eq!(repeat.status(), status, "{method} {status} replayed");
    }
}

// ===== The client side =====

/// Each logical call gets one key; every retry of it (the retry layer sits
/// inside) carries the same key; a key the caller set is kept.
#[tokio::test]
async fn the_client_layer_gives_each_logical_call_one_key_for_all_its_retries() {
    use tower::retry::{Policy, RetryLayer};

    #[derive(Clone)]
    struct ThreeTries(usize);

    impl Policy<Request<Bytes>, StatusCode, BoxError> for ThreeTries {
        type Future = std::future::Ready<()>;

        fn retry(
            &mut self,
            _: &mut Request<Bytes>,
            result: &mut Result<StatusCode, BoxError>,
        ) -> Option<Self::Future> {
            let failed = matches!(result, Ok(status) if status.is_server_error());
            (failed && self.0 > 1).then(|| {
                self.0 -= 1;
                std::future::ready(())
            })
        }

        fn clone_request(&mut self, req: &Request<Bytes>) -> Option<Request<Bytes>> {
            let mut clone = Request::new(req.body().clone());
            *clone.method_mut() = req.method().clone();
            *clone.uri_mut() = req.uri().clone();
            *clone.headers_mut() = req.headers().clone();
            Some(clone)
        }
    }

    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let record = seen.clone();
    let upstream = service_fn(move |req: Request<Bytes>| {
        let record = record.clone();
        async move {
            let key = req
                .headers()
                .get("idempotency-key")
                .map(|v| v.to_str().unwrap().to_owned());
            let mut seen = record.lock().unwrap();
            seen.push(key);
            // Every call fails twice, then works.
            let status = if seen.len().is_multiple_of(3) {
                StatusCode::CREATED
            } else {
                StatusCode::BAD_GATEWAY
            };
            Ok::<_, BoxError>(status)
        }
    });
    let mut client = tower::ServiceBuilder::new()
        .layer(IdempotencyKeyLayer::new())
        .layer(RetryLayer::new(ThreeTries(3)))
        .service(upstream);
    let call = |key: Option<&str>| {
        let mut builder = Request::post("http://orders.internal/orders");
        if let Some(key) = key {
            builder = builder.header("idempotency-key", key);
        }
        builder.body(Bytes::from_static(b"{}")).unwrap()
    };
    for request in [call(None), call(None), call(Some("mine"))] {
        let status = client.ready().await.unwrap().call(request).await.unwrap();
        assert_eq!(status, StatusCode::CREATED);
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 9);
    let keys: Vec<&str> = seen.iter().map(|k| k.as_deref().unwrap()).collect();
    assert!(
        keys[0..3].iter().all(|k| *k == keys[0]),
        "one key per call: {keys:?}"
    );
    assert!(keys[3..6].iter().all(|k| *k == keys[3]));
    assert_ne!(keys[0], keys[3], "each logical call has its own key");
    assert_eq!(keys[0].len(), 32);
    assert!(
        keys[6..9].iter().all(|k| *k == "mine"),
        "the caller's key is kept"
    );

    // GET is idempotent: no key unless asked for.
    let mut plain = IdempotencyKeyLayer::new().layer(service_fn(|req: Request<()>| async move {
        Ok::<_, BoxError>(req.headers().contains_key("idempotency-key"))
    }));
    let get = Request::get("/orders").body(()).unwrap();
    assert!(!plain.ready().await.unwrap().call(get).await.unwrap());
    let mut all = IdempotencyKeyLayer::new()
        .all_methods(true)
        .layer(service_fn(|req: Request<()>| async move {
            Ok::<_, BoxError>(req.headers().contains_key("idempotency-key"))
        }));
    let get = Request::get("/orders").body(()).unwrap();
    assert!(all.ready().await.unwrap().call(get).await.unwrap());
}

// ===== Over the wire =====

/// A POST over a real HTTP/1.1 connection.
async fn post_over(
    client: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    path: &str,
    key: &str,
) -> (StatusCode, http::HeaderMap, Bytes) {
    let request = Request::post(path)
        .header("host", "orders.internal")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"{\"sku\":3}")))
        .unwrap();
    let response = client.send_request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    (
        parts.status,
        parts.headers,
        body.collect().await.unwrap().to_bytes(),
    )
}

async fn connect(
    address: std::net::SocketAddr,
) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let (client, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    client
}

/// The guard under axum's `Router::layer` (no `HandleErrorLayer`: its error
/// is the router's `Infallible`), served on 127.0.0.1: a replay, a 409 while
/// in flight on a connection that stays usable, a 503 from a broken store.
#[tokio::test]
async fn axum_router_layer_serves_replays_and_refusals_over_http() {
    use axum::routing::post as route_post;
    use axum::Router;

    let created = Arc::new(Mutex::new(0usize));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (count, wait) = (created.clone(), gate.clone());
    let app = Router::new()
        .route(
            "/orders",
            route_post(move |body: String| {
                let (count, wait) = (count.clone(), wait.clone());
                async move {
                    let n = {
                        let mut created = count.lock().unwrap();
                        *created += 1;
                        *created
                    };
                    if body.contains("slow") {
                        wait.acquire().await.unwrap().forget();
                    }
                    (StatusCode::CREATED, format!("order {n}"))
                }
            }),
        )
        .layer(IdempotencyGuardLayer::new(memory()));
    let broken = Router::new()
        .route("/orders", route_post(|| async { StatusCode::CREATED }))
        .layer(IdempotencyGuardLayer::new(BrokenStore));
    let app = Router::new().merge(app).nest("/broken", broken);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let mut client = connect(address).await;
    let (status, _, first) = post_over(&mut client, "/orders", "wire-1").await;
    assert_eq!((status, &first[..]), (StatusCode::CREATED, &b"order 1"[..]));
    let (status, headers, repeat) = post_over(&mut client, "/orders", "wire-1").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(headers["content-length"], first.len().to_string());
    assert_eq!(repeat, first);

    // A request held in flight on a second connection; its repeat on the
    // first gets a 409 problem, and the connection serves the next request.
    let mut other = connect(address).await;
    let slow = tokio::spawn(async move {
        let request = Request::post("/orders")
            .header("host", "orders.internal")
            .header("idempotency-key", "wire-2")
            .body(Full::new(Bytes::from_static(b"slow")))
            .unwrap();
        other.send_request(request).await.unwrap().status()
    });
    while *created.lock().unwrap() < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let request = Request::post("/orders")
        .header("host", "orders.internal")
        .header("idempotency-key", "wire-2")
        .body(Full::new(Bytes::from_static(b"slow")))
        .unwrap();
    let busy = client.send_request(request).await.unwrap();
    assert_eq!(busy.status(), StatusCode::CONFLICT);
    assert_eq!(busy.headers()["content-type"], "application/problem+json");
    let json: Value =
        serde_json::from_slice(&busy.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(json["code"], "idempotency_key_in_use");
    gate.add_permits(1);
    assert_eq!(slow.await.unwrap(), StatusCode::CREATED);
    let (status, _, _) = post_over(&mut client, "/orders", "wire-3").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(*created.lock().unwrap(), 3);

    let (status, headers, body) = post_over(&mut client, "/broken/orders", "wire-4").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers["retry-after"], "1");
    let json: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["code"], "idempotency_store_unavailable");
}

/// The guard on an HTTP/2 server, with a key: the client reads the echo of
/// message 1 before it sends message 2, over a real connection on
/// 127.0.0.1. A guard that read the request body before calling the
/// handler, or the response body before answering, would leave both sides
/// waiting here. The repeat is replayed from the store.
#[tokio::test]
async fn http2_full_duplex_echo_completes_through_the_guard() {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::service::TowerToHyperService;

    let calls = Arc::new(AtomicUsize::new(0));
    let service = IdempotencyGuardLayer::new(memory()).layer(echo(&calls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let connection = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(
                    TokioIo::new(stream),
                    TowerToHyperService::new(service.clone()),
                );
            tokio::spawn(connection);
        }
    });

    let stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let (mut client, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let chat = |body: Channel<Bytes>| {
        Request::post(format!("http://{address}/chat"))
            .header("idempotency-key", "k-h2-chat")
            .body(body)
            .unwrap()
    };

    let (mut messages, body) = Channel::new(1);
    let reply = tokio::time::timeout(Duration::from_secs(10), client.send_request(chat(body)))
        .await
        .expect("the reply's head comes before the request's body")
        .unwrap();
    assert_eq!(reply.version(), http::Version::HTTP_2);
    let mut replies = reply.into_body();
    send_message(&mut messages, "one").await;
    assert_eq!(next_data(&mut replies).await, "echo: one");
    send_message(&mut messages, "two").await;
    assert_eq!(next_data(&mut replies).await, "echo: two");
    drop(messages);
    let rest = tokio::time::timeout(Duration::from_secs(10), replies.collect())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rest.trailers().unwrap()["x-echoed"], "2");
    assert!(rest.to_bytes().is_empty());

    let repeat = client
        .send_request(chat(sent(&["one", "two"])))
        .await
        .unwrap();
    assert_eq!(repeat.headers()["idempotent-replayed"], "true");
    let repeat = repeat.into_body().collect().await.unwrap();
    assert_eq!(repeat.trailers().unwrap()["x-echoed"], "2");
    assert_eq!(repeat.to_bytes(), "echo: oneecho: two");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the handler ran once");
}
