//! The failure modes between the layers, end to end over real sockets:
//! refused connections, slow attempts, a spent retry budget, bodies too large
//! to replay, cancelled calls, dropped probes, per-host breakers and a
//! hedged call. Each test checks what crosses a crate boundary: how one
//! layer's outcome is classified by the next through `tower-classify`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use tokio::io::AsyncReadExt;
use tower::ServiceBuilder;
use tower_breaker::Policy;
use tower_breaker::{CircuitBreakerLayer, CircuitOpen, State};
use tower_classify::{ErrorChainClassifier, FailureKind, HttpClassifier, Outcome};
use tower_poison::replay::{http_request, ReplayError, Replayer};
use tower_poison::store::{DeadLetterStore, MemoryStore};
use tower_poison::{CountAttemptsLayer, DeadLetterLayer};

/// The dead-letter layer's default body limit, as its docs give it.
const DEFAULT_BODY_LIMIT: usize = 64 * 1024;
use tower_retry_budget::budget::TpsBudget;
use tower_retry_budget::hedge::HedgeLayer;
use tower_retry_budget::{Backoff, Jitter, RetryLayer, RetryStopped, StopReason};

use examples::client::{http_client_for, HttpService};
use examples::scripted::{Reply, ScriptedServer};
use integration_tests::{
    breaker, dead_letters, default_order, entries, request, retry, send, BREAKER, REPLAY_LIMIT,
    REQUEST_ID,
};

fn classify_error(error: &tower::BoxError) -> Option<FailureKind> {
    match ErrorChainClassifier::new().classify_error(&**error) {
        Outcome::Failure(failure) => Some(failure.kind),
        _ => None,
    }
}

/// Nothing listens on the port: hyper-util's connect error is classified as
/// a connection failure that never sent the request (`NotSent`, through the
/// error chain, across crates), retried,
/// counted once by the breaker outside the loop, and dead-lettered with the
/// real number of attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_refused_retried_then_dead_lettered() {
    let closed = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap()
    };
    let store = MemoryStore::new(100);
    let (breaker, handle) = breaker(3, Duration::from_secs(30));
    let stack = default_order(dead_letters(&store), breaker, retry(2));

    let req = Request::get(format!("http://{closed}/items"))
        .header(REQUEST_ID, "refused-1")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let error = send(&stack, req).await.expect_err("nothing listens");

    assert_eq!(
        classify_error(&error),
        Some(FailureKind::NotSent),
        "{error}"
    );
    assert_eq!(handle.get(BREAKER).unwrap().failures, 1);
    let stored = entries(&store).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].kind, FailureKind::NotSent);
    assert_eq!(stored[0].attempts, 3);
    assert!(stored[0].last_failed_at >= stored[0].first_failed_at);
}

fn timed_retry(
    attempt_timeout: Duration,
) -> RetryLayer<HttpClassifier, tower_retry_budget::replay::HttpReplay> {
    RetryLayer::http_builder()
        .max_retries(2)
        .backoff(Backoff::fixed(Duration::from_millis(20)).with_jitter(Jitter::None))
        .attempt_timeout(attempt_timeout)
        .deadline(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// The first attempt hangs; the per-attempt timeout abandons it and the
/// retry succeeds, long before the slow answer would have come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_attempt_timed_out_and_retried() {
    let upstream = ScriptedServer::start().await.unwrap();
    upstream.script([Reply::ok("ok").after(Duration::from_secs(3))]);
    let store = MemoryStore::new(100);
    let (breaker, _handle) = breaker(3, Duration::from_secs(30));
    let stack = default_order(
        dead_letters(&store),
        breaker,
        timed_retry(Duration::from_millis(150)),
    );

    let started = Instant::now();
    let response = send(
        &stack,
        request(&upstream, Method::GET, "/slow", "slow-1", ""),
    )
    .await
    .expect("the retry succeeds");

    assert_eq!(response.status(), 200);
    assert_eq!(upstream.hits(), 2);
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(150), "{elapsed:?}");
    assert!(
        elapsed < Duration::from_secs(2),
        "waited for the slow answer: {elapsed:?}"
    );
    assert_eq!(store.depth().await.unwrap(), 0);
}

