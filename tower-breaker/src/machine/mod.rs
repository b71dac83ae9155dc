//! The state machine: closed → open → half-open → closed or open again.
//!
//! A [`Breaker`] keeps its state in one word (`word.rs`, where "Why one
//! word" explains the encoding) and moves it by compare-and-swap. This file
//! holds the breaker and its transitions (opening, closing, an operator's
//! forcing); `admission.rs` admits or refuses a call, claiming half-open
//! probe slots; `record.rs` counts a call's result and decides whether it
//! opens or closes the breaker. It reports to one [`Observer`].

mod admission;
mod record;

use std::fmt;
use std::sync::atomic::AtomicUsize as StdAtomicUsize;
use std::sync::atomic::{AtomicBool as StdAtomicBool, AtomicU64 as StdAtomicU64};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::policy::Policy;
use crate::settings::Settings;
use crate::state::{CallEvent, CallKind, Mode, State, StateChange};
use crate::sync::{AtomicU32, AtomicU64, Ordering};
use crate::window::{Tally, WindowState};
use crate::word::{Slots, Word};
use tower_classify::CoarseClock;

pub(crate) use self::admission::{Admission, Readiness};

/// What a breaker's machine reports, to the one [`Observer`] it owns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Report<'a> {
    /// A transition, by the machine or (`by_operator`) an operator's reset
    /// or force.
    Changed {
        change: StateChange<'a>,
        by_operator: bool,
    },
    /// A half-open probe slot was claimed: the `probe`-th of the period.
    ProbeAdmitted { probe: u64 },
    /// The half-open probes did not all answer by their deadline: the
    /// breaker reopened (reported after its `Changed`).
    ProbesLapsed,
    /// A call was refused; the remaining open time when it is known.
    Rejected { remaining: Option<Duration> },
    /// A metrics-only breaker let through a call it would have refused in `state`.
    WouldReject { state: State },
    /// The registry keeps this new breaker, in this state.
    Kept(State),
    /// The registry let go of this breaker (evicted, or never kept).
    LetGo,
}

/// Whoever listens to a breaker (`listeners.rs`). The machine decides and
/// reports; it names none of its listeners, and they read it, never the
/// other way round. Never told of an admitted closed call.
pub(crate) trait Observer: Send + Sync {
    fn report(&self, breaker: &Breaker, report: Report<'_>);
}

/// One breaker's live state. Every clone of a service (and, for a plain
/// breaker, the layer it came from) reaches the same `Arc<Breaker>`, through
/// a share of it (see `share.rs`).
///
/// Aligned to 128 bytes so that it starts two cache lines after the `Arc`'s
/// reference counts: a reference made or dropped on it (a thread's share, a
/// keyed call's) writes the count, and without the gap that write would
/// evict the state word every other core reads.
#[repr(align(128))]
pub(crate) struct Breaker {
    pub(crate) key: Arc<str>,
    /// One of a keyed layer's breakers: its events carry the key as well
    /// as the layer's name.
    pub(crate) keyed: bool,
    pub(crate) settings: Arc<Settings>,
    pub(crate) disabled: bool,
    /// Copied out of `settings` so the hot path reads one allocation.
    pub(crate) slow_call_threshold: Option<Duration>,
    slow_apart: bool,
    /// Per-call callbacks are registered: the call's duration is measured.
    pub(crate) call_listeners: bool,
    pub(crate) pending_when_open: bool,
    /// `k` of [`Policy::AdaptiveThrottle`], for a throttling breaker.
    throttle: Option<f64>,
    base: Instant,
    word: AtomicU64,
    /// Nanoseconds after `base` when the open period ends.
    open_until: AtomicU64,
    /// Nanoseconds after `base` when the probes of the half-open period
    /// must have answered; past it, their slots are reclaimed.
    probes_due: AtomicU64,
    /// Nanoseconds after `base` of the last state change.
    since: AtomicU64,
    /// Nanoseconds after `base` when the current open period, or slow
    /// start, began. Written before the CAS that starts it, as `open_until`
    /// is, so that a caller that sees the new word reads this one too
    /// (`since` is written only after the change).
    period_start: AtomicU64,
    /// Counted failures in a row (consecutive-failures policy).
    pub(crate) consecutive: AtomicU32,
    /// How many times in a row the breaker reopened from half-open (low 32
    /// bits), and the epoch of the half-open period the last reopening left
    /// (high bits), so that every caller racing to reopen one period
    /// computes the same streak (see [`open`](Self::open)).
    open_streak: AtomicU64,
    window: Option<WindowState>,
    /// For a time window: the clock a success is filed by.
    coarse_clock: Option<CoarseClock>,
    /// Lifetime totals: counted failures, refusals, openings.
    pub(crate) failures: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) opened: AtomicU64,
    changed: Option<Arc<Notify>>,
    /// Told of every transition and refusal (see [`Observer`]).
    observer: Box<dyn Observer>,
    /// The registry's bookkeeping from here on, not part of the state
    /// machine: `std`'s atomics even under loom.
    ///
    /// The registry's coarse clock when this breaker was last looked up;
    /// see `Registry::breaker`.
    pub(crate) last_used: StdAtomicU64,
    /// The stamp of its last use while not closed, or of its opening; see
    /// `EvictionNotices::stamp`.
    pub(crate) open_used: StdAtomicU64,
    /// A notice is posted and not yet read.
    pub(crate) notice_posted: StdAtomicBool,
    /// Its node in the eviction queues, written under the insert lock.
    pub(crate) node: StdAtomicUsize,
}

