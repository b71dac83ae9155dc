//! The operator's admin page over a small live scenario: two downstreams
//! called through the whole stack, traffic generated in-process, so that a
//! breaker opens, retries happen and dead letters appear while you watch.
//!
//! ```sh
//! cargo run -p examples --example admin_page                     # serve until Ctrl-C
//! cargo run -p examples --example admin_page -- --exit-after 3   # a short run that checks itself
//! ```
//!
//! It prints the page's address and its token (random, or `ADMIN_PAGE_TOKEN`
//! when set): open the address, paste the token, and force breakers, replay
//! or purge dead letters from the page.
//!
//! - `orders` goes down for a few seconds (every request `503`): its calls
//!   fail after their retries, its breaker opens, and the failed calls (and
//!   those the open breaker refused) land in the dead-letter store. Then it
//!   recovers, the breaker closes after its cooldown, and the stored orders
//!   can be replayed from the page. Served until Ctrl-C, it goes down again
//!   every 30 seconds.
//! - Every request's body carries a note written as HTML markup
//!   (`<img src=x onerror=…>`): the page shows it, in an entry, as those
//!   characters.
//! - `payments` fails one request in four once: the retry layer fixes each
//!   of those, which the page shows as retries and recoveries.
//!
//! Both stacks come from one [`ResilienceConfig`] and write to one memory
//! store; [`AdminPage`] shows both breakers, both stacks' retry counts and
//! the store, and replays entries to the upstream through a plain HTTP
//! client. With `--exit-after SECS` the scenario has one outage, and at the
//! end the example reads the page's own JSON with the token, replays one
//! entry through it, and exits non-zero unless the breaker opened, dead
//! letters appeared, the payments retries were counted and the replay was
//! delivered.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use examples::client::{http_client, http_client_for, HttpService};
use examples::scripted::{Reply, ScriptedServer};
use http::{header, Request, Response};
use http_body_util::Full;
use serde_json::Value;
use tokio::net::TcpListener;
use tower::{BoxError, Layer, ServiceExt};
use tower_poison::store::MemoryStore;
use tower_poison::{OpenCall, ReplayBody, SettleBody};
use tower_steadfast::{AdminPage, ResilienceConfig};

/// The admin page over a live scenario of two downstreams.
#[derive(Debug, Parser)]
struct Args {
    /// Run the scenario (one outage) for this many seconds, check what the
    /// page shows, and exit; without it, serve until Ctrl-C.
    #[arg(long, value_name = "SECS")]
    exit_after: Option<f64>,
    /// The admin page's port on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    port: u16,
}

/// How the stacks are set: two attempts a call, quick backoff, a breaker
/// that opens after three failed calls in a row and probes after 4 s.
const CONFIG: &str = r#"{
    "retry": {"max_attempts": 2, "backoff": "exponential", "base_ms": 20, "max_ms": 100},
    "circuit_breaker": {"consecutive_failures": 3, "cooldown_secs": 4},
    "poison": {"action": "dlq"}
}"#;

/// How long `orders` is down, from the start (and, when serving, from each
/// 30-second mark).
const OUTAGE: Duration = Duration::from_millis(2500);
const OUTAGE_EVERY: Duration = Duration::from_secs(30);

