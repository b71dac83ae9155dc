//! Poison-message detection for consumers of redelivering queues.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::SystemTime;

use tower_classify::{BoxError, ConfigError};

use crate::counts::{DeliveryTally, DynFailureCountStore, MemoryFailureCounts, MessageKey};
use crate::error::CountStoreFailed;
use crate::observability::ForgetfulMap;
use crate::store::StoreError;

/// How poison detection counts deliveries of a message.
///
/// A queue (SQS, Pub/Sub, RabbitMQ, Redis Streams, a Kafka consumer with
/// retries) delivers a failed message again. The layer counts deliveries per
/// message id ([`RequestRecord::message_id`](crate::RequestRecord::message_id));
/// once a message has been delivered `max_attempts` times without success,
/// its next delivery goes to the action (the store, by default) instead of
/// the inner service, and the caller gets a
/// [`PoisonMessage`](crate::error::PoisonMessage) error, which tells a
/// consumer to acknowledge it.
///
/// Under the limit, failures are returned to the caller and *not* stored:
/// the queue's redelivery is the retry, and the store gets one entry per
/// message. A failure classified
/// [`Poison`](tower_classify::FailureKind::Poison) is stored at once. A
/// success forgets the count, which comes from the queue or a count store
/// (the [`counts`](crate::counts) module), by default
/// [`MemoryFailureCounts`] with this policy's [`capacity`](Self::capacity).
///
/// A diverted message never reaches the inner service: not its future, nor
/// its `call` (where hyper's `SendRequest` sends and `RateLimit` spends a
/// permit). A store that answers at once (memory, a count from the request)
/// decides before the inner service is called. One that waits (Redis, redb)
/// is awaited first, with the service made ready taken along and a clone
/// left in its place, as tower's `Retry` does: hence `S: Clone`.
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

    /// Remembers at most `capacity` message ids (at least 1; default 10 000).
    pub fn capacity(mut self, capacity: usize) -> Result<Self, ConfigError> {
        if capacity == 0 {
            return Err(ConfigError::new("poison.capacity", "must be at least 1"));
        }
        self.capacity = capacity;
        Ok(self)
    }
}

/// Poison detection as a layer runs it: the policy, where deliveries are
/// counted, and what this process saw of each message's last failure.
pub(crate) struct PoisonCounting {
    policy: PoisonPolicy,
    store: Counts,
    /// Bounded: losing one only makes a diverted entry's error text generic.
    last: ForgetfulMap<MessageKey, LastFailure>,
}

/// Where a layer counts: its own memory (answered in place, no runtime or
/// allocation needed), or a store behind a pointer.
enum Counts {
    Memory(MemoryFailureCounts),
    Store(Arc<dyn DynFailureCountStore>),
}

/// What poison detection knows of the delivery being processed.
#[derive(Debug, Clone)]
pub(crate) struct Counted {
    pub(crate) key: MessageKey,
    /// Which delivery this is (1 for the first).
    pub(crate) deliveries: u32,
    pub(crate) first: SystemTime,
    /// `true` when the count store counted it (and must forget it on success).
    in_store: bool,
}

/// Whether a delivery may reach the inner service.
pub(crate) enum Decision {
    /// Call the inner service; the count, when the message has an id.
    Process(Option<Counted>),
    /// Do not call it.
    Stop(Stop),
}

/// Why a delivery does not reach the inner service.
pub(crate) enum Stop {
    /// Over the limit: dispose of the message.
    Divert(Counted),
    /// The count store failed: fail the delivery unprocessed.
    Refuse(BoxError),
}

/// A [`Decision`] made at once, or one that waits on the count store.
pub(crate) enum Admission {
    Now(Decision),
    Later(Pin<Box<dyn Future<Output = Decision> + Send>>),
}

/// The last failure of a message, as this process saw it, for the entry
/// written when the message is diverted.
#[derive(Debug, Clone)]
pub(crate) struct LastFailure {
    pub(crate) error: Vec<String>,
    pub(crate) at: SystemTime,
}

impl PoisonCounting {
    pub(crate) fn new(policy: PoisonPolicy, store: Option<Arc<dyn DynFailureCountStore>>) -> Self {
        let store = match store {
            Some(store) => Counts::Store(store),
            // `PoisonPolicy::capacity` refuses zero, so `new` cannot fail.
            None => Counts::Memory(MemoryFailureCounts::new(policy.capacity).unwrap_or_default()),
        };
        PoisonCounting {
            policy,
            store,
            last: ForgetfulMap::new(policy.capacity),
        }
    }

    pub(crate) fn policy(&self) -> PoisonPolicy {
        self.policy
    }

    /// Decides whether the delivery of `message_id` (delivery number
    /// `delivery` when the request carries the queue's count) may be
    /// processed, counting it in the store otherwise.
    ///
    /// The memory store decides here; another store is polled once here,
    /// and one that answers at once decides before the inner service is
    /// called too.
    pub(crate) fn admit(
        self: &Arc<Self>,
        message_id: Option<&str>,
        delivery: Option<u32>,
    ) -> Admission {
        let Some(id) = message_id else {
            return Admission::Now(Decision::Process(None));
        };
        let key = MessageKey::new(id);
        let now = SystemTime::now();
        if let Some(deliveries) = delivery {
            // The queue's count is authoritative: no store is asked.
            let first = self.last(&key).map_or(now, |last| last.at.min(now));
            return Admission::Now(self.decide(Counted {
                key,
                deliveries: deliveries.max(1),
                first,
                in_store: false,
            }));
        }
        let store = match &self.store {
            Counts::Memory(memory) => {
                let tally = memory.count_now(&key, now);
                return Admission::Now(self.counted(key, Ok(tally)));
            }
            Counts::Store(store) => store,
        };
        let mut counting = store.count_delivery(key.clone(), now);
        // Stores do their I/O on the tokio runtime (`spawn_blocking`, a
        // connection task), so they are polled here only inside one.
        if tokio::runtime::Handle::try_current().is_ok() {
            let mut cx = Context::from_waker(Waker::noop());
            if let Poll::Ready(tally) = counting.as_mut().poll(&mut cx) {
                return Admission::Now(self.counted(key, tally));
            }
        }
        let this = Arc::clone(self);
        Admission::Later(Box::pin(async move {
            let tally = counting.await;
            this.counted(key, tally)
        }))
    }

