//! A windowed latency histogram, lock-free, and the hedge delay read from it.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::budget::advance;

/// Sub-buckets per power of two: 32, so a bucket spans at most 1/32 (3.1 %)
/// of its lower bound, and a percentile interpolated inside one is closer.
const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
/// Latencies are kept in microseconds up to 2^36 µs (19 hours); longer ones
/// count in the last bucket.
const MAX_EXPONENT: u32 = 36;
/// The regular buckets, then one for everything from 2^36 µs up.
const BUCKETS: usize = (MAX_EXPONENT - SUB_BITS + 1) as usize * SUB as usize + 1;
/// The window is this many slices; the oldest is cleared as a new one starts,
/// so a percentile reads between `window × (SLICES − 1) / SLICES` and
/// `window` of history.
pub(crate) const SLICES: usize = 3;
/// The delay is recomputed every this many samples (a power of two), at
/// most once per `RECOMPUTE_GAP_NANOS`, and whenever a slice is cleared: a
/// busy layer scans its buckets every 10 ms, not on every 64th of a million
/// calls a second.
const RECOMPUTE_EVERY: u64 = 64;
const RECOMPUTE_GAP_NANOS: u64 = 10_000_000;
/// The delay before enough samples are in: never hedge.
const UNKNOWN: u64 = u64::MAX;

fn bucket_of(micros: u64) -> usize {
    if micros < SUB {
        return micros as usize;
    }
    let exponent = (63 - micros.leading_zeros()).min(MAX_EXPONENT);
    if exponent == MAX_EXPONENT {
        return BUCKETS - 1;
    }
    let mantissa = (micros >> (exponent - SUB_BITS)) & (SUB - 1);
    ((exponent - SUB_BITS + 1) as u64 * SUB + mantissa) as usize
}

/// The lowest value of `bucket`, and its width.
fn bounds_of(bucket: usize) -> (u64, u64) {
    let bucket = bucket as u64;
    if bucket < SUB {
        return (bucket, 1);
    }
    let shift = (bucket / SUB - 1) as u32;
    let mantissa = bucket % SUB;
    ((SUB + mantissa) << shift, 1 << shift)
}

struct Slice {
    counts: Box<[AtomicU32]>,
    total: AtomicU32,
}

impl Slice {
    fn new() -> Self {
        Slice {
            counts: (0..BUCKETS).map(|_| AtomicU32::new(0)).collect(),
            total: AtomicU32::new(0),
        }
    }

    fn clear(&self) {
        for count in self.counts.iter() {
            count.store(0, Ordering::Relaxed);
        }
        self.total.store(0, Ordering::Relaxed);
    }
}

/// Recent latencies and the percentile of them that a hedge waits for.
///
/// Recording is three relaxed atomic adds; every 64th sample (at most every
/// 10 ms, each time a slice of the window is cleared, and while the delay is
/// unknown and the window holds enough samples) the caller that recorded it
/// scans the buckets and stores the new delay, which every call reads with
/// one load.
/// A sample recorded while another thread clears its slice may be lost: the
/// percentile is an estimate, and one sample in thousands does not move it.
pub(crate) struct LatencyWindow {
    slices: [Slice; SLICES],
    start: Instant,
    slice_nanos: u64,
    /// The slice index (since `start`) being written.
    epoch: AtomicU64,
    samples: AtomicU64,
    /// Nanoseconds after `start` of the last scan, and the samples then.
    scanned_at: AtomicU64,
    scanned_samples: AtomicU64,
    percentile: f64,
    min_samples: u32,
    min_delay: Duration,
    delay_micros: AtomicU64,
}

impl LatencyWindow {
    pub(crate) fn new(
        percentile: f64,
        window: Duration,
        min_samples: u32,
        min_delay: Duration,
    ) -> Self {
        LatencyWindow {
            slices: std::array::from_fn(|_| Slice::new()),
            start: Instant::now(),
            slice_nanos: ((window / SLICES as u32).as_nanos() as u64).max(1),
            epoch: AtomicU64::new(0),
            samples: AtomicU64::new(0),
            scanned_at: AtomicU64::new(0),
            scanned_samples: AtomicU64::new(0),
            percentile,
            min_samples,
            min_delay,
            delay_micros: AtomicU64::new(UNKNOWN),
        }
    }

    /// The delay after which a hedge is sent, `None` until `min_samples`
    /// latencies are in the window.
    #[inline]
    pub(crate) fn delay(&self) -> Option<Duration> {
        match self.delay_micros.load(Ordering::Relaxed) {
            UNKNOWN => None,
            micros => Some(Duration::from_micros(micros)),
        }
    }

