//! The dead-letter layer in a stack: what lands in the store, and what the
//! caller gets back.

use std::error::Error;
use std::fmt;
use std::future::Ready;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tower::retry::{Policy, RetryLayer};
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};
use tower_classify::{
    BoxError, Classified, Classify, ErrorChainClassifier, FailureKind, HttpClassifier,
};
use tower_poison::store::{DeadLetterStore, ListQuery, MemoryStore, PurgeFilter, StoreError};
use tower_poison::store::{Page, StoreErrorKind};
use tower_poison::{
    describe_fn, Action, CountAttemptsLayer, DeadLetterEntry, DeadLetterLayer, EntryId,
    PoisonMessage, PoisonPolicy, ReplayBody, RequestRecord, StoreFailed, StoreFull, REDACTED,
};

type Body = ReplayBody<Full<Bytes>>;

/// An error with a cause, like a client error wrapping an I/O error.
#[derive(Debug)]
struct UpstreamError(std::io::Error);

impl fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("upstream call failed")
    }
}

impl Error for UpstreamError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.0)
    }
}

/// A retry policy like a real one: retries what the shared classifier calls
/// retryable, up to `attempts` in all, and carries request extensions to each
/// attempt (which is how the attempt counter travels).
#[derive(Clone)]
struct RetryClassified {
    remaining: usize,
}

impl Policy<Request<Body>, Response<Bytes>, BoxError> for RetryClassified {
    type Future = Ready<()>;

    fn retry(
        &mut self,
        _req: &mut Request<Body>,
        result: &mut Result<Response<Bytes>, BoxError>,
    ) -> Option<Self::Future> {
        let outcome = HttpClassifier::new().classify(result.as_ref());
        if outcome.is_retryable() && self.remaining > 1 {
            self.remaining -= 1;
            Some(std::future::ready(()))
        } else {
            None
        }
    }

    fn clone_request(&mut self, req: &Request<Body>) -> Option<Request<Body>> {
        let mut clone = Request::new(req.body().clone());
        *clone.method_mut() = req.method().clone();
        *clone.uri_mut() = req.uri().clone();
        *clone.headers_mut() = req.headers().clone();
        *clone.extensions_mut() = req.extensions().clone();
        Some(clone)
    }
}

