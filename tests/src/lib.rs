//! The harness of the family's cross-crate integration tests.
//!
//! Every test starts its own [`Upstream`] (an axum server on `127.0.0.1:0`
//! whose answers the test scripts, and which records every request it
//! receives), calls it through a real hyper-util client ([`client`]) wrapped
//! in the family's layers ([`default_order`], [`retry_outside_breaker`]), and
//! asserts on what the upstream saw, what the caller got, and what the
//! dead-letter store holds. The scenarios themselves are in `tests/`.
//!
//! Nothing here is mocked: the requests cross real sockets, so the tests use
//! real time. They keep waits short and assert exact counts and generous
//! bounds rather than tight timings, so that a loaded 2-core CI machine does
//! not make them flaky.

#![warn(
    missing_debug_implementations,
    missing_docs,
    rust_2018_idioms,
    unreachable_pub
)]
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request as AxumRequest, State};
use axum::response::Response as AxumResponse;
use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_breaker::{BreakerHandle, CircuitBreakerLayer};
use tower_classify::HttpClassifier;
use tower_poison::store::{DeadLetterStore, ListQuery};
use tower_poison::{CountAttemptsLayer, DeadLetterEntry, DeadLetterLayer};
use tower_retry_budget::body::ReplayBodyLayer;
use tower_retry_budget::replay::HttpReplay;
use tower_retry_budget::{Backoff, Jitter, RetryLayer};

/// The request type every stack takes.
pub type HttpRequest = Request<Full<Bytes>>;
/// The response type every stack returns: the body read to the end.
pub type HttpResponse = Response<Bytes>;
/// A stack under test, type-erased.
pub type HttpService = BoxCloneSyncService<HttpRequest, HttpResponse, BoxError>;

/// The header every test request carries so that the upstream's log, the
/// caller's results and the dead-letter store can be matched up.
pub const REQUEST_ID: &str = "x-request-id";

/// One answer of the upstream.
#[derive(Debug, Clone)]
pub struct Reply {
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
    delay: Duration,
}

impl Reply {
    /// An answer with `status` and an empty body.
    pub fn status(status: u16) -> Self {
        Reply {
            status: StatusCode::from_u16(status).expect("a valid status code"),
            headers: Vec::new(),
            body: Bytes::new(),
            delay: Duration::ZERO,
        }
    }

    /// `200 OK` with body `ok`.
    pub fn ok() -> Self {
        Reply::status(200).body("ok")
    }

    /// Adds a header.
    pub fn header(mut self, name: &'static str, value: impl AsRef<str>) -> Self {
        self.headers.push((
            HeaderName::from_static(name),
            HeaderValue::from_str(value.as_ref()).expect("a valid header value"),
        ));
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// Answers only after `delay` (the request is logged on arrival).
    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    fn into_response(self) -> AxumResponse {
        let mut response = AxumResponse::new(Body::from(self.body));
        *response.status_mut() = self.status;
        response.headers_mut().extend(self.headers);
        response
    }
}

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// When it arrived (before its body was read).
    pub at: Instant,
    /// The method.
    pub method: Method,
    /// The path and query.
    pub uri: String,
    /// The headers.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
}

impl Seen {
    /// The value of header `name`, if present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The request id ([`REQUEST_ID`]) the caller put on the request.
    pub fn request_id(&self) -> Option<&str> {
        self.header(REQUEST_ID)
    }
}

/// Decides the answer to a request, given the requests received before it.
type Responder = Arc<dyn Fn(&Seen, &[Seen]) -> Reply + Send + Sync>;

struct Shared {
    /// Answers used first, one per request, in order.
    script: VecDeque<Reply>,
    /// The answer once the script is used up.
    responder: Responder,
    /// Every request received, in arrival order.
    log: Vec<Seen>,
}

