//! The default durable store, on redb.

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
    WriteTransaction,
};
use tokio::sync::{mpsc, oneshot};

use super::{
    decode, lease_end, millis_since_epoch, page_of, time_from_millis, Claim, ClaimToken,
    DeadLetterStore, ListQuery, Page, PrefixMatches, PurgeFilter, StoreError, StoreErrorKind,
};
use crate::entry::{DeadLetterEntry, EntryId, EntryIdPrefix};

/// Entries by id; the value is the entry's JSON encoding.
const ENTRIES: TableDefinition<'_, u128, &[u8]> = TableDefinition::new("dead_letters");

/// Counters kept in the same transactions as the entries they count.
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("dead_letters_meta");

/// The key in [`META`] of the total encoded size of the entries, in bytes.
const ENTRY_BYTES: &str = "entry_bytes";

/// How many entries each label has, updated in the same transactions as the
/// entries; a label leaves the table with its last entry.
const LABELS: TableDefinition<'_, &str, u64> = TableDefinition::new("dead_letter_label_depths");

/// The key in [`META`] that says [`LABELS`] counts every entry (a file
/// written before there were label counts gets them when it is opened).
const LABELS_COUNTED: &str = "label_depths_counted";

/// Claims by entry id; the value is when the lease ends (milliseconds since
/// the Unix epoch) and the claim's token.
const CLAIMS: TableDefinition<'_, u128, (u64, u128)> =
    TableDefinition::new("dead_letter_claim_tokens");

/// Where claims were kept before they had tokens: dropped when a file is
/// opened (claims are leases, so forgetting one only ends it early).
const UNTOKENED_CLAIMS: TableDefinition<'_, u128, u64> = TableDefinition::new("dead_letter_claims");

/// The default dead-letter store: one redb file on local disk.
///
/// [`put`](DeadLetterStore::put) returns only after the transaction holding
/// the entry has committed with [`Durability::Immediate`] (`fsync`), so an
/// acknowledged entry survives a crash or `SIGKILL`. The byte count for
/// [`max_bytes`](RedbStoreBuilder::max_bytes) lives in the file, updated in
/// the same transactions as the entries, so it never drifts.
///
/// # Group commit
///
/// One writer thread writes up to [`max_batch`](RedbStoreBuilder::max_batch)
/// waiting entries in *one* transaction and acknowledges each after that
/// commit: a lone entry never waits for company, and under bursts many
/// share one `fsync` (`BENCHMARKS.md`). When the disk falls behind, `put`
/// waits asynchronously for room in the writer's bounded queue
/// ([`max_pending_writes`](RedbStoreBuilder::max_pending_writes)).
///
/// A claim and a release each check and write in one durable transaction,
/// so a replayer killed after sending leaves its claim in the file for the
/// next process to find lapsed.
///
/// # Threads
///
/// Disk work never runs on the async executor (the writer thread, or
/// [`tokio::task::spawn_blocking`]): use the store inside a tokio runtime.
/// Clones share the database; dropping the last one stops the writer after
/// its batch. redb locks the file to one process: stop the service before
/// pointing the CLI at it.
#[derive(Clone)]
pub struct RedbStore {
    inner: Arc<Inner>,
}

struct Inner {
    writer: Arc<Writer>,
    queue: Option<mpsc::Sender<Put>>,
    thread: Option<JoinHandle<()>>,
}

struct Put {
    key: u128,
    value: Vec<u8>,
    label: String,
    /// How many entries the label has after the commit, or why the entry
    /// was not kept.
    ack: oneshot::Sender<Result<u64, StoreError>>,
}

/// The bounds a `put` is checked against, inside its write transaction.
#[derive(Debug, Clone, Copy)]
struct Limits {
    max_entries: u64,
    max_bytes: u64,
}

/// Configures and opens a [`RedbStore`].
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("dead-letters.redb");
/// use tower_poison::store::RedbStore;
///
/// let store = RedbStore::builder()
///     .max_entries(10_000)
///     .max_bytes(256 << 20)
///     .max_pending_writes(256)
///     .open(&path)?; // /var/lib/orders/dead-letters.redb
/// # drop(store);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RedbStoreBuilder {
    max_batch: usize,
    max_pending_writes: usize,
    limits: Limits,
}

impl Default for RedbStoreBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl RedbStoreBuilder {
    /// The defaults: group commit of up to 256 entries, at most 100,000
    /// entries and 1 GiB, a writer queue of 1024.
    const fn new() -> Self {
        RedbStoreBuilder {
            max_batch: 256,
            max_pending_writes: 1024,
            limits: Limits {
                max_entries: 100_000,
                max_bytes: 1 << 30,
            },
        }
    }

