#![doc = include_str!("../README.md")]
#![warn(
    missing_debug_implementations,
    missing_docs,
    rust_2018_idioms,
    unreachable_pub
)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod classify;
mod error;
mod error_chain;
mod log_limit;
mod outcome;
mod retry_on;

#[cfg(feature = "serde")]
pub mod config;
pub mod duration;
#[cfg(feature = "http")]
pub mod grpc;
#[cfg(feature = "http")]
pub mod grpc_status;
#[cfg(feature = "http")]
pub mod hint;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "tower-http")]
pub mod tower_http;

pub use self::classify::{
    classify_fn, Classify, ClassifyExt, ClassifyFn, Map, MapOutcome, Or, RetryOnFilter,
};
pub use self::error::{BoxError, Classified, ConfigError};
pub use self::error_chain::{AsDynError, ErrorChainClassifier};
#[cfg(feature = "http")]
pub use self::grpc::GrpcClassifier;
#[cfg(feature = "http")]
pub use self::http::HttpClassifier;
pub use self::log_limit::LogLimit;
pub use self::outcome::{Failure, FailureKind, Outcome, RetryHint};
pub use self::retry_on::RetryOn;
