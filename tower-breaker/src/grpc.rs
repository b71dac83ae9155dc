//! The gRPC variant: a failure a server reports in the response *trailers*
//! counts, at the end of the body.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_classify::{BoxError, Classify, FailureKind, GrpcClassifier, Outcome};
use tower_layer::Layer;
use tower_service::Service;

use crate::admin::BreakerHandle;
use crate::future::{Deferred, Recorder, ResponseState, ResponseStateProj};
use crate::layer::CircuitBreakerLayer;
use crate::service::CircuitBreaker;
use crate::state::State;

/// Like [`CircuitBreakerLayer`], but a gRPC call that fails in its trailers
/// counts as the failure it is.
///
/// A gRPC server answers most failures with a `200` head and reports the
/// status in the trailers, after the body. A breaker that classifies only the
/// head sees every such call succeed, so it never opens. This layer's
/// services wrap each response body in a [`GrpcBody`]; when the head leaves
/// the outcome open, the body holds the call's place in the breaker until the
/// body ends, and the trailers' `grpc-status` decides.
///
/// # Rules
///
/// - The classifier judges the head first. Only a head it calls a success,
///   with status `200`, a content type `application/grpc…` and no
///   `grpc-status`, leaves the outcome to the trailers; anything else (a
///   trailers-only response, another status or content type) is settled by
///   the head, and its body passes through with nothing left to do. A
///   `grpc-retry-pushback-ms` in the trailers is read as in a head.
/// - What the body records when it ends, or records nothing when dropped, is
///   listed on [`GrpcBody`].
/// - A half-open probe is judged at its trailers too, so a probe that is a
///   long stream holds its slot while it runs; past
///   [`probe_timeout`](crate::Builder::probe_timeout) it is lapsed like a
///   hung probe: the breaker reopens, and the stream's later `grpc-status: 0`
///   counts for nothing. For long streams (watches, subscriptions), set
///   `probe_timeout` above the longest one, or keep them out of the breaker
///   that guards the unary calls.
/// - A [slow-call threshold](crate::Builder::slow_call_threshold) times the
///   call up to its response head, so a long server stream is not a slow
///   call.
/// - Through tonic, an open circuit reaches the caller as a `tonic::Status`
///   whose `source()` is the `CircuitOpen`, with the code `UNKNOWN` (tonic's
///   for any service error), unless tower-classify's `GrpcStatusLayer` in
///   front of the breaker answers it as `UNAVAILABLE` with
///   `grpc-retry-pushback-ms`.
/// - Retries still decide on the head: once a response has started, gRPC
///   does not retry it (gRFC A6), so a failure in the trailers reaches the
///   breaker, not a retry layer.
///
/// It is opt-in because it changes the response type; the plain layer and
/// [`into_http`](CircuitBreakerLayer::into_http) judge the head and return
/// the inner body as it is.
///
/// The response type is `Response<GrpcBody<B>>` for an inner service
/// answering `Response<B>`, and the error is [`BoxError`] (a
/// [`CircuitOpen`](crate::CircuitOpen) while open), as for
/// [`CircuitBreakerLayer`]. Both fit tonic: a generated client takes a
/// `Channel` wrapped in this layer as its `GrpcService`. A refused request's
/// [`RefusalToken`](tower_classify::RefusalToken), when it carries one, goes
/// into the `CircuitOpen` (see there).
///
/// ```
/// use std::convert::Infallible;
/// use bytes::Bytes;
/// use http::{HeaderMap, Request, Response};
/// use http_body_util::{BodyExt, Full};
/// use tower::{service_fn, Layer, ServiceExt};
/// use tower_breaker::{CircuitBreakerLayer, CircuitOpen, State};
/// use tower_classify::{BoxError, GrpcClassifier};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// let layer = CircuitBreakerLayer::builder()
///     .failure_threshold(2)
///     .build(GrpcClassifier::new())?
///     .into_grpc();
/// // Every call: `200`, one message, then trailers `grpc-status: 14`.
/// let service = layer.layer(service_fn(|_req: Request<()>| async {
///     let mut trailers = HeaderMap::new();
///     trailers.insert("grpc-status", "14".parse().unwrap());
///     let body = Full::new(Bytes::from_static(b"\0\0\0\0\0"))
///         .with_trailers(async move { Some(Ok::<_, Infallible>(trailers)) });
///     let response = Response::builder().header("content-type", "application/grpc");
///     Ok::<_, BoxError>(response.body(body)?)
/// }));
///
/// for _ in 0..2 {
///     let response = service.clone().oneshot(Request::new(())).await?;
///     assert_eq!(response.status(), 200);
///     // Recorded when the body ends, from its trailers.
///     response.into_body().collect().await?;
/// }
/// assert_eq!(service.state(), State::Open);
/// let refused = service.clone().oneshot(Request::new(())).await.err();
/// assert!(refused.is_some_and(|err| err.is::<CircuitOpen>()));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct GrpcCircuitBreakerLayer<C> {
    inner: CircuitBreakerLayer<C>,
}

