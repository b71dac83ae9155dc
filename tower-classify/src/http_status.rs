//! Answering errors as HTTP problem responses.
//!
//! The HTTP twin of [`GrpcStatusLayer`](crate::grpc_status::GrpcStatusLayer):
//! an axum server whose routes sit behind the family's layers (a breaker in
//! front of a handler, a deadline) must answer their errors, since axum
//! takes only services that cannot fail. [`HttpStatusLayer`] turns every
//! error of the service it wraps into an `application/problem+json`
//! response (RFC 9457) with the status the error's
//! [classification](crate::ErrorChainClassifier) calls for, the same
//! mapping `GrpcStatusLayer` uses, read as the HTTP status of that gRPC
//! code:
//!
//! | failure kind | status | `Retry-After` |
//! |---|---|---|
//! | [`Shed`](FailureKind::Shed) (an open circuit, tower's `Overloaded`) | 503 | the hint's wait |
//! | [`ServerError`](FailureKind::ServerError), [`Connection`](FailureKind::Connection), [`NotSent`](FailureKind::NotSent) | 503 | the hint's wait |
//! | [`RateLimited`](FailureKind::RateLimited) | 429 | the hint's wait |
//! | [`Timeout`](FailureKind::Timeout) (a deadline, `Elapsed`) | 504 | — |
//! | [`Poison`](FailureKind::Poison), [`Rejected`](FailureKind::Rejected) | 400 | — |
//! | an error nothing recognises | 500, unless the layer's classifier chose what it means (see [`HttpStatusLayer::classifier`]) | — |
//! | an [ignored](crate::Outcome::Ignored) error (the caller cancelled) | 499 | — |
//!
//! `Retry-After` is the wait in whole seconds, rounded up. The response
//! carries the error's [`Failure`] in its extensions, as a breaker's own
//! `503` does, so the layers around it (a dead-letter layer, an idempotency
//! guard, a client breaker) classify it as what it stands for rather than
//! by its status.
//!
//! A handler that maps its own errors calls [`problem`] (the same answer)
//! or, when it did nothing before the error and may be run again under the
//! same idempotency key, [`not_run`].
//!
//! After the inner service's `poll_ready` fails, it is never polled or
//! called again: every call gets that error's answer.

use std::convert::Infallible;
use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use crate::error::BoxError;
use crate::error_chain::{AsDynError, ErrorChainClassifier};
use crate::grpc_status::answer;
use crate::outcome::{Failure, FailureKind};
use crate::refusal::RefusalToken;

/// Turns the errors of the service it wraps into problem responses; see the
/// [module docs](self) for the mapping.
///
/// ```
/// use std::time::Duration;
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_classify::http_status::HttpStatusLayer;
/// use tower_classify::{BoxError, Classified};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // A layer below refused the call, as an open circuit does.
/// let refused = service_fn(|_req: http::Request<()>| async {
///     Err::<http::Response<String>, BoxError>(
///         Classified::shed("circuit open", Some(Duration::from_millis(1500))).into(),
///     )
/// });
/// let service = ServiceBuilder::new().layer(HttpStatusLayer::new()).service(refused);
///
/// let response = service.oneshot(http::Request::new(())).await.unwrap();
/// assert_eq!(response.status(), 503);
/// assert_eq!(response.headers()["retry-after"], "2");
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// assert!(response.body().contains(r#""detail":"circuit open""#));
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct HttpStatusLayer {
    settings: Settings,
}

#[derive(Debug, Clone, Copy)]
struct Settings {
    classifier: ErrorChainClassifier,
    details: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            classifier: ErrorChainClassifier::new(),
            details: true,
        }
    }
}

impl HttpStatusLayer {
    /// The layer with the mapping above, classifying errors with
    /// [`ErrorChainClassifier::new`] and sending each error's text as the
    /// problem's `detail`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Classifies errors with `classifier` instead. Its
    /// [`unknown_as`](ErrorChainClassifier::unknown_as) decides the status
    /// of an error nothing recognises: without it, 500; with it, the status
    /// of the table above for the outcome chosen.
    pub fn classifier(mut self, classifier: ErrorChainClassifier) -> Self {
        self.settings.classifier = classifier;
        self
    }

    /// Sends no `detail`, for a server whose callers must not see a
    /// dependency's error text (host names, internal paths).
    pub fn without_details(mut self) -> Self {
        self.settings.details = false;
        self
    }
}

impl<S> Layer<S> for HttpStatusLayer {
    type Service = HttpStatus<S>;

    fn layer(&self, inner: S) -> Self::Service {
        HttpStatus {
            inner,
            settings: self.settings,
            failed: None,
        }
    }
}

/// The service made by [`HttpStatusLayer`].
///
/// Once the inner service's readiness fails, every call is answered with
/// that error's problem response and the inner service is left alone (a
/// service whose `poll_ready` failed must not be used again). A clone
/// starts afresh.
#[derive(Debug)]
pub struct HttpStatus<S> {
    inner: S,
    settings: Settings,
    failed: Option<Problem>,
}

impl<S: Clone> Clone for HttpStatus<S> {
    fn clone(&self) -> Self {
        HttpStatus {
            inner: self.inner.clone(),
            settings: self.settings,
            failed: None,
        }
    }
}

impl<S> HttpStatus<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, Req, B> Service<Req> for HttpStatus<S>
where
    S: Service<Req, Response = Response<B>>,
    S::Error: Into<BoxError>,
    B: From<String>,
{
    type Response = Response<B>;
    type Error = Infallible;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if self.failed.is_none() {
            if let Err(error) = ready!(self.inner.poll_ready(cx)) {
                let error: BoxError = error.into();
                self.failed = Some(Problem::of(&*error, &self.settings));
            }
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let state = match &self.failed {
            Some(problem) => State::NotReady {
                problem: Some(problem.clone()),
            },
            None => State::Called {
                inner: self.inner.call(request),
            },
        };
        ResponseFuture {
            state,
            settings: self.settings,
        }
    }
}

