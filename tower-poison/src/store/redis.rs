//! The dead-letter store for fleets of nodes: one Redis queue they share.

use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime};

use redis::{RedisError, Script};
use tower_store_support::{redact_url, RedisConnectOptions, RedisConnection};

use super::{
    decode, fill_page, millis_since_epoch, saturating_millis, time_from_millis, Claim, ClaimToken,
    DeadLetterStore, ListQuery, Page, PrefixMatches, PurgeFilter, StoreError, StoreErrorKind,
    MAX_MILLIS,
};
use crate::entry::{DeadLetterEntry, EntryId, EntryIdPrefix};

/// The dead-letter store for a fleet: one Redis queue shared by every node,
/// read by the operator CLI (`tower-poison-cli`: `tower-poison --store
/// redis://host:6379 --stream NAME …`).
///
/// # Layout
///
/// A queue named `NAME` (the `stream` argument of
/// [`connect`](RedisDeadLetterStoreBuilder::connect)) lives in these keys, all with the hash tag
/// `{NAME}` so that on Redis Cluster they share one slot and every script
/// below runs on one node (no `CROSSSLOT`):
///
/// | key | type | holds |
/// |---|---|---|
/// | `tower-poison:{NAME}:dead-letters` | hash | each [`EntryId`] (32 hex digits) → the entry's JSON; `get` is `HGET`, `depth` is `HLEN` |
/// | `tower-poison:{NAME}:ids` | sorted set | every entry id, all with score 0, so they sort by their text: fixed-width hex, hence id (creation) order; `list` and the scans page with `ZRANGEBYLEX` |
/// | `tower-poison:{NAME}:dead-letter-bytes` | string | the total size of the stored JSON, for [`max_bytes`](RedisDeadLetterStoreBuilder::max_bytes) |
/// | `tower-poison:{NAME}:label-depths` | hash | each label → how many entries it has, for the layer's `tower_poison_dlq_depth{label}` gauge; a label leaves with its last entry |
/// | `tower-poison:{NAME}:claim:<id>` | string | a [claim](DeadLetterStore::claim) on entry `<id>`: its [token](crate::store::ClaimToken), expiring with the lease (`PX`) |
/// | `tower-poison:{NAME}:unreleased-claims` | hash | each entry id → the token of its latest claim, until that claim is released or the entry removed: a claim key gone while its token is still here lapsed unreleased |
///
/// A name must not be empty or start with `}` (the hash tag would be
/// empty); [`connect`](RedisDeadLetterStoreBuilder::connect) refuses it.
///
/// Every write is one Lua script, so the entries, their ids, the byte and
/// label counts and the claims never disagree, and nodes writing at once
/// cannot overshoot a [limit](RedisDeadLetterStoreBuilder::max_entries). A
/// replaced entry keeps its place in the ids, so a page cursor stays valid.
/// `purge` and `stats` walk the ids a page at a time. Queues of earlier
/// layouts are not read: drain them with the version that wrote them.
///
/// # Durability
///
/// `put` returns once Redis has applied the write: with `appendonly yes`
/// and `appendfsync always` an acknowledged entry survives a Redis crash
/// (with `everysec`, up to a second of entries can be lost). A write Redis
/// does not acknowledge fails with [`StoreFailed`](crate::StoreFailed)
/// while the connection reconnects in the background (see
/// [`RedisConnectOptions`](crate::store::RedisConnectOptions)); no message
/// shows a URL's password. Give the queue a database with
/// `maxmemory-policy noeviction`.
///
/// # Claims
///
/// A claim takes the claim key with `SET … NX PX <lease>`, so the lease runs
/// on Redis's clock; [`Held::until`](crate::Claim::Held) is the caller's
/// `now` plus the key's `PTTL`. A token left in `unreleased-claims` with no
/// claim key marks a claim that lapsed unreleased.
///
/// ```no_run
/// # async fn example() -> Result<(), tower_poison::store::StoreError> {
/// use tower_poison::store::RedisDeadLetterStore;
/// use tower_poison::DeadLetterLayer;
///
/// let store = RedisDeadLetterStore::builder().connect("redis://127.0.0.1:6379", "orders:dlq").await?;
/// let layer = DeadLetterLayer::new(store).label("orders");
/// # let _ = layer;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisDeadLetterStore {
    connection: RedisConnection,
    shared: Arc<Shared>,
}

