#![doc = include_str!("../README.md")]
#![warn(
    missing_debug_implementations,
    missing_docs,
    rust_2018_idioms,
    unreachable_pub
)]
#![forbid(unsafe_code)]

mod body;
mod error;
mod head;

pub use self::body::{Recording, ReplayBody};
pub use self::error::{ReplayError, ReplayErrorKind};
pub use self::head::{CopiedHeader, Headers, RequestHead};
