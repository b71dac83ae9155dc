//! Future types.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

#[cfg(feature = "http")]
use http::Response;
#[cfg(feature = "http")]
use http_body::Body;
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_classify::{BoxError, Classify, Outcome};
#[cfg(feature = "http")]
use tower_classify::{SettleBody, StreamEnd};

use crate::answer::Plain;
#[cfg(feature = "http")]
use crate::answer::{open_response, Http503, HttpError};
use crate::error::CircuitOpen;
use crate::machine::Breaker;
#[cfg(feature = "http")]
use crate::open::OpenCall;
use crate::permit::Permit;
use crate::share::BreakerRef;

pin_project! {
    /// Response future of [`CircuitBreaker`](crate::CircuitBreaker) and
    /// [`KeyedCircuitBreaker`](crate::KeyedCircuitBreaker); `A` is the
    /// breaker's [answer](crate::answer).
    ///
    /// When the inner future completes, its result is classified and
    /// recorded; under the `HttpError` answer a response whose head leaves
    /// the call open is recorded where its body ends instead. A refused call
    /// resolves at once, to the [`CircuitOpen`] error or, under `Http503`,
    /// to the `503` answer. Dropping the future first records nothing; if
    /// it was a half-open probe, its slot is given back so another call can
    /// probe.
    pub struct ResponseFuture<F, C, A = Plain> {
        #[pin]
        state: ResponseState<F>,
        recorder: Option<Recorder<C>>,
        answer: PhantomData<fn() -> A>,
    }
}

pin_project! {
    #[project = ResponseStateProj]
    enum ResponseState<F> {
        Called {
            #[pin]
            future: F,
        },
        // Boxed at once: a plain caller gets a `BoxError` anyway, and
        // keeping the large error out of line keeps the common (called)
        // future small.
        Rejected {
            open: Option<Box<CircuitOpen>>,
        },
    }
}

impl<F, C, A> ResponseFuture<F, C, A> {
    #[inline]
    pub(crate) fn called(future: F, recorder: Option<Recorder<C>>) -> Self {
        ResponseFuture {
            state: ResponseState::Called { future },
            recorder,
            answer: PhantomData,
        }
    }

    pub(crate) fn rejected(open: CircuitOpen) -> Self {
        ResponseFuture {
            state: ResponseState::Rejected {
                open: Some(Box::new(open)),
            },
            recorder: None,
            answer: PhantomData,
        }
    }
}

/// Records `result` with the recorder in place, then drops it: moving the
/// recorder out first costs a copy the closed path can do without.
#[inline]
fn record<C: Classify<T, E>, T, E>(
    recorder: &mut Option<Recorder<C>>,
    result: Result<T, E>,
) -> Result<T, E> {
    if let Some(recorder) = recorder.as_mut() {
        recorder.record(result.as_ref());
    }
    *recorder = None;
    result
}

/// The refusal a rejected future resolves to, once.
fn take_refusal(open: &mut Option<Box<CircuitOpen>>) -> Box<CircuitOpen> {
    open.take().expect("ResponseFuture polled after completion")
}

impl<F, C, T, E> Future for ResponseFuture<F, C, Plain>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
    C: Classify<T, BoxError>,
{
    type Output = Result<T, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            // Boxed before it is classified, so one classifier over
            // `BoxError` serves any client's error type.
            ResponseStateProj::Called { future } => Poll::Ready(record(
                this.recorder,
                ready!(future.poll(cx)).map_err(Into::into),
            )),
            ResponseStateProj::Rejected { open } => Poll::Ready(Err(take_refusal(open))),
        }
    }
}

#[cfg(feature = "http")]
impl<F, C, B, E> Future for ResponseFuture<F, C, Http503>
where
    F: Future<Output = Result<Response<B>, E>>,
    C: Classify<Response<B>, E>,
    B: From<String>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            ResponseStateProj::Called { future } => {
                Poll::Ready(record(this.recorder, ready!(future.poll(cx))))
            }
            ResponseStateProj::Rejected { open } => {
                Poll::Ready(Ok(open_response(&take_refusal(open))))
            }
        }
    }
}

