//! Future types

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::HeaderMap;
use pin_project_lite::pin_project;
use tower_classify::attempts::TallyScope;
use tower_classify::{BoxError, Classify, GrpcClassifier, Outcome, StreamEnd};

use crate::attempts::{Attempts, Tallied};
use crate::capture::{BodyRecording, DescribeResponse, PendingRecord};
use crate::entry::error_chain;
use crate::open::{detach, OpenCall, SettleAtEnd, Write};
use crate::poison::Counted;
use crate::service::{Failed, Shared, Verdict};
use crate::store::DeadLetterStore;

/// A future that runs a step of a dead-letter call needing the store (its
/// futures are not nameable: stores return `impl Future`) or a count store.
type Boxed<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

pin_project! {
    /// Response future of [`DeadLetter`](crate::DeadLetter).
    ///
    /// A call that succeeds is the inner future and a classification of its
    /// result, in place: no allocation, no store. Only the steps that need
    /// the store or a count store run in a boxed future, made when they
    /// begin.
    pub struct ResponseFuture<F, Res, St, C, Cap, R> {
        #[pin]
        state: State<F, Res, St, C, Cap, R>,
    }
}

pin_project! {
    #[project = StateProjection]
    enum State<F, Res, St, C, Cap, R> {
        /// The inner service's call, running.
        Calling {
            #[pin]
            call: Tallied<F>,
            shared: Arc<Shared<St, C, Cap>>,
            // Taken when the call ends.
            pending: Option<PendingRecord<R>>,
            counted: Option<Counted>,
        },
        /// A step that needs the store, or a count store.
        Boxed { future: Boxed<Res> },
    }
}

impl<F, Res, St, C, Cap, R> ResponseFuture<F, Res, St, C, Cap, R> {
    /// The inner service's call, its future made by `call` inside the
    /// tally scope, in place.
    #[inline]
    pub(crate) fn calling(
        call: impl FnOnce() -> F,
        shared: Arc<Shared<St, C, Cap>>,
        pending: PendingRecord<R>,
        counted: Option<Counted>,
    ) -> Self {
        // A retry layer below makes its first attempt in `call`: with a
        // fresh tally current.
        let scope = TallyScope::calling(Default::default());
        let call = Tallied::in_scope(call(), scope);
        ResponseFuture {
            state: State::Calling {
                call,
                shared,
                pending: Some(pending),
                counted,
            },
        }
    }

    pub(crate) fn boxed(
        future: impl Future<Output = Result<Res, BoxError>> + Send + 'static,
    ) -> Self {
        ResponseFuture {
            state: State::Boxed {
                future: Box::pin(future),
            },
        }
    }
}

impl<F, Res, E, Out, St, C, Cap, R> Future for ResponseFuture<F, Out, St, C, Cap, R>
where
    F: Future<Output = Result<Res, E>>,
    E: Into<BoxError>,
    Res: Send + 'static,
    Out: Send + 'static,
    St: DeadLetterStore,
    C: Classify<Res, BoxError> + Send + Sync + 'static,
    Cap: DescribeResponse<Res, Response = Out> + Send + Sync + 'static,
    R: BodyRecording,
{
    type Output = Result<Out, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let settling = match self.as_mut().project().state.project() {
                StateProjection::Boxed { future } => return future.as_mut().poll(cx),
                StateProjection::Calling {
                    call,
                    shared,
                    pending,
                    counted,
                } => {
                    let (result, attempts) = ready!(call.poll(cx));
                    // Boxed before it is classified, so one classifier over
                    // `BoxError` serves any client's error type (a box of
                    // an error only: a response is not moved).
                    let result = result.map_err(Into::<BoxError>::into);
                    let counted = counted.take();
                    let outcome = match shared.classifier.classify_head(result.as_ref()) {
                        Some(outcome) => outcome,
                        None => match result {
                            // Its body settles it (boxed once: a streamed
                            // call, never one its head settled).
                            Ok(response) => {
                                let pending = pending.take().expect("polled after it ended");
                                let shared = Arc::clone(shared);
                                let open = OpenCall::new(Box::new(EndOfCall {
                                    shared: Arc::clone(&shared),
                                    pending,
                                    counted,
                                    attempts,
                                    response: PhantomData::<fn() -> Res>,
                                }));
                                return Poll::Ready(Ok(shared
                                    .capture
                                    .hand_back(response, Some(open))));
                            }
                            // An error has no body to wait for.
                            Err(_) => shared.classifier.classify(result.as_ref()),
                        },
                    };
                    let failed = match shared.settings.verdict(outcome, &counted) {
                        Verdict::HandBack => {
                            return Poll::Ready(
                                result.map(|res| shared.capture.hand_back(res, None)),
                            )
                        }
                        Verdict::Succeeded => None,
                        Verdict::Failed(failure) => Some(shared.failed(failure, &result)),
                    };
                    let shared = Arc::clone(shared);
                    let pending = pending.take().expect("polled after it ended");
                    async move {
                        let settings = &shared.settings;
                        let result = settings
                            .settle(result, failed, pending, counted, attempts)
                            .await;
                        result.map(|res| shared.capture.hand_back(res, None))
                    }
                }
            };
            self.as_mut().project().state.set(State::Boxed {
                future: Box::pin(settling),
            });
        }
    }
}

