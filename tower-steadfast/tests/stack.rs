//! The stack the documented block builds, driven over an HTTP service with
//! a paused clock: its retries and their waits, the breaker opening and
//! cooling down, and what reaches the dead-letter store.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::time::Instant;
use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};
use tower_breaker::CircuitOpen;
use tower_classify::FailureKind;
use tower_poison::store::{DeadLetterStore, ListQuery, MemoryStore};
use tower_poison::{DeadLetterEntry, PoisonMessage, ReplayBody};
use tower_steadfast::{ResilienceConfig, ResilienceLayer};

type Body = ReplayBody<Full<Bytes>>;

fn seed() -> ResilienceConfig {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/seed.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    ResilienceConfig::from_yaml_str(&text).unwrap()
}

/// An upstream that answers the n-th request (0-based) with `status(n)`
/// and records when each request arrived.
#[derive(Clone)]
struct Upstream {
    arrivals: Arc<Mutex<Vec<Instant>>>,
}

impl Upstream {
    fn new() -> Self {
        Upstream {
            arrivals: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn service(
        &self,
        status: impl Fn(usize) -> StatusCode + Clone + Send + 'static,
    ) -> impl Service<Request<Body>, Response = Response<Full<Bytes>>, Error = BoxError, Future: Send>
           + Clone
           + Send
           + 'static {
        let arrivals = Arc::clone(&self.arrivals);
        service_fn(move |_request: Request<Body>| {
            let status = status.clone();
            let arrivals = Arc::clone(&arrivals);
            async move {
                let n = {
                    let mut arrivals = arrivals.lock().unwrap();
                    arrivals.push(Instant::now());
                    arrivals.len() - 1
                };
                let response = Response::builder()
                    .status(status(n))
                    .body(Full::new(Bytes::from_static(b"upstream")))
                    .unwrap();
                Ok::<_, BoxError>(response)
            }
        })
    }

    fn count(&self) -> usize {
        self.arrivals.lock().unwrap().len()
    }

    /// The waits between consecutive requests.
    fn gaps(&self) -> Vec<Duration> {
        let arrivals = self.arrivals.lock().unwrap();
        arrivals.windows(2).map(|w| w[1] - w[0]).collect()
    }
}

fn get() -> Request<Full<Bytes>> {
    Request::get("http://upstream.test/orders/7")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

async fn stored(store: &MemoryStore) -> Vec<DeadLetterEntry> {
    store
        .list(ListQuery {
            limit: 1000,
            ..ListQuery::default()
        })
        .await
        .unwrap()
        .entries
}

#[tokio::test(start_paused = true)]
async fn a_503_then_200_get_succeeds_after_one_retry_with_the_configured_backoff() {
    let store = MemoryStore::new(100);
    let upstream = Upstream::new();
    let stack = ServiceBuilder::new()
        .layer(seed().layer("orders", store.clone()))
        .service(upstream.service(|n| {
            if n == 0 {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::OK
            }
        }));

    let response = stack.oneshot(get()).await.unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(upstream.count(), 2, "one retry");
    // base_ms 200 with jitter: true waits 200 ms × [0.5, 1.5); tokio's timer
    // rounds a deadline up to its next millisecond, so 300 ms itself occurs.
    let gap = upstream.gaps()[0];
    assert!(
        gap >= Duration::from_millis(100) && gap <= Duration::from_millis(300),
        "waited {gap:?}"
    );
    assert!(
        stored(&store).await.is_empty(),
        "a fixed blip is not stored"
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_failing_after_every_retry_lands_in_the_store_once() {
    let store = MemoryStore::new(100);
    let upstream = Upstream::new();
    let stack = ServiceBuilder::new()
        .layer(seed().layer("orders", store.clone()))
        .service(upstream.service(|_| StatusCode::SERVICE_UNAVAILABLE));

    let response = stack.oneshot(get()).await.unwrap();

    // The last failing response is handed back as it is.
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(upstream.count(), 5, "max_attempts: 5 counts the first try");
    // Exponential from 200 ms, each wait jittered by [0.5, 1.5) (and rounded
    // up to the timer's millisecond).
    for (n, gap) in upstream.gaps().into_iter().enumerate() {
        let base = Duration::from_millis(200) * 2u32.pow(n as u32);
        assert!(
            gap >= base / 2 && gap <= base * 3 / 2,
            "wait {n}: {gap:?} for a base of {base:?}"
        );
    }
    let entries = stored(&store).await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].kind, FailureKind::ServerError);
    assert_eq!(entries[0].attempts, 5);
    assert_eq!(entries[0].method.as_deref(), Some("GET"));
    assert_eq!(
        entries[0].uri.as_deref(),
        Some("http://upstream.test/orders/7")
    );
}

#[tokio::test(start_paused = true)]
async fn five_failed_calls_open_the_breaker_until_the_cooldown_has_passed() {
    let store = MemoryStore::new(100);
    opens_until_the_cooldown(seed().layer("orders", store.clone()), store).await;
}

/// Down for the first 25 requests (five calls of five tries), then up.
fn down_for_five_calls(n: usize) -> StatusCode {
    if n < 25 {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

/// Without `cooldown_secs` the open period backs off from a quarter of a
/// second (SPEC 5b): the first trial call comes within 250 ms of the fifth
/// failure.
#[tokio::test(start_paused = true)]
async fn without_a_cooldown_the_first_trial_call_comes_within_a_quarter_second() {
    let store = MemoryStore::new(100);
    // Five tries a call, as `down_for_five_calls` counts them; the
    // `circuit_breaker` section is left out.
    let config = ResilienceConfig::from_yaml_str("retry: {max_attempts: 5}").unwrap();
    let layer = config.layer("orders", store);
    let upstream = Upstream::new();
    let mut stack = ServiceBuilder::new()
        .layer(layer)
        .service(upstream.service(down_for_five_calls));
    for _ in 0..5 {
        let response = stack.ready().await.unwrap().call(get()).await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    let refused = stack.ready().await.unwrap().call(get()).await.unwrap_err();
    let open = refused.downcast_ref::<CircuitOpen>().expect("open");
    let remaining = open.remaining().unwrap();
    assert!(
        (Duration::from_millis(200)..=Duration::from_millis(250)).contains(&remaining),
        "{remaining:?}"
    );
    tokio::time::advance(remaining).await;
    let response = stack.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "the trial call closes it"
    );
}

async fn opens_until_the_cooldown(layer: ResilienceLayer<MemoryStore>, store: MemoryStore) {
    let upstream = Upstream::new();
    let handle = layer.breaker_handle();
    let mut stack = ServiceBuilder::new()
        .layer(layer)
        .service(upstream.service(down_for_five_calls));

    for call in 0..5 {
        let response = stack.ready().await.unwrap().call(get()).await.unwrap();
        assert_eq!(
            response.status(),
            StatusCode::SERVICE_UNAVAILABLE,
            "call {call}"
        );
    }
    assert_eq!(upstream.count(), 25);
    let opened = Instant::now();

    let refused = stack.ready().await.unwrap().call(get()).await.unwrap_err();
    assert!(refused.downcast_ref::<CircuitOpen>().is_some(), "{refused}");
    assert_eq!(upstream.count(), 25, "an open circuit fails fast");
    assert_eq!(opened.elapsed(), Duration::ZERO, "no wait, no retry");

    // Still open one second before cooldown_secs: 60 has passed.
    tokio::time::advance(Duration::from_secs(59)).await;
    let refused = stack.ready().await.unwrap().call(get()).await.unwrap_err();
    assert!(refused.downcast_ref::<CircuitOpen>().is_some(), "{refused}");
    assert_eq!(upstream.count(), 25);

    // After it, one trial call goes through, succeeds and closes the circuit.
    tokio::time::advance(Duration::from_secs(1)).await;
    let response = stack.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(upstream.count(), 26);
    assert_eq!(handle.list()[0].state, tower_breaker::State::Closed);

    // The five failed calls were dead-lettered; the two refusals were
    // returned to the caller, not stored (`poison.store_refusals`).
    let kinds: Vec<FailureKind> = stored(&store).await.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [FailureKind::ServerError; 5]);
}

/// Issue 36, item 4: the facade passes an open circuit's refusals through
/// unstored by default, and stores them under `poison.store_refusals: true`.
#[tokio::test(start_paused = true)]
async fn first_hour_4_the_facade_stores_refusals_only_when_asked() {
    for (yaml, kept) in [
        ("retry: {max_attempts: 1}", 0),
        (
            "retry: {max_attempts: 1}\npoison: {store_refusals: true}",
            1,
        ),
    ] {
        let config = ResilienceConfig::from_yaml_str(yaml).unwrap();
        let store = MemoryStore::new(10);
        let layer = config.layer("orders", store.clone());
        assert!(layer.breaker_handle().force_open("orders"));
        let upstream = Upstream::new();
        let mut stack = ServiceBuilder::new()
            .layer(layer)
            .service(upstream.service(|_| StatusCode::OK));
        let refused = stack.ready().await.unwrap().call(get()).await.unwrap_err();
        assert!(refused.is::<CircuitOpen>(), "the refusal itself: {refused}");
        let kinds: Vec<FailureKind> = stored(&store).await.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, vec![FailureKind::Shed; kept], "{yaml}");
    }
}

#[tokio::test(start_paused = true)]
async fn max_row_attempts_diverts_a_message_after_that_many_failed_deliveries() {
    let config = ResilienceConfig::from_yaml_str(
        "retry: {max_attempts: 1}\n\
         poison: {max_row_attempts: 3, message_id_header: x-message-id}",
    )
    .unwrap();
    let store = MemoryStore::new(100);
    let upstream = Upstream::new();
    let mut stack = ServiceBuilder::new()
        .layer(config.layer("orders", store.clone()))
        .service(upstream.service(|_| StatusCode::INTERNAL_SERVER_ERROR));
    let delivery = || {
        Request::post("http://upstream.test/rows")
            .header("x-message-id", "row-42")
            .body(Full::new(Bytes::from_static(b"{\"id\": 42}")))
            .unwrap()
    };

    for n in 1..=3 {
        let response = stack.ready().await.unwrap().call(delivery()).await.unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            stored(&store).await.is_empty(),
            "delivery {n} is under the limit: its redelivery is the retry"
        );
    }
    let diverted = stack
        .ready()
        .await
        .unwrap()
        .call(delivery())
        .await
        .unwrap_err();
    assert!(
        diverted.downcast_ref::<PoisonMessage>().is_some(),
        "{diverted}"
    );
    assert_eq!(
        upstream.count(),
        3,
        "a diverted message is not delivered again"
    );
    let entries = stored(&store).await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].message_id.as_deref(), Some("row-42"));
}

