//! The demo's resilient stacks, built from the family:
//!
//! ```text
//! full family:    DeadLetter → Retry (+ budget) → CircuitBreaker → HTTP client
//! budget only:                      ReplayBody → Retry (+ budget) → HTTP client
//! ```
//!
//! The dead-letter layer hands the layers below it a `ReplayBody`, which the
//! retry layer replays; the budget-only stack wraps the body itself.
//!
//! The family puts the retry layer *outside* the breaker (Polly's and
//! Resilience4j's order), as the root README's layer-order rule says for an
//! upstream that throttles with `Retry-After`, as this one does for a whole
//! phase (the facade's default puts it inside): the breaker judges single attempts, so its
//! half-open probe is one attempt and it sees the upstream recover as soon
//! as the open period ends. A request refused in the last fifth of an open
//! period is told to come back after five times the period's remaining time
//! (the breaker's release ramp); the retry layer waits that out once,
//! jittered, spending no budget, when it fits the retry deadline and the 2 s
//! maximum backoff delay. A refusal without that hint goes back at once. With the breaker outside,
//! the probe is a whole retry loop that sleeps out the upstream's
//! `Retry-After`, and the circuit stays open up to that long after the
//! upstream is back.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body_util::Full;
use tokio::time::Instant;
use tower::retry::budget::Budget;
use tower::{BoxError, ServiceBuilder};
use tower_breaker::Policy;
use tower_breaker::{BreakerHandle, CircuitBreakerLayer, State, StateChange};
use tower_classify::HttpClassifier;
use tower_poison::store::{DeadLetterStore, RedbStore};
use tower_poison::{DeadLetterLayer, OpenCall, SettleBody};
use tower_retry_budget::body::{ReplayBody, ReplayBodyLayer};
use tower_retry_budget::budget::TpsBudget;
use tower_retry_budget::{Backoff, Jitter, RetryLayer};

use crate::client::{http_client_for, HttpService};

/// What the demo reads back from the family's layers after the run.
#[derive(Debug, Clone)]
pub struct FamilyHandles {
    breaker: BreakerHandle,
    breaker_closes: BreakerCloses,
    budget: Arc<CountingBudget>,
    store: RedbStore,
}

/// The family's own figures for the comparison table.
#[derive(Debug, Clone, Copy)]
pub struct FamilySummary {
    /// Times the breaker opened.
    pub breaker_opens: u64,
    /// Calls the open breaker refused without touching the upstream.
    pub breaker_rejections: u64,
    /// Retries the budget refused.
    pub budget_refusals: u64,
    /// Entries in the dead-letter store.
    pub dead_letters: u64,
}

impl FamilyHandles {
    /// Reads the figures.
    pub async fn summary(&self) -> Result<FamilySummary, BoxError> {
        let breakers = self.breaker.list();
        Ok(FamilySummary {
            breaker_opens: breakers.iter().map(|b| b.opened).sum(),
            breaker_rejections: breakers.iter().map(|b| b.rejected).sum(),
            budget_refusals: self.budget.refused(),
            dead_letters: self.store.depth().await?,
        })
    }

    /// The dead-letter store.
    pub fn store(&self) -> &RedbStore {
        &self.store
    }

    /// The breaker's admin handle.
    pub fn breaker(&self) -> &BreakerHandle {
        &self.breaker
    }

    /// The first time the breaker closed at or after `since`, if it did.
    pub fn first_close_since(&self, since: Instant) -> Option<Instant> {
        self.breaker_closes.first_since(since)
    }
}

/// When the breaker closed, in order: the admin handle shows the state now,
/// the demo needs to know when the traffic it held back was let go.
#[derive(Debug, Clone, Default)]
struct BreakerCloses(Arc<Mutex<Vec<Instant>>>);

impl BreakerCloses {
    fn record(&self, change: &StateChange<'_>) {
        if change.to == State::Closed {
            self.0
                .lock()
                .expect("no panics while locked")
                .push(Instant::now());
        }
    }

