//! Replayable `http::Request` bodies.
//!
//! A streaming body (hyper's `Incoming`, axum's `Body`) can be read only once,
//! so a request carrying one cannot be retried as it is. [`ReplayBodyLayer`]
//! reads each request body into memory **up to a byte limit** and hands the
//! service below a [`ReplayBody`]:
//!
//! - a body that ends within the limit is kept whole (data and trailers) and
//!   can be copied for every retry;
//! - a bigger body is *not* truncated: the chunks already read are sent first,
//!   followed by the rest of the stream, and the request is sent exactly once
//!   (its [`TryCloneBody`] returns `None`, so the retry layer does not retry it).
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
//!     .layer(RetryLayer::http().backoff(Backoff::none()).build()?)
//!     .service(client);
//!
//! let request = http::Request::put("/doc").body(Full::new(Bytes::from("v2")))?;
//! let response = service.ready().await?.call(request).await?;
//! assert_eq!(response.status(), 200);
//! assert_eq!(*seen.lock().unwrap(), ["v2", "v2"]);
//! # Ok(()) }
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, Request};
use http_body::{Body, Frame, SizeHint};
use tower_classify::BoxError;
use tower_layer::Layer;
use tower_service::Service;

/// A request body whose copies can be sent again.
///
/// Implemented for bodies already in memory and for [`ReplayBody`]. `None`
/// means "this body cannot be sent twice": the request gets one attempt.
pub trait TryCloneBody: Sized {
    /// A copy of the whole body, not yet read.
    fn try_clone_body(&self) -> Option<Self>;
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

impl<D: Buf + Clone> TryCloneBody for http_body_util::Full<D> {
    fn try_clone_body(&self) -> Option<Self> {
        Some(self.clone())
    }
}

impl<D> TryCloneBody for http_body_util::Empty<D> {
    fn try_clone_body(&self) -> Option<Self> {
        Some(http_body_util::Empty::new())
    }
}

/// A request body read into memory up to a limit; see the [module docs](self).
pub struct ReplayBody<B> {
    kind: Kind<B>,
}

enum Kind<B> {
    /// The whole body; `next` is what `poll_frame` yields next.
    Buffered {
        data: Bytes,
        trailers: Option<HeaderMap>,
        next: Next,
    },
    /// More than the limit: the chunks read so far, then the rest, once.
    Streaming {
        prefix: VecDeque<Bytes>,
        rest: Pin<Box<B>>,
    },
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Next {
    Data,
    Trailers,
    End,
}

impl<B> ReplayBody<B> {
    /// A replayable body of `data`.
    pub fn buffered(data: impl Into<Bytes>) -> Self {
        ReplayBody {
            kind: Kind::Buffered {
                data: data.into(),
                trailers: None,
                next: Next::Data,
            },
        }
    }

    /// `true` when the whole body is in memory, so it can be replayed.
    pub fn is_buffered(&self) -> bool {
        matches!(self.kind, Kind::Buffered { .. })
    }
}

impl<B> ReplayBody<B>
where
    B: Body,
{
    /// Reads `body` into memory if it is at most `limit` bytes long.
    ///
    /// A body longer than that is returned as a one-shot stream of what was
    /// read followed by the rest: nothing is dropped. A body whose size hint
    /// already says it is longer is not read at all.
    pub async fn buffer(body: B, limit: usize) -> Result<Self, B::Error> {
        let mut body = Box::pin(body);
        let mut chunks = VecDeque::new();
        if body.size_hint().lower() > limit as u64 {
            return Ok(Self::streaming(chunks, body));
        }
        let mut len = 0usize;
        let mut trailers = None;
        while let Some(frame) = poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            match frame?.into_data() {
                Ok(mut data) => {
                    let bytes = data.copy_to_bytes(data.remaining());
                    len = len.saturating_add(bytes.len());
                    chunks.push_back(bytes);
                    if len > limit {
                        return Ok(Self::streaming(chunks, body));
                    }
                }
                Err(frame) => {
                    if let Ok(map) = frame.into_trailers() {
                        trailers = Some(map);
                    }
                }
            }
        }
        let data = match chunks.len() {
            0 => Bytes::new(),
            1 => chunks.pop_front().unwrap_or_default(),
            _ => {
                let mut all = BytesMut::with_capacity(len);
                chunks.iter().for_each(|chunk| all.extend_from_slice(chunk));
                all.freeze()
            }
        };
        Ok(ReplayBody {
            kind: Kind::Buffered {
                data,
                trailers,
                next: Next::Data,
            },
        })
    }