impl fmt::Debug for Breaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breaker")
            .field("key", &self.key)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

impl Breaker {
    /// A closed breaker for `key`, reporting to `observer`. It reports its
    /// state only once the registry keeps it ([`publish`](Self::publish)): a
    /// breaker built for a key another call inserted first is dropped
    /// without a word.
    pub(crate) fn new(
        key: Arc<str>,
        settings: Arc<Settings>,
        keyed: bool,
        observer: Box<dyn Observer>,
    ) -> Self {
        let window = settings
            .policy
            .window()
            .map(|window| WindowState::new(window, settings.slow_call_rate.is_some()));
        let throttle = match settings.policy {
            Policy::AdaptiveThrottle { k, .. } => Some(k),
            _ => None,
        };
        let closed = Word::new(State::Closed, 0, Slots::NONE);
        let base = Instant::now();
        let coarse_clock = matches!(window, Some(WindowState::Time(_)))
            .then(|| CoarseClock::new(base, Duration::from_millis(1)));
        Breaker {
            key,
            keyed,
            disabled: settings.mode == Mode::Disabled,
            slow_call_threshold: settings.slow_call_threshold,
            slow_apart: settings.slow_call_rate.is_some(),
            call_listeners: !settings.on_call.0.is_empty(),
            pending_when_open: settings.pending_when_open,
            throttle,
            changed: settings.pending_when_open.then(|| Arc::new(Notify::new())),
            settings,
            base,
            word: AtomicU64::new(match throttle {
                Some(_) => closed.throttling().0,
                None => closed.0,
            }),
            open_until: AtomicU64::new(0),
            probes_due: AtomicU64::new(0),
            since: AtomicU64::new(0),
            period_start: AtomicU64::new(0),
            consecutive: AtomicU32::new(0),
            open_streak: AtomicU64::new(0),
            window,
            coarse_clock,
            failures: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            opened: AtomicU64::new(0),
            observer,
            last_used: StdAtomicU64::new(0),
            open_used: StdAtomicU64::new(0),
            notice_posted: StdAtomicBool::new(false),
            node: StdAtomicUsize::new(usize::MAX),
        }
    }

