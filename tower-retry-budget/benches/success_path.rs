//! The success path, side by side: what a retry layer costs when nothing fails.
//!
//! - `bare`: the service alone;
//! - `tower-retry-budget`: our `Retry` with a `TpsBudget` and the default
//!   classifier (`ErrorChainClassifier`);
//! - `tower::retry + TpsBudget`: tower's `Retry` with the budget policy from
//!   tower's own documentation (deposit on success);
//! - `tower-resilience-retry`: its `RetryLayer` with 3 attempts.
//!
//! Two ways to drive each call:
//!
//! - `awaited` (the headline): as axum and tonic do, on a current-thread
//!   tokio runtime, each call clones the service, awaits `ready()` and
//!   awaits the call. Criterion runs the whole loop inside one `block_on`.
//! - `contended_2_threads`: two threads, each on its own current-thread
//!   runtime, awaiting calls on clones of one layer (one budget, one
//!   `Arc`), timed per call per thread.
//! - `polled_once`: each iteration polled by hand with a no-op waker inside
//!   a tokio runtime context, the future pinned in place: the layers' own
//!   work with no executor and no move of the future.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{criterion_group, Criterion};
use tower::retry::budget::{Budget, TpsBudget};
use tower::{Layer, Service, ServiceExt};
use tower_retry_budget::RetryLayer;

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

/// tower's budget policy, as its documentation writes it.
#[derive(Clone)]
struct TowerPolicy {
    budget: Arc<TpsBudget>,
}

impl<E> tower::retry::Policy<u64, u64, E> for TowerPolicy {
    type Future = std::future::Ready<()>;

    fn retry(&mut self, _: &mut u64, result: &mut Result<u64, E>) -> Option<Self::Future> {
        match result {
            Ok(_) => {
                self.budget.deposit();
                None
            }
            Err(_) => self.budget.withdraw().then(|| std::future::ready(())),
        }
    }

    fn clone_request(&mut self, request: &u64) -> Option<u64> {
        Some(*request)
    }
}

/// One ready + call + response, polled once each.
fn once<S>(service: &mut S, cx: &mut Context<'_>, request: u64) -> S::Response
where
    S: Service<u64>,
    S::Error: std::fmt::Debug,
{
    match service.poll_ready(cx) {
        Poll::Ready(Ok(())) => {}
        _ => panic!("service not ready"),
    }
    let future = pin!(service.call(request));
    match future.poll(cx) {
        Poll::Ready(Ok(response)) => response,
        _ => panic!("response not ready"),
    }
}

/// One call as a server drives it: clone, `ready().await`, `call().await`.
async fn awaited<S>(service: &S, request: u64) -> S::Response
where
    S: Service<u64> + Clone,
    S::Error: std::fmt::Debug,
{
    let mut service = service.clone();
    service
        .ready()
        .await
        .expect("ready")
        .call(request)
        .await
        .expect("a response")
}

fn ours_layer() -> RetryLayer {
    RetryLayer::builder()
        .max_retries(3)
        .budget(std::sync::Arc::new(
            tower_retry_budget::budget::TpsBudget::default(),
        ))
        .build()
        .unwrap()
}

fn ours(
) -> impl Service<u64, Response = u64, Error = impl std::fmt::Debug, Future: Send> + Clone + Send + 'static
{
    ours_layer().layer(Echo)
}

fn towers() -> tower::retry::Retry<TowerPolicy, Echo> {
    tower::retry::RetryLayer::new(TowerPolicy {
        budget: Arc::new(TpsBudget::default()),
    })
    .layer(Echo)
}

fn resilience() -> impl Service<u64, Response = u64, Error = impl std::fmt::Debug> + Clone {
    tower_resilience_retry::RetryLayer::<u64, u64, std::io::Error>::builder()
        .max_attempts(3)
        .exponential_backoff(Duration::from_millis(100))
        .build()
        .layer(Echo)
}

fn awaited_path(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("awaited");
    group.bench_function("bare", |b| {
        b.to_async(&runtime).iter(|| awaited(&Echo, black_box(7)))
    });
    let service = ours();
    group.bench_function("tower-retry-budget", |b| {
        b.to_async(&runtime)
            .iter(|| awaited(&service, black_box(7)))
    });
    let service = towers();
    group.bench_function("tower::retry + TpsBudget", |b| {
        b.to_async(&runtime)
            .iter(|| awaited(&service, black_box(7)))
    });
    let service = resilience();
    group.bench_function("tower-resilience-retry", |b| {
        b.to_async(&runtime)
            .iter(|| awaited(&service, black_box(7)))
    });
    group.finish();
}

/// Two threads, each on its own current-thread runtime, awaiting calls on
/// clones of one service (one budget): the time per call per thread.
fn contended<S>(service: &S, iters: u64) -> Duration
where
    S: Service<u64> + Clone + Send + 'static,
    S::Error: std::fmt::Debug,
    S::Future: Send,
{
    let barrier = Arc::new(std::sync::Barrier::new(2));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let service = service.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .unwrap();
                barrier.wait();
                let start = std::time::Instant::now();
                runtime.block_on(async {
                    for _ in 0..iters {
                        black_box(awaited(&service, black_box(7)).await);
                    }
                });
                start.elapsed()
            })
        })
        .collect();
    let total: Duration = threads.into_iter().map(|t| t.join().unwrap()).sum();
    total / 2
}

