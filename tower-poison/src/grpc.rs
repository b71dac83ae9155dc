//! The gRPC variant: a call that fails in its response *trailers* is
//! dead-lettered when its body ends.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::{HeaderMap, Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_replay::ReplayBody;
use pin_project_lite::pin_project;
use tower_classify::{BoxError, Classify, FailureKind, GrpcClassifier, Outcome};
use tower_layer::Layer;
use tower_service::Service;

use crate::attempts::{tallied, Attempts, Tallied};
use crate::capture::{BodyRecording, CaptureRequest, HttpCapture, PendingRecord, BODY_WAIT};
use crate::entry::error_chain;
use crate::layer::DeadLetterLayer;
use crate::poison::{Admission, Counted, Decision};
use crate::service::{DeadLetter, Failed, Shared};
use crate::store::DeadLetterStore;

/// Like [`DeadLetterLayer`], but a gRPC call that fails in its trailers is
/// dead-lettered too, with the trailers' status.
///
/// A gRPC server answers most failures with a `200` head and puts
/// `grpc-status` in the trailers, after the body: a layer that classifies
/// only the head sees them succeed. This layer's services wrap each response
/// body in a [`GrpcBody`]. When the head leaves the outcome open
/// ([`GrpcClassifier::status_in_trailers`]), the body passes every frame
/// through as it arrives and, at its end, classifies the trailers with
/// [`GrpcClassifier::classify_end_of_stream`]:
///
/// - a failure status is written to the store as an entry whose error reads
///   `grpc-status 14: <grpc-message>`, *before* the trailers reach the
///   caller; if the store cannot write, the caller gets [`StoreFailed`]
///   ([`StoreFull`] when it is at its limits) instead of the trailers
///   (nothing acknowledged is lost);
/// - a body that ends without `grpc-status` is `UNKNOWN`, a failure;
/// - a body error (a reset stream) is a [connection](FailureKind::Connection)
///   failure with the error's chain;
/// - a body dropped before its end (the caller cancelled) records nothing.
///
/// Every other response (trailers-only errors, other statuses) is settled by
/// the head, as [`DeadLetterLayer`] does: pair it with a
/// [`GrpcClassifier`] (`.classifier(GrpcClassifier::new())`).
///
/// ```
/// use std::convert::Infallible;
/// use bytes::Bytes;
/// use http::{HeaderMap, Request, Response};
/// use http_body_util::{BodyExt, Full};
/// use tower::{service_fn, Layer, ServiceExt};
/// use tower_classify::{BoxError, GrpcClassifier};
/// use tower_poison::store::{DeadLetterStore, ListQuery, MemoryStore};
/// use tower_poison::{DeadLetterLayer, ReplayBody};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// let store = MemoryStore::new(100);
/// let layer = DeadLetterLayer::new(store.clone())
///     .classifier(GrpcClassifier::new())
///     .into_grpc();
/// // `200`, one message, then trailers `grpc-status: 14`.
/// let service = layer.layer(service_fn(|_req: Request<ReplayBody<Full<Bytes>>>| async {
///     let mut trailers = HeaderMap::new();
///     trailers.insert("grpc-status", "14".parse().unwrap());
///     trailers.insert("grpc-message", "no%20backend".parse().unwrap());
///     let body = Full::new(Bytes::from_static(b"\0\0\0\0\0"))
///         .with_trailers(async move { Some(Ok::<_, Infallible>(trailers)) });
///     let response = Response::builder().header("content-type", "application/grpc");
///     Ok::<_, BoxError>(response.body(body)?)
/// }));
///
/// let request = Request::post("/greeter.Greeter/SayHello").body(Full::new(Bytes::new()))?;
/// let response = service.oneshot(request).await?;
/// assert_eq!(response.status(), 200);
/// response.into_body().collect().await?;
/// let entries = store.list(ListQuery::default()).await?.entries;
/// assert_eq!(entries[0].error, ["grpc-status 14: no backend"]);
/// # Ok(())
/// # }
/// ```
///
/// [`StoreFailed`]: crate::StoreFailed
/// [`StoreFull`]: crate::StoreFull
pub struct GrpcDeadLetterLayer<St, C> {
    inner: DeadLetterLayer<St, C, HttpCapture>,
}

