//! The first hour under failure (issue 36): a new user's axum server, with
//! the idempotency guard in front of a handler that calls a flaky
//! dependency through the family's layers, on a real socket.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Router};
use bytes::Bytes;
use examples::client::http_client;
use http::{Request, StatusCode};
use http_body_util::Full;
use tower::util::BoxCloneSyncService;
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_breaker::Policy;
use tower_breaker::{BreakerHandle, CircuitBreakerLayer};
use tower_classify::status::not_run;
use tower_classify::{ErrorChainClassifier, RefusalToken};
use tower_idempotency::store::MemoryIdempotencyStore;
use tower_idempotency::IdempotencyGuardLayer;

/// The handler's client for its dependency.
type Inventory = BoxCloneSyncService<(), (), BoxError>;

#[derive(Clone)]
struct Orders {
    inventory: Inventory,
    written: Arc<AtomicUsize>,
}

/// Reserves stock first, and writes the order only once that worked: when
/// the reservation is refused, nothing happened, and it says so.
async fn create_order(
    State(orders): State<Orders>,
    token: Option<Extension<RefusalToken>>,
) -> Response {
    if let Err(error) = orders.inventory.oneshot(()).await {
        return not_run(&error, token.map(|Extension(token)| token));
    }
    orders.written.fetch_add(1, Ordering::SeqCst);
    (StatusCode::CREATED, "order written").into_response()
}

