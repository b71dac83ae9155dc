//! Dead letters for tower: keep every call that finally failed, detect poison
//! messages, and let an operator inspect, replay and purge them.
//!
//! A retry layer handles transient faults and a circuit breaker sustained
//! outages, but some input will never succeed: a malformed payload, a deleted
//! account, a decommissioned endpoint. Without a dead-letter queue those calls
//! disappear, and nobody knows until a customer complains. [`DeadLetterLayer`]
//! writes each of them to a [`DeadLetterStore`](store::DeadLetterStore) (by
//! default a durable [`RedbStore`](store::RedbStore) file), with the request,
//! the error chain, the failure kind and the attempt count, so it can be
//! inspected and replayed once the cause is fixed.
//!
//! # What happens to a call
//!
//! The layer classifies each call's result with a
//! [`Classify`](tower_classify::Classify) value (default
//! [`HttpClassifier`](tower_classify::HttpClassifier)), the same one the retry
//! and breaker layers of the family use:
//!
//! - success (or an ignored result): returned as is;
//! - a failure: an entry is built (headers [redacted](Redactor), the body
//!   recorded while it streamed to the service, if within a limit) and the
//!   [`Action`] applies — [`Dlq`](Action::Dlq) stores it before
//!   the call returns, [`Drop`](Action::Drop) counts it and logs it once per key,
//!   [`Fail`](Action::Fail) stores nothing. The caller always gets the call's
//!   own result back: the inner error unchanged (boxed), or the failing
//!   response;
//! - a store that cannot write turns the call into a [`StoreFailed`] error,
//!   and a store at its limits into [`StoreFull`]: an entry is never lost
//!   silently.
//!
//! # Layer order
//!
//! Put the dead-letter layer *outermost*, outside the retry layer:
//!
//! ```text
//! DeadLetter → CircuitBreaker → Retry → (per-attempt Timeout) → CountAttempts → service
//! ```
//!
//! There it sees each call's *final* outcome: a transient failure the retry
//! layer fixed never reaches the store, and one it gave up on is stored once,
//! with the number of attempts made (counted by [`CountAttemptsLayer`] below
//! the retry layer). A [`Poison`](tower_classify::FailureKind::Poison) failure
//! is not retried, so it is stored on its first failure. The breaker sits
//! inside, so its `CircuitOpen` refusals are dead-lettered too, as
//! [`Shed`](tower_classify::FailureKind::Shed) entries that are worth
//! replaying once the dependency is back.
//!
//! Inside the retry layer (`Retry → DeadLetter → service`) the layer would see
//! every *attempt* and store a call once per failed try, including the tries a
//! retry later fixed: use that order only when every failure must be audited.
//!
//! # With axum
//!
//! The layer's error type is `BoxError` (it fails a call when its store cannot
//! write), and `axum::Router::layer` wants infallible services, so put axum's
//! `HandleErrorLayer` in front of it. The router's routes accept the
//! [`ReplayBody`] the layer hands on (it streams: nothing is read ahead).
//!
//! ```rust,ignore
//! use axum::{error_handling::HandleErrorLayer, http::StatusCode, BoxError, Router};
//! use tower::ServiceBuilder;
//!
//! let app = Router::new().route("/orders", post(create_order)).layer(
//!     ServiceBuilder::new()
//!         .layer(HandleErrorLayer::new(|error: BoxError| async move {
//!             // `StoreFailed`: the failed request could not be kept.
//!             (StatusCode::INTERNAL_SERVER_ERROR, error.to_string())
//!         }))
//!         .layer(DeadLetterLayer::new(store).label("orders-api")),
//! );
//! ```
//!
//! A server's handlers answer failures with 4xx/5xx responses, not errors;
//! the classifier decides which of those are stored (by default 5xx, 408,
//! 429 and other 4xx: narrow it with
//! [`HttpClassifier::retryable_statuses`](tower_classify::HttpClassifier::retryable_statuses)
//! or a [`map`](tower_classify::ClassifyExt::map) that turns `Rejected` into
//! success if client mistakes are not worth keeping).
//!
//! # Poison messages
//!
//! A queue consumer sees the same message again after a failure.
//! [`PoisonPolicy`] counts deliveries per message id; once `max_attempts`
//! deliveries have not succeeded, the next one goes to the store instead of
//! the inner service, and the caller gets a [`PoisonMessage`] error telling
//! it to acknowledge the message. [`describe_fn`] describes queue messages.
//!
//! The count is the queue's own when the request carries one
//! ([`DeliveryCount`] reads SQS's, RabbitMQ's and a forwarded Redis Streams
//! count; a consumer can insert a [`DeliveryAttempt`]); otherwise a
//! [`FailureCountStore`](counts::FailureCountStore) counts each delivery
//! before it runs, so a crashed worker's delivery still counts: in memory by
//! default, in a redb file, or in Redis for a fleet
//! ([`DeadLetterLayer::count_store`]). A count store that fails fails the
//! delivery with [`CountStoreFailed`], unprocessed and unacknowledged. See
//! [`counts`].
//!
//! # Operating the store
//!
//! From code: [`DeadLetterStore`](store::DeadLetterStore) (`list`, `get`,
//! `remove`, `purge`, `depth`, `oldest_age`, `stats`, and `claim`/`release`
//! leases for replay) and [`replay()`](crate::replay()). The durable stores
//! are bounded (entries and bytes, see [`store`]'s limits).
//! From a shell, with the `cli` feature: the `tower-poison` binary
//! (`list`, `show`, `stats`, `replay --to URL`, `purge --older-than 7d`).
//!
//! # Idempotency
//!
//! The server-side idempotency guard lives in its own crate,
//! `tower-idempotency`. On a server it goes outermost, in front of the
//! dead-letter layer, so its answers to repeats never become dead letters:
//!
//! ```text
//! IdempotencyGuard → DeadLetter → handlers
//! ```
//!
//! # Fleets of nodes: Redis
//!
//! With the `redis` feature,
//! [`RedisDeadLetterStore`](store::RedisDeadLetterStore) keeps one queue in
//! Redis for every node and the CLI (`--store redis://…`). While
//! Redis is down, a dead-lettered call fails with [`StoreFailed`]: nothing
//! acknowledged is lost.
//!
//! # Configuration
//!
//! [`config::DeadLetterConfig`] reads the layer's settings from a file
//! (`label`, `action`, `body_limit`, `redact_headers`, `message_id_header`,
//! `poison.max_attempts`, `poison.delivery_count`, and the shared HTTP
//! `classifier`); every invalid
//! value is a
//! [`ConfigError`](tower_classify::ConfigError) naming the field.
//!
//! # Observability
//!
//! A `tracing` event per dead-lettered call (`warn`, with the entry id, label,
//! kind and attempts); the `metrics` counter
//! `tower_poison_dead_lettered_total{action, label}`, the gauge
//! `tower_poison_dlq_depth{label}` (set from the write's own result, no extra
//! store round trip), and `tower_poison_dlq_store_full_total{label}` for
//! calls a full store refused (with a `warn` at most every 10 s per label).
//!
//! # Example
//!
//! ```
//! # #[cfg(not(feature = "redb"))] fn main() {}
//! # #[cfg(feature = "redb")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::Full;
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_poison::store::{DeadLetterStore, ListQuery, RedbStore};
//! use tower_poison::DeadLetterLayer;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let store = RedbStore::open(dir.path().join("dead-letters.redb")).unwrap();
//!
//! let mut service = ServiceBuilder::new()
//!     .layer(DeadLetterLayer::new(store.clone()).label("orders"))
//!     .service_fn(|_request: Request<_>| async {
//!         // The order service rejects this payload.
//!         let response = Response::builder()
//!             .status(StatusCode::UNPROCESSABLE_ENTITY)
//!             .body(Bytes::new())
//!             .unwrap();
//!         Ok::<_, std::io::Error>(response)
//!     });
//!
//! let request = Request::post("http://orders.internal/orders")
//!     .header("authorization", "Bearer secret")
//!     .body(Full::new(Bytes::from(r#"{"sku":42}"#)))
//!     .unwrap();
//! let response = service.ready().await.unwrap().call(request).await.unwrap();
//! assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
//!
//! let page = store.list(ListQuery::new()).await.unwrap();
//! let entry = &page.entries[0];
//! assert_eq!(entry.label, "orders");
//! assert_eq!(entry.body, r#"{"sku":42}"#);
//! assert_eq!(entry.error, ["HTTP 422 Unprocessable Entity"]);
//! assert_eq!(entry.headers[0].value, "[redacted]");
//! # }
//! ```
//!
//! # Features
//!
//! - `redb` (default): [`RedbStore`](store::RedbStore) and the
//!   `RedbFailureCounts` poison count store.
//! - `redis`: [`RedisDeadLetterStore`](store::RedisDeadLetterStore) and the
//!   `RedisFailureCounts` poison count store (the `redis` crate, tokio, a
//!   reconnecting connection manager).
//! - `cli`: the `tower-poison` operator binary (`clap`, a hyper client). It
//!   is off by default so that services using the layer do not compile a
//!   command-line parser and an HTTP client; install the tool with
//!   `cargo install tower-poison --features cli`.

