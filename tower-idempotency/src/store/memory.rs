//! The in-memory idempotency store: bounded by entries and bytes, evicting
//! only completed records.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::{bounded, Claim, ClaimToken, Completion, IdempotencyStore, NotKept, Record};
use crate::{StoreError, StoreErrorKind};

/// The bytes a record costs besides its key, fingerprint and response: the
/// map's slot, the record's fields and the queue entry that orders it. An
/// estimate on 64-bit targets, so that a flood of tiny records is bounded
/// by `max_bytes` too.
const RECORD_OVERHEAD: usize = 192;
/// The bytes a stored header costs besides its name and value.
const HEADER_OVERHEAD: usize = 64;

/// An idempotency store in one process's memory. Clones share its keys;
/// use `RedisIdempotencyStore` (feature `redis`) for a fleet.
///
/// It is bounded twice: at most `max_entries` keys and at most `max_bytes`
/// bytes (64 MiB unless [set](Self::with_max_bytes)), counting each record's
/// key, fingerprint, stored response and a fixed per-record overhead. To
/// make room it evicts completed records, oldest first, never a claim in
/// flight; a response that cannot fit even then is recorded as
/// [`NotKept::TooLarge`]. A repeat whose key was evicted runs again: size
/// the store for the repeats you expect within the TTL.
///
/// Keys expire on tokio's clock ([`tokio::time::Instant`]), so tests can
/// move time with `tokio::time::pause`/`advance`.
///
/// ```
/// use tower_idempotency::store::MemoryIdempotencyStore;
///
/// let store = MemoryIdempotencyStore::new(100_000).with_max_bytes(256 << 20);
/// assert_eq!((store.len(), store.bytes()), (0, 0));
/// ```
#[derive(Clone)]
pub struct MemoryIdempotencyStore {
    state: Arc<Mutex<State>>,
}

struct State {
    slots: HashMap<Arc<str>, Slot>,
    /// Completed keys by the sequence number of their record: the eviction
    /// order.
    completed: BTreeMap<u64, Arc<str>>,
    /// Keys in flight by when they were claimed or last extended: the order
    /// they lapse in, to drop lapsed claims when full.
    in_flight: BTreeMap<u64, Arc<str>>,
    bytes: usize,
    /// The bytes of the claims in flight: what no eviction can free.
    claim_bytes: usize,
    next_seq: u64,
    max_entries: usize,
    max_bytes: usize,
}

struct Slot {
    record: Record,
    expires_at: Instant,
    seq: u64,
    size: usize,
}

impl MemoryIdempotencyStore {
    /// An empty store holding at most `max_entries` keys (at least one) and
    /// 64 MiB.
    pub fn new(max_entries: usize) -> Self {
        crate::observability::describe_metrics();
        MemoryIdempotencyStore {
            state: Arc::new(Mutex::new(State {
                slots: HashMap::new(),
                completed: BTreeMap::new(),
                in_flight: BTreeMap::new(),
                bytes: 0,
                claim_bytes: 0,
                next_seq: 0,
                max_entries: max_entries.max(1),
                max_bytes: 64 << 20,
            })),
        }
    }

    /// Holds at most `max_bytes` bytes of records (default 64 MiB). It
    /// applies to every clone.
    pub fn with_max_bytes(self, max_bytes: usize) -> Self {
        self.lock().max_bytes = max_bytes;
        self
    }

    /// How many keys are held now (expired ones not yet dropped included).
    pub fn len(&self) -> usize {
        self.lock().slots.len()
    }

    /// `true` when no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes the records held now count for.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock, so a poisoned lock still
        // guards consistent data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl fmt::Debug for MemoryIdempotencyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("MemoryIdempotencyStore")
            .field("len", &state.slots.len())
            .field("bytes", &state.bytes)
            .field("max_entries", &state.max_entries)
            .field("max_bytes", &state.max_bytes)
            .finish()
    }
}

/// What `record` under `key` counts for.
fn size(key: &str, record: &Record) -> usize {
    let fields = match record {
        Record::InFlight(claim) => claim.token.len() + claim.fingerprint.len(),
        Record::Completed {
            fingerprint,
            completion,
        } => {
            fingerprint.len()
                + match completion {
                    Completion::Response(response) => {
                        response.len_bytes() + response.headers.len() * HEADER_OVERHEAD
                    }
                    Completion::NotKept(_) => 0,
                }
        }
    };
    RECORD_OVERHEAD + key.len() + fields
}