struct Shared {
    keys: Keys,
    url: String,
    max_entries: u64,
    max_bytes: u64,
}

/// The keys of one queue (see the layout above).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Keys {
    name: String,
    entries: String,
    ids: String,
    bytes: String,
    labels: String,
    unreleased_claims: String,
    claim_prefix: String,
}

impl Keys {
    fn new(name: String) -> Result<Self, StoreError> {
        if name.is_empty() || name.starts_with('}') {
            let invalid = format!(
                "invalid redis dead-letter queue name {name:?}: it must not be empty \
                 or start with `}}` (it is the keys' hash tag)"
            );
            return Err(StoreError::new(StoreErrorKind::Backend, invalid));
        }
        let base = format!("tower-poison:{{{name}}}:");
        Ok(Keys {
            entries: format!("{base}dead-letters"),
            ids: format!("{base}ids"),
            bytes: format!("{base}dead-letter-bytes"),
            labels: format!("{base}label-depths"),
            unreleased_claims: format!("{base}unreleased-claims"),
            claim_prefix: format!("{base}claim:"),
            name,
        })
    }

    fn claim(&self, id: EntryId) -> String {
        format!("{}{id}", self.claim_prefix)
    }
}

/// Configures and connects a [`RedisDeadLetterStore`].
#[derive(Debug, Clone)]
pub struct RedisDeadLetterStoreBuilder {
    max_entries: u64,
    max_bytes: u64,
    options: RedisConnectOptions,
}

impl Default for RedisDeadLetterStoreBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl RedisDeadLetterStoreBuilder {
    /// The defaults: at most 100,000 entries and 256 MiB, default
    /// connection options.
    const fn new() -> Self {
        RedisDeadLetterStoreBuilder {
            max_entries: 100_000,
            max_bytes: 256 << 20,
            options: RedisConnectOptions::new(),
        }
    }

    /// Holds at most `max_entries` entries (default 100,000, as for the redb
    /// store); a `put` of a new id past it fails with
    /// [`StoreErrorKind::Full`].
    pub const fn max_entries(mut self, max_entries: u64) -> Self {
        self.max_entries = max_entries;
        self
    }

    /// Holds at most `max_bytes` of encoded entries (default 256 MiB, less
    /// than redb's because Redis keeps it all in memory: the whole default
    /// entry count at about 2.5 KiB an entry, or 4,000 full 64 KiB bodies);
    /// a `put` that would pass it fails with [`StoreErrorKind::Full`].
    pub const fn max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// How to connect (timeouts, reconnection).
    pub const fn options(mut self, options: RedisConnectOptions) -> Self {
        self.options = options;
        self
    }

    /// Connects to `url` and uses the queue `stream` (see the key layout on
    /// [`RedisDeadLetterStore`]).
    pub async fn connect(
        self,
        url: &str,
        stream: impl Into<String>,
    ) -> Result<RedisDeadLetterStore, StoreError> {
        let keys = Keys::new(stream.into())?;
        let connection = self.options.connect(url).await?;
        Ok(RedisDeadLetterStore {
            connection,
            shared: Arc::new(Shared {
                keys,
                url: redact_url(url),
                max_entries: self.max_entries,
                max_bytes: self.max_bytes,
            }),
        })
    }
}

