//! Replay: success removes an entry, failure keeps it updated, and a claim
//! keeps two replayers from sending one entry.

#[cfg(feature = "redis")]
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use tokio::sync::oneshot;
use tower::service_fn;
use tower::{Service, ServiceExt};
use tower_classify::{BoxError, FailureKind, HttpClassifier};
use tower_poison::replay::{http_request, ReplayError, ReplayOutcome, Replayer, REPLAY_HEADER};
use tower_poison::store::{DeadLetterStore, MemoryStore, RedbStore};
use tower_poison::DeadLetterLayer;
use tower_poison::{Claim, DeadLetterEntry, EntryId, StoredHeader, REDACTED};

/// How many failed replays an entry keeps, as `DeadLetterEntry::replays`
/// says.
const REPLAY_HISTORY_LIMIT: usize = 16;

fn entry() -> DeadLetterEntry {
    let then = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut entry = DeadLetterEntry::new(
        "orders",
        FailureKind::ServerError,
        vec!["HTTP 503 Service Unavailable".into()],
        then,
    );
    entry.method = Some("PUT".into());
    entry.uri = Some("http://orders.internal/orders/7?notify=false".into());
    entry.headers = [
        ("content-type", "application/json"),
        ("authorization", REDACTED),
        ("host", "orders.internal"),
    ]
    .map(|(name, value)| StoredHeader {
        name: name.into(),
        value: value.into(),
    })
    .into();
    entry.body = Bytes::from_static(b"{\"qty\":2}");
    entry.attempts = 2;
    entry.last_failed_at = then + Duration::from_secs(5);
    entry
}

fn to_request(e: &DeadLetterEntry) -> Result<Request<Full<Bytes>>, BoxError> {
    http_request(e, &"http://127.0.0.1:9".parse().unwrap(), &[])
}

async fn replay_success_removes_the_entry(store: impl DeadLetterStore) {
    let e = entry();
    store.put(e.clone()).await.unwrap();
    let received = Arc::new(Mutex::new(None));
    let seen = received.clone();
    let mut service = service_fn(move |req: Request<Full<Bytes>>| {
        let seen = seen.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            *seen.lock().unwrap() = Some((parts, body));
            Ok::<_, BoxError>(Response::new(Bytes::new()))
        }
    });
    let outcome = Replayer::new(&store)
        .replay(e.id, &mut service, &HttpClassifier::new(), to_request)
        .await
        .unwrap();
    assert_eq!(outcome, ReplayOutcome::Delivered);
    assert_eq!(store.get(e.id).await.unwrap(), None);

    let (parts, body) = received.lock().unwrap().take().unwrap();
    assert_eq!(parts.method, "PUT");
    assert_eq!(parts.uri, "http://127.0.0.1:9/orders/7?notify=false");
    assert_eq!(parts.headers["content-type"], "application/json");
    assert!(
        parts.headers.get("authorization").is_none(),
        "redacted placeholder sent"
    );
    assert!(parts.headers.get("host").is_none());
    assert_eq!(body, "{\"qty\":2}");
}

async fn replay_failure_keeps_and_updates_the_entry(store: impl DeadLetterStore) {
    let e = entry();
    store.put(e.clone()).await.unwrap();
    let mut service = service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, BoxError>(
            Response::builder()
                .status(StatusCode::TOO_MANY_REQUESTS)
                .body(Bytes::new())
                .unwrap(),
        )
    });
    let before = SystemTime::now();
    let outcome = Replayer::new(&store)
        .replay(e.id, &mut service, &HttpClassifier::new(), to_request)
        .await
        .unwrap();
    assert_eq!(
        outcome,
        ReplayOutcome::Failed {
            attempts: 3,
            kind: FailureKind::RateLimited,
            error: "replay response classified as rate_limited".into(),
        }
    );
    let kept = store.get(e.id).await.unwrap().expect("entry kept");
    assert_eq!(kept.attempts, 3);
    assert!(kept.last_failed_at + Duration::from_millis(1) >= before);
    // The original failure is left as it was; the replay's is in the history.
    assert_eq!(kept.kind, FailureKind::ServerError);
    assert_eq!(kept.error, e.error);
    assert_eq!(kept.first_failed_at, e.first_failed_at);
    assert_eq!(kept.body, e.body);
    assert_eq!(kept.failed_replays, 1);
    let [first] = &kept.replays[..] else {
        panic!("one replay record: {:?}", kept.replays)
    };
    assert_eq!(first.attempt, 3);
    assert_eq!(first.kind, FailureKind::RateLimited);
    assert_eq!(first.error, ["replay response classified as rate_limited"]);
    assert_eq!(first.status, None, "the default replayer reads no status");
    assert!(first.at + Duration::from_millis(1) >= before);

    // An error (no response) is recorded with its chain.
    let mut refused = service_fn(|_req: Request<Full<Bytes>>| async {
        Err::<Response<Bytes>, _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
    });
    let outcome = Replayer::new(&store)
        .replay(e.id, &mut refused, &HttpClassifier::new(), to_request)
        .await
        .unwrap();
    assert!(matches!(
        outcome,
        ReplayOutcome::Failed {
            attempts: 4,
            kind: FailureKind::NotSent,
            ..
        }
    ));
    let kept = store.get(e.id).await.unwrap().unwrap();
    assert_eq!(kept.error, e.error, "the original error stays");
    assert_eq!(kept.failed_replays, 2);
    assert_eq!(kept.replays.len(), 2);
    let second = &kept.replays[1];
    assert_eq!(
        (second.attempt, second.kind, second.status),
        (4, FailureKind::NotSent, None)
    );
    assert_eq!(second.error, ["connection refused"]);

    // An HTTP replayer records the response's status line and code.
    let mut unavailable = service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, BoxError>(
            Response::builder()
                .status(StatusCode::SERVICE_UNAVAILABLE)
                .body(Bytes::new())
                .unwrap(),
        )
    });
    let outcome = Replayer::new(&store)
        .describe(tower_poison::HttpCapture::default())
        .replay(e.id, &mut unavailable, &HttpClassifier::new(), to_request)
        .await
        .unwrap();
    assert_eq!(
        outcome,
        ReplayOutcome::Failed {
            attempts: 5,
            kind: FailureKind::ServerError,
            error: "HTTP 503 Service Unavailable".into(),
        }
    );
    let kept = store.get(e.id).await.unwrap().unwrap();
    let third = kept.replays.last().unwrap();
    assert_eq!((third.attempt, third.status), (5, Some(503)));
    assert_eq!(third.error, ["HTTP 503 Service Unavailable"]);
    assert_eq!(kept.error, e.error);
    assert_eq!(kept.kind, FailureKind::ServerError);
}