/// Every attempt hangs: each is timed out, and the call is dead-lettered as
/// a timeout after all its attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_upstream_dead_lettered_as_timeout() {
    let upstream = ScriptedServer::start().await.unwrap();
    upstream.otherwise(Reply::ok("ok").after(Duration::from_secs(3)));
    let store = MemoryStore::new(100);
    let (breaker, handle) = breaker(3, Duration::from_secs(30));
    let stack = default_order(
        dead_letters(&store),
        breaker,
        timed_retry(Duration::from_millis(100)),
    );

    let started = Instant::now();
    let error = send(
        &stack,
        request(&upstream, Method::GET, "/slow", "slow-2", ""),
    )
    .await
    .expect_err("every attempt times out");

    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        classify_error(&error),
        Some(FailureKind::Timeout),
        "{error}"
    );
    assert_eq!(upstream.hits(), 3);
    assert_eq!(handle.get(BREAKER).unwrap().failures, 1);
    let stored = entries(&store).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].kind, FailureKind::Timeout);
    assert_eq!(stored[0].attempts, 3);
}

/// A spent retry budget ends the loop at once and hands the upstream's 503
/// back, marked `RetryStopped { reason: Budget }`; the breaker outside counts
/// it as the server error it is (not as load shedding), so it still opens
/// during the outage that spent the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_exhausted_still_opens_the_breaker() {
    let upstream = ScriptedServer::start().await.unwrap();
    upstream.otherwise(Reply::status(503));
    let store = MemoryStore::new(100);
    let (breaker, handle) = breaker(2, Duration::from_secs(30));
    // No floor and no share of traffic: not a single retry is affordable.
    let retry = RetryLayer::http_builder()
        .max_retries(3)
        .backoff(Backoff::fixed(Duration::from_millis(20)).with_jitter(Jitter::None))
        .deadline(Duration::from_secs(5))
        .budget(Arc::new(
            TpsBudget::new(Duration::from_secs(10), 0, 0.0).unwrap(),
        ))
        .build()
        .unwrap();
    let stack = default_order(dead_letters(&store), breaker, retry);

    for i in 0..2 {
        let response = send(
            &stack,
            request(&upstream, Method::GET, "/items", &format!("b-{i}"), ""),
        )
        .await
        .expect("the upstream's own 503");
        assert_eq!(response.status(), 503);
        let stopped = response
            .extensions()
            .get::<RetryStopped>()
            .expect("marked with why retrying stopped");
        assert_eq!((stopped.reason, stopped.attempts), (StopReason::Budget, 1));
    }
    assert_eq!(upstream.hits(), 2, "no retry was sent");
    assert_eq!(handle.get(BREAKER).unwrap().state, State::Open);
    let error = send(&stack, request(&upstream, Method::GET, "/items", "b-2", ""))
        .await
        .unwrap_err();
    assert!(error.is::<CircuitOpen>(), "{error}");

    // The refusals came back to the caller as `CircuitOpen`, unstored
    // (`DeadLetterLayer::store_refusals` is off by default).
    let kinds: Vec<FailureKind> = entries(&store).await.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [FailureKind::ServerError, FailureKind::ServerError]);
}

