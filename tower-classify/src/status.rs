//! Answering errors as gRPC statuses ([`GrpcStatusLayer`]) or HTTP problem
//! responses ([`HttpStatusLayer`], [`Problem`]): why, the mapping and the
//! waits sent are in the [crate docs](crate#errors-as-grpc-statuses-or-http-problems).

use std::convert::Infallible;
use std::error::Error;
use std::fmt::{self, Write as _};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use crate::classified::Classified;
use crate::error::BoxError;
use crate::error_chain::{next_in_chain, AsDynError, ErrorChainClassifier, DEFAULT_UNKNOWN};
use crate::grpc::{GRPC_MESSAGE, GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS};
use crate::outcome::{Failure, FailureKind, Outcome, RetryHint};
use crate::refusal::RefusalToken;

/// The longest `grpc-message` written, in bytes before percent-encoding.
const MAX_MESSAGE: usize = 512;

/// What both layers are configured with.
#[derive(Debug, Clone, Copy, Default)]
struct Settings {
    classifier: ErrorChainClassifier,
    without_details: bool,
}

/// The constructor, builder methods and `Layer` impl both layers share;
/// `$text` names where the error's text goes.
macro_rules! status_layer {
    ($layer:ident, $text:literal) => {
        impl $layer {
            /// The layer, classifying errors with [`ErrorChainClassifier::new`] and
            #[doc = concat!("sending each error's text as its ", $text, ".")]
            pub fn new() -> Self {
                Self::default()
            }

            /// Classifies errors with `classifier` instead (its
            /// [`unknown_as`](ErrorChainClassifier::unknown_as), if chosen,
            /// decides what an unrecognised error answers).
            pub fn classifier(mut self, classifier: ErrorChainClassifier) -> Self {
                self.settings.classifier = classifier;
                self
            }

            #[doc = concat!("Sends no error text (no ", $text, "), for a server whose callers")]
            /// must not see an upstream's error text (host names, internal paths).
            pub fn without_details(mut self) -> Self {
                self.settings.without_details = true;
                self
            }
        }

        impl<S> Layer<S> for $layer {
            type Service = StatusService<S, Self>;

            fn layer(&self, inner: S) -> Self::Service {
                StatusService::new(inner, *self)
            }
        }
    };
}

status_layer!(HttpStatusLayer, "`detail`");
status_layer!(GrpcStatusLayer, "`grpc-message`");

/// Turns the errors of the service it wraps into problem responses; see the
/// [module docs](self).
///
/// ```
/// use std::time::Duration;
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_classify::status::HttpStatusLayer;
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

/// Turns the errors of the service it wraps into gRPC status responses; see
/// the [module docs](self).
///
/// ```
/// use std::time::Duration;
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_classify::status::GrpcStatusLayer;
/// use tower_classify::{BoxError, Classified};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // A layer below refused the call, as an open circuit does.
/// let refused = service_fn(|_req: http::Request<()>| async {
///     Err::<http::Response<String>, BoxError>(
///         Classified::shed("circuit open", Some(Duration::from_secs(2))).into(),
///     )
/// });
/// let service = ServiceBuilder::new().layer(GrpcStatusLayer::new()).service(refused);
///
/// let response = service.oneshot(http::Request::new(())).await.unwrap();
/// assert_eq!(response.headers()["grpc-status"], "14");
/// assert_eq!(response.headers()["grpc-retry-pushback-ms"], "2000");
/// assert_eq!(response.headers()["grpc-message"], "circuit open");
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcStatusLayer {
    settings: Settings,
    status_of: Option<StatusOf>,
}

