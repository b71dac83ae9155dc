//! Dead-letter stores: where entries are kept until an operator acts on them.
//!
//! [`DeadLetterStore`] is the interface the layer, [replay](mod@crate::replay)
//! and the CLI use; the crate docs compare the three stores here.
//!
//! # Limits
//!
//! A `put` past a limit fails with [`StoreErrorKind::Full`] and keeps nothing
//! (the crate docs' [stores](crate#stores) say why nothing is evicted).
//! Replacing an entry counts only the difference in size, and one no larger
//! always succeeds; `remove` and `purge` give their bytes back; `u64::MAX`
//! lifts a limit.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tower_classify::FailureKind;

use crate::entry::{DeadLetterEntry, EntryId, EntryIdPrefix};

mod memory;
#[cfg(feature = "redb")]
pub(crate) mod redb;
#[cfg(feature = "redis")]
mod redis;

pub use self::memory::MemoryStore;
#[cfg(feature = "redb")]
pub use self::redb::{RedbStore, RedbStoreBuilder};
#[cfg(feature = "redis")]
pub use self::redis::{RedisDeadLetterStore, RedisDeadLetterStoreBuilder};
/// What a dead-letter or poison count store fails with (from
/// `tower-store-support`, shared by the family's stores); the layer's
/// errors keep it as their [`source`](std::error::Error::source).
pub use tower_store_support::StoreError;
pub use tower_store_support::StoreErrorKind;
/// How the Redis stores connect (from `tower-store-support`).
#[cfg(feature = "redis")]
pub use tower_store_support::{RedisConnectOptions, RedisConnection};

