//! The guard's rules on the Redis store (real, short TTLs), two nodes on one
//! Redis, the key layout (namespace, hash tag, TTL, size cap), and Redis
//! going away under the guard.
//!
//! The shared server is named by `TOWER_IDEMPOTENCY_REDIS_URL` (default
//! `redis://127.0.0.1:6379`); the outage test starts a private
//! `redis-server`. Without them a test prints why it is skipped and passes,
//! unless `TOWER_IDEMPOTENCY_REQUIRE_REDIS=1` (as in CI) makes that a failure.
//!
//! The suites run twice: `single::` on the shared server, `cluster::` on the
//! Redis Cluster whose nodes `TOWER_REDIS_CLUSTER_URLS` lists
//! (`redis://127.0.0.1:7000,redis://127.0.0.1:7001,…`), where a script whose
//! keys span two slots is refused (`CROSSSLOT`); without it they are skipped
//! the same way, unless `TOWER_REDIS_REQUIRE_CLUSTER=1` (as in CI).

mod rules;

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use http::StatusCode;
use tower_idempotency::store::{
    Claim, Completion, IdempotencyStore, NotKept, RedisConnectOptions, RedisConnection,
    RedisIdempotencyStore,
};
use tower_idempotency::IdempotencyGuardLayer;

use rules::*;

const URL_VAR: &str = "TOWER_IDEMPOTENCY_REDIS_URL";
const REQUIRE_VAR: &str = "TOWER_IDEMPOTENCY_REQUIRE_REDIS";
const CLUSTER_VAR: &str = "TOWER_REDIS_CLUSTER_URLS";
const REQUIRE_CLUSTER_VAR: &str = "TOWER_REDIS_REQUIRE_CLUSTER";

/// Where a suite runs: the shared server, or the Redis Cluster named by
/// `TOWER_REDIS_CLUSTER_URLS` (its nodes' URLs, comma-separated), where a
/// script whose keys span two slots is refused.
#[derive(Debug, Clone, Copy)]
enum Target {
    Single,
    Cluster,
}

impl Target {
    fn url(self) -> Option<String> {
        match self {
            Target::Single => {
                Some(std::env::var(URL_VAR).unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned()))
            }
            Target::Cluster => std::env::var(CLUSTER_VAR)
                .ok()
                .filter(|urls| !urls.is_empty()),
        }
    }

    /// Skips the calling test (prints why), or fails it when Redis (or the
    /// cluster) is required.
    fn skip(self, reason: &str) {
        let (require, hint) = match self {
            Target::Single => (REQUIRE_VAR, format!("start redis-server, or set {URL_VAR}")),
            Target::Cluster => (
                REQUIRE_CLUSTER_VAR,
                format!(
                    "start a Redis Cluster and list its nodes in {CLUSTER_VAR}, as .ci/run does"
                ),
            ),
        };
        if std::env::var(require).is_ok_and(|v| v == "1") {
            panic!("{reason}; {require}=1 makes this a failure");
        }
        // Straight to the stream: the harness captures `eprintln!` of passing
        // tests, and a skip must be seen.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {reason} ({hint}; {require}=1 makes this a failure)"
        );
    }
}

fn skip(reason: &str) {
    Target::Single.skip(reason);
}

/// A store on `target` with a prefix no other test (or run) uses.
async fn redis(target: Target, name: &str) -> Option<RedisIdempotencyStore> {
    let Some(url) = target.url() else {
        target.skip(&format!("{CLUSTER_VAR} is not set"));
        return None;
    };
    let prefix = format!(
        "tower-idempotency-test:{name}:{}:{:016x}:",
        std::process::id(),
        fastrand::u64(..)
    );
    let connect = RedisIdempotencyStore::builder()
        .options(RedisConnectOptions::new().connection_timeout(Duration::from_secs(2)))
        .connect(&url, prefix);
    match tokio::time::timeout(Duration::from_secs(3), connect).await {
        Ok(Ok(store)) => Some(store),
        _ => {
            target.skip(&format!("no Redis answers at {url}"));
            None
        }
    }
}

/// The prefix `store` was connected with: its Redis keys are
/// `PREFIX{16 hex digits}KEY`.
fn prefix(store: &RedisIdempotencyStore) -> String {
    let key = store.redis_key("");
    key[..key.len() - 18].to_owned()
}

