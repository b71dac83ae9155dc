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
//!   queue in Redis that every node writes and the CLI reads.
//!
//! # Limits
//!
//! The durable stores are bounded by entry count and by bytes (the entries'
//! encoded size): see [`RedbStoreBuilder::max_entries`] and
//! [`RedisDeadLetterStoreBuilder::max_entries`] for the defaults. A `put`
//! past either limit fails with [`StoreErrorKind::Full`] and keeps nothing;
//! the layer turns that into [`StoreFull`](crate::StoreFull), so a caller
//! (a queue consumer) knows the failed call was neither processed nor kept.
//! Nothing already stored is ever evicted to make room (dead letters are
//! evidence). Replacing an entry counts only the difference in size, and one
//! no larger always succeeds; `remove` and `purge` give their bytes back;
//! `u64::MAX` lifts a limit.
//!
//! # Claims
//!
//! [`DeadLetterStore::claim`] leases an entry to one replayer for a while, so
//! two replays running at once (two operators, two CLI runs) do not both send
//! it. Each claim carries a [`ClaimToken`] that only its holder knows, and
//! only that token [releases](DeadLetterStore::release) it: a replayer whose
//! lease ran out cannot end the claim of the replayer that took over. A lease
//! is advisory and ends by itself: a replayer that crashes between sending
//! and removing leaves an entry that can be claimed again once the lease is
//! over, so a replay is at least once, never lost; and the claim that takes
//! it over is told that the one before it lapsed unreleased
//! ([`Claim::Claimed::previous_claim_lapsed`]), so the replay keeps the
//! idempotency key of a send that may have been applied.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tower_classify::FailureKind;

use crate::entry::{DeadLetterEntry, EntryId, EntryIdPrefix};

mod memory;
#[cfg(feature = "redb")]
mod redb;
#[cfg(feature = "redis")]
mod redis;