impl<C: fmt::Debug> fmt::Debug for GrpcCircuitBreakerLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcCircuitBreakerLayer")
            .field("inner", &self.inner)
            .finish()
    }
}

impl<C> CircuitBreakerLayer<C> {
    /// The same breaker (same shared state), also judging gRPC calls by the
    /// `grpc-status` in their trailers; responses become
    /// `Response<GrpcBody<B>>`.
    pub fn into_grpc(self) -> GrpcCircuitBreakerLayer<C> {
        GrpcCircuitBreakerLayer { inner: self }
    }
}

impl<C> GrpcCircuitBreakerLayer<C> {
    /// The admin handle of this layer's breaker.
    pub fn handle(&self) -> BreakerHandle {
        self.inner.handle()
    }
}

impl<S, C: Clone> Layer<S> for GrpcCircuitBreakerLayer<C> {
    type Service = GrpcCircuitBreaker<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcCircuitBreaker {
            inner: self.inner.layer(inner),
        }
    }
}

/// A service guarded by a circuit breaker that reads gRPC trailers; see
/// [`GrpcCircuitBreakerLayer`].
#[derive(Clone)]
pub struct GrpcCircuitBreaker<S, C> {
    inner: CircuitBreaker<S, C>,
}

impl<S: fmt::Debug, C: fmt::Debug> fmt::Debug for GrpcCircuitBreaker<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcCircuitBreaker")
            .field("inner", &self.inner)
            .finish()
    }
}

impl<S, C> GrpcCircuitBreaker<S, C> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        self.inner.get_ref()
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        self.inner.get_mut()
    }

    /// The inner service, consuming the breaker.
    pub fn into_inner(self) -> S {
        self.inner.into_inner()
    }

    /// The breaker's current state.
    pub fn state(&self) -> State {
        self.inner.state()
    }
}

impl<S, C, ReqB, B> Service<Request<ReqB>> for GrpcCircuitBreaker<S, C>
where
    S: Service<Request<ReqB>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    C: Classify<Response<B>, BoxError> + Clone,
    B: Body,
{
    type Response = Response<GrpcBody<B>>;
    type Error = BoxError;
    type Future = GrpcResponseFuture<S::Future, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready_with(cx, |inner, cx| inner.poll_ready(cx).map_err(Into::into))
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        match self.inner.admit() {
            Ok(permit) => {
                let recorder = permit.map(|p| Recorder::new(p, self.inner.classifier().clone()));
                GrpcResponseFuture {
                    state: ResponseState::Called {
                        future: self.inner.inner_mut().call(req),
                    },
                    recorder,
                }
            }
            Err(open) => GrpcResponseFuture {
                state: ResponseState::Rejected {
                    error: Some(Box::new(open.refusing(req.extensions().get().copied()))),
                },
                recorder: None,
            },
        }
    }
}

pin_project! {
    /// Response future of [`GrpcCircuitBreaker`].
    ///
    /// An error is recorded when it arrives, and so is a response whose head
    /// settles the outcome; otherwise the call's permit moves into the
    /// response's [`GrpcBody`]. Dropping the future first records nothing,
    /// as for [`ResponseFuture`](crate::future::ResponseFuture).
    pub struct GrpcResponseFuture<F, C> {
        #[pin]
        state: ResponseState<F>,
        recorder: Option<Recorder<C>>,
    }
}

impl<F, C, B, E> Future for GrpcResponseFuture<F, C>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
    C: Classify<Response<B>, BoxError>,
    B: Body,
{
    type Output = Result<Response<GrpcBody<B>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            ResponseStateProj::Called { future } => {
                let result = ready!(future.poll(cx));
                let Some(mut recorder) = this.recorder.take() else {
                    return Poll::Ready(
                        result.map(|r| r.map(GrpcBody::settled)).map_err(Into::into),
                    );
                };
                match result {
                    Ok(response) => Poll::Ready(Ok(settle(response, recorder))),
                    Err(err) => {
                        let err: BoxError = err.into();
                        recorder.record::<Response<B>, _>(Err(&err));
                        Poll::Ready(Err(err))
                    }
                }
            }
            ResponseStateProj::Rejected { error } => Poll::Ready(Err(error
                .take()
                .expect("GrpcResponseFuture polled after completion"))),
        }
    }
}

