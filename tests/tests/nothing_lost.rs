//! Nothing is lost (seed 002): under concurrent load against an upstream that
//! fails in every way at once, each request either succeeded or is in the
//! durable dead-letter store — read back from disk after the service is gone.
//!
//! Three waves of concurrent requests go through one stack in the documented
//! order (`DeadLetter → CircuitBreaker → ReplayBody → Retry → client`) backed
//! by one redb file:
//!
//! 1. a mixed-failure upstream: healthy, flaky (fails once per request),
//!    down (always 500) and poison (422) requests, GETs and POSTs;
//! 2. a full outage, which opens the breaker;
//! 3. the upstream is healthy again but the breaker is still open: every
//!    request is refused locally, and still not lost (the layer stores
//!    refusals here, `store_refusals(true)`; by default it returns them to
//!    the caller unstored, see `first_hour_4_…` in tower-poison).
//!
//! Requests are matched by their `x-request-id` header.

use std::collections::HashMap;
use std::time::Duration;

use http::Method;
use tower_breaker::{CircuitOpen, State};
use tower_classify::FailureKind;
use tower_poison::store::{DeadLetterStore, MemoryStore, RedbStore};
use tower_poison::{DeadLetterEntry, StoreFull};

use examples::client::HttpService;
use examples::scripted::{Reply, ScriptedServer};
use integration_tests::{
    breaker, dead_letters, default_order, entries, request, retry, send, stored_header, BREAKER,
    REQUEST_ID,
};

/// Requests per wave.
const WAVE: usize = 24;
/// Retries after the first attempt.
const RETRIES: u32 = 2;

/// What the mixed upstream does with request `n` of wave 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Behaviour {
    Healthy,
    /// 503 on the first attempt, 200 on the next.
    Flaky,
    /// 500 on every attempt.
    Down,
    /// 422: never succeeds, never retried.
    Poison,
}

fn behaviour(n: usize) -> Behaviour {
    [
        Behaviour::Healthy,
        Behaviour::Flaky,
        Behaviour::Down,
        Behaviour::Poison,
    ][n % 4]
}

/// One request in three is a POST without an `Idempotency-Key`: one attempt.
fn method(n: usize) -> Method {
    if n.is_multiple_of(3) {
        Method::POST
    } else {
        Method::GET
    }
}

/// How a call ended, as the caller saw it.
#[derive(Debug)]
enum Ended {
    Succeeded,
    /// Refused locally by the open breaker.
    Refused,
    /// Any other failure: an error, or a failing response passed on.
    Failed(String),
}

