//! The metrics the layer emits, and their descriptions.

/// Failed calls the action disposed of, by `action` and `label`.
pub(crate) const DEAD_LETTERED_TOTAL: &str = "tower_poison_dead_lettered_total";

/// How many entries a label has in the store, by `label`.
pub(crate) const DLQ_DEPTH: &str = "tower_poison_dlq_depth";

/// Calls a full store refused, by `label`.
pub(crate) const STORE_FULL_TOTAL: &str = "tower_poison_dlq_store_full_total";

/// Registers the descriptions (kind, unit, meaning) of this crate's
/// metrics with the installed `metrics` recorder.
///
/// Building a layer calls it, so an exporter installed before the layers
/// are built describes every series; call it yourself after installing a
/// recorder later. Repeating it is harmless.
pub fn describe_metrics() {
    metrics::describe_counter!(
        DEAD_LETTERED_TOTAL,
        metrics::Unit::Count,
        "Calls that finally failed and were disposed of by the dead-letter action \
         (dlq: stored, drop: counted and logged, fail: propagated)"
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
}
