//! The Redis dead-letter store (one queue shared by a fleet), and the store through a
//! Redis restart: persistence keeps what was acknowledged, and a call made
//! while Redis is down fails with a clear error.
//!
//! The suites run on the shared server (`single::`) and on a Redis Cluster
//! (`cluster::`, see `support`), where a script whose keys span two slots is
//! refused.

mod support;

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{service_fn, Layer, ServiceExt};
use tower_classify::{BoxError, FailureKind};
use tower_poison::store::{
    DeadLetterStore, ListQuery, PurgeFilter, RedisConnectOptions, RedisConnection,
    RedisDeadLetterStore, StoreErrorKind,
};
use tower_poison::{
    Claim, ClaimToken, DeadLetterEntry, DeadLetterLayer, EntryId, ReplayBody, StoreFailed,
    StoreFull,
};

const DAY: Duration = Duration::from_secs(86_400);

fn entry(label: &str, kind: FailureKind, first_failed_at: SystemTime) -> DeadLetterEntry {
    let mut entry = DeadLetterEntry::new(
        label,
        kind,
        vec!["upstream failed".into()],
        whole_millis(first_failed_at),
    );
    entry.id = fresh_id();
    entry.method = Some("POST".into());
    entry.uri = Some("http://example.internal/orders".into());
    entry.body = Bytes::from_static(b"{\"sku\":42}");
    entry.attempts = 3;
    entry.last_failed_at = whole_millis(SystemTime::now());
    entry
}

fn whole_millis(time: SystemTime) -> SystemTime {
    let since = time.duration_since(SystemTime::UNIX_EPOCH).unwrap();
    SystemTime::UNIX_EPOCH + Duration::from_millis(since.as_millis() as u64)
}

/// A store on a queue of its own at `url`, and what deletes the queue's
/// keys after the test.
async fn shared_store(url: &str, name: &str) -> (RedisDeadLetterStore, support::Cleanup) {
    let name = support::unique(name);
    let cleanup = support::Cleanup::queue(url, &name);
    (
        RedisDeadLetterStore::builder()
            .connect(url, name)
            .await
            .unwrap(),
        cleanup,
    )
}

