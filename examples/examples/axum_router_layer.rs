//! The family on the server side: `Router::layer` protects your own
//! handlers. An axum app whose database goes down stores the requests that
//! failed for replay and stops hammering the database with a breaker, while
//! it keeps answering every caller.
//!
//! ```sh
//! cargo run -p examples --example axum_router_layer
//! ```
//!
//! The stack around the routes, outermost first:
//!
//! ```text
//! HandleError → DeadLetter (for_server) → CircuitBreaker (http) → routes
//! ```
//!
//! - **`HandleErrorLayer`**: `Router::layer` needs an infallible service; the
//!   dead-letter layer fails a call only when its store refused the entry
//!   (`StoreFailed`), and that becomes a `503`.
//! - **`DeadLetterLayer::for_server`**: keeps the requests an operator acts
//!   on — 5xx answers, timeouts — and not a scanner's 404s nor the breaker's
//!   own refusals.
//! - **`CircuitBreakerLayer::answer(Http503)`**: after three failed requests in a
//!   row the handlers are not called; callers get `503` with `Retry-After`
//!   and a JSON body at once, until one trial request finds the database
//!   back.
//!
//! The example sends real requests to the app on 127.0.0.1 while its
//! database is down, then up again, and exits non-zero if the story did not
//! happen as told.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use examples::observability::{get as http_get, serve};
use tower::{BoxError, ServiceBuilder};
use tower_breaker::answer::Http503;
use tower_breaker::CircuitBreakerLayer;
use tower_breaker::Policy;
use tower_classify::HttpClassifier;
use tower_poison::store::{DeadLetterStore, ListQuery, MemoryStore};
use tower_poison::{DeadLetterLayer, StoreFailed};

/// The app's database: up or down, and how many queries reached it.
#[derive(Clone, Default)]
struct Database {
    down: Arc<AtomicBool>,
    queries: Arc<AtomicU32>,
}

async fn report(Path(id): Path<u32>, State(db): State<Database>) -> Result<String, StatusCode> {
    db.queries.fetch_add(1, Ordering::SeqCst);
    if db.down.load(Ordering::SeqCst) {
        return Err(StatusCode::INTERNAL_SERVER_ERROR);
    }
    Ok(format!("report {id}: 42 rows"))
}

async fn store_failed(error: BoxError) -> (StatusCode, String) {
    if error.is::<StoreFailed>() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "DEAD_LETTER_STORE_FAILED".to_owned(),
        )
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, error.to_string())
    }
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    let db = Database::default();
    let store = MemoryStore::new(1_000);
    let breaker = CircuitBreakerLayer::builder()
        .name("reports")
        .policy(Policy::consecutive_failures(3))
        .recovery_timeout(Duration::from_millis(300))
        .build(HttpClassifier::new())?;
    let app = Router::new()
        .route("/reports/{id}", get(report))
        .with_state(db.clone())
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(store_failed))
                .layer(DeadLetterLayer::for_server(store.clone()).label("reports"))
                .layer(breaker.answer(Http503)),
        );
    let addr = serve(app).await?;
    let url = |id: u32| format!("http://{addr}/reports/{id}");

    println!("the database is down");
    db.down.store(true, Ordering::SeqCst);
    let mut statuses = Vec::new();
    for id in 1..=6 {
        let (status, body) = http_get(&url(id)).await?;
        println!("GET /reports/{id} -> {status} {body}");
        statuses.push(status);
    }
    let queries_while_down = db.queries.load(Ordering::SeqCst);

    println!("the database is back; waiting out the breaker's 300 ms");
    db.down.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(350)).await;
    let (status, body) = http_get(&url(7)).await?;
    println!("GET /reports/7 -> {status} {body}");

    let stored = store.list(ListQuery::default()).await?.entries;
    println!("\ndead letters, to replay once the cause is fixed:");
    for entry in &stored {
        println!(
            "  {} {} {} ({})",
            entry.id,
            entry.method.as_deref().unwrap_or("-"),
            entry.uri.as_deref().unwrap_or("-"),
            entry.error.join(": ")
        );
    }

    let opened = statuses[..3]
        .iter()
        .all(|s| *s == StatusCode::INTERNAL_SERVER_ERROR)
        && statuses[3..]
            .iter()
            .all(|s| *s == StatusCode::SERVICE_UNAVAILABLE);
    let spared = queries_while_down == 3;
    let recovered = status == StatusCode::OK;
    let kept = stored.len() == 3;
    println!(
        "\nbreaker opened after 3 failures: {opened}; database queried {queries_while_down} times \
         for 6 requests: {spared}; recovered: {recovered}; 3 failures kept, refusals not: {kept}"
    );
    Ok(if opened && spared && recovered && kept {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
