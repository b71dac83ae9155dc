//! Where poison detection's delivery counts come from: the queue's own count
//! on the request (authoritative), or a count store shared by layers; a
//! crashed delivery still counts, and a failing store never loses a message.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_classify::{BoxError, ErrorChainClassifier, FailureKind};
use tower_poison::counts::{
    DeliveryTally, FailureCountStore, MemoryFailureCounts, MessageKey, RedbFailureCounts,
};
use tower_poison::store::{DeadLetterStore, ListQuery, MemoryStore, StoreError, StoreErrorKind};
use tower_poison::{
    describe_fn, Action, CountStoreFailed, DeadLetterLayer, DeliveryAttempt, DeliveryCount,
    PoisonMessage, PoisonPolicy, ReplayBody, RequestRecord,
};

type Body = ReplayBody<Full<Bytes>>;

/// A queue message as a consumer's service receives it.
#[derive(Debug, Clone)]
struct Message {
    id: String,
    /// The queue's count, when the consumer's client library reports one.
    delivery: Option<u32>,
}

fn message(id: &str) -> Message {
    Message {
        id: id.into(),
        delivery: None,
    }
}

fn describe(message: &Message) -> RequestRecord {
    RequestRecord {
        message_id: Some(message.id.clone()),
        delivery: message.delivery,
        body: Bytes::from_static(b"{\"order\":7}"),
        ..RequestRecord::default()
    }
}

/// A consumer that always fails, counting the deliveries it *processes*
/// (inside its future, so an unpolled future counts nothing).
fn failing_consumer(
    processed: Arc<AtomicUsize>,
) -> impl Service<Message, Response = (), Error = std::io::Error, Future: Send> + Clone {
    service_fn(move |_message: Message| {
        let processed = processed.clone();
        async move {
            processed.fetch_add(1, Ordering::SeqCst);
            Err(std::io::Error::other(
                "the order service rejects this payload",
            ))
        }
    })
}

async fn deliver<S>(service: &mut S, message: &Message) -> Result<(), BoxError>
where
    S: Service<Message, Response = (), Error = BoxError>,
{
    service.ready().await?.call(message.clone()).await
}

/// `true` when `counts` holds no count for message `id`: a delivery counted
/// now is its first. The count is forgotten again, leaving `counts` as it was.
async fn forgotten(counts: &RedbFailureCounts, id: &str) -> bool {
    let key = MessageKey::new(id);
    let tally = counts
        .count_delivery(&key, SystemTime::now())
        .await
        .unwrap();
    counts.forget(&key).await.unwrap();
    tally.deliveries == 1
}

// ===== a fleet sharing one count store =====

#[tokio::test]
async fn two_layers_sharing_a_redb_count_store_divert_after_max_attempts_deliveries_in_all() {
    let dir = tempfile::tempdir().unwrap();
    let counts = RedbFailureCounts::builder()
        .open(dir.path().join("counts.redb"))
        .unwrap();
    let dead_letters = MemoryStore::new(100);
    let processed = Arc::new(AtomicUsize::new(0));
    // Two consumers, as two processes would build them: separate layers,
    // separate services, one count store.
    let consumer = |counts: RedbFailureCounts| {
        DeadLetterLayer::new(dead_letters.clone())
            .classifier(ErrorChainClassifier::new())
            .capture(describe_fn(describe))
            .poison(PoisonPolicy::new(3).unwrap())
            .count_store(counts)
            .layer(failing_consumer(processed.clone()))
    };
    let mut a = consumer(counts.clone());
    let mut b = consumer(counts.clone());
    let poison = message("m-1");

    // Deliveries alternate between the consumers; the first three fail and
    // go back to the queue.
    for delivery in 1..=3 {
        let consumer = if delivery % 2 == 1 { &mut a } else { &mut b };
        let error = deliver(consumer, &poison).await.unwrap_err();
        assert!(error.is::<std::io::Error>(), "delivery {delivery}: {error}");
        assert_eq!(processed.load(Ordering::SeqCst), delivery);
    }
    assert_eq!(dead_letters.depth().await.unwrap(), 0);

    // The fourth delivery, on the consumer that saw only one of them, is
    // diverted: three deliveries in all, not three per consumer.
    let error = deliver(&mut b, &poison).await.unwrap_err();
    let diverted = error.downcast_ref::<PoisonMessage>().expect("diverted");
    assert_eq!(diverted.attempts(), 3);
    assert_eq!(diverted.action(), Action::Dlq);
    assert_eq!(processed.load(Ordering::SeqCst), 3, "not processed again");
    let entries = dead_letters
        .list(ListQuery::default())
        .await
        .unwrap()
        .entries;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].kind, FailureKind::Poison);
    assert_eq!(entries[0].attempts, 3);
    assert_eq!(entries[0].message_id.as_deref(), Some("m-1"));
    // Diverted and stored: the count is forgotten.
    assert!(forgotten(&counts, "m-1").await);
}

