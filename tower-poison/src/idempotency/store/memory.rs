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