fn request(body: &'static str) -> Request<Full<Bytes>> {
    Request::post("http://payments.internal/charges?currency=eur")
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk_live_secret")
        .header("cookie", "session=secret")
        .header("x-api-key", "secret")
        .header("x-tenant-token", "secret")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

async fn all(store: &impl DeadLetterStore) -> Vec<DeadLetterEntry> {
    store
        .list(ListQuery {
            limit: 1000,
            ..ListQuery::default()
        })
        .await
        .unwrap()
        .entries
}

/// One snapshot of the recorded metrics (taking one resets the values).
type Series = (String, Vec<(String, String)>, DebugValue);

struct Recorded(Vec<Series>);

impl Recorded {
    fn take(snapshotter: &Snapshotter) -> Self {
        Recorded(
            snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .map(|(key, _, _, value)| {
                    let labels = key
                        .key()
                        .labels()
                        .map(|l| (l.key().to_owned(), l.value().to_owned()))
                        .collect();
                    (key.key().name().to_owned(), labels, value)
                })
                .collect(),
        )
    }

    /// The counter `name` summed over series with `action`.
    fn counter(&self, name: &str, action: &str) -> u64 {
        self.0
            .iter()
            .filter(|(n, labels, _)| {
                n == name && labels.iter().any(|(k, v)| k == "action" && v == action)
            })
            .map(|(.., value)| match value {
                DebugValue::Counter(n) => *n,
                _ => 0,
            })
            .sum()
    }

    fn gauge(&self, name: &str) -> Option<f64> {
        self.0
            .iter()
            .find(|(n, ..)| n == name)
            .and_then(|(.., value)| match value {
                DebugValue::Gauge(g) => Some(g.into_inner()),
                _ => None,
            })
    }
}

fn run<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

#[test]
fn call_that_fails_after_retries_lands_in_the_store_with_every_field() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        run(async {
            let store = MemoryStore::new(100);
            let calls = Arc::new(AtomicUsize::new(0));
            let inner_calls = calls.clone();
            let mut service = ServiceBuilder::new()
                .layer(
                    DeadLetterLayer::new(store.clone())
                        .label("payments")
                        .redactor(
                            tower_poison::Redactor::default()
                                .with_header("x-tenant-token".parse().unwrap()),
                        ),
                )
                .layer(RetryLayer::new(RetryClassified { remaining: 3 }))
                .layer(CountAttemptsLayer::new())
                .service(service_fn(move |req: Request<Body>| {
                    let calls = inner_calls.clone();
                    async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        // The body reaches the inner service whole on every attempt.
                        let body = req.into_body().collect().await?.to_bytes();
                        assert_eq!(body, r#"{"amount":100}"#);
                        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
                        Err::<Response<Bytes>, BoxError>(UpstreamError(refused).into())
                    }
                }));

            let before = SystemTime::now();
            let error = service
                .ready()
                .await
                .unwrap()
                .call(request(r#"{"amount":100}"#))
                .await
                .unwrap_err();
            let after = SystemTime::now();

            // The caller gets the inner error itself, not a wrapper.
            assert!(error.downcast_ref::<UpstreamError>().is_some(), "{error}");
            assert_eq!(calls.load(Ordering::SeqCst), 3);

            let entries = all(&store).await;
            assert_eq!(entries.len(), 1, "stored once, not once per attempt");
            let entry = &entries[0];
            assert_eq!(entry.label, "payments");
            assert_eq!(entry.message_id, None);
            assert_eq!(entry.method.as_deref(), Some("POST"));
            assert_eq!(
                entry.uri.as_deref(),
                Some("http://payments.internal/charges?currency=eur")
            );
            let header = |name: &str| {
                entry
                    .headers
                    .iter()
                    .find(|h| h.name == name)
                    .map(|h| h.value.as_str())
            };
            assert_eq!(header("content-type"), Some("application/json"));
            for sensitive in ["authorization", "cookie", "x-api-key", "x-tenant-token"] {
                assert_eq!(header(sensitive), Some(REDACTED), "{sensitive}");
            }
            assert!(!entry.headers.iter().any(|h| h.value.contains("secret")));
            assert_eq!(entry.body, r#"{"amount":100}"#);
            assert!(!entry.body_truncated);
            assert_eq!(entry.error, ["upstream call failed", "connection refused"]);
            assert_eq!(entry.kind, FailureKind::NotSent);
            assert_eq!(entry.attempts, 3);
            // Stored times have millisecond precision.
            let ms = std::time::Duration::from_millis(1);
            assert!(before <= entry.first_failed_at + ms);
            assert!(entry.first_failed_at <= entry.last_failed_at);
            assert!(entry.last_failed_at <= after);
            assert_eq!(store.get(entry.id).await.unwrap().as_ref(), Some(entry));
        });
    });
    let recorded = Recorded::take(&snapshotter);
    assert_eq!(
        recorded.counter("tower_poison_dead_lettered_total", "dlq"),
        1
    );
    // Counted under the entry's kind too: poison input apart from outages.
    let kinds: Vec<&str> = recorded
        .0
        .iter()
        .filter(|(name, ..)| name == "tower_poison_dead_lettered_total")
        .flat_map(|(_, labels, _)| labels.iter().filter(|(k, _)| k == "kind"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(kinds, [FailureKind::NotSent.as_str()]);
    assert_eq!(recorded.gauge("tower_poison_dlq_depth"), Some(1.0));
}

#[tokio::test]
async fn transient_failure_fixed_by_retry_is_not_dead_lettered() {
    let store = MemoryStore::new(100);
    let calls = Arc::new(AtomicUsize::new(0));
    let inner_calls = calls.clone();
    let mut service = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()))
        .layer(RetryLayer::new(RetryClassified { remaining: 3 }))
        .service(service_fn(move |_req: Request<Body>| {
            let n = inner_calls.fetch_add(1, Ordering::SeqCst);
            async move {
                let status = if n == 0 { 503 } else { 200 };
                Ok::<_, BoxError>(
                    Response::builder()
                        .status(status)
                        .body(Bytes::new())
                        .unwrap(),
                )
            }
        }));
    let response = service
        .ready()
        .await
        .unwrap()
        .call(request("{}"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(store.depth().await.unwrap(), 0);
}

fn failing_http_service(
) -> impl Service<Request<Body>, Response = Response<Bytes>, Error = BoxError, Future: Send>
       + Clone
       + Send
       + 'static {
    service_fn(|_req: Request<Body>| async {
        Err::<Response<Bytes>, BoxError>(
            std::io::Error::from(std::io::ErrorKind::ConnectionReset).into(),
        )
    })
}

#[test]
fn drop_and_fail_store_nothing_return_the_error_and_count_by_action() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        run(async {
            for action in [Action::Drop, Action::Fail] {
                let store = MemoryStore::new(100);
                let mut service = DeadLetterLayer::new(store.clone())
                    .action(action)
                    .layer_service(failing_http_service());
                for _ in 0..2 {
                    let error = service
                        .ready()
                        .await
                        .unwrap()
                        .call(request("{}"))
                        .await
                        .unwrap_err();
                    let io = error.downcast_ref::<std::io::Error>().unwrap();
                    assert_eq!(io.kind(), std::io::ErrorKind::ConnectionReset);
                }
                assert_eq!(store.depth().await.unwrap(), 0, "{action} stored");
            }
        });
    });
    let recorded = Recorded::take(&snapshotter);
    assert_eq!(
        recorded.counter("tower_poison_dead_lettered_total", "drop"),
        2
    );
    assert_eq!(
        recorded.counter("tower_poison_dead_lettered_total", "fail"),
        2
    );
    assert_eq!(
        recorded.counter("tower_poison_dead_lettered_total", "dlq"),
        0
    );
}

