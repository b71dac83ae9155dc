//! The metrics the guard emits, and their descriptions.

/// The label carrying the guard's
/// [name](crate::IdempotencyGuardLayer::name) on each of its metrics; its
/// events carry the name in a field of the same name.
pub(crate) const NAME_LABEL: &str = "idempotency";

/// Guarded calls by the guard's name and `outcome` (`claimed`, `replayed`,
/// `stored`, a refusal's code, …).
pub(crate) const TOTAL: &str = "tower_idempotency_total";

/// Completed records the memory store evicted to make room; no guard name,
/// as a store may be shared.
pub(crate) const EVICTED_TOTAL: &str = "tower_idempotency_evicted_total";

/// Describes this crate's metrics to the installed `metrics` recorder.
/// Building a layer calls it; call it after installing a recorder later.
pub fn describe_metrics() {
    metrics::describe_counter!(
        TOTAL,
        metrics::Unit::Count,
        "Requests the idempotency guard handled, by guard name and outcome (claimed, replayed, stored, \
         released, a reason a response was not kept, or a refusal's code)"
    );
    metrics::describe_counter!(
        EVICTED_TOTAL,
        metrics::Unit::Count,
        "Completed idempotency records the in-memory store evicted to stay within its bounds"
    );
}
