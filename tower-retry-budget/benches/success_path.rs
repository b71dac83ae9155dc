//! The success path, side by side: what a retry layer costs when nothing fails.
//!
//! - `bare`: the service alone;
//! - `tower-retry-budget`: our `Retry` with a `TpsBudget` and the default
//!   classifier (`ErrorChainClassifier`);
//! - `tower::retry + TpsBudget`: tower's `Retry` with the budget policy from
//!   tower's own documentation (deposit on success);
//! - `tower-resilience-retry`: its `RetryLayer` with 3 attempts.
//!
//! Every future here completes on its first poll, so each iteration is polled
//! by hand with a no-op waker inside a tokio runtime context: the numbers are
//! the layers' own work, not an executor's.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use tower::retry::budget::{Budget, TpsBudget};
use tower::{Layer, Service};
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

fn success_path(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let mut cx = Context::from_waker(Waker::noop());

    let mut group = c.benchmark_group("success_path");

    let mut bare = Echo;
    group.bench_function("bare", |b| {
        b.iter(|| once(&mut bare, &mut cx, black_box(7)))
    });

    let mut ours = RetryLayer::builder()
        .max_retries(3)
        .budget(tower_retry_budget::budget::TpsBudget::default())
        .build()
        .unwrap()
        .layer(Echo);
    group.bench_function("tower-retry-budget", |b| {
        b.iter(|| once(&mut ours, &mut cx, black_box(7)))
    });

    let mut towers = tower::retry::RetryLayer::new(TowerPolicy {
        budget: Arc::new(TpsBudget::default()),
    })
    .layer(Echo);
    group.bench_function("tower::retry + TpsBudget", |b| {
        b.iter(|| once(&mut towers, &mut cx, black_box(7)))
    });

    let mut resilience = tower_resilience_retry::RetryLayer::<u64, u64, std::io::Error>::builder()
        .max_attempts(3)
        .exponential_backoff(Duration::from_millis(100))
        .build()
        .layer(Echo);
    group.bench_function("tower-resilience-retry", |b| {
        b.iter(|| once(&mut resilience, &mut cx, black_box(7)))
    });

    group.finish();
}

criterion_group!(benches, success_path);
criterion_main!(benches);
