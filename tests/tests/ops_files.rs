//! The operator files under `ops/` against what the crates really export.
//!
//! - Every metric and label the dashboard and the alert rules name is one
//!   metrics-exporter-prometheus renders after each layer ran once (with
//!   the exporter's defaults, and with its recommended naming and histogram
//!   buckets), and every metric the crates describe has a panel: a renamed
//!   metric or label fails here.
//! - The dashboard is importable: it parses, has a schema version, a
//!   Prometheus data-source variable every query uses, and a query in every
//!   panel.
//! - `promtool check rules` and `promtool test rules` pass, and every
//!   dashboard expression parses as PromQL, when `promtool` is on `PATH`
//!   (skipped with a printed reason otherwise, or failed when
//!   `TOWER_OPS_REQUIRE_PROMTOOL=1`).
//!
//! Its own binary: it installs the global `metrics` recorder.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use examples::observability::parse_scrape;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use serde_json::Value;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_breaker::CircuitBreakerLayer;
use tower_breaker::Policy;
use tower_classify::{ErrorChainClassifier, FailureKind};
use tower_idempotency::store::MemoryIdempotencyStore;
use tower_idempotency::{GuardBody, IdempotencyGuardLayer};
use tower_poison::replay::{ReplayOutcome, Replayer};
use tower_poison::store::{DeadLetterStore, MemoryStore};
use tower_poison::{DeadLetterEntry, DeadLetterLayer, ReplayBody, StoreFull};
use tower_retry_budget::backoff::{Backoff, Jitter};
use tower_retry_budget::budget::TpsBudget;
use tower_retry_budget::hedge::HedgeLayer;
use tower_retry_budget::RetryLayer;

fn ops_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../ops")
}

fn read_ops(file: &str) -> String {
    std::fs::read_to_string(ops_dir().join(file))
        .unwrap_or_else(|error| panic!("ops/{file}: {error}"))
}

fn dashboard() -> Value {
    serde_json::from_str(&read_ops("grafana-dashboard.json"))
        .expect("ops/grafana-dashboard.json is JSON")
}

fn alert_rules() -> yaml_serde::Value {
    yaml_serde::from_str(&read_ops("alerts.yml")).expect("ops/alerts.yml is YAML")
}

// ===== A recorder feeding two Prometheus exporters

/// Forwards every metric to several exporters and keeps the name and kind
/// of every metric described to it.
struct Exporters {
    recorders: Vec<PrometheusRecorder>,
    described: Arc<Mutex<BTreeMap<String, &'static str>>>,
}

struct Fan<T>(Vec<T>);

impl CounterFn for Fan<Counter> {
    fn increment(&self, value: u64) {
        self.0.iter().for_each(|c| c.increment(value));
    }
    fn absolute(&self, value: u64) {
        self.0.iter().for_each(|c| c.absolute(value));
    }
}

impl GaugeFn for Fan<Gauge> {
    fn increment(&self, value: f64) {
        self.0.iter().for_each(|g| g.increment(value));
    }
    fn decrement(&self, value: f64) {
        self.0.iter().for_each(|g| g.decrement(value));
    }
    fn set(&self, value: f64) {
        self.0.iter().for_each(|g| g.set(value));
    }
}

impl HistogramFn for Fan<Histogram> {
    fn record(&self, value: f64) {
        self.0.iter().for_each(|h| h.record(value));
    }
}

impl Exporters {
    fn describe(&self, kind: &'static str, name: &KeyName) {
        self.described
            .lock()
            .unwrap()
            .insert(name.as_str().to_owned(), kind);
    }
}

