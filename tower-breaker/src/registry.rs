//! The breakers of one layer, by key: a sharded map for lookups and, beside
//! it, the eviction order for new keys ([`crate::eviction`]). A known key
//! takes one shard's read lock; a new key builds its breaker (its window can
//! be tens of KiB) before taking the insert lock, which serialises changes.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock};
use std::sync::{RwLockReadGuard, RwLockWriteGuard};

use std::time::Duration;

use metrics::SharedString;
use tower_classify::LogLimit;

use crate::eviction::{EvictionNotices, EvictionQueues, Victim};
use crate::instruments::EvictionCounters;
use crate::listeners::{breaker_event, Listeners};
use crate::machine::Breaker;
use crate::settings::Settings;
use crate::share::Share;
use crate::state::State;

/// Enough shards that calls from a few dozen cores seldom share one; few
/// enough that listing every breaker stays cheap.
const SHARDS: usize = 16;

/// Each key's breaker, as a keyed call's permit holds it.
type Shard = HashMap<Arc<str>, Arc<Share>>;

/// The breakers of one layer, by key. A plain layer's registry holds its one
/// breaker (under the layer's name) so the admin handle treats both alike.
pub(crate) struct Registry {
    settings: Arc<Settings>,
    shards: Box<[RwLock<Shard>]>,
    hasher: RandomState,
    /// Taken to add or evict a breaker (a new key) and by the admin handle's
    /// resets; never by a call for a key already present.
    queues: Mutex<EvictionQueues>,
    /// The coarse clock of last-used stamps: one tick per new key.
    clock: AtomicU64,
    /// What the breakers tell the eviction queues.
    notices: Arc<EvictionNotices>,
    /// Counts every eviction, warned about or not.
    evictions: EvictionCounters,
    /// Evicting an open breaker warns at most once per [`WARNING_INTERVAL`].
    open_eviction_warnings: LogLimit,
    /// So does a new key not kept because every breaker is forced.
    overflow_warnings: LogLimit,
    /// Every kept breaker is forced (the last eviction found none to take)
    /// and none was reset since: new keys go to `overflow`. Written under
    /// the insert lock.
    all_forced: AtomicBool,
    /// The breaker new keys share while `all_forced`.
    overflow: OnceLock<Arc<Share>>,
}

/// The key of the breaker that new keys share while every kept breaker is
/// forced by an operator (in events and in its [`CircuitOpen`] errors).
///
/// [`CircuitOpen`]: crate::CircuitOpen
pub(crate) const OVERFLOW_KEY: &str = "<overflow>";

/// The shortest time between two warnings of one kind from one registry. A
/// flood of new keys evicts a breaker per key: one line per key would bury
/// the log (and cost more than the eviction).
pub(crate) const WARNING_INTERVAL: Duration = Duration::from_secs(10);

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let breakers: usize = (0..SHARDS).map(|shard| self.read(shard).len()).sum();
        f.debug_struct("Registry")
            .field("breakers", &breakers)
            .field("max_breakers", &self.settings.max_breakers)
            .finish()
    }
}

impl Registry {
    /// A keyed layer's registry, empty, counting its evictions on `evictions`.
    pub(crate) fn new(settings: Arc<Settings>, evictions: EvictionCounters) -> Self {
        Registry {
            settings,
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            hasher: RandomState::new(),
            queues: Mutex::new(EvictionQueues::new()),
            clock: AtomicU64::new(0),
            notices: Arc::default(),
            evictions,
            open_eviction_warnings: LogLimit::new(WARNING_INTERVAL),
            overflow_warnings: LogLimit::new(WARNING_INTERVAL),
            all_forced: AtomicBool::new(false),
            overflow: OnceLock::new(),
        }
    }

    /// The registry of a plain (unkeyed) layer and its one breaker, labelled
    /// with the layer's name.
    pub(crate) fn single(settings: Arc<Settings>) -> (Self, Arc<Breaker>) {
        // Never evicts: no eviction series for an exporter to show at 0.
        let registry = Registry::new(Arc::clone(&settings), EvictionCounters::none());
        let name = &settings.name;
        let breaker = registry.build(Arc::clone(name), Arc::clone(name).into(), true, false, None);
        let shard = registry.shard_of(name);
        let kept = registry.keep(&mut registry.lock_queues(), breaker, 0, shard);
        (registry, Arc::clone(&kept.breaker))
    }

    /// A breaker for `key`, its metrics under `label`.
    fn build(
        &self,
        key: Arc<str>,
        label: SharedString,
        own_label: bool,
        keyed: bool,
        notices: Option<Arc<EvictionNotices>>,
    ) -> Arc<Breaker> {
        let listeners = Listeners::new(label, own_label, notices);
        let settings = Arc::clone(&self.settings);
        Arc::new(Breaker::new(key, settings, keyed, Box::new(listeners)))
    }

