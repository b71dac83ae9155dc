//! gRPC's retry throttling (gRFC A6): a token bucket that throttles at half.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use tower::retry::budget::Budget;
use tower_classify::ConfigError;

/// Tokens are kept in thousandths, A6's precision for `tokenRatio`: every
/// count is a whole number of thousandths and no rounding accumulates.
const MILLI: u64 = 1000;

/// The retry throttling of [gRFC A6] ("Throttling Retry Attempts and Hedged
/// RPCs"): a bucket of `max_tokens` that starts full and stays in
/// `[0, max_tokens]`; a success adds `token_ratio`, a failure takes one
/// token, and a retry (or hedge) is allowed only while *more than* half the
/// bucket is left: at exactly half, retries stop until successes lift it.
///
/// Lock-free (one `AtomicU64`); share it through an `Arc`. It counts in one
/// of two ways:
///
/// - as any retry layer's [`budget`](crate::RetryBuilder::budget), it is a
///   tower [`Budget`]: the layer deposits once per request and withdraws
///   before each retry, so under a full outage every request costs
///   `1 − token_ratio` tokens and retries stop once the bucket is half
///   empty; they resume after `max_tokens / (2 × token_ratio)` requests'
///   worth of deposits. (gRPC credits successful calls rather than all
///   calls; the layer credits every request, which throttles slightly later
///   under partial failure.)
/// - as a gRPC service config's throttle (feature `grpc-service-config`,
///   `ServiceConfig::retry_throttle`), the config's classifier counts each
///   attempt as A6 does and the layers only ask it before each retry or
///   hedge. Give such a bucket to those layers only, one per server.
///
/// ```
/// use tower_retry_budget::budget::{Budget, TokenBucketBudget};
///
/// let budget = TokenBucketBudget::new(10, 0.1).unwrap();
/// // Full bucket: 10 tokens; a retry is allowed while more than 5 remain.
/// let retries = (0..10).filter(|_| budget.withdraw()).count();
/// assert_eq!(retries, 4);
/// ```
///
/// [gRFC A6]: https://github.com/grpc/proposal/blob/master/A6-client-retries.md
pub struct TokenBucketBudget {
    tokens: AtomicU64,
    max: u64,
    ratio: u64,
}

impl TokenBucketBudget {
    /// A full bucket of `max_tokens` (1–1000) refilled by `token_ratio`
    /// (0.001–1000; digits past the third decimal are dropped, as A6 says)
    /// per deposit. Errors name the field.
    pub fn new(max_tokens: u32, token_ratio: f64) -> Result<Self, ConfigError> {
        if !(1..=1000).contains(&max_tokens) {
            return Err(ConfigError::new(
                "max_tokens",
                format!("{max_tokens} must be between 1 and 1000"),
            ));
        }
        let ratio = thousandths(token_ratio);
        if !(1..=1_000_000).contains(&ratio) {
            return Err(ConfigError::new(
                "token_ratio",
                format!("{token_ratio} must be between 0.001 and 1000"),
            ));
        }
        Ok(Self::with_thousandths(max_tokens, ratio))
    }

    /// A full bucket whose ratio is already in thousandths (a validated
    /// service config's `retryThrottling`).
    pub(crate) fn with_thousandths(max_tokens: u32, ratio: u64) -> Self {
        let max = u64::from(max_tokens) * MILLI;
        TokenBucketBudget {
            tokens: AtomicU64::new(max),
            max,
            ratio,
        }
    }

    /// The tokens left.
    pub fn tokens(&self) -> f64 {
        self.milli_tokens() as f64 / MILLI as f64
    }

    /// The tokens left in thousandths, exact.
    pub(crate) fn milli_tokens(&self) -> u64 {
        self.tokens.load(Ordering::Acquire)
    }

    /// One success: adds `token_ratio`, at most up to `max_tokens`.
    pub(crate) fn record_success(&self) {
        // The closure always returns `Some`, so this cannot fail.
        let _ = self
            .tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tokens| {
                Some((tokens + self.ratio).min(self.max))
            });
    }

    /// One failure: takes one token, never below zero; returns the count
    /// before.
    pub(crate) fn record_failure(&self) -> u64 {
        self.tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tokens| {
                Some(tokens.saturating_sub(MILLI))
            })
            .unwrap_or_else(|tokens| tokens)
    }

    /// `true` while the count is greater than `max_tokens / 2`.
    #[cfg(any(test, feature = "grpc-service-config"))]
    pub(crate) fn allows_retry(&self) -> bool {
        // tokens > max / 2, without the division's rounding.
        self.milli_tokens() * 2 > self.max
    }
}

