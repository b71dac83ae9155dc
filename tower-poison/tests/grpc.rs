//! gRPC calls that fail in their trailers are dead-lettered at the end of
//! the body, with the trailers' status.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::channel::Channel;
use http_body_util::{BodyExt, Full};
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_classify::{BoxError, FailureKind, GrpcClassifier};
use tower_poison::store::{DeadLetterStore, ListQuery, MemoryStore};
use tower_poison::{DeadLetterEntry, DeadLetterLayer, ReplayBody, StoreFull};

type Upload = ReplayBody<Full<Bytes>>;

fn trailers(status: &'static str) -> HeaderMap {
    let mut map = HeaderMap::new();
    map.insert("grpc-status", status.parse().unwrap());
    map
}

/// A gRPC response body: one message, then its trailers.
type Answer = http_body_util::combinators::WithTrailers<
    Full<Bytes>,
    std::future::Ready<Option<Result<HeaderMap, Infallible>>>,
>;

/// A gRPC answer: `200`, one message, then `trailers` (or none).
fn answer(end: Option<HeaderMap>) -> Response<Answer> {
    let body = Full::new(Bytes::from_static(b"\0\0\0\0\x02hi"))
        .with_trailers(std::future::ready(end.map(Ok)));
    Response::builder()
        .header("content-type", "application/grpc")
        .body(body)
        .unwrap()
}

fn call_request() -> Request<Full<Bytes>> {
    Request::post("http://greeter/greeter.Greeter/SayHello")
        .header("content-type", "application/grpc")
        .body(Full::new(Bytes::from_static(b"\0\0\0\0\x05hello")))
        .unwrap()
}

async fn entries(store: &MemoryStore) -> Vec<DeadLetterEntry> {
    store.list(ListQuery::default()).await.unwrap().entries
}

/// gRPC is a matter of the classifier: the same layer, given a
/// `GrpcClassifier`, settles calls whose status comes in the trailers.
fn layer(store: &MemoryStore) -> DeadLetterLayer<MemoryStore, GrpcClassifier> {
    DeadLetterLayer::new(store.clone()).classifier(GrpcClassifier::new())
}

#[tokio::test]
async fn a_failure_in_the_trailers_is_stored_with_its_status_before_the_caller_sees_them() {
    let store = MemoryStore::new(10);
    let service = layer(&store).layer(service_fn(|_: Request<Upload>| async {
        let mut end = trailers("14");
        end.insert("grpc-message", "backend%20down".parse().unwrap());
        Ok::<_, BoxError>(answer(Some(end)))
    }));
    let response = service.oneshot(call_request()).await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.body().awaits_end());
    assert!(entries(&store).await.is_empty(), "not known before the end");
    let mut body = response.into_body();
    body.frame().await.unwrap().unwrap();
    let last = body.frame().await.unwrap().unwrap();
    assert!(last.is_trailers());
    // By the time the trailers are handed on, the entry is written.
    let entry = entries(&store).await.remove(0);
    assert_eq!(entry.error, ["grpc-status 14: backend down"]);
    assert_eq!(entry.kind, FailureKind::ServerError);
    assert_eq!(
        entry.uri.as_deref(),
        Some("http://greeter/greeter.Greeter/SayHello")
    );
    assert_eq!(entry.body, &b"\0\0\0\0\x05hello"[..], "the request message");
}

#[tokio::test]
async fn ok_trailers_store_nothing_and_trailers_only_errors_are_settled_by_the_head() {
    let store = MemoryStore::new(10);
    let service = layer(&store).layer(service_fn(|req: Request<Upload>| async move {
        if req.uri().path().ends_with("Fail") {
            // Trailers-only: the status is in the head.
            let response = Response::builder()
                .header("content-type", "application/grpc")
                .header("grpc-status", "3");
            return Ok::<_, BoxError>(response.body(Full::new(Bytes::new())).unwrap().map(|b| {
                b.with_trailers(std::future::ready(None::<Result<HeaderMap, Infallible>>))
            }));
        }
        Ok(answer(Some(trailers("0"))))
    }));
    let response = service.clone().oneshot(call_request()).await.unwrap();
    let collected = response.into_body().collect().await.unwrap();
    assert_eq!(collected.trailers(), Some(&trailers("0")));
    assert!(entries(&store).await.is_empty());

    let request = Request::post("/greeter.Greeter/Fail")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    assert!(!response.body().awaits_end());
    let entry = entries(&store).await.remove(0);
    assert_eq!(entry.kind, FailureKind::Rejected);
}

#[tokio::test]
async fn a_body_that_ends_without_a_status_is_stored_as_unknown() {
    let store = MemoryStore::new(10);
    let service = layer(&store).layer(service_fn(|_: Request<Upload>| async {
        Ok::<_, BoxError>(answer(None))
    }));
    let response = service.oneshot(call_request()).await.unwrap();
    response.into_body().collect().await.unwrap();
    let entry = entries(&store).await.remove(0);
    assert_eq!(
        entry.error,
        ["the response body ended without a grpc-status"]
    );
    assert_eq!(entry.kind, FailureKind::ServerError);
}

