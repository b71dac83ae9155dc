//! The metrics the guard emits, and their descriptions.

/// The label carrying the guard's
/// [name](crate::IdempotencyGuardLayer::name) on each of its metrics; its
/// events carry the name in a field of the same name.
pub(crate) const NAME_LABEL: &str = "idempotency";

/// Guarded calls by the guard's name and `outcome` (`claimed`, `replayed`,
/// `stored`, a refusal's code, …).
pub(crate) const TOTAL: &str = "tower_idempotency_total";

/// Completed records the memory store evicted to make room. Not labelled
/// with a guard's name: a store may be shared by several guards, and the
/// record it evicts may be another guard's than the one whose claim needed
/// the room.
pub(crate) const EVICTED_TOTAL: &str = "tower_idempotency_evicted_total";

/// Registers the descriptions (kind, unit, meaning) of this crate's
/// metrics with the installed `metrics` recorder.
///
/// Building a layer calls it, so an exporter installed before the layers
/// are built describes every series; call it yourself after installing a
/// recorder later. Repeating it is harmless.
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