impl<F, Res, St, C, Cap, R> fmt::Debug for ResponseFuture<F, Res, St, C, Cap, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// What an [`OpenCall`] settles: the call's state, kept until its response
/// body ends.
struct EndOfCall<St, C, Cap, R, Res> {
    shared: Arc<Shared<St, C, Cap>>,
    pending: PendingRecord<R>,
    counted: Option<Counted>,
    attempts: Attempts,
    response: PhantomData<fn() -> Res>,
}

impl<St, C, Cap, R, Res> SettleAtEnd for EndOfCall<St, C, Cap, R, Res>
where
    St: DeadLetterStore,
    C: Classify<Res, BoxError> + Send + Sync + 'static,
    Cap: Send + Sync + 'static,
    R: BodyRecording,
    Res: 'static,
{
    fn classify_end(&self, end: StreamEnd<'_>) -> Outcome {
        self.shared.classifier.classify_end(end)
    }

    fn settle(self: Box<Self>, outcome: Outcome, end: StreamEnd<'_>) -> Write {
        let EndOfCall {
            shared,
            pending,
            counted,
            attempts,
            ..
        } = *self;
        let failure = match (end, shared.settings.verdict(outcome, &counted)) {
            // The caller went away (nothing is known of the call), or there
            // is nothing to do.
            (StreamEnd::Dropped, _) | (_, Verdict::HandBack) => {
                return Box::pin(std::future::ready(Ok(())))
            }
            // A success boxes only the forget, not the failure path's
            // larger future (this is every counted gRPC call that works).
            (_, Verdict::Succeeded) => {
                drop(pending);
                return detach(Box::pin(async move {
                    shared.settings.forget(counted).await;
                    Ok(())
                }));
            }
            // The head came; a body error means the rest did not.
            (_, Verdict::Failed(failure)) => {
                let responded = !matches!(end, StreamEnd::Error(_));
                Failed::new(failure, describe(end), responded, None)
            }
        };
        detach(Box::pin(async move {
            shared
                .settings
                .on_failure(pending, attempts, failure, Ok(()), counted)
                .await
        }))
    }
}

/// An entry's error for a body that ended as `end` did.
fn describe(end: StreamEnd<'_>) -> Vec<String> {
    match end {
        StreamEnd::Trailers(trailers) => vec![trailers_text(trailers)],
        StreamEnd::Error(error) => error_chain(error),
        StreamEnd::Dropped => Vec::new(),
    }
}

fn trailers_text(trailers: Option<&HeaderMap>) -> String {
    let code = trailers.and_then(GrpcClassifier::status_code);
    let message = trailers.and_then(GrpcClassifier::status_message);
    match (code, message) {
        (Some(code), Some(message)) => format!("grpc-status {code}: {message}"),
        (Some(code), None) => format!("grpc-status {code}"),
        (None, _) => "the response body ended without a grpc-status".to_owned(),
    }
}