    /// Records one latency, measured at `now`.
    pub(crate) fn record(&self, latency: Duration, now: Instant) {
        let now_nanos = now.saturating_duration_since(self.start).as_nanos() as u64;
        let epoch = now_nanos / self.slice_nanos;
        let (current, rotated) = match advance(&self.epoch, epoch) {
            Ok(previous) => {
                // Clear the slices that fell out of the window (all of
                // them after a long quiet spell).
                for stale in (previous + 1..=epoch).rev().take(SLICES) {
                    self.slices[(stale % SLICES as u64) as usize].clear();
                }
                (epoch, true)
            }
            Err(current) => (current, false),
        };
        let slice = &self.slices[(current % SLICES as u64) as usize];
        let micros = latency.as_micros().min(u128::from(u64::MAX)) as u64;
        slice.counts[bucket_of(micros)].fetch_add(1, Ordering::Relaxed);
        slice.total.fetch_add(1, Ordering::Relaxed);
        let samples = self.samples.fetch_add(1, Ordering::Relaxed) + 1;
        // While the delay is unknown, the three slice totals say cheaply
        // whether a scan can find one.
        let unknown = self.delay_micros.load(Ordering::Relaxed) == UNKNOWN
            && self.window_total() >= u64::from(self.min_samples);
        // Due once both 64 samples and 10 ms have passed since the last
        // scan: a 64th sample too soon postpones the scan, not skips it.
        let due = samples.saturating_sub(self.scanned_samples.load(Ordering::Relaxed))
            >= RECOMPUTE_EVERY
            && now_nanos.saturating_sub(self.scanned_at.load(Ordering::Relaxed))
                >= RECOMPUTE_GAP_NANOS;
        if rotated || due || unknown {
            self.scanned_at.store(now_nanos, Ordering::Relaxed);
            self.scanned_samples.store(samples, Ordering::Relaxed);
            self.recompute();
        }
    }

    fn window_total(&self) -> u64 {
        self.slices
            .iter()
            .map(|slice| u64::from(slice.total.load(Ordering::Relaxed)))
            .sum()
    }

    /// Reads the percentile from every slice and stores it as the delay.
    ///
    /// The counts are read once into a snapshot, and the total and the
    /// rank come from that snapshot: a slice cleared by another thread
    /// meanwhile cannot leave the rank past the counts read.
    fn recompute(&self) {
        let mut counts = [0u64; BUCKETS];
        for slice in &self.slices {
            for (sum, count) in counts.iter_mut().zip(slice.counts.iter()) {
                *sum += u64::from(count.load(Ordering::Relaxed));
            }
        }
        let total: u64 = counts.iter().sum();
        if total == 0 || total < u64::from(self.min_samples) {
            self.delay_micros.store(UNKNOWN, Ordering::Relaxed);
            return;
        }
        // The rank of the percentile, 1-based: p95 of 100 samples is the
        // 95th smallest.
        let rank = ((self.percentile * total as f64).ceil() as u64).clamp(1, total);
        let mut below = 0u64;
        let mut micros = 0;
        for (bucket, &count) in counts.iter().enumerate() {
            if count == 0 {
                continue;
            }
            if below + count >= rank {
                // Interpolated inside the bucket, as if its samples were
                // spread evenly over it.
                let (low, width) = bounds_of(bucket);
                let into = (rank - below) as f64 / count as f64;
                micros = low + (width as f64 * into) as u64;
                break;
            }
            below += count;
        }
        let micros = micros
            .max(self.min_delay.as_micros() as u64)
            .min(UNKNOWN - 1);
        self.delay_micros.store(micros, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_value_in_order() {
        let mut last = 0;
        for micros in (0..100_000u64).chain([u64::MAX / 2, u64::MAX]) {
            let bucket = bucket_of(micros);
            assert!(bucket >= last, "{micros}");
            assert!(bucket < BUCKETS);
            last = bucket;
            if micros < 1 << MAX_EXPONENT {
                let (low, width) = bounds_of(bucket);
                assert!(
                    low <= micros && micros < low + width,
                    "{micros} in {low}+{width}"
                );
                assert!(width * SUB <= low.max(SUB), "a bucket spans at most 1/32");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_delay_is_the_percentile_once_enough_samples_are_in() {
        let window = LatencyWindow::new(0.9, Duration::from_secs(30), 100, Duration::ZERO);
        let now = Instant::now();
        for ms in 1..=99 {
            window.record(Duration::from_millis(ms), now);
            assert_eq!(window.delay(), None, "not before 100 samples");
        }
        window.record(Duration::from_millis(100), now);
        let delay = window.delay().unwrap();
        // The 90th of 1..=100 ms, within a bucket's width.
        assert!(
            delay >= Duration::from_micros(88_000) && delay <= Duration::from_micros(91_000),
            "{delay:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn old_slices_leave_the_window() {
        let window = LatencyWindow::new(0.5, Duration::from_secs(3), 10, Duration::ZERO);
        for _ in 0..64 {
            window.record(Duration::from_millis(100), Instant::now());
        }
        assert!(window.delay().unwrap() >= Duration::from_millis(99));
        // Three slices later the slow samples are gone; fast ones replace them.
        tokio::time::advance(Duration::from_secs(3)).await;
        for _ in 0..64 {
            window.record(Duration::from_millis(1), Instant::now());
        }
        assert!(
            window.delay().unwrap() <= Duration::from_millis(2),
            "{:?}",
            window.delay()
        );
        // A quiet spell empties the window: no hedging on stale data.
        tokio::time::advance(Duration::from_secs(10)).await;
        window.record(Duration::from_millis(1), Instant::now());
        assert_eq!(window.delay(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_delay_is_never_below_the_minimum() {
        let window = LatencyWindow::new(0.5, Duration::from_secs(30), 1, Duration::from_millis(1));
        window.record(Duration::ZERO, Instant::now());
        assert_eq!(window.delay(), Some(Duration::from_millis(1)));
    }
}
