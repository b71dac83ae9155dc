//! Recording a call's result: the closed period's counts (consecutive
//! failures, or the window) and the half-open period's probe answers, and
//! the opening or closing they decide.

use std::time::Duration;

use tokio::time::Instant;

use super::Breaker;
use crate::policy::Policy;
use crate::state::{CallKind, State};
use crate::sync::Ordering;
use crate::window::Tally;
use tower_classify::{FailureKind, Outcome};

/// What one result means to the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Success,
    Failure,
    /// Says nothing about the dependency: not counted, and a probe slot it
    /// held is given back.
    Neutral,
}

impl Verdict {
    /// The verdict on a call. Without a slow-call rate (`slow_apart` false)
    /// a slow success is a failure; with one it stays a success and counts
    /// towards the slow-call rate instead.
    #[inline]
    pub(crate) fn of(outcome: Outcome, slow: bool, slow_apart: bool) -> Self {
        match outcome {
            Outcome::Success if slow && !slow_apart => Verdict::Failure,
            Outcome::Success => Verdict::Success,
            Outcome::Failure(failure) if failure.kind.is_transient() => Verdict::Failure,
            _ => Verdict::Neutral,
        }
    }

    /// The verdict of [adaptive throttling](Policy::AdaptiveThrottle): a
    /// success is an accept, and so is any answer of the backend's, even
    /// one refusing the request itself (rejected, poison); transient and
    /// shed failures are not.
    #[inline]
    fn of_throttled(outcome: Outcome) -> Self {
        match outcome {
            Outcome::Success => Verdict::Success,
            Outcome::Failure(failure)
                if failure.kind.is_transient() || failure.kind == FailureKind::Shed =>
            {
                Verdict::Failure
            }
            Outcome::Failure(_) => Verdict::Success,
            _ => Verdict::Neutral,
        }
    }
}

impl Breaker {
    /// Records the result of a call admitted in `epoch` (holding a probe
    /// slot if `probe`) and tells the per-call callbacks.
    #[inline]
    pub(crate) fn complete(
        &self,
        epoch: u64,
        probe: bool,
        outcome: Outcome,
        elapsed: Option<Duration>,
    ) {
        let slow = matches!(
            (elapsed, self.slow_call_threshold),
            (Some(elapsed), Some(threshold)) if elapsed >= threshold
        );
        let verdict = match self.throttle {
            None => Verdict::of(outcome, slow, self.slow_apart),
            Some(_) => Verdict::of_throttled(outcome),
        };
        self.record(epoch, probe, verdict, slow && self.slow_apart);
        if self.call_listeners {
            let kind = match (verdict, outcome) {
                (Verdict::Neutral, _) => CallKind::Ignored,
                (_, Outcome::Failure(failure)) => CallKind::Failure(failure.kind),
                _ if slow => CallKind::SlowCall,
                _ => CallKind::Success,
            };
            self.call_event(kind, elapsed);
        }
    }

    /// A probe admitted in `epoch` was dropped unanswered: its slot goes
    /// back, so a cancelled probe cannot wedge the breaker half-open.
    pub(crate) fn give_back_probe(&self, epoch: u64) {
        self.record_probe(epoch, Verdict::Neutral);
    }

    #[inline]
    fn record(&self, epoch: u64, probe: bool, verdict: Verdict, slow: bool) {
        if probe {
            // A probe that answered, but slowly, has not shown the
            // dependency healthy.
            let verdict = match verdict {
                Verdict::Success if slow => Verdict::Failure,
                verdict => verdict,
            };
            self.record_probe(epoch, verdict);
        } else {
            self.record_closed(epoch, verdict, slow);
        }
    }

