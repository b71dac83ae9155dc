//! Replay: success removes an entry, failure keeps it updated.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use tower::service_fn;
use tower_classify::{BoxError, FailureKind, HttpClassifier};
use tower_poison::replay::{http_request, replay, ReplayError, ReplayOutcome};
use tower_poison::store::{DeadLetterStore, MemoryStore, RedbStore};
use tower_poison::{DeadLetterEntry, EntryId, StoredHeader, REDACTED};

fn entry() -> DeadLetterEntry {
    let then = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    DeadLetterEntry {
        id: EntryId::generate(then),
        label: "orders".into(),
        message_id: None,
        method: Some("PUT".into()),
        uri: Some("http://orders.internal/orders/7?notify=false".into()),
        headers: vec![
            StoredHeader {
                name: "content-type".into(),
                value: "application/json".into(),
            },
            StoredHeader {
                name: "authorization".into(),
                value: REDACTED.into(),
            },
            StoredHeader {
                name: "host".into(),
                value: "orders.internal".into(),
            },
        ],
        body: Bytes::from_static(b"{\"qty\":2}"),
        body_truncated: false,
        body_len: None,
        error: vec!["HTTP 503 Service Unavailable".into()],
        kind: FailureKind::ServerError,
        attempts: 2,
        first_failed_at: then,
        last_failed_at: then + Duration::from_secs(5),
    }
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
    let outcome = replay(
        &store,
        e.id,
        &mut service,
        &HttpClassifier::new(),
        to_request,
    )
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
    let outcome = replay(
        &store,
        e.id,
        &mut service,
        &HttpClassifier::new(),
        to_request,
    )
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
    assert_eq!(kept.kind, FailureKind::RateLimited);
    assert!(kept.last_failed_at + Duration::from_millis(1) >= before);
    assert_eq!(kept.first_failed_at, e.first_failed_at);
    assert_eq!(kept.body, e.body);

    // An error (no response) is recorded with its chain.
    let mut refused = service_fn(|_req: Request<Full<Bytes>>| async {
        Err::<Response<Bytes>, _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
    });
    let outcome = replay(
        &store,
        e.id,
        &mut refused,
        &HttpClassifier::new(),
        to_request,
    )
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
    assert_eq!(kept.error, ["connection refused"]);
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
    let store = RedbStore::open(dir.path().join("dlq.redb")).unwrap();
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
    let error = replay(
        &store,
        e.id,
        &mut service,
        &HttpClassifier::new(),
        to_request,
    )
    .await
    .unwrap_err();
    assert!(matches!(error, ReplayError::Request(_)));
    assert!(error.to_string().contains("truncated body"), "{error}");
    assert!(store.get(e.id).await.unwrap().is_some(), "entry kept");

    let missing = EntryId::generate(SystemTime::now());
    let outcome = replay(
        &store,
        missing,
        &mut service,
        &HttpClassifier::new(),
        to_request,
    )
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