fn contended_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("contended_2_threads");
    group.bench_function("bare", |b| b.iter_custom(|iters| contended(&Echo, iters)));
    let service = ours();
    group.bench_function("tower-retry-budget", |b| {
        b.iter_custom(|iters| contended(&service, iters))
    });
    let service = towers();
    group.bench_function("tower::retry + TpsBudget", |b| {
        b.iter_custom(|iters| contended(&service, iters))
    });
    group.finish();
}

fn success_path(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let mut cx = Context::from_waker(Waker::noop());

    let mut group = c.benchmark_group("polled_once");

    let mut bare = Echo;
    group.bench_function("bare", |b| {
        b.iter(|| once(&mut bare, &mut cx, black_box(7)))
    });

    let mut ours = ours();
    group.bench_function("tower-retry-budget", |b| {
        b.iter(|| once(&mut ours, &mut cx, black_box(7)))
    });

    let mut towers = towers();
    group.bench_function("tower::retry + TpsBudget", |b| {
        b.iter(|| once(&mut towers, &mut cx, black_box(7)))
    });

    let mut resilience = resilience();
    group.bench_function("tower-resilience-retry", |b| {
        b.iter(|| once(&mut resilience, &mut cx, black_box(7)))
    });

    group.finish();
}

criterion_group!(benches, awaited_path, contended_path, success_path);

/// `SUCCESS_PATH_COUNT=<bare|ours|tower|resilience>,<calls>`: that many
/// awaited calls of one case in one `block_on`, then exit, for an
/// instruction count under callgrind (`benches/count_instructions.sh
/// success_path`), which repeats exactly where wall-clock time does not.
fn count(spec: &str) {
    let (case, calls) = spec
        .split_once(',')
        .expect("SUCCESS_PATH_COUNT is case,calls");
    let calls: u64 = calls.parse().expect("calls is a number");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    async fn run<S>(service: S, calls: u64)
    where
        S: Service<u64> + Clone,
        S::Error: std::fmt::Debug,
    {
        for _ in 0..calls {
            black_box(awaited(&service, black_box(7)).await);
        }
    }
    match case {
        "bare" => runtime.block_on(run(Echo, calls)),
        "ours" => runtime.block_on(run(ours(), calls)),
        "tower" => runtime.block_on(run(towers(), calls)),
        "resilience" => runtime.block_on(run(resilience(), calls)),
        other => panic!("case is bare, ours, tower or resilience, not {other}"),
    }
}

fn main() {
    if let Ok(spec) = std::env::var("SUCCESS_PATH_COUNT") {
        count(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
