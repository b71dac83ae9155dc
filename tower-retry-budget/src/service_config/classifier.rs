//! Classifying gRPC responses by a policy's `retryableStatusCodes`.

use std::sync::Arc;

use http::{HeaderMap, Response, StatusCode};
use tower_classify::grpc::GRPC_RETRY_PUSHBACK_MS;
use tower_classify::hint::parse_grpc_pushback;
use tower_classify::{
    AsDynError, Classify, ClassifyExt, ErrorChainClassifier, Failure, FailureKind, GrpcClassifier,
    Outcome, RetryHint,
};

use super::status::StatusCodes;
use crate::budget::TokenBucketBudget;

/// `UNKNOWN`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `UNAVAILABLE`.
const UNKNOWN: u32 = 2;
const DEADLINE_EXCEEDED: u32 = 4;
const RESOURCE_EXHAUSTED: u32 = 8;
const UNAVAILABLE: u32 = 14;

/// Classifies gRPC calls for a retry layer following a [gRFC A6] retry
/// policy: a failure is retryable exactly when its status code is one of
/// the policy's `retryableStatusCodes`.
///
/// | result | outcome |
/// |---|---|
/// | `grpc-status: 0` | success |
/// | a code in the set | a transient failure (the kind [`GrpcClassifier`] gives the code, or [`ServerError`](FailureKind::ServerError) for a code it calls permanent), hinted by `grpc-retry-pushback-ms` |
/// | a code not in the set | the kind [`GrpcClassifier`] gives it, hinted [`Final`](RetryHint::Final): a breaker sharing the classifier still counts an `UNAVAILABLE`, the retry layer does not retry it, a hedge layer returns it at once (A6's fatal status); `CANCELLED` stays ignored |
/// | HTTP status without `grpc-status` | the code gRPC's [HTTP to gRPC mapping] gives it (`429`, `502`, `503`, `504` are `UNAVAILABLE`, `400` `INTERNAL`, ...), then as above |
/// | `200` without `grpc-status` (the status comes in the trailers) | success: the server sent its headers, so A6 counts the call as committed and it is not retried |
/// | an error | its [error-chain class](ErrorChainClassifier) read as the code a gRPC client reports for it: a lost connection `UNAVAILABLE`, a timeout `DEADLINE_EXCEEDED`, rate limiting `RESOURCE_EXHAUSTED`, a server error `UNKNOWN`; then as above |
/// | an error of a request never sent ([`NotSent`](FailureKind::NotSent)) | retryable whatever the set: A6 retries these transparently, since the server never saw them |
/// | a [`Failure`] in the response's extensions, a [`Shed`](FailureKind::Shed) error | as they are: a layer below answered |
///
/// A pushback (`grpc-retry-pushback-ms`) of `n ≥ 0` ms is the wait before
/// the next attempt; a negative or unreadable one means "do not retry", for
/// any code.
///
/// Built by a [`MethodConfig`](super::MethodConfig) with the server's
/// throttle, it counts each attempt in that [`TokenBucketBudget`], as A6
/// counts RPCs: a success adds `tokenRatio`; a
/// failure with a retryable code, or with a pushback that says not to
/// retry, takes a token; nothing else (a request never sent, a code not in
/// the set) counts. Give such a classifier to one retry layer only: every
/// classification counts.
///
/// ```
/// use tower_classify::{Classify, Outcome};
/// use tower_retry_budget::service_config::{GrpcRetryClassifier, StatusCodes};
///
/// let unavailable = StatusCodes::EMPTY.with(14).unwrap();
/// let classifier = GrpcRetryClassifier::new(unavailable);
/// let response = |code: &str| {
///     http::Response::builder()
///         .header("content-type", "application/grpc")
///         .header("grpc-status", code)
///         .body(())
///         .unwrap()
/// };
/// let classify = |code| Classify::<_, std::io::Error>::classify(&classifier, Ok(&response(code)));
/// assert!(classify("14").is_retryable()); // UNAVAILABLE is in the set
/// assert!(!classify("13").is_retryable()); // INTERNAL is not
/// assert_eq!(classify("0"), Outcome::Success);
/// ```
///
/// [gRFC A6]: https://github.com/grpc/proposal/blob/master/A6-client-retries.md
/// [HTTP to gRPC mapping]: https://github.com/grpc/grpc/blob/master/doc/http-grpc-status-mapping.md
#[derive(Debug, Clone)]
pub struct GrpcRetryClassifier {
    retryable: StatusCodes,
    throttle: Option<Arc<TokenBucketBudget>>,
    errors: ErrorChainClassifier,
}

