//! A gRPC-style budget: a token bucket that throttles below half.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use tower::retry::budget::Budget;
use tower_classify::ConfigError;

/// Tokens are kept in thousandths, gRPC's precision for `token_ratio`.
const MILLI: u64 = 1000;

/// gRPC's retry throttling ([gRFC A6]): a bucket of `max_tokens` that starts
/// full; every deposit adds `token_ratio`, every withdrawal takes one token,
/// and a retry is allowed only while more than half the bucket is left.
///
/// The retry layer deposits once per request and withdraws before each retry,
/// so under a full outage every request costs `1 − token_ratio` tokens and
/// retries stop once the bucket is half empty; they resume after
/// `max_tokens / (2 × token_ratio)` requests' worth of deposits. (gRPC credits
/// successful calls rather than all calls; with a single `Budget` trait for
/// both budgets, the layer credits every request, which throttles slightly
/// later under partial failure.)
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
    /// A bucket of `max_tokens` (1–1000) refilled by `token_ratio` (0.001–1000,
    /// kept to three decimals) per deposit. Errors name the field.
    pub fn new(max_tokens: u32, token_ratio: f64) -> Result<Self, ConfigError> {
        if !(1..=1000).contains(&max_tokens) {
            return Err(ConfigError::new(
                "max_tokens",
                format!("{max_tokens} must be between 1 and 1000"),
            ));
        }
        let ratio = (token_ratio * MILLI as f64).round();
        if !(token_ratio.is_finite() && (1.0..=1_000_000.0).contains(&ratio)) {
            return Err(ConfigError::new(
                "token_ratio",
                format!("{token_ratio} must be between 0.001 and 1000"),
            ));
        }
        let max = u64::from(max_tokens) * MILLI;
        Ok(TokenBucketBudget {
            tokens: AtomicU64::new(max),
            max,
            ratio: ratio as u64,
        })
    }

    /// The tokens left.
    pub fn tokens(&self) -> f64 {
        self.tokens.load(Ordering::Acquire) as f64 / MILLI as f64
    }
}

impl Budget for TokenBucketBudget {
    fn deposit(&self) {
        // The closure always returns `Some`, so this cannot fail.
        let _ = self
            .tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tokens| {
                Some((tokens + self.ratio).min(self.max))
            });
    }

    fn withdraw(&self) -> bool {
        let before = self
            .tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tokens| {
                Some(tokens.saturating_sub(MILLI))
            })
            .unwrap_or_else(|tokens| tokens);
        // gRPC: decrement, then throttle when the count is at or below half.
        before.saturating_sub(MILLI) * 2 > self.max
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

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn invalid_settings_name_the_field() {
        assert_eq!(
            TokenBucketBudget::new(0, 0.1).unwrap_err().field(),
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
    }
}
