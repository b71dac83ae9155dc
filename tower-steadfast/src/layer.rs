//! The stack a configuration builds, and the builders of its layers.

use std::time::Duration;

use http::HeaderName;
use tower_breaker::{BreakerHandle, CircuitBreaker, CircuitBreakerLayer, Policy};
use tower_classify::HttpClassifier;
use tower_layer::Layer;
use tower_poison::{DeadLetter, DeadLetterLayer, HttpCapture, PoisonPolicy};
use tower_retry_budget::replay::HttpReplay;
use tower_retry_budget::{Backoff, BackoffKind, Retry, RetryBuilder, RetryLayer};

use crate::config::ResilienceConfig;

/// The service [`ResilienceLayer`] builds around `S`, outermost first:
/// dead letters, circuit breaker, retry.
pub type ResilienceService<S, St> = DeadLetter<
    CircuitBreaker<Retry<S, HttpClassifier, HttpReplay>, HttpClassifier>,
    St,
    HttpClassifier,
    HttpCapture,
>;

/// The whole stack as one [`Layer`] (see [`ResilienceService`]).
///
/// The dead-letter layer stores a call its retries gave up on once, with its
/// attempt count; the breaker counts one failure per call, after its
/// retries. Clones share the breaker, the retry budget, the poison counts
/// and the store; two [`ResilienceConfig::layer`] calls share only the store.
#[derive(Debug, Clone)]
pub struct ResilienceLayer<St> {
    dead_letter: DeadLetterLayer<St>,
    breaker: CircuitBreakerLayer<HttpClassifier>,
    pub(crate) retry: RetryLayer<HttpClassifier, HttpReplay>,
    /// The retry layer's events counted for the admin page; `None` for one
    /// built elsewhere.
    #[cfg(feature = "admin-page")]
    pub(crate) retry_counts: Option<std::sync::Arc<crate::admin_page::RetryCounts>>,
}

impl<St> ResilienceLayer<St> {
    /// The stack of three layers built elsewhere, for example from
    /// [`ResilienceConfig`]'s builders with a name or callbacks added.
    pub fn new(
        dead_letter: DeadLetterLayer<St>,
        breaker: CircuitBreakerLayer<HttpClassifier>,
        retry: RetryLayer<HttpClassifier, HttpReplay>,
    ) -> Self {
        ResilienceLayer {
            dead_letter,
            breaker,
            retry,
            #[cfg(feature = "admin-page")]
            retry_counts: None,
        }
    }

    /// The breaker's operator handle: its state, forcing it open or closed.
    pub fn breaker_handle(&self) -> BreakerHandle {
        self.breaker.handle()
    }
}

impl<S, St: Clone> Layer<S> for ResilienceLayer<St> {
    type Service = ResilienceService<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        let retried = self.retry.layer(inner);
        let guarded = self.breaker.layer(retried);
        self.dead_letter.layer(guarded)
    }
}

// A loaded configuration passed these builders' checks
// (`check_with_layers`): the `expect`s state that invariant.
const CHECKED: &str = "the configuration was checked by the layers' builders when it was loaded";

impl ResilienceConfig {
    /// The stack for the downstream `name`, dead-lettering into `store` (any
    /// [`DeadLetterStore`](tower_poison::store::DeadLetterStore): redb,
    /// Redis, memory). With `action: drop` or `fail` the store is never
    /// written.
    ///
    /// `name` labels all three layers' metrics, events and spans and the
    /// dead letters stored: one per downstream, few, never from requests.
    /// Each call builds a breaker and a retry budget of its own; clone the
    /// layer to share them.
    pub fn layer<St>(&self, name: &str, store: St) -> ResilienceLayer<St> {
        let retry = self.retry_builder().name(name);
        #[cfg(feature = "admin-page")]
        let (retry, retry_counts) = crate::admin_page::RetryCounts::attach(retry);
        ResilienceLayer {
            dead_letter: self.dead_letter_layer(store).label(name),
            breaker: self
                .breaker_builder()
                .name(name)
                .build(HttpClassifier::new())
                .expect(CHECKED),
            retry: retry.build().expect(CHECKED),
            #[cfg(feature = "admin-page")]
            retry_counts: Some(retry_counts),
        }
    }