    /// Reports the state of a breaker the registry now keeps.
    pub(crate) fn publish(&self) {
        self.observer.report(self, Report::Kept(self.state()));
    }

    /// The registry let go of this breaker (evicted, or never kept). Calls
    /// still in flight may finish on it; it no longer reports its state.
    pub(crate) fn retire(&self) {
        self.observer.report(self, Report::LetGo);
    }

    fn cas(&self, current: Word, next: Word) -> Result<(), Word> {
        self.word
            .compare_exchange(current.0, next.0, Ordering::AcqRel, Ordering::Acquire)
            .map(drop)
            .map_err(Word)
    }

    fn offset(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.base)
            .as_nanos()
            .min(u128::from(u64::MAX)) as u64
    }

    pub(crate) fn state(&self) -> State {
        self.load().state()
    }

    /// Tells every per-call callback.
    fn call_event(&self, kind: CallKind, elapsed: Option<Duration>) {
        if !self.call_listeners {
            return;
        }
        let event = CallEvent {
            key: &self.key,
            kind,
            elapsed,
        };
        for callback in &self.settings.on_call.0 {
            callback(&event);
        }
    }

    /// Nanoseconds after `base` of `now + wait`, saturating.
    fn deadline_after(&self, now: Instant, wait: Duration) -> u64 {
        self.offset(now)
            .saturating_add(wait.as_nanos().min(u128::from(u64::MAX)) as u64)
    }

    /// The time a time window files a result at (zero for a count window):
    /// the coarse clock's unless `exact`.
    #[inline]
    fn window_now(&self, exact: bool) -> Duration {
        let Some(clock) = &self.coarse_clock else {
            return Duration::ZERO;
        };
        let nanos = match clock.offset() {
            Some(nanos) if !exact => nanos,
            _ => self.offset(CoarseClock::precise_now()),
        };
        Duration::from_nanos(nanos)
    }

    /// Opens the breaker from `from` (closed or half-open). `false` when the
    /// word changed under us.
    fn open(&self, from: Word, now: Instant) -> bool {
        let streak = match from.state() {
            State::HalfOpen => {
                let kept = self.open_streak.load(Ordering::Acquire);
                // A racer that already reopened this very period left its
                // epoch with the streak: the streak is that one, not one
                // more, or a loser would write a longer deadline.
                if kept >> 32 == from.epoch() {
                    kept as u32
                } else {
                    (kept as u32).saturating_add(1)
                }
            }
            _ => 0,
        };
        let wait = self.settings.open_duration(streak);
        // Written before the CAS so no reader ever sees `Open` with the last
        // period's (past) deadline. A writer that then loses the CAS differs
        // from the winner only by the moments between them.
        self.period_start.store(self.offset(now), Ordering::Release);
        self.open_until
            .store(self.deadline_after(now, wait), Ordering::Release);
        if self.cas(from, from.next(State::Open)).is_err() {
            return false;
        }
        self.open_streak
            .store(from.epoch() << 32 | u64::from(streak), Ordering::Release);
        // Results of the old period no longer count (their epoch is gone):
        // the counts an operator reads while the breaker is open are empty.
        // Cleared again before it closes (see `clear_counts`).
        self.clear_counts();
        self.changed(from.state(), State::Open, now, Some(wait), false);
        true
    }

    /// `word` as this breaker writes it: a closed word of a throttling
    /// breaker keeps it off the one-load closed path.
    fn closed_word(&self, word: Word) -> Word {
        if self.throttle.is_some() && word.is_closed() {
            word.throttling()
        } else {
            word
        }
    }

    /// Clears the counts when the breaker opens and again just *before* it
    /// closes, while no call can count in them: a result is checked against
    /// its epoch ([`counts`](Self::counts)) and then written, so calls that
    /// passed the check just before the opening may still write, and the
    /// next closed period must not meet those stale counts.
    fn clear_counts(&self) {
        self.consecutive.store(0, Ordering::Release);
        if let Some(window) = &self.window {
            window.reset();
        }
    }

    /// An operator's transition: reset (to closed), force open, force
    /// closed. A reset clears the counts before the breaker closes, as a
    /// probe's close does; reset while it is closed, the clearing races the
    /// results its calls are writing, and a count window's failure count
    /// can come out one off until the breaker next opens or is reset. So
    /// can a reset that lands while the last probe closes the breaker: the
    /// probe clears the counts before its CAS, which the reset makes fail,
    /// and the clearing may meet the reset period's first results.
    /// Returns the state left; [`announce_forced`](Self::announce_forced)
    /// then reports the change (the registry calls it once it holds no lock).
    pub(crate) fn set_forced(&self, to: State) -> State {
        if to == State::Closed {
            self.clear_counts();
        }
        let mut word = self.load();
        loop {
            match self.cas(word, self.closed_word(word.next(to))) {
                Ok(()) => break,
                Err(actual) => word = actual,
            }
        }
        if to == State::ForcedClosed {
            // Nothing counts while forced closed; the counts an operator
            // reads are empty, and cleared again before it closes.
            self.clear_counts();
        }
        if to != State::ForcedOpen {
            self.open_streak.store(0, Ordering::Release);
        }
        word.state()
    }

    /// Reports an operator's transition made by [`set_forced`](Self::set_forced):
    /// gauge, event, callbacks, waiters.
    pub(crate) fn announce_forced(&self, from: State, to: State) {
        self.changed(from, to, Instant::now(), None, true);
    }

    fn changed(
        &self,
        from: State,
        to: State,
        now: Instant,
        open_for: Option<Duration>,
        by_operator: bool,
    ) {
        self.since.store(self.offset(now), Ordering::Release);
        if to == State::Open {
            self.opened.fetch_add(1, Ordering::Relaxed);
        }
        let change = StateChange {
            key: &self.key,
            from,
            to,
            open_for,
        };
        let report = Report::Changed {
            change,
            by_operator,
        };
        self.observer.report(self, report);
        for callback in &self.settings.on_state_change.0 {
            callback(&change);
        }
        self.wake_waiters();
    }

    /// Wakes every `poll_ready` parked in pending mode: after each state
    /// change and each probe slot given back.
    fn wake_waiters(&self) {
        if let Some(notify) = &self.changed {
            notify.notify_waiters();
        }
    }

    /// The state word as it is now. With the readings below, what the admin
    /// handle shows (`admin.rs`).
    #[inline]
    pub(crate) fn load(&self) -> Word {
        Word(self.word.load(Ordering::Acquire))
    }

    /// How long it has been in its state at `now`.
    pub(crate) fn time_in_state(&self, now: Instant) -> Duration {
        Duration::from_nanos(
            self.offset(now)
                .saturating_sub(self.since.load(Ordering::Acquire)),
        )
    }

    /// The time left at `now` of the open period (of the last one, if it
    /// is no longer open).
    pub(crate) fn remaining_open(&self, now: Instant) -> Duration {
        let open_until = self.open_until.load(Ordering::Acquire);
        Duration::from_nanos(open_until.saturating_sub(self.offset(now)))
    }

    /// The window's counts at `now` (none without a window).
    pub(crate) fn tally(&self, now: Instant) -> Tally {
        match &self.window {
            Some(window) => window.tally(Duration::from_nanos(self.offset(now))),
            None => Tally::default(),
        }
    }
}

