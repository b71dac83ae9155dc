//! The other common layer order (Polly's, Resilience4j's), outermost first:
//!
//! ```text
//! DeadLetter → ReplayBody → Retry → CircuitBreaker → CountAttempts → client
//! ```
//!
//! Every attempt is recorded by the breaker, so it opens sooner; the retry
//! layer then meets the breaker's `CircuitOpen` (a `Shed` failure through
//! `tower-classify`, the crates do not know each other) and must not spin on
//! it. A refusal early in an open period carries no hint, and the retry layer
//! returns it at once; one in the period's last fifth carries its
//! `retry_after` (five times the open time left: a place on the breaker's
//! release ramp), which the retry layer waits out once when it fits inside
//! its deadline. Either way the upstream sees a bounded, exact number of
//! attempts.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use tower::ServiceBuilder;
use tower_breaker::Policy;
use tower_breaker::{CallKind, CircuitBreakerLayer, CircuitOpen, State};
use tower_classify::{FailureKind, HttpClassifier};
use tower_poison::store::{DeadLetterStore, MemoryStore};

use examples::scripted::{Reply, ScriptedServer};
use integration_tests::{
    breaker, dead_letters, default_order, entries, request, retry, retry_outside_breaker, send,
    BREAKER, REQUEST_ID,
};

/// The breaker opens after two attempts of the first call; the third attempt
/// meets `CircuitOpen` with 30 s to go, early in the period, so the refusal
/// carries no hint and the retry layer gives up at once instead of using its
/// four remaining retries. Later calls are refused before any attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_outside_breaker_does_not_spin_on_circuit_open() {
    let upstream = ScriptedServer::start().await.unwrap();
    upstream.otherwise(Reply::status(503));
    let store = MemoryStore::new(100);
    let (breaker, handle) = breaker(2, Duration::from_secs(30));
    // Refusals stored (off by default), to show each call stored once.
    let dead_letters = dead_letters(&store).store_refusals(true);
    let stack = retry_outside_breaker(dead_letters, breaker, retry(5));

    let started = Instant::now();
    let error = send(
        &stack,
        request(&upstream, Method::GET, "/items", "first", ""),
    )
    .await
    .expect_err("the breaker opened during the retry loop");
    let elapsed = started.elapsed();

    let open = error
        .downcast_ref::<CircuitOpen>()
        .unwrap_or_else(|| panic!("expected CircuitOpen, got {error}"));
    assert!(open.remaining().unwrap() > Duration::from_secs(20));
    assert_eq!(
        upstream.hits(),
        2,
        "two attempts opened the breaker; no more"
    );
    assert!(
        elapsed < Duration::from_secs(2),
        "gave up after {elapsed:?}"
    );
    let snapshot = handle.get(BREAKER).unwrap();
    assert_eq!(snapshot.state, State::Open);
    assert_eq!(
        snapshot.failures, 2,
        "every attempt is recorded in this order"
    );
    assert_eq!(snapshot.rejected, 1);

    // Later calls: refused before reaching the upstream, not retried.
    for i in 0..20 {
        let error = send(
            &stack,
            request(&upstream, Method::GET, "/items", &format!("later-{i}"), ""),
        )
        .await
        .expect_err("still open");
        assert!(error.is::<CircuitOpen>(), "{error}");
    }
    assert_eq!(upstream.hits(), 2);
    assert_eq!(
        handle.get(BREAKER).unwrap().rejected,
        21,
        "one refusal per call: the retry layer did not retry CircuitOpen"
    );

    let stored = entries(&store).await;
    assert_eq!(stored.len(), 21);
    assert!(stored.iter().all(|e| e.kind == FailureKind::Shed));
}