impl<St: Clone, C: Clone> Clone for GrpcDeadLetterLayer<St, C> {
    fn clone(&self) -> Self {
        GrpcDeadLetterLayer {
            inner: self.inner.clone(),
        }
    }
}

impl<St: fmt::Debug, C: fmt::Debug> fmt::Debug for GrpcDeadLetterLayer<St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcDeadLetterLayer")
            .field("inner", &self.inner)
            .finish()
    }
}

impl<St, C> DeadLetterLayer<St, C, HttpCapture> {
    /// The same layer, also dead-lettering gRPC calls that fail in their
    /// trailers; responses become `Response<GrpcBody<B>>`. See
    /// [`GrpcDeadLetterLayer`].
    pub fn into_grpc(self) -> GrpcDeadLetterLayer<St, C> {
        GrpcDeadLetterLayer { inner: self }
    }
}

impl<S, St: Clone, C: Clone> Layer<S> for GrpcDeadLetterLayer<St, C> {
    type Service = GrpcDeadLetter<S, St, C>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcDeadLetter {
            inner: self.inner.layer(inner),
        }
    }
}

/// A service whose failed calls, trailers included, are dead-lettered; see
/// [`GrpcDeadLetterLayer`].
pub struct GrpcDeadLetter<S, St, C> {
    inner: DeadLetter<S, St, C, HttpCapture>,
}

impl<S: Clone, St, C> Clone for GrpcDeadLetter<S, St, C> {
    fn clone(&self) -> Self {
        GrpcDeadLetter {
            inner: self.inner.clone(),
        }
    }
}

impl<S: fmt::Debug, St: fmt::Debug, C> fmt::Debug for GrpcDeadLetter<S, St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcDeadLetter")
            .field("inner", &self.inner)
            .finish()
    }
}

impl<S, St, C> GrpcDeadLetter<S, St, C> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        self.inner.get_ref()
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        self.inner.get_mut()
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner.into_inner()
    }

    /// The store entries are written to.
    pub fn store(&self) -> &St {
        self.inner.store()
    }
}

impl<S, St, C, ReqB, ResB> Service<Request<ReqB>> for GrpcDeadLetter<S, St, C>
where
    HttpCapture: CaptureRequest<Request<ReqB>, Request = Request<ReplayBody<ReqB>>>,
    // Already asked of a body by `HttpCapture`; said here too for the
    // request held until a count store decided.
    Request<ReplayBody<ReqB>>: Send + 'static,
    S: Service<Request<ReplayBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send,
    ResB: Body + Send + 'static,
    ResB::Error: Into<BoxError>,
    St: DeadLetterStore,
    C: Classify<Response<ResB>, BoxError> + Send + Sync + 'static,
{
    type Response = Response<GrpcBody<ResB>>;
    type Error = BoxError;
    type Future = GrpcResponseFuture<Self::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.get_mut().poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let shared = Arc::clone(self.inner.shared());
        let (request, pending) = shared.capture.capture(request);
        let decision = match shared.admit(&pending) {
            Admission::Now(Decision::Stop(stop)) => {
                return GrpcResponseFuture::new(
                    async move { Err(shared.stop(stop, pending).await) },
                );
            }
            Admission::Now(Decision::Process(counted)) => {
                let call = tallied!(self.inner.get_mut().call(request));
                return GrpcResponseFuture::new(respond(call, shared, pending, counted));
            }
            Admission::Later(decision) => decision,
        };
        // As in `DeadLetter::call`: a client that sends in `call` (tonic's
        // `Channel`) must not see a message the count store then diverts,
        // so the client made ready is called only once the count decided,
        // and a clone stays here to be made ready for the next call.
        let clone = self.inner.get_ref().clone();
        let mut inner = std::mem::replace(self.inner.get_mut(), clone);
        GrpcResponseFuture::new(async move {
            let counted = match decision.await {
                Decision::Process(counted) => counted,
                Decision::Stop(stop) => {
                    // The request's copy of the body goes first: the entry
                    // reads what is left of the body only once no other
                    // copy could be reading it. The service goes too,
                    // with whatever its readiness reserved.
                    drop((request, inner));
                    return Err(shared.stop(stop, pending).await);
                }
            };
            let call = tallied!(inner.call(request));
            respond(call, shared, pending, counted).await
        })
    }
}

