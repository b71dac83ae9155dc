//! A6's retry throttling: a token count per server that failures spend and
//! successes refill; retries stop while it is at or below half.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use tower::retry::budget::Budget;
use tower_classify::ConfigError;

use super::RetryThrottlingConfig;

/// Tokens are counted in thousandths: A6 keeps three decimals of
/// `tokenRatio`, so every count is a whole number of thousandths and no
/// rounding ever accumulates.
const MILLI: u64 = 1000;

/// The retry throttling of [gRFC A6] ("Throttling Retry Attempts and
/// Hedged RPCs"), for one server.
///
/// - The token count starts at `maxTokens` and stays in `[0, maxTokens]`.
/// - `record_failure` takes one token: call it for
///   an attempt that failed with a retryable (or non-fatal) status, or with
///   a pushback that said not to retry. Other failures (`INVALID_ARGUMENT`,
///   ...) say nothing about the server's load and are not recorded.
/// - `record_success` adds `tokenRatio`.
/// - `allows_retry` is `true` only while the count is
///   *greater than* `maxTokens / 2`: at exactly half, retries and hedges
///   stop until successes lift it above.
///
/// Lock-free (one `AtomicU64`) and meant to be shared through an `Arc` by
/// the retry layers of every method of the server. It is also a tower
/// [`Budget`]: [`withdraw`](Budget::withdraw) asks
/// `allows_retry` without spending anything and
/// [`deposit`](Budget::deposit) does nothing, because the counting is done
/// by [`GrpcRetryClassifier::with_throttle`](super::GrpcRetryClassifier::with_throttle),
/// which sees each attempt's status.
///
/// A6's own example (10 tokens, 0.1 per success: four failures leave 6
/// and allow retries, a fifth leaves 5 and stops them, one success lifts it
/// to 5.1 and allows them again) is this type's first unit test.
///
/// [gRFC A6]: https://github.com/grpc/proposal/blob/master/A6-client-retries.md
pub struct RetryThrottle {
    milli_tokens: AtomicU64,
    max_milli_tokens: u64,
    ratio_milli_tokens: u64,
}

impl RetryThrottle {
    /// A full throttle of `max_tokens` (1–1000) refilled by `token_ratio`
    /// per success (more than 0; decimals past the third are cut, as A6
    /// says: 0.5466 is 0.546). Errors name the service config field.
    pub fn new(max_tokens: u32, token_ratio: f64) -> Result<Self, ConfigError> {
        if !(1..=1000).contains(&max_tokens) {
            return Err(ConfigError::new(
                "maxTokens",
                format!("{max_tokens} must be in (0, 1000]"),
            ));
        }
        // `floor` of a product in floating point can land a thousandth
        // low (0.29 × 1000 = 289.99…); a ratio read from JSON goes through
        // `from_config`, whose thousandths were cut from its digits.
        let thousandths = (token_ratio * MILLI as f64 + 1e-9).floor();
        if !(token_ratio.is_finite() && thousandths >= 1.0) {
            return Err(ConfigError::new(
                "tokenRatio",
                format!("{token_ratio} must be at least 0.001"),
            ));
        }
        Ok(Self::with_milli(
            max_tokens,
            thousandths.min(1_000_000.0) as u64,
        ))
    }

    /// A full throttle for a validated `retryThrottling` section.
    pub(crate) fn from_config(config: &RetryThrottlingConfig) -> Self {
        Self::with_milli(
            config.max_tokens(),
            u64::from(config.token_ratio_thousandths()),
        )
    }

    fn with_milli(max_tokens: u32, ratio_milli_tokens: u64) -> Self {
        let max_milli_tokens = u64::from(max_tokens) * MILLI;
        RetryThrottle {
            milli_tokens: AtomicU64::new(max_milli_tokens),
            max_milli_tokens,
            ratio_milli_tokens,
        }
    }

