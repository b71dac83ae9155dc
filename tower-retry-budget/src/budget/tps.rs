//! A Finagle-style budget: retries as a percentage of recent requests.

use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tower::retry::budget::Budget;
use tower_classify::{CoarseClock, ConfigError};

/// The ring of committed windows: ten full windows of `ttl / 10` plus the one
/// being written, so the budget always sees between `ttl` and `ttl + ttl/10`
/// of history.
const SLOTS: usize = 11;
const WINDOWS_PER_TTL: u32 = 10;

/// What one retry costs, in budget units: a deposit is `retry_percent × UNIT`,
/// so a percentage keeps six decimals (tower issue 857).
const UNIT: i64 = 1_000_000;

/// Finagle's retry budget: retries may add `retry_percent` of the requests
/// deposited in the last `ttl`, plus `min_per_sec` retries per second.
///
/// Every deposit counts for `ttl` to `ttl + ttl/10` (the windows are a tenth
/// of the ttl, as tower's are), whatever the traffic, busy or idle.
///
/// Unlike tower's `TpsBudget` it has no fractional-percent truncation: 0.6
/// allows 60 retries per 100 requests, not 100. And it takes no lock: a
/// deposit is one relaxed atomic add filed by a [`CoarseClock`] reading,
/// which may lag by its tick (10 ms) or more, so a deposit that close to a
/// window's start may count for that much less than `ttl`. Withdrawals read
/// the clock itself; under paused tokio time (tests) deposits do too.
/// Concurrent withdrawals may take the balance briefly negative by at most
/// the number of callers racing, as tower's may.
///
/// ```
/// use std::time::Duration;
/// use tower_retry_budget::budget::{Budget, TpsBudget};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let budget = TpsBudget::new(Duration::from_secs(10), 0, 0.6).unwrap();
/// for _ in 0..100 {
///     budget.deposit();
/// }
/// let retries = (0..100).filter(|_| budget.withdraw()).count();
/// assert_eq!(retries, 60);
/// # }
/// ```
pub struct TpsBudget {
    start: Instant,
    /// What deposits file by (nanoseconds after `start`).
    clock: CoarseClock,
    window_nanos: u64,
    /// The window index the writer currently accumulates.
    generation: AtomicU64,
    /// Nanoseconds after `start` when that window ends: a deposit before it
    /// needs no rotation, and one comparison tells.
    window_end: AtomicU64,
    /// Deposits since the last rotation, counted one by one.
    deposits: AtomicI64,
    /// Budget units withdrawn since the last rotation.
    withdrawn: AtomicI64,
    slots: [AtomicI64; SLOTS],
    reserve: i64,
    deposit_amount: i64,
    ttl: Duration,
    min_per_sec: u32,
    retry_percent: f64,
}

impl TpsBudget {
    /// A budget over `ttl` (1–60 s) allowing `retry_percent` (0–1000, where
    /// 0.2 is 20 %) of deposited requests as retries, plus `min_per_sec`
    /// retries per second whatever the traffic. Errors name the field.
    pub fn new(ttl: Duration, min_per_sec: u32, retry_percent: f64) -> Result<Self, ConfigError> {
        if ttl < Duration::from_secs(1) || ttl > Duration::from_secs(60) {
            return Err(ConfigError::new(
                "ttl",
                format!("{ttl:?} must be between 1s and 60s"),
            ));
        }
        if !(retry_percent.is_finite() && (0.0..=1000.0).contains(&retry_percent)) {
            return Err(ConfigError::new(
                "retry_percent",
                format!("{retry_percent} must be between 0 and 1000 (0.2 is 20 %)"),
            ));
        }
        let reserve = (f64::from(min_per_sec) * ttl.as_secs_f64() * UNIT as f64) as i64;
        let window = ttl / WINDOWS_PER_TTL;
        let window_nanos = window.as_nanos() as u64;
        let start = Instant::now();
        Ok(TpsBudget {
            start,
            // A tenth of a window at the finest: the clock's slower rate.
            clock: CoarseClock::new(start, window / 10),
            window_nanos,
            generation: AtomicU64::new(0),
            window_end: AtomicU64::new(window_nanos),
            deposits: AtomicI64::new(0),
            withdrawn: AtomicI64::new(0),
            slots: Default::default(),
            reserve,
            deposit_amount: (retry_percent * UNIT as f64).round() as i64,
            ttl,
            min_per_sec,
            retry_percent,
        })
    }

