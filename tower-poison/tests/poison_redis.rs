//! Poison counts shared by a fleet through Redis: two consumers (two
//! connections, as two processes would have) divert a poison message after
//! `max_attempts` deliveries in all, a crashed delivery counts on the other
//! consumer, and keys are hash-tagged, bounded and expire. On the shared
//! server (`single::`) and on a Redis Cluster (`cluster::`, see `support`).

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use sha2::Digest;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_classify::{BoxError, ErrorChainClassifier, FailureKind};
use tower_poison::counts::{FailureCountStore, MessageKey, RedisFailureCounts};
use tower_poison::store::{DeadLetterStore, ListQuery, MemoryStore};
use tower_poison::{describe_fn, DeadLetterLayer, PoisonMessage, PoisonPolicy, RequestRecord};

#[derive(Debug, Clone)]
struct Message {
    id: String,
}

fn describe(message: &Message) -> RequestRecord {
    RequestRecord {
        message_id: Some(message.id.clone()),
        body: Bytes::from_static(b"{\"order\":7}"),
        ..RequestRecord::default()
    }
}

/// Two connections to `url`, keeping the counts of one queue
/// that no other test uses; and the queue's name.
async fn two_consumers_counts(
    url: &str,
    name: &str,
) -> (RedisFailureCounts, RedisFailureCounts, String) {
    let queue = format!("{}-{:08x}", name, fastrand::u32(..));
    let a = RedisFailureCounts::builder()
        .connect(url, &queue)
        .await
        .unwrap();
    let b = RedisFailureCounts::builder()
        .connect(url, &queue)
        .await
        .unwrap();
    (a, b, queue)
}

/// The Redis key of `key`'s count in queue `tag`, as `RedisFailureCounts`
/// documents its layout.
fn count_key(tag: &str, key: &MessageKey) -> String {
    format!("tower-poison:{{{tag}}}:failures:{}", key.as_str())
}

async fn redis(url: &str) -> tower_poison::store::RedisConnection {
    support::raw_connection(url).await.unwrap()
}

async fn deliver<S>(service: &mut S, message: &Message) -> Result<(), BoxError>
where
    S: Service<Message, Response = (), Error = BoxError>,
{
    service.ready().await?.call(message.clone()).await
}

async fn two_consumers_sharing_redis_counts_divert_after_max_attempts_deliveries_in_all(
    url: String,
) {
    let (counts_a, counts_b, queue) = two_consumers_counts(&url, "fleet").await;
    let dead_letters = MemoryStore::new(100);
    let processed = Arc::new(AtomicUsize::new(0));
    let consumer = |counts: RedisFailureCounts| {
        let processed = processed.clone();
        DeadLetterLayer::new(dead_letters.clone())
            .classifier(ErrorChainClassifier::new())
            .capture(describe_fn(describe))
            .poison(PoisonPolicy::new(3).unwrap())
            .count_store(counts)
            .layer(service_fn(move |_m: Message| {
                let processed = processed.clone();
                async move {
                    processed.fetch_add(1, Ordering::SeqCst);
                    Err::<(), _>(std::io::Error::other("payload fails validation downstream"))
                }
            }))
    };
    let mut a = consumer(counts_a);
    let mut b = consumer(counts_b);
    let poison = Message { id: "m-1".into() };

    // Deliveries alternate A, B, A: each fails and goes back to the queue.
    for delivery in 1..=3 {
        let consumer = if delivery % 2 == 1 { &mut a } else { &mut b };
        let error = deliver(consumer, &poison).await.unwrap_err();
        assert!(error.is::<std::io::Error>(), "delivery {delivery}: {error}");
    }
    assert_eq!(processed.load(Ordering::SeqCst), 3);
    let key = count_key(&queue, &MessageKey::new("m-1"));
    let (n, pttl): (u32, i64) = redis::pipe()
        .hget(&key, "n")
        .cmd("PTTL")
        .arg(&key)
        .query_async(&mut redis(&url).await)
        .await
        .unwrap();
    assert_eq!(n, 3, "one count for the fleet");
    // At most the default TTL, 14 days.
    assert!(pttl > 0 && pttl as u64 <= 14 * 24 * 3_600 * 1_000, "{pttl}");

    // The fourth delivery — B's second — is diverted: 3 in all, not 6.
    let error = deliver(&mut b, &poison).await.unwrap_err();
    let diverted = error.downcast_ref::<PoisonMessage>().expect("diverted");
    assert_eq!(diverted.attempts(), 3);
    assert_eq!(processed.load(Ordering::SeqCst), 3, "not processed again");
    let entries = dead_letters
        .list(ListQuery::default())
        .await
        .unwrap()
        .entries;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].kind, FailureKind::Poison);
    assert_eq!(entries[0].attempts, 3);
    // Dead-lettered: the fleet's count is gone.
    let exists: bool = redis::cmd("EXISTS")
        .arg(&key)
        .query_async(&mut redis(&url).await)
        .await
        .unwrap();
    assert!(!exists);
}

