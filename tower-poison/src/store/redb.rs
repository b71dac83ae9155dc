//! The default durable store, on redb.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
};
use tokio::sync::oneshot;

use super::{DeadLetterStore, ListQuery, Page, PurgeFilter, StoreError, StoreErrorKind};
use crate::entry::{DeadLetterEntry, EntryId};

/// Entries by id; the value is the entry's JSON encoding.
const ENTRIES: TableDefinition<'_, u128, &[u8]> = TableDefinition::new("dead_letters");

/// The default dead-letter store: one redb file on local disk.
///
/// # Durability
///
/// [`put`](DeadLetterStore::put) returns only after the write transaction
/// holding the entry has committed with [`Durability::Immediate`], i.e. after
/// redb has flushed it to disk (`fsync`). An entry the layer acknowledged
/// survives a crash or `SIGKILL` of the process the next instant, and the file
/// opens cleanly again (redb's commit protocol never leaves a half-written
/// transaction visible).
///
/// # Group commit
///
/// Writes go to one writer thread. When several entries are waiting, the
/// thread writes up to [`max_batch`](RedbStoreBuilder::max_batch) of them in
/// *one* transaction and acknowledges each only after that transaction
/// commits. A lone entry is never held back waiting for company, so batching
/// adds no latency; under bursts it shares one `fsync` between many entries.
/// `max_batch(1)` gives one commit per entry. See the crate README for the
/// measured difference.
///
/// # Threads
///
/// Blocking disk work never runs on the async executor: writes run on the
/// writer thread, reads, removals and purges in
/// [`tokio::task::spawn_blocking`], so the store must be used inside a tokio
/// runtime. Clones share the database. Dropping the last clone stops the
/// writer thread after its current batch.
///
/// redb locks the file: one process at a time may open it. Stop the service
/// before pointing the CLI at its store.
#[derive(Clone)]
pub struct RedbStore {
    inner: Arc<Inner>,
}

struct Inner {
    db: Arc<Database>,
    /// The number of entries, kept up to date by every committed write so
    /// `depth` (read after every dead-lettered call for the gauge) needs no
    /// transaction. Exact, because redb's file lock keeps other processes out.
    depth: Arc<AtomicU64>,
    path: PathBuf,
    writer: Option<mpsc::Sender<Put>>,
    thread: Option<JoinHandle<()>>,
}

struct Put {
    key: u128,
    value: Vec<u8>,
    ack: oneshot::Sender<Result<(), StoreError>>,
}

/// Configures and opens a [`RedbStore`].
#[derive(Debug, Clone)]
pub struct RedbStoreBuilder {
    max_batch: usize,
}

impl Default for RedbStoreBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl RedbStoreBuilder {
    /// The defaults: group commit of up to 256 entries.
    pub const fn new() -> Self {
        RedbStoreBuilder { max_batch: 256 }
    }

    /// At most `max_batch` entries per write transaction (default 256); `1`
    /// commits every entry on its own. Zero is treated as one.
    pub const fn max_batch(mut self, max_batch: usize) -> Self {
        self.max_batch = if max_batch == 0 { 1 } else { max_batch };
        self
    }

    /// Opens the store at `path`, creating the file if it does not exist.
    ///
    /// This does blocking file I/O (and, after a crash, redb's repair); call
    /// it at start-up or inside `spawn_blocking`.
    pub fn open(self, path: impl AsRef<Path>) -> Result<RedbStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let db = Database::create(&path).map_err(|e| {
            StoreError::backend(
                format!("cannot open dead-letter store {}", path.display()),
                e,
            )
        })?;
        // Create the table up front so readers never see a missing table.
        let txn = db.begin_write().map_err(backend)?;
        let depth = txn
            .open_table(ENTRIES)
            .map_err(backend)?
            .len()
            .map_err(backend)?;
        txn.commit().map_err(backend)?;

        let db = Arc::new(db);
        let depth = Arc::new(AtomicU64::new(depth));
        let thread_depth = Arc::clone(&depth);
        let (writer, queue) = mpsc::channel();
        let thread_db = Arc::clone(&db);
        let max_batch = self.max_batch;
        let thread = std::thread::Builder::new()
            .name("tower-poison-redb".into())
            .spawn(move || write_loop(&thread_db, &queue, max_batch, &thread_depth))
            .map_err(|e| StoreError::backend("cannot start the dead-letter writer thread", e))?;
        Ok(RedbStore {
            inner: Arc::new(Inner {
                db,
                depth,
                path,
                writer: Some(writer),
                thread: Some(thread),
            }),
        })
    }
}

impl RedbStore {
    /// Opens the store at `path` with the default settings (see
    /// [`RedbStoreBuilder::open`]).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        RedbStoreBuilder::new().open(path)
    }

    /// A builder for other settings.
    pub const fn builder() -> RedbStoreBuilder {
        RedbStoreBuilder::new()
    }

    /// The file the store lives in.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    async fn blocking<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Database) -> Result<T, StoreError> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || f(&inner.db))
            .await
            .map_err(|e| StoreError::backend("dead-letter store task failed", e))?
    }
}

fn backend(error: impl Into<redb::Error>) -> StoreError {
    StoreError::backend("dead-letter store failed", error.into())
}

fn decode(bytes: &[u8]) -> Result<DeadLetterEntry, StoreError> {
    DeadLetterEntry::from_bytes(bytes)
        .map_err(|e| StoreError::corrupt("cannot decode a stored dead-letter entry", e))
}

