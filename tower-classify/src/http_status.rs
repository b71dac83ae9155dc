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
//! | [`Shed`](FailureKind::Shed) (an open circuit, tower's `Overloaded`) | 503 | the error's wait (an open circuit's: the time it stays open) |
//! | [`ServerError`](FailureKind::ServerError), [`Connection`](FailureKind::Connection), [`NotSent`](FailureKind::NotSent) | 503 | the error's wait |
//! | [`RateLimited`](FailureKind::RateLimited) | 429 | the error's wait |
//! | [`Timeout`](FailureKind::Timeout) (a deadline, `Elapsed`) | 504 | — |
//! | [`Poison`](FailureKind::Poison), [`Rejected`](FailureKind::Rejected) | 400 | — |
//! | an error nothing recognises | 500, unless the layer's classifier chose what it means (see [`HttpStatusLayer::classifier`]) | — |
//! | an [ignored](crate::Outcome::Ignored) error (the caller cancelled) | 499 | — |
//!
//! `Retry-After` is the wait in whole seconds, rounded up and at least 1:
//! the [wait the error tells remote callers](crate::Classified::with_answer_wait)
//! when it names one (an open circuit's time left, however early in its
//! open period), else its hint's. The response
//! carries the error's [`Failure`] in its extensions, as a breaker's own
//! `503` does, so the layers around it (a dead-letter layer, an idempotency
//! guard, a client breaker) classify it as what it stands for rather than
//! by its status.
//!
//! A handler that maps its own errors calls [`problem`] (the same answer)
//! or, when it did nothing before the error and may be run again under the
//! same idempotency key, [`not_run`]. Every answer is built by [`Problem`],
//! as are the other HTTP error answers of the family.
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
    Problem::for_error(error).response()
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
    let mut problem = Problem::for_error(error);
    let failure = problem
        .failure
        .unwrap_or_else(|| Failure::new(FailureKind::Shed));
    problem.failure = Some(failure.with_refusal(token));
    problem.response()
}

/// An `application/problem+json` response (RFC 9457): the one builder of
/// the family's HTTP error answers. [`HttpStatusLayer`], [`problem`] and
/// [`not_run`] build theirs with it, as do a breaker's `503` (tower-breaker's
/// `Http503`) and an idempotency guard's rejections.
///
/// The body is `{"type":"about:blank","title":…,"status":…}` (the title is
/// the status's reason phrase) plus the [members](Self::member) added;
/// `Retry-After` is a wait in whole seconds, rounded up and at least 1
/// (`Retry-After: 0` would invite an immediate retry of what was just
/// refused). A problem made [for an error](Self::for_error) carries the
/// error's [`Failure`] in the response's extensions.
///
/// ```
/// use std::time::Duration;
/// use http::StatusCode;
/// use tower_classify::http_status::Problem;
///
/// let response: http::Response<String> = Problem::new(StatusCode::CONFLICT)
///     .member("code", "order_in_progress")
///     .retry_after(Duration::from_millis(200))
///     .response();
/// assert_eq!(response.status(), 409);
/// assert_eq!(response.headers()["retry-after"], "1");
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// let body: serde_json::Value = serde_json::from_str(response.body()).unwrap();
/// assert_eq!(body["title"], "Conflict");
/// assert_eq!(body["code"], "order_in_progress");
/// ```
#[derive(Debug, Clone)]
pub struct Problem {
    status: StatusCode,
    retry_after: Option<u64>,
    body: serde_json::Map<String, serde_json::Value>,
    failure: Option<Failure>,
}

impl Problem {
    /// A problem of `status`, with no `detail` and no `Retry-After`.
    pub fn new(status: StatusCode) -> Self {
        let mut body = serde_json::Map::new();
        body.insert("type".into(), "about:blank".into());
        body.insert(
            "title".into(),
            status.canonical_reason().unwrap_or("Error").into(),
        );
        body.insert("status".into(), status.as_u16().into());
        Problem {
            status,
            retry_after: None,
            body,
            failure: None,
        }
    }

    /// The problem answering `error`, as [`problem`] answers it: its status,
    /// `Retry-After` and failure from the error's classification (see the
    /// [module docs](self)), its text as the `detail`.
    pub fn for_error(error: &(impl AsDynError + ?Sized)) -> Self {
        Problem::of(error.as_dyn_error(), &Settings::default())
    }

    /// The body's member `name` set to `value`: an extension member such as
    /// a stable `code` (RFC 9457 §3.2), or `type`, `title` or `detail`.
    pub fn member(mut self, name: &str, value: &str) -> Self {
        self.body.insert(name.into(), value.into());
        self
    }

    /// `Retry-After`: `wait` in whole seconds, rounded up, at least 1.
    pub fn retry_after(mut self, wait: Duration) -> Self {
        self.retry_after = Some(ceil_secs(wait));
        self
    }

    fn of(error: &(dyn Error + 'static), settings: &Settings) -> Self {
        let answer = answer(error, &settings.classifier);
        let mut problem = Problem::new(http_status(answer.code));
        if let Some(millis) = answer.pushback.and_then(|ms| u64::try_from(ms).ok()) {
            problem = problem.retry_after(Duration::from_millis(millis));
        }
        if settings.details {
            problem = problem.member("detail", &error.to_string());
        }
        // An error nothing recognises answers 500 and is left to be read as
        // the server error its status says.
        problem.failure = answer
            .outcome
            .as_failure()
            .copied()
            .filter(|_| answer.code != 2);
        problem
    }

    /// The response.
    pub fn response<B: From<String>>(self) -> Response<B> {
        let body = serde_json::Value::Object(self.body).to_string();
        let mut response = Response::new(B::from(body));
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

/// Whole seconds, rounded up (a client waiting the rounded-down value would
/// come back too early) and at least 1 (`0` would invite an immediate retry).
fn ceil_secs(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_round_up_to_whole_seconds_at_least_one() {
        assert_eq!(ceil_secs(Duration::from_millis(1500)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2_001)), 3);
        assert_eq!(ceil_secs(Duration::from_secs(3)), 3);
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::ZERO), 1);
    }
}