pin_project! {
    /// Response future of [`HttpStatus`].
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
        settings: Settings,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Called { #[pin] inner: F },
        NotReady { problem: Option<Problem> },
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
    B: From<String>,
{
    type Output = Result<Response<B>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = match this.state.project() {
            StateProj::Called { inner } => match ready!(inner.poll(cx)) {
                Ok(response) => response,
                Err(error) => {
                    let error: BoxError = error.into();
                    Problem::of(&*error, this.settings).response()
                }
            },
            StateProj::NotReady { problem } => {
                problem.take().expect("polled after completion").response()
            }
        };
        Poll::Ready(Ok(response))
    }
}

/// The problem response answering `error`, as [`HttpStatusLayer`] answers
/// it (with the default classifier, details included): for a handler that
/// maps its own errors, `.map_err(|e| problem(&e))?`.
///
/// The key of an idempotency guard in front of the handler is kept: the
/// handler ran. When it did nothing before the error, answer with
/// [`not_run`] instead.
pub fn problem<B: From<String>>(error: &(impl AsDynError + ?Sized)) -> Response<B> {
    Problem::of(error.as_dyn_error(), &Settings::default()).response()
}

/// The problem response answering `error`, marked as a refusal of the
/// request that carried `token`: the handler says it did nothing for this
/// request, so an idempotency guard in front of it frees the key and the
/// client's retry with the same key runs the handler again.
///
/// `token` is the [`RefusalToken`] in the handler's request extensions (an
/// axum handler takes `token: Option<Extension<RefusalToken>>`; it is `None`
/// when no guard is in front, and then nothing is freed). Use it only when
/// nothing happened before the error: the handler refused before any write,
/// as a dependency's open circuit makes it do. A handler that wrote the
/// order and then failed must answer with [`problem`], or the retry writes
/// the order again.
///
/// The status and `Retry-After` are [`problem`]'s: an open circuit below is
/// `503` with its wait. The failure it carries is the error's
/// classification, or [`Shed`](FailureKind::Shed) (what a refusal is) for
/// an error nothing recognises, which still answers `500`.
///
/// ```
/// use std::time::Duration;
/// use tower_classify::http_status::not_run;
/// use tower_classify::{Classified, Failure, RefusalToken};
///
/// // In a handler: `token` comes from the request, `error` from the
/// // dependency the handler was about to call.
/// let token = Some(RefusalToken::issue());
/// let error = Classified::shed("circuit open", Some(Duration::from_secs(3)));
/// let response: http::Response<String> = not_run(&error, token);
/// assert_eq!(response.status(), 503);
/// assert_eq!(response.headers()["retry-after"], "3");
/// assert_eq!(response.extensions().get::<Failure>().unwrap().refusal, token);
/// ```
pub fn not_run<B: From<String>>(
    error: &(impl AsDynError + ?Sized),
    token: Option<RefusalToken>,
) -> Response<B> {
    let mut problem = Problem::of(error.as_dyn_error(), &Settings::default());
    let failure = problem
        .failure
        .unwrap_or_else(|| Failure::new(FailureKind::Shed));
    problem.failure = Some(failure.with_refusal(token));
    problem.response()
}

/// One error's answer, kept whole so that a failed readiness can answer
/// every later call.
#[derive(Debug, Clone)]
struct Problem {
    status: StatusCode,
    retry_after: Option<u64>,
    body: String,
    failure: Option<Failure>,
}

impl Problem {
    fn of(error: &(dyn Error + 'static), settings: &Settings) -> Self {
        let answer = answer(error, &settings.classifier);
        let status = http_status(answer.code);
        let retry_after = answer
            .pushback
            .and_then(|millis| u64::try_from(millis).ok())
            .map(|millis| ceil_secs(Duration::from_millis(millis)));
        let mut body = serde_json::json!({
            "type": "about:blank",
            "title": status.canonical_reason().unwrap_or("Error"),
            "status": status.as_u16(),
        });
        if settings.details {
            body["detail"] = error.to_string().into();
        }
        Problem {
            status,
            retry_after,
            body: body.to_string(),
            // An error nothing recognises answers 500 and is left to be
            // read as the server error its status says.
            failure: answer
                .outcome
                .as_failure()
                .copied()
                .filter(|_| answer.code != 2),
        }
    }

    fn response<B: From<String>>(self) -> Response<B> {
        let mut response = Response::new(B::from(self.body));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(secs) = self.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Some(failure) = self.failure {
            response.extensions_mut().insert(failure);
        }
        response
    }
}

/// The HTTP status for a gRPC status code, as gRPC's own HTTP mapping reads
/// them; 499 is the de facto "client closed request".
fn http_status(code: u32) -> StatusCode {
    match code {
        14 => StatusCode::SERVICE_UNAVAILABLE,
        8 => StatusCode::TOO_MANY_REQUESTS,
        4 => StatusCode::GATEWAY_TIMEOUT,
        3 => StatusCode::BAD_REQUEST,
        1 => StatusCode::from_u16(499).expect("499 is a valid status"),
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// Whole seconds, rounded up: a client waiting the rounded-down value would
/// come back too early.
fn ceil_secs(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_round_up_to_whole_seconds() {
        assert_eq!(ceil_secs(Duration::from_millis(1500)), 2);
        assert_eq!(ceil_secs(Duration::from_secs(3)), 3);
        assert_eq!(ceil_secs(Duration::ZERO), 0);
    }
}