/// `target`'s URL, once [`redis`] connected to it.
fn url(target: Target) -> String {
    target.url().expect("the target is configured")
}

async fn real_wait(duration: Duration) {
    tokio::time::sleep(duration).await;
}

/// A connection of the stores' own kind, for looking at keys directly.
async fn raw_connection(target: Target) -> RedisConnection {
    RedisConnectOptions::new()
        .connect(&url(target))
        .await
        .unwrap()
}

/// Each suite twice: on the shared server (`single::`) and on the cluster
/// (`cluster::`).
macro_rules! on_redis {
    ($($name:ident => |$target:ident, $store:ident| $body:expr;)*) => {
        mod single {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    let $target = Target::Single;
                    let Some($store) = redis($target, stringify!($name)).await else {
                        return;
                    };
                    $body.await;
                }
            )*
        }
        mod cluster {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    let $target = Target::Cluster;
                    let Some($store) = redis($target, stringify!($name)).await else {
                        return;
                    };
                    $body.await;
                }
            )*
        }
    };
}

on_redis! {
    redis_replays_the_first_response => |_target, store| replays_the_first_response(store);
    redis_conflicts_while_in_flight => |_target, store| conflicts_while_in_flight(store);
    redis_refuses_a_reused_key_for_another_request => |_target, store| refuses_a_reused_key_for_another_request(store);
    redis_the_body_counts_as_far_as_the_handler_read_it => |_target, store| the_body_counts_as_far_as_the_handler_read_it(store);
    redis_a_streamed_response_is_recorded_when_it_ends => |_target, store| a_streamed_response_is_recorded_when_it_ends(store);
    redis_a_response_body_slower_than_the_in_flight_ttl_keeps_its_key => |_target, store| a_response_body_slower_than_the_in_flight_ttl_keeps_its_key(store, Duration::from_secs(1));
    redis_refuses_a_key_over_255_characters => |_target, store| refuses_a_key_over_255_characters(store);
    redis_transient_answers_and_errors_run_once => |_target, store| transient_answers_and_errors_run_once(store);
    redis_release_on_transient_is_an_opt_in => |_target, store| release_on_transient_is_an_opt_in(store);
    redis_shed_refusals_free_the_key => |_target, store| shed_refusals_free_the_key(store);
    redis_item_5_a_downstream_circuit_open_passed_on_after_the_side_effect_keeps_the_key => |_target, store| a_refusal_passed_on_after_acting_keeps_the_key(store, "/acted-then-circuit-open");
    redis_item_5_a_downstream_503_with_the_failure_extension_keeps_the_key => |_target, store| a_refusal_passed_on_after_acting_keeps_the_key(store, "/acted-then-503");
    redis_item_5_a_refusal_of_another_calls_request_keeps_the_key => |_target, store| a_refusal_passed_on_after_acting_keeps_the_key(store, "/acted-then-503-of-another-call");
    redis_trailers_are_replayed => |_target, store| trailers_are_replayed(store);
    redis_keys_expire_after_the_ttl => |_target, store| keys_expire_after_the_ttl(store, Duration::from_secs(2), real_wait);
    redis_in_flight_claims_lapse => |_target, store| in_flight_claims_lapse(store, Duration::from_secs(2), real_wait);
    redis_a_request_slower_than_the_in_flight_ttl_keeps_its_key => |_target, store| a_request_slower_than_the_in_flight_ttl_keeps_its_key(store, Duration::from_secs(1));
    redis_a_call_dropped_in_the_handler_runs_once => |_target, store| a_call_dropped_in_the_handler_runs_once(store);
    redis_a_call_dropped_in_the_response_body_runs_once => |_target, store| a_call_dropped_in_the_response_body_runs_once(store);
    redis_an_over_limit_response_runs_once => |_target, store| an_over_limit_response_runs_once(store);
    redis_scopes_keys_by_client => |_target, store| scopes_keys_by_client(store);
    redis_idempotent_methods_and_unkeyed_requests_pass_through => |_target, store| idempotent_methods_and_unkeyed_requests_pass_through(store);
    redis_a_duplicate_on_node_b_is_replayed_from_node_a => |target, store| a_duplicate_on_node_b_is_replayed_from_node_a(target, store);
    redis_keys_carry_their_namespace_hash_tag_and_ttl => |target, store| keys_carry_their_namespace_hash_tag_and_ttl(target, store);
    redis_a_record_over_the_size_cap_is_recorded_as_not_kept => |target, store| a_record_over_the_size_cap_is_recorded_as_not_kept(target, store);
    redis_a_corrupt_record_answers_503_without_running_the_handler => |target, store| a_corrupt_record_answers_503_without_running_the_handler(target, store);
}