    /// One successful attempt: adds `tokenRatio`, at most up to `maxTokens`.
    pub(crate) fn record_success(&self) {
        let (ratio, max) = (self.ratio_milli_tokens, self.max_milli_tokens);
        // The closure always returns `Some`, so the update cannot fail.
        let _ = self
            .milli_tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tokens| {
                Some(tokens.saturating_add(ratio).min(max))
            });
    }

    /// One failed attempt that counts (see the type's docs): takes one
    /// token, never below zero.
    pub(crate) fn record_failure(&self) {
        let _ = self
            .milli_tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tokens| {
                Some(tokens.saturating_sub(MILLI))
            });
    }

    /// `true` while the token count is greater than `maxTokens / 2`.
    pub(crate) fn allows_retry(&self) -> bool {
        // tokens > max / 2, without the division's rounding.
        self.milli_tokens.load(Ordering::Acquire) * 2 > self.max_milli_tokens
    }

    /// The token count.
    pub fn tokens(&self) -> f64 {
        self.milli_tokens() as f64 / MILLI as f64
    }

    /// The token count in thousandths, exact.
    pub(crate) fn milli_tokens(&self) -> u64 {
        self.milli_tokens.load(Ordering::Acquire)
    }

    /// `maxTokens`.
    pub(crate) fn max_tokens(&self) -> u32 {
        (self.max_milli_tokens / MILLI) as u32
    }

    /// `tokenRatio` in thousandths, as kept.
    #[cfg(test)]
    pub(crate) fn token_ratio_thousandths(&self) -> u64 {
        self.ratio_milli_tokens
    }
}

impl fmt::Debug for RetryThrottle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryThrottle")
            .field("tokens", &self.tokens())
            .field("max_tokens", &self.max_tokens())
            .field(
                "token_ratio",
                &(self.ratio_milli_tokens as f64 / MILLI as f64),
            )
            .finish()
    }
}

/// The gate of a retry layer: see the type's docs for why neither method
/// counts anything.
impl Budget for RetryThrottle {
    fn deposit(&self) {}

    fn withdraw(&self) -> bool {
        self.allows_retry()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn starts_full_and_retries_only_above_half() {
        let throttle = RetryThrottle::new(10, 0.1).unwrap();
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
        // maxTokens 3: threshold 1.5; 2 allows, 1.5 does not, 1.501 does.
        let throttle = RetryThrottle::new(3, 0.001).unwrap();
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
    fn never_leaves_zero_to_max() {
        let throttle = RetryThrottle::new(2, 0.5).unwrap();
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
    fn the_ratio_is_cut_to_three_decimals() {
        assert_eq!(
            RetryThrottle::new(10, 0.5466)
                .unwrap()
                .token_ratio_thousandths(),
            546
        );
        assert_eq!(
            RetryThrottle::new(10, 0.29)
                .unwrap()
                .token_ratio_thousandths(),
            290
        );
        assert_eq!(
            RetryThrottle::new(10, 0.0009).unwrap_err().field(),
            "tokenRatio"
        );
        assert_eq!(
            RetryThrottle::new(10, f64::NAN).unwrap_err().field(),
            "tokenRatio"
        );
        assert_eq!(RetryThrottle::new(0, 0.1).unwrap_err().field(), "maxTokens");
        assert_eq!(
            RetryThrottle::new(1001, 0.1).unwrap_err().field(),
            "maxTokens"
        );
    }

    #[test]
    fn as_a_budget_it_only_asks() {
        let throttle = RetryThrottle::new(10, 0.1).unwrap();
        assert!(throttle.withdraw());
        throttle.deposit();
        assert_eq!(throttle.milli_tokens(), 10_000, "neither call counts");
    }

    #[test]
    fn two_threads_lose_no_update_and_stay_in_bounds() {
        // Failures only, from two threads: 2 × 300 from 1000 tokens must
        // leave exactly 400 (a lost update would leave more).
        let throttle = Arc::new(RetryThrottle::new(1000, 1.0).unwrap());
        let spend = |throttle: Arc<RetryThrottle>| {
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
        // checks every value it sees is within [0, maxTokens].
        let throttle = Arc::new(RetryThrottle::new(10, 0.7).unwrap());
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
            assert!(tokens <= 10_000, "{tokens} above maxTokens");
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
