//! The closed path: what a breaker costs a call that succeeds.
//!
//! Compares a bare service, this crate's breaker under each trip policy
//! (consecutive failures, a failure rate over a count window, a failure rate
//! over a time window), `failsafe` 1.x (defaults, wrapped in a `Service`) and
//! `tower-resilience-circuitbreaker` 0.14 (defaults).
//!
//! - `awaited/*`, the headline: each call is driven the way axum and tonic
//!   drive a service. Clone the service, `ready().await`, `call(..).await`,
//!   on a current-thread tokio runtime (criterion runs the whole iteration
//!   loop inside one `block_on`, so the executor's share is small and the
//!   same for every peer).
//! - `contended_2_threads/*`: two OS threads, each with its own
//!   current-thread runtime, awaiting calls on one breaker at the same
//!   moment, each call on a clone of one service that both threads share,
//!   as axum's router clones the service it keeps on whichever thread
//!   serves the request; the figure is the wall time per call per thread.
//!   `*_handed_clone`: each thread's calls clone a clone made for it on
//!   the main thread beforehand, as a per-connection clone made where
//!   connections are accepted is (the calls then count on the main
//!   thread's share of the breaker, from both threads).
//!   `tower-resilience` is left out: under contention its future waits on a
//!   lock and its figure swung by orders of magnitude from run to run.
//! - `poll_once/*`: `poll_ready` + `call` + one poll of the (immediately
//!   ready) future, with no executor and no clone: the breaker's own cost.

use std::future::{ready, Future, Ready};
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use futures_util::task::noop_waker_ref;
use tower::{Layer, ServiceExt};
use tower_breaker::Policy;
use tower_breaker::{CircuitBreakerLayer, Window};
use tower_classify::ErrorChainClassifier;
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

/// The service every peer wraps, plus what the bench needs of it.
trait Bench:
    Service<u64, Error: std::fmt::Debug, Future: Send> + Clone + Send + Sync + 'static
{
}
impl<S> Bench for S where
    S: Service<u64, Error: std::fmt::Debug, Future: Send> + Clone + Send + Sync + 'static
{
}

/// The default policy: five consecutive failures.
fn consecutive_layer() -> CircuitBreakerLayer<ErrorChainClassifier> {
    CircuitBreakerLayer::new(ErrorChainClassifier::new())
}

/// Half the last 100 calls failed, once 20 were made.
fn count_window_layer() -> CircuitBreakerLayer<ErrorChainClassifier> {
    CircuitBreakerLayer::builder()
        .policy(Policy::failure_rate(0.5, 20, Window::count(100)))
        .build(ErrorChainClassifier::new())
        .expect("valid configuration")
}

/// Half the calls of the last 10 s (ten buckets) failed, once 20 were made.
fn time_window_layer() -> CircuitBreakerLayer<ErrorChainClassifier> {
    CircuitBreakerLayer::builder()
        .policy(Policy::failure_rate(
            0.5,
            20,
            Window::time(Duration::from_secs(10)),
        ))
        .build(ErrorChainClassifier::new())
        .expect("valid configuration")
}

fn consecutive() -> impl Bench {
    consecutive_layer().layer(Bare)
}

fn count_window() -> impl Bench {
    count_window_layer().layer(Bare)
}

fn time_window() -> impl Bench {
    time_window_layer().layer(Bare)
}

fn tower_resilience() -> impl Bench {
    tower_resilience_circuitbreaker::CircuitBreakerLayer::builder()
        .build()
        .expect("default configuration")
        .layer(Bare)
}