/// Two connections (two nodes) with the same prefix race for one key.
async fn concurrent_repeats_run_once_across_two_nodes(target: Target) {
    let Some(node_1) = redis(target, "race").await else {
        return;
    };
    let node_2 = RedisIdempotencyStore::builder()
        .connect(&url(target), prefix(&node_1))
        .await
        .unwrap();
    concurrent_repeats_run_once(node_1, node_2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_concurrent_repeats_run_once_across_two_nodes() {
    concurrent_repeats_run_once_across_two_nodes(Target::Single).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_concurrent_repeats_run_once_across_two_nodes() {
    concurrent_repeats_run_once_across_two_nodes(Target::Cluster).await;
}

/// A duplicate that a load balancer sends to node B is replayed from the
/// response node A stored; B's handler is never called.
async fn a_duplicate_on_node_b_is_replayed_from_node_a(
    target: Target,
    node_a: RedisIdempotencyStore,
) {
    let node_b = RedisIdempotencyStore::builder()
        .connect(&url(target), prefix(&node_a))
        .await
        .unwrap();
    let (orders_a, orders_b) = (Orders::default(), Orders::default());
    let a = guarded(IdempotencyGuardLayer::new(node_a), &orders_a);
    let b = guarded(IdempotencyGuardLayer::new(node_b), &orders_b);
    let first = text(send(&a, post("/orders", "k-fleet", r#"{"sku":9}"#)).await).await;
    let repeat = send(&b, post("/orders", "k-fleet", r#"{"sku":9}"#)).await;
    assert!(replayed(&repeat));
    assert_eq!(repeat.headers()["set-cookie"], "session=order-1");
    assert_eq!(text(repeat).await, first);
    assert_eq!(
        (orders_a.calls("/orders"), orders_b.calls("/orders")),
        (1, 0)
    );
}

/// Keys are `PREFIX{hash}namespaced-key` (a hash of the idempotency key is
/// the cluster hash tag, so a `}` a client sends cannot cut it short), carry
/// their TTL in Redis itself (`PX`), and any configured TTL is cut to a
/// value Redis accepts.
async fn keys_carry_their_namespace_hash_tag_and_ttl(target: Target, store: RedisIdempotencyStore) {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store.clone()), &orders);
    call(&service, post("/orders", "k-pttl", "{}")).await;
    let key = store.redis_key("u:k-pttl");
    let tag = key
        .strip_prefix(&prefix(&store))
        .and_then(|rest| rest.strip_suffix("u:k-pttl"))
        .expect("PREFIX{tag}KEY");
    assert!(
        tag.len() == 18
            && tag.starts_with('{')
            && tag.ends_with('}')
            && tag[1..17].bytes().all(|b| b.is_ascii_hexdigit()),
        "{key}"
    );
    let braces = store.redis_key("u:a}b{c");
    let prefix_len = prefix(&store).len();
    assert_eq!(&braces[prefix_len + 17..], "}u:a}b{c");
    assert_ne!(braces[..prefix_len + 18], key[..prefix_len + 18]);
    let mut connection = raw_connection(target).await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut connection)
        .await
        .unwrap();
    let day = 24 * 3600 * 1000;
    assert!(
        pttl > day - 60_000 && pttl <= day,
        "default TTL 24 h, got {pttl} ms"
    );
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(&key)
        .query_async(&mut connection)
        .await
        .unwrap_or(-1);
    if slot >= 0 {
        let tag_slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&tag[1..17])
            .query_async(&mut connection)
            .await
            .unwrap();
        assert_eq!(slot, tag_slot, "the slot is the tag's");
    }

    // The longest TTLs are accepted (cut, never overflowing `PX`).
    let forever = guarded(
        IdempotencyGuardLayer::new(store.clone())
            .ttl(Duration::MAX)
            .in_flight_ttl(Duration::MAX),
        &orders,
    );
    let response = call(&forever, post("/orders", "k-forever", "{}")).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert!(replayed(
        &send(&forever, post("/orders", "k-forever", "{}")).await
    ));
}

/// A record over the store's size cap is not written; the key is completed
/// as "not kept: too large", so the repeat is refused, not run.
async fn a_record_over_the_size_cap_is_recorded_as_not_kept(
    target: Target,
    probe: RedisIdempotencyStore,
) {
    let store = RedisIdempotencyStore::builder()
        .max_record_bytes(1024)
        .connect(&url(target), prefix(&probe))
        .await
        .unwrap();
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store.clone()), &orders);
    let first = send(&service, post("/big", "k-cap", "{}")).await;
    assert_eq!(text(first).await.1.len(), 2048, "passed on whole");
    assert_not_kept(&service, post("/big", "k-cap", "{}"), "too_large").await;
    assert_eq!(orders.calls("/big"), 1);
    let Claim::Completed { completion, .. } = store
        .claim("u:k-cap", "whatever", Duration::from_secs(1))
        .await
        .unwrap()
    else {
        panic!("the key is completed");
    };
    assert_eq!(completion, Completion::NotKept(NotKept::TooLarge));
}

/// A record that is not the store's (garbage, or larger than anything it
/// writes) is a corrupt store: the guard answers 503 and runs nothing, and
/// never panics.
async fn a_corrupt_record_answers_503_without_running_the_handler(
    target: Target,
    store: RedisIdempotencyStore,
) {
    let mut connection = raw_connection(target).await;
    let huge = format!(
        r#"{{"state":"completed","fingerprint":"{}"}}"#,
        "f".repeat(5 << 20)
    );
    for (key, value) in [
        ("u:k-garbage", "not json at all".to_owned()),
        ("u:k-huge", huge),
    ] {
        let _: () = redis::cmd("SET")
            .arg(store.redis_key(key))
            .arg(value)
            .arg("PX")
            .arg(60_000)
            .query_async(&mut connection)
            .await
            .unwrap();
    }
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store), &orders);
    for key in ["k-garbage", "k-huge"] {
        let response = send(&service, post("/orders", key, "{}")).await;
        assert_eq!(
            rejection(response).await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "idempotency_store_unavailable".to_owned()
            ),
            "{key}"
        );
    }
    assert_eq!(orders.calls("/orders"), 0);
}

