//! Delivery counts in a redb file: they survive a crash and a restart.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use redb::{Database, Durability, ReadableTable, ReadableTableMetadata, TableDefinition};
use tower_classify::ConfigError;

use super::{DeliveryTally, FailureCountStore, MessageKey};
use crate::store::redb::blocking;
use crate::store::{millis_since_epoch, time_from_millis, StoreError};

/// Counts by message key: (deliveries, first delivery in ms since the epoch,
/// sequence number in `ORDER`).
const COUNTS: TableDefinition<'_, &str, (u32, u64, u64)> =
    TableDefinition::new("poison_delivery_counts");
/// Keys by the sequence number they were first counted under: the eviction
/// order, oldest first.
const ORDER: TableDefinition<'_, u64, &str> = TableDefinition::new("poison_delivery_order");

/// Delivery counts in a redb file, for consumers whose counts must survive a
/// crash or a restart.
///
/// Each counted delivery is committed with [`Durability::Immediate`] (one
/// `fsync` per delivery of a message with an id) *before* the inner service
/// sees the message, so a message that kills its worker is counted on the
/// next start. redb locks the file to one process, whose layers share it
/// through clones (to share counts between processes, use
/// [`RedisFailureCounts`]). Keep it in a file of its own, apart from the
/// dead-letter [`RedbStore`](crate::store::RedbStore).
///
/// At most [`capacity`](RedbFailureCountsBuilder::capacity) keys, each at
/// most 131 bytes: counting a new key in a full store forgets the key first
/// counted longest ago (found by a lookup in a second table, not a scan).
/// Blocking work runs in [`tokio::task::spawn_blocking`].
///
/// [`RedisFailureCounts`]: https://docs.rs/tower-poison/latest/tower_poison/counts/struct.RedisFailureCounts.html
#[derive(Clone)]
pub struct RedbFailureCounts {
    inner: Arc<Inner>,
}

struct Inner {
    db: Arc<Database>,
    path: PathBuf,
    capacity: u64,
}

/// Configures and opens a [`RedbFailureCounts`].
#[derive(Debug, Clone)]
pub struct RedbFailureCountsBuilder {
    capacity: u64,
}

impl Default for RedbFailureCountsBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl RedbFailureCountsBuilder {
    /// The defaults: 100 000 keys.
    const fn new() -> Self {
        RedbFailureCountsBuilder { capacity: 100_000 }
    }

    /// Remembers at most `capacity` keys (at least 1; default 100,000).
    pub fn capacity(mut self, capacity: u64) -> Result<Self, ConfigError> {
        if capacity == 0 {
            return Err(ConfigError::new(
                "count_store.capacity",
                "must be at least 1",
            ));
        }
        self.capacity = capacity;
        Ok(self)
    }

    /// Opens the counts at `path`, creating the file if it does not exist.
    /// Blocking file I/O: call it at start-up or in `spawn_blocking`.
    pub fn open(self, path: impl AsRef<Path>) -> Result<RedbFailureCounts, StoreError> {
        let path = path.as_ref().to_path_buf();
        let db = Database::create(&path).map_err(|e| {
            StoreError::backend(format!("cannot open delivery counts {}", path.display()), e)
        })?;
        let txn = db.begin_write().map_err(backend)?;
        txn.open_table(COUNTS).map_err(backend)?;
        txn.open_table(ORDER).map_err(backend)?;
        txn.commit().map_err(backend)?;
        Ok(RedbFailureCounts {
            inner: Arc::new(Inner {
                db: Arc::new(db),
                path,
                capacity: self.capacity,
            }),
        })
    }
}

impl RedbFailureCounts {
    /// A builder: `RedbFailureCounts::builder().open(path)` opens the
    /// counts with the default capacity.
    pub const fn builder() -> RedbFailureCountsBuilder {
        RedbFailureCountsBuilder::new()
    }
}

/// What a panicked blocking task is reported as.
const TASK: &str = "delivery count task failed";

fn backend(error: impl Into<redb::Error>) -> StoreError {
    StoreError::backend("delivery count store failed", error.into())
}

fn count(
    db: &Database,
    capacity: u64,
    key: &str,
    now: SystemTime,
) -> Result<DeliveryTally, StoreError> {
    let mut txn = db.begin_write().map_err(backend)?;
    txn.set_durability(Durability::Immediate).map_err(backend)?;
    let (deliveries, first) = {
        let mut counts = txn.open_table(COUNTS).map_err(backend)?;
        let mut order = txn.open_table(ORDER).map_err(backend)?;
        let existing = counts.get(key).map_err(backend)?.map(|v| v.value());
        match existing {
            Some((deliveries, first, seq)) => {
                let deliveries = deliveries.saturating_add(1);
                counts
                    .insert(key, (deliveries, first, seq))
                    .map_err(backend)?;
                (deliveries, first)
            }
            None => {
                while counts.len().map_err(backend)? >= capacity {
                    let Some((_, oldest)) = order.pop_first().map_err(backend)? else {
                        break;
                    };
                    counts.remove(oldest.value()).map_err(backend)?;
                }
                let last = order.last().map_err(backend)?;
                let seq = last.map_or(0, |(seq, _)| seq.value().saturating_add(1));
                let first = millis_since_epoch(now);
                counts.insert(key, (1, first, seq)).map_err(backend)?;
                order.insert(seq, key).map_err(backend)?;
                (1, first)
            }
        }
    };
    txn.commit().map_err(backend)?;
    Ok(DeliveryTally::new(deliveries, time_from_millis(first)))
}

fn forget(db: &Database, key: &str) -> Result<(), StoreError> {
    let mut txn = db.begin_write().map_err(backend)?;
    // Losing a forget in a crash costs at most one early diversion of a
    // message id that comes back; not worth an fsync per success.
    txn.set_durability(Durability::None).map_err(backend)?;
    {
        let mut counts = txn.open_table(COUNTS).map_err(backend)?;
        let removed = counts.remove(key).map_err(backend)?.map(|v| v.value());
        if let Some((_, _, seq)) = removed {
            let mut order = txn.open_table(ORDER).map_err(backend)?;
            order.remove(seq).map_err(backend)?;
        }
    }
    txn.commit().map_err(backend)
}

impl FailureCountStore for RedbFailureCounts {
    async fn count_delivery(
        &self,
        key: &MessageKey,
        now: SystemTime,
    ) -> Result<DeliveryTally, StoreError> {
        let key = key.as_str().to_owned();
        let capacity = self.inner.capacity;
        blocking(&self.inner.db, TASK, move |db| {
            count(db, capacity, &key, now)
        })
        .await
    }

    async fn forget(&self, key: &MessageKey) -> Result<(), StoreError> {
        let key = key.as_str().to_owned();
        blocking(&self.inner.db, TASK, move |db| forget(db, &key)).await
    }
}

impl fmt::Debug for RedbFailureCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedbFailureCounts")
            .field("path", &self.inner.path)
            .field("capacity", &self.inner.capacity)
            .finish()
    }
}
