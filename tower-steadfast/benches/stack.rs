//! The whole stack against the sum of its layers, on the success path,
//! awaited the way a server drives a service: each call clones the service
//! and awaits `oneshot` (`ready()`, then `call()`) on a current-thread
//! tokio runtime, as axum and tonic do.
//!
//! With `ResilienceConfig::default()`:
//!
//! - `bare`: the service alone;
//! - `dead_letter`: `config.dead_letter_layer(MemoryStore)` over it;
//! - `breaker`: `config.breaker_builder().build(HttpClassifier::new())`;
//! - `retry`: `config.retry_builder().build()`;
//! - `stack`: `config.layer("bench", MemoryStore)`, DeadLetter →
//!   CircuitBreaker → Retry → CountAttempts.
//!
//! Each for a small `GET` and a `POST` with a 300-byte JSON body, built
//! inside every iteration (bare included) so the request's cost cancels
//! out of each overhead (variant − bare). The service reads the request
//! body to its end; the response is dropped the same way everywhere. The
//! figure to read is `(stack − bare) / Σ(layer − bare)`.
//!
//! Run (see the crate README):
//! `cargo bench -p tower-steadfast --bench stack -- --warm-up-time 1 --measurement-time 3`.

use std::convert::Infallible;
use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use criterion::{criterion_group, Criterion};
use http::{Request, Response};
use http_body::Body;
use http_body_util::Full;
use tower::{Layer, Service, ServiceExt};
use tower_classify::HttpClassifier;
use tower_poison::store::MemoryStore;
use tower_steadfast::ResilienceConfig;

/// A 300-byte JSON body, the size of a small API request.
const ORDER: &[u8] = br#"{"order_id":"7d1f0c2e-4b8a-4f7e-9a51-1c2d3e4f5a6b","customer":"c-1042","lines":[{"sku":"SKU-00017","quantity":2,"unit_price":"19.90"},{"sku":"SKU-00342","quantity":1,"unit_price":"104.00"}],"currency":"EUR","shipping":{"method":"standard","country":"DE"},"notes":"leave at the door, ring twice"}"#;

/// Answers `200 OK` at once, after reading the request body to its end
/// (in memory here, so read in `call` with a no-op waker).
#[derive(Clone, Copy, Debug)]
struct Handler;

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

fn get() -> Request<Full<Bytes>> {
    Request::get("http://orders.internal/orders/7d1f0c2e?expand=lines")
        .header("accept", "application/json")
        .header("user-agent", "orders-client/1.4")
        .header("x-request-id", "0b6c9f3e-97a1-4c55-b2d2-6d1e8a4f0c11")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn post() -> Request<Full<Bytes>> {
    Request::post("http://orders.internal/orders")
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .header("user-agent", "orders-client/1.4")
        .header("x-request-id", "0b6c9f3e-97a1-4c55-b2d2-6d1e8a4f0c11")
        .body(Full::new(Bytes::from_static(ORDER)))
        .unwrap()
}

fn bench<S>(c: &mut Criterion, runtime: &tokio::runtime::Runtime, name: &str, service: S)
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

fn stack(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let config = ResilienceConfig::default();
    bench(c, &runtime, "bare", Handler);
    let dead_letter = config.dead_letter_layer(MemoryStore::new(10_000));
    bench(c, &runtime, "dead_letter", dead_letter.layer(Handler));
    let breaker = config
        .breaker_builder()
        .build(HttpClassifier::new())
        .unwrap();
    bench(c, &runtime, "breaker", breaker.layer(Handler));
    let retry = config.retry_builder().build().unwrap();
    bench(c, &runtime, "retry", retry.layer(Handler));
    let stack = config.layer("bench", MemoryStore::new(10_000));
    bench(c, &runtime, "stack", stack.layer(Handler));
}

criterion_group!(benches, stack);

/// `BENCH_COUNT=<variant>,<GET|POST>,<calls>` makes that many calls of one
/// variant and exits, for `benches/count_instructions.sh` (instructions
/// repeat exactly from run to run, unlike time on a shared machine).
fn main() {
    if let Ok(spec) = std::env::var("BENCH_COUNT") {
        count(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}

/// Makes `calls` awaited calls of `service`, as one bench iteration does.
fn drive<S>(service: S, request: fn() -> Request<Full<Bytes>>, calls: usize)
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

fn count(spec: &str) {
    let [variant, method, calls] = spec.split(',').collect::<Vec<_>>()[..] else {
        panic!("BENCH_COUNT=<variant>,<GET|POST>,<calls>, not {spec:?}");
    };
    let request = match method {
        "GET" => get as fn() -> _,
        "POST" => post,
        other => panic!("no request {other:?}"),
    };
    let calls = calls.parse().expect("a number of calls");
    let config = ResilienceConfig::default();
    match variant {
        "bare" => drive(Handler, request, calls),
        "dead_letter" => drive(
            config
                .dead_letter_layer(MemoryStore::new(10_000))
                .layer(Handler),
            request,
            calls,
        ),
        "breaker" => drive(
            config
                .breaker_builder()
                .build(HttpClassifier::new())
                .unwrap()
                .layer(Handler),
            request,
            calls,
        ),
        "retry" => drive(
            config.retry_builder().build().unwrap().layer(Handler),
            request,
            calls,
        ),
        "stack" => drive(
            config
                .layer("bench", MemoryStore::new(10_000))
                .layer(Handler),
            request,
            calls,
        ),
        other => panic!("no variant {other:?}"),
    }
}
