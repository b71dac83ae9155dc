//! What a breaker answers a call it refuses, and how it watches the calls it
//! admits: [`Plain`] (the default) or, with the `http` feature, `Http503`
//! or `HttpError`; chosen with
//! [`CircuitBreakerLayer::answer`](crate::CircuitBreakerLayer::answer).
//!
//! One breaker, one service type: the answer is a type parameter of
//! [`CircuitBreakerLayer`](crate::CircuitBreakerLayer),
//! [`CircuitBreaker`](crate::CircuitBreaker) and
//! [`ResponseFuture`](crate::future::ResponseFuture), and the protocol is
//! the classifier's business ([crate docs](crate#with-axum) for gRPC).

#[cfg(feature = "http")]
use http::Response;
#[cfg(feature = "http")]
use tower_classify::status::Problem;

/// A refused call fails with a [`CircuitOpen`](crate::CircuitOpen) error,
/// boxed, and every call is judged by its result as it arrives (its
/// response head, or its error). For any request and response type; the
/// default. Not for gRPC: a call that answers `200` and fails in its
/// trailers is judged a success here; use `HttpError`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Plain;

/// For HTTP servers: a refused call is *answered*, `503 Service
/// Unavailable`, a `Retry-After` header in whole seconds (rounded up, at
/// least 1) with the wait [`CircuitOpen::failure`](crate::CircuitOpen::failure)
/// describes (absent when none is known), and a problem details body
/// (`application/problem+json`, RFC 9457)
///
/// ```json
/// {"type":"about:blank","title":"Service Unavailable","status":503,"detail":"circuit open","code":"CIRCUIT_OPEN"}
/// ```
///
/// It is [`Problem::for_error`](tower_classify::status::Problem::for_error)'s
/// answer to the `CircuitOpen` with the stable `code` added.
///
/// An error would make a server close the connection without answering, and
/// needs a `HandleErrorLayer` under axum; a response needs neither. The error
/// type stays the inner service's, so it stacks under `axum::Router::layer`
/// as is.
///
/// The answer's `Failure` extension is the refusal's, with the
/// [`RefusalToken`](tower_classify::RefusalToken) when the request carried
/// one (see [`CircuitOpen`](crate::CircuitOpen)).
///
/// Each call is judged by its response head, and the inner body is returned
/// as it is: a status that arrives in the trailers (gRPC) is not seen. A
/// client whose calls can fail at the end of their body answers
/// [`HttpError`].
///
/// ```
/// use axum::{routing::get, Router};
/// use tower_breaker::answer::Http503;
/// use tower_breaker::CircuitBreakerLayer;
/// use tower_classify::HttpClassifier;
///
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(CircuitBreakerLayer::new(HttpClassifier::new()).answer(Http503));
/// # drop(app);
/// ```
#[cfg(feature = "http")]
#[derive(Debug, Clone, Copy, Default)]
pub struct Http503;

