//! How long to wait before each retry: a plain `Iterator<Item = Duration>`.
//!
//! A [`Backoff`] is a small `Copy` description (growth, initial delay,
//! multiplier, cap, jitter); [`Backoff::iter`] turns it into the sequence of
//! sleeps, one per retry. Because the sequence is just an iterator it can be
//! tested alone, without a service or a clock:
//!
//! ```
//! use std::time::Duration;
//! use tower_retry_budget::backoff::{Backoff, Jitter};
//!
//! // Start at 1 s, double, cap at 60 s.
//! let backoff = Backoff::exponential(Duration::from_secs(1)).with_jitter(Jitter::None);
//! let secs: Vec<u64> = backoff.iter().take(8).map(|d| d.as_secs()).collect();
//! assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60]);
//! ```
//!
//! # The cap comes before jitter
//!
//! `max_delay` caps the computed delay, *then* jitter is applied: with
//! `[0.5, 1.5)` jitter a sleep may reach 1.5 × `max_delay`, with the other
//! kinds never more than `max_delay`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use tower_classify::ConfigError;

/// How the un-jittered delay grows from one retry to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackoffKind {
    /// No wait at all: retry at once.
    None,
    /// Always `initial_delay`.
    Fixed,
    /// `initial_delay × n` before the n-th retry.
    Linear,
    /// `initial_delay × multiplier^(n-1)` before the n-th retry.
    Exponential,
}

impl BackoffKind {
    /// The configuration name: `none`, `fixed`, `linear`, `exponential`.
    pub const fn as_str(self) -> &'static str {
        match self {
            BackoffKind::None => "none",
            BackoffKind::Fixed => "fixed",
            BackoffKind::Linear => "linear",
            BackoffKind::Exponential => "exponential",
        }
    }
}

impl FromStr for BackoffKind {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let kinds = [Self::None, Self::Fixed, Self::Linear, Self::Exponential];
        kinds.into_iter().find(|kind| kind.as_str() == s).ok_or_else(|| {
            ConfigError::new(
                "kind",
                format!("unknown backoff `{s}`; expected `none`, `fixed`, `linear` or `exponential`"),
            )
        })
    }
}

impl fmt::Display for BackoffKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Randomness added to each (already capped) delay `d`, so that clients that
/// failed together do not retry together.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub enum Jitter {
    /// Exactly `d`.
    None,
    /// Uniform in `[0, d]` (the default: AWS's "full jitter").
    #[default]
    Full,
    /// Uniform in `[d/2, d]`.
    Equal,
    /// Uniform in `[initial_delay, 3 × previous sleep]`, capped at `max_delay`.
    Decorrelated,
    /// Uniform in `[low × d, high × d)`: `{ low: 0.5, high: 1.5 }` is ±50 %
    /// around the computed delay, `{ low: 0.5, high: 1.0 }` is 50–100 % of
    /// it (a sleep never exceeds it).
    Proportional {
        /// The smallest factor.
        low: f64,
        /// The largest factor (exclusive).
        high: f64,
    },
}

impl Jitter {
    /// Checks the factors of a proportional jitter: finite, `0 ≤ low ≤ high ≤ 10`.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if let Jitter::Proportional { low, high } = *self {
            if !(low.is_finite() && high.is_finite() && 0.0 <= low && low <= high && high <= 10.0) {
                return Err(ConfigError::new(
                    "jitter",
                    format!("factors {low}..{high} must satisfy 0 <= low <= high <= 10"),
                ));
            }
        }
        Ok(())
    }
}

/// `none`, `full`, `equal`, `decorrelated`, or `LOW..HIGH` for a proportional
/// jitter (`0.5..1.5`, `0.5..1`).
impl FromStr for Jitter {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let jitter = match s {
            "none" => Jitter::None,
            "full" => Jitter::Full,
            "equal" => Jitter::Equal,
            "decorrelated" => Jitter::Decorrelated,
            other => {
                let parsed = other.split_once("..").and_then(|(low, high)| {
                    Some((low.trim().parse().ok()?, high.trim().parse().ok()?))
                });
                match parsed {
                    Some((low, high)) => Jitter::Proportional { low, high },
                    None => {
                        return Err(ConfigError::new(
                            "jitter",
                            format!(
                                "unknown jitter `{other}`; expected `none`, `full`, `equal`, \
                                 `decorrelated` or factors such as `0.5..1.5`"
                            ),
                        ))
                    }
                }
            }
        };
        jitter.validate()?;
        Ok(jitter)
    }
}