#[tokio::test]
async fn a_success_on_either_consumer_forgets_the_shared_count() {
    let dir = tempfile::tempdir().unwrap();
    let counts = RedbFailureCounts::builder()
        .open(dir.path().join("counts.redb"))
        .unwrap();
    let layer = |counts: RedbFailureCounts| {
        DeadLetterLayer::new(MemoryStore::new(10))
            .classifier(ErrorChainClassifier::new())
            .capture(describe_fn(describe))
            .poison(PoisonPolicy::new(3).unwrap())
            .count_store(counts)
    };
    let processed = Arc::new(AtomicUsize::new(0));
    let mut failing = layer(counts.clone()).layer(failing_consumer(processed.clone()));
    let mut working = layer(counts.clone()).layer(service_fn(|_m: Message| async {
        Ok::<_, std::io::Error>(())
    }));
    let m = message("m-2");
    deliver(&mut failing, &m).await.unwrap_err();
    deliver(&mut failing, &m).await.unwrap_err();
    // The third delivery reaches the other consumer and succeeds.
    deliver(&mut working, &m).await.unwrap();
    assert!(forgotten(&counts, "m-2").await);
    // Counting starts over: three more deliveries are processed.
    for _ in 0..3 {
        let error = deliver(&mut failing, &m).await.unwrap_err();
        assert!(error.is::<std::io::Error>(), "{error}");
    }
    assert_eq!(processed.load(Ordering::SeqCst), 5);
    let error = deliver(&mut failing, &m).await.unwrap_err();
    assert!(error.is::<PoisonMessage>(), "{error}");
}

#[tokio::test]
async fn the_redb_count_store_keeps_at_most_its_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let counts = RedbFailureCounts::builder()
        .capacity(5)
        .unwrap()
        .open(dir.path().join("counts.redb"))
        .unwrap();
    let now = SystemTime::now();
    for i in 0..50 {
        let key = MessageKey::new(&format!("m-{i}"));
        counts.count_delivery(&key, now).await.unwrap();
    }
    // The five newest keys are kept.
    for i in 45..50 {
        let newest = MessageKey::new(&format!("m-{i}"));
        let tally = counts.count_delivery(&newest, now).await.unwrap();
        assert_eq!(tally.deliveries, 2, "m-{i}");
    }
    // Every older key was forgotten: each is counted afresh. (Each probe
    // adds its key and pushes out another; no key is probed twice.)
    for i in 0..45 {
        let older = MessageKey::new(&format!("m-{i}"));
        let tally = counts.count_delivery(&older, now).await.unwrap();
        assert_eq!(tally.deliveries, 1, "m-{i} was kept past the capacity");
    }
    assert_eq!(
        RedbFailureCounts::builder()
            .capacity(0)
            .unwrap_err()
            .field(),
        "count_store.capacity"
    );
}

// ===== a crash still counts =====