#![warn(
    missing_debug_implementations,
    missing_docs,
    rust_2018_idioms,
    unreachable_pub
)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod action;
mod attempts;
mod builder;
mod capture;
pub mod config;
pub mod counts;
mod entry;
pub mod error;
mod future;
mod grpc;
mod layer;
mod poison;
mod redact;
mod service;

pub mod replay;
pub mod store;

pub use self::action::Action;
pub use self::attempts::{AttemptCounter, CountAttempts, CountAttemptsLayer, CountedFuture};
pub use self::builder::ServiceBuilderExt;
pub use self::capture::{
    describe_fn, CaptureRequest, DescribeFn, DescribeResponse, HttpCapture, PendingRecord,
    RequestRecord, BODY_WAIT, DEFAULT_BODY_LIMIT,
};
pub use self::counts::{DeliveryAttempt, DeliveryCount};
pub use self::entry::{
    error_chain, kind_from_name, DeadLetterEntry, EntryId, EntryIdPrefix, ParseEntryIdError,
    ReplayRecord, StoredHeader, REPLAY_ERROR_BYTES, REPLAY_ERROR_LEVELS, REPLAY_HISTORY_LIMIT,
};
pub use self::error::{CountStoreFailed, PoisonMessage, StoreFailed, StoreFull};
pub use self::future::ResponseFuture;
pub use self::grpc::{GrpcBody, GrpcDeadLetter, GrpcDeadLetterLayer};
pub use self::layer::{DeadLetterLayer, SERVER_KINDS};
pub use self::poison::PoisonPolicy;
pub use self::redact::{Redactor, REDACTED};
pub use self::replay::replay;
pub use self::service::DeadLetter;
pub use self::store::{Claim, ClaimToken};
pub use http_body_replay::ReplayBody;