#[cfg(test)]
#[cfg(not(breaker_loom))]
mod tests {
    use std::time::Duration;

    use tower_classify::{ErrorChainClassifier, FailureKind, Outcome};

    use super::*;
    use crate::{CircuitBreakerLayer, Window};

    fn failure() -> Outcome {
        Outcome::failure(FailureKind::ServerError)
    }

    /// Opens a breaker with four failures, lets three more failures be
    /// written into its counts after it opened (calls that checked their
    /// epoch just before it opened, then wrote), closes it with a probe,
    /// and records one failure: under half of four calls, it must stay
    /// closed.
    async fn late_writes_do_not_reach_the_next_closed_period(window: Window) {
        let layer = CircuitBreakerLayer::builder()
            .policy(Policy::failure_rate(0.5, 4, window))
            .recovery_timeout(Duration::from_secs(1))
            .build(ErrorChainClassifier::new())
            .unwrap();
        let holder = &layer.breaker;
        let breaker = holder.breaker();
        for _ in 0..4 {
            Breaker::admit(holder)
                .expect("closed")
                .complete(failure(), None);
        }
        assert_eq!(breaker.state(), State::Open);

        let counts = breaker.window.as_ref().expect("a rate policy's window");
        for _ in 0..3 {
            counts.record(true, false, breaker.window_now(true));
        }

        tokio::time::advance(Duration::from_secs(2)).await;
        let mut probe = Breaker::admit(holder).expect("a half-open probe");
        probe.complete(Outcome::Success, None);
        assert_eq!(breaker.state(), State::Closed);
        assert_eq!(counts.tally(breaker.window_now(true)), Tally::default());

        Breaker::admit(holder)
            .expect("closed")
            .complete(failure(), None);
        assert_eq!(
            breaker.state(),
            State::Closed,
            "one failure of one call, under the minimum of four"
        );
    }

