//! A circuit breaker for tower services.
//!
//! A retry fixes a blip; it makes a sustained outage worse, because every
//! caller waits out every retry against a dependency that is down. A circuit
//! breaker notices the outage and fails calls at once — in well under a
//! millisecond, without touching the dependency — until it is time to check
//! whether the dependency is back.
//!
//! ```text
//!            N transient failures          recovery timeout over
//!   Closed ─────────────────────────▶ Open ─────────────────────▶ HalfOpen
//!     ▲                                 ▲                            │
//!     │        probe(s) succeed         │      a probe fails         │
//!     └─────────────────────────────────┼────────────────────────────┘
//!                                       └────────────────────────────┘
//! ```
//!
//! - **Closed**: calls pass. Only *transient* failures count
//!   ([`FailureKind::is_transient`](tower_classify::FailureKind::is_transient):
//!   server errors, rate limiting, timeouts, connection failures). A rejected
//!   request (a 4xx, a validation error), a poison message, another layer's
//!   load shedding and an [`Ignored`](tower_classify::Outcome::Ignored) outcome
//!   say nothing about the dependency's health and never trip it. The
//!   [`Policy`] decides when to open: 5 consecutive failures by default, or a
//!   failure rate over a count- or time-based sliding window with a minimum
//!   number of calls. A success slower than a
//!   [threshold](Builder::slow_call_threshold) can count as a failure.
//! - **Open**: calls fail with [`CircuitOpen`], which carries the remaining
//!   open time. The inner service is not called. After the recovery timeout
//!   (30 s by default, optionally [growing](Builder::max_recovery_timeout)
//!   exponentially, capped and jittered, while probes keep failing) the next
//!   call turns it half-open.
//! - **HalfOpen**: exactly one probe is admitted ([configurable](Builder::probes)),
//!   across all clones of the service. Success closes the breaker; failure
//!   reopens it. A probe whose future is dropped gives its slot back.
//!
//! Operators can [list, reset and force](BreakerHandle) breakers; with the
//! `admin` feature, over HTTP behind a bearer token.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower::{service_fn, Layer, Service, ServiceExt};
//! use tower_breaker::{CircuitBreakerLayer, CircuitOpen, State};
//! use tower_classify::{BoxError, ErrorChainClassifier};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let layer = CircuitBreakerLayer::builder()
//!     .failure_threshold(2)
//!     .recovery_timeout(Duration::from_secs(10))
//!     .build(ErrorChainClassifier::new())?;
//! let handle = layer.handle();
//!
//! // A dependency that refuses connections: a transient failure.
//! let mut service = layer.layer(service_fn(|_req: ()| async {
//!     Err::<(), BoxError>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into())
//! }));
//! for _ in 0..2 {
//!     let err = service.ready().await?.call(()).await.unwrap_err();
//!     assert!(err.is::<std::io::Error>());
//! }
//!
//! // Open: the next call fails fast, without reaching the dependency.
//! assert_eq!(handle.list()[0].state, State::Open);
//! let err = service.ready().await?.call(()).await.unwrap_err();
//! let open = err.downcast_ref::<CircuitOpen>().unwrap();
//! assert!(open.remaining().unwrap() <= Duration::from_secs(10));
//! # Ok(())
//! # }
//! ```
//!
//! # Shared state
//!
//! The breaker's state lives behind an `Arc` created when the **layer** is
//! built. Every service the layer wraps and every clone of those services
//! share it. This is what axum needs: `Router::layer` clones the service for
//! each request, and a breaker whose state were per clone would never open.
//! Build the layer once, at startup, and clone it where needed.
//!
//! # Where to put it: layer order
//!
//! The documented default order, outermost first, is
//!
//! ```text
//! DeadLetter → CircuitBreaker → Retry → (per-attempt Timeout) → service
//! ```
//!
//! The breaker sits *outside* the retry loop. It then counts one failure per
//! call that failed after all its retries — a request whose retries could not
//! save it — and, once open, it saves callers the whole retry loop
//! ("3 retries × 30 s") instead of one attempt. This is the order to pick when
//! the retry layer already handles blips and the breaker should react only to
//! outages that retries cannot hide.
//!
//! The other common order (Polly's and Resilience4j's) puts the retry layer
//! outside the breaker: `Retry → CircuitBreaker → Timeout → service`. Every
//! *attempt* is recorded, so the breaker opens sooner, and a retry against an
//! open circuit fails fast instead of reaching the dependency. For this to
//! work the retry layer must not spin on [`CircuitOpen`]: its
//! [`source`](std::error::Error::source) is a
//! [`tower_classify::Classified`] of kind
//! [`Shed`](tower_classify::FailureKind::Shed) carrying the remaining open
//! time, which an [`ErrorChainClassifier`](tower_classify::ErrorChainClassifier)
//! finds. A retry layer of this family treats it as "do not retry now", or
//! waits it out once when the remaining time fits inside its deadline — without
//! depending on this crate. Pick this order when you want the breaker to see
//! every attempt, e.g. with a failure-rate policy over individual requests.
//!
//! # With axum
//!
//! `CircuitOpen` is an error, and axum needs every error handled before it
//! reaches the router. Map it to `503 Service Unavailable` with
//! `HandleErrorLayer`, and pass `Retry-After` on:
//!
//! ```
//! use axum::{error_handling::HandleErrorLayer, http::StatusCode, routing::get, Router};
//! use axum::response::{IntoResponse, Response};
//! use tower::ServiceBuilder;
//! use tower_breaker::{CircuitBreakerLayer, CircuitOpen};
//! use tower_classify::{BoxError, HttpClassifier};
//!
//! async fn handle_error(err: BoxError) -> Response {
//!     match err.downcast_ref::<CircuitOpen>() {
//!         Some(open) => {
//!             let secs = open.remaining().map_or(1, |d| d.as_secs().max(1));
//!             (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", secs.to_string())], "CIRCUIT_OPEN")
//!                 .into_response()
//!         }
//!         None => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response(),
//!     }
//! }
//!
//! // Built once: every per-request clone shares this breaker.
//! let breaker = CircuitBreakerLayer::new(HttpClassifier::new());
//! let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(
//!     ServiceBuilder::new()
//!         .layer(HandleErrorLayer::new(handle_error))
//!         .layer(breaker),
//! );
//! # drop(app);
//! ```
//!
//! With the `http` feature, [`HttpCircuitBreakerLayer`] answers that `503`
//! itself (with a `CIRCUIT_OPEN` body), so no `HandleErrorLayer` is needed.
//!
//! # gRPC: failures in trailers
//!
//! A gRPC server answers most failures with a `200` head and reports the
//! status in the *trailers*, at the end of the body; only a "trailers-only"
//! response (an error before any message) puts `grpc-status` in the head. A
//! breaker that classifies the head sees a server answering `UNAVAILABLE` to
//! every call succeed every time. With the `grpc` feature,
//! [`into_grpc`](CircuitBreakerLayer::into_grpc) makes a
//! [`GrpcCircuitBreakerLayer`] whose responses are `Response<GrpcBody<B>>`:
//!
//! - The classifier judges the head, as before. When it calls the head a
//!   success, the status is `200`, the content type `application/grpc…` and
//!   the head has no `grpc-status`, the outcome is still open: the
//!   [`GrpcBody`] keeps the call's permit (and a half-open probe's slot) until
//!   the body ends, then records the trailers' `grpc-status` through
//!   [`GrpcClassifier::classify_end_of_stream`](tower_classify::GrpcClassifier::classify_end_of_stream):
//!   `0` is a success, `14 UNAVAILABLE` a server error that counts towards
//!   opening, `grpc-retry-pushback-ms` is read as in a head.
//! - A body that ends without `grpc-status` broke the protocol: it counts as
//!   `UNKNOWN`, a server error, the status tonic reports for it. A body error
//!   (a reset stream) counts as a connection failure.
//! - A body dropped before its end (the caller cancelled, or read only the
//!   first messages of a stream) records nothing, and a probe's slot is given
//!   back: the rule for a dropped response future.
//! - Everything else is settled by the head as in [`CircuitBreakerLayer`]: a
//!   trailers-only response, any other status, any other content type. Its
//!   body is passed through with nothing left to do.
//!
//! The body forwards every frame as it arrives and reads nothing ahead, so
//! server streams keep streaming; `size_hint` and `is_end_stream` are the
//! inner body's. A slow-call threshold times the call up to its response
//! head, so a long server stream is not a slow call.
//!
//! It is a separate layer rather than the default because the wrapper changes
//! the response type, and most HTTP stacks need neither the type change nor
//! the per-frame check. The plain [`CircuitBreakerLayer`] and the `503`-answering
//! [`HttpCircuitBreakerLayer`] keep deciding on the head and return the inner
//! body as it is. Put a breaker around a tonic `Channel` with `into_grpc()`:
//! the generated client takes the wrapped channel as its `GrpcService`, and an
//! open circuit reaches the caller as a `tonic::Status` (code `UNKNOWN`, as
//! tonic converts any service error) whose `source()` is the [`CircuitOpen`].
//!
//! Retries still decide on the head: once a response has started, gRPC does
//! not retry it (gRFC A6), so a failure that arrives in the trailers reaches
//! the breaker, not a retry layer.
//!
//! [`GrpcCircuitBreakerLayer`] has a runnable example.
//!
//! # Keyed breakers
//!
//! [`KeyedCircuitBreakerLayer`] keeps one breaker per key (a host, a route, a
//! `channel:connector` pair) in a map bounded at
//! [`max_breakers`](Builder::max_breakers), evicting closed breakers first
//! (least recently used, approximated in O(1)), open ones only when none is
//! closed, forced ones never. A call for a known key takes no lock shared
//! with other keys; its metrics are labelled per [`MetricsLabel`].
//!
//! # Rolling out
//!
//! [`Mode::MetricsOnly`] measures, logs and reports state changes and
//! would-be rejections but never rejects; [`Mode::Disabled`] turns the layer
//! into a pass-through.
//!
//! # Observability
//!
//! Every state change is a `tracing` event (`warn` when opening, `info`
//! otherwise) and calls the [state-change callback](Builder::on_state_change).
//! Metrics go through the `metrics` facade, labelled `breaker="<name>"` (a
//! keyed layer's breakers share the layer's name unless
//! [`metrics_label`](Builder::metrics_label) says otherwise). Each breaker
//! registers its handles when it is created, with the recorder installed at
//! that moment: install the recorder before building the layer.
//!
//! | name | kind | meaning |
//! |---|---|---|
//! | `tower_breaker_state` | gauge | see [`State::gauge_value`] |
//! | `tower_breaker_opened_total` | counter | transitions to open |
//! | `tower_breaker_rejected_total` | counter | calls refused |
//! | `tower_breaker_would_reject_total` | counter | calls a [`Mode::MetricsOnly`] breaker let through |
//!
//! # Readiness
//!
//! `poll_ready` forwards the inner service's readiness while the breaker
//! admits calls. While it refuses them, `poll_ready` is ready at once without
//! polling the inner service (whose client is often not ready during an
//! outage either) and the next `call` fails fast — tower's load-shed pattern.
//! With [`pending_when_open`](Builder::pending_when_open), `poll_ready`
//! instead stays `Pending` until the breaker would admit a call, so a
//! balancer routes around it.
//!
//! # Cost
//!
//! The closed path takes no lock: one atomic load on entry and, under the
//! default policy, one on completion, plus the reference count of the `Arc`
//! each response future holds (the breaker's state sits two cache lines away
//! from that count, so other cores' clones do not evict it).
//! `benches/closed_path.rs` compares it with other breakers; the README has
//! the numbers.
//!
//! # Features
//!
//! - `http`: [`HttpCircuitBreakerLayer`].
//! - `grpc`: [`GrpcCircuitBreakerLayer`], gRPC failures reported in trailers
//!   (implies `http`).
//! - `serde`: [`BreakerConfig`], configuration from files.
//! - `admin`: [`BreakerHandle::router`], an axum router over the admin handle.

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
pub use self::state::{CallEvent, CallKind, Mode, State, StateChange};
