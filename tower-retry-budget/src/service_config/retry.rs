//! From a service config's retry policy to a [`RetryBuilder`].
//!
//! [`MethodConfig::retry_builder`] gives a builder for `http::Request`s (a tonic `Channel`'s requests, with
//! their body made replayable by [`ReplayBodyLayer`](crate::body::ReplayBodyLayer))
//! that follows [gRFC A6]:
//!
//! | A6 | the builder |
//! |---|---|
//! | `maxAttempts` attempts in all, at most 5 | [`max_retries`](RetryBuilder::max_retries) `maxAttempts − 1` |
//! | the n-th retry after `min(initialBackoff × backoffMultiplier^(n-1), maxBackoff) × random(0.8, 1.2)` | [`Backoff::exponential`] capped at `maxBackoff` before jitter, with a jitter of `[0.8, 1.2)` |
//! | only `retryableStatusCodes` are retried | [`GrpcRetryClassifier`] |
//! | a pushback of `n` ms: retry after exactly `n` ms; negative or unreadable: do not retry | the classifier's hint, which replaces the computed backoff |
//! | after a pushback, the backoff starts again at `initialBackoff` | [`restart_backoff_after_hint(true)`](RetryBuilder::restart_backoff_after_hint) |
//! | every gRPC call is a POST, and the policy, not the method, says what is retried | [`HttpReplay::retry_non_idempotent(true)`](HttpReplay::retry_non_idempotent) |
//! | retries carry `grpc-previous-rpc-attempts` | [`HttpReplay::attempt_header`](HttpReplay::attempt_header) |
//! | `timeout` bounds the whole call, every attempt included | [`deadline`](RetryBuilder::deadline) ([`MethodConfig::retry_builder`]) |
//! | `retryThrottling` | a shared [`TokenBucketBudget`]: the classifier counts into it, and the layer asks it before each retry ([`MethodConfig::retry_builder`]) |
//! | no retry policy: no retries | one attempt ([`MethodConfig::retry_builder`]) |
//!
//! Where this differs from A6:
//!
//! - A `backoffMultiplier` below 1 (A6 allows any value above 0, so delays
//!   that shrink) is refused by the conversion, not by the parser: this
//!   crate's [`Backoff`] only grows.
//! - Without `retryThrottling` A6 does not throttle; the builder then keeps
//!   this crate's default retry budget (a [`TpsBudget`](crate::budget::TpsBudget)),
//!   which only bounds retry storms. Call
//!   [`no_budget`](RetryBuilder::no_budget) for A6's behaviour exactly.
//! - A method with a hedging policy gets a single attempt from
//!   `retry_builder`: build its [`HedgeLayer`](crate::hedge::HedgeLayer)
//!   with [`MethodConfig::hedge_builder`].
//! - A6's jitter was `random(0, backoff)` until its 2024 revision; that is
//!   [`Jitter::Full`].
//!
//! [gRFC A6]: https://github.com/grpc/proposal/blob/master/A6-client-retries.md

use std::sync::Arc;

use http::HeaderName;
use tower_classify::ConfigError;

use super::{GrpcRetryClassifier, MethodConfig, RetryPolicyConfig, StatusCodes};
use crate::backoff::{Backoff, Jitter};
use crate::budget::token_bucket::AskOnly;
use crate::budget::TokenBucketBudget;
use crate::layer::RetryBuilder;
use crate::replay::HttpReplay;

/// How gRPC requests are copied: every call is a POST, and the policy, not
/// the method, says what is sent again; each copy carries the attempts
/// before it (A6 "Exposed Retry Metadata").
pub(crate) fn grpc_replay() -> HttpReplay {
    HttpReplay::new()
        .retry_non_idempotent(true)
        .attempt_header(HeaderName::from_static("grpc-previous-rpc-attempts"))
}

/// A6's jitter: each delay multiplied by a random factor in `[0.8, 1.2)`.
pub(crate) const A6_JITTER: Jitter = Jitter::Proportional {
    low: 0.8,
    high: 1.2,
};

impl RetryPolicyConfig {
    /// The policy's backoff: exponential from `initialBackoff` by
    /// `backoffMultiplier`, capped at `maxBackoff`, then A6's jitter, `[0.8, 1.2)`.
    ///
    /// Refuses a `backoffMultiplier` below 1 (see the [module docs](self)).
    pub(crate) fn backoff(&self) -> Result<Backoff, ConfigError> {
        if self.backoff_multiplier < 1.0 {
            return Err(ConfigError::new(
                "backoffMultiplier",
                format!(
                    "{} is valid in A6 but below 1, and this retry layer's backoff never shrinks",
                    self.backoff_multiplier
                ),
            ));
        }
        Ok(Backoff::exponential(self.initial_backoff)
            .with_multiplier(self.backoff_multiplier)
            .with_max_delay(self.max_backoff)
            .with_jitter(A6_JITTER))
    }
}

impl MethodConfig {
    /// A builder for the calls this method config applies to: its retry
    /// policy (see the [module docs](self)) or, without one, a single
    /// attempt; its `timeout` as the deadline of the whole call; and
    /// `throttle`, the server's [`TokenBucketBudget`] from
    /// [`ServiceConfig::retry_throttle`](super::ServiceConfig::retry_throttle),
    /// counted by the classifier and asked before each retry.
    ///
    /// Errors name the field (`retryPolicy.backoffMultiplier`).
    ///
    /// ```
    /// use tower_retry_budget::service_config::ServiceConfig;
    ///
    /// let config = ServiceConfig::from_json(r#"{ "methodConfig": [{
    ///     "name": [{ "service": "pkg.Svc" }],
    ///     "retryPolicy": { "maxAttempts": 10, "initialBackoff": "0.1s", "maxBackoff": "1s",
    ///                      "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"] }
    /// }]}"#).unwrap();
    /// let method = config.method_config("/pkg.Svc/Get").unwrap();
    /// // 10 attempts are capped to 5: 4 retries.
    /// let layer = method.retry_builder(None).unwrap().build().unwrap();
    /// ```
    pub fn retry_builder(
        &self,
        throttle: Option<&Arc<TokenBucketBudget>>,
    ) -> Result<RetryBuilder<GrpcRetryClassifier, HttpReplay>, ConfigError> {
        let policy = self.retry_policy();
        let codes = policy.map_or(StatusCodes::EMPTY, |policy| policy.retryable_status_codes);
        let classifier = GrpcRetryClassifier::new(codes).with_throttle(throttle);
        let mut builder = RetryBuilder::new(classifier, grpc_replay())
            .max_retries(policy.map_or(1, |policy| policy.max_attempts) - 1)
            .restart_backoff_after_hint(true);
        if let Some(policy) = policy {
            builder = builder.backoff(policy.backoff().map_err(|err| err.within("retryPolicy"))?);
        }
        if let Some(timeout) = self.timeout {
            builder = builder.deadline(timeout);
        }
        if let Some(throttle) = throttle {
            builder = builder.budget(Arc::new(AskOnly(Arc::clone(throttle))));
        }
        Ok(builder)
    }
}
