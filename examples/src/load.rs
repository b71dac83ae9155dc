//! Concurrent clients driving a stack through a [`Schedule`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use indicatif::ProgressBar;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tower::ServiceExt;
use tower_classify::{ErrorChainClassifier, FailureKind, Outcome};

use crate::client::HttpService;
use crate::upstream::{Phase, Schedule, POISON_HEADER};

/// How the clients behave.
///
/// Arrivals are *open-loop*: each client sends one request every `interval`
/// whether or not its earlier requests have finished, as independent users
/// do. A closed-loop client (the next request only after the previous one)
/// would slow down when retries slow its calls, and would hide the retry storm
/// the demo is about.
#[derive(Debug, Clone)]
pub struct LoadPlan {
    /// Concurrent clients.
    pub clients: usize,
    /// Time between one client's requests.
    pub interval: Duration,
    /// In the poison phase, one request in this many is a poison request.
    pub poison_every: u64,
}

/// What one stack's clients saw.
#[derive(Debug, Default, Clone)]
pub struct LoadReport {
    /// Client requests started, by the phase they started in.
    pub started_in: [u64; 5],
    /// Requests that got a 2xx.
    pub succeeded: u64,
    /// Of those, by the phase they started in.
    pub succeeded_in: [u64; 5],
    /// Requests that failed (an error or a non-2xx answer).
    pub failed: u64,
    /// Failed requests refused locally by load shedding (an open circuit, an
    /// exhausted budget), as `tower-classify` sees them.
    pub shed: u64,
    /// Poison requests sent.
    pub poison_sent: u64,
    /// Latency of every request, sorted at the end.
    pub latencies: Vec<Duration>,
}

impl LoadReport {
    /// Client requests started during `phase`.
    pub fn started_during(&self, phase: Phase) -> u64 {
        self.started_in[Phase::ALL.iter().position(|p| *p == phase).expect("listed")]
    }

    /// All client requests.
    pub fn requests(&self) -> u64 {
        self.succeeded + self.failed
    }

    /// The `q` quantile of latency (0.5 = median).
    pub fn latency_quantile(&self, q: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let index = ((self.latencies.len() - 1) as f64 * q).round() as usize;
        self.latencies[index]
    }
}

/// Runs `plan.clients` clients against `url` through `stack` until the
/// schedule ends, and reports what they saw.
pub async fn drive(
    stack: HttpService,
    url: String,
    schedule: Arc<Schedule>,
    plan: LoadPlan,
    started: Instant,
    progress: Option<ProgressBar>,
) -> LoadReport {
    let report = Arc::new(Mutex::new(LoadReport::default()));
    let end = schedule.total();
    let sequence = Arc::new(AtomicU64::new(0));
    let mut clients = JoinSet::new();
    for client in 0..plan.clients {
        let (stack, url, schedule, report, plan, sequence, progress) = (
            stack.clone(),
            url.clone(),
            schedule.clone(),
            report.clone(),
            plan.clone(),
            sequence.clone(),
            progress.clone(),
        );
        clients.spawn(async move {
            // Spread the clients' first requests over one interval.
            let offset = plan.interval * client as u32 / plan.clients.max(1) as u32;
            let mut ticks = tokio::time::interval_at(started + offset, plan.interval);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            let mut requests = JoinSet::new();
            loop {
                ticks.tick().await;
                let elapsed = started.elapsed();
                if elapsed >= end {
                    break;
                }
                let phase = schedule.phase_at(elapsed);
                let n = sequence.fetch_add(1, Ordering::Relaxed);
                let poison = phase == Phase::Poison && n % plan.poison_every == 0;
                let request = build_request(&url, n, poison);
                let (stack, report, progress) = (stack.clone(), report.clone(), progress.clone());
                requests.spawn(async move {
                    let begun = Instant::now();
                    let result = stack.oneshot(request).await;
                    let latency = begun.elapsed();
                    let mut report = report.lock().expect("no panics while locked");
                    report.record(phase, poison, latency, result);
                    drop(report);
                    if let Some(progress) = progress {
                        progress.inc(1);
                    }
                });
            }
            while requests.join_next().await.is_some() {}
        });
    }
    while let Some(joined) = clients.join_next().await {
        joined.expect("client task");
    }
    let mut report = Arc::try_unwrap(report)
        .expect("all clients finished")
        .into_inner()
        .expect("no panics while locked");
    report.latencies.sort_unstable();
    report
}

impl LoadReport {
    fn record(
        &mut self,
        phase: Phase,
        poison: bool,
        latency: Duration,
        result: Result<crate::client::HttpResponse, tower::BoxError>,
    ) {
        self.latencies.push(latency);
        let phase = Phase::ALL.iter().position(|p| *p == phase).expect("listed");
        self.started_in[phase] += 1;
        self.poison_sent += u64::from(poison);
        match result {
            Ok(response) if response.status().is_success() => {
                self.succeeded += 1;
                self.succeeded_in[phase] += 1;
            }
            Ok(_) => self.failed += 1,
            Err(error) => {
                self.failed += 1;
                if let Outcome::Failure(f) = ErrorChainClassifier::new().classify_error(&*error) {
                    self.shed += u64::from(f.kind == FailureKind::Shed);
                }
            }
        }
    }
}

/// A GET for ordinary traffic; a poison request is a POST carrying an
/// `Idempotency-Key` (so it may be retried) and a payload the upstream rejects.
fn build_request(url: &str, n: u64, poison: bool) -> Request<Full<Bytes>> {
    if poison {
        Request::post(format!("{url}/orders"))
            .header(POISON_HEADER, "1")
            .header("idempotency-key", format!("order-{n}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(format!(
                r#"{{"order":{n},"quantity":-1}}"#
            ))))
            .expect("valid request")
    } else {
        Request::get(format!("{url}/items/{n}"))
            .body(Full::new(Bytes::new()))
            .expect("valid request")
    }
}