impl Recorder for Exporters {
    fn describe_counter(&self, name: KeyName, unit: Option<Unit>, text: SharedString) {
        self.describe("counter", &name);
        for r in &self.recorders {
            r.describe_counter(name.clone(), unit, text.clone());
        }
    }
    fn describe_gauge(&self, name: KeyName, unit: Option<Unit>, text: SharedString) {
        self.describe("gauge", &name);
        for r in &self.recorders {
            r.describe_gauge(name.clone(), unit, text.clone());
        }
    }
    fn describe_histogram(&self, name: KeyName, unit: Option<Unit>, text: SharedString) {
        self.describe("histogram", &name);
        for r in &self.recorders {
            r.describe_histogram(name.clone(), unit, text.clone());
        }
    }
    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        let each = self.recorders.iter();
        let each = each.map(|r| r.register_counter(key, metadata));
        Counter::from_arc(Arc::new(Fan(each.collect())))
    }
    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        let each = self.recorders.iter();
        let each = each.map(|r| r.register_gauge(key, metadata));
        Gauge::from_arc(Arc::new(Fan(each.collect())))
    }
    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        let each = self.recorders.iter();
        let each = each.map(|r| r.register_histogram(key, metadata));
        Histogram::from_arc(Arc::new(Fan(each.collect())))
    }
}

/// Each rendered metric name with the label names its samples carry.
type Rendered = BTreeMap<String, BTreeSet<String>>;

/// The names and label names of a Prometheus text exposition.
fn parse_exposition(text: &str) -> Rendered {
    let mut rendered = Rendered::new();
    for sample in parse_scrape(text) {
        rendered
            .entry(sample.name)
            .or_default()
            .extend(sample.labels.into_iter().map(|(key, _)| key));
    }
    rendered
}

