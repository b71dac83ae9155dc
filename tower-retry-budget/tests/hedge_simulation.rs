//! A deterministic simulation of hedging, ours beside `tower::hedge`.
//!
//! Paused tokio time, one thread, a seeded generator: every run gives the
//! same figures. 100,000 requests arrive open-loop at 1,000 per second;
//! each attempt's latency is log-normal (median 10 ms, sigma 0.5) and 2 %
//! of attempts are 20 times slower (a GC pause, a busy disk), independently
//! of the other attempts of the same request. `tower::hedge` is set up as
//! its docs suggest (p95, 1,000 data points, 10 s period); ours with its
//! defaults (p95 from `max_extra_load` 5 %).
//!
//! `cargo test -p tower-retry-budget --release --test hedge_simulation -- --nocapture`
//! prints the table the crate's BENCHMARKS.md shows.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tower::{Service, ServiceExt};
use tower_classify::BoxError;
use tower_layer::Layer;
use tower_retry_budget::hedge::HedgeLayer;

const REQUESTS: usize = 100_000;
const INTERVAL: Duration = Duration::from_millis(1);
const MAX_ATTEMPTS: usize = 5;
const NONE: u64 = u64::MAX;

#[derive(Clone, Copy, Debug)]
struct Request(usize);

/// Each attempt's latency and whether it fails fast, drawn before the run.
struct Table {
    latency: Vec<[Duration; MAX_ATTEMPTS]>,
    fails: Vec<[bool; MAX_ATTEMPTS]>,
}

impl Table {
    fn new(seed: u64, fast_failures: f64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut normal = move || {
            // Box–Muller.
            let u1 = rng.f64().max(f64::MIN_POSITIVE);
            let u2 = rng.f64();
            (
                (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos(),
                rng.f64(),
                rng.f64(),
            )
        };
        let mut latency = Vec::with_capacity(REQUESTS);
        let mut fails = Vec::with_capacity(REQUESTS);
        for _ in 0..REQUESTS {
            let mut row = [Duration::ZERO; MAX_ATTEMPTS];
            let mut fail_row = [false; MAX_ATTEMPTS];
            for attempt in 0..MAX_ATTEMPTS {
                let (z, slow, fail) = normal();
                let mut millis = 10.0 * (0.5 * z).exp();
                if slow < 0.02 {
                    millis *= 20.0;
                }
                fail_row[attempt] = fail < fast_failures;
                if fail_row[attempt] {
                    // A fast failure: refused at once by an overloaded server.
                    millis = 1.0;
                }
                row[attempt] = Duration::from_secs_f64(millis / 1000.0);
            }
            latency.push(row);
            fails.push(fail_row);
        }
        Table { latency, fails }
    }
}

/// What the simulated server saw.
struct Log {
    start: Instant,
    attempts: AtomicU64,
    attempt_of: Vec<AtomicU32>,
    alive: Vec<AtomicU32>,
    failed_at: Vec<AtomicU64>,
    after_failure: AtomicU64,
}

impl Log {
    fn new() -> Self {
        Log {
            start: Instant::now(),
            attempts: AtomicU64::new(0),
            attempt_of: (0..REQUESTS).map(|_| AtomicU32::new(0)).collect(),
            alive: (0..REQUESTS).map(|_| AtomicU32::new(0)).collect(),
            failed_at: (0..REQUESTS).map(|_| AtomicU64::new(NONE)).collect(),
            after_failure: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }
}

#[derive(Clone)]
struct Server {
    table: Arc<Table>,
    log: Arc<Log>,
}

struct Alive {
    log: Arc<Log>,
    id: usize,
}

impl Drop for Alive {
    fn drop(&mut self) {
        self.log.alive[self.id].fetch_sub(1, Ordering::Relaxed);
    }
}

impl Service<Request> for Server {
    type Response = usize;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<usize, std::io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, Request(id): Request) -> Self::Future {
        let log = Arc::clone(&self.log);
        let attempt = log.attempt_of[id].fetch_add(1, Ordering::Relaxed) as usize;
        log.attempts.fetch_add(1, Ordering::Relaxed);
        if log.failed_at[id].load(Ordering::Relaxed) != NONE {
            log.after_failure.fetch_add(1, Ordering::Relaxed);
        }
        log.alive[id].fetch_add(1, Ordering::Relaxed);
        let latency = self.table.latency[id][attempt.min(MAX_ATTEMPTS - 1)];
        let fails = self.table.fails[id][attempt.min(MAX_ATTEMPTS - 1)];
        Box::pin(async move {
            let alive = Alive { log, id };
            tokio::time::sleep(latency).await;
            if fails {
                let log = &alive.log;
                log.failed_at[id].store(log.now(), Ordering::Relaxed);
                return Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
            }
            Ok(id)
        })
    }
}

#[derive(Clone)]
struct ClonePolicy;

impl tower::hedge::Policy<Request> for ClonePolicy {
    fn clone_request(&self, request: &Request) -> Option<Request> {
        Some(*request)
    }

