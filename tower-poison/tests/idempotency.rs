//! The idempotency guard's rules, each run against the in-memory store (on
//! paused time) and, with the `redis` feature, the Redis store (real short
//! TTLs), plus the client-side key layer.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use tokio::sync::Semaphore;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_classify::BoxError;
use tower_poison::idempotency::store::{
    Claim, ClaimToken, IdempotencyStore, MemoryIdempotencyStore, StoredResponse,
};
use tower_poison::idempotency::{IdempotencyGuardLayer, IdempotencyKeyLayer};
use tower_poison::store::{StoreError, StoreErrorKind};
use tower_poison::CapturedBody;

#[cfg(feature = "redis")]
mod support;

type Body = CapturedBody<Full<Bytes>>;
type Guarded = BoxCloneService<Request<Full<Bytes>>, Response<Body>, BoxError>;

/// The service behind the guard: an order API whose behaviour depends on the
/// path, counting how often each path was really called.
#[derive(Clone)]
struct Orders {
    calls: Arc<Mutex<HashMap<String, usize>>>,
    /// `/slow` waits for a permit, so a test can hold a request in flight.
    gate: Arc<Semaphore>,
}

impl Default for Orders {
    fn default() -> Self {
        Orders {
            calls: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }
}

impl Orders {
    fn calls(&self, path: &str) -> usize {
        self.calls.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    async fn handle(self, request: Request<Body>) -> Result<Response<Full<Bytes>>, BoxError> {
        let path = request.uri().path().to_owned();
        // The guard read the body for its fingerprint; the handler still
        // gets all of it.
        let body = request.into_body().collect().await?.to_bytes();
        let n = {
            let mut calls = self.calls.lock().unwrap();
            let n = calls.entry(path.clone()).or_default();
            *n += 1;
            *n
        };
        let (status, text) = match path.as_str() {
            "/slow" => {
                self.gate.acquire().await?.forget();
                (201, format!("slow order {n}"))
            }
            // Fails transiently the first time, then works.
            "/flaky" if n == 1 => (503, "try again".to_owned()),
            "/throttled" if n == 1 => (429, "slow down".to_owned()),
            "/error" if n == 1 => return Err("connection to the database lost".into()),
            // A permanent failure: the same request fails the same way.
            "/invalid" => (400, "unknown sku".to_owned()),
            "/big" => (201, "x".repeat(2048)),
            _ => (
                201,
                format!("order {n} for {}", String::from_utf8_lossy(&body)),
            ),
        };
        Ok(Response::builder()
            .status(status)
            .header("x-order-number", n.to_string())
            .header("content-type", "text/plain")
            .body(Full::new(Bytes::from(text)))
            .unwrap())
    }
}

fn guarded<St: IdempotencyStore>(layer: IdempotencyGuardLayer<St>, orders: &Orders) -> Guarded {
    let orders = orders.clone();
    let service = layer.layer(service_fn(move |req| orders.clone().handle(req)));
    BoxCloneService::new(service)
}

fn post(path: &str, key: &str, body: &'static str) -> Request<Full<Bytes>> {
    Request::post(format!("http://orders.internal{path}"))
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

async fn send(service: &Guarded, request: Request<Full<Bytes>>) -> Response<Body> {
    service.clone().oneshot(request).await.unwrap()
}

async fn text(response: Response<Body>) -> (StatusCode, String) {
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// The guard's own answer: its status and the `error` code of its JSON body.
async fn rejection(response: Response<Body>) -> (StatusCode, String) {
    assert_eq!(response.headers()["content-type"], "application/json");
    let (status, body) = text(response).await;
    let json: Value = serde_json::from_str(&body).unwrap();
    assert!(json["message"].as_str().is_some_and(|m| !m.is_empty()));
    (status, json["error"].as_str().unwrap().to_owned())
}

fn replayed(response: &Response<Body>) -> bool {
    response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

// ===== The rules, for any store =====

async fn replays_the_first_response<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store), &orders);

    let first = send(&service, post("/orders", "k-replay", r#"{"sku":1}"#)).await;
    assert!(!replayed(&first));
    assert_eq!(first.headers()["x-order-number"], "1");
    let first = text(first).await;
    assert_eq!(
        first,
        (StatusCode::CREATED, r#"order 1 for {"sku":1}"#.to_owned())
    );

    for _ in 0..3 {
        let repeat = send(&service, post("/orders", "k-replay", r#"{"sku":1}"#)).await;
        assert!(replayed(&repeat), "a repeat is marked as replayed");
        assert_eq!(repeat.headers()["x-order-number"], "1");
        assert_eq!(repeat.headers()["content-type"], "text/plain");
        assert_eq!(text(repeat).await, first);
    }
    assert_eq!(orders.calls("/orders"), 1, "the order was created once");

    // Another key is another request.
    let other = send(&service, post("/orders", "k-replay-2", r#"{"sku":1}"#)).await;
    assert!(!replayed(&other));
    assert_eq!(orders.calls("/orders"), 2);
}

async fn conflicts_while_in_flight<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store), &orders);

    let first = tokio::spawn(service.clone().oneshot(post("/slow", "k-busy", "{}")));
    while orders.calls("/slow") == 0 {
        tokio::task::yield_now().await;
    }
    let repeat = send(&service, post("/slow", "k-busy", "{}")).await;
    assert_eq!(repeat.headers()["retry-after"], "1");
    assert_eq!(
        rejection(repeat).await,
        (StatusCode::CONFLICT, "idempotency_key_in_use".to_owned())
    );

    orders.gate.add_permits(1);
    let first = first.await.unwrap().unwrap();
    assert_eq!(text(first).await.0, StatusCode::CREATED);
    let after = send(&service, post("/slow", "k-busy", "{}")).await;
    assert!(replayed(&after));
    assert_eq!(orders.calls("/slow"), 1);
}

async fn refuses_a_reused_key_for_another_request<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store), &orders);
    let first = send(&service, post("/orders", "k-reuse", r#"{"sku":1}"#)).await;
    assert_eq!(first.status(), StatusCode::CREATED);

    let mismatch = (
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency_key_reused".to_owned(),
    );
    // Another body, another path, another method: each is refused.
    let other_body = send(&service, post("/orders", "k-reuse", r#"{"sku":2}"#)).await;
    assert_eq!(rejection(other_body).await, mismatch);
    let other_path = send(&service, post("/orders/2", "k-reuse", r#"{"sku":1}"#)).await;
    assert_eq!(rejection(other_path).await, mismatch);
    let mut patch = post("/orders", "k-reuse", r#"{"sku":1}"#);
    *patch.method_mut() = http::Method::PATCH;
    assert_eq!(rejection(send(&service, patch).await).await, mismatch);
    assert_eq!(orders.calls("/orders"), 1);
    assert_eq!(orders.calls("/orders/2"), 0);

    // A mismatch is refused while the first is in flight too.
    let slow = tokio::spawn(service.clone().oneshot(post("/slow", "k-reuse-busy", "a")));
    while orders.calls("/slow") == 0 {
        tokio::task::yield_now().await;
    }
    let during = send(&service, post("/slow", "k-reuse-busy", "b")).await;
    assert_eq!(rejection(during).await, mismatch);
    orders.gate.add_permits(1);
    slow.await.unwrap().unwrap();
}

async fn refuses_a_key_over_255_characters<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store), &orders);
    let long = "k".repeat(256);
    let response = send(&service, post("/orders", &long, "{}")).await;
    assert_eq!(
        rejection(response).await,
        (
            StatusCode::BAD_REQUEST,
            "idempotency_key_too_long".to_owned()
        )
    );
    assert_eq!(orders.calls("/orders"), 0, "the request did not run");

    let longest = "k".repeat(255);
    let response = send(&service, post("/orders", &longest, "{}")).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert!(replayed(
        &send(&service, post("/orders", &longest, "{}")).await
    ));
}

async fn transient_failures_release_the_key<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store), &orders);
    for (path, transient) in [
        ("/flaky", StatusCode::SERVICE_UNAVAILABLE),
        ("/throttled", StatusCode::TOO_MANY_REQUESTS),
    ] {
        let key = format!("k-release{path}");
        let first = send(&service, post(path, &key, "{}")).await;
        assert_eq!(first.status(), transient);
        assert!(!replayed(&first));
        // The retry runs again (not a replay of the failure) and succeeds;
        // that success is stored.
        let retry = send(&service, post(path, &key, "{}")).await;
        assert!(!replayed(&retry));
        assert_eq!(retry.status(), StatusCode::CREATED);
        assert!(replayed(&send(&service, post(path, &key, "{}")).await));
        assert_eq!(orders.calls(path), 2);
    }

    // An error (no response at all) releases it too.
    let error = service
        .clone()
        .oneshot(post("/error", "k-release-error", "{}"))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("database lost"));
    let retry = send(&service, post("/error", "k-release-error", "{}")).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(orders.calls("/error"), 2);

    // A permanent failure is an answer: stored and replayed.
    let invalid = send(&service, post("/invalid", "k-invalid", "{}")).await;
    assert_eq!(invalid.status(), StatusCode::BAD_REQUEST);
    let repeat = send(&service, post("/invalid", "k-invalid", "{}")).await;
    assert!(replayed(&repeat));
    assert_eq!(
        text(repeat).await,
        (StatusCode::BAD_REQUEST, "unknown sku".into())
    );
    assert_eq!(orders.calls("/invalid"), 1);
}

/// `wait` lets the TTL pass: paused time for the memory store, a real (short)
/// sleep for Redis.
async fn keys_expire_after_the_ttl<St, W, F>(store: St, ttl: Duration, wait: W)
where
    St: IdempotencyStore,
    W: Fn(Duration) -> F,
    F: Future<Output = ()>,
{
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store).ttl(ttl), &orders);
    send(&service, post("/orders", "k-ttl", "{}")).await;
    wait(ttl / 2).await;
    assert!(replayed(
        &send(&service, post("/orders", "k-ttl", "{}")).await
    ));
    wait(ttl).await;
    let after = send(&service, post("/orders", "k-ttl", "{}")).await;
    assert!(!replayed(&after), "an expired key runs again");
    assert_eq!(orders.calls("/orders"), 2);
}

/// A claim whose request never finishes (its node died) lapses after the
/// in-flight TTL.
async fn in_flight_claims_lapse<St, W, F>(store: St, in_flight_ttl: Duration, wait: W)
where
    St: IdempotencyStore,
    W: Fn(Duration) -> F,
    F: Future<Output = ()>,
{
    let fingerprint = "POST /orders sha256:00";
    let Claim::Acquired(_abandoned) = store
        .claim("k-lapse", fingerprint, in_flight_ttl)
        .await
        .unwrap()
    else {
        panic!("a fresh key is acquired");
    };
    assert!(matches!(
        store
            .claim("k-lapse", fingerprint, in_flight_ttl)
            .await
            .unwrap(),
        Claim::InFlight { .. }
    ));
    wait(in_flight_ttl + in_flight_ttl / 2).await;
    let Claim::Acquired(claim) = store
        .claim("k-lapse", fingerprint, in_flight_ttl)
        .await
        .unwrap()
    else {
        panic!("the lapsed claim can be taken over");
    };
    // The abandoned owner can no longer complete over the new one.
    assert!(!store
        .complete("k-lapse", &_abandoned, stored(), Duration::from_secs(60))
        .await
        .unwrap());
    assert!(store
        .complete("k-lapse", &claim, stored(), Duration::from_secs(60))
        .await
        .unwrap());
}

fn stored() -> StoredResponse {
    StoredResponse::new(StatusCode::CREATED, &http::HeaderMap::new(), "ok".into())
}

async fn a_dropped_call_releases_its_key<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store), &orders);
    let first = tokio::spawn(service.clone().oneshot(post("/slow", "k-cancel", "{}")));
    while orders.calls("/slow") == 0 {
        tokio::task::yield_now().await;
    }
    // The client goes away: the call's future is dropped mid-flight.
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    // The release runs in a spawned task; the key frees up without waiting
    // for the in-flight TTL (5 min).
    let mut answer = StatusCode::CONFLICT;
    let started = tokio::time::Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        orders.gate.add_permits(1);
        let response = send(&service, post("/slow", "k-cancel", "{}")).await;
        answer = response.status();
        if answer != StatusCode::CONFLICT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(answer, StatusCode::CREATED, "the key was released");
}

