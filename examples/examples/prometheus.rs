//! A gateway that calls two downstreams through the whole stack, each under
//! its own name, and exposes the family's metrics at `/metrics` with
//! metrics-exporter-prometheus.
//!
//! ```sh
//! cargo run -p examples --example prometheus            # a short run, then the scrape
//! cargo run -p examples --example prometheus -- --serve  # keep serving; curl it
//! ```
//!
//! Two scripted downstreams on 127.0.0.1: `inventory` fails once with a 503
//! and then answers (one retry, the breaker stays closed), `payments` is down
//! (every attempt 503: its breaker opens, its calls are dead-lettered). The
//! scrape shows each downstream's series under its own name: the retries of
//! one never add to the other's, and one open breaker is not hidden behind
//! another's closed one.
//!
//! The recorder is installed before the layers are built, so every series
//! has its `# HELP` line: each layer registers its metrics' descriptions
//! when it is built.

use std::process::ExitCode;

use examples::observability::{get, parse_scrape, router, serve};
use examples::scripted::{Reply, ScriptedServer};
use metrics_exporter_prometheus::PrometheusBuilder;
use tower::BoxError;

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    let keep_serving = std::env::args().any(|arg| arg == "--serve");
    let metrics = PrometheusBuilder::new().install_recorder()?;

    let inventory = ScriptedServer::start().await?;
    inventory
        .then(1, Reply::status(503))
        .otherwise(Reply::ok("12 in stock"));
    let payments = ScriptedServer::start().await?;
    payments.otherwise(Reply::status(503));

    let gateway = serve(router(metrics, inventory.uri(), payments.uri())).await?;
    println!("gateway on http://{gateway}: /inventory, /payments, /metrics");

    for path in ["inventory", "payments"] {
        for _ in 0..5 {
            let (status, _) = get(&format!("http://{gateway}/{path}")).await?;
            println!("GET /{path} -> {status}");
        }
    }

    let (_, scrape) = get(&format!("http://{gateway}/metrics")).await?;
    println!("\n--- GET /metrics (the family's series)");
    for line in scrape.lines().filter(|line| line.contains("tower_")) {
        println!("{line}");
    }

    // The two downstreams' series are apart.
    let samples = parse_scrape(&scrape);
    let state = |breaker: &str| {
        samples
            .iter()
            .find(|s| s.name == "tower_breaker_state" && s.label("breaker") == Some(breaker))
            .map(|s| s.value)
    };
    let retried = |retry: &str| {
        samples
            .iter()
            .filter(|s| s.name == "tower_retry_retries_total" && s.label("retry") == Some(retry))
            .map(|s| s.value)
            .sum::<f64>()
    };
    let ok = state("payments") == Some(2.0)
        && state("inventory") == Some(0.0)
        && retried("inventory") == 1.0
        && retried("payments") >= 2.0;
    println!(
        "\npayments breaker open: {}, inventory breaker closed: {}, retries inventory={} payments={}",
        state("payments") == Some(2.0),
        state("inventory") == Some(0.0),
        retried("inventory"),
        retried("payments"),
    );
    if !ok {
        eprintln!("the scrape does not keep the two downstreams apart");
        return Ok(ExitCode::FAILURE);
    }
    if keep_serving {
        println!("serving until Ctrl-C: curl http://{gateway}/metrics");
        tokio::signal::ctrl_c().await?;
    }
    Ok(ExitCode::SUCCESS)
}