/// A private `redis-server` (no persistence), killed when dropped.
struct RedisProcess(Child);

impl Drop for RedisProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Redis dies under the guard: a keyed request is answered `503` with
/// `Retry-After` and the handler is not called; requests without a key are
/// served as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_answers_503_and_never_runs_the_handler() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let Ok(child) = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        skip("no redis-server binary on PATH (apt-get install redis-server)");
        return;
    };
    let mut server = RedisProcess(child);
    let url = format!("redis://127.0.0.1:{port}");
    let mut store = None;
    for _ in 0..100 {
        let connect = RedisIdempotencyStore::builder()
            .options(
                RedisConnectOptions::new()
                    .connection_timeout(Duration::from_millis(300))
                    .response_timeout(Duration::from_secs(1)),
            )
            .connect(&url, "orders:idem:");
        if let Ok(connected) = connect.await {
            store = Some(connected);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let store = store.expect("the private redis-server answers");
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store), &orders);
    let before = call(&service, post("/orders", "k-before", "{}")).await;
    assert_eq!(before.status(), StatusCode::CREATED);

    let _ = server.0.kill();
    let _ = server.0.wait();
    let refused = send(&service, post("/orders", "k-during", "{}")).await;
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(
        rejection(refused).await,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "idempotency_store_unavailable".to_owned()
        )
    );
    assert_eq!(orders.calls("/orders"), 1, "the handler was not called");

    let mut unkeyed = post("/orders", "unused", "{}");
    unkeyed.headers_mut().remove("idempotency-key");
    assert_eq!(send(&service, unkeyed).await.status(), StatusCode::CREATED);
}