/// A consumer whose every delivery hangs (a worker about to be killed); it
/// reports each delivery it starts on `started`.
fn hanging_consumer(
    started: tokio::sync::mpsc::UnboundedSender<()>,
) -> impl Service<Message, Response = (), Error = std::io::Error, Future: Send> + Clone {
    service_fn(move |_message: Message| {
        let started = started.clone();
        async move {
            let _ = started.send(());
            std::future::pending::<Result<(), std::io::Error>>().await
        }
    })
}

#[tokio::test]
async fn a_crashed_delivery_counts_in_memory() {
    let (started, mut began) = tokio::sync::mpsc::unbounded_channel();
    let dead_letters = MemoryStore::new(10);
    let service = DeadLetterLayer::new(dead_letters.clone())
        .classifier(ErrorChainClassifier::new())
        .capture(describe_fn(describe))
        .poison(PoisonPolicy::new(2).unwrap())
        .layer(hanging_consumer(started));
    let m = message("m-crash");
    // Two deliveries start processing and are cut off mid-flight (their
    // tasks aborted, as when a worker dies): neither returned a failure.
    for _ in 0..2 {
        let task = tokio::spawn(service.clone().oneshot(m.clone()));
        began.recv().await.unwrap();
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
    }
    // Both count: the third delivery is diverted, not processed.
    let error = service.clone().oneshot(m.clone()).await.unwrap_err();
    let diverted = error.downcast_ref::<PoisonMessage>().expect("diverted");
    assert_eq!(diverted.attempts(), 2);
    assert!(began.try_recv().is_err(), "the consumer was not called");
    let entry = dead_letters
        .list(ListQuery::default())
        .await
        .unwrap()
        .entries;
    // No failure was ever returned, so the entry says what is known.
    assert_eq!(
        entry[0].error,
        ["2 earlier deliveries did not succeed (this consumer saw none of their errors)"]
    );
}

#[tokio::test]
async fn a_crashed_process_counts_after_a_restart_with_the_redb_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("counts.redb");
    let m = message("m-kills-its-worker");
    let consumer = |started| {
        DeadLetterLayer::new(MemoryStore::new(10))
            .classifier(ErrorChainClassifier::new())
            .capture(describe_fn(describe))
            .poison(PoisonPolicy::new(1).unwrap())
            .count_store(RedbFailureCounts::builder().open(&path).unwrap())
            .layer(hanging_consumer(started))
    };
    {
        // The first process: the delivery reaches the consumer, then the
        // process dies (task aborted, layer, service and store dropped).
        let (started, mut began) = tokio::sync::mpsc::unbounded_channel();
        let service = consumer(started);
        let task = tokio::spawn(service.oneshot(m.clone()));
        began.recv().await.unwrap();
        task.abort();
        let _ = task.await;
    }
    // The restarted process sees the crashed delivery.
    let (started, mut began) = tokio::sync::mpsc::unbounded_channel();
    let error = consumer(started).oneshot(m).await.unwrap_err();
    assert_eq!(
        error
            .downcast_ref::<PoisonMessage>()
            .expect("diverted")
            .attempts(),
        1
    );
    assert!(began.try_recv().is_err());
}

#[tokio::test]
async fn a_count_from_the_queue_survives_a_crash_without_any_store() {
    // A fresh layer (a restarted worker) knows nothing, but the queue's
    // count says this is the fourth delivery.
    let processed = Arc::new(AtomicUsize::new(0));
    let service = DeadLetterLayer::new(MemoryStore::new(10))
        .classifier(ErrorChainClassifier::new())
        .capture(describe_fn(describe))
        .poison(PoisonPolicy::new(3).unwrap())
        .layer(failing_consumer(processed.clone()));
    let mut m = message("m-3");
    m.delivery = Some(4);
    let error = service.clone().oneshot(m.clone()).await.unwrap_err();
    assert_eq!(error.downcast_ref::<PoisonMessage>().unwrap().attempts(), 3);
    m.delivery = Some(3);
    let error = service.oneshot(m).await.unwrap_err();
    assert!(error.is::<std::io::Error>());
    assert_eq!(processed.load(Ordering::SeqCst), 1);
}

