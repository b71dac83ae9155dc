//! The operator CLI, run as a real binary against a store the layer filled,
//! replaying to a real HTTP server on 127.0.0.1.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_classify::BoxError;
use tower_poison::store::{DeadLetterStore, ListQuery, RedbStore};
use tower_poison::{DeadLetterEntry, DeadLetterLayer, ReplayBody};

const BIN: &str = env!("CARGO_BIN_EXE_tower-poison");

/// Fills a store through the layer: three calls fail with 503, 404 and 429.
async fn populate(path: &Path) {
    let store = RedbStore::builder().open(path).unwrap();
    let mut service = DeadLetterLayer::new(store)
        .label("orders")
        .layer(service_fn(
            |req: Request<ReplayBody<Full<Bytes>>>| async move {
                let status = match req.uri().path() {
                    "/orders" => 503,
                    "/orders/missing" => 404,
                    _ => 429,
                };
                Ok::<_, BoxError>(
                    Response::builder()
                        .status(status)
                        .body(Bytes::new())
                        .unwrap(),
                )
            },
        ));
    for (method, path, body) in [
        ("POST", "/orders", r#"{"sku":1}"#),
        ("PUT", "/orders/missing", r#"{"sku":2}"#),
        ("POST", "/orders/slow", r#"{"sku":3}"#),
    ] {
        let req = Request::builder()
            .method(method)
            .uri(format!("http://orders.internal{path}"))
            .header("authorization", "Bearer secret-token")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap();
        service.ready().await.unwrap().call(req).await.unwrap();
    }
    // Dropping the service closes the store, so the CLI can open it.
}

/// `millis` since the Unix epoch in RFC 3339, built from `httpdate`'s
/// formatting (an independent implementation of the calendar).
fn httpdate_to_rfc3339(millis: u64) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let http = httpdate::fmt_http_date(
        std::time::UNIX_EPOCH + Duration::from_millis(millis / 1000 * 1000),
    );
    let parts: Vec<&str> = http.split(' ').collect();
    let month = MONTHS.iter().position(|m| *m == parts[2]).unwrap() + 1;
    format!(
        "{}-{month:02}-{}T{}.{:03}Z",
        parts[3],
        parts[1],
        parts[4],
        millis % 1000
    )
}

async fn cli(store: &Path, args: &[&str]) -> Output {
    let mut command = std::process::Command::new(BIN);
    command.arg("--store").arg(store).args(args);
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn json(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

async fn entries(store: &Path) -> Vec<DeadLetterEntry> {
    let listed = json(&cli(store, &["list", "--json"]).await);
    serde_json::from_value(listed["entries"].clone()).unwrap()
}

/// Requests the replay target received: (method, path, authorization, body).
type Seen = Arc<Mutex<Vec<(String, String, Option<String>, Bytes)>>>;

/// A server that answers 200, except 500 for paths ending in `/slow`.
async fn server() -> (String, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen: Seen = Arc::default();
    let record = seen.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let record = record.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let record = record.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body.collect().await.unwrap().to_bytes();
                        let auth = parts
                            .headers
                            .get("authorization")
                            .map(|v| v.to_str().unwrap().to_owned());
                        let path = parts.uri.path().to_owned();
                        let status = if path.ends_with("/slow") {
                            StatusCode::INTERNAL_SERVER_ERROR
                        } else {
                            StatusCode::OK
                        };
                        record
                            .lock()
                            .unwrap()
                            .push((parts.method.to_string(), path, auth, body));
                        Ok::<_, Infallible>(
                            Response::builder()
                                .status(status)
                                .body(Full::new(Bytes::new()))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (url, seen)
}

fn store_path() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dlq.redb");
    (dir, path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_show_and_stats_read_what_the_layer_stored() {
    let (_dir, store) = store_path();
    populate(&store).await;

    // list: a table for people, JSON for scripts.
    let table = cli(&store, &["list"]).await;
    assert!(table.status.success());
    let text = stdout(&table);
    let header = text.lines().next().unwrap();
    assert!(header.starts_with("ID") && header.contains("KIND") && header.contains("ERROR"));
    assert!(
        text.contains("server_error") && text.contains("rejected") && text.contains("rate_limited")
    );
    assert!(text.contains("HTTP 503 Service Unavailable"));
    assert!(text.contains("3 entries"));

    let all = entries(&store).await;
    assert_eq!(all.len(), 3);
    let rejected = json(&cli(&store, &["list", "--json", "--kind", "rejected"]).await);
    assert_eq!(rejected["entries"].as_array().unwrap().len(), 1);
    assert_eq!(
        rejected["entries"][0]["uri"],
        "http://orders.internal/orders/missing"
    );
    let paged = json(&cli(&store, &["list", "--json", "--limit", "2"]).await);
    assert_eq!(paged["entries"].as_array().unwrap().len(), 2);
    let next = paged["next"].as_str().unwrap();
    let rest = json(&cli(&store, &["list", "--json", "--after", next]).await);
    assert_eq!(rest["entries"].as_array().unwrap().len(), 1);

    // show: every field, secrets redacted.
    let id = all[0].id.to_string();
    let shown = cli(&store, &["show", &id]).await;
    assert!(shown.status.success());
    let text = stdout(&shown);
    assert!(text.contains(&id));
    assert!(text.contains("authorization: [redacted]"));
    assert!(!text.contains("secret-token"));
    assert!(text.contains(r#"{"sku":1}"#));
    let shown_json = json(&cli(&store, &["show", &id, "--json"]).await);
    let shown: DeadLetterEntry = serde_json::from_value(shown_json.clone()).unwrap();
    assert_eq!(shown, all[0]);
    // The epoch-millisecond fields stay, with RFC 3339 twins for people and jq.
    let millis = shown_json["first_failed_at"].as_u64().unwrap();
    let rfc3339 = shown_json["first_failed_at_rfc3339"].as_str().unwrap();
    assert_eq!(rfc3339, httpdate_to_rfc3339(millis), "{shown_json}");
    assert!(shown_json["last_failed_at_rfc3339"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
    let listed = json(&cli(&store, &["list", "--json"]).await);
    assert_eq!(listed["entries"][0]["first_failed_at_rfc3339"], rfc3339);

    // stats.
    let stats = json(&cli(&store, &["stats", "--json"]).await);
    assert_eq!(stats["depth"], 3);
    assert_eq!(stats["by_kind"]["server_error"], 1);
    assert_eq!(stats["by_kind"]["rejected"], 1);
    assert_eq!(stats["by_kind"]["rate_limited"], 1);
    assert_eq!(stats["by_label"]["orders"], 3);
    assert!(stats["oldest_age_seconds"].as_u64().unwrap() < 60);
    assert!(stats["oldest_failed_at_rfc3339"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
    let text = stdout(&cli(&store, &["stats"]).await);
    assert!(text.contains("depth") && text.contains("oldest age"));

    // Errors are reported, with a non-zero status.
    let missing = cli(&store, &["show", "0000000000000000000000000000abcd"]).await;
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no entry"));
    let bad_id = cli(&store, &["show", "nope"]).await;
    assert_eq!(bad_id.status.code(), Some(2));
    let no_store = cli(&store.with_extension("missing"), &["stats"]).await;
    assert_eq!(no_store.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&no_store.stderr).contains("does not exist"));
}

/// The digits every one of `ids` starts with.
fn common_prefix(ids: &[String]) -> String {
    let first = &ids[0];
    let len = (0..first.len())
        .take_while(|&i| ids.iter().all(|id| id.as_bytes()[i] == first.as_bytes()[i]))
        .count();
    first[..len].to_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_take_a_unique_id_prefix_and_refuse_an_ambiguous_one() {
    let (_dir, store) = store_path();
    populate(&store).await;
    let ids: Vec<String> = entries(&store)
        .await
        .iter()
        .map(|e| e.id.to_string())
        .collect();
    let target = &ids[0];
    // Enough digits to tell the entry from the others (the low digits are
    // random), in capitals as an operator may paste them.
    let unique_len = (1..=32)
        .find(|&len| ids[1..].iter().all(|other| other[..len] != target[..len]))
        .unwrap();
    let short = target[..unique_len].to_uppercase();

    let shown = cli(&store, &["show", &short]).await;
    assert!(shown.status.success(), "{}", stderr(&shown));
    assert!(stdout(&shown).contains(target.as_str()));
    let shown = json(&cli(&store, &["show", &short, "--json"]).await);
    assert_eq!(shown["id"], target.as_str());

    // A prefix every entry shares is refused, naming how many match and
    // which.
    let shared = common_prefix(&ids);
    if !shared.is_empty() {
        let ambiguous = cli(&store, &["show", &shared]).await;
        assert_eq!(ambiguous.status.code(), Some(1));
        let message = stderr(&ambiguous);
        assert!(
            message.contains(&format!("id prefix {shared} is ambiguous: 3 entries match")),
            "{message}"
        );
        assert!(
            ids.iter().all(|id| message.contains(id.as_str())),
            "{message}"
        );
        let replayed = cli(&store, &["replay", &shared, "--to", "http://127.0.0.1:9"]).await;
        assert_eq!(replayed.status.code(), Some(1));
        assert!(stderr(&replayed).contains("is ambiguous"));
    }

    // No match: not found.
    let flipped = if target.starts_with('f') { "e" } else { "f" };
    let absent = format!("{flipped}{}", &target[1..8]);
    let missing = cli(&store, &["show", &absent]).await;
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).contains(&format!("no entry id starts with {absent}")),
        "{}",
        stderr(&missing)
    );
    // Not hex: a usage error.
    assert_eq!(cli(&store, &["show", "xyz"]).await.status.code(), Some(2));

    // remove takes a prefix too, and the entry is gone.
    let removed = cli(&store, &["remove", &short]).await;
    assert!(removed.status.success(), "{}", stderr(&removed));
    assert!(stdout(&removed).contains(&format!("removed {target}")));
    let left: Vec<String> = entries(&store)
        .await
        .iter()
        .map(|e| e.id.to_string())
        .collect();
    assert_eq!(left.len(), 2);
    assert!(!left.contains(target));
    let again = cli(&store, &["remove", target]).await;
    assert_eq!(again.status.code(), Some(1));
    assert!(stderr(&again).contains("no entry"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_to_a_real_server_removes_delivered_and_keeps_failed_entries() {
    let (_dir, store) = store_path();
    populate(&store).await;
    let (url, seen) = server().await;
    let all = entries(&store).await;
    let first = all
        .iter()
        .find(|e| e.uri.as_deref() == Some("http://orders.internal/orders"))
        .unwrap();

    // One entry, with fresh credentials for the redacted header.
    let one = cli(
        &store,
        &[
            "replay",
            &first.id.to_string(),
            "--to",
            &url,
            "--header",
            "authorization: Bearer fresh",
        ],
    )
    .await;
    assert!(
        one.status.success(),
        "{}",
        String::from_utf8_lossy(&one.stderr)
    );
    assert!(stdout(&one).contains("delivered"));
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].0, "POST");
        assert_eq!(seen[0].1, "/orders");
        assert_eq!(seen[0].2.as_deref(), Some("Bearer fresh"));
        assert_eq!(seen[0].3, r#"{"sku":1}"#);
    }
    assert_eq!(entries(&store).await.len(), 2);

    // The rest, rate-limited: /orders/slow still fails and is kept.
    let started = Instant::now();
    let rest = cli(
        &store,
        &["replay", "--all", "--to", &url, "--rate", "10", "--json"],
    )
    .await;
    let elapsed = started.elapsed();
    assert_eq!(rest.status.code(), Some(3), "a failed replay is reported");
    let report: Value = serde_json::from_slice(&rest.stdout).unwrap();
    assert_eq!(report["delivered"], 1);
    assert_eq!(report["failed"], 1);
    // Two requests at 10/s: the second waits for the next 100 ms slot.
    assert!(elapsed >= Duration::from_millis(100), "{elapsed:?}");
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 3);
        assert!(
            seen[1..].iter().all(|(_, _, auth, _)| auth.is_none()),
            "redacted header sent"
        );
    }
    let left = entries(&store).await;
    assert_eq!(left.len(), 1);
    assert_eq!(
        left[0].uri.as_deref(),
        Some("http://orders.internal/orders/slow")
    );
    assert_eq!(left[0].attempts, 2);
    assert_eq!(left[0].kind.as_str(), "rate_limited", "the original kind");
    assert!(left[0].last_failed_at > left[0].first_failed_at);
    // The replay's own answer is in the entry's history; the original
    // failure is kept as it was.
    let original = all.iter().find(|e| e.id == left[0].id).unwrap();
    assert_eq!(left[0].error, original.error);
    let record = left[0].replays.last().expect("the replay is recorded");
    assert_eq!(record.status, Some(500));
    assert_eq!(record.attempt, 2);
    assert_eq!(record.kind.as_str(), "server_error");
    assert_eq!(record.error, ["HTTP 500 Internal Server Error"]);
    let id = left[0].id.to_string();
    let shown = stdout(&cli(&store, &["show", &id]).await);
    assert!(shown.contains("replays         1 failed"), "{shown}");
    assert!(
        shown.contains("attempt 2  server_error  status 500  HTTP 500 Internal Server Error"),
        "{shown}"
    );
    let shown = json(&cli(&store, &["show", &id, "--json"]).await);
    assert_eq!(shown["replays"][0]["status"], 500);
    let replay_millis = shown["replays"][0]["at"].as_u64().unwrap();
    assert_eq!(
        shown["replays"][0]["at_rfc3339"],
        httpdate_to_rfc3339(replay_millis)
    );
    assert_eq!(shown["replays"][0]["attempt"], 2);
    assert_eq!(shown["failed_replays"], 1);

    // A lease shorter than a request may take is refused before anything
    // is sent: the entry could be sent again while still in flight.
    let short = cli(
        &store,
        &[
            "replay",
            "--all",
            "--to",
            &url,
            "--lease",
            "1s",
            "--timeout",
            "30s",
        ],
    )
    .await;
    assert_eq!(short.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&short.stderr).contains("--lease 1s must be at least --timeout"),
        "{}",
        String::from_utf8_lossy(&short.stderr)
    );
    assert_eq!(seen.lock().unwrap().len(), 3, "a request was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_is_a_dry_run_without_yes_and_filters_by_age() {
    let (_dir, store) = store_path();
    populate(&store).await;
    // One more entry that first failed ten days ago.
    let old_id = {
        let opened = RedbStore::builder().open(&store).unwrap();
        let mut old = entries_of(&opened).await.remove(0);
        // A new id, made now, as the layer makes one.
        old.id = tower_poison::DeadLetterEntry::new(
            "",
            tower_classify::FailureKind::ServerError,
            Vec::new(),
            std::time::SystemTime::now(),
        )
        .id;
        old.first_failed_at -= Duration::from_secs(10 * 86_400);
        old.uri = Some("http://orders.internal/orders/old".into());
        opened.put(old.clone()).await.unwrap();
        old.id
    };

    let dry = cli(&store, &["purge", "--older-than", "7d"]).await;
    assert!(dry.status.success());
    assert!(
        stdout(&dry).contains("would purge 1 entries"),
        "{}",
        stdout(&dry)
    );
    assert_eq!(entries(&store).await.len(), 4);

    let aged = json(&cli(&store, &["purge", "--older-than", "7d", "--yes", "--json"]).await);
    assert_eq!(aged["purged"], 1);
    let left = entries(&store).await;
    assert_eq!(left.len(), 3);
    assert!(left.iter().all(|e| e.id != old_id));

    let bad = cli(&store, &["purge", "--older-than", "7", "--yes"]).await;
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unit"));

    let dry = cli(&store, &["purge"]).await;
    assert!(stdout(&dry).contains("would purge 3 entries"));
    let purged = cli(&store, &["purge", "--yes"]).await;
    assert!(stdout(&purged).contains("purged 3 entries"));
    assert_eq!(json(&cli(&store, &["stats", "--json"]).await)["depth"], 0);
}

async fn entries_of(store: &RedbStore) -> Vec<DeadLetterEntry> {
    store.list(ListQuery::default()).await.unwrap().entries
}

// tower-poison's Redis test helpers (the shared server, skipping without
// one, cleaning up a queue), one copy for both crates.
#[cfg(feature = "redis")]
#[path = "../../tower-poison/tests/support/mod.rs"]
mod support;

/// Two tower stacks ("two nodes") sharing one Redis: the dead letters both
/// nodes wrote are listed together by the CLI and replayed from it.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_share_one_redis_for_replays_and_dead_letters() {
    if let Some(url) = support::redis_at(support::Target::Single).await {
        two_nodes_share_one_redis(url).await;
    }
}

/// The same on a Redis Cluster: the CLI takes the nodes' URLs as its store.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_share_one_redis_cluster_for_replays_and_dead_letters() {
    if let Some(url) = support::redis_at(support::Target::Cluster).await {
        two_nodes_share_one_redis(url).await;
    }
}

#[cfg(feature = "redis")]
async fn two_nodes_share_one_redis(url: String) {
    use std::collections::BTreeSet;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::util::BoxCloneService;
    use tower_poison::store::RedisDeadLetterStore;

    type Node = BoxCloneService<
        Request<Full<Bytes>>,
        Response<tower_poison::SettleBody<Full<Bytes>, tower_poison::OpenCall>>,
        BoxError,
    >;

    let stream = support::unique("fleet-dlq");
    let _cleanup = support::Cleanup::queue(&url, &stream);

    // Each node has its own connection; only Redis is shared.
    let node = |name: &'static str, calls: Arc<AtomicUsize>| {
        let (url, stream) = (url.clone(), stream.clone());
        async move {
            let dead_letters = RedisDeadLetterStore::builder()
                .connect(&url, stream)
                .await
                .unwrap();
            let handler = service_fn(move |req: Request<ReplayBody<Full<Bytes>>>| {
                let calls = calls.clone();
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    let (status, body) = match req.uri().path() {
                        "/orders" => (StatusCode::CREATED, format!("order created by {name}")),
                        _ => (
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "database down".to_owned(),
                        ),
                    };
                    Ok::<_, BoxError>(
                        Response::builder()
                            .status(status)
                            .body(Full::new(Bytes::from(body)))
                            .unwrap(),
                    )
                }
            });
            let stack = DeadLetterLayer::new(dead_letters)
                .label(name)
                .layer(handler);
            Node::new(stack)
        }
    };
    let (calls_1, calls_2) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let node_1 = node("node-1", calls_1.clone()).await;
    let node_2 = node("node-2", calls_2.clone()).await;
    let request = |path: &str, key: &str| {
        Request::post(format!("http://orders.internal{path}"))
            .header("idempotency-key", key)
            .header("authorization", "Bearer secret")
            .body(Full::new(Bytes::from_static(br#"{"sku":7}"#)))
            .unwrap()
    };

    // Each node fails one call: both go to the one stream.
    for (node, key) in [(&node_1, "broken-1"), (&node_2, "broken-2")] {
        let failed = node.clone().oneshot(request("/broken", key)).await.unwrap();
        assert_eq!(failed.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    let run = |args: Vec<String>| {
        let mut command = std::process::Command::new(BIN);
        command.args(args);
        tokio::task::spawn_blocking(move || command.output().unwrap())
    };
    let base = vec![
        "--store".to_owned(),
        url.clone(),
        "--stream".to_owned(),
        stream.clone(),
    ];
    let listed = run([base.clone(), vec!["list".into(), "--json".into()]].concat())
        .await
        .unwrap();
    let listed: Vec<DeadLetterEntry> =
        serde_json::from_value(json(&listed)["entries"].clone()).unwrap();
    let labels: BTreeSet<&str> = listed.iter().map(|e| e.label.as_str()).collect();
    assert_eq!(labels, BTreeSet::from(["node-1", "node-2"]));
    assert_eq!(listed.len(), 2);
    assert!(listed
        .iter()
        .all(|e| e.uri.as_deref() == Some("http://orders.internal/broken")));
    assert!(listed.iter().all(|e| e
        .headers
        .iter()
        .any(|h| h.name == "authorization" && h.value == "[redacted]")));
    let stats = run([base.clone(), vec!["stats".into(), "--json".into()]].concat())
        .await
        .unwrap();
    assert_eq!(json(&stats)["depth"], 2);
    let table = run([base.clone(), vec!["list".into()]].concat())
        .await
        .unwrap();
    let table = stdout(&table);
    assert!(
        table.contains("node-1") && table.contains("node-2"),
        "{table}"
    );

    // Once the database is back, the operator replays the shared queue.
    let (target, seen) = server().await;
    let replayed = run([
        base.clone(),
        vec!["replay".into(), "--all".into(), "--to".into(), target],
        vec!["--rate".into(), "100".into(), "--json".into()],
    ]
    .concat())
    .await
    .unwrap();
    let replayed = json(&replayed);
    assert_eq!(replayed["delivered"], 2, "{replayed}");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|(method, path, _, body)| method == "POST"
        && path == "/broken"
        && body == &br#"{"sku":7}"#[..]));
    let stats = run([base, vec!["stats".into(), "--json".into()]].concat())
        .await
        .unwrap();
    assert_eq!(json(&stats)["depth"], 0, "delivered entries are removed");
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn the_cli_names_an_unreachable_redis() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(BIN)
            .args(["--store", &format!("redis://127.0.0.1:{port}"), "stats"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "cannot connect to redis at redis://127.0.0.1:{port}"
        )),
        "{stderr}"
    );
}