/// A replay loop left running keeps the latest records and counts the
/// rest, so the stored entry stops growing.
async fn replay_history_is_bounded(store: impl DeadLetterStore) {
    let e = entry();
    store.put(e.clone()).await.unwrap();
    let mut failing = service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, BoxError>(
            Response::builder()
                .status(StatusCode::BAD_GATEWAY)
                .body(Bytes::new())
                .unwrap(),
        )
    });
    let replayer = Replayer::new(&store).describe(tower_poison::HttpCapture::default());
    let mut sizes = Vec::new();
    let total = REPLAY_HISTORY_LIMIT + 4;
    for _ in 0..total {
        replayer
            .replay(e.id, &mut failing, &HttpClassifier::new(), to_request)
            .await
            .unwrap();
        sizes.push(
            serde_json::to_vec(&store.get(e.id).await.unwrap().unwrap())
                .unwrap()
                .len(),
        );
    }
    let kept = store.get(e.id).await.unwrap().unwrap();
    assert_eq!(kept.failed_replays, total as u64);
    assert_eq!(kept.replays.len(), REPLAY_HISTORY_LIMIT);
    assert_eq!(kept.attempts, e.attempts + total as u32);
    // The oldest records went: the first kept is the fifth replay.
    assert_eq!(kept.replays[0].attempt, e.attempts + 5);
    assert_eq!(kept.replays.last().unwrap().attempt, kept.attempts);
    let limit = REPLAY_HISTORY_LIMIT;
    // Past the limit a replay replaces a record instead of adding one:
    // four more replays grow the entry by less than one record (only by
    // wider attempt numbers).
    let one_record = sizes[limit - 1] - sizes[limit - 2];
    assert!(
        sizes[total - 1] < sizes[limit - 1] + one_record,
        "the entry stopped growing once the history was full: {sizes:?}"
    );
    assert_eq!(kept.error, e.error);
}

