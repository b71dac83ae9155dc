//! The dead-letter store for fleets of nodes: a Redis stream.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, RedisError, Script};

use super::{
    lease_end, millis_since_epoch, saturating_millis, time_from_millis, Claim, DeadLetterStore,
    ListQuery, Page, PurgeFilter, Stats, StoreError, StoreErrorKind,
};
use crate::entry::{DeadLetterEntry, EntryId};

/// How the Redis stores connect: one reconnecting
/// [`ConnectionManager`] per store, shared by its clones.
///
/// The defaults fail a command quickly while Redis is unreachable (a 1 s
/// connection timeout, one reconnection attempt, a 5 s response timeout), so
/// a call made during an outage gets a clear error instead of hanging; the
/// manager reconnects in the background and later calls succeed again.
#[derive(Debug, Clone)]
pub struct RedisConnectOptions {
    connection_timeout: Duration,
    response_timeout: Duration,
    reconnect_retries: usize,
}

impl Default for RedisConnectOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl RedisConnectOptions {
    /// The defaults described above.
    pub const fn new() -> Self {
        RedisConnectOptions {
            connection_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(5),
            reconnect_retries: 1,
        }
    }

    /// Gives up on connecting after `timeout` (default 1 s).
    pub const fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// Gives up on a command's reply after `timeout` (default 5 s).
    pub const fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Reconnection attempts after a connection is lost (default 1), with a
    /// short exponential backoff between them.
    pub const fn reconnect_retries(mut self, retries: usize) -> Self {
        self.reconnect_retries = retries;
        self
    }

    /// Connects to `url` (`redis://host:port/db`), failing if Redis does not
    /// answer now.
    pub(crate) async fn connect(&self, url: &str) -> Result<ConnectionManager, StoreError> {
        let shown = redact_url(url);
        let client = Client::open(url)
            .map_err(|e| StoreError::backend(format!("invalid redis url {shown:?}"), e))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connection_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(self.reconnect_retries)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500));
        ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| StoreError::backend(format!("cannot connect to redis at {shown}"), e))
    }
}

/// `url` without its password, for messages and logs.
pub(crate) fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://[redacted]@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// The dead-letter store for a fleet: one Redis stream per queue, shared by
/// every node, read by the CLI (`tower-poison --store redis://host:6379 …`).
///
/// # Layout
///
/// A queue named `NAME` (the `stream` argument of
/// [`connect`](Self::connect)) lives in these keys, all with the hash tag
/// `{NAME}` so that on Redis Cluster they share one slot and every script
/// below runs on one node (no `CROSSSLOT`):
///
/// | key | type | holds |
/// |---|---|---|
/// | `tower-poison:{NAME}:entries` | stream | one stream entry per dead letter (fields `id` and `entry`, the entry's JSON), added with `XADD`; `depth` is `XLEN`, `list` pages with `XRANGE` |
/// | `tower-poison:{NAME}:index` | hash | each [`EntryId`] → its stream entry id, so `get` and `remove` find an entry by id |
/// | `tower-poison:{NAME}:bytes` | string | the total size of the stored `entry` fields, for [`max_bytes`](RedisDeadLetterStoreBuilder::max_bytes) |
/// | `tower-poison:{NAME}:claim:<id>` | string | a [claim](DeadLetterStore::claim) on entry `<id>`: when its lease ends (milliseconds since the Unix epoch), expiring by itself (`PX`) |
///
/// A name must not be empty or start with `}` (either would leave the hash
/// tag empty); [`connect`](RedisDeadLetterStoreBuilder::connect) refuses it.
///
/// Every write is one Lua script, so the stream, the index, the byte count
/// and the claims never disagree. [`put`](DeadLetterStore::put) of an id
/// already present (a failed replay updating its entry) deletes the old
/// stream entry and adds the new one at the end: `list` returns entries in
/// the order they were last written. Entry ids come from many nodes, so the
/// order is by write time, not id.
///
/// `purge`, `oldest_age` and `stats` walk the stream in pages of 512
/// (`XRANGE` with an exclusive start), never loading the whole stream.
///
/// # Durability
///
/// `put` returns once Redis has applied the write. How durable that is
/// depends on the server's persistence: with `appendonly yes` and
/// `appendfsync always` every acknowledged entry survives a Redis crash
/// (the restart test runs this way); with the default `everysec` up to a
/// second of entries can be lost. A write Redis does not acknowledge (it is
/// down, a timeout) is an error, and the layer fails the call with
/// [`StoreFailed`](crate::StoreFailed): never a silent loss.
///
/// # Limits
///
/// The queue holds at most
/// [`max_entries`](RedisDeadLetterStoreBuilder::max_entries) entries
/// (default 100,000) of at most
/// [`max_bytes`](RedisDeadLetterStoreBuilder::max_bytes) in total (default
/// 256 MiB). The check and the write are one script, so nodes writing at
/// once cannot overshoot. A `put` past either fails with
/// [`StoreErrorKind::Full`] (the layer's [`StoreFull`](crate::StoreFull));
/// nothing stored is trimmed to make room. Replacing an entry with one no
/// larger always succeeds.
///
/// # Claims
///
/// A claim is one script: it checks that the entry exists and that no lease
/// on it is still running at the caller's `now`, then sets the claim key with
/// `PX` set to the lease, so a forgotten claim expires on its own.
///
/// ```no_run
/// # async fn example() -> Result<(), tower_poison::store::StoreError> {
/// use tower_poison::store::RedisDeadLetterStore;
/// use tower_poison::DeadLetterLayer;
///
/// let store = RedisDeadLetterStore::connect("redis://127.0.0.1:6379", "orders:dlq").await?;
/// let layer = DeadLetterLayer::new(store).label("orders");
/// # let _ = layer;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisDeadLetterStore {
    connection: ConnectionManager,
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
    index: String,
    bytes: String,
    claim_prefix: String,
}