/// `layer_service` keeps the tests short: `layer.layer(service)`.
trait LayerService<S>: tower::Layer<S> {
    fn layer_service(&self, service: S) -> Self::Service {
        self.layer(service)
    }
}

impl<S, L: tower::Layer<S>> LayerService<S> for L {}

#[tokio::test]
async fn poison_outcome_is_dead_lettered_on_the_first_failure() {
    let store = MemoryStore::new(100);
    let calls = Arc::new(AtomicUsize::new(0));
    let inner_calls = calls.clone();
    let mut service = ServiceBuilder::new()
        .layer(
            DeadLetterLayer::new(store.clone())
                .message_id_header("x-message-id".parse().unwrap())
                // Even with poison detection counting deliveries, a poison
                // outcome does not wait for the count.
                .poison(PoisonPolicy::new(5).unwrap()),
        )
        .layer(RetryLayer::new(RetryClassified { remaining: 3 }))
        .service(service_fn(move |_req: Request<Body>| {
            inner_calls.fetch_add(1, Ordering::SeqCst);
            async {
                Err::<Response<Bytes>, BoxError>(
                    Classified::new(FailureKind::Poison, "payload fails schema validation").into(),
                )
            }
        }));
    let mut req = request(r#"{"amount":"lots"}"#);
    req.headers_mut()
        .insert("x-message-id", "msg-7".parse().unwrap());
    let error = service.ready().await.unwrap().call(req).await.unwrap_err();
    assert!(error.downcast_ref::<Classified>().is_some());
    assert_eq!(calls.load(Ordering::SeqCst), 1, "poison is never retried");

    let entries = all(&store).await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].kind, FailureKind::Poison);
    assert_eq!(entries[0].attempts, 1);
    assert_eq!(entries[0].message_id.as_deref(), Some("msg-7"));
    assert_eq!(entries[0].error, ["payload fails schema validation"]);
}