#[tokio::test]
async fn memory_replay_history_is_bounded() {
    replay_history_is_bounded(MemoryStore::new(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_replay_history_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    replay_history_is_bounded(
        RedbStore::builder()
            .open(dir.path().join("dlq.redb"))
            .unwrap(),
    )
    .await;
}

#[tokio::test]
async fn memory_replay_success_removes() {
    replay_success_removes_the_entry(MemoryStore::new(10)).await;
}

#[tokio::test]
async fn memory_replay_failure_keeps_and_updates() {
    replay_failure_keeps_and_updates_the_entry(MemoryStore::new(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_replay_success_removes_and_failure_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::builder()
        .open(dir.path().join("dlq.redb"))
        .unwrap();
    replay_success_removes_the_entry(store.clone()).await;
    replay_failure_keeps_and_updates_the_entry(store).await;
}

#[tokio::test]
async fn truncated_or_missing_entries_are_not_replayed() {
    let store = MemoryStore::new(10);
    let mut e = entry();
    e.body_truncated = true;
    store.put(e.clone()).await.unwrap();
    let mut service = service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, BoxError>(Response::new(Bytes::new()))
    });
    let error = Replayer::new(&store)
        .replay(e.id, &mut service, &HttpClassifier::new(), to_request)
        .await
        .unwrap_err();
    assert!(matches!(error, ReplayError::Request(_)));
    assert!(error.to_string().contains("truncated body"), "{error}");
    assert!(store.get(e.id).await.unwrap().is_some(), "entry kept");
    // The claim was given back: the next replay is refused for the same
    // reason, not told another replay holds the entry.
    let again = Replayer::new(&store)
        .replay(e.id, &mut service, &HttpClassifier::new(), to_request)
        .await
        .unwrap_err();
    assert!(matches!(again, ReplayError::Request(_)), "{again}");

    let missing = fresh_id();
    let outcome = Replayer::new(&store)
        .replay(missing, &mut service, &HttpClassifier::new(), to_request)
        .await
        .unwrap();
    assert_eq!(outcome, ReplayOutcome::NotFound);
}

#[test]
fn destination_path_prefix_and_extra_headers_are_applied() {
    let e = entry();
    let to: Uri = "https://replay.example:8443/v2/".parse().unwrap();
    let auth = (
        http::header::AUTHORIZATION,
        http::HeaderValue::from_static("Bearer fresh"),
    );
    let req = http_request(&e, &to, &[auth]).unwrap();
    assert_eq!(
        req.uri(),
        "https://replay.example:8443/v2/orders/7?notify=false"
    );
    assert_eq!(req.headers()["authorization"], "Bearer fresh");
}

#[test]
fn entries_with_a_redacted_uri_or_body_are_not_rebuilt() {
    let destination: Uri = "http://replay.internal".parse().unwrap();
    let mut in_query = entry();
    in_query.uri = Some(format!("/orders?access_token={REDACTED}"));
    let mut in_body = entry();
    in_body.body = Bytes::from(format!(r#"{{"password":"{REDACTED}"}}"#));
    for e in [in_query, in_body] {
        let error = http_request(&e, &destination, &[]).unwrap_err();
        assert!(error.to_string().contains("redacted"), "{error}");
    }
    assert!(http_request(&entry(), &destination, &[]).is_ok());
}

/// Two replays of one entry at the same time: the second starts once the
/// first one's call is under way (so the first holds the claim), finds the
/// entry claimed and sends nothing, so the service sees the entry once.
/// Bounded by a timeout: were the second replay to send too, its call
/// returns at once and the test fails on the count instead of hanging.
async fn concurrent_replays_deliver_once(store: impl DeadLetterStore) {
    let e = entry();
    store.put(e.clone()).await.unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let (started, call_started) = oneshot::channel::<()>();
    let (finish, call_may_finish) = oneshot::channel::<()>();
    // Only the first call takes these; a second call would find them gone
    // and return straight away.
    let first_call = Arc::new(Mutex::new(Some((started, call_may_finish))));
    let counted = calls.clone();
    let mut slow = service_fn(move |_req: Request<Full<Bytes>>| {
        counted.fetch_add(1, Ordering::SeqCst);
        let first = first_call.lock().unwrap().take();
        async move {
            if let Some((started, may_finish)) = first {
                started.send(()).unwrap();
                let _ = may_finish.await;
            }
            Ok::<_, BoxError>(Response::new(Bytes::new()))
        }
    });
    let mut second_service = slow.clone();
    let classifier = HttpClassifier::new();
    let replayer = Replayer::new(&store);
    let first = replayer.replay(e.id, &mut slow, &classifier, to_request);
    let second = async {
        call_started
            .await
            .expect("the first replay calls the service");
        let outcome = Replayer::new(&store)
            .replay(
                e.id,
                &mut second_service,
                &HttpClassifier::new(),
                to_request,
            )
            .await
            .unwrap();
        finish.send(()).unwrap();
        outcome
    };
    let (first, second) = tokio::time::timeout(Duration::from_secs(30), async {
        tokio::join!(first, second)
    })
    .await
    .expect("both replays finish");
    assert_eq!(first.unwrap(), ReplayOutcome::Delivered);
    assert!(
        matches!(second, ReplayOutcome::InProgress { until } if until > SystemTime::now()),
        "{second:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the entry was sent twice");
    assert_eq!(store.get(e.id).await.unwrap(), None);
}

#[tokio::test]
async fn memory_concurrent_replays_deliver_once() {
    concurrent_replays_deliver_once(MemoryStore::new(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_concurrent_replays_deliver_once() {
    let dir = tempfile::tempdir().unwrap();
    concurrent_replays_deliver_once(
        RedbStore::builder()
            .open(dir.path().join("dlq.redb"))
            .unwrap(),
    )
    .await;
}

/// A dead-letter layer in the replayed service records the failure (a
/// `put`) while the replay is still finishing: another replayer that tries
/// the entry then must find it held, not free. Once the replay is over it
/// has given its claim back and the entry can be replayed again.
async fn a_failure_the_layer_records_keeps_the_entry_claimed<St: DeadLetterStore>(store: St) {
    let e = entry();
    store.put(e.clone()).await.unwrap();
    let meanwhile = Arc::new(Mutex::new(None));
    let mut service = {
        let layered = still_failing(store.clone(), "orders");
        let (store, meanwhile, id) = (store.clone(), meanwhile.clone(), e.id);
        service_fn(move |req: Request<Full<Bytes>>| {
            let (layered, store, meanwhile) = (layered.clone(), store.clone(), meanwhile.clone());
            async move {
                let response = layered.oneshot(req).await?;
                // The layer has stored the failure; replayer B tries now.
                let other = store
                    .claim(id, SystemTime::now(), Duration::from_secs(60))
                    .await
                    .unwrap();
                *meanwhile.lock().unwrap() = Some(other);
                Ok::<_, BoxError>(response.map(|_| Bytes::new()))
            }
        })
    };
    let outcome = Replayer::new(&store)
        .replay(e.id, &mut service, &HttpClassifier::new(), to_request)
        .await
        .unwrap();
    assert!(
        matches!(outcome, ReplayOutcome::Failed { attempts: 3, .. }),
        "{outcome:?}"
    );
    let other = meanwhile.lock().unwrap().take().expect("B tried");
    assert!(
        matches!(other, Claim::Held { .. }),
        "the layer's put freed the entry for a second replayer: {other:?}"
    );
    assert!(
        matches!(
            store
                .claim(e.id, SystemTime::now(), Duration::from_secs(60))
                .await
                .unwrap(),
            Claim::Claimed { .. }
        ),
        "the finished replay gave its claim back"
    );
}

/// Replayer A's lease runs out while its call is in flight (a zero lease:
/// at once), and replayer B claims the entry. When A's call fails and A
/// updates the entry and gives its claim back, B's claim must stay, so a
/// third replay C sends nothing while B is still sending.
async fn a_replay_whose_lease_ran_out_leaves_the_next_replays_claim<St: DeadLetterStore>(
    store: St,
) {
    let e = entry();
    store.put(e.clone()).await.unwrap();
    let b_claim = Arc::new(Mutex::new(None));
    let mut a_service = {
        let (store, b_claim, id) = (store.clone(), b_claim.clone(), e.id);
        service_fn(move |_req: Request<Full<Bytes>>| {
            let (store, b_claim) = (store.clone(), b_claim.clone());
            async move {
                let claim = store
                    .claim(id, SystemTime::now(), Duration::from_secs(60))
                    .await
                    .unwrap();
                *b_claim.lock().unwrap() = Some(claim);
                Ok::<_, BoxError>(
                    Response::builder()
                        .status(StatusCode::SERVICE_UNAVAILABLE)
                        .body(Bytes::new())
                        .unwrap(),
                )
            }
        })
    };
    let outcome = Replayer::new(&store)
        .lease(Duration::ZERO)
        .replay(e.id, &mut a_service, &HttpClassifier::new(), to_request)
        .await
        .unwrap();
    assert!(
        matches!(outcome, ReplayOutcome::Failed { attempts: 3, .. }),
        "{outcome:?}"
    );
    let b_claim = b_claim.lock().unwrap().take().expect("B tried");
    assert!(
        matches!(b_claim, Claim::Claimed { .. }),
        "A's lease was over: {b_claim:?}"
    );

    let c_calls = Arc::new(AtomicUsize::new(0));
    let counted = c_calls.clone();
    let mut c_service = service_fn(move |_req: Request<Full<Bytes>>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, BoxError>(Response::new(Bytes::new())) }
    });
    let outcome = Replayer::new(&store)
        .replay(e.id, &mut c_service, &HttpClassifier::new(), to_request)
        .await
        .unwrap();
    assert!(
        matches!(outcome, ReplayOutcome::InProgress { .. }),
        "A ended B's claim: {outcome:?}"
    );
    assert_eq!(c_calls.load(Ordering::SeqCst), 0, "C sent the entry too");
}

#[tokio::test]
async fn memory_claims_survive_the_layers_put_and_a_slow_replayers_release() {
    a_failure_the_layer_records_keeps_the_entry_claimed(MemoryStore::new(10)).await;
    a_replay_whose_lease_ran_out_leaves_the_next_replays_claim(MemoryStore::new(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_claims_survive_the_layers_put_and_a_slow_replayers_release() {
    let dir = tempfile::tempdir().unwrap();
    a_failure_the_layer_records_keeps_the_entry_claimed(
        RedbStore::builder()
            .open(dir.path().join("layer.redb"))
            .unwrap(),
    )
    .await;
    a_replay_whose_lease_ran_out_leaves_the_next_replays_claim(
        RedbStore::builder()
            .open(dir.path().join("lease.redb"))
            .unwrap(),
    )
    .await;
}

#[cfg(feature = "redis")]
async fn redis_replays_deliver_once_and_claims_survive_the_layers_put_and_a_slow_release(
    url: String,
) {
    use tower_poison::store::RedisDeadLetterStore;
    for test in ["concurrent", "layer", "lease", "failure", "history"] {
        let name = support::unique(test);
        let _cleanup = support::Cleanup::queue(&url, &name);
        let store = RedisDeadLetterStore::builder()
            .connect(&url, name)
            .await
            .unwrap();
        match test {
            "concurrent" => concurrent_replays_deliver_once(store).await,
            "layer" => a_failure_the_layer_records_keeps_the_entry_claimed(store).await,
            "failure" => replay_failure_keeps_and_updates_the_entry(store).await,
            "history" => replay_history_is_bounded(store).await,
            _ => a_replay_whose_lease_ran_out_leaves_the_next_replays_claim(store).await,
        }
    }
}

#[tokio::test]
async fn a_replay_that_never_finished_holds_the_entry_for_its_lease() {
    let store = MemoryStore::new(10);
    let e = entry();
    store.put(e.clone()).await.unwrap();
    let mut hangs = service_fn(|_req: Request<Full<Bytes>>| {
        std::future::pending::<Result<Response<Bytes>, BoxError>>()
    });
    // A replayer that dies mid-call (its future is dropped) leaves its claim.
    let crashed = Replayer::new(&store).lease(Duration::from_secs(3600));
    let classifier = HttpClassifier::new();
    let mut call = Box::pin(crashed.replay(e.id, &mut hangs, &classifier, to_request));
    assert!(futures_poll_once(call.as_mut()).await.is_none());
    drop(call);
    let mut works = service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, BoxError>(Response::new(Bytes::new()))
    });
    let outcome = Replayer::new(&store)
        .replay(e.id, &mut works, &HttpClassifier::new(), to_request)
        .await
        .unwrap();
    assert!(
        matches!(outcome, ReplayOutcome::InProgress { .. }),
        "{outcome:?}"
    );
    assert!(store.get(e.id).await.unwrap().is_some(), "entry kept");
}

/// Polls `future` once; `None` when it is pending.
async fn futures_poll_once<F: std::future::Future + Unpin>(mut future: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| match std::pin::Pin::new(&mut future).poll(cx) {
        std::task::Poll::Ready(output) => std::task::Poll::Ready(Some(output)),
        std::task::Poll::Pending => std::task::Poll::Ready(None),
    })
    .await
}

#[test]
fn a_replay_carries_the_entry_id_as_idempotency_key_and_replay_mark() {
    let e = entry();
    let to: Uri = "http://replay.internal".parse().unwrap();
    let req = http_request(&e, &to, &[]).unwrap();
    let id = e.id.to_string();
    assert_eq!(req.headers()["idempotency-key"], format!("{id}-0").as_str());
    assert_eq!(req.headers()[REPLAY_HEADER], id.as_str());

    // A server answered a replay with a 5xx: the next replay is a new
    // request to a server that keeps failed answers under their key.
    let mut failed_again = e.clone();
    failed_again.replay_server_errors += 1;
    let req = http_request(&failed_again, &to, &[]).unwrap();
    assert_eq!(req.headers()["idempotency-key"], format!("{id}-1").as_str());

    // A key the original request carried is the one sent again.
    let mut keyed = entry();
    keyed.headers.push(StoredHeader {
        name: "Idempotency-Key".into(),
        value: "order-7-v1".into(),
    });
    let req = http_request(&keyed, &to, &[]).unwrap();
    let keys: Vec<_> = req.headers().get_all("idempotency-key").iter().collect();
    assert_eq!(keys, ["order-7-v1"]);

    // So is one given on the command line.
    let given = (
        http::HeaderName::from_static("idempotency-key"),
        http::HeaderValue::from_static("fresh"),
    );
    let req = http_request(&e, &to, &[given]).unwrap();
    let keys: Vec<_> = req.headers().get_all("idempotency-key").iter().collect();
    assert_eq!(keys, ["fresh"]);

    // A replay mark stored by mistake is not sent next to the real one.
    let mut marked = entry();
    marked.headers.push(StoredHeader {
        name: REPLAY_HEADER.into(),
        value: "0".repeat(32),
    });
    let req = http_request(&marked, &to, &[]).unwrap();
    let marks: Vec<_> = req.headers().get_all(REPLAY_HEADER).iter().collect();
    assert_eq!(marks, [marked.id.to_string().as_str()]);
}

type Body = tower_poison::ReplayBody<Full<Bytes>>;

/// The service an entry is replayed into: a dead-letter layer over the same
/// store, in front of a handler that still fails.
fn still_failing<St: DeadLetterStore>(
    store: St,
    label: &'static str,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<tower_poison::SettleBody<Bytes, tower_poison::OpenCall>>,
    Error = BoxError,
    Future: Send,
> + Clone {
    let handler = service_fn(|_req: Request<Body>| async {
        Ok::<_, BoxError>(
            Response::builder()
                .status(StatusCode::BAD_GATEWAY)
                .body(Bytes::new())
                .unwrap(),
        )
    });
    tower::ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store).label(label))
        .service(handler)
}

#[tokio::test]
async fn a_failed_replay_through_a_dead_letter_layer_updates_the_original_entry() {
    let store = MemoryStore::new(10);
    let e = entry();
    store.put(e.clone()).await.unwrap();
    let mut service = still_failing(store.clone(), "orders");
    let outcome = Replayer::new(&store)
        .replay(e.id, &mut service, &HttpClassifier::new(), to_request)
        .await
        .unwrap();
    assert!(
        matches!(
            outcome,
            ReplayOutcome::Failed {
                attempts: 3,
                kind: FailureKind::ServerError,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(store.depth().await.unwrap(), 1, "a second entry was added");
    let kept = store.get(e.id).await.unwrap().unwrap();
    assert_eq!(kept.attempts, 3, "the failure was counted once");
    assert_eq!(kept.first_failed_at, e.first_failed_at);
    assert!(kept.last_failed_at > e.last_failed_at);
    assert_eq!(kept.error, e.error, "the original error stays");
    assert_eq!(kept.kind, e.kind);
    assert_eq!(kept.failed_replays, 1, "the failure was recorded once");
    let record = kept.replays.last().expect("the layer recorded the replay");
    assert_eq!(record.error, ["HTTP 502 Bad Gateway"]);
    assert_eq!(record.status, Some(502));
    assert_eq!((record.attempt, record.kind), (3, FailureKind::ServerError));
    assert_eq!(record.at, kept.last_failed_at);
    // A gateway's 502: the server behind it may have run the request.
    assert!(kept.replay_key_pinned, "the layer noted the answer");
    assert_eq!(
        (kept.body, kept.uri),
        (e.body, e.uri),
        "the request was replaced"
    );
}

#[tokio::test]
async fn a_replay_mark_for_an_unknown_or_foreign_entry_starts_a_new_entry() {
    let store = MemoryStore::new(10);
    let foreign = entry(); // label "orders"
    store.put(foreign.clone()).await.unwrap();
    let mut service = still_failing(store.clone(), "payments");
    let unknown = fresh_id().to_string();
    for mark in [foreign.id.to_string(), unknown, "not-an-id".into()] {
        let request = Request::post("http://payments.internal/pay")
            .header(REPLAY_HEADER, mark)
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let response = service.ready().await.unwrap().call(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    }
    assert_eq!(store.depth().await.unwrap(), 4);
    assert_eq!(
        store.get(foreign.id).await.unwrap().unwrap(),
        foreign,
        "foreign entry changed"
    );
    let page = store
        .list(tower_poison::store::ListQuery {
            label: Some("payments".into()),
            ..tower_poison::store::ListQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(page.entries.len(), 3);
    for stored in page.entries {
        assert_eq!(stored.attempts, 1);
        assert!(
            stored
                .headers
                .iter()
                .all(|h| !h.name.eq_ignore_ascii_case(REPLAY_HEADER)),
            "the replay mark was stored"
        );
    }
}

/// Sends one replay of `id` per answer in `answers` (a status, or an I/O
/// error of that kind), through `replayer`; the idempotency keys sent.
async fn keys_sent<St, D>(
    replayer: &Replayer<'_, St, D>,
    id: EntryId,
    answers: Vec<Result<StatusCode, std::io::ErrorKind>>,
) -> Vec<String>
where
    St: DeadLetterStore,
    D: tower_poison::DescribeResponse<Response<Bytes>>,
{
    let answers = Arc::new(Mutex::new(answers));
    let keys = Arc::new(Mutex::new(Vec::new()));
    let (answer, seen) = (answers.clone(), keys.clone());
    let mut service = service_fn(move |req: Request<Full<Bytes>>| {
        let key = req.headers()["idempotency-key"]
            .to_str()
            .unwrap()
            .to_owned();
        seen.lock().unwrap().push(key);
        let answer = answer.lock().unwrap().remove(0);
        async move {
            let status = answer.map_err(|kind| BoxError::from(std::io::Error::from(kind)))?;
            Ok::<_, BoxError>(
                Response::builder()
                    .status(status)
                    .body(Bytes::new())
                    .unwrap(),
            )
        }
    });
    let classifier = HttpClassifier::new();
    while !answers.lock().unwrap().is_empty() {
        replayer
            .replay(id, &mut service, &classifier, to_request)
            .await
            .unwrap();
    }
    let sent = keys.lock().unwrap().clone();
    sent
}

/// The key moves on after a server's own 5xx (a guard may keep it), and
/// never again once a replay's outcome was unknown (a timeout, a gateway's
/// 504): that replay may have been applied, so a later 503 (a shedder in
/// front of the guard) must not make the next replay a new request.
#[tokio::test]
async fn a_replay_key_moves_after_a_server_error_and_is_pinned_by_an_unknown_outcome() {
    let store = MemoryStore::new(10);
    let e = entry();
    store.put(e.clone()).await.unwrap();
    let replayer = Replayer::new(&store).describe(tower_poison::HttpCapture::default());
    use std::io::ErrorKind::TimedOut;
    let answers = vec![
        Ok(StatusCode::SERVICE_UNAVAILABLE),
        Err(TimedOut),
        Ok(StatusCode::SERVICE_UNAVAILABLE),
        Ok(StatusCode::GATEWAY_TIMEOUT),
        Ok(StatusCode::OK),
    ];
    let id = e.id;
    let keys = keys_sent(&replayer, id, answers).await;
    let key = |n: u32| format!("{id}-{n}");
    assert_eq!(keys, [key(0), key(1), key(1), key(1), key(1)]);
    assert_eq!(store.get(id).await.unwrap(), None, "delivered at last");
}

/// A gateway's 504 pins the key as a timeout does (the 500 after it moves
/// nothing); a replayer that reads no status never moves it, since it
/// cannot tell a gateway's 504 from the server's own 500.
#[tokio::test]
async fn a_gateway_timeout_pins_the_key_and_a_replayer_reading_no_status_keeps_it() {
    let store = MemoryStore::new(10);
    let e = entry();
    store.put(e.clone()).await.unwrap();
    let id = e.id;
    let described = Replayer::new(&store).describe(tower_poison::HttpCapture::default());
    let answers = vec![
        Ok(StatusCode::GATEWAY_TIMEOUT),
        Ok(StatusCode::INTERNAL_SERVER_ERROR),
        Ok(StatusCode::OK),
    ];
    let key = format!("{id}-0");
    assert_eq!(
        keys_sent(&described, id, answers).await,
        [key.as_str(), &key, &key]
    );

    let other = entry();
    store.put(other.clone()).await.unwrap();
    let plain = Replayer::new(&store);
    let answers = vec![Ok(StatusCode::INTERNAL_SERVER_ERROR), Ok(StatusCode::OK)];
    let id = other.id;
    let key = format!("{id}-0");
    assert_eq!(keys_sent(&plain, id, answers).await, [key.as_str(), &key]);
}

/// Replayer A sends the entry and dies before it hears back (its future is
/// dropped once the service has the request), leaving its claim unreleased.
/// Its send may have been applied, so once that claim has lapsed the next
/// replay must keep A's key, even after a 503 of its own (a load shedder in
/// front of the server's idempotency guard): the replay after that sends
/// A's key again, not a new one the guard would run.
async fn a_crashed_replayers_send_keeps_its_key<St: DeadLetterStore>(store: St) {
    let e = entry();
    store.put(e.clone()).await.unwrap();
    let id = e.id;
    let (sent, lost_send) = oneshot::channel::<String>();
    let sent = Arc::new(Mutex::new(Some(sent)));
    let mut dies = service_fn(move |req: Request<Full<Bytes>>| {
        let key = req.headers()["idempotency-key"]
            .to_str()
            .unwrap()
            .to_owned();
        if let Some(sent) = sent.lock().unwrap().take() {
            let _ = sent.send(key);
        }
        std::future::pending::<Result<Response<Bytes>, BoxError>>()
    });
    // A zero lease: A's claim has lapsed by the time B claims the entry.
    let crashed = Replayer::new(&store).lease(Duration::ZERO);
    let classifier = HttpClassifier::new();
    let lost_key = tokio::select! {
        outcome = crashed.replay(id, &mut dies, &classifier, to_request) => {
            panic!("the crashed replay finished: {outcome:?}")
        }
        key = lost_send => key.unwrap(),
    };
    assert_eq!(lost_key, format!("{id}-0"));

    let replayer = Replayer::new(&store).describe(tower_poison::HttpCapture::default());
    let answers = vec![Ok(StatusCode::SERVICE_UNAVAILABLE), Ok(StatusCode::OK)];
    assert_eq!(
        keys_sent(&replayer, id, answers).await,
        [lost_key.as_str(), &lost_key],
        "the 503 after a lapsed claim moved the key: the lost send can run twice"
    );
    assert_eq!(store.get(id).await.unwrap(), None, "delivered at last");
}

#[tokio::test]
async fn item_6_a_crashed_replayers_send_keeps_its_key_in_memory() {
    a_crashed_replayers_send_keeps_its_key(MemoryStore::new(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn item_6_a_crashed_replayers_send_keeps_its_key_in_redb() {
    let dir = tempfile::tempdir().unwrap();
    a_crashed_replayers_send_keeps_its_key(
        RedbStore::builder()
            .open(dir.path().join("dlq.redb"))
            .unwrap(),
    )
    .await;
}

#[cfg(feature = "redis")]
async fn item_6_a_crashed_replayers_send_keeps_its_key_in_redis(url: String) {
    use tower_poison::store::RedisDeadLetterStore;
    let name = support::unique("crashed-replayer");
    let _cleanup = support::Cleanup::queue(&url, &name);
    let store = RedisDeadLetterStore::builder()
        .connect(&url, name)
        .await
        .unwrap();
    a_crashed_replayers_send_keeps_its_key(store).await;
}

/// The same, when the replayed service has a dead-letter layer over the
/// store: the layer records B's 503 in the entry itself, knowing nothing of
/// the lapsed claim, and the key must still stay A's.
#[tokio::test]
async fn item_6_a_layer_in_the_service_keeps_the_key_a_lapsed_claim_pinned() {
    let store = MemoryStore::new(10);
    let e = entry();
    store.put(e.clone()).await.unwrap();
    let id = e.id;
    // What a replayer that crashed after sending leaves: its claim, never
    // released, its (zero) lease over.
    let Claim::Claimed { .. } = store
        .claim(id, SystemTime::now(), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("the entry is free");
    };
    let keys = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = keys.clone();
    let handler = service_fn(move |req: Request<Body>| {
        let key = req.headers()["idempotency-key"]
            .to_str()
            .unwrap()
            .to_owned();
        let mut seen = seen.lock().unwrap();
        seen.push(key);
        // A load shedder's 503 first, then the server's answer.
        let status = match seen.len() {
            1 => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::OK,
        };
        async move {
            Ok::<_, BoxError>(
                Response::builder()
                    .status(status)
                    .body(Bytes::new())
                    .unwrap(),
            )
        }
    });
    let mut service = tower::ServiceBuilder::new()
        .layer(DeadLetterLayer::new(store.clone()).label("orders"))
        .service(handler);
    let replayer = Replayer::new(&store).describe(tower_poison::HttpCapture::default());
    let classifier = HttpClassifier::new();
    let outcome = replayer
        .replay(id, &mut service, &classifier, to_request)
        .await
        .unwrap();
    assert!(
        matches!(outcome, ReplayOutcome::Failed { .. }),
        "{outcome:?}"
    );
    let kept = store.get(id).await.unwrap().unwrap();
    assert_eq!(kept.failed_replays, 1, "the layer recorded the 503 once");
    let outcome = replayer
        .replay(id, &mut service, &classifier, to_request)
        .await
        .unwrap();
    assert_eq!(outcome, ReplayOutcome::Delivered);
    let key = format!("{id}-0");
    assert_eq!(
        *keys.lock().unwrap(),
        [key.as_str(), &key],
        "the layer's record of the 503 moved the key"
    );
}

/// A replay that took over a lapsed claim and cannot record the pin in the
/// entry (here its request cannot be built) leaves its own claim to lapse,
/// so the replay after it is told of the lapse as well; without a lapse to
/// pass on, the claim is given back as before.
#[tokio::test]
async fn a_lapse_the_entry_cannot_record_stays_in_the_claim() {
    let store = MemoryStore::new(10);
    let e = entry();
    store.put(e.clone()).await.unwrap();
    let cannot_build = |_: &DeadLetterEntry| -> Result<Request<Full<Bytes>>, BoxError> {
        Err("no destination for this entry".into())
    };
    let mut unused = service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, BoxError>(Response::new(Bytes::new()))
    });
    let classifier = HttpClassifier::new();
    let replayer = Replayer::new(&store).lease(Duration::ZERO);
    // Released: the next claim follows a released one.
    let error = replayer
        .replay(e.id, &mut unused, &classifier, cannot_build)
        .await
        .unwrap_err();
    assert!(matches!(error, ReplayError::Request(_)), "{error}");
    // Every lease is zero: each claim, at a fresh now, finds the one
    // before it over.
    let now = SystemTime::now;
    let lapsed = |claim: Claim| match claim {
        Claim::Claimed {
            previous_claim_lapsed,
            ..
        } => previous_claim_lapsed,
        other => panic!("expected Claimed, got {other:?}"),
    };
    assert!(!lapsed(
        store.claim(e.id, now(), Duration::ZERO).await.unwrap()
    ));
    // That claim lapses unreleased (a crashed replayer); the next replay
    // cannot record it and keeps it in its own claim.
    let error = replayer
        .replay(e.id, &mut unused, &classifier, cannot_build)
        .await
        .unwrap_err();
    assert!(matches!(error, ReplayError::Request(_)), "{error}");
    assert!(!store.get(e.id).await.unwrap().unwrap().replay_key_pinned);
    assert!(lapsed(
        store.claim(e.id, now(), Duration::ZERO).await.unwrap()
    ));
}

/// An entry purged while its replay ran is not written back when the
/// replay fails: the purge stands.
#[tokio::test]
async fn a_failed_replay_does_not_bring_back_an_entry_purged_meanwhile() {
    let store = MemoryStore::new(10);
    let e = entry();
    store.put(e.clone()).await.unwrap();
    let purging = store.clone();
    let mut service = service_fn(move |_req: Request<Full<Bytes>>| {
        let store = purging.clone();
        async move {
            let purged = store
                .purge(tower_poison::store::PurgeFilter::default())
                .await
                .unwrap();
            assert_eq!(purged, 1);
            Err::<Response<Bytes>, _>(BoxError::from(std::io::Error::from(
                std::io::ErrorKind::TimedOut,
            )))
        }
    });
    let outcome = Replayer::new(&store)
        .replay(e.id, &mut service, &HttpClassifier::new(), to_request)
        .await
        .unwrap();
    assert!(
        matches!(
            outcome,
            ReplayOutcome::Gone {
                kind: FailureKind::Timeout,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(store.get(e.id).await.unwrap(), None, "the purge stands");
}

#[cfg(feature = "redis")]
support::redis_suites! {
    redis_replays_deliver_once_and_claims_survive_the_layers_put_and_a_slow_release,
    item_6_a_crashed_replayers_send_keeps_its_key_in_redis,
}

/// Every replay that sent its entry is counted under the entry's label, by
/// how it ended: delivered, failed (kept), or gone (removed meanwhile).
#[test]
fn finished_replays_are_counted_by_label_and_outcome() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let store = MemoryStore::new(10);
    let [delivered, failed, gone] = [entry(), entry(), entry()];
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(async {
                for e in [&delivered, &failed, &gone] {
                    store.put(e.clone()).await.unwrap();
                }
                let answer = |status: StatusCode| {
                    service_fn(move |_: Request<Full<Bytes>>| async move {
                        Ok::<_, BoxError>(Response::builder().status(status).body(Bytes::new())?)
                    })
                };
                let replayer = Replayer::new(&store);
                let classifier = HttpClassifier::new();
                let mut ok = answer(StatusCode::OK);
                let outcome = replayer.replay(delivered.id, &mut ok, &classifier, to_request);
                assert_eq!(outcome.await.unwrap(), ReplayOutcome::Delivered);
                let mut unavailable = answer(StatusCode::SERVICE_UNAVAILABLE);
                let outcome = replayer.replay(failed.id, &mut unavailable, &classifier, to_request);
                assert!(matches!(
                    outcome.await.unwrap(),
                    ReplayOutcome::Failed { .. }
                ));
                // An operator purges the entry while its replay runs.
                let (purging_store, id) = (store.clone(), gone.id);
                let mut purged = service_fn(move |_: Request<Full<Bytes>>| {
                    let store = purging_store.clone();
                    async move {
                        store.remove(id).await?;
                        Ok::<_, BoxError>(Response::builder().status(503).body(Bytes::new())?)
                    }
                });
                let outcome = replayer.replay(gone.id, &mut purged, &classifier, to_request);
                assert!(matches!(outcome.await.unwrap(), ReplayOutcome::Gone { .. }));
                // Not found: nothing was sent, nothing is counted.
                let outcome = replayer.replay(delivered.id, &mut ok, &classifier, to_request);
                assert_eq!(outcome.await.unwrap(), ReplayOutcome::NotFound);
            })
    });
    let mut counted: Vec<(Vec<String>, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "tower_poison_replayed_total")
        .map(|(key, _, _, value)| {
            let labels = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let DebugValue::Counter(n) = value else {
                panic!("a counter")
            };
            (labels, n)
        })
        .collect();
    counted.sort();
    assert_eq!(
        counted,
        [
            (vec!["label=orders".into(), "outcome=delivered".into()], 1),
            (vec!["label=orders".into(), "outcome=failed".into()], 1),
            (vec!["label=orders".into(), "outcome=gone".into()], 1),
        ]
    );
}

/// A new entry id, made now (as the layer makes one for each entry).
fn fresh_id() -> EntryId {
    DeadLetterEntry::new("", FailureKind::ServerError, Vec::new(), SystemTime::now()).id
}