/// Sends every request of a wave at once and waits for all of them.
async fn wave(
    stack: &HttpService,
    upstream: &ScriptedServer,
    prefix: &str,
    results: &mut HashMap<String, Ended>,
) {
    let mut calls = Vec::with_capacity(WAVE);
    for n in 0..WAVE {
        let id = format!("{prefix}-{n:02}");
        let body = if method(n) == Method::POST {
            format!(r#"{{"n":{n}}}"#)
        } else {
            String::new()
        };
        let req = request(upstream, method(n), &format!("/work/{n}"), &id, &body);
        let stack = stack.clone();
        calls.push(tokio::spawn(async move {
            let ended = match send(&stack, req).await {
                Ok(response) if response.status().is_success() => Ended::Succeeded,
                Ok(response) => Ended::Failed(format!("HTTP {}", response.status())),
                Err(error) if error.is::<CircuitOpen>() => Ended::Refused,
                Err(error) => Ended::Failed(format!("error: {error}")),
            };
            (id, ended)
        }));
    }
    for call in calls {
        let (id, ended) = call.await.expect("request task");
        results.insert(id, ended);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_lost_under_mixed_failures() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dead-letters.redb");
    let store = RedbStore::builder().open(&path).unwrap();
    let upstream = ScriptedServer::start().await.unwrap();
    upstream.respond_with(|seen, earlier| {
        let n: usize = seen
            .uri
            .path()
            .trim_start_matches("/work/")
            .parse()
            .unwrap();
        match behaviour(n) {
            Behaviour::Healthy => Reply::ok("ok"),
            Behaviour::Flaky => {
                let id = seen.header(REQUEST_ID);
                if earlier.iter().any(|e| e.header(REQUEST_ID) == id) {
                    Reply::ok("ok")
                } else {
                    Reply::status(503)
                }
            }
            Behaviour::Down => Reply::status(500),
            Behaviour::Poison => Reply::status(422),
        }
    });
    // Wave 1 has 8 transient failures in 24 calls, so a threshold of 20
    // cannot open during it; wave 2 (24 failures in a row) must open it.
    let (breaker, handle) = breaker(20, Duration::from_secs(30));
    // Refusals stored too (`store_refusals`, off by default, when a refusal
    // is returned to its caller, who still holds the request): here every
    // request that did not succeed must be in the store.
    let dead_letters = dead_letters(&store).store_refusals(true);
    let stack = default_order(dead_letters, breaker, retry(RETRIES));
    let mut results = HashMap::new();

    // Wave 1: mixed failures.
    wave(&stack, &upstream, "mixed", &mut results).await;
    let mixed_attempts = upstream.hits();
    let expected_attempts: usize = (0..WAVE)
        .map(|n| match (behaviour(n), method(n) == Method::POST) {
            (Behaviour::Flaky, false) => 2,
            (Behaviour::Down, false) => 1 + RETRIES as usize,
            _ => 1,
        })
        .sum();
    assert_eq!(mixed_attempts, expected_attempts);
    assert_eq!(handle.get(BREAKER).unwrap().state, State::Closed);

    // Wave 2: a full outage opens the breaker.
    upstream.otherwise(Reply::status(503));
    wave(&stack, &upstream, "outage", &mut results).await;
    let outage_attempts = upstream.hits() - mixed_attempts;
    assert_eq!(handle.get(BREAKER).unwrap().state, State::Open);

    // Wave 3: the upstream is back, the breaker still open: all refused.
    upstream.otherwise(Reply::ok("ok"));
    wave(&stack, &upstream, "open", &mut results).await;
    assert_eq!(
        upstream.hits(),
        mixed_attempts + outage_attempts,
        "no request reached the upstream through the open breaker"
    );

    // The service goes away; the store is read back from disk.
    drop(stack);
    drop(store);
    let reopened = RedbStore::builder()
        .open(&path)
        .expect("the store opens again");
    let stored = entries(&reopened).await;
    let mut by_id: HashMap<String, Vec<&DeadLetterEntry>> = HashMap::new();
    for entry in &stored {
        let id = stored_header(entry, REQUEST_ID).expect("every entry keeps its request id");
        by_id.entry(id.to_owned()).or_default().push(entry);
    }

    // The invariant: every request succeeded or is stored, once, never both.
    assert_eq!(results.len(), 3 * WAVE);
    for (id, ended) in &results {
        let kept = by_id.get(id).map_or(0, Vec::len);
        match ended {
            Ended::Succeeded => assert_eq!(kept, 0, "{id} succeeded but was dead-lettered"),
            Ended::Refused => assert_eq!(kept, 1, "{id} was refused and is stored {kept} times"),
            Ended::Failed(why) => {
                assert_eq!(kept, 1, "{id} failed ({why}) and is stored {kept} times")
            }
        }
    }
    let failed = results
        .values()
        .filter(|e| !matches!(e, Ended::Succeeded))
        .count();
    assert_eq!(stored.len(), failed, "no entry without a failed request");

    // Wave 1, request by request.
    for n in 0..WAVE {
        let id = format!("mixed-{n:02}");
        let post = method(n) == Method::POST;
        let expected = match (behaviour(n), post) {
            (Behaviour::Healthy, _) | (Behaviour::Flaky, false) => None,
            (Behaviour::Flaky, true) => Some((FailureKind::ServerError, 1)),
            (Behaviour::Down, false) => Some((FailureKind::ServerError, 1 + RETRIES)),
            (Behaviour::Down, true) => Some((FailureKind::ServerError, 1)),
            (Behaviour::Poison, _) => Some((FailureKind::Rejected, 1)),
        };
        match (expected, by_id.get(&id)) {
            (None, None) => assert!(matches!(results[&id], Ended::Succeeded), "{id}"),
            (Some((kind, attempts)), Some(kept)) => {
                let entry = kept[0];
                assert_eq!(entry.kind, kind, "{id}");
                assert_eq!(entry.attempts, attempts, "{id}");
                assert_eq!(entry.method.as_deref(), Some(method(n).as_str()), "{id}");
                let body = if post {
                    format!(r#"{{"n":{n}}}"#)
                } else {
                    String::new()
                };
                assert_eq!(entry.body, body, "{id}");
            }
            (expected, kept) => panic!("{id}: expected {expected:?}, stored {kept:?}"),
        }
    }

    // Wave 2: every request failed and is stored; those that reached the
    // upstream made every attempt they were allowed (POSTs one), the rest
    // were refused by the breaker once it opened.
    let mut reached = 0;
    let mut attempts = 0;
    for n in 0..WAVE {
        let id = format!("outage-{n:02}");
        let entry = by_id[&id][0];
        match entry.kind {
            FailureKind::ServerError => {
                let allowed = if method(n) == Method::POST {
                    1
                } else {
                    1 + RETRIES
                };
                assert_eq!(entry.attempts, allowed, "{id}");
                reached += 1;
                attempts += allowed as usize;
            }
            FailureKind::Shed => assert!(matches!(results[&id], Ended::Refused), "{id}"),
            other => panic!("{id}: unexpected kind {other}"),
        }
    }
    assert!(
        reached >= 20 - 8,
        "the breaker opened after {reached} failures"
    );
    assert_eq!(
        outage_attempts, attempts,
        "the upstream saw exactly the attempts stored"
    );

    // Wave 3: every request refused locally and kept, ready for replay.
    for n in 0..WAVE {
        let id = format!("open-{n:02}");
        assert!(
            matches!(results[&id], Ended::Refused),
            "{id}: {:?}",
            results[&id]
        );
        let entry = by_id[&id][0];
        assert_eq!(entry.kind, FailureKind::Shed, "{id}");
    }
    assert_eq!(reopened.depth().await.unwrap(), failed as u64);
}

/// The other half of "nothing lost": when the store cannot keep an entry (a
/// full bounded store here), the call fails loudly with `StoreFull` instead
/// of the failure disappearing, so the caller (a queue consumer) knows not to
/// acknowledge it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_store_fails_calls_loudly() {
    let upstream = ScriptedServer::start().await.unwrap();
    upstream.otherwise(Reply::status(500));
    let store = MemoryStore::new(2);
    let (breaker, _handle) = breaker(100, Duration::from_secs(30));
    let stack = default_order(dead_letters(&store), breaker, retry(0));

    let mut outcomes = Vec::new();
    for n in 0..4 {
        let req = request(&upstream, Method::POST, "/work", &format!("full-{n}"), "{}");
        outcomes.push(send(&stack, req).await);
    }

    for outcome in &outcomes[..2] {
        assert_eq!(outcome.as_ref().unwrap().status(), 500);
    }
    for outcome in &outcomes[2..] {
        let error = outcome.as_ref().expect_err("the entry could not be kept");
        let failed = error
            .downcast_ref::<StoreFull>()
            .unwrap_or_else(|| panic!("expected StoreFull, got {error}"));
        assert!(
            failed.original().is_none(),
            "the call failed with a response"
        );
    }
    let kept: Vec<String> = entries(&store)
        .await
        .iter()
        .map(|e| stored_header(e, REQUEST_ID).unwrap().to_owned())
        .collect();
    assert_eq!(kept, ["full-0", "full-1"]);
    assert_eq!(upstream.hits(), 4);
}
