//! An axum order API behind the idempotency guard, and a hyper client that
//! gives each logical call one `Idempotency-Key`.
//!
//! ```sh
//! cargo run -p examples --example idempotent_orders
//! ```
//!
//! The server's stack, outermost first:
//!
//! ```text
//! IdempotencyGuard (scoped by tenant) → Router → create_order
//! ```
//!
//! The guard goes straight into `Router::layer`: its error is the router's
//! (`Infallible`) and its own refusals, a failing store included, are
//! responses, so no `HandleErrorLayer` is needed. The client's stack is
//! `IdempotencyKey → hyper client`; with a retry layer the key layer goes
//! outside it, so every retry of one call carries the same key.
//!
//! What it shows, against a real server on 127.0.0.1:
//!
//! 1. a POST creates an order; the client sends it again (it did not see
//!    the answer): the stored response comes back, the order is created once;
//! 2. the same key with another payload: `422` with a problem body;
//! 3. a copy sent while the first is still running: `409`, `Retry-After: 1`;
//! 4. tenant B choosing tenant A's key gets its own order, and a request
//!    without a tenant whose key spells tenant A's scoped record gets its
//!    own too: tenants never see each other's responses.

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use examples::client::{http_client, HttpRequest, HttpResponse};
use http::Request;
use http_body_util::Full;
use tower::{BoxError, Layer, ServiceExt};
use tower_idempotency::store::MemoryIdempotencyStore;
use tower_idempotency::{IdempotencyGuardLayer, IdempotencyKeyLayer};

#[derive(Clone, Default)]
struct Orders {
    created: Arc<AtomicUsize>,
}

async fn create_order(
    State(orders): State<Orders>,
    headers: HeaderMap,
    body: String,
) -> (StatusCode, String) {
    let n = orders.created.fetch_add(1, Ordering::SeqCst) + 1;
    if body.contains("gift-wrap") {
        // A slow order: long enough for a copy to arrive meanwhile.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let tenant = headers
        .get("x-tenant-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("anonymous");
    (
        StatusCode::CREATED,
        format!("order {n} for {tenant}: {body}"),
    )
}

fn order(tenant: Option<&str>, key: Option<&str>, body: &'static str) -> HttpRequest {
    let mut request = Request::post("/orders");
    if let Some(tenant) = tenant {
        request = request.header("x-tenant-id", tenant);
    }
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

fn show(what: &str, response: &HttpResponse) {
    let replayed = response.headers().contains_key("idempotent-replayed");
    println!(
        "{what:<52} {} {}{}",
        response.status().as_u16(),
        String::from_utf8_lossy(response.body()),
        if replayed { "  [replayed]" } else { "" }
    );
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    let orders = Orders::default();
    // In production: a store bounded for the repeats expected within the
    // TTL, or `RedisIdempotencyStore` for a fleet.
    let keys = MemoryIdempotencyStore::new(100_000).with_max_bytes(64 << 20);
    let guard = IdempotencyGuardLayer::new(keys).scope_by(|request| {
        // An authentication layer in front would vouch for the tenant; here
        // the header stands in for it.
        request
            .headers
            .get("x-tenant-id")?
            .to_str()
            .ok()
            .map(str::to_owned)
    });
    let app = Router::new()
        .route("/orders", post(create_order))
        .with_state(orders.clone())
        .layer(guard);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    // The client: one key per logical call, kept by every resend of it.
    let client = IdempotencyKeyLayer::new().layer(http_client());
    let send = |mut request: HttpRequest| {
        let client = client.clone();
        *request.uri_mut() = format!("{base}{}", request.uri()).parse().unwrap();
        async move { client.oneshot(request).await }
    };

    // 1. The same call sent twice.
    let first = send(order(Some("tenant-a"), Some("order-1"), r#"{"sku":42}"#)).await?;
    show("tenant-a creates order-1", &first);
    let again = send(order(Some("tenant-a"), Some("order-1"), r#"{"sku":42}"#)).await?;
    show("tenant-a sends it again", &again);

    // 2. The key reused for another payload.
    let reused = send(order(Some("tenant-a"), Some("order-1"), r#"{"sku":7}"#)).await?;
    show("tenant-a reuses order-1 for another payload", &reused);

    // 3. A copy while the first is still running.
    let slow = tokio::spawn(send(order(Some("tenant-a"), Some("order-2"), "gift-wrap")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let copy = send(order(Some("tenant-a"), Some("order-2"), "gift-wrap")).await?;
    show("tenant-a's copy of order-2 while it runs", &copy);
    let slow = slow.await??;
    show("tenant-a's order-2", &slow);

    // 4. Tenants never see each other's keys.
    let other_tenant = send(order(Some("tenant-b"), Some("order-1"), r#"{"sku":42}"#)).await?;
    show("tenant-b uses the key order-1", &other_tenant);
    let spelled = send(order(None, Some("8:tenant-a:order-1"), r#"{"sku":42}"#)).await?;
    show("no tenant, key spelling tenant-a's record", &spelled);

    // A POST without a key gets one from the client layer.
    let keyed = send(order(Some("tenant-c"), None, "{}")).await?;
    show("tenant-c, key added by the client layer", &keyed);

    let created = orders.created.load(Ordering::SeqCst);
    println!("orders created: {created}");

    let mut ok = true;
    let mut expect = |what: &str, good: bool| {
        if !good {
            eprintln!("UNEXPECTED: {what}");
            ok = false;
        }
    };
    expect(
        "the repeat of order-1 is the stored response",
        again.headers().contains_key("idempotent-replayed") && again.body() == first.body(),
    );
    expect(
        "a reused key with another payload gets 422",
        reused.status() == StatusCode::UNPROCESSABLE_ENTITY
            && reused.headers()["content-type"] == "application/problem+json",
    );
    expect(
        "a copy while the first runs gets 409 with Retry-After",
        copy.status() == StatusCode::CONFLICT && copy.headers()["retry-after"] == "1",
    );
    expect(
        "tenant-b and the anonymous caller get their own orders",
        other_tenant.status() == StatusCode::CREATED
            && !other_tenant.headers().contains_key("idempotent-replayed")
            && spelled.status() == StatusCode::CREATED
            && !spelled.headers().contains_key("idempotent-replayed")
            && !String::from_utf8_lossy(spelled.body()).contains("tenant-a"),
    );
    expect(
        "five orders were created: order-1 once, order-2 once, tenant-b, anonymous, tenant-c",
        created == 5,
    );
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
