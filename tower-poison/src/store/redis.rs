//! The dead-letter store for fleets of nodes: a Redis stream.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, RedisError, Script};

use super::{DeadLetterStore, ListQuery, Page, PurgeFilter, StoreError, StoreErrorKind};
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
/// - the stream `NAME` holds one stream entry per dead letter (fields `id`
///   and `entry`, the entry's JSON), added with `XADD`; `depth` is `XLEN`,
///   `list` pages with `XRANGE`;
/// - the hash `NAME:index` maps each [`EntryId`] to its stream entry, so
///   `get` and `remove` (`XDEL`) find an entry by id.
///
/// Every write is one Lua script, so the stream and the index never
/// disagree. [`put`](DeadLetterStore::put) of an id already present (a
/// failed replay updating its entry) deletes the old stream entry and adds the
/// new one at the end: `list` returns entries in the order they were last
/// written. Entry ids come from many nodes, so the order is by write time,
/// not id.
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
/// # Bound
///
/// With [`max_len`](RedisDeadLetterStoreBuilder::max_len) the stream keeps at
/// most that many entries: a `put` past it drops the oldest (as
/// `XADD MAXLEN` does, and removing their index entries too). Without it
/// (the default) the stream grows until an operator purges it, as a
/// dead-letter queue should.
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
    stream: String,
    index: String,
    url: String,
    max_len: Option<u64>,
}

/// Configures and connects a [`RedisDeadLetterStore`].
#[derive(Debug, Clone, Default)]
pub struct RedisDeadLetterStoreBuilder {
    max_len: Option<u64>,
    options: RedisConnectOptions,
}

impl RedisDeadLetterStoreBuilder {
    /// No length bound, default connection options.
    pub const fn new() -> Self {
        RedisDeadLetterStoreBuilder {
            max_len: None,
            options: RedisConnectOptions::new(),
        }
    }

    /// Keeps at most `max_len` entries, dropping the oldest (default: no
    /// bound).
    pub const fn max_len(mut self, max_len: u64) -> Self {
        self.max_len = Some(max_len);
        self
    }

    /// How to connect (timeouts, reconnection).
    pub const fn options(mut self, options: RedisConnectOptions) -> Self {
        self.options = options;
        self
    }

    /// Connects to `url` and uses the stream `stream`.
    pub async fn connect(
        self,
        url: &str,
        stream: impl Into<String>,
    ) -> Result<RedisDeadLetterStore, StoreError> {
        let connection = self.options.connect(url).await?;
        let stream = stream.into();
        Ok(RedisDeadLetterStore {
            connection,
            shared: Arc::new(Shared {
                index: format!("{stream}:index"),
                stream,
                url: redact_url(url),
                max_len: self.max_len,
            }),
        })
    }
}

/// Adds or replaces an entry: KEYS = stream, index; ARGV = id, entry JSON,
/// max length (0: none). Replacing deletes the old stream entry first;
/// trimming removes the index entries of what it drops. Running it twice
/// with the same arguments leaves one entry, so a retried `put` is safe.
const PUT: &str = r"
local old = redis.call('HGET', KEYS[2], ARGV[1])
if old then redis.call('XDEL', KEYS[1], old) end
local max = tonumber(ARGV[3])
if max > 0 then
  local excess = redis.call('XLEN', KEYS[1]) - max + 1
  if excess > 0 then
    for _, e in ipairs(redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', excess)) do
      redis.call('XDEL', KEYS[1], e[1])
      local fields = e[2]
      for i = 1, #fields, 2 do
        if fields[i] == 'id' then redis.call('HDEL', KEYS[2], fields[i + 1]) end
      end
    end
  end
  local sid = redis.call('XADD', KEYS[1], 'MAXLEN', max, '*', 'id', ARGV[1], 'entry', ARGV[2])
  redis.call('HSET', KEYS[2], ARGV[1], sid)
  return sid
end
local sid = redis.call('XADD', KEYS[1], '*', 'id', ARGV[1], 'entry', ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], sid)
return sid
";

/// Removes an entry by id: KEYS = stream, index; ARGV = id and, optionally,
/// the stream id it must still have (purge: do not remove an entry that was
/// replaced since it was read). Returns 1 when removed.
const REMOVE: &str = r"
local sid = redis.call('HGET', KEYS[2], ARGV[1])
if not sid then return 0 end
if ARGV[2] and ARGV[2] ~= sid then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
return redis.call('XDEL', KEYS[1], sid)
";

static PUT_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(PUT));
static REMOVE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(REMOVE));