    /// The retries that could be withdrawn now (fractional).
    pub fn available(&self) -> f64 {
        self.rotate();
        self.balance() as f64 / UNIT as f64
    }

    fn elapsed_nanos(&self) -> u64 {
        let elapsed = CoarseClock::precise_now().saturating_duration_since(self.start);
        // u64 nanoseconds last 584 years.
        u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
    }

    /// Moves the deposits and withdrawals since the last rotation into the
    /// ring when a window has passed.
    /// Exactly one caller wins the compare-and-swap and rotates; the others go
    /// on writing into the uncommitted counters, which is at worst attributed to the
    /// neighbouring window.
    #[inline]
    fn rotate(&self) {
        self.rotate_at(self.elapsed_nanos());
    }

    /// [`rotate`](Self::rotate) as of `elapsed` nanoseconds after `start`.
    #[inline]
    fn rotate_at(&self, elapsed: u64) {
        if elapsed < self.window_end.load(Ordering::Acquire) {
            return;
        }
        self.rotate_to(elapsed / self.window_nanos);
    }

    #[cold]
    fn rotate_to(&self, now: u64) {
        let Ok(seen) = advance(&self.generation, now) else {
            return;
        };
        self.window_end.store(
            now.saturating_add(1).saturating_mul(self.window_nanos),
            Ordering::Release,
        );
        let committed = self
            .deposits
            .swap(0, Ordering::AcqRel)
            .saturating_mul(self.deposit_amount)
            .saturating_sub(self.withdrawn.swap(0, Ordering::AcqRel));
        let passed = now - seen;
        if passed < SLOTS as u64 {
            self.slots[(seen % SLOTS as u64) as usize].store(committed, Ordering::Release);
            for generation in seen + 1..=now {
                self.slots[(generation % SLOTS as u64) as usize].store(0, Ordering::Release);
            }
        } else {
            for slot in &self.slots {
                slot.store(0, Ordering::Release);
            }
        }
    }

    /// The deposits and withdrawals since the last rotation, in units.
    fn uncommitted(&self) -> i64 {
        self.deposits
            .load(Ordering::Acquire)
            .saturating_mul(self.deposit_amount)
            .saturating_sub(self.withdrawn.load(Ordering::Acquire))
    }

    fn balance(&self) -> i64 {
        self.slots
            .iter()
            .map(|slot| slot.load(Ordering::Acquire))
            .fold(self.uncommitted(), i64::saturating_add)
            .saturating_add(self.reserve)
    }
}

/// Moves `generation` forward to `to` unless it is there already: `Ok`
/// with the generation it left, for the one caller that moved it; else
/// `Err` with the generation found (`to` or later).
pub(crate) fn advance(generation: &AtomicU64, to: u64) -> Result<u64, u64> {
    let mut seen = generation.load(Ordering::Acquire);
    while seen < to {
        match generation.compare_exchange_weak(seen, to, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Ok(seen),
            Err(actual) => seen = actual,
        }
    }
    Err(seen)
}

impl Budget for TpsBudget {
    /// Adds one request's share: the coarse clock's reading, a comparison
    /// with the window's end, and one relaxed add.
    fn deposit(&self) {
        let elapsed = match self.clock.offset() {
            Some(elapsed) => elapsed,
            None => self.elapsed_nanos(),
        };
        // Before adding, so that this deposit goes to the window of now.
        self.rotate_at(elapsed);
        // Relaxed: a count, read with the others by the rotation's swaps.
        self.deposits.fetch_add(1, Ordering::Relaxed);
    }

    fn withdraw(&self) -> bool {
        self.rotate();
        if self.balance() >= UNIT {
            self.withdrawn.fetch_add(UNIT, Ordering::AcqRel);
            true
        } else {
            false
        }
    }
}

impl TpsBudget {
    /// Gives back one withdrawal that was not used (a hedge the budget
    /// allowed but another gate then refused). Crediting the current window
    /// is exact while the withdrawal is in it, and at worst lets the
    /// withdrawal expire early: never more retries than the rule allows.
    pub(crate) fn refund(&self) {
        self.withdrawn.fetch_sub(UNIT, Ordering::AcqRel);
    }
}

impl Default for TpsBudget {
    /// Finagle's and tower's: 10 s ttl, 10 retries per second, 20 %.
    fn default() -> Self {
        TpsBudget::new(Duration::from_secs(10), 10, 0.2).expect("valid defaults")
    }
}