/// Awaits the inner call and settles what its head settles; a response
/// whose outcome is in its trailers is settled by its [`GrpcBody`].
async fn respond<F, E, ResB, St, C, R>(
    call: Tallied<F>,
    shared: Arc<Shared<St, C, HttpCapture>>,
    pending: PendingRecord<R>,
    counted: Option<Counted>,
) -> Result<Response<GrpcBody<ResB>>, BoxError>
where
    F: Future<Output = Result<Response<ResB>, E>>,
    E: Into<BoxError>,
    ResB: Body + Send + 'static,
    ResB::Error: Into<BoxError>,
    St: DeadLetterStore,
    C: Classify<Response<ResB>, BoxError> + Send + Sync + 'static,
    R: BodyRecording,
{
    // Boxed before it is classified, so one classifier over `BoxError`
    // serves any client's error type.
    let (result, attempts) = call.await;
    match result.map_err(Into::<BoxError>::into) {
        Ok(response) if GrpcClassifier::status_in_trailers(&response) => {
            let mut end: Option<Box<dyn SettleAtEnd>> = Some(Box::new(EndOfCall {
                shared,
                pending,
                counted,
                attempts,
            }));
            if response.body().is_end_stream() {
                // Over before it began: no trailers will come.
                let (outcome, error) = ending(None);
                if let Some(end) = end.take() {
                    end.settle(outcome, error, Ok(())).await?;
                }
            }
            Ok(response.map(|inner| GrpcBody {
                inner,
                end,
                writing: None,
            }))
        }
        result => {
            let verdict = shared.verdict(&result);
            Ok(shared
                .settle(result, verdict, pending, counted, attempts)
                .await?
                .map(GrpcBody::settled))
        }
    }
}

/// Response future of [`GrpcDeadLetter`].
///
/// A gRPC call's outcome is often settled when its body ends, after this
/// future, and the steps around it await the store: they run in one boxed
/// future (one allocation per call).
pub struct GrpcResponseFuture<T> {
    inner: Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>,
}

impl<T> GrpcResponseFuture<T> {
    fn new(future: impl Future<Output = Result<T, BoxError>> + Send + 'static) -> Self {
        GrpcResponseFuture {
            inner: Box::pin(future),
        }
    }
}

impl<T> Future for GrpcResponseFuture<T> {
    type Output = Result<T, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<T> fmt::Debug for GrpcResponseFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcResponseFuture").finish_non_exhaustive()
    }
}

/// What a body whose outcome waits for its end needs to settle it.
trait SettleAtEnd: Send {
    /// Records `outcome`; resolves to `result`, or to the store's failure.
    fn settle(
        self: Box<Self>,
        outcome: Outcome,
        error: Vec<String>,
        result: Result<(), BoxError>,
    ) -> Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;
}

struct EndOfCall<St, C, R> {
    shared: Arc<Shared<St, C, HttpCapture>>,
    pending: PendingRecord<R>,
    counted: Option<Counted>,
    attempts: Attempts,
}

impl<St, C, R: BodyRecording> SettleAtEnd for EndOfCall<St, C, R>
where
    St: DeadLetterStore,
    C: Send + Sync + 'static,
{
    fn settle(
        self: Box<Self>,
        outcome: Outcome,
        error: Vec<String>,
        result: Result<(), BoxError>,
    ) -> Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>> {
        let EndOfCall {
            shared,
            pending,
            counted,
            attempts,
        } = *self;
        Box::pin(async move {
            match outcome {
                Outcome::Failure(failure) => {
                    let record = pending.finish(BODY_WAIT, attempts).await;
                    let failure = Failed {
                        kind: failure.kind,
                        error,
                        // The head came; a body error means the rest did not.
                        responded: result.is_ok(),
                        status: None,
                    };
                    shared.on_failure(record, failure, result, counted).await
                }
                Outcome::Success | Outcome::Ignored => {
                    shared.succeeded(counted).await;
                    result
                }
            }
        })
    }
}

