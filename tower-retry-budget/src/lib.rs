#![doc = include_str!("../README.md")]
#![warn(
    missing_debug_implementations,
    missing_docs,
    rust_2018_idioms,
    unreachable_pub
)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backoff;
#[cfg(feature = "http")]
pub mod body;
pub mod budget;
mod cold;
#[cfg(feature = "serde")]
pub mod config;
pub mod error;
mod events;
pub mod future;
pub mod hedge;
mod layer;
mod policy;
#[cfg(feature = "http")]
pub mod presets;
pub mod replay;
mod service;
#[cfg(feature = "grpc-service-config")]
pub mod service_config;
mod telemetry;

pub use self::backoff::{Backoff, BackoffKind, Jitter};
pub use self::events::{GiveUpEvent, RetryEvent, RetryStopped, StopReason, SuccessAfterRetries};
pub use self::layer::{RetryBuilder, RetryLayer, MAX_RETRIES_LIMIT};
pub use self::service::Retry;
pub use self::telemetry::describe_metrics;
