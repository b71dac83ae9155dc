//! Delivery counts shared by a fleet of consumers, in Redis.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime};

use redis::{RedisError, Script};
use tower_classify::ConfigError;
use tower_store_support::{redact_url, RedisConnectOptions, RedisConnection};

use super::{sha256_hex, DeliveryTally, FailureCountStore, MessageKey};
use crate::store::{millis_since_epoch, time_from_millis, StoreError};

/// Delivery counts in Redis, shared by every consumer of a queue: a fleet of
/// N consumers diverts a poison message after `max_attempts` deliveries in
/// total, not N × `max_attempts`.
///
/// # Layout
///
/// One hash per message, `tower-poison:{<queue>}:failures:<key>`, with the
/// fields `n` (deliveries) and `first` (ms since the epoch). `<key>` is the
/// [`MessageKey`]; `<queue>` is the queue name given at connect when it is at
/// most 64 bytes of printable ASCII without braces or colons, else its
/// SHA-256. The braces make it a hash tag: on Redis Cluster a queue's counts
/// share one slot. Counting is one Lua script (`HINCRBY`, `HSETNX` of the
/// first time, `PEXPIRE`): one round trip, the increment and its expiry
/// atomic. A success is one `DEL`.
///
/// # Bound
///
/// Every count expires [`ttl`](RedisFailureCountsBuilder::ttl) after the
/// message's latest delivery, so a message that stops arriving is
/// forgotten: the number of keys is bounded by the TTL, not a cap (a flood
/// of distinct failing ids leaves one key each for `ttl`). Keep the counts
/// in a Redis database (or instance) of their own with an eviction policy
/// (`volatile-ttl` evicts the counts nearest expiry), and the dead-letter
/// [`RedisDeadLetterStore`](crate::store::RedisDeadLetterStore) in one with
/// `maxmemory-policy noeviction`: under memory pressure a count may then be
/// forgotten (a message gets more deliveries), but never a dead letter or
/// the store's byte counter.
///
/// # Example
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # use tower_poison::RequestRecord;
/// # struct Message { id: String }
/// # fn describe(m: &Message) -> RequestRecord {
/// #     RequestRecord { message_id: Some(m.id.clone()), ..RequestRecord::default() }
/// # }
/// # let store = tower_poison::store::MemoryStore::new(10_000);
/// use tower_poison::counts::RedisFailureCounts;
/// use tower_poison::{describe_fn, DeadLetterLayer, PoisonPolicy};
///
/// let counts = RedisFailureCounts::builder().connect("redis://redis:6379", "orders").await?;
/// let layer = DeadLetterLayer::new(store)
///     .capture(describe_fn(describe))
///     .poison(PoisonPolicy::new(3)?)
///     .count_store(counts); // every consumer: 3 deliveries in all, not 3 each
/// # drop(layer);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisFailureCounts {
    connection: RedisConnection,
    shared: Arc<Shared>,
}

struct Shared {
    prefix: String,
    ttl_ms: u64,
    url: String,
}

/// Configures and connects a [`RedisFailureCounts`].
#[derive(Debug, Clone)]
pub struct RedisFailureCountsBuilder {
    ttl: Duration,
    options: RedisConnectOptions,
}

impl Default for RedisFailureCountsBuilder {
    fn default() -> Self {
        Self::new()
    }
}

/// The longest TTL sent to Redis: 100 years, far below where
/// `now + ttl` could overflow Redis's 64-bit millisecond expiry.
const MAX_TTL_MS: u64 = 100 * 365 * 24 * 3_600 * 1_000;

/// The longest queue name kept readable in keys.
const MAX_QUEUE_VERBATIM: usize = 64;

impl RedisFailureCountsBuilder {
    /// A TTL of 14 days and the default connection options.
    const fn new() -> Self {
        RedisFailureCountsBuilder {
            ttl: Duration::from_secs(14 * 24 * 3_600),
            options: RedisConnectOptions::new(),
        }
    }

    /// Forgets a message's count `ttl` after its latest delivery (default
    /// 14 days, SQS's longest retention; at least 1 ms; longer than 100
    /// years is treated as 100 years, so Redis's expiry cannot overflow).
    pub fn ttl(mut self, ttl: Duration) -> Result<Self, ConfigError> {
        if ttl.as_millis() == 0 {
            return Err(ConfigError::new(
                "count_store.ttl",
                "must be at least 1 ms (a zero TTL would forget every count at once)",
            ));
        }
        self.ttl = ttl;
        Ok(self)
    }

    /// How to connect (timeouts, reconnection).
    pub fn options(mut self, options: RedisConnectOptions) -> Self {
        self.options = options;
        self
    }