/// A test upstream: an HTTP server on `127.0.0.1:0` that answers with a
/// script the test controls and records every request.
///
/// It answers any method and path. The server task lives as long as the
/// test's runtime.
#[derive(Clone)]
pub struct Upstream {
    addr: SocketAddr,
    shared: Arc<Mutex<Shared>>,
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upstream")
            .field("addr", &self.addr)
            .field("requests", &self.requests())
            .finish()
    }
}

impl Upstream {
    /// Starts an upstream that answers `200 ok` until told otherwise.
    pub async fn start() -> Self {
        let shared = Arc::new(Mutex::new(Shared {
            script: VecDeque::new(),
            responder: Arc::new(|_, _| Reply::ok()),
            log: Vec::new(),
        }));
        let app = Router::new()
            .fallback(answer)
            .with_state(Arc::clone(&shared));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        tokio::spawn(async move {
            axum::serve(listener, app).await.expect("upstream server");
        });
        Upstream { addr, shared }
    }

    /// The URL of `path` on this upstream (`path` starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The upstream's base URI, `http://127.0.0.1:PORT`.
    pub fn base(&self) -> http::Uri {
        self.url("/").parse().expect("a valid URI")
    }

    /// Answers the next requests with `replies`, one each, before falling
    /// back to the standing answer.
    pub fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        self.lock().script.extend(replies);
    }

    /// From now on (after any script), answers every request with `reply`.
    pub fn always(&self, reply: Reply) {
        self.respond_with(move |_, _| reply.clone());
    }

    /// From now on (after any script), answers each request with
    /// `responder(request, earlier_requests)`.
    pub fn respond_with(
        &self,
        responder: impl Fn(&Seen, &[Seen]) -> Reply + Send + Sync + 'static,
    ) {
        self.lock().responder = Arc::new(responder);
    }

    /// Requests received so far.
    pub fn requests(&self) -> usize {
        self.lock().log.len()
    }

    /// Every request received so far, in arrival order.
    pub fn log(&self) -> Vec<Seen> {
        self.lock().log.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        // A panicking responder poisons the lock; the test has failed anyway,
        // and the log is still worth reading.
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }
}

async fn answer(State(shared): State<Arc<Mutex<Shared>>>, request: AxumRequest) -> AxumResponse {
    let at = Instant::now();
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Reply::status(400).into_response(),
    };
    let seen = Seen {
        at,
        method: parts.method,
        uri: parts
            .uri
            .path_and_query()
            .map_or("/", |pq| pq.as_str())
            .to_owned(),
        headers: parts.headers,
        body,
    };
    let reply = {
        let mut shared = shared.lock().unwrap_or_else(|e| e.into_inner());
        let reply = match shared.script.pop_front() {
            Some(reply) => reply,
            None => (shared.responder)(&seen, &shared.log),
        };
        shared.log.push(seen);
        reply
    };
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    reply.into_response()
}

/// A pooled hyper-util client for requests with body `B` that reads each
/// response body to the end.
pub fn client<B>() -> BoxCloneSyncService<Request<B>, HttpResponse, BoxError>
where
    B: http_body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let client = Client::builder(TokioExecutor::new()).build::<_, B>(HttpConnector::new());
    let service = ServiceBuilder::new()
        .map_err(BoxError::from)
        .service(client)
        .and_then(|response: Response<hyper::body::Incoming>| async move {
            let (parts, body) = response.into_parts();
            let bytes = body.collect().await?.to_bytes();
            Ok::<_, BoxError>(Response::from_parts(parts, bytes))
        });
    BoxCloneSyncService::new(service)
}

/// The largest request body the stacks buffer for replay.
pub const REPLAY_LIMIT: usize = 64 * 1024;

/// The documented order, outermost first:
///
/// ```text
/// DeadLetter → CircuitBreaker → ReplayBody → Retry → CountAttempts → client
/// ```
pub fn default_order<St>(
    dead_letter: DeadLetterLayer<St>,
    breaker: CircuitBreakerLayer<HttpClassifier>,
    retry: RetryLayer<HttpClassifier, HttpReplay>,
) -> HttpService
where
    St: DeadLetterStore,
{
    let stack = ServiceBuilder::new()
        .layer(dead_letter)
        .layer(breaker)
        .layer(ReplayBodyLayer::new(REPLAY_LIMIT))
        .layer(retry)
        .layer(CountAttemptsLayer::new())
        .service(client());
    HttpService::new(stack)
}

