//! [`CoarseClock`]: the time for a layer's hot path, one relaxed load.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;
use std::time::Duration;

use tokio::time::Instant;

/// The rates the thread ticks at: the finest any live clock asked for.
const FINE_TICK: Duration = Duration::from_millis(1);
const COARSE_TICK: Duration = Duration::from_millis(10);

/// The instant the readings count from.
static START: OnceLock<std::time::Instant> = OnceLock::new();
/// Nanoseconds after `START`, as of the last tick.
static READING: AtomicU64 = AtomicU64::new(0);
/// Live clocks that asked for [`FINE_TICK`], and for [`COARSE_TICK`]: the
/// thread parks while both are zero.
static FINE_USERS: AtomicUsize = AtomicUsize::new(0);
static COARSE_USERS: AtomicUsize = AtomicUsize::new(0);
/// tokio's clock was seen paused, or the thread could not be started: read
/// the clock on every call.
static PRECISE: AtomicBool = AtomicBool::new(false);
static TICKER: OnceLock<Option<Thread>> = OnceLock::new();

fn saturating_nanos(duration: Duration) -> u64 {
    duration.as_nanos().min(u128::from(u64::MAX)) as u64
}

fn tick(start: std::time::Instant) {
    loop {
        READING.fetch_max(saturating_nanos(start.elapsed()), Ordering::Relaxed);
        if FINE_USERS.load(Ordering::Acquire) > 0 {
            std::thread::sleep(FINE_TICK);
        } else if COARSE_USERS.load(Ordering::Acquire) > 0 {
            std::thread::sleep(COARSE_TICK);
        } else {
            // `unpark` before `park` makes `park` return at once, so a
            // clock built between the loads and here is not missed.
            std::thread::park();
        }
    }
}

/// A coarse clock for a layer's hot path: the time as one relaxed load of a
/// process-wide reading that one thread refreshes (reading the monotonic
/// clock costs more than a call through a closed breaker).
///
/// # Accuracy
///
/// A reading is late by at most the tick asked for (1 ms for a resolution
/// under 10 ms, else 10 ms) plus however long the OS delays the ticking
/// thread. It never runs ahead.
///
/// # The thread
///
/// `tower-coarse-clock`, one per process, started by the first clock; it
/// ticks at the finest rate a live clock asked for and parks while none
/// exists.
///
/// # Paused tokio time
///
/// Once [`precise_now`](Self::precise_now) sees tokio's clock paused (or the
/// thread could not start), [`offset`](Self::offset) is `None` everywhere in
/// the process and callers read tokio's clock.
///
/// ```
/// use std::time::Duration;
/// use tokio::time::Instant;
/// use tower_classify::CoarseClock;
///
/// let base = Instant::now();
/// let clock = CoarseClock::new(base, Duration::from_millis(10));
/// let elapsed = match clock.offset() {
///     Some(nanos) => Duration::from_nanos(nanos),
///     // Paused time, or no thread: read the clock.
///     None => CoarseClock::precise_now() - base,
/// };
/// assert!(elapsed < Duration::from_secs(60));
/// ```
pub struct CoarseClock {
    /// The caller's base instant, in nanoseconds after `START`.
    base: u64,
    users: &'static AtomicUsize,
}

impl CoarseClock {
    /// A clock whose offsets count from `base`, late by about `resolution`
    /// at most (see [Accuracy](Self#accuracy)); starts (or wakes) the
    /// ticking thread.
    pub fn new(base: Instant, resolution: Duration) -> Self {
        let start = *START.get_or_init(std::time::Instant::now);
        let users = if resolution < COARSE_TICK {
            &FINE_USERS
        } else {
            &COARSE_USERS
        };
        users.fetch_add(1, Ordering::AcqRel);
        // Fresh at once, not only after the thread's next tick.
        READING.fetch_max(saturating_nanos(start.elapsed()), Ordering::Relaxed);
        let ticker = TICKER.get_or_init(|| {
            std::thread::Builder::new()
                .name("tower-coarse-clock".into())
                .spawn(move || tick(start))
                .ok()
                .map(|handle| handle.thread().clone())
        });
        match ticker {
            Some(thread) => thread.unpark(),
            None => PRECISE.store(true, Ordering::Relaxed),
        }
        Self::precise_now();
        let base = saturating_nanos(base.into_std().saturating_duration_since(start));
        CoarseClock { base, users }
    }

    /// Nanoseconds after the base, as of the last tick; `None` when the
    /// clock must be read instead (see [Paused tokio time](Self#paused-tokio-time)).
    #[inline]
    pub fn offset(&self) -> Option<u64> {
        if PRECISE.load(Ordering::Relaxed) {
            return None;
        }
        Some(READING.load(Ordering::Relaxed).saturating_sub(self.base))
    }

    /// tokio's clock; once it is seen paused (a `std` reading does not lie
    /// between two tokio ones), every [`offset`](Self::offset) is `None`.
    pub fn precise_now() -> Instant {
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
}

impl Drop for CoarseClock {
    fn drop(&mut self) {
        self.users.fetch_sub(1, Ordering::AcqRel);
    }
}

impl fmt::Debug for CoarseClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoarseClock")
            .field("offset", &self.offset())
            .finish()
    }
}

fn paused(before: Instant, real: std::time::Instant, after: Instant) -> bool {
    !(before.into_std() <= real && real <= after.into_std())
}

#[cfg(test)]
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

    /// The thread refreshes the reading by itself, at either rate: with no
    /// clock read by the caller, the offset passes an instant taken after
    /// the clock was built. Waits for the thread (a few ticks), capped at
    /// 10 s.
    #[test]
    fn the_thread_moves_the_reading_on() {
        for (resolution, tick) in [(COARSE_TICK, COARSE_TICK), (FINE_TICK, FINE_TICK)] {
            let clock = CoarseClock::new(Instant::from_std(std::time::Instant::now()), resolution);
            let Some(offset) = clock.offset() else {
                // Another test of this binary paused tokio's clock: every
                // call reads the clock, which is what it should do then.
                return;
            };
            let target = offset + 3 * tick.as_nanos() as u64;
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
}
