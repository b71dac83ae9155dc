//! The closed path: what a breaker costs a call that succeeds.
//!
//! Compares a bare service, this crate's breaker, `tower-resilience-circuitbreaker`
//! and `failsafe` (wrapped in a `Service`), single-threaded and with two
//! threads calling clones of one breaker at once. Every call is
//! `poll_ready` + `call` + one poll of the (immediately ready) future.

use std::future::{ready, Future, Ready};
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use futures_util::task::noop_waker_ref;
use tower::Layer;
use tower_service::Service;

/// The dependency: answers at once.
#[derive(Clone, Copy)]
struct Bare;

impl Service<u64> for Bare {
    type Response = u64;
    type Error = std::io::Error;
    type Future = Ready<Result<u64, std::io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: u64) -> Self::Future {
        ready(Ok(req))
    }
}

/// `failsafe`'s futures-aware breaker as a tower `Service`.
#[derive(Clone)]
struct Failsafe<B> {
    breaker: B,
    inner: Bare,
}

impl<B: failsafe::futures::CircuitBreaker> Service<u64> for Failsafe<B> {
    type Response = u64;
    type Error = failsafe::Error<std::io::Error>;
    type Future = failsafe::futures::ResponseFuture<
        Ready<Result<u64, std::io::Error>>,
        B::FailurePolicy,
        B::Instrument,
        failsafe::Any,
    >;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: u64) -> Self::Future {
        self.breaker.call(self.inner.call(req))
    }
}

fn call_once<S: Service<u64>>(service: &mut S, req: u64) {
    let mut cx = Context::from_waker(noop_waker_ref());
    // Busy-polling stands in for an executor: under contention
    // `tower-resilience`'s future can wait on a lock and answer `Pending`.
    while service.poll_ready(&mut cx).is_pending() {
        std::hint::spin_loop();
    }
    let mut future = pin!(service.call(req));
    loop {
        if let Poll::Ready(result) = future.as_mut().poll(&mut cx) {
            black_box(result.is_ok());
            return;
        }
        std::hint::spin_loop();
    }
}

fn ours() -> impl Service<u64> + Clone + Send + 'static {
    tower_breaker::CircuitBreakerLayer::new(tower_classify::ErrorChainClassifier::new()).layer(Bare)
}

fn tower_resilience() -> impl Service<u64> + Clone + Send + 'static {
    tower_resilience_circuitbreaker::CircuitBreakerLayer::builder()
        .build()
        .expect("default configuration")
        .layer(Bare)
}

fn failsafe_service() -> impl Service<u64> + Clone + Send + 'static {
    Failsafe {
        breaker: failsafe::Config::new().build(),
        inner: Bare,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime")
}

fn single<S: Service<u64>>(c: &mut Criterion, name: &str, mut service: S) {
    let rt = runtime();
    let _guard = rt.enter();
    c.bench_function(&format!("closed_path/{name}"), |b| {
        let mut n = 0u64;
        b.iter(|| {
            n += 1;
            call_once(&mut service, n)
        })
    });
}

/// Two threads, each calling its own clone of one breaker `iters` times at
/// the same moment; the time reported is the wall time per call per thread.
fn contended<S>(c: &mut Criterion, name: &str, service: S)
where
    S: Service<u64> + Clone + Send + 'static,
{
    c.bench_function(&format!("contended_2_threads/{name}"), |b| {
        b.iter_custom(|iters| {
            let barrier = std::sync::Barrier::new(2);
            std::thread::scope(|scope| {
                let handles: Vec<_> = (0..2)
                    .map(|_| {
                        let mut service = service.clone();
                        let barrier = &barrier;
                        scope.spawn(move || {
                            let rt = runtime();
                            let _guard = rt.enter();
                            barrier.wait();
                            let start = Instant::now();
                            for n in 0..iters {
                                call_once(&mut service, n);
                            }
                            start.elapsed()
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("bench thread"))
                    .max()
                    .unwrap_or(Duration::ZERO)
            })
        })
    });
}

fn closed_path(c: &mut Criterion) {
    single(c, "bare", Bare);
    single(c, "tower_breaker", ours());
    single(c, "tower_resilience", tower_resilience());
    single(c, "failsafe", failsafe_service());
    contended(c, "bare", Bare);
    contended(c, "tower_breaker", ours());
    contended(c, "tower_resilience", tower_resilience());
    contended(c, "failsafe", failsafe_service());
}

criterion_group!(benches, closed_path);
criterion_main!(benches);
