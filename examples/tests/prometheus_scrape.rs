//! Scrapes the `prometheus` example's gateway over HTTP: the series of two
//! downstreams built from one configuration stay apart under their names,
//! and every family series is described.
//!
//! Its own binary: it installs the global `metrics` recorder.

use examples::observability::{get, parse_scrape, router, serve, Sample};
use examples::scripted::{Reply, ScriptedServer};
use http::StatusCode;
use metrics_exporter_prometheus::PrometheusBuilder;

fn value(samples: &[Sample], name: &str, key: &str, label: &str) -> Option<f64> {
    let matching: Vec<f64> = samples
        .iter()
        .filter(|s| s.name == name && s.label(key) == Some(label))
        .map(|s| s.value)
        .collect();
    (!matching.is_empty()).then(|| matching.iter().sum())
}

#[tokio::test]
async fn a_scrape_keeps_two_downstreams_apart_and_describes_every_series() {
    let metrics = PrometheusBuilder::new().install_recorder().unwrap();
    let inventory = ScriptedServer::start().await.unwrap();
    inventory
        .then(1, Reply::status(503))
        .otherwise(Reply::ok("12 in stock"));
    let payments = ScriptedServer::start().await.unwrap();
    payments.otherwise(Reply::status(503));
    let gateway = serve(router(metrics, inventory.uri(), payments.uri()))
        .await
        .unwrap();

    for _ in 0..5 {
        let (status, body) = get(&format!("http://{gateway}/inventory")).await.unwrap();
        assert_eq!((status, body.as_str()), (StatusCode::OK, "12 in stock"));
    }
    for _ in 0..5 {
        let (status, _) = get(&format!("http://{gateway}/payments")).await.unwrap();
        assert_ne!(status, StatusCode::OK);
    }
    // Calls 1–3 to payments make 3 attempts each (max_attempts 3); the
    // third failed call opens its breaker, which refuses calls 4 and 5.
    assert_eq!(payments.hits(), 9);
    assert_eq!(inventory.hits(), 6, "one 503, retried once, then 5 answers");

    let (status, scrape) = get(&format!("http://{gateway}/metrics")).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let samples = parse_scrape(&scrape);

    let retries = |name| value(&samples, "tower_retry_retries_total", "retry", name);
    assert_eq!(retries("inventory"), Some(1.0));
    assert_eq!(retries("payments"), Some(6.0));
    assert_eq!(
        value(
            &samples,
            "tower_retry_sleep_seconds_count",
            "retry",
            "inventory"
        ),
        Some(1.0)
    );
    let state = |name| value(&samples, "tower_breaker_state", "breaker", name);
    assert_eq!(state("inventory"), Some(0.0), "closed");
    assert_eq!(state("payments"), Some(2.0), "open");
    assert_eq!(
        value(
            &samples,
            "tower_breaker_rejected_total",
            "breaker",
            "payments"
        ),
        Some(2.0)
    );
    assert_eq!(
        value(
            &samples,
            "tower_poison_dead_lettered_total",
            "label",
            "payments"
        ),
        Some(3.0),
        "the three failed calls; the two refusals are returned unstored (store_refusals is off by default)"
    );
    assert_eq!(
        value(&samples, "tower_poison_dlq_depth", "label", "payments"),
        Some(3.0)
    );
    assert_eq!(
        value(&samples, "tower_poison_dlq_depth", "label", "inventory"),
        None,
        "nothing was dead-lettered for inventory"
    );
    // No series under a default name: every layer was named.
    for sample in samples.iter().filter(|s| s.name.starts_with("tower_")) {
        for key in ["retry", "breaker", "label"] {
            assert_ne!(sample.label(key), Some("default"), "{sample:?}");
        }
    }

    // Every family's series has its description.
    let families: Vec<&str> = scrape
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split(' ').next())
        .filter(|name| {
            ["tower_retry_", "tower_breaker_", "tower_poison_"]
                .iter()
                .any(|p| name.starts_with(p))
        })
        .collect();
    assert!(families.len() >= 8, "{families:?}");
    for family in families {
        assert!(
            scrape.contains(&format!("# HELP {family} ")),
            "{family} has no # HELP line:\n{scrape}"
        );
    }
}