/// Reads the gRPC status an error already is, `(code, message)`; see
/// [`GrpcStatusLayer::status_of`].
type StatusOf = fn(&(dyn Error + 'static)) -> Option<(u32, String)>;

impl GrpcStatusLayer {
    /// Sends an error that already is a gRPC status as that status, not
    /// classified: `status_of` is asked about the error, then each of its
    /// sources, and the first answer's code is sent as given, its message as
    /// every message is. Without it, a `tonic::Status` answers `UNKNOWN`.
    /// A tonic user passes
    ///
    /// ```text
    /// |error| {
    ///     let status = error.downcast_ref::<tonic::Status>()?;
    ///     Some((status.code() as u32, status.message().to_owned()))
    /// }
    /// ```
    pub fn status_of(mut self, status_of: StatusOf) -> Self {
        self.status_of = Some(status_of);
        self
    }
}

/// How a status layer answers an error with a response of body `B`.
pub(crate) trait AnswerError<B>: Copy {
    /// The response answering `error`.
    fn answer_error(&self, error: &(dyn Error + 'static)) -> Response<B>;
}

impl<B: From<String>> AnswerError<B> for HttpStatusLayer {
    fn answer_error(&self, error: &(dyn Error + 'static)) -> Response<B> {
        Problem::of(error, &self.settings).response()
    }
}

/// A trailers-only response.
impl<B: Default> AnswerError<B> for GrpcStatusLayer {
    fn answer_error(&self, error: &(dyn Error + 'static)) -> Response<B> {
        let mut response = Response::new(B::default());
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        let carried = self.status_of.and_then(|status_of| {
            std::iter::successors(Some(error), |&error| error.source()).find_map(status_of)
        });
        let (code, message) = match carried {
            Some(carried) => carried,
            None => {
                let answer = answer(error, &self.settings.classifier);
                if let Some(millis) = answer.pushback {
                    headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(millis));
                }
                (answer.code, error.to_string())
            }
        };
        headers.insert(GRPC_STATUS, HeaderValue::from(code));
        if !self.settings.without_details {
            if let Ok(value) = HeaderValue::try_from(percent_encode(&message)) {
                headers.insert(GRPC_MESSAGE, value);
            }
        }
        response
    }
}

/// The service of [`HttpStatusLayer`] and [`GrpcStatusLayer`] (`L`).
///
/// Once the inner service's readiness fails, every call is answered with
/// that error's answer and the inner service is left alone (tower's
/// contract: it is finished). A clone starts afresh.
#[derive(Debug)]
pub struct StatusService<S, L> {
    inner: S,
    layer: L,
    failed: Option<Arc<dyn Error + Send + Sync>>,
}

impl<S: Clone, L: Copy> Clone for StatusService<S, L> {
    fn clone(&self) -> Self {
        StatusService::new(self.inner.clone(), self.layer)
    }
}

impl<S, L> StatusService<S, L> {
    fn new(inner: S, layer: L) -> Self {
        StatusService {
            inner,
            layer,
            failed: None,
        }
    }

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

impl<S, L, Req, B> Service<Req> for StatusService<S, L>
where
    S: Service<Req, Response = Response<B>>,
    S::Error: Into<BoxError>,
    L: AnswerError<B>,
{
    type Response = Response<B>;
    type Error = Infallible;
    type Future = ResponseFuture<S::Future, L>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if self.failed.is_none() {
            if let Err(error) = ready!(self.inner.poll_ready(cx)) {
                let error: BoxError = error.into();
                self.failed = Some(Arc::from(error));
            }
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let state = match &self.failed {
            Some(error) => State::NotReady {
                error: Some(Arc::clone(error)),
            },
            None => State::Called {
                inner: self.inner.call(request),
            },
        };
        ResponseFuture {
            state,
            layer: self.layer,
        }
    }
}

pin_project! {
    /// Response future of [`StatusService`].
    pub struct ResponseFuture<F, L> {
        #[pin]
        state: State<F>,
        layer: L,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Called { #[pin] inner: F },
        NotReady { error: Option<Arc<dyn Error + Send + Sync>> },
    }
}

impl<F, L> fmt::Debug for ResponseFuture<F, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, L, B, E> Future for ResponseFuture<F, L>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
    L: AnswerError<B>,
{
    type Output = Result<Response<B>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = match this.state.project() {
            StateProj::Called { inner } => match ready!(inner.poll(cx)) {
                Ok(response) => response,
                Err(error) => this.layer.answer_error(&*error.into()),
            },
            StateProj::NotReady { error } => {
                let error = error.take().expect("polled after completion");
                this.layer.answer_error(&*error)
            }
        };
        Poll::Ready(Ok(response))
    }
}

/// The gRPC status code and the HTTP status (gRPC's own mapping; 499 is
/// "client closed request") answering an error's classification.
fn statuses(outcome: &Outcome) -> (u32, StatusCode) {
    match outcome {
        Outcome::Ignored => (1, StatusCode::from_u16(499).expect("499 is a valid status")),
        Outcome::Success => UNKNOWN,
        Outcome::Failure(failure) => match failure.kind {
            FailureKind::Shed
            | FailureKind::ServerError
            | FailureKind::Connection
            | FailureKind::NotSent => (14, StatusCode::SERVICE_UNAVAILABLE),
            FailureKind::RateLimited => (8, StatusCode::TOO_MANY_REQUESTS),
            FailureKind::Timeout => (4, StatusCode::GATEWAY_TIMEOUT),
            // The request is wrong: a client's classifier reads the code
            // back as rejected, so a run of bad requests trips no breaker.
            FailureKind::Poison | FailureKind::Rejected => (3, StatusCode::BAD_REQUEST),
        },
    }
}

/// `UNKNOWN`, as tonic answers an error it does not know: a server error.
const UNKNOWN: (u32, StatusCode) = (2, StatusCode::INTERNAL_SERVER_ERROR);

/// An error as both layers answer it: its gRPC `code` and HTTP `status`;
/// `pushback` `-1`: do not retry.
struct Answer {
    outcome: Outcome,
    code: u32,
    status: StatusCode,
    pushback: Option<i64>,
}

/// The answer to `error`, classified by `classifier`.
fn answer(error: &(dyn Error + 'static), classifier: &ErrorChainClassifier) -> Answer {
    // An unrecognised error is `UNKNOWN` unless `unknown_as` chose: the
    // default's `Rejected` means "do not retry blindly", not "your request
    // is wrong" (`INVALID_ARGUMENT`).
    let (outcome, (code, status)) = match classifier.decided(error) {
        Some(outcome) => (outcome, statuses(&outcome)),
        None => (DEFAULT_UNKNOWN, UNKNOWN),
    };
    // A wait told to remote callers (an open circuit's time left) takes the
    // place of the hint meant for a retry layer in this process.
    let hint = match answer_wait(error) {
        Some(wait) => Some(RetryHint::After(wait)),
        None => outcome.as_failure().and_then(|failure| failure.hint),
    };
    // A wait means something only where the status invites a retry.
    let pushback = match hint {
        Some(_) if !matches!(code, 14 | 8) => None,
        Some(RetryHint::After(wait)) => Some(wait.as_millis().min(i32::MAX as u128) as i64),
        Some(RetryHint::DoNotRetry | RetryHint::Final) => Some(-1),
        None => None,
    };
    Answer {
        outcome,
        code,
        status,
        pushback,
    }
}

/// The [answer wait](Classified::with_answer_wait) of the first
/// `Classified` in `error`'s chain: the one that decided its outcome.
fn answer_wait(error: &(dyn Error + 'static)) -> Option<Duration> {
    std::iter::successors(Some(error), |&err| next_in_chain(err))
        .find_map(|err| err.downcast_ref::<Classified>())?
        .answer_wait
}

/// `text` as a `grpc-message`: percent-encoded as gRPC does (every byte
/// outside visible ASCII and space, `%`, a space at either end), cut at a
/// character boundary to [`MAX_MESSAGE`] bytes.
fn percent_encode(text: &str) -> String {
    let mut end = text.len().min(MAX_MESSAGE);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let text = &text[..end];
    let mut encoded = String::with_capacity(end);
    for (at, byte) in text.bytes().enumerate() {
        // HTTP/2 refuses a field value that starts or ends with whitespace
        // (RFC 9113, section 8.2.1), so a space there is encoded too.
        let edge_space = byte == b' ' && (at == 0 || at + 1 == text.len());
        if (0x20..=0x7e).contains(&byte) && byte != b'%' && !edge_space {
            encoded.push(char::from(byte));
        } else {
            let _ = write!(encoded, "%{byte:02X}");
        }
    }
    encoded
}

/// [`Problem::for_error`]'s response, marked as a refusal of the request
/// that carried `token` (from its extensions), so an idempotency guard in
/// front frees the key. Only for a handler that did nothing before the
/// error. An error nothing recognises is carried as
/// [`Shed`](FailureKind::Shed), and still answers `500`.
///
/// ```
/// use std::time::Duration;
/// use tower_classify::status::not_run;
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

/// An `application/problem+json` response (RFC 9457): its body is
/// `{"type":"about:blank","title":…,"status":…}` (the status's reason
/// phrase) plus the [members](Self::member) added. One made
/// [for an error](Self::for_error) carries its [`Failure`] in the extensions.
///
/// ```
/// use std::time::Duration;
/// use http::StatusCode;
/// use tower_classify::status::Problem;
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
        let title = status.canonical_reason().unwrap_or("Error");
        let mut body = serde_json::Map::new();
        body.insert("type".into(), "about:blank".into());
        body.insert("title".into(), title.into());
        body.insert("status".into(), status.as_u16().into());
        Problem {
            status,
            retry_after: None,
            body,
            failure: None,
        }
    }

    /// The problem answering `error` as [`HttpStatusLayer::new`] does, for
    /// a handler that maps its own errors (a guard in front keeps the key;
    /// see [`not_run`]).
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
        let mut problem = Problem::new(answer.status);
        if let Some(millis) = answer.pushback.and_then(|ms| u64::try_from(ms).ok()) {
            problem = problem.retry_after(Duration::from_millis(millis));
        }
        if !settings.without_details {
            problem = problem.member("detail", &error.to_string());
        }
        // An error nothing recognises answers 500 and is left to be read as
        // the server error its status says.
        let failure = answer.outcome.as_failure().copied();
        problem.failure = failure.filter(|_| answer.code != 2);
        problem
    }

    /// The response.
    pub fn response<B: From<String>>(self) -> Response<B> {
        let body = serde_json::Value::Object(self.body).to_string();
        let mut response = Response::new(B::from(body));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        let problem_json = HeaderValue::from_static("application/problem+json");
        headers.insert(CONTENT_TYPE, problem_json);
        if let Some(secs) = self.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Some(failure) = self.failure {
            response.extensions_mut().insert(failure);
        }
        response
    }
}

/// Whole seconds, rounded up (not too early) and at least 1 (`0` invites
/// an immediate retry).
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

    #[test]
    fn messages_are_percent_encoded_and_bounded() {
        assert_eq!(percent_encode("circuit open"), "circuit open");
        assert_eq!(percent_encode("100% é"), "100%25 %C3%A9");
        assert_eq!(percent_encode("line\nbreak"), "line%0Abreak");
        assert_eq!(percent_encode(" padded "), "%20padded%20");
        let long = "é".repeat(MAX_MESSAGE);
        let encoded = percent_encode(&long);
        assert_eq!(encoded.len(), MAX_MESSAGE * 3, "cut at a char boundary");
        assert!(HeaderValue::try_from(encoded).is_ok());
    }
}