/// 32 random bytes as hex, from the standard library's per-process hash
/// keys: a demo token, printed once.
fn random_token() -> String {
    (0..4)
        .map(|i| {
            let mut hasher = RandomState::new().build_hasher();
            hasher.write_u64(i);
            format!("{:016x}", hasher.finish())
        })
        .collect()
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    let args = Args::parse();
    let once = args.exit_after.is_some();
    let started = Instant::now();

    // The upstream: `/orders` down during each outage, `/payments` failing
    // every fourth request.
    let upstream = ScriptedServer::start().await?;
    let payments_seen = Arc::new(AtomicU64::new(0));
    let seen = payments_seen.clone();
    upstream.respond_with(move |request, _| {
        if request.uri.path().starts_with("/payments") {
            return match seen.fetch_add(1, Ordering::Relaxed) % 4 {
                3 => Reply::status(503),
                _ => Reply::ok("paid"),
            };
        }
        let since = started.elapsed();
        let in_outage = if once {
            since < OUTAGE
        } else {
            since.as_secs_f64() % OUTAGE_EVERY.as_secs_f64() < OUTAGE.as_secs_f64()
        };
        if in_outage {
            Reply::status(503)
        } else {
            Reply::ok("accepted")
        }
    });

    let config = ResilienceConfig::from_json_str(CONFIG)?;
    let store = MemoryStore::new(10_000);
    let orders = config.layer("orders", store.clone());
    let payments = config.layer("payments", store.clone());

    let token = std::env::var("ADMIN_PAGE_TOKEN").unwrap_or_else(|_| random_token());
    let admin = AdminPage::new(token.clone())
        .stack(&orders)
        .stack(&payments)
        .dead_letters(store.clone(), upstream.uri(), http_client())
        .router()?;
    let app = axum::Router::new().nest("/admin", admin);
    let listener = TcpListener::bind(("127.0.0.1", args.port)).await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    println!("admin page: http://{address}/admin/index.html");
    println!("token: {token}");

    // Traffic: an order every 150 ms, a payment every 100 ms.
    let client = http_client_for::<ReplayBody<Full<Bytes>>>();
    for (stack, path, every) in [
        (orders.clone(), "orders", Duration::from_millis(150)),
        (payments.clone(), "payments", Duration::from_millis(100)),
    ] {
        // The body comes back in a `SettleBody`; an HTTP call is settled by
        // its head, so the buffered body is taken out as it was.
        let service = HttpService::new(stack.layer(client.clone()).map_response(
            |response: Response<SettleBody<Bytes, OpenCall>>| response.map(SettleBody::into_inner),
        ));
        let url = format!("{}/{path}", upstream.url());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            for n in 0u64.. {
                tick.tick().await;
                let request = Request::post(&url)
                    .header(header::CONTENT_TYPE, "application/json")
                    .header("idempotency-key", format!("{path}-{n}"))
                    // The note is markup: the page shows it as text.
                    .body(Full::from(format!(
                        r#"{{"{path}":{n},"note":"<img src=x onerror=alert(1)>"}}"#
                    )))
                    .expect("a valid request");
                let service = service.clone();
                // Each call on its own task: a call waiting out its retries
                // does not hold the next one back.
                tokio::spawn(async move {
                    let _ = service.oneshot(request).await;
                });
            }
        });
    }

    if once {
        tokio::spawn(async move {
            tokio::time::sleep_until((started + OUTAGE).into()).await;
            println!("orders upstream recovered");
        });
    }

    let Some(seconds) = args.exit_after else {
        println!("serving until Ctrl-C");
        tokio::signal::ctrl_c().await?;
        return Ok(ExitCode::SUCCESS);
    };
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    check(&format!("http://{address}/admin"), &token).await
}

/// Reads the page's JSON as the page does, replays one entry through it, and
/// says whether the scenario showed what it should.
async fn check(base: &str, token: &str) -> Result<ExitCode, BoxError> {
    let client = http_client();
    let call = |request: Request<Full<Bytes>>| {
        let client = client.clone();
        async move {
            let response = client.oneshot(request).await?;
            Ok::<Value, BoxError>(serde_json::from_slice(response.body())?)
        }
    };
    let state = call(
        Request::get(format!("{base}/api/state"))
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(Full::default())?,
    )
    .await?;

    let breaker = |key: &str| {
        state["breakers"]
            .as_array()
            .and_then(|list| list.iter().find(|b| b["key"] == key))
            .cloned()
            .unwrap_or_default()
    };
    let orders = breaker("orders");
    let store = &state["dead_letters"][0];
    let payments = state["retries"]
        .as_array()
        .and_then(|list| list.iter().find(|r| r["name"] == "payments"))
        .cloned()
        .unwrap_or_default();
    println!(
        "orders breaker: {} (opened {} times); dead letters: {}; payments: {} retries, {} recovered",
        orders["state"], orders["opened"], store["depth"], payments["retries"], payments["recovered"],
    );

    let mut ok = true;
    let mut expect = |holds: bool, what: &str| {
        if !holds {
            eprintln!("expected: {what}");
            ok = false;
        }
    };
    expect(
        orders["opened"].as_u64() >= Some(1),
        "the orders breaker opened",
    );
    expect(
        store["depth"].as_u64() >= Some(1),
        "dead letters were stored",
    );
    expect(
        payments["retries"].as_u64() >= Some(1),
        "payments retries were counted",
    );
    expect(
        payments["recovered"].as_u64() >= Some(1),
        "payments calls recovered",
    );

    // The outage is over: the oldest order shown replays, through the page's
    // own endpoint, as the page's button sends it.
    if let Some(id) = store["newest"]
        .as_array()
        .and_then(|entries| entries.iter().find(|e| e["label"] == "orders"))
        .and_then(|entry| entry["id"].as_str())
    {
        let host = base
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap_or_default();
        let outcome = call(
            Request::post(format!("{base}/api/dead-letters/replay"))
                .header(header::AUTHORIZATION, format!("Bearer {token}"))
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::ORIGIN, format!("http://{host}"))
                .body(Full::from(format!(r#"{{"store":0,"id":"{id}"}}"#)))?,
        )
        .await?;
        println!("replayed {id}: {}", outcome["outcome"]);
        expect(
            outcome["outcome"] == "delivered",
            "the replay was delivered",
        );
    } else {
        expect(false, "an orders entry to replay");
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