impl Keys {
    fn new(name: String) -> Result<Self, StoreError> {
        if name.is_empty() || name.starts_with('}') {
            return Err(StoreError::new(
                StoreErrorKind::Backend,
                format!(
                    "invalid redis dead-letter stream name {name:?}: it must not be empty \
                     or start with `}}` (it is the keys' hash tag)"
                ),
            ));
        }
        let base = format!("tower-poison:{{{name}}}:");
        Ok(Keys {
            entries: format!("{base}entries"),
            index: format!("{base}index"),
            bytes: format!("{base}bytes"),
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
    /// The default number of entries a queue holds: 100,000, as for the
    /// redb store (more than an operator triages, few enough to scan).
    pub const DEFAULT_MAX_ENTRIES: u64 = 100_000;

    /// The default total size of a queue's entries: 256 MiB.
    ///
    /// Smaller than the redb store's 1 GiB because Redis keeps it all in
    /// memory, usually beside other data: enough for the whole default entry
    /// count at about 2.5 KiB an entry (a typical request with a small body),
    /// or 4,000 entries with full 64 KiB bodies.
    pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;

    /// The defaults: at most 100,000 entries and 256 MiB, default
    /// connection options.
    pub const fn new() -> Self {
        RedisDeadLetterStoreBuilder {
            max_entries: Self::DEFAULT_MAX_ENTRIES,
            max_bytes: Self::DEFAULT_MAX_BYTES,
            options: RedisConnectOptions::new(),
        }
    }

    /// Holds at most `max_entries` entries (default
    /// [`DEFAULT_MAX_ENTRIES`](Self::DEFAULT_MAX_ENTRIES)); a `put` of a new
    /// id past it fails with [`StoreErrorKind::Full`]. `u64::MAX` removes
    /// the bound.
    pub const fn max_entries(mut self, max_entries: u64) -> Self {
        self.max_entries = max_entries;
        self
    }

    /// Holds at most `max_bytes` of encoded entries (default
    /// [`DEFAULT_MAX_BYTES`](Self::DEFAULT_MAX_BYTES)); a `put` that would
    /// pass it fails with [`StoreErrorKind::Full`]. Replacing an entry
    /// counts the difference in size. `u64::MAX` removes the bound.
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

/// The Lua function the scripts share: the size of a stream entry's `entry`
/// field, which is what the byte counter counts.
macro_rules! entry_size_lua {
    () => {
        r"
local function entry_size(fields)
  for i = 1, #fields, 2 do
    if fields[i] == 'entry' then return string.len(fields[i + 1]) end
  end
  return 0
end
"
    };
}

/// Adds or replaces an entry within the limits: KEYS = entries, index,
/// bytes, the entry's claim; ARGV = id, entry JSON, max entries, max bytes.
/// Returns `{0, depth}` when stored, `{1, depth}` when refused for the entry
/// count, `{2, depth}` for the bytes. Only what a put adds is checked, so a
/// replacement no larger than the entry it replaces always succeeds. Replacing deletes the old stream entry
/// first and counts only the difference in size; any claim ends. Running it
/// twice with the same arguments leaves one entry, so a retried `put` is
/// safe.
const PUT: &str = concat!(
    entry_size_lua!(),
    r"
local old = redis.call('HGET', KEYS[2], ARGV[1])
local old_size = 0
if old then
  local found = redis.call('XRANGE', KEYS[1], old, old)
  if found[1] then old_size = entry_size(found[1][2]) end
end
local depth = redis.call('XLEN', KEYS[1])
if not old and depth + 1 > tonumber(ARGV[3]) then return {1, depth} end
local bytes = tonumber(redis.call('GET', KEYS[3]) or '0')
local size = string.len(ARGV[2])
if size > old_size and bytes - old_size + size > tonumber(ARGV[4]) then return {2, depth} end
if old then redis.call('XDEL', KEYS[1], old) end
local sid = redis.call('XADD', KEYS[1], '*', 'id', ARGV[1], 'entry', ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], sid)
redis.call('INCRBY', KEYS[3], size - old_size)
redis.call('DEL', KEYS[4])
return {0, redis.call('XLEN', KEYS[1])}
"
);

/// Removes entries by id: KEYS = entries, index, bytes, then the claim key
/// of each entry; ARGV = for each entry its id and the stream id it must
/// still have, or `''` for any (purge: do not remove an entry that was
/// replaced since it was read). Returns how many were removed.
const REMOVE: &str = concat!(
    entry_size_lua!(),
    r"
local removed = 0
for i = 1, #ARGV, 2 do
  local sid = redis.call('HGET', KEYS[2], ARGV[i])
  if sid and (ARGV[i + 1] == '' or ARGV[i + 1] == sid) then
    local found = redis.call('XRANGE', KEYS[1], sid, sid)
    if found[1] then redis.call('DECRBY', KEYS[3], entry_size(found[1][2])) end
    redis.call('HDEL', KEYS[2], ARGV[i])
    redis.call('DEL', KEYS[3 + (i + 1) / 2])
    removed = removed + redis.call('XDEL', KEYS[1], sid)
  end
end
return removed
"
);

/// Claims an entry: KEYS = entries, index, the entry's claim; ARGV = id, the
/// caller's now, the lease's end (both milliseconds since the Unix epoch),
/// the lease in milliseconds (at least 1). Returns `{'claimed', entry
/// JSON}`, `{'held', lease end}` or `{'missing'}`.
const CLAIM: &str = r"
local sid = redis.call('HGET', KEYS[2], ARGV[1])
if not sid then return {'missing'} end
local held = redis.call('GET', KEYS[3])
if held and tonumber(held) > tonumber(ARGV[2]) then return {'held', held} end
local found = redis.call('XRANGE', KEYS[1], sid, sid)
if not found[1] then return {'missing'} end
local fields = found[1][2]
for i = 1, #fields, 2 do
  if fields[i] == 'entry' then
    redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[4])
    return {'claimed', fields[i + 1]}
  end
end
return {'missing'}
";

static PUT_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(PUT));
static REMOVE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(REMOVE));
static CLAIM_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(CLAIM));

