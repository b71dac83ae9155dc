//! A reqwest client under the family's retry layer: reqwest's own error
//! type goes through unchanged (no `map_err`), a 503 is retried with the
//! same body, a POST is not.
//!
//! ```sh
//! cargo run -p examples --example reqwest_client
//! ```
//!
//! reqwest's `Client` is a tower `Service<reqwest::Request>`. The family's
//! HTTP layers speak `http::Request` / `http::Response`, and reqwest converts
//! both ways (`reqwest::Request::try_from`, `http::Response::from`), so one
//! small service adapts it. Its error is `reqwest::Error`: the layers box it
//! before classifying, and the classifier reads its `source()` chain (a
//! refused connection, a reset, a timeout) like any other client's.
//!
//! The stack, outermost first:
//!
//! ```text
//! ReplayBody → Retry ("catalog") → http ⇄ reqwest → reqwest::Client
//! ```

use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use examples::scripted::{Reply, ScriptedServer};
use http_body_util::{BodyExt, Full};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_retry_budget::backoff::Backoff;
use tower_retry_budget::body::{ReplayBody, ReplayBodyLayer};
use tower_retry_budget::RetryLayer;

/// reqwest as an `http::Request` → `http::Response` service whose error is
/// `reqwest::Error` itself.
#[derive(Clone)]
struct Reqwest(reqwest::Client);

impl Service<http::Request<ReplayBody<Full<Bytes>>>> for Reqwest {
    type Response = http::Response<reqwest::Body>;
    type Error = reqwest::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, reqwest::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), reqwest::Error>> {
        Service::<reqwest::Request>::poll_ready(&mut self.0, cx)
    }

    fn call(&mut self, request: http::Request<ReplayBody<Full<Bytes>>>) -> Self::Future {
        let converted = reqwest::Request::try_from(request.map(reqwest::Body::wrap));
        let mut client = self.0.clone();
        Box::pin(async move {
            let response = client.call(converted?).await?;
            Ok(http::Response::from(response))
        })
    }
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    let catalog = ScriptedServer::start().await?;
    catalog
        .then(2, Reply::status(503))
        .otherwise(Reply::ok("updated"));

    let mut client = ServiceBuilder::new()
        .layer(ReplayBodyLayer::new(64 * 1024))
        .layer(
            RetryLayer::http_builder()
                .name("catalog")
                .max_retries(3)
                .backoff(Backoff::fixed(Duration::from_millis(20)))
                .build()?,
        )
        .service(Reqwest(reqwest::Client::new()));

    // A PUT is idempotent: the two 503s are retried, with the body each time.
    let put = http::Request::put(format!("{}items/7", catalog.uri()))
        .body(Full::new(Bytes::from_static(b"{\"price\":12}")))?;
    let response = client.ready().await?.call(put).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    println!(
        "PUT /items/7 -> {status} {}",
        String::from_utf8_lossy(&body)
    );
    let bodies: Vec<Bytes> = catalog.received().iter().map(|r| r.body.clone()).collect();
    println!("the catalog received {} PUTs: {bodies:?}", bodies.len());

    // A POST is not (no Idempotency-Key): one attempt, its 503 handed back.
    catalog.then(1, Reply::status(503));
    let post = http::Request::post(format!("{}orders", catalog.uri()))
        .body(Full::new(Bytes::from_static(b"{\"item\":7}")))?;
    let response = client.ready().await?.call(post).await?;
    println!("POST /orders -> {} (sent once)", response.status());
    let posts = catalog.hits() - bodies.len();

    // A refused connection: the classifier finds the refusal in reqwest's
    // error chain and retries the GET; the caller gets reqwest's own error.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.local_addr()?
    };
    let get = http::Request::get(format!("http://{closed}/")).body(Full::new(Bytes::new()))?;
    let error = client.ready().await?.call(get).await.unwrap_err();
    println!("GET on a closed port -> error: {error}");
    let is_reqwest =
        std::iter::successors(Some(&*error as &(dyn std::error::Error + 'static)), |e| {
            e.source()
        })
        .any(|e| e.is::<reqwest::Error>());

    let ok = status == 200
        && bodies.len() == 3
        && bodies.iter().all(|b| b == &b"{\"price\":12}"[..])
        && posts == 1
        && is_reqwest;
    println!(
        "retried with the same body: {}, POST sent once: {}, reqwest's error kept: {is_reqwest}",
        bodies.len() == 3,
        posts == 1
    );
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