/// Adds or replaces an entry within the limits: KEYS = entries, ids, bytes,
/// label depths; ARGV = id, entry JSON, max entries, max bytes, the entry's
/// label. Returns `{0, label depth}` when stored, `{1, depth}` when refused
/// for the entry count, `{2, depth}` for the bytes. Idempotent, so a
/// retried `put` is safe.
const PUT: &str = r"
local exists = redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1
local old_size = redis.call('HSTRLEN', KEYS[1], ARGV[1])
local depth = redis.call('HLEN', KEYS[1])
if not exists and depth + 1 > tonumber(ARGV[3]) then return {1, depth} end
local bytes = tonumber(redis.call('GET', KEYS[3]) or '0')
local size = string.len(ARGV[2])
if size > old_size and bytes - old_size + size > tonumber(ARGV[4]) then return {2, depth} end
local old_label = nil
if exists then old_label = cjson.decode(redis.call('HGET', KEYS[1], ARGV[1]))['label'] end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], 0, ARGV[1])
redis.call('INCRBY', KEYS[3], size - old_size)
if old_label == ARGV[5] then
  return {0, tonumber(redis.call('HGET', KEYS[4], ARGV[5]) or '0')}
end
if old_label and redis.call('HINCRBY', KEYS[4], old_label, -1) <= 0 then
  redis.call('HDEL', KEYS[4], old_label)
end
return {0, redis.call('HINCRBY', KEYS[4], ARGV[5], 1)}
";

/// Removes entries by id, with their claims: KEYS = entries, ids, bytes,
/// label depths, unreleased claims, then the claim key of each entry; ARGV =
/// for each entry its id and the JSON it must still have, or `''` for any
/// (purge: do not remove an entry that was replaced since it was read).
/// Returns how many were removed.
const REMOVE: &str = r"
local removed = 0
for i = 1, #ARGV, 2 do
  local json = redis.call('HGET', KEYS[1], ARGV[i])
  if json and (ARGV[i + 1] == '' or ARGV[i + 1] == json) then
    local label = cjson.decode(json)['label']
    if label and redis.call('HINCRBY', KEYS[4], label, -1) <= 0 then
      redis.call('HDEL', KEYS[4], label)
    end
    redis.call('DECRBY', KEYS[3], string.len(json))
    redis.call('HDEL', KEYS[1], ARGV[i])
    redis.call('ZREM', KEYS[2], ARGV[i])
    redis.call('HDEL', KEYS[5], ARGV[i])
    redis.call('DEL', KEYS[5 + (i + 1) / 2])
    removed = removed + 1
  end
end
return removed
";

/// Claims an entry: KEYS = entries, the entry's claim, unreleased claims;
/// ARGV = id, the new claim's token, the lease in milliseconds (a zero lease
/// takes no key). Returns `{'claimed', entry JSON[, 'lapsed']}`, `{'held',
/// milliseconds left}` (`-1`: no expiry) or `{'missing'}`; the milliseconds
/// as text, since Lua's `tostring` writes long numbers with an exponent.
const CLAIM: &str = r"
local json = redis.call('HGET', KEYS[1], ARGV[1])
if not json then return {'missing'} end
if tonumber(ARGV[3]) > 0 then
  if not redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3]) then
    return {'held', string.format('%.0f', redis.call('PTTL', KEYS[2]))}
  end
else
  local left = redis.call('PTTL', KEYS[2])
  if left ~= -2 then return {'held', string.format('%.0f', left)} end
end
local lapsed = redis.call('HSET', KEYS[3], ARGV[1], ARGV[2]) == 0
if lapsed then return {'claimed', json, 'lapsed'} end
return {'claimed', json}
";

/// Ends a claim if `token` still holds it, in the unreleased claims too
/// (even once its key expired): KEYS = the claim, unreleased claims; ARGV =
/// token, id. Returns 1 when it ended it.
const RELEASE: &str = r"
local released = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then released = redis.call('DEL', KEYS[1]) end
if redis.call('HGET', KEYS[2], ARGV[2]) == ARGV[1] then
  released = redis.call('HDEL', KEYS[2], ARGV[2])
end
return released
";

static PUT_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(PUT));
static REMOVE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(REMOVE));
static CLAIM_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(CLAIM));
static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE));

/// How many ids one `ZRANGEBYLEX` of a purge reads.
const SCAN_PAGE: usize = 512;

