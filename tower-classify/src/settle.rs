//! Settling a call where its response body ends.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{ready, Context, Poll};

use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::error::BoxError;
use crate::outcome::{FailureKind, Outcome};

/// How a response body ended; judged by
/// [`Classify::classify_end`](crate::Classify::classify_end).
#[derive(Debug, Clone, Copy)]
pub enum StreamEnd<'a> {
    /// The body ended, with these trailers (`None`: without any).
    Trailers(Option<&'a HeaderMap>),
    /// The body failed before its end (a reset stream).
    Error(&'a (dyn std::error::Error + Send + Sync + 'static)),
    /// The body was dropped before its end: the caller went away.
    Dropped,
}

impl StreamEnd<'_> {
    /// What [`Classify::classify_end`](crate::Classify::classify_end) says
    /// by default.
    pub(crate) fn default_outcome(self) -> Outcome {
        match self {
            StreamEnd::Trailers(_) => Outcome::Success,
            StreamEnd::Error(_) => Outcome::failure(FailureKind::Connection),
            StreamEnd::Dropped => Outcome::Ignored,
        }
    }
}

/// What a layer does with a call a [`SettleBody`] settles, once per body.
pub trait OnEnd {
    /// What [`settle`](Self::settle) returns; the body holds its last frame
    /// back until it resolves, and hands an error on in its place.
    type Future: Future<Output = Result<(), BoxError>>;

