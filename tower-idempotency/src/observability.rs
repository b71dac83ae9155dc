//! The metrics the guard emits, and their descriptions.

use std::sync::Once;

/// Guarded calls by `outcome` (`claimed`, `replayed`, `stored`, a refusal's
/// code, …).
pub(crate) const TOTAL: &str = "tower_idempotency_total";

/// Completed records the memory store evicted to make room.
pub(crate) const EVICTED_TOTAL: &str = "tower_idempotency_evicted_total";

/// Describes every metric of this crate to the recorder, once per process:
/// called when a guard layer or a memory store is built, so install the
/// recorder before building them.
pub(crate) fn describe_metrics() {
    static DESCRIBED: Once = Once::new();
    DESCRIBED.call_once(|| {
        metrics::describe_counter!(
            TOTAL,
            metrics::Unit::Count,
            "Requests the idempotency guard handled, by outcome (claimed, replayed, stored, \
             released, a reason a response was not kept, or a refusal's code)"
        );
        metrics::describe_counter!(
            EVICTED_TOTAL,
            metrics::Unit::Count,
            "Completed idempotency records the in-memory store evicted to stay within its bounds"
        );
    });
}
