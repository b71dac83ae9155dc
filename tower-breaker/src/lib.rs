#![doc = include_str!("../README.md")]
#![warn(
    missing_debug_implementations,
    missing_docs,
    rust_2018_idioms,
    unreachable_pub
)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod admin;
#[cfg(feature = "admin")]
mod admin_router;
#[cfg(feature = "serde")]
mod config;
mod error;
mod events;
mod eviction;
pub mod future;
#[cfg(feature = "grpc")]
mod grpc;
#[cfg(feature = "http")]
mod http;
mod instruments;
mod keyed;
mod layer;
mod policy;
mod registry;
mod service;
mod service_builder;
mod state;
mod sync;

pub use self::admin::{BreakerHandle, BreakerSnapshot};
#[cfg(feature = "serde")]
pub use self::config::{BreakerConfig, FailureRateConfig, WindowConfig};
pub use self::error::CircuitOpen;
#[cfg(feature = "grpc")]
pub use self::grpc::{GrpcBody, GrpcCircuitBreaker, GrpcCircuitBreakerLayer};
#[cfg(feature = "http")]
pub use self::http::{HttpCircuitBreaker, HttpCircuitBreakerLayer};
pub use self::instruments::MetricsLabel;
pub use self::keyed::{KeyedCircuitBreaker, KeyedCircuitBreakerLayer};
pub use self::layer::{Builder, CircuitBreakerLayer};
pub use self::policy::{Policy, Window};
pub use self::service::CircuitBreaker;
pub use self::service_builder::ServiceBuilderExt;
pub use self::state::{CallEvent, CallKind, Mode, State, StateChange};
