//! Dead-letter stores: where entries are kept until an operator acts on them.
//!
//! [`DeadLetterStore`] is the interface the layer, [replay](mod@crate::replay)
//! and the CLI use. Three implementations ship here:
//!
//! - [`RedbStore`] (feature `redb`, on by default): the default, an embedded
//!   durable store in one file. An entry is acknowledged only after the
//!   transaction holding it has committed durably, so a crash never loses an
//!   acknowledged entry.
//! - [`MemoryStore`]: bounded, in memory, for tests and for services that can
//!   afford to lose their dead letters on restart. When full it refuses new
//!   entries (the call fails) rather than evicting old ones.
//!
//! - [`RedisDeadLetterStore`] (feature `redis`): for a fleet of nodes, one
//!   Redis stream per queue that every node writes and the CLI reads.

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime};

use tower_classify::FailureKind;

use crate::entry::{DeadLetterEntry, EntryId};

mod memory;
#[cfg(feature = "redb")]
mod redb;
#[cfg(feature = "redis")]
pub(crate) mod redis;

pub use self::memory::MemoryStore;
#[cfg(feature = "redb")]
pub use self::redb::{RedbStore, RedbStoreBuilder};
#[cfg(feature = "redis")]
pub use self::redis::{RedisConnectOptions, RedisDeadLetterStore, RedisDeadLetterStoreBuilder};

/// A place to keep dead-letter entries.
///
/// Every method is asynchronous and returns a `Send` future, so the layer can
/// await it inside any tower stack. Implementations are cheap to clone and
/// share their state between clones.
///
/// [`put`](Self::put) is an upsert keyed by [`DeadLetterEntry::id`]:
/// [replay](mod@crate::replay) uses it to update a failed entry in place. It must
/// return only once the entry is as durable as the store promises; an error
/// means the entry was *not* kept.
pub trait DeadLetterStore: Clone + Send + Sync + 'static {
    /// Stores `entry`, replacing any entry with the same id.
    fn put(&self, entry: DeadLetterEntry) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The entry with `id`.
    fn get(
        &self,
        id: EntryId,
    ) -> impl Future<Output = Result<Option<DeadLetterEntry>, StoreError>> + Send;

    /// One page of entries in id (creation) order, filtered by `query`.
    fn list(&self, query: ListQuery) -> impl Future<Output = Result<Page, StoreError>> + Send;

    /// Removes the entry with `id`; `true` when there was one.
    fn remove(&self, id: EntryId) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Removes every entry matching `filter`; returns how many.
    fn purge(&self, filter: PurgeFilter) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// How many entries the store holds.
    fn depth(&self) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// How long ago the oldest entry first failed (`None` when empty).
    fn oldest_age(
        &self,
        now: SystemTime,
    ) -> impl Future<Output = Result<Option<Duration>, StoreError>> + Send;

    /// Depth, oldest age and counts by failure kind, by paging through
    /// [`list`](Self::list). Stores with an index may answer faster.
    fn stats(&self, now: SystemTime) -> impl Future<Output = Result<Stats, StoreError>> + Send {
        async move {
            let mut stats = Stats::default();
            let mut query = ListQuery::new().limit(1024);
            loop {
                let page = self.list(query.clone()).await?;
                for entry in &page.entries {
                    stats.depth += 1;
                    *stats
                        .by_kind
                        .entry(entry.kind.as_str().to_owned())
                        .or_default() += 1;
                    let age = entry.age(now);
                    stats.oldest_age = Some(stats.oldest_age.map_or(age, |o: Duration| o.max(age)));
                }
                match page.next {
                    Some(next) => query = query.after(next),
                    None => return Ok(stats),
                }
            }
        }
    }
}