impl fmt::Display for Jitter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Jitter::None => f.write_str("none"),
            Jitter::Full => f.write_str("full"),
            Jitter::Equal => f.write_str("equal"),
            Jitter::Decorrelated => f.write_str("decorrelated"),
            Jitter::Proportional { low, high } => write!(f, "{low}..{high}"),
        }
    }
}

/// A backoff policy: growth, initial delay, multiplier, cap and jitter.
///
/// | setting | default |
/// |---|---|
/// | kind | exponential |
/// | `initial_delay` | 1 s |
/// | `multiplier` | 2 (Google's HTTP default 1.25 is `with_multiplier(1.25)`) |
/// | `max_delay` | 60 s, applied before jitter |
/// | jitter | [`Jitter::Full`] |
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    kind: BackoffKind,
    initial_delay: Duration,
    multiplier: f64,
    max_delay: Duration,
    jitter: Jitter,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::exponential(Duration::from_secs(1))
    }
}

impl Backoff {
    /// Retry at once, without waiting.
    pub const fn none() -> Self {
        Self::new(BackoffKind::None, Duration::ZERO).with_jitter(Jitter::None)
    }

    /// Wait `delay` before every retry (then jitter).
    pub const fn fixed(delay: Duration) -> Self {
        Self::new(BackoffKind::Fixed, delay)
    }

    /// Wait `initial_delay × n` before the n-th retry.
    pub const fn linear(initial_delay: Duration) -> Self {
        Self::new(BackoffKind::Linear, initial_delay)
    }

    /// Wait `initial_delay × multiplier^(n-1)` before the n-th retry.
    pub const fn exponential(initial_delay: Duration) -> Self {
        Self::new(BackoffKind::Exponential, initial_delay)
    }

    /// A backoff of `kind` starting at `initial_delay`.
    pub const fn new(kind: BackoffKind, initial_delay: Duration) -> Self {
        Backoff {
            kind,
            initial_delay,
            multiplier: 2.0,
            max_delay: Duration::from_secs(60),
            jitter: Jitter::Full,
        }
    }

    /// The growth factor of an exponential backoff (default 2, at least 1).
    pub const fn with_multiplier(mut self, multiplier: f64) -> Self {
        self.multiplier = multiplier;
        self
    }

    /// The cap on the computed delay, applied before jitter (default 60 s).
    pub const fn with_max_delay(mut self, max_delay: Duration) -> Self {
        self.max_delay = max_delay;
        self
    }

    /// The jitter (default [`Jitter::Full`]).
    pub const fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The growth.
    pub const fn kind(&self) -> BackoffKind {
        self.kind
    }

    /// The first delay.
    pub const fn initial_delay(&self) -> Duration {
        self.initial_delay
    }

    /// The exponential growth factor.
    pub const fn multiplier(&self) -> f64 {
        self.multiplier
    }

    /// The cap applied before jitter.
    pub const fn max_delay(&self) -> Duration {
        self.max_delay
    }

    /// The jitter.
    pub const fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// Checks the settings; errors name the field (`multiplier`, `jitter`).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if !(self.multiplier.is_finite() && self.multiplier >= 1.0) {
            return Err(ConfigError::new(
                "multiplier",
                format!("{} must be a finite number of at least 1", self.multiplier),
            ));
        }
        self.jitter.validate()
    }

    /// The computed delay before retry `n` (1-based), capped, without jitter.
    ///
    /// Never panics and never overflows: a delay too large for a `Duration`
    /// is `max_delay`.
    pub fn delay(&self, n: u32) -> Duration {
        let factor = match self.kind {
            BackoffKind::None => return Duration::ZERO,
            BackoffKind::Fixed => 1.0,
            BackoffKind::Linear => f64::from(n.max(1)),
            // Past 2^16 retries every multiplier ≥ 1 has long hit any cap;
            // clamping keeps `powi` in range.
            BackoffKind::Exponential => self
                .multiplier
                .powi(n.saturating_sub(1).min(u32::from(u16::MAX)) as i32),
        };
        let secs = self.initial_delay.as_secs_f64() * factor;
        // NaN and infinity are not `Less` either: both become the cap.
        if secs.partial_cmp(&self.max_delay.as_secs_f64()) != Some(std::cmp::Ordering::Less) {
            return self.max_delay;
        }
        Duration::try_from_secs_f64(secs).unwrap_or(self.max_delay)
    }

    /// The sleeps, one per retry, jittered with a randomly seeded generator.
    pub fn iter(&self) -> BackoffIter {
        self.iter_with_rng(fastrand::Rng::new())
    }

    /// The same sequence for a fixed `seed`, for reproducible tests.
    pub fn iter_seeded(&self, seed: u64) -> BackoffIter {
        self.iter_with_rng(fastrand::Rng::with_seed(seed))
    }

    fn iter_with_rng(&self, rng: fastrand::Rng) -> BackoffIter {
        BackoffIter {
            backoff: *self,
            retry: 0,
            previous: self.initial_delay,
            rng,
        }
    }
}

