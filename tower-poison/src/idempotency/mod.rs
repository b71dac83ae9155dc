//! The idempotency guard: run a request once, replay its response to
//! repeats.
//!
//! Webhook providers and careful clients re-send a request when they did not
//! see its answer (Stripe after 5 s without a 200, a client's retry layer
//! after a timeout). Without a guard the order is created twice. The client
//! marks one logical request with an `Idempotency-Key` header
//! ([`IdempotencyKeyLayer`] does it), and the server's
//! [`IdempotencyGuardLayer`] remembers the first response for each key.
//!
//! # The rules
//!
//! For a request with a non-idempotent method (POST, PATCH, extension
//! methods; all methods with [`all_methods`](IdempotencyGuardLayer::all_methods))
//! that carries an `Idempotency-Key` (scoped by a client identity with
//! [`scope_by`](IdempotencyGuardLayer::scope_by)):
//!
//! | situation | answer |
//! |---|---|
//! | key longer than 255 characters | **400** `idempotency_key_too_long` |
//! | key empty or not visible ASCII | **400** `idempotency_key_invalid` |
//! | first time | the request runs; its response is stored (status, headers, body up to a limit) |
//! | repeat, first response stored | that response, replayed with `Idempotent-Replayed: true`; the service is not called |
//! | repeat while the first is still running | **409** `idempotency_key_in_use`, `Retry-After: 1` |
//! | same key, different method, path, query or body | **422** `idempotency_key_reused` |
//! | the store does not answer | **503** `idempotency_store_unavailable`; the request is not run unguarded |
//!
//! The guard's answers are responses with a short JSON body
//! (`{"error": "...", "message": "..."}`), not errors: an error makes a
//! server close the connection without answering, and the client could not
//! tell a 409 from a network failure. See [`Rejection`].
//!
//! A response that should be retried — one the classifier (tower-classify's
//! [`HttpClassifier`](tower_classify::HttpClassifier) by default) calls a
//! transient failure (5xx, 429, 408) or a shed — is **not** stored: the key
//! is released so the client's retry runs the request again. So is an error
//! from the inner service (there is no response to replay), and so is a call
//! whose future is dropped before it finishes (a client that disconnected, a
//! timeout above the guard): otherwise a cancelled request would lock its key
//! until the in-flight TTL. Other failures (400, 404, 422 from the handler)
//! are stored and replayed like successes: the same request would fail the
//! same way.
//!
//! A stored response is kept for the [TTL](IdempotencyGuardLayer::ttl) (24 h
//! by default). Requests without the header, and idempotent methods, pass
//! through untouched.
//!
//! # Stores
//!
//! [`IdempotencyStore`](store::IdempotencyStore) has two implementations:
//! [`MemoryIdempotencyStore`](store::MemoryIdempotencyStore) (one process,
//! bounded with FIFO eviction, TTL) and, with the `redis` feature,
//! [`RedisIdempotencyStore`](store::RedisIdempotencyStore) for a fleet: a
//! repeat that a load balancer sends to another node is replayed from the
//! response the first node stored.
//!
//! # Layer order on a server
//!
//! The guard goes **outermost**, before the dead-letter layer:
//!
//! ```text
//! IdempotencyGuard → DeadLetter → handlers
//! ```
//!
//! - Its 400/409/422 answers are about the *repeat*, not failures of the
//!   service: outside the dead-letter layer they never become dead letters.
//!   Inside it, every 409 for a duplicate webhook would be stored as a
//!   rejected call worth an operator's time.
//! - A replayed repeat never reaches the dead-letter layer or the handler, so
//!   a client retrying a request that failed permanently (a stored 422 from
//!   the handler) creates one dead letter, not one per retry.
//! - A request that failed transiently releases its key *and* is
//!   dead-lettered by the inner layer if the dead-letter classifier says so;
//!   the client's retry then runs it again.
//!
//! A store failure of the dead-letter layer (`StoreFailed`) is an error, not
//! a response: the guard releases the key (there is no response to replay),
//! so the client's retry runs again.
//!
//! # Example
//!
//! ```
//! # tokio_test::block_on(async {
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::{BodyExt, Full};
//! use tower::{service_fn, Layer, Service, ServiceExt};
//! use tower_poison::idempotency::store::MemoryIdempotencyStore;
//! use tower_poison::idempotency::IdempotencyGuardLayer;
//!
//! let guard = IdempotencyGuardLayer::new(MemoryIdempotencyStore::new(10_000));
//! let mut service = guard.layer(service_fn(|_req: Request<_>| async {
//!     Ok::<_, std::io::Error>(
//!         Response::builder().status(StatusCode::CREATED).body(Full::new(Bytes::from("order 1"))).unwrap(),
//!     )
//! }));
//! let request = || {
//!     Request::post("/orders")
//!         .header("idempotency-key", "order-abc")
//!         .body(Full::new(Bytes::from(r#"{"sku":42}"#)))
//!         .unwrap()
//! };
//!
//! let first = service.ready().await.unwrap().call(request()).await.unwrap();
//! assert_eq!(first.status(), StatusCode::CREATED);
//! let repeat = service.ready().await.unwrap().call(request()).await.unwrap();
//! assert_eq!(repeat.status(), StatusCode::CREATED);
//! assert_eq!(repeat.headers()["idempotent-replayed"], "true");
//! assert_eq!(repeat.into_body().collect().await.unwrap().to_bytes(), "order 1");
//! # });
//! ```

mod client;
mod layer;
mod rejection;
mod service;
pub mod store;

pub use self::client::{IdempotencyKeyLayer, SetIdempotencyKey};
pub use self::layer::IdempotencyGuardLayer;
pub use self::rejection::Rejection;
pub use self::service::{IdempotencyGuard, IDEMPOTENT_REPLAYED, MAX_KEY_LEN};
pub use crate::future::ResponseFuture;