    /// Connects to `url` (one server, or a Redis Cluster's node URLs
    /// comma-separated: see [`RedisConnectOptions`]) and keeps the counts of
    /// queue `queue`.
    pub async fn connect(self, url: &str, queue: &str) -> Result<RedisFailureCounts, StoreError> {
        let connection = self.options.connect(url).await?;
        Ok(RedisFailureCounts {
            connection,
            shared: Arc::new(Shared {
                prefix: format!("tower-poison:{{{}}}:failures:", queue_tag(queue)),
                ttl_ms: ttl_millis(self.ttl),
                url: redact_url(url),
            }),
        })
    }
}

/// `queue` as it may appear inside a hash tag.
fn queue_tag(queue: &str) -> String {
    let verbatim = !queue.is_empty()
        && queue.len() <= MAX_QUEUE_VERBATIM
        && queue
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'{' | b'}' | b':'));
    if verbatim {
        queue.to_owned()
    } else {
        // A verbatim name has no colon, so it never looks like a digest.
        format!("sha256:{}", sha256_hex(queue.as_bytes()))
    }
}

fn ttl_millis(ttl: Duration) -> u64 {
    let millis = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    millis.clamp(1, MAX_TTL_MS)
}

/// KEYS = the count's hash; ARGV = now (ms), TTL (ms). Returns
/// `{deliveries, first}`.
const COUNT: &str = r"
local n = redis.call('HINCRBY', KEYS[1], 'n', 1)
redis.call('HSETNX', KEYS[1], 'first', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {n, redis.call('HGET', KEYS[1], 'first')}
";

static COUNT_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(COUNT));

impl RedisFailureCounts {
    /// A builder: `RedisFailureCounts::builder().connect(url, queue)`
    /// connects with the default settings.
    pub const fn builder() -> RedisFailureCountsBuilder {
        RedisFailureCountsBuilder::new()
    }

    /// The Redis key holding `key`'s count.
    fn redis_key(&self, key: &MessageKey) -> String {
        format!("{}{}", self.shared.prefix, key.as_str())
    }

    fn failed(&self, what: &str, error: RedisError) -> StoreError {
        let url = &self.shared.url;
        StoreError::backend(
            format!("redis delivery counts at {url} failed to {what}"),
            error,
        )
    }
}

impl FailureCountStore for RedisFailureCounts {
    async fn count_delivery(
        &self,
        key: &MessageKey,
        now: SystemTime,
    ) -> Result<DeliveryTally, StoreError> {
        let (deliveries, first): (i64, String) = COUNT_SCRIPT
            .key(self.redis_key(key))
            .arg(millis_since_epoch(now))
            .arg(self.shared.ttl_ms)
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.failed("count a delivery", e))?;
        let first = first.parse::<u64>().map_err(|e| {
            StoreError::corrupt(format!("delivery count {} has a bad time", key.as_str()), e)
        })?;
        let deliveries = u32::try_from(deliveries.max(1)).unwrap_or(u32::MAX);
        Ok(DeliveryTally::new(deliveries, time_from_millis(first)))
    }

    async fn forget(&self, key: &MessageKey) -> Result<(), StoreError> {
        let _: i64 = redis::cmd("DEL")
            .arg(self.redis_key(key))
            .query_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.failed("forget a count", e))?;
        Ok(())
    }
}

impl fmt::Debug for RedisFailureCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisFailureCounts")
            .field("prefix", &self.shared.prefix)
            .field("ttl_ms", &self.shared.ttl_ms)
            .field("url", &self.shared.url)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_saturates_and_zero_is_refused() {
        assert_eq!(ttl_millis(Duration::MAX), MAX_TTL_MS);
        assert_eq!(ttl_millis(Duration::from_secs(2)), 2_000);
        assert_eq!(ttl_millis(Duration::from_micros(10)), 1);
        let err = RedisFailureCountsBuilder::new()
            .ttl(Duration::ZERO)
            .unwrap_err();
        assert_eq!(err.field(), "count_store.ttl");
    }

    #[test]
    fn queue_names_cannot_break_the_hash_tag() {
        assert_eq!(queue_tag("orders"), "orders");
        for hostile in ["a}b", "{x}", "", "with space", "a:b", &"q".repeat(65)] {
            let tag = queue_tag(hostile);
            assert!(!tag.contains(['{', '}']), "{hostile:?} -> {tag}");
            assert!(tag.len() <= 71, "{tag}");
        }
        assert_ne!(queue_tag("a}b"), queue_tag("a{b"));
    }
}
