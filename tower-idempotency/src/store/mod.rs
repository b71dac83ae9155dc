//! Idempotency stores: who holds a key, and what its request came to.
//!
//! [`IdempotencyStore`] is the interface the
//! [`IdempotencyGuard`](crate::IdempotencyGuard) uses. A key goes through
//! three states, and once its request was handed to the service it never
//! goes back to absent before its TTL:
//!
//! ```text
//!            claim                 complete (owner only)
//!  absent ────────────▶ in flight ─────────────────────▶ completed ──▶ absent
//!    ▲                     │     (a response, or "not kept")     (TTL)
//!    └─────────────────────┘
//!     release (owner only: refused before the handler ran), or the
//!     in-flight TTL runs out (the owner's node crashed and stopped
//!     extending its claim)
//! ```
//!
//! Keys reach a store already namespaced by the guard (see
//! [the rules](crate#the-rules)).

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use serde::{Deserialize, Serialize};

use crate::StoreError;

mod memory;
#[cfg(feature = "redis")]
mod redis;

pub use self::memory::MemoryIdempotencyStore;
#[cfg(feature = "redis")]
pub use self::redis::{RedisIdempotencyStore, RedisIdempotencyStoreBuilder};
/// How [`RedisIdempotencyStore`] connects, as `tower-poison`'s Redis stores
/// do (from `tower-store-support`).
///
#[cfg(feature = "redis")]
pub use tower_store_support::{RedisConnectOptions, RedisConnection};

/// The longest TTL a store applies; longer ones are cut to it, so that no
/// configured value can overflow a clock or a store's expiry arithmetic.
/// About 100 years.
pub const MAX_TTL: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Where the idempotency guard keeps its keys.
///
/// Every method is asynchronous and returns a `Send` future. Implementations
/// are cheap to clone and clones share their state. An error means the store
/// could not answer; the guard then refuses the request (503) rather than run
/// it unguarded.
pub trait IdempotencyStore: Clone + Send + Sync + 'static {
    /// Claims `key` for a request whose fingerprint is `fingerprint`, unless
    /// the key is already in flight or completed. The guard claims before the
    /// handler reads the request body, so this fingerprint's body part is
    /// still unknown; [`complete`](Self::complete) brings the final one. A claim not completed or
    /// released within `in_flight_ttl` lapses (its owner crashed).
    ///
    /// A store at its bound may evict completed records to make room, never
    /// a claim in flight (a repeat would run beside the original): when only
    /// claims in flight are left it fails with
    /// [`StoreErrorKind::Full`](crate::StoreErrorKind::Full).
    fn claim(
        &self,
        key: &str,
        fingerprint: &str,
        in_flight_ttl: Duration,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Records what the request holding `claim` came to and keeps it for
    /// `ttl`, only if the claim is still the one in the store (it has not
    /// lapsed or been taken over). Returns whether it was recorded.
    ///
    /// `fingerprint` replaces the claim's in the completed record: it covers
    /// the request body as far as the handler read it, which the guard only
    /// knows once the handler is done. Later claims of the key report it in
    /// [`Claim::Completed`].
    ///
    /// A store that cannot keep a response (over its size cap) records
    /// [`NotKept::TooLarge`] in its place: the key stays completed.
    fn complete(
        &self,
        key: &str,
        claim: &ClaimToken,
        fingerprint: &str,
        completion: Completion,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Pushes the lapse of `claim` to `in_flight_ttl` from now, only if the
    /// claim is still the one in the store. Returns whether it was extended.
    /// The guard calls it every third of the in-flight TTL ([crate
    /// docs](crate#the-rules)).
    fn extend(
        &self,
        key: &str,
        claim: &ClaimToken,
        in_flight_ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Gives the key up so the request can be tried again, only if `claim`
    /// is still the one in the store. Returns whether it was released. The
    /// guard releases only requests that were refused before they reached
    /// the handler (and, when opted in, transient failures).
    fn release(
        &self,
        key: &str,
        claim: &ClaimToken,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// What [`IdempotencyStore::claim`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Claim {
    /// The key was free and is now held by the caller.
    Acquired(ClaimToken),
    /// Another request holds the key and has not finished.
    InFlight {
        /// That request's fingerprint.
        fingerprint: String,
    },
    /// A request with this key finished.
    Completed {
        /// That request's fingerprint, as it was when it finished.
        fingerprint: String,
        /// What it came to.
        completion: Completion,
    },
}

/// What a request that reached the service came to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Completion {
    /// Its response, replayed to repeats.
    Response(StoredResponse),
    /// It ran (or may have run), but there is no response to replay.
    /// Repeats are refused with `409` naming the reason, never run again.
    NotKept(NotKept),
}

/// Why a request that reached the service has no stored response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum NotKept {
    /// The response was larger than the guard's
    /// [`response_body_limit`](crate::IdempotencyGuardLayer::response_body_limit)
    /// or the store's size cap.
    TooLarge,
    /// The call was dropped before its response was complete (the client
    /// went away, a timeout above the guard), or the response body was
    /// dropped before its end: the handler may have run.
    Cancelled,
    /// The service returned an error instead of a response.
    ServiceError,
    /// The response body failed while it streamed.
    BodyFailed,
}

impl NotKept {
    /// A short, stable name for logs, metric labels and the `reason` of the
    /// guard's `409` body (`too_large`, `cancelled`, …).
    pub const fn as_str(self) -> &'static str {
        match self {
            NotKept::TooLarge => "too_large",
            NotKept::Cancelled => "cancelled",
            NotKept::ServiceError => "service_error",
            NotKept::BodyFailed => "body_failed",
        }
    }
}