/// The error chain stored for one call that failed with an
/// [`UpstreamError`] over an I/O error saying `message`, through a
/// dead-letter layer with `redactor`.
async fn stored_error(redactor: tower_poison::Redactor, message: String) -> Vec<String> {
    let store = MemoryStore::new(100);
    let mut service = DeadLetterLayer::new(store.clone())
        .redactor(redactor)
        .layer(service_fn(move |_req: Request<Body>| {
            let error = UpstreamError(std::io::Error::other(message.clone()));
            async move { Err::<Response<Bytes>, BoxError>(error.into()) }
        }));
    service
        .ready()
        .await
        .unwrap()
        .call(request("{}"))
        .await
        .unwrap_err();
    let entries = all(&store).await;
    let [entry] = &entries[..] else {
        panic!("one entry: {entries:?}")
    };
    entry.error.clone()
}

/// An upstream error that quotes a whole body is stored cut to 8 levels of
/// at most 512 bytes (as `DeadLetterEntry::error` says): sixteen 4 MiB failures
/// used to keep 64 MiB of error text in a store bounded by entry count.
#[tokio::test]
async fn a_huge_error_is_stored_cut_to_its_bound() {
    let error = stored_error(tower_poison::Redactor::default(), "x".repeat(4 << 20)).await;
    assert_eq!(error.len(), 2);
    assert_eq!(error[0], "upstream call failed");
    assert!(error[1].len() <= 512);
    assert!(error[1].ends_with('…'));
}

/// A redactor given to the layer applies its hooks: the error-text hook
/// sees each message whole, so a secret across the 512-byte cut is still
/// redacted (cut first, its first part was stored).
#[tokio::test]
async fn a_layers_redactor_hooks_see_each_error_whole() {
    let redactor = tower_poison::Redactor::default()
        .with_error_hook(|line| *line = line.replace("SECRET-TOKEN-123", "[token]"));
    let message = format!("{}SECRET-TOKEN-123", "x".repeat(505));
    let stored = stored_error(redactor, message).await.join(": ");
    assert!(!stored.contains("SECRET"), "{stored}");
    assert!(stored.contains("[token]"), "{stored}");
}

/// A queue message, as a consumer's service receives it.
#[derive(Debug, Clone)]
struct Message {
    id: String,
    payload: Bytes,
}

fn describe(message: &Message) -> RequestRecord {
    RequestRecord {
        message_id: Some(message.id.clone()),
        method: Some("consume".into()),
        uri: Some("queue://orders".into()),
        body: message.payload.clone(),
        ..RequestRecord::default()
    }
}

#[tokio::test]
async fn message_failing_max_attempts_across_deliveries_is_diverted_and_not_called_again() {
    let store = MemoryStore::new(100);
    let calls = Arc::new(AtomicUsize::new(0));
    let inner_calls = calls.clone();
    let consumer = service_fn(move |message: Message| {
        inner_calls.fetch_add(1, Ordering::SeqCst);
        async move {
            if message.payload == "good" {
                Ok(())
            } else {
                Err(std::io::Error::other("downstream rejected the write"))
            }
        }
    });
    let mut service = DeadLetterLayer::new(store.clone())
        .label("orders-consumer")
        .classifier(ErrorChainClassifier::new())
        .capture(describe_fn(describe))
        .poison(PoisonPolicy::new(3).unwrap())
        .layer_service(consumer);
    let bad = Message {
        id: "m-1".into(),
        payload: Bytes::from_static(b"bad"),
    };

    // Three deliveries fail; each returns the error (the queue redelivers) and
    // nothing is stored yet.
    for delivery in 1..=3 {
        let error = service
            .ready()
            .await
            .unwrap()
            .call(bad.clone())
            .await
            .unwrap_err();
        assert!(error.downcast_ref::<std::io::Error>().is_some());
        assert_eq!(calls.load(Ordering::SeqCst), delivery);
        assert_eq!(store.depth().await.unwrap(), 0);
    }
    // Another message is unaffected by m-1's count.
    let good = Message {
        id: "m-2".into(),
        payload: Bytes::from_static(b"good"),
    };
    service.ready().await.unwrap().call(good).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 4);

    // The fourth delivery is diverted: the consumer is not called again.
    let error = service
        .ready()
        .await
        .unwrap()
        .call(bad.clone())
        .await
        .unwrap_err();
    let poison = error
        .downcast_ref::<PoisonMessage>()
        .expect("poison message error");
    assert_eq!(poison.message_id(), "m-1");
    assert_eq!(poison.attempts(), 3);
    assert_eq!(poison.action(), Action::Dlq);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        4,
        "inner service called again"
    );

    let entries = all(&store).await;
    assert_eq!(entries.len(), 1);
    let entry = &entries[0];
    assert_eq!(Some(entry.id), poison.entry_id());
    assert_eq!(entry.label, "orders-consumer");
    assert_eq!(entry.message_id.as_deref(), Some("m-1"));
    assert_eq!(entry.body, "bad");
    assert_eq!(entry.kind, FailureKind::Poison);
    assert_eq!(entry.attempts, 3);
    assert_eq!(entry.error, ["downstream rejected the write"]);
    assert!(entry.first_failed_at <= entry.last_failed_at);
    // An outer classifier sees the diversion as poison, not as retryable.
    let outcome = ErrorChainClassifier::new().classify_error(&*error);
    assert_eq!(outcome.as_failure().unwrap().kind, FailureKind::Poison);
}