    fn counted(&self, key: MessageKey, tally: Result<DeliveryTally, StoreError>) -> Decision {
        match tally {
            Ok(tally) => self.decide(Counted {
                key,
                deliveries: tally.deliveries,
                first: tally.first_delivered_at,
                in_store: true,
            }),
            Err(error) => {
                tracing::error!(
                    error = %error,
                    "poison count store failed; the delivery fails unprocessed so the queue redelivers it"
                );
                Decision::Stop(Stop::Refuse(CountStoreFailed::new(error).into()))
            }
        }
    }

    fn decide(&self, counted: Counted) -> Decision {
        // `max_attempts` deliveries came before this one and none succeeded.
        if counted.deliveries > self.policy.max_attempts {
            Decision::Stop(Stop::Divert(counted))
        } else {
            Decision::Process(Some(counted))
        }
    }

    /// What this process saw of `key`'s last failure.
    pub(crate) fn last(&self, key: &MessageKey) -> Option<LastFailure> {
        self.last.lock().get(key).cloned()
    }

    /// A delivery under the limit failed: keep its error for the entry
    /// written if the message is diverted later.
    pub(crate) fn note_failure(&self, key: &MessageKey, error: Vec<String>) {
        let at = SystemTime::now();
        self.last.insert(key.clone(), LastFailure { error, at });
    }

    /// The message succeeded or was disposed of: its count starts over. A
    /// store that cannot forget is logged, not fatal: the message was
    /// handled, and a stale count only matters if its id comes back (the
    /// Redis and redb stores bound how long or how many they keep).
    pub(crate) async fn forget(&self, counted: Counted) {
        self.last.lock().remove(&counted.key);
        if !counted.in_store {
            return;
        }
        let store = match &self.store {
            Counts::Memory(memory) => return memory.forget_now(&counted.key),
            Counts::Store(store) => store,
        };
        if let Err(error) = store.forget(counted.key).await {
            tracing::warn!(error = %error, "poison count store failed to forget a handled message");
        }
    }
}

impl fmt::Debug for PoisonCounting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let store = match &self.store {
            Counts::Memory(memory) => format!("{memory:?}"),
            Counts::Store(store) => store.name().to_owned(),
        };
        f.debug_struct("PoisonCounting")
            .field("policy", &self.policy)
            .field("store", &store)
            .finish_non_exhaustive()
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
        assert_eq!(
            PoisonPolicy::new(1)
                .unwrap()
                .capacity(0)
                .unwrap_err()
                .field(),
            "poison.capacity"
        );
    }

    fn decide(poison: &Arc<PoisonCounting>, id: &str, delivery: Option<u32>) -> Decision {
        match poison.admit(Some(id), delivery) {
            Admission::Now(decision) => decision,
            Admission::Later(_) => panic!("the memory store answers at once"),
        }
    }

    #[test]
    fn the_delivery_after_max_attempts_is_diverted() {
        let poison = Arc::new(PoisonCounting::new(PoisonPolicy::new(2).unwrap(), None));
        assert!(
            matches!(decide(&poison, "m", None), Decision::Process(Some(c)) if c.deliveries == 1)
        );
        assert!(
            matches!(decide(&poison, "m", None), Decision::Process(Some(c)) if c.deliveries == 2)
        );
        assert!(
            matches!(decide(&poison, "m", None), Decision::Stop(Stop::Divert(c)) if c.deliveries == 3)
        );
        assert!(matches!(
            poison.admit(None, None),
            Admission::Now(Decision::Process(None))
        ));
    }

    #[test]
    fn a_count_from_the_request_is_authoritative() {
        let poison = Arc::new(PoisonCounting::new(PoisonPolicy::new(3).unwrap(), None));
        // The queue says fourth delivery: diverted although this process
        // never counted the message.
        assert!(
            matches!(decide(&poison, "m", Some(4)), Decision::Stop(Stop::Divert(c)) if c.deliveries == 4)
        );
        assert!(matches!(
            decide(&poison, "n", Some(3)),
            Decision::Process(Some(_))
        ));
        // …and nothing was counted in the store.
        assert!(
            matches!(decide(&poison, "m", None), Decision::Process(Some(c)) if c.deliveries == 1)
        );
    }

    #[test]
    fn last_failures_stay_bounded() {
        let policy = PoisonPolicy::new(3).unwrap().capacity(10).unwrap();
        let poison = PoisonCounting::new(policy, None);
        for i in 0..1_000 {
            let key = MessageKey::new(&format!("m-{i}"));
            poison.note_failure(&key, vec!["boom".into()]);
            assert!(poison.last.lock().len() <= 10);
        }
    }
}
