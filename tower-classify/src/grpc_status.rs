//! Answering errors as gRPC statuses.
//!
//! A tower stack in front of a gRPC service (or around a gRPC client's
//! channel) fails with errors: an open circuit, an exhausted retry budget, a
//! deadline. Left alone, tonic reports any such error to its caller as
//! `UNKNOWN`, so the caller cannot tell "back off" from "broken".
//! [`GrpcStatusLayer`] turns every error of the service it wraps into a
//! *trailers-only* gRPC response (HTTP 200, `content-type: application/grpc`,
//! `grpc-status` and `grpc-message` in the headers) with the status the
//! error's [classification](crate::ErrorChainClassifier) calls for, and the
//! wait it carries as `grpc-retry-pushback-ms`, which gRPC clients that retry
//! ([gRFC A6]) obey:
//!
//! | failure kind | `grpc-status` | `grpc-retry-pushback-ms` |
//! |---|---|---|
//! | [`Shed`](FailureKind::Shed) (an open circuit, tower's `Overloaded`) | 14 `UNAVAILABLE` | the hint's wait |
//! | [`ServerError`](FailureKind::ServerError), [`Connection`](FailureKind::Connection), [`NotSent`](FailureKind::NotSent) | 14 `UNAVAILABLE` | the hint's wait |
//! | [`RateLimited`](FailureKind::RateLimited) | 8 `RESOURCE_EXHAUSTED` | the hint's wait |
//! | [`Timeout`](FailureKind::Timeout) (a deadline, `Elapsed`) | 4 `DEADLINE_EXCEEDED` | — |
//! | [`Poison`](FailureKind::Poison) | 3 `INVALID_ARGUMENT` | — |
//! | [`Rejected`](FailureKind::Rejected) | 3 `INVALID_ARGUMENT` | — |
//! | an error nothing recognises | 2 `UNKNOWN`, unless the layer's classifier chose what it means (see [`GrpcStatusLayer::classifier`]) | — |
//! | an [ignored](Outcome::Ignored) error (the caller cancelled) | 1 `CANCELLED` | — |
//!
//! A hint of [`DoNotRetry`](RetryHint::DoNotRetry) (or
//! [`Final`](RetryHint::Final)) is sent as pushback `-1`,
//! which tells an A6 client not to retry at all: an exhausted retry budget
//! stops the callers' retries too instead of multiplying them.
//!
//! An error that already *is* a gRPC status (a `tonic::Status` from a
//! tonic layer below) is sent as it is, code and message, once
//! [`GrpcStatusLayer::status_of`] says how to recognise it; otherwise it is
//! classified like any other error, and with the default classifier comes
//! out `UNKNOWN`.
//!
//! After the inner service's `poll_ready` fails, it is never polled or
//! called again: every call gets that error's status.
//!
//! The service's error type becomes [`Infallible`], which is what tonic's
//! server router asks of a service.
//!
//! [gRFC A6]: https://github.com/grpc/proposal/blob/master/A6-client-retries.md

use std::convert::Infallible;
use std::fmt::{self, Write as _};
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use http::Response;
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use crate::classified::Classified;
use crate::error::BoxError;
use crate::error_chain::{ErrorChainClassifier, DEFAULT_UNKNOWN};
use crate::grpc::{GRPC_MESSAGE, GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS};
use crate::outcome::{FailureKind, Outcome, RetryHint};

/// The longest `grpc-message` written, in bytes before percent-encoding.
const MAX_MESSAGE: usize = 512;

/// Turns the errors of the service it wraps into gRPC status responses; see
/// the [module docs](self) for the mapping.
///
/// ```
/// use std::time::Duration;
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_classify::grpc_status::GrpcStatusLayer;
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
}

#[derive(Debug, Clone, Copy)]
struct Settings {
    classifier: ErrorChainClassifier,
    messages: bool,
    status_of: Option<StatusOf>,
}