    /// A jitter too small to shorten the longest recovery timeout leaves it
    /// as it is: rounding it up must not overflow `Duration`.
    #[tokio::test(start_paused = true)]
    async fn the_longest_recovery_timeout_with_a_tiny_jitter_opens() {
        let layer = CircuitBreakerLayer::builder()
            .policy(Policy::consecutive_failures(1))
            .recovery_timeout(Duration::from_secs(u64::MAX))
            .recovery_jitter(1e-20)
            .build(ErrorChainClassifier::new())
            .unwrap();
        let holder = &layer.breaker;
        Breaker::admit(holder)
            .expect("closed")
            .complete(failure(), None);
        assert_eq!(holder.breaker().state(), State::Open);
    }

    /// Two callers reopening one half-open period: the one that loses the
    /// CAS computes the winner's streak, not one more, so the deadline it
    /// writes first is the winner's (2 s here), not twice it.
    #[tokio::test(start_paused = true)]
    async fn a_caller_that_loses_the_race_to_reopen_writes_the_same_deadline() {
        let layer = CircuitBreakerLayer::builder()
            .policy(Policy::consecutive_failures(1))
            .recovery_timeout(Duration::from_secs(1))
            .max_recovery_timeout(Duration::from_secs(3600))
            .recovery_jitter(0.0)
            .build(ErrorChainClassifier::new())
            .unwrap();
        let holder = &layer.breaker;
        let breaker = holder.breaker();
        Breaker::admit(holder)
            .expect("closed")
            .complete(failure(), None);
        tokio::time::advance(Duration::from_secs(1)).await;
        let _probe = Breaker::admit(holder).expect("a half-open probe");
        let half_open = breaker.load();
        assert_eq!(half_open.state(), State::HalfOpen);
        let now = Instant::now();
        assert!(breaker.open(half_open, now), "the winner");
        let deadline = breaker.open_until.load(Ordering::Acquire);
        assert_eq!(
            deadline,
            breaker.deadline_after(now, Duration::from_secs(2))
        );
        assert!(!breaker.open(half_open, now), "the loser");
        assert_eq!(breaker.open_until.load(Ordering::Acquire), deadline);
    }