/// Drives each layer of the family once, so that every metric
/// it registers has a series.
async fn drive_every_layer() {
    let reset = || io::Error::from(io::ErrorKind::ConnectionReset);

    // Retry: a retry after a failure (retries, sleep), then a call an empty
    // budget refuses to retry (budget exhausted, give-up).
    let failures = Arc::new(Mutex::new(0));
    let count = failures.clone();
    let flaky = service_fn(move |_: ()| {
        let first = {
            let mut n = count.lock().unwrap();
            *n += 1;
            *n == 1
        };
        async move {
            if first {
                Err(io::Error::from(io::ErrorKind::ConnectionReset))
            } else {
                Ok(())
            }
        }
    });
    RetryLayer::builder()
        .name("payments")
        .backoff(Backoff::fixed(Duration::from_millis(100)).with_jitter(Jitter::None))
        .no_budget()
        .build()
        .unwrap()
        .layer(flaky)
        .oneshot(())
        .await
        .unwrap();
    let empty_budget = || Arc::new(TpsBudget::new(Duration::from_secs(1), 0, 0.0).unwrap());
    RetryLayer::builder()
        .name("payments")
        .budget(empty_budget())
        .build()
        .unwrap()
        .layer(service_fn(
            move |_: ()| async move { Err::<(), _>(reset()) },
        ))
        .oneshot(())
        .await
        .unwrap_err();

    // Hedges: one that wins (the first attempt cancelled) under a
    // percentile delay (the delay gauge), one an empty budget refuses.
    let attempts = Arc::new(Mutex::new(0u32));
    let count = attempts.clone();
    let slow_first = service_fn(move |_: ()| {
        let n = {
            let mut n = count.lock().unwrap();
            *n += 1;
            *n
        };
        async move {
            let wait = if n == 2 { 1_000 } else { 10 };
            tokio::time::sleep(Duration::from_millis(wait)).await;
            Ok::<_, io::Error>(())
        }
    });
    let hedge = HedgeLayer::builder()
        .name("search")
        .percentile(0.5)
        .min_samples(1)
        .min_hedges_per_sec(10)
        .build()
        .unwrap()
        .layer(slow_first.clone());
    // The first call answers in 10 ms and sets the delay; the second is
    // slow, hedged after that delay, and its hedge wins.
    hedge.clone().oneshot(()).await.unwrap();
    hedge.oneshot(()).await.unwrap();
    *attempts.lock().unwrap() = 1;
    HedgeLayer::builder()
        .name("search")
        .delay(Duration::from_millis(50))
        .shared_budget(empty_budget())
        .build()
        .unwrap()
        .layer(slow_first)
        .oneshot(())
        .await
        .unwrap();

    // Breakers: one opened by a failure that refuses the next call, one in
    // metrics-only mode, and a keyed one evicting a key for another.
    let failing = || service_fn(move |_: &'static str| async move { Err::<(), _>(reset()) });
    let mut breaker = CircuitBreakerLayer::builder()
        .name("payments")
        .policy(Policy::consecutive_failures(1))
        .build(ErrorChainClassifier::new())
        .unwrap()
        .layer(failing());
    breaker.ready().await.unwrap().call("a").await.unwrap_err();
    let refused = breaker.ready().await.unwrap().call("a").await.unwrap_err();
    assert!(refused.is::<tower_breaker::CircuitOpen>(), "{refused}");
    CircuitBreakerLayer::builder()
        .name("inventory")
        .mode(tower_breaker::Mode::MetricsOnly)
        .build(ErrorChainClassifier::new())
        .unwrap()
        .layer(failing())
        .oneshot("a")
        .await
        .unwrap_err();
    let mut keyed = CircuitBreakerLayer::builder()
        .name("hosts")
        .policy(Policy::consecutive_failures(1))
        .max_breakers(1)
        .build_keyed(ErrorChainClassifier::new(), |host: &&'static str| *host)
        .unwrap()
        .layer(failing());
    for host in ["host-a", "host-b"] {
        keyed.ready().await.unwrap().call(host).await.unwrap_err();
    }

    // Dead letters: a store with room for one; the second failed call is
    // refused by the full store.
    let dlq = DeadLetterLayer::new(MemoryStore::new(1))
        .label("payments")
        .layer(service_fn(|_: Request<ReplayBody<Full<Bytes>>>| async {
            Ok::<_, tower::BoxError>(Response::builder().status(503).body(Bytes::new()).unwrap())
        }));
    let post = || Request::post("http://payments.test/charge").body(Full::default());
    let kept = dlq.clone().oneshot(post().unwrap()).await.unwrap();
    assert_eq!(kept.status(), 503);
    let full = dlq.oneshot(post().unwrap()).await.unwrap_err();
    assert!(full.is::<StoreFull>(), "{full}");
    // An entry replayed and delivered.
    let store = MemoryStore::new(1);
    let entry = DeadLetterEntry::new(
        "payments",
        FailureKind::ServerError,
        vec!["HTTP 503 Service Unavailable".into()],
        SystemTime::now(),
    );
    let id = entry.id;
    store.put(entry).await.unwrap();
    let mut delivering = service_fn(|_: ()| async { Ok::<_, io::Error>(()) });
    let outcome = Replayer::new(&store)
        .replay(
            id,
            &mut delivering,
            &ErrorChainClassifier::new(),
            |_| Ok(()),
        )
        .await
        .unwrap();
    assert_eq!(outcome, ReplayOutcome::Delivered);

    // The idempotency guard: room for one record, so a second key evicts
    // the first.
    let guard = IdempotencyGuardLayer::new(MemoryIdempotencyStore::new(1))
        .name("orders")
        .layer(service_fn(|_: Request<GuardBody<Full<Bytes>>>| async {
            Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from("done"))))
        }));
    for key in ["a", "b"] {
        let request = Request::post("/orders")
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from("{}")))
            .unwrap();
        let response = guard.clone().oneshot(request).await.unwrap();
        response.into_body().collect().await.unwrap();
    }
}