/// A body larger than the replay limit is sent once, whole, even though the
/// request may be retried (it carries an `Idempotency-Key`); the dead-letter
/// entry says it was not captured (its length only), and replay refuses to
/// send it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_body_sent_once_whole_and_never_replayed_truncated() {
    // The body below must be larger than both limits.
    const { assert!(DEFAULT_BODY_LIMIT < 100 * 1024 && REPLAY_LIMIT < 100 * 1024) };
    let upstream = ScriptedServer::start().await.unwrap();
    upstream.otherwise(Reply::status(503));
    let store = MemoryStore::new(100);
    let (breaker, _handle) = breaker(3, Duration::from_secs(30));
    let stack = default_order(dead_letters(&store), breaker, retry(3));

    let body: String = (0..100 * 1024)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    let mut req = request(&upstream, Method::POST, "/upload", "big-1", &body);
    req.headers_mut()
        .insert("idempotency-key", http::HeaderValue::from_static("big-1"));
    let response = send(&stack, req).await.unwrap();

    assert_eq!(response.status(), 503);
    let log = upstream.received();
    assert_eq!(log.len(), 1, "a body too large to record is not retried");
    assert_eq!(log[0].body, body, "and is sent whole, never truncated");
    let stored = entries(&store).await;
    assert_eq!(stored.len(), 1);
    let entry = &stored[0];
    assert!(entry.body_truncated);
    assert!(entry.body.is_empty(), "not captured");
    assert_eq!(entry.body_len, Some(body.len() as u64));

    let mut replayer = http_client_for::<Full<Bytes>>();
    let destination = upstream.uri();
    let result = Replayer::new(&store)
        .replay(entry.id, &mut replayer, &HttpClassifier::new(), |e| {
            http_request(e, &destination, &[])
        })
        .await;
    assert!(matches!(result, Err(ReplayError::Request(_))), "{result:?}");
    assert_eq!(upstream.hits(), 1, "nothing was sent");
    assert_eq!(store.depth().await.unwrap(), 1, "the entry is kept");
}

/// Dropping a call while it sleeps before a retry (here: `Retry-After: 1`)
/// cancels the retry: the upstream never sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_call_cancels_its_pending_retry() {
    let upstream = ScriptedServer::start().await.unwrap();
    upstream.script([Reply::status(503).header("retry-after", "1")]);
    let store = MemoryStore::new(100);
    let (breaker, handle) = breaker(3, Duration::from_secs(30));
    let stack = default_order(dead_letters(&store), breaker, retry(3));

    let call = send(
        &stack,
        request(&upstream, Method::GET, "/items", "dropped", ""),
    );
    let outcome = tokio::time::timeout(Duration::from_millis(300), call).await;
    assert!(outcome.is_err(), "the call was still waiting to retry");
    assert_eq!(upstream.hits(), 1);

    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(upstream.hits(), 1, "the cancelled retry was never sent");
    let snapshot = handle.get(BREAKER).unwrap();
    assert_eq!(snapshot.state, State::Closed);
    assert_eq!(snapshot.failures, 0, "a cancelled call is no failure");
}

/// A half-open probe whose caller gives up (its future is dropped) gives its
/// slot back: the next call is admitted as the probe and closes the breaker,
/// instead of the breaker refusing everything forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_probe_gives_its_slot_back() {
    let recovery = Duration::from_millis(200);
    let upstream = ScriptedServer::start().await.unwrap();
    upstream.otherwise(Reply::status(503));
    let store = MemoryStore::new(100);
    let (breaker, handle) = breaker(1, recovery);
    let stack = default_order(dead_letters(&store), breaker, retry(0));

    let response = send(
        &stack,
        request(&upstream, Method::GET, "/items", "open", ""),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(handle.get(BREAKER).unwrap().state, State::Open);

    // The probe hangs and its caller gives up.
    upstream.otherwise(Reply::ok("ok").after(Duration::from_secs(3)));
    tokio::time::sleep(recovery + Duration::from_millis(100)).await;
    let probe = send(
        &stack,
        request(&upstream, Method::GET, "/items", "probe", ""),
    );
    assert!(tokio::time::timeout(Duration::from_millis(200), probe)
        .await
        .is_err());
    assert_eq!(upstream.hits(), 2, "the probe reached the upstream");
    assert_eq!(handle.get(BREAKER).unwrap().probes_in_flight, 0);

    // The upstream answers quickly again: the next call is the new probe.
    upstream.otherwise(Reply::ok("ok"));
    let response = send(
        &stack,
        request(&upstream, Method::GET, "/items", "probe-2", ""),
    )
    .await
    .expect("the slot was given back");
    assert_eq!(response.status(), 200);
    assert_eq!(handle.get(BREAKER).unwrap().state, State::Closed);
    assert_eq!(upstream.hits(), 3);
}

