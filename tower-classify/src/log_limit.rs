//! Rate-limited logging for events that repeat once per call during an
//! outage.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Lets one log line through per interval and counts the ones it holds
/// back: the family logs an event that repeats per call during an outage at
/// `warn` through it (and at `debug` every time). Lock-free, on tokio's clock.
///
/// ```
/// use std::time::Duration;
/// use tower_classify::LogLimit;
///
/// let limit = LogLimit::new(Duration::from_secs(10));
/// assert_eq!(limit.check(), Some(0)); // the first event is logged
/// assert_eq!(limit.check(), None); // held back, counted
/// assert_eq!(limit.check(), None);
/// ```
pub struct LogLimit {
    start: Instant,
    interval_ms: u64,
    // Milliseconds after `start` from which the next line may go through.
    next_ms: AtomicU64,
    held_back: AtomicU64,
}

impl LogLimit {
    /// At most one line per `interval` (at least 1 ms).
    pub fn new(interval: Duration) -> Self {
        LogLimit {
            start: Instant::now(),
            interval_ms: u64::try_from(interval.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
            next_ms: AtomicU64::new(0),
            held_back: AtomicU64::new(0),
        }
    }

    /// `Some(n)` when this event is to be logged, `n` being how many were
    /// held back since the last logged one; `None` when it is held back.
    pub fn check(&self) -> Option<u64> {
        let now_ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let next = self.next_ms.load(Ordering::Relaxed);
        if now_ms >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now_ms.saturating_add(self.interval_ms),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some(self.held_back.swap(0, Ordering::Relaxed));
        }
        self.held_back.fetch_add(1, Ordering::Relaxed);
        None
    }
}

impl fmt::Debug for LogLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogLimit")
            .field("interval", &Duration::from_millis(self.interval_ms))
            .field("held_back", &self.held_back.load(Ordering::Relaxed))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_line_per_interval_with_the_count_of_the_rest() {
        let limit = LogLimit::new(Duration::from_secs(10));
        assert_eq!(limit.check(), Some(0));
        for _ in 0..99 {
            assert_eq!(limit.check(), None);
        }
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert_eq!(limit.check(), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(limit.check(), Some(100));
        assert_eq!(limit.check(), None);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(limit.check(), Some(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_huge_interval_saturates_instead_of_overflowing() {
        let limit = LogLimit::new(Duration::MAX);
        assert_eq!(limit.check(), Some(0));
        tokio::time::advance(Duration::from_secs(86_400 * 365)).await;
        assert_eq!(limit.check(), None);
    }
}
