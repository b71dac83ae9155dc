//! The live, lock-free counters of a [`Window`]: a ring of the last `n`
//! results ([`CountWindow`]) or buckets of time ([`TimeWindow`]).

use std::time::Duration;

use crate::policy::{Window, MAX_BUCKETS};
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// The calls, counted failures and slow calls a window holds right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Tally {
    pub(crate) calls: u32,
    pub(crate) failures: u32,
    /// Counted only when a slow-call rate is configured.
    pub(crate) slow: u32,
}

#[derive(Debug)]
pub(crate) enum WindowState {
    Count(CountWindow),
    Time(TimeWindow),
}

impl WindowState {
    /// `slow_calls`: slow calls are counted apart from failures.
    pub(crate) fn new(window: Window, slow_calls: bool) -> Self {
        match window {
            Window::Count(n) => WindowState::Count(CountWindow::new(n)),
            Window::Time { length, buckets } => {
                WindowState::Time(TimeWindow::new(length, buckets, slow_calls))
            }
        }
    }

    /// Records one call at `now` (since the breaker's base instant) and
    /// returns the tally; a time window holding no failure and no slow call
    /// returns an empty one for a success, which could not open anyway.
    #[inline]
    pub(crate) fn record(&self, failed: bool, slow: bool, now: Duration) -> Tally {
        match self {
            WindowState::Count(w) => w.record(failed, slow),
            WindowState::Time(w) => w.record(failed, slow, now),
        }
    }

    pub(crate) fn tally(&self, now: Duration) -> Tally {
        match self {
            WindowState::Count(w) => w.tally(),
            WindowState::Time(w) => w.tally(now),
        }
    }

    pub(crate) fn reset(&self) {
        match self {
            WindowState::Count(w) => w.reset(),
            WindowState::Time(w) => w.reset(),
        }
    }
}

/// A ring of the last `n` results, two bits each (failed, slow), 32 to a
/// word. Swapping a result's bits in adds it to the counts and removes the
/// one it replaces, each exactly once.
///
/// A success into a full window of successes writes nothing (such a ring is
/// the same whichever position comes next); one into a window holding a
/// failure only takes a position, so the failure ages out.
#[derive(Debug)]
pub(crate) struct CountWindow {
    size: u64,
    position: Remainder,
    results: Box<[AtomicU64]>,
    next: AtomicU64,
    failures: AtomicU32,
    slow: AtomicU32,
}

const FAILED: u64 = 0b01;
const SLOW: u64 = 0b10;
const RESULT_BITS: u64 = 2;
const RESULTS_PER_WORD: u64 = 64 / RESULT_BITS;

/// `a % divisor` by multiplication: a division costs as much as the rest
/// of a record (Lemire, Kaser and Kurz, "Faster Remainder by Direct
/// Computation", 2019; exact for every 64-bit numerator).
#[derive(Debug, Clone, Copy)]
struct Remainder {
    divisor: u64,
    magic: u128,
}

impl Remainder {
    fn new(divisor: u64) -> Self {
        Remainder {
            divisor,
            magic: (u128::MAX / u128::from(divisor)).wrapping_add(1),
        }
    }

    #[inline]
    fn of(&self, a: u64) -> u64 {
        let fraction = self.magic.wrapping_mul(u128::from(a));
        let divisor = u128::from(self.divisor);
        let low = (u128::from(fraction as u64) * divisor) >> 64;
        let high = (fraction >> 64) * divisor;
        ((low + high) >> 64) as u64
    }
}

/// Moves `count` by one result entering (`now`) and one leaving (`was`).
///
/// Wraps rather than saturates: two records of one position can race so
/// that a result is taken off before it was added, and the count must dip
/// below zero to come out exact (read as zero meanwhile, [`settled`]). A
/// record racing a reset may leave a count one off until the next reset,
/// which the breaker does on opening and again just before closing.
fn shift(count: &AtomicU32, was: bool, now: bool) -> u32 {
    settled(match (was, now) {
        (false, true) => count.fetch_add(1, Ordering::AcqRel).wrapping_add(1),
        (true, false) => count.fetch_sub(1, Ordering::AcqRel).wrapping_sub(1),
        _ => count.load(Ordering::Acquire),
    })
}

/// A count as read: one briefly below zero (see [`shift`]) is zero.
fn settled(count: u32) -> u32 {
    if (count as i32) < 0 {
        0
    } else {
        count
    }
}

