//! The bounded in-memory store.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use super::{
    lease_end, millis_since_epoch, page_of, time_from_millis, Claim, ClaimToken, DeadLetterStore,
    LabelDepths, ListQuery, Page, PrefixMatches, PurgeFilter, StoreError, StoreErrorKind,
};
use crate::entry::{DeadLetterEntry, EntryId, EntryIdPrefix};

/// A bounded dead-letter store in memory, shared by clones.
///
/// It holds at most `capacity` entries and, when full, *refuses* a new one
/// with [`StoreErrorKind::Full`] rather than evict (the [`store`](super)
/// module's limits); replacing an existing id always succeeds. It counts
/// entries, not bytes: each is at most the layer's body limit, the
/// request's headers, its bounded error chain and its replay history.
/// [Claims](DeadLetterStore::claim) are kept under the same lock as the
/// entries, so a claim and a put or remove of the same id never interleave.
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
    inner: Arc<Mutex<State>>,
    capacity: usize,
}

#[derive(Debug, Default)]
struct State {
    entries: BTreeMap<EntryId, DeadLetterEntry>,
    /// Each claim: its token and when its lease ends, in milliseconds since
    /// the Unix epoch. Kept past its lease until released, so the next
    /// claim can tell it lapsed unreleased. Only ids present in `entries`:
    /// remove and purge end a claim.
    claims: HashMap<EntryId, Held>,
    /// How many entries each label has, updated under the same lock as
    /// `entries`; a label leaves the map with its last entry, so it holds
    /// no more keys than there are entries.
    labels: LabelDepths,
}

/// One claim on an entry.
#[derive(Debug, Clone, Copy)]
struct Held {
    token: ClaimToken,
    until: u64,
}

impl MemoryStore {
    /// An empty store holding at most `capacity` entries.
    pub fn new(capacity: usize) -> Self {
        MemoryStore {
            inner: Arc::new(Mutex::new(State::default())),
            capacity,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock, so a poisoned lock still
        // guards consistent data.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl DeadLetterStore for MemoryStore {
    async fn put(&self, entry: DeadLetterEntry) -> Result<(), StoreError> {
        self.put_with_depth(entry).await.map(drop)
    }

    async fn put_with_depth(&self, entry: DeadLetterEntry) -> Result<Option<u64>, StoreError> {
        let mut state = self.state();
        if state.entries.len() >= self.capacity && !state.entries.contains_key(&entry.id) {
            let full = format!(
                "in-memory dead-letter store is full ({} entries)",
                self.capacity
            );
            return Err(StoreError::new(StoreErrorKind::Full, full));
        }
        let label = entry.label.clone();
        if let Some(old) = state.entries.insert(entry.id, entry) {
            state.labels.remove(&old.label);
        }
        Ok(Some(state.labels.add(&label)))
    }

    async fn get(&self, id: EntryId) -> Result<Option<DeadLetterEntry>, StoreError> {
        Ok(self.state().entries.get(&id).cloned())
    }

    async fn list(&self, query: ListQuery) -> Result<Page, StoreError> {
        let state = self.state();
        let start = query.after.map_or(Bound::Unbounded, Bound::Excluded);
        let range = state.entries.range((start, Bound::Unbounded));
        page_of(&query, range.map(|(_, e)| Ok(Cow::Borrowed(e))))
    }

    // The ids in range, under one lock, without cloning an entry.
    async fn match_prefix(
        &self,
        prefix: EntryIdPrefix,
        limit: usize,
    ) -> Result<PrefixMatches, StoreError> {
        let (low, high) = prefix.range();
        let state = self.state();
        let mut matches = PrefixMatches::default();
        for id in state.entries.range(low..=high).map(|(id, _)| *id) {
            matches.count += 1;
            if matches.ids.len() < limit {
                matches.ids.push(id);
            }
        }
        Ok(matches)
    }

    async fn remove(&self, id: EntryId) -> Result<bool, StoreError> {
        let mut state = self.state();
        state.claims.remove(&id);
        let removed = state.entries.remove(&id);
        if let Some(old) = &removed {
            state.labels.remove(&old.label);
        }
        Ok(removed.is_some())
    }

    async fn purge(&self, filter: PurgeFilter) -> Result<u64, StoreError> {
        let mut state = self.state();
        let State {
            entries,
            claims,
            labels,
        } = &mut *state;
        let before = entries.len();
        entries.retain(|_, entry| {
            let matches = filter.matches(entry);
            if matches {
                labels.remove(&entry.label);
            }
            !matches
        });
        claims.retain(|id, _| entries.contains_key(id));
        Ok((before - entries.len()) as u64)
    }

    async fn claim(
        &self,
        id: EntryId,
        now: SystemTime,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let mut state = self.state();
        let Some(entry) = state.entries.get(&id).cloned() else {
            return Ok(Claim::NotFound);
        };
        // A claim stays in the map past its lease until it is released or
        // its entry removed: one found here whose lease is over lapsed
        // unreleased.
        let previous_claim_lapsed = match state.claims.get(&id) {
            Some(held) if held.until > millis_since_epoch(now) => {
                return Ok(Claim::Held {
                    until: time_from_millis(held.until),
                });
            }
            held => held.is_some(),
        };
        let token = ClaimToken::generate();
        let until = lease_end(now, lease);
        state.claims.insert(id, Held { token, until });
        Ok(Claim::Claimed {
            entry,
            token,
            previous_claim_lapsed,
        })
    }

    async fn release(&self, id: EntryId, token: ClaimToken) -> Result<(), StoreError> {
        let mut state = self.state();
        if state.claims.get(&id).is_some_and(|h| h.token == token) {
            state.claims.remove(&id);
        }
        Ok(())
    }

    async fn depth(&self) -> Result<u64, StoreError> {
        Ok(self.state().entries.len() as u64)
    }

    async fn oldest_age(&self, now: SystemTime) -> Result<Option<Duration>, StoreError> {
        let state = self.state();
        Ok(state.entries.values().map(|entry| entry.age(now)).max())
    }
}
