//! gRPC status classification.

use http::{HeaderMap, Response};

use crate::classify::Classify;
use crate::error_chain::AsDynError;
use crate::hint::{decimal, parse_grpc_pushback};
use crate::http::HttpClassifier;
use crate::outcome::{Failure, FailureKind, Outcome};
use crate::settle::StreamEnd;

/// The `grpc-status` header or trailer.
pub(crate) const GRPC_STATUS: &str = "grpc-status";
/// The `grpc-message` header or trailer.
pub(crate) const GRPC_MESSAGE: &str = "grpc-message";
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
/// | `UNKNOWN` (2), `INTERNAL` (13), `UNAVAILABLE` (14), `DATA_LOSS` (15), unknown codes, a `grpc-status` that cannot be read | [`ServerError`](FailureKind::ServerError) |
/// | `DEADLINE_EXCEEDED` (4) | [`Timeout`](FailureKind::Timeout) |
/// | `RESOURCE_EXHAUSTED` (8) | [`RateLimited`](FailureKind::RateLimited) |
/// | every other code | [`Rejected`](FailureKind::Rejected) |
///
/// A `200` whose status comes in the trailers is judged where its body
/// ends ([crate docs](crate#what-it-reads)); a non-200 without
/// `grpc-status` is classified as HTTP. `grpc-retry-pushback-ms` is the
/// [hint](crate::hint::parse_grpc_pushback); a [`Failure`] in the
/// extensions decides, as for [`HttpClassifier`].
#[derive(Debug, Clone, Default)]
pub struct GrpcClassifier {
    /// Judges what is not gRPC: a non-200 without `grpc-status`, an error.
    http: HttpClassifier,
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

    /// The `grpc-status` code in `headers` (response headers of a
    /// trailers-only response, or trailers). `None` when it is absent. A
    /// value that is not a code written as gRPC writes one (decimal, no
    /// sign, no leading zero: `ok`, `+0`, `00`) reads as 2 `UNKNOWN`, as
    /// tonic reads it: a status nobody can read is not a success.
    pub fn status_code(headers: &HeaderMap) -> Option<u32> {
        let digits = headers.get(GRPC_STATUS)?.as_bytes().trim_ascii();
        let written_as_grpc = matches!(digits, [_] | [b'1'..=b'9', _]);
        let code = decimal(digits).filter(|_| written_as_grpc);
        Some(code.map_or(UNKNOWN, |code| code as u32))
    }

    /// `true` for a gRPC response: `content-type: application/grpc…` or a
    /// `grpc-status` in its head. Its HTTP status is `200` whatever the call's
    /// outcome; the gRPC status is what a client reads.
    pub fn is_grpc<B>(response: &Response<B>) -> bool {
        response.headers().contains_key(GRPC_STATUS) || grpc_content(response.headers())
    }

    /// The `grpc-message` of `headers` (trailers), percent-decoded as the
    /// gRPC protocol encodes it; `None` when absent.
    pub fn status_message(headers: &HeaderMap) -> Option<String> {
        let raw = headers.get(GRPC_MESSAGE)?.as_bytes();
        let hex = |byte: &u8| (*byte as char).to_digit(16);
        let mut decoded = Vec::with_capacity(raw.len());
        let mut i = 0;
        while i < raw.len() {
            if raw[i] == b'%' {
                if let (Some(high), Some(low)) =
                    (raw.get(i + 1).and_then(hex), raw.get(i + 2).and_then(hex))
                {
                    decoded.push((high * 16 + low) as u8);
                    i += 3;
                    continue;
                }
            }
            decoded.push(raw[i]);
            i += 1;
        }
        Some(String::from_utf8_lossy(&decoded).into_owned())
    }
}

/// `UNKNOWN` (2): the status of a `grpc-status` nobody can read, and of a
/// body that ended without one (what tonic reports for both).
const UNKNOWN: u32 = 2;

fn grpc_content(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"))
}

/// `grpc-status` and `grpc-retry-pushback-ms` of `headers`, classified.
fn status_outcome(headers: &HeaderMap) -> Option<Outcome> {
    let code = GrpcClassifier::status_code(headers)?;
    Some(match GrpcClassifier::code_outcome(code) {
        Outcome::Failure(failure) => {
            let hint = headers
                .get(GRPC_RETRY_PUSHBACK_MS)
                .map(|value| parse_grpc_pushback(value.as_bytes()));
            Outcome::Failure(Failure { hint, ..failure })
        }
        other => other,
    })
}

impl<B, E> Classify<Response<B>, E> for GrpcClassifier
where
    B: 'static,
    E: AsDynError,
{
    fn classify(&self, result: Result<&Response<B>, &E>) -> Outcome {
        // As for HTTP, a `Failure` in the extensions decides: `http` reads it.
        let grpc = result
            .ok()
            .filter(|response| response.extensions().get::<Failure>().is_none());
        match grpc.map(|response| (status_outcome(response.headers()), response.status())) {
            Some((Some(outcome), _)) => outcome,
            Some((None, http::StatusCode::OK)) => Outcome::Success,
            _ => self.http.classify(result),
        }
    }

    /// Leaves open a `200` gRPC response without `grpc-status` in its head
    /// (its status comes in the trailers); settles every other result as
    /// [`classify`](Classify::classify) does.
    fn classify_head(&self, result: Result<&Response<B>, &E>) -> Option<Outcome> {
        match result {
            Ok(response)
                if response.status() == http::StatusCode::OK
                    && !response.headers().contains_key(GRPC_STATUS)
                    && grpc_content(response.headers())
                    && response.extensions().get::<Failure>().is_none() =>
            {
                None
            }
            result => Some(self.classify(result)),
        }
    }

    /// Judges the trailers as the head's `grpc-status`; a body that ends
    /// without one broke the protocol and is 2 `UNKNOWN` (as tonic reports
    /// it), a [`ServerError`](FailureKind::ServerError). A body error and a
    /// drop are judged as [`Classify::classify_end`] does by default.
    fn classify_end(&self, end: StreamEnd<'_>) -> Outcome {
        match end {
            StreamEnd::Trailers(trailers) => trailers
                .and_then(status_outcome)
                .unwrap_or(Self::code_outcome(UNKNOWN)),
            other => other.default_outcome(),
        }
    }
}

impl crate::classify::ClassifyExt for GrpcClassifier {}