    fn can_retry(&self, _: &Request) -> bool {
        true
    }
}

#[derive(Debug)]
struct Figures {
    p50: Duration,
    p99: Duration,
    p999: Duration,
    extra: f64,
    after_failure: u64,
    most_alive_after_answer: u32,
}

/// Drives the whole run through `service` and measures it.
///
/// One owner drives the service ready and calls it, and each response
/// future runs in a task of its own, as a server's connection tasks do
/// (`tower::hedge::Hedge` is not `Clone`).
async fn run<S>(mut service: S, log: Arc<Log>) -> Figures
where
    S: Service<Request, Response = usize>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    let latencies = Arc::new(Mutex::new(vec![Duration::ZERO; REQUESTS]));
    let most_alive = Arc::new(AtomicU32::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(REQUESTS);
    for id in 0..REQUESTS {
        tokio::time::sleep_until(start + INTERVAL * id as u32).await;
        let sent = Instant::now();
        let answer = service
            .ready()
            .await
            .map_err(Into::into)
            .expect("the simulated server is always ready")
            .call(Request(id));
        let latencies = Arc::clone(&latencies);
        let most_alive = Arc::clone(&most_alive);
        let done = Arc::clone(&done);
        let log = Arc::clone(&log);
        tasks.push(tokio::spawn(async move {
            let _ = answer.await;
            latencies.lock().unwrap()[id] = sent.elapsed();
            tokio::time::sleep(Duration::from_millis(1)).await;
            most_alive.fetch_max(log.alive[id].load(Ordering::Relaxed), Ordering::Relaxed);
            done.fetch_add(1, Ordering::Relaxed);
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let mut sorted = latencies.lock().unwrap().clone();
    sorted.sort();
    let at = |q: f64| sorted[((q * REQUESTS as f64).ceil() as usize).min(REQUESTS) - 1];
    Figures {
        p50: at(0.5),
        p99: at(0.99),
        p999: at(0.999),
        extra: log.attempts.load(Ordering::Relaxed) as f64 / REQUESTS as f64 - 1.0,
        after_failure: log.after_failure.load(Ordering::Relaxed),
        most_alive_after_answer: most_alive.load(Ordering::Relaxed),
    }
}

#[derive(Clone, Copy, Debug)]
enum Contender {
    Bare,
    Tower,
    Ours,
    /// Ours with three attempts in flight: a failure answer can come while
    /// a further hedge is still due, so "none after a failure" is tested.
    OursThreeAttempts,
}

fn simulate(contender: Contender, fast_failures: f64) -> Figures {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async move {
        let table = Arc::new(Table::new(0x05ee_d0f4_ed9e, fast_failures));
        let log = Arc::new(Log::new());
        let server = Server {
            table,
            log: Arc::clone(&log),
        };
        match contender {
            Contender::Bare => run(server, log).await,
            Contender::Tower => {
                let hedge = tower::hedge::Hedge::new::<Request>(
                    server,
                    ClonePolicy,
                    1000,
                    0.95,
                    Duration::from_secs(10),
                );
                run(hedge, log).await
            }
            Contender::Ours => {
                let layer = HedgeLayer::builder().name("sim").build().unwrap();
                run(layer.layer(server), log).await
            }
            Contender::OursThreeAttempts => {
                let layer = HedgeLayer::builder()
                    .name("sim")
                    .max_attempts(3)
                    .build()
                    .unwrap();
                run(layer.layer(server), log).await
            }
        }
    })
}

fn ms(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1000.0)
}

fn cut(base: Duration, ours: Duration) -> f64 {
    1.0 - ours.as_secs_f64() / base.as_secs_f64()
}

fn print_row(name: &str, base: &Figures, figures: &Figures) {
    println!(
        "| {name} | {} | {} ({:+.0} %) | {} ({:+.0} %) | {:.2} % | {} | {} |",
        ms(figures.p50),
        ms(figures.p99),
        -100.0 * cut(base.p99, figures.p99),
        ms(figures.p999),
        -100.0 * cut(base.p999, figures.p999),
        100.0 * figures.extra,
        figures.after_failure,
        figures.most_alive_after_answer,
    );
}

#[test]
fn hedging_cuts_the_tail_within_its_budget() {
    let bare = simulate(Contender::Bare, 0.0);
    let tower = simulate(Contender::Tower, 0.0);
    let ours = simulate(Contender::Ours, 0.0);
    println!("| | p50 | p99 | p99.9 | extra attempts | sent after a failure | attempts alive 1 ms after the answer |");
    println!("|---|---|---|---|---|---|---|");
    print_row("no hedging", &bare, &bare);
    print_row("`tower::hedge` (p95, 1,000 points, 10 s)", &bare, &tower);
    print_row("`HedgeLayer` (defaults: p95, 5 % budget)", &bare, &ours);

    assert!(
        cut(bare.p99, ours.p99) >= 0.80,
        "p99 cut: {bare:?} {ours:?}"
    );
    assert!(
        cut(bare.p999, ours.p999) >= 0.80,
        "p99.9 cut: {bare:?} {ours:?}"
    );
    assert!(ours.extra <= 0.053, "extra load: {ours:?}");
    let p50_change = ours.p50.as_secs_f64() / bare.p50.as_secs_f64() - 1.0;
    assert!(
        p50_change.abs() <= 0.02,
        "p50 moved {p50_change}: {bare:?} {ours:?}"
    );
    assert!(ours.most_alive_after_answer <= 1, "{ours:?}");
    // Ours beats tower's on both tails in the same run.
    assert!(ours.p999 < tower.p999, "{tower:?} {ours:?}");
}

#[test]
fn no_hedge_follows_a_failure_answer() {
    let bare = simulate(Contender::Bare, 0.5);
    let tower = simulate(Contender::Tower, 0.5);
    let ours = simulate(Contender::Ours, 0.5);
    let three = simulate(Contender::OursThreeAttempts, 0.5);
    println!("With half of all attempts failing fast:");
    println!("| | p50 | p99 | p99.9 | extra attempts | sent after a failure | attempts alive 1 ms after the answer |");
    println!("|---|---|---|---|---|---|---|");
    print_row("no hedging", &bare, &bare);
    print_row("`tower::hedge`", &bare, &tower);
    print_row("`HedgeLayer`", &bare, &ours);
    print_row("`HedgeLayer`, `max_attempts(3)`", &bare, &three);
    assert_eq!(ours.after_failure, 0, "{ours:?}");
    assert_eq!(three.after_failure, 0, "{three:?}");
    assert!(three.extra <= 0.05, "{three:?}");
    assert!(ours.extra <= 0.05, "{ours:?}");
    assert!(ours.most_alive_after_answer <= 1, "{ours:?}");
}