#[tokio::test(start_paused = true)]
async fn drop_and_fail_store_nothing() {
    for action in ["drop", "fail"] {
        let config = ResilienceConfig::from_yaml_str(&format!(
            "retry: {{max_attempts: 2, backoff: none}}\npoison: {{action: {action}}}"
        ))
        .unwrap();
        let store = MemoryStore::new(100);
        let upstream = Upstream::new();
        let stack = ServiceBuilder::new()
            .layer(config.layer("orders", store.clone()))
            .service(upstream.service(|_| StatusCode::BAD_GATEWAY));
        let response = stack.oneshot(get()).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_GATEWAY, "{action}");
        assert_eq!(upstream.count(), 2, "{action}");
        assert!(stored(&store).await.is_empty(), "{action}");
    }
}

#[tokio::test(start_paused = true)]
async fn retry_on_limits_the_classes_retried() {
    // 429 is rate_limited, which this list leaves out: one try only.
    let config = ResilienceConfig::from_yaml_str(
        "retry: {retry_on: [http_5xx, connection, timeout], backoff: none}",
    )
    .unwrap();
    let upstream = Upstream::new();
    let stack = ServiceBuilder::new()
        .layer(config.layer("orders", MemoryStore::new(100)))
        .service(upstream.service(|_| StatusCode::TOO_MANY_REQUESTS));
    let response = stack.oneshot(get()).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(upstream.count(), 1);
}

