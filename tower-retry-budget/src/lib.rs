//! Retry for tower services: backoff with jitter, one deadline for the whole
//! loop, server hints, idempotency and lock-free retry budgets.
//!
//! [`RetryLayer`] retries the calls of the service it wraps when
//! [`tower-classify`](tower_classify) says a failure is transient (server
//! error, rate limited, timeout, connection), sleeping a [`Backoff`] between
//! attempts, and stops:
//!
//! - after `max_retries` retries (at most 16), returning the last result as is;
//! - when the next sleep would cross the **deadline** of the whole loop
//!   (attempts and sleeps together): the last result is returned at once;
//! - when the [retry budget](budget) shared by all clones is spent, at once,
//!   never a sleep: a failed response comes back as it is (the upstream's 503,
//!   its `Retry-After`, its body), an error as
//!   [`BudgetExhausted`](error::BudgetExhausted);
//! - when the server asks for a wait (`Retry-After`, gRPC pushback, a response
//!   rule) longer than `max_wait` (1 h) or past the deadline:
//!   [`WaitTooLong`](error::WaitTooLong), naming the wait;
//! - when the request cannot be sent twice: POST and PATCH without an
//!   `Idempotency-Key` header, or a streamed body that outgrew its recording
//!   limit ([`body`]).
//!
//! A `2xx` that the classifier calls a failure (a `match_success` response
//! rule caught a throttled answer) is never handed back as data when retrying
//! stops: it comes back as [`FailedSuccess`](error::FailedSuccess).
//!
//! The decision is made on the response *head*: once a response has
//! started, the call is committed (gRPC's own rule, gRFC A6), and a failure
//! that a gRPC server reports in the trailers of a started stream goes back
//! to the caller as it is. Request bodies stream ([`body`]): nothing is read
//! before the first attempt.
//!
//! A failed `http::Response` handed back carries a [`RetryStopped`] extension
//! saying why retrying stopped ([`StopReason`]) and how many attempts ran; a
//! retry layer outside hands back one that stopped on a spent budget without
//! retrying it. A server's hint replaces the computed backoff for that
//! attempt. Before every retry the inner service is driven ready again, and
//! dropping the response future cancels a pending sleep at once.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
//! use tower_retry_budget::{backoff::Backoff, budget::TpsBudget, RetryLayer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), tower_classify::BoxError> {
//! let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
//! let counter = calls.clone();
//! // Fails twice with a connection reset, then answers.
//! let flaky = service_fn(move |name: &'static str| {
//!     let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
//!     async move {
//!         if n < 2 {
//!             Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
//!         } else {
//!             Ok(format!("hello, {name}"))
//!         }
//!     }
//! });
//!
//! let mut service = ServiceBuilder::new()
//!     .layer(
//!         RetryLayer::builder()
//!             .max_retries(3)
//!             .backoff(Backoff::exponential(Duration::from_millis(100)))
//!             .deadline(Duration::from_secs(5))
//!             .budget(TpsBudget::default())
//!             .build()?,
//!     )
//!     .service(flaky);
//!
//! let answer = service.ready().await?.call("world").await?;
//! assert_eq!(answer, "hello, world");
//! assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
//! # Ok(()) }
//! ```
//!
//! For HTTP, [`RetryLayer::http`] classifies statuses and `Retry-After` with
//! [`HttpClassifier`](tower_classify::HttpClassifier) and replays only
//! idempotent requests; [`policy::default_retry`] and
//! [`policy::default_retry_non_idempotent`] are Google Cloud Workflows'
//! presets. With the `serde` feature, [`config::RetryConfig`] reads the same
//! settings from a configuration file.
//!
//! # Where to put it: layer order
//!
//! The documented order, outermost first, is
//!
//! ```text
//! DeadLetter → CircuitBreaker → Retry → (per-attempt Timeout) → service
//! ```
//!
//! The breaker sits **outside** the retry loop: it sees one outcome per
//! *logical* call, after retries, and when it opens it saves callers the whole
//! "3 retries × 30 s" wait instead of one attempt of it. The timeout sits
//! inside, so each attempt gets its own (or use
//! [`attempt_timeout`](RetryBuilder::attempt_timeout)). When the retry layer
//! gives up on its own (budget spent, wait too long, deadline), its error
//! carries a [`Classified`](tower_classify::Classified) with the last failure's
//! *transient* kind and a `DoNotRetry` hint: the breaker counts it as the
//! dependency failure it is, and no outer retry layer retries it (see
//! [`error`]).
//!
//! The other common order (Polly's and Resilience4j's) puts **Retry outside
//! the breaker**, so every attempt is recorded by the breaker:
//!
//! ```text
//! Retry → CircuitBreaker → service
//! ```
//!
//! Pick it when the breaker should react to individual attempts (it opens
//! sooner). The retry layer then sees the breaker's `CircuitOpen`, which is a
//! [`Shed`](tower_classify::FailureKind::Shed) failure: it is never retried at
//! once. If the breaker says when it will half-open, the layer has a
//! deadline that time fits in, and it is no longer than the backoff's
//! `max_delay`, the layer waits it out **once**, plus up to a quarter more at
//! random so that callers refused together do not return together; otherwise
//! (no deadline set, above all) it returns the `CircuitOpen` error
//! immediately rather than sleep through the recovery. The attempt after such
//! a wait spends no retry budget: the refused attempt never reached the
//! dependency, so it adds no load to it.
//!
//! # Why budgets
//!
//! `max_retries` bounds one request, not the fleet: during an outage every
//! request retries, and 3 retries quadruple the load on a service that is
//! already failing. A [budget] caps retries at a fraction of recent
//! traffic (20 % plus 10/s by default) and is shared by every clone of the
//! layer, so a full outage costs at most 1.2× the normal load. Every layer
//! built without [`no_budget`](RetryBuilder::no_budget) gets one.
//!
//! # Observability
//!
//! - `tracing`: a `debug` event per retry (attempt, class, wait), an `info`
//!   event per give-up (reason: `attempts`, `deadline`, `budget`,
//!   `wait_too_long`, `shed`).
//! - `metrics`: counters `tower_retry_retries_total{class}`,
//!   `tower_retry_giveups_total{reason}`, `tower_retry_budget_exhausted_total`
//!   and the histogram `tower_retry_sleep_seconds`.
//! - [`on_retry`](RetryBuilder::on_retry): your own callback per retry.
//! - [`attempt_header`](RetryBuilder::attempt_header): mark retried HTTP
//!   requests with the number of attempts before them
//!   (`grpc-previous-rpc-attempts`), so servers can shed retries first.
//!
//! # Features
//!
//! - `http` (default): `http::Request` replay ([`replay::HttpReplay`]), the
//!   [`body`] adapter and the presets.
//! - `hyper` (default): the error classifier recognises `hyper::Error` and
//!   `hyper_util`'s client error, so a GET that meets a stale keep-alive
//!   connection (`IncompleteMessage`) is retried, and a failed connect is
//!   known not to have sent the request.
//! - `serde`: [`config::RetryConfig`].

#![warn(
    missing_debug_implementations,
    missing_docs,
    rust_2018_idioms,
    unreachable_pub
)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backoff;
#[cfg(feature = "http")]
pub mod body;
pub mod budget;
#[cfg(feature = "serde")]
pub mod config;
pub mod error;
pub mod future;
mod layer;
pub mod policy;
pub mod replay;
mod service;

pub use self::backoff::{Backoff, BackoffKind, Jitter};
pub use self::layer::{RetryBuilder, RetryLayer, MAX_RETRIES_LIMIT};
pub use self::policy::{GiveUpEvent, RetryEvent, RetryStopped, StopReason, SuccessAfterRetries};
pub use self::service::Retry;
