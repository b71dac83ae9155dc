//! The default count store: bounded, in this process's memory.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::{ready, Future};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use tower_classify::ConfigError;

use super::{DeliveryTally, FailureCountStore, MessageKey};
use crate::store::StoreError;

/// Delivery counts in this process's memory: the default store of
/// [`PoisonPolicy`](crate::PoisonPolicy).
///
/// It keeps at most `capacity` message ids (default 10 000); past that the id
/// counted longest ago is forgotten, so an unbounded stream of distinct
/// failing ids cannot exhaust memory. Counts are shared by clones (and by
/// every service of one layer), not between processes, and are lost on
/// restart: a fleet of consumers, or a worker that crashes, needs the
/// queue's own count ([`DeliveryCount`](super::DeliveryCount)) or a shared
/// store.
///
/// Every answer is immediate, so with this store the layer decides before it
/// calls the inner service.
#[derive(Clone)]
pub struct MemoryFailureCounts {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    capacity: usize,
    counts: HashMap<MessageKey, Count>,
    /// Keys by the sequence number they were first counted under: the
    /// eviction order, oldest first.
    order: BTreeMap<u64, MessageKey>,
    next_seq: u64,
}

#[derive(Debug, Clone, Copy)]
struct Count {
    deliveries: u32,
    first: SystemTime,
    seq: u64,
}

impl MemoryFailureCounts {
    /// The capacity of the default store.
    const DEFAULT_CAPACITY: usize = 10_000;

    /// A store remembering at most `capacity` message ids (at least 1).
    pub fn new(capacity: usize) -> Result<Self, ConfigError> {
        if capacity == 0 {
            return Err(ConfigError::new("poison.capacity", "must be at least 1"));
        }
        let state = State {
            capacity,
            ..State::default()
        };
        Ok(MemoryFailureCounts {
            state: Arc::new(Mutex::new(state)),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn count_now(&self, key: &MessageKey, now: SystemTime) -> DeliveryTally {
        let mut state = self.state();
        if let Some(count) = state.counts.get_mut(key) {
            count.deliveries = count.deliveries.saturating_add(1);
            return DeliveryTally::new(count.deliveries, count.first);
        }
        while state.counts.len() >= state.capacity {
            let Some((_, oldest)) = state.order.pop_first() else {
                break;
            };
            state.counts.remove(&oldest);
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        let count = Count {
            deliveries: 1,
            first: now,
            seq,
        };
        state.counts.insert(key.clone(), count);
        state.order.insert(seq, key.clone());
        DeliveryTally::new(1, now)
    }

    pub(crate) fn forget_now(&self, key: &MessageKey) {
        let mut state = self.state();
        if let Some(count) = state.counts.remove(key) {
            state.order.remove(&count.seq);
        }
    }

    /// Deliveries counted for `key`, if it is remembered.
    #[cfg(test)]
    fn deliveries(&self, key: &MessageKey) -> Option<u32> {
        self.state().counts.get(key).map(|c| c.deliveries)
    }

    #[cfg(test)]
    fn tracked(&self) -> (usize, usize) {
        let state = self.state();
        (state.counts.len(), state.order.len())
    }
}

impl Default for MemoryFailureCounts {
    fn default() -> Self {
        Self::new(Self::DEFAULT_CAPACITY).expect("the default capacity is not zero")
    }
}

impl FailureCountStore for MemoryFailureCounts {
    fn count_delivery(
        &self,
        key: &MessageKey,
        now: SystemTime,
    ) -> impl Future<Output = Result<DeliveryTally, StoreError>> + Send {
        ready(Ok(self.count_now(key, now)))
    }

    fn forget(&self, key: &MessageKey) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.forget_now(key);
        ready(Ok(()))
    }
}

impl fmt::Debug for MemoryFailureCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state();
        f.debug_struct("MemoryFailureCounts")
            .field("capacity", &state.capacity)
            .field("tracked", &state.counts.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> MessageKey {
        MessageKey::new(id)
    }

    #[test]
    fn zero_capacity_names_the_field() {
        assert_eq!(
            MemoryFailureCounts::new(0).unwrap_err().field(),
            "poison.capacity"
        );
    }

    #[test]
    fn counts_until_forgotten() {
        let counts = MemoryFailureCounts::new(10).unwrap();
        let now = SystemTime::now();
        assert_eq!(counts.count_now(&key("m"), now).deliveries, 1);
        let later = now + std::time::Duration::from_secs(5);
        let tally = counts.count_now(&key("m"), later);
        assert_eq!(tally.deliveries, 2);
        assert_eq!(tally.first_delivered_at, now, "the first time is kept");
        counts.forget_now(&key("m"));
        assert_eq!(counts.count_now(&key("m"), later).deliveries, 1);
    }

    #[test]
    fn counter_map_stays_bounded_under_unbounded_ids() {
        let counts = MemoryFailureCounts::new(100).unwrap();
        let now = SystemTime::now();
        for i in 0..10_000 {
            let id = key(&format!("m-{i}"));
            counts.count_now(&id, now);
            if i % 3 == 0 {
                counts.forget_now(&id);
            }
            let (live, order) = counts.tracked();
            assert!(live <= 100, "{live} ids tracked");
            assert!(order <= 201, "{order} positions tracked");
        }
        // The most recent ids are the ones remembered.
        assert!(counts.deliveries(&key("m-9998")).is_some());
        assert!(counts.deliveries(&key("m-5")).is_none());
    }

    proptest::proptest! {
        /// Against a model: whatever the sequence of deliveries and
        /// successes, the map never holds more than `capacity` ids, and an
        /// id it still holds has exactly the deliveries counted since it was
        /// last forgotten.
        #[test]
        fn counts_match_a_model_and_stay_bounded(
            ops in proptest::collection::vec((0u8..20, proptest::bool::ANY), 0..300),
            capacity in 1usize..8,
        ) {
            let counts = MemoryFailureCounts::new(capacity).unwrap();
            let mut model: HashMap<MessageKey, u32> = HashMap::new();
            let now = SystemTime::now();
            for (id, delivered) in ops {
                let id = key(&format!("m-{id}"));
                if delivered {
                    let tally = counts.count_now(&id, now);
                    let expected = model.get(&id).map_or(1, |n| n + 1);
                    // A key evicted for room starts again at one.
                    proptest::prop_assert!(tally.deliveries == expected || tally.deliveries == 1);
                    model.insert(id.clone(), tally.deliveries);
                } else {
                    counts.forget_now(&id);
                    model.remove(&id);
                }
                let (live, order) = counts.tracked();
                proptest::prop_assert!(live <= capacity);
                proptest::prop_assert!(order <= 2 * capacity + 1);
                if let Some(deliveries) = counts.deliveries(&id) {
                    proptest::prop_assert_eq!(Some(&deliveries), model.get(&id));
                }
            }
        }
    }
}