    /// Judges how the body ended: a layer asks its classifier's
    /// [`Classify::classify_end`](crate::Classify::classify_end).
    fn classify_end(&self, end: StreamEnd<'_>) -> Outcome;

    /// Acts on the call's `outcome`, judged from `end`. After
    /// [`StreamEnd::Dropped`] the future is dropped unpolled: do the work in
    /// `settle` itself.
    fn settle(self, outcome: Outcome, end: StreamEnd<'_>) -> Self::Future;
}

pin_project! {
    /// A response body that settles its call where it ends.
    ///
    /// When the body ends (trailers, last data frame or `None`), fails, or is
    /// dropped, it asks its [`OnEnd`] to [judge](OnEnd::classify_end) the end
    /// and [settle](OnEnd::settle) the call, once; the last frame waits until
    /// the settling resolves. It reports no end of stream while its call is
    /// open, so a server polls it to its end.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::future::{ready, Ready};
    /// use std::sync::{Arc, Mutex};
    /// use bytes::Bytes;
    /// use http::HeaderMap;
    /// use http_body_util::{BodyExt, Full};
    /// use tower_classify::{BoxError, Classify, GrpcClassifier, OnEnd, Outcome, SettleBody, StreamEnd};
    ///
    /// /// Keeps the outcome, as a circuit breaker would count it.
    /// struct Record(Arc<Mutex<Option<Outcome>>>);
    ///
    /// impl OnEnd for Record {
    ///     type Future = Ready<Result<(), BoxError>>;
    ///     fn classify_end(&self, end: StreamEnd<'_>) -> Outcome {
    ///         Classify::<http::Response<()>, BoxError>::classify_end(&GrpcClassifier::new(), end)
    ///     }
    ///     fn settle(self, outcome: Outcome, _end: StreamEnd<'_>) -> Self::Future {
    ///         *self.0.lock().unwrap() = Some(outcome);
    ///         ready(Ok(()))
    ///     }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let mut trailers = HeaderMap::new();
    /// trailers.insert("grpc-status", "14".parse().unwrap());
    /// let inner = Full::new(Bytes::from_static(b"\0\0\0\0\0"))
    ///     .with_trailers(async move { Some(Ok::<_, Infallible>(trailers)) });
    /// let seen = Arc::new(Mutex::new(None));
    /// let body = SettleBody::new(inner, Record(Arc::clone(&seen)));
    /// body.collect().await.unwrap();
    /// assert!(seen.lock().unwrap().unwrap().is_retryable());
    /// # }
    /// ```
    pub struct SettleBody<B, F: OnEnd> {
        #[pin]
        inner: B,
        #[pin]
        state: State<F, F::Future>,
    }
}

pin_project! {
    #[project = StateProjection]
    enum State<F: OnEnd, Fut> {
        // The head settled the call, or the body's end did.
        Settled,
        // Waiting for the end.
        Open { end: Armed<F> },
        Settling {
            #[pin]
            future: Fut,
            // The last frame, error or end, for when `future` resolves.
            // Type-erased so `SettleBody<B, F>` is a type for any `B`, not
            // only a body; the mutex (never locked) makes it `Sync`, as
            // `BodyExt::boxed` asks.
            held: Mutex<Box<dyn Any + Send>>,
        },
    }
}

/// The [`OnEnd`] of a body whose call is still open; settles it as
/// dropped if the body goes first.
struct Armed<F: OnEnd>(Option<F>);

impl<F: OnEnd> Drop for Armed<F> {
    fn drop(&mut self) {
        if let Some(on_end) = self.0.take() {
            let outcome = on_end.classify_end(StreamEnd::Dropped);
            drop(on_end.settle(outcome, StreamEnd::Dropped));
        }
    }
}

impl<B, F: OnEnd> SettleBody<B, F> {
    /// `inner`, settling its call with `on_end` where it ends.
    pub fn new(inner: B, on_end: F) -> Self {
        SettleBody {
            inner,
            state: State::Open {
                end: Armed(Some(on_end)),
            },
        }
    }

    /// `inner`, whose call its head settled: frames pass through.
    pub fn settled(inner: B) -> Self {
        SettleBody {
            inner,
            state: State::Settled,
        }
    }

    /// `true` while the call waits for this body's end.
    pub fn awaits_end(&self) -> bool {
        !matches!(self.state, State::Settled)
    }

    /// Consumes `self`, returning the inner body; an open call is settled
    /// as [dropped](StreamEnd::Dropped).
    pub fn into_inner(self) -> B {
        let SettleBody { inner, .. } = self;
        inner
    }
}

type Held<D> = Option<Result<Frame<D>, BoxError>>;

impl<B, F> Body for SettleBody<B, F>
where
    B: Body,
    B::Data: Send + 'static,
    B::Error: Into<BoxError>,
    F: OnEnd,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, BoxError>>> {
        let mut this = self.project();
        loop {
            let end = match this.state.as_mut().project() {
                StateProjection::Settled => {
                    let frame = ready!(this.inner.as_mut().poll_frame(cx));
                    return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
                }
                StateProjection::Settling { future, held } => {
                    let settled = ready!(future.poll(cx));
                    let held = held.get_mut().unwrap_or_else(PoisonError::into_inner);
                    let held = std::mem::replace(held, Box::new(()));
                    this.state.set(State::Settled);
                    return Poll::Ready(match settled {
                        Ok(()) => *held.downcast::<Held<B::Data>>().expect("held as this type"),
                        Err(error) => Some(Err(error)),
                    });
                }
                StateProjection::Open { end } => end,
            };
            let held: Held<B::Data> = match ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) if !frame.is_trailers() && !this.inner.is_end_stream() => {
                    return Poll::Ready(Some(Ok(frame)));
                }
                Some(Ok(frame)) => Some(Ok(frame)),
                Some(Err(error)) => Some(Err(error.into())),
                None => None,
            };
            let ended = match &held {
                Some(Ok(frame)) => StreamEnd::Trailers(frame.trailers_ref()),
                Some(Err(error)) => StreamEnd::Error(&**error),
                None => StreamEnd::Trailers(None),
            };
            let on_end = end.0.take().expect("open until its end");
            let outcome = on_end.classify_end(ended);
            let future = on_end.settle(outcome, ended);
            this.state.set(State::Settling {
                future,
                held: Mutex::new(Box::new(held)),
            });
        }
    }

    fn is_end_stream(&self) -> bool {
        !self.awaits_end() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: fmt::Debug, F: OnEnd> fmt::Debug for SettleBody<B, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SettleBody")
            .field("inner", &self.inner)
            .field("awaits_end", &self.awaits_end())
            .finish()
    }
}