/// A refusal early in an open period carries no place on the breaker's
/// release ramp: the retry layer gives it back at once rather than wait.
/// One in the period's last fifth does: the retry layer waits it out once,
/// and the attempt after the wait is the probe. A 1 s open period, so that
/// a loaded machine's scheduling delays cannot carry either call out of the
/// part of the period it is meant for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_outside_breaker_waits_out_a_refusal_late_in_the_open_period() {
    let recovery = Duration::from_secs(1);
    let last_fifth = recovery / 5;
    let upstream = ScriptedServer::start().await.unwrap();
    upstream.otherwise(Reply::status(503));
    let store = MemoryStore::new(100);
    // Each refusal's remaining open time, and when it was made: what the
    // retry layer was told, seen from the breaker's side.
    let refusals = Arc::new(Mutex::new(Vec::<(Duration, Instant)>::new()));
    let layer = CircuitBreakerLayer::builder()
        .name(BREAKER)
        .policy(Policy::consecutive_failures(2))
        .recovery_timeout(recovery)
        .on_call({
            let refusals = refusals.clone();
            move |event| {
                if let CallKind::Rejected(Some(remaining)) = event.kind {
                    refusals.lock().unwrap().push((remaining, Instant::now()));
                }
            }
        })
        .build(HttpClassifier::new())
        .unwrap();
    let handle = layer.handle();
    // Refusals stored (off by default), to show each call stored once.
    let dead_letters = dead_letters(&store).store_refusals(true);
    let stack = retry_outside_breaker(dead_letters, layer, retry(5));

    let error = send(
        &stack,
        request(&upstream, Method::GET, "/items", "first", ""),
    )
    .await
    .expect_err("refused 20 ms into the open period");
    assert_eq!(
        upstream.hits(),
        2,
        "two attempts open the breaker; the early refusal is given back at once"
    );
    let open = error
        .downcast_ref::<CircuitOpen>()
        .unwrap_or_else(|| panic!("expected CircuitOpen, got {error}"));
    assert!(
        open.remaining().unwrap() > last_fifth,
        "{:?}",
        open.remaining()
    );
    assert_eq!(open.failure().retry_after(), None, "no place on the ramp");
    let snapshot = handle.get(BREAKER).unwrap();
    assert_eq!(snapshot.state, State::Open);
    assert_eq!(snapshot.rejected, 1);
    assert_eq!(store.depth().await.unwrap(), 1);

    // Aim just inside the last fifth, by the breaker's own clock (a sleep
    // ends late, never early): a call delayed by up to nine tenths of it
    // still lands in it. It is refused with a place on the ramp, waits it
    // out, and its next attempt is the probe; the upstream is back by then.
    upstream.otherwise(Reply::ok("ok"));
    let remaining_open = handle
        .get(BREAKER)
        .unwrap()
        .remaining_open
        .expect("open, so timed");
    tokio::time::sleep(remaining_open.saturating_sub(last_fifth * 9 / 10)).await;
    let response = send(
        &stack,
        request(&upstream, Method::GET, "/items", "second", ""),
    )
    .await
    .expect("the probe succeeds after the wait");
    assert_eq!(response.status(), 200);
    assert_eq!(upstream.hits(), 3, "the refusal never reached the upstream");

    let refusals = refusals.lock().unwrap().clone();
    assert_eq!(
        refusals.len(),
        2,
        "the second call was refused once, then waited; not the probe itself"
    );
    let (remaining, refused_at) = refusals[1];
    assert!(
        remaining <= last_fifth,
        "refused with {remaining:?} to go: not in the last fifth"
    );
    let waited = upstream.received()[2].at - refused_at;
    assert!(
        waited >= remaining * 5,
        "the probe came {waited:?} after a refusal with {remaining:?} to go: \
         the retry layer did not wait out its `retry_after`"
    );
    let snapshot = handle.get(BREAKER).unwrap();
    assert_eq!(snapshot.rejected, 2);
    assert_eq!(snapshot.state, State::Closed);
}

/// Across processes: a server protects its handler with the breaker's HTTP
/// variant, which answers `503 CIRCUIT_OPEN` with `Retry-After` while open; a
/// client calling it through the family's stack honours that `Retry-After`
/// (instead of hammering the open circuit with its quick backoff), and its
/// retry lands after the server's recovery timeout, where the server's probe
/// succeeds and closes the server's breaker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_retry_honours_a_server_breakers_retry_after() {
    // The server: a handler that fails twice, behind the HTTP breaker.
    let handled = Arc::new(AtomicUsize::new(0));
    let arrivals = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let server_breaker = CircuitBreakerLayer::builder()
        .name("handler")
        .policy(Policy::consecutive_failures(2))
        .recovery_timeout(Duration::from_millis(900))
        .build(HttpClassifier::new())
        .unwrap()
        .answer(tower_breaker::answer::Http503);
    let server_handle = server_breaker.handle();
    let counter = handled.clone();
    let app = Router::new()
        .fallback(move || {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 2 {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::OK
                }
            }
        })
        .layer(
            ServiceBuilder::new()
                .map_request({
                    let arrivals = arrivals.clone();
                    move |req: Request<axum::body::Body>| {
                        arrivals.lock().unwrap().push(Instant::now());
                        req
                    }
                })
                .layer(server_breaker),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    // The client: the documented order, 20 ms backoff.
    let store = MemoryStore::new(100);
    let (client_breaker, client_handle) = breaker(5, Duration::from_secs(30));
    let stack = default_order(dead_letters(&store), client_breaker, retry(3));
    let req = Request::get(format!("http://{addr}/orders"))
        .header(REQUEST_ID, "cross-1")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = send(&stack, req).await.expect("the call succeeds");

    assert_eq!(response.status(), 200);
    let arrivals = arrivals.lock().unwrap().clone();
    assert_eq!(
        arrivals.len(),
        4,
        "two failures, one refusal, one successful probe"
    );
    assert_eq!(
        handled.load(Ordering::SeqCst),
        3,
        "the refusal never reached the handler"
    );
    let waited = arrivals[3] - arrivals[2];
    assert!(
        waited >= Duration::from_secs(1),
        "the client retried {waited:?} after a `Retry-After: 1`"
    );
    let server = server_handle.get("handler").unwrap();
    assert_eq!(server.state, State::Closed);
    assert_eq!(server.rejected, 1);
    assert_eq!(client_handle.get(BREAKER).unwrap().failures, 0);
    assert_eq!(store.depth().await.unwrap(), 0);
}
