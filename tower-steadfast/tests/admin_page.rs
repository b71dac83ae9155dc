//! The admin page's router, driven as a browser or an attacker would:
//! requests through `oneshot`, answers read as the page reads them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use tower::ServiceExt;
use tower_breaker::State;
use tower_classify::FailureKind;
use tower_poison::store::{DeadLetterStore, MemoryStore};
use tower_poison::{DeadLetterEntry, ReplayBody, StoredHeader};
use tower_steadfast::{AdminPage, ResilienceConfig, ResilienceLayer};

const TOKEN: &str = "a-long-random-operator-token";
const HOST: &str = "admin.internal:9000";
const SCRIPT: &str = "<script>alert(1)</script>";

/// A replay destination that answers `status` and counts what it received.
#[derive(Clone)]
struct Upstream {
    status: StatusCode,
    received: Arc<AtomicUsize>,
}

impl Upstream {
    fn new(status: StatusCode) -> Self {
        Upstream {
            status,
            received: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn client(
        &self,
    ) -> impl tower::Service<
        Request<Full<Bytes>>,
        Response = Response<Full<Bytes>>,
        Error = std::io::Error,
        Future = impl Send,
    > + Clone
           + Send
           + Sync
           + 'static {
        let (status, received) = (self.status, self.received.clone());
        tower::service_fn(move |_request: Request<Full<Bytes>>| {
            received.fetch_add(1, Ordering::SeqCst);
            async move {
                let mut response = Response::new(Full::new(Bytes::new()));
                *response.status_mut() = status;
                Ok::<_, std::io::Error>(response)
            }
        })
    }
}

struct Fixture {
    router: axum::Router,
    stack: ResilienceLayer<MemoryStore>,
    store: MemoryStore,
    upstream: Upstream,
}

fn fixture_with(name: &str, upstream_status: StatusCode) -> Fixture {
    let store = MemoryStore::new(10_000);
    let stack = ResilienceConfig::default().layer(name, store.clone());
    let upstream = Upstream::new(upstream_status);
    let router = AdminPage::new(TOKEN)
        .stack(&stack)
        .dead_letters(
            store.clone(),
            "http://orders.internal:8080".parse().unwrap(),
            upstream.client(),
        )
        .router()
        .unwrap();
    Fixture {
        router,
        stack,
        store,
        upstream,
    }
}

fn fixture() -> Fixture {
    fixture_with("orders", StatusCode::OK)
}

async fn put_entry(store: &MemoryStore, label: &str) -> String {
    let mut entry = DeadLetterEntry::new(
        label,
        FailureKind::ServerError,
        vec!["HTTP 503 Service Unavailable".into()],
        SystemTime::now(),
    );
    entry.method = Some("POST".into());
    entry.uri = Some("/orders".into());
    entry.body = Bytes::from_static(br#"{"sku":42}"#);
    let id = entry.id.to_string();
    store.put(entry).await.unwrap();
    id
}

fn get(path: &str, token: Option<&str>) -> Request<Full<Bytes>> {
    let mut request = Request::get(path).header(header::HOST, HOST);
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    request.body(Full::default()).unwrap()
}

/// A POST as the page sends it: token, JSON, the page's own origin.
fn post(path: &str, body: Value) -> Request<Full<Bytes>> {
    Request::post(path)
        .header(header::HOST, HOST)
        .header(header::ORIGIN, format!("http://{HOST}"))
        .header("sec-fetch-site", "same-origin")
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::from(body.to_string()))
        .unwrap()
}

async fn send(
    router: &axum::Router,
    request: Request<Full<Bytes>>,
) -> (StatusCode, http::HeaderMap, Bytes) {
    let response = router.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, bytes)
}

async fn json_of(router: &axum::Router, request: Request<Full<Bytes>>) -> (StatusCode, Value) {
    let (status, _, body) = send(router, request).await;
    let value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    (status, value)
}

async fn state(router: &axum::Router) -> Value {
    let (status, value) = json_of(router, get("/api/state", Some(TOKEN))).await;
    assert_eq!(status, StatusCode::OK, "{value}");
    value
}

