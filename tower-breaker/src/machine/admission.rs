//! Admitting a call or refusing it: the one-load closed path, the claim of
//! a half-open probe slot (the open → half-open transition is the first
//! claim), a throttle's and a slow start's draws, and the refusal's
//! release ramp.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{Breaker, Report};
use crate::error::CircuitOpen;
use crate::state::{CallKind, Mode, State};
use crate::sync::Ordering;
use crate::word::{Slots, Word};

/// How many times its remaining open time a refused call's release is put
/// off past the end of the period; see [`Breaker::rejection`].
const RELEASE_SPREAD: u32 = 4;

/// The share of an open period at its end whose refusals are told when to
/// come back; see [`Breaker::rejection`]. With [`RELEASE_SPREAD`] they come
/// back within the first four fifths of the period's length after it,
/// which the next period outlasts (a fixed one, or one jittered by up to
/// the default 20 %).
const RELEASE_WINDOW_DIVISOR: u64 = 5;

/// The share of calls a slow start admits at its beginning (Envoy's
/// `min_weight_percent` default).
const SLOW_START_FLOOR: f64 = 0.1;

/// What `poll_ready` should wait for in [pending mode](crate::Builder::pending_when_open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Readiness {
    Ready,
    Until(Instant),
    Change,
}

/// A call admitted by `Breaker::admit`: the epoch it was admitted in,
/// and whether it holds a probe slot. A `Permit` (`permit.rs`) keeps it
/// until the call's result is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Admission {
    pub(crate) epoch: u64,
    pub(crate) probe: bool,
}

impl Admission {
    #[inline]
    pub(crate) const fn new(epoch: u64, probe: bool) -> Self {
        Admission { epoch, probe }
    }
}

impl Breaker {
    /// The admission of a call that found `word` not plainly closed (the
    /// closed path is `Breaker::admit`'s one load).
    #[cold]
    pub(crate) fn admit_slow(&self, mut word: Word) -> Result<Admission, CircuitOpen> {
        if word.is_throttling() {
            return self.admit_throttled(word);
        }
        if word.is_slow_starting() {
            return self.admit_slow_start(word);
        }
        let now = Instant::now();
        loop {
            match word.state() {
                State::Closed | State::ForcedClosed => {
                    return Ok(Admission::new(word.epoch(), false))
                }
                State::ForcedOpen => return self.refuse_until(word, None, None),
                State::Open | State::HalfOpen => {
                    let opening = word.state() == State::Open;
                    let probes = u64::from(self.settings.probes);
                    if opening {
                        if let Some((remaining, retry_after)) = self.open_refusal(now) {
                            return self.refuse_until(word, Some(remaining), retry_after);
                        }
                    } else if word.claimed() >= probes {
                        if self.lapse_probes(word, now) {
                            word = self.load();
                            continue;
                        }
                        return self.refuse_until(word, None, None);
                    }
                    // Past the recovery timeout, this caller turns the breaker
                    // half-open and takes the first slot in one CAS.
                    let from = if opening {
                        word.next(State::HalfOpen)
                    } else {
                        word
                    };
                    let next = from.with_slots(Slots {
                        claimed: from.claimed() + 1,
                        ..from.slots()
                    });
                    if opening || next.claimed() == probes {
                        // The probes' deadline, written before the CAS (as
                        // `open_until` is) so no reader sees a half-open
                        // period, or every slot taken, without it: from the
                        // opening, and again from the last slot's claim
                        // (`probe_timeout` counts once every slot is taken;
                        // a probe given back and a quiet spell may have left
                        // the opening long past). Raised, never lowered: a
                        // caller that stalled before this write and lost its
                        // CAS cannot shorten a later period's deadline.
                        self.probes_due.fetch_max(
                            self.deadline_after(now, self.settings.probe_timeout),
                            Ordering::AcqRel,
                        );
                    }
                    match self.cas(word, next) {
                        Ok(()) => {
                            if opening {
                                self.changed(State::Open, State::HalfOpen, now, None, false);
                            }
                            let probe = next.claimed();
                            self.observer.report(self, Report::ProbeAdmitted { probe });
                            return Ok(Admission::new(next.epoch(), true));
                        }
                        Err(actual) => word = actual,
                    }
                }
            }
        }
    }