#[tokio::test]
async fn success_resets_a_message_count() {
    let store = MemoryStore::new(100);
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let inner_fail = fail.clone();
    let consumer = service_fn(move |_message: Message| {
        let fail = inner_fail.load(Ordering::SeqCst);
        async move {
            if fail {
                Err(std::io::Error::other("flaky"))
            } else {
                Ok(())
            }
        }
    });
    let mut service = DeadLetterLayer::new(store.clone())
        .classifier(ErrorChainClassifier::new())
        .capture(describe_fn(describe))
        .poison(PoisonPolicy::new(2).unwrap())
        .layer_service(consumer);
    let message = Message {
        id: "m-1".into(),
        payload: Bytes::from_static(b"x"),
    };
    let mut deliver = |fails: bool| {
        fail.store(fails, Ordering::SeqCst);
        service.call(message.clone())
    };
    deliver(true).await.unwrap_err();
    deliver(false).await.unwrap();
    // After the success the count starts over: one more failure is not enough.
    deliver(true).await.unwrap_err();
    let error = deliver(true).await.unwrap_err();
    assert!(error.downcast_ref::<PoisonMessage>().is_none(), "{error}");
    assert_eq!(store.depth().await.unwrap(), 0);
}

#[tokio::test]
async fn a_body_over_the_limit_is_sent_whole_and_not_captured() {
    let store = MemoryStore::new(100);
    let seen = Arc::new(std::sync::Mutex::new(Bytes::new()));
    let inner_seen = seen.clone();
    let mut service = DeadLetterLayer::new(store.clone())
        .body_limit(8)
        .layer_service(service_fn(move |req: Request<Body>| {
            let seen = inner_seen.clone();
            async move {
                let body = req.into_body().collect().await?.to_bytes();
                *seen.lock().unwrap() = body;
                Ok::<_, BoxError>(
                    Response::builder()
                        .status(StatusCode::INTERNAL_SERVER_ERROR)
                        .body(Bytes::new())
                        .unwrap(),
                )
            }
        }));
    let big = "0123456789abcdefghij".repeat(50);
    let req = Request::put("http://x/items/1")
        .body(Full::new(Bytes::from(big.clone())))
        .unwrap();
    let response = service.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        *seen.lock().unwrap(),
        big.as_bytes(),
        "inner got the whole body"
    );

    let entry = all(&store).await.remove(0);
    assert_eq!(entry.body, "", "not captured");
    assert!(entry.body_truncated);
    assert_eq!(entry.body_len, Some(1000));
    assert_eq!(entry.error, ["HTTP 500 Internal Server Error"]);
    assert_eq!(entry.kind, FailureKind::ServerError);
    assert_eq!(entry.attempts, 1);
}