async fn scopes_keys_by_client<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let layer = IdempotencyGuardLayer::new(store).scope_by(|parts| {
        parts
            .headers
            .get("x-client")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    });
    let service = guarded(layer, &orders);
    let from = |client: &str| {
        let mut request = post("/orders", "k-shared", "{}");
        request
            .headers_mut()
            .insert("x-client", client.parse().unwrap());
        request
    };
    assert!(!replayed(&send(&service, from("alice")).await));
    assert!(
        !replayed(&send(&service, from("bob")).await),
        "bob does not see alice's order"
    );
    assert!(replayed(&send(&service, from("alice")).await));
    assert_eq!(orders.calls("/orders"), 2);
}

async fn idempotent_methods_and_unkeyed_requests_pass_through<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store.clone()), &orders);
    for _ in 0..2 {
        let mut put = post("/orders", "k-put", "{}");
        *put.method_mut() = http::Method::PUT;
        assert!(!replayed(&send(&service, put).await));
        let mut unkeyed = post("/orders", "unused", "{}");
        unkeyed.headers_mut().remove("idempotency-key");
        assert!(!replayed(&send(&service, unkeyed).await));
    }
    assert_eq!(orders.calls("/orders"), 4);

    // With `all_methods`, a keyed PUT is guarded as well.
    let all = guarded(IdempotencyGuardLayer::new(store).all_methods(true), &orders);
    for _ in 0..2 {
        let mut put = post("/orders", "k-put-all", "{}");
        *put.method_mut() = http::Method::PUT;
        send(&all, put).await;
    }
    assert_eq!(orders.calls("/orders"), 5);
}