#[cfg(feature = "http")]
impl<F, C, B, E> Future for ResponseFuture<F, C, HttpError>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
    C: Classify<Response<B>, BoxError>,
    B: Body,
{
    type Output = Result<Response<SettleBody<B, OpenCall<C>>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            ResponseStateProj::Called { future } => {
                let result = ready!(future.poll(cx)).map_err(Into::<BoxError>::into);
                let Some(mut recorder) = this.recorder.take() else {
                    return Poll::Ready(result.map(|response| response.map(SettleBody::settled)));
                };
                Poll::Ready(match result {
                    Ok(response) => Ok(recorder.settle_head(response)),
                    Err(error) => {
                        recorder.record::<Response<B>, _>(Err(&error));
                        Err(error)
                    }
                })
            }
            ResponseStateProj::Rejected { open } => Poll::Ready(Err(take_refusal(open))),
        }
    }
}

impl<F, C, A> fmt::Debug for ResponseFuture<F, C, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            ResponseState::Called { .. } => "called",
            ResponseState::Rejected { .. } => "rejected",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("recorder", &self.recorder)
            .finish()
    }
}

/// Records one admitted call's result: the permit, the classifier, and the
/// start time when a slow-call threshold needs it.
pub(crate) struct Recorder<C> {
    permit: Permit,
    classifier: C,
    started: Option<Instant>,
}

impl<C> fmt::Debug for Recorder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recorder")
            .field("permit", &self.permit)
            .field("started", &self.started)
            .finish()
    }
}

impl<C> Recorder<C> {
    /// The recorder of a call `breaker` admits (`None` when it is
    /// disabled), or the refusal.
    #[inline]
    pub(crate) fn admit(breaker: &BreakerRef, classifier: &C) -> Result<Option<Self>, CircuitOpen>
    where
        C: Clone,
    {
        if breaker.breaker().disabled {
            return Ok(None);
        }
        let permit = Breaker::admit(breaker)?;
        // Cloned before the clock is read, so a call's time is its own.
        let classifier = classifier.clone();
        // The clock is read only when a slow-call threshold or a per-call
        // callback needs it, keeping the default closed path free of clock
        // reads.
        let breaker = permit.breaker();
        let started =
            (breaker.slow_call_threshold.is_some() || breaker.call_listeners).then(Instant::now);
        Ok(Some(Recorder {
            permit,
            classifier,
            started,
        }))
    }

    #[inline]
    pub(crate) fn record<T, E>(&mut self, result: Result<&T, &E>)
    where
        C: Classify<T, E>,
    {
        let outcome = self.classifier.classify(result);
        self.complete(outcome);
    }

    /// Records `outcome`, timed from the call's start to now.
    #[inline]
    pub(crate) fn complete(&mut self, outcome: Outcome) {
        let elapsed = self.started.map(|started| started.elapsed());
        self.permit.complete(outcome, elapsed);
    }

    /// Records what the head of `response` settles, or hands the call to
    /// its body when only the body's end can.
    #[cfg(feature = "http")]
    fn settle_head<B>(mut self, response: Response<B>) -> Response<SettleBody<B, OpenCall<C>>>
    where
        B: Body,
        C: Classify<Response<B>, BoxError>,
    {
        let outcome = match self.classifier.classify_head(Ok(&response)) {
            Some(outcome) => outcome,
            // Over before it began: it ends now, without trailers.
            None if response.body().is_end_stream() => {
                Classify::<Response<B>, BoxError>::classify_end(
                    &self.classifier,
                    StreamEnd::Trailers(None),
                )
            }
            None => {
                let Recorder {
                    permit,
                    classifier,
                    started,
                } = self;
                let open = OpenCall {
                    permit,
                    elapsed: started.map(|started| started.elapsed()),
                    classifier,
                    judge: |classifier, end| {
                        Classify::<Response<B>, BoxError>::classify_end(classifier, end)
                    },
                };
                return response.map(|body| SettleBody::new(body, open));
            }
        };
        self.complete(outcome);
        response.map(SettleBody::settled)
    }
}

#[cfg(test)]
#[cfg(not(breaker_loom))]
mod tests {
    use super::*;

    /// What each call moves around: the inner future, the permit (a breaker
    /// reference and one word), the classifier and the optional start time.
    /// A guard against growth; the bench prints the figures next to its
    /// peers'.
    #[test]
    fn the_response_future_stays_small() {
        type Inner = std::future::Ready<Result<u64, std::io::Error>>;
        type Future = ResponseFuture<Inner, tower_classify::ErrorChainClassifier>;
        let size = std::mem::size_of::<Future>();
        println!("ResponseFuture over a 16-byte future: {size} bytes");
        assert!(size <= 80, "{size} bytes");
        assert_eq!(std::mem::size_of::<Permit>(), 16);
    }
}
