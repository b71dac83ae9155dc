//! Poison-message detection for consumers of redelivering queues.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::SystemTime;

use tower_classify::{ConfigError, FailureKind};

/// How poison detection counts failures across deliveries.
///
/// A queue (SQS, Pub/Sub, RabbitMQ, a Kafka consumer with retries) delivers a
/// failed message again. The layer counts failures per message id (from
/// [`RequestRecord::message_id`](crate::RequestRecord::message_id)); a message
/// that has failed `max_attempts` times is not given to the inner service
/// again: its next delivery goes to the dead-letter store (or the configured
/// action) and the caller gets a [`PoisonMessage`](crate::error::PoisonMessage)
/// error, which tells a consumer to acknowledge it.
///
/// While a message is under the limit, its failures are returned to the
/// caller and *not* stored, so the queue's redelivery is the retry and the
/// store gets one entry per message, not one per delivery. A failure
/// classified [`Poison`](FailureKind::Poison) is stored at once.
///
/// The counts are kept for at most `capacity` message ids (default 10 000);
/// past that the id counted longest ago is forgotten, so an unbounded stream
/// of distinct failing ids cannot exhaust memory. A success forgets its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoisonPolicy {
    max_attempts: u32,
    capacity: usize,
}

impl PoisonPolicy {
    /// Diverts a message after `max_attempts` failed deliveries (at least 1).
    pub fn new(max_attempts: u32) -> Result<Self, ConfigError> {
        if max_attempts == 0 {
            return Err(ConfigError::new(
                "poison.max_attempts",
                "must be at least 1 (the number of failed deliveries before a message is diverted)",
            ));
        }
        Ok(PoisonPolicy {
            max_attempts,
            capacity: 10_000,
        })
    }

    /// Remembers at most `capacity` message ids (at least 1).
    pub fn capacity(mut self, capacity: usize) -> Result<Self, ConfigError> {
        if capacity == 0 {
            return Err(ConfigError::new("poison.capacity", "must be at least 1"));
        }
        self.capacity = capacity;
        Ok(self)
    }

    /// The number of failed deliveries after which a message is diverted.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }
}

/// What is known about one message's failures.
#[derive(Debug, Clone)]
pub(crate) struct FailureCount {
    pub(crate) failures: u32,
    pub(crate) first: SystemTime,
    pub(crate) last: SystemTime,
    pub(crate) error: Vec<String>,
    pub(crate) kind: FailureKind,
    seq: u64,
}

/// The bounded failure counts, shared by every clone of a layer's services.
#[derive(Debug)]
pub(crate) struct PoisonCounters {
    policy: PoisonPolicy,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    counts: HashMap<String, FailureCount>,
    /// Ids in the order they were first counted, with the sequence number
    /// they were counted under; an id forgotten and counted again gets a new
    /// number, so stale positions are recognised and skipped.
    order: VecDeque<(String, u64)>,
    next_seq: u64,
}

