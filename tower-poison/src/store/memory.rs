//! The bounded in-memory store.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::{DeadLetterStore, ListQuery, Page, PurgeFilter, StoreError, StoreErrorKind};
use crate::entry::{DeadLetterEntry, EntryId};

/// A bounded dead-letter store in memory.
///
/// It holds at most `capacity` entries. When full it *refuses* a new entry
/// with a [`StoreErrorKind::Full`] error (so the call fails, visibly) instead
/// of evicting an older one: dead letters are evidence, and dropping the
/// oldest silently is exactly the loss a dead-letter queue exists to prevent.
/// Replacing an existing id always succeeds.
///
/// Clones share the same entries.
///
/// ```
/// # tokio_test::block_on(async {
/// use tower_poison::store::{DeadLetterStore, MemoryStore};
///
/// let store = MemoryStore::new(10_000);
/// assert_eq!(store.depth().await.unwrap(), 0);
/// # });
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Mutex<BTreeMap<EntryId, DeadLetterEntry>>>,
    capacity: usize,
}

impl MemoryStore {
    /// An empty store holding at most `capacity` entries.
    pub fn new(capacity: usize) -> Self {
        MemoryStore {
            inner: Arc::new(Mutex::new(BTreeMap::new())),
            capacity,
        }
    }

    /// The most entries the store holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, BTreeMap<EntryId, DeadLetterEntry>> {
        // Nothing panics while holding the lock, so a poisoned lock still
        // guards consistent data.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl DeadLetterStore for MemoryStore {
    async fn put(&self, entry: DeadLetterEntry) -> Result<(), StoreError> {
        let mut entries = self.entries();
        if entries.len() >= self.capacity && !entries.contains_key(&entry.id) {
            return Err(StoreError::new(
                StoreErrorKind::Full,
                format!(
                    "in-memory dead-letter store is full ({} entries)",
                    self.capacity
                ),
            ));
        }
        entries.insert(entry.id, entry);
        Ok(())
    }

    async fn get(&self, id: EntryId) -> Result<Option<DeadLetterEntry>, StoreError> {
        Ok(self.entries().get(&id).cloned())
    }

    async fn list(&self, query: ListQuery) -> Result<Page, StoreError> {
        let entries = self.entries();
        let range = match query.after {
            Some(after) => {
                entries.range((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
            }
            None => entries.range(..),
        };
        let mut page = Vec::new();
        let mut next = None;
        for entry in range.map(|(_, entry)| entry) {
            if page.len() == query.limit {
                next = page.last().map(|e: &DeadLetterEntry| e.id);
                break;
            }
            if query.matches(entry) {
                page.push(entry.clone());
            }
        }
        Ok(Page {
            entries: page,
            next,
        })
    }

    async fn remove(&self, id: EntryId) -> Result<bool, StoreError> {
        Ok(self.entries().remove(&id).is_some())
    }

    async fn purge(&self, filter: PurgeFilter) -> Result<u64, StoreError> {
        let mut entries = self.entries();
        let before = entries.len();
        entries.retain(|_, entry| !filter.matches(entry));
        Ok((before - entries.len()) as u64)
    }

    async fn depth(&self) -> Result<u64, StoreError> {
        Ok(self.entries().len() as u64)
    }

    async fn oldest_age(&self, now: SystemTime) -> Result<Option<Duration>, StoreError> {
        Ok(self.entries().values().map(|entry| entry.age(now)).max())
    }
}