#[tokio::test]
async fn every_api_read_and_write_without_the_token_is_refused() {
    let f = fixture();
    let id = put_entry(&f.store, "orders").await;
    for path in [
        "/api/state".to_owned(),
        format!("/api/dead-letters/entry?store=0&id={id}"),
        "/api/no-such-path".to_owned(),
    ] {
        let (status, headers, body) = send(&f.router, get(&path, None)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(headers[header::CACHE_CONTROL], "no-store");
        // Nothing of the store leaks into a refusal.
        assert!(!String::from_utf8_lossy(&body).contains("orders"));
    }
    let mut write = post("/api/breakers/force-open", json!({"key": "orders"}));
    write.headers_mut().remove(header::AUTHORIZATION);
    let (status, _) = json_of(&f.router, write).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        f.stack.breaker_handle().get("orders").unwrap().state,
        State::Closed
    );
}

#[tokio::test]
async fn a_wrong_token_is_refused_and_changes_nothing() {
    let f = fixture();
    let id = put_entry(&f.store, "orders").await;
    for wrong in ["a-long-random-operator-tokeN", "short", ""] {
        let (status, _) = json_of(&f.router, get("/api/state", Some(wrong))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{wrong:?}");
    }
    let mut purge = post("/api/dead-letters/purge", json!({"store": 0, "id": id}));
    purge.headers_mut().insert(
        header::AUTHORIZATION,
        "Bearer a-long-random-operator-tokeN".parse().unwrap(),
    );
    let (status, _) = json_of(&f.router, purge).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(f.store.depth().await.unwrap(), 1);
}

#[test]
fn a_short_token_is_refused_when_the_router_is_built() {
    let error = AdminPage::new("too-short").router().unwrap_err();
    assert_eq!(error.field(), "admin.token");
}

#[tokio::test]
async fn a_cross_origin_post_is_refused_even_with_the_token() {
    let f = fixture();
    let id = put_entry(&f.store, "orders").await;

    let mut foreign = post("/api/breakers/force-open", json!({"key": "orders"}));
    foreign
        .headers_mut()
        .insert(header::ORIGIN, "https://evil.example".parse().unwrap());
    foreign.headers_mut().remove("sec-fetch-site");
    let (status, body) = json_of(&f.router, foreign).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["code"], "CROSS_ORIGIN");

    // A cross-site fetch that hides its origin is refused too.
    let mut hidden = post("/api/dead-letters/purge", json!({"store": 0, "id": id}));
    hidden.headers_mut().remove(header::ORIGIN);
    hidden
        .headers_mut()
        .insert("sec-fetch-site", "cross-site".parse().unwrap());
    let (status, _) = json_of(&f.router, hidden).await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    assert_eq!(
        f.stack.breaker_handle().get("orders").unwrap().state,
        State::Closed
    );
    assert_eq!(f.store.depth().await.unwrap(), 1);

    // A form post (what a forged cross-site form can send) is not JSON:
    // refused before it is read, even with the token and no origin.
    let mut form = post("/api/breakers/force-open", json!({}));
    form.headers_mut().remove(header::ORIGIN);
    form.headers_mut().remove("sec-fetch-site");
    form.headers_mut().insert(
        header::CONTENT_TYPE,
        "application/x-www-form-urlencoded".parse().unwrap(),
    );
    *form.body_mut() = Full::from("key=orders");
    let (status, _) = json_of(&f.router, form).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);

    assert_eq!(
        f.stack.breaker_handle().get("orders").unwrap().state,
        State::Closed
    );

    // The same requests from the page's own origin go through.
    let (status, _) = json_of(
        &f.router,
        post("/api/breakers/force-open", json!({"key": "orders"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

/// An HTTP/2 request as hyper hands it to the router: the browser sent
/// `:authority`, not `Host`, so the authority is in the URI.
fn http2_post(path: &str, origin: &str, body: Value) -> Request<Full<Bytes>> {
    let mut request = post(&format!("https://{HOST}{path}"), body);
    request.headers_mut().remove(header::HOST);
    request
        .headers_mut()
        .insert(header::ORIGIN, origin.parse().unwrap());
    *request.version_mut() = http::Version::HTTP_2;
    request
}

#[tokio::test]
async fn over_http2_a_write_from_the_page_goes_through_and_a_foreign_one_does_not() {
    let f = fixture();
    let own = format!("https://{HOST}");
    let force_open = json!({"key": "orders"});

    let foreign = http2_post(
        "/api/breakers/force-open",
        "https://evil.example",
        force_open.clone(),
    );
    let (status, body) = json_of(&f.router, foreign).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(
        f.stack.breaker_handle().get("orders").unwrap().state,
        State::Closed
    );

    let (status, body) = json_of(
        &f.router,
        http2_post("/api/breakers/force-open", &own, force_open),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        f.stack.breaker_handle().get("orders").unwrap().state,
        State::ForcedOpen
    );
}

#[tokio::test]
async fn script_in_a_breaker_key_or_a_label_comes_back_as_data_never_as_markup() {
    let f = fixture_with(SCRIPT, StatusCode::OK);
    let mut entry = DeadLetterEntry::new(
        SCRIPT,
        FailureKind::ServerError,
        vec![SCRIPT.into()],
        SystemTime::now(),
    );
    entry.uri = Some(format!("/orders?q={SCRIPT}"));
    entry.headers.push(StoredHeader {
        name: "x-note".into(),
        value: SCRIPT.into(),
    });
    entry.body = Bytes::from(SCRIPT);
    let id = entry.id.to_string();
    f.store.put(entry).await.unwrap();

    let (status, headers, body) = send(&f.router, get("/api/state", Some(TOKEN))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers[header::CONTENT_TYPE], "application/json");
    assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    let value: Value = serde_json::from_slice(&body).unwrap();
    // The exact characters, as data: the page writes them with textContent.
    assert_eq!(value["breakers"][0]["key"], SCRIPT);
    assert_eq!(value["retries"][0]["name"], SCRIPT);
    assert_eq!(value["dead_letters"][0]["by_label"][SCRIPT], 1);
    assert_eq!(value["dead_letters"][0]["newest"][0]["label"], SCRIPT);
    assert_eq!(value["dead_letters"][0]["newest"][0]["error"], SCRIPT);

    let (_, entry) = json_of(
        &f.router,
        get(
            &format!("/api/dead-letters/entry?store=0&id={id}"),
            Some(TOKEN),
        ),
    )
    .await;
    assert_eq!(entry["body"], SCRIPT);
    assert_eq!(entry["headers"][0][1], SCRIPT);

    // The HTML is static: the server puts no data in it, and its policy
    // runs no inline script even if some got there.
    let (status, headers, page) = send(&f.router, get("/", None)).await;
    assert_eq!(status, StatusCode::OK);
    let page = String::from_utf8(page.to_vec()).unwrap();
    assert!(!page.contains("alert(1)"));
    assert!(
        !page.contains("<script>"),
        "the page's only script is admin.js, loaded by src"
    );
    let csp = headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
    assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"));
    assert_eq!(headers[header::X_FRAME_OPTIONS], "DENY");

    // The script never turns data into markup.
    let (_, _, script) = send(&f.router, get("/admin.js", None)).await;
    let script = String::from_utf8(script.to_vec()).unwrap();
    for sink in [
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
    ] {
        assert!(!script.contains(sink), "admin.js uses {sink}");
    }
    assert!(script.contains("textContent"));
}

/// An open breaker (opened by failures, not forced) shows how long until
/// its next probe as a number of milliseconds: the name the page reads.
#[tokio::test(start_paused = true)]
async fn an_open_breaker_shows_the_time_left_before_its_next_probe() {
    let f = fixture();
    let down = tower::service_fn(|_request: Request<ReplayBody<Full<Bytes>>>| async {
        let mut response = Response::new(Full::new(Bytes::new()));
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        Ok::<_, std::io::Error>(response)
    });
    let service = tower::ServiceBuilder::new()
        .layer(f.stack.clone())
        .service(down);
    let handle = f.stack.breaker_handle();
    for _ in 0..50 {
        if handle
            .get("orders")
            .is_some_and(|breaker| breaker.state == State::Open)
        {
            break;
        }
        let request = Request::get("http://orders.internal/")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let _ = service.clone().oneshot(request).await;
    }
    assert_eq!(handle.get("orders").unwrap().state, State::Open);

    let breaker = &state(&f.router).await["breakers"][0];
    assert_eq!(breaker["state"], "open", "{breaker}");
    assert_eq!(breaker["forced"], false, "{breaker}");
    let left = breaker["remaining_open_ms"].as_u64();
    assert!(left.is_some_and(|ms| ms > 0), "{breaker}");
}

#[tokio::test]
async fn force_open_force_closed_and_reset_change_the_breaker() {
    let f = fixture();
    let handle = f.stack.breaker_handle();
    let cases = [
        ("/api/breakers/force-open", State::ForcedOpen, "forced_open"),
        (
            "/api/breakers/force-closed",
            State::ForcedClosed,
            "forced_closed",
        ),
        ("/api/breakers/reset", State::Closed, "closed"),
    ];
    for (path, expected, shown) in cases {
        let (status, body) = json_of(&f.router, post(path, json!({"key": "orders"}))).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        assert_eq!(handle.get("orders").unwrap().state, expected, "{path}");
        let breaker = &state(&f.router).await["breakers"][0];
        assert_eq!(breaker["state"], shown);
        assert_eq!(breaker["forced"], expected.is_forced());
    }

    let (status, body) = json_of(
        &f.router,
        post("/api/breakers/force-open", json!({"key": "nope"})),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["code"], "UNKNOWN_BREAKER");
    // A body that names no key never falls back to every breaker.
    let (status, _) = json_of(&f.router, post("/api/breakers/force-open", json!({}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(handle.get("orders").unwrap().state, State::Closed);
}

#[tokio::test]
async fn replay_sends_the_entry_and_removes_it_when_delivered() {
    let f = fixture();
    let id = put_entry(&f.store, "orders").await;
    assert_eq!(state(&f.router).await["dead_letters"][0]["depth"], 1);

    let (status, body) = json_of(
        &f.router,
        post("/api/dead-letters/replay", json!({"store": 0, "id": id})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["outcome"], "delivered");
    assert_eq!(f.upstream.received.load(Ordering::SeqCst), 1);
    assert_eq!(f.store.depth().await.unwrap(), 0);
    let shown = state(&f.router).await;
    assert_eq!(shown["dead_letters"][0]["depth"], 0);
    assert_eq!(shown["dead_letters"][0]["newest"], json!([]));

    let (_, body) = json_of(
        &f.router,
        post("/api/dead-letters/replay", json!({"store": 0, "id": id})),
    )
    .await;
    assert_eq!(body["outcome"], "not_found");
}

#[tokio::test]
async fn a_replay_that_fails_again_keeps_the_entry_with_its_history() {
    let f = fixture_with("orders", StatusCode::SERVICE_UNAVAILABLE);
    let id = put_entry(&f.store, "orders").await;
    let (status, body) = json_of(
        &f.router,
        post("/api/dead-letters/replay", json!({"store": 0, "id": id})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["outcome"], "failed");
    assert_eq!(body["attempts"], 2);
    let (_, entry) = json_of(
        &f.router,
        get(
            &format!("/api/dead-letters/entry?store=0&id={id}"),
            Some(TOKEN),
        ),
    )
    .await;
    assert_eq!(entry["failed_replays"], 1);
    assert_eq!(entry["replays"][0]["status"], 503);
}

#[tokio::test]
async fn purge_removes_one_entry_or_one_label_and_never_the_whole_store() {
    let f = fixture();
    let first = put_entry(&f.store, "orders").await;
    put_entry(&f.store, "orders").await;
    put_entry(&f.store, "orders").await;
    put_entry(&f.store, "payments").await;

    let (status, body) = json_of(
        &f.router,
        post("/api/dead-letters/purge", json!({"store": 0, "id": first})),
    )
    .await;
    assert_eq!((status, &body["purged"]), (StatusCode::OK, &json!(1)));
    assert_eq!(f.store.depth().await.unwrap(), 3);

    let (status, _) = json_of(
        &f.router,
        post("/api/dead-letters/purge", json!({"store": 0})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(f.store.depth().await.unwrap(), 3);

    let (_, body) = json_of(
        &f.router,
        post(
            "/api/dead-letters/purge",
            json!({"store": 0, "label": "orders"}),
        ),
    )
    .await;
    assert_eq!(body["purged"], 2);
    let shown = state(&f.router).await;
    assert_eq!(shown["dead_letters"][0]["by_label"], json!({"payments": 1}));
}

#[tokio::test]
async fn listings_are_bounded_and_show_the_newest_first() {
    let f = fixture();
    let mut ids = Vec::new();
    for i in 0..60 {
        ids.push(put_entry(&f.store, if i % 2 == 0 { "even" } else { "odd" }).await);
    }
    let (_, shown) = json_of(&f.router, get("/api/state?limit=1000", Some(TOKEN))).await;
    let newest = shown["dead_letters"][0]["newest"].as_array().unwrap();
    assert_eq!(newest.len(), 50);
    assert_eq!(newest[0]["id"], ids[59].as_str());
    assert_eq!(shown["dead_letters"][0]["depth"], 60);
    assert_eq!(
        shown["dead_letters"][0]["by_label"],
        json!({"even": 30, "odd": 30})
    );

    let (_, shown) = json_of(&f.router, get("/api/state?label=odd", Some(TOKEN))).await;
    let newest = shown["dead_letters"][0]["newest"].as_array().unwrap();
    assert_eq!(newest.len(), 20);
    assert!(newest.iter().all(|entry| entry["label"] == "odd"));
}

#[tokio::test(start_paused = true)]
async fn retry_counts_follow_the_stacks_retry_layer() {
    let f = fixture();
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    // Fails twice, then answers: one call, two retries, recovered.
    let inner = tower::service_fn(move |_request: Request<ReplayBody<Full<Bytes>>>| {
        let n = seen.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut response = Response::new(Full::new(Bytes::new()));
            if n < 2 {
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            }
            Ok::<_, tower::BoxError>(response)
        }
    });
    let service = tower::Layer::layer(&f.stack, inner);
    let response = service
        .oneshot(
            Request::get("http://orders.internal/x")
                .body(Full::default())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let retries = &state(&f.router).await["retries"][0];
    assert_eq!(retries["name"], "orders");
    assert_eq!(retries["retries"], 2);
    assert_eq!(retries["recovered"], 1);
    assert_eq!(retries["gave_up"], 0);
}

#[tokio::test]
async fn the_page_needs_no_token_and_a_slashless_address_is_sent_where_its_assets_resolve() {
    let f = fixture();
    let app = axum::Router::new().nest("/admin", f.router.clone());
    let (status, headers, _) = send(&app, get("/admin", None)).await;
    assert!(status.is_redirection(), "{status}");
    // Relative, so it stays on this site: `/admin/index.html`.
    assert_eq!(headers[header::LOCATION], "./admin/index.html");
    let (status, headers, page) = send(&app, get("/admin/index.html", None)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(String::from_utf8_lossy(&page).contains(r#"src="admin.js""#));
    let (status, _, _) = send(&app, get("/admin/admin.css", None)).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = json_of(&app, get("/admin/api/state", Some(TOKEN))).await;
    assert_eq!(status, StatusCode::OK);
    // `Method` is the only thing a write's refusal depends on besides its
    // headers: a GET to a write path is simply not a route.
    let mut wrong_method = get("/admin/api/breakers/reset", Some(TOKEN));
    *wrong_method.method_mut() = Method::GET;
    let (status, _) = json_of(&app, wrong_method).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn a_stack_built_by_hand_shows_its_breaker_and_says_its_retries_are_not_counted() {
    let config = ResilienceConfig::default();
    let store = MemoryStore::new(10);
    let stack = ResilienceLayer::new(
        config.dead_letter_layer(store),
        config
            .breaker_builder()
            .name("by-hand")
            .build(tower_classify::HttpClassifier::new())
            .unwrap(),
        config.retry_builder().name("by-hand").build().unwrap(),
    );
    let router = AdminPage::new(TOKEN).stack(&stack).router().unwrap();
    let shown = state(&router).await;
    assert_eq!(shown["breakers"][0]["key"], "by-hand");
    assert_eq!(
        shown["retries"],
        json!([{"name": "by-hand", "counted": false}])
    );
    assert_eq!(shown["dead_letters"], json!([]));
}
