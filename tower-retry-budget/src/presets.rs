//! Google Cloud Workflows' HTTP retry policies, as builders to adjust.

use std::time::Duration;

use http::StatusCode;
use tower_classify::{FailureKind, HttpClassifier, RetryOn};

use crate::backoff::{Backoff, Jitter};
use crate::layer::RetryBuilder;
use crate::replay::HttpReplay;

/// Google's HTTP backoff: 1 s, ×1.25, at most 60 s, no jitter.
const GOOGLE_BACKOFF: Backoff = Backoff::exponential(Duration::from_secs(1))
    .with_multiplier(1.25)
    .with_max_delay(Duration::from_secs(60))
    .with_jitter(Jitter::None);

/// Google Cloud Workflows' `http.default_retry` (documented at
/// <https://cloud.google.com/workflows/docs/reference/stdlib/http/default_retry>): HTTP 429, 502,
/// 503 and 504, connection errors and timeouts; 5 retries; backoff 1 s
/// initial, multiplier 1.25, at most 60 s.
///
/// Idempotency rules stay on: POST and PATCH are retried only with an
/// `Idempotency-Key` header. Google's delays are stated without jitter, so
/// the preset has none; add it with `.backoff(...)` if many clients share
/// a dependency. Every setting can be changed before `build()`.
pub fn default_retry() -> RetryBuilder<HttpClassifier, HttpReplay> {
    let classifier = HttpClassifier::new().retryable_statuses([
        StatusCode::TOO_MANY_REQUESTS,
        StatusCode::BAD_GATEWAY,
        StatusCode::SERVICE_UNAVAILABLE,
        StatusCode::GATEWAY_TIMEOUT,
    ]);
    RetryBuilder::new(classifier, HttpReplay::new())
        .max_retries(5)
        .backoff(GOOGLE_BACKOFF)
}

/// Google Cloud Workflows' `http.default_retry_non_idempotent`: HTTP 429
/// and 503 and connection *failures* only; 5 retries; the same backoff.
///
/// This is the policy Google gives *non-idempotent* steps, so it retries
/// POST and PATCH too (`retry_non_idempotent(true)`): the failures it
/// retries are those where the server did not act on the request. So no
/// timeouts (a timed-out call may have been applied) and, of connection
/// errors, only [`NotSent`](FailureKind::NotSent) ones (refused, DNS, a
/// failed connect): a connection lost after the request was written may
/// have been acted on, and sending it again could apply it twice.
pub fn default_retry_non_idempotent() -> RetryBuilder<HttpClassifier, HttpReplay> {
    let classifier = HttpClassifier::new().retryable_statuses([
        StatusCode::TOO_MANY_REQUESTS,
        StatusCode::SERVICE_UNAVAILABLE,
    ]);
    let classes = RetryOn::new([
        FailureKind::ServerError,
        FailureKind::RateLimited,
        FailureKind::NotSent,
    ])
    .expect("a non-empty set of transient kinds");
    RetryBuilder::new(classifier, HttpReplay::new().retry_non_idempotent(true))
        .max_retries(5)
        .backoff(GOOGLE_BACKOFF)
        .retry_on(classes)
}
