#![doc = include_str!("../README.md")]
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
mod cold;
#[cfg(feature = "serde")]
pub mod config;
pub mod error;
mod events;
pub mod future;
pub mod hedge;
mod layer;
mod policy;
#[cfg(feature = "http")]
pub mod presets;
pub mod replay;
mod service;
#[cfg(feature = "grpc-service-config")]
pub mod service_config;
mod telemetry;

pub use self::backoff::{Backoff, BackoffKind, Jitter};
pub use self::events::{RetryEvent, RetryStopped, StopReason, SuccessAfterRetries};
pub use self::layer::{RetryBuilder, RetryLayer, MAX_RETRIES_LIMIT};
pub use self::service::Retry;

/// Registers the descriptions of the retry and hedge layers' metrics with
/// the installed `metrics` recorder.
///
/// [`RetryBuilder::build`](crate::RetryBuilder::build) and
/// [`HedgeBuilder::build`](crate::hedge::HedgeBuilder::build) call it for their
/// layer, so an exporter installed before the layers are built describes
/// every series; call it yourself after installing a recorder later.
///
/// # What a retry layer reports
///
/// Everything a layer reports carries its [name](crate::RetryBuilder::name):
/// the `retry` label of every metric, a field of every event and span.
///
/// | metric | type | labels | meaning |
/// |---|---|---|---|
/// | `tower_retry_retries_total` | counter | `retry`, `class` | retries sent, by the failure class that caused them |
/// | `tower_retry_giveups_total` | counter | `retry`, `reason` | calls ended failed because a retry was not allowed |
/// | `tower_retry_budget_exhausted_total` | counter | `retry` | retries refused by the budget |
/// | `tower_retry_sleep_seconds` | histogram | `retry` | time slept before a retry |
///
/// Spans, at `debug` (as tower-http's `TraceLayer`), are made only when a
/// subscriber records them (a call without one costs one null pointer):
///
/// - `retry` per logical call: `retry` (the name), `attempts`, `outcome`
///   (`success` or `failure`), `error.type` (the class of the last
///   failure), and `stop_reason` when the layer stopped retrying
///   (`attempts`, `deadline`, `budget`, `wait_too_long`, `shed`,
///   `not_retried`, `not_replayable`);
/// - `retry_attempt` per attempt, a child of the call's span and the parent
///   of whatever the service below logs or traces: `attempt` (1-based),
///   `http.request.resend_count` on every attempt after the first
///   (OpenTelemetry's name), `outcome`, `error.type`, and `wait`, the sleep
///   before the next attempt when it failed and is retried. A failed
///   attempt's span ends when it fails, not after the sleep.
///
/// Events: `debug` per retry (attempt, class, wait) and per give-up; a
/// give-up is also logged at `warn`, at most once per 10 s per layer, with
/// `since_last_warning`, the number of give-ups it stands for, so an outage
/// shows without a line per call.
///
/// # What a hedge layer reports
///
/// Everything carries the layer's [name](crate::hedge::HedgeBuilder::name), the
/// `hedge` label of every metric:
///
/// | metric | type | labels | meaning |
/// |---|---|---|---|
/// | `tower_hedge_sent_total` | counter | `hedge` | hedges sent: attempts after a call's first |
/// | `tower_hedge_won_total` | counter | `hedge` | calls answered by a hedge rather than by their first attempt |
/// | `tower_hedge_cancelled_total` | counter | `hedge` | attempts dropped because another attempt of the call answered first |
/// | `tower_hedge_refused_total` | counter | `hedge`, `reason` | hedges due but not sent (`budget`, `deadline`, `not_ready`, `not_replayable`) |
/// | `tower_hedge_delay_seconds` | gauge | `hedge` | the current percentile delay (NaN before enough samples) |
///
/// Each hedge runs inside a `hedge_attempt` span at `debug`, made only when
/// a subscriber records it.
pub fn describe_metrics() {
    telemetry::describe_retry_metrics();
    hedge::describe_metrics();
}
