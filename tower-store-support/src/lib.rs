#![doc = include_str!("../README.md")]
#![warn(
    missing_debug_implementations,
    missing_docs,
    rust_2018_idioms,
    unreachable_pub
)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod bytes_text;
mod error;
#[cfg(feature = "redis")]
mod redis;
mod url;

pub use self::error::{StoreError, StoreErrorKind};
#[cfg(feature = "redis")]
pub use self::redis::{RedisConnectOptions, RedisConnection};
pub use self::url::redact_url;