/// A place to keep dead-letter entries.
///
/// Every method returns a `Send` future. Implementations are cheap to clone
/// and share their state between clones.
pub trait DeadLetterStore: Clone + Send + Sync + 'static {
    /// Stores `entry`, replacing any entry with the same id (replay updates
    /// a failed entry in place), and returns once it is as durable as the
    /// store promises; an error means it was *not* kept.
    ///
    /// A [claim](Self::claim) on the id is left as it is: a layer recording
    /// a replayed call's failure must not free the entry for a second
    /// replayer while the first is still finishing.
    fn put(&self, entry: DeadLetterEntry) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Stores `entry` as [`put`](Self::put) does and returns how many
    /// entries its *label* has after the write, when the write itself tells
    /// it: the layer's `tower_poison_dlq_depth{label}` gauge (see
    /// [`describe_metrics`](crate::describe_metrics)). The provided
    /// implementation reports `None`, and the layer then sets no gauge.
    fn put_with_depth(
        &self,
        entry: DeadLetterEntry,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send {
        async move {
            self.put(entry).await?;
            Ok(None)
        }
    }

    /// The entry with `id`.
    fn get(
        &self,
        id: EntryId,
    ) -> impl Future<Output = Result<Option<DeadLetterEntry>, StoreError>> + Send;

    /// One page of entries in id (creation) order, filtered by `query`.
    fn list(&self, query: ListQuery) -> impl Future<Output = Result<Page, StoreError>> + Send;

    /// The ids that start with `prefix`: how many there are, and the first
    /// `limit` of them in id order (how the CLI accepts a short id).
    ///
    /// The provided implementation pages through [`list`](Self::list) from
    /// the start of the prefix's [range](EntryIdPrefix::range).
    fn match_prefix(
        &self,
        prefix: EntryIdPrefix,
        limit: usize,
    ) -> impl Future<Output = Result<PrefixMatches, StoreError>> + Send {
        async move {
            let (low, high) = prefix.range();
            let mut matches = PrefixMatches::default();
            let mut query = ListQuery {
                limit: 1024,
                ..ListQuery::default()
            };
            query.after = low.as_u128().checked_sub(1).map(EntryId::from_u128);
            loop {
                let page = self.list(query.clone()).await?;
                for entry in &page.entries {
                    if entry.id > high {
                        return Ok(matches);
                    }
                    matches.count += 1;
                    if matches.ids.len() < limit {
                        matches.ids.push(entry.id);
                    }
                }
                match page.next {
                    Some(next) if next < high => query.after = Some(next),
                    _ => return Ok(matches),
                }
            }
        }
    }

    /// Removes the entry with `id` and any claim on it (there is nothing
    /// left to replay); `true` when there was one.
    fn remove(&self, id: EntryId) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Removes every entry matching `filter`, and their claims; returns how
    /// many.
    fn purge(&self, filter: PurgeFilter) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Claims entry `id` for `lease` so one replayer at a time sends it.
    ///
    /// Atomic: of two claims of one entry made at once, one is
    /// [`Claimed`](Claim::Claimed), with a fresh [`ClaimToken`], and the
    /// other sees [`Held`](Claim::Held). A claim is a lease, not a lock: once
    /// its lease has ended (judged by `now`, or by Redis's own clock) the
    /// entry is free again, so a replayer that dies holding one delays the
    /// replay by at most `lease`. Lease ends saturate at the end of the year
    /// 9999, so any `Duration` is accepted.
    ///
    /// A claim whose lease ended before it was [released](Self::release) is
    /// remembered until it is released or its entry removed, and the next
    /// claim reports it
    /// ([`previous_claim_lapsed`](Claim::Claimed::previous_claim_lapsed)):
    /// its replayer may have sent the entry and died. A store of your own
    /// must report it too.
    fn claim(
        &self,
        id: EntryId,
        now: SystemTime,
        lease: Duration,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Gives up the claim on `id` that `token` holds; does nothing when
    /// `token` no longer holds it, so a slow replayer never frees an entry
    /// another one is sending.
    fn release(
        &self,
        id: EntryId,
        token: ClaimToken,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// How many entries the store holds.
    fn depth(&self) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// How long ago the oldest entry first failed (`None` when empty); the
    /// provided implementation reads [`stats`](Self::stats), since ids come
    /// from many clocks and the first is not necessarily the oldest.
    fn oldest_age(
        &self,
        now: SystemTime,
    ) -> impl Future<Output = Result<Option<Duration>, StoreError>> + Send {
        async move { Ok(self.stats(now).await?.oldest_age) }
    }

    /// Depth, oldest age and counts by failure kind and label, by paging
    /// through [`list`](Self::list).
    fn stats(&self, now: SystemTime) -> impl Future<Output = Result<Stats, StoreError>> + Send {
        async move {
            let mut stats = Stats::default();
            let mut query = ListQuery {
                limit: 1024,
                ..ListQuery::default()
            };
            loop {
                let page = self.list(query.clone()).await?;
                for entry in &page.entries {
                    stats.count(entry, now);
                }
                match page.next {
                    Some(next) => query.after = Some(next),
                    None => return Ok(stats),
                }
            }
        }
    }
}

/// What [`DeadLetterStore::claim`] found.
// Unboxed: a claim is made once per replayed entry, so its size costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Claim {
    /// The caller holds the entry for its lease.
    Claimed {
        /// The entry as stored when it was claimed.
        entry: DeadLetterEntry,
        /// What [`DeadLetterStore::release`] needs to end this claim.
        token: ClaimToken,
        /// `true` when the claim before this one ran out of lease without
        /// being released, so its send may have been applied (a
        /// [`Replayer`](crate::replay::Replayer) then pins the idempotency
        /// key).
        previous_claim_lapsed: bool,
    },
    /// Another replayer holds it until `until`.
    Held {
        /// When the other replayer's lease ends.
        until: SystemTime,
    },
    /// There is no entry with that id.
    NotFound,
}

/// Names one [claim](DeadLetterStore::claim): only the replayer that got it
/// can [release](DeadLetterStore::release) it. Opaque random bits, new for
/// every claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClaimToken(u128);

impl ClaimToken {
    /// A token no other claim has.
    pub(crate) fn generate() -> Self {
        ClaimToken(fastrand::u128(..))
    }

    /// The token as a number, for a store to keep.
    #[cfg_attr(not(any(feature = "redb", feature = "redis")), allow(dead_code))]
    pub(crate) const fn as_u128(self) -> u128 {
        self.0
    }
}

/// The latest instant the stores write, in milliseconds since the epoch: the
/// end of 9999, a `SystemTime` everywhere, exact in Lua's doubles and valid
/// for Redis's `PX`, so no lease can wrap, panic or be refused.
pub(crate) const MAX_MILLIS: u64 = 253_402_300_799_999;

/// `duration` in whole milliseconds, saturating at [`MAX_MILLIS`].
pub(crate) fn saturating_millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .min(MAX_MILLIS)
}