/// Reads the gRPC status an error already is; see [`GrpcStatusLayer::status_of`].
type StatusOf = fn(&(dyn std::error::Error + 'static)) -> Option<CarriedStatus>;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            classifier: ErrorChainClassifier::new(),
            messages: true,
            status_of: None,
        }
    }
}

/// A gRPC status that an error already is (a `tonic::Status` from a layer
/// below), as [`GrpcStatusLayer::status_of`] reads it: sent as it is
/// instead of being classified.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CarriedStatus {
    /// The `grpc-status` code, sent as given.
    pub code: u32,
    /// The `grpc-message`, percent-encoded and cut as every message is
    /// (and left out under [`without_messages`](GrpcStatusLayer::without_messages)).
    pub message: String,
}

impl CarriedStatus {
    /// The status `code` with `message`.
    pub fn new(code: u32, message: impl Into<String>) -> Self {
        CarriedStatus {
            code,
            message: message.into(),
        }
    }
}

impl GrpcStatusLayer {
    /// The layer with the mapping above, classifying errors with
    /// [`ErrorChainClassifier::new`] and sending each error's text as the
    /// `grpc-message`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Classifies errors with `classifier` instead. Its
    /// [`unknown_as`](ErrorChainClassifier::unknown_as) decides the status
    /// of an error nothing recognises: without it, 2 `UNKNOWN`, as tonic
    /// sends; with it, the status of the table above for the outcome
    /// chosen, even the default's own (rejected 3 `INVALID_ARGUMENT`, a
    /// server error 14 `UNAVAILABLE`, ignored 1 `CANCELLED`).
    pub fn classifier(mut self, classifier: ErrorChainClassifier) -> Self {
        self.settings.classifier = classifier;
        self
    }

    /// Sends no `grpc-message`, for a server whose callers must not see an
    /// upstream's error text (host names, internal paths).
    pub fn without_messages(mut self) -> Self {
        self.settings.messages = false;
        self
    }