    /// Adds `breaker` to the map (its key's `shard`) and the queues, under
    /// the insert lock.
    fn keep(
        &self,
        queues: &mut EvictionQueues,
        breaker: Arc<Breaker>,
        now: u64,
        shard: usize,
    ) -> Arc<Share> {
        queues.insert(Arc::clone(&breaker), now);
        // Before the breaker is visible: nothing can have changed its state.
        breaker.publish();
        let share = Arc::new(Share::new(breaker));
        self.write(shard)
            .insert(Arc::clone(&share.key), Arc::clone(&share));
        share
    }

    fn shard_of(&self, key: &str) -> usize {
        self.hasher.hash_one(key) as usize % SHARDS
    }

    // Every change to a shard or the queues is a single insert, remove or
    // relink: a panic elsewhere while one is held leaves them consistent,
    // so a poisoned lock keeps serving.

    fn read(&self, shard: usize) -> RwLockReadGuard<'_, Shard> {
        self.shards[shard]
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self, shard: usize) -> RwLockWriteGuard<'_, Shard> {
        self.shards[shard]
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_queues(&self) -> MutexGuard<'_, EvictionQueues> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The breaker for `key`, created (and a victim evicted) when new.
    pub(crate) fn breaker(&self, key: &str) -> Arc<Share> {
        let shard = self.shard_of(key);
        let found = self.read(shard).get(key).cloned();
        match found {
            Some(breaker) => {
                self.touch(&breaker);
                breaker
            }
            None => self.insert(key, shard),
        }
    }

    /// Stamps a breaker used now. Loads first: the stamp changes once per
    /// new key at most, and a store on every call would bounce the cache
    /// line between cores. A breaker that is not closed is also stamped in
    /// the exact order of uses the all-open eviction reads: its calls are
    /// refused or probes, never the closed fast path.
    fn touch(&self, breaker: &Breaker) {
        let now = self.clock.load(Ordering::Relaxed);
        if breaker.last_used.load(Ordering::Relaxed) < now {
            breaker.last_used.store(now, Ordering::Relaxed);
        }
        if breaker.state() != State::Closed {
            self.notices.stamp(&breaker.open_used);
        }
    }

    #[cold]
    fn insert(&self, key: &str, shard: usize) -> Arc<Share> {
        if self.all_forced.load(Ordering::Acquire) {
            // Nothing could be kept: build nothing, so a flood of new keys
            // allocates nothing per call.
            return self.overflow();
        }
        let key: Arc<str> = Arc::from(key);
        let (label, own_label) = self
            .settings
            .metrics_label
            .label_for(&self.settings.name, &key);
        // Built before any lock is taken: a failure-rate window allocates,
        // and registering metric handles runs the recorder's code.
        let notices = Some(Arc::clone(&self.notices));
        let breaker = self.build(Arc::clone(&key), label, own_label, true, notices);

        let mut queues = self.lock_queues();
        // Every insert holds `queues`: what this read finds stays true until
        // it is released.
        if let Some(existing) = self.read(shard).get(&key).cloned() {
            // Another call inserted the key while this one built a breaker.
            drop(queues);
            self.touch(&existing);
            return existing;
        }
        let now = self.clock.load(Ordering::Relaxed);
        if queues.len() >= self.settings.max_breakers {
            self.read_closed_notices(&mut queues);
            let evicted = match queues.evict(now) {
                Victim::Closed(victim) => {
                    self.evictions.closed.increment(1);
                    breaker_event!(debug, &victim, "evicting closed circuit breaker");
                    victim
                }
                Victim::Open(victim) => {
                    self.evictions.open.increment(1);
                    // One per new key under a key flood: rate-limited, with
                    // the count of those left out; the counter has them all.
                    match self.open_eviction_warnings.check() {
                        Some(suppressed) => breaker_event!(
                            warn,
                            &victim,
                            max_breakers = self.settings.max_breakers,
                            suppressed,
                            "every circuit breaker is open; evicting the least recently used \
                             open one, which re-admits load to its dependency"
                        ),
                        None => breaker_event!(
                            debug,
                            &victim,
                            "evicting open circuit breaker (warning rate-limited)"
                        ),
                    }
                    victim
                }
                Victim::None => {
                    // Every breaker is an operator's (all parked now): none
                    // may go, and the map may not grow, until a reset. The
                    // breaker just built was never published; it is dropped.
                    self.all_forced.store(true, Ordering::Release);
                    drop(queues);
                    return self.overflow();
                }
            };
            self.write(self.shard_of(&evicted.key))
                .remove(&*evicted.key);
            // Under the insert lock, so it cannot overwrite the state of a
            // new breaker for the same key.
            evicted.retire();
        }
        let share = self.keep(&mut queues, breaker, now, shard);
        // Calls from now on stamp a later time than any breaker's join time.
        self.clock.store(now + 1, Ordering::Relaxed);
        share
    }

    /// The breaker shared by every new key while all kept breakers are
    /// forced, created on first use; see [`OVERFLOW_KEY`].
    #[cold]
    fn overflow(&self) -> Arc<Share> {
        match self.overflow_warnings.check() {
            Some(suppressed) => tracing::warn!(
                breaker = %self.settings.name,
                max_breakers = self.settings.max_breakers,
                suppressed,
                "every circuit breaker is forced by an operator; \
                 new keys share one overflow breaker until a reset"
            ),
            None => tracing::debug!(
                breaker = %self.settings.name,
                "every circuit breaker is forced; a new key's call goes through the overflow breaker"
            ),
        }
        let overflow = self.overflow.get_or_init(|| {
            // Labelled with the layer's name and never reporting a state:
            // its gauge would hide the state of the breakers sharing the
            // label, and it is no key's breaker.
            let label = Arc::clone(&self.settings.name).into();
            let breaker = self.build(Arc::from(OVERFLOW_KEY), label, false, true, None);
            breaker.retire();
            Arc::new(Share::new(breaker))
        });
        Arc::clone(overflow)
    }

    /// Moves the breakers that closed again back to the closed queue.
    fn read_closed_notices(&self, queues: &mut EvictionQueues) {
        for key in self.notices.take_closed() {
            if let Some(share) = self.read(self.shard_of(&key)).get(&key) {
                // Cleared first: closing again after this posts again.
                share.notice_posted.store(false, Ordering::Relaxed);
                queues.closed_again(&share.breaker);
            }
        }
    }

    pub(crate) fn get(&self, key: &str) -> Option<Arc<Breaker>> {
        self.read(self.shard_of(key))
            .get(key)
            .map(|share| Arc::clone(&share.breaker))
    }

    /// Every breaker, shard by shard.
    pub(crate) fn all(&self) -> Vec<Arc<Breaker>> {
        let breakers =
            |shard: &Shard| -> Vec<_> { shard.values().map(|s| Arc::clone(&s.breaker)).collect() };
        (0..SHARDS)
            .flat_map(|shard| breakers(&self.read(shard)))
            .collect()
    }

    /// An operator's transition for the breaker of `key`; `false` if there
    /// is none. A breaker leaving a forced state may be evicted again.
    pub(crate) fn force(&self, key: &str, to: State) -> bool {
        let queues = self.lock_queues();
        let Some(found) = self.get(key) else {
            return false;
        };
        self.force_all(queues, &[found], to);
        true
    }

    /// Resets every breaker; returns how many.
    pub(crate) fn reset_all(&self) -> usize {
        let queues = self.lock_queues();
        let all = self.all();
        self.force_all(queues, &all, State::Closed);
        all.len()
    }

    /// Sets the breakers found under `queues` to `to`, then tells the world.
    fn force_all(
        &self,
        mut queues: MutexGuard<'_, EvictionQueues>,
        breakers: &[Arc<Breaker>],
        to: State,
    ) {
        // Under the insert lock, which every eviction holds: a breaker found
        // in the map is still there when its state changes (else an eviction
        // in between could lose it, and the key come back unforced), and
        // once it is forced no eviction takes it.
        let now = self.clock.load(Ordering::Relaxed);
        if !to.is_forced() && !breakers.is_empty() {
            // A reset breaker can be evicted again: new keys are kept again.
            self.all_forced.store(false, Ordering::Release);
        }
        let left: Vec<State> = breakers
            .iter()
            .map(|breaker| {
                let from = breaker.set_forced(to);
                if !to.is_forced() {
                    queues.unpark(breaker, now);
                }
                from
            })
            .collect();
        // Announced outside it: the state-change callbacks may call the
        // service again, and a new key would wait on this lock.
        drop(queues);
        for (breaker, from) in breakers.iter().zip(left) {
            breaker.announce_forced(from, to);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::thread;
    use std::time::Duration;

    use super::*;
    use crate::layer::Builder;

    fn registry(max: usize) -> Arc<Registry> {
        let settings = Builder::default().max_breakers(max).into_settings();
        let evictions = EvictionCounters::register(&settings.name);
        Arc::new(Registry::new(Arc::new(settings), evictions))
    }

    /// Looks `keys` up on another thread; `true` when it finished in time.
    fn finishes(registry: &Arc<Registry>, keys: Vec<String>) -> bool {
        let (done, finished) = mpsc::channel();
        let registry = Arc::clone(registry);
        thread::spawn(move || {
            for key in &keys {
                assert_eq!(&*registry.breaker(key).key, key.as_str());
            }
            let _ = done.send(());
        });
        finished.recv_timeout(Duration::from_secs(10)).is_ok()
    }

    /// Issue 13: a call for a known key takes neither the insert lock (held
    /// here as a new key's insert would) nor the lock of another key's shard.
    #[test]
    fn a_known_key_is_found_while_the_insert_lock_and_another_shard_are_held() {
        let registry = registry(64);
        let keys: Vec<String> = (0..32).map(|n| format!("key-{n}")).collect();
        for key in &keys {
            registry.breaker(key);
        }
        let tick = registry.clock.load(Ordering::Relaxed);

        let insert_lock = registry.lock_queues();
        assert!(
            finishes(&registry, keys.clone()),
            "a lookup waited on the insert lock"
        );
        drop(insert_lock);

        let held = registry.shard_of(&keys[0]);
        let elsewhere: Vec<String> = keys
            .iter()
            .filter(|key| registry.shard_of(key) != held)
            .cloned()
            .collect();
        assert!(!elsewhere.is_empty());
        let shard_lock = registry.write(held);
        assert!(
            finishes(&registry, elsewhere),
            "a lookup waited on another shard's lock"
        );
        drop(shard_lock);
        assert_eq!(
            registry.clock.load(Ordering::Relaxed),
            tick,
            "lookups of known keys inserted nothing"
        );
    }

    /// Issue 14: an operator's force and a new key's eviction race; a
    /// breaker reported forced is never the one evicted, so the key keeps
    /// its forced state. Before the fix the force ran outside the insert
    /// lock: the eviction could take the breaker between the lookup and
    /// the force, losing it. Many rounds with shifting timings, since the
    /// window is a few instructions wide.
    #[test]
    fn a_breaker_forced_while_a_new_key_evicts_stays_forced() {
        use std::sync::Barrier;
        let mut lost = Vec::new();
        for round in 0..3_000u32 {
            let registry = registry(1);
            registry.breaker("pinned");
            let barrier = Arc::new(Barrier::new(2));
            let newcomer = {
                let (registry, barrier) = (Arc::clone(&registry), Arc::clone(&barrier));
                thread::spawn(move || {
                    barrier.wait();
                    for _ in 0..round % 64 {
                        std::hint::spin_loop();
                    }
                    registry.breaker("newcomer");
                })
            };
            barrier.wait();
            for _ in 0..(round / 64) % 64 {
                std::hint::spin_loop();
            }
            let forced = registry.force("pinned", State::ForcedOpen);
            newcomer.join().unwrap();
            let kept = registry.get("pinned").map(|breaker| breaker.state());
            if forced && kept != Some(State::ForcedOpen) {
                lost.push((round, kept));
            }
        }
        assert!(lost.is_empty(), "forced and then lost: {lost:?}");
    }

    /// Issue 14: while every kept breaker is forced, new keys share one
    /// overflow breaker instead of a new one per call (which allocated a
    /// breaker, and registered its metrics, for every hostile key); after a
    /// reset, new keys are kept again.
    #[test]
    fn new_keys_share_one_overflow_breaker_while_every_breaker_is_forced() {
        let registry = registry(2);
        for key in ["a", "b"] {
            registry.breaker(key);
            assert!(registry.force(key, State::ForcedClosed));
        }
        let first = registry.breaker("hostile-0");
        assert_eq!(&*first.key, OVERFLOW_KEY);
        for n in 1..100 {
            let again = registry.breaker(&format!("hostile-{n}"));
            assert!(Arc::ptr_eq(&first, &again), "a breaker per new key");
        }
        assert_eq!(registry.all().len(), 2);
        assert_eq!(registry.lock_queues().len(), 2);

        assert!(registry.force("a", State::Closed));
        let kept = registry.breaker("newcomer");
        assert_eq!(&*kept.key, "newcomer");
        assert!(registry.get("newcomer").is_some());
        assert!(registry.get("a").is_none(), "the reset breaker made room");
    }

    /// A breaker built for a key that another call inserted meanwhile is
    /// dropped; the one already kept is returned.
    #[test]
    fn an_insert_that_lost_the_race_returns_the_kept_breaker() {
        let registry = registry(4);
        let kept = registry.breaker("shared");
        let shard = registry.shard_of("shared");
        assert!(Arc::ptr_eq(&registry.insert("shared", shard), &kept));
        assert_eq!(registry.all().len(), 1);
        assert_eq!(registry.lock_queues().len(), 1);
    }
}
