//! Which requests may be sent twice.

use http::{HeaderName, Method, Request};

/// The `Idempotency-Key` header: a client-chosen key that lets a server
/// recognise a repeat of a request it has already applied.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// Decides whether a request may be sent more than once.
///
/// Per [RFC 9110 §9.2.2], GET, HEAD, OPTIONS, TRACE, PUT and DELETE are
/// idempotent. POST and PATCH are only with an `Idempotency-Key` header (the
/// server recognises the repeat) or with
/// [`retry_non_idempotent`](Self::retry_non_idempotent); any other method
/// is not.
///
/// ```
/// use http::Request;
/// use tower_classify::http::Idempotency;
///
/// let policy = Idempotency::new();
/// assert!(policy.is_idempotent(&Request::get("/").body(()).unwrap()));
/// assert!(!policy.is_idempotent(&Request::post("/").body(()).unwrap()));
/// let keyed = Request::post("/").header("idempotency-key", "k-1").body(()).unwrap();
/// assert!(policy.is_idempotent(&keyed));
/// ```
///
/// [RFC 9110 §9.2.2]: https://www.rfc-editor.org/rfc/rfc9110#section-9.2.2
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotency {
    retry_non_idempotent: bool,
    key_header: HeaderName,
}

impl Default for Idempotency {
    fn default() -> Self {
        Self::new()
    }
}

impl Idempotency {
    /// RFC 9110's rules, with `Idempotency-Key` as the key header.
    pub const fn new() -> Self {
        Idempotency {
            retry_non_idempotent: false,
            key_header: IDEMPOTENCY_KEY,
        }
    }

    /// Treat every request as safe to repeat (default `false`). Only for
    /// endpoints you know to deduplicate.
    pub const fn retry_non_idempotent(mut self, yes: bool) -> Self {
        self.retry_non_idempotent = yes;
        self
    }

    /// The header whose presence makes POST and PATCH safe to repeat
    /// (default `Idempotency-Key`).
    pub fn key_header(mut self, name: HeaderName) -> Self {
        self.key_header = name;
        self
    }

    /// `true` for the methods RFC 9110 defines as idempotent (see
    /// [`Idempotency`]), whatever version of the `http` crate is in the build.
    pub fn method_is_idempotent(method: &Method) -> bool {
        matches!(
            *method,
            Method::GET
                | Method::HEAD
                | Method::OPTIONS
                | Method::TRACE
                | Method::PUT
                | Method::DELETE
        )
    }

    /// `true` when `request` may be sent more than once.
    pub fn is_idempotent<B>(&self, request: &Request<B>) -> bool {
        if self.retry_non_idempotent || Self::method_is_idempotent(request.method()) {
            return true;
        }
        matches!(*request.method(), Method::POST | Method::PATCH)
            && request.headers().contains_key(&self.key_header)
    }
}
