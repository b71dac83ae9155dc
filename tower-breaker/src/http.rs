//! The HTTP variant: an open circuit answers `503 CIRCUIT_OPEN` instead of
//! failing with an error.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::{header, HeaderValue, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_classify::Classify;
use tower_layer::Layer;
use tower_service::Service;

use crate::admin::BreakerHandle;
use crate::error::CircuitOpen;
use crate::future::Recorder;
use crate::layer::CircuitBreakerLayer;
use crate::service::CircuitBreaker;

/// Like [`CircuitBreakerLayer`], but an open circuit *answers*: `503 Service
/// Unavailable`, a `Retry-After` header in whole seconds (rounded up) with
/// [`CircuitOpen::retry_after`] (the caller's place on the release ramp), or
/// the remaining open time for a call refused before the period's last
/// fifth (absent when neither is known), and a JSON body
///
/// ```json
/// {"code":"CIRCUIT_OPEN","message":"circuit open","retry_after_secs":12}
/// ```
///
/// An error would make a server close the connection without answering, and
/// needs a `HandleErrorLayer` under axum; a response needs neither. The error
/// type stays the inner service's, so it stacks under `axum::Router::layer`
/// as is.
///
/// The answer's `Failure` extension is a [`Shed`](tower_classify::FailureKind::Shed)
/// failure; when the refused request carried a
/// [`RefusalToken`](tower_classify::RefusalToken) (an idempotency guard in
/// front gave it one), the failure carries it, proving to that guard that
/// the service behind the breaker never saw the request.
///
/// It judges each call by its response head and returns the inner body as it
/// is; a gRPC status that arrives in the trailers is not seen. For a gRPC
/// client, use [`into_grpc`](CircuitBreakerLayer::into_grpc) (feature `grpc`),
/// which reads them.
///
/// ```
/// use axum::{routing::get, Router};
/// use tower_breaker::CircuitBreakerLayer;
/// use tower_classify::HttpClassifier;
///
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(CircuitBreakerLayer::new(HttpClassifier::new()).into_http());
/// # drop(app);
/// ```
#[derive(Clone)]
pub struct HttpCircuitBreakerLayer<C> {
    inner: CircuitBreakerLayer<C>,
}

impl<C: fmt::Debug> fmt::Debug for HttpCircuitBreakerLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpCircuitBreakerLayer")
            .field("inner", &self.inner)
            .finish()
    }
}

impl<C> CircuitBreakerLayer<C> {
    /// The same breaker (same shared state), answering `503 CIRCUIT_OPEN`
    /// responses instead of [`CircuitOpen`] errors.
    pub fn into_http(self) -> HttpCircuitBreakerLayer<C> {
        HttpCircuitBreakerLayer { inner: self }
    }
}

impl<C> HttpCircuitBreakerLayer<C> {
    /// The admin handle of this layer's breaker.
    pub fn handle(&self) -> BreakerHandle {
        self.inner.handle()
    }
}

impl<S, C: Clone> Layer<S> for HttpCircuitBreakerLayer<C> {
    type Service = HttpCircuitBreaker<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        HttpCircuitBreaker {
            inner: self.inner.layer(inner),
        }
    }
}

/// A service guarded by a circuit breaker that answers `503` when open; see
/// [`HttpCircuitBreakerLayer`].
#[derive(Clone)]
pub struct HttpCircuitBreaker<S, C> {
    inner: CircuitBreaker<S, C>,
}

impl<S: fmt::Debug, C: fmt::Debug> fmt::Debug for HttpCircuitBreaker<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpCircuitBreaker")
            .field("inner", &self.inner)
            .finish()
    }
}

impl<S, C> HttpCircuitBreaker<S, C> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        self.inner.get_ref()
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        self.inner.get_mut()
    }

    /// The inner service, consuming the breaker.
    pub fn into_inner(self) -> S {
        self.inner.into_inner()
    }
}

impl<S, C, ReqB, B> Service<Request<ReqB>> for HttpCircuitBreaker<S, C>
where
    S: Service<Request<ReqB>, Response = Response<B>>,
    C: Classify<Response<B>, S::Error> + Clone,
    B: From<String>,
{
    type Response = Response<B>;
    type Error = S::Error;
    type Future = HttpResponseFuture<S::Future, C, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready_with(cx, S::poll_ready)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        match self.inner.admit() {
            Ok(permit) => {
                let recorder = permit.map(|p| Recorder::new(p, self.inner.classifier().clone()));
                HttpResponseFuture {
                    state: HttpState::Called {
                        future: self.inner.inner_mut().call(req),
                    },
                    recorder,
                }
            }
            Err(open) => HttpResponseFuture {
                state: HttpState::Rejected {
                    response: Some(open_response(
                        &open.refusing(req.extensions().get().copied()),
                    )),
                },
                recorder: None,
            },
        }
    }
}

/// The `503 CIRCUIT_OPEN` answer for `open`.
fn open_response<B: From<String>>(open: &CircuitOpen) -> Response<B> {
    // A call refused early in an open period has no place on the release
    // ramp; an HTTP caller still gets what an open circuit promises it, the
    // time left.
    let secs = open.retry_after().or(open.remaining()).map(ceil_secs);
    let body = match secs {
        Some(secs) => {
            format!(
                r#"{{"code":"CIRCUIT_OPEN","message":"circuit open","retry_after_secs":{secs}}}"#
            )
        }
        None => {
            r#"{"code":"CIRCUIT_OPEN","message":"circuit open","retry_after_secs":null}"#.to_owned()
        }
    };
    let mut response = Response::new(B::from(body));
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    // Layers around this one (a dead-letter layer, a client breaker) classify
    // the answer as the shed load it is, not as a server error.
    response.extensions_mut().insert(open.failure());
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(secs) = secs {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// Whole seconds, rounded up and at least 1: `Retry-After: 0` would invite
/// an immediate retry into a circuit that is still open.
fn ceil_secs(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

pin_project! {
    /// Response future of [`HttpCircuitBreaker`].
    pub struct HttpResponseFuture<F, C, B> {
        #[pin]
        state: HttpState<F, B>,
        recorder: Option<Recorder<C>>,
    }
}

pin_project! {
    #[project = HttpStateProj]
    enum HttpState<F, B> {
        Called {
            #[pin]
            future: F,
        },
        Rejected {
            response: Option<Response<B>>,
        },
    }
}

impl<F, C, B, E> Future for HttpResponseFuture<F, C, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    C: Classify<Response<B>, E>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            HttpStateProj::Called { future } => {
                let result = ready!(future.poll(cx));
                if let Some(recorder) = this.recorder.as_mut() {
                    recorder.record(result.as_ref());
                }
                *this.recorder = None;
                Poll::Ready(result)
            }
            HttpStateProj::Rejected { response } => Poll::Ready(Ok(response
                .take()
                .expect("HttpResponseFuture polled after completion"))),
        }
    }
}

impl<F, C, B> fmt::Debug for HttpResponseFuture<F, C, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            HttpState::Called { .. } => "called",
            HttpState::Rejected { .. } => "rejected",
        };
        f.debug_struct("HttpResponseFuture")
            .field("state", &state)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(2_001)), 3);
        assert_eq!(ceil_secs(Duration::from_secs(30)), 30);
        assert_eq!(ceil_secs(Duration::ZERO), 1);
    }
}
