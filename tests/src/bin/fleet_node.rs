//! One node of the fleet test (`tests/fleet.rs`): an axum service on
//! `127.0.0.1:0` behind the idempotency guard, the dead-letter layer and
//! poison detection, all on one Redis, as a fleet's nodes would be.
//!
//! It prints `listening on <port>` on stdout once it serves. Settings from
//! the environment: `FLEET_REDIS_URL`, `FLEET_NAMESPACE` (the dead-letter
//! queue, the poison counts' queue and the prefix of every other key) and
//! `FLEET_NODE` (its name in answers).
//!
//! `POST /work` runs the handler, which counts each of its runs in Redis
//! (`INCR <namespace>:runs:<what>`, `what` the idempotency key, else the
//! message id, else `x-request-id`) and then answers by the request's
//! headers:
//!
//! - `x-poison: 1`: `500` (poison: it fails on every delivery);
//! - `x-fail: 1`: `500 failed as asked: <x-request-id>` (a dead letter);
//! - otherwise `201 done <x-request-id>`, after `x-delay-ms` if given.
//!
//! Layers, outermost first: `IdempotencyGuard → HandleError →
//! DeadLetter (poison by x-message-id) → handler`. A `500` reaches the
//! client only once its dead letter is stored (or, under the poison
//! limit, counted); a diverted poison message is answered `202 diverted`
//! (stored: the consumer acknowledges it); an entry or count that could not
//! be kept is `503 not kept`.

use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{BoxError, Router};

use tower::ServiceBuilder;
use tower_idempotency::store::{RedisConnectOptions, RedisConnection, RedisIdempotencyStore};
use tower_idempotency::IdempotencyGuardLayer;
use tower_poison::counts::RedisFailureCounts;
use tower_poison::store::RedisDeadLetterStore;
use tower_poison::{DeadLetterLayer, PoisonMessage, PoisonPolicy};

/// Deliveries of a poison message before it is diverted.
const MAX_ATTEMPTS: u32 = 3;

#[derive(Clone)]
struct Handler {
    counter: RedisConnection,
    namespace: String,
    node: String,
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

async fn work(State(handler): State<Handler>, headers: HeaderMap) -> (StatusCode, String) {
    let request_id = header(&headers, "x-request-id").unwrap_or("-");
    let what = header(&headers, "idempotency-key")
        .or_else(|| header(&headers, "x-message-id"))
        .unwrap_or(request_id);
    let runs: Result<u64, _> = redis::cmd("INCR")
        .arg(format!("{}:runs:{what}", handler.namespace))
        .query_async(&mut handler.counter.clone())
        .await;
    if let Err(error) = runs {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("run counter unavailable: {error}"),
        );
    }
    if header(&headers, "x-poison") == Some("1") {
        return (StatusCode::INTERNAL_SERVER_ERROR, "poison".to_owned());
    }
    if header(&headers, "x-fail") == Some("1") {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("failed as asked: {request_id}"),
        );
    }
    if let Some(delay) = header(&headers, "x-delay-ms").and_then(|d| d.parse().ok()) {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    (
        StatusCode::CREATED,
        format!("done {request_id} on {}", handler.node),
    )
}

async fn answer_error(error: BoxError) -> (StatusCode, String) {
    match error.downcast_ref::<PoisonMessage>() {
        Some(poison) => (
            StatusCode::ACCEPTED,
            format!(
                "diverted {} after {}",
                poison.message_id(),
                poison.attempts()
            ),
        ),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not kept: {error}"),
        ),
    }
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let url = env("FLEET_REDIS_URL");
    let namespace = env("FLEET_NAMESPACE");
    let node = env("FLEET_NODE");
    // Short timeouts: Redis restarts during the test, and a call made while
    // it is away should fail quickly rather than hang.
    let options = RedisConnectOptions::new()
        .connection_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_secs(1))
        .reconnect_retries(3);

    let keys = RedisIdempotencyStore::builder()
        .options(options.clone())
        .connect(&url, format!("{namespace}:idem:"))
        .await?;
    let dead_letters = RedisDeadLetterStore::builder()
        .options(options.clone())
        .connect(&url, namespace.clone())
        .await?;
    let counts = RedisFailureCounts::builder()
        .options(options.clone())
        .connect(&url, &namespace)
        .await?;
    let counter = options.connect(&url).await?;

    let dead_letter = DeadLetterLayer::for_server(dead_letters)
        .label("fleet")
        .message_id_header("x-message-id".parse()?)
        .poison(PoisonPolicy::new(MAX_ATTEMPTS)?)
        .count_store(counts);
    let app = Router::new()
        .route("/work", post(work))
        .with_state(Handler {
            counter,
            namespace,
            node,
        })
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(answer_error))
                .layer(dead_letter),
        )
        .layer(IdempotencyGuardLayer::new(keys));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("listening on {}", listener.local_addr()?.port());
    axum::serve(listener, app).await?;
    Ok(())
}