/// Which entries [`DeadLetterStore::list`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    /// Only entries with an id greater than this (the previous page's
    /// [`Page::next`]).
    pub after: Option<EntryId>,
    /// At most this many entries (default 100).
    pub limit: usize,
    /// Only entries of this failure kind.
    pub kind: Option<FailureKind>,
    /// Only entries with this label.
    pub label: Option<String>,
    /// Only entries that first failed before this time.
    pub failed_before: Option<SystemTime>,
}

impl Default for ListQuery {
    fn default() -> Self {
        Self::new()
    }
}

impl ListQuery {
    /// The first 100 entries, unfiltered.
    pub const fn new() -> Self {
        ListQuery {
            after: None,
            limit: 100,
            kind: None,
            label: None,
            failed_before: None,
        }
    }

    /// Starts after `id`.
    pub fn after(mut self, id: EntryId) -> Self {
        self.after = Some(id);
        self
    }

    /// Returns at most `limit` entries.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Only entries of `kind`.
    pub fn kind(mut self, kind: FailureKind) -> Self {
        self.kind = Some(kind);
        self
    }

    /// Only entries labelled `label`.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// `true` when `entry` passes the filters (not the cursor or limit).
    pub fn matches(&self, entry: &DeadLetterEntry) -> bool {
        self.kind.is_none_or(|kind| entry.kind == kind)
            && self
                .label
                .as_ref()
                .is_none_or(|label| &entry.label == label)
            && self
                .failed_before
                .is_none_or(|before| entry.first_failed_at < before)
    }
}

/// One page of [`DeadLetterStore::list`].
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// The entries, in id order.
    pub entries: Vec<DeadLetterEntry>,
    /// Where the next page starts, when there may be one.
    pub next: Option<EntryId>,
}

/// Which entries [`DeadLetterStore::purge`] removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PurgeFilter {
    /// Only entries that first failed before this time; `None` removes all.
    pub failed_before: Option<SystemTime>,
}

impl PurgeFilter {
    /// Every entry.
    pub const fn all() -> Self {
        PurgeFilter {
            failed_before: None,
        }
    }

    /// Entries whose first failure is more than `age` before `now`.
    pub fn older_than(age: Duration, now: SystemTime) -> Self {
        PurgeFilter {
            failed_before: Some(now.checked_sub(age).unwrap_or(std::time::UNIX_EPOCH)),
        }
    }

    /// `true` when `entry` is to be removed.
    pub fn matches(&self, entry: &DeadLetterEntry) -> bool {
        self.failed_before
            .is_none_or(|before| entry.first_failed_at < before)
    }
}

/// What [`DeadLetterStore::stats`] reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// How many entries there are.
    pub depth: u64,
    /// How long ago the oldest entry first failed.
    pub oldest_age: Option<Duration>,
    /// Entries per failure kind name.
    pub by_kind: BTreeMap<String, u64>,
}

/// A store could not do what was asked.
///
/// The [`kind`](Self::kind) tells a full store (back-pressure) from a broken
/// one; the source, when there is one, is the backend's own error.
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    message: String,
    source: Option<Box<dyn Error + Send + Sync>>,
}

/// What kind of store failure a [`StoreError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store is at its capacity.
    Full,
    /// The backend failed (I/O, a lock, a closed store).
    Backend,
    /// A stored entry could not be decoded.
    Corrupt,
}

impl StoreError {
    /// An error of `kind` described by `message`.
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        StoreError {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// A backend failure caused by `source`.
    pub fn backend(
        message: impl Into<String>,
        source: impl Into<Box<dyn Error + Send + Sync>>,
    ) -> Self {
        StoreError {
            kind: StoreErrorKind::Backend,
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// A stored value that could not be decoded, because of `source`.
    #[cfg_attr(not(any(feature = "redb", feature = "redis")), allow(dead_code))]
    pub(crate) fn corrupt(
        message: impl Into<String>,
        source: impl Into<Box<dyn Error + Send + Sync>>,
    ) -> Self {
        StoreError {
            kind: StoreErrorKind::Corrupt,
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error for StoreError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}
