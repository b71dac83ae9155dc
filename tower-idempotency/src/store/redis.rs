//! The idempotency store for fleets of nodes, on Redis.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::{FromRedisValue, Script, ToRedisArgs};
use tower_store_support::{redact_url, RedisConnectOptions, RedisConnection};

use super::{bounded, Claim, ClaimToken, Completion, IdempotencyStore, NotKept, Record};
use crate::StoreError;

/// An idempotency store every node of a fleet shares, on Redis.
///
/// Each key is one Redis string, named by [`redis_key`](Self::redis_key),
/// holding a small JSON record. Its hash tag spreads the keys over a Redis
/// Cluster's slots (a `{` in the prefix would make *that* the tag, putting
/// every key in one slot).
///
/// A claim is one round trip, `SET key {in flight, owner token,
/// fingerprint} NX PX in_flight_ttl` in a script that returns the record
/// already there, so two nodes can never both hold a key. Completing (the
/// outcome and the final fingerprint, `PX ttl`), extending (`PEXPIRE`) and
/// releasing (`DEL`) go through one Lua script that acts *only if* the key
/// still holds the caller's in-flight record: a claim that lapsed and was
/// taken over by another node is left alone. Every key expires; a record is
/// at most [`max_record_bytes`](RedisIdempotencyStoreBuilder::max_record_bytes).
///
/// ```no_run
/// # async fn example() -> Result<(), tower_idempotency::StoreError> {
/// use tower_idempotency::store::RedisIdempotencyStore;
/// use tower_idempotency::IdempotencyGuardLayer;
///
/// let store = RedisIdempotencyStore::builder()
///     .connect("redis://127.0.0.1:6379", "orders:idem:")
///     .await?;
/// let guard = IdempotencyGuardLayer::new(store);
/// # let _ = guard;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisIdempotencyStore {
    connection: RedisConnection,
    shared: Arc<Shared>,
}

struct Shared {
    prefix: String,
    url: String,
    max_record_bytes: usize,
}

/// Configures and connects a [`RedisIdempotencyStore`].
#[derive(Debug, Clone)]
pub struct RedisIdempotencyStoreBuilder {
    options: RedisConnectOptions,
    max_record_bytes: usize,
}

impl Default for RedisIdempotencyStoreBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl RedisIdempotencyStoreBuilder {
    /// The defaults: the default connection options (1 s to connect, 5 s
    /// for a reply, one reconnection attempt), records up to 2 MiB.
    const fn new() -> Self {
        RedisIdempotencyStoreBuilder {
            options: RedisConnectOptions::new(),
            max_record_bytes: 2 << 20,
        }
    }

    /// How to connect (timeouts, reconnection). The default connection
    /// timeout (1 s) makes a call made while Redis is down get a `503`
    /// instead of hanging.
    pub const fn options(mut self, options: RedisConnectOptions) -> Self {
        self.options = options;
        self
    }

    /// Records larger than `bytes` (default 2 MiB, room for a 1 MiB binary
    /// body in its text form) are not written; the key is completed as
    /// [`NotKept::TooLarge`] instead.
    pub const fn max_record_bytes(mut self, bytes: usize) -> Self {
        self.max_record_bytes = bytes;
        self
    }

    /// Connects to `url` (`redis://host:port/db`, or a Redis Cluster's node URLs
    /// comma-separated: see [`RedisConnectOptions`]), failing if Redis does not
    /// answer now; every key is stored under `prefix`. The connection
    /// reconnects in the background after an outage.
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
                max_record_bytes: self.max_record_bytes,
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

/// KEYS = key; ARGV = the owner's in-flight record (as claimed, with the
/// claim's fingerprint), then a command and its arguments after the key
/// (`SET` of the completed record, `PEXPIRE`, `DEL`). Runs the command and
/// returns 1 only if the key still holds that record.
const OWNER_ONLY: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call(ARGV[2], KEYS[1], unpack(ARGV, 3))
return 1
";

static CLAIM_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(CLAIM));
static OWNER_ONLY_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(OWNER_ONLY));

impl RedisIdempotencyStore {
    /// A builder: its [`connect`](RedisIdempotencyStoreBuilder::connect)
    /// connects with the default options, every key stored under a prefix
    /// (such as `"orders:idem:"`).
    pub const fn builder() -> RedisIdempotencyStoreBuilder {
        RedisIdempotencyStoreBuilder::new()
    }