    /// At most `max_batch` entries per write transaction (default 256); `1`
    /// commits every entry on its own. Zero is treated as one.
    pub const fn max_batch(mut self, max_batch: usize) -> Self {
        self.max_batch = if max_batch == 0 { 1 } else { max_batch };
        self
    }

    /// Holds at most `max_entries` entries (default 100,000: more than an
    /// operator triages by hand, few enough that a full `list`, `stats` or
    /// `purge` takes seconds); a `put` of a new id past it fails with
    /// [`StoreErrorKind::Full`].
    pub const fn max_entries(mut self, max_entries: u64) -> Self {
        self.limits.max_entries = max_entries;
        self
    }

    /// Holds at most `max_bytes` of encoded entries (default 1 GiB: at least
    /// 16,000 entries with full 64 KiB bodies, while a scanner's flood
    /// cannot fill the disk); a `put` that would pass it fails with
    /// [`StoreErrorKind::Full`].
    pub const fn max_bytes(mut self, max_bytes: u64) -> Self {
        self.limits.max_bytes = max_bytes;
        self
    }

    /// Queues at most `max_pending_writes` entries for the writer thread
    /// (default 1024: four full group commits); past it `put` waits for
    /// room. Zero is treated as one.
    pub const fn max_pending_writes(mut self, max_pending_writes: usize) -> Self {
        let n = max_pending_writes;
        self.max_pending_writes = if n == 0 { 1 } else { n };
        self
    }

    /// Opens the store at `path`, creating the file if it does not exist.
    /// Blocking file I/O (and, after a crash, redb's repair): call it at
    /// start-up or inside `spawn_blocking`.
    pub fn open(self, path: impl AsRef<Path>) -> Result<RedbStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let what = format!("cannot open dead-letter store {}", path.display());
        let db = Database::create(&path).map_err(|e| StoreError::backend(what, e))?;
        let depth = prepare(&db)?;

        let writer = Arc::new(Writer {
            db: Arc::new(db),
            depth: AtomicU64::new(depth),
            path,
            limits: self.limits,
            max_batch: self.max_batch,
        });
        let (queue, queued) = mpsc::channel(self.max_pending_writes);
        let writing = Arc::clone(&writer);
        let thread = std::thread::Builder::new()
            .name("tower-poison-redb".into())
            .spawn(move || writing.run(queued))
            .map_err(|e| StoreError::backend("cannot start the dead-letter writer thread", e))?;
        Ok(RedbStore {
            inner: Arc::new(Inner {
                writer,
                queue: Some(queue),
                thread: Some(thread),
            }),
        })
    }
}

/// Creates the tables up front (so readers never see a missing one), and
/// the label and byte counts of a file written before there were any;
/// returns the depth.
fn prepare(db: &Database) -> Result<u64, StoreError> {
    let txn = db.begin_write().map_err(backend)?;
    let depth = {
        let entries = txn.open_table(ENTRIES).map_err(backend)?;
        let mut meta = txn.open_table(META).map_err(backend)?;
        txn.open_table(CLAIMS).map_err(backend)?;
        let mut labels = txn.open_table(LABELS).map_err(backend)?;
        let count_labels = meta.get(LABELS_COUNTED).map_err(backend)?.is_none();
        if count_labels || meta.get(ENTRY_BYTES).map_err(backend)?.is_none() {
            let mut bytes = 0u64;
            for item in entries.iter().map_err(backend)? {
                let (_, value) = item.map_err(backend)?;
                bytes = bytes.saturating_add(value.value().len() as u64);
                // An entry that does not decode has no label to count.
                if let Some(label) = label_of(value.value()).filter(|_| count_labels) {
                    add_label(&mut labels, &label, 1)?;
                }
            }
            meta.insert(LABELS_COUNTED, 1).map_err(backend)?;
            meta.insert(ENTRY_BYTES, bytes).map_err(backend)?;
        }
        entries.len().map_err(backend)?
    };
    txn.delete_table(UNTOKENED_CLAIMS).map_err(backend)?;
    txn.commit().map_err(backend)?;
    Ok(depth)
}

impl RedbStore {
    /// A builder: `RedbStore::builder().open(path)` opens the store with
    /// the default settings.
    pub const fn builder() -> RedbStoreBuilder {
        RedbStoreBuilder::new()
    }

