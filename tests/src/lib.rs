//! The harness of the family's cross-crate integration tests.
//!
//! Every test starts its own upstream, a [`ScriptedServer`] (an axum server on
//! `127.0.0.1:0` whose answers the test scripts, and which records every
//! request it receives), calls it through a real hyper-util client
//! ([`http_client_for`]) wrapped in the family's layers ([`default_order`],
//! [`retry_outside_breaker`]), and asserts on what the upstream saw, what the
//! caller got, and what the dead-letter store holds. The scenarios themselves
//! are in `tests/`.
//!
//! The upstream and the client are the examples' own
//! ([`examples::scripted`], [`examples::client`]), so that the examples and
//! the tests exercise the layers against the same pieces.
//!
//! Nothing here is mocked: the requests cross real sockets, so the tests use
//! real time. They keep waits short and assert exact counts and generous
//! bounds rather than tight timings, so that a loaded 2-core CI machine does
//! not make them flaky.

#![warn(
    missing_debug_implementations,
    missing_docs,
    rust_2018_idioms,
    unreachable_pub
)]
#![forbid(unsafe_code)]

use std::time::Duration;

use bytes::Bytes;
use examples::client::{http_client_for, HttpRequest, HttpResponse, HttpService};
use examples::scripted::ScriptedServer;
use http::{Method, Request};
use http_body_util::Full;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_breaker::Policy;
use tower_breaker::{BreakerHandle, CircuitBreakerLayer};
use tower_classify::HttpClassifier;
use tower_poison::store::{DeadLetterStore, ListQuery};
use tower_poison::{CountAttemptsLayer, DeadLetterEntry, DeadLetterLayer, OpenCall, SettleBody};
use tower_retry_budget::replay::HttpReplay;
use tower_retry_budget::{Backoff, Jitter, RetryLayer};

/// The workspace README's Rust blocks, compiled and run as this crate's doc
/// tests (`cargo test --doc -p integration-tests`): the README belongs to no
/// crate, so it is included here, and only when rustdoc collects doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct WorkspaceReadme;

/// The flaky inventory service of the README's quickstarts: an axum server on
/// `127.0.0.1:0` whose `PUT /reservations/42` answers its first call `503`,
/// then `200`. Returns its base URL.
pub async fn flaky_inventory() -> Result<String, BoxError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let calls = Arc::new(AtomicUsize::new(0));
    let reserve = move || async move {
        match calls.fetch_add(1, Ordering::SeqCst) {
            0 => http::StatusCode::SERVICE_UNAVAILABLE,
            _ => http::StatusCode::OK,
        }
    };
    let app = axum::Router::new().route("/reservations/42", axum::routing::put(reserve));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

/// The header every test request carries so that the upstream's log, the
/// caller's results and the dead-letter store can be matched up.
pub const REQUEST_ID: &str = "x-request-id";

/// The largest request body the stacks record for replay (the dead-letter
/// layer's default body limit).
pub const REPLAY_LIMIT: usize = 64 * 1024;

/// The documented order, outermost first:
///
/// ```text
/// DeadLetter → CircuitBreaker → Retry → client
/// ```
///
/// The dead-letter layer hands the layers below it a `ReplayBody` that
/// streams and records the request body once; the retry layer replays it,
/// and reports its attempts to the dead-letter layer.
pub fn default_order<St>(
    dead_letter: DeadLetterLayer<St>,
    breaker: CircuitBreakerLayer<HttpClassifier>,
    retry: RetryLayer<HttpClassifier, HttpReplay>,
) -> HttpService
where
    St: DeadLetterStore,
{
    let stack = ServiceBuilder::new()
        .map_response(buffered)
        .layer(dead_letter)
        .layer(breaker)
        .layer(retry)
        .service(http_client_for());
    HttpService::new(stack)
}

