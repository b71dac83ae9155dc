#![doc = include_str!("../README.md")]
#![warn(
    missing_debug_implementations,
    missing_docs,
    rust_2018_idioms,
    unreachable_pub
)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "admin-page")]
mod admin_page;
pub mod config;
pub mod error;
mod layer;
mod load;
#[cfg(feature = "json-schema")]
mod schema;

#[cfg(feature = "admin-page")]
pub use self::admin_page::AdminPage;
pub use self::config::ResilienceConfig;
pub use self::error::LoadError;
pub use self::layer::{ResilienceLayer, ResilienceService};
#[cfg(feature = "json-schema")]
pub use self::schema::{json_schema, json_schema_text};