    async fn blocking<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Database) -> Result<T, StoreError> + Send + 'static,
    {
        blocking(&self.inner.writer.db, "dead-letter store task failed", f).await
    }
}

/// Runs `f` on `db` in `spawn_blocking`, off the executor; `task` names a
/// task that panicked.
pub(crate) async fn blocking<T, F>(
    db: &Arc<Database>,
    task: &'static str,
    f: F,
) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: FnOnce(&Database) -> Result<T, StoreError> + Send + 'static,
{
    let db = Arc::clone(db);
    let done = tokio::task::spawn_blocking(move || f(&db)).await;
    done.map_err(|e| StoreError::backend(task, e))?
}

fn backend(error: impl Into<redb::Error>) -> StoreError {
    StoreError::backend("dead-letter store failed", error.into())
}

/// Ends the claims and takes the label counts and bytes of the entries
/// `txn` removed (each its key, label and size), commits, and takes them off
/// `depth`; returns how many there were.
fn forget_removed(
    txn: WriteTransaction,
    depth: &AtomicU64,
    gone: &[(u128, Option<String>, usize)],
) -> Result<u64, StoreError> {
    {
        let mut claims = txn.open_table(CLAIMS).map_err(backend)?;
        let mut labels = txn.open_table(LABELS).map_err(backend)?;
        let mut meta = txn.open_table(META).map_err(backend)?;
        let mut bytes = meta
            .get(ENTRY_BYTES)
            .map_err(backend)?
            .map_or(0, |v| v.value());
        for (key, label, size) in gone {
            claims.remove(*key).map_err(backend)?;
            if let Some(label) = label {
                add_label(&mut labels, label, -1)?;
            }
            bytes = bytes.saturating_sub(*size as u64);
        }
        meta.insert(ENTRY_BYTES, bytes).map_err(backend)?;
    }
    txn.commit().map_err(backend)?;
    subtract_depth(depth, gone.len() as u64);
    Ok(gone.len() as u64)
}

/// Adds `delta` (+1 or -1) to `label`'s count in `labels`; returns the
/// count now. A count that reaches zero is removed, so the table holds only
/// labels that have entries.
fn add_label(
    labels: &mut redb::Table<'_, &str, u64>,
    label: &str,
    delta: i64,
) -> Result<u64, StoreError> {
    let current = labels.get(label).map_err(backend)?.map_or(0, |v| v.value());
    let count = current.saturating_add_signed(delta);
    if count == 0 {
        labels.remove(label).map_err(backend)?;
    } else {
        labels.insert(label, count).map_err(backend)?;
    }
    Ok(count)
}

/// The label of the stored entry `bytes` (`None` when it does not decode).
fn label_of(bytes: &[u8]) -> Option<String> {
    DeadLetterEntry::from_bytes(bytes).ok().map(|e| e.label)
}

/// Takes `count` off the depth counter, after the commit that removed them.
///
/// Saturating: the writer counts entries before their commit, so a removal
/// never overtakes the addition of what it removes; should the counter ever
/// be short all the same, `depth` reads 0, not a wrapped `u64::MAX`.
fn subtract_depth(depth: &AtomicU64, count: u64) {
    let _ = depth.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |current| {
        Some(current.saturating_sub(count))
    });
}

/// The database and what the writer thread writes to it with, shared with
/// the store's clones.
struct Writer {
    db: Arc<Database>,
    /// The number of entries, so `depth` needs no transaction (redb's file
    /// lock keeps other processes out); see `Writer::write_batch`.
    depth: AtomicU64,
    path: PathBuf,
    limits: Limits,
    max_batch: usize,
}

impl Writer {
    /// Takes what is queued (up to `max_batch`), commits it in one durable
    /// transaction, then acknowledges every entry of the batch. Ends when
    /// every sender is gone and the queue is drained.
    fn run(self: Arc<Self>, mut queue: mpsc::Receiver<Put>) {
        while let Some(first) = queue.blocking_recv() {
            let mut batch = vec![first];
            while batch.len() < self.max_batch {
                let Ok(put) = queue.try_recv() else { break };
                batch.push(put);
            }
            let acks = match self.write_batch(&batch) {
                Ok(outcomes) => outcomes,
                Err(error) => {
                    let text = crate::entry::error_chain(&error).join(": ");
                    let failed = || Err(StoreError::new(error.kind(), text.clone()));
                    batch.iter().map(|_| failed()).collect()
                }
            };
            for (put, ack) in batch.into_iter().zip(acks) {
                // The caller may have gone away (its call was cancelled); the
                // entry is stored all the same.
                let _ = put.ack.send(ack);
            }
        }
    }