impl CountWindow {
    fn new(n: u32) -> Self {
        let size = u64::from(n);
        CountWindow {
            size,
            position: Remainder::new(size),
            results: (0..size.div_ceil(RESULTS_PER_WORD))
                .map(|_| AtomicU64::new(0))
                .collect(),
            next: AtomicU64::new(0),
            failures: AtomicU32::new(0),
            slow: AtomicU32::new(0),
        }
    }

    #[inline]
    fn record(&self, failed: bool, slow: bool) -> Tally {
        if !failed && !slow && self.is_full_of_successes() {
            // A racing failure not yet counted is ordered after this
            // success; it ages out after `size` more records either way.
            return Tally {
                calls: self.size as u32,
                failures: 0,
                slow: 0,
            };
        }
        self.record_in_ring(failed, slow)
    }

    #[inline]
    fn is_full_of_successes(&self) -> bool {
        self.failures.load(Ordering::Relaxed) == 0
            && self.slow.load(Ordering::Relaxed) == 0
            && self.next.load(Ordering::Relaxed) >= self.size
    }

    fn record_in_ring(&self, failed: bool, slow: bool) -> Tally {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        let position = self.position.of(index);
        let word = &self.results[(position / RESULTS_PER_WORD) as usize];
        let offset = (position % RESULTS_PER_WORD) * RESULT_BITS;
        let mask = (FAILED | SLOW) << offset;
        let result = (if failed { FAILED } else { 0 } | if slow { SLOW } else { 0 }) << offset;
        let current = word.load(Ordering::Acquire);
        let old = if current & mask == result {
            current
        } else {
            word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                Some(w & !mask | result)
            })
            .unwrap_or(current)
        };
        let old = (old & mask) >> offset;
        Tally {
            calls: (index + 1).min(self.size) as u32,
            failures: shift(&self.failures, old & FAILED != 0, failed),
            slow: shift(&self.slow, old & SLOW != 0, slow),
        }
    }

    fn tally(&self) -> Tally {
        Tally {
            calls: self.next.load(Ordering::Acquire).min(self.size) as u32,
            failures: settled(self.failures.load(Ordering::Acquire)),
            slow: settled(self.slow.load(Ordering::Acquire)),
        }
    }

    fn reset(&self) {
        self.next.store(0, Ordering::Release);
        for word in self.results.iter() {
            word.store(0, Ordering::Release);
        }
        self.failures.store(0, Ordering::Release);
        self.slow.store(0, Ordering::Release);
    }
}

/// Buckets of `length / buckets` each, striped per thread as
/// [`Window::Time`] describes. A bucket is one `u64`: a written flag, a
/// sequence number (23 bits), calls and failures (20 bits each). A full
/// bucket takes no more records, so failures never run on past saturated
/// calls. A record adds with one `fetch_add` while the bucket is of its
/// period and far from full; restarting a bucket for a later period is a
/// compare-and-swap, so no bucket mixes two periods. A slot untouched for
/// exactly 2^23 periods (hours to months) reads as stale-but-valid, an
/// error of one bucket's counts.
#[derive(Debug)]
pub(crate) struct TimeWindow {
    bucket_nanos: u64,
    /// The stripes, `lines_per_stripe` lines each.
    buckets: Box<[Line]>,
    ring: usize,
    lines_per_stripe: usize,
    /// The stripe count less one (a power of two).
    stripe_mask: usize,
    /// Slow calls per bucket, packed the same way (in the calls field).
    slow: Option<Box<[AtomicU64]>>,
    /// The last period a record found, its slot in the low
    /// `PERIOD_INDEX_BITS` bits; see [`TimeWindow::locate`].
    period: AtomicU64,
    /// One more than the latest period a failure or slow call was filed in
    /// (0: none). While it is older than the window, a success skips the
    /// tally: nothing could open.
    notable: AtomicU64,
}

const BUCKETS_PER_LINE: usize = 8;

#[derive(Debug)]
#[repr(align(64))]
struct Line([AtomicU64; BUCKETS_PER_LINE]);

const MAX_STRIPES: usize = 8;
/// The longest ring that is striped (at most 4 KiB a window).
const STRIPED_UP_TO: usize = 64;

/// One stripe per CPU (a power of two, at most [`MAX_STRIPES`]), or one for
/// a long ring.
fn stripes_for(ring: usize) -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    if ring > STRIPED_UP_TO {
        return 1;
    }
    let cpus = *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from));
    cpus.clamp(1, MAX_STRIPES).next_power_of_two()
}

/// This thread's stripe number, unmasked: threads take numbers in turn on
/// first use (here and in `share.rs`), so up to a stripe count of threads
/// each write lines of their own.
#[inline]
pub(crate) fn thread_stripe() -> usize {
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize;

    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    STRIPE
        .try_with(|stripe| match stripe.get() {
            usize::MAX => {
                let taken =
                    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) & (usize::MAX >> 1);
                stripe.set(taken);
                taken
            }
            taken => taken,
        })
        // A thread that is ending takes the first stripe.
        .unwrap_or(0)
}