    /// The retry layer's builder with the `retry` section applied (the
    /// crate docs' [table](crate#the-block)); everything else, such as the
    /// retry budget and the longest honoured `Retry-After`, at the retry
    /// layer's defaults.
    pub fn retry_builder(&self) -> RetryBuilder<HttpClassifier, HttpReplay> {
        let retry = &self.retry;
        let defaults = Backoff::default();
        let (base, max) = retry.base_and_max();
        let backoff = match retry.backoff.unwrap_or(defaults.kind()) {
            BackoffKind::None => Backoff::none(),
            // The layer's multiplier, 2: `exponential` is base × 2^(n−1).
            kind => Backoff::new(kind, base)
                .with_max_delay(max)
                .with_jitter(retry.jitter.unwrap_or(defaults.jitter())),
        };
        let (deadline, attempt_timeout) = retry.bounds();
        let mut builder = RetryLayer::http_builder()
            .backoff(backoff)
            .deadline(deadline)
            .attempt_timeout(attempt_timeout);
        if let Some(attempts) = retry.max_attempts {
            // The loader refuses 0 attempts.
            builder = builder.max_retries(attempts.saturating_sub(1));
        }
        if let Some(classes) = retry.retry_on {
            builder = builder.retry_on(classes);
        }
        builder
    }

    /// The breaker's builder with the `circuit_breaker` section applied; add
    /// a [`name`](tower_breaker::Builder::name) or callbacks before building.
    pub fn breaker_builder(&self) -> tower_breaker::Builder {
        let mut builder = CircuitBreakerLayer::builder();
        if let Some(threshold) = self.circuit_breaker.consecutive_failures {
            builder = builder.policy(Policy::consecutive_failures(threshold));
        }
        match self.circuit_breaker.cooldown_secs {
            Some(secs) => builder.recovery_timeout(Duration::from_secs(secs)),
            None => builder,
        }
    }

