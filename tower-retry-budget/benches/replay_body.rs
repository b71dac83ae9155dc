//! What the streaming replay body costs a request that succeeds, side by side
//! in one run: the same body (1 KiB in one frame; 64 KiB in 16 frames of
//! 4 KiB) sent through `Retry`
//!
//! - `plain`: as it is (a body type that clones itself, so `Retry` can copy
//!   it without any wrapper);
//! - `replay body`: wrapped by `ReplayBodyLayer`, recording every frame.
//!
//! Each call is driven the way axum and tonic drive a service: the service
//! is cloned, `ready().await`, `call().await`, and the service below reads
//! the body to its end, all on a current-thread runtime.
//!
//! Two groups: `replay_body`, where the service below is in memory (the
//! worst case: nothing else costs anything), and `replay_body_loopback`,
//! where it is a hyper client sending the body over HTTP/1.1 to a hyper
//! server on 127.0.0.1 in the same runtime (what a client pays).
//!
//! On this shared machine wall-clock ratios move by more than the cost being
//! measured, so `count_instructions.sh` beside this file also runs each case
//! a fixed number of times under callgrind (`REPLAY_BODY_COUNT=...`, see
//! [`count`]) and reports instructions per request, which repeat exactly.

use std::collections::VecDeque;
use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_classify::BoxError;
use tower_retry_budget::body::{ReplayBodyLayer, TryCloneBody};
use tower_retry_budget::RetryLayer;

/// A body of frames already in memory, sent one by one.
#[derive(Clone)]
struct Frames(VecDeque<Bytes>);

impl Body for Frames {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.pop_front().map(|data| Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.iter().map(|b| b.len() as u64).sum())
    }
}

impl TryCloneBody for Frames {
    fn try_clone_body(&self) -> Option<Self> {
        Some(self.clone())
    }
}

/// Reads the request body to its end and answers 200.
async fn read_body<B>(request: Request<B>) -> Result<Response<()>, BoxError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(request.into_body());
    let mut len = 0;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.map_err(Into::into)?.into_data() {
            len += bytes::Buf::remaining(&data);
        }
    }
    black_box(len);
    Ok(Response::new(()))
}

async fn send<S>(service: &S, body: Frames)
where
    S: Service<Request<Frames>, Response = Response<()>> + Clone,
    S::Error: std::fmt::Debug,
{
    let request = Request::put("/upload").body(body).unwrap();
    let response = service.clone().ready().await.unwrap().call(request).await;
    black_box(response.unwrap());
}

fn bodies(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("replay_body");
    let retry = RetryLayer::http_builder().build().unwrap();
    for (name, frames, frame_len) in [("1 KiB", 1, 1024), ("64 KiB", 16, 4096)] {
        let body = Frames(
            (0..frames)
                .map(|i| Bytes::from(vec![i as u8; frame_len]))
                .collect(),
        );
        group.throughput(Throughput::Bytes((frames * frame_len) as u64));

        let plain = ServiceBuilder::new()
            .layer(retry.clone())
            .service(tower::service_fn(read_body::<Frames>));
        group.bench_with_input(BenchmarkId::new("plain", name), &body, |b, body| {
            b.iter(|| runtime.block_on(send(&plain, body.clone())));
        });

        let replayed = ServiceBuilder::new()
            .layer(ReplayBodyLayer::new(64 * 1024))
            .layer(retry.clone())
            .service(tower::service_fn(read_body));
        group.bench_with_input(BenchmarkId::new("replay body", name), &body, |b, body| {
            b.iter(|| runtime.block_on(send(&replayed, body.clone())));
        });
    }
    group.finish();
}

/// A hyper server on 127.0.0.1 that reads each body to its end and answers
/// 200, on the current runtime.
async fn sink() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service =
                hyper::service::service_fn(|request: Request<hyper::body::Incoming>| async {
                    read_body(request)
                        .await
                        .map(|r| r.map(|()| http_body_util::Empty::<Bytes>::new()))
                });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
            );
        }
    });
    addr
}

/// A pooled hyper client whose responses' bodies are read to the end.
fn client<B>(
) -> impl Service<Request<B>, Response = Response<()>, Error = BoxError, Future = impl Send> + Clone
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<B>();
    ServiceBuilder::new()
        .map_err(BoxError::from)
        .service(client)
        .and_then(|response: Response<hyper::body::Incoming>| async move {
            let (parts, body) = response.into_parts();
            body.collect().await?;
            Ok::<_, BoxError>(Response::from_parts(parts, ()))
        })
}