/// The infinite sequence of sleeps of a [`Backoff`]; see [`Backoff::iter`].
#[derive(Debug, Clone)]
pub struct BackoffIter {
    backoff: Backoff,
    retry: u32,
    previous: Duration,
    rng: fastrand::Rng,
}

impl Iterator for BackoffIter {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.retry = self.retry.saturating_add(1);
        let b = &self.backoff;
        if b.kind == BackoffKind::None {
            return Some(Duration::ZERO);
        }
        let delay = b.delay(self.retry);
        let jittered = match b.jitter {
            Jitter::None => delay,
            Jitter::Full => delay.mul_f64(self.rng.f64()),
            Jitter::Equal => delay / 2 + (delay / 2).mul_f64(self.rng.f64()),
            Jitter::Decorrelated => {
                let low = b.initial_delay.min(b.max_delay);
                let high = self.previous.saturating_mul(3).min(b.max_delay).max(low);
                let next = low + (high - low).mul_f64(self.rng.f64());
                self.previous = next;
                next
            }
            Jitter::Proportional { low, high } => {
                let factor = low + (high - low) * self.rng.f64();
                scale(delay, factor)
            }
        };
        Some(jittered)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::MAX, None)
    }
}

/// `d × factor`, saturating instead of panicking.
fn scale(d: Duration, factor: f64) -> Duration {
    let secs = d.as_secs_f64() * factor;
    Duration::try_from_secs_f64(secs).unwrap_or(if secs > 0.0 {
        Duration::MAX
    } else {
        Duration::ZERO
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn exponential_doubles_and_caps_before_jitter() {
        let b = Backoff::exponential(S(1)).with_jitter(Jitter::None);
        let got: Vec<Duration> = b.iter().take(9).collect();
        assert_eq!(
            got,
            [1, 2, 4, 8, 16, 32, 60, 60, 60].map(S),
            "doubling from 1 s, capped at 60 s"
        );
    }

    #[test]
    fn googles_multiplier_1_25_is_expressible() {
        let b = Backoff::exponential(S(1))
            .with_multiplier(1.25)
            .with_jitter(Jitter::None);
        let got: Vec<u128> = b.iter().take(5).map(|d| d.as_millis()).collect();
        assert_eq!(got, [1000, 1250, 1562, 1953, 2441]);
    }

    #[test]
    fn fixed_linear_and_none() {
        let fixed: Vec<_> = Backoff::fixed(S(3))
            .with_jitter(Jitter::None)
            .iter()
            .take(3)
            .collect();
        assert_eq!(fixed, [S(3), S(3), S(3)]);
        let linear: Vec<_> = Backoff::linear(S(2))
            .with_max_delay(S(7))
            .with_jitter(Jitter::None)
            .iter()
            .take(5)
            .collect();
        assert_eq!(linear, [S(2), S(4), S(6), S(7), S(7)]);
        let none: Vec<_> = Backoff::none().iter().take(3).collect();
        assert_eq!(none, [Duration::ZERO; 3]);
    }

    #[test]
    fn absurd_growth_saturates_at_the_cap() {
        let b = Backoff::exponential(Duration::MAX)
            .with_multiplier(1e300)
            .with_max_delay(S(5))
            .with_jitter(Jitter::None);
        assert_eq!(b.delay(u32::MAX), S(5));
        assert_eq!(b.iter().nth(100), Some(S(5)));
    }

    #[test]
    fn invalid_settings_name_the_field() {
        let err = Backoff::exponential(S(1))
            .with_multiplier(0.5)
            .validate()
            .unwrap_err();
        assert_eq!(err.field(), "multiplier");
        let err = Backoff::exponential(S(1))
            .with_multiplier(f64::NAN)
            .validate()
            .unwrap_err();
        assert_eq!(err.field(), "multiplier");
        assert_eq!("2..1".parse::<Jitter>().unwrap_err().field(), "jitter");
        assert_eq!("sometimes".parse::<Jitter>().unwrap_err().field(), "jitter");
    }

    #[test]
    fn kind_names_round_trip() {
        use BackoffKind::{Exponential, Fixed, Linear};
        for kind in [BackoffKind::None, Fixed, Linear, Exponential] {
            assert_eq!(kind.as_str().parse::<BackoffKind>().unwrap(), kind);
        }
        assert_eq!("Linear".parse::<BackoffKind>().unwrap_err().field(), "kind");
        assert_eq!("".parse::<BackoffKind>().unwrap_err().field(), "kind");
    }

    #[test]
    fn jitter_names_round_trip() {
        for j in [
            Jitter::None,
            Jitter::Full,
            Jitter::Equal,
            Jitter::Decorrelated,
            Jitter::Proportional {
                low: 0.5,
                high: 1.5,
            },
            Jitter::Proportional {
                low: 0.5,
                high: 1.0,
            },
        ] {
            assert_eq!(j.to_string().parse::<Jitter>().unwrap(), j);
        }
        assert_eq!(
            "0.5..1.5".parse::<Jitter>().unwrap(),
            Jitter::Proportional {
                low: 0.5,
                high: 1.5
            }
        );
    }

    /// Checks every sleep of `jitter` against `[low, high]` bounds computed
    /// from the un-jittered delay `d` of the same retry.
    fn check_bounds(jitter: Jitter, seed: u64, bounds: impl Fn(Duration) -> (Duration, Duration)) {
        let b = Backoff::exponential(Duration::from_millis(100))
            .with_max_delay(S(2))
            .with_jitter(jitter);
        for (n, sleep) in b.iter_seeded(seed).take(20).enumerate() {
            let d = b.delay(n as u32 + 1);
            let (low, high) = bounds(d);
            // 1 ns of slack either side for float rounding.
            let (low, high) = (
                low.saturating_sub(Duration::from_nanos(1)),
                high + Duration::from_nanos(1),
            );
            assert!(
                low <= sleep && sleep <= high,
                "{jitter}: retry {} slept {sleep:?}, outside [{low:?}, {high:?}] of {d:?}",
                n + 1
            );
        }
    }

    proptest! {
        #[test]
        fn full_jitter_is_within_zero_and_d(seed: u64) {
            check_bounds(Jitter::Full, seed, |d| (Duration::ZERO, d));
        }

        #[test]
        fn equal_jitter_is_within_half_and_d(seed: u64) {
            check_bounds(Jitter::Equal, seed, |d| (d / 2, d));
        }

        #[test]
        fn half_to_one_and_a_half(seed: u64) {
            check_bounds(Jitter::Proportional { low: 0.5, high: 1.5 }, seed, |d| (d / 2, d.mul_f64(1.5)));
        }

        #[test]
        fn fifty_to_hundred_percent(seed: u64) {
            check_bounds(Jitter::Proportional { low: 0.5, high: 1.0 }, seed, |d| (d / 2, d));
        }

        #[test]
        fn no_jitter_is_exact(seed: u64) {
            check_bounds(Jitter::None, seed, |d| (d, d));
        }

        #[test]
        fn decorrelated_stays_between_base_and_three_times_previous(seed: u64) {
            let b = Backoff::exponential(Duration::from_millis(100))
                .with_max_delay(S(2))
                .with_jitter(Jitter::Decorrelated);
            let mut previous = Duration::from_millis(100);
            for sleep in b.iter_seeded(seed).take(30) {
                prop_assert!(sleep >= Duration::from_millis(100));
                prop_assert!(sleep <= S(2));
                prop_assert!(sleep <= previous * 3);
                previous = sleep;
            }
        }

        #[test]
        fn delay_never_panics(initial in 0u64..u64::MAX, m in 1.0f64..1e6, n: u32, cap in 0u64..u64::MAX) {
            let b = Backoff::exponential(Duration::from_nanos(initial))
                .with_multiplier(m)
                .with_max_delay(Duration::from_nanos(cap));
            prop_assert!(b.delay(n) <= Duration::from_nanos(cap));
            let _ = b.iter_seeded(1).take(3).count();
        }
    }
}