impl<F, C> fmt::Debug for GrpcResponseFuture<F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            ResponseState::Called { .. } => "called",
            ResponseState::Rejected { .. } => "rejected",
        };
        f.debug_struct("GrpcResponseFuture")
            .field("state", &state)
            .field("recorder", &self.recorder)
            .finish()
    }
}

/// Records what the head of `response` settles, or hands the permit to its
/// body when only the trailers can.
fn settle<B, C>(response: Response<B>, mut recorder: Recorder<C>) -> Response<GrpcBody<B>>
where
    B: Body,
    C: Classify<Response<B>, BoxError>,
{
    let outcome = recorder.classify::<_, BoxError>(Ok(&response));
    if !(outcome.is_success() && GrpcClassifier::status_in_trailers(&response)) {
        recorder.complete(outcome);
        return response.map(GrpcBody::settled);
    }
    if response.body().is_end_stream() {
        // Over before it began: no trailers will come.
        recorder.complete(GrpcClassifier::classify_end_of_stream(None));
        return response.map(GrpcBody::settled);
    }
    let deferred = recorder.defer();
    response.map(|body| GrpcBody {
        inner: body,
        awaiting: Some(deferred),
    })
}

pin_project! {
    /// The response body of a [`GrpcCircuitBreaker`]: the inner body, passed
    /// through frame by frame as each arrives (nothing is buffered or read
    /// ahead; `size_hint` and `is_end_stream` are the inner body's).
    ///
    /// When the response head left the outcome open (a `200` gRPC response
    /// without `grpc-status`), the body holds the call's place in the breaker
    /// until it ends, and records:
    ///
    /// - the `grpc-status` of its trailers, classified by
    ///   [`GrpcClassifier::classify_end_of_stream`]: `0` a success, `14
    ///   UNAVAILABLE` a server error that counts towards opening, and so on;
    /// - a body that ends without `grpc-status`: `UNKNOWN`, a server error
    ///   (the protocol requires the status; tonic reports `UNKNOWN` too);
    /// - a body error (a reset stream): a [connection](FailureKind::Connection)
    ///   failure.
    ///
    /// Dropped before its end (the client cancelled), it records nothing and
    /// a half-open probe's slot is given back, as for a dropped response
    /// future; [`into_inner`](Self::into_inner) before the end does the same.
    pub struct GrpcBody<B> {
        #[pin]
        inner: B,
        awaiting: Option<Deferred>,
    }
}

impl<B> GrpcBody<B> {
    /// A body whose outcome is already recorded (or never will be).
    fn settled(inner: B) -> Self {
        GrpcBody {
            inner,
            awaiting: None,
        }
    }

    /// The inner body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// The inner body, giving up on recording its trailers (nothing is
    /// recorded, as for a body dropped before its end).
    pub fn into_inner(self) -> B {
        self.inner
    }

    /// `true` while the call's outcome waits for this body's trailers.
    pub fn awaits_trailers(&self) -> bool {
        self.awaiting.is_some()
    }
}

impl<B: Body> Body for GrpcBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        if this.awaiting.is_some() {
            let outcome = match &frame {
                Some(Ok(frame)) => match frame.trailers_ref() {
                    Some(trailers) => Some(GrpcClassifier::classify_end_of_stream(Some(trailers))),
                    // The last data frame of a body without trailers: its
                    // reader may never poll again to see the end.
                    None if this.inner.is_end_stream() => {
                        Some(GrpcClassifier::classify_end_of_stream(None))
                    }
                    None => None,
                },
                Some(Err(_)) => Some(Outcome::failure(FailureKind::Connection)),
                None => Some(GrpcClassifier::classify_end_of_stream(None)),
            };
            if let Some(outcome) = outcome {
                if let Some(deferred) = this.awaiting.take() {
                    deferred.complete(outcome);
                }
            }
        }
        Poll::Ready(frame)
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: fmt::Debug> fmt::Debug for GrpcBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcBody")
            .field("inner", &self.inner)
            .field("awaits_trailers", &self.awaits_trailers())
            .finish()
    }
}