async fn a_delivery_that_crashed_on_one_consumer_counts_on_the_other(url: String) {
    let (counts_a, counts_b, _) = two_consumers_counts(&url, "crash").await;
    let (started, mut began) = tokio::sync::mpsc::unbounded_channel();
    let consumer = |counts: RedisFailureCounts, started: tokio::sync::mpsc::UnboundedSender<()>| {
        DeadLetterLayer::new(MemoryStore::new(10))
            .classifier(ErrorChainClassifier::new())
            .capture(describe_fn(describe))
            .poison(PoisonPolicy::new(1).unwrap())
            .count_store(counts)
            .layer(service_fn(move |_m: Message| {
                let started = started.clone();
                async move {
                    let _ = started.send(());
                    // The worker hangs, then dies.
                    std::future::pending::<Result<(), std::io::Error>>().await
                }
            }))
    };
    let m = Message {
        id: "m-kills-workers".into(),
    };
    let task = tokio::spawn(consumer(counts_a, started.clone()).oneshot(m.clone()));
    began.recv().await.unwrap();
    task.abort();
    let _ = task.await;

    let error = consumer(counts_b, started).oneshot(m).await.unwrap_err();
    let diverted = error.downcast_ref::<PoisonMessage>().expect("diverted");
    assert_eq!(diverted.attempts(), 1);
    assert!(began.try_recv().is_err(), "B never processed it");
}

async fn redis_keys_are_hash_tagged_and_bounded_and_expire(url: String) {
    let counts = RedisFailureCounts::builder()
        .ttl(Duration::from_secs(30))
        .unwrap()
        .connect(&url, "orders{eu}:v1")
        .await
        .unwrap();
    let huge = MessageKey::new(&"\u{0}x".repeat(1 << 19));
    // A queue name with braces or colons is tagged by its SHA-256.
    let digest = sha2::Sha256::digest(b"orders{eu}:v1");
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let key = count_key(&format!("sha256:{hex}"), &huge);
    // A message key is at most 131 bytes (`MessageKey`'s docs).
    assert!(key.len() <= 64 + 131, "{} bytes", key.len());
    // One hash tag, whatever the queue name holds.
    let open = key.find('{').unwrap();
    let close = key[open..].find('}').unwrap() + open;
    assert_eq!(key.matches('{').count(), 1, "{key}");
    assert!(key[close + 1..].starts_with(":failures:sha256:"), "{key}");

    let now = SystemTime::now();
    let tally = counts.count_delivery(&huge, now).await.unwrap();
    assert_eq!(tally.deliveries, 1);
    let later = now + Duration::from_secs(9);
    let tally = counts.count_delivery(&huge, later).await.unwrap();
    assert_eq!(tally.deliveries, 2);
    let first_ms = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let kept_ms = tally
        .first_delivered_at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    assert_eq!(kept_ms, first_ms, "the first delivery's time is kept");
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut redis(&url).await)
        .await
        .unwrap();
    assert!(pttl > 0 && pttl <= 30_000, "{pttl}");
    counts.forget(&huge).await.unwrap();
    let exists: bool = redis::cmd("EXISTS")
        .arg(&key)
        .query_async(&mut redis(&url).await)
        .await
        .unwrap();
    assert!(!exists);

    // The longest TTL saturates rather than overflowing Redis's expiry.
    let forever = RedisFailureCounts::builder()
        .ttl(Duration::MAX)
        .unwrap()
        .connect(&url, "forever")
        .await
        .unwrap();
    let id = MessageKey::new(&format!("m-{:016x}", fastrand::u64(..)));
    forever.count_delivery(&id, now).await.unwrap();
    forever.forget(&id).await.unwrap();
}

#[tokio::test]
async fn while_redis_is_down_a_delivery_fails_unprocessed() {
    let Some(binary) = support::redis_server_binary() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut server = support::RedisProcess::start(&binary, dir.path(), support::free_port());
    let counts = RedisFailureCounts::builder()
        .connect(&server.url(), "down")
        .await
        .unwrap();
    let processed = Arc::new(AtomicUsize::new(0));
    let inner = processed.clone();
    let dead_letters = MemoryStore::new(10);
    let service = DeadLetterLayer::new(dead_letters.clone())
        .classifier(ErrorChainClassifier::new())
        .capture(describe_fn(describe))
        .poison(PoisonPolicy::new(3).unwrap())
        .count_store(counts)
        .layer(service_fn(move |_m: Message| {
            let inner = inner.clone();
            async move {
                inner.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(())
            }
        }));
    server.kill();
    let error = service
        .oneshot(Message { id: "m-9".into() })
        .await
        .unwrap_err();
    assert!(error.is::<tower_poison::CountStoreFailed>(), "{error}");
    // Not processed (the inner future was never polled), not stored: the
    // consumer does not acknowledge the message, and the queue redelivers it.
    assert_eq!(processed.load(Ordering::SeqCst), 0);
    assert_eq!(dead_letters.depth().await.unwrap(), 0);
}

support::redis_suites! {
    redis_keys_are_hash_tagged_and_bounded_and_expire,
    two_consumers_sharing_redis_counts_divert_after_max_attempts_deliveries_in_all,
    a_delivery_that_crashed_on_one_consumer_counts_on_the_other,
}
