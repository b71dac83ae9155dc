//! An axum app whose handler calls a flaky downstream through the whole
//! family: dead-letter → circuit breaker → retry, with `HandleErrorLayer`
//! turning the layers' own errors into `503`/`504` responses.
//!
//! ```sh
//! cargo run -p examples --example axum_server
//! ```
//!
//! Two servers run on 127.0.0.1: a scripted *inventory* service (the flaky
//! downstream) and the *shop* app, an axum router whose `GET /items/{sku}`
//! asks the inventory. The example sends real HTTP requests to the shop while
//! the inventory blips, throttles, goes down and comes back, and prints what
//! the shop answered; at the end it lists the dead-letter store and replays
//! its entries to the recovered inventory.
//!
//! The stack the handler calls the inventory through, outermost first:
//!
//! ```text
//! HandleError → DeadLetter → CircuitBreaker → Retry → hyper client
//! ```
//!
//! - **`HandleErrorLayer` outermost**: the layers below fail calls on their
//!   own (`CircuitOpen`, `BudgetExhausted`, `WaitTooLong`, `DeadlineExceeded`,
//!   `StoreFailed`), as `BoxError`s. An axum handler must answer with a
//!   response, so one function maps each error to the status a caller should
//!   see — `503` with `Retry-After` for "not now", `504` for "out of time" —
//!   and the stack becomes infallible. The handler then just returns what the
//!   stack answered.
//! - **`DeadLetter` next**: it sees each call's *final* outcome. A blip the
//!   retry layer fixed never reaches the store; a call that still failed is
//!   stored once, with its attempt count, and so is a call the open breaker
//!   refused (worth replaying once the inventory is back).
//! - **`CircuitBreaker` outside the retry loop**: it counts one failure per
//!   call that failed *after* its retries, and once open it answers at once,
//!   saving every caller the whole retry loop. The dead-letter layer hands
//!   the layers below a `ReplayBody`: it streams each frame to the client as
//!   it arrives and records it (up to a limit), and the retry layer replays
//!   that recording, so no `ReplayBodyLayer` is needed.
//! - **`Retry` innermost**: it owns the retries and their waits, and reports
//!   how many attempts it made to the dead-letter layer, for the entry.
//!
//! The same `ServiceBuilder` also works on `Router::layer` to protect your
//! own handlers (the router accepts the bodies these layers hand on); here
//! the layers wrap the outgoing client, because it is the *downstream* that
//! fails.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use examples::client::{http_client, http_client_for};
use examples::scripted::{Reply, ScriptedServer};
use http::{Request, Uri};
use http_body_util::Full;
use tokio::net::TcpListener;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_breaker::Policy;
use tower_breaker::{CircuitBreakerLayer, CircuitOpen};
use tower_classify::HttpClassifier;
use tower_poison::replay::{http_request, ReplayOutcome, Replayer};
use tower_poison::store::{DeadLetterStore, ListQuery, RedbStore};
use tower_poison::{DeadLetterLayer, OpenCall, ReplayBody, SettleBody, StoreFailed};
use tower_retry_budget::error::{BudgetExhausted, DeadlineExceeded, WaitTooLong};
use tower_retry_budget::{Backoff, RetryLayer};

/// What the handler calls the inventory with: infallible, because
/// `HandleErrorLayer` has turned every error into a response.
type Inventory = BoxCloneSyncService<Request<Full<Bytes>>, Response, std::convert::Infallible>;

#[derive(Clone)]
struct AppState {
    inventory: Inventory,
    inventory_url: Arc<str>,
}

