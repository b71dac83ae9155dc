//! [`BreakerRef`]: a counted reference to a breaker that, on the closed
//! path, leaves the count alone.
//!
//! # Why
//!
//! A call through a breaker needs a reference to it in its response future,
//! which outlives the service that made it (tower's futures are `'static`),
//! and callers that clone the service per request (axum, tonic) make one
//! more. Each `Arc` clone and each drop is an atomic read-modify-write of the
//! one shared count: four per call, together the largest cost of a call
//! through a closed breaker, and with several cores calling, that count's
//! cache line moves between them on every call. Borrowing instead would need
//! `unsafe`, which this crate forbids.
//!
//! So a reference dropped on a thread is not released but kept in that
//! thread's few spare slots, and the next reference to the same breaker made
//! on the thread takes it back. In a steady stream of calls every reference
//! is such a spare and no count moves; only the thread's own memory is
//! written.
//!
//! # Cost
//!
//! A thread keeps up to [`SPARES_PER_THREAD`] breakers alive after their
//! last service is dropped: a spare for another breaker pushes the oldest
//! out, and the thread's exit releases them all. Nothing of a breaker's
//! behaviour hangs on its release; it only frees its memory.

use std::cell::Cell;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use crate::state::Breaker;

/// References a thread keeps for reuse (one per breaker it calls through,
/// up to this many breakers, plus the in-flight calls' own).
pub(crate) const SPARES_PER_THREAD: usize = 4;

thread_local! {
    /// Most recently kept first.
    static SPARES: [Cell<Option<Arc<Breaker>>>; SPARES_PER_THREAD] =
        const { [const { Cell::new(None) }; SPARES_PER_THREAD] };
}

/// A reference to a breaker, reused through the thread's spares.
pub(crate) struct BreakerRef {
    /// `None` only while it is dropped.
    breaker: Option<Arc<Breaker>>,
}

impl BreakerRef {
    /// Wraps a reference already counted.
    pub(crate) fn new(breaker: Arc<Breaker>) -> Self {
        BreakerRef {
            breaker: Some(breaker),
        }
    }

    /// Another reference to `breaker`: a spare of this thread when it has
    /// one, a new count otherwise.
    #[inline]
    pub(crate) fn share(breaker: &Arc<Breaker>) -> Self {
        BreakerRef::new(take_spare(breaker).unwrap_or_else(|| Arc::clone(breaker)))
    }

    #[inline]
    pub(crate) fn arc(&self) -> &Arc<Breaker> {
        match &self.breaker {
            Some(breaker) => breaker,
            None => unreachable!("a BreakerRef is only empty while dropped"),
        }
    }
}

#[inline]
fn take_spare(breaker: &Arc<Breaker>) -> Option<Arc<Breaker>> {
    SPARES
        .try_with(|spares| {
            spares.iter().find_map(|spare| match spare.take() {
                Some(kept) if Arc::ptr_eq(&kept, breaker) => Some(kept),
                other => {
                    spare.set(other);
                    None
                }
            })
        })
        .ok()
        .flatten()
}

/// Keeps `breaker` first among the spares, moving the others down; returns
/// the one pushed out of the last slot, to be released by the caller once no
/// slot is being written (its release may drop a breaker, and with it
/// callbacks whose own drop could make or drop references again).
#[inline]
fn keep_spare(breaker: Arc<Breaker>) -> Option<Arc<Breaker>> {
    SPARES
        .try_with(|spares| {
            let mut carried = breaker;
            for spare in spares {
                match spare.replace(Some(carried)) {
                    None => return None,
                    Some(older) => carried = older,
                }
            }
            Some(carried)
        })
        // The thread is exiting and its spares are gone: the closure, and
        // the reference it holds, were dropped.
        .unwrap_or(None)
}

impl Deref for BreakerRef {
    type Target = Breaker;

    #[inline]
    fn deref(&self) -> &Breaker {
        self.arc()
    }
}

impl Clone for BreakerRef {
    #[inline]
    fn clone(&self) -> Self {
        BreakerRef::share(self.arc())
    }
}

impl Drop for BreakerRef {
    #[inline]
    fn drop(&mut self) {
        if let Some(breaker) = self.breaker.take() {
            drop(keep_spare(breaker));
        }
    }
}

impl fmt::Debug for BreakerRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

#[cfg(all(test, not(breaker_loom)))]
mod tests {
    use super::*;
    use crate::layer::CircuitBreakerLayer;
    use tower_classify::ErrorChainClassifier;

    fn breaker() -> Arc<Breaker> {
        Arc::clone(&CircuitBreakerLayer::new(ErrorChainClassifier::new()).breaker)
    }

    /// In a steady stream of clones and drops on one thread, the count
    /// stops moving: every clone is a spare the last drop kept.
    #[test]
    fn clones_reuse_the_references_drops_kept() {
        let breaker = breaker();
        let service = BreakerRef::new(Arc::clone(&breaker));
        let warm = (service.clone(), service.clone());
        drop(warm);
        let count = Arc::strong_count(&breaker);
        for _ in 0..100 {
            let request = service.clone();
            let permit = request.clone();
            assert_eq!(Arc::strong_count(&breaker), count, "both came from spares");
            drop(permit);
            drop(request);
        }
    }

    /// Spares are bounded: a thread holds at most `SPARES_PER_THREAD`
    /// references past their drop, and a spare of another breaker is never
    /// handed out.
    #[test]
    fn spares_are_bounded_and_per_breaker() {
        let breakers: Vec<_> = (0..SPARES_PER_THREAD + 2).map(|_| breaker()).collect();
        let before: Vec<_> = breakers.iter().map(Arc::strong_count).collect();
        for breaker in &breakers {
            drop(BreakerRef::share(breaker));
        }
        let kept = |i: usize| Arc::strong_count(&breakers[i]) - before[i];
        let total: usize = (0..breakers.len()).map(kept).sum();
        assert_eq!(total, SPARES_PER_THREAD);
        assert_eq!(kept(0), 0, "the oldest spares were pushed out");
        let newest = breakers.len() - 1;
        let other = BreakerRef::share(&breakers[newest - 1]);
        assert!(Arc::ptr_eq(other.arc(), &breakers[newest - 1]));
        assert_eq!(kept(newest), 1, "another breaker's spare was not taken");
    }
}
