//! One layer for a whole service config: each call gets its method's policy.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_classify::deadline::Deadline;
use tower_classify::{BoxError, ConfigError};
use tower_layer::Layer;
use tower_service::Service;

use super::{GrpcRetryClassifier, MethodConfig, ServiceConfig};
use crate::body::TryCloneBody;
use crate::budget::TokenBucketBudget;
use crate::error::DeadlineExceeded;
use crate::hedge::HedgeLayer;
use crate::replay::{HttpReplay, Replay};
use crate::RetryLayer;

enum MethodLayer {
    Retry(RetryLayer<GrpcRetryClassifier, HttpReplay>),
    Hedge(HedgeLayer<GrpcRetryClassifier, HttpReplay>),
}

struct Routes {
    config: ServiceConfig,
    // One per method config, in the same order.
    layers: Vec<MethodLayer>,
}

/// Applies a gRPC service config to every call: the request path
/// (`/package.Service/Method`) picks the method config, as
/// [`ServiceConfig::method_config`] does, and the call goes through that
/// config's retry layer ([`MethodConfig::retry_builder`](super::MethodConfig::retry_builder))
/// or hedge layer ([`MethodConfig::hedge_builder`](super::MethodConfig::hedge_builder)).
/// A path no method config covers is sent once, as it is. A hedged
/// method's `timeout` bounds the whole call (it ends with
/// [`DeadlineExceeded`](crate::error::DeadlineExceeded)) and is the
/// [`Deadline`](tower_classify::deadline::Deadline) its hedges respect,
/// as a retried method's is the deadline of its retry loop.
///
/// Every method shares one [`TokenBucketBudget`] (A6 throttles per server), and
/// each method config's layer is named after its first name
/// (`greeter.Greeter/SayHello`), so its metrics have their own series.
///
/// ```
/// use tower::{service_fn, Layer, ServiceExt};
/// use tower_retry_budget::service_config::ServiceConfig;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), tower_classify::BoxError> {
/// let config = ServiceConfig::from_json(r#"{
///   "methodConfig": [
///     { "name": [{ "service": "pkg.Svc", "method": "Get" }],
///       "retryPolicy": { "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "1s",
///                        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"] } }
///   ],
///   "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.1 }
/// }"#)?;
/// let layer = config.layer(config.retry_throttle())?;
/// let attempts = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
/// let seen = attempts.clone();
/// let server = service_fn(move |_: http::Request<String>| {
///     seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
///     async { Ok::<_, tower_classify::BoxError>(
///         http::Response::builder().header("grpc-status", "14").body(())?) }
/// });
/// let client = layer.layer(server);
/// for path in ["/pkg.Svc/Get", "/pkg.Svc/Put"] {
///     let request = http::Request::post(path).body(String::new())?;
///     client.clone().oneshot(request).await?;
/// }
/// // Get: 3 attempts by its retry policy; Put: no method config, one.
/// assert_eq!(attempts.load(std::sync::atomic::Ordering::SeqCst), 4);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ServiceConfigLayer {
    routes: Arc<Routes>,
}

impl fmt::Debug for ServiceConfigLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceConfigLayer")
            .field("method_configs", &self.routes.layers.len())
            .finish_non_exhaustive()
    }
}

impl ServiceConfig {
    /// The layer applying this config to every call by its path; see
    /// [`ServiceConfigLayer`]. `throttle` is the server's
    /// [`TokenBucketBudget`], usually [`retry_throttle`](Self::retry_throttle).
    /// Errors name the method config (`methodConfig[1].retryPolicy.backoffMultiplier`).
    pub fn layer(
        &self,
        throttle: Option<Arc<TokenBucketBudget>>,
    ) -> Result<ServiceConfigLayer, ConfigError> {
        let mut layers = Vec::with_capacity(self.method_configs.len());
        for (entry, method) in self.method_configs.iter().enumerate() {
            let path = format!("methodConfig[{entry}]");
            let within = |error: ConfigError| error.within(&path);
            let name = method
                .names
                .first()
                .map_or_else(String::new, |name| match &name.method {
                    Some(m) => format!("{}/{m}", name.service),
                    None if name.service.is_empty() => String::from("default"),
                    None => name.service.clone(),
                });
            let layer = match method.hedge_builder(throttle.as_ref()) {
                Some(hedge) => MethodLayer::Hedge(hedge.name(name).build().map_err(within)?),
                None => MethodLayer::Retry(
                    method
                        .retry_builder(throttle.as_ref())
                        .map_err(within)?
                        .name(name)
                        .build()
                        .map_err(within)?,
                ),
            };
            layers.push(layer);
        }
        Ok(ServiceConfigLayer {
            routes: Arc::new(Routes {
                config: self.clone(),
                layers,
            }),
        })
    }
}

impl<S> Layer<S> for ServiceConfigLayer {
    type Service = PerMethod<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PerMethod {
            inner,
            routes: Arc::clone(&self.routes),
        }
    }
}