#[tokio::test]
async fn a_store_that_cannot_write_turns_the_trailers_into_an_error() {
    let full = MemoryStore::new(0);
    let service = layer(&full).layer(service_fn(|_: Request<Upload>| async {
        Ok::<_, BoxError>(answer(Some(trailers("13"))))
    }));
    let response = service.oneshot(call_request()).await.unwrap();
    let error = response.into_body().collect().await.unwrap_err();
    // A store at its limits: `StoreFull`, the refusal the caller can tell
    // from a broken store.
    assert!(error.is::<StoreFull>(), "{error}");
}

#[tokio::test]
async fn a_reset_stream_is_stored_and_its_error_handed_on() {
    let store = MemoryStore::new(10);
    let service = layer(&store).layer(service_fn(|_: Request<Upload>| async {
        let (mut sender, body) = Channel::<Bytes, BoxError>::new(2);
        sender
            .send_data(Bytes::from_static(b"\0\0\0\0\x01x"))
            .await
            .unwrap();
        sender.abort("stream reset by peer".into());
        let response = Response::builder().header("content-type", "application/grpc");
        Ok::<_, BoxError>(response.body(body).unwrap())
    }));
    let response = service.oneshot(call_request()).await.unwrap();
    let error = response.into_body().collect().await.unwrap_err();
    assert_eq!(error.to_string(), "stream reset by peer");
    let entry = entries(&store).await.remove(0);
    assert_eq!(entry.kind, FailureKind::Connection);
    assert_eq!(entry.error, ["stream reset by peer"]);
}

#[tokio::test]
async fn a_body_dropped_before_its_end_stores_nothing_and_frames_pass_as_they_arrive() {
    let store = MemoryStore::new(10);
    let (mut sender, body) = Channel::<Bytes, BoxError>::new(1);
    let body = std::sync::Arc::new(std::sync::Mutex::new(Some(body)));
    let service = layer(&store).layer(service_fn(move |_: Request<Upload>| {
        let body = body.lock().unwrap().take().unwrap();
        async move {
            let response = Response::builder().header("content-type", "application/grpc");
            Ok::<_, BoxError>(response.body(body).unwrap())
        }
    }));
    let response = service.oneshot(call_request()).await.unwrap();
    let mut body = response.into_body();
    sender
        .send_data(Bytes::from_static(b"first"))
        .await
        .unwrap();
    let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("the first frame is handed on before the second is sent")
        .unwrap()
        .unwrap();
    assert_eq!(frame.into_data().unwrap(), "first");
    // The caller cancels.
    drop(body);
    let _ = sender.send_trailers(trailers("14")).await;
    assert!(entries(&store).await.is_empty());
}

/// A store whose writes take a while.
#[derive(Debug, Clone)]
struct SlowStore(MemoryStore);