#[tokio::test]
async fn success_and_rejected_statuses_follow_the_classifier() {
    let store = MemoryStore::new(100);
    let mut service = DeadLetterLayer::new(store.clone()).layer_service(service_fn(
        |req: Request<Body>| async move {
            let status: u16 = req.uri().path().trim_start_matches('/').parse().unwrap();
            Ok::<_, BoxError>(
                Response::builder()
                    .status(status)
                    .body(Bytes::new())
                    .unwrap(),
            )
        },
    ));
    for (status, stored) in [(200, 0), (304, 0), (404, 1), (503, 2)] {
        let req = Request::get(format!("http://x/{status}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        service.ready().await.unwrap().call(req).await.unwrap();
        assert_eq!(store.depth().await.unwrap(), stored, "after {status}");
    }
}

/// A store whose disk is gone.
#[derive(Debug, Clone)]
struct BrokenStore;

fn broken() -> StoreError {
    StoreError::backend(
        "disk gone",
        std::io::Error::other("no space left on device"),
    )
}

impl DeadLetterStore for BrokenStore {
    async fn put(&self, _entry: DeadLetterEntry) -> Result<(), StoreError> {
        Err(broken())
    }
    async fn get(&self, _id: EntryId) -> Result<Option<DeadLetterEntry>, StoreError> {
        Err(broken())
    }
    async fn list(&self, _query: ListQuery) -> Result<Page, StoreError> {
        Err(broken())
    }
    async fn remove(&self, _id: EntryId) -> Result<bool, StoreError> {
        Err(broken())
    }
    async fn purge(&self, _filter: PurgeFilter) -> Result<u64, StoreError> {
        Err(broken())
    }
    async fn depth(&self) -> Result<u64, StoreError> {
        Err(broken())
    }
    async fn oldest_age(
        &self,
        _now: SystemTime,
    ) -> Result<Option<std::time::Duration>, StoreError> {
        Err(broken())
    }
    async fn claim(
        &self,
        _id: EntryId,
        _now: SystemTime,
        _lease: std::time::Duration,
    ) -> Result<tower_poison::Claim, StoreError> {
        Err(broken())
    }
    async fn release(
        &self,
        _id: EntryId,
        _token: tower_poison::ClaimToken,
    ) -> Result<(), StoreError> {
        Err(broken())
    }
}

#[tokio::test]
async fn a_store_that_cannot_write_fails_the_call_with_a_clear_error() {
    // A broken backend: the call's own error is kept inside `StoreFailed`.
    let mut service = DeadLetterLayer::new(BrokenStore).layer_service(failing_http_service());
    let error = service
        .ready()
        .await
        .unwrap()
        .call(request("{}"))
        .await
        .unwrap_err();
    let failed = error.downcast_ref::<StoreFailed>().expect("StoreFailed");
    assert!(failed
        .to_string()
        .starts_with("dead-letter store failed to keep entry"));
    assert!(failed.to_string().contains("connection reset"), "{failed}");
    assert_eq!(failed.store_error().to_string(), "disk gone");
    let original = failed.original().unwrap();
    assert!(original.downcast_ref::<std::io::Error>().is_some());

    // A full store: a failing *response* also becomes an error rather than
    // passing as if it had been kept.
    let full = MemoryStore::new(0);
    let mut service =
        DeadLetterLayer::new(full.clone()).layer_service(service_fn(|_req: Request<Body>| async {
            Ok::<_, BoxError>(Response::builder().status(502).body(Bytes::new()).unwrap())
        }));
    let error = service
        .ready()
        .await
        .unwrap()
        .call(request("{}"))
        .await
        .unwrap_err();
    // A store at its limits refused the entry: `StoreFull`, not `StoreFailed`.
    let full = error.downcast_ref::<StoreFull>().expect("StoreFull");
    assert_eq!(full.store_error().kind(), StoreErrorKind::Full);
    assert!(full.original().is_none());

    // With drop or fail nothing is written, so a broken store does not matter.
    let mut service = DeadLetterLayer::new(BrokenStore)
        .action(Action::Drop)
        .layer_service(failing_http_service());
    let error = service
        .ready()
        .await
        .unwrap()
        .call(request("{}"))
        .await
        .unwrap_err();
    assert!(error.downcast_ref::<std::io::Error>().is_some());
}

#[tokio::test]
async fn readiness_is_the_inner_services() {
    let (mut service, mut handle) =
        tower_test::mock::spawn_layer::<Request<Body>, Response<Bytes>, _>(DeadLetterLayer::new(
            MemoryStore::new(10),
        ));
    handle.allow(0);
    tokio_test::assert_pending!(service.poll_ready());
    handle.allow(1);
    tokio_test::assert_ready_ok!(service.poll_ready());
    let call = tokio::spawn(service.call(request("{}")));
    let (req, respond) = handle.next_request().await.unwrap();
    assert_eq!(req.uri().path(), "/charges");
    respond.send_response(Response::new(Bytes::from_static(b"ok")));
    let response = call.await.unwrap().unwrap();
    assert_eq!(response.into_body().into_inner(), "ok");
}

/// Issue 13: a server's dead-letter layer keeps what an operator must act
/// on, not a scanner's 404s nor its own open circuit's refusals.
#[tokio::test]
async fn a_servers_layer_stores_only_what_an_operator_acts_on() {
    use tower::Layer;
    async fn answer(req: Request<Body>) -> Result<Response<Bytes>, BoxError> {
        match req.uri().path() {
            "/missing" => Ok(Response::builder().status(404).body(Bytes::new()).unwrap()),
            "/down" => Ok(Response::builder().status(503).body(Bytes::new()).unwrap()),
            _ => Err(Box::new(Classified::shed("circuit open", None))),
        }
    }
    let kinds_stored = |store: MemoryStore| async move {
        let page = store.list(ListQuery::default()).await.unwrap();
        page.entries.iter().map(|e| e.kind).collect::<Vec<_>>()
    };
    for server in [true, false] {
        let store = MemoryStore::new(100);
        let layer = if server {
            DeadLetterLayer::for_server(store.clone())
        } else {
            DeadLetterLayer::new(store.clone())
        };
        let mut service = layer.layer(service_fn(answer));
        for path in ["/missing", "/down", "/shed"] {
            let req = Request::get(format!("http://app{path}"))
                .body(Full::new(Bytes::new()))
                .unwrap();
            let _ = service.ready().await.unwrap().call(req).await;
        }
        let kinds = kinds_stored(store).await;
        if server {
            assert_eq!(kinds, [FailureKind::ServerError]);
        } else {
            assert_eq!(
                kinds,
                [FailureKind::Rejected, FailureKind::ServerError],
                "a client's layer keeps every failure, and passes refusals through"
            );
        }
    }
}

/// In a `ServiceBuilder`, `.layer(layer)` adds the dead-letter layer in
/// order: it stores failures of the services below it, the inner one first.
#[tokio::test]
async fn service_builder_adds_the_dead_letter_layer_in_order() {
    use tower::layer::util::{Identity, Stack};
    use tower::ServiceBuilder;
    use tower_poison::store::{DeadLetterStore, ListQuery, MemoryStore};

    let store = MemoryStore::new(100);
    let builder: ServiceBuilder<Stack<DeadLetterLayer<MemoryStore>, Identity>> =
        ServiceBuilder::new().layer(DeadLetterLayer::new(store.clone()).label("outer"));
    // A second one below the first: both see the failure, the inner one
    // first.
    let service = builder
        .layer(DeadLetterLayer::new(store.clone()).label("inner"))
        .service_fn(|_: Request<_>| async {
            Ok::<_, BoxError>(
                http::Response::builder()
                    .status(500)
                    .body(bytes::Bytes::new())
                    .unwrap(),
            )
        });
    let request = Request::post("http://x/")
        .body(http_body_util::Full::new(bytes::Bytes::from("{}")))
        .unwrap();
    let response = tower::ServiceExt::oneshot(service, request).await.unwrap();
    assert_eq!(response.status(), 500);
    let labels: Vec<String> = store
        .list(ListQuery::default())
        .await
        .unwrap()
        .entries
        .into_iter()
        .map(|e| e.label)
        .collect();
    assert_eq!(labels, ["inner", "outer"]);
}
