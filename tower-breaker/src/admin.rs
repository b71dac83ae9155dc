//! The admin handle: list, reset and force breakers from code.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::machine::Breaker;
use crate::registry::Registry;
use crate::state::State;
use crate::sync::Ordering;

/// An operator's handle on a layer's breakers: list them, reset one or all,
/// force one open or closed.
///
/// Get it from any layer's `handle()`
/// ([`CircuitBreakerLayer::handle`](crate::CircuitBreakerLayer::handle)). It
/// is cheap to clone and shares the breakers' live state.
///
/// ```
/// use tower_breaker::{CircuitBreakerLayer, State};
/// use tower_classify::ErrorChainClassifier;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let layer = CircuitBreakerLayer::new(ErrorChainClassifier::new());
/// let handle = layer.handle();
/// assert!(handle.force_open("default"));
/// assert_eq!(handle.get("default").unwrap().state, State::ForcedOpen);
/// assert_eq!(handle.reset_all(), 1);
/// assert_eq!(handle.list()[0].state, State::Closed);
/// # drop(layer);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct BreakerHandle {
    registry: Arc<Registry>,
}

/// One breaker as the admin handle reports it. With the `admin` feature it
/// serializes as the admin JSON (`remaining_open_ms`, `forced`, …).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BreakerSnapshot {
    /// The key (the layer's name for an unkeyed breaker).
    pub key: String,
    /// The current state.
    pub state: State,
    /// How long it has been in that state.
    pub time_in_state: Duration,
    /// For [`State::Open`]: how long until a probe is admitted.
    pub remaining_open: Option<Duration>,
    /// Counted failures in a row (consecutive-failures policy).
    pub consecutive_failures: u32,
    /// Calls in the sliding window (failure-rate policy).
    pub window_calls: u32,
    /// Counted failures in the sliding window (failure-rate policy).
    pub window_failures: u32,
    /// Counted failures recorded since the breaker was created.
    pub failures: u64,
    /// Calls refused since the breaker was created.
    pub rejected: u64,
    /// Times it opened since the breaker was created.
    pub opened: u64,
    /// Probes admitted and not yet finished (half-open only).
    pub probes_in_flight: u32,
}

// Lifetime totals (`failures`, `rejected`, `opened`) are not cleared by a
// reset: like metrics counters, they only grow, so rates stay meaningful.
// Successes are not counted at all: a shared counter written on every call
// would cost the closed path a contended atomic write.

impl BreakerSnapshot {
    /// `breaker` as it is now.
    fn of(breaker: &Breaker) -> Self {
        let now = Instant::now();
        let word = breaker.load();
        let state = word.state();
        let tally = breaker.tally(now);
        BreakerSnapshot {
            key: breaker.key.to_string(),
            state,
            time_in_state: breaker.time_in_state(now),
            remaining_open: (state == State::Open).then(|| breaker.remaining_open(now)),
            consecutive_failures: breaker.consecutive.load(Ordering::Acquire),
            window_calls: tally.calls,
            window_failures: tally.failures,
            failures: breaker.failures.load(Ordering::Relaxed),
            rejected: breaker.rejected.load(Ordering::Relaxed),
            opened: breaker.opened.load(Ordering::Relaxed),
            probes_in_flight: if state == State::HalfOpen {
                let slots = word.slots();
                slots.claimed.saturating_sub(slots.succeeded + slots.failed) as u32
            } else {
                0
            },
        }
    }
}

impl BreakerHandle {
    pub(crate) fn new(registry: Arc<Registry>) -> Self {
        BreakerHandle { registry }
    }

    /// Every breaker, sorted by key.
    pub fn list(&self) -> Vec<BreakerSnapshot> {
        let mut list: Vec<_> = self
            .registry
            .all()
            .iter()
            .map(|b| BreakerSnapshot::of(b))
            .collect();
        list.sort_by(|a, b| a.key.cmp(&b.key));
        list
    }

    /// The breaker for `key`, if there is one.
    pub fn get(&self, key: &str) -> Option<BreakerSnapshot> {
        self.registry.get(key).map(|b| BreakerSnapshot::of(&b))
    }

    /// Closes the breaker for `key` and clears its failure counts (also
    /// ending a forced state). `false` if there is no such breaker.
    pub fn reset(&self, key: &str) -> bool {
        self.registry.force(key, State::Closed)
    }

    /// Resets every breaker; returns how many.
    pub fn reset_all(&self) -> usize {
        self.registry.reset_all()
    }

    /// Opens the breaker for `key` until a [`reset`](Self::reset): every call
    /// fails fast. `false` if there is no such breaker.
    pub fn force_open(&self, key: &str) -> bool {
        self.registry.force(key, State::ForcedOpen)
    }

    /// Closes the breaker for `key` until a [`reset`](Self::reset): every call
    /// passes and nothing trips it. `false` if there is no such breaker.
    pub fn force_closed(&self, key: &str) -> bool {
        self.registry.force(key, State::ForcedClosed)
    }
}