/// How many stream entries one `XRANGE` of a scan reads.
const SCAN_PAGE: usize = 512;

/// One stream entry as `XRANGE` returns it: its stream id and the flat
/// field/value list.
type StreamEntry = (String, Vec<Vec<u8>>);

/// Where a scan of the stream goes on: the next `XRANGE` start, or `None`
/// once the stream is exhausted.
struct Scan {
    start: Option<String>,
}

impl RedisDeadLetterStore {
    /// Connects to `url` (`redis://host:port/db`) with the default options and
    /// uses the queue `stream` (one per queue; see the key layout above).
    pub async fn connect(url: &str, stream: impl Into<String>) -> Result<Self, StoreError> {
        RedisDeadLetterStoreBuilder::new()
            .connect(url, stream)
            .await
    }

    /// A builder for other settings.
    pub const fn builder() -> RedisDeadLetterStoreBuilder {
        RedisDeadLetterStoreBuilder::new()
    }

    /// The queue's name, as passed to [`connect`](Self::connect).
    pub fn stream(&self) -> &str {
        &self.shared.keys.name
    }

    fn failed(&self, what: &str, error: RedisError) -> StoreError {
        StoreError::backend(
            format!(
                "redis dead-letter store {} at {} failed to {what}",
                self.shared.keys.name, self.shared.url
            ),
            error,
        )
    }

    fn full(&self, what: String) -> StoreError {
        StoreError::new(
            StoreErrorKind::Full,
            format!(
                "redis dead-letter store {} at {} is full: {what}",
                self.shared.keys.name, self.shared.url
            ),
        )
    }

