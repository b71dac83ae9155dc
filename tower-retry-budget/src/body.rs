//! Replayable `http::Request` bodies.
//!
//! A streaming body (hyper's `Incoming`, axum's `Body`, tonic's) can be read
//! only once, so a request carrying one cannot be retried as it is.
//! [`ReplayBodyLayer`] wraps each request body in a [`ReplayBody`] (from
//! [`http_body_replay`]) and reads **nothing ahead**:
//!
//! - the first attempt receives each frame as the client sends it, while the
//!   body records it (refcounted `Bytes`) up to a byte limit;
//! - a retry replays the recording, then continues the original where the
//!   previous attempt stopped;
//! - a body that grows past the limit stops being recorded: the attempt
//!   reading it carries on, and its result, whatever it is, goes back to the
//!   caller as it is; a `Content-Length` above the limit records nothing.
//!
//! A [`DeadLetterLayer`](https://docs.rs/tower-poison) above the retry layer
//! already hands the services below it a `ReplayBody`; the retry layer
//! replays that one, and no `ReplayBodyLayer` is needed.
//!
//! ```
//! use bytes::Bytes;
//! use http_body_util::{BodyExt, Full};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_retry_budget::{backoff::Backoff, body::{ReplayBody, ReplayBodyLayer}, RetryLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_classify::BoxError> {
//! let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
//! let log = seen.clone();
//! // Answers 503 the first time, 200 after; records every body it receives.
//! let client = tower::service_fn(move |req: http::Request<ReplayBody<Full<Bytes>>>| {
//!     let log = log.clone();
//!     async move {
//!         let body = req.into_body().collect().await?.to_bytes();
//!         let mut log = log.lock().unwrap();
//!         log.push(body);
//!         let status = if log.len() == 1 { 503 } else { 200 };
//!         Ok::<_, tower_classify::BoxError>(http::Response::builder().status(status).body(()).unwrap())
//!     }
//! });
//! let mut service = ServiceBuilder::new()
//!     .layer(ReplayBodyLayer::new(64 * 1024))
//!     .layer(RetryLayer::http_builder().backoff(Backoff::none()).build()?)
//!     .service(client);
//!
//! let request = http::Request::put("/doc").body(Full::new(Bytes::from("v2")))?;
//! let response = service.ready().await?.call(request).await?;
//! assert_eq!(response.status(), 200);
//! assert_eq!(*seen.lock().unwrap(), ["v2", "v2"]);
//! # Ok(()) }
//! ```
//!
//! # tonic
//!
//! A tonic `Channel` takes `http::Request<tonic::body::Body>`. Wrap the body
//! above the retry layer and convert it back below it: client- and
//! bidi-streaming calls keep streaming, each message reaching the server as
//! it is sent. Classify with [`GrpcClassifier`](tower_classify::GrpcClassifier)
//! (`grpc-status`, `grpc-retry-pushback-ms`). Every gRPC call is a POST, so
//! opt in explicitly for methods that are safe to repeat (gRPC's own retry
//! policy is per method, too), or let a gRPC service config choose per
//! method (`service_config`, feature `grpc-service-config`).
//! `examples/examples/tonic_client.rs` in the repository runs this stack
//! against a tonic server.
//!
//! ```
//! use tower::ServiceBuilder;
//! use tower_retry_budget::body::{ReplayBody, ReplayBodyLayer};
//! use tower_retry_budget::RetryLayer;
//! # fn main() -> Result<(), tower_classify::BoxError> {
//! # // A stand-in for a `tonic::transport::Channel`.
//! # let channel = tower::service_fn(|_req: http::Request<tonic::body::Body>| async {
//! #     Ok::<_, std::io::Error>(http::Response::new(tonic::body::Body::default()))
//! # });
//!
//! let retry = RetryLayer::http_builder()
//!     .classifier(tower_classify::GrpcClassifier::new())
//!     .map_replay(|replay| {
//!         replay
//!             .retry_non_idempotent(true)
//!             .attempt_header(http::HeaderName::from_static("grpc-previous-rpc-attempts"))
//!     })
//!     .build()?;
//! let channel = ServiceBuilder::new()
//!     .layer(ReplayBodyLayer::new(64 * 1024))
//!     .layer(retry)
//!     .map_request(|r: http::Request<ReplayBody<tonic::body::Body>>| r.map(tonic::body::Body::new))
//!     .service(channel);
//! # drop(channel);
//! # Ok(()) }
//! ```