    /// Recognises errors that already are a gRPC status, and sends that
    /// status as it is instead of classifying the error. `status_of` is
    /// asked about the error, then each of its
    /// [`source`](std::error::Error::source)s in turn; the first answer
    /// wins. Without it, such an error is classified like any other, which
    /// for a `tonic::Status` (a kind of failure no classifier knows) means
    /// `UNKNOWN` with the default classifier.
    ///
    /// tower-classify does not depend on tonic; a tonic user passes
    ///
    /// ```text
    /// |error| {
    ///     let status = error.downcast_ref::<tonic::Status>()?;
    ///     Some(CarriedStatus::new(status.code() as u32, status.message()))
    /// }
    /// ```
    ///
    /// Here with a stand-in for `tonic::Status`:
    ///
    /// ```
    /// use tower::{service_fn, Layer, ServiceExt};
    /// use tower_classify::grpc_status::{CarriedStatus, GrpcStatusLayer};
    /// use tower_classify::BoxError;
    ///
    /// /// Shaped like `tonic::Status`: a code and a message.
    /// #[derive(Debug)]
    /// struct Status { code: i32, message: String }
    /// impl std::fmt::Display for Status {
    ///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    ///         write!(f, "status: {}, message: {:?}", self.code, self.message)
    ///     }
    /// }
    /// impl std::error::Error for Status {}
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let layer = GrpcStatusLayer::new().status_of(|error| {
    ///     let status = error.downcast_ref::<Status>()?;
    ///     Some(CarriedStatus::new(status.code as u32, status.message.clone()))
    /// });
    /// let not_found = service_fn(|_req: http::Request<()>| async {
    ///     Err::<http::Response<String>, BoxError>(
    ///         Box::new(Status { code: 5, message: "no such user".into() }),
    ///     )
    /// });
    /// let response = layer.layer(not_found).oneshot(http::Request::new(())).await.unwrap();
    /// assert_eq!(response.headers()["grpc-status"], "5"); // NOT_FOUND, not UNKNOWN
    /// assert_eq!(response.headers()["grpc-message"], "no such user");
    /// # }
    /// ```
    pub fn status_of(
        mut self,
        status_of: fn(&(dyn std::error::Error + 'static)) -> Option<CarriedStatus>,
    ) -> Self {
        self.settings.status_of = Some(status_of);
        self
    }
}

impl<S> Layer<S> for GrpcStatusLayer {
    type Service = GrpcStatus<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcStatus {
            inner,
            settings: self.settings,
            failed: None,
        }
    }
}

/// The service made by [`GrpcStatusLayer`].
///
/// A service whose `poll_ready` failed is finished, by tower's contract: it
/// must be neither called nor polled again. So once the inner service's
/// readiness fails, every call is answered with that error's status and
/// the inner service is left alone. A clone starts afresh (its inner
/// service is a clone, with readiness of its own).
#[derive(Debug)]
pub struct GrpcStatus<S> {
    inner: S,
    settings: Settings,
    /// The status headers of the inner service's readiness error, once
    /// `poll_ready` failed: every call from then on is answered with them.
    failed: Option<HeaderMap>,
}

impl<S: Clone> Clone for GrpcStatus<S> {
    fn clone(&self) -> Self {
        GrpcStatus {
            inner: self.inner.clone(),
            settings: self.settings,
            failed: None,
        }
    }
}

impl<S> GrpcStatus<S> {
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

impl<S, Req, B> Service<Req> for GrpcStatus<S>
where
    S: Service<Req, Response = Response<B>>,
    S::Error: Into<BoxError>,
    B: Default,
{
    type Response = Response<B>;
    type Error = Infallible;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if self.failed.is_none() {
            if let Err(error) = ready!(self.inner.poll_ready(cx)) {
                self.failed = Some(status_headers(&error.into(), &self.settings));
            }
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let state = match &self.failed {
            Some(headers) => {
                let mut response = Response::new(());
                *response.headers_mut() = headers.clone();
                State::NotReady {
                    response: Some(response),
                }
            }
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
    /// Response future of [`GrpcStatus`].
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
        NotReady { response: Option<Response<()>> },
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
    B: Default,
{
    type Output = Result<Response<B>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = match this.state.project() {
            StateProj::Called { inner } => match ready!(inner.poll(cx)) {
                Ok(response) => response,
                Err(error) => status_response(&error.into(), this.settings).map(|()| B::default()),
            },
            StateProj::NotReady { response } => response
                .take()
                .expect("polled after completion")
                .map(|()| B::default()),
        };
        Poll::Ready(Ok(response))
    }
}

/// The gRPC status code for an error's classification.
pub fn status_code(outcome: &Outcome) -> u32 {
    match outcome {
        Outcome::Ignored => 1,
        Outcome::Success => 2,
        Outcome::Failure(failure) => match failure.kind {
            FailureKind::Shed
            | FailureKind::ServerError
            | FailureKind::Connection
            | FailureKind::NotSent => 14,
            FailureKind::RateLimited => 8,
            FailureKind::Timeout => 4,
            // The request is wrong: a client's classifier reads the code
            // back as rejected, so a run of bad requests trips no breaker.
            FailureKind::Poison | FailureKind::Rejected => 3,
        },
    }
}

/// What an error comes to, as both status layers answer it (this one and
/// its HTTP twin, [`HttpStatusLayer`](crate::http_status::HttpStatusLayer)):
/// its classification, the gRPC status code for it, and the wait to send
/// (`-1`: do not retry).
pub(crate) struct Answer {
    pub(crate) outcome: Outcome,
    pub(crate) code: u32,
    pub(crate) pushback: Option<i64>,
}

/// The answer to `error`, classified by `classifier`.
pub(crate) fn answer(
    error: &(dyn std::error::Error + 'static),
    classifier: &ErrorChainClassifier,
) -> Answer {
    // An error nothing recognises is `UNKNOWN`, as tonic sends it and a
    // client reads as a server error, unless the layer's classifier chose
    // what it means (`unknown_as`), even as the default's own outcome. The
    // default calls it rejected only so as not to retry it blindly: sent as
    // `INVALID_ARGUMENT`, it would tell every caller its request is wrong.
    let (outcome, code) = match classifier.recognised(error) {
        Some(outcome) => (outcome, status_code(&outcome)),
        None => match classifier.chosen_unknown() {
            Some(chosen) => (chosen, status_code(&chosen)),
            None => (DEFAULT_UNKNOWN, 2),
        },
    };
    // A wait told to remote callers (an open circuit's time left) takes the
    // place of the hint meant for a retry layer in this process.
    let hint = match answer_wait(error, &outcome) {
        Some(wait) => Some(RetryHint::After(wait)),
        None => outcome.as_failure().and_then(|failure| failure.hint),
    };
    // A wait means something only where the status invites a retry.
    let pushback = match hint {
        Some(_) if !matches!(code, 14 | 8) => None,
        Some(RetryHint::After(wait)) => Some(
            u64::try_from(wait.as_millis())
                .unwrap_or(u64::MAX)
                .min(i32::MAX as u64) as i64,
        ),
        Some(RetryHint::DoNotRetry | RetryHint::Final) => Some(-1),
        None => None,
    };
    Answer {
        outcome,
        code,
        pushback,
    }
}

/// The [answer wait](Classified::with_answer_wait) of the `Classified` in
/// `error`'s chain that decided `outcome` (the first one, as the
/// classifier reads it), unless the classifier made something else of it.
fn answer_wait(error: &(dyn std::error::Error + 'static), outcome: &Outcome) -> Option<Duration> {
    let mut current = Some(error);
    while let Some(err) = current {
        if let Some(classified) = err.downcast_ref::<Classified>() {
            return classified
                .answer_wait()
                .filter(|_| outcome.as_failure() == Some(&classified.failure()));
        }
        // As the classifier walks it: `io::Error::source` skips the error
        // it wraps.
        current = match err
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    }
    None
}

fn status_response(error: &BoxError, settings: &Settings) -> Response<()> {
    let mut response = Response::new(());
    *response.headers_mut() = status_headers(error, settings);
    response
}

/// The headers of a trailers-only response answering `error`.
fn status_headers(error: &BoxError, settings: &Settings) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    if let Some(carried) = carried_status(error, settings) {
        headers.insert(GRPC_STATUS, HeaderValue::from(carried.code));
        if settings.messages {
            insert_message(&mut headers, &carried.message);
        }
        return headers;
    }
    let answer = answer(&**error, &settings.classifier);
    headers.insert(GRPC_STATUS, HeaderValue::from(answer.code));
    if settings.messages {
        insert_message(&mut headers, &error.to_string());
    }
    let pushback = answer.pushback;
    if let Some(millis) = pushback {
        headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(millis));
    }
    headers
}

fn insert_message(headers: &mut HeaderMap, text: &str) {
    if let Ok(value) = HeaderValue::try_from(percent_encode(text)) {
        headers.insert(GRPC_MESSAGE, value);
    }
}

/// The status the first error of `error`'s chain that
/// [`status_of`](GrpcStatusLayer::status_of) recognises carries.
fn carried_status(error: &BoxError, settings: &Settings) -> Option<CarriedStatus> {
    let status_of = settings.status_of?;
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(&**error);
    while let Some(error) = next {
        if let Some(status) = status_of(error) {
            return Some(status);
        }
        next = error.source();
    }
    None
}

/// `text` as a `grpc-message`: the gRPC HTTP/2 protocol's percent-encoding
/// of every byte outside space and visible ASCII, of `%` itself and of a
/// space at either end; at most
/// [`MAX_MESSAGE`] bytes of the text, cut at a character boundary.
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

#[cfg(test)]
mod tests {
    use super::*;

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