impl DeadLetterStore for SlowStore {
    async fn put(&self, entry: DeadLetterEntry) -> Result<(), tower_poison::store::StoreError> {
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.0.put(entry).await
    }
    async fn get(
        &self,
        id: tower_poison::EntryId,
    ) -> Result<Option<DeadLetterEntry>, tower_poison::store::StoreError> {
        self.0.get(id).await
    }
    async fn list(
        &self,
        query: ListQuery,
    ) -> Result<tower_poison::store::Page, tower_poison::store::StoreError> {
        self.0.list(query).await
    }
    async fn remove(
        &self,
        id: tower_poison::EntryId,
    ) -> Result<bool, tower_poison::store::StoreError> {
        self.0.remove(id).await
    }
    async fn purge(
        &self,
        filter: tower_poison::store::PurgeFilter,
    ) -> Result<u64, tower_poison::store::StoreError> {
        self.0.purge(filter).await
    }
    async fn depth(&self) -> Result<u64, tower_poison::store::StoreError> {
        self.0.depth().await
    }
    async fn oldest_age(
        &self,
        now: std::time::SystemTime,
    ) -> Result<Option<Duration>, tower_poison::store::StoreError> {
        self.0.oldest_age(now).await
    }
    async fn claim(
        &self,
        id: tower_poison::EntryId,
        now: std::time::SystemTime,
        lease: Duration,
    ) -> Result<tower_poison::Claim, tower_poison::store::StoreError> {
        self.0.claim(id, now, lease).await
    }
    async fn release(
        &self,
        id: tower_poison::EntryId,
        token: tower_poison::ClaimToken,
    ) -> Result<(), tower_poison::store::StoreError> {
        self.0.release(id, token).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_body_dropped_while_its_entry_is_written_still_keeps_the_entry() {
    let store = MemoryStore::new(10);
    let service = DeadLetterLayer::new(SlowStore(store.clone()))
        .classifier(GrpcClassifier::new())
        .layer(service_fn(|_: Request<Upload>| async {
            Ok::<_, BoxError>(answer(Some(trailers("14"))))
        }));
    let response = service.oneshot(call_request()).await.unwrap();
    let mut body = response.into_body();
    body.frame().await.unwrap().unwrap();
    // The trailers arrive; the entry's write waits on the store; the caller
    // goes away.
    let waiting = tokio::time::timeout(Duration::from_millis(1), body.frame()).await;
    assert!(waiting.is_err(), "the trailers wait for the entry");
    drop(body);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(entries(&store).await.len(), 1);
}

/// Poison counts behind a store that answers only after a yield, as a
/// network store does.
#[derive(Clone, Default)]
struct WaitingCounts {
    counts: tower_poison::counts::MemoryFailureCounts,
}

impl tower_poison::counts::FailureCountStore for WaitingCounts {
    async fn count_delivery(
        &self,
        key: &tower_poison::counts::MessageKey,
        now: std::time::SystemTime,
    ) -> Result<tower_poison::counts::DeliveryTally, tower_poison::store::StoreError> {
        tokio::task::yield_now().await;
        self.counts.count_delivery(key, now).await
    }

    async fn forget(
        &self,
        key: &tower_poison::counts::MessageKey,
    ) -> Result<(), tower_poison::store::StoreError> {
        tokio::task::yield_now().await;
        self.counts.forget(key).await
    }
}

/// A gRPC client sends inside `call` (tonic's `Channel`): with a count
/// store that waits, a message over the poison limit must not be called at
/// all, so the handle of a tower-test mock never receives it.
#[tokio::test]
async fn item_4_a_diverted_grpc_message_never_reaches_a_client_that_sends_in_call() {
    let store = MemoryStore::new(10);
    let (client, mut handle) = tower_test::mock::pair::<Request<Upload>, Response<Answer>>();
    let mut service = DeadLetterLayer::new(store.clone())
        .classifier(GrpcClassifier::new())
        .message_id_header("x-message-id".parse().unwrap())
        .poison(tower_poison::PoisonPolicy::new(1).unwrap())
        .count_store(WaitingCounts::default())
        .layer(client);
    let message = || {
        let mut request = call_request();
        request
            .headers_mut()
            .insert("x-message-id", "m-1".parse().unwrap());
        request
    };
    // Under the limit: sent once the count is in, and fails.
    let (first, ()) = tokio::join!(
        async { service.ready().await?.call(message()).await },
        async {
            let (_request, respond) = handle.next_request().await.expect("sent");
            respond.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        }
    );
    assert!(first.is_err());
    // Over it: diverted, never handed to the client.
    let error = match service.ready().await.unwrap().call(message()).await {
        Err(error) => error,
        Ok(_) => panic!("the message over the limit was processed"),
    };
    assert!(error.is::<tower_poison::PoisonMessage>(), "{error}");
    let mut next = tokio_test::task::spawn(handle.next_request());
    assert!(
        next.poll().is_pending(),
        "the diverted message was sent by the client's `call`"
    );
    assert_eq!(entries(&store).await[0].kind, FailureKind::Poison);
}

/// The trailers are judged by the layer's classifier, not by a gRPC
/// classifier of the layer's own: a classifier built around
/// `GrpcClassifier` that forgives `UNAVAILABLE` and makes `NOT_FOUND`
/// poison is obeyed at the end of the body.
#[tokio::test]
async fn the_users_classifier_judges_the_trailers() {
    use tower_classify::{ClassifyExt, Failure, Outcome};

    let forgiving = GrpcClassifier::new().map(|outcome: Outcome| match outcome {
        Outcome::Failure(failure) if failure.kind == FailureKind::ServerError => Outcome::Success,
        Outcome::Failure(failure) if failure.kind == FailureKind::Rejected => {
            Outcome::Failure(Failure::new(FailureKind::Poison))
        }
        other => other,
    });
    let store = MemoryStore::new(10);
    let service = DeadLetterLayer::new(store.clone())
        .classifier(forgiving)
        .layer(service_fn(|req: Request<Upload>| async move {
            let status = match req.uri().path().ends_with("Missing") {
                true => "5",
                false => "14",
            };
            Ok::<_, BoxError>(answer(Some(trailers(status))))
        }));

    // `UNAVAILABLE` in the trailers: the plain gRPC classifier stores it,
    // this one forgives it.
    let response = service.clone().oneshot(call_request()).await.unwrap();
    assert!(response.body().awaits_end());
    let collected = response.into_body().collect().await.unwrap();
    assert_eq!(collected.trailers(), Some(&trailers("14")));
    assert!(entries(&store).await.is_empty());

    // `NOT_FOUND`: poison, by this classifier's word.
    let request = Request::post("/greeter.Greeter/Missing")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    response.into_body().collect().await.unwrap();
    let entry = entries(&store).await.remove(0);
    assert_eq!(entry.kind, FailureKind::Poison);
    assert_eq!(entry.error, ["grpc-status 5"]);
}
