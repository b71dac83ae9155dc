//! How many attempts a call made, reported by the layers that make them to
//! the layer above that records them, through an [`AttemptTally`] current on
//! the thread while the recorder calls ([`TallyScope::calling`]) or polls
//! ([`TallyScope::enter`]):
//!
//! - a layer that counts its own attempts (retry, hedge) asks
//!   [`claim_reports`] when called and, with the claim, calls
//!   [`report_attempts`] as attempts fail and follow;
//! - a layer that only sees attempts go by calls [`attempt_started`] and
//!   [`attempt_finished`] (under a hedge layer, for every hedge).
//!
//! Both count each attempt once: a report raises the tally to the
//! reporter's count. Nothing crosses a `Buffer` or a spawned task.
//!
//! ```
//! use tower_classify::attempts::{
//!     claim_reports, report_attempts, AttemptTally, TallyScope,
//! };
//!
//! // The recording layer, around its inner service's call:
//! let scope = TallyScope::calling(AttemptTally::default());
//! // A retry layer below, called now: it will report.
//! let reports = claim_reports();
//! assert!(reports);
//! // A hedge layer the retry layer calls: the retry layer reports.
//! assert!(!claim_reports());
//! let tally = scope.exit();
//!
//! // The recording layer, around a poll of the call's future:
//! let scope = TallyScope::enter(tally);
//! // The retry layer: its first attempt failed, the second is sent.
//! report_attempts(1, 1);
//! report_attempts(2, 1);
//! // A layer called only now, in a poll, does not report.
//! assert!(!claim_reports());
//! let tally = scope.exit();
//! assert_eq!((tally.started, tally.finished), (2, 1));
//!
//! // Outside a scope, a report goes nowhere.
//! report_attempts(5, 5);
//! ```

use std::cell::Cell;

/// The attempts of the call whose [`TallyScope`] is current, as the layers
/// below reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttemptTally {
    /// Attempts sent.
    pub started: u32,
    /// Attempts that ended (in a failure: the call went on, or ended).
    pub finished: u32,
}

/// The tally current on this thread, and whether the recording layer is
/// calling its inner service (rather than polling the call's future).
#[derive(Debug, Clone, Copy)]
struct Current {
    tally: AttemptTally,
    calling: bool,
}

thread_local! {
    /// The tally of the call being called or polled on this thread, if any.
    static CURRENT: Cell<Option<Current>> = const { Cell::new(None) };
}

/// A call's tally made current on this thread until [`exit`](Self::exit);
/// the thread's previous tally is restored when the scope ends, even by a
/// panic. (A guard, not a closure: the inner future moves through no frame.)
#[derive(Debug)]
#[must_use = "the tally is current until the scope is exited or dropped"]
pub struct TallyScope {
    outer: Option<Current>,
}

impl TallyScope {
    /// Makes `tally` current while the recording layer polls its call's
    /// future.
    #[inline]
    pub fn enter(tally: AttemptTally) -> Self {
        Self::with(tally, false)
    }

    /// Makes `tally` current while the recording layer calls its inner
    /// service: a layer called meanwhile is the recording layer's, until a
    /// reporting layer [claims](claim_reports) the call.
    #[inline]
    pub fn calling(tally: AttemptTally) -> Self {
        Self::with(tally, true)
    }

    #[inline]
    fn with(tally: AttemptTally, calling: bool) -> Self {
        TallyScope {
            outer: CURRENT.replace(Some(Current { tally, calling })),
        }
    }

    /// Ends the scope: the tally as the layers below left it.
    #[inline]
    pub fn exit(self) -> AttemptTally {
        CURRENT
            .get()
            .map(|current| current.tally)
            .unwrap_or_default()
    }
}

impl Drop for TallyScope {
    #[inline]
    fn drop(&mut self) {
        CURRENT.set(self.outer);
    }
}

/// Changes the current tally, if there is one.
#[inline]
fn update(change: impl FnOnce(&mut AttemptTally)) {
    if let Some(mut current) = CURRENT.get() {
        change(&mut current.tally);
        CURRENT.set(Some(current));
    }
}

/// Whether the layer asking reports its attempts, claiming the call: true
/// only inside [`TallyScope::calling`] and for the first layer to ask. Ask
/// when called, *before* calling the inner service, so the outermost
/// reporting layer has the call.
#[inline]
pub fn claim_reports() -> bool {
    match CURRENT.get() {
        Some(current) if current.calling => {
            CURRENT.set(Some(Current {
                calling: false,
                ..current
            }));
            true
        }
        _ => false,
    }
}

/// A layer that makes its own attempts says how many it has `started` and
/// how many have `finished` so far; the tally keeps the larger of each.
/// Only the layer that [claimed the call](claim_reports) reports.
#[inline]
pub fn report_attempts(started: u32, finished: u32) {
    update(|tally| {
        tally.started = tally.started.max(started);
        tally.finished = tally.finished.max(finished);
    });
}

/// One more attempt went by, seen by a layer that does not count them.
#[inline]
pub fn attempt_started() {
    update(|tally| tally.started += 1);
}

/// One attempt ended, seen by a layer that does not count them.
#[inline]
pub fn attempt_finished() {
    update(|tally| tally.finished += 1);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether a recording layer is calling the layers below it right now,
    /// and no reporting layer has claimed the call yet: what
    /// [`claim_reports`] answers, without claiming.
    fn called_by_recorder() -> bool {
        CURRENT.get().is_some_and(|current| current.calling)
    }

    #[test]
    fn a_counting_layer_and_a_reporting_one_count_each_attempt_once() {
        let scope = TallyScope::enter(AttemptTally::default());
        for attempt in 1..=3 {
            attempt_started(); // under the retry layer
            attempt_finished();
            report_attempts(attempt, attempt); // the retry layer, after it
        }
        assert_eq!(
            scope.exit(),
            AttemptTally {
                started: 3,
                finished: 3
            }
        );
    }

    #[test]
    fn only_a_scope_entered_for_the_call_says_so() {
        assert!(!called_by_recorder());
        let calling = TallyScope::calling(AttemptTally::default());
        assert!(called_by_recorder());
        {
            // A recording layer polling inside the call (nested).
            let polling = TallyScope::enter(AttemptTally::default());
            assert!(!called_by_recorder());
            drop(polling);
        }
        assert!(called_by_recorder());
        drop(calling);
        assert!(!called_by_recorder());
    }

    #[test]
    fn only_the_first_layer_to_claim_a_call_reports() {
        assert!(!claim_reports(), "no recorder");
        let calling = TallyScope::calling(AttemptTally::default());
        assert!(claim_reports(), "the outermost reporting layer");
        // The reporting layer below it, called by it.
        assert!(!claim_reports());
        assert!(!called_by_recorder());
        report_attempts(1, 0); // the claiming layer's report still counts
        assert_eq!(calling.exit().started, 1);

        let polling = TallyScope::enter(AttemptTally::default());
        assert!(!claim_reports(), "only polled");
        drop(polling);
    }

    #[test]
    fn scopes_nest_and_restore_the_outer_tally() {
        let outer = TallyScope::enter(AttemptTally::default());
        attempt_started();
        {
            let inner = TallyScope::enter(AttemptTally::default());
            report_attempts(4, 3);
            assert_eq!(inner.exit().started, 4);
        }
        assert_eq!(outer.exit().started, 1);
        // No scope: nothing to report into.
        report_attempts(9, 9);
        attempt_started();
        let scope = TallyScope::enter(AttemptTally::default());
        assert_eq!(scope.exit(), AttemptTally::default());
    }
}