    /// The dead-letter layer over `store` with the `poison` section applied.
    pub fn dead_letter_layer<St>(&self, store: St) -> DeadLetterLayer<St> {
        let poison = &self.poison;
        let layer = DeadLetterLayer::new(store).store_refusals(poison.store_refusals);
        let layer = match poison.action {
            Some(action) => layer.action(action),
            None => layer,
        };
        match &poison.message_id_header {
            Some(name) => layer
                .message_id_header(HeaderName::from_bytes(name.as_bytes()).expect(CHECKED))
                .poison(PoisonPolicy::new(poison.max_row_attempts()).expect(CHECKED)),
            None => layer,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;
    use crate::config::{DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_DEADLINE};
    use crate::load::check_with_layers;

    /// The loader refuses these values itself; the layers' builders are the
    /// second line, and what they refuse must still name the key.
    #[test]
    fn refusals_of_the_layers_builders_name_the_configuration_key() {
        let mut config = ResilienceConfig::default();
        config.retry.max_attempts = Some(18);
        let error = check_with_layers(&config, "resilience").unwrap_err();
        assert_eq!(error.field(), "resilience.retry.max_attempts");
        assert_eq!(error.reason(), "must be from 1 (no retry) to 17");

        let mut config = ResilienceConfig::default();
        config.circuit_breaker.consecutive_failures = Some(0);
        let error = check_with_layers(&config, "").unwrap_err();
        assert_eq!(error.field(), "circuit_breaker.consecutive_failures");
        assert_eq!(error.reason(), "must be at least 1");

        let mut config = ResilienceConfig::default();
        config.poison.max_row_attempts = Some(0);
        let error = check_with_layers(&config, "").unwrap_err();
        assert_eq!(error.field(), "poison.max_row_attempts");
    }

    #[test]
    fn the_defaults_pass_the_layers_builders_and_build() {
        let config = ResilienceConfig::default();
        check_with_layers(&config, "").unwrap();
        let layer = config.layer("orders", tower_poison::store::MemoryStore::new(1));
        // One name for all three layers.
        assert_eq!(layer.breaker_handle().list()[0].key, "orders");
        assert_eq!(layer.retry.name(), "orders");
    }

    type Retries = RetryLayer<HttpClassifier, HttpReplay>;
    type Answer = Result<http::Response<http_body_util::Full<bytes::Bytes>>, tower::BoxError>;

    /// Drives one `method` call through `retry` over a downstream that
    /// answers `status` at once (with `Retry-After: hint` seconds when
    /// given), or never when `status` is `None`. Returns when each attempt
    /// arrived, from the call's start, and how and when the call ended:
    /// `None` when it had not ended after a day.
    async fn drive(
        retry: &Retries,
        method: http::Method,
        status: Option<u16>,
        hint: Option<u64>,
    ) -> (Vec<Duration>, Option<(Duration, Answer)>) {
        use tower::ServiceExt;
        let start = Instant::now();
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&arrivals);
        let downstream = tower::service_fn(move |_: http::Request<Body>| {
            seen.lock().unwrap().push(start.elapsed());
            async move {
                let Some(status) = status else {
                    return std::future::pending().await;
                };
                let mut response = http::Response::builder().status(status);
                if let Some(seconds) = hint {
                    response = response.header("retry-after", seconds.to_string());
                }
                Ok::<_, tower::BoxError>(response.body(Body::default()).unwrap())
            }
        });
        let request = http::Request::builder()
            .method(method)
            .uri("http://upstream.test/orders/7")
            .body(Body::default())
            .unwrap();
        let call = retry.layer(downstream).oneshot(request);
        let ended = tokio::time::timeout(Duration::from_secs(24 * 3600), call)
            .await
            .ok()
            .map(|answer| (start.elapsed(), answer));
        let arrivals = arrivals.lock().unwrap().clone();
        (arrivals, ended)
    }

    type Body = http_body_util::Full<bytes::Bytes>;

    /// The waits between the attempts of a call that arrived at `arrivals`.
    fn waits(arrivals: &[Duration]) -> Vec<Duration> {
        arrivals.windows(2).map(|pair| pair[1] - pair[0]).collect()
    }

    /// Every default of the stack is its layer's but the call's bounds: a
    /// block that leaves every key out builds the layers as their own
    /// builders do, with a deadline and an attempt timeout added. The retry
    /// layers are compared by what they do, on a paused clock.
    #[tokio::test(start_paused = true)]
    async fn an_empty_block_builds_the_layers_defaults() {
        use http::Method;
        let config = ResilienceConfig::from_value(&serde_json::json!({})).unwrap();
        assert_eq!(config, ResilienceConfig::default());
        let facade = config.retry_builder().build().unwrap();
        let own = RetryLayer::http_builder().build().unwrap();
        let bounded = RetryLayer::http_builder()
            .deadline(DEFAULT_DEADLINE)
            .attempt_timeout(DEFAULT_ATTEMPT_TIMEOUT)
            .build()
            .unwrap();
        assert_eq!(facade.name(), own.name());
        // Every setting, those no behaviour below reaches included (the
        // backoff's cap, `max_wait`, the attempt header, the classifier's
        // rules): the facade's layer is the layer's own plus the two bounds.
        assert_eq!(format!("{facade:?}"), format!("{bounded:?}"));

        // The retry layer's own leaves out the two bounds a request handler
        // needs: no attempt timeout cuts a hung attempt, no deadline the call.
        let (arrivals, ended) = drive(&own, Method::GET, None, None).await;
        assert_eq!(arrivals, [Duration::ZERO]);
        assert!(ended.is_none(), "the layer's own ends no hung call");
        // Nor does one refuse a wait that would cross one: four attempts
        // (three retries), each hint of 6 s waited out, the last answer kept.
        let (arrivals, ended) = drive(&own, Method::GET, Some(429), Some(6)).await;
        assert_eq!(arrivals, [0, 6, 12, 18].map(Duration::from_secs));
        let (took, answer) = ended.unwrap();
        assert_eq!(took, Duration::from_secs(18));
        assert_eq!(answer.unwrap().status(), 429);

        // The facade's adds both, at the block's defaults, as `bounded` does.
        for retry in [&facade, &bounded] {
            // The deadline: at 6 s, the second hint of 6 s is refused with
            // the 4 s left of 10 s.
            let (arrivals, ended) = drive(retry, Method::GET, Some(429), Some(6)).await;
            assert_eq!(arrivals, [0, 6].map(Duration::from_secs));
            let (took, answer) = ended.unwrap();
            assert_eq!(took, Duration::from_secs(6));
            let error = answer.unwrap_err();
            let too_long = error
                .downcast_ref::<tower_retry_budget::error::WaitTooLong>()
                .unwrap_or_else(|| panic!("{error}"));
            assert_eq!(too_long.limit(), DEFAULT_DEADLINE - Duration::from_secs(6));
            // Within it, the layer's own three retries: hints of 1 s are
            // waited out three times and the fourth answer is kept.
            let (arrivals, ended) = drive(retry, Method::GET, Some(429), Some(1)).await;
            assert_eq!(arrivals, [0, 1, 2, 3].map(Duration::from_secs));
            assert_eq!(ended.unwrap().1.unwrap().status(), 429);
            // The attempt timeout: a hung first attempt is cut at 3 s, and
            // the call ends by the deadline.
            let (arrivals, ended) = drive(retry, Method::GET, None, None).await;
            assert!(arrivals.len() >= 2, "{arrivals:?}");
            assert!(arrivals[1] >= DEFAULT_ATTEMPT_TIMEOUT, "{arrivals:?}");
            let (took, answer) = ended.expect("the deadline ends a hung call");
            assert!(took <= DEFAULT_DEADLINE, "{took:?}");
            assert!(answer.is_err());
        }

        // Everything else is the layer's own: the same answers retried
        // (transient statuses, idempotent methods only) as often, ...
        for (method, status, attempts) in [
            (Method::GET, 500, 4),
            (Method::GET, 502, 4),
            (Method::GET, 503, 4),
            (Method::GET, 504, 4),
            (Method::GET, 429, 4),
            (Method::GET, 408, 4),
            (Method::PUT, 503, 4),
            (Method::POST, 503, 1),
            (Method::GET, 400, 1),
            (Method::GET, 404, 1),
            (Method::GET, 200, 1),
        ] {
            for retry in [&facade, &bounded, &own] {
                let (arrivals, ended) = drive(retry, method.clone(), Some(status), None).await;
                assert_eq!(arrivals.len(), attempts, "{method} {status}");
                let (_, answer) = ended.unwrap();
                assert_eq!(answer.unwrap().status(), status, "the last answer kept");
            }
        }
        // ... after the same backoff: exponential from 1 s, doubling, with
        // full jitter (each wait anywhere from 0 to its bound).
        for retry in [&facade, &own] {
            let mut seen: Vec<Vec<Duration>> = vec![Vec::new(); 3];
            for _ in 0..40 {
                let (arrivals, _) = drive(retry, Method::GET, Some(503), None).await;
                for (n, wait) in waits(&arrivals).into_iter().enumerate() {
                    seen[n].push(wait);
                }
            }
            for (n, bound) in [1, 2, 4].map(Duration::from_secs).into_iter().enumerate() {
                let (least, most) = (
                    *seen[n].iter().min().unwrap(),
                    *seen[n].iter().max().unwrap(),
                );
                assert!(most <= bound, "retry {}: {most:?}", n + 1);
                assert!(most > bound / 2, "retry {}: {:?}", n + 1, seen[n]);
                assert!(least < bound / 2, "retry {}: {:?}", n + 1, seen[n]);
            }
        }
        // ... and the same retry budget: of a burst of calls failing
        // together, each layer retries as many, fewer than all. Layers
        // built afresh: the calls above are still in the budgets' window.
        let mut retried = Vec::new();
        for retry in [
            config.retry_builder().build().unwrap(),
            RetryLayer::http_builder()
                .deadline(DEFAULT_DEADLINE)
                .attempt_timeout(DEFAULT_ATTEMPT_TIMEOUT)
                .build()
                .unwrap(),
            RetryLayer::http_builder().build().unwrap(),
        ] {
            // Local tasks: the calls run together on the test's thread.
            let calls = tokio::task::LocalSet::new();
            let mut burst = tokio::task::JoinSet::new();
            for _ in 0..100 {
                let retry = retry.clone();
                burst.spawn_local_on(
                    async move { drive(&retry, Method::GET, Some(503), None).await.0.len() },
                    &calls,
                );
            }
            let attempts: usize = calls.run_until(burst.join_all()).await.into_iter().sum();
            retried.push(attempts - 100);
        }
        assert_eq!(retried[0], retried[1], "{retried:?}");
        assert_eq!(retried[0], retried[2], "{retried:?}");
        assert_eq!(
            retried[0], 120,
            "10 a second over the 10 s window, and 20 % of the 100 calls"
        );
        assert_eq!(
            format!("{:?}", config.breaker_builder()),
            format!("{:?}", CircuitBreakerLayer::builder()),
        );
        let store = tower_poison::store::MemoryStore::new(1);
        assert_eq!(
            format!("{:?}", config.dead_letter_layer(store.clone())),
            format!("{:?}", DeadLetterLayer::new(store)),
        );
    }
}