async fn large_responses_are_passed_on_but_not_stored<St: IdempotencyStore>(store: St) {
    let orders = Orders::default();
    let layer = IdempotencyGuardLayer::new(store).response_body_limit(1024);
    let service = guarded(layer, &orders);
    for _ in 0..2 {
        let response = send(&service, post("/big", "k-big", "{}")).await;
        assert!(!replayed(&response));
        assert_eq!(text(response).await.1.len(), 2048, "passed on whole");
    }
    assert_eq!(orders.calls("/big"), 2);
}

/// Many copies of one request at once, through two stacks sharing the store
/// (two nodes): exactly one runs, every other gets 409, and once it is done
/// every repeat is a replay.
async fn concurrent_repeats_run_once<St: IdempotencyStore>(node_1: St, node_2: St) {
    let orders = Orders::default();
    let nodes = [
        guarded(IdempotencyGuardLayer::new(node_1), &orders),
        guarded(IdempotencyGuardLayer::new(node_2), &orders),
    ];
    let calls: Vec<_> = (0..20)
        .map(|i| tokio::spawn(nodes[i % 2].clone().oneshot(post("/slow", "k-race", "{}"))))
        .collect();
    // The one that runs waits at the gate; every other copy must be
    // answered meanwhile.
    let started = tokio::time::Instant::now();
    while calls.iter().filter(|c| c.is_finished()).count() < 19 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "copies still waiting"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut running = None;
    for call in calls {
        if call.is_finished() {
            let response = call.await.unwrap().unwrap();
            assert_eq!(response.status(), StatusCode::CONFLICT);
        } else {
            assert!(running.replace(call).is_none(), "only one runs");
        }
    }
    orders.gate.add_permits(1);
    let ran = running.unwrap().await.unwrap().unwrap();
    assert_eq!(ran.status(), StatusCode::CREATED);
    assert_eq!(orders.calls("/slow"), 1, "the request ran once");
    for node in &nodes {
        assert!(replayed(&send(node, post("/slow", "k-race", "{}")).await));
    }
}