/// Enough for `MAX_BUCKETS` slots.
const PERIOD_INDEX_BITS: u32 = 10;
const PERIOD_INDEX_MASK: u64 = (1 << PERIOD_INDEX_BITS) - 1;
const _: () = assert!(MAX_BUCKETS as u64 <= PERIOD_INDEX_MASK + 1);

const SEQ_BITS: u32 = 23;
const COUNT_BITS: u32 = 20;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
/// Set in every bucket written for a period; a bucket without it is empty,
/// so a `fetch_add` that raced a reset cannot forge a period.
const WRITTEN: u64 = 1 << 63;
/// How full a bucket may be for a blind `fetch_add`: the margin exceeds the
/// adders that can sit between check and add, so no count carries over.
const ADD_BELOW: u64 = COUNT_MAX - (1 << 16);

fn pack(seq: u64, calls: u64, failures: u64) -> u64 {
    WRITTEN | ((seq & SEQ_MASK) << (2 * COUNT_BITS)) | (calls << COUNT_BITS) | failures
}

/// `(sequence, calls, failures)`, or `None` for an empty bucket.
fn unpack(bucket: u64) -> Option<(u64, u64, u64)> {
    (bucket & WRITTEN != 0).then_some((
        (bucket >> (2 * COUNT_BITS)) & SEQ_MASK,
        (bucket >> COUNT_BITS) & COUNT_MAX,
        bucket & COUNT_MAX,
    ))
}

/// How much later than a record's period a bucket may be and still take it
/// ([`add`]): far more than any clock lag, far less than the cycle.
const LATER_BY_LESS_THAN: u64 = 1 << 16;

/// Whether slot sequence `held` is a period later than a record's `seq`
/// but not past the latest period seen (`period`): a bucket written since
/// by a record that read the clock later. A slot untouched for nearly a
/// whole cycle also looks a little later, but lies ahead of the latest
/// period. `period` is read after the slot; its writer raised it first.
#[cold]
fn is_later(held: u64, seq: u64, period: &AtomicU64) -> bool {
    let by = held.wrapping_sub(seq) & SEQ_MASK;
    if by == 0 || by >= LATER_BY_LESS_THAN {
        return false;
    }
    let latest = seq.max(period.load(Ordering::Acquire) >> PERIOD_INDEX_BITS);
    latest.wrapping_sub(held) & SEQ_MASK < LATER_BY_LESS_THAN
}

/// Adds to the bucket of `seq` in `slot`, restarting it when it holds an
/// older period. A slot holding a *later* one ([`is_later`]) takes the
/// counts rather than being wiped. Returns the period filed in, or `None`
/// when the bucket was full.
fn add(slot: &AtomicU64, seq: u64, period: &AtomicU64, calls: u64, failures: u64) -> Option<u64> {
    let mut current = slot.load(Ordering::Acquire);
    loop {
        let (held, had_calls, had_failures) = match unpack(current) {
            // This period's bucket, or a later one.
            Some((s, c, f)) if s == seq & SEQ_MASK || is_later(s, seq, period) => {
                if c < ADD_BELOW && f < ADD_BELOW {
                    slot.fetch_add((calls << COUNT_BITS) | failures, Ordering::SeqCst);
                    return Some(full_period(seq, s));
                }
                (s, c, f)
            }
            _ => (seq & SEQ_MASK, 0, 0),
        };
        // Failures never outnumber calls, so a bucket with room for the
        // calls has room for the failures.
        if had_calls + calls > COUNT_MAX {
            return None;
        }
        let next = pack(held, had_calls + calls, had_failures + failures);
        match slot.compare_exchange_weak(current, next, Ordering::SeqCst, Ordering::Acquire) {
            Ok(_) => return Some(full_period(seq, held)),
            Err(actual) => current = actual,
        }
    }
}

/// The full period number `held` (low bits) stands for, seen from `seq`.
#[inline]
fn full_period(seq: u64, held: u64) -> u64 {
    seq.wrapping_add(held.wrapping_sub(seq) & SEQ_MASK)
}

/// The calls and failures of the bucket of sequence `expected` in `slot`.
fn read(slot: &AtomicU64, expected: u64) -> (u32, u32) {
    match unpack(slot.load(Ordering::SeqCst)) {
        Some((s, calls, failures)) if s == expected & SEQ_MASK => (calls as u32, failures as u32),
        _ => (0, 0),
    }
}

