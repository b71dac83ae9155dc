//! What the HTTP success-path benches of `tower-poison` and
//! `tower-steadfast` share, so that both measure the same calls the same
//! way: a small `GET` and a `POST` with a 300-byte JSON body, built inside
//! every iteration; a service that reads the body to its end and answers
//! `200`; and each call awaited as a server drives a service (clone, then
//! `oneshot` on a current-thread tokio runtime).
//!
//! `callgrind.sh` next to this crate's manifest holds the shell helpers of
//! the benches' `count_instructions.sh` scripts, and [`alloc`] the counting
//! allocator of the tests that pin a success path's allocations.

// Only `alloc` implements `GlobalAlloc`, which takes `unsafe`.
#![deny(unsafe_code)]
#![warn(missing_docs)]

#[allow(unsafe_code)]
pub mod alloc;

use std::convert::Infallible;
use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use criterion::Criterion;
use http::{Request, Response};
use http_body::Body;
use http_body_util::Full;
use tower::{Service, ServiceExt};

/// Builds one request: [`get`] or [`post`].
pub type MakeRequest = fn() -> Request<Full<Bytes>>;

/// A 300-byte JSON body, the size of a small API request.
const ORDER: &[u8] = br#"{"order_id":"7d1f0c2e-4b8a-4f7e-9a51-1c2d3e4f5a6b","customer":"c-1042","lines":[{"sku":"SKU-00017","quantity":2,"unit_price":"19.90"},{"sku":"SKU-00342","quantity":1,"unit_price":"104.00"}],"currency":"EUR","shipping":{"method":"standard","country":"DE"},"notes":"leave at the door, ring twice"}"#;

/// Answers `200 OK` at once, after reading the request body to its end.
///
/// The bodies here are all in memory, so they are read in `call` with a
/// no-op waker, and the future is `Ready`: the bare path adds no task
/// switch or allocation of its own.
#[derive(Clone, Copy, Debug)]
pub struct Handler;

impl<B> Service<Request<B>> for Handler
where
    B: Body + Unpin,
{
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let mut body = request.into_body();
        let mut cx = Context::from_waker(Waker::noop());
        let mut read = 0;
        while let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut body).poll_frame(&mut cx) {
            if let Some(data) = frame.data_ref() {
                read += bytes::Buf::remaining(data);
            }
        }
        black_box(read);
        std::future::ready(Ok(Response::new(Full::new(Bytes::from_static(b"ok")))))
    }
}

/// A small `GET` with three headers and no body.
pub fn get() -> Request<Full<Bytes>> {
    Request::get("http://orders.internal/orders/7d1f0c2e?expand=lines")
        .header("accept", "application/json")
        .header("user-agent", "orders-client/1.4")
        .header("x-request-id", "0b6c9f3e-97a1-4c55-b2d2-6d1e8a4f0c11")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// A `POST` with four headers and a 300-byte JSON body.
pub fn post() -> Request<Full<Bytes>> {
    Request::post("http://orders.internal/orders")
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .header("user-agent", "orders-client/1.4")
        .header("x-request-id", "0b6c9f3e-97a1-4c55-b2d2-6d1e8a4f0c11")
        .body(Full::new(Bytes::from_static(ORDER)))
        .unwrap()
}

/// One criterion group `name` timing `service` on [`get`] and [`post`].
pub fn bench<S>(c: &mut Criterion, runtime: &tokio::runtime::Runtime, name: &str, service: S)
where
    S: Service<Request<Full<Bytes>>> + Clone,
    S::Error: std::fmt::Debug,
{
    let mut group = c.benchmark_group(name);
    for (method, request) in [("GET", get as fn() -> _), ("POST", post)] {
        group.bench_function(method, |b| {
            b.to_async(runtime).iter(|| {
                let service = service.clone();
                async move {
                    let response = service.oneshot(request()).await.expect("a response");
                    drop(black_box(response));
                }
            })
        });
    }
    group.finish();
}

/// Makes `calls` awaited calls of `service`, as one bench iteration does.
pub fn drive<S>(service: S, request: MakeRequest, calls: usize)
where
    S: Service<Request<Full<Bytes>>> + Clone,
    S::Error: std::fmt::Debug,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        for _ in 0..calls {
            let response = service
                .clone()
                .oneshot(request())
                .await
                .expect("a response");
            drop(black_box(response));
        }
    });
}

/// Reads `BENCH_COUNT=<variant>,<GET|POST>,<calls>`, which makes a bench
/// binary make that many calls of one variant and exit, for its
/// `count_instructions.sh` (instructions repeat exactly from run to run,
/// unlike time on a shared machine): the variant, the request builder and
/// the number of calls.
pub fn count_spec(spec: &str) -> (&str, MakeRequest, usize) {
    let [variant, method, calls] = spec.split(',').collect::<Vec<_>>()[..] else {
        panic!("BENCH_COUNT=<variant>,<GET|POST>,<calls>, not {spec:?}");
    };
    let request = match method {
        "GET" => get as MakeRequest,
        "POST" => post,
        other => panic!("no request {other:?}"),
    };
    (variant, request, calls.parse().expect("a number of calls"))
}