impl fmt::Debug for TpsBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TpsBudget")
            .field("ttl", &self.ttl)
            .field("min_per_sec", &self.min_per_sec)
            .field("retry_percent", &self.retry_percent)
            .field("balance", &(self.balance() as f64 / UNIT as f64))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time;

    fn withdrawals(budget: &impl Budget, max: usize) -> usize {
        (0..max).take_while(|_| budget.withdraw()).count()
    }

    #[tokio::test(start_paused = true)]
    async fn fractional_percent_is_honoured_not_truncated() {
        for (percent, expected) in [(0.6, 600), (0.006, 6), (1.5, 1500), (0.2, 200), (0.0, 0)] {
            let ours = TpsBudget::new(Duration::from_secs(10), 0, percent).unwrap();
            for _ in 0..1000 {
                ours.deposit();
            }
            assert_eq!(withdrawals(&ours, 5000), expected, "percent {percent}");
        }
    }

    /// The same experiment against tower's `TpsBudget` shows issue 857: 0.6
    /// behaves as 1.0 there.
    #[tokio::test(start_paused = true)]
    async fn towers_budget_truncates_where_ours_does_not() {
        let towers = tower::retry::budget::TpsBudget::new(Duration::from_secs(10), 0, 0.6);
        let ours = TpsBudget::new(Duration::from_secs(10), 0, 0.6).unwrap();
        for _ in 0..1000 {
            towers.deposit();
            ours.deposit();
        }
        assert_eq!(withdrawals(&towers, 5000), 1000);
        assert_eq!(withdrawals(&ours, 5000), 600);
    }

    #[tokio::test(start_paused = true)]
    async fn floor_allows_min_per_sec_times_ttl() {
        let budget = TpsBudget::new(Duration::from_secs(2), 5, 0.2).unwrap();
        assert_eq!(withdrawals(&budget, 100), 10);
        // Withdrawals are paid back once they leave the window.
        time::advance(Duration::from_millis(2300)).await;
        assert_eq!(withdrawals(&budget, 100), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn deposits_expire_after_ttl() {
        let budget = TpsBudget::new(Duration::from_secs(1), 0, 1.0).unwrap();
        budget.deposit();
        budget.deposit();
        time::advance(Duration::from_millis(900)).await;
        assert!(budget.withdraw(), "900 ms later the deposits still count");
        time::advance(Duration::from_millis(1200)).await;
        assert!(!budget.withdraw(), "past the ttl they are gone");
        budget.deposit();
        time::advance(Duration::from_secs(30)).await;
        assert!(!budget.withdraw(), "a long gap clears every slot");
    }

    #[tokio::test(start_paused = true)]
    async fn item_3_deposits_after_a_gap_count_in_their_own_window() {
        // 40 deposits at t = 0; 2 ttl later 10 more. Finagle's rule allows
        // 10 retries: the 10 count in full, the 40 not at all.
        let budget = TpsBudget::new(Duration::from_secs(1), 0, 1.0).unwrap();
        for _ in 0..40 {
            budget.deposit();
        }
        time::advance(Duration::from_secs(2)).await;
        for _ in 0..10 {
            budget.deposit();
        }
        assert_eq!(withdrawals(&budget, 100), 10);
        // A quiet budget: each deposit in its own window.
        let quiet = TpsBudget::new(Duration::from_secs(1), 0, 1.0).unwrap();
        for _ in 0..10 {
            quiet.deposit();
            time::advance(Duration::from_millis(300)).await;
        }
        // At 3 s, a deposit counts for 1 to 1.1 s (its 100 ms window and
        // the 10 after): those of 2.1, 2.4 and 2.7 s, each in its own window.
        assert_eq!(withdrawals(&quiet, 100), 3);
    }

    /// Issue 31, item 3: a budget idle past its ttl, then 100 deposits over
    /// 0.8 s, allows exactly 20 % of them. Deposits made before the idle
    /// spell, whatever their count, neither hide the new ones in an expired
    /// window nor count themselves.
    #[tokio::test(start_paused = true)]
    async fn item_3_deposits_after_an_idle_spell_all_count() {
        for before in [0, 1, 3, 40, 63, 100, 1000] {
            let budget = TpsBudget::new(Duration::from_secs(10), 0, 0.2).unwrap();
            for _ in 0..before {
                budget.deposit();
            }
            time::advance(Duration::from_secs(30)).await;
            for _ in 0..100 {
                budget.deposit();
                time::advance(Duration::from_millis(8)).await;
            }
            assert_eq!(withdrawals(&budget, 1000), 20, "{before} deposits before");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_steady_stream_gets_exactly_finagles_share() {
        // 100 requests per 100 ms window for 3 s, 50 %: the last ttl (1 s)
        // holds 1,000 deposits, 500 retries.
        let budget = TpsBudget::new(Duration::from_secs(1), 0, 0.5).unwrap();
        for _ in 0..30 {
            for _ in 0..100 {
                budget.deposit();
            }
            time::advance(Duration::from_millis(100)).await;
        }
        let retries = (0..2_000).filter(|_| budget.withdraw()).count();
        assert_eq!(retries, 500);
    }

    // tower's own `TpsBudget` tests (tower/src/retry/budget/tps_budget.rs),
    // against this budget.

    #[test]
    fn tps_empty() {
        let budget = TpsBudget::new(Duration::from_secs(1), 0, 1.0).unwrap();
        assert!(!budget.withdraw());
    }

    #[tokio::test(start_paused = true)]
    async fn tps_leaky() {
        let budget = TpsBudget::new(Duration::from_secs(1), 0, 1.0).unwrap();
        budget.deposit();
        time::advance(Duration::from_secs(3)).await;
        assert!(!budget.withdraw());
    }

    #[tokio::test(start_paused = true)]
    async fn tps_slots() {
        let budget = TpsBudget::new(Duration::from_secs(1), 0, 0.5).unwrap();
        budget.deposit();
        budget.deposit();
        time::advance(Duration::from_millis(901)).await;
        assert!(budget.withdraw(), "900 ms later the deposits still count");

        time::advance(Duration::from_millis(2001)).await;
        budget.deposit();
        time::advance(Duration::from_millis(301)).await;
        budget.deposit();
        time::advance(Duration::from_millis(801)).await;
        budget.deposit();
        assert!(
            budget.withdraw(),
            "the first deposit expired; the second and third make one retry"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn tps_reserve() {
        let budget = TpsBudget::new(Duration::from_secs(1), 5, 1.0).unwrap();
        assert_eq!(withdrawals(&budget, 10), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn item_8_every_deposit_counts_for_one_ttl_whatever_the_gaps() {
        // One deposit a second, each worth a whole retry, over a 5 s ttl
        // (windows of 500 ms, so a deposit counts for 5 to 5.5 s): 600 ms
        // after each deposit, exactly the last five count.
        let budget = TpsBudget::new(Duration::from_secs(5), 0, 1.0).unwrap();
        for second in 0..20 {
            budget.deposit();
            time::advance(Duration::from_millis(600)).await;
            let expected = (second + 1).min(5) as f64;
            assert!(
                (budget.available() - expected).abs() < 1e-9,
                "after {second} s: {} available, {expected} expected",
                budget.available()
            );
            time::advance(Duration::from_millis(400)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn item_8_budgets_do_not_share_their_accounting() {
        // Deposits into one budget must not change when another is rotated.
        let quiet = TpsBudget::new(Duration::from_secs(1), 0, 1.0).unwrap();
        let busy = TpsBudget::new(Duration::from_secs(1), 0, 1.0).unwrap();
        for _ in 0..7 {
            busy.deposit();
        }
        time::advance(Duration::from_millis(500)).await;
        quiet.deposit();
        time::advance(Duration::from_millis(700)).await;
        assert!(quiet.withdraw(), "its deposit is 700 ms old");
        assert!(!busy.withdraw(), "its deposits are 1.2 s old");
    }

    #[test]
    fn invalid_settings_name_the_field() {
        let ttl = TpsBudget::new(Duration::from_millis(500), 1, 0.2).unwrap_err();
        assert_eq!(ttl.field(), "ttl");
        let pct = TpsBudget::new(Duration::from_secs(10), 1, -0.1).unwrap_err();
        assert_eq!(pct.field(), "retry_percent");
        let nan = TpsBudget::new(Duration::from_secs(10), 1, f64::NAN).unwrap_err();
        assert_eq!(nan.field(), "retry_percent");
    }

    #[test]
    fn concurrent_use_loses_no_deposit() {
        let budget = std::sync::Arc::new(TpsBudget::new(Duration::from_secs(60), 0, 1.0).unwrap());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let budget = budget.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        budget.deposit();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(budget.available().round() as i64, 40_000);
    }
}