    /// A refusal's place on the release ramp is judged against the period
    /// whose end it compared: one that stalls while a newer period starts
    /// gets no hint, rather than the old period's time left measured
    /// against the new period's length.
    #[tokio::test(start_paused = true)]
    async fn a_refusal_is_placed_against_the_period_it_compared() {
        let layer = CircuitBreakerLayer::builder()
            .policy(Policy::consecutive_failures(1))
            .recovery_timeout(Duration::from_secs(10))
            .build(ErrorChainClassifier::new())
            .unwrap();
        let holder = &layer.breaker;
        let breaker = holder.breaker();
        Breaker::admit(holder)
            .expect("closed")
            .complete(failure(), None);
        let until = breaker.open_until.load(Ordering::Acquire);
        let late = until - Duration::from_secs(1).as_nanos() as u64;
        assert_eq!(
            breaker.release_after(until, late),
            (Duration::from_secs(1), Some(Duration::from_secs(5))),
            "1 s left of 10: the last fifth, back after five times that"
        );
        let early = until - Duration::from_secs(3).as_nanos() as u64;
        assert_eq!(breaker.release_after(until, early).1, None);
        // A newer 10 s period started after `until` was read.
        let newer = until + 1;
        breaker.period_start.store(newer, Ordering::Release);
        breaker.open_until.store(
            newer + Duration::from_secs(10).as_nanos() as u64,
            Ordering::Release,
        );
        assert_eq!(
            breaker.release_after(until, late),
            (Duration::from_secs(1), None)
        );
    }

    /// SPEC 5b: a throttling breaker refuses with the SRE book's
    /// probability, `max(0, (requests − k × accepts) / (requests + 1))`.
    #[tokio::test(start_paused = true)]
    async fn the_throttle_refuses_with_the_sre_probability() {
        let layer = CircuitBreakerLayer::builder()
            .policy(Policy::adaptive_throttle(2.0, Window::count(10_000)))
            .build(ErrorChainClassifier::new())
            .unwrap();
        let holder = &layer.breaker;
        let breaker = holder.breaker();
        let window = breaker.window.as_ref().expect("a throttle's window");
        let fill = |requests: u32, accepts: u32| {
            window.reset();
            // The calls not accepted first: they are the oldest.
            for n in 0..requests {
                window.record(n < requests - accepts, false, Duration::ZERO);
            }
        };
        for (requests, accepts) in [
            (0, 0),
            (10, 5),
            (10, 4),
            (100, 0),
            (1_000, 200),
            (1_000, 600),
        ] {
            fill(requests, accepts);
            let expected = ((f64::from(requests) - 2.0 * f64::from(accepts))
                / (f64::from(requests) + 1.0))
                .max(0.0);
            assert_eq!(
                breaker.throttle_probability(),
                expected,
                "{requests} requests, {accepts} accepts"
            );
        }

        // Drawn: 10,000 requests of which 2,000 accepts, the newest. Every
        // call now fails, refused or not, and pushes out one of the oldest
        // (a failure too), so the probability stays (10,000 − 4,000) /
        // 10,001 throughout.
        fill(10_000, 2_000);
        fastrand::seed(11);
        let draws = 2_000;
        let mut refused = 0;
        for _ in 0..draws {
            match Breaker::admit(holder) {
                Ok(mut permit) => permit.complete(failure(), None),
                Err(_) => refused += 1,
            }
        }
        let expected = f64::from(draws) * 6_000.0 / 10_001.0;
        // Three standard deviations of a binomial draw.
        let spread = 3.0 * (f64::from(draws) * 0.6 * 0.4).sqrt();
        assert!(
            (f64::from(refused) - expected).abs() < spread,
            "{refused} refused, expected {expected:.0} ± {spread:.0}"
        );
        assert_eq!(breaker.state(), State::Closed, "a throttle never opens");
    }

    #[tokio::test(start_paused = true)]
    async fn a_count_window_closes_empty_whatever_was_written_while_open() {
        late_writes_do_not_reach_the_next_closed_period(Window::count(10)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_time_window_closes_empty_whatever_was_written_while_open() {
        late_writes_do_not_reach_the_next_closed_period(Window::time(Duration::from_secs(60)))
            .await;
    }
}
