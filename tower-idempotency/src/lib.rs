#![doc = include_str!("../README.md")]
#![warn(
    missing_debug_implementations,
    missing_docs,
    rust_2018_idioms,
    unreachable_pub
)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod body;
mod client;
pub mod config;
mod error;
pub mod future;
mod key;
mod layer;
mod observability;
mod rejection;
mod run_to_end;
mod service;
pub mod store;

pub use self::body::GuardBody;
pub use self::client::{IdempotencyKeyLayer, SetIdempotencyKey};
pub use self::future::ResponseFuture;
pub use self::key::MAX_KEY_LEN;
pub use self::layer::{IdempotencyGuardLayer, MIN_TTL};
pub use self::observability::describe_metrics;
pub use self::rejection::Rejection;
pub use self::service::{IdempotencyGuard, IDEMPOTENT_REPLAYED};
/// What an idempotency store fails with (from `tower-store-support`).
pub use tower_store_support::StoreError;
pub use tower_store_support::StoreErrorKind;

/// Not part of the API. Public only so the workspace's fuzz targets
/// (`fuzz/`) can call the `Idempotency-Key` parser directly, without a
/// guard, a store and a runtime around every input.
#[doc(hidden)]
pub mod __fuzz {
    use http::HeaderValue;

    use crate::Rejection;

    /// The key an `Idempotency-Key` header value names, or why it is refused.
    pub fn parse_idempotency_key(value: &HeaderValue) -> Result<&str, Rejection> {
        crate::key::parse(value)
    }
}