/// The scrapes of the two exporters after every layer ran once, and the
/// metrics the crates described (name to kind).
struct Exported {
    scrapes: Vec<(&'static str, Rendered)>,
    described: BTreeMap<String, &'static str>,
}

async fn export() -> Exported {
    let described = Arc::new(Mutex::new(BTreeMap::new()));
    let default = PrometheusBuilder::new().build_recorder();
    let recommended = PrometheusBuilder::new()
        .with_recommended_naming(true)
        .set_buckets(&[0.01, 0.1, 1.0, 10.0])
        .unwrap()
        .build_recorder();
    let handles: Vec<(&'static str, PrometheusHandle)> = vec![
        ("defaults", default.handle()),
        ("recommended naming and buckets", recommended.handle()),
    ];
    metrics::set_global_recorder(Exporters {
        recorders: vec![default, recommended],
        described: described.clone(),
    })
    .expect("the only recorder of this binary");

    tower_retry_budget::describe_metrics();
    tower_breaker::describe_metrics();
    tower_poison::describe_metrics();
    tower_idempotency::describe_metrics();
    drive_every_layer().await;

    let scrapes = handles
        .into_iter()
        .map(|(setup, handle)| (setup, parse_exposition(&handle.render())))
        .collect();
    let described = described.lock().unwrap().clone();
    Exported { scrapes, described }
}

// ===== PromQL: the metric and label names an expression uses

/// The metric names and label names (in matchers and in `by`, `without`,
/// `on`, `ignoring`, `group_left`, `group_right` lists) of a PromQL
/// expression, with Grafana's `$variables` left out.
#[derive(Debug, Default)]
struct Names {
    metrics: BTreeSet<String>,
    labels: BTreeSet<String>,
}

const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];
const KEYWORDS: &[&str] = &["and", "or", "unless", "bool", "offset", "inf", "nan"];
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

fn names_in(expr: &str) -> Names {
    let chars: Vec<char> = expr.chars().collect();
    let ident_start = |c: char| c.is_ascii_alphabetic() || c == '_' || c == ':';
    let ident_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = Names::default();
    let mut i = 0;
    let skip_string = |i: &mut usize| {
        let quote = chars[*i];
        *i += 1;
        while *i < chars.len() && chars[*i] != quote {
            if chars[*i] == '\\' {
                *i += 1;
            }
            *i += 1;
        }
        *i += 1;
    };
    let next_non_space = |from: usize| {
        chars[from..]
            .iter()
            .position(|c| !c.is_whitespace())
            .map(|p| from + p)
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            skip_string(&mut i);
        } else if c == '$' {
            // A Grafana variable: `$name`, `$__rate_interval` or `${name}`.
            i += 1;
            if chars.get(i) == Some(&'{') {
                while i < chars.len() && chars[i] != '}' {
                    i += 1;
                }
                i += 1;
            } else {
                while i < chars.len() && ident_char(chars[i]) {
                    i += 1;
                }
            }
        } else if c == '[' {
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
            i += 1;
        } else if c == '{' {
            // Matchers: `label op "value"`, comma-separated.
            i += 1;
            while i < chars.len() && chars[i] != '}' {
                if ident_start(chars[i]) {
                    let start = i;
                    while i < chars.len() && ident_char(chars[i]) {
                        i += 1;
                    }
                    names.labels.insert(chars[start..i].iter().collect());
                } else if chars[i] == '"' || chars[i] == '\'' || chars[i] == '`' {
                    skip_string(&mut i);
                } else {
                    i += 1;
                }
            }
            i += 1;
        } else if c.is_ascii_digit() || c == '.' {
            // A number or a duration (`5m`, `1e3`).
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if ident_start(c) {
            let start = i;
            while i < chars.len() && ident_char(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = next_non_space(i).map(|n| chars[n]);
            if LABEL_LISTS.contains(&word.as_str()) {
                if next == Some('(') {
                    let open = next_non_space(i).unwrap();
                    let close = open + chars[open..].iter().position(|&c| c == ')').unwrap();
                    let list: String = chars[open + 1..close].iter().collect();
                    names.labels.extend(
                        list.split(',')
                            .map(str::trim)
                            .filter(|l| !l.is_empty())
                            .map(str::to_owned),
                    );
                    i = close + 1;
                }
            } else if next == Some('(')
                || AGGREGATIONS.contains(&word.as_str())
                || KEYWORDS.contains(&word.to_ascii_lowercase().as_str())
            {
                // A function, an aggregation or a keyword.
            } else {
                names.metrics.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn names_in_reads_metrics_and_labels_and_skips_the_rest() {
    let names = names_in(
        r#"sum by (retry, class) (rate(tower_a_total{retry=~"$retry", x!="a,b}"}[$__rate_interval]))
           / on (job) group_left (zone) max(tower_b offset 5m) > 0.5 unless tower_c == bool 1 or vector(0)"#,
    );
    assert_eq!(
        names.metrics,
        BTreeSet::from(["tower_a_total", "tower_b", "tower_c"].map(String::from))
    );
    assert_eq!(
        names.labels,
        BTreeSet::from(["retry", "class", "x", "job", "zone"].map(String::from))
    );
}

// ===== The dashboard's and the rules' queries

/// Labels the scrape itself adds to every series.
const TARGET_LABELS: &[&str] = &["job", "instance"];

/// A query of the ops files, and where it is.
struct Query {
    place: String,
    expr: String,
}

fn dashboard_queries(dashboard: &Value) -> Vec<Query> {
    let mut queries = Vec::new();
    for panel in panels(dashboard) {
        let title = panel["title"].as_str().unwrap_or("?");
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap_or_default();
            queries.push(Query {
                place: format!("dashboard panel {title:?}"),
                expr: expr.to_owned(),
            });
        }
    }
    queries
}

fn rule_queries(rules: &yaml_serde::Value) -> Vec<(Query, BTreeSet<String>)> {
    let mut queries = Vec::new();
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"]
                .as_str()
                .or(rule["record"].as_str())
                .expect("a rule's name");
            // `$labels.x` in the annotations.
            let mut templated = BTreeSet::new();
            if let Some(annotations) = rule["annotations"].as_mapping() {
                for text in annotations.values().filter_map(|v| v.as_str()) {
                    for part in text.split("$labels.").skip(1) {
                        let label: String = part
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect();
                        templated.insert(label);
                    }
                }
            }
            queries.push((
                Query {
                    place: format!("alert {name}"),
                    expr: rule["expr"].as_str().expect("an expr").to_owned(),
                },
                templated,
            ));
        }
    }
    queries
}

/// Every panel, those inside collapsed rows too.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut all = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        all.push(panel);
        all.extend(panel["panels"].as_array().into_iter().flatten());
    }
    all
}