/// The most ids one `ZRANGEBYLEX` of a `list` reads.
const LIST_BATCH: usize = 1000;

impl RedisDeadLetterStore {
    /// A builder: `RedisDeadLetterStore::builder().connect(url, stream)`
    /// connects with the default settings.
    pub const fn builder() -> RedisDeadLetterStoreBuilder {
        RedisDeadLetterStoreBuilder::new()
    }

    /// How messages name the store.
    fn name(&self) -> String {
        let Shared { keys, url, .. } = &*self.shared;
        format!("redis dead-letter store {} at {url}", keys.name)
    }

    fn failed(&self, what: &str, error: RedisError) -> StoreError {
        StoreError::backend(format!("{} failed to {what}", self.name()), error)
    }

    fn full(&self, what: String) -> StoreError {
        let full = format!("{} is full: {what}", self.name());
        StoreError::new(StoreErrorKind::Full, full)
    }

    /// Runs `cmd`; a failure says it failed to `what`.
    async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        what: &str,
    ) -> Result<T, StoreError> {
        let result = cmd.query_async(&mut self.connection.clone()).await;
        result.map_err(|e| self.failed(what, e))
    }

    /// The JSON of up to `count` entries after id `after` (from the first
    /// when `None`), in id order, one removed between the two reads left
    /// out; `after` moves to the last id read, and `true` says none are left.
    async fn scan(
        &self,
        after: &mut Option<String>,
        count: usize,
    ) -> Result<(Vec<Vec<u8>>, bool), StoreError> {
        let min = after
            .as_ref()
            .map_or_else(|| "-".to_owned(), |a| format!("({a}"));
        let mut cmd = redis::cmd("ZRANGEBYLEX");
        cmd.arg(&self.shared.keys.ids).arg(min).arg("+");
        let ids: Vec<String> = self
            .query(cmd.arg("LIMIT").arg(0).arg(count), "read the entry ids")
            .await?;
        let exhausted = ids.len() < count;
        let Some(last) = ids.last().cloned() else {
            return Ok((Vec::new(), exhausted));
        };
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(&self.shared.keys.entries).arg(&ids);
        let found: Vec<Option<Vec<u8>>> = self.query(&cmd, "read entries").await?;
        *after = Some(last);
        Ok((found.into_iter().flatten().collect(), exhausted))
    }

    /// Removes `entries` (id, and the JSON each must still have, or empty
    /// for any) with their claims in one script; returns how many went.
    async fn remove_all(&self, entries: &[(EntryId, &[u8])]) -> Result<u64, StoreError> {
        let keys = &self.shared.keys;
        let mut invocation = REMOVE_SCRIPT.prepare_invoke();
        invocation
            .key(&keys.entries)
            .key(&keys.ids)
            .key(&keys.bytes)
            .key(&keys.labels)
            .key(&keys.unreleased_claims);
        for (id, json) in entries {
            let claim = keys.claim(*id);
            invocation.key(claim).arg(id.to_string()).arg(*json);
        }
        invocation
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.failed("remove entries", e))
    }
}

fn corrupt(message: impl Into<String>) -> StoreError {
    StoreError::new(StoreErrorKind::Corrupt, message)
}

impl DeadLetterStore for RedisDeadLetterStore {
    async fn put(&self, entry: DeadLetterEntry) -> Result<(), StoreError> {
        self.put_with_depth(entry).await.map(drop)
    }

