//! The metrics the layer emits, and their descriptions.

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
/// each report their own. Every store here keeps a count per label, updated
/// with the entries themselves (the memory store under its lock, redb in the
/// write transaction, Redis in the put and remove scripts, in a
/// `tower-poison:{NAME}:label-depths` hash), so `remove` and `purge` count
/// too, and a label leaves the count with its last entry, so the counts never
/// hold more labels than the store holds entries. A redb file from before
/// label counts is counted when it is opened; a Redis queue from before them
/// counts only the entries written since (the gauge never goes below zero;
/// the CLI's `stats`, which scans, reports exact `by_label` counts). A store
/// of your own reports a label's depth by implementing
/// [`put_with_depth`](crate::store::DeadLetterStore::put_with_depth); the
/// provided one reports none, and the layer then sets no gauge.
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