async fn redis_store_pages_filters_and_purges_by_age(url: String) {
    let (store, _cleanup) = shared_store(&url, "paging").await;
    let now = SystemTime::now();
    let mut old_ids = HashSet::new();
    let mut written = Vec::new();
    for i in 0..10u32 {
        let kind = if i % 2 == 0 {
            FailureKind::ServerError
        } else {
            FailureKind::Poison
        };
        let first = if i < 4 {
            now - DAY * 10
        } else {
            now - Duration::from_secs(3_600 * u64::from(i))
        };
        let e = entry(if i < 7 { "orders" } else { "billing" }, kind, first);
        if i < 4 {
            old_ids.insert(e.id);
        }
        written.push(e.clone());
        store.put(e).await.unwrap();
    }
    assert_eq!(store.depth().await.unwrap(), 10, "HLEN");
    for e in &written {
        assert_eq!(store.get(e.id).await.unwrap().as_ref(), Some(e));
    }

    // Paging 3 at a time: every entry once, in id order (here also the
    // order they were written in).
    let mut seen = Vec::new();
    let mut query = ListQuery {
        limit: 3,
        ..ListQuery::default()
    };
    loop {
        let page = store.list(query.clone()).await.unwrap();
        assert!(page.entries.len() <= 3);
        seen.extend(page.entries.iter().map(|e| e.id));
        match page.next {
            Some(next) => query.after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, written.iter().map(|e| e.id).collect::<Vec<_>>());
    // A limit of 0 is a limit of 1: one entry and a cursor to the rest.
    let one = store
        .list(ListQuery {
            limit: 0,
            ..ListQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(one.entries.len(), 1);
    assert_eq!(one.next, Some(written[0].id));
    let last = store
        .list(ListQuery {
            limit: 0,
            after: Some(written[8].id),
            ..ListQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(last.entries.len(), 1);
    assert_eq!(last.next, None);

    let poison = store
        .list(ListQuery {
            kind: Some(FailureKind::Poison),
            ..ListQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(poison.entries.len(), 5);
    let billing = store
        .list(ListQuery {
            label: Some("billing".into()),
            ..ListQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(billing.entries.len(), 3);
    let stats = store.stats(now).await.unwrap();
    assert_eq!((stats.depth, stats.by_kind["poison"]), (10, 5));
    let oldest = store.oldest_age(now).await.unwrap().unwrap();
    assert!(oldest >= DAY * 10 - Duration::from_secs(1));

    // Purge by age removes exactly the four old entries.
    let purged = store
        .purge(PurgeFilter::older_than(DAY * 7, now))
        .await
        .unwrap();
    assert_eq!(purged, 4);
    assert_eq!(store.depth().await.unwrap(), 6);
    for id in &old_ids {
        assert_eq!(store.get(*id).await.unwrap(), None);
    }
    assert!(store.oldest_age(now).await.unwrap().unwrap() < DAY);

    let first = store
        .list(ListQuery {
            limit: 1,
            ..ListQuery::default()
        })
        .await
        .unwrap()
        .entries[0]
        .id;
    assert!(store.remove(first).await.unwrap());
    assert!(!store.remove(first).await.unwrap());
    assert_eq!(store.get(first).await.unwrap(), None);
    assert_eq!(store.purge(PurgeFilter::default()).await.unwrap(), 5);
    assert_eq!(store.depth().await.unwrap(), 0);
}

/// `put` of an existing id (a failed replay updating its entry) keeps one
/// entry, in its place; a page cursor whose entry went away still resumes
/// right after it.
async fn redis_store_replaces_an_entry_in_place_of_adding_one(url: String) {
    let (store, _cleanup) = shared_store(&url, "upsert").await;
    let now = SystemTime::now();
    let a = entry("orders", FailureKind::Timeout, now);
    let b = entry("orders", FailureKind::Timeout, now);
    store.put(a.clone()).await.unwrap();
    store.put(b.clone()).await.unwrap();
    let mut updated = a.clone();
    updated.attempts = 9;
    store.put(updated.clone()).await.unwrap();
    // A retried put (same arguments twice) still leaves one entry.
    store.put(updated.clone()).await.unwrap();
    assert_eq!(store.depth().await.unwrap(), 2);
    assert_eq!(store.get(a.id).await.unwrap().unwrap().attempts, 9);
    let listed: Vec<EntryId> = store
        .list(ListQuery::default())
        .await
        .unwrap()
        .entries
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(listed, [a.id, b.id], "listed in id order");

    // Resume after an entry that was removed meanwhile.
    let c = entry("orders", FailureKind::Timeout, SystemTime::now());
    store.put(c.clone()).await.unwrap();
    assert!(store.remove(b.id).await.unwrap());
    let page = store
        .list(ListQuery {
            after: Some(b.id),
            ..ListQuery::default()
        })
        .await
        .unwrap();
    let ids: Vec<EntryId> = page.entries.iter().map(|e| e.id).collect();
    assert_eq!(ids, [c.id]);
}

/// Paging is stable while entries change: six entries, two to a page; the
/// cursor's entry is rewritten (a failed replay) and the next page is still
/// the next two, then the next cursor's entry is removed and the last page
/// is still the last two. Nothing is skipped or repeated.
async fn redis_pages_stay_in_id_order_when_the_cursor_entry_is_rewritten_or_removed(url: String) {
    let (store, _cleanup) = shared_store(&url, "stable-paging").await;
    let now = SystemTime::now();
    let written: Vec<DeadLetterEntry> = (0..6)
        .map(|_| entry("orders", FailureKind::ServerError, now))
        .collect();
    for e in &written {
        store.put(e.clone()).await.unwrap();
    }
    let ids = |page: &tower_poison::store::Page| -> Vec<EntryId> {
        page.entries.iter().map(|e| e.id).collect()
    };
    let query = ListQuery {
        limit: 2,
        ..ListQuery::default()
    };
    let first = store.list(query.clone()).await.unwrap();
    assert_eq!(ids(&first), [written[0].id, written[1].id]);
    assert_eq!(first.next, Some(written[1].id));

    let mut replayed = written[1].clone();
    replayed.attempts += 1;
    store.put(replayed).await.unwrap();
    let second = store
        .list(ListQuery {
            after: Some(written[1].id),
            ..query.clone()
        })
        .await
        .unwrap();
    assert_eq!(ids(&second), [written[2].id, written[3].id]);
    assert_eq!(second.next, Some(written[3].id));

    assert!(store.remove(written[3].id).await.unwrap());
    let third = store
        .list(ListQuery {
            after: Some(written[3].id),
            ..query.clone()
        })
        .await
        .unwrap();
    assert_eq!(ids(&third), [written[4].id, written[5].id]);
    assert_eq!(third.next, None);
    assert_eq!(store.stats(now).await.unwrap().depth, 5);
}

/// A connection for looking at the keys themselves.
async fn raw_connection(url: &str) -> RedisConnection {
    support::raw_connection(url).await.unwrap()
}

/// The documented key of `part` of queue `name`.
fn key(name: &str, part: &str) -> String {
    format!("tower-poison:{{{name}}}:{part}")
}

async fn a_full_redis_store_fails_the_call_with_store_full_and_keeps_every_acknowledged_entry(
    url: String,
) {
    let name = support::unique("full");
    let _cleanup = support::Cleanup::queue(&url, &name);
    let store = RedisDeadLetterStore::builder()
        .max_entries(3)
        .connect(&url, name.clone())
        .await
        .unwrap();
    let dlq = DeadLetterLayer::new(store.clone())
        .label("orders")
        .layer(service_fn(failing_order));
    for n in 0..3 {
        let response = dlq.clone().oneshot(order("/orders", n)).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_GATEWAY, "acknowledged");
    }
    let error = dlq
        .clone()
        .oneshot(order("/orders", 3))
        .await
        .expect_err("a full store fails the call");
    let full = error
        .downcast_ref::<StoreFull>()
        .expect("the dead-letter layer's StoreFull");
    assert_eq!(full.store_error().kind(), StoreErrorKind::Full);
    assert!(
        full.store_error().to_string().contains("max_entries 3"),
        "{}",
        full.store_error()
    );
    assert!(store.get(full.entry_id()).await.unwrap().is_none());

    assert_eq!(store.depth().await.unwrap(), 3);
    let bodies: HashSet<String> = store
        .list(ListQuery::default())
        .await
        .unwrap()
        .entries
        .iter()
        .map(|e| String::from_utf8(e.body.to_vec()).unwrap())
        .collect();
    let acknowledged: HashSet<String> = (0..3).map(|n| format!("{{\"n\":{n}}}")).collect();
    assert_eq!(
        bodies, acknowledged,
        "every acknowledged entry, nothing else"
    );

    // The documented layout, all in one hash tag.
    let mut connection = raw_connection(&url).await;
    let stored: u64 = redis::cmd("HLEN")
        .arg(key(&name, "dead-letters"))
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(stored, 3);
    let ordered: u64 = redis::cmd("ZCARD")
        .arg(key(&name, "ids"))
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(ordered, 3);
}

async fn redis_max_bytes_counts_encoded_sizes_replacing_without_double_counting(url: String) {
    let now = SystemTime::now();
    let written: Vec<DeadLetterEntry> = (0..3)
        .map(|_| entry("orders", FailureKind::ServerError, now))
        .collect();
    let size = |e: &DeadLetterEntry| serde_json::to_vec(e).unwrap().len() as u64;
    let total: u64 = written.iter().map(size).sum();
    let name = support::unique("bytes");
    let _cleanup = support::Cleanup::queue(&url, &name);
    let store = RedisDeadLetterStore::builder()
        .max_bytes(total)
        .connect(&url, name.clone())
        .await
        .unwrap();
    let connection = raw_connection(&url).await;
    let counted = |mut connection: RedisConnection| {
        let key = key(&name, "dead-letter-bytes");
        async move {
            let bytes: Option<u64> = redis::cmd("GET")
                .arg(key)
                .query_async(&mut connection)
                .await
                .unwrap();
            bytes.unwrap_or(0)
        }
    };
    for e in &written {
        store.put(e.clone()).await.unwrap();
    }
    assert_eq!(counted(connection.clone()).await, total);

    // One byte more than the limit allows: refused, nothing changes.
    let mut bigger = entry("orders", FailureKind::ServerError, now);
    bigger.body = Bytes::from_static(b"x");
    let error = store.put(bigger.clone()).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Full);
    assert!(error.to_string().contains("max_bytes"), "{error}");
    assert_eq!(store.depth().await.unwrap(), 3);

    // Replacing an entry with one of the same size fits: the old size goes.
    let mut updated = written[0].clone();
    updated.attempts = 4;
    assert_eq!(size(&updated), size(&written[0]));
    store.put(updated).await.unwrap();
    assert_eq!(counted(connection.clone()).await, total);

    // Removing gives its bytes back, so a new entry fits again.
    assert!(store.remove(written[1].id).await.unwrap());
    assert_eq!(counted(connection.clone()).await, total - size(&written[1]));
    let fresh = entry("orders", FailureKind::ServerError, now);
    // The script's reply carries the depth, for the layer's gauge.
    assert_eq!(store.put_with_depth(fresh).await.unwrap(), Some(3));
    assert_eq!(store.purge(PurgeFilter::default()).await.unwrap(), 3);
    assert_eq!(counted(connection).await, 0);
}

/// The token of a claim that succeeded.
fn claimed(claim: Claim) -> (DeadLetterEntry, ClaimToken) {
    match claim {
        Claim::Claimed { entry, token, .. } => (entry, token),
        other => panic!("expected Claimed, got {other:?}"),
    }
}

/// Ends the claim on `id` as its lease running out would: Redis expires the
/// key (an expiry time in the past), without the test waiting for it.
async fn expire_claim(url: &str, name: &str, id: EntryId) {
    let mut connection = raw_connection(url).await;
    let expired: u8 = redis::cmd("PEXPIREAT")
        .arg(key(name, &format!("claim:{id}")))
        .arg(1)
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(expired, 1, "the claim key exists");
}

/// The claim key's time to live, in milliseconds (`-2`: there is none).
async fn claim_ttl(url: &str, name: &str, id: EntryId) -> i64 {
    redis::cmd("PTTL")
        .arg(key(name, &format!("claim:{id}")))
        .query_async(&mut raw_connection(url).await)
        .await
        .unwrap()
}

async fn redis_claims_are_exclusive_run_on_the_redis_clock_and_end_on_remove_and_release(
    url: String,
) {
    let name = support::unique("claims");
    let _cleanup = support::Cleanup::queue(&url, &name);
    let store = RedisDeadLetterStore::builder()
        .connect(&url, name.clone())
        .await
        .unwrap();
    let now = whole_millis(SystemTime::now());
    let lease = Duration::from_secs(30);
    let e = entry("orders", FailureKind::ServerError, now);
    store.put(e.clone()).await.unwrap();

    // Two replayers at once: exactly one holds it; the other is told when
    // the lease ends, as its `now` plus what Redis has left of it.
    let (first, second) =
        tokio::join!(store.claim(e.id, now, lease), store.claim(e.id, now, lease));
    let outcomes = [first.unwrap(), second.unwrap()];
    assert_eq!(
        outcomes
            .iter()
            .filter(|c| matches!(c, Claim::Claimed { entry, .. } if *entry == e))
            .count(),
        1,
        "{outcomes:?}"
    );
    assert!(
        outcomes.iter().any(|c| matches!(c,
            Claim::Held { until } if *until <= now + lease && *until > now + lease - Duration::from_secs(5))),
        "{outcomes:?}"
    );
    // The lease is Redis's `PX`, not a time from the caller's clock: a
    // caller whose clock runs far ahead still finds the entry held.
    let ttl = claim_ttl(&url, &name, e.id).await;
    assert!(ttl > 25_000 && ttl <= 30_000, "PTTL {ttl}");
    let far_ahead = now + DAY;
    assert!(matches!(
        store.claim(e.id, far_ahead, lease).await.unwrap(),
        Claim::Held { until } if until > far_ahead
    ));

    // Once Redis has expired the lease, the entry is free again.
    expire_claim(&url, &name, e.id).await;
    let (claimed_entry, token) = claimed(store.claim(e.id, now, lease).await.unwrap());
    assert_eq!(claimed_entry, e);
    assert!(matches!(
        store.claim(e.id, now, lease).await.unwrap(),
        Claim::Held { .. }
    ));

    // Its own token releases it.
    store.release(e.id, token).await.unwrap();
    let (_, token) = claimed(store.claim(e.id, now, lease).await.unwrap());
    // A put leaves the claim; the next claim hands out the new entry.
    let mut updated = e.clone();
    updated.attempts = 7;
    store.put(updated.clone()).await.unwrap();
    assert!(matches!(
        store.claim(e.id, now, lease).await.unwrap(),
        Claim::Held { .. }
    ));
    store.release(e.id, token).await.unwrap();
    assert_eq!(
        claimed(store.claim(e.id, now, lease).await.unwrap()).0,
        updated
    );
    // A remove ends it (the claim key goes with the entry).
    assert!(store.remove(e.id).await.unwrap());
    assert_eq!(claim_ttl(&url, &name, e.id).await, -2);
    assert_eq!(
        store.claim(e.id, now, lease).await.unwrap(),
        Claim::NotFound
    );
    store.put(e.clone()).await.unwrap();
    claimed(store.claim(e.id, now, lease).await.unwrap());
    // So does a purge.
    assert_eq!(store.purge(PurgeFilter::default()).await.unwrap(), 1);
    assert_eq!(claim_ttl(&url, &name, e.id).await, -2);

    // An id the store never had.
    let missing = fresh_id();
    assert_eq!(
        store.claim(missing, now, lease).await.unwrap(),
        Claim::NotFound
    );
}

/// A claim belongs to whoever took it (the three-replayer scenario, on the
/// Redis clock): the layer's `put` during A's call leaves A's claim, and
/// after A's lease has run out and B took over, A's late release leaves B's
/// claim, so C still finds the entry held.
async fn redis_claims_are_ended_only_by_their_own_token(url: String) {
    let name = support::unique("owners");
    let _cleanup = support::Cleanup::queue(&url, &name);
    let store = RedisDeadLetterStore::builder()
        .connect(&url, name.clone())
        .await
        .unwrap();
    let now = SystemTime::now();
    let lease = Duration::from_secs(30);
    let e = entry("orders", FailureKind::ServerError, now);
    store.put(e.clone()).await.unwrap();

    let (_, a) = claimed(store.claim(e.id, now, lease).await.unwrap());
    let mut recorded = e.clone();
    recorded.attempts += 1;
    store.put(recorded).await.unwrap();
    assert!(
        matches!(
            store.claim(e.id, now, lease).await.unwrap(),
            Claim::Held { .. }
        ),
        "the layer's put freed the entry for replayer B"
    );

    expire_claim(&url, &name, e.id).await;
    let (_, b) = claimed(store.claim(e.id, now, lease).await.unwrap());
    assert_ne!(a, b, "every claim has its own token");
    store.release(e.id, a).await.unwrap();
    assert!(
        matches!(
            store.claim(e.id, now, lease).await.unwrap(),
            Claim::Held { .. }
        ),
        "A's stale token ended B's claim: replayer C would send the entry too"
    );
    store.release(e.id, b).await.unwrap();
    claimed(store.claim(e.id, now, lease).await.unwrap());
}

/// Whether the claim that succeeded followed one that lapsed unreleased.
fn after_lapse(claim: Claim) -> (bool, ClaimToken) {
    match claim {
        Claim::Claimed {
            token,
            previous_claim_lapsed,
            ..
        } => (previous_claim_lapsed, token),
        other => panic!("expected Claimed, got {other:?}"),
    }
}

/// A claim whose lease Redis expired before anyone released it (its
/// replayer crashed after sending, or is still sending) is reported to the
/// next claimant; a released claim, or one ended with its entry, is not.
async fn item_6_the_redis_store_reports_a_claim_that_lapsed_unreleased(url: String) {
    let name = support::unique("lapsed");
    let _cleanup = support::Cleanup::queue(&url, &name);
    let store = RedisDeadLetterStore::builder()
        .connect(&url, name.clone())
        .await
        .unwrap();
    let now = SystemTime::now();
    let lease = Duration::from_secs(30);
    let e = entry("orders", FailureKind::ServerError, now);
    store.put(e.clone()).await.unwrap();

    let (lapsed, _crashed) = after_lapse(store.claim(e.id, now, lease).await.unwrap());
    assert!(!lapsed, "the first claim follows none");
    // Replayer A never comes back; once Redis ends its lease B hears of it.
    expire_claim(&url, &name, e.id).await;
    let (lapsed, b) = after_lapse(store.claim(e.id, now, lease).await.unwrap());
    assert!(lapsed, "A's claim lapsed unreleased");
    // A put (a dead-letter layer recording B's failure) leaves that as it is.
    store.put(e.clone()).await.unwrap();
    store.release(e.id, b).await.unwrap();
    let (lapsed, c) = after_lapse(store.claim(e.id, now, lease).await.unwrap());
    assert!(!lapsed, "B released its claim");
    // C outlives its lease but releases it in the end: no lapse either.
    expire_claim(&url, &name, e.id).await;
    store.release(e.id, c).await.unwrap();
    let (lapsed, _d) = after_lapse(store.claim(e.id, now, lease).await.unwrap());
    assert!(!lapsed, "C released its claim late, but released it");
    // D's claim lapses, but the entry is removed (delivered) and stored
    // anew: its next claim follows no claim of that entry.
    expire_claim(&url, &name, e.id).await;
    assert!(store.remove(e.id).await.unwrap());
    store.put(e.clone()).await.unwrap();
    let (lapsed, _) = after_lapse(store.claim(e.id, now, lease).await.unwrap());
    assert!(!lapsed, "a remove ends the claim with its entry");
    // So does a purge.
    expire_claim(&url, &name, e.id).await;
    assert_eq!(store.purge(PurgeFilter::default()).await.unwrap(), 1);
    store.put(e.clone()).await.unwrap();
    let (lapsed, _) = after_lapse(store.claim(e.id, now, lease).await.unwrap());
    assert!(!lapsed, "a purge ends the claim with its entry");
    // A zero lease has lapsed at once.
    let f = entry("orders", FailureKind::ServerError, now);
    store.put(f.clone()).await.unwrap();
    let (lapsed, _) = after_lapse(store.claim(f.id, now, Duration::ZERO).await.unwrap());
    assert!(!lapsed);
    let (lapsed, _) = after_lapse(store.claim(f.id, now, lease).await.unwrap());
    assert!(lapsed, "a zero lease is over at once");
}

async fn redis_claim_leases_saturate_for_any_duration(url: String) {
    let (store, _cleanup) = shared_store(&url, "ttl").await;
    let now = SystemTime::now();
    let e = entry("orders", FailureKind::ServerError, now);
    store.put(e.clone()).await.unwrap();
    // Redis refuses a `PX` it cannot add to its clock; the store caps the
    // lease instead of wrapping, panicking or failing.
    claimed(store.claim(e.id, now, Duration::MAX).await.unwrap());
    let end_of_9999 = SystemTime::UNIX_EPOCH + Duration::from_millis(253_402_300_799_999);
    assert_eq!(
        store.claim(e.id, now, Duration::ZERO).await.unwrap(),
        Claim::Held { until: end_of_9999 }
    );
    // A zero lease ends at once.
    let f = entry("orders", FailureKind::ServerError, now);
    store.put(f.clone()).await.unwrap();
    claimed(store.claim(f.id, now, Duration::ZERO).await.unwrap());
    claimed(store.claim(f.id, now, Duration::ZERO).await.unwrap());
}

/// More entries than one scan page (512): purge, oldest_age and stats page
/// through the stream and see every entry.
async fn redis_scans_page_through_more_than_one_page(url: String) {
    let (store, _cleanup) = shared_store(&url, "pages").await;
    let now = SystemTime::now();
    let count = 1_300u32;
    for i in 0..count {
        // Every third entry is old; the oldest is the very last one written,
        // on the third page.
        let first = if i == count - 1 {
            now - DAY * 30
        } else if i % 3 == 0 {
            now - DAY * 10
        } else {
            now
        };
        store
            .put(entry("orders", FailureKind::ServerError, first))
            .await
            .unwrap();
    }
    let stats = store.stats(now).await.unwrap();
    assert_eq!(stats.depth, u64::from(count));
    assert_eq!(stats.by_kind["server_error"], u64::from(count));
    let oldest = store.oldest_age(now).await.unwrap().unwrap();
    assert!(oldest >= DAY * 30 - Duration::from_secs(1), "{oldest:?}");
    assert_eq!(
        stats.oldest_age.map(|a| a.as_secs()),
        Some(oldest.as_secs())
    );

    let old = (0..count - 1).filter(|i| i % 3 == 0).count() as u64 + 1;
    let purged = store
        .purge(PurgeFilter::older_than(DAY * 7, now))
        .await
        .unwrap();
    assert_eq!(purged, old);
    assert_eq!(store.depth().await.unwrap(), u64::from(count) - old);
    assert!(store.oldest_age(now).await.unwrap().unwrap() < DAY);
    assert_eq!(
        store.purge(PurgeFilter::default()).await.unwrap(),
        u64::from(count) - old
    );
    assert_eq!(store.depth().await.unwrap(), 0);
}

type Body = ReplayBody<Full<Bytes>>;

fn failing_order(
    _request: Request<Body>,
) -> std::future::Ready<Result<Response<Full<Bytes>>, BoxError>> {
    std::future::ready(Ok(Response::builder()
        .status(StatusCode::BAD_GATEWAY)
        .body(Full::new(Bytes::from_static(b"upstream failed")))
        .unwrap()))
}

fn order(path: &str, n: usize) -> Request<Full<Bytes>> {
    Request::post(format!("http://orders.internal{path}"))
        .body(Full::new(Bytes::from(format!("{{\"n\":{n}}}"))))
        .unwrap()
}

/// Restarts a persistent Redis (its own process, append-only file with fsync
/// always) under the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_entries_survive_a_redis_restart_and_calls_during_the_outage_fail_clearly() {
    let Some(binary) = support::redis_server_binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let port = support::free_port();
    let mut server = support::RedisProcess::start(&binary, dir.path(), port);
    let url = server.url();
    let options = RedisConnectOptions::new()
        .connection_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_secs(1));

    let dead_letters = RedisDeadLetterStore::builder()
        .options(options)
        .connect(&url, "orders:dlq")
        .await
        .unwrap();
    let dlq = DeadLetterLayer::new(dead_letters.clone())
        .label("orders")
        .layer(service_fn(failing_order));

    // Before: 20 failed calls acknowledged (the layer returned their own
    // 502, so each entry was written).
    let mut acknowledged = Vec::new();
    for n in 0..20 {
        let response = dlq.clone().oneshot(order("/orders", n)).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
        acknowledged.push(n);
    }
    assert_eq!(dead_letters.depth().await.unwrap(), 20);

    // Redis dies (SIGKILL: no shutdown save).
    server.kill();
    let error = dlq
        .clone()
        .oneshot(order("/orders", 999))
        .await
        .expect_err("a failed call whose entry cannot be kept is an error");
    let failed = error
        .downcast_ref::<StoreFailed>()
        .expect("the dead-letter layer's StoreFailed");
    assert_eq!(failed.store_error().kind(), StoreErrorKind::Backend);
    let chain = tower_poison::error_chain(&*error).join(": ");
    assert!(
        chain.contains("redis dead-letter store orders:dlq at redis://127.0.0.1")
            && chain.contains("failed to keep entry"),
        "a clear error: {chain}"
    );
    eprintln!("while Redis is down: {chain}");

    // Redis comes back from its append-only file, on the same port.
    let _server = support::RedisProcess::start(&binary, dir.path(), port);
    // The connection manager reconnects in the background; the first
    // command after the outage may still see the old, broken connection.
    let mut depth = None;
    for _ in 0..50 {
        if let Ok(d) = dead_letters.depth().await {
            depth = Some(d);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        depth,
        Some(20),
        "every acknowledged entry is back, nothing else"
    );
    let entries = dead_letters
        .list(ListQuery {
            limit: 100,
            ..ListQuery::default()
        })
        .await
        .unwrap()
        .entries;
    let bodies: HashSet<String> = entries
        .iter()
        .map(|e| String::from_utf8(e.body.to_vec()).unwrap())
        .collect();
    for n in acknowledged {
        assert!(bodies.contains(&format!("{{\"n\":{n}}}")), "entry {n} lost");
    }
    // And the store takes writes again.
    let response = dlq.clone().oneshot(order("/orders", 1000)).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(dead_letters.depth().await.unwrap(), 21);
}

/// The error chain, joined, of connecting a store to `url`, which fails.
async fn connect_error(url: &str) -> String {
    let error = RedisDeadLetterStore::builder()
        .connect(url, "dlq")
        .await
        .unwrap_err();
    tower_poison::error_chain(&error).join(": ")
}

/// A call made before Redis was ever reachable: connecting fails with a
/// clear error naming the server (and never its password).
#[tokio::test]
async fn connecting_to_an_absent_redis_names_it_without_the_password() {
    let port = support::free_port();
    let text = connect_error(&format!("redis://:hunter2@127.0.0.1:{port}")).await;
    assert!(
        text.contains(&format!(
            "cannot connect to redis at redis://[redacted]@127.0.0.1:{port}"
        )),
        "{text}"
    );
    assert!(!text.contains("hunter2"));
}

/// The same for a cluster whose nodes are all absent: every node is named,
/// none with its password.
#[tokio::test]
async fn connecting_to_an_absent_cluster_names_its_nodes_without_the_password() {
    let (a, b) = (support::free_port(), support::free_port());
    let text = connect_error(&format!(
        "redis://:hunter2@127.0.0.1:{a},redis://:hunter2@127.0.0.1:{b}"
    ))
    .await;
    assert!(
        text.contains(&format!(
            "cannot connect to redis at redis://[redacted]@127.0.0.1:{a},redis://[redacted]@127.0.0.1:{b}"
        )),
        "{text}"
    );
    assert!(!text.contains("hunter2"));
}

/// What the cluster runs check: a script whose keys lie in two slots is
/// refused (`CROSSSLOT`), as every script of the store would be if one of
/// its keys lost the queue's hash tag; the same script on two keys of one
/// queue runs.
#[tokio::test]
async fn the_cluster_refuses_a_script_whose_keys_span_two_slots() {
    let Some(url) = support::redis_at(support::Target::Cluster).await else {
        return;
    };
    let mut connection = raw_connection(&url).await;
    let script = redis::Script::new("return redis.call('EXISTS', KEYS[1], KEYS[2])");
    let probe = connection.clone();
    let slot = |key: String| {
        let mut connection = probe.clone();
        async move {
            let slot: i64 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(key)
                .query_async(&mut connection)
                .await
                .unwrap();
            slot
        }
    };
    let name = support::unique("slots");
    let (one, other) = (key(&name, "ids"), key(&name, "dead-letters"));
    assert_eq!(slot(one.clone()).await, slot(other.clone()).await);
    // One seed node (a trailing comma) is enough to reach every slot: the
    // connection is a cluster's, which routes each key to the master that
    // holds its slot (a connection to the one node would get `MOVED` for
    // the keys of the other two masters, and fail).
    let seed = format!("{},", url.split(',').next().unwrap());
    let mut from_seed = raw_connection(&seed).await;
    for n in 0..16 {
        let exists: bool = redis::cmd("EXISTS")
            .arg(key(&format!("{name}-{n}"), "ids"))
            .query_async(&mut from_seed)
            .await
            .unwrap();
        assert!(!exists);
    }
    let found: i64 = script
        .key(&one)
        .key(&other)
        .invoke_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(found, 0);

    // Untagged, the two keys of one queue land in two slots.
    let untagged = |part: &str| format!("tower-poison:{name}:{part}");
    let (one, other) = (untagged("ids"), untagged("dead-letters"));
    assert_ne!(slot(one.clone()).await, slot(other.clone()).await);
    let refused = script
        .key(&one)
        .key(&other)
        .invoke_async::<i64>(&mut connection)
        .await
        .unwrap_err();
    assert!(
        refused.to_string().to_uppercase().contains("CROSSSLOT"),
        "{refused}"
    );
}

support::redis_suites! {
    a_full_redis_store_fails_the_call_with_store_full_and_keeps_every_acknowledged_entry,
    redis_max_bytes_counts_encoded_sizes_replacing_without_double_counting,
    redis_claims_are_exclusive_run_on_the_redis_clock_and_end_on_remove_and_release,
    redis_claims_are_ended_only_by_their_own_token,
    item_6_the_redis_store_reports_a_claim_that_lapsed_unreleased,
    redis_store_pages_filters_and_purges_by_age,
    redis_store_replaces_an_entry_in_place_of_adding_one,
    redis_pages_stay_in_id_order_when_the_cursor_entry_is_rewritten_or_removed,
    redis_claim_leases_saturate_for_any_duration,
    redis_scans_page_through_more_than_one_page,
}

/// A new entry id, made now (as the layer makes one for each entry).
fn fresh_id() -> EntryId {
    DeadLetterEntry::new("", FailureKind::ServerError, Vec::new(), SystemTime::now()).id
}