    async fn put_with_depth(&self, entry: DeadLetterEntry) -> Result<Option<u64>, StoreError> {
        let keys = &self.shared.keys;
        let (refused, depth): (u8, u64) = PUT_SCRIPT
            .key(&keys.entries)
            .key(&keys.ids)
            .key(&keys.bytes)
            .key(&keys.labels)
            .arg(entry.id.to_string())
            .arg(entry.to_bytes())
            .arg(self.shared.max_entries)
            .arg(self.shared.max_bytes)
            .arg(&entry.label)
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.failed(&format!("keep entry {}", entry.id), e))?;
        match refused {
            0 => Ok(Some(depth)),
            1 => Err(self.full(format!("max_entries {} reached", self.shared.max_entries))),
            _ => Err(self.full(format!(
                "entry {} would pass max_bytes {}",
                entry.id, self.shared.max_bytes
            ))),
        }
    }

    async fn get(&self, id: EntryId) -> Result<Option<DeadLetterEntry>, StoreError> {
        let mut cmd = redis::cmd("HGET");
        cmd.arg(&self.shared.keys.entries).arg(id.to_string());
        let json: Option<Vec<u8>> = self.query(&cmd, &format!("read entry {id}")).await?;
        json.as_deref().map(decode).transpose()
    }

    async fn list(&self, query: ListQuery) -> Result<Page, StoreError> {
        // One id past the page, so a full page knows whether more follow.
        let batch = query.limit.max(1).saturating_add(1).min(LIST_BATCH);
        let mut after = query.after.map(|id| id.to_string());
        let mut page = Vec::new();
        loop {
            let (found, exhausted) = self.scan(&mut after, batch).await?;
            let found = found.into_iter().map(|json| decode(&json).map(Cow::Owned));
            if let Some(full) = fill_page(&query, &mut page, found)? {
                return Ok(full);
            }
            if exhausted {
                return Ok(Page::new(page, None));
            }
        }
    }

    async fn match_prefix(
        &self,
        prefix: EntryIdPrefix,
        limit: usize,
    ) -> Result<PrefixMatches, StoreError> {
        // Ids are lowercase hex of one width, so those starting with the
        // prefix are the members from `prefix` up to (not including)
        // `prefix` followed by `g`, the first byte after `f`.
        let min = format!("[{prefix}");
        let max = format!("({prefix}g");
        let ids = &self.shared.keys.ids;
        let (count, found): (u64, Vec<String>) = redis::pipe()
            .cmd("ZLEXCOUNT")
            .arg(ids)
            .arg(&min)
            .arg(&max)
            .cmd("ZRANGEBYLEX")
            .arg(ids)
            .arg(&min)
            .arg(&max)
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.failed("find ids by prefix", e))?;
        let parse = |id: &String| id.parse::<EntryId>();
        let ids = found.iter().map(parse).collect::<Result<Vec<_>, _>>();
        let ids = ids.map_err(|e| StoreError::corrupt("a stored entry id is not an id", e))?;
        Ok(PrefixMatches { count, ids })
    }

    async fn remove(&self, id: EntryId) -> Result<bool, StoreError> {
        Ok(self.remove_all(&[(id, b"")]).await? > 0)
    }

    async fn purge(&self, filter: PurgeFilter) -> Result<u64, StoreError> {
        let (mut removed, mut after) = (0, None);
        loop {
            let (found, exhausted) = self.scan(&mut after, SCAN_PAGE).await?;
            let mut matching: Vec<(EntryId, &[u8])> = Vec::new();
            for json in &found {
                let entry = decode(json)?;
                if filter.matches(&entry) {
                    // Only an entry unchanged since it was read goes, unless
                    // everything goes.
                    let all = filter.failed_before.is_none();
                    let guard: &[u8] = if all { b"" } else { json };
                    matching.push((entry.id, guard));
                }
            }
            if !matching.is_empty() {
                removed += self.remove_all(&matching).await?;
            }
            if exhausted {
                return Ok(removed);
            }
        }
    }

    async fn claim(
        &self,
        id: EntryId,
        now: SystemTime,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let keys = &self.shared.keys;
        let token = ClaimToken::generate();
        let reply: Vec<Vec<u8>> = CLAIM_SCRIPT
            .key(&keys.entries)
            .key(keys.claim(id))
            .key(&keys.unreleased_claims)
            .arg(id.to_string())
            .arg(token_text(token))
            .arg(saturating_millis(lease))
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.failed(&format!("claim entry {id}"), e))?;
        match reply.as_slice() {
            [status, json, lapsed @ ..] if status == b"claimed" => Ok(Claim::Claimed {
                entry: decode(json)?,
                token,
                previous_claim_lapsed: lapsed == [b"lapsed"],
            }),
            [status, left] if status == b"held" => {
                let left = std::str::from_utf8(left)
                    .ok()
                    .and_then(|left| left.parse::<i64>().ok())
                    .ok_or_else(|| corrupt(format!("the claim on entry {id} has no lease")))?;
                // `-1`: a key without expiry, which only a hand-made key
                // can be; it holds until someone deletes it.
                let left = u64::try_from(left).unwrap_or(MAX_MILLIS);
                Ok(Claim::Held {
                    until: time_from_millis(millis_since_epoch(now).saturating_add(left)),
                })
            }
            _ => Ok(Claim::NotFound),
        }
    }

    async fn release(&self, id: EntryId, token: ClaimToken) -> Result<(), StoreError> {
        let keys = &self.shared.keys;
        let _released: u8 = RELEASE_SCRIPT
            .key(keys.claim(id))
            .key(&keys.unreleased_claims)
            .arg(token_text(token))
            .arg(id.to_string())
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.failed(&format!("release entry {id}"), e))?;
        Ok(())
    }

    async fn depth(&self) -> Result<u64, StoreError> {
        let mut cmd = redis::cmd("HLEN");
        self.query(cmd.arg(&self.shared.keys.entries), "count the entries")
            .await
    }
}

