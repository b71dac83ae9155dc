//! An axum handler that calls a downstream through `HedgeLayer`.
//!
//! ```sh
//! cargo run -p examples --example axum_hedged_downstream
//! ```
//!
//! A pricing service on 127.0.0.1 answers in about 5 ms, except one request
//! in 25, which stalls for 400 ms (a GC pause, a cold cache on one replica).
//! A gateway serves `/quote/{id}` by asking it for the price, once through
//! a plain hyper-util client and once through the same client behind a
//! `HedgeLayer`:
//!
//! ```text
//! axum handler → HedgeLayer (p95 of recent latencies, 5 % extra load) → hyper-util client
//! ```
//!
//! 300 quotes each way, ten at a time. The hedged route sends a second copy
//! of a request whose first attempt is slower than the p95 of the recent
//! ones, takes the first answer and drops the other; its p99 falls from the
//! stall to a few milliseconds, for at most 5 % more requests to the pricing
//! service. GETs only: `http_builder` never hedges a POST without an
//! `Idempotency-Key`.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use examples::client::{http_client, HttpService};
use http::Request;
use http_body_util::Full;
use tower::{BoxError, Layer, ServiceExt};
use tower_retry_budget::hedge::HedgeLayer;

const QUOTES: usize = 300;
const CONCURRENCY: usize = 10;

/// The pricing service: every 25th request stalls.
async fn pricing(counter: Arc<AtomicU64>) -> std::io::Result<String> {
    let router = Router::new().route(
        "/price/{id}",
        get(
            |State(counter): State<Arc<AtomicU64>>, Path(id): Path<u32>| async move {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                let wait = if n % 25 == 7 { 400 } else { 5 };
                tokio::time::sleep(Duration::from_millis(wait)).await;
                format!("{}.{:02}", 10 + id % 90, id % 100)
            },
        ),
    );
    serve(router.with_state(counter)).await
}

#[derive(Clone)]
struct Gateway {
    pricing: String,
    plain: HttpService,
    hedged: HttpService,
}

async fn quote(client: &HttpService, url: String) -> (StatusCode, String) {
    let request = match Request::get(url).body(Full::new(Bytes::new())) {
        Ok(request) => request,
        Err(error) => return (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
    };
    match client.clone().oneshot(request).await {
        Ok(response) => (
            StatusCode::OK,
            String::from_utf8_lossy(response.body()).into_owned(),
        ),
        Err(error) => (StatusCode::BAD_GATEWAY, error.to_string()),
    }
}

fn gateway(state: Gateway) -> Router {
    Router::new()
        .route(
            "/quote/{id}",
            get(
                |State(gw): State<Gateway>, Path(id): Path<u32>| async move {
                    quote(&gw.hedged, format!("{}/price/{id}", gw.pricing)).await
                },
            ),
        )
        .route(
            "/quote-unhedged/{id}",
            get(
                |State(gw): State<Gateway>, Path(id): Path<u32>| async move {
                    quote(&gw.plain, format!("{}/price/{id}", gw.pricing)).await
                },
            ),
        )
        .with_state(state)
}

async fn serve(router: Router) -> std::io::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        axum::serve(listener, router).await.ok();
    });
    Ok(format!("http://{addr}"))
}

/// `QUOTES` requests to `route`, `CONCURRENCY` at a time; their latencies, sorted.
async fn drive(gateway: &str, route: &str) -> Result<Vec<Duration>, BoxError> {
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..CONCURRENCY {
        let next = next.clone();
        let base = format!("{gateway}/{route}");
        workers.push(tokio::spawn(async move {
            let client = http_client();
            let mut latencies = Vec::new();
            loop {
                let id = next.fetch_add(1, Ordering::Relaxed);
                if id >= QUOTES as u64 {
                    return Ok::<_, BoxError>(latencies);
                }
                let started = Instant::now();
                let request = Request::get(format!("{base}/{id}")).body(Full::new(Bytes::new()))?;
                let response = client.clone().oneshot(request).await?;
                if response.status() != StatusCode::OK {
                    return Err(format!("quote {id}: {}", response.status()).into());
                }
                latencies.push(started.elapsed());
            }
        }));
    }
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await??);
    }
    all.sort();
    Ok(all)
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    let sent = Arc::new(AtomicU64::new(0));
    let pricing_url = pricing(sent.clone()).await?;

    let hedge = HedgeLayer::http_builder()
        .name("pricing")
        // Start hedging after 20 latencies instead of the default 100.
        .min_samples(20)
        .build()?;
    let hedged = HttpService::new(hedge.clone().layer(http_client()));
    let gateway_url = serve(gateway(Gateway {
        pricing: pricing_url,
        plain: http_client(),
        hedged,
    }))
    .await?;

    let mut good = true;
    let mut check = |what: &str, ok: bool| {
        if !ok {
            eprintln!("UNEXPECTED: {what}");
            good = false;
        }
    };

    let before = sent.load(Ordering::Relaxed);
    let plain = drive(&gateway_url, "quote-unhedged").await?;
    let plain_sent = sent.load(Ordering::Relaxed) - before;
    let before = sent.load(Ordering::Relaxed);
    let hedged = drive(&gateway_url, "quote").await?;
    let hedged_sent = sent.load(Ordering::Relaxed) - before;

    println!("{QUOTES} quotes each way, {CONCURRENCY} at a time; one pricing request in 25 stalls 400 ms\n");
    println!("| route | p50 | p99 | max | requests to pricing |");
    println!("|---|---|---|---|---|");
    for (name, latencies, requests) in [
        ("/quote-unhedged", &plain, plain_sent),
        ("/quote (HedgeLayer)", &hedged, hedged_sent),
    ] {
        println!(
            "| {name} | {:.1?} | {:.1?} | {:.1?} | {requests} |",
            quantile(latencies, 0.5),
            quantile(latencies, 0.99),
            latencies[latencies.len() - 1],
        );
    }
    match hedge.current_delay() {
        Some(delay) => {
            println!("\nthe hedge delay is now {delay:.1?} (p95 of recent first attempts)")
        }
        None => println!("\nthe hedge delay is not known yet"),
    }

    check(
        "the stalls show in the unhedged p99",
        quantile(&plain, 0.99) >= Duration::from_millis(350),
    );
    check(
        "hedging cuts the p99 below the stall",
        quantile(&hedged, 0.99) < Duration::from_millis(200),
    );
    // 5 % of the calls, plus the budget's floor of one hedge per second.
    check(
        "hedges stay within the extra-load budget",
        hedged_sent <= QUOTES as u64 * 105 / 100 + 10,
    );
    check("some requests were hedged", hedged_sent > QUOTES as u64);
    Ok(if good {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