/// `time` in milliseconds since the Unix epoch (`0` before it), saturating
/// at [`MAX_MILLIS`].
pub(crate) fn millis_since_epoch(time: SystemTime) -> u64 {
    saturating_millis(time.duration_since(UNIX_EPOCH).unwrap_or_default())
}

/// The instant `millis` after the Unix epoch, saturating at [`MAX_MILLIS`].
pub(crate) fn time_from_millis(millis: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(millis.min(MAX_MILLIS))
}

/// The entry stored as `bytes`; bytes that are not one are a corrupt store.
#[cfg_attr(not(any(feature = "redb", feature = "redis")), allow(dead_code))]
pub(crate) fn decode(bytes: &[u8]) -> Result<DeadLetterEntry, StoreError> {
    DeadLetterEntry::from_bytes(bytes)
        .map_err(|e| StoreError::corrupt("cannot decode a stored dead-letter entry", e))
}

/// When a lease of `lease` taken at `now` ends, as [`millis_since_epoch`].
pub(crate) fn lease_end(now: SystemTime, lease: Duration) -> u64 {
    millis_since_epoch(now)
        .saturating_add(saturating_millis(lease))
        .min(MAX_MILLIS)
}

/// Which entries [`DeadLetterStore::list`] returns: set the fields you need
/// over [`ListQuery::default`]'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    /// Only entries with an id greater than this (the previous page's
    /// [`Page::next`]).
    pub after: Option<EntryId>,
    /// At most this many entries (default 100). Zero is treated as one, so
    /// a page is empty only when no matching entry is left.
    pub limit: usize,
    /// Only entries of this failure kind.
    pub kind: Option<FailureKind>,
    /// Only entries with this label.
    pub label: Option<String>,
    /// Only entries that first failed before this time.
    pub failed_before: Option<SystemTime>,
}

/// The first 100 entries, unfiltered.
impl Default for ListQuery {
    fn default() -> Self {
        ListQuery {
            after: None,
            limit: 100,
            kind: None,
            label: None,
            failed_before: None,
        }
    }
}

impl ListQuery {
    /// `true` when `entry` passes the filters (not the cursor or limit).
    pub fn matches(&self, entry: &DeadLetterEntry) -> bool {
        self.kind.is_none_or(|kind| entry.kind == kind)
            && self.label.as_ref().is_none_or(|l| &entry.label == l)
            && self.failed_before.is_none_or(|b| entry.first_failed_at < b)
    }
}

/// Adds to `page` the entries of `entries` (those after the query's cursor,
/// in id order) that `query` matches; the page once it is full and another
/// entry follows. Borrowed entries are cloned only when they match.
pub(crate) fn fill_page<'a, I>(
    query: &ListQuery,
    page: &mut Vec<DeadLetterEntry>,
    entries: I,
) -> Result<Option<Page>, StoreError>
where
    I: IntoIterator<Item = Result<Cow<'a, DeadLetterEntry>, StoreError>>,
{
    for entry in entries {
        if page.len() == query.limit.max(1) {
            let next = page.last().map(|e: &DeadLetterEntry| e.id);
            return Ok(Some(Page::new(std::mem::take(page), next)));
        }
        let entry = entry?;
        if query.matches(&entry) {
            page.push(entry.into_owned());
        }
    }
    Ok(None)
}

/// The page of `query` from `entries`, all the store has after the cursor
/// ([`fill_page`] for a store that reads them in one pass).
pub(crate) fn page_of<'a, I>(query: &ListQuery, entries: I) -> Result<Page, StoreError>
where
    I: IntoIterator<Item = Result<Cow<'a, DeadLetterEntry>, StoreError>>,
{
    let mut page = Vec::new();
    let full = fill_page(query, &mut page, entries)?;
    Ok(full.unwrap_or_else(|| Page::new(page, None)))
}

/// One page of [`DeadLetterStore::list`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Page {
    /// The entries, in id order.
    pub entries: Vec<DeadLetterEntry>,
    /// Where the next page starts, when there may be one.
    pub next: Option<EntryId>,
}

impl Page {
    /// A page of `entries` (in id order), the next starting after `next`
    /// when there may be more.
    pub fn new(entries: Vec<DeadLetterEntry>, next: Option<EntryId>) -> Self {
        Page { entries, next }
    }
}

