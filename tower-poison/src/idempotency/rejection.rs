//! The guard's own answers: HTTP responses, not errors.
//!
//! An error from a server's service makes hyper close the connection without
//! answering (tower-http's lesson), so a client could not tell "repeat while
//! in flight" from a network failure and would retry blindly. Each problem is
//! a response with a status that says what to do and a short JSON body
//! naming it.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

/// Why the guard answered a request itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// 400: the `Idempotency-Key` is longer than the limit (255 characters).
    KeyTooLong,
    /// 400: the `Idempotency-Key` is empty or not visible ASCII.
    KeyInvalid,
    /// 409: a request with the same key is still being processed.
    InFlight,
    /// 422: the key was used before for a different request (method, path
    /// or body).
    Mismatch,
    /// 503: the idempotency store did not answer; the request was not run.
    StoreUnavailable,
}

impl Rejection {
    /// The status of the response.
    pub const fn status(self) -> StatusCode {
        match self {
            Rejection::KeyTooLong | Rejection::KeyInvalid => StatusCode::BAD_REQUEST,
            Rejection::InFlight => StatusCode::CONFLICT,
            Rejection::Mismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Rejection::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The stable code in the JSON body's `error` field (also the metric
    /// label).
    pub const fn code(self) -> &'static str {
        match self {
            Rejection::KeyTooLong => "idempotency_key_too_long",
            Rejection::KeyInvalid => "idempotency_key_invalid",
            Rejection::InFlight => "idempotency_key_in_use",
            Rejection::Mismatch => "idempotency_key_reused",
            Rejection::StoreUnavailable => "idempotency_store_unavailable",
        }
    }

    /// The human-readable `message`.
    pub const fn message(self) -> &'static str {
        match self {
            Rejection::KeyTooLong => "the Idempotency-Key header is longer than 255 characters",
            Rejection::KeyInvalid => {
                "the Idempotency-Key header must be 1 to 255 visible ASCII characters"
            }
            Rejection::InFlight => {
                "a request with this Idempotency-Key is still being processed; retry later"
            }
            Rejection::Mismatch => {
                "this Idempotency-Key was already used for a different request (method, path or body)"
            }
            Rejection::StoreUnavailable => {
                "the idempotency store is unavailable; the request was not processed, retry later"
            }
        }
    }

    /// The response: the status, `content-type: application/json`, a body
    /// `{"error": code, "message": …}`, and `retry-after: 1` where retrying
    /// the same request is the right move (409, 503).
    pub fn response<B>(self, body: impl FnOnce(Bytes) -> B) -> Response<B> {
        let json = serde_json::json!({ "error": self.code(), "message": self.message() });
        let mut response = Response::new(body(Bytes::from(json.to_string())));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if matches!(self, Rejection::InFlight | Rejection::StoreUnavailable) {
            headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}