// ===== In-memory store (paused time) =====

fn memory() -> MemoryIdempotencyStore {
    MemoryIdempotencyStore::new(1000)
}

async fn paused_wait(duration: Duration) {
    tokio::time::advance(duration).await;
}

#[tokio::test(start_paused = true)]
async fn memory_replays_the_first_response() {
    replays_the_first_response(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_conflicts_while_in_flight() {
    conflicts_while_in_flight(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_refuses_a_reused_key_for_another_request() {
    refuses_a_reused_key_for_another_request(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_refuses_a_key_over_255_characters() {
    refuses_a_key_over_255_characters(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_transient_failures_release_the_key() {
    transient_failures_release_the_key(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_keys_expire_after_the_ttl() {
    keys_expire_after_the_ttl(memory(), Duration::from_secs(24 * 3600), paused_wait).await;
}

#[tokio::test(start_paused = true)]
async fn memory_in_flight_claims_lapse() {
    in_flight_claims_lapse(memory(), Duration::from_secs(300), paused_wait).await;
}

#[tokio::test(start_paused = true)]
async fn memory_a_dropped_call_releases_its_key() {
    a_dropped_call_releases_its_key(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_scopes_keys_by_client() {
    scopes_keys_by_client(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_idempotent_methods_and_unkeyed_requests_pass_through() {
    idempotent_methods_and_unkeyed_requests_pass_through(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_large_responses_are_passed_on_but_not_stored() {
    large_responses_are_passed_on_but_not_stored(memory()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_concurrent_repeats_run_once() {
    let store = memory();
    concurrent_repeats_run_once(store.clone(), store).await;
}

#[tokio::test(start_paused = true)]
async fn memory_store_evicts_the_oldest_key_at_its_bound() {
    let store = MemoryIdempotencyStore::new(2);
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(store.clone()), &orders);
    for key in ["a", "b", "c"] {
        send(&service, post("/orders", key, "{}")).await;
    }
    assert_eq!(store.len(), 2, "bounded");
    assert_eq!(orders.calls("/orders"), 3);
    // "a" was claimed first, so it went first; "b" and "c" are kept.
    assert!(replayed(&send(&service, post("/orders", "c", "{}")).await));
    assert!(replayed(&send(&service, post("/orders", "b", "{}")).await));
    assert_eq!(orders.calls("/orders"), 3);
    assert!(!replayed(&send(&service, post("/orders", "a", "{}")).await));
    assert_eq!(orders.calls("/orders"), 4);
    // Re-claiming "a" evicted the oldest remaining key, "b".
    assert!(replayed(&send(&service, post("/orders", "c", "{}")).await));
    assert!(!replayed(&send(&service, post("/orders", "b", "{}")).await));
    assert_eq!(store.len(), 2);
}

/// A store that cannot answer.
#[derive(Clone)]
struct BrokenStore;

impl IdempotencyStore for BrokenStore {
    async fn claim(&self, _: &str, _: &str, _: Duration) -> Result<Claim, StoreError> {
        Err(StoreError::new(StoreErrorKind::Backend, "disk on fire"))
    }

    async fn complete(
        &self,
        _: &str,
        _: &ClaimToken,
        _: StoredResponse,
        _: Duration,
    ) -> Result<bool, StoreError> {
        unreachable!("never claimed")
    }

    async fn release(&self, _: &str, _: &ClaimToken) -> Result<bool, StoreError> {
        unreachable!("never claimed")
    }
}

#[tokio::test]
async fn a_store_that_cannot_answer_refuses_the_request_with_503() {
    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(BrokenStore), &orders);
    let response = send(&service, post("/orders", "k", "{}")).await;
    assert_eq!(response.headers()["retry-after"], "1");
    assert_eq!(
        rejection(response).await,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "idempotency_store_unavailable".to_owned()
        )
    );
    assert_eq!(orders.calls("/orders"), 0, "never run unguarded");
}

/// A store that claims but cannot keep a response (it went down mid-call).
#[derive(Clone)]
struct CannotComplete(MemoryIdempotencyStore);

impl IdempotencyStore for CannotComplete {
    async fn claim(
        &self,
        key: &str,
        fingerprint: &str,
        ttl: Duration,
    ) -> Result<Claim, StoreError> {
        self.0.claim(key, fingerprint, ttl).await
    }

    async fn complete(
        &self,
        _: &str,
        _: &ClaimToken,
        _: StoredResponse,
        _: Duration,
    ) -> Result<bool, StoreError> {
        Err(StoreError::new(StoreErrorKind::Backend, "connection reset"))
    }

    async fn release(&self, key: &str, claim: &ClaimToken) -> Result<bool, StoreError> {
        self.0.release(key, claim).await
    }
}

/// The request was applied but its response could not be stored: the client
/// still gets the response, and the key stays claimed (repeats get 409 until
/// the in-flight TTL) rather than being released for a second application.
#[tokio::test(start_paused = true)]
async fn a_response_the_store_cannot_keep_is_still_returned_and_the_key_stays_held() {
    let orders = Orders::default();
    let layer =
        IdempotencyGuardLayer::new(CannotComplete(memory())).in_flight_ttl(Duration::from_secs(60));
    let service = guarded(layer, &orders);
    let first = send(&service, post("/orders", "k-lost", "{}")).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let repeat = send(&service, post("/orders", "k-lost", "{}")).await;
    assert_eq!(repeat.status(), StatusCode::CONFLICT);
    assert_eq!(orders.calls("/orders"), 1, "not applied twice");
    tokio::time::advance(Duration::from_secs(60)).await;
    let later = send(&service, post("/orders", "k-lost", "{}")).await;
    assert_eq!(later.status(), StatusCode::CREATED, "the claim lapsed");
    assert_eq!(orders.calls("/orders"), 2);
}

// ===== The client side =====

/// Each logical call gets one key; every retry of it (the retry layer sits
/// inside) carries the same key; a key the caller set is kept.
#[tokio::test]
async fn the_client_layer_gives_each_logical_call_one_key_for_all_its_retries() {
    use tower::retry::{Policy, RetryLayer};

    #[derive(Clone)]
    struct ThreeTries(usize);

    impl Policy<Request<Bytes>, StatusCode, BoxError> for ThreeTries {
        type Future = std::future::Ready<()>;

        fn retry(
            &mut self,
            _: &mut Request<Bytes>,
            result: &mut Result<StatusCode, BoxError>,
        ) -> Option<Self::Future> {
            let failed = matches!(result, Ok(status) if status.is_server_error());
            (failed && self.0 > 1).then(|| {
                self.0 -= 1;
                std::future::ready(())
            })
        }

        fn clone_request(&mut self, req: &Request<Bytes>) -> Option<Request<Bytes>> {
            let mut clone = Request::new(req.body().clone());
            *clone.method_mut() = req.method().clone();
            *clone.uri_mut() = req.uri().clone();
            *clone.headers_mut() = req.headers().clone();
            Some(clone)
        }
    }

    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let record = seen.clone();
    let upstream = service_fn(move |req: Request<Bytes>| {
        let record = record.clone();
        async move {
            let key = req
                .headers()
                .get("idempotency-key")
                .map(|v| v.to_str().unwrap().to_owned());
            let mut seen = record.lock().unwrap();
            seen.push(key);
            // Every call fails twice, then works.
            let status = if seen.len().is_multiple_of(3) {
                StatusCode::CREATED
            } else {
                StatusCode::BAD_GATEWAY
            };
            Ok::<_, BoxError>(status)
        }
    });
    let mut client = tower::ServiceBuilder::new()
        .layer(IdempotencyKeyLayer::new())
        .layer(RetryLayer::new(ThreeTries(3)))
        .service(upstream);
    let call = |key: Option<&str>| {
        let mut builder = Request::post("http://orders.internal/orders");
        if let Some(key) = key {
            builder = builder.header("idempotency-key", key);
        }
        builder.body(Bytes::from_static(b"{}")).unwrap()
    };
    for request in [call(None), call(None), call(Some("mine"))] {
        let status = client.ready().await.unwrap().call(request).await.unwrap();
        assert_eq!(status, StatusCode::CREATED);
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 9);
    let keys: Vec<&str> = seen.iter().map(|k| k.as_deref().unwrap()).collect();
    assert!(
        keys[0..3].iter().all(|k| *k == keys[0]),
        "one key per call: {keys:?}"
    );
    assert!(keys[3..6].iter().all(|k| *k == keys[3]));
    assert_ne!(keys[0], keys[3], "each logical call has its own key");
    assert_eq!(keys[0].len(), 32);
    assert!(
        keys[6..9].iter().all(|k| *k == "mine"),
        "the caller's key is kept"
    );

    // GET is idempotent: no key unless asked for.
    let mut plain = IdempotencyKeyLayer::new().layer(service_fn(|req: Request<()>| async move {
        Ok::<_, BoxError>(req.headers().contains_key("idempotency-key"))
    }));
    let get = Request::get("/orders").body(()).unwrap();
    assert!(!plain.ready().await.unwrap().call(get).await.unwrap());
    let mut all = IdempotencyKeyLayer::new()
        .all_methods(true)
        .layer(service_fn(|req: Request<()>| async move {
            Ok::<_, BoxError>(req.headers().contains_key("idempotency-key"))
        }));
    let get = Request::get("/orders").body(()).unwrap();
    assert!(all.ready().await.unwrap().call(get).await.unwrap());
}

// ===== Redis store (real, short TTLs) =====

#[cfg(feature = "redis")]
mod redis_store {
    use super::*;
    use tower_poison::idempotency::store::RedisIdempotencyStore;

    async fn redis(name: &str) -> Option<RedisIdempotencyStore> {
        let url = support::shared_redis().await?;
        let prefix = format!("{}:", support::unique(name));
        Some(RedisIdempotencyStore::connect(&url, prefix).await.unwrap())
    }

    async fn real_wait(duration: Duration) {
        tokio::time::sleep(duration).await;
    }

    #[tokio::test]
    async fn redis_replays_the_first_response() {
        let Some(store) = redis("replay").await else {
            return;
        };
        replays_the_first_response(store).await;
    }

    #[tokio::test]
    async fn redis_conflicts_while_in_flight() {
        let Some(store) = redis("in-flight").await else {
            return;
        };
        conflicts_while_in_flight(store).await;
    }

    #[tokio::test]
    async fn redis_refuses_a_reused_key_for_another_request() {
        let Some(store) = redis("reuse").await else {
            return;
        };
        refuses_a_reused_key_for_another_request(store).await;
    }

    #[tokio::test]
    async fn redis_refuses_a_key_over_255_characters() {
        let Some(store) = redis("long-key").await else {
            return;
        };
        refuses_a_key_over_255_characters(store).await;
    }

    #[tokio::test]
    async fn redis_transient_failures_release_the_key() {
        let Some(store) = redis("release").await else {
            return;
        };
        transient_failures_release_the_key(store).await;
    }

    #[tokio::test]
    async fn redis_keys_expire_after_the_ttl() {
        let Some(store) = redis("ttl").await else {
            return;
        };
        keys_expire_after_the_ttl(store, Duration::from_millis(1000), real_wait).await;
    }

    #[tokio::test]
    async fn redis_in_flight_claims_lapse() {
        let Some(store) = redis("lapse").await else {
            return;
        };
        in_flight_claims_lapse(store, Duration::from_millis(1000), real_wait).await;
    }

    #[tokio::test]
    async fn redis_a_dropped_call_releases_its_key() {
        let Some(store) = redis("cancel").await else {
            return;
        };
        a_dropped_call_releases_its_key(store).await;
    }

    #[tokio::test]
    async fn redis_scopes_keys_by_client() {
        let Some(store) = redis("scope").await else {
            return;
        };
        scopes_keys_by_client(store).await;
    }

    #[tokio::test]
    async fn redis_idempotent_methods_and_unkeyed_requests_pass_through() {
        let Some(store) = redis("pass").await else {
            return;
        };
        idempotent_methods_and_unkeyed_requests_pass_through(store).await;
    }

    #[tokio::test]
    async fn redis_large_responses_are_passed_on_but_not_stored() {
        let Some(store) = redis("big").await else {
            return;
        };
        large_responses_are_passed_on_but_not_stored(store).await;
    }

    /// Two connections (two nodes) with the same prefix race for one key.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_concurrent_repeats_run_once_across_two_nodes() {
        let Some(node_1) = redis("race").await else {
            return;
        };
        let node_2 = RedisIdempotencyStore::connect(&support::redis_url(), node_1.prefix())
            .await
            .unwrap();
        concurrent_repeats_run_once(node_1, node_2).await;
    }

    /// Keys carry the TTL in Redis itself (`PX`): nothing needs sweeping.
    #[tokio::test]
    async fn redis_keys_carry_their_ttl_and_prefix() {
        let Some(store) = redis("pttl").await else {
            return;
        };
        let orders = Orders::default();
        let service = guarded(IdempotencyGuardLayer::new(store.clone()), &orders);
        send(&service, post("/orders", "k-pttl", "{}")).await;
        let url = support::redis_url();
        let mut connection = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let pttl: i64 = redis::cmd("PTTL")
            .arg(format!("{}k-pttl", store.prefix()))
            .query_async(&mut connection)
            .await
            .unwrap();
        let day = 24 * 3600 * 1000;
        assert!(
            pttl > day - 60_000 && pttl <= day,
            "default TTL 24 h, got {pttl} ms"
        );
    }
}

// ===== Over the wire =====

/// The guard in a real hyper server on 127.0.0.1: a replay and a 409 as a
/// client sees them (the guard's answers are responses, so the connection
/// stays usable).
#[tokio::test]
async fn a_real_server_replays_and_answers_409_over_http() {
    use hyper::body::Incoming;
    use hyper_util::rt::TokioIo;

    let orders = Orders::default();
    let service = guarded(IdempotencyGuardLayer::new(memory()), &orders);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let service = service.clone();
            tokio::spawn(async move {
                let hyper_service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (parts, body) = req.into_parts();
                    let service = service.clone();
                    async move {
                        // The test stack takes `Full` bodies: collect first.
                        // The error is a `String` because with `BoxError` the
                        // compiler cannot prove the spawned connection `Send`
                        // (a higher-ranked `From` bound, rust-lang/rust#102211).
                        let body = match body.collect().await {
                            Ok(collected) => collected.to_bytes(),
                            Err(error) => return Err::<Response<Body>, _>(error.to_string()),
                        };
                        let request = Request::from_parts(parts, Full::new(body));
                        let response = match service.oneshot(request).await {
                            Ok(response) => response,
                            Err(error) => return Err(error.to_string()),
                        };
                        Ok(response)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), hyper_service)
                    .await;
            });
        }
    });

    let stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let (mut client, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = |path: &str, key: &str| {
        Request::post(path)
            .header("host", "orders.internal")
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from_static(b"{\"sku\":3}")))
            .unwrap()
    };

    let first = client
        .send_request(request("/orders", "wire-1"))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let first_body = first.into_body().collect().await.unwrap().to_bytes();
    let repeat = client
        .send_request(request("/orders", "wire-1"))
        .await
        .unwrap();
    assert_eq!(repeat.headers()["idempotent-replayed"], "true");
    assert_eq!(
        repeat.headers()["content-length"],
        first_body.len().to_string()
    );
    assert_eq!(
        repeat.into_body().collect().await.unwrap().to_bytes(),
        first_body
    );

    // Hold one request in flight on a second connection; the repeat on the
    // first connection gets a 409 with its JSON body, and the connection
    // still serves the next request.
    let stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let (mut other, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let slow = tokio::spawn(other.send_request(request("/slow", "wire-2")));
    while orders.calls("/slow") == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let busy = client
        .send_request(request("/slow", "wire-2"))
        .await
        .unwrap();
    assert_eq!(busy.status(), StatusCode::CONFLICT);
    let json: Value =
        serde_json::from_slice(&busy.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(json["error"], "idempotency_key_in_use");
    orders.gate.add_permits(1);
    assert_eq!(slow.await.unwrap().unwrap().status(), StatusCode::CREATED);
    let next = client
        .send_request(request("/orders", "wire-3"))
        .await
        .unwrap();
    assert_eq!(next.status(), StatusCode::CREATED);
    assert_eq!(orders.calls("/orders"), 2);
}