/// `now + ttl`, never overflowing the clock.
fn expiry(now: Instant, ttl: Duration) -> Instant {
    const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);
    now.checked_add(bounded(ttl))
        .or_else(|| now.checked_add(YEAR))
        .unwrap_or(now)
}

impl State {
    /// The order keys of claims in flight, or of completed records, are in.
    fn order(&mut self, in_flight: bool) -> &mut BTreeMap<u64, Arc<str>> {
        if in_flight {
            &mut self.in_flight
        } else {
            &mut self.completed
        }
    }

    fn remove(&mut self, key: &str) -> Option<(Arc<str>, Record)> {
        let (key, slot) = self.slots.remove_entry(key)?;
        let in_flight = matches!(slot.record, Record::InFlight(_));
        self.bytes -= slot.size;
        if in_flight {
            self.claim_bytes -= slot.size;
        }
        self.order(in_flight).remove(&slot.seq);
        Some((key, slot.record))
    }

    /// The live slot for `key`, dropping it if it has expired.
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Slot> {
        if self
            .slots
            .get(key)
            .is_some_and(|slot| slot.expires_at <= now)
        {
            self.remove(key);
        }
        self.slots.get_mut(key)
    }

    /// Drops the expired claims, or completed records, oldest first.
    fn drop_expired(&mut self, claims: bool, now: Instant) {
        loop {
            // Borrows the fields, not `self`, so the key is cloned only
            // when it is dropped (this runs on every claim).
            let order = if claims {
                &self.in_flight
            } else {
                &self.completed
            };
            let Some((_, key)) = order.first_key_value() else {
                return;
            };
            if self.slots[&**key].expires_at > now {
                return;
            }
            let key = Arc::clone(key);
            self.remove(&key);
        }
    }

    fn fits(&self, entries: usize, bytes: usize) -> bool {
        self.slots.len() + entries <= self.max_entries
            && self.bytes.saturating_add(bytes) <= self.max_bytes
    }

    /// Makes room for `entries` more keys and `bytes` more bytes: claims
    /// that lapsed go first, then completed records, oldest first. `false`
    /// (and nothing evicted) when the claims still in flight leave no room
    /// even with every completed record gone.
    fn make_room(&mut self, entries: usize, bytes: usize, now: Instant) -> bool {
        if self.fits(entries, bytes) {
            return true;
        }
        self.drop_expired(true, now);
        if self.in_flight.len() + entries > self.max_entries
            || self.claim_bytes.saturating_add(bytes) > self.max_bytes
        {
            return false;
        }
        while !self.fits(entries, bytes) {
            let Some((_, key)) = self.completed.pop_first() else {
                return false;
            };
            self.remove(&key);
            metrics::counter!(crate::observability::EVICTED_TOTAL).increment(1);
        }
        true
    }

    /// Holds `record` under `key` until `expires_at`, once room was made
    /// for it, last in its order.
    fn insert(&mut self, key: Arc<str>, record: Record, expires_at: Instant) {
        let size = size(&key, &record);
        let in_flight = matches!(record, Record::InFlight(_));
        self.bytes += size;
        if in_flight {
            self.claim_bytes += size;
        }
        self.next_seq += 1;
        let seq = self.next_seq;
        self.order(in_flight).insert(seq, Arc::clone(&key));
        let slot = Slot {
            record,
            expires_at,
            seq,
            size,
        };
        self.slots.insert(key, slot);
    }

    /// Takes out the live in-flight record of `claim`, with its key (for
    /// `insert` to move back in, not allocate again), if it is there.
    fn take_held(
        &mut self,
        key: &str,
        claim: &ClaimToken,
        now: Instant,
    ) -> Option<(Arc<str>, Record)> {
        if !self.live(key, now)?.record.is_held_by(claim) {
            return None;
        }
        self.remove(key)
    }
}