    /// Stream entries after `start` (exclusive when it starts with `(`).
    async fn range(&self, start: &str, count: usize) -> Result<Vec<StreamEntry>, StoreError> {
        redis::cmd("XRANGE")
            .arg(&self.shared.keys.entries)
            .arg(start)
            .arg("+")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.failed("read the stream", e))
    }

    /// Where a page after entry `after` starts in the stream.
    async fn start_after(&self, after: Option<EntryId>) -> Result<String, StoreError> {
        let Some(after) = after else {
            return Ok("-".to_owned());
        };
        let sid: Option<String> = redis::cmd("HGET")
            .arg(&self.shared.keys.index)
            .arg(after.to_string())
            .query_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.failed("read the index", e))?;
        Ok(match sid {
            Some(sid) => format!("({sid}"),
            // The cursor's entry is gone (removed or replayed meanwhile):
            // resume from the millisecond its id was made in, the nearest
            // place a stream id can name.
            None => format!("{}-0", after.as_u128() >> 80),
        })
    }

    /// A scan of the whole stream, from its start.
    fn scan(&self) -> Scan {
        Scan {
            start: Some("-".to_owned()),
        }
    }

    /// The next page of `scan` (at most [`SCAN_PAGE`] entries, with their
    /// stream ids), or `None` once it is done. Entries written or removed
    /// while the scan runs may or may not be seen, as with any cursor.
    async fn next_page(
        &self,
        scan: &mut Scan,
    ) -> Result<Option<Vec<(String, DeadLetterEntry)>>, StoreError> {
        let Some(start) = scan.start.take() else {
            return Ok(None);
        };
        let page = self.range(&start, SCAN_PAGE).await?;
        if page.len() == SCAN_PAGE {
            scan.start = page.last().map(|(sid, _)| format!("({sid}"));
        }
        page.into_iter()
            .map(|(sid, fields)| Ok((sid, decode(&fields)?)))
            .collect::<Result<Vec<_>, StoreError>>()
            .map(Some)
    }

    /// Removes `entries` (id, and the stream id each must still have, or
    /// `""` for any) in one script; returns how many went.
    async fn remove_all(&self, entries: &[(EntryId, &str)]) -> Result<u64, StoreError> {
        let keys = &self.shared.keys;
        let mut invocation = REMOVE_SCRIPT.prepare_invoke();
        invocation
            .key(&keys.entries)
            .key(&keys.index)
            .key(&keys.bytes);
        for (id, sid) in entries {
            invocation
                .key(keys.claim(*id))
                .arg(id.to_string())
                .arg(*sid);
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

/// The entry in a stream entry's fields.
fn decode(fields: &[Vec<u8>]) -> Result<DeadLetterEntry, StoreError> {
    let json = fields
        .chunks(2)
        .find(|pair| pair[0] == b"entry")
        .and_then(|pair| pair.get(1))
        .ok_or_else(|| corrupt("a stream entry has no `entry` field"))?;
    decode_json(json)
}

fn decode_json(json: &[u8]) -> Result<DeadLetterEntry, StoreError> {
    DeadLetterEntry::from_bytes(json)
        .map_err(|e| StoreError::corrupt("cannot decode a stored dead-letter entry", e))
}

impl DeadLetterStore for RedisDeadLetterStore {
    async fn put(&self, entry: DeadLetterEntry) -> Result<(), StoreError> {
        self.put_with_depth(entry).await.map(drop)
    }

    async fn put_with_depth(&self, entry: DeadLetterEntry) -> Result<Option<u64>, StoreError> {
        let keys = &self.shared.keys;
        let (refused, depth): (u8, u64) = PUT_SCRIPT
            .key(&keys.entries)
            .key(&keys.index)
            .key(&keys.bytes)
            .key(keys.claim(entry.id))
            .arg(entry.id.to_string())
            .arg(entry.to_bytes())
            .arg(self.shared.max_entries)
            .arg(self.shared.max_bytes)
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
        let sid: Option<String> = redis::cmd("HGET")
            .arg(&self.shared.keys.index)
            .arg(id.to_string())
            .query_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.failed("read the index", e))?;
        let Some(sid) = sid else { return Ok(None) };
        let found: Vec<StreamEntry> = redis::cmd("XRANGE")
            .arg(&self.shared.keys.entries)
            .arg(&sid)
            .arg(&sid)
            .query_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.failed("read the stream", e))?;
        found.first().map(|(_, fields)| decode(fields)).transpose()
    }

    async fn list(&self, query: ListQuery) -> Result<Page, StoreError> {
        let mut start = self.start_after(query.after).await?;
        let batch = query.limit.clamp(1, 1000);
        let mut entries = Vec::new();
        loop {
            let page = self.range(&start, batch).await?;
            let exhausted = page.len() < batch;
            for (sid, fields) in page {
                start = format!("({sid}");
                if entries.len() == query.limit {
                    let next = entries.last().map(|e: &DeadLetterEntry| e.id);
                    return Ok(Page { entries, next });
                }
                let entry = decode(&fields)?;
                // Skip what a fallback cursor (see `start_after`) would repeat.
                if query.after.is_some_and(|after| entry.id == after) {
                    continue;
                }
                if query.matches(&entry) {
                    entries.push(entry);
                }
            }
            if exhausted {
                return Ok(Page {
                    entries,
                    next: None,
                });
            }
        }
    }

    async fn remove(&self, id: EntryId) -> Result<bool, StoreError> {
        Ok(self.remove_all(&[(id, "")]).await? > 0)
    }

    async fn purge(&self, filter: PurgeFilter) -> Result<u64, StoreError> {
        let mut removed = 0;
        let mut scan = self.scan();
        while let Some(page) = self.next_page(&mut scan).await? {
            let matching: Vec<(EntryId, &str)> = page
                .iter()
                .filter(|(_, entry)| filter.matches(entry))
                .map(|(sid, entry)| (entry.id, sid.as_str()))
                .collect();
            if !matching.is_empty() {
                removed += self.remove_all(&matching).await?;
            }
        }
        Ok(removed)
    }

    async fn claim(
        &self,
        id: EntryId,
        now: SystemTime,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let keys = &self.shared.keys;
        let reply: Vec<Vec<u8>> = CLAIM_SCRIPT
            .key(&keys.entries)
            .key(&keys.index)
            .key(keys.claim(id))
            .arg(id.to_string())
            .arg(millis_since_epoch(now))
            .arg(lease_end(now, lease))
            // `PX` must be positive; a zero lease ends at `now` anyway.
            .arg(saturating_millis(lease).max(1))
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.failed(&format!("claim entry {id}"), e))?;
        match reply.as_slice() {
            [status, entry] if status == b"claimed" => decode_json(entry).map(Claim::Claimed),
            [status, until] if status == b"held" => {
                let until = std::str::from_utf8(until)
                    .ok()
                    .and_then(|until| until.parse::<u64>().ok())
                    .ok_or_else(|| corrupt(format!("the claim on entry {id} is not a time")))?;
                Ok(Claim::Held {
                    until: time_from_millis(until),
                })
            }
            _ => Ok(Claim::NotFound),
        }
    }

    async fn release(&self, id: EntryId) -> Result<(), StoreError> {
        redis::cmd("DEL")
            .arg(self.shared.keys.claim(id))
            .query_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.failed(&format!("release entry {id}"), e))
    }

    async fn depth(&self) -> Result<u64, StoreError> {
        redis::cmd("XLEN")
            .arg(&self.shared.keys.entries)
            .query_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.failed("read the stream length", e))
    }

    async fn oldest_age(&self, now: SystemTime) -> Result<Option<Duration>, StoreError> {
        // Replays move entries to the end, so the first stream entry is not
        // necessarily the oldest failure: look at all of them, a page at a
        // time.
        let mut oldest = None;
        let mut scan = self.scan();
        while let Some(page) = self.next_page(&mut scan).await? {
            for (_, entry) in &page {
                let age = entry.age(now);
                oldest = Some(oldest.map_or(age, |o: Duration| o.max(age)));
            }
        }
        Ok(oldest)
    }

    async fn stats(&self, now: SystemTime) -> Result<Stats, StoreError> {
        let mut stats = Stats::default();
        let mut scan = self.scan();
        while let Some(page) = self.next_page(&mut scan).await? {
            for (_, entry) in &page {
                stats.depth += 1;
                *stats
                    .by_kind
                    .entry(entry.kind.as_str().to_owned())
                    .or_default() += 1;
                let age = entry.age(now);
                stats.oldest_age = Some(stats.oldest_age.map_or(age, |o: Duration| o.max(age)));
            }
        }
        Ok(stats)
    }
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
            for key in [&keys.index, &keys.bytes, &claim] {
                assert_eq!(hash_tag(key), tag, "{name:?}: {key}");
            }
        }
        let keys = Keys::new("orders:dlq".to_owned()).unwrap();
        assert_eq!(keys.entries, "tower-poison:{orders:dlq}:entries");
        assert_eq!(keys.index, "tower-poison:{orders:dlq}:index");
        assert_eq!(keys.bytes, "tower-poison:{orders:dlq}:bytes");
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
