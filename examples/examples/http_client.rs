//! A hyper-util HTTP client with retries: body replay, `Retry-After`
//! honoured, and one retry budget shared by two clients.
//!
//! ```sh
//! cargo run -p examples --example http_client
//! ```
//!
//! Three short scenes against scripted servers on 127.0.0.1:
//!
//! 1. **Body replay.** A `PUT` whose body is a one-shot stream meets a 503.
//!    `ReplayBodyLayer` had read the body into memory, so the retry sends it
//!    again, byte for byte. A body above the limit is sent once, whole, and
//!    not retried.
//! 2. **`Retry-After`.** The server answers 429 with `Retry-After: 1`. The
//!    server's wait replaces the computed backoff (50 ms here): the retry
//!    goes out one second later.
//! 3. **A shared budget.** Two clients of one service share a retry budget.
//!    During a full outage the budget caps the retries of both together at
//!    20 % of their traffic (plus a small reserve), where `max_retries = 3`
//!    alone would send four times the traffic to a service that is down.
//!
//! The stack, outermost first:
//!
//! ```text
//! ReplayBody → Retry (+ shared budget) → hyper-util client
//! ```
//!
//! `ReplayBodyLayer` sits *above* the retry layer because the retry layer
//! clones the request for each attempt: it needs a body it can copy
//! (`ReplayBody`), and only a layer that runs before the first attempt can
//! read the original stream into memory.

use std::convert::Infallible;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use examples::client::{http_client_for, HttpResponse};
use examples::scripted::{Reply, ScriptedServer};
use futures_util::stream;
use http::Request;
use http_body::Frame;
use http_body_util::StreamBody;
use tower::retry::budget::Budget;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_retry_budget::body::{ReplayBody, ReplayBodyLayer};
use tower_retry_budget::budget::TpsBudget;
use tower_retry_budget::error::BudgetExhausted;
use tower_retry_budget::{Backoff, RetryEvent, RetryLayer};
use tower_retry_budget::{RetryStopped, StopReason};

/// A request body that can be read only once, like a file being uploaded or
/// hyper's `Incoming`.
type OneShot = StreamBody<stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