    fn first_since(&self, since: Instant) -> Option<Instant> {
        let closes = self.0.lock().expect("no panics while locked");
        closes.iter().copied().find(|closed| *closed >= since)
    }
}

/// A retry budget that counts the retries it refuses, for the report.
#[derive(Debug)]
pub struct CountingBudget {
    inner: TpsBudget,
    refused: AtomicU64,
}

impl CountingBudget {
    /// Retries refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

impl Budget for CountingBudget {
    fn deposit(&self) {
        self.inner.deposit();
    }

    fn withdraw(&self) -> bool {
        let granted = self.inner.withdraw();
        if !granted {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        granted
    }
}

/// The body the HTTP client sees under the dead-letter layer.
type StackBody = ReplayBody<Full<Bytes>>;

/// The retry layer both stacks use, with a 20 % budget that counts refusals.
fn budgeted_retry(
    classifier: HttpClassifier,
) -> Result<
    (
        RetryLayer<HttpClassifier, tower_retry_budget::replay::HttpReplay>,
        Arc<CountingBudget>,
    ),
    BoxError,
> {
    // Finagle's defaults: retries may add 20 % to recent traffic, plus 10/s.
    let budget = Arc::new(CountingBudget {
        inner: TpsBudget::new(Duration::from_secs(10), 10, 0.2)?,
        refused: AtomicU64::new(0),
    });
    let retry = RetryLayer::http_builder()
        .classifier(classifier)
        .max_retries(3)
        .backoff(
            Backoff::exponential(Duration::from_millis(50))
                .with_max_delay(Duration::from_secs(2))
                .with_jitter(Jitter::Full),
        )
        .deadline(Duration::from_secs(5))
        .budget(budget.clone())
        .build()?;
    Ok((retry, budget))
}

/// Retry with a budget and nothing else: what the budget alone does to an
/// outage. Returns the stack and the number of retries the budget refused.
pub fn budget_only_stack() -> Result<(HttpService, Arc<CountingBudget>), BoxError> {
    let (retry, budget) = budgeted_retry(HttpClassifier::new())?;
    let stack = ServiceBuilder::new()
        .layer(ReplayBodyLayer::new(64 * 1024))
        .layer(retry)
        .service(http_client_for::<ReplayBody<Full<Bytes>>>());
    Ok((HttpService::new(stack), budget))
}

/// Builds the family's stack over a fresh HTTP client, dead-lettering into a
/// redb file at `dead_letters`.
pub fn family_stack(dead_letters: &Path) -> Result<(HttpService, FamilyHandles), BoxError> {
    let classifier = HttpClassifier::new();
    let store = RedbStore::builder().open(dead_letters)?;

    let (retry, budget) = budgeted_retry(classifier.clone())?;
    let breaker_closes = BreakerCloses::default();

    // The breaker's defaults, the threshold spelled out: it counts attempts
    // (the retry layer is outside), so five failed attempts in a row open
    // it. Its open periods back off (250 ms, doubling with jitter, up to 500 ms),
    // and each refusal in a period's last fifth says when to come back, on
    // a ramp past the period's end rather than all at its end.
    let breaker = CircuitBreakerLayer::builder()
        .name("upstream")
        .policy(Policy::consecutive_failures(5))
        .on_state_change({
            let closes = breaker_closes.clone();
            move |change| closes.record(change)
        })
        .build(classifier.clone())?;
    let breaker_handle = breaker.handle();

    let stack = ServiceBuilder::new()
        // The body comes back in a `SettleBody`; an HTTP call is settled by
        // its head, so the buffered body is taken out as it was.
        .map_response(|response: Response<SettleBody<Bytes, OpenCall>>| {
            response.map(SettleBody::into_inner)
        })
        .layer(DeadLetterLayer::new(store.clone()).label("demo-upstream"))
        .layer(retry)
        .layer(breaker)
        .service(http_client_for::<StackBody>());
    Ok((
        HttpService::new(stack),
        FamilyHandles {
            breaker: breaker_handle,
            breaker_closes,
            budget,
            store,
        },
    ))
}