/// `ratio` in thousandths with the digits past the third decimal dropped,
/// as A6 reads a `tokenRatio`; 0 unless `ratio` is a positive number. Cut
/// on the shortest decimal digits that read back as `ratio` (which, for a
/// ratio written with up to 15 significant digits, are the digits written),
/// not in floating point, where `0.29 × 1000` is `289.99…`.
pub(crate) fn thousandths(ratio: f64) -> u64 {
    if !(ratio.is_finite() && ratio > 0.0) {
        return 0;
    }
    // `Display` writes those digits, and never an exponent.
    let text = ratio.to_string();
    let (whole, fraction) = text.split_once('.').unwrap_or((&text, ""));
    let fraction = fraction.bytes().chain(std::iter::repeat(b'0')).take(3);
    whole.bytes().chain(fraction).fold(0, |value: u64, digit| {
        value
            .saturating_mul(10)
            .saturating_add(u64::from(digit - b'0'))
    })
}

impl Budget for TokenBucketBudget {
    fn deposit(&self) {
        self.record_success();
    }

    fn withdraw(&self) -> bool {
        // A6: decrement, then throttle when the count is at or below half.
        self.record_failure().saturating_sub(MILLI) * 2 > self.max
    }
}

impl fmt::Debug for TokenBucketBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenBucketBudget")
            .field("tokens", &self.tokens())
            .field("max_tokens", &(self.max / MILLI))
            .field("token_ratio", &(self.ratio as f64 / MILLI as f64))
            .finish()
    }
}

/// A bucket the classifier counts, as a layer's budget: it only asks (see
/// [`TokenBucketBudget`]'s second way of counting).
#[cfg(feature = "grpc-service-config")]
#[derive(Debug)]
pub(crate) struct AskOnly(pub(crate) std::sync::Arc<TokenBucketBudget>);

#[cfg(feature = "grpc-service-config")]
impl Budget for AskOnly {
    fn deposit(&self) {}