fn one_shot(chunks: &[&'static [u8]]) -> OneShot {
    let frames: Vec<_> = chunks
        .iter()
        .map(|chunk| Ok(Frame::data(Bytes::from_static(chunk))))
        .collect();
    StreamBody::new(stream::iter(frames))
}

type Client = BoxCloneSyncService<Request<OneShot>, HttpResponse, BoxError>;

/// Replayable bodies up to 64 KiB, then retry with `budget`.
fn client(budget: Option<Arc<dyn Budget + Send + Sync>>) -> Result<Client, BoxError> {
    let retry = RetryLayer::http_builder()
        .max_retries(3)
        .backoff(Backoff::exponential(Duration::from_millis(50)))
        .deadline(Duration::from_secs(5))
        .on_retry(|event: &RetryEvent| {
            println!(
                "     ↻ retry: attempt {} after {} ({}), waiting {:?}",
                event.attempt,
                event.failure.kind,
                match event.failure.retry_after() {
                    Some(_) => "the server said when",
                    None => "computed backoff",
                },
                event.wait
            );
        });
    let retry = match budget {
        Some(budget) => retry.budget(budget),
        None => retry.no_budget(),
    }
    .build()?;
    let stack = ServiceBuilder::new()
        .layer(ReplayBodyLayer::new(64 * 1024))
        .layer(retry)
        .service(http_client_for::<ReplayBody<OneShot>>());
    Ok(BoxCloneSyncService::new(stack))
}

/// The same stack without the retry log (the budget scene sends many requests).
fn quiet_client(budget: Option<Arc<dyn Budget + Send + Sync>>) -> Result<Client, BoxError> {
    let retry = RetryLayer::http_builder()
        .max_retries(3)
        .backoff(Backoff::fixed(Duration::from_millis(1)));
    let retry = match budget {
        Some(budget) => retry.budget(budget),
        None => retry.no_budget(),
    }
    .build()?;
    let stack = ServiceBuilder::new()
        .layer(ReplayBodyLayer::new(64 * 1024))
        .layer(retry)
        .service(http_client_for::<ReplayBody<OneShot>>());
    Ok(BoxCloneSyncService::new(stack))
}

struct Checks(bool);

impl Checks {
    fn check(&mut self, what: &str, good: bool) {
        if !good {
            eprintln!("UNEXPECTED: {what}");
            self.0 = false;
        }
    }
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    let mut checks = Checks(true);
    // A budget shared by nobody else: large enough not to matter in scenes 1-2.
    let client = client(Some(Arc::new(TpsBudget::default())))?;

    // ---- 1. Body replay -------------------------------------------------
    println!("1. body replay");
    let server = ScriptedServer::start().await?;
    server
        .then(1, Reply::status(503))
        .otherwise(Reply::ok("saved"));

    let request = Request::put(format!("{}/documents/7", server.url())).body(one_shot(&[
        b"{\"title\":",
        b"\"draft\",",
        b"\"v\":2}",
    ]))?;
    let response = client.clone().oneshot(request).await?;
    let bodies: Vec<Bytes> = server.received().into_iter().map(|r| r.body).collect();
    println!(
        "   PUT /documents/7 (a 3-chunk one-shot stream) → {} after {} attempts",
        response.status(),
        bodies.len()
    );
    for (n, body) in bodies.iter().enumerate() {
        println!(
            "     attempt {} carried {:?}",
            n + 1,
            String::from_utf8_lossy(body)
        );
    }
    checks.check(
        "the PUT succeeds on its second attempt",
        response.status() == 200 && bodies.len() == 2,
    );
    checks.check(
        "both attempts carry the whole body",
        bodies
            .iter()
            .all(|b| &b[..] == b"{\"title\":\"draft\",\"v\":2}"),
    );

    // A body over the limit cannot be kept for a second attempt: it is sent
    // once, whole (never truncated), and its failure is returned as is.
    let server = ScriptedServer::start().await?;
    server
        .then(1, Reply::status(503))
        .otherwise(Reply::ok("saved"));
    static BIG: [u8; 100 * 1024] = [b'x'; 100 * 1024];
    let request = Request::put(format!("{}/documents/8", server.url()))
        .body(one_shot(&[&BIG[..50 * 1024], &BIG[50 * 1024..]]))?;
    let response = client.clone().oneshot(request).await?;
    let received = server.received();
    println!(
        "   PUT /documents/8 (100 KiB, over the 64 KiB limit) → {} after {} attempt; the server got {} KiB",
        response.status(),
        received.len(),
        received.first().map_or(0, |r| r.body.len()) / 1024
    );
    checks.check(
        "an over-limit body is sent once, whole, and not retried",
        response.status() == 503 && received.len() == 1 && received[0].body.len() == BIG.len(),
    );

    // ---- 2. Retry-After -----------------------------------------------
    println!("\n2. Retry-After");
    let server = ScriptedServer::start().await?;
    server
        .then(1, Reply::status(429).header("retry-after", "1"))
        .otherwise(Reply::ok("here you go"));
    let started = Instant::now();
    let request = Request::get(format!("{}/quota", server.url())).body(one_shot(&[]))?;
    let response = client.clone().oneshot(request).await?;
    let received = server.received();
    let gap = match &received[..] {
        [first, second, ..] => second.at - first.at,
        _ => Duration::ZERO,
    };
    println!(
        "   GET /quota → {} in {:.2} s; the server saw the retry {:.3} s after the 429 (Retry-After: 1; our own backoff would have been ≤ 50 ms)",
        response.status(),
        started.elapsed().as_secs_f64(),
        gap.as_secs_f64()
    );
    checks.check(
        "the retry succeeds",
        response.status() == 200 && received.len() == 2,
    );
    checks.check(
        "the retry waited the server's second",
        gap >= Duration::from_millis(950) && gap < Duration::from_secs(3),
    );

    // ---- 3. One budget, two clients --------------------------------------
    println!("\n3. one retry budget shared by two clients, during a full outage");
    let server = ScriptedServer::start().await?;
    server.otherwise(Reply::status(503).body("down"));

    // Finagle's shape: retries may add 20 % to the requests of the last 10 s,
    // plus a reserve of 1 retry per second of that window (10 here), so a
    // quiet client can still retry a blip. One `Arc`, given to both layers.
    let budget: Arc<dyn Budget + Send + Sync> =
        Arc::new(TpsBudget::new(Duration::from_secs(10), 1, 0.2)?);
    let orders = quiet_client(Some(budget.clone()))?;
    let billing = quiet_client(Some(budget.clone()))?;
    const REQUESTS: usize = 50;

    let mut total_requests = 0;
    for (name, client) in [("orders", &orders), ("billing", &billing)] {
        let before = server.hits();
        let mut refused = 0;
        for n in 0..REQUESTS {
            let request =
                Request::get(format!("{}/{name}/{n}", server.url())).body(one_shot(&[]))?;
            match client.clone().oneshot(request).await {
                // A spent budget hands the upstream's 503 back at once,
                // marked with why retrying stopped.
                Ok(response)
                    if response
                        .extensions()
                        .get::<RetryStopped>()
                        .is_some_and(|stopped| stopped.reason == StopReason::Budget) =>
                {
                    refused += 1
                }
                Err(error) if error.is::<BudgetExhausted>() => refused += 1,
                Err(error) => return Err(error),
                Ok(_) => {}
            }
        }
        total_requests += REQUESTS;
        let sent = server.hits() - before;
        println!(
            "   {name:<8} {REQUESTS} requests → {sent} attempts reached the server ({} retries); {refused} requests stopped on the spent budget",
            sent - REQUESTS
        );
        if name == "billing" {
            checks.check(
                "the second client finds the budget spent by the first",
                refused > REQUESTS / 2,
            );
        }
    }
    let hits = server.hits();
    let amplification = hits as f64 / total_requests as f64;
    let bound = 10 + total_requests / 5;
    println!(
        "   together: {total_requests} requests, {hits} attempts = {amplification:.2}× the traffic (retries ≤ reserve 10 + 20 % × {total_requests} = {bound})"
    );
    checks.check(
        "the budget bounds the retries",
        hits - total_requests <= bound + 1,
    );

    // For contrast: the same client without a budget.
    let unbudgeted = quiet_client(None)?;
    let before = server.hits();
    for n in 0..10 {
        let request =
            Request::get(format!("{}/unbudgeted/{n}", server.url())).body(one_shot(&[]))?;
        let _ = unbudgeted.clone().oneshot(request).await?;
    }
    let sent = server.hits() - before;
    println!(
        "   without a budget: 10 requests → {sent} attempts = {:.1}× the traffic",
        sent as f64 / 10.0
    );
    checks.check(
        "without a budget every request is retried 3 times",
        sent == 40,
    );

    Ok(if checks.0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
