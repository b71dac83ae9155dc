//! The seeds' scenarios, end to end: a real upstream on 127.0.0.1, a real
//! hyper-util client, and the family's layers in the documented order
//!
//! ```text
//! DeadLetter → CircuitBreaker → ReplayBody → Retry → CountAttempts → client
//! ```
//!
//! Each test owns its upstream and scripts its answers, then asserts exact
//! request counts at the upstream, what the caller got, the breaker's state
//! and the dead-letter store's contents. Timings are asserted only as lower
//! bounds (a wait the server asked for) or as generous upper bounds.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::header::AUTHORIZATION;
use http::{HeaderValue, Method, Request};
use tower_breaker::{CircuitOpen, State};
use tower_classify::{FailureKind, HttpClassifier};
use tower_poison::replay::{http_request, ReplayOutcome, Replayer};
use tower_poison::store::{DeadLetterStore, MemoryStore, RedbStore};
use tower_poison::{DeadLetterEntry, DeadLetterLayer, REDACTED};
use tower_retry_budget::budget::TpsBudget;
use tower_retry_budget::{Backoff, Jitter, RetryLayer};

use examples::client::http_client_for;
use examples::scripted::{Reply, ScriptedServer};
use integration_tests::{
    breaker, dead_letters, default_order, entries, request, retry, send, stored_header, BREAKER,
    REQUEST_ID,
};

/// Seed 000/002: a GET that meets two 503s is retried and succeeds; the
/// upstream sees exactly three attempts of the same request; nothing is
/// dead-lettered and the breaker (outside the retry loop) saw one success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_retried_on_503_then_succeeds() {
    let upstream = ScriptedServer::start().await.unwrap();
    upstream.script([Reply::status(503), Reply::status(503)]);
    let store = MemoryStore::new(100);
    let (breaker, handle) = breaker(3, Duration::from_secs(30));
    let stack = default_order(dead_letters(&store), breaker, retry(3));

    let response = send(
        &stack,
        request(&upstream, Method::GET, "/items/1", "get-1", ""),
    )
    .await
    .expect("the call succeeds");

    assert_eq!(response.status(), 200);
    assert_eq!(response.body().as_ref(), b"ok");
    let log = upstream.received();
    assert_eq!(log.len(), 3, "two failed attempts and the successful one");
    for seen in &log {
        assert_eq!(seen.method, Method::GET);
        assert_eq!(seen.uri, "/items/1");
        assert_eq!(seen.header(REQUEST_ID), Some("get-1"));
    }
    assert_eq!(
        store.depth().await.unwrap(),
        0,
        "a call retries fixed is not a dead letter"
    );
    let snapshot = handle.get(BREAKER).expect("the breaker");
    assert_eq!(snapshot.state, State::Closed);
    assert_eq!(
        snapshot.failures, 0,
        "the breaker counts the logical call, which succeeded"
    );
}

/// Seed 000, RFC 9110: a POST without an `Idempotency-Key` gets exactly one
/// attempt; its failure is returned to the caller and dead-lettered with the
/// body, one attempt recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_not_retried_and_dead_lettered() {
    let upstream = ScriptedServer::start().await.unwrap();
    upstream.otherwise(Reply::status(503));
    let store = MemoryStore::new(100);
    let (breaker, _handle) = breaker(3, Duration::from_secs(30));
    let stack = default_order(dead_letters(&store), breaker, retry(3));

    let body = r#"{"sku":42,"quantity":1}"#;
    let response = send(
        &stack,
        request(&upstream, Method::POST, "/orders", "post-1", body),
    )
    .await
    .expect("the failing response comes back as a response");

    assert_eq!(response.status(), 503);
    assert_eq!(upstream.hits(), 1, "a POST is never sent twice");
    let stored = entries(&store).await;
    assert_eq!(stored.len(), 1);
    let entry = &stored[0];
    assert_eq!(entry.label, "upstream");
    assert_eq!(entry.method.as_deref(), Some("POST"));
    assert!(
        entry.uri.as_deref().unwrap().ends_with("/orders"),
        "{:?}",
        entry.uri
    );
    assert_eq!(entry.body, body);
    assert!(!entry.body_truncated);
    assert_eq!(entry.kind, FailureKind::ServerError);
    assert_eq!(entry.attempts, 1);
    assert_eq!(stored_header(entry, REQUEST_ID), Some("post-1"));
}