/// Checks that `names` are rendered: each metric, and each label on one of
/// the metrics (or added by the scrape).
fn check_rendered(place: &str, names: &Names, setup: &str, rendered: &Rendered) -> Vec<String> {
    let mut missing = Vec::new();
    let mut labels_of_metrics = BTreeSet::new();
    for metric in &names.metrics {
        match rendered.get(metric) {
            Some(labels) => labels_of_metrics.extend(labels.iter().cloned()),
            None => missing.push(format!(
                "{place}: metric {metric} is not rendered ({setup})"
            )),
        }
    }
    for label in &names.labels {
        if !labels_of_metrics.contains(label) && !TARGET_LABELS.contains(&label.as_str()) {
            missing.push(format!(
                "{place}: label {label} is on none of {:?} ({setup})",
                names.metrics
            ));
        }
    }
    missing
}

#[tokio::test(start_paused = true)]
async fn every_metric_and_label_the_ops_files_name_is_rendered_and_every_metric_has_a_panel() {
    let Exported { scrapes, described } = export().await;
    let dashboard = dashboard();
    let rules = alert_rules();

    // The exporters rendered what the crates describe, under the families
    // the crates document: the check below is not against an empty scrape.
    for crate_prefix in [
        "tower_retry_",
        "tower_hedge_",
        "tower_breaker_",
        "tower_poison_",
        "tower_idempotency_",
    ] {
        assert!(
            described.keys().any(|name| name.starts_with(crate_prefix)),
            "nothing described under {crate_prefix}: {described:?}"
        );
    }
    for (setup, rendered) in &scrapes {
        for (name, kind) in &described {
            let series = match *kind {
                "histogram" => vec![format!("{name}_sum"), format!("{name}_count")],
                _ => vec![name.clone()],
            };
            for series in series {
                assert!(
                    rendered.contains_key(&series),
                    "{kind} {name} was described but {series} not rendered ({setup}): \
                     drive_every_layer misses it\n{rendered:?}"
                );
            }
        }
    }

    let mut missing = Vec::new();
    let mut on_dashboard = BTreeSet::new();
    for query in dashboard_queries(&dashboard) {
        let names = names_in(&query.expr);
        assert!(
            !names.metrics.is_empty(),
            "{}: no metric in {:?}",
            query.place,
            query.expr
        );
        on_dashboard.extend(names.metrics.iter().cloned());
        for (setup, rendered) in &scrapes {
            missing.extend(check_rendered(&query.place, &names, setup, rendered));
        }
    }
    for (query, templated) in rule_queries(&rules) {
        let names = names_in(&query.expr);
        assert!(!names.metrics.is_empty(), "{}: no metric", query.place);
        for (setup, rendered) in &scrapes {
            missing.extend(check_rendered(&query.place, &names, setup, rendered));
            let with_annotations = Names {
                metrics: names.metrics.clone(),
                labels: templated.clone(),
            };
            missing.extend(check_rendered(
                &format!("{} annotations", query.place),
                &with_annotations,
                setup,
                rendered,
            ));
        }
    }
    // The layer-name variables: `label_values(metric, label)` or
    // `label_values(label)`.
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
    {
        if variable["type"] != "query" {
            continue;
        }
        let name = variable["name"].as_str().unwrap_or("?");
        let query = variable["definition"].as_str().expect("a definition");
        let args = query
            .strip_prefix("label_values(")
            .and_then(|rest| rest.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable {name}: {query:?} is not label_values(…)"));
        let args: Vec<&str> = args.split(',').map(str::trim).collect();
        for (setup, rendered) in &scrapes {
            let found = match args[..] {
                [metric, label] => rendered.get(metric).is_some_and(|l| l.contains(label)),
                [label] => rendered
                    .iter()
                    .any(|(m, l)| m.starts_with("tower_") && l.contains(label)),
                _ => false,
            };
            if !found {
                missing.push(format!(
                    "variable {name}: {query} finds nothing rendered ({setup})"
                ));
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));

    // Every metric the crates describe has a panel.
    let without_panel: Vec<&String> = described
        .iter()
        .filter(|(name, kind)| {
            let series = match **kind {
                "histogram" => vec![
                    name.to_string(),
                    format!("{name}_sum"),
                    format!("{name}_count"),
                    format!("{name}_bucket"),
                ],
                _ => vec![name.to_string()],
            };
            !series.iter().any(|s| on_dashboard.contains(s))
        })
        .map(|(name, _)| name)
        .collect();
    assert!(
        without_panel.is_empty(),
        "described metrics without a panel: {without_panel:?}"
    );
}

#[test]
fn the_dashboard_is_importable_and_every_panel_has_a_query() {
    let dashboard = dashboard();
    assert!(
        dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
        "schemaVersion"
    );
    assert!(dashboard["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(dashboard["uid"].as_str().is_some_and(|t| !t.is_empty()));

    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("templating");
    let datasource = variables
        .iter()
        .find(|v| v["type"] == "datasource")
        .expect("a data-source variable");
    assert_eq!(datasource["query"], "prometheus");
    let source = format!("${{{}}}", datasource["name"].as_str().unwrap());
    for variable in variables.iter().filter(|v| v["type"] == "query") {
        assert_eq!(variable["datasource"]["uid"], source.as_str(), "{variable}");
    }
    for layer_label in ["retry", "hedge", "breaker", "label", "idempotency"] {
        assert!(
            variables.iter().any(|v| v["definition"]
                .as_str()
                .is_some_and(|q| q.trim_end_matches(')').ends_with(layer_label))),
            "no variable over the layer label {layer_label}"
        );
    }

    let mut ids = BTreeSet::new();
    let mut queries = 0;
    for panel in panels(&dashboard) {
        let title = panel["title"].as_str().expect("a panel's title");
        assert!(
            ids.insert(panel["id"].as_u64().expect("an id")),
            "{title}: id reused"
        );
        for key in ["x", "y", "w", "h"] {
            assert!(panel["gridPos"][key].is_u64(), "{title}: gridPos.{key}");
        }
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], source.as_str(), "{title}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title} has no query");
        for target in targets {
            let expr = target["expr"].as_str().unwrap_or_default();
            assert!(!expr.trim().is_empty(), "{title} has an empty query");
            assert_eq!(target["datasource"]["uid"], source.as_str(), "{title}");
            queries += 1;
        }
        assert!(
            panel["description"].as_str().is_some_and(|d| !d.is_empty()),
            "{title} has no description"
        );
    }
    assert!(queries >= 15, "{queries} queries");
}

#[test]
fn every_alert_has_a_runbook_and_a_severity() {
    let rules = alert_rules();
    let mut alerts = BTreeSet::new();
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let Some(name) = rule["alert"].as_str() else {
                continue;
            };
            alerts.insert(name.to_owned());
            let runbook = rule["annotations"]["runbook"].as_str().unwrap_or_default();
            for part in ["What it means", "What to check", "What to do"] {
                assert!(runbook.contains(part), "{name}'s runbook lacks {part:?}");
            }
            assert!(rule["annotations"]["summary"].is_string(), "{name}");
            assert!(rule["labels"]["severity"].is_string(), "{name}");
        }
    }
    assert_eq!(
        alerts,
        BTreeSet::from(
            [
                "CircuitBreakerOpen",
                "DeadLetterQueueGrowing",
                "DeadLetterStoreFull",
                "RetryBudgetExhausted"
            ]
            .map(String::from)
        )
    );
}

