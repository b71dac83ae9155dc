//! The in-memory idempotency store: bounded, FIFO eviction, TTL.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::{Claim, ClaimToken, IdempotencyStore, Record, StoredResponse};
use crate::store::StoreError;

/// An idempotency store in one process's memory.
///
/// It holds at most `capacity` keys. Claiming a new key when full evicts the
/// *oldest claimed* key first (FIFO), the way the seed's guard keeps memory
/// bounded: a repeat that arrives after its key was evicted runs again, so
/// size the capacity for the repeats you expect within the TTL. An evicted
/// key that was still in flight can no longer be completed (its response is
/// not stored); set the capacity well above the number of requests in flight.
///
/// Keys expire after their TTL on tokio's clock ([`tokio::time::Instant`]),
/// so tests can move time with `tokio::time::pause`/`advance`. Expired keys
/// are dropped when met, and by eviction.
///
/// Clones share the same keys. Keys are not shared between processes: use
/// [`RedisIdempotencyStore`](super::RedisIdempotencyStore) for a fleet.
///
/// ```
/// use tower_poison::idempotency::store::MemoryIdempotencyStore;
///
/// let store = MemoryIdempotencyStore::new(100_000);
/// assert_eq!(store.len(), 0);
/// ```
#[derive(Debug, Clone)]
pub struct MemoryIdempotencyStore {
    state: Arc<Mutex<State>>,
    capacity: usize,
}

#[derive(Debug, Default)]
struct State {
    slots: HashMap<String, Slot>,
    /// Keys in claim order, with the sequence number of the claim; a key
    /// released or re-claimed since leaves a stale pair, skipped on eviction.
    order: VecDeque<(String, u64)>,
    next_seq: u64,
}

#[derive(Debug)]
struct Slot {
    record: Record,
    expires_at: Instant,
    seq: u64,
}

impl MemoryIdempotencyStore {
    /// An empty store holding at most `capacity` keys (at least one).
    pub fn new(capacity: usize) -> Self {
        MemoryIdempotencyStore {
            state: Arc::default(),
            capacity: capacity.max(1),
        }
    }

    /// The most keys the store holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// How many keys are held now (expired ones not yet dropped included).
    pub fn len(&self) -> usize {
        self.lock().slots.len()
    }

    /// `true` when no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock, so a poisoned lock still
        // guards consistent data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl State {
    /// The live slot for `key`, dropping it if it has expired.
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Slot> {
        if self
            .slots
            .get(key)
            .is_some_and(|slot| slot.expires_at <= now)
        {
            self.slots.remove(key);
        }
        self.slots.get_mut(key)
    }

    /// Evicts the oldest claims until there is room for one more key.
    fn make_room(&mut self, capacity: usize) {
        while self.slots.len() >= capacity {
            let Some((key, seq)) = self.order.pop_front() else {
                return;
            };
            if self.slots.get(&key).is_some_and(|slot| slot.seq == seq) {
                self.slots.remove(&key);
                metrics::counter!("tower_poison_idempotency_evicted_total").increment(1);
            }
        }
    }

    /// Drops stale pairs from `order` once they outnumber the live keys, so
    /// released keys do not make it grow without bound.
    fn compact(&mut self) {
        if self.order.len() > 2 * self.slots.len() + 64 {
            let slots = &self.slots;
            self.order
                .retain(|(key, seq)| slots.get(key).is_some_and(|slot| slot.seq == *seq));
        }
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
        if let Some(slot) = state.live(key, now) {
            return Ok(slot.record.clone().into_claim());
        }
        state.make_room(self.capacity);
        let claim = ClaimToken::new(fingerprint);
        let seq = state.next_seq;
        state.next_seq += 1;
        state.slots.insert(
            key.to_owned(),
            Slot {
                record: Record::in_flight(&claim),
                expires_at: now + in_flight_ttl,
                seq,
            },
        );
        state.order.push_back((key.to_owned(), seq));
        state.compact();
        Ok(Claim::Acquired(claim))
    }

