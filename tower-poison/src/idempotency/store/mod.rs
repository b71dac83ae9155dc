//! Idempotency stores: who holds a key, and the response to replay.
//!
//! [`IdempotencyStore`] is the interface the
//! [`IdempotencyGuard`](super::IdempotencyGuard) uses. A key goes through
//! three states:
//!
//! ```text
//!            claim                 complete (owner only)
//!  absent ────────────▶ in flight ─────────────────────▶ completed ──▶ absent
//!    ▲                     │        (kept for the TTL)        (TTL)
//!    └─────────────────────┘
//!     release (owner only), or the in-flight TTL runs out
//! ```
//!
//! Two implementations ship here:
//!
//! - [`MemoryIdempotencyStore`]: one process, bounded, FIFO eviction of the
//!   oldest key when full, TTL on tokio's clock.
//! - [`RedisIdempotencyStore`] (feature `redis`): shared by every node of a
//!   fleet; the claim is `SET NX PX`, completion and release are Lua scripts
//!   that act only while the caller still owns the claim.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use serde::{Deserialize, Serialize};

use crate::store::StoreError;

mod memory;
#[cfg(feature = "redis")]
mod redis;

pub use self::memory::MemoryIdempotencyStore;
#[cfg(feature = "redis")]
pub use self::redis::{RedisIdempotencyStore, RedisIdempotencyStoreBuilder};

#[cfg(test)]
mod tests {
    use super::*;

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
        let json = serde_json::to_vec(&stored).unwrap();
        let stored: StoredResponse = serde_json::from_slice(&json).unwrap();
        let response = stored.to_response(|b| b);
        assert_eq!(response.status(), StatusCode::ACCEPTED);
        assert_eq!(*response.body(), body);
        let set_cookie: Vec<_> = response.headers().get_all("set-cookie").iter().collect();
        assert_eq!(set_cookie, ["a=1", "b=2"]);
        assert_eq!(response.headers()["x-raw"].as_bytes(), b"caf\xe9");
        assert!(!response.headers().contains_key("transfer-encoding"));
        assert!(!response.headers().contains_key("connection"));
        assert_eq!(response.headers().len(), 4);
    }
}

/// Where the idempotency guard keeps its keys.
///
/// Every method is asynchronous and returns a `Send` future. Implementations
/// are cheap to clone and clones share their state. An error means the store
/// could not answer; the guard then refuses the request (503) rather than run
/// it unguarded.
pub trait IdempotencyStore: Clone + Send + Sync + 'static {
    /// Claims `key` for a request whose fingerprint is `fingerprint`, unless
    /// the key is already in flight or completed. A claim not completed or
    /// released within `in_flight_ttl` lapses (its owner crashed).
    fn claim(
        &self,
        key: &str,
        fingerprint: &str,
        in_flight_ttl: Duration,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Stores `response` for the key `claim` holds and keeps it for `ttl`,
    /// only if the claim is still the one in the store (it has not lapsed,
    /// been evicted or been taken over). Returns whether it was stored.
    fn complete(
        &self,
        key: &str,
        claim: &ClaimToken,
        response: StoredResponse,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Gives the key up so the request can be tried again, only if `claim`
    /// is still the one in the store. Returns whether it was released.
    fn release(
        &self,
        key: &str,
        claim: &ClaimToken,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// What [`IdempotencyStore::claim`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The key was free and is now held by the caller.
    Acquired(ClaimToken),
    /// Another request holds the key and has not finished.
    InFlight {
        /// That request's fingerprint.
        fingerprint: String,
    },
    /// A request with this key finished; its response is kept.
    Completed {
        /// That request's fingerprint.
        fingerprint: String,
        /// Its response.
        response: StoredResponse,
    },
}

/// Proof of holding a key: a random owner token and the request's
/// fingerprint.
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

    /// The fingerprint of the request holding the key.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
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
    #[serde(with = "crate::entry::body_serde")]
    pub body: Bytes,
}

/// One header of a [`StoredResponse`], byte for byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponseHeader {
    /// The header name, lowercase.
    pub name: String,
    /// The value's bytes.
    #[serde(with = "crate::entry::body_serde")]
    pub value: Bytes,
}

impl StoredResponse {
    /// Keeps `status`, `headers` and `body`. Hop-by-hop headers
    /// (`connection`, `transfer-encoding`, …) describe one connection, not
    /// the response, and are left out.
    pub fn new(status: StatusCode, headers: &HeaderMap, body: Bytes) -> Self {
        StoredResponse {
            status: status.as_u16(),
            headers: headers
                .iter()
                .filter(|(name, _)| !is_hop_by_hop(name))
                .map(|(name, value)| StoredResponseHeader {
                    name: name.as_str().to_owned(),
                    value: Bytes::copy_from_slice(value.as_bytes()),
                })
                .collect(),
            body,
        }
    }

    /// The response again, with body type `B`. A header that no longer
    /// parses (the store was edited by hand) is skipped.
    pub fn to_response<B>(&self, body: impl FnOnce(Bytes) -> B) -> Response<B> {
        let mut response = Response::new(body(self.body.clone()));
        *response.status_mut() =
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let headers = response.headers_mut();
        for header in &self.headers {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(header.name.as_bytes()),
                HeaderValue::from_bytes(&header.value),
            ) {
                headers.append(name, value);
            }
        }
        response
    }
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
/// is compared byte for byte by the owner-only scripts, so it must encode the
/// same way every time (serde_json's output for a struct is deterministic).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub(crate) enum Record {
    InFlight {
        token: String,
        fingerprint: String,
    },
    Completed {
        fingerprint: String,
        response: StoredResponse,
    },
}

impl Record {
    pub(crate) fn in_flight(claim: &ClaimToken) -> Self {
        Record::InFlight {
            token: claim.token.clone(),
            fingerprint: claim.fingerprint.clone(),
        }
    }

    /// What a claim that found this record reports.
    pub(crate) fn into_claim(self) -> Claim {
        match self {
            Record::InFlight { fingerprint, .. } => Claim::InFlight { fingerprint },
            Record::Completed {
                fingerprint,
                response,
            } => Claim::Completed {
                fingerprint,
                response,
            },
        }
    }

    /// `true` when this is the in-flight record of `claim`.
    pub(crate) fn is_held_by(&self, claim: &ClaimToken) -> bool {
        matches!(self, Record::InFlight { token, .. } if *token == claim.token)
    }
}