/// One breaker per upstream host: an outage of one upstream opens its own
/// breaker and leaves calls to the healthy one flowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_breakers_isolate_a_failing_host() {
    let down = ScriptedServer::start().await.unwrap();
    down.otherwise(Reply::status(503));
    let up = ScriptedServer::start().await.unwrap();
    let store = MemoryStore::new(100);
    let breaker = CircuitBreakerLayer::builder()
        .policy(Policy::consecutive_failures(2))
        .recovery_timeout(Duration::from_secs(30))
        .build_keyed(HttpClassifier::new(), |req: &Request<_>| {
            req.uri()
                .authority()
                .map_or_else(String::new, |a| a.to_string())
        })
        .unwrap();
    let handle = breaker.handle();
    let stack = HttpService::new(
        ServiceBuilder::new()
            .map_response(integration_tests::buffered)
            .layer(DeadLetterLayer::new(store.clone()))
            .layer(breaker)
            .layer(retry(1))
            .layer(CountAttemptsLayer::new())
            .service(http_client_for()),
    );

    for i in 0..4 {
        let result = send(
            &stack,
            request(&down, Method::GET, "/x", &format!("d-{i}"), ""),
        )
        .await;
        if i < 2 {
            assert_eq!(result.unwrap().status(), 503);
        } else {
            assert!(result.unwrap_err().is::<CircuitOpen>());
        }
        let response = send(
            &stack,
            request(&up, Method::GET, "/x", &format!("u-{i}"), ""),
        )
        .await
        .unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(down.hits(), 4, "two calls of two attempts, then refused");
    assert_eq!(up.hits(), 4);
    let down_key = down.uri().authority().unwrap().to_string();
    let up_key = up.uri().authority().unwrap().to_string();
    assert_eq!(handle.get(&down_key).unwrap().state, State::Open);
    assert_eq!(handle.get(&up_key).unwrap().state, State::Closed);
    assert_eq!(handle.list().len(), 2);
    // The refusals came back to the caller as `CircuitOpen`, unstored
    // (`DeadLetterLayer::store_refusals` is off by default).
    let kinds: Vec<FailureKind> = entries(&store).await.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [FailureKind::ServerError, FailureKind::ServerError]);
}

/// Half-open admits exactly one probe across every clone of the stack, even
/// when many callers arrive at once: the others fail fast while the probe is
/// in flight, and the probe's success closes the breaker for everyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_admits_exactly_one_probe_under_concurrency() {
    let recovery = Duration::from_millis(200);
    let upstream = ScriptedServer::start().await.unwrap();
    upstream.otherwise(Reply::status(503));
    let store = MemoryStore::new(100);
    let (breaker, handle) = breaker(1, recovery);
    let stack = default_order(dead_letters(&store), breaker, retry(0));
    let response = send(
        &stack,
        request(&upstream, Method::GET, "/items", "open", ""),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 503);

    // The probe takes a while, so every concurrent caller arrives while it
    // is in flight.
    upstream.otherwise(Reply::ok("ok").after(Duration::from_millis(500)));
    tokio::time::sleep(recovery + Duration::from_millis(100)).await;
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let stack = stack.clone();
            let req = request(&upstream, Method::GET, "/items", &format!("c-{i}"), "");
            tokio::spawn(async move { send(&stack, req).await })
        })
        .collect();
    let (mut succeeded, mut refused) = (0, 0);
    for call in calls {
        match call.await.unwrap() {
            Ok(response) if response.status() == 200 => succeeded += 1,
            Err(error) if error.is::<CircuitOpen>() => refused += 1,
            Ok(response) => panic!("unexpected {}", response.status()),
            Err(error) => panic!("unexpected error {error}"),
        }
    }

    assert_eq!((succeeded, refused), (1, 19));
    assert_eq!(upstream.hits(), 2, "the opening call and one probe");
    assert_eq!(handle.get(BREAKER).unwrap().state, State::Closed);
}