/// Seed 000: the same POST carrying an `Idempotency-Key` is retried, and every
/// attempt carries the same key and the whole body (replayed, not consumed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_with_idempotency_key_retried() {
    let upstream = ScriptedServer::start().await.unwrap();
    upstream.script([Reply::status(503), Reply::status(502)]);
    let store = MemoryStore::new(100);
    let (breaker, _handle) = breaker(3, Duration::from_secs(30));
    let stack = default_order(dead_letters(&store), breaker, retry(3));

    let body = r#"{"sku":42,"quantity":1}"#;
    let mut req = request(&upstream, Method::POST, "/orders", "post-2", body);
    req.headers_mut().insert(
        "idempotency-key",
        HeaderValue::from_static("order-2-attempt"),
    );
    let response = send(&stack, req).await.expect("the call succeeds");

    assert_eq!(response.status(), 200);
    let log = upstream.received();
    assert_eq!(log.len(), 3, "two failures, then the success");
    for seen in &log {
        assert_eq!(seen.method, Method::POST);
        assert_eq!(seen.header("idempotency-key"), Some("order-2-attempt"));
        assert_eq!(
            seen.body, body,
            "the body is replayed whole on every attempt"
        );
    }
    assert_eq!(store.depth().await.unwrap(), 0);
}

/// Seed 001/002: `Retry-After: 1` replaces the 20 ms backoff; the retry
/// reaches the upstream no earlier than one second after the 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_seconds_respected() {
    let upstream = ScriptedServer::start().await.unwrap();
    upstream.script([Reply::status(429).header("retry-after", "1")]);
    let store = MemoryStore::new(100);
    let (breaker, _handle) = breaker(3, Duration::from_secs(30));
    let stack = default_order(dead_letters(&store), breaker, retry(3));

    let started = Instant::now();
    let response = send(
        &stack,
        request(&upstream, Method::GET, "/quota", "ra-1", ""),
    )
    .await
    .expect("the call succeeds");

    assert_eq!(response.status(), 200);
    let log = upstream.received();
    assert_eq!(log.len(), 2);
    let gap = log[1].at - log[0].at;
    assert!(
        gap >= Duration::from_secs(1),
        "retried after {gap:?}, before the 1 s asked for"
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(store.depth().await.unwrap(), 0);
}

/// Seed 001: an HTTP-date `Retry-After` is measured against the response's
/// `Date`, not the local clock. The upstream's clock is an hour behind: by
/// the local clock the date is long past (which would mean "retry now"); by
/// the response's own `Date` it is one second away, and that is what the
/// retry waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_http_date_measured_against_date_header() {
    let upstream = ScriptedServer::start().await.unwrap();
    let skewed = SystemTime::now() - Duration::from_secs(3600);
    upstream.script([Reply::status(503)
        .header("date", httpdate::fmt_http_date(skewed))
        .header(
            "retry-after",
            httpdate::fmt_http_date(skewed + Duration::from_secs(1)),
        )]);
    let store = MemoryStore::new(100);
    let (breaker, _handle) = breaker(3, Duration::from_secs(30));
    let stack = default_order(dead_letters(&store), breaker, retry(3));

    let response = send(
        &stack,
        request(&upstream, Method::GET, "/quota", "ra-2", ""),
    )
    .await
    .expect("the call succeeds");

    assert_eq!(response.status(), 200);
    let log = upstream.received();
    assert_eq!(log.len(), 2);
    let gap = log[1].at - log[0].at;
    assert!(
        gap >= Duration::from_secs(1),
        "retried after {gap:?}, before the 1 s asked for"
    );
    assert!(gap < Duration::from_secs(4), "retried after {gap:?}");
}

