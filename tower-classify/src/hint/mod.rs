//! Delay hints: what a response says about when to try again.
//!
//! A hint replaces a retry layer's computed backoff for one attempt. Every
//! parser is total ([crate docs](crate#what-it-reads)). A response rule reads,
//! most specific first, its [`BackoffFrom`] reader, its fixed `backoff`,
//! `Retry-After`, then the retry layer's backoff; a source missing or
//! unreadable falls through.

mod backoff_from;
mod instant;
mod json_path;
mod retry_after;

pub(crate) use self::backoff_from::{header_name, json_number};
pub use self::backoff_from::{BackoffFrom, WaitUnit};
pub use self::json_path::JsonPath;
pub(crate) use self::retry_after::{decimal, parse_http_date};
pub use self::retry_after::{parse_grpc_pushback, parse_retry_after};
