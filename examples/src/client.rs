//! A hyper-util HTTP client as a tower `Service` with buffered bodies, for the
//! examples, the demo and the integration tests.

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder, ServiceExt};

/// The request type every stack in the examples and the tests takes.
pub type HttpRequest = Request<Full<Bytes>>;
/// The response type every stack in the examples and the tests returns: the
/// body is read to the end, so classifiers' body rules can see it and latency
/// includes it.
pub type HttpResponse = Response<Bytes>;
/// A cloneable HTTP client service.
pub type HttpService = BoxCloneSyncService<HttpRequest, HttpResponse, BoxError>;

/// A pooled hyper client that reads each response body to the end.
pub fn http_client() -> HttpService {
    http_client_for::<Full<Bytes>>()
}

/// The same client for requests with body type `B`, for stacks whose layers
/// wrap the body (a dead-letter layer capturing it, a retry layer buffering it).
pub fn http_client_for<B>() -> BoxCloneSyncService<Request<B>, HttpResponse, BoxError>
where
    B: http_body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(256)
        .build::<_, B>(HttpConnector::new());
    let service = ServiceBuilder::new()
        .map_err(BoxError::from)
        .service(client)
        .and_then(|response: Response<hyper::body::Incoming>| async move {
            let (parts, body) = response.into_parts();
            let bytes = body.collect().await?.to_bytes();
            Ok::<_, BoxError>(Response::from_parts(parts, bytes))
        });
    BoxCloneSyncService::new(service)
}