pub use self::memory::MemoryStore;
#[cfg(feature = "redb")]
pub use self::redb::{RedbStore, RedbStoreBuilder};
#[cfg(feature = "redis")]
pub use self::redis::{RedisDeadLetterStore, RedisDeadLetterStoreBuilder};
/// What a dead-letter or poison count store fails with: the one store error
/// of the whole family (from `tower-store-support`; `tower-idempotency`'s
/// stores fail with it too).
///
/// The dead-letter layer turns it into [`StoreFull`](crate::StoreFull) (of
/// kind [`StoreErrorKind::Full`]: the store kept nothing and evicted
/// nothing) or [`StoreFailed`](crate::StoreFailed), and poison detection
/// into [`CountStoreFailed`](crate::CountStoreFailed); each has it as its
/// [`source`](std::error::Error::source).
///
pub use tower_store_support::StoreError;
pub use tower_store_support::StoreErrorKind;
/// How the Redis stores ([`RedisDeadLetterStore`] and
/// [`RedisFailureCounts`](crate::counts::RedisFailureCounts)) connect, as
/// `tower-idempotency`'s Redis store does (from `tower-store-support`).
///
#[cfg(feature = "redis")]
pub use tower_store_support::{RedisConnectOptions, RedisConnection};

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
    ///
    /// A [claim](Self::claim) on the id is left as it is: a dead-letter
    /// layer recording a replayed call's failure must not free the entry for
    /// a second replayer while the first is still finishing.
    ///
    /// A store at its limits fails with [`StoreErrorKind::Full`]; replacing
    /// an entry counts only the difference in size.
    fn put(&self, entry: DeadLetterEntry) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Stores `entry` as [`put`](Self::put) does and returns how many
    /// entries its *label* has after the write, when the write itself tells
    /// it.
    ///
    /// The layer calls this for every dead-lettered call to set its
    /// `tower_poison_dlq_depth{label}` gauge, so that two layers with
    /// different labels sharing one store each report their own depth. The
    /// stores here keep a count per label updated with the entries (under
    /// the memory store's lock, in the redb write transaction, in the Redis
    /// put script) and answer from the write's own result, so the gauge
    /// costs no extra round trip. The provided implementation calls `put`
    /// and reports `None` (the layer then sets no gauge): counting a label's
    /// entries by listing them would cost a scan per failed call.
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
    /// `limit` of them in id order.
    ///
    /// This is how the CLI accepts a short id (`show 0190c3`). Ids sort by
    /// their digits, so the matches are one contiguous range: the stores
    /// here find them in their id index without reading an entry (a range of
    /// redb keys, `ZLEXCOUNT` and `ZRANGEBYLEX` in Redis). The provided
    /// implementation pages through [`list`](Self::list) from the start of
    /// the range, reading only the matching entries.
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
    /// Atomic in each store: of two claims of one entry made at once, one is
    /// [`Claimed`](Claim::Claimed), with a fresh [`ClaimToken`], and the
    /// other sees [`Held`](Claim::Held). A claim whose lease has ended counts
    /// as free. The stores of one process ([`MemoryStore`], [`RedbStore`])
    /// judge that by the caller's `now` and end the lease at `now + lease`;
    /// [`RedisDeadLetterStore`] leaves the lease to Redis's own clock (the
    /// nodes' clocks differ) and uses `now` only to report
    /// [`Held::until`](Claim::Held) as `now` plus the time Redis has left.
    /// Any `Duration` is accepted, even `Duration::MAX`: lease ends saturate
    /// at the end of the year 9999.
    ///
    /// A claim is a lease, not a lock: it ends by itself, so a replayer that
    /// dies holding one delays the entry's replay by at most `lease`.
    ///
    /// A claim whose lease ended before anyone [released](Self::release) it
    /// is still remembered, until it is released or its entry removed: the
    /// next claim reports it
    /// ([`previous_claim_lapsed`](Claim::Claimed::previous_claim_lapsed)),
    /// since its replayer may have sent the entry and died before recording
    /// how that went. The lapse is kept with the claim (the memory store's
    /// claims, redb's claim table, a Redis hash of unreleased claims), not
    /// written to the entry. A store of your own reports it too: one that
    /// always says `false` leaves a crashed replayer's send unknown to the
    /// next replay.
    fn claim(
        &self,
        id: EntryId,
        now: SystemTime,
        lease: Duration,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Gives up the claim on `id` that `token` holds (the replay is over,
    /// or could not be sent).
    ///
    /// Does nothing when `token` no longer holds it (the lease ran out and
    /// another replayer claimed the entry), so a slow replayer never frees
    /// an entry another one is sending. [`remove`](Self::remove) and
    /// [`purge`](Self::purge) end any claim; [`put`](Self::put) ends none.
    fn release(
        &self,
        id: EntryId,
        token: ClaimToken,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

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
// The entry is held unboxed so a replayer matches `Claimed { entry, .. }`
// directly; a claim is made once per replayed entry, so its size costs
// nothing.
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
        /// being released: its replayer may have sent the entry and then
        /// died (or is still sending it), so that send may have been
        /// applied. A [`Replayer`](crate::replay::Replayer) then pins the
        /// entry's idempotency key, as after a replay that got no answer
        /// ([`replay_key_pinned`](crate::DeadLetterEntry::replay_key_pinned)).
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
/// can [release](DeadLetterStore::release) that claim.
///
/// Opaque: 128 random bits made afresh for every claim, so a token left
/// over from an earlier claim of the same entry matches no later one.
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

/// The latest instant the stores write, in milliseconds since the Unix
/// epoch: the end of the year 9999 (`9999-12-31T23:59:59.999Z`).
///
/// Lease ends saturate here. It is a `SystemTime` on every platform, a
/// number Lua (Redis scripts use doubles) holds exactly, and far inside what
/// Redis accepts for `PX`, so no duration a caller passes can wrap, panic or
/// be refused.
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

/// The entry stored as `bytes` ([`DeadLetterEntry::to_bytes`]); bytes that
/// are not one are a corrupt store.
#[cfg_attr(not(any(feature = "redb", feature = "redis")), allow(dead_code))]
pub(crate) fn decode(bytes: &[u8]) -> Result<DeadLetterEntry, StoreError> {
    DeadLetterEntry::from_bytes(bytes)
        .map_err(|e| StoreError::corrupt("cannot decode a stored dead-letter entry", e))
}

/// When a lease of `lease` taken at `now` ends, in milliseconds since the
/// Unix epoch, saturating at [`MAX_MILLIS`].
pub(crate) fn lease_end(now: SystemTime, lease: Duration) -> u64 {
    millis_since_epoch(now)
        .saturating_add(saturating_millis(lease))
        .min(MAX_MILLIS)
}

/// Which entries [`DeadLetterStore::list`] returns: set the fields you need
/// over [`ListQuery::default`]'s.
///
/// ```
/// use tower_classify::FailureKind;
/// use tower_poison::store::ListQuery;
///
/// let poison = ListQuery { kind: Some(FailureKind::Poison), limit: 20, ..ListQuery::default() };
/// assert_eq!((poison.limit, poison.after), (20, None));
/// ```
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
        self.failed_before
            .is_none_or(|before| entry.first_failed_at < before)
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
        *self
            .by_kind
            .entry(entry.kind.as_str().to_owned())
            .or_default() += 1;
        *self.by_label.entry(entry.label.clone()).or_default() += 1;
        let age = entry.age(now);
        self.oldest_age = Some(self.oldest_age.map_or(age, |o: Duration| o.max(age)));
    }
}

/// How many entries each label has, for a store that keeps them in memory:
/// a label leaves the map with its last entry, so the map never holds more
/// keys than the store holds entries (and the stores are bounded).
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