    fn withdraw(&self) -> bool {
        self.0.allows_retry()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn the_ratio_is_cut_to_three_decimals_as_a6_says() {
        let ratio = |r: f64| TokenBucketBudget::new(10, r).unwrap().ratio;
        assert_eq!(ratio(0.5466), 546);
        assert_eq!(ratio(0.29), 290);
        assert_eq!(ratio(0.1), 100);
        // Cut on its digits: 0.000999… is 0, not a floating-point 0.001.
        assert_eq!(thousandths(0.0009999999999), 0);
        for refused in [
            0.0009,
            0.0009999999999,
            0.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            1000.001,
        ] {
            let error = TokenBucketBudget::new(10, refused).unwrap_err();
            assert_eq!(error.field(), "token_ratio", "{refused}");
        }
        assert_eq!(
            TokenBucketBudget::new(0, 0.1).unwrap_err().field(),
            "max_tokens"
        );
    }

    #[test]
    fn throttles_at_half_and_recovers_by_ratio() {
        let budget = TokenBucketBudget::new(10, 0.5).unwrap();
        // 10 → 9, 8, 7, 6 allowed (> 5); 5 is not.
        let allowed: Vec<bool> = (0..5).map(|_| budget.withdraw()).collect();
        assert_eq!(allowed, [true, true, true, true, false]);
        assert_eq!(budget.tokens(), 5.0);
        // Two deposits of 0.5 bring it to 6: one more withdrawal leaves 5, refused.
        budget.deposit();
        budget.deposit();
        assert!(!budget.withdraw());
        for _ in 0..4 {
            budget.deposit();
        }
        assert!(budget.withdraw(), "7 → 6 is above half");
    }

    #[test]
    fn counted_by_status_it_starts_full_and_retries_only_above_half() {
        let throttle = TokenBucketBudget::new(10, 0.1).unwrap();
        assert_eq!(throttle.milli_tokens(), 10_000);
        // 10 → 6: every count above 5 allows a retry.
        for expected in [9_000, 8_000, 7_000, 6_000] {
            throttle.record_failure();
            assert_eq!(throttle.milli_tokens(), expected);
            assert!(throttle.allows_retry(), "{expected} > 5000");
        }
        // Exactly half is "less than or equal to the threshold": no retry.
        throttle.record_failure();
        assert_eq!(throttle.milli_tokens(), 5_000);
        assert!(!throttle.allows_retry());
        // Retries resume as soon as a success lifts it over the threshold.
        throttle.record_success();
        assert_eq!(throttle.milli_tokens(), 5_100);
        assert!(throttle.allows_retry());
    }

    #[test]
    fn an_odd_maximum_has_a_fractional_threshold() {
        // max_tokens 3: threshold 1.5; 2 allows, 1.5 does not, 1.501 does.
        let throttle = TokenBucketBudget::new(3, 0.001).unwrap();
        throttle.record_failure();
        assert!(throttle.allows_retry(), "2 > 1.5");
        throttle.record_failure();
        assert!(!throttle.allows_retry(), "1 <= 1.5");
        for _ in 0..500 {
            throttle.record_success();
        }
        assert_eq!(throttle.milli_tokens(), 1_500);
        assert!(!throttle.allows_retry(), "1.5 <= 1.5");
        throttle.record_success();
        assert!(throttle.allows_retry(), "1.501 > 1.5");
    }

    #[test]
    fn never_exceeds_max_nor_goes_below_zero() {
        let budget = TokenBucketBudget::new(3, 1.0).unwrap();
        for _ in 0..10 {
            budget.deposit();
        }
        assert_eq!(budget.tokens(), 3.0);
        for _ in 0..10 {
            budget.withdraw();
        }
        assert_eq!(budget.tokens(), 0.0);
        let throttle = TokenBucketBudget::new(2, 0.5).unwrap();
        for _ in 0..10 {
            throttle.record_failure();
        }
        assert_eq!(throttle.milli_tokens(), 0);
        for _ in 0..10 {
            throttle.record_success();
        }
        assert_eq!(throttle.milli_tokens(), 2_000);
    }

    #[test]
    fn invalid_settings_name_the_field() {
        assert_eq!(
            TokenBucketBudget::new(0, 0.1).unwrap_err().field(),
            "max_tokens"
        );
        assert_eq!(
            TokenBucketBudget::new(1001, 0.1).unwrap_err().field(),
            "max_tokens"
        );
        assert_eq!(
            TokenBucketBudget::new(10, 0.0).unwrap_err().field(),
            "token_ratio"
        );
        assert_eq!(
            TokenBucketBudget::new(10, f64::INFINITY)
                .unwrap_err()
                .field(),
            "token_ratio"
        );
        assert_eq!(
            TokenBucketBudget::new(10, f64::NAN).unwrap_err().field(),
            "token_ratio"
        );
    }

    #[cfg(feature = "grpc-service-config")]
    #[test]
    fn asked_only_it_counts_nothing() {
        let throttle = Arc::new(TokenBucketBudget::new(10, 0.1).unwrap());
        let gate = AskOnly(Arc::clone(&throttle));
        assert!(gate.withdraw());
        gate.deposit();
        assert_eq!(throttle.milli_tokens(), 10_000, "neither call counts");
        for _ in 0..5 {
            throttle.record_failure();
        }
        assert!(!gate.withdraw(), "at half");
    }

    #[test]
    fn two_threads_lose_no_update_and_stay_in_bounds() {
        // Failures only, from two threads: 2 × 300 from 1000 tokens must
        // leave exactly 400 (a lost update would leave more).
        let throttle = Arc::new(TokenBucketBudget::new(1000, 1.0).unwrap());
        let spend = |throttle: Arc<TokenBucketBudget>| {
            std::thread::spawn(move || {
                for _ in 0..300 {
                    throttle.record_failure();
                }
            })
        };
        let (a, b) = (spend(Arc::clone(&throttle)), spend(Arc::clone(&throttle)));
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(throttle.milli_tokens(), 400_000);

        // Failures and successes racing, each far past a bound; an observer
        // checks every value it sees is within [0, max_tokens].
        let throttle = Arc::new(TokenBucketBudget::new(10, 0.7).unwrap());
        let failures = {
            let throttle = Arc::clone(&throttle);
            std::thread::spawn(move || {
                for _ in 0..20_000 {
                    throttle.record_failure();
                }
            })
        };
        let successes = {
            let throttle = Arc::clone(&throttle);
            std::thread::spawn(move || {
                for _ in 0..20_000 {
                    throttle.record_success();
                }
            })
        };
        while !(failures.is_finished() && successes.is_finished()) {
            let tokens = throttle.milli_tokens();
            assert!(tokens <= 10_000, "{tokens} above max_tokens");
        }
        failures.join().unwrap();
        successes.join().unwrap();
        assert!(throttle.milli_tokens() <= 10_000);
        // A final burst each way reaches each bound exactly.
        for _ in 0..20 {
            throttle.record_failure();
        }
        assert_eq!(throttle.milli_tokens(), 0);
        for _ in 0..20 {
            throttle.record_success();
        }
        assert_eq!(throttle.milli_tokens(), 10_000);
    }
}