impl TimeWindow {
    fn new(length: Duration, buckets: u32, slow_calls: bool) -> Self {
        // At least 1 ms (`Window::validate`): a period fits 54 bits.
        let bucket_nanos = (length.as_nanos() / u128::from(buckets)).clamp(1, u128::from(u64::MAX));
        let ring = buckets as usize;
        let stripes = stripes_for(ring);
        let lines_per_stripe = ring.div_ceil(BUCKETS_PER_LINE);
        let line = |_| Line(std::array::from_fn(|_| AtomicU64::new(0)));
        TimeWindow {
            bucket_nanos: bucket_nanos as u64,
            buckets: (0..stripes * lines_per_stripe).map(line).collect(),
            ring,
            lines_per_stripe,
            stripe_mask: stripes - 1,
            slow: slow_calls.then(|| (0..buckets).map(|_| AtomicU64::new(0)).collect()),
            period: AtomicU64::new(0),
            notable: AtomicU64::new(0),
        }
    }

    /// The period of `now` and its slot. The latest period found is kept
    /// and a multiplication checks `now` is still in it, so only a record
    /// in a new period divides. A `now` before it (a coarse reading a
    /// little behind) is filed in the kept, newest period.
    #[inline]
    fn locate(&self, now: Duration) -> (u64, usize) {
        let nanos = u64::try_from(now.as_nanos()).unwrap_or(u64::MAX);
        let kept = self.period.load(Ordering::Relaxed);
        let (seq, index) = (kept >> PERIOD_INDEX_BITS, kept & PERIOD_INDEX_MASK);
        let kept_end = seq
            .wrapping_mul(self.bucket_nanos)
            .saturating_add(self.bucket_nanos);
        if nanos < kept_end {
            return (seq, index as usize);
        }
        let seq = (nanos / self.bucket_nanos).min(u64::MAX >> PERIOD_INDEX_BITS);
        let index = seq % self.ring as u64;
        // Raised before the record writes its bucket (see `is_later`).
        self.period
            .fetch_max(seq << PERIOD_INDEX_BITS | index, Ordering::AcqRel);
        (seq, index as usize)
    }

    fn record(&self, failed: bool, slow: bool, now: Duration) -> Tally {
        let (seq, index) = self.locate(now);
        self.record_at(seq, index, failed, slow)
    }

    /// Records a call in period `seq` (slot `index`) from `locate`.
    #[inline]
    fn record_at(&self, seq: u64, index: usize, failed: bool, slow: bool) -> Tally {
        let stripe = thread_stripe() & self.stripe_mask;
        let period = &self.period;
        let filed = add(
            self.bucket(stripe, index),
            seq,
            period,
            1,
            u64::from(failed),
        );
        // With the call, in the period it joined (none if its bucket was full).
        if let (Some(buckets), true, Some(filed)) = (&self.slow, slow, filed) {
            add(&buckets[index], filed, period, 1, 0);
        }
        // Judged at the period it joined (same slot), or a deciding failure
        // filed in a later bucket would tally an empty window.
        let seq = filed.unwrap_or(seq);
        // SeqCst bucket writes, `notable` and tally reads: a failure and a
        // success recorded at once each write one place and read the
        // other's, which acquire/release lets both miss (ARM `ldapr`), and
        // the rate would not open. Free on x86.
        if failed || slow {
            self.notable
                .fetch_max(seq.wrapping_add(1), Ordering::SeqCst);
        } else if self.quiet_at(seq) {
            return Tally::default();
        }
        self.tally_at(seq, index)
    }

    /// No failure and no slow call in the window at `seq`.
    #[inline]
    fn quiet_at(&self, seq: u64) -> bool {
        match self.notable.load(Ordering::SeqCst) {
            0 => true,
            after => (after - 1).saturating_add(self.ring as u64) <= seq,
        }
    }

    #[inline]
    fn bucket(&self, stripe: usize, index: usize) -> &AtomicU64 {
        let line = &self.buckets[stripe * self.lines_per_stripe + index / BUCKETS_PER_LINE];
        &line.0[index % BUCKETS_PER_LINE]
    }

    fn tally(&self, now: Duration) -> Tally {
        let (seq, index) = self.locate(now);
        self.tally_at(seq, index)
    }

