//! Delay hints: what a response says about when to try again.
//!
//! A hint found here replaces a retry layer's computed backoff for that one
//! attempt. Every parser is total ([crate docs](crate#what-it-reads)): bad
//! values read as "no hint" (for gRPC pushback, "do not retry"), and a retry
//! layer's `max_wait` refuses waits that are merely absurd.
//!
//! The order a response rule reads them in, most specific first: the rule's
//! [`BackoffFrom`] reader, then its fixed `backoff`, then `Retry-After`, then the
//! retry layer's own backoff. A source that is missing or unreadable falls
//! through to the next.

mod backoff_from;
mod instant;
mod json_path;
mod retry_after;

pub(crate) use self::backoff_from::header_name;
pub use self::backoff_from::{BackoffFrom, WaitUnit};
pub use self::json_path::JsonPath;
pub(crate) use self::retry_after::{decimal, parse_http_date};
pub use self::retry_after::{parse_grpc_pushback, parse_retry_after};