// ===== promtool

/// Runs `promtool` with `args` in `ops/`; `None` when it is not installed
/// and not required.
fn promtool(args: &[&str]) -> Option<std::process::Output> {
    let required = std::env::var("TOWER_OPS_REQUIRE_PROMTOOL").is_ok_and(|v| v == "1");
    match Command::new("promtool")
        .args(args)
        .current_dir(ops_dir())
        .output()
    {
        Ok(output) => Some(output),
        Err(error) if error.kind() == io::ErrorKind::NotFound && !required => {
            println!(
                "skipped: promtool is not on PATH (install Debian's `prometheus` package; \
                 TOWER_OPS_REQUIRE_PROMTOOL=1 makes this a failure)"
            );
            None
        }
        Err(error) if required => {
            panic!("TOWER_OPS_REQUIRE_PROMTOOL=1 but promtool {args:?} could not run: {error}")
        }
        Err(error) => panic!("promtool {args:?}: {error}"),
    }
}

fn assert_success(args: &[&str], output: &std::process::Output) {
    assert!(
        output.status.success(),
        "promtool {args:?} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn promtool_checks_the_rules_and_runs_their_unit_tests() {
    for args in [
        &["check", "rules", "alerts.yml"][..],
        &["test", "rules", "alerts.test.yml"][..],
    ] {
        let Some(output) = promtool(args) else {
            return;
        };
        assert_success(args, &output);
    }
}

#[test]
fn promtool_parses_every_dashboard_expression() {
    // Each expression as a recording rule, Grafana's variables replaced by
    // what they stand for.
    let rules: Vec<Value> = dashboard_queries(&dashboard())
        .iter()
        .enumerate()
        .map(|(n, query)| {
            let mut expr = query.expr.replace("$__rate_interval", "5m");
            for variable in ["$retry", "$hedge", "$breaker", "$dlq", "$idempotency"] {
                expr = expr.replace(variable, ".*");
            }
            assert!(!expr.contains('$'), "{}: {expr}", query.place);
            serde_json::json!({ "record": format!("dashboard:query{n}"), "expr": expr })
        })
        .collect();
    let file = tempfile::Builder::new().suffix(".yml").tempfile().unwrap();
    // JSON is YAML.
    serde_json::to_writer(
        &file,
        &serde_json::json!({ "groups": [{ "name": "dashboard", "rules": rules }] }),
    )
    .unwrap();
    let path = file.path().to_str().unwrap();
    let args = ["check", "rules", path];
    let Some(output) = promtool(&args) else {
        return;
    };
    assert_success(&args, &output);
}