/// What [`DeadLetterStore::match_prefix`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PrefixMatches {
    /// How many ids start with the prefix.
    pub count: u64,
    /// The first of them, in id order, up to the limit asked for.
    pub ids: Vec<EntryId>,
}

impl PrefixMatches {
    /// The one id that matched, when exactly one did.
    pub fn unique(&self) -> Option<EntryId> {
        match (self.count, self.ids.as_slice()) {
            (1, [id]) => Some(*id),
            _ => None,
        }
    }
}

/// Which entries [`DeadLetterStore::purge`] removes: every entry
/// (`PurgeFilter::default()`) or those [older than](Self::older_than) an age.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PurgeFilter {
    /// Only entries that first failed before this time; `None` removes all.
    pub failed_before: Option<SystemTime>,
}

impl PurgeFilter {
    /// Entries whose first failure is more than `age` before `now`.
    pub fn older_than(age: Duration, now: SystemTime) -> Self {
        PurgeFilter {
            failed_before: Some(now.checked_sub(age).unwrap_or(std::time::UNIX_EPOCH)),
        }
    }

    /// `true` when `entry` is to be removed.
    pub fn matches(&self, entry: &DeadLetterEntry) -> bool {
        self.failed_before.is_none_or(|b| entry.first_failed_at < b)
    }
}

/// What [`DeadLetterStore::stats`] reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// How many entries there are.
    pub depth: u64,
    /// How long ago the oldest entry first failed.
    pub oldest_age: Option<Duration>,
    /// Entries per failure kind name.
    pub by_kind: BTreeMap<String, u64>,
    /// Entries per label.
    pub by_label: BTreeMap<String, u64>,
}

impl Stats {
    /// Counts `entry` in the statistics, its age measured against `now`.
    pub(crate) fn count(&mut self, entry: &DeadLetterEntry, now: SystemTime) {
        self.depth += 1;
        let kind = entry.kind.as_str().to_owned();
        *self.by_kind.entry(kind).or_default() += 1;
        *self.by_label.entry(entry.label.clone()).or_default() += 1;
        let age = entry.age(now);
        self.oldest_age = Some(self.oldest_age.map_or(age, |o: Duration| o.max(age)));
    }
}

/// How many entries each label has; a label leaves with its last entry.
#[derive(Debug, Default)]
pub(crate) struct LabelDepths(HashMap<String, u64>);

impl LabelDepths {
    /// One more entry for `label`; returns its count now.
    pub(crate) fn add(&mut self, label: &str) -> u64 {
        let count = match self.0.get_mut(label) {
            Some(count) => count,
            None => self.0.entry(label.to_owned()).or_default(),
        };
        *count += 1;
        *count
    }

    /// One entry fewer for `label`.
    pub(crate) fn remove(&mut self, label: &str) {
        if let Some(count) = self.0.get_mut(label) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.0.remove(label);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lease_maths_saturates_instead_of_wrapping_or_panicking() {
        let now = SystemTime::now();
        assert_eq!(saturating_millis(Duration::MAX), MAX_MILLIS);
        assert_eq!(lease_end(now, Duration::MAX), MAX_MILLIS);
        assert_eq!(
            lease_end(time_from_millis(MAX_MILLIS), Duration::from_secs(1)),
            MAX_MILLIS
        );
        assert_eq!(millis_since_epoch(UNIX_EPOCH - Duration::from_secs(5)), 0);
        // The cap is a valid time on every platform and round-trips.
        assert_eq!(millis_since_epoch(time_from_millis(u64::MAX)), MAX_MILLIS);
        assert_eq!(
            lease_end(
                UNIX_EPOCH + Duration::from_millis(1_000),
                Duration::from_millis(250)
            ),
            1_250
        );
    }

    proptest! {
        #[test]
        fn lease_end_is_now_plus_lease_capped(
            now_ms in 0..=MAX_MILLIS,
            secs in any::<u64>(),
            nanos in 0..1_000_000_000u32,
        ) {
            let lease = Duration::new(secs, nanos);
            let now = time_from_millis(now_ms);
            let end = lease_end(now, lease);
            let exact = u128::from(now_ms) + lease.as_millis();
            prop_assert_eq!(u128::from(end), exact.min(u128::from(MAX_MILLIS)));
            prop_assert!(end >= now_ms);
            // Always a time the platform can hold.
            prop_assert_eq!(millis_since_epoch(time_from_millis(end)), end);
        }
    }
}