/// The other order (Polly's, Resilience4j's), outermost first:
///
/// ```text
/// DeadLetter → Retry → CircuitBreaker → CountAttempts → client
/// ```
///
/// `CountAttempts` is not needed under this family's retry layer, which
/// reports its own attempts; it is here so that the tests cover both
/// counting at once, which must count each attempt once.
pub fn retry_outside_breaker<St>(
    dead_letter: DeadLetterLayer<St>,
    breaker: CircuitBreakerLayer<HttpClassifier>,
    retry: RetryLayer<HttpClassifier, HttpReplay>,
) -> HttpService
where
    St: DeadLetterStore,
{
    let stack = ServiceBuilder::new()
        .map_response(buffered)
        .layer(dead_letter)
        .layer(retry)
        .layer(breaker)
        .layer(CountAttemptsLayer::new())
        .service(http_client_for());
    HttpService::new(stack)
}

/// The dead-letter layer's answer with its body taken out of the
/// `SettleBody` (an HTTP call is settled by its head: it holds only the
/// client's buffered bytes).
pub fn buffered(response: http::Response<SettleBody<Bytes, OpenCall>>) -> HttpResponse {
    response.map(SettleBody::into_inner)
}

/// Sends `request` through `stack` once.
pub async fn send(stack: &HttpService, request: HttpRequest) -> Result<HttpResponse, BoxError> {
    stack.clone().oneshot(request).await
}

/// A request `method path` to `upstream` with request id `id` and `body`.
pub fn request(
    upstream: &ScriptedServer,
    method: Method,
    path: &str,
    id: &str,
    body: &str,
) -> HttpRequest {
    Request::builder()
        .method(method)
        .uri(format!("{}{path}", upstream.url()))
        .header(REQUEST_ID, id)
        .body(Full::new(Bytes::copy_from_slice(body.as_bytes())))
        .expect("a valid request")
}

/// A retry layer for HTTP with `max_retries` retries 20 ms apart (no jitter,
/// so counts and waits are exact), a 5 s deadline for the whole loop and the
/// default retry budget.
pub fn retry(max_retries: u32) -> RetryLayer<HttpClassifier, HttpReplay> {
    RetryLayer::http_builder()
        .max_retries(max_retries)
        .backoff(Backoff::fixed(Duration::from_millis(20)).with_jitter(Jitter::None))
        .deadline(Duration::from_secs(5))
        .build()
        .expect("valid retry settings")
}

/// The name of the breaker [`breaker`] builds.
pub const BREAKER: &str = "upstream";

/// A breaker named [`BREAKER`] that opens after `threshold` consecutive
/// transient failures and admits one probe after `recovery`, with its admin
/// handle.
pub fn breaker(
    threshold: u32,
    recovery: Duration,
) -> (CircuitBreakerLayer<HttpClassifier>, BreakerHandle) {
    let layer = CircuitBreakerLayer::builder()
        .name(BREAKER)
        .policy(Policy::consecutive_failures(threshold))
        .recovery_timeout(recovery)
        .build(HttpClassifier::new())
        .expect("valid breaker settings");
    let handle = layer.handle();
    (layer, handle)
}

/// A dead-letter layer over `store`, labelled `upstream`.
pub fn dead_letters<St: DeadLetterStore>(store: &St) -> DeadLetterLayer<St> {
    DeadLetterLayer::new(store.clone()).label("upstream")
}

/// Every entry in `store`, in id order (all pages).
pub async fn entries<St: DeadLetterStore>(store: &St) -> Vec<DeadLetterEntry> {
    let mut all = Vec::new();
    let mut query = ListQuery {
        limit: 1000,
        ..ListQuery::default()
    };
    loop {
        let page = store.list(query.clone()).await.expect("list entries");
        all.extend(page.entries);
        match page.next {
            Some(next) => query.after = Some(next),
            None => return all,
        }
    }
}

/// The stored value of header `name` (lowercase) of `entry`.
pub fn stored_header<'a>(entry: &'a DeadLetterEntry, name: &str) -> Option<&'a str> {
    entry
        .headers
        .iter()
        .find(|h| h.name == name)
        .map(|h| h.value.as_str())
}