    fn tally_at(&self, seq: u64, mut index: usize) -> Tally {
        let n = self.ring;
        let mut tally = Tally::default();
        // Backwards from the newest: no division per bucket.
        for age in 0..(n as u64).min(seq + 1) {
            let expected = seq - age;
            for stripe in 0..=self.stripe_mask {
                let (calls, failures) = read(self.bucket(stripe, index), expected);
                tally.calls = tally.calls.saturating_add(calls);
                tally.failures = tally.failures.saturating_add(failures);
            }
            if let Some(slow) = &self.slow {
                tally.slow = tally.slow.saturating_add(read(&slow[index], expected).0);
            }
            index = index.checked_sub(1).unwrap_or(n - 1);
        }
        tally
    }

    fn reset(&self) {
        let slow = self.slow.iter().flat_map(|slow| slow.iter());
        let striped = self.buckets.iter().flat_map(|line| line.0.iter());
        for bucket in striped.chain(slow) {
            bucket.store(0, Ordering::Release);
        }
    }
}
#[cfg(test)]
impl CountWindow {
    /// The results the ring holds now: (failures, slow), for the tests to
    /// compare with the counts.
    fn ring_counts(&self) -> (u32, u32) {
        let mut counts = (0, 0);
        for position in 0..self.size {
            let word = self.results[(position / RESULTS_PER_WORD) as usize].load(Ordering::Acquire);
            let bits = word >> ((position % RESULTS_PER_WORD) * RESULT_BITS);
            counts.0 += (bits & FAILED != 0) as u32;
            counts.1 += (bits & SLOW != 0) as u32;
        }
        counts
    }
}

#[cfg(test)]
#[cfg(not(breaker_loom))]
mod tests {
    use super::*;

    fn counts(calls: u32, failures: u32, slow: u32) -> Tally {
        Tally {
            calls,
            failures,
            slow,
        }
    }

    #[test]
    fn count_window_forgets_the_oldest_call() {
        let w = CountWindow::new(3);
        w.record(true, false);
        w.record(true, true);
        assert_eq!(w.record(false, false), counts(3, 2, 1));
        // The first failure leaves the window.
        assert_eq!(w.record(false, false), counts(3, 1, 1));
        // And then the slow one.
        assert_eq!(w.record(false, false), counts(3, 0, 0));
        w.reset();
        assert_eq!(w.tally(), Tally::default());
    }

    /// Once the window is full, a fast success into a window holding no
    /// failure and no slow call takes no position; every other record does,
    /// so a failure still ages out after exactly `size` more records.
    #[test]
    fn a_success_into_a_full_window_of_successes_writes_nothing() {
        let w = CountWindow::new(4);
        let taken = |w: &CountWindow| w.next.load(Ordering::Relaxed);
        for n in 1..=4 {
            w.record(false, false);
            assert_eq!(taken(&w), n, "a window not yet full counts every call");
        }
        for _ in 0..10 {
            assert_eq!(w.record(false, false), counts(4, 0, 0));
        }
        assert_eq!(taken(&w), 4);
        w.record(false, true);
        w.record(true, false);
        assert_eq!(taken(&w), 6);
        for _ in 0..2 {
            w.record(false, false);
        }
        assert_eq!(taken(&w), 8, "a window holding a failure moves on");
        w.record(false, false);
        assert_eq!(w.tally().slow, 0, "the slow call aged out");
        assert_eq!(w.tally().failures, 1);
        w.record(false, false);
        assert_eq!(w.tally().failures, 0, "the failure aged out");
        assert_eq!(taken(&w), 10);
        w.record(false, false);
        assert_eq!(taken(&w), 10);
    }

    #[test]
    fn remainder_by_multiplication_at_the_edges() {
        for d in [1, 2, 3, 7, 32, 100, 65_535, 65_536] {
            let r = Remainder::new(d);
            for a in [0, 1, d - 1, d, d + 1, u64::MAX - 1, u64::MAX, u64::MAX / 2] {
                assert_eq!(r.of(a), a % d, "{a} % {d}");
            }
        }
    }

    /// Concurrent records leave the counts equal to the results the ring
    /// holds: every result was added and removed exactly once, including
    /// when successes skipped the write, and when a removal was counted
    /// before its addition (a saturating count came out too high here).
    #[test]
    fn count_window_counts_agree_with_its_results_after_concurrent_records() {
        let w = CountWindow::new(70);
        std::thread::scope(|scope| {
            for thread in 0..4u64 {
                let w = &w;
                scope.spawn(move || {
                    let mut rng = fastrand::Rng::with_seed(thread);
                    for _ in 0..20_000 {
                        w.record(rng.u8(..4) == 0, rng.u8(..8) == 0);
                    }
                });
            }
        });
        let tally = w.tally();
        assert_eq!(tally.calls, 70);
        assert_eq!((tally.failures, tally.slow), w.ring_counts());
    }