    /// Writes `batch` in one durable transaction. Each entry is checked
    /// against the limits on its own, in order: one that does not fit is
    /// refused without failing the others. Returns each entry's outcome:
    /// for those kept, how many entries the entry's label has once its put
    /// is counted.
    fn write_batch(&self, batch: &[Put]) -> Result<Vec<Result<u64, StoreError>>, StoreError> {
        let mut txn = self.db.begin_write().map_err(backend)?;
        txn.set_durability(Durability::Immediate).map_err(backend)?;
        let mut kept = Vec::with_capacity(batch.len());
        let (before, after) = {
            let mut entries = txn.open_table(ENTRIES).map_err(backend)?;
            let mut meta = txn.open_table(META).map_err(backend)?;
            let mut labels = txn.open_table(LABELS).map_err(backend)?;
            let before = entries.len().map_err(backend)?;
            let mut depth = before;
            let stored_bytes = meta.get(ENTRY_BYTES).map_err(backend)?;
            let mut bytes = stored_bytes.map_or(0, |v| v.value());
            for put in batch {
                let (replaced, old_label) = match entries.get(put.key).map_err(backend)? {
                    Some(old) => (Some(old.value().len() as u64), label_of(old.value())),
                    None => (None, None),
                };
                let new_depth = depth + u64::from(replaced.is_none());
                let new_bytes = bytes
                    .saturating_sub(replaced.unwrap_or(0))
                    .saturating_add(put.value.len() as u64);
                // Only what a put adds is checked: replacing an entry with
                // one no larger always succeeds, even past lowered limits.
                let (max_entries, max_bytes) = (self.limits.max_entries, self.limits.max_bytes);
                let full = if replaced.is_none() && new_depth > max_entries {
                    format!("max_entries {max_entries} reached")
                } else if new_bytes > bytes && new_bytes > max_bytes {
                    format!("{new_bytes} bytes would pass max_bytes {max_bytes}")
                } else {
                    String::new()
                };
                if !full.is_empty() {
                    let full = format!("dead-letter store {} is full: {full}", self.path.display());
                    kept.push(Err(StoreError::new(StoreErrorKind::Full, full)));
                    continue;
                }
                entries
                    .insert(put.key, put.value.as_slice())
                    .map_err(backend)?;
                (depth, bytes) = (new_depth, new_bytes);
                let moved = old_label.as_deref() != Some(put.label.as_str());
                if let Some(old) = old_label.as_deref().filter(|_| moved) {
                    add_label(&mut labels, old, -1)?;
                }
                kept.push(Ok(add_label(&mut labels, &put.label, moved.into())?));
            }
            meta.insert(ENTRY_BYTES, bytes).map_err(backend)?;
            (before, depth)
        };
        if kept.iter().all(Result::is_err) {
            // A full store refused the whole batch: no commit, so a flood of
            // failures against a full store costs no fsync.
            txn.abort().map_err(backend)?;
        } else {
            // Counted before the commit, while this transaction still holds
            // redb's write lock: a removal of these entries can only start
            // after the commit, so its subtraction always comes after this
            // addition and the counter never dips below zero. A delta, not
            // the absolute count, because removals update it too.
            self.depth.fetch_add(after - before, Ordering::Relaxed);
            if let Err(error) = txn.commit() {
                subtract_depth(&self.depth, after - before);
                return Err(backend(error));
            }
        }
        Ok(kept)
    }
}

impl DeadLetterStore for RedbStore {
    async fn put(&self, entry: DeadLetterEntry) -> Result<(), StoreError> {
        self.put_with_depth(entry).await.map(drop)
    }

    async fn put_with_depth(&self, entry: DeadLetterEntry) -> Result<Option<u64>, StoreError> {
        let (ack, acked) = oneshot::channel();
        let put = Put {
            key: entry.id.as_u128(),
            value: entry.to_bytes(),
            label: entry.label,
            ack,
        };
        let closed =
            || StoreError::new(StoreErrorKind::Backend, "dead-letter store writer stopped");
        // Waits for room in the writer's queue: the back-pressure that keeps
        // a slow disk from growing memory.
        let queue = self.inner.queue.as_ref().ok_or_else(closed)?;
        queue.send(put).await.map_err(|_| closed())?;
        acked.await.map_err(|_| closed())?.map(Some)
    }