impl IdempotencyStore for MemoryIdempotencyStore {
    async fn claim(
        &self,
        key: &str,
        fingerprint: &str,
        in_flight_ttl: Duration,
    ) -> Result<Claim, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        state.drop_expired(false, now);
        if let Some(slot) = state.live(key, now) {
            return Ok(slot.record.clone().into_claim());
        }
        let claim = ClaimToken::new(fingerprint);
        let record = Record::InFlight(claim.clone());
        if !state.make_room(1, size(key, &record), now) {
            return Err(StoreError::new(
                StoreErrorKind::Full,
                format!(
                    "the in-memory idempotency store is full ({} keys, {} bytes) of requests still in flight",
                    state.slots.len(),
                    state.bytes
                ),
            ));
        }
        state.insert(Arc::from(key), record, expiry(now, in_flight_ttl));
        Ok(Claim::Acquired(claim))
    }

    async fn complete(
        &self,
        key: &str,
        claim: &ClaimToken,
        fingerprint: &str,
        completion: Completion,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        // The claim makes way for its outcome: gone from the map, it is
        // never evicted making room.
        let Some((held, _)) = state.take_held(key, claim, now) else {
            return Ok(false);
        };
        let mut record = Record::completed(fingerprint, completion);
        let record_size = size(key, &record);
        if !state.make_room(1, record_size, now) {
            tracing::warn!(
                key,
                bytes = record_size,
                max_bytes = state.max_bytes,
                "response does not fit in the idempotency store; recorded as not kept"
            );
            record = Record::completed(fingerprint, Completion::NotKept(NotKept::TooLarge));
        }
        state.insert(held, record, expiry(now, ttl));
        Ok(true)
    }

    async fn extend(
        &self,
        key: &str,
        claim: &ClaimToken,
        in_flight_ttl: Duration,
    ) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        let Some((held, record)) = state.take_held(key, claim, now) else {
            return Ok(false);
        };
        // Back in, last in line: the claims ahead of it lapse first.
        state.insert(held, record, expiry(now, in_flight_ttl));
        Ok(true)
    }

    async fn release(&self, key: &str, claim: &ClaimToken) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        Ok(state.take_held(key, claim, now).is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoredResponse;

    const TTL: Duration = Duration::from_secs(60);
    /// The fingerprint completions are recorded with; claims use `"f"`.
    const DONE: &str = "f done";

    fn response(body: usize) -> Completion {
        Completion::Response(StoredResponse::new(
            http::StatusCode::CREATED,
            &http::HeaderMap::new(),
            vec![b'r'; body].into(),
        ))
    }

    /// Completes `key` with a response of `body` bytes; it must be held.
    async fn finish(store: &MemoryIdempotencyStore, key: &str, claim: &ClaimToken, body: usize) {
        assert!(store
            .complete(key, claim, DONE, response(body), TTL)
            .await
            .unwrap());
    }

    /// What `key` came to; it must be completed.
    async fn completion_of(store: &MemoryIdempotencyStore, key: &str) -> Completion {
        match store.claim(key, "f", TTL).await.unwrap() {
            Claim::Completed { completion, .. } => completion,
            other => panic!("{key} should be completed, found {other:?}"),
        }
    }

    async fn acquire(store: &MemoryIdempotencyStore, key: &str) -> ClaimToken {
        match store.claim(key, "f", TTL).await.unwrap() {
            Claim::Acquired(claim) => claim,
            other => panic!("{key} should be free, found {other:?}"),
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Claim(u8),
        Complete(u8, usize),
        Extend(u8, usize),
        Release(u8, usize),
        Advance(u64),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            (0u8..6).prop_map(Op::Claim),
            (0u8..6, 0usize..64).prop_map(|(k, t)| Op::Complete(k, t)),
            (0u8..6, 0usize..64).prop_map(|(k, t)| Op::Extend(k, t)),
            (0u8..6, 0usize..64).prop_map(|(k, t)| Op::Release(k, t)),
            (0u64..250).prop_map(Op::Advance),
        ]
    }

    /// The reference: a list of records, each in flight (with its owner) or
    /// completed, ordered by when it reached its state.
    #[derive(Debug)]
    struct ModelSlot {
        key: u8,
        owner: Option<usize>,
        expires: u64,
        order: u64,
    }

    #[derive(Debug, Default)]
    struct Model {
        slots: Vec<ModelSlot>,
        order: u64,
    }

    impl Model {
        /// Drops `k`'s slot if expired; its index if live.
        fn live(&mut self, k: u8, now: u64) -> Option<usize> {
            let i = self.slots.iter().position(|s| s.key == k)?;
            if self.slots[i].expires <= now {
                self.slots.remove(i);
                return None;
            }
            Some(i)
        }

        fn oldest(&self, in_flight: bool) -> Option<usize> {
            (0..self.slots.len())
                .filter(|&i| self.slots[i].owner.is_some() == in_flight)
                .min_by_key(|&i| self.slots[i].order)
        }

        /// Room for one more: the oldest completed record goes first, then
        /// the oldest claim if it lapsed; never a live claim.
        /// Room for one more: lapsed claims go first, then the oldest
        /// completed records, unless the live claims alone fill the store
        /// (then nothing is evicted).
        fn make_room(&mut self, capacity: usize, now: u64) -> bool {
            if self.slots.len() < capacity {
                return true;
            }
            self.slots.retain(|s| s.owner.is_none() || s.expires > now);
            if self.slots.iter().filter(|s| s.owner.is_some()).count() >= capacity {
                return false;
            }
            while self.slots.len() >= capacity {
                let i = self.oldest(false).expect("a completed record");
                self.slots.remove(i);
            }
            true
        }

        fn next_order(&mut self) -> u64 {
            self.order += 1;
            self.order
        }
    }

    proptest::proptest! {
        /// Any sequence of claims, completions, releases (by owners and by
        /// strangers) and clock moves: the store answers as the model does,
        /// never holds more than its capacity, never evicts a live claim
        /// (a full store of claims refuses instead), and never lets two
        /// claims hold a key at once.
        #[test]
        fn the_store_evicts_only_completed_records_oldest_first(
            capacity in 1usize..5,
            ops in proptest::collection::vec(op(), 1..80),
        ) {
            const IN_FLIGHT_MS: u64 = 100;
            const TTL_MS: u64 = 300;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            runtime.block_on(async {
                let store = MemoryIdempotencyStore::new(capacity).with_max_bytes(usize::MAX);
                let mut model = Model::default();
                let mut tokens: Vec<(u8, ClaimToken)> = Vec::new();
                let mut now = 0u64;
                let key = |k: u8| format!("k{k}");
                for op in ops {
                    match op {
                        Op::Claim(k) => {
                            let got = store
                                .claim(&key(k), "f", Duration::from_millis(IN_FLIGHT_MS))
                                .await;
                            // Expired completed records go first.
                            model.slots.retain(|s| s.owner.is_some() || s.expires > now);
                            match model.live(k, now) {
                                Some(i) => {
                                    let in_flight = model.slots[i].owner.is_some();
                                    let got = got.unwrap();
                                    proptest::prop_assert_eq!(
                                        matches!(got, Claim::InFlight { .. }), in_flight
                                    );
                                    proptest::prop_assert_eq!(
                                        matches!(got, Claim::Completed { .. }), !in_flight
                                    );
                                }
                                None if !model.make_room(capacity, now) => {
                                    let error = got.expect_err("a store full of live claims refuses");
                                    proptest::prop_assert_eq!(error.kind(), StoreErrorKind::Full);
                                }
                                None => {
                                    let Ok(Claim::Acquired(token)) = got else {
                                        return Err(proptest::test_runner::TestCaseError::fail(
                                            format!("{k} should be free: {got:?}"),
                                        ));
                                    };
                                    let order = model.next_order();
                                    model.slots.push(ModelSlot {
                                        key: k,
                                        owner: Some(tokens.len()),
                                        expires: now + IN_FLIGHT_MS,
                                        order,
                                    });
                                    tokens.push((k, token));
                                }
                            }
                        }
                        Op::Complete(_, _) | Op::Extend(_, _) | Op::Release(_, _)
                            if tokens.is_empty() => {}
                        Op::Extend(k, t) => {
                            let t = t % tokens.len();
                            let done = store
                                .extend(&key(k), &tokens[t].1, Duration::from_millis(IN_FLIGHT_MS))
                                .await
                                .unwrap();
                            let expected = match model.live(k, now) {
                                Some(i) if model.slots[i].owner == Some(t) => {
                                    let order = model.next_order();
                                    let slot = &mut model.slots[i];
                                    slot.expires = now + IN_FLIGHT_MS;
                                    slot.order = order;
                                    true
                                }
                                _ => false,
                            };
                            proptest::prop_assert_eq!(done, expected);
                        }
                        Op::Complete(k, t) => {
                            let t = t % tokens.len();
                            let done = store
                                .complete(&key(k), &tokens[t].1, DONE, response(2), Duration::from_millis(TTL_MS))
                                .await
                                .unwrap();
                            let expected = match model.live(k, now) {
                                Some(i) if model.slots[i].owner == Some(t) => {
                                    let order = model.next_order();
                                    let slot = &mut model.slots[i];
                                    slot.owner = None;
                                    slot.expires = now + TTL_MS;
                                    slot.order = order;
                                    true
                                }
                                _ => false,
                            };
                            proptest::prop_assert_eq!(done, expected);
                        }
                        Op::Release(k, t) => {
                            let t = t % tokens.len();
                            let done = store.release(&key(k), &tokens[t].1).await.unwrap();
                            let expected = match model.live(k, now) {
                                Some(i) if model.slots[i].owner == Some(t) => {
                                    model.slots.remove(i);
                                    true
                                }
                                _ => false,
                            };
                            proptest::prop_assert_eq!(done, expected);
                        }
                        Op::Advance(ms) => {
                            tokio::time::advance(Duration::from_millis(ms)).await;
                            now += ms;
                        }
                    }
                    proptest::prop_assert!(store.len() <= capacity);
                    proptest::prop_assert_eq!(store.len(), model.slots.len());
                    let state = store.lock();
                    let counted: usize = state.slots.values().map(|s| s.size).sum();
                    proptest::prop_assert_eq!(state.bytes, counted);
                    let claims: Vec<usize> = state
                        .slots
                        .values()
                        .filter(|s| matches!(s.record, Record::InFlight(_)))
                        .map(|s| s.size)
                        .collect();
                    proptest::prop_assert_eq!(state.claim_bytes, claims.iter().sum::<usize>());
                    // Each record is in its order, once.
                    proptest::prop_assert_eq!(state.in_flight.len(), claims.len());
                    let completed = state.slots.len() - claims.len();
                    proptest::prop_assert_eq!(state.completed.len(), completed);
                }
                Ok(())
            })?;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn released_keys_do_not_grow_the_queues() {
        let store = MemoryIdempotencyStore::new(10);
        for _ in 0..10_000 {
            let claim = acquire(&store, "k").await;
            assert!(store.release("k", &claim).await.unwrap());
        }
        let state = store.lock();
        assert!(state.in_flight.is_empty() && state.completed.is_empty());
        assert_eq!((state.slots.len(), state.bytes), (0, 0));
    }

    /// A heartbeat, and the completion after it, move the key's allocation
    /// back in rather than make a new one.
    #[tokio::test(start_paused = true)]
    async fn extending_and_completing_keep_the_key_allocation() {
        let store = MemoryIdempotencyStore::new(10);
        let claim = acquire(&store, "k").await;
        let first = Arc::downgrade(store.lock().slots.get_key_value("k").unwrap().0);
        assert!(store.extend("k", &claim, TTL).await.unwrap());
        finish(&store, "k", &claim, 2).await;
        // Alive still: the key in the map is that allocation.
        assert!(first.upgrade().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_owner_completes_or_releases() {
        let store = MemoryIdempotencyStore::new(10);
        let claim = acquire(&store, "k").await;
        let stranger = ClaimToken::new("f");
        assert!(!store.release("k", &stranger).await.unwrap());
        assert!(!store
            .complete("k", &stranger, DONE, response(2), TTL)
            .await
            .unwrap());
        assert!(store
            .complete("k", &claim, DONE, response(2), TTL)
            .await
            .unwrap());
        // Completed: the owner can no longer release it.
        assert!(!store.release("k", &claim).await.unwrap());
        assert!(matches!(
            store.claim("k", "f", TTL).await.unwrap(),
            Claim::Completed { .. }
        ));
    }

    /// The completed record carries the fingerprint given to `complete`
    /// (the body part the guard learned while the handler ran), not the
    /// claim's; its size counts it.
    #[tokio::test(start_paused = true)]
    async fn a_completed_record_carries_the_final_fingerprint() {
        let store = MemoryIdempotencyStore::new(10);
        let claim = acquire(&store, "k").await;
        let claimed = store.bytes();
        let long = "f".repeat(500);
        assert!(store
            .complete("k", &claim, &long, response(0), TTL)
            .await
            .unwrap());
        match store.claim("k", "other", TTL).await.unwrap() {
            Claim::Completed { fingerprint, .. } => assert_eq!(fingerprint, long),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            store.bytes(),
            claimed - "f".len() - claim.token().len() + long.len()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lapsed_claim_cannot_be_completed() {
        let store = MemoryIdempotencyStore::new(10);
        let claim = acquire(&store, "k").await;
        tokio::time::advance(TTL).await;
        assert!(!store
            .complete("k", &claim, DONE, response(2), TTL)
            .await
            .unwrap());
        acquire(&store, "k").await;
    }

    /// Bytes bound the store as well as entries: completed records are
    /// evicted oldest first to make room for a large response.
    #[tokio::test(start_paused = true)]
    async fn bytes_bound_the_store_and_evict_completed_records() {
        let store = MemoryIdempotencyStore::new(1000).with_max_bytes(10_000);
        for key in ["a", "b", "c"] {
            let claim = acquire(&store, key).await;
            finish(&store, key, &claim, 3000).await;
        }
        assert!(store.bytes() <= 10_000);
        assert_eq!(store.len(), 3);
        // A fourth 3000-byte response does not fit beside three: "a", the
        // oldest, goes.
        let claim = acquire(&store, "d").await;
        finish(&store, "d", &claim, 3000).await;
        assert!(store.bytes() <= 10_000, "{} bytes", store.bytes());
        acquire(&store, "a").await;
        assert!(matches!(
            store.claim("b", "f", TTL).await.unwrap(),
            Claim::Completed { .. }
        ));
    }

    /// A response larger than the whole store is recorded as not kept: the
    /// key stays completed (a repeat is refused, not run again).
    #[tokio::test(start_paused = true)]
    async fn a_response_larger_than_the_store_is_recorded_as_not_kept() {
        let store = MemoryIdempotencyStore::new(10).with_max_bytes(4096);
        let claim = acquire(&store, "big").await;
        finish(&store, "big", &claim, 8192).await;
        assert_eq!(
            completion_of(&store, "big").await,
            Completion::NotKept(NotKept::TooLarge),
            "the key stays completed"
        );
        assert!(store.bytes() <= 4096);
    }

    /// A response that cannot fit beside the claims in flight, even with
    /// every completed record gone, evicts nothing: it is recorded as not
    /// kept and the completed records stay.
    #[tokio::test(start_paused = true)]
    async fn a_response_that_cannot_fit_evicts_nothing() {
        let store = MemoryIdempotencyStore::new(1000).with_max_bytes(8192);
        for key in ["a", "b"] {
            let claim = acquire(&store, key).await;
            finish(&store, key, &claim, 1000).await;
        }
        let big = acquire(&store, "big").await;
        finish(&store, "big", &big, 8000).await;
        for key in ["a", "b"] {
            assert_eq!(
                completion_of(&store, key).await,
                response(1000),
                "{key} was evicted for nothing"
            );
        }
        assert_eq!(
            completion_of(&store, "big").await,
            Completion::NotKept(NotKept::TooLarge),
            "the key stays completed"
        );
    }

    /// A claim extended while older claims lapsed: the lapsed ones make
    /// room, the extended one stays.
    #[tokio::test(start_paused = true)]
    async fn lapsed_claims_make_room_and_extended_ones_stay() {
        let store = MemoryIdempotencyStore::new(2);
        let first = acquire(&store, "first").await;
        let _second = acquire(&store, "second").await;
        tokio::time::advance(TTL / 2).await;
        assert!(store.extend("first", &first, TTL).await.unwrap());
        tokio::time::advance(TTL / 2).await;
        // "second" lapsed; "first" was extended and is still in flight.
        acquire(&store, "third").await;
        assert!(matches!(
            store.claim("first", "f", TTL).await.unwrap(),
            Claim::InFlight { .. }
        ));
    }

    /// A store full of live claims refuses a new one rather than evict any.
    #[tokio::test(start_paused = true)]
    async fn a_store_full_of_claims_in_flight_refuses_new_keys() {
        let store = MemoryIdempotencyStore::new(2);
        let a = acquire(&store, "a").await;
        let _b = acquire(&store, "b").await;
        let error = store.claim("c", "f", TTL).await.unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::Full);
        assert!(matches!(
            store.claim("a", "f", TTL).await.unwrap(),
            Claim::InFlight { .. }
        ));
        // Once one completes, it can be evicted to make room.
        assert!(store
            .complete("a", &a, DONE, response(2), TTL)
            .await
            .unwrap());
        acquire(&store, "c").await;
        assert!(matches!(
            store.claim("b", "f", TTL).await.unwrap(),
            Claim::InFlight { .. }
        ));
    }

    /// No configured TTL overflows the clock.
    #[tokio::test(start_paused = true)]
    async fn any_ttl_is_safe() {
        let store = MemoryIdempotencyStore::new(10);
        let claim = match store.claim("k", "f", Duration::MAX).await.unwrap() {
            Claim::Acquired(claim) => claim,
            other => panic!("{other:?}"),
        };
        assert!(store
            .complete("k", &claim, DONE, response(2), Duration::MAX)
            .await
            .unwrap());
        tokio::time::advance(Duration::from_secs(10 * 365 * 24 * 3600)).await;
        assert!(matches!(
            store.claim("k", "f", Duration::ZERO).await.unwrap(),
            Claim::Completed { .. }
        ));
    }
}
