//! A coarse clock for the time window's success path.
//!
//! Reading the monotonic clock costs tens of nanoseconds (more under some
//! hypervisors): more than the whole rest of a call through a closed breaker.
//! A success only has to be filed into the right bucket of a window whose
//! buckets are at least a millisecond long, so it reads this clock instead:
//! one relaxed load of a process-wide reading that one thread refreshes every
//! [`TICK`]. The same design as `coarsetime` and `quanta`'s upkeep thread.
//!
//! # Accuracy
//!
//! The reading is late by at most one tick (1 ms) plus however long the
//! operating system delays the ticking thread, which on a loaded machine can
//! be a few milliseconds more. So a success may be filed into the bucket
//! before the current one, near a bucket boundary. Everything that can open
//! the breaker reads the real clock: a failure is filed at the exact time, and
//! a success whose coarse tally reaches the rate is judged again on a tally
//! at the exact time, so an expired failure never opens a breaker.
//!
//! # The thread
//!
//! One thread for the whole process, `tower-breaker-clock`, started by the
//! first time-window breaker; it parks while no time-window breaker exists
//! and never runs a task. No per-breaker task or timer.
//!
//! # Paused tokio time
//!
//! Tests pause tokio's clock and move it by hand; a thread ticking with the
//! real clock would not follow. Whenever the breaker reads tokio's clock
//! ([`precise_now`]: on building a time-window breaker and on each failure),
//! it checks that clock against `std`'s; once tokio's clock is seen paused (or
//! the thread could not be started), every time-window call in the process
//! reads tokio's clock, as it did before this clock existed.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;
use std::time::Duration;

use tokio::time::Instant;

/// How often the reading is refreshed.
pub(crate) const TICK: Duration = Duration::from_millis(1);

/// The instant the readings count from.
static START: OnceLock<std::time::Instant> = OnceLock::new();
/// Nanoseconds after `START`, as of the last tick.
static READING: AtomicU64 = AtomicU64::new(0);
/// Time-window breakers alive: the thread parks at zero.
static USERS: AtomicUsize = AtomicUsize::new(0);
/// tokio's clock was seen paused, or the thread could not be started: read
/// the clock on every call.
static PRECISE: AtomicBool = AtomicBool::new(false);
static TICKER: OnceLock<Option<Thread>> = OnceLock::new();

fn nanos_since(start: std::time::Instant) -> u64 {
    start.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64
}

fn tick(start: std::time::Instant) {
    loop {
        READING.fetch_max(nanos_since(start), Ordering::Relaxed);
        if USERS.load(Ordering::Acquire) == 0 {
            // `unpark` before `park` makes `park` return at once, so a
            // breaker built between the load and here is not missed.
            std::thread::park();
            continue;
        }
        std::thread::sleep(TICK);
    }
}

/// One time-window breaker's view of the coarse clock; while it lives the
/// thread ticks.
#[derive(Debug)]
pub(crate) struct CoarseClock {
    /// The breaker's base instant, in nanoseconds after `START`.
    base: u64,
}

impl CoarseClock {
    /// A clock for a breaker whose offsets count from `base`; starts (or
    /// wakes) the ticking thread.
    pub(crate) fn new(base: Instant) -> Self {
        let start = *START.get_or_init(std::time::Instant::now);
        USERS.fetch_add(1, Ordering::AcqRel);
        // Fresh at once, not only after the thread's next tick.
        READING.fetch_max(nanos_since(start), Ordering::Relaxed);
        let ticker = TICKER.get_or_init(|| {
            std::thread::Builder::new()
                .name("tower-breaker-clock".into())
                .spawn(move || tick(start))
                .ok()
                .map(|handle| handle.thread().clone())
        });
        match ticker {
            Some(thread) => thread.unpark(),
            None => PRECISE.store(true, Ordering::Relaxed),
        }
        precise_now();
        CoarseClock {
            base: base
                .into_std()
                .saturating_duration_since(start)
                .as_nanos()
                .min(u128::from(u64::MAX)) as u64,
        }
    }

    /// Nanoseconds after the breaker's base, as of the last tick; `None`
    /// when the clock must be read instead (see the module docs).
    #[inline]
    pub(crate) fn offset(&self) -> Option<u64> {
        if PRECISE.load(Ordering::Relaxed) {
            return None;
        }
        Some(READING.load(Ordering::Relaxed).saturating_sub(self.base))
    }
}

impl Drop for CoarseClock {
    fn drop(&mut self) {
        USERS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// tokio's clock, checked against `std`'s. Unpaused, tokio's `Instant::now`
/// is `std`'s, so a `std` reading taken between two tokio readings lies
/// between them; a paused clock stands still at some other instant.
pub(crate) fn precise_now() -> Instant {
    let before = Instant::now();
    if PRECISE.load(Ordering::Relaxed) {
        return before;
    }
    let real = std::time::Instant::now();
    let after = Instant::now();
    if paused(before, real, after) {
        PRECISE.store(true, Ordering::Relaxed);
    }
    after
}

fn paused(before: Instant, real: std::time::Instant, after: Instant) -> bool {
    !(before.into_std() <= real && real <= after.into_std())
}

#[cfg(all(test, not(breaker_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_clock_that_stands_still_elsewhere_is_seen_paused() {
        let t = std::time::Instant::now();
        let later = t + Duration::from_millis(5);
        let at = Instant::from_std;
        // Running: tokio's readings bracket std's.
        assert!(!paused(at(t), t, at(t)));
        assert!(!paused(at(t), t + Duration::from_micros(1), at(later)));
        // Frozen in the past, or moved ahead by `advance`.
        assert!(paused(at(t), later, at(t)));
        assert!(paused(at(later), t, at(later)));
    }

    /// The thread refreshes the reading by itself: with no clock read by
    /// the caller, the offset passes an instant taken after the clock was
    /// built. Waits for the thread (a few milliseconds), capped at 10 s.
    #[test]
    fn the_thread_moves_the_reading_on() {
        let clock = CoarseClock::new(Instant::from_std(std::time::Instant::now()));
        if clock.offset().is_none() {
            // Another test of this binary paused tokio's clock: every call
            // reads the clock, which is what it should do then.
            return;
        }
        let target = clock.offset().unwrap() + 3 * TICK.as_nanos() as u64;
        let give_up = std::time::Instant::now() + Duration::from_secs(10);
        while clock.offset().is_some_and(|offset| offset < target) {
            assert!(
                std::time::Instant::now() < give_up,
                "the clock never ticked"
            );
            std::thread::yield_now();
        }
    }
}