// ===== a count store that fails =====

/// A count store that is down: every call fails, after `waits` yields.
#[derive(Clone)]
struct DownStore {
    waits: usize,
    asked: Arc<AtomicUsize>,
}

impl FailureCountStore for DownStore {
    async fn count_delivery(
        &self,
        _key: &MessageKey,
        _now: SystemTime,
    ) -> Result<DeliveryTally, StoreError> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        for _ in 0..self.waits {
            tokio::task::yield_now().await;
        }
        Err(StoreError::new(
            StoreErrorKind::Backend,
            "count store unreachable",
        ))
    }

    async fn forget(&self, _key: &MessageKey) -> Result<(), StoreError> {
        Err(StoreError::new(
            StoreErrorKind::Backend,
            "count store unreachable",
        ))
    }
}

#[tokio::test]
async fn a_failing_count_store_fails_the_delivery_unprocessed_and_stores_nothing() {
    for waits in [0, 3] {
        let processed = Arc::new(AtomicUsize::new(0));
        let asked = Arc::new(AtomicUsize::new(0));
        let dead_letters = MemoryStore::new(10);
        let service = DeadLetterLayer::new(dead_letters.clone())
            .classifier(ErrorChainClassifier::new())
            .capture(describe_fn(describe))
            .count_store(DownStore {
                waits,
                asked: asked.clone(),
            })
            .poison(PoisonPolicy::new(3).unwrap())
            .layer(failing_consumer(processed.clone()));
        let error = service.oneshot(message("m-4")).await.unwrap_err();
        let failed = error
            .downcast_ref::<CountStoreFailed>()
            .unwrap_or_else(|| panic!("waits {waits}: {error}"));
        assert_eq!(failed.store_error().kind(), StoreErrorKind::Backend);
        assert_eq!(asked.load(Ordering::SeqCst), 1);
        // Not processed, not dead-lettered, and the error is not a
        // `PoisonMessage`: the consumer does not acknowledge it and the
        // queue delivers it again.
        assert_eq!(processed.load(Ordering::SeqCst), 0, "waits {waits}");
        assert_eq!(dead_letters.depth().await.unwrap(), 0);
    }
}

#[tokio::test]
async fn a_store_that_cannot_forget_still_returns_the_success() {
    let service = DeadLetterLayer::new(MemoryStore::new(10))
        .classifier(ErrorChainClassifier::new())
        .capture(describe_fn(describe))
        .poison(PoisonPolicy::new(3).unwrap())
        .count_store(DownStore {
            waits: 0,
            asked: Arc::default(),
        })
        .layer(service_fn(|_m: Message| async {
            Ok::<_, std::io::Error>(())
        }));
    // The queue's count spares the store the count; the success then has
    // nothing to forget in it.
    let mut m = message("m-5");
    m.delivery = Some(1);
    service.oneshot(m).await.unwrap();
}

/// Memory counts behind a store that answers only after a yield, like a
/// network store.
#[derive(Clone, Default)]
struct SlowStore {
    counts: MemoryFailureCounts,
}

impl FailureCountStore for SlowStore {
    async fn count_delivery(
        &self,
        key: &MessageKey,
        now: SystemTime,
    ) -> Result<DeliveryTally, StoreError> {
        tokio::task::yield_now().await;
        self.counts.count_delivery(key, now).await
    }

    async fn forget(&self, key: &MessageKey) -> Result<(), StoreError> {
        tokio::task::yield_now().await;
        self.counts.forget(key).await
    }
}