/// Proof of holding a key: a random owner token and the fingerprint the key
/// was claimed with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimToken {
    token: String,
    fingerprint: String,
}

impl ClaimToken {
    /// A fresh claim for a request with `fingerprint`.
    pub fn new(fingerprint: impl Into<String>) -> Self {
        ClaimToken {
            token: format!("{:032x}", fastrand::u128(..)),
            fingerprint: fingerprint.into(),
        }
    }

    /// The owner token (random, 32 hex digits).
    pub fn token(&self) -> &str {
        &self.token
    }
}

/// A response as an idempotency store keeps it, to be replayed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponse {
    /// The status code.
    pub status: u16,
    /// The headers, in order.
    pub headers: Vec<StoredResponseHeader>,
    /// The whole body.
    #[serde(with = "tower_store_support::bytes_text")]
    pub body: Bytes,
    /// The trailers that ended the body (gRPC's `grpc-status`), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trailers: Vec<StoredResponseHeader>,
}

/// One header of a [`StoredResponse`], byte for byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponseHeader {
    /// The header name, lowercase.
    pub name: String,
    /// The value's bytes.
    #[serde(with = "tower_store_support::bytes_text")]
    pub value: Bytes,
}

impl StoredResponse {
    /// Keeps `status`, `headers` and `body`. Hop-by-hop headers
    /// (`connection`, `transfer-encoding`, …) describe one connection, not
    /// the response, and are left out.
    pub(crate) fn new(status: StatusCode, headers: &HeaderMap, body: Bytes) -> Self {
        StoredResponse {
            status: status.as_u16(),
            headers: stored_headers(headers),
            body,
            trailers: Vec::new(),
        }
    }

    /// The same response, ended by `trailers`.
    pub(crate) fn with_trailers(mut self, trailers: &HeaderMap) -> Self {
        self.trailers = stored_headers(trailers);
        self
    }

    /// The response again, its body made by `body` of the bytes and the
    /// trailers that ended them, if any. A header or trailer that no longer
    /// parses (the store was edited by hand) is skipped, and so is any past
    /// the most a header map holds: a hostile record never panics.
    pub(crate) fn to_response<B>(
        &self,
        body: impl FnOnce(Bytes, Option<HeaderMap>) -> B,
    ) -> Response<B> {
        let trailers = (!self.trailers.is_empty()).then(|| header_map(&self.trailers));
        let mut response = Response::new(body(self.body.clone(), trailers));
        *response.status_mut() =
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        *response.headers_mut() = header_map(&self.headers);
        response
    }

    /// The bytes this response occupies: body, header and trailer names and
    /// values.
    pub fn len_bytes(&self) -> usize {
        let fields = |list: &[StoredResponseHeader]| {
            list.iter()
                .map(|h| h.name.len() + h.value.len())
                .sum::<usize>()
        };
        self.body.len() + fields(&self.headers) + fields(&self.trailers)
    }
}

fn stored_headers(headers: &HeaderMap) -> Vec<StoredResponseHeader> {
    headers
        .iter()
        .filter(|(name, _)| !is_hop_by_hop(name))
        .map(|(name, value)| StoredResponseHeader {
            name: name.as_str().to_owned(),
            value: Bytes::copy_from_slice(value.as_bytes()),
        })
        .collect()
}

fn header_map(list: &[StoredResponseHeader]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for header in list {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(header.name.as_bytes()),
            HeaderValue::from_bytes(&header.value),
        ) {
            if headers.try_append(name, value).is_err() {
                break;
            }
        }
    }
    headers
}

/// RFC 9110 §7.6.1's connection-specific headers.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// What a store keeps under a key. Redis keeps its JSON; the in-flight form
/// is compared byte for byte by the owner-only script, so it must encode the
/// same way every time (serde_json's output for a struct is deterministic).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub(crate) enum Record {
    /// The fields of its claim, after the tag.
    InFlight(ClaimToken),
    Completed {
        fingerprint: String,
        completion: Completion,
    },
}

impl Record {
    pub(crate) fn completed(fingerprint: &str, completion: Completion) -> Self {
        Record::Completed {
            fingerprint: fingerprint.to_owned(),
            completion,
        }
    }