/// The writer thread: take what is queued (up to `max_batch`), commit it in
/// one durable transaction, then acknowledge every entry of the batch.
fn write_loop(db: &Database, queue: &mpsc::Receiver<Put>, max_batch: usize, depth: &AtomicU64) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < max_batch {
            match queue.try_recv() {
                Ok(put) => batch.push(put),
                Err(_) => break,
            }
        }
        let result = write_batch(db, &batch);
        if let Ok(added) = &result {
            depth.fetch_add(*added, Ordering::Relaxed);
        }
        for put in batch {
            let ack = match &result {
                Ok(_) => Ok(()),
                Err(error) => Err(StoreError::new(error.kind(), error_text(error))),
            };
            // The caller may have gone away (its call was cancelled); the
            // entry is stored all the same.
            let _ = put.ack.send(ack);
        }
    }
}

fn error_text(error: &StoreError) -> String {
    crate::entry::error_chain(error).join(": ")
}

/// Writes `batch` in one durable transaction; returns how many entries are new
/// (the others replaced an entry with the same id).
fn write_batch(db: &Database, batch: &[Put]) -> Result<u64, StoreError> {
    let mut txn = db.begin_write().map_err(backend)?;
    txn.set_durability(Durability::Immediate)
        .map_err(|e| StoreError::backend("dead-letter store failed", e))?;
    let mut added = 0;
    {
        let mut table = txn.open_table(ENTRIES).map_err(backend)?;
        for put in batch {
            let replaced = table
                .insert(put.key, put.value.as_slice())
                .map_err(backend)?;
            added += u64::from(replaced.is_none());
        }
    }
    txn.commit().map_err(backend)?;
    Ok(added)
}

impl DeadLetterStore for RedbStore {
    async fn put(&self, entry: DeadLetterEntry) -> Result<(), StoreError> {
        let (ack, acked) = oneshot::channel();
        let put = Put {
            key: entry.id.as_u128(),
            value: entry.to_bytes(),
            ack,
        };
        let closed =
            || StoreError::new(StoreErrorKind::Backend, "dead-letter store writer stopped");
        self.inner
            .writer
            .as_ref()
            .ok_or_else(closed)?
            .send(put)
            .map_err(|_| closed())?;
        acked.await.map_err(|_| closed())?
    }

    async fn get(&self, id: EntryId) -> Result<Option<DeadLetterEntry>, StoreError> {
        self.blocking(move |db| {
            let txn = db.begin_read().map_err(backend)?;
            let table = txn.open_table(ENTRIES).map_err(backend)?;
            match table.get(id.as_u128()).map_err(backend)? {
                Some(value) => decode(value.value()).map(Some),
                None => Ok(None),
            }
        })
        .await
    }

    async fn list(&self, query: ListQuery) -> Result<Page, StoreError> {
        self.blocking(move |db| {
            let txn = db.begin_read().map_err(backend)?;
            let table = txn.open_table(ENTRIES).map_err(backend)?;
            let start = match query.after {
                Some(after) => match after.as_u128().checked_add(1) {
                    Some(start) => start,
                    None => {
                        return Ok(Page {
                            entries: Vec::new(),
                            next: None,
                        })
                    }
                },
                None => 0,
            };
            let mut entries = Vec::new();
            let mut next = None;
            for item in table.range(start..).map_err(backend)? {
                let (_, value) = item.map_err(backend)?;
                if entries.len() == query.limit {
                    next = entries.last().map(|e: &DeadLetterEntry| e.id);
                    break;
                }
                let entry = decode(value.value())?;
                if query.matches(&entry) {
                    entries.push(entry);
                }
            }
            Ok(Page { entries, next })
        })
        .await
    }

    async fn remove(&self, id: EntryId) -> Result<bool, StoreError> {
        let depth = Arc::clone(&self.inner.depth);
        self.blocking(move |db| {
            let txn = db.begin_write().map_err(backend)?;
            let removed = {
                let mut table = txn.open_table(ENTRIES).map_err(backend)?;
                let removed = table.remove(id.as_u128()).map_err(backend)?.is_some();
                removed
            };
            txn.commit().map_err(backend)?;
            if removed {
                depth.fetch_sub(1, Ordering::Relaxed);
            }
            Ok(removed)
        })
        .await
    }

    async fn purge(&self, filter: PurgeFilter) -> Result<u64, StoreError> {
        let depth = Arc::clone(&self.inner.depth);
        self.blocking(move |db| {
            let txn = db.begin_write().map_err(backend)?;
            let mut removed = 0;
            {
                let mut table = txn.open_table(ENTRIES).map_err(backend)?;
                // An entry that does not decode is kept: purge removes by age,
                // and an unreadable entry's age is unknown.
                table
                    .retain(|_, value| {
                        let gone = DeadLetterEntry::from_bytes(value)
                            .map(|entry| filter.matches(&entry))
                            .unwrap_or(false);
                        removed += u64::from(gone);
                        !gone
                    })
                    .map_err(backend)?;
            }
            txn.commit().map_err(backend)?;
            depth.fetch_sub(removed, Ordering::Relaxed);
            Ok(removed)
        })
        .await
    }

    async fn depth(&self) -> Result<u64, StoreError> {
        Ok(self.inner.depth.load(Ordering::Relaxed))
    }

    async fn oldest_age(&self, now: SystemTime) -> Result<Option<Duration>, StoreError> {
        self.blocking(move |db| {
            let txn = db.begin_read().map_err(backend)?;
            let table = txn.open_table(ENTRIES).map_err(backend)?;
            let mut oldest = None;
            for item in table.iter().map_err(backend)? {
                let (_, value) = item.map_err(backend)?;
                let age = decode(value.value())?.age(now);
                oldest = Some(oldest.map_or(age, |o: Duration| o.max(age)));
            }
            Ok(oldest)
        })
        .await
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the queue ends the writer loop; joining makes sure the file
        // lock is released when the last clone is gone, so the same process
        // can open the store again.
        drop(self.writer.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedbStore")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}