    /// A throttling breaker's admission: refused at random with the
    /// probability of [`Policy::AdaptiveThrottle`](crate::Policy::AdaptiveThrottle),
    /// counted as a request the backend did not accept.
    fn admit_throttled(&self, word: Word) -> Result<Admission, CircuitOpen> {
        let probability = self.throttle_probability();
        if probability > 0.0 && fastrand::f64() < probability {
            if self.settings.mode == Mode::Enforce {
                if let Some(window) = &self.window {
                    window.record(true, false, self.window_now(false));
                }
            }
            return self.refuse_until(word, None, None);
        }
        Ok(Admission::new(word.epoch(), false))
    }

    /// A breaker in its slow start admits a share of calls rising linearly
    /// from [`SLOW_START_FLOOR`] to all of them over the window; a call
    /// refused is told to come back at a random point of what is left of
    /// it. Past the window, the breaker is plainly closed again (same
    /// epoch: the counts go on).
    fn admit_slow_start(&self, word: Word) -> Result<Admission, CircuitOpen> {
        let window = self.settings.slow_start;
        let since_close = Duration::from_nanos(
            self.offset(Instant::now())
                .saturating_sub(self.period_start.load(Ordering::Acquire)),
        );
        let Some(left) = window
            .checked_sub(since_close)
            .filter(|left| !left.is_zero())
        else {
            // A racing caller may have done it already, or the breaker moved
            // on; either way this call is admitted as a closed one.
            let _ = self.cas(word, word.plainly_closed());
            return Ok(Admission::new(word.epoch(), false));
        };
        let share = (since_close.as_secs_f64() / window.as_secs_f64()).max(SLOW_START_FLOOR);
        if fastrand::f64() < share {
            return Ok(Admission::new(word.epoch(), false));
        }
        self.refuse_until(word, None, Some(left.mul_f64(fastrand::f64())))
    }

    /// The share of calls a throttling breaker refuses now:
    /// `max(0, (requests − k × accepts) / (requests + 1))` over its window,
    /// 0 for any other breaker.
    pub(crate) fn throttle_probability(&self) -> f64 {
        let (Some(k), Some(window)) = (self.throttle, &self.window) else {
            return 0.0;
        };
        let tally = window.tally(self.window_now(false));
        let requests = f64::from(tally.calls);
        let accepts = f64::from(tally.calls - tally.failures);
        ((requests - k * accepts) / (requests + 1.0)).max(0.0)
    }

    /// Refuses a call, telling the caller the `remaining` open time and to
    /// come back after `retry_after` (neither where no open period says:
    /// forced open, every probe slot taken, throttled).
    fn refuse_until(
        &self,
        word: Word,
        remaining: Option<Duration>,
        retry_after: Option<Duration>,
    ) -> Result<Admission, CircuitOpen> {
        if self.settings.mode == Mode::MetricsOnly {
            // Admitted, but as an ordinary call: it cannot decide a probe.
            let state = word.state();
            self.observer.report(self, Report::WouldReject { state });
            return Ok(Admission::new(word.epoch(), false));
        }
        Err(self.refusal(remaining, retry_after))
    }

    /// Counts and builds one refusal, placed on the release ramp that
    /// [`CircuitOpen::failure`] describes.
    pub(crate) fn rejection(&self) -> CircuitOpen {
        if self.load().state() == State::Open {
            if let Some((remaining, retry_after)) = self.open_refusal(Instant::now()) {
                return self.refusal(Some(remaining), retry_after);
            }
        }
        self.refusal(None, None)
    }