    /// The Redis key holding the record of `key` (as the guard names it,
    /// namespace included): `PREFIX{TAG}KEY`, where the hash tag `TAG` is 16
    /// hex digits of the key's SHA-256. A tag of the key itself could be cut
    /// short by a `}` in it, piling keys a client chose onto one slot.
    pub fn redis_key(&self, key: &str) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(key.as_bytes());
        let mut redis_key = String::with_capacity(self.shared.prefix.len() + 18 + key.len());
        redis_key.push_str(&self.shared.prefix);
        redis_key.push('{');
        tower_store_support::bytes_text::push_hex(&mut redis_key, &digest[..8]);
        redis_key.push('}');
        redis_key.push_str(key);
        redis_key
    }

    /// Runs `script` on `key`: ARGV[1] is `claim`'s in-flight record, `args`
    /// follow; a failure is reported as failing to do `what`.
    async fn run<T: FromRedisValue>(
        &self,
        script: &Script,
        key: &str,
        claim: &ClaimToken,
        args: impl ToRedisArgs,
        what: &str,
    ) -> Result<T, StoreError> {
        script
            .key(self.redis_key(key))
            .arg(encode(&Record::InFlight(claim.clone())))
            .arg(args)
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(|error| {
                let url = &self.shared.url;
                let message = format!("redis idempotency store at {url} failed to {what}");
                StoreError::backend(message, error)
            })
    }

    /// Runs `command` on `key` only if it still holds `claim`'s in-flight
    /// record; whether it ran.
    async fn owner_only(
        &self,
        key: &str,
        claim: &ClaimToken,
        command: impl ToRedisArgs,
        what: &str,
    ) -> Result<bool, StoreError> {
        let done: u64 = self
            .run(&OWNER_ONLY_SCRIPT, key, claim, command, what)
            .await?;
        Ok(done == 1)
    }
}

fn encode(record: &Record) -> Vec<u8> {
    // Plain data with string keys always serializes.
    serde_json::to_vec(record).expect("an idempotency record serializes")
}

/// Milliseconds for `PX`: at least 1 (`PX 0` is an error in Redis), at most
/// [`MAX_TTL`](super::MAX_TTL), so the expiry never overflows.
fn millis(duration: Duration) -> u64 {
    u64::try_from(bounded(duration).as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

impl IdempotencyStore for RedisIdempotencyStore {
    async fn claim(
        &self,
        key: &str,
        fingerprint: &str,
        in_flight_ttl: Duration,
    ) -> Result<Claim, StoreError> {
        let claim = ClaimToken::new(fingerprint);
        let args = millis(in_flight_ttl);
        let existing: Option<Vec<u8>> = self
            .run(&CLAIM_SCRIPT, key, &claim, args, "claim a key")
            .await?;
        let cap = self.shared.max_record_bytes;
        match existing {
            None => Ok(Claim::Acquired(claim)),
            // Larger than anything this store writes: not ours to decode.
            Some(bytes) if bytes.len() > cap.max(4096) => Err(StoreError::new(
                crate::StoreErrorKind::Corrupt,
                format!(
                    "the idempotency record of key {key:?} is {} bytes, over the {cap}-byte cap",
                    bytes.len()
                ),
            )),
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
        fingerprint: &str,
        completion: Completion,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let mut completed = encode(&Record::completed(fingerprint, completion));
        if completed.len() > self.shared.max_record_bytes {
            tracing::warn!(
                key,
                bytes = completed.len(),
                max_record_bytes = self.shared.max_record_bytes,
                "response too large for the redis idempotency store; recorded as not kept"
            );
            let not_kept = Completion::NotKept(NotKept::TooLarge);
            completed = encode(&Record::completed(fingerprint, not_kept));
        }
        let command = ("SET", completed, "PX", millis(ttl));
        self.owner_only(key, claim, command, "record an outcome")
            .await
    }

    async fn extend(
        &self,
        key: &str,
        claim: &ClaimToken,
        in_flight_ttl: Duration,
    ) -> Result<bool, StoreError> {
        let command = ("PEXPIRE", millis(in_flight_ttl));
        self.owner_only(key, claim, command, "extend a claim").await
    }

    async fn release(&self, key: &str, claim: &ClaimToken) -> Result<bool, StoreError> {
        self.owner_only(key, claim, "DEL", "release a key").await
    }
}

impl fmt::Debug for RedisIdempotencyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisIdempotencyStore")
            .field("url", &self.shared.url)
            .field("prefix", &self.shared.prefix)
            .field("max_record_bytes", &self.shared.max_record_bytes)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_milliseconds_never_overflow_or_reach_zero() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
        assert_eq!(
            millis(Duration::MAX),
            super::super::MAX_TTL.as_millis() as u64
        );
    }
}