/// The service of a [`ServiceConfigLayer`].
#[derive(Clone)]
pub struct PerMethod<S> {
    inner: S,
    routes: Arc<Routes>,
}

impl<S: fmt::Debug> fmt::Debug for PerMethod<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerMethod")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, B, Rb: 'static> Service<Request<B>> for PerMethod<S>
where
    S: Service<Request<B>, Response = Response<Rb>> + Clone,
    S::Error: Into<BoxError>,
    B: TryCloneBody,
{
    type Response = Response<Rb>;
    type Error = BoxError;
    type Future = PerMethodFuture<S, Request<B>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let entry = self.routes.config.entry_for_path(request.uri().path());
        // A retried or hedged method's layer takes the service made ready
        // by `poll_ready` for its future (leaving a fresh clone here) only
        // when it may send more than one attempt, as `Retry` and `Hedge`
        // do; any other call is made on it in place.
        let kind = match entry.map(|entry| &self.routes.layers[entry]) {
            None => Kind::Plain {
                future: self.inner.call(request),
            },
            Some(MethodLayer::Retry(layer)) => Kind::Retry {
                future: crate::service::start(&layer.policy, &mut self.inner, request),
            },
            Some(MethodLayer::Hedge(layer)) => {
                // The method's timeout (which the hedge layer does not keep
                // itself) bounds the whole call: as the caller's deadline
                // for the hedges (none starts past it), and as a limit on
                // the call itself.
                let config = entry.map(|entry| &self.routes.config.method_configs[entry]);
                let timeout = config.and_then(MethodConfig::timeout);
                let now = Instant::now();
                let until = timeout.and_then(|timeout| now.checked_add(timeout));
                let caller = request.extensions().get::<Deadline>().map(|c| c.instant());
                let until = until.into_iter().chain(caller).min();
                if let Some(until) = until {
                    request.extensions_mut().insert(Deadline::at(until));
                }
                Kind::Hedge {
                    future: Some(crate::hedge::service::start(
                        &layer.policy,
                        &mut self.inner,
                        request,
                    )),
                    until: until.map(|until| (until, until.saturating_duration_since(now))),
                    timer: None,
                }
            }
        };
        PerMethodFuture { kind }
    }
}

pin_project! {
    /// The response future of [`PerMethod`].
    pub struct PerMethodFuture<S, Req>
    where
        S: Service<Req>,
        HttpReplay: Replay<Req>,
    {
        #[pin]
        kind: Kind<S, Req>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<S, Req>
    where
        S: Service<Req>,
        HttpReplay: Replay<Req>,
    {
        // A call no method config covers.
        Plain { #[pin] future: S::Future },
        Retry { #[pin] future: crate::future::ResponseFuture<S, Req, GrpcRetryClassifier, HttpReplay> },
        Hedge {
            // `None` once the deadline ended the call: its attempts go then.
            #[pin]
            future: Option<crate::hedge::ResponseFuture<S, Req, GrpcRetryClassifier, HttpReplay>>,
            // When the method's timeout ends the call; its timer is made on
            // the first poll that finds the call unanswered.
            until: Option<(Instant, Duration)>,
            #[pin]
            timer: Option<Sleep>,
        },
    }
}

impl<S, B, Rb: 'static> Future for PerMethodFuture<S, Request<B>>
where
    S: Service<Request<B>, Response = Response<Rb>>,
    S::Error: Into<BoxError>,
    B: TryCloneBody,
{
    type Output = Result<Response<Rb>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Plain { future } => future.poll(cx).map_err(Into::into),
            KindProj::Retry { future } => future.poll(cx),
            KindProj::Hedge {
                mut future,
                until,
                mut timer,
            } => {
                let hedged = future
                    .as_mut()
                    .as_pin_mut()
                    .expect("PerMethodFuture polled after it completed");
                if let Poll::Ready(result) = hedged.poll(cx) {
                    future.set(None);
                    return Poll::Ready(result);
                }
                let Some((until, total)) = *until else {
                    return Poll::Pending;
                };
                if timer.is_none() {
                    timer.set(Some(tokio::time::sleep_until(until)));
                }
                ready!(timer.as_pin_mut().expect("set above").poll(cx));
                let attempts = future
                    .as_ref()
                    .as_pin_ref()
                    .map_or(0, |hedged| hedged.attempts_sent());
                // Every attempt still in flight is dropped now, not when the
                // caller drops this future.
                future.set(None);
                Poll::Ready(Err(Box::new(DeadlineExceeded::new(
                    total, attempts, None, None, None,
                ))))
            }
        }
    }
}

impl<S, Req> fmt::Debug for PerMethodFuture<S, Req>
where
    S: Service<Req>,
    HttpReplay: Replay<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            Kind::Plain { .. } => "Plain",
            Kind::Retry { .. } => "Retry",
            Kind::Hedge { .. } => "Hedge",
        };
        f.debug_tuple("PerMethodFuture").field(&kind).finish()
    }
}
