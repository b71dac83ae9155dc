//! One error classification for the tower resilience layers.
//!
//! A retry layer, a circuit breaker and a dead-letter layer each need to know
//! what a call's result *means*: was it a success, a failure a retry may fix, a
//! request that will never succeed, or input to set aside? This crate answers
//! that once, with the [`Classify`] trait, so that one classifier value,
//! configured once and cloned into every layer of a stack, makes them all agree.
//!
//! # Outcomes
//!
//! [`Classify::classify`] sees the response *or* the error of one call and
//! returns an [`Outcome`]: [`Success`](Outcome::Success),
//! [`Ignored`](Outcome::Ignored) (counts neither way) or a
//! [`Failure`] of some [`FailureKind`]:
//!
//! | kind | examples | retried | trips a breaker |
//! |---|---|---|---|
//! | [`ServerError`](FailureKind::ServerError) | HTTP ≥ 500 | yes | yes |
//! | [`RateLimited`](FailureKind::RateLimited) | 429, response rules | yes | yes |
//! | [`Timeout`](FailureKind::Timeout) | 408, `Elapsed`, `TimedOut` | yes | yes |
//! | [`Connection`](FailureKind::Connection) | reset, closed before the response, other I/O | yes | yes |
//! | [`NotSent`](FailureKind::NotSent) | refused, unreachable, a failed connect: never sent | yes, even not idempotent | yes |
//! | [`Rejected`](FailureKind::Rejected) | other 4xx, auth, parse errors | no | no |
//! | [`Poison`](FailureKind::Poison) | input that can never succeed | no | no |
//! | [`Shed`](FailureKind::Shed) | an open circuit, an exhausted budget, tower's `Overloaded` | waits its hint once | no |
//!
//! A failure may carry a [`RetryHint`]: a wait the server asked for
//! (`Retry-After`, `grpc-retry-pushback-ms`, a [`hint::BackoffFrom`] reader),
//! or an instruction not to retry at all.
//!
//! # Classifiers
//!
//! - [`HttpClassifier`]: HTTP status codes, `Retry-After`, [response
//!   rules](http::ResponseRule) for APIs that signal throttling without a 429,
//!   and errors through the error chain.
//! - [`GrpcClassifier`]: `grpc-status` and `grpc-retry-pushback-ms`, in the
//!   response headers or, once a streamed body has ended, in its trailers
//!   ([`GrpcClassifier::classify_end_of_stream`]).
//! - [`ErrorChainClassifier`]: walks an error's `source()` chain for
//!   `tower::timeout::error::Elapsed`, tower's load-shed `Overloaded`,
//!   `io::Error` kinds, `hyper::Error` and `hyper_util`'s client error (the
//!   `hyper` feature, on by default) and the family's own [`Classified`]
//!   errors.
//! - [`classify_fn`]: a closure.
//!
//! The other way round, [`grpc_status::GrpcStatusLayer`] answers the errors
//! of a stack in front of a gRPC service (an open circuit, an exhausted
//! budget, a deadline) as gRPC statuses (`UNAVAILABLE` with
//! `grpc-retry-pushback-ms`, `DEADLINE_EXCEEDED`, …) instead of `UNKNOWN`.
//! - Combinators in [`ClassifyExt`]: [`or`](ClassifyExt::or),
//!   [`map`](ClassifyExt::map) and [`retry_on`](ClassifyExt::retry_on) with a
//!   [`RetryOn`] class set.
//!
//! # Load shedding across crates
//!
//! The layers of the family do not depend on each other, yet a retry layer must
//! not spin on a breaker's open circuit. Each layer's own error type returns a
//! [`Classified`] from `source()`; the [`ErrorChainClassifier`] finds it, so every
//! layer recognises every other layer's errors through this crate alone.
//!
//! # Requests
//!
//! [`http::Idempotency`] decides whether a request may be sent twice
//! (RFC 9110 methods; POST and PATCH only with an `Idempotency-Key` header or
//! an explicit opt-in).
//!
//! # Example
//!
//! ```
//! use http::Response;
//! use tower_classify::{BoxError, Classify, FailureKind, HttpClassifier, Outcome};
//!
//! let classifier = HttpClassifier::new();
//!
//! // A response: 503 with `Retry-After: 2` is a server error with a 2 s hint.
//! let response = Response::builder()
//!     .status(503)
//!     .header("retry-after", "2")
//!     .body(())
//!     .unwrap();
//! let outcome = Classify::<_, BoxError>::classify(&classifier, Ok(&response));
//! let failure = outcome.as_failure().unwrap();
//! assert_eq!(failure.kind, FailureKind::ServerError);
//! assert_eq!(failure.retry_after(), Some(std::time::Duration::from_secs(2)));
//!
//! // An error: a refused connection, boxed as tower middleware returns it. The
//! // request never left, so even a POST may be sent again.
//! let error: BoxError = std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into();
//! let outcome = Classify::<Response<()>, _>::classify(&classifier, Err(&error));
//! assert_eq!(outcome, Outcome::failure(FailureKind::NotSent));
//! assert!(outcome.is_retryable());
//! ```
//!
//! # Features
//!
//! - `http` (default): [`HttpClassifier`], [`GrpcClassifier`], [`hint`],
//!   [`http::Idempotency`].
//! - `hyper` (default): recognise `hyper::Error` and `hyper_util`'s legacy
//!   client error in error chains.
//! - `tower-http`: [`tower_http::TowerHttpClassifier`], an adapter from
//!   tower-http's `ClassifyResponse`.
//! - `serde`: [`config`] types that deserialize from configuration files.

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
pub use self::outcome::{Failure, FailureKind, Outcome, RetryHint};
pub use self::retry_on::RetryOn;
