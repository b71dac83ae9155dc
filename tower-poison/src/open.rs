//! Calls whose head leaves them open: settled where the response body ends.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::task::JoinHandle;
use tower_classify::{BoxError, OnEnd, Outcome, StreamEnd};

/// A call whose classifier left it open at the head
/// ([`Classify::classify_head`](tower_classify::Classify::classify_head)
/// answered `None`): its response body, a
/// [`SettleBody`](tower_classify::SettleBody), settles it where it ends.
///
/// A gRPC server answers most failures with a `200` head and puts
/// `grpc-status` in the trailers; with a
/// [`GrpcClassifier`](tower_classify::GrpcClassifier) (or a classifier built
/// around one) the layer's classifier judges those trailers
/// ([`Classify::classify_end`](tower_classify::Classify::classify_end)):
///
/// - a failure is written to the store as an entry whose error reads
///   `grpc-status 14: <grpc-message>`, *before* the trailers reach the
///   caller; if the store cannot write, the caller gets
///   [`StoreFailed`](crate::StoreFailed) ([`StoreFull`](crate::StoreFull)
///   when it is at its limits) instead of the trailers (nothing
///   acknowledged is lost). The write finishes even if the caller drops the
///   body meanwhile;
/// - a body that ends without `grpc-status` is `UNKNOWN`, a failure;
/// - a body error (a reset stream) is a
///   [connection](tower_classify::FailureKind::Connection) failure with the
///   error's chain;
/// - a body dropped before its end (the caller cancelled, or never read
///   it, even one already over) records nothing.
///
/// Every other call is settled by its head, and its body passes through.
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
/// let layer = DeadLetterLayer::new(store.clone()).classifier(GrpcClassifier::new());
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
/// assert!(response.body().awaits_end());
/// response.into_body().collect().await?;
/// let entries = store.list(ListQuery::default()).await?.entries;
/// assert_eq!(entries[0].error, ["grpc-status 14: no backend"]);
/// # Ok(())
/// # }
/// ```
pub struct OpenCall {
    call: Box<dyn SettleAtEnd>,
}

impl OpenCall {
    pub(crate) fn new(call: Box<dyn SettleAtEnd>) -> Self {
        OpenCall { call }
    }
}

impl fmt::Debug for OpenCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenCall").finish_non_exhaustive()
    }
}

/// The store's write of an open call's entry, if any.
pub(crate) type Write = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;

impl OnEnd for OpenCall {
    type Future = Write;

    fn classify_end(&self, end: StreamEnd<'_>) -> Outcome {
        self.call.classify_end(end)
    }

    fn settle(self, outcome: Outcome, end: StreamEnd<'_>) -> Write {
        self.call.settle(outcome, end)
    }
}

/// [`OpenCall`]'s settling, without the types it was made with (the
/// layer's call state, in `future.rs`).
pub(crate) trait SettleAtEnd: Send {
    fn classify_end(&self, end: StreamEnd<'_>) -> Outcome;
    fn settle(self: Box<Self>, outcome: Outcome, end: StreamEnd<'_>) -> Write;
}

/// `write`, polled in place while it is ready at once (a store that answers
/// at once costs no task); once it waits, spawned on the current tokio
/// runtime, so that it finishes even if the body awaiting it is dropped.
pub(crate) fn detach(write: Write) -> Write {
    Box::pin(Detach::Inline(Some(write)))
}

enum Detach {
    Inline(Option<Write>),
    Spawned(JoinHandle<Result<(), BoxError>>),
}

impl Future for Detach {
    type Output = Result<(), BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match this {
                Detach::Inline(write) => {
                    let future = write.as_mut().expect("polled after it ended");
                    if let Poll::Ready(written) = future.as_mut().poll(cx) {
                        *write = None;
                        return Poll::Ready(written);
                    }
                    // Outside a runtime it stays here, awaited by the body.
                    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                        return Poll::Pending;
                    };
                    let task = runtime.spawn(write.take().expect("taken once"));
                    *this = Detach::Spawned(task);
                }
                Detach::Spawned(task) => {
                    return Pin::new(task)
                        .poll(cx)
                        .map(|joined| joined.unwrap_or_else(|join| Err(join.into())));
                }
            }
        }
    }
}