/// The handler: one call to the inventory, whose answer it passes on.
async fn get_item(State(state): State<AppState>, Path(sku): Path<String>) -> Response {
    let request = Request::get(format!("{}/items/{sku}", state.inventory_url))
        .body(Full::new(Bytes::new()))
        .expect("a valid URI");
    match state.inventory.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// Our layers' errors, as the responses a caller of the shop should get.
///
/// Every error of the family is a public type to downcast to. "Try later"
/// refusals are `503` with a `Retry-After` where we know how long; a retry
/// loop out of time is `504`. Anything else is the downstream's own failure
/// (a refused connection after all retries): `502`.
async fn error_response(error: BoxError) -> Response {
    let retry_after = |wait: Duration| [("retry-after", wait.as_secs().max(1).to_string())];
    if let Some(open) = error.downcast_ref::<CircuitOpen>() {
        let wait = open.remaining().unwrap_or(Duration::from_secs(1));
        (
            StatusCode::SERVICE_UNAVAILABLE,
            retry_after(wait),
            "CIRCUIT_OPEN",
        )
            .into_response()
    } else if let Some(too_long) = error.downcast_ref::<WaitTooLong>() {
        // The inventory asked for a wait we will not hold a request open for;
        // pass its wait on to our caller instead.
        (
            StatusCode::SERVICE_UNAVAILABLE,
            retry_after(too_long.wait()),
            "UPSTREAM_THROTTLED",
        )
            .into_response()
    } else if error.is::<BudgetExhausted>() {
        (StatusCode::SERVICE_UNAVAILABLE, "RETRY_BUDGET_EXHAUSTED").into_response()
    } else if error.is::<DeadlineExceeded>() {
        (StatusCode::GATEWAY_TIMEOUT, "UPSTREAM_TIMEOUT").into_response()
    } else if error.is::<StoreFailed>() {
        // The call failed *and* could not be kept for replay: say so loudly.
        (StatusCode::SERVICE_UNAVAILABLE, "DEAD_LETTER_STORE_FAILED").into_response()
    } else {
        (StatusCode::BAD_GATEWAY, format!("UPSTREAM_FAILED: {error}")).into_response()
    }
}

/// The body the hyper client sees under the dead-letter layer.
type StackBody = ReplayBody<Full<Bytes>>;

fn inventory_client(store: RedbStore) -> Result<Inventory, BoxError> {
    // One classifier, cloned into every layer: they agree that 5xx, 429,
    // timeouts and connection errors are transient, other 4xx are not.
    let classifier = HttpClassifier::new();
    let retry = RetryLayer::http_builder()
        .classifier(classifier.clone())
        .max_retries(2)
        .backoff(Backoff::exponential(Duration::from_millis(20)))
        .deadline(Duration::from_secs(2))
        // A server asking for more than 10 s gets a 503 + Retry-After from us
        // instead of a request held open for minutes.
        .max_wait(Duration::from_secs(10))
        .build()?;
    // Short timings so the example runs in seconds; the defaults are 5
    // failures and open periods backing off from 250 ms to 500 ms.
    let breaker = CircuitBreakerLayer::builder()
        .name("inventory")
        .policy(Policy::consecutive_failures(3))
        .recovery_timeout(Duration::from_secs(1))
        .build(classifier.clone())?;
    let stack = ServiceBuilder::new()
        .layer(HandleErrorLayer::new(error_response))
        // The client reads each body to the end (`Response<Bytes>`), which
        // classifiers' body rules can see; the dead-letter layer hands it back
        // in a `SettleBody` (an HTTP call is settled by its head, so it only
        // holds the bytes); axum answers with its own `Body`.
        .map_response(|response: http::Response<SettleBody<Bytes, OpenCall>>| {
            response.map(|body| axum::body::Body::from(body.into_inner()))
        })
        .layer(
            DeadLetterLayer::new(store)
                .classifier(classifier)
                .label("inventory"),
        )
        .layer(breaker)
        .layer(retry)
        .service(http_client_for::<StackBody>());
    Ok(BoxCloneSyncService::new(stack))
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    // The flaky downstream.
    let inventory = ScriptedServer::start().await?;
    inventory.otherwise(Reply::ok("12 in stock"));

    // The dead-letter store: redb, the durable default, in a temporary folder.
    let dir = tempfile::tempdir()?;
    let store = RedbStore::builder().open(dir.path().join("dead-letters.redb"))?;

    // The shop: an axum app on a free port.
    let state = AppState {
        inventory: inventory_client(store.clone())?,
        inventory_url: inventory.url().into(),
    };
    let app = Router::new()
        .route("/items/{sku}", get(get_item))
        .with_state(state);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let shop = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    println!("shop on {shop}, inventory on {}\n", inventory.url());
    let caller = http_client();
    let mut ok = true;
    let step = |label: &str, path: &str| {
        let (caller, shop) = (caller.clone(), shop.clone());
        let (label, path) = (label.to_owned(), path.to_owned());
        let before = inventory.hits();
        let inventory = &inventory;
        async move {
            let request = Request::get(format!("{shop}{path}")).body(Full::new(Bytes::new()))?;
            let response = caller.oneshot(request).await?;
            let reached = inventory.hits() - before;
            let retry_after = response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(|v| format!(" (Retry-After: {v})"))
                .unwrap_or_default();
            println!(
                "{label:<34} GET {path:<14} → {} {:?}{retry_after}; inventory saw {reached} call(s)",
                response.status().as_u16(),
                String::from_utf8_lossy(response.body()),
            );
            Ok::<_, BoxError>((response.status().as_u16(), response.body().clone(), reached))
        }
    };
    let mut expect = |what: &str, good: bool| {
        if !good {
            eprintln!("UNEXPECTED: {what}");
            ok = false;
        }
    };

    let (status, _, reached) = step("healthy", "/items/apple").await?;
    expect("a healthy call passes", status == 200 && reached == 1);

    inventory.then(1, Reply::status(429).header("retry-after", "120"));
    let (status, body, reached) = step("throttled: Retry-After 120 s", "/items/plum").await?;
    expect(
        "a wait above max_wait is refused at once: 503 UPSTREAM_THROTTLED",
        status == 503 && body == "UPSTREAM_THROTTLED" && reached == 1,
    );

    inventory.then(2, Reply::status(503));
    let (status, _, reached) = step("blip: two 503s", "/items/pear").await?;
    expect(
        "a blip is retried away: 200 after 3 attempts",
        status == 200 && reached == 3,
    );

    println!("\n-- the inventory goes down --");
    inventory.otherwise(Reply::status(503).body("inventory down"));
    for n in 1..=3 {
        let (status, _, reached) = step(&format!("outage, call {n}"), "/items/fig").await?;
        expect(
            "an outage call fails after 3 attempts",
            status == 503 && reached == 3,
        );
    }
    let (status, body, reached) = step("outage, breaker open", "/items/fig").await?;
    expect(
        "the open breaker answers 503 CIRCUIT_OPEN without calling the inventory",
        status == 503 && body == "CIRCUIT_OPEN" && reached == 0,
    );

    println!("\n-- the inventory recovers; the breaker probes after 1 s --");
    inventory.otherwise(Reply::ok("12 in stock"));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (status, _, reached) = step("recovered (the probe)", "/items/fig").await?;
    expect(
        "the probe succeeds and closes the breaker",
        status == 200 && reached == 1,
    );

    // What the dead-letter store kept: every call that finally failed. The
    // refused one was answered 503 and not stored: a refusal never reached
    // the inventory (`DeadLetterLayer::store_refusals` keeps them too).
    let entries = store.list(ListQuery::default()).await?.entries;
    println!(
        "\ndead-letter store {} holds {} entries:",
        dir.path().join("dead-letters.redb").display(),
        entries.len()
    );
    for entry in &entries {
        println!(
            "  {}  {:<12} attempts={}  {} {}  {}",
            entry.id,
            entry.kind.as_str(),
            entry.attempts,
            entry.method.as_deref().unwrap_or("-"),
            entry.uri.as_deref().unwrap_or("-"),
            entry.error.join(": ")
        );
    }
    let kinds: Vec<&str> = entries.iter().map(|e| e.kind.as_str()).collect();
    expect(
        "stored: the throttled call and three outage calls (3 attempts each), not the refused one",
        kinds
            == [
                "rate_limited",
                "server_error",
                "server_error",
                "server_error",
            ]
            && entries[1..4].iter().all(|e| e.attempts == 3),
    );

    // The inventory is back: replay every entry to it (what
    // `tower-poison --store … replay --all --to URL` does from a shell).
    let destination: Uri = inventory.url().parse()?;
    let mut client = http_client();
    let classifier = HttpClassifier::new();
    let mut delivered = 0;
    for entry in &entries {
        let outcome = Replayer::new(&store)
            .replay(entry.id, &mut client, &classifier, |entry| {
                http_request(entry, &destination, &[])
            })
            .await?;
        delivered += usize::from(outcome == ReplayOutcome::Delivered);
    }
    let left = store.depth().await?;
    println!(
        "replayed to the recovered inventory: {delivered} delivered, {left} left in the store"
    );
    expect(
        "every entry is delivered on replay",
        delivered == entries.len() && left == 0,
    );

    let (status, body, _) = step("after the replay", "/items/apple").await?;
    expect(
        "the shop answers normally at the end",
        status == 200 && body == "12 in stock",
    );

    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