/// For HTTP and gRPC clients (whose servers report most failures in the
/// trailers): a refused call fails with a [`CircuitOpen`](crate::CircuitOpen)
/// error, and each response body comes back in a
/// [`SettleBody`](tower_classify::SettleBody); when the classifier's
/// [`classify_head`](tower_classify::Classify::classify_head) leaves the call
/// open, the body holds the call's place in the breaker until it ends, and
/// [`classify_end`](tower_classify::Classify::classify_end) judges the end.
///
/// # Rules
///
/// - The classifier judges the head first; a head it settles is recorded at
///   once, and its body passes through with nothing left to do. A
///   [`GrpcClassifier`](tower_classify::GrpcClassifier) leaves open only a
///   `200` gRPC response without `grpc-status`; a trailers-only response,
///   another status or content type is settled by the head.
/// - A body left open records what the classifier makes of its end: its
///   trailers (for a `GrpcClassifier`, `grpc-status: 0` a success, `14` a
///   server error that counts towards opening, none at all `UNKNOWN`, a
///   server error), a body error (by default a
///   [connection](tower_classify::FailureKind::Connection) failure), or
///   the caller dropping it before its end. A drop the classifier calls
///   [ignored](tower_classify::Outcome::Ignored), as it does by default,
///   records nothing, and a half-open probe's slot is given back, as for a
///   dropped response future; so does
///   [`SettleBody::into_inner`](tower_classify::SettleBody::into_inner)
///   before the end.
/// - A body over before it began (its inner body is at its end already) is
///   judged at once, as a body that ended without trailers.
/// - A half-open probe is judged at its end too, so a probe that is a long
///   stream holds its slot while it runs; past
///   [`probe_timeout`](crate::Builder::probe_timeout) it is lapsed like a
///   hung probe: the breaker reopens, and the stream's later `grpc-status: 0`
///   counts for nothing. For long streams (watches, subscriptions), set
///   `probe_timeout` above the longest one, or keep them out of the breaker
///   that guards the unary calls.
/// - A [slow-call threshold](crate::Builder::slow_call_threshold) times the
///   call up to its response head, so a long server stream is not a slow
///   call.
/// - Through tonic, an open circuit reaches the caller as a `tonic::Status`
///   whose `source()` is the `CircuitOpen`, with the code `UNKNOWN` (tonic's
///   for any service error), unless tower-classify's `GrpcStatusLayer` in
///   front of the breaker answers it as `UNAVAILABLE` with
///   `grpc-retry-pushback-ms`.
/// - Retries still decide on the head: once a response has started, gRPC
///   does not retry it (gRFC A6), so a failure in the trailers reaches the
///   breaker, not a retry layer.
///
/// The response type is `Response<SettleBody<B, OpenCall<C>>>` for an inner
/// service answering `Response<B>` (see [`OpenCall`](crate::OpenCall)), and
/// the error is a [`BoxError`](tower_classify::BoxError) (a `CircuitOpen`
/// while open). Both fit tonic: a generated client takes a `Channel` wrapped
/// in this layer as its `GrpcService`. A refused request's
/// [`RefusalToken`](tower_classify::RefusalToken), when it carries one, goes
/// into the `CircuitOpen` (see there).
///
/// ```
/// use std::convert::Infallible;
/// use bytes::Bytes;
/// use http::{HeaderMap, Request, Response};
/// use http_body_util::{BodyExt, Full};
/// use tower::{service_fn, Layer, ServiceExt};
/// use tower_breaker::answer::HttpError;
/// use tower_breaker::{CircuitBreakerLayer, CircuitOpen, Policy, State};
/// use tower_classify::{BoxError, GrpcClassifier};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// let layer = CircuitBreakerLayer::builder()
///     .policy(Policy::consecutive_failures(2))
///     .build(GrpcClassifier::new())?
///     .answer(HttpError);
/// // Every call: `200`, one message, then trailers `grpc-status: 14`.
/// let service = layer.layer(service_fn(|_req: Request<()>| async {
///     let mut trailers = HeaderMap::new();
///     trailers.insert("grpc-status", "14".parse().unwrap());
///     let body = Full::new(Bytes::from_static(b"\0\0\0\0\0"))
///         .with_trailers(async move { Some(Ok::<_, Infallible>(trailers)) });
///     let response = Response::builder().header("content-type", "application/grpc");
///     Ok::<_, BoxError>(response.body(body)?)
/// }));
///
/// for _ in 0..2 {
///     let response = service.clone().oneshot(Request::new(())).await?;
///     assert_eq!(response.status(), 200);
///     assert!(response.body().awaits_end());
///     // Recorded when the body ends, from its trailers.
///     response.into_body().collect().await?;
/// }
/// assert_eq!(layer.handle().get("default").unwrap().state, State::Open);
/// let refused = service.clone().oneshot(Request::new(())).await.err();
/// assert!(refused.is_some_and(|err| err.is::<CircuitOpen>()));
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "http")]
#[derive(Debug, Clone, Copy, Default)]
pub struct HttpError;

/// The `503 CIRCUIT_OPEN` answer for `open`: its problem response, whose
/// `Retry-After` is the wait `open` tells remote callers and whose `Failure`
/// extension (the refusal's, with its token) makes the layers around it
/// classify it as the shed load it is, not as a server error.
#[cfg(feature = "http")]
pub(crate) fn open_response<B: From<String>>(open: &crate::error::CircuitOpen) -> Response<B> {
    Problem::for_error(open as &(dyn std::error::Error + 'static))
        .member("code", "CIRCUIT_OPEN")
        .response()
}