    async fn complete(
        &self,
        key: &str,
        claim: &ClaimToken,
        response: StoredResponse,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        match state.live(key, now) {
            Some(slot) if slot.record.is_held_by(claim) => {
                slot.record = Record::Completed {
                    fingerprint: claim.fingerprint().to_owned(),
                    response,
                };
                slot.expires_at = now + ttl;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release(&self, key: &str, claim: &ClaimToken) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        match state.live(key, now) {
            Some(slot) if slot.record.is_held_by(claim) => {
                state.slots.remove(key);
                state.compact();
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(60);

    fn response() -> StoredResponse {
        StoredResponse::new(
            http::StatusCode::CREATED,
            &http::HeaderMap::new(),
            "ok".into(),
        )
    }

    #[derive(Debug, Clone)]
    enum Op {
        Claim(u8),
        Complete(u8, usize),
        Release(u8, usize),
        Advance(u64),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            (0u8..5).prop_map(Op::Claim),
            (0u8..5, 0usize..64).prop_map(|(k, t)| Op::Complete(k, t)),
            (0u8..5, 0usize..64).prop_map(|(k, t)| Op::Release(k, t)),
            (0u64..250).prop_map(Op::Advance),
        ]
    }

    /// The reference: slots in claim order, the oldest evicted first when
    /// full, an expired slot dropped when its key is met.
    #[derive(Debug)]
    struct ModelSlot {
        key: u8,
        owner: Option<usize>,
        expires: u64,
    }

    proptest::proptest! {
        /// Any sequence of claims, completions, releases (by owners and by
        /// strangers) and clock moves: the store answers as the model does,
        /// never holds more than its capacity, and never lets two claims hold
        /// a key at once.
        #[test]
        fn the_store_behaves_like_a_fifo_map_with_expiry(
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
                let store = MemoryIdempotencyStore::new(capacity);
                let mut model: Vec<ModelSlot> = Vec::new();
                let mut tokens: Vec<(u8, ClaimToken)> = Vec::new();
                let mut now = 0u64;
                let key = |k: u8| format!("k{k}");
                // Drops `k`'s slot if expired; its index if live.
                fn live(model: &mut Vec<ModelSlot>, k: u8, now: u64) -> Option<usize> {
                    let i = model.iter().position(|s| s.key == k)?;
                    if model[i].expires <= now {
                        model.remove(i);
                        return None;
                    }
                    Some(i)
                }
                for op in ops {
                    match op {
                        Op::Claim(k) => {
                            let got = store
                                .claim(&key(k), "f", Duration::from_millis(IN_FLIGHT_MS))
                                .await
                                .unwrap();
                            match live(&mut model, k, now) {
                                Some(i) => {
                                    let in_flight = model[i].owner.is_some();
                                    proptest::prop_assert_eq!(
                                        matches!(got, Claim::InFlight { .. }), in_flight
                                    );
                                    proptest::prop_assert_eq!(
                                        matches!(got, Claim::Completed { .. }), !in_flight
                                    );
                                }
                                None => {
                                    let Claim::Acquired(token) = got else {
                                        return Err(proptest::test_runner::TestCaseError::fail(
                                            format!("{k} should be free"),
                                        ));
                                    };
                                    while model.len() >= capacity {
                                        model.remove(0);
                                    }
                                    model.push(ModelSlot {
                                        key: k,
                                        owner: Some(tokens.len()),
                                        expires: now + IN_FLIGHT_MS,
                                    });
                                    tokens.push((k, token));
                                }
                            }
                        }
                        Op::Complete(k, t) | Op::Release(k, t) if tokens.is_empty() => {
                            let _ = (k, t);
                        }
                        Op::Complete(k, t) => {
                            let t = t % tokens.len();
                            let done = store
                                .complete(&key(k), &tokens[t].1, response(), Duration::from_millis(TTL_MS))
                                .await
                                .unwrap();
                            let expected = match live(&mut model, k, now) {
                                Some(i) if model[i].owner == Some(t) => {
                                    model[i].owner = None;
                                    model[i].expires = now + TTL_MS;
                                    true
                                }
                                _ => false,
                            };
                            proptest::prop_assert_eq!(done, expected);
                        }
                        Op::Release(k, t) => {
                            let t = t % tokens.len();
                            let done = store.release(&key(k), &tokens[t].1).await.unwrap();
                            let expected = match live(&mut model, k, now) {
                                Some(i) if model[i].owner == Some(t) => {
                                    model.remove(i);
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
                    proptest::prop_assert_eq!(store.len(), model.len());
                }
                Ok(())
            })?;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn released_keys_do_not_grow_the_order_queue() {
        let store = MemoryIdempotencyStore::new(10);
        for _ in 0..10_000 {
            let Claim::Acquired(claim) = store.claim("k", "f", TTL).await.unwrap() else {
                panic!("the key was released");
            };
            assert!(store.release("k", &claim).await.unwrap());
        }
        assert!(store.lock().order.len() <= 64 + 1);
        assert!(store.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_owner_completes_or_releases() {
        let store = MemoryIdempotencyStore::new(10);
        let Claim::Acquired(claim) = store.claim("k", "f", TTL).await.unwrap() else {
            panic!("fresh key");
        };
        let stranger = ClaimToken::new("f");
        assert!(!store.release("k", &stranger).await.unwrap());
        assert!(!store
            .complete("k", &stranger, response(), TTL)
            .await
            .unwrap());
        assert!(store.complete("k", &claim, response(), TTL).await.unwrap());
        // Completed: the owner can no longer release it.
        assert!(!store.release("k", &claim).await.unwrap());
        assert!(matches!(
            store.claim("k", "f", TTL).await.unwrap(),
            Claim::Completed { .. }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lapsed_claim_cannot_be_completed() {
        let store = MemoryIdempotencyStore::new(10);
        let Claim::Acquired(claim) = store.claim("k", "f", TTL).await.unwrap() else {
            panic!("fresh key");
        };
        tokio::time::advance(TTL).await;
        assert!(!store.complete("k", &claim, response(), TTL).await.unwrap());
        assert!(matches!(
            store.claim("k", "f", TTL).await.unwrap(),
            Claim::Acquired(_)
        ));
    }
}
