// The README's examples classify HTTP responses: it is the crate's
// documentation when the `http` feature (a default) is on.
#![cfg_attr(feature = "http", doc = include_str!("../README.md"))]
#![cfg_attr(
    not(feature = "http"),
    doc = "One error classification for the tower resilience layers: the `Classify` \
           trait, its outcomes and the error-chain classifier. The full documentation, \
           with the HTTP and gRPC classifiers, is built with the `http` feature (on by default)."
)]
#![warn(
    missing_debug_implementations,
    missing_docs,
    rust_2018_idioms,
    unreachable_pub
)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod classified;
mod classify;
mod coarse_clock;
mod error;
mod error_chain;
mod log_limit;
mod outcome;
mod refusal;
mod retry_on;
#[cfg(feature = "http")]
mod settle;

pub mod attempts;
#[cfg(feature = "serde")]
pub mod config;
pub mod deadline;
pub mod duration;
#[cfg(feature = "http")]
pub mod grpc;
#[cfg(feature = "http")]
pub mod hint;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "http")]
pub mod status;
#[cfg(feature = "tower-http")]
pub mod tower_http;

pub use self::classified::Classified;
pub use self::classify::{classify_fn, Classify, ClassifyExt, ClassifyFn, Map, MapOutcome, Or};
pub use self::coarse_clock::CoarseClock;
pub use self::error::{BoxError, ConfigError};
pub use self::error_chain::{AsDynError, ErrorChainClassifier};
#[cfg(feature = "http")]
pub use self::grpc::GrpcClassifier;
#[cfg(feature = "http")]
pub use self::http::HttpClassifier;
pub use self::log_limit::LogLimit;
pub use self::outcome::{Failure, FailureKind, Outcome, RetryHint};
pub use self::refusal::RefusalToken;
pub use self::retry_on::RetryOn;
#[cfg(feature = "http")]
pub use self::settle::{OnEnd, SettleBody, StreamEnd};

#[cfg(doctest)]
/// Checks that [`FailureKind`], [`RetryHint`] and [`Failure`] (which will
/// grow) stay `#[non_exhaustive]`, as the `backoff_from` readers and the
/// configuration types are; the last block is the allowed control.
///
/// [`Outcome`] is exhaustive on purpose: every layer must decide each of
/// success, failure or neither, and a fourth would fall silently into a
/// wildcard arm of every retry loop and breaker.
///
/// ```compile_fail
/// use tower_classify::{Failure, FailureKind};
/// let _ = Failure { kind: FailureKind::Timeout, hint: None };
/// ```
///
/// ```compile_fail
/// use std::time::Duration;
/// use tower_classify::RetryHint;
/// fn wait(hint: RetryHint) -> Option<Duration> {
///     match hint {
///         RetryHint::After(wait) => Some(wait),
///         RetryHint::DoNotRetry => None,
///     }
/// }
/// ```
///
/// ```
/// use std::time::Duration;
/// use tower_classify::{Failure, FailureKind, Outcome, RetryHint};
/// let failure = Failure::new(FailureKind::Timeout);
/// fn wait(hint: RetryHint) -> Option<Duration> {
///     match hint {
///         RetryHint::After(wait) => Some(wait),
///         _ => None,
///     }
/// }
/// fn settled(outcome: Outcome) -> bool {
///     match outcome {
///         Outcome::Success => true,
///         Outcome::Failure(_) => false,
///         Outcome::Ignored => false,
///     }
/// }
/// # assert_eq!(failure.kind, FailureKind::Timeout);
/// # assert_eq!(wait(RetryHint::After(Duration::from_secs(1))), Some(Duration::from_secs(1)));
/// # assert!(settled(Outcome::Success));
/// ```
mod non_exhaustive {}
