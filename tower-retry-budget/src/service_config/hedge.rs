//! From a service config's hedging policy to a [`HedgeBuilder`].
//!
//! [`HedgingPolicyConfig::hedge_builder`] and [`MethodConfig::hedge_builder`]
//! give a builder for `http::Request`s that follows [gRFC A6]'s hedging:
//!
//! | A6 | the builder |
//! |---|---|
//! | `maxAttempts` in flight, at most 5 | [`max_attempts`](HedgeBuilder::max_attempts) |
//! | attempt `n` sent `hedgingDelay × (n − 1)` after the first; 0 sends them all at once | a fixed [`delay`](HedgeBuilder::delay) |
//! | a `nonFatalStatusCodes` answer lets the other attempts go on; any other answer is the call's, and the rest are cancelled | [`GrpcRetryClassifier`] over those codes |
//! | hedges carry `grpc-previous-rpc-attempts` | [`attempt_header`](HedgeBuilder::attempt_header) |
//! | `retryThrottling` stops hedges at or below half its tokens | the shared [`RetryThrottle`] ([`MethodConfig::hedge_builder`]) |
//!
//! Where this differs from A6:
//!
//! - A6 sends the next hedge at once after a non-fatal answer. This layer
//!   sends none after any failure answer (the attempts in flight go on):
//!   hedging is for slowness, and a server that fails fast is not made to
//!   fail faster. A retry layer above retries failures, with its backoff.
//! - A6 limits hedges only by retry throttling; the builder has no budget of
//!   its own ([`no_budget`](HedgeBuilder::no_budget)).
//!   [`max_extra_load`](HedgeBuilder::max_extra_load) adds one.
//! - The method config's `timeout` is not applied: put a timeout (or a
//!   [`Deadline`](tower_classify::deadline::Deadline)) around the layer.
//!
//! [gRFC A6]: https://github.com/grpc/proposal/blob/master/A6-client-retries.md

use std::sync::Arc;

use http::HeaderName;

use super::retry::GRPC_PREVIOUS_RPC_ATTEMPTS;
use super::{GrpcRetryClassifier, HedgingPolicyConfig, MethodConfig, RetryThrottle};
use crate::hedge::HedgeBuilder;
use crate::replay::HttpReplay;

/// The builder these conversions return.
pub type GrpcHedgeBuilder = HedgeBuilder<GrpcRetryClassifier, HttpReplay>;

impl HedgingPolicyConfig {
    /// A builder with this policy and no throttle; see the
    /// [module docs](self).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_retry_budget::service_config::ServiceConfig;
    ///
    /// let config = ServiceConfig::from_json(r#"{ "methodConfig": [{
    ///     "name": [{ "service": "pkg.Svc" }],
    ///     "hedgingPolicy": { "maxAttempts": 3, "hedgingDelay": "0.05s",
    ///                        "nonFatalStatusCodes": ["UNAVAILABLE"] }
    /// }]}"#).unwrap();
    /// let policy = config.method_configs()[0].hedging_policy().unwrap();
    /// let layer = policy.hedge_builder().build().unwrap();
    /// assert_eq!(layer.max_attempts(), 3);
    /// assert_eq!(layer.current_delay(), Some(Duration::from_millis(50)));
    /// ```
    pub fn hedge_builder(&self) -> GrpcHedgeBuilder {
        HedgeBuilder::new(
            GrpcRetryClassifier::new(self.non_fatal_status_codes()),
            HttpReplay::new(),
        )
        // Every gRPC call is a POST; the policy says what is hedged.
        .hedge_non_idempotent(true)
        .attempt_header(HeaderName::from_static(GRPC_PREVIOUS_RPC_ATTEMPTS))
        .max_attempts(self.max_attempts())
        .delay(self.hedging_delay())
        .no_budget()
    }
}

impl MethodConfig {
    /// A hedging builder for the calls this method config applies to, when
    /// it has a hedging policy (`None` otherwise: use
    /// [`retry_builder`](Self::retry_builder)); `throttle`, the server's
    /// [`RetryThrottle`], is counted by the classifier and asked before
    /// each hedge.
    pub fn hedge_builder(&self, throttle: Option<&Arc<RetryThrottle>>) -> Option<GrpcHedgeBuilder> {
        let policy = self.hedging_policy()?;
        let mut builder = policy.hedge_builder();
        if let Some(throttle) = throttle {
            let classifier = GrpcRetryClassifier::new(policy.non_fatal_status_codes())
                .with_throttle(Arc::clone(throttle));
            builder = builder
                .classifier(classifier)
                .shared_budget(Arc::clone(throttle) as Arc<_>);
        }
        Some(builder)
    }
}