type Write = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;

/// `write`, spawned on the current tokio runtime so that it finishes even if
/// its awaiter is dropped; as it is outside one.
fn detach(write: Write) -> Write {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            let task = runtime.spawn(write);
            Box::pin(async move { task.await.unwrap_or_else(|join| Err(join.into())) })
        }
        Err(_) => write,
    }
}

/// What the caller gets once the entry is written: the frame held back, or
/// the store's failure.
fn after_write<D>(written: Result<(), BoxError>, held: Held<D>) -> Held<D> {
    match written {
        Ok(()) => held,
        Err(error) => Some(Err(error)),
    }
}

/// The outcome of a body that ended with `trailers`, and its description.
fn ending(trailers: Option<&HeaderMap>) -> (Outcome, Vec<String>) {
    let outcome = GrpcClassifier::classify_end_of_stream(trailers);
    let code = trailers.and_then(GrpcClassifier::status_code);
    let message = trailers.and_then(GrpcClassifier::status_message);
    let text = match (code, message) {
        (Some(code), Some(message)) => format!("grpc-status {code}: {message}"),
        (Some(code), None) => format!("grpc-status {code}"),
        (None, _) => "the response body ended without a grpc-status".to_owned(),
    };
    (outcome, vec![text])
}

type Held<D> = Option<Result<Frame<D>, BoxError>>;

pin_project! {
    /// The response body of a [`GrpcDeadLetter`]: the inner body, frame by
    /// frame as each arrives (`size_hint` is the inner body's).
    ///
    /// When the head left the outcome open, the body settles the call at its
    /// end (see [`GrpcDeadLetterLayer`]): a failing call's entry is written
    /// before its last frame is handed on.
    pub struct GrpcBody<B: Body> {
        #[pin]
        inner: B,
        end: Option<Box<dyn SettleAtEnd>>,
        writing: Option<(Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>, Held<B::Data>)>,
    }
}

impl<B: Body> GrpcBody<B> {
    fn settled(inner: B) -> Self {
        GrpcBody {
            inner,
            end: None,
            writing: None,
        }
    }

    /// `true` while the call's outcome waits for this body's end.
    pub fn awaits_trailers(&self) -> bool {
        self.end.is_some() || self.writing.is_some()
    }
}

impl<B> Body for GrpcBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, BoxError>>> {
        let mut this = self.as_mut().project();
        if let Some((write, held)) = this.writing.as_mut() {
            let written = ready!(write.as_mut().poll(cx));
            let held = held.take();
            *this.writing = None;
            return Poll::Ready(after_write(written, held));
        }
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        let Some(end) = this.end.take() else {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        };
        let (outcome, error, result, held) = match frame {
            Some(Ok(frame)) => {
                let last = frame.is_trailers() || this.inner.is_end_stream();
                if !last {
                    *this.end = Some(end);
                    return Poll::Ready(Some(Ok(frame)));
                }
                let (outcome, error) = ending(frame.trailers_ref());
                (outcome, error, Ok(()), Some(Ok(frame)))
            }
            Some(Err(body_error)) => {
                let body_error: BoxError = body_error.into();
                let error = error_chain(&*body_error);
                let outcome = Outcome::failure(FailureKind::Connection);
                (outcome, error, Err(body_error), None)
            }
            None => {
                let (outcome, error) = ending(None);
                (outcome, error, Ok(()), None)
            }
        };
        let mut write = end.settle(outcome, error, result);
        // A success, or a store that answers at once, costs no task.
        if let Poll::Ready(written) = write.as_mut().poll(cx) {
            return Poll::Ready(after_write(written, held));
        }
        // A write that waits runs in a task of its own, polled from here on:
        // a caller dropping the body now must not cut the entry short.
        *this.writing = Some((detach(write), held));
        self.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.end.is_none() && self.writing.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: Body + fmt::Debug> fmt::Debug for GrpcBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcBody")
            .field("inner", &self.inner)
            .field("awaits_trailers", &self.awaits_trailers())
            .finish()
    }
}
