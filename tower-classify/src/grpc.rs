//! gRPC status classification.

use std::time::SystemTime;

use http::{HeaderMap, Response};

use crate::classify::Classify;
use crate::error_chain::{AsDynError, ErrorChainClassifier};
use crate::hint::parse_grpc_pushback;
use crate::http::HttpClassifier;
use crate::outcome::{Failure, FailureKind, Outcome};

/// The `grpc-status` header or trailer.
pub const GRPC_STATUS: &str = "grpc-status";
/// The `grpc-retry-pushback-ms` trailer ([gRFC A6]).
///
/// [gRFC A6]: https://github.com/grpc/proposal/blob/master/A6-client-retries.md
pub const GRPC_RETRY_PUSHBACK_MS: &str = "grpc-retry-pushback-ms";

/// Classifies gRPC responses by their status code.
///
/// | code | outcome |
/// |---|---|
/// | `OK` (0) | success |
/// | `CANCELLED` (1) | ignored: the client gave up, the server said nothing |
/// | `UNKNOWN` (2), `INTERNAL` (13), `UNAVAILABLE` (14), `DATA_LOSS` (15), unknown codes | [`ServerError`](FailureKind::ServerError) |
/// | `DEADLINE_EXCEEDED` (4) | [`Timeout`](FailureKind::Timeout) |
/// | `RESOURCE_EXHAUSTED` (8) | [`RateLimited`](FailureKind::RateLimited) |
/// | every other code | [`Rejected`](FailureKind::Rejected) |
///
/// The status is read from the `grpc-status` *header*, where a
/// "trailers-only" response (the form servers use for an immediate error, and
/// tonic for every error it returns before the body) carries it. A response
/// whose status arrives in trailers looks successful here, because the trailers
/// come only at the end of the body; classify them with
/// [`classify_trailers`](Self::classify_trailers) where the body ends. A
/// non-200 HTTP status without `grpc-status` is classified as HTTP.
///
/// `grpc-retry-pushback-ms` becomes the failure's hint: a non-negative value
/// is a wait, a negative or unreadable one means "do not retry". A [`Failure`]
/// in the response's extensions decides, as for [`HttpClassifier`].
#[derive(Debug, Clone, Default)]
pub struct GrpcClassifier {
    http: HttpClassifier,
    errors: ErrorChainClassifier,
}

impl GrpcClassifier {
    /// The classifier with the defaults in the table above.
    pub fn new() -> Self {
        Self::default()
    }

    /// The outcome of a gRPC status `code`.
    pub const fn code_outcome(code: u32) -> Outcome {
        match code {
            0 => Outcome::Success,
            1 => Outcome::Ignored,
            4 => Outcome::failure(FailureKind::Timeout),
            8 => Outcome::failure(FailureKind::RateLimited),
            3 | 5 | 6 | 7 | 9 | 10 | 11 | 12 | 16 => Outcome::failure(FailureKind::Rejected),
            _ => Outcome::failure(FailureKind::ServerError),
        }
    }

    /// Classifies a header map holding `grpc-status` (response headers of a
    /// trailers-only response, or trailers). `None` when it has no readable
    /// `grpc-status`.
    pub fn classify_trailers(&self, trailers: &HeaderMap) -> Option<Outcome> {
        let code = trailers
            .get(GRPC_STATUS)?
            .to_str()
            .ok()?
            .trim()
            .parse::<u32>()
            .ok()?;
        Some(match Self::code_outcome(code) {
            Outcome::Failure(failure) => {
                let hint = trailers
                    .get(GRPC_RETRY_PUSHBACK_MS)
                    .map(|value| parse_grpc_pushback(value.as_bytes()));
                Outcome::Failure(Failure { hint, ..failure })
            }
            other => other,
        })
    }
}

impl<B, E> Classify<Response<B>, E> for GrpcClassifier
where
    B: 'static,
    E: AsDynError,
{
    fn classify(&self, result: Result<&Response<B>, &E>) -> Outcome {
        match result {
            Ok(response) => {
                // As for HTTP: a layer that answered on its own says what it means.
                if let Some(failure) = response.extensions().get::<Failure>() {
                    return Outcome::Failure(*failure);
                }
                match self.classify_trailers(response.headers()) {
                    Some(outcome) => outcome,
                    None if response.status() == http::StatusCode::OK => Outcome::Success,
                    None => self.http.classify_parts(
                        response.status(),
                        response.headers(),
                        None,
                        SystemTime::now(),
                    ),
                }
            }
            Err(err) => self.errors.classify_error(err.as_dyn_error()),
        }
    }
}

impl crate::classify::ClassifyExt for GrpcClassifier {}