impl GrpcRetryClassifier {
    /// Retries the `retryable` codes.
    pub fn new(retryable: StatusCodes) -> Self {
        GrpcRetryClassifier {
            retryable,
            throttle: None,
            errors: ErrorChainClassifier::new(),
        }
    }

    /// Counts every classified attempt in `throttle`, if any (see the
    /// type's docs).
    pub(crate) fn with_throttle(mut self, throttle: Option<&Arc<TokenBucketBudget>>) -> Self {
        self.throttle = throttle.cloned();
        self
    }

    /// Classifies errors with `errors` instead of [`ErrorChainClassifier::new`].
    pub fn with_error_classifier(mut self, errors: ErrorChainClassifier) -> Self {
        self.errors = errors;
        self
    }

    /// The outcome of a call that ended with gRPC status `code` and,
    /// optionally, a pushback; counted in the throttle.
    pub(crate) fn classify_code(&self, code: u32, pushback: Option<RetryHint>) -> Outcome {
        if let Some(throttle) = &self.throttle {
            if code == 0 {
                throttle.record_success();
            } else if self.retryable.contains(code) || pushback == Some(RetryHint::DoNotRetry) {
                throttle.record_failure();
            }
        }
        if code == 0 {
            return Outcome::Success;
        }
        let default = GrpcClassifier::code_outcome(code);
        if self.retryable.contains(code) {
            let kind = match default {
                Outcome::Failure(failure) if failure.kind.is_transient() => failure.kind,
                _ => FailureKind::ServerError,
            };
            let mut failure = Failure::new(kind);
            failure.hint = pushback;
            return Outcome::Failure(failure);
        }
        // Outside the codes: not retried, and under a hedging policy the
        // call's answer at once (the other attempts are cancelled).
        match default {
            Outcome::Failure(failure) => {
                Outcome::Failure(Failure::new(failure.kind).with_hint(RetryHint::Final))
            }
            other => other,
        }
    }

    fn classify_head(&self, status: StatusCode, headers: &HeaderMap) -> Outcome {
        let pushback = headers
            .get(GRPC_RETRY_PUSHBACK_MS)
            .map(|value| parse_grpc_pushback(value.as_bytes()));
        let code = match GrpcClassifier::status_code(headers) {
            Some(code) => code,
            // Headers without a status: the status comes in the trailers,
            // and the call is committed (A6 "When Retries are Valid").
            // Counted as the success it is so far.
            None if status == StatusCode::OK => 0,
            None => http_status_code(status),
        };
        self.classify_code(code, pushback)
    }

    fn classify_failed_call(&self, outcome: Outcome) -> Outcome {
        let Outcome::Failure(failure) = outcome else {
            return outcome;
        };
        let code = match failure.kind {
            // Never reached the server: A6 retries it transparently, and a
            // transparent retry is not counted by the throttle.
            FailureKind::NotSent => return outcome,
            FailureKind::Connection => UNAVAILABLE,
            FailureKind::Timeout => DEADLINE_EXCEEDED,
            FailureKind::RateLimited => RESOURCE_EXHAUSTED,
            FailureKind::ServerError => UNKNOWN,
            // Shed (a layer below refused), rejected, poison: as classified.
            _ => return outcome,
        };
        match self.classify_code(code, failure.hint) {
            // Keep the error's own kind and hint (a connection error stays
            // `Connection`, so a non-idempotent rule still sees it).
            decided if decided.is_retryable() => outcome,
            Outcome::Failure(decided) => {
                Outcome::Failure(failure.with_hint(decided.hint.unwrap_or(RetryHint::Final)))
            }
            decided => decided,
        }
    }
}

/// The gRPC status a client reads from an HTTP status that came without
/// `grpc-status` (gRPC's `doc/http-grpc-status-mapping.md`).
fn http_status_code(status: StatusCode) -> u32 {
    match status.as_u16() {
        400 | 431 => 13,
        401 => 16,
        403 => 7,
        404 => 12,
        429 | 502 | 503 | 504 => UNAVAILABLE,
        _ => UNKNOWN,
    }
}

impl<B, E> Classify<Response<B>, E> for GrpcRetryClassifier
where
    B: 'static,
    E: AsDynError,
{
    fn classify(&self, result: Result<&Response<B>, &E>) -> Outcome {
        match result {
            Ok(response) => {
                // A layer below answered on its own and said what it means.
                if let Some(failure) = response.extensions().get::<Failure>() {
                    return Outcome::Failure(*failure);
                }
                self.classify_head(response.status(), response.headers())
            }
            Err(err) => self.classify_failed_call(self.errors.classify_error(err.as_dyn_error())),
        }
    }
}

impl ClassifyExt for GrpcRetryClassifier {}
