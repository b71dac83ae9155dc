//! HTTP: status classification, response rules and request idempotency.

mod idempotency;
mod rules;
mod status;

pub use self::idempotency::{Idempotency, IDEMPOTENCY_KEY};
pub use self::rules::{ResponseRule, ResponseRuleBuilder};
pub use self::status::HttpClassifier;
#[cfg(feature = "serde")]
pub(crate) use self::status::StatusSet;

/// The bytes of a response body of a buffered type, recognised at run time
/// (a classifier sees whatever `B` the stack uses); `None` for a stream.
pub(crate) fn buffered_body<B: 'static>(body: &B) -> Option<&[u8]> {
    let any = body as &dyn std::any::Any;
    let bytes = any.downcast_ref::<bytes::Bytes>().map(|bytes| &bytes[..]);
    bytes
        .or_else(|| any.downcast_ref::<Vec<u8>>().map(Vec::as_slice))
        .or_else(|| any.downcast_ref::<String>().map(String::as_bytes))
        .or_else(|| any.downcast_ref::<&'static str>().map(|s| s.as_bytes()))
}