    async fn get(&self, id: EntryId) -> Result<Option<DeadLetterEntry>, StoreError> {
        self.blocking(move |db| {
            let txn = db.begin_read().map_err(backend)?;
            let table = txn.open_table(ENTRIES).map_err(backend)?;
            let value = table.get(id.as_u128()).map_err(backend)?;
            value.map(|value| decode(value.value())).transpose()
        })
        .await
    }

    async fn list(&self, query: ListQuery) -> Result<Page, StoreError> {
        self.blocking(move |db| {
            let txn = db.begin_read().map_err(backend)?;
            let table = txn.open_table(ENTRIES).map_err(backend)?;
            // After the greatest id there is nothing.
            let Some(start) = query.after.map_or(Some(0), |a| a.as_u128().checked_add(1)) else {
                return Ok(Page::new(Vec::new(), None));
            };
            let range = table.range(start..).map_err(backend)?;
            let range = range.map(|item| decode(item.map_err(backend)?.1.value()).map(Cow::Owned));
            page_of(&query, range)
        })
        .await
    }

    async fn match_prefix(
        &self,
        prefix: EntryIdPrefix,
        limit: usize,
    ) -> Result<PrefixMatches, StoreError> {
        self.blocking(move |db| {
            let (low, high) = prefix.range();
            let txn = db.begin_read().map_err(backend)?;
            let table = txn.open_table(ENTRIES).map_err(backend)?;
            let mut matches = PrefixMatches::default();
            // Keys only: an entry's value is never decoded.
            let range = table.range(low.as_u128()..=high.as_u128());
            for item in range.map_err(backend)? {
                let (key, _) = item.map_err(backend)?;
                matches.count += 1;
                if matches.ids.len() < limit {
                    matches.ids.push(EntryId::from_u128(key.value()));
                }
            }
            Ok(matches)
        })
        .await
    }

    async fn remove(&self, id: EntryId) -> Result<bool, StoreError> {
        let writer = Arc::clone(&self.inner.writer);
        self.blocking(move |db| {
            let txn = db.begin_write().map_err(backend)?;
            let mut entries = txn.open_table(ENTRIES).map_err(backend)?;
            let old = entries.remove(id.as_u128()).map_err(backend)?;
            let gone = old.map(|old| (id.as_u128(), label_of(old.value()), old.value().len()));
            drop(entries);
            Ok(forget_removed(txn, &writer.depth, gone.as_slice())? > 0)
        })
        .await
    }

    async fn purge(&self, filter: PurgeFilter) -> Result<u64, StoreError> {
        let writer = Arc::clone(&self.inner.writer);
        self.blocking(move |db| {
            let txn = db.begin_write().map_err(backend)?;
            let mut gone = Vec::new();
            let mut entries = txn.open_table(ENTRIES).map_err(backend)?;
            // An entry that does not decode is kept: purge removes by age,
            // and an unreadable entry's age is unknown.
            let purged = entries.retain(|key, value| {
                let entry = DeadLetterEntry::from_bytes(value).ok();
                let Some(entry) = entry.filter(|entry| filter.matches(entry)) else {
                    return true;
                };
                gone.push((key, Some(entry.label), value.len()));
                false
            });
            purged.map_err(backend)?;
            drop(entries);
            forget_removed(txn, &writer.depth, &gone)
        })
        .await
    }

    async fn claim(
        &self,
        id: EntryId,
        now: SystemTime,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.blocking(move |db| {
            let txn = db.begin_write().map_err(backend)?;
            let claim = {
                let entries = txn.open_table(ENTRIES).map_err(backend)?;
                let mut claims = txn.open_table(CLAIMS).map_err(backend)?;
                // A claim stays in the table past its lease until it is
                // released or its entry removed: one found whose lease is
                // over lapsed unreleased.
                let previous = claims.get(id.as_u128()).map_err(backend)?;
                let previous = previous.map(|held| held.value().0);
                let held = previous.filter(|&until| until > millis_since_epoch(now));
                let stored = entries.get(id.as_u128()).map_err(backend)?;
                let claim = match (stored, held) {
                    (None, _) => Claim::NotFound,
                    (Some(_), Some(until)) => Claim::Held {
                        until: time_from_millis(until),
                    },
                    (Some(value), None) => {
                        let entry = decode(value.value())?;
                        let token = ClaimToken::generate();
                        let held = (lease_end(now, lease), token.as_u128());
                        claims.insert(id.as_u128(), held).map_err(backend)?;
                        Claim::Claimed {
                            entry,
                            token,
                            previous_claim_lapsed: previous.is_some(),
                        }
                    }
                };
                claim
            };
            if matches!(claim, Claim::Claimed { .. }) {
                txn.commit().map_err(backend)?;
            } else {
                txn.abort().map_err(backend)?;
            }
            Ok(claim)
        })
        .await
    }