    /// What a claim that found this record reports.
    pub(crate) fn into_claim(self) -> Claim {
        match self {
            Record::InFlight(claim) => Claim::InFlight {
                fingerprint: claim.fingerprint,
            },
            Record::Completed {
                fingerprint,
                completion,
            } => Claim::Completed {
                fingerprint,
                completion,
            },
        }
    }

    /// `true` when this is the in-flight record of `claim`.
    pub(crate) fn is_held_by(&self, claim: &ClaimToken) -> bool {
        matches!(self, Record::InFlight(held) if held.token == claim.token)
    }
}

/// `ttl` cut to [`MAX_TTL`].
pub(crate) fn bounded(ttl: Duration) -> Duration {
    ttl.min(MAX_TTL)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The owner-only script compares the in-flight record byte for byte,
    /// so nodes of one fleet must write it alike, across versions too.
    #[test]
    fn the_in_flight_record_encodes_as_it_always_has() {
        let claim = ClaimToken::new("POST /orders body=unknown");
        let json = serde_json::to_string(&Record::InFlight(claim.clone())).unwrap();
        let expected = format!(
            r#"{{"state":"in_flight","token":"{}","fingerprint":"POST /orders body=unknown"}}"#,
            claim.token()
        );
        assert_eq!(json, expected);
        let back: Record = serde_json::from_str(&expected).unwrap();
        assert!(back.is_held_by(&claim));
    }

    #[test]
    fn a_stored_response_comes_back_byte_for_byte_without_hop_by_hop_headers() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.append("set-cookie", HeaderValue::from_static("a=1"));
        headers.append("set-cookie", HeaderValue::from_static("b=2"));
        headers.insert("x-raw", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        headers.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        headers.insert("connection", HeaderValue::from_static("close"));
        let body = Bytes::from_static(b"\x00\xff{}");
        let stored = StoredResponse::new(StatusCode::ACCEPTED, &headers, body.clone());
        // Through the JSON a Redis store keeps.
        let record = Record::Completed {
            fingerprint: "f".into(),
            completion: Completion::Response(stored),
        };
        let json = serde_json::to_vec(&record).unwrap();
        let Record::Completed {
            completion: Completion::Response(stored),
            ..
        } = serde_json::from_slice(&json).unwrap()
        else {
            panic!("a completed record decodes as one");
        };
        let response = stored.to_response(|b, _| b);
        assert_eq!(response.status(), StatusCode::ACCEPTED);
        assert_eq!(*response.body(), body);
        let set_cookie: Vec<_> = response.headers().get_all("set-cookie").iter().collect();
        assert_eq!(set_cookie, ["a=1", "b=2"]);
        assert_eq!(response.headers()["x-raw"].as_bytes(), b"caf\xe9");
        assert!(!response.headers().contains_key("transfer-encoding"));
        assert!(!response.headers().contains_key("connection"));
        assert_eq!(response.headers().len(), 4);
    }

    /// A record with more headers than a header map can hold (a tampered
    /// store) is replayed with what fits, never a panic; trailers survive
    /// the JSON form.
    #[test]
    fn hostile_records_never_panic_and_trailers_round_trip() {
        let headers = (0..40_000)
            .map(|i| StoredResponseHeader {
                name: format!("x-h{i}"),
                value: Bytes::from_static(b"v"),
            })
            .collect();
        let hostile = StoredResponse {
            status: 1000,
            headers,
            body: Bytes::new(),
            trailers: Vec::new(),
        };
        let response = hostile.to_response(|b, _| b);
        assert!(response.headers().len() < 40_000);
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);

        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let stored = StoredResponse::new(StatusCode::OK, &HeaderMap::new(), "x".into())
            .with_trailers(&trailers);
        let json = serde_json::to_string(&stored).unwrap();
        let back: StoredResponse = serde_json::from_str(&json).unwrap();
        let trailers_of = |stored: &StoredResponse| stored.to_response(|_, t| t).into_body();
        assert_eq!(trailers_of(&back), Some(trailers));
        let plain = StoredResponse::new(StatusCode::OK, &HeaderMap::new(), "x".into());
        let json = serde_json::to_string(&plain).unwrap();
        assert!(!json.contains("trailers"), "{json}");
        assert_eq!(trailers_of(&plain), None);
    }

    proptest::proptest! {
        /// Any bytes survive the JSON text form; garbage in a record never
        /// panics the decoder.
        #[test]
        fn bytes_round_trip_and_garbage_is_an_error(
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
            garbage in "\\PC{0,40}",
        ) {
            let stored = StoredResponse {
                status: 200,
                headers: Vec::new(),
                body: Bytes::from(body),
                trailers: Vec::new(),
            };
            let json = serde_json::to_string(&stored).unwrap();
            let back: StoredResponse = serde_json::from_str(&json).unwrap();
            proptest::prop_assert_eq!(back, stored);
            let hostile = format!(r#"{{"status":200,"headers":[],"body":{{"hex":"{garbage}"}}}}"#);
            let _ = serde_json::from_str::<StoredResponse>(&hostile);
        }
    }
}