/// One stream entry as `XRANGE` returns it: its stream id and the flat
/// field/value list.
type StreamEntry = (String, Vec<Vec<u8>>);

impl RedisDeadLetterStore {
    /// Connects to `url` (`redis://host:port/db`) with the default options and
    /// uses the stream `stream` (one per queue).
    pub async fn connect(url: &str, stream: impl Into<String>) -> Result<Self, StoreError> {
        RedisDeadLetterStoreBuilder::new()
            .connect(url, stream)
            .await
    }

    /// A builder for other settings.
    pub const fn builder() -> RedisDeadLetterStoreBuilder {
        RedisDeadLetterStoreBuilder::new()
    }

    /// The stream's key.
    pub fn stream(&self) -> &str {
        &self.shared.stream
    }

    fn failed(&self, what: &str, error: RedisError) -> StoreError {
        StoreError::backend(
            format!(
                "redis dead-letter store {} at {} failed to {what}",
                self.shared.stream, self.shared.url
            ),
            error,
        )
    }

    /// Stream entries after `start` (exclusive when it starts with `(`).
    async fn range(&self, start: &str, count: usize) -> Result<Vec<StreamEntry>, StoreError> {
        redis::cmd("XRANGE")
            .arg(&self.shared.stream)
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
            .arg(&self.shared.index)
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

    /// Every entry in stream order, with its stream id, in pages of `batch`.
    async fn scan(&self, batch: usize) -> Result<Vec<(String, DeadLetterEntry)>, StoreError> {
        let mut all = Vec::new();
        let mut start = "-".to_owned();
        loop {
            let page = self.range(&start, batch).await?;
            let full = page.len() == batch;
            for (sid, fields) in page {
                start = format!("({sid}");
                all.push((sid, decode(&fields)?));
            }
            if !full {
                return Ok(all);
            }
        }
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
    DeadLetterEntry::from_bytes(json)
        .map_err(|e| StoreError::corrupt("cannot decode a stored dead-letter entry", e))
}

impl DeadLetterStore for RedisDeadLetterStore {
    async fn put(&self, entry: DeadLetterEntry) -> Result<(), StoreError> {
        let _sid: String = PUT_SCRIPT
            .key(&self.shared.stream)
            .key(&self.shared.index)
            .arg(entry.id.to_string())
            .arg(entry.to_bytes())
            .arg(self.shared.max_len.unwrap_or(0))
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.failed(&format!("keep entry {}", entry.id), e))?;
        Ok(())
    }

    async fn get(&self, id: EntryId) -> Result<Option<DeadLetterEntry>, StoreError> {
        let sid: Option<String> = redis::cmd("HGET")
            .arg(&self.shared.index)
            .arg(id.to_string())
            .query_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.failed("read the index", e))?;
        let Some(sid) = sid else { return Ok(None) };
        let found: Vec<StreamEntry> = redis::cmd("XRANGE")
            .arg(&self.shared.stream)
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
        let removed: u64 = REMOVE_SCRIPT
            .key(&self.shared.stream)
            .key(&self.shared.index)
            .arg(id.to_string())
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.failed(&format!("remove entry {id}"), e))?;
        Ok(removed > 0)
    }

    async fn purge(&self, filter: PurgeFilter) -> Result<u64, StoreError> {
        let mut removed = 0;
        for (sid, entry) in self.scan(500).await? {
            if !filter.matches(&entry) {
                continue;
            }
            let gone: u64 = REMOVE_SCRIPT
                .key(&self.shared.stream)
                .key(&self.shared.index)
                .arg(entry.id.to_string())
                .arg(&sid)
                .invoke_async(&mut self.connection.clone())
                .await
                .map_err(|e| self.failed(&format!("remove entry {}", entry.id), e))?;
            removed += gone;
        }
        Ok(removed)
    }

    async fn depth(&self) -> Result<u64, StoreError> {
        redis::cmd("XLEN")
            .arg(&self.shared.stream)
            .query_async(&mut self.connection.clone())
            .await
            .map_err(|e| self.failed("read the stream length", e))
    }

    async fn oldest_age(&self, now: SystemTime) -> Result<Option<Duration>, StoreError> {
        // Replays move entries to the end, so the first stream entry is not
        // necessarily the oldest failure: look at all of them.
        Ok(self
            .scan(500)
            .await?
            .iter()
            .map(|(_, entry)| entry.age(now))
            .max())
    }
}

impl fmt::Debug for RedisDeadLetterStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisDeadLetterStore")
            .field("url", &self.shared.url)
            .field("stream", &self.shared.stream)
            .field("max_len", &self.shared.max_len)
            .finish_non_exhaustive()
    }
}