    async fn release(&self, id: EntryId, token: ClaimToken) -> Result<(), StoreError> {
        self.blocking(move |db| {
            let txn = db.begin_write().map_err(backend)?;
            let released = {
                let mut claims = txn.open_table(CLAIMS).map_err(backend)?;
                let held = claims.get(id.as_u128()).map_err(backend)?;
                let holds = held.is_some_and(|held| held.value().1 == token.as_u128());
                if holds {
                    claims.remove(id.as_u128()).map_err(backend)?;
                }
                holds
            };
            if released {
                txn.commit().map_err(backend)
            } else {
                // Another claim holds the entry (or none does): leave it.
                txn.abort().map_err(backend)
            }
        })
        .await
    }

    async fn depth(&self) -> Result<u64, StoreError> {
        Ok(self.inner.writer.depth.load(Ordering::Relaxed))
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the queue ends the writer loop; joining makes sure the file
        // lock is released when the last clone is gone, so the same process
        // can open the store again.
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedbStore")
            .field("path", &self.inner.writer.path)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use tower_classify::FailureKind;

    fn entry() -> DeadLetterEntry {
        let now = SystemTime::now();
        DeadLetterEntry {
            id: EntryId::generate(now),
            label: "orders".into(),
            message_id: None,
            method: None,
            uri: None,
            headers: Vec::new(),
            body: Bytes::from_static(b"{}"),
            body_truncated: false,
            body_len: None,
            error: vec!["failed".into()],
            kind: FailureKind::ServerError,
            attempts: 1,
            first_failed_at: now,
            last_failed_at: now,
            replays: Vec::new(),
            failed_replays: 0,
            replay_server_errors: 0,
            replay_key_pinned: false,
        }
    }

    /// A removal never takes the depth below zero, even when the counter is
    /// short of what is stored (it reads 0, not a wrapped `u64::MAX`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_depth_counter_saturates_at_zero() {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::builder()
            .open(dir.path().join("dlq.redb"))
            .unwrap();
        let (a, b) = (entry(), entry());
        store.put(a.clone()).await.unwrap();
        store.put(b.clone()).await.unwrap();
        assert_eq!(store.depth().await.unwrap(), 2);
        // As if the removals overtook the writer's count.
        store.inner.writer.depth.store(0, Ordering::Relaxed);
        assert!(store.remove(a.id).await.unwrap());
        assert_eq!(store.depth().await.unwrap(), 0);
        assert_eq!(store.purge(PurgeFilter::default()).await.unwrap(), 1);
        assert_eq!(store.depth().await.unwrap(), 0);
    }

    /// With the writer stuck (another write transaction holds redb's write
    /// lock), the queue fills to its bound and further puts wait without
    /// holding the runtime's only thread; once the writer moves on, every
    /// put completes and is durable.
    #[tokio::test(flavor = "current_thread")]
    async fn puts_past_the_queue_bound_wait_asynchronously_then_all_complete() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dlq.redb");
        let store = RedbStore::builder()
            .max_pending_writes(2)
            .max_batch(1)
            .open(&path)
            .unwrap();
        let stall = store.inner.writer.db.begin_write().unwrap();

        let puts: Vec<_> = (0..6)
            .map(|_| {
                let store = store.clone();
                let e = entry();
                let id = e.id;
                tokio::spawn(async move { store.put(e).await.map(|()| id) })
            })
            .collect();
        let writer = store.inner.queue.clone().unwrap();
        // The writer takes at most one entry before it blocks on the write
        // lock, so two are queued and at least three puts wait for room.
        for _ in 0..1_000 {
            if writer.capacity() == 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(writer.capacity(), 0, "the queue is at its bound of 2");
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(writer.capacity(), 0, "nothing went past the bound");
        assert!(
            puts.iter().all(|put| !put.is_finished()),
            "every put waits (this thread still runs: the waiting is async)"
        );
        drop(writer);

        stall.abort().unwrap();
        let mut ids = Vec::new();
        for put in puts {
            ids.push(put.await.unwrap().unwrap());
        }
        drop(store);
        let store = RedbStore::builder().open(&path).unwrap();
        assert_eq!(store.depth().await.unwrap(), 6);
        for id in ids {
            assert!(store.get(id).await.unwrap().is_some());
        }
    }
}
