//! A scripted upstream for the examples and the integration tests: an HTTP
//! server on 127.0.0.1 that answers from a queue of replies you push, then
//! with a standing answer, and records every request it receives.
//!
//! The demo's [`FlakyUpstream`](crate::upstream::FlakyUpstream) goes through
//! timed phases; an example or a test needs exact control instead ("fail the
//! next two calls, then answer 200"), so that what it prints or asserts is the
//! same on every run.
//!
//! ```
//! use examples::client::http_client;
//! use examples::scripted::{Reply, ScriptedServer};
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower::BoxError> {
//! let server = ScriptedServer::start().await?;
//! server
//!     .then(1, Reply::status(503).header("retry-after", "1"))
//!     .otherwise(Reply::ok("fine"));
//!
//! let get = |path: &str| {
//!     http::Request::get(format!("{}{path}", server.url()))
//!         .body(http_body_util::Full::default())
//! };
//! let first = http_client().oneshot(get("/a")?).await?;
//! let second = http_client().oneshot(get("/b")?).await?;
//! assert_eq!(first.status(), 503);
//! assert_eq!(first.headers()["retry-after"], "1");
//! assert_eq!((second.status().as_u16(), &second.body()[..]), (200, &b"fine"[..]));
//!
//! let received = server.received();
//! assert_eq!(server.hits(), 2);
//! assert_eq!(received[1].uri, "/b");
//! assert!(received[1].at >= received[0].at);
//! # Ok(())
//! # }
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// One answer of the scripted server.
#[derive(Debug, Clone)]
pub struct Reply {
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
    delay: Duration,
}

impl Reply {
    /// An answer with `status` and an empty body.
    ///
    /// # Panics
    ///
    /// When `status` is not a valid HTTP status code.
    pub fn status(status: u16) -> Self {
        Reply {
            status: StatusCode::from_u16(status).expect("a valid status code"),
            headers: Vec::new(),
            body: Bytes::new(),
            delay: Duration::ZERO,
        }
    }

    /// `200 OK` with `body`.
    pub fn ok(body: impl Into<Bytes>) -> Self {
        Reply::status(200).body(body)
    }

    /// Adds a header.
    ///
    /// # Panics
    ///
    /// When `name` or `value` is not a valid header name or value.
    pub fn header(mut self, name: &str, value: impl AsRef<str>) -> Self {
        self.headers.push((
            HeaderName::from_bytes(name.as_bytes()).expect("a valid header name"),
            HeaderValue::from_str(value.as_ref()).expect("a valid header value"),
        ));
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// Answers only `delay` after the request arrived, to play a slow or
    /// hanging upstream. The request is recorded on arrival all the same.
    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    fn into_response(self) -> Response {
        let mut response = Response::new(Body::from(self.body));
        *response.status_mut() = self.status;
        response.headers_mut().extend(self.headers);
        response
    }
}

/// A request the scripted server received.
#[derive(Debug, Clone)]
pub struct Received {
    /// The method.
    pub method: Method,
    /// The URI as the request line had it: path and query.
    pub uri: Uri,
    /// The headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
    /// When it arrived (before its body was read).
    pub at: Instant,
}

impl Received {
    /// The value of header `name`, if present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Decides an answer from the request and the requests received before it.
type Responder = Arc<dyn Fn(&Received, &[Received]) -> Reply + Send + Sync>;

struct Script {
    /// Answers used first, one per request, in order.
    queue: VecDeque<Reply>,
    /// The answer once the queue is used up.
    responder: Responder,
    /// Every request received, in arrival order.
    received: Vec<Received>,
}

/// A running scripted server.
///
/// It answers any method and path. Clones share the server, its script and
/// its record; the server stops once the last clone is dropped.
#[derive(Clone)]
pub struct ScriptedServer {
    addr: SocketAddr,
    script: Arc<Mutex<Script>>,
    // Dropping the sender (with the last clone) ends the server task.
    _shutdown: Arc<oneshot::Sender<()>>,
}

impl fmt::Debug for ScriptedServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let script = self.lock();
        f.debug_struct("ScriptedServer")
            .field("addr", &self.addr)
            .field("queued", &script.queue.len())
            .field("hits", &script.received.len())
            .finish_non_exhaustive()
    }
}

impl ScriptedServer {
    /// Starts the server on a free port of 127.0.0.1. Until told otherwise it
    /// answers every request with `200 OK` and the body `ok`.
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let script = Arc::new(Mutex::new(Script {
            queue: VecDeque::new(),
            responder: Arc::new(|_, _| Reply::ok("ok")),
            received: Vec::new(),
        }));
        let app = Router::new().fallback(answer).with_state(script.clone());
        let shutdown = serve_until_dropped(listener, app);
        Ok(ScriptedServer {
            addr,
            script,
            _shutdown: Arc::new(shutdown),
        })
    }

    /// `http://127.0.0.1:PORT`, to which callers append a path.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The base URI, `http://127.0.0.1:PORT/`: its authority names the
    /// server (a key for per-host layers); a replay can take it as its
    /// destination.
    pub fn uri(&self) -> Uri {
        format!("http://{}/", self.addr)
            .parse()
            .expect("a socket address makes a valid URI")
    }

    /// Answers the next `times` requests with `reply` (after the replies
    /// already queued).
    pub fn then(&self, times: usize, reply: Reply) -> &Self {
        self.script(std::iter::repeat_n(reply, times))
    }

    /// Answers the next requests with `replies`, one each, in order (after
    /// the replies already queued).
    pub fn script(&self, replies: impl IntoIterator<Item = Reply>) -> &Self {
        self.lock().queue.extend(replies);
        self
    }

    /// Answers with `reply` once the queued replies are used up.
    pub fn otherwise(&self, reply: Reply) -> &Self {
        self.respond_with(move |_, _| reply.clone())
    }

    /// Once the queued replies are used up, answers each request with
    /// `responder(request, earlier_requests)`, for answers that depend on the
    /// request (its path, a header, whether it was seen before).
    ///
    /// A panic in `responder` leaves that request without an answer; the
    /// record stays readable.
    pub fn respond_with(
        &self,
        responder: impl Fn(&Received, &[Received]) -> Reply + Send + Sync + 'static,
    ) -> &Self {
        self.lock().responder = Arc::new(responder);
        self
    }

    /// The number of requests received so far.
    pub fn hits(&self) -> usize {
        self.lock().received.len()
    }

    /// Every request received so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.lock().received.clone()
    }

    fn lock(&self) -> MutexGuard<'_, Script> {
        lock(&self.script)
    }
}

fn lock(script: &Mutex<Script>) -> MutexGuard<'_, Script> {
    // A panicking responder poisons the lock; the caller has failed anyway,
    // and the record is still worth reading.
    script.lock().unwrap_or_else(|p| p.into_inner())
}

async fn answer(State(script): State<Arc<Mutex<Script>>>, request: Request) -> Response {
    let at = Instant::now();
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return StatusCode::BAD_REQUEST.into_response(),
    };
    let received = Received {
        method: parts.method,
        uri: parts.uri,
        headers: parts.headers,
        body,
        at,
    };
    let reply = {
        let mut script = lock(&script);
        let reply = match script.queue.pop_front() {
            Some(reply) => reply,
            None => (script.responder)(&received, &script.received),
        };
        script.received.push(received);
        reply
    };
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    reply.into_response()
}

/// Serves `app` on `listener` in a background task until the returned sender
/// is dropped: a test server lives exactly as long as its handle.
pub(crate) fn serve_until_dropped(listener: TcpListener, app: Router) -> oneshot::Sender<()> {
    let (shutdown, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await;
    });
    shutdown
}