#[tokio::test]
async fn a_store_that_waits_still_keeps_a_diverted_message_from_the_service() {
    let processed = Arc::new(AtomicUsize::new(0));
    let store = SlowStore::default();
    let mut service = DeadLetterLayer::new(MemoryStore::new(10))
        .classifier(ErrorChainClassifier::new())
        .capture(describe_fn(describe))
        .poison(PoisonPolicy::new(2).unwrap())
        .count_store(store.clone())
        .layer(failing_consumer(processed.clone()));
    let m = message("m-6");
    deliver(&mut service, &m).await.unwrap_err();
    deliver(&mut service, &m).await.unwrap_err();
    let error = deliver(&mut service, &m).await.unwrap_err();
    let diverted = error.downcast_ref::<PoisonMessage>().expect("diverted");
    assert_eq!(diverted.attempts(), 2);
    assert_eq!(processed.load(Ordering::SeqCst), 2);
    // Dead-lettered: the count is forgotten, so the next delivery counts as
    // the first.
    let next = store
        .counts
        .count_delivery(&MessageKey::new("m-6"), SystemTime::now())
        .await
        .unwrap();
    assert_eq!(next.deliveries, 1);
}

/// A consumer that acts inside `call` (hyper's `SendRequest` and tonic's
/// `Channel` send there, `RateLimit` spends its permit): a tower-test mock,
/// whose handle receives each request as soon as `call` is made.
#[tokio::test]
async fn item_4_a_store_that_waits_keeps_a_diverted_message_from_a_service_that_acts_in_call() {
    let (consumer, mut handle) = tower_test::mock::pair::<Message, ()>();
    let mut service = DeadLetterLayer::new(MemoryStore::new(10))
        .classifier(ErrorChainClassifier::new())
        .capture(describe_fn(describe))
        .poison(PoisonPolicy::new(1).unwrap())
        .count_store(SlowStore::default())
        .layer(consumer);
    let m = message("m-9");
    // The first delivery is under the limit: sent once the count is in.
    let (first, ()) = tokio::join!(deliver(&mut service, &m), async {
        let (request, respond) = handle.next_request().await.expect("sent");
        assert_eq!(request.id, "m-9");
        respond.send_error(std::io::Error::other("rejected"));
    });
    assert!(first.unwrap_err().is::<std::io::Error>());
    // The second is over it: diverted, and never handed to the consumer.
    let error = deliver(&mut service, &m).await.unwrap_err();
    assert!(error.is::<PoisonMessage>(), "{error}");
    let mut next = tokio_test::task::spawn(handle.next_request());
    assert!(
        next.poll().is_pending(),
        "the diverted message was sent by the consumer's `call`"
    );
}