    #[test]
    fn time_window_ages_out_whole_buckets() {
        let w = TimeWindow::new(Duration::from_secs(10), 10, true);
        w.record(true, false, Duration::from_millis(500));
        w.record(false, true, Duration::from_millis(1500));
        assert_eq!(w.tally(Duration::from_millis(9_900)), counts(2, 1, 1));
        // At 10.5 s the bucket of 0–1 s has left the window.
        assert_eq!(w.tally(Duration::from_millis(10_500)), counts(1, 0, 1));
        // A slot reused for a later period starts from zero.
        assert_eq!(
            w.record(true, false, Duration::from_millis(10_600)),
            counts(2, 1, 1)
        );
        assert_eq!(w.tally(Duration::from_secs(100)), Tally::default());
    }

    /// Threads record into stripes of their own (here, as many threads as
    /// stripes, so each has one to itself, and as many again, sharing), and
    /// the tally counts every call of every stripe once.
    #[test]
    fn a_tally_sums_the_stripes_of_every_thread() {
        let w = TimeWindow::new(Duration::from_secs(10), 10, false);
        let threads = 2 * (w.stripe_mask + 1) as u64;
        std::thread::scope(|scope| {
            for thread in 0..threads {
                let w = &w;
                scope.spawn(move || {
                    for call in 0..1_000u64 {
                        let at = Duration::from_millis(thread * 1_000 + call % 1_000);
                        w.record(call % 10 == 0, false, at);
                    }
                });
            }
        });
        let tally = w.tally(Duration::from_millis(threads * 1_000 - 1));
        let live = threads.min(10);
        assert_eq!(
            (tally.calls, tally.failures),
            (live as u32 * 1_000, live as u32 * 100)
        );
        let lines = w.buckets.len();
        assert_eq!(
            lines,
            (w.stripe_mask + 1) * 2,
            "10 buckets take two lines a stripe"
        );
        w.reset();
        assert_eq!(
            w.tally(Duration::from_millis(threads * 1_000 - 1)),
            Tally::default()
        );
    }

