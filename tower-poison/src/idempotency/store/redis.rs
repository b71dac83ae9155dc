//! The idempotency store for fleets of nodes, on Redis.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{RedisError, Script};

use super::{Claim, ClaimToken, IdempotencyStore, Record, StoredResponse};
use crate::store::redis::{redact_url, RedisConnectOptions};
use crate::store::StoreError;

/// An idempotency store every node of a fleet shares, on Redis.
///
/// Each key is one Redis string, `PREFIX` + the (scoped) idempotency key,
/// holding a small JSON record:
///
/// - **claim**: `SET key {in flight, owner token, fingerprint} NX PX
///   in_flight_ttl`, in a script that returns the existing record when the
///   key is taken, so a claim is one round trip and two nodes can never both
///   hold a key;
/// - **complete**: a Lua script replaces the record with the response and
///   sets its TTL (`PX ttl`, 24 h by default) *only if* the key still holds
///   this caller's in-flight record: a claim that lapsed and was taken over
///   by another node is not overwritten;
/// - **release**: a Lua script deletes the key, again only for its owner.
///
/// Every key expires: an in-flight claim after the in-flight TTL (its node
/// crashed), a completed one after the TTL. Nothing needs sweeping.
///
/// ```no_run
/// # async fn example() -> Result<(), tower_poison::store::StoreError> {
/// use tower_poison::idempotency::store::RedisIdempotencyStore;
/// use tower_poison::idempotency::IdempotencyGuardLayer;
///
/// let store = RedisIdempotencyStore::connect("redis://127.0.0.1:6379", "orders:idem:").await?;
/// let guard = IdempotencyGuardLayer::new(store);
/// # let _ = guard;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisIdempotencyStore {
    connection: ConnectionManager,
    shared: Arc<Shared>,
}

struct Shared {
    prefix: String,
    url: String,
}

/// Configures and connects a [`RedisIdempotencyStore`].
#[derive(Debug, Clone, Default)]
pub struct RedisIdempotencyStoreBuilder {
    options: RedisConnectOptions,
}

impl RedisIdempotencyStoreBuilder {
    /// Default connection options.
    pub const fn new() -> Self {
        RedisIdempotencyStoreBuilder {
            options: RedisConnectOptions::new(),
        }
    }

    /// How to connect (timeouts, reconnection).
    pub const fn options(mut self, options: RedisConnectOptions) -> Self {
        self.options = options;
        self
    }

    /// Connects to `url`; every key is stored under `prefix`.
    pub async fn connect(
        self,
        url: &str,
        prefix: impl Into<String>,
    ) -> Result<RedisIdempotencyStore, StoreError> {
        let connection = self.options.connect(url).await?;
        Ok(RedisIdempotencyStore {
            connection,
            shared: Arc::new(Shared {
                prefix: prefix.into(),
                url: redact_url(url),
            }),
        })
    }
}

/// KEYS = key; ARGV = in-flight record, in-flight TTL (ms). Returns nil when
/// claimed, else the record already there.
const CLAIM: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return false end
return redis.call('GET', KEYS[1])
";

/// KEYS = key; ARGV = the owner's in-flight record, completed record, TTL
/// (ms). Returns 1 when stored.
const COMPLETE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
";

/// KEYS = key; ARGV = the owner's in-flight record. Returns 1 when released.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

static CLAIM_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(CLAIM));
static COMPLETE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(COMPLETE));
static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE));

impl RedisIdempotencyStore {
    /// Connects to `url` (`redis://host:port/db`) with the default options;
    /// every key is stored under `prefix` (such as `"orders:idem:"`).
    pub async fn connect(url: &str, prefix: impl Into<String>) -> Result<Self, StoreError> {
        RedisIdempotencyStoreBuilder::new()
            .connect(url, prefix)
            .await
    }

    /// A builder for other settings.
    pub const fn builder() -> RedisIdempotencyStoreBuilder {
        RedisIdempotencyStoreBuilder::new()
    }

    /// The prefix of every key.
    pub fn prefix(&self) -> &str {
        &self.shared.prefix
    }

    fn redis_key(&self, key: &str) -> String {
        format!("{}{key}", self.shared.prefix)
    }

    fn failed(&self, what: &str, error: RedisError) -> StoreError {
        StoreError::backend(
            format!(
                "redis idempotency store at {} failed to {what}",
                self.shared.url
            ),
            error,
        )
    }
}

fn encode(record: &Record) -> Vec<u8> {
    // Plain data with string keys always serializes.
    serde_json::to_vec(record).expect("an idempotency record serializes")
}

fn millis(duration: Duration) -> u64 {
    // PX 0 is an error in Redis; a zero TTL means "expire at once".
    (duration.as_millis() as u64).max(1)
}

impl IdempotencyStore for RedisIdempotencyStore {
    async fn claim(
        &self,
        key: &str,
        fingerprint: &str,
        in_flight_ttl: Duration,
    ) -> Result<Claim, StoreError> {
        let claim = ClaimToken::new(fingerprint);
        let existing: Option<Vec<u8>> = CLAIM_SCRIPT
            .key(self.redis_key(key))
            .arg(encode(&Record::in_flight(&claim)))
            .arg(millis(in_flight_ttl))
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.failed("claim a key", e))?;
        match existing {
            None => Ok(Claim::Acquired(claim)),
            Some(bytes) => serde_json::from_slice::<Record>(&bytes)
                .map(Record::into_claim)
                .map_err(|e| {
                    StoreError::corrupt(
                        format!("cannot decode the idempotency record of key {key:?}"),
                        e,
                    )
                }),
        }
    }

    async fn complete(
        &self,
        key: &str,
        claim: &ClaimToken,
        response: StoredResponse,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let completed = Record::Completed {
            fingerprint: claim.fingerprint().to_owned(),
            response,
        };
        let stored: u64 = COMPLETE_SCRIPT
            .key(self.redis_key(key))
            .arg(encode(&Record::in_flight(claim)))
            .arg(encode(&completed))
            .arg(millis(ttl))
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.failed("store a response", e))?;
        Ok(stored == 1)
    }

    async fn release(&self, key: &str, claim: &ClaimToken) -> Result<bool, StoreError> {
        let released: u64 = RELEASE_SCRIPT
            .key(self.redis_key(key))
            .arg(encode(&Record::in_flight(claim)))
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.failed("release a key", e))?;
        Ok(released == 1)
    }
}

impl fmt::Debug for RedisIdempotencyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisIdempotencyStore")
            .field("url", &self.shared.url)
            .field("prefix", &self.shared.prefix)
            .finish_non_exhaustive()
    }
}