use std::task::{Context, Poll};

use bytes::Bytes;
use http::Request;
use http_body::Body;
use tower_layer::Layer;
use tower_service::Service;

pub use http_body_replay::{ReplayBody, ReplayError, ReplayErrorKind};

/// A request body whose copies can be sent again.
///
/// Implemented for bodies already in memory and for [`ReplayBody`].
#[diagnostic::on_unimplemented(
    message = "the request body `{Self}` cannot be sent again by a retry",
    label = "a streaming body is read once",
    note = "put `ReplayBodyLayer` (or a dead-letter layer, which hands on a `ReplayBody`) in front of the retry layer, so the body is recorded as it streams and replayed from the recording"
)]
pub trait TryCloneBody: Sized {
    /// A copy of the whole body, not yet read; `None` when this body cannot
    /// be sent twice (the request then gets one attempt).
    fn try_clone_body(&self) -> Option<Self>;

    /// Whether a copy made earlier can still be sent whole. Asked after an
    /// attempt, before a retry: a [`ReplayBody`] that outgrew its limit
    /// during the attempt says `false`. In-memory bodies always can.
    fn can_replay(&self) -> bool {
        true
    }

    /// Whether [`can_replay`](Self::can_replay) may yet turn `false`, a
    /// copy made earlier still reading the body from its source: for a
    /// [`ReplayBody`], while a copy that read from the original is alive
    /// and the original has not ended, recorded whole. In-memory bodies
    /// never are.
    fn still_streaming(&self) -> bool {
        false
    }
}

macro_rules! clone_body {
    ($($ty:ty),*) => {$(
        impl TryCloneBody for $ty {
            fn try_clone_body(&self) -> Option<Self> {
                Some(self.clone())
            }
        }
    )*};
}

clone_body!((), Bytes, String, Vec<u8>, &'static str);

impl<D: bytes::Buf + Clone> TryCloneBody for http_body_util::Full<D> {
    fn try_clone_body(&self) -> Option<Self> {
        Some(self.clone())
    }
}

impl<D> TryCloneBody for http_body_util::Empty<D> {
    fn try_clone_body(&self) -> Option<Self> {
        Some(http_body_util::Empty::new())
    }
}

impl<B> TryCloneBody for ReplayBody<B> {
    fn try_clone_body(&self) -> Option<Self> {
        // Cheap (one `Arc`): the copy is made before the attempt reads the
        // body and only becomes a retry if `can_replay` still holds then.
        self.can_replay().then(|| self.clone())
    }

    fn can_replay(&self) -> bool {
        ReplayBody::can_replay(self)
    }

    fn still_streaming(&self) -> bool {
        // An idle copy (a dead-letter layer's above) never reads from the
        // original; most failed attempts drop theirs, and the count, asked
        // first, spares them the recording's snapshot.
        self.copies_reading() > 0 && self.can_replay() && !self.recording().is_complete()
    }
}

/// Wraps request bodies in a [`ReplayBody`] recording up to `limit` bytes,
/// so the retry layer below can replay them; see the [module docs](self).
#[derive(Debug, Clone, Copy)]
pub struct ReplayBodyLayer {
    limit: usize,
}

impl ReplayBodyLayer {
    /// Records (and so replays) bodies of at most `limit` bytes.
    pub const fn new(limit: usize) -> Self {
        ReplayBodyLayer { limit }
    }
}

impl<S> Layer<S> for ReplayBodyLayer {
    type Service = ReplayBodyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ReplayBodyService {
            inner,
            limit: self.limit,
        }
    }
}

/// The service made by [`ReplayBodyLayer`].
#[derive(Debug, Clone)]
pub struct ReplayBodyService<S> {
    inner: S,
    limit: usize,
}

impl<S> ReplayBodyService<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming `self`.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B> Service<Request<B>> for ReplayBodyService<S>
where
    S: Service<Request<ReplayBody<B>>>,
    B: Body + Unpin,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, request: Request<B>) -> Self::Future {
        let limit = self.limit;
        self.inner
            .call(request.map(|body| ReplayBody::new(body, limit)))
    }
}
