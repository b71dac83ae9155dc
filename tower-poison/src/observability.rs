//! The metrics the layer emits, and their descriptions.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard};

/// Failed calls the action disposed of, by `action`, `kind` and `label`.
pub(crate) const DEAD_LETTERED_TOTAL: &str = "tower_poison_dead_lettered_total";

/// How many entries a label has in the store, by `label`.
pub(crate) const DLQ_DEPTH: &str = "tower_poison_dlq_depth";

/// Calls a full store refused, by `label`.
pub(crate) const STORE_FULL_TOTAL: &str = "tower_poison_dlq_store_full_total";

/// Replays finished, by the entry's `label` and the `outcome`.
pub(crate) const REPLAYED_TOTAL: &str = "tower_poison_replayed_total";

/// Counts a replay of an entry labelled `label` that ended in `outcome`.
pub(crate) fn replayed(label: &str, outcome: &'static str) {
    metrics::counter!(REPLAYED_TOTAL, "label" => label.to_owned(), "outcome" => outcome)
        .increment(1);
}

/// Registers the descriptions (kind, unit, meaning) of this crate's
/// metrics with the installed `metrics` recorder.
///
/// Building a layer or a [`Replayer`](crate::replay::Replayer) calls it, so
/// an exporter installed before they are built describes every series; call
/// it yourself after installing a recorder later. Repeating it is harmless.
///
/// The crate docs' [observability](crate#observability) section lists the
/// metrics and events. A refusal of a full store is logged at `warn` at most
/// once every 10 s per label (with `since_last_warning`, the refusals held
/// back since), the others at `debug`; a refused call is not counted as
/// dead-lettered. The other actions log as [`Action`](crate::Action) says.
///
/// # The depth gauge
///
/// The depth is per label: layers with different labels sharing one store
/// each report their own. Every store here counts each label's entries with
/// the entries themselves (a redb file from before it counted labels is
/// counted when opened; a Redis queue's older entries are not, so its gauge
/// counts those written since, while the CLI's `stats` scans), so `remove`
/// and `purge` count too, and a label leaves with its last entry. A store of
/// your own reports a depth through
/// [`put_with_depth`](crate::store::DeadLetterStore::put_with_depth); without
/// it the layer sets no gauge.
pub fn describe_metrics() {
    metrics::describe_counter!(
        DEAD_LETTERED_TOTAL,
        metrics::Unit::Count,
        "Calls that finally failed and were disposed of by the dead-letter action \
         (dlq: stored, drop: counted and logged, fail: propagated), by failure kind"
    );
    metrics::describe_gauge!(
        DLQ_DEPTH,
        metrics::Unit::Count,
        "Entries the layer's label has in its dead-letter store, as of the layer's latest write"
    );
    metrics::describe_counter!(
        STORE_FULL_TOTAL,
        metrics::Unit::Count,
        "Failed calls a dead-letter store at its limits refused to keep (the call failed with StoreFull)"
    );
    metrics::describe_counter!(
        REPLAYED_TOTAL,
        metrics::Unit::Count,
        "Dead-letter replays finished, by outcome (delivered: removed, failed: kept with the \
         failure added, gone: removed by someone else meanwhile)"
    );
}

/// A map that starts over rather than hold more than `capacity` keys, for
/// what may be forgotten at the cost of a repeated log line or a generic
/// error text: a flood of distinct keys costs a refill, never memory.
#[derive(Debug)]
pub(crate) struct ForgetfulMap<K, V> {
    capacity: usize,
    map: Mutex<HashMap<K, V>>,
}

impl<K: Hash + Eq, V: Clone> ForgetfulMap<K, V> {
    pub(crate) fn new(capacity: usize) -> Self {
        let map = Mutex::new(HashMap::new());
        ForgetfulMap { capacity, map }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, HashMap<K, V>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets `key`'s value, emptying the map first when it is full.
    pub(crate) fn insert(&self, key: K, value: V) {
        let mut map = self.lock();
        if map.len() >= self.capacity && !map.contains_key(&key) {
            map.clear();
        }
        map.insert(key, value);
    }

    /// `key`'s value, or the one `make` makes when it has none, with `true`.
    pub(crate) fn get_or_insert<Q>(&self, key: &Q, make: impl FnOnce() -> (K, V)) -> (V, bool)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut map = self.lock();
        if let Some(value) = map.get(key) {
            return (value.clone(), false);
        }
        if map.len() >= self.capacity {
            map.clear();
        }
        let (key, value) = make();
        map.insert(key, value.clone());
        (value, true)
    }
}