    #[inline]
    fn record_closed(&self, epoch: u64, verdict: Verdict, slow: bool) {
        let failed = match verdict {
            Verdict::Neutral => return,
            Verdict::Success => false,
            Verdict::Failure => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                true
            }
        };
        let trip = match &self.window {
            None if !failed => {
                // Load first: a store on every success would bounce the
                // cache line between cores even when the count is already
                // zero. A success of a past period must not clear the
                // count of this one (checked only when there is a count to
                // clear, so the healthy path reads one word).
                if self.consecutive.load(Ordering::Relaxed) != 0 && self.counts(epoch) {
                    self.consecutive.store(0, Ordering::Relaxed);
                }
                return;
            }
            None => {
                if !self.counts(epoch) {
                    return;
                }
                let threshold = match self.settings.policy {
                    Policy::ConsecutiveFailures { threshold } => threshold,
                    // `Breaker::new` gives the other policies a window.
                    Policy::FailureRate { .. } | Policy::AdaptiveThrottle { .. } => return,
                };
                self.consecutive.fetch_add(1, Ordering::AcqRel) + 1 >= threshold
            }
            // A success can tip the rate too: the call that reaches the
            // minimum may be one.
            Some(window) => {
                if self.throttle.is_some() {
                    // A throttle never opens: it only keeps its counts (none
                    // while an operator forces it closed).
                    let word = self.load();
                    if word.epoch() == epoch && (word.counts_calls() || word.is_throttling()) {
                        window.record(failed, false, self.window_now(false));
                    }
                    return;
                }
                if !self.counts(epoch) {
                    return;
                }
                // A failure may open the breaker: filed at the exact time. A
                // success by the coarse clock, and judged again at the exact
                // time when the coarse tally would open, so an expired
                // failure never does.
                let tally = window.record(failed, slow, self.window_now(failed));
                self.rate_reached(tally)
                    && (failed
                        || self.coarse_clock.is_none()
                        || self.rate_reached(window.tally(self.window_now(true))))
            }
        };
        if trip {
            let word = self.load();
            if word.epoch() == epoch && word.counts_calls() {
                self.open(word, Instant::now());
            }
        }
    }

    /// Whether a result admitted in `epoch` counts towards opening: not when
    /// it was admitted in an earlier period (the counts were reset when the
    /// breaker opened), nor while the breaker is forced closed.
    #[inline]
    fn counts(&self, epoch: u64) -> bool {
        let word = self.load();
        word.epoch() == epoch && word.counts_calls()
    }

    /// The rate policy's test: enough calls, and a failure share (or, when
    /// configured, a slow-call share) at or above its rate. Dividing (rather
    /// than multiplying the rate) keeps a share exactly at the rate exact: 3
    /// of 10 is 0.3.
    #[inline]
    fn rate_reached(&self, tally: Tally) -> bool {
        // A rate is above zero (`Policy::validate`), so a tally of neither
        // failures nor slow calls never reaches it: the healthy case reads
        // nothing else, and skips the division.
        if tally.failures == 0 && tally.slow == 0 {
            return false;
        }
        let Policy::FailureRate {
            rate,
            minimum_calls,
            ..
        } = self.settings.policy
        else {
            return false;
        };
        let share = |count: u32| f64::from(count) / f64::from(tally.calls);
        tally.calls >= minimum_calls
            && ((tally.failures > 0 && share(tally.failures) >= rate)
                || (tally.slow > 0
                    && self
                        .settings
                        .slow_call_rate
                        .is_some_and(|slow_rate| share(tally.slow) >= slow_rate)))
    }

    /// Records a probe's result. The probes of one half-open period are
    /// judged together: under the consecutive-failures policy one failure
    /// reopens; under the rate policy the probes' own failure share is held
    /// against the rate, and the breaker reopens as soon as it is reached
    /// (more answers cannot lower it) and closes when every probe answered
    /// below it.
    fn record_probe(&self, epoch: u64, verdict: Verdict) {
        if verdict == Verdict::Failure {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        let probes = u64::from(self.settings.probes);
        let mut word = self.load();
        loop {
            if word.epoch() != epoch || word.state() != State::HalfOpen {
                return;
            }
            let mut slots = word.slots();
            match verdict {
                Verdict::Success => slots.succeeded += 1,
                Verdict::Failure => slots.failed += 1,
                // Says nothing: the slot goes back for another caller.
                Verdict::Neutral => slots.claimed = slots.claimed.saturating_sub(1),
            }
            let reopen = verdict == Verdict::Failure
                && match self.settings.policy {
                    // A throttle has no probes of its own: only an operator
                    // opens it.
                    Policy::ConsecutiveFailures { .. } | Policy::AdaptiveThrottle { .. } => true,
                    Policy::FailureRate { rate, .. } => slots.failed as f64 / probes as f64 >= rate,
                };
            if reopen {
                if self.open(word, Instant::now()) {
                    return;
                }
                word = self.load();
                continue;
            }
            let next = if slots.succeeded + slots.failed >= probes {
                self.clear_counts();
                let closed = self.closed_word(word.next(State::Closed));
                if self.settings.slow_start.is_zero() || closed.is_throttling() {
                    closed
                } else {
                    self.period_start
                        .store(self.offset(Instant::now()), Ordering::Release);
                    closed.slow_starting()
                }
            } else {
                word.with_slots(slots)
            };
            match self.cas(word, next) {
                Ok(()) => {
                    if next.state() == State::Closed {
                        self.changed(State::HalfOpen, State::Closed, Instant::now(), None, false);
                    } else if verdict == Verdict::Neutral {
                        // A slot is free again: callers parked in a pending
                        // `poll_ready` may take it.
                        self.wake_waiters();
                    }
                    return;
                }
                Err(actual) => word = actual,
            }
        }
    }
}