    /// Each thread takes a stripe number of its own, and keeps it; no two
    /// stripes of a window share a cache line.
    #[test]
    fn threads_write_stripes_on_lines_of_their_own() {
        let mine = thread_stripe();
        assert_eq!(thread_stripe(), mine);
        let other = std::thread::spawn(thread_stripe).join().unwrap();
        assert_ne!(other, mine);

        let w = TimeWindow {
            buckets: (0..4 * 2)
                .map(|_| Line(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
            ring: 10,
            lines_per_stripe: 2,
            stripe_mask: 3,
            ..TimeWindow::new(Duration::from_secs(10), 10, false)
        };
        let line_of = |stripe, index| w.bucket(stripe, index) as *const AtomicU64 as usize / 64;
        for stripe in 0..4 {
            for index in 0..10 {
                for other in (0..4).filter(|other| *other != stripe) {
                    assert!((0..10).all(|i| line_of(other, i) != line_of(stripe, index)));
                }
            }
        }
    }

    #[test]
    fn a_long_ring_is_not_striped() {
        assert!(stripes_for(STRIPED_UP_TO).is_power_of_two());
        assert!(stripes_for(STRIPED_UP_TO) <= MAX_STRIPES);
        assert_eq!(stripes_for(STRIPED_UP_TO + 1), 1);
        let w = TimeWindow::new(Duration::from_secs(100), 1_000, false);
        assert_eq!((w.stripe_mask, w.buckets.len()), (0, 125));
    }

    /// A success filed with a coarse reading one bucket late, after a
    /// record of the next bucket, is filed in that latest bucket (one
    /// bucket per window: the same slot), rather than wiping its failure
    /// out; its tally sees that bucket, so a success that reaches the
    /// minimum number of calls there can open the breaker.
    #[test]
    fn a_late_record_is_filed_in_the_latest_bucket() {
        let w = TimeWindow::new(Duration::from_secs(1), 1, false);
        w.record(true, false, Duration::from_millis(1_000));
        assert_eq!(
            w.record(false, false, Duration::from_millis(999)),
            counts(2, 1, 0),
            "the tally of the late record sees the latest bucket"
        );
        assert_eq!(w.tally(Duration::from_millis(1_001)), counts(2, 1, 0));
    }

    /// A window's kept period at `seq` (slot 0).
    fn period(seq: u64) -> AtomicU64 {
        AtomicU64::new(seq << PERIOD_INDEX_BITS)
    }

    /// A record of period 5 whose kept period was read before another
    /// record raised it to 6 and wrote period 6 into the slot: it joins
    /// that bucket (the latest period is read again with the slot) rather
    /// than starting the slot afresh at 5 and wiping period 6 out.
    #[test]
    fn a_record_behind_a_bucket_written_since_joins_it() {
        let slot = AtomicU64::new(pack(6, 1, 1));
        assert_eq!(add(&slot, 5, &period(6), 1, 0), Some(6));
        assert_eq!(read(&slot, 6), (2, 1));
    }

    /// A failure of period 5 that joins the bucket of period 6 (written
    /// since its `locate`) is judged at period 6: its tally sees that
    /// bucket and it marks period 6 notable. Judged at 5, it tallied an
    /// empty bucket (the deciding failure did not open) and the successes
    /// after it found the window quiet.
    #[test]
    fn a_record_that_joins_a_later_bucket_is_judged_there() {
        let w = TimeWindow::new(Duration::from_secs(1), 1, false);
        let sixth = Duration::from_millis(6_500);
        w.record(false, false, sixth);
        let tally = w.record_at(5, 0, true, false);
        assert_eq!((tally.calls, tally.failures), (2, 1));
        let tally = w.record(false, false, sixth);
        assert_eq!((tally.calls, tally.failures), (3, 1), "not judged quiet");
    }

    /// A slow call that joins a later bucket is counted slow in that
    /// bucket, with the call.
    #[test]
    fn a_slow_call_that_joins_a_later_bucket_is_slow_there() {
        let w = TimeWindow::new(Duration::from_secs(1), 1, true);
        let sixth = Duration::from_millis(6_500);
        w.record(false, false, sixth);
        let tally = w.record_at(5, 0, false, true);
        assert_eq!((tally.calls, tally.slow), (2, 1));
        assert_eq!(w.tally(sixth).slow, 1);
    }

    /// A full bucket takes nothing more, rather than carrying into the
    /// next field (through the blind `fetch_add` and past it) or counting
    /// failures past its calls.
    #[test]
    fn a_full_bucket_takes_no_more() {
        let slot = AtomicU64::new(pack(5, ADD_BELOW - 1, 0));
        assert_eq!(add(&slot, 5, &period(5), 1, 1), Some(5));
        assert_eq!(read(&slot, 5), (ADD_BELOW as u32, 1));
        slot.store(pack(5, COUNT_MAX, COUNT_MAX), Ordering::Relaxed);
        assert_eq!(add(&slot, 5, &period(5), 1, 1), None);
        assert_eq!(read(&slot, 5), (COUNT_MAX as u32, COUNT_MAX as u32));
        slot.store(pack(5, COUNT_MAX, 7), Ordering::Relaxed);
        assert_eq!(add(&slot, 5, &period(5), 1, 1), None);
        assert_eq!(read(&slot, 5), (COUNT_MAX as u32, 7));
        // A reset bucket is empty whatever a racing add left in it.
        slot.store(0, Ordering::Relaxed);
        slot.fetch_add((1 << COUNT_BITS) | 1, Ordering::Relaxed);
        assert_eq!(read(&slot, 0), (0, 0));
        add(&slot, 0, &period(0), 1, 0);
        assert_eq!(read(&slot, 0), (1, 0));
    }

    /// Sequence numbers wrap after 2^23 periods: a slot untouched for a
    /// little less than that holds a number a little *later* than a new
    /// record's. It is an old bucket, ahead of the latest period the window
    /// has seen, and is started afresh; taken for a later bucket, it hid the
    /// record (read under another number) for up to 2^16 periods.
    #[test]
    fn a_slot_from_before_the_sequence_wrapped_is_started_afresh() {
        let w = TimeWindow::new(Duration::from_millis(8), 8, false);
        let period = |n: u64| Duration::from_micros(n * 1_000 + 500);
        w.record(true, false, period(0));
        // The same slot (a multiple of 8), 2^15 periods short of the cycle.
        let wrapped = (1 << SEQ_BITS) - (1 << 15);
        let tally = w.record(true, false, period(wrapped));
        assert_eq!((tally.calls, tally.failures), (1, 1));
        assert_eq!(w.tally(period(wrapped)).calls, 1);
    }

    /// Two million calls in one bucket, one in ten failing: the window reads
    /// the share of the calls it kept, not failures counted past saturated
    /// calls (which read 19 %).
    #[test]
    fn a_full_time_bucket_keeps_its_failure_share() {
        let w = TimeWindow::new(Duration::from_secs(600), 10, true);
        let now = Duration::from_secs(1);
        for call in 0..2_000_000u32 {
            w.record(call % 10 == 0, call % 10 == 0, now);
        }
        let tally = w.tally(now);
        assert_eq!(tally.calls as u64, COUNT_MAX);
        let share = f64::from(tally.failures) / f64::from(tally.calls);
        assert!((share - 0.1).abs() < 0.001, "failure share {share}");
        assert_eq!(tally.slow, tally.failures, "slow share as kept");
    }

    proptest::proptest! {
        /// The multiplied remainder is the remainder, for every numerator and
        /// every window size.
        #[test]
        fn remainder_by_multiplication_is_exact(a in proptest::num::u64::ANY, d in 1u64..=65_536) {
            proptest::prop_assert_eq!(Remainder::new(d).of(a), a % d);
        }

        /// The lock-free ring agrees with a plain queue of the last `n` results.
        #[test]
        fn count_window_matches_a_queue(
            // Past 32 a window spans several words of results.
            n in 1u32..80,
            results in proptest::collection::vec((proptest::bool::ANY, proptest::bool::ANY), 0..300),
        ) {
            let window = CountWindow::new(n);
            let mut queue = std::collections::VecDeque::new();
            for (failed, slow) in results {
                queue.push_back((failed, slow));
                if queue.len() > n as usize {
                    queue.pop_front();
                }
                let expected = Tally {
                    calls: queue.len() as u32,
                    failures: queue.iter().filter(|(f, _)| *f).count() as u32,
                    slow: queue.iter().filter(|(_, s)| *s).count() as u32,
                };
                proptest::prop_assert_eq!(window.record(failed, slow), expected);
            }
        }

        /// The bucketed time window agrees with a list of timestamped results
        /// filtered to the buckets still inside the window.
        #[test]
        fn time_window_matches_a_list(
            steps in proptest::collection::vec(
                (0u64..1_500, proptest::bool::ANY, proptest::bool::ANY),
                0..80,
            ),
        ) {
            let window = TimeWindow::new(Duration::from_secs(10), 10, true);
            let mut now = 0u64;
            let mut all: Vec<(u64, bool, bool)> = Vec::new();
            for (advance_ms, failed, slow) in steps {
                now += advance_ms;
                all.push((now / 1_000, failed, slow));
                let bucket = now / 1_000;
                let live: Vec<_> = all.iter().filter(|(b, _, _)| bucket - b < 10).collect();
                let expected = Tally {
                    calls: live.len() as u32,
                    failures: live.iter().filter(|(_, f, _)| *f).count() as u32,
                    slow: live.iter().filter(|(_, _, s)| *s).count() as u32,
                };
                let recorded = window.record(failed, slow, Duration::from_millis(now));
                proptest::prop_assert_eq!(window.tally(Duration::from_millis(now)), expected);
                // A success in a window with no failure and no slow call
                // cannot open the breaker and skips the tally; every other
                // record returns it.
                let quiet = !failed && !slow && expected.failures == 0 && expected.slow == 0;
                if recorded != expected {
                    proptest::prop_assert!(quiet && recorded == Tally::default());
                }
            }
        }
    }
}

/// Loom models of the windows' lock-free records (run with the crate's
/// loom model, see `tests/loom.rs`): every interleaving of the records.
#[cfg(all(test, breaker_loom))]
mod loom_models {
    use loom::sync::Arc;
    use loom::thread;

    use super::*;

    /// Two records racing into a window of two that holds one failure: a
    /// slow failure and a success, the first taking the failure's position.
    /// Whichever thread swaps first, the counts end equal to the ring's.
    #[test]
    fn loom_racing_records_leave_the_counts_equal_to_the_ring() {
        loom::model(|| {
            let w = Arc::new(CountWindow::new(2));
            w.record(true, false);
            let failing = {
                let w = w.clone();
                thread::spawn(move || {
                    w.record(true, true);
                })
            };
            w.record(false, false);
            failing.join().unwrap();
            let tally = w.tally();
            assert_eq!(tally.calls, 2);
            assert_eq!((tally.failures, tally.slow), w.ring_counts());
        });
    }

    /// A success that finds the window full of successes writes nothing;
    /// racing a failure, the failure is counted either way.
    #[test]
    fn loom_a_success_skipping_its_write_never_hides_a_failure() {
        loom::model(|| {
            let w = Arc::new(CountWindow::new(2));
            w.record(false, false);
            w.record(false, false);
            let failing = {
                let w = w.clone();
                thread::spawn(move || w.record(true, false))
            };
            w.record(false, false);
            let failed = failing.join().unwrap();
            assert_eq!(failed.failures, 1, "the failure's own tally");
            assert_eq!(w.tally().failures, 1);
            assert_eq!(w.ring_counts(), (1, 0));
        });
    }
}
