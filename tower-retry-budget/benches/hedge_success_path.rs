//! What a hedge layer costs a call that answers before any hedge is due,
//! side by side in one run:
//!
//! - `bare`: a service that answers at once;
//! - `HedgeLayer (p95)`: ours with its defaults, its latency window warmed
//!   so the delay is known and every call is ready to hedge (a copy of the
//!   request, a timer armed);
//! - `HedgeLayer (fixed 10 ms)`: ours with a fixed delay;
//! - `tower::hedge (p95)`: tower's `Hedge`, its histogram warmed the same
//!   way (`new_with_mock_latencies`).
//!
//! Each call is awaited on a current-thread tokio runtime: `ready().await`
//! then `call().await` on one service (tower's `Hedge` is not `Clone`).
//!
//! `cargo bench -p tower-retry-budget --bench hedge_success_path -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::task::{Context, Poll};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use tower::{Layer, Service, ServiceExt};
use tower_retry_budget::hedge::HedgeLayer;

/// A service that answers at once.
#[derive(Clone, Copy, Debug)]
struct Echo;

impl Service<u64> for Echo {
    type Response = u64;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<u64, std::io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: u64) -> Self::Future {
        std::future::ready(Ok(request.wrapping_add(1)))
    }
}

#[derive(Clone)]
struct ClonePolicy;

impl tower::hedge::Policy<u64> for ClonePolicy {
    fn clone_request(&self, request: &u64) -> Option<u64> {
        Some(*request)
    }

    fn can_retry(&self, _: &u64) -> bool {
        true
    }
}

async fn call<S>(service: &mut S, request: u64) -> S::Response
where
    S: Service<u64>,
    S::Error: std::fmt::Debug,
{
    service.ready().await.unwrap().call(request).await.unwrap()
}

/// `iters` awaited calls in a row, timed together.
async fn timed<S>(service: &mut S, iters: u64) -> Duration
where
    S: Service<u64>,
    S::Error: std::fmt::Debug,
{
    let start = std::time::Instant::now();
    for n in 0..iters {
        black_box(call(service, black_box(n)).await);
    }
    start.elapsed()
}

fn hedge_success_path(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _entered = runtime.enter();

    let mut bare = Echo;
    let mut ours_p95 = HedgeLayer::builder().build().unwrap().layer(Echo);
    // Warm the window: 200 answers of the Echo service (microseconds; the
    // delay becomes the 1 ms minimum, far longer than an answer takes).
    runtime.block_on(async {
        for n in 0..200 {
            call(&mut ours_p95, n).await;
        }
    });
    let mut ours_fixed = HedgeLayer::builder()
        .delay(Duration::from_millis(10))
        .build()
        .unwrap()
        .layer(Echo);
    let mut towers = tower::hedge::Hedge::new_with_mock_latencies::<u64>(
        Echo,
        ClonePolicy,
        1000,
        0.95,
        Duration::from_secs(10),
        &[10; 1000],
    );

    let mut group = c.benchmark_group("hedge_awaited");
    group.bench_function("bare", |b| {
        b.iter_custom(|iters| runtime.block_on(timed(&mut bare, iters)))
    });
    group.bench_function("HedgeLayer (p95)", |b| {
        b.iter_custom(|iters| runtime.block_on(timed(&mut ours_p95, iters)))
    });
    group.bench_function("HedgeLayer (fixed 10 ms)", |b| {
        b.iter_custom(|iters| runtime.block_on(timed(&mut ours_fixed, iters)))
    });
    group.bench_function("tower::hedge (p95)", |b| {
        b.iter_custom(|iters| runtime.block_on(timed(&mut towers, iters)))
    });
    group.finish();
}

criterion_group!(benches, hedge_success_path);
criterion_main!(benches);