/// Issue 31, item 4: a message diverted after a count store that waits is
/// stored with its whole body. The request (and its copy of the body) is
/// held until the count decides; held on through the entry's write, the
/// entry could not read the rest of the body and stored none of it.
#[tokio::test]
async fn item_4_a_message_diverted_after_a_waiting_count_keeps_its_body() {
    let dead_letters = MemoryStore::new(10);
    let mut service = DeadLetterLayer::new(dead_letters.clone())
        .message_id_header("x-message-id".parse().unwrap())
        .poison(PoisonPolicy::new(1).unwrap())
        .count_store(SlowStore::default())
        .layer(service_fn(|_: Request<Body>| async {
            Ok::<_, BoxError>(
                Response::builder()
                    .status(StatusCode::SERVICE_UNAVAILABLE)
                    .body(Bytes::new())
                    .unwrap(),
            )
        }));
    let order = || {
        Request::post("http://localhost/orders")
            .header("x-message-id", "m-10")
            .body(Full::new(Bytes::from_static(br#"{"order":7}"#)))
            .unwrap()
    };
    let first = service.ready().await.unwrap().call(order()).await;
    assert_eq!(first.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
    let error = service
        .ready()
        .await
        .unwrap()
        .call(order())
        .await
        .unwrap_err();
    assert!(error.is::<PoisonMessage>(), "{error}");
    let entries = dead_letters
        .list(ListQuery::default())
        .await
        .unwrap()
        .entries;
    let diverted = entries
        .iter()
        .find(|entry| entry.kind == FailureKind::Poison)
        .expect("the diverted message is stored");
    assert_eq!(
        (&diverted.body[..], diverted.body_truncated),
        (&br#"{"order":7}"#[..], false)
    );
}

// ===== the queue's count on an HTTP request =====

type Http = Request<Full<Bytes>>;
/// What the dead-letter layer answers an HTTP call with.
type Answer = Response<tower_poison::SettleBody<Bytes, tower_poison::OpenCall>>;

fn http_consumer(
    reader: DeliveryCount,
    store: impl FailureCountStore,
    processed: Arc<AtomicUsize>,
) -> impl Service<Http, Response = Answer, Error = BoxError> + Clone {
    DeadLetterLayer::new(MemoryStore::new(10))
        .message_id_header("x-message-id".parse().unwrap())
        .delivery_count(reader)
        .poison(PoisonPolicy::new(3).unwrap())
        .count_store(store)
        .layer(service_fn(move |_req: Request<Body>| {
            let processed = processed.clone();
            async move {
                processed.fetch_add(1, Ordering::SeqCst);
                Ok::<_, BoxError>(
                    Response::builder()
                        .status(StatusCode::SERVICE_UNAVAILABLE)
                        .body(Bytes::new())
                        .unwrap(),
                )
            }
        }))
}

fn http_message(headers: &[(&str, &str)]) -> Http {
    let mut request = Request::post("http://localhost/").header("x-message-id", "m-7");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(Full::new(Bytes::from_static(b"{}"))).unwrap()
}

/// Delivers `request` to a consumer whose count store is down: a request
/// the layer reads a count from never reaches the store.
async fn outcome(reader: DeliveryCount, request: Http) -> (Result<Answer, BoxError>, usize, usize) {
    let processed = Arc::new(AtomicUsize::new(0));
    let asked = Arc::new(AtomicUsize::new(0));
    let store = DownStore {
        waits: 0,
        asked: asked.clone(),
    };
    let result = http_consumer(reader, store, processed.clone())
        .oneshot(request)
        .await;
    (
        result,
        processed.load(Ordering::SeqCst),
        asked.load(Ordering::SeqCst),
    )
}

fn diverted_after(result: &Result<Answer, BoxError>) -> Option<u32> {
    let error = result.as_ref().err()?;
    error
        .downcast_ref::<PoisonMessage>()
        .map(PoisonMessage::attempts)
}

#[tokio::test]
async fn the_sqs_receive_count_is_authoritative() {
    let header = "x-aws-sqsd-receive-count";
    let (result, processed, asked) =
        outcome(DeliveryCount::sqs(), http_message(&[(header, "4")])).await;
    assert_eq!(diverted_after(&result), Some(3));
    assert_eq!((processed, asked), (0, 0));
    let (result, processed, asked) =
        outcome(DeliveryCount::sqs(), http_message(&[(header, "3")])).await;
    assert_eq!(result.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!((processed, asked), (1, 0), "processed, and no store asked");
}

#[tokio::test]
async fn the_rabbitmq_delivery_count_counts_redeliveries() {
    let header = "x-delivery-count";
    // Three redeliveries: this is the fourth delivery.
    let (result, processed, asked) =
        outcome(DeliveryCount::rabbitmq(), http_message(&[(header, "3")])).await;
    assert_eq!(diverted_after(&result), Some(3));
    assert_eq!((processed, asked), (0, 0));
    // No header on a quorum queue: the first delivery.
    let (result, processed, asked) = outcome(DeliveryCount::rabbitmq(), http_message(&[])).await;
    assert!(result.is_ok());
    assert_eq!((processed, asked), (1, 0));
    let (result, _, _) = outcome(DeliveryCount::rabbitmq(), http_message(&[(header, "2")])).await;
    assert!(result.is_ok());
}

#[tokio::test]
async fn the_redis_streams_counter_comes_as_a_header_or_an_extension() {
    let header = "x-redis-stream-delivery-count";
    let (result, processed, _) = outcome(
        DeliveryCount::redis_streams(),
        http_message(&[(header, "4")]),
    )
    .await;
    assert_eq!(diverted_after(&result), Some(3));
    assert_eq!(processed, 0);
    // The extension is read whatever the header says, with any reader.
    let mut request = http_message(&[(header, "1")]);
    request.extensions_mut().insert(DeliveryAttempt(5));
    let (result, processed, asked) = outcome(DeliveryCount::sqs(), request).await;
    assert_eq!(diverted_after(&result), Some(4));
    assert_eq!((processed, asked), (0, 0));
}

#[tokio::test]
async fn hostile_delivery_counts_fall_back_to_the_store_or_saturate() {
    let header = "x-aws-sqsd-receive-count";
    for hostile in ["", "-4", "4.0", "0x4", "four", "0", "4 4"] {
        // Unreadable: the store is asked (and, being down, fails the
        // delivery unprocessed).
        let (result, processed, asked) =
            outcome(DeliveryCount::sqs(), http_message(&[(header, hostile)])).await;
        let error = result.unwrap_err();
        assert!(error.is::<CountStoreFailed>(), "{hostile:?}: {error}");
        assert_eq!((processed, asked), (0, 1), "{hostile:?}");
    }
    // Two values of the header: neither is trusted.
    let mut request = http_message(&[(header, "1")]);
    request.headers_mut().append(header, "9".parse().unwrap());
    let (result, _, asked) = outcome(DeliveryCount::sqs(), request).await;
    assert!(result.unwrap_err().is::<CountStoreFailed>());
    assert_eq!(asked, 1);
    // A number past u32::MAX saturates: an absurd count, diverted.
    let (result, processed, _) = outcome(
        DeliveryCount::sqs(),
        http_message(&[(header, "184467440737095516160000")]),
    )
    .await;
    assert_eq!(diverted_after(&result), Some(u32::MAX - 1));
    assert_eq!(processed, 0);
}

#[tokio::test]
async fn long_and_binary_message_ids_are_counted_by_a_bounded_key() {
    let processed = Arc::new(AtomicUsize::new(0));
    let counts = MemoryFailureCounts::new(100).unwrap();
    let service = DeadLetterLayer::new(MemoryStore::new(10))
        .classifier(ErrorChainClassifier::new())
        .capture(describe_fn(describe))
        .poison(PoisonPolicy::new(1).unwrap())
        .count_store(counts.clone())
        .layer(failing_consumer(processed.clone()));
    let huge = "x".repeat(1 << 20);
    service.clone().oneshot(message(&huge)).await.unwrap_err();
    let key = MessageKey::new(&huge);
    // At most 131 bytes, as `MessageKey`'s docs say.
    assert!(key.as_str().len() <= 131);
    // The layer counted the delivery under the bounded key: one more makes
    // two.
    let tally = counts
        .count_delivery(&key, SystemTime::now())
        .await
        .unwrap();
    assert_eq!(tally.deliveries, 2);
    let error = service.oneshot(message(&huge)).await.unwrap_err();
    assert!(error.is::<PoisonMessage>(), "{error}");
}

#[test]
fn a_store_needing_the_runtime_is_not_polled_by_a_call_made_outside_one() {
    let dir = tempfile::tempdir().unwrap();
    let counts = RedbFailureCounts::builder()
        .open(dir.path().join("counts.redb"))
        .unwrap();
    let processed = Arc::new(AtomicUsize::new(0));
    let mut service = DeadLetterLayer::new(MemoryStore::new(10))
        .classifier(ErrorChainClassifier::new())
        .capture(describe_fn(describe))
        .poison(PoisonPolicy::new(1).unwrap())
        .count_store(counts)
        .layer(failing_consumer(processed.clone()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for _ in 0..2 {
        // `call` outside the runtime (redb's counting needs its blocking
        // pool), the future awaited inside it.
        let delivery = service.call(message("m-8"));
        let _ = runtime.block_on(delivery);
    }
    assert_eq!(
        processed.load(Ordering::SeqCst),
        1,
        "the second was diverted"
    );
}