/// A `Retry-After` longer than the loop's deadline is not slept: the call
/// ends at once with `WaitTooLong` naming the wait, and is dead-lettered as
/// rate limited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_beyond_the_deadline_fails_at_once() {
    let upstream = ScriptedServer::start().await.unwrap();
    upstream.otherwise(Reply::status(429).header("retry-after", "30"));
    let store = MemoryStore::new(100);
    let (breaker, _handle) = breaker(3, Duration::from_secs(30));
    let stack = default_order(dead_letters(&store), breaker, retry(3));

    let started = Instant::now();
    let error = send(
        &stack,
        request(&upstream, Method::GET, "/quota", "ra-3", ""),
    )
    .await
    .expect_err("a 30 s wait does not fit a 5 s deadline");

    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    let wait = error
        .downcast_ref::<tower_retry_budget::error::WaitTooLong>()
        .unwrap_or_else(|| panic!("expected WaitTooLong, got {error}"));
    assert_eq!(wait.wait(), Duration::from_secs(30));
    assert_eq!(upstream.hits(), 1);
    let stored = entries(&store).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].kind, FailureKind::RateLimited);
    assert_eq!(stored[0].attempts, 1);
}

/// Seed 000/004: a sustained outage opens the breaker; from then on calls
/// fail fast with `CircuitOpen` without reaching the upstream, and, with
/// `store_refusals` on (off by default: a refusal is returned to the caller
/// unstored), every refusal is dead-lettered as `shed` (worth replaying
/// later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sustained_outage_opens_breaker_and_upstream_load_drops() {
    let upstream = ScriptedServer::start().await.unwrap();
    upstream.otherwise(Reply::status(503));
    let store = MemoryStore::new(1000);
    let (breaker, handle) = breaker(3, Duration::from_secs(30));
    let stack = default_order(dead_letters(&store).store_refusals(true), breaker, retry(2));

    // Closed: every call costs the upstream three attempts.
    for i in 0..3 {
        let response = send(
            &stack,
            request(&upstream, Method::GET, "/items", &format!("o-{i}"), ""),
        )
        .await
        .expect("the last 503 comes back as a response");
        assert_eq!(response.status(), 503);
        assert_eq!(upstream.hits(), 3 * (i + 1));
    }
    let snapshot = handle.get(BREAKER).unwrap();
    assert_eq!(snapshot.state, State::Open);
    assert_eq!(snapshot.opened, 1);
    let before = upstream.hits();
    assert_eq!(before, 9);

    // Open: calls fail fast and the upstream sees nothing.
    const OPEN_CALLS: u32 = 200;
    let started = Instant::now();
    for i in 0..OPEN_CALLS {
        let error = send(
            &stack,
            request(&upstream, Method::GET, "/items", &format!("s-{i}"), ""),
        )
        .await
        .expect_err("the circuit is open");
        let open = error
            .downcast_ref::<CircuitOpen>()
            .unwrap_or_else(|| panic!("expected CircuitOpen, got {error}"));
        assert!(open.remaining().unwrap() <= Duration::from_secs(30));
    }
    let per_call = started.elapsed() / OPEN_CALLS;
    assert_eq!(
        upstream.hits(),
        before,
        "no call reached the upstream while open"
    );
    // Each refused call is the whole stack's work (the dead-letter entry
    // included) without any I/O; a generous bound for a loaded machine.
    assert!(
        per_call < Duration::from_millis(1),
        "{per_call:?} per refused call"
    );
    assert_eq!(handle.get(BREAKER).unwrap().rejected, u64::from(OPEN_CALLS));

    let stored = entries(&store).await;
    let server_errors = stored.iter().filter(|e| e.kind == FailureKind::ServerError);
    assert_eq!(server_errors.clone().count(), 3);
    for entry in server_errors.clone() {
        assert_eq!(entry.attempts, 3);
        // The first failure is the first attempt's, two 20 ms backoffs
        // before the last (stored with millisecond resolution).
        let span = entry
            .last_failed_at
            .duration_since(entry.first_failed_at)
            .expect("first failure before the last");
        assert!(span >= Duration::from_millis(39), "{span:?}");
    }
    let shed = stored
        .iter()
        .filter(|e| e.kind == FailureKind::Shed)
        .count();
    assert_eq!(shed, OPEN_CALLS as usize);
}