/// The other order (Polly's, Resilience4j's), outermost first:
///
/// ```text
/// DeadLetter → ReplayBody → Retry → CircuitBreaker → CountAttempts → client
/// ```
pub fn retry_outside_breaker<St>(
    dead_letter: DeadLetterLayer<St>,
    breaker: CircuitBreakerLayer<HttpClassifier>,
    retry: RetryLayer<HttpClassifier, HttpReplay>,
) -> HttpService
where
    St: DeadLetterStore,
{
    let stack = ServiceBuilder::new()
        .layer(dead_letter)
        .layer(ReplayBodyLayer::new(REPLAY_LIMIT))
        .layer(retry)
        .layer(breaker)
        .layer(CountAttemptsLayer::new())
        .service(client());
    HttpService::new(stack)
}

/// Sends `request` through `stack` once.
pub async fn send(stack: &HttpService, request: HttpRequest) -> Result<HttpResponse, BoxError> {
    stack.clone().oneshot(request).await
}

/// A request `method path` to `upstream` with request id `id` and `body`.
pub fn request(
    upstream: &Upstream,
    method: Method,
    path: &str,
    id: &str,
    body: &str,
) -> HttpRequest {
    Request::builder()
        .method(method)
        .uri(upstream.url(path))
        .header(REQUEST_ID, id)
        .body(Full::new(Bytes::copy_from_slice(body.as_bytes())))
        .expect("a valid request")
}

/// A retry layer for HTTP with `max_retries` retries 20 ms apart (no jitter,
/// so counts and waits are exact), a 5 s deadline for the whole loop and the
/// default retry budget.
pub fn retry(max_retries: u32) -> RetryLayer<HttpClassifier, HttpReplay> {
    RetryLayer::http()
        .max_retries(max_retries)
        .backoff(Backoff::fixed(Duration::from_millis(20)).with_jitter(Jitter::None))
        .deadline(Duration::from_secs(5))
        .build()
        .expect("valid retry settings")
}

/// The name of the breaker [`breaker`] builds.
pub const BREAKER: &str = "upstream";

/// A breaker named [`BREAKER`] that opens after `threshold` consecutive
/// transient failures and admits one probe after `recovery`, with its admin
/// handle.
pub fn breaker(
    threshold: u32,
    recovery: Duration,
) -> (CircuitBreakerLayer<HttpClassifier>, BreakerHandle) {
    let layer = CircuitBreakerLayer::builder()
        .name(BREAKER)
        .failure_threshold(threshold)
        .recovery_timeout(recovery)
        .build(HttpClassifier::new())
        .expect("valid breaker settings");
    let handle = layer.handle();
    (layer, handle)
}

/// A dead-letter layer over `store`, labelled `upstream`.
pub fn dead_letters<St: DeadLetterStore>(store: &St) -> DeadLetterLayer<St> {
    DeadLetterLayer::new(store.clone()).label("upstream")
}

/// Every entry in `store`, in id order (all pages).
pub async fn entries<St: DeadLetterStore>(store: &St) -> Vec<DeadLetterEntry> {
    let mut all = Vec::new();
    let mut query = ListQuery::new().limit(1000);
    loop {
        let page = store.list(query.clone()).await.expect("list entries");
        all.extend(page.entries);
        match page.next {
            Some(next) => query = query.after(next),
            None => return all,
        }
    }
}

/// The stored value of header `name` (lowercase) of `entry`.
pub fn stored_header<'a>(entry: &'a DeadLetterEntry, name: &str) -> Option<&'a str> {
    entry
        .headers
        .iter()
        .find(|h| h.name == name)
        .map(|h| h.value.as_str())
}
