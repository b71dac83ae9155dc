//! Hedging: a second copy of a slow request, within a budget.
//!
//! A [`HedgeLayer`] sends a call's first attempt at once. If no answer has
//! won after the hedge delay, it sends a copy (a *hedge*, Dean and
//! Barroso's "backup request"), and another one delay after each, up to
//! [`max_attempts`](HedgeBuilder::max_attempts) in flight. The first
//! answer that wins is the call's, and every other attempt is dropped at
//! once:
//!
//! - a success wins, and so does a failure another attempt cannot fix
//!   (`Rejected` or `Poison`: a `404`, a validation error; or any failure
//!   marked [`RetryHint::Final`](tower_classify::RetryHint::Final), as a
//!   gRPC hedging policy marks the statuses it calls fatal);
//! - a transient failure (a `503`, a reset connection, even with a
//!   server's "do not retry" hint) or a local refusal (`Shed`: an open
//!   circuit or a full queue below refused that attempt) waits for the
//!   other attempts, and **no hedge is sent after it**: hedging answers
//!   slowness, and retrying failures is a [retry layer](crate::RetryLayer)'s
//!   job, with its backoff and budget. When every attempt failed, the
//!   latest failure is the answer;
//! - an attempt whose copy of a streamed body could not be sent whole
//!   (another attempt read the body past its recording limit) waits too,
//!   and its "cannot be replayed" error is the answer only when no other
//!   attempt failed.
//!
//! # The delay
//!
//! Fixed ([`delay`](HedgeBuilder::delay)), or by default the percentile
//! `1 − max_extra_load` (p95 for 5 %, as Finagle's backup requests choose)
//! of recent latencies (3 % buckets), once the window holds
//! [`min_samples`](HedgeBuilder::min_samples) of them.
//!
//! Only **first attempts** are recorded: their latency when they answer
//! with a success, or, when a hedge won, how long they had run (a lower
//! bound, above the delay, so the percentile stays where it is). A hedge's
//! own latency is not recorded: it is only seen when it wins, so its
//! samples would be the fast ones, and a window of them drifts down and
//! hedges more and more (the bias of recording only winners).
//!
//! # The budget
//!
//! Hedges are extra load, sent when the dependency is slow, which may be
//! when it is overloaded. Each layer has its own [`TpsBudget`] allowing
//! hedges of at most [`max_extra_load`](HedgeBuilder::max_extra_load) of
//! the calls of the last 10 s (plus a floor of
//! [`min_hedges_per_sec`](HedgeBuilder::min_hedges_per_sec)); a hedge it
//! refuses is not sent and the call waits for its first attempt. A
//! [shared budget](HedgeBuilder::shared_budget) (a retry layer's, or gRFC
//! A6 retry throttling) is asked too.
//!
//! # What is hedged
//!
//! Only a request its [`Replay`](crate::replay::Replay) can copy:
//! [`HedgeLayer::http_builder`] uses [`HttpReplay`](crate::replay::HttpReplay),
//! so POST and PATCH are never hedged unless they carry an
//! `Idempotency-Key` or the builder is given
//! [`.map_replay(|replay| replay.retry_non_idempotent(true))`](crate::replay::HttpReplay::retry_non_idempotent),
//! and a streamed body is hedged only while its
//! [`ReplayBody`](crate::body::ReplayBody) recording holds it, and not
//! when the caller's deadline is [too close](HedgeBuilder::min_attempt_time).
//!
//! ```
//! use std::time::Duration;
//! use tower::{service_fn, Service, ServiceExt};
//! use tower_retry_budget::hedge::HedgeLayer;
//! use tower_layer::Layer;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), tower_classify::BoxError> {
//! let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
//! let counter = calls.clone();
//! // The first attempt takes a second; any other answers in 10 ms.
//! let slow_once = service_fn(move |name: &'static str| {
//!     let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
//!     async move {
//!         let took = if n == 0 { 1000 } else { 10 };
//!         tokio::time::sleep(Duration::from_millis(took)).await;
//!         Ok::<_, std::io::Error>(format!("hello, {name} (attempt {})", n + 1))
//!     }
//! });
//! let layer = HedgeLayer::builder()
//!     .delay(Duration::from_millis(50))
//!     .build()?;
//! let mut service = layer.layer(slow_once);
//!
//! let started = tokio::time::Instant::now();
//! let answer = service.ready().await?.call("world").await?;
//! assert_eq!(answer, "hello, world (attempt 2)");
//! assert_eq!(started.elapsed(), Duration::from_millis(60)); // 50 ms delay + 10 ms
//! # Ok(())
//! # }
//! ```
//!
//! [`TpsBudget`]: crate::budget::TpsBudget

mod future;
mod latency;
pub(crate) mod layer;
mod policy;
pub(crate) mod service;
mod telemetry;

pub use self::future::ResponseFuture;
pub use self::layer::{HedgeBuilder, HedgeLayer};
pub use self::service::Hedge;
pub(crate) use self::telemetry::describe_metrics;