/// Seed 004: after the recovery timeout one probe goes through; a failed
/// probe reopens the breaker, a successful one closes it and traffic flows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_probe_closes_the_breaker() {
    let recovery = Duration::from_millis(200);
    let upstream = ScriptedServer::start().await.unwrap();
    upstream.otherwise(Reply::status(503));
    let store = MemoryStore::new(100);
    let (breaker, handle) = breaker(2, recovery);
    let stack = default_order(dead_letters(&store), breaker, retry(1));
    let get = |id: &str| request(&upstream, Method::GET, "/items", id, "");

    for i in 0..2 {
        let response = send(&stack, get(&format!("open-{i}"))).await.unwrap();
        assert_eq!(response.status(), 503);
    }
    assert_eq!(handle.get(BREAKER).unwrap().state, State::Open);
    assert_eq!(upstream.hits(), 4);
    let error = send(&stack, get("refused")).await.unwrap_err();
    assert!(error.is::<CircuitOpen>(), "{error}");
    assert_eq!(upstream.hits(), 4);

    // Still down at the first probe: the probe (with its retry) fails and
    // the breaker opens again.
    tokio::time::sleep(recovery + Duration::from_millis(100)).await;
    let response = send(&stack, get("probe-1")).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(upstream.hits(), 6, "one probe call, two attempts");
    let snapshot = handle.get(BREAKER).unwrap();
    assert_eq!(snapshot.state, State::Open);
    assert_eq!(snapshot.opened, 2);
    assert!(send(&stack, get("refused-2"))
        .await
        .unwrap_err()
        .is::<CircuitOpen>());

    // Fixed: the next probe succeeds and closes the breaker.
    upstream.otherwise(Reply::ok("ok"));
    tokio::time::sleep(recovery + Duration::from_millis(100)).await;
    let response = send(&stack, get("probe-2")).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(upstream.hits(), 7);
    assert_eq!(handle.get(BREAKER).unwrap().state, State::Closed);
    for i in 0..5 {
        let response = send(&stack, get(&format!("after-{i}"))).await.unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(upstream.hits(), 12);
}

/// Seed 002/004: a request the upstream rejects (422) is not retried even
/// though it may be (it carries an `Idempotency-Key`), does not trip the
/// breaker, and is dead-lettered durably with its credentials redacted and
/// its body kept. Replay keeps it while the upstream still rejects it, and
/// delivers and removes it once the upstream is fixed, sending fresh
/// credentials instead of the redacted ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_request_dead_lettered_and_replayable() {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::builder()
        .open(dir.path().join("dead-letters.redb"))
        .unwrap();
    let upstream = ScriptedServer::start().await.unwrap();
    upstream.otherwise(Reply::status(422).body("quantity must be positive"));
    let (breaker, handle) = breaker(1, Duration::from_secs(30));
    let stack = default_order(
        DeadLetterLayer::new(store.clone()).label("orders"),
        breaker,
        retry(3),
    );

    let body = r#"{"order":7,"quantity":-1}"#;
    let req = Request::post(format!("{}/orders?source=test", upstream.url()))
        .header(REQUEST_ID, "order-7")
        .header("idempotency-key", "order-7")
        .header(AUTHORIZATION, "Bearer secret-token")
        .header("cookie", "session=abc")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let response = send(&stack, req).await.unwrap();

    assert_eq!(response.status(), 422);
    assert_eq!(upstream.hits(), 1, "a rejected request is never retried");
    let snapshot = handle.get(BREAKER).unwrap();
    assert_eq!(
        snapshot.state,
        State::Closed,
        "a rejection does not trip the breaker"
    );
    assert_eq!(snapshot.failures, 0);

    let stored = entries(&store).await;
    assert_eq!(stored.len(), 1);
    let entry = &stored[0];
    assert_eq!(entry.label, "orders");
    assert_eq!(entry.kind, FailureKind::Rejected);
    assert_eq!(entry.attempts, 1);
    assert_eq!(entry.method.as_deref(), Some("POST"));
    assert!(entry
        .uri
        .as_deref()
        .unwrap()
        .ends_with("/orders?source=test"));
    assert_eq!(entry.body, body);
    assert_eq!(stored_header(entry, "authorization"), Some(REDACTED));
    assert_eq!(stored_header(entry, "cookie"), Some(REDACTED));
    assert_eq!(
        stored_header(entry, "content-type"),
        Some("application/json")
    );
    assert_eq!(stored_header(entry, REQUEST_ID), Some("order-7"));
    let stored_text = format!("{entry:?}");
    assert!(!stored_text.contains("secret-token") && !stored_text.contains("session=abc"));
    let id = entry.id;

    // Replay from code (as an operator would after a deploy) through a plain
    // client, with fresh credentials.
    let mut replayer = http_client_for::<http_body_util::Full<bytes::Bytes>>();
    let fresh = [(
        AUTHORIZATION,
        HeaderValue::from_static("Bearer fresh-token"),
    )];
    let destination = upstream.uri();
    let to_request = |e: &DeadLetterEntry| http_request(e, &destination, &fresh);

    // Still rejected: the entry stays, its attempts counted.
    let outcome = Replayer::new(&store)
        .replay(id, &mut replayer, &HttpClassifier::new(), to_request)
        .await
        .unwrap();
    match outcome {
        ReplayOutcome::Failed { attempts, kind, .. } => {
            assert_eq!(attempts, 2);
            assert_eq!(kind, FailureKind::Rejected);
        }
        other => panic!("expected a failed replay, got {other:?}"),
    }
    assert_eq!(store.depth().await.unwrap(), 1);
    assert_eq!(upstream.hits(), 2);

    // Fixed: delivered and removed.
    upstream.otherwise(Reply::status(201).body("created"));
    let outcome = Replayer::new(&store)
        .replay(id, &mut replayer, &HttpClassifier::new(), to_request)
        .await
        .unwrap();
    assert_eq!(outcome, ReplayOutcome::Delivered);
    assert_eq!(store.depth().await.unwrap(), 0);
    assert!(store.get(id).await.unwrap().is_none());

    let log = upstream.received();
    assert_eq!(log.len(), 3);
    let delivered = &log[2];
    assert_eq!(delivered.method, Method::POST);
    assert_eq!(delivered.uri, "/orders?source=test");
    assert_eq!(delivered.body, body);
    assert_eq!(
        delivered.header("authorization"),
        Some("Bearer fresh-token")
    );
    assert_eq!(
        delivered.header("cookie"),
        None,
        "redacted headers are left out"
    );
    assert_eq!(delivered.header("content-type"), Some("application/json"));
    assert_eq!(delivered.header("idempotency-key"), Some("order-7"));
    assert_eq!(delivered.header(REQUEST_ID), Some("order-7"));
}

