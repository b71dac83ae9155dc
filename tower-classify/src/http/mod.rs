//! HTTP: status classification, response rules and request idempotency.

mod idempotency;
mod rules;
mod status;

pub use self::idempotency::{Idempotency, IDEMPOTENCY_KEY};
pub use self::rules::{ResponseRule, ResponseRuleBuilder};
pub use self::status::HttpClassifier;
#[cfg(feature = "serde")]
pub(crate) use self::status::StatusSet;

/// The bytes of a response body that is already buffered in memory.
///
/// Body rules can only look at a body that is already in memory. A classifier
/// sees `&Response<B>` for whatever `B` the stack uses, so it recognises the
/// common buffered body types (`Bytes`, `Vec<u8>`, `String`, `&'static str`)
/// at run time and reads nothing from a streaming body. Buffer a streaming body
/// (up to a limit you choose) before classifying it if you need body rules.
pub(crate) fn buffered_body<B: 'static>(body: &B) -> Option<&[u8]> {
    let any = body as &dyn std::any::Any;
    let bytes = any.downcast_ref::<bytes::Bytes>().map(|bytes| &bytes[..]);
    bytes
        .or_else(|| any.downcast_ref::<Vec<u8>>().map(Vec::as_slice))
        .or_else(|| any.downcast_ref::<String>().map(String::as_bytes))
        .or_else(|| any.downcast_ref::<&'static str>().map(|s| s.as_bytes()))
}
