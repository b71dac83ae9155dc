//! From a service config's hedging policy to a [`HedgeBuilder`].
//!
//! [`MethodConfig::hedge_builder`] gives a builder for `http::Request`s that follows [gRFC A6]'s hedging:
//!
//! | A6 | the builder |
//! |---|---|
//! | `maxAttempts` in flight, at most 5 | [`max_attempts`](HedgeBuilder::max_attempts) |
//! | attempt `n` sent `hedgingDelay × (n − 1)` after the first; 0 sends them all at once | a fixed [`delay`](HedgeBuilder::delay) |
//! | a `nonFatalStatusCodes` answer lets the other attempts go on; any other answer is the call's, and the rest are cancelled | [`GrpcRetryClassifier`] over those codes |
//! | hedges carry `grpc-previous-rpc-attempts` | [`HttpReplay::attempt_header`](HttpReplay::attempt_header) |
//! | `retryThrottling` stops hedges at or below half its tokens | the shared [`TokenBucketBudget`] ([`MethodConfig::hedge_builder`]) |
//!
//! Where this differs from A6:
//!
//! - A6 sends the next hedge at once after a non-fatal answer. This layer
//!   sends none after any failure answer (the attempts in flight go on):
//!   hedging is for slowness, and a server that fails fast is not made to
//!   fail faster. A retry layer above retries failures, with its backoff.
//! - A6 limits hedges only by retry throttling. With a throttle
//!   ([`MethodConfig::hedge_builder`] given one) the builder has no budget
//!   of its own, as A6 says; without one it keeps the layer's default
//!   extra-load budget (5 %), so that a config sending every attempt at
//!   once is not five times the load, unbounded. Call
//!   [`no_budget`](HedgeBuilder::no_budget) for A6's behaviour exactly.
//! - A `hedgingDelay` above 1 hour is read as 1 hour (the layer's limit):
//!   the call has ended long before either would send a hedge.
//! - The builder does not apply the method config's `timeout` (the hedge
//!   layer has no deadline of its own); [`ServiceConfigLayer`](super::ServiceConfigLayer)
//!   does, or put a timeout (or a
//!   [`Deadline`](tower_classify::deadline::Deadline)) around the layer.
//!
//! [gRFC A6]: https://github.com/grpc/proposal/blob/master/A6-client-retries.md

use std::sync::Arc;

use super::retry::grpc_replay;
use super::{GrpcRetryClassifier, MethodConfig};
use crate::budget::token_bucket::AskOnly;
use crate::budget::TokenBucketBudget;
use crate::hedge::layer::MAX_DELAY;
use crate::hedge::HedgeBuilder;
use crate::replay::HttpReplay;

impl MethodConfig {
    /// A hedging builder for the calls this method config applies to, when
    /// it has a hedging policy (`None` otherwise: use
    /// [`retry_builder`](Self::retry_builder)); `throttle`, the server's
    /// [`TokenBucketBudget`], is counted by the classifier and asked before
    /// each hedge, and then replaces the layer's own budget, as in A6.
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
    /// let method = config.method_config("/pkg.Svc/Get").unwrap();
    /// let layer = method.hedge_builder(None).unwrap().build().unwrap();
    /// assert_eq!(layer.current_delay(), Some(Duration::from_millis(50)));
    /// ```
    pub fn hedge_builder(
        &self,
        throttle: Option<&Arc<TokenBucketBudget>>,
    ) -> Option<HedgeBuilder<GrpcRetryClassifier, HttpReplay>> {
        let policy = self.hedging_policy()?;
        let classifier =
            GrpcRetryClassifier::new(policy.non_fatal_status_codes).with_throttle(throttle);
        let builder = HedgeBuilder::new(classifier, grpc_replay())
            .max_attempts(policy.max_attempts)
            .delay(policy.hedging_delay.min(MAX_DELAY));
        Some(match throttle {
            Some(throttle) => builder
                .no_budget()
                .shared_budget(Arc::new(AskOnly(Arc::clone(throttle)))),
            None => builder,
        })
    }
}