impl PoisonCounters {
    pub(crate) fn new(policy: PoisonPolicy) -> Self {
        PoisonCounters {
            policy,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The count for `id` when it has reached the limit.
    pub(crate) fn exceeded(&self, id: &str) -> Option<FailureCount> {
        self.state()
            .counts
            .get(id)
            .filter(|count| count.failures >= self.policy.max_attempts)
            .cloned()
    }

    /// Previous failures of `id`.
    pub(crate) fn get(&self, id: &str) -> Option<FailureCount> {
        self.state().counts.get(id).cloned()
    }

    /// Counts one failure of `id`.
    pub(crate) fn record_failure(
        &self,
        id: &str,
        kind: FailureKind,
        error: Vec<String>,
        now: SystemTime,
    ) -> FailureCount {
        let mut state = self.state();
        if let Some(count) = state.counts.get_mut(id) {
            count.failures += 1;
            count.last = now;
            count.error = error;
            count.kind = kind;
            return count.clone();
        }
        while state.counts.len() >= self.policy.capacity {
            let Some((oldest, seq)) = state.order.pop_front() else {
                break;
            };
            if state.counts.get(&oldest).is_some_and(|c| c.seq == seq) {
                state.counts.remove(&oldest);
            }
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        let count = FailureCount {
            failures: 1,
            first: now,
            last: now,
            error,
            kind,
            seq,
        };
        state.counts.insert(id.to_owned(), count.clone());
        state.order.push_back((id.to_owned(), seq));
        // Forgotten ids leave stale positions behind; rebuild the order when
        // they outnumber the live ones so it stays bounded too.
        if state.order.len() > 2 * self.policy.capacity {
            let State { counts, order, .. } = &mut *state;
            order.retain(|(id, seq)| counts.get(id).is_some_and(|c| c.seq == *seq));
        }
        count
    }

    /// Forgets `id` (it succeeded, or it was dead-lettered).
    pub(crate) fn clear(&self, id: &str) {
        self.state().counts.remove(id);
    }

    #[cfg(test)]
    fn tracked(&self) -> (usize, usize) {
        let state = self.state();
        (state.counts.len(), state.order.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_max_attempts_names_the_field() {
        assert_eq!(
            PoisonPolicy::new(0).unwrap_err().field(),
            "poison.max_attempts"
        );
    }

    #[test]
    fn reaches_the_limit_after_max_attempts_failures() {
        let counters = PoisonCounters::new(PoisonPolicy::new(2).unwrap());
        let now = SystemTime::now();
        counters.record_failure("m", FailureKind::ServerError, vec!["boom".into()], now);
        assert!(counters.exceeded("m").is_none());
        counters.record_failure("m", FailureKind::ServerError, vec!["boom".into()], now);
        assert_eq!(counters.exceeded("m").unwrap().failures, 2);
        counters.clear("m");
        assert!(counters.exceeded("m").is_none());
    }

    #[test]
    fn counter_map_stays_bounded_under_unbounded_ids() {
        let policy = PoisonPolicy::new(3).unwrap().capacity(100).unwrap();
        let counters = PoisonCounters::new(policy);
        let now = SystemTime::now();
        for i in 0..10_000 {
            let id = format!("m-{i}");
            counters.record_failure(&id, FailureKind::Connection, Vec::new(), now);
            if i % 3 == 0 {
                counters.clear(&id);
            }
            let (live, order) = counters.tracked();
            assert!(live <= 100, "{live} ids tracked");
            assert!(order <= 201, "{order} positions tracked");
        }
        // The most recent ids are the ones remembered.
        assert!(counters.get("m-9998").is_some());
        assert!(counters.get("m-5").is_none());
    }

    proptest::proptest! {
        /// Against a model: whatever the sequence of failures and successes,
        /// the map never holds more than `capacity` ids, and an id it still
        /// holds has exactly the failures counted since it was last cleared.
        #[test]
        fn counts_match_a_model_and_stay_bounded(
            ops in proptest::collection::vec((0u8..20, proptest::bool::ANY), 0..300),
            capacity in 1usize..8,
        ) {
            let policy = PoisonPolicy::new(3).unwrap().capacity(capacity).unwrap();
            let counters = PoisonCounters::new(policy);
            let mut model: HashMap<String, u32> = HashMap::new();
            let now = SystemTime::now();
            for (id, fails) in ops {
                let id = format!("m-{id}");
                if fails {
                    let count = counters.record_failure(&id, FailureKind::Connection, Vec::new(), now);
                    let expected = model.get(&id).map_or(1, |n| n + 1);
                    // A forgotten id starts again at one.
                    proptest::prop_assert!(count.failures == expected || count.failures == 1);
                    model.insert(id.clone(), count.failures);
                } else {
                    counters.clear(&id);
                    model.remove(&id);
                }
                let (live, order) = counters.tracked();
                proptest::prop_assert!(live <= capacity);
                proptest::prop_assert!(order <= 2 * capacity + 1);
                if let Some(count) = counters.get(&id) {
                    proptest::prop_assert_eq!(Some(&count.failures), model.get(&id));
                    proptest::prop_assert_eq!(
                        counters.exceeded(&id).is_some(),
                        count.failures >= 3
                    );
                }
            }
        }
    }
}