fn loopback(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr = runtime.block_on(sink());
    let uri: http::Uri = format!("http://{addr}/upload").parse().unwrap();
    let mut group = c.benchmark_group("replay_body_loopback");
    let retry = RetryLayer::http_builder().build().unwrap();
    for (name, frames, frame_len) in [("1 KiB", 1, 1024), ("64 KiB", 16, 4096)] {
        let body = Frames(
            (0..frames)
                .map(|i| Bytes::from(vec![i as u8; frame_len]))
                .collect(),
        );
        group.throughput(Throughput::Bytes((frames * frame_len) as u64));
        let plain = ServiceBuilder::new()
            .layer(retry.clone())
            .service(client::<Frames>());
        group.bench_with_input(BenchmarkId::new("plain", name), &body, |b, body| {
            b.iter(|| runtime.block_on(send_to(&plain, &uri, body.clone())));
        });
        let replayed = ServiceBuilder::new()
            .layer(ReplayBodyLayer::new(64 * 1024))
            .layer(retry.clone())
            .service(client());
        group.bench_with_input(BenchmarkId::new("replay body", name), &body, |b, body| {
            b.iter(|| runtime.block_on(send_to(&replayed, &uri, body.clone())));
        });
    }
    group.finish();
}

async fn send_to<S>(service: &S, uri: &http::Uri, body: Frames)
where
    S: Service<Request<Frames>, Response = Response<()>> + Clone,
    S::Error: std::fmt::Debug,
{
    let request = Request::put(uri.clone()).body(body).unwrap();
    let response = service.clone().ready().await.unwrap().call(request).await;
    black_box(response.unwrap());
}

criterion_group!(benches, bodies, loopback);

/// `REPLAY_BODY_COUNT=<memory|loopback>,<plain|replay>,<1|64>,<calls>`: makes
/// that many calls of one case and exits, for an instruction count.
fn count(spec: &str) {
    let parts: Vec<&str> = spec.split(',').collect();
    let [place, body_kind, kib, calls] = parts[..] else {
        panic!("REPLAY_BODY_COUNT is place,body,KiB,calls: {spec:?}");
    };
    let calls: usize = calls.parse().expect("calls is a number");
    let (frames, frame_len) = match kib {
        "1" => (1, 1024),
        "64" => (16, 4096),
        other => panic!("KiB is 1 or 64, not {other}"),
    };
    let body = Frames(
        (0..frames)
            .map(|i| Bytes::from(vec![i as u8; frame_len]))
            .collect(),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let retry = RetryLayer::http_builder().build().unwrap();
    let addr = runtime.block_on(sink());
    let uri: http::Uri = format!("http://{addr}/upload").parse().unwrap();
    match (place, body_kind) {
        ("memory", "plain") => {
            let service = ServiceBuilder::new()
                .layer(retry)
                .service(tower::service_fn(read_body::<Frames>));
            for _ in 0..calls {
                runtime.block_on(send(&service, body.clone()));
            }
        }
        ("memory", "replay") => {
            let service = ServiceBuilder::new()
                .layer(ReplayBodyLayer::new(64 * 1024))
                .layer(retry)
                .service(tower::service_fn(read_body));
            for _ in 0..calls {
                runtime.block_on(send(&service, body.clone()));
            }
        }
        ("loopback", "plain") => {
            let service = ServiceBuilder::new()
                .layer(retry)
                .service(client::<Frames>());
            for _ in 0..calls {
                runtime.block_on(send_to(&service, &uri, body.clone()));
            }
        }
        ("loopback", "replay") => {
            let service = ServiceBuilder::new()
                .layer(ReplayBodyLayer::new(64 * 1024))
                .layer(retry)
                .service(client());
            for _ in 0..calls {
                runtime.block_on(send_to(&service, &uri, body.clone()));
            }
        }
        _ => panic!("place is memory or loopback, body is plain or replay: {spec:?}"),
    }
}

fn main() {
    if let Ok(spec) = std::env::var("REPLAY_BODY_COUNT") {
        count(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