#[tokio::test(start_paused = true)]
async fn fixed_backoff_without_jitter_waits_exactly_base_ms_capped_by_max_ms() {
    let config = ResilienceConfig::from_yaml_str(
        "retry: {max_attempts: 3, backoff: fixed, base_ms: 250, max_ms: 250, jitter: false}",
    )
    .unwrap();
    let upstream = Upstream::new();
    let stack = ServiceBuilder::new()
        .layer(config.layer("orders", MemoryStore::new(100)))
        .service(upstream.service(|_| StatusCode::SERVICE_UNAVAILABLE));
    stack.oneshot(get()).await.unwrap();
    assert_eq!(upstream.gaps(), [Duration::from_millis(250); 2]);

    let capped = ResilienceConfig::from_yaml_str(
        "retry: {max_attempts: 4, backoff: exponential, base_ms: 100, max_ms: 300, jitter: false}",
    )
    .unwrap();
    let upstream = Upstream::new();
    let stack = ServiceBuilder::new()
        .layer(capped.layer("orders", MemoryStore::new(100)))
        .service(upstream.service(|_| StatusCode::SERVICE_UNAVAILABLE));
    stack.oneshot(get()).await.unwrap();
    assert_eq!(
        upstream.gaps(),
        [100, 200, 300].map(Duration::from_millis),
        "doubling from base_ms, capped at max_ms"
    );
}

#[tokio::test(start_paused = true)]
async fn client_errors_do_not_open_the_breaker() {
    let store = MemoryStore::new(100);
    let upstream = Upstream::new();
    let mut stack = ServiceBuilder::new()
        .layer(seed().layer("orders", store.clone()))
        .service(upstream.service(|_| StatusCode::NOT_FOUND));
    for _ in 0..6 {
        let response = stack.ready().await.unwrap().call(get()).await.unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
    }
    assert_eq!(upstream.count(), 6, "a 404 is not retried and not refused");
    // Still a failure worth keeping: every kind is stored with `action: dlq`.
    let kinds: Vec<FailureKind> = stored(&store).await.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [FailureKind::Rejected; 6]);
}
