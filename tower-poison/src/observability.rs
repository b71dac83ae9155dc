//! The metrics the layer emits, and their descriptions.

use std::sync::Once;

/// Failed calls the action disposed of, by `action` and `label`.
pub(crate) const DEAD_LETTERED_TOTAL: &str = "tower_poison_dead_lettered_total";

/// How many entries a label has in the store, by `label`.
pub(crate) const DLQ_DEPTH: &str = "tower_poison_dlq_depth";

/// Calls a full store refused, by `label`.
pub(crate) const STORE_FULL_TOTAL: &str = "tower_poison_dlq_store_full_total";

/// Describes every metric of this crate to the recorder, once per process:
/// called when a layer is built, so install the recorder before building
/// layers (as exporters expect anyway).
pub(crate) fn describe_metrics() {
    static DESCRIBED: Once = Once::new();
    DESCRIBED.call_once(|| {
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
    });
}