/// A claim token as the claim key holds it: 32 hex digits.
fn token_text(token: ClaimToken) -> String {
    format!("{:032x}", token.as_u128())
}

impl fmt::Debug for RedisDeadLetterStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisDeadLetterStore")
            .field("url", &self.shared.url)
            .field("stream", &self.shared.keys.name)
            .field("max_entries", &self.shared.max_entries)
            .field("max_bytes", &self.shared.max_bytes)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The part of `key` Redis Cluster hashes to pick its slot: the text
    /// between the first `{` and the first `}` after it, when not empty;
    /// otherwise the whole key.
    fn hash_tag(key: &str) -> &str {
        if let Some(open) = key.find('{') {
            if let Some(close) = key[open + 1..].find('}') {
                if close > 0 {
                    return &key[open + 1..open + 1 + close];
                }
            }
        }
        key
    }

    #[test]
    fn every_key_of_a_queue_shares_one_hash_tag() {
        for name in ["orders:dlq", "a}b", "{x}", "with space", "{", "x{y}z"] {
            let keys = Keys::new(name.to_owned()).unwrap();
            let claim = keys.claim(EntryId::from_u128(42));
            let tag = hash_tag(&keys.entries);
            assert_ne!(tag, keys.entries, "{name:?}: the key has a hash tag");
            for key in [
                &keys.ids,
                &keys.bytes,
                &keys.labels,
                &keys.unreleased_claims,
                &claim,
            ] {
                assert_eq!(hash_tag(key), tag, "{name:?}: {key}");
            }
        }
        let keys = Keys::new("orders:dlq".to_owned()).unwrap();
        assert_eq!(keys.entries, "tower-poison:{orders:dlq}:dead-letters");
        assert_eq!(keys.ids, "tower-poison:{orders:dlq}:ids");
        assert_eq!(keys.bytes, "tower-poison:{orders:dlq}:dead-letter-bytes");
        assert_eq!(
            keys.unreleased_claims,
            "tower-poison:{orders:dlq}:unreleased-claims"
        );
        assert_eq!(
            keys.claim(EntryId::from_u128(1)),
            "tower-poison:{orders:dlq}:claim:00000000000000000000000000000001"
        );
    }

    #[test]
    fn a_name_that_would_empty_the_hash_tag_is_refused() {
        for name in ["", "}", "}orders"] {
            let error = Keys::new(name.to_owned()).unwrap_err();
            assert!(error.to_string().contains("hash tag"), "{error}");
        }
    }
}
