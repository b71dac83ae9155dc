//! A scripted upstream for the examples: an HTTP server on 127.0.0.1 that
//! answers from a queue of replies you push, then with a fallback reply, and
//! records every request it receives.
//!
//! The demo's [`FlakyUpstream`](crate::upstream::FlakyUpstream) goes through
//! timed phases; an example needs exact control instead ("fail the next two
//! calls, then answer 200"), so that what it prints is the same on every run.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

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
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((
            HeaderName::from_bytes(name.as_bytes()).expect("a valid header name"),
            HeaderValue::from_str(value).expect("a valid header value"),
        ));
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }
}

/// A request the scripted server received.
#[derive(Debug, Clone)]
pub struct Received {
    /// The method.
    pub method: Method,
    /// The URI (path and query).
    pub uri: Uri,
    /// The headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
    /// When it arrived.
    pub at: Instant,
}

#[derive(Debug)]
struct Script {
    queue: VecDeque<Reply>,
    fallback: Reply,
    received: Vec<Received>,
}

/// A running scripted server. Dropping it stops the server.
#[derive(Debug)]
pub struct ScriptedServer {
    addr: SocketAddr,
    script: Arc<Mutex<Script>>,
    _shutdown: oneshot::Sender<()>,
}

impl ScriptedServer {
    /// Starts the server on a free port of 127.0.0.1. Until told otherwise it
    /// answers every request with `200 OK` and the body `ok`.
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let script = Arc::new(Mutex::new(Script {
            queue: VecDeque::new(),
            fallback: Reply::ok("ok"),
            received: Vec::new(),
        }));
        let app = Router::new().fallback(answer).with_state(script.clone());
        let (shutdown, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(ScriptedServer {
            addr,
            script,
            _shutdown: shutdown,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Answers the next `times` requests with `reply` (after the replies
    /// already queued).
    pub fn then(&self, times: usize, reply: Reply) -> &Self {
        let mut script = self.lock();
        script.queue.extend(std::iter::repeat_n(reply, times));
        drop(script);
        self
    }

    /// Answers with `reply` once the queued replies are used up.
    pub fn otherwise(&self, reply: Reply) -> &Self {
        self.lock().fallback = reply;
        self
    }

    /// The number of requests received so far.
    pub fn hits(&self) -> usize {
        self.lock().received.len()
    }

    /// Every request received so far, in order.
    pub fn received(&self) -> Vec<Received> {
        self.lock().received.clone()
    }

    fn lock(&self) -> MutexGuard<'_, Script> {
        self.script.lock().unwrap_or_else(|p| p.into_inner())
    }
}

async fn answer(State(script): State<Arc<Mutex<Script>>>, request: Request) -> Response {
    let at = Instant::now();
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return StatusCode::BAD_REQUEST.into_response(),
    };
    let reply = {
        let mut script = script.lock().unwrap_or_else(|p| p.into_inner());
        script.received.push(Received {
            method: parts.method,
            uri: parts.uri,
            headers: parts.headers,
            body,
            at,
        });
        script
            .queue
            .pop_front()
            .unwrap_or_else(|| script.fallback.clone())
    };
    let mut response = Response::new(Body::from(reply.body));
    *response.status_mut() = reply.status;
    response.headers_mut().extend(reply.headers);
    response
}