/// An axum server on `127.0.0.1:0` with `POST /orders` behind the guard, the
/// inventory behind a breaker of the family; its URL, the breaker's handle
/// and the count of orders written.
async fn server() -> (String, BreakerHandle, Arc<AtomicUsize>) {
    let breaker = CircuitBreakerLayer::builder()
        .name("inventory")
        .build(ErrorChainClassifier::new())
        .unwrap();
    let handle = breaker.handle();
    let inventory = Inventory::new(breaker.layer(service_fn(|()| async { Ok::<_, BoxError>(()) })));
    let written = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/orders", post(create_order))
        .with_state(Orders {
            inventory,
            written: Arc::clone(&written),
        })
        .layer(IdempotencyGuardLayer::new(MemoryIdempotencyStore::new(100)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, handle, written)
}

fn order(url: &str, key: &str) -> Request<Full<Bytes>> {
    Request::post(format!("{url}/orders"))
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(br#"{"sku":42}"#)))
        .unwrap()
}

/// Item 2: a handler that answers a refusal with the one call `not_run`
/// frees its key, so the client's retry with the same key runs the handler
/// once the dependency is back (and the answer after that is replayed).
#[tokio::test]
async fn first_hour_2_a_handler_answering_not_run_frees_the_key() {
    let (url, breaker, written) = server().await;
    let client = http_client();
    assert!(breaker.force_open("inventory"));

    let refused = client.clone().oneshot(order(&url, "k-2")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    assert_eq!(written.load(Ordering::SeqCst), 0);

    // The dependency recovers; the client retries with the same key.
    assert!(breaker.force_closed("inventory"));
    let retried = client.clone().oneshot(order(&url, "k-2")).await.unwrap();
    assert_eq!(retried.status(), StatusCode::CREATED, "the handler ran");
    assert!(!retried.headers().contains_key("idempotent-replayed"));
    assert_eq!(written.load(Ordering::SeqCst), 1);

    let repeat = client.clone().oneshot(order(&url, "k-2")).await.unwrap();
    assert_eq!(repeat.status(), StatusCode::CREATED);
    assert_eq!(repeat.headers()["idempotent-replayed"], "true");
    assert_eq!(
        written.load(Ordering::SeqCst),
        1,
        "the order is written once"
    );
}

/// Item 3: the error table (`docs/errors.md`, linked from the README) has a row for every public error
/// type of the family, found in the sources (every `pub` type with an
/// `impl Error for` it, directly or through a macro), so a new error type
/// fails this test until it is documented there.
#[test]
fn first_hour_3_every_public_error_type_is_in_the_error_table() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let errors = std::fs::read_to_string(root.join("docs/errors.md")).unwrap();
    let table: Vec<&str> = errors
        .split("# Every error the family returns\n")
        .nth(1)
        .expect("docs/errors.md has the error table")
        .lines()
        .take_while(|line| !line.starts_with("## "))
        .filter(|line| line.starts_with("| `"))
        .collect();
    let crates = [
        "http-body-replay",
        "tower-breaker",
        "tower-classify",
        "tower-idempotency",
        "tower-poison",
        "tower-retry-budget",
        "tower-steadfast",
        "tower-store-support",
    ];
    let mut found = Vec::new();
    for krate in crates {
        for file in rust_files(&root.join(krate).join("src")) {
            let source = std::fs::read_to_string(&file).unwrap();
            for name in error_types(&source) {
                found.push((krate, name));
            }
        }
    }
    for expected in ["CircuitOpen", "BudgetExhausted", "StoreFull", "StoreFailed"] {
        assert!(
            found.iter().any(|(_, name)| name == expected),
            "the scan finds {expected}: {found:?}"
        );
    }
    let missing: Vec<_> = found
        .iter()
        .filter(|(krate, name)| {
            !table.iter().any(|row| {
                let cells: Vec<&str> = row.split('|').map(str::trim).collect();
                cells.get(1) == Some(&format!("`{name}`").as_str()) && cells.get(2) == Some(krate)
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "public error types without a row in docs/errors.md: {missing:?}"
    );
}

fn rust_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The public types of `source` that implement `std::error::Error`: named
/// in an `impl … Error for Name` outside comments, or, for an impl inside a
/// `macro_rules!` (`impl Error for $name`), the type each invocation of
/// that macro names first.
fn error_types(source: &str) -> Vec<String> {
    let code: Vec<&str> = source
        .lines()
        .map(str::trim)
        .filter(|line| !line.starts_with("//"))
        .collect();
    let mut names = Vec::new();
    let mut macros = Vec::new();
    let mut current_macro = None;
    for line in &code {
        if let Some(rest) = line.strip_prefix("macro_rules! ") {
            current_macro = Some(rest.trim_end_matches(" {").to_owned());
        }
        let Some(rest) = line.strip_prefix("impl") else {
            continue;
        };
        let Some((head, tail)) = rest.split_once(" for ") else {
            continue;
        };
        let head = head.trim_start_matches(|c: char| c != ' ').trim();
        if !matches!(head, "Error" | "std::error::Error" | "StdError") {
            continue;
        }
        let name: String = tail
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
            .collect();
        if name.starts_with('$') {
            macros.extend(current_macro.clone());
        } else {
            names.push(name);
        }
    }
    names.retain(|name| {
        code.iter().any(|line| {
            line.starts_with(&format!("pub struct {name}"))
                || line.starts_with(&format!("pub enum {name}"))
        })
    });
    // Each invocation `name! {` lists its doc attributes, then the type.
    let public_in_macro = code.iter().any(|line| line.starts_with("pub struct $name"));
    for mac in macros.into_iter().filter(|_| public_in_macro) {
        let mut lines = code.iter();
        while lines.any(|line| *line == format!("{mac}! {{")) {
            let name = lines
                .by_ref()
                .find(|line| !line.starts_with("#[") && !line.is_empty())
                .unwrap();
            names.push(name.trim_end_matches(',').to_owned());
        }
    }
    names
}

/// Item 3: an axum route whose own layers fail (a breaker in front of the
/// handler) is served through `HttpStatusLayer`: the open circuit reaches the
/// client as problem+json `503` with `Retry-After`, the time it stays open.
#[tokio::test]
async fn first_hour_3_an_axum_route_behind_a_breaker_answers_problem_json() {
    use std::time::Duration;
    use tower::ServiceBuilder;
    use tower_classify::status::HttpStatusLayer;
    use tower_classify::HttpClassifier;

    let breaker = CircuitBreakerLayer::builder()
        .name("reports")
        .policy(Policy::consecutive_failures(1))
        .recovery_timeout(Duration::from_secs(30))
        .build(HttpClassifier::new())
        .unwrap();
    let failing = service_fn(|_: axum::extract::Request| async {
        Ok::<_, BoxError>(StatusCode::INTERNAL_SERVER_ERROR.into_response())
    });
    let route = ServiceBuilder::new()
        .layer(HttpStatusLayer::new())
        .layer(breaker)
        .service(failing);
    let app = Router::new().route_service("/reports", route);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/reports", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = http_client();
    let get = || Request::get(&url).body(Full::new(Bytes::new())).unwrap();

    let failed = client.clone().oneshot(get()).await.unwrap();
    assert_eq!(
        failed.status(),
        StatusCode::INTERNAL_SERVER_ERROR,
        "the handler's own answer"
    );
    let refused = client.clone().oneshot(get()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    // Early in the open period the refusal gives a retry layer no hint (see
    // `CircuitOpen::failure().retry_after()`), but the client is told the time left, as
    // the breaker's own `503` tells it.
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=30).contains(&retry_after), "{retry_after}");
    let body = String::from_utf8(refused.body().to_vec()).unwrap();
    assert!(body.contains(r#""status":503"#), "{body}");
    assert!(body.contains("circuit open"), "{body}");
}