fn failsafe_service() -> impl Bench {
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

/// One call as a caller in a server makes it: a clone per request, then
/// readiness, then the call, each awaited.
async fn awaited_call<S: Bench>(service: &S, req: u64) {
    let mut service = service.clone();
    let response = service
        .ready()
        .await
        .expect("ready")
        .call(req)
        .await
        .expect("closed breaker admits");
    black_box(response);
}

fn awaited<S: Bench>(c: &mut Criterion, name: &str, service: S) {
    let rt = runtime();
    c.bench_function(&format!("awaited/{name}"), |b| {
        b.to_async(&rt).iter(|| awaited_call(&service, 7))
    });
}

/// Two threads, each with its own current-thread runtime, awaiting `iters`
/// calls on clones of `service` at the same moment; the time reported is
/// the slower thread's wall time, so per call per thread.
fn contended<S: Bench>(c: &mut Criterion, name: &str, service: S) {
    // Both threads clone the one service (the other slot is unused).
    let spare = service.clone();
    contended_on(c, name, [service, spare], |[shared, _], _| shared);
}

/// The same, each thread's calls cloning a clone of `service` made for it on
/// the main thread.
fn contended_handed_clone<S: Bench>(c: &mut Criterion, name: &str, service: S) {
    let name = format!("{name}_handed_clone");
    contended_on(
        c,
        &name,
        [service.clone(), service.clone()],
        |clones, thread| &clones[thread],
    );
}

/// Thread `n` of two awaits its calls on clones of `pick(services, n)`.
fn contended_on<S: Bench>(
    c: &mut Criterion,
    name: &str,
    services: [S; 2],
    pick: impl Fn(&[S; 2], usize) -> &S + Sync,
) {
    c.bench_function(&format!("contended_2_threads/{name}"), |b| {
        b.iter_custom(|iters| {
            let barrier = std::sync::Barrier::new(2);
            std::thread::scope(|scope| {
                let handles: Vec<_> = (0..2)
                    .map(|thread| {
                        let service = pick(&services, thread);
                        let barrier = &barrier;
                        scope.spawn(move || {
                            let rt = runtime();
                            rt.block_on(async {
                                barrier.wait();
                                let start = Instant::now();
                                for n in 0..iters {
                                    awaited_call(service, n).await;
                                }
                                start.elapsed()
                            })
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

/// `poll_ready` + `call` + one poll, no executor, no clone.
fn poll_once<S: Bench>(c: &mut Criterion, name: &str, mut service: S) {
    let rt = runtime();
    let _guard = rt.enter();
    c.bench_function(&format!("poll_once/{name}"), |b| {
        let mut cx = Context::from_waker(noop_waker_ref());
        let mut n = 0u64;
        b.iter(|| {
            n += 1;
            // Busy-polling stands in for an executor: `tower-resilience`'s
            // future can wait on a lock and answer `Pending`.
            while service.poll_ready(&mut cx).is_pending() {
                std::hint::spin_loop();
            }
            let mut future = pin!(service.call(n));
            loop {
                if let Poll::Ready(result) = future.as_mut().poll(&mut cx) {
                    black_box(result.is_ok());
                    return;
                }
                std::hint::spin_loop();
            }
        })
    });
}

/// The size of what each call moves around: the response futures of the
/// services benched (tower-breaker's holds the inner future, a breaker
/// reference, the packed permit word and the classifier).
fn print_future_sizes() {
    fn future_size<S: Bench>(_: &S) -> usize {
        std::mem::size_of::<S::Future>()
    }
    eprintln!(
        "response future sizes: bare {} B, tower-breaker {} B (count window {} B, time window {} B), failsafe {} B, tower-resilience {} B",
        future_size(&Bare),
        future_size(&consecutive()),
        future_size(&count_window()),
        future_size(&time_window()),
        future_size(&failsafe_service()),
        future_size(&tower_resilience()),
    );
}

fn closed_path(c: &mut Criterion) {
    print_future_sizes();
    awaited(c, "bare", Bare);
    awaited(c, "tower_breaker_consecutive", consecutive());
    awaited(c, "tower_breaker_count_window", count_window());
    awaited(c, "tower_breaker_time_window", time_window());
    awaited(c, "failsafe", failsafe_service());
    awaited(c, "tower_resilience", tower_resilience());

    contended(c, "bare", Bare);
    contended(c, "tower_breaker_consecutive", consecutive());
    contended_handed_clone(c, "tower_breaker_consecutive", consecutive());
    contended(c, "tower_breaker_count_window", count_window());
    contended(c, "tower_breaker_time_window", time_window());
    contended(c, "failsafe", failsafe_service());

    poll_once(c, "bare", Bare);
    poll_once(c, "tower_breaker_consecutive", consecutive());
    poll_once(c, "tower_breaker_count_window", count_window());
    poll_once(c, "tower_breaker_time_window", time_window());
    poll_once(c, "failsafe", failsafe_service());
    poll_once(c, "tower_resilience", tower_resilience());
}

criterion_group!(benches, closed_path);

/// `CLOSED_PATH_COUNT=<case>,<calls>`: that many awaited calls of one case
/// in one `block_on`, then exit, for an instruction count under callgrind
/// (`benches/count_instructions.sh`), which repeats exactly where
/// wall-clock time does not.
fn count(spec: &str) {
    let (case, calls) = spec
        .split_once(',')
        .expect("CLOSED_PATH_COUNT is case,calls");
    let calls: u64 = calls.parse().expect("calls is a number");
    async fn run<S: Bench>(service: S, calls: u64) {
        for n in 0..calls {
            awaited_call(&service, black_box(n)).await;
        }
    }
    let rt = runtime();
    match case {
        "bare" => rt.block_on(run(Bare, calls)),
        "consecutive" => rt.block_on(run(consecutive(), calls)),
        "count_window" => rt.block_on(run(count_window(), calls)),
        "time_window" => rt.block_on(run(time_window(), calls)),
        "failsafe" => rt.block_on(run(failsafe_service(), calls)),
        "tower_resilience" => rt.block_on(run(tower_resilience(), calls)),
        other => panic!("no case {other:?}"),
    }
}

fn main() {
    if let Ok(spec) = std::env::var("CLOSED_PATH_COUNT") {
        count(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
