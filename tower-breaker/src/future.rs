//! Future types.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
#[cfg(feature = "grpc")]
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_classify::{BoxError, Classify, Outcome};

use crate::error::CircuitOpen;
use crate::permit::Permit;

#[cfg(feature = "grpc")]
pub use crate::grpc::GrpcResponseFuture;
#[cfg(feature = "http")]
pub use crate::http::HttpResponseFuture;

pin_project! {
    /// Response future of [`CircuitBreaker`](crate::CircuitBreaker) and
    /// [`KeyedCircuitBreaker`](crate::KeyedCircuitBreaker).
    ///
    /// When the inner future completes, its result is classified and recorded.
    /// Dropping it first records nothing; if it was a half-open probe, its
    /// slot is given back so another call can probe.
    pub struct ResponseFuture<F, C> {
        #[pin]
        state: ResponseState<F>,
        recorder: Option<Recorder<C>>,
    }
}

pin_project! {
    #[project = ResponseStateProj]
    pub(crate) enum ResponseState<F> {
        Called {
            #[pin]
            future: F,
        },
        // Boxed at once: the caller gets a `BoxError` anyway, and keeping the
        // large error out of line keeps the common (called) future small.
        Rejected {
            error: Option<BoxError>,
        },
    }
}

impl<F, C> ResponseFuture<F, C> {
    #[inline]
    pub(crate) fn called(future: F, recorder: Option<Recorder<C>>) -> Self {
        ResponseFuture {
            state: ResponseState::Called { future },
            recorder,
        }
    }

    pub(crate) fn rejected(error: CircuitOpen) -> Self {
        ResponseFuture {
            state: ResponseState::Rejected {
                error: Some(Box::new(error)),
            },
            recorder: None,
        }
    }
}

impl<F, C, T, E> Future for ResponseFuture<F, C>
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
            ResponseStateProj::Called { future } => {
                // Boxed before it is classified, so one classifier over
                // `BoxError` serves any client's error type.
                let result = ready!(future.poll(cx)).map_err(Into::into);
                // Recorded in place, then dropped: moving the recorder out
                // first costs a copy the closed path can do without.
                if let Some(recorder) = this.recorder.as_mut() {
                    recorder.record(result.as_ref());
                }
                *this.recorder = None;
                Poll::Ready(result)
            }
            ResponseStateProj::Rejected { error } => Poll::Ready(Err(error
                .take()
                .expect("ResponseFuture polled after completion"))),
        }
    }
}

impl<F, C> fmt::Debug for ResponseFuture<F, C> {
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
    #[inline]
    pub(crate) fn new(permit: Permit, classifier: C) -> Self {
        // The clock is read only when a slow-call threshold or a per-call
        // callback needs it, keeping the default closed path free of clock
        // reads.
        let breaker = permit.breaker();
        let started =
            (breaker.slow_call_threshold.is_some() || breaker.call_listeners).then(Instant::now);
        Recorder {
            permit,
            classifier,
            started,
        }
    }

    #[inline]
    pub(crate) fn record<T, E>(&mut self, result: Result<&T, &E>)
    where
        C: Classify<T, E>,
    {
        let outcome = self.classifier.classify(result);
        self.complete(outcome);
    }

    /// What the classifier says of `result`, recording nothing.
    #[cfg(feature = "grpc")]
    pub(crate) fn classify<T, E>(&self, result: Result<&T, &E>) -> Outcome
    where
        C: Classify<T, E>,
    {
        self.classifier.classify(result)
    }

    /// Records `outcome`, timed from the call's start to now.
    #[inline]
    pub(crate) fn complete(&mut self, outcome: Outcome) {
        let elapsed = self.started.map(|started| started.elapsed());
        self.permit.complete(outcome, elapsed);
    }

    /// Keeps the permit, timed up to now, for an outcome known only later
    /// (gRPC trailers); the classifier is not needed any more.
    #[cfg(feature = "grpc")]
    pub(crate) fn defer(self) -> Deferred {
        Deferred {
            elapsed: self.started.map(|started| started.elapsed()),
            permit: self.permit,
        }
    }
}

/// A call's permit whose outcome comes after its response: recorded with
/// [`complete`](Self::complete), or dropped unrecorded like a dropped
/// response future (a probe's slot is given back).
#[cfg(feature = "grpc")]
pub(crate) struct Deferred {
    permit: Permit,
    /// The call's duration up to its response head; `None` without a
    /// slow-call threshold.
    elapsed: Option<Duration>,
}

#[cfg(feature = "grpc")]
impl Deferred {
    pub(crate) fn complete(mut self, outcome: Outcome) {
        self.permit.complete(outcome, self.elapsed);
    }
}

#[cfg(feature = "grpc")]
impl fmt::Debug for Deferred {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deferred")
            .field("permit", &self.permit)
            .field("elapsed", &self.elapsed)
            .finish()
    }
}

#[cfg(all(test, not(breaker_loom)))]
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