/// The upstream reads the request and hangs up without answering (status 0,
/// "no response"): hyper's incomplete-message error is classified as a
/// connection failure, so a GET is retried and a POST is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hang_up_without_response_is_a_connection_failure() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                // Read the request head, then close without a word.
                let mut buf = [0u8; 4096];
                let _ = socket.read(&mut buf).await;
                drop(socket);
            });
        }
    });
    let store = MemoryStore::new(100);
    let (breaker, _handle) = breaker(10, Duration::from_secs(30));
    let stack = default_order(dead_letters(&store), breaker, retry(2));

    let get = Request::get(format!("http://{addr}/items"))
        .header(REQUEST_ID, "hangup-get")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let error = send(&stack, get).await.expect_err("no response");
    assert_eq!(
        classify_error(&error),
        Some(FailureKind::Connection),
        "{error}"
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 3, "a GET is retried");

    let post = Request::post(format!("http://{addr}/orders"))
        .header(REQUEST_ID, "hangup-post")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let error = send(&stack, post).await.expect_err("no response");
    assert_eq!(
        classify_error(&error),
        Some(FailureKind::Connection),
        "{error}"
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 4, "a POST is not");

    let stored = entries(&store).await;
    let summary: Vec<(FailureKind, u32)> = stored.iter().map(|e| (e.kind, e.attempts)).collect();
    assert_eq!(
        summary,
        [(FailureKind::Connection, 3), (FailureKind::Connection, 1)]
    );
}

/// At the limits exactly: a body of `REPLAY_LIMIT` bytes is recorded and
/// retried, and kept whole in the dead-letter entry (`DEFAULT_BODY_LIMIT`);
/// one byte more is sent once, whole, and stored as not captured (its length
/// only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_limits_are_inclusive() {
    const { assert!(REPLAY_LIMIT == DEFAULT_BODY_LIMIT) };
    let upstream = ScriptedServer::start().await.unwrap();
    upstream.otherwise(Reply::status(503));
    let store = MemoryStore::new(100);
    let (breaker, _handle) = breaker(100, Duration::from_secs(30));
    let stack = default_order(dead_letters(&store), breaker, retry(1));

    for (id, len) in [("at-limit", REPLAY_LIMIT), ("over-limit", REPLAY_LIMIT + 1)] {
        let body = "x".repeat(len);
        let mut req = request(&upstream, Method::PUT, "/blob", id, &body);
        req.headers_mut()
            .insert("content-type", http::HeaderValue::from_static("text/plain"));
        let response = send(&stack, req).await.unwrap();
        assert_eq!(response.status(), 503);
        let sent: Vec<_> = upstream
            .received()
            .into_iter()
            .filter(|s| s.header(REQUEST_ID) == Some(id))
            .collect();
        assert!(sent.iter().all(|s| s.body.len() == len), "{id}: sent whole");
        let expected_attempts = if len <= REPLAY_LIMIT { 2 } else { 1 };
        assert_eq!(sent.len(), expected_attempts, "{id}");
    }
    let stored = entries(&store).await;
    assert_eq!(stored.len(), 2);
    assert!(!stored[0].body_truncated);
    assert_eq!(stored[0].body.len(), REPLAY_LIMIT);
    assert_eq!(stored[0].attempts, 2);
    assert!(stored[1].body_truncated);
    assert!(stored[1].body.is_empty());
    assert_eq!(stored[1].body_len, Some(DEFAULT_BODY_LIMIT as u64 + 1));
    assert_eq!(stored[1].attempts, 1);
}

/// A hedged call whose attempts all fail: the hedge layer reports its
/// attempts to the dead-letter layer as the retry layer does, so the entry
/// counts the hedge too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedged_call_that_fails_is_stored_with_every_attempt() {
    let upstream = ScriptedServer::start().await.unwrap();
    upstream.script([
        Reply::status(503).after(Duration::from_millis(300)),
        Reply::status(503).after(Duration::from_millis(10)),
    ]);
    let store = MemoryStore::new(100);
    let hedge = HedgeLayer::http_builder()
        .delay(Duration::from_millis(50))
        .no_budget()
        .build()
        .unwrap();
    let stack = HttpService::new(
        ServiceBuilder::new()
            .map_response(integration_tests::buffered)
            .layer(dead_letters(&store))
            .layer(hedge)
            .service(http_client_for()),
    );
    let req = request(&upstream, Method::GET, "/search", "hedged", "");
    let response = send(&stack, req).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(upstream.hits(), 2, "the first attempt and its hedge");

    let stored = entries(&store).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].attempts, 2);
}