/// Seed 000/001: retries must not multiply the load of a service that is
/// down. With a Finagle-style budget (20 % of requests, a floor of 1 retry/s
/// over 10 s) shared by every clone, 100 calls during a full outage, each
/// allowed 3 retries, cost the upstream at most 100 + 20 + 10 attempts
/// instead of 400. (The breaker is set not to open, to isolate the budget.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_budget_caps_amplification_during_an_outage() {
    let upstream = ScriptedServer::start().await.unwrap();
    upstream.otherwise(Reply::status(503));
    let store = MemoryStore::new(1000);
    let (breaker, _handle) = breaker(1000, Duration::from_secs(30));
    let retry = RetryLayer::http_builder()
        .max_retries(3)
        .backoff(Backoff::fixed(Duration::from_millis(5)).with_jitter(Jitter::None))
        .deadline(Duration::from_secs(5))
        .budget(Arc::new(
            TpsBudget::new(Duration::from_secs(10), 1, 0.2).unwrap(),
        ))
        .build()
        .unwrap();
    let stack = default_order(dead_letters(&store), breaker, retry);

    const CLIENTS: usize = 10;
    const CALLS_EACH: usize = 10;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (stack, upstream) = (stack.clone(), upstream.clone());
            tokio::spawn(async move {
                for i in 0..CALLS_EACH {
                    let req = request(&upstream, Method::GET, "/items", &format!("{c}-{i}"), "");
                    // Either the last 503, or `BudgetExhausted`: both fail.
                    let failed = match send(&stack, req).await {
                        Ok(response) => !response.status().is_success(),
                        Err(_) => true,
                    };
                    assert!(failed);
                }
            })
        })
        .collect();
    for client in clients {
        client.await.unwrap();
    }

    let calls = CLIENTS * CALLS_EACH;
    let attempts = upstream.hits();
    // The floor's reserve (10 retries) is spent in any case.
    assert!(
        attempts >= calls + 10,
        "{attempts} attempts for {calls} calls"
    );
    assert!(
        attempts <= calls + calls / 5 + 10,
        "{attempts} attempts for {calls} calls"
    );
    assert_eq!(
        store.depth().await.unwrap(),
        calls as u64,
        "every call dead-lettered"
    );
}