    fn streaming(prefix: VecDeque<Bytes>, rest: Pin<Box<B>>) -> Self {
        ReplayBody {
            kind: Kind::Streaming { prefix, rest },
        }
    }
}

impl<B> TryCloneBody for ReplayBody<B> {
    fn try_clone_body(&self) -> Option<Self> {
        match &self.kind {
            Kind::Buffered { data, trailers, .. } => Some(ReplayBody {
                kind: Kind::Buffered {
                    data: data.clone(),
                    trailers: trailers.clone(),
                    next: Next::Data,
                },
            }),
            Kind::Streaming { .. } => None,
        }
    }
}

impl<B> Body for ReplayBody<B>
where
    B: Body,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match &mut self.get_mut().kind {
            Kind::Buffered {
                data,
                trailers,
                next,
            } => {
                if *next == Next::Data {
                    *next = Next::Trailers;
                    if !data.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(data.clone()))));
                    }
                }
                if *next == Next::Trailers {
                    *next = Next::End;
                    if let Some(trailers) = trailers.clone() {
                        return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                    }
                }
                Poll::Ready(None)
            }
            Kind::Streaming { prefix, rest } => {
                if let Some(chunk) = prefix.pop_front() {
                    return Poll::Ready(Some(Ok(Frame::data(chunk))));
                }
                rest.as_mut().poll_frame(cx).map(|frame| {
                    frame.map(|frame| {
                        frame.map(|f| f.map_data(|mut d| d.copy_to_bytes(d.remaining())))
                    })
                })
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Buffered {
                next,
                data,
                trailers,
            } => match next {
                Next::Data => data.is_empty() && trailers.is_none(),
                Next::Trailers => trailers.is_none(),
                Next::End => true,
            },
            Kind::Streaming { prefix, rest } => prefix.is_empty() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Buffered { data, next, .. } => SizeHint::with_exact(if *next == Next::Data {
                data.len() as u64
            } else {
                0
            }),
            Kind::Streaming { prefix, rest } => {
                let buffered: u64 = prefix.iter().map(|c| c.len() as u64).sum();
                let rest = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower().saturating_add(buffered));
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper.saturating_add(buffered));
                }
                hint
            }
        }
    }
}

impl<B> fmt::Debug for ReplayBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Buffered { data, trailers, .. } => f
                .debug_struct("ReplayBody::Buffered")
                .field("len", &data.len())
                .field("trailers", &trailers.is_some())
                .finish(),
            Kind::Streaming { prefix, .. } => f
                .debug_struct("ReplayBody::Streaming")
                .field("prefix_chunks", &prefix.len())
                .finish(),
        }
    }
}

/// Buffers request bodies up to `limit` bytes so the retry layer below can
/// replay them; see the [module docs](self).
#[derive(Debug, Clone, Copy)]
pub struct ReplayBodyLayer {
    limit: usize,
}

impl ReplayBodyLayer {
    /// Buffers bodies of at most `limit` bytes.
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
    S: Service<Request<ReplayBody<B>>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    // Boxed: reading a body already costs far more than one allocation, and a
    // hand-written state machine here would only hide that.
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The readied service goes with the request; a fresh clone stays.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limit = self.limit;
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let body = ReplayBody::buffer(body, limit).await.map_err(Into::into)?;
            inner
                .call(Request::from_parts(parts, body))
                .await
                .map_err(Into::into)
        })
    }
}
