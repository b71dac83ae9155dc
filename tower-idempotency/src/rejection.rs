//! The guard's own answers: HTTP responses, not errors (see the crate docs).

use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use tower_classify::status::Problem;

use crate::store::NotKept;

/// Why the guard answered a request itself, with an RFC 9457 problem
/// (`type`, `title`, `status`, `detail`, `code`, and `reason` for
/// [`NotKept`](Rejection::NotKept)) whose `type` is this enum's page. Each
/// variant names its status and its stable `code` (also the metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// 400 `idempotency_key_too_long`: the `Idempotency-Key` is longer than
    /// 255 characters.
    KeyTooLong,
    /// 400 `idempotency_key_invalid`: the `Idempotency-Key` is empty or not
    /// visible ASCII.
    KeyInvalid,
    /// 400 `idempotency_body_unreadable`: the body of a repeat failed while
    /// the guard read it to compare it with the first request's; nothing was
    /// run. (The body of a first request is read by the handler, which sees
    /// its failure itself.)
    BodyUnreadable,
    /// 409 `idempotency_key_in_use`: a request with the same key is still
    /// being processed. Retry later (`Retry-After: 1`).
    InFlight,
    /// 409 `idempotency_response_not_kept`: a request with the same key was
    /// processed, but its response was not kept (the `reason` says why). It
    /// is not run again: whether to repeat the operation under a new key is
    /// the client's decision.
    NotKept(NotKept),
    /// 422 `idempotency_key_reused`: the key was used before for a different
    /// request (method, path, query, or the body as far as the first
    /// request's handler read it).
    Mismatch,
    /// 503 `idempotency_store_unavailable`: the idempotency store did not
    /// answer; the request was not run (`Retry-After: 1`).
    StoreUnavailable,
    /// 503 `idempotency_store_full`: the idempotency store is full of
    /// requests still in flight; the request was not run (`Retry-After: 1`).
    StoreFull,
}

impl Rejection {
    /// The status of the response.
    pub(crate) const fn status(self) -> StatusCode {
        match self {
            Rejection::KeyTooLong | Rejection::KeyInvalid | Rejection::BodyUnreadable => {
                StatusCode::BAD_REQUEST
            }
            Rejection::InFlight | Rejection::NotKept(_) => StatusCode::CONFLICT,
            Rejection::Mismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Rejection::StoreUnavailable | Rejection::StoreFull => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The stable code in the body's `code` field (also the metric label).
    pub(crate) const fn code(self) -> &'static str {
        match self {
            Rejection::KeyTooLong => "idempotency_key_too_long",
            Rejection::KeyInvalid => "idempotency_key_invalid",
            Rejection::BodyUnreadable => "idempotency_body_unreadable",
            Rejection::InFlight => "idempotency_key_in_use",
            Rejection::NotKept(_) => "idempotency_response_not_kept",
            Rejection::Mismatch => "idempotency_key_reused",
            Rejection::StoreUnavailable => "idempotency_store_unavailable",
            Rejection::StoreFull => "idempotency_store_full",
        }
    }

    /// The problem's short `title`.
    pub(crate) const fn title(self) -> &'static str {
        match self {
            Rejection::KeyTooLong => "Idempotency-Key is too long",
            Rejection::KeyInvalid => "Idempotency-Key is invalid",
            Rejection::BodyUnreadable => "Request body could not be read",
            Rejection::InFlight => "A request is outstanding for this Idempotency-Key",
            Rejection::NotKept(_) => "The response for this Idempotency-Key was not kept",
            Rejection::Mismatch => "Idempotency-Key is already used",
            Rejection::StoreUnavailable => "Idempotency store unavailable",
            Rejection::StoreFull => "Idempotency store full",
        }
    }

    /// The human-readable `detail`.
    pub(crate) const fn detail(self) -> &'static str {
        match self {
            Rejection::KeyTooLong => "The Idempotency-Key header is longer than 255 characters.",
            Rejection::KeyInvalid => {
                "The Idempotency-Key header must be 1 to 255 visible ASCII characters."
            }
            Rejection::BodyUnreadable => {
                "The request body failed before the server could compare it with the first request's; the request was not processed."
            }
            Rejection::InFlight => {
                "A request with this Idempotency-Key is still being processed; retry later."
            }
            Rejection::NotKept(NotKept::TooLarge) => {
                "The request was processed, but its response was too large to keep for replay; it will not be processed again."
            }
            Rejection::NotKept(NotKept::Cancelled) => {
                "The request was cancelled before its response was complete, so it may have taken effect; it will not be processed again."
            }
            Rejection::NotKept(NotKept::ServiceError) => {
                "Processing the request failed after it started, so it may have taken effect; it will not be processed again."
            }
            Rejection::NotKept(NotKept::BodyFailed) => {
                "The request was processed, but its response failed while it was sent; it will not be processed again."
            }
            Rejection::Mismatch => {
                "This Idempotency-Key was already used for a different request (method, path, query or body); an Idempotency-Key must not be reused across different payloads."
            }
            Rejection::StoreUnavailable => {
                "The idempotency store is unavailable; the request was not processed, retry later."
            }
            Rejection::StoreFull => {
                "The idempotency store is full of requests still being processed; the request was not processed, retry later."
            }
        }
    }

    /// The answer described on [`Rejection`], with `Retry-After: 1` where
    /// retrying the same request later is the right move.
    pub(crate) fn response<B>(self, body: impl FnOnce(Bytes) -> B) -> Response<B> {
        let mut problem = Problem::new(self.status())
            .member(
                "type",
                "https://docs.rs/tower-idempotency/latest/tower_idempotency/enum.Rejection.html",
            )
            .member("title", self.title())
            .member("detail", self.detail())
            .member("code", self.code());
        if let Rejection::NotKept(reason) = self {
            problem = problem.member("reason", reason.as_str());
        }
        if let Rejection::InFlight | Rejection::StoreUnavailable | Rejection::StoreFull = self {
            problem = problem.retry_after(Duration::from_secs(1));
        }
        problem
            .response::<String>()
            .map(|json| body(Bytes::from(json)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole answer, as the family's problem builder makes it: the
    /// draft's status, the problem members, the guard's code and reason,
    /// `Retry-After: 1` only where a retry of the same request is right.
    #[test]
    fn a_rejection_is_a_problem_with_its_code() {
        let response = Rejection::NotKept(NotKept::Cancelled).response(|bytes| bytes);
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
        assert!(!response.headers().contains_key("retry-after"));
        let body: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "type": "https://docs.rs/tower-idempotency/latest/tower_idempotency/enum.Rejection.html",
                "title": "The response for this Idempotency-Key was not kept",
                "status": 409,
                "detail": Rejection::NotKept(NotKept::Cancelled).detail(),
                "code": "idempotency_response_not_kept",
                "reason": "cancelled",
            })
        );

        let response = Rejection::StoreFull.response(|bytes| bytes);
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()["retry-after"], "1");
    }
}
