//! What a stack's retry layer did, counted from its events.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use tower_retry_budget::{RetryBuilder, StopReason};

/// Totals since the stack was built. The retry layer keeps no counts of its
/// own (its metrics go to the recorder), so the page counts its events: one
/// atomic add per retry or give-up, nothing on a call that needed neither.
#[derive(Debug, Default)]
pub(crate) struct RetryCounts {
    retries: AtomicU64,
    gave_up: AtomicU64,
    budget_exhausted: AtomicU64,
    recovered: AtomicU64,
}

impl RetryCounts {
    /// `builder` with callbacks counting into a new set of totals.
    pub(crate) fn attach<C, R>(builder: RetryBuilder<C, R>) -> (RetryBuilder<C, R>, Arc<Self>) {
        let counts = Arc::new(RetryCounts::default());
        let (retry, give_up, recovered) = (counts.clone(), counts.clone(), counts.clone());
        let builder = builder
            .on_retry(move |_| {
                retry.retries.fetch_add(1, Ordering::Relaxed);
            })
            .on_give_up(move |event| {
                give_up.gave_up.fetch_add(1, Ordering::Relaxed);
                if event.reason == StopReason::Budget {
                    give_up.budget_exhausted.fetch_add(1, Ordering::Relaxed);
                }
            })
            .on_success_after_retries(move |_| {
                recovered.recovered.fetch_add(1, Ordering::Relaxed);
            });
        (builder, counts)
    }

    pub(crate) fn to_json(&self, name: &str) -> Value {
        json!({
            "name": name,
            "retries": self.retries.load(Ordering::Relaxed),
            "gave_up": self.gave_up.load(Ordering::Relaxed),
            "budget_exhausted": self.budget_exhausted.load(Ordering::Relaxed),
            "recovered": self.recovered.load(Ordering::Relaxed),
        })
    }
}