    /// While the open period runs at `now`: a refusal's remaining time and
    /// when it should come back ([`release_after`](Self::release_after)).
    fn open_refusal(&self, now: Instant) -> Option<(Duration, Option<Duration>)> {
        let until = self.open_until.load(Ordering::Acquire);
        let at = self.offset(now);
        (at < until).then(|| self.release_after(until, at))
    }

    /// The time left of the open period ending at `until` for a call
    /// refused at `at`, and when it should come back: see
    /// [`rejection`](Self::rejection). The period is the one `until` ends,
    /// read from the same load the caller compared, so a refusal that
    /// stalls across a reopening never mixes two periods (it then gets no
    /// hint: the newer period started after `until` was read).
    pub(super) fn release_after(&self, until: u64, at: u64) -> (Duration, Option<Duration>) {
        let remaining = until - at;
        let period = until.saturating_sub(self.period_start.load(Ordering::Acquire));
        let remaining_time = Duration::from_nanos(remaining);
        let retry_after = (remaining <= period / RELEASE_WINDOW_DIVISOR)
            .then(|| remaining_time.saturating_mul(RELEASE_SPREAD + 1));
        (remaining_time, retry_after)
    }

    /// Counts and builds one refusal that tells the caller to come back
    /// after `retry_after`.
    fn refusal(&self, remaining: Option<Duration>, retry_after: Option<Duration>) -> CircuitOpen {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        self.observer.report(self, Report::Rejected { remaining });
        self.call_event(CallKind::Rejected(remaining), None);
        CircuitOpen::new(Arc::clone(&self.key), remaining, retry_after)
    }

    /// Whether a call arriving now would be refused (enforce mode only):
    /// what [`readiness`](Self::readiness) waits out. Closed: one load.
    #[inline]
    pub(crate) fn refusing(&self) -> bool {
        !self.load().is_closed() && self.readiness() != Readiness::Ready
    }

    /// What a `poll_ready` in pending mode waits for (`Ready` outside
    /// enforce mode). Reclaims the slots of
    /// probes that are overdue, so a waiter woken by their deadline finds
    /// the breaker open again rather than spinning.
    pub(crate) fn readiness(&self) -> Readiness {
        if self.settings.mode != Mode::Enforce {
            return Readiness::Ready;
        }
        let now = Instant::now();
        loop {
            let word = self.load();
            return match word.state() {
                State::Closed | State::ForcedClosed => Readiness::Ready,
                State::Open => {
                    let until = self.open_until.load(Ordering::Acquire);
                    if self.offset(now) >= until {
                        Readiness::Ready
                    } else {
                        Readiness::Until(self.base + Duration::from_nanos(until))
                    }
                }
                State::HalfOpen if word.claimed() < u64::from(self.settings.probes) => {
                    Readiness::Ready
                }
                State::HalfOpen => {
                    if self.lapse_probes(word, now) {
                        continue;
                    }
                    let due = self.probes_due.load(Ordering::Acquire);
                    Readiness::Until(self.base + Duration::from_nanos(due))
                }
                State::ForcedOpen => Readiness::Change,
            };
        }
    }

    /// Reopens a half-open breaker whose probes have all been admitted and
    /// not all answered by their deadline: a probe hung with no timeout
    /// below it must not hold the slots for good. Their late results carry
    /// the old epoch and count for nothing. `true` when it reopened (or the
    /// word moved on meanwhile: look again).
    fn lapse_probes(&self, word: Word, now: Instant) -> bool {
        if self.offset(now) < self.probes_due.load(Ordering::Acquire) {
            return false;
        }
        if self.open(word, now) {
            self.observer.report(self, Report::ProbesLapsed);
        }
        true
    }

    pub(crate) fn change_notifier(&self) -> Option<&Arc<Notify>> {
        self.changed.as_ref()
    }
}
