//! Concurrent clients driving a stack through a [`Schedule`].

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use indicatif::ProgressBar;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tower::ServiceExt;
use tower_classify::{ErrorChainClassifier, FailureKind, Outcome};

use crate::client::HttpService;
use crate::upstream::{Phase, Schedule, POISON_HEADER};

/// How the clients behave.
#[derive(Debug, Clone)]
pub struct LoadPlan {
    /// Concurrent clients.
    pub clients: usize,
    /// Pause between one client's requests.
    pub think: Duration,
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
    let sequence = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut clients = Vec::with_capacity(plan.clients);
    for _ in 0..plan.clients {
        let (stack, url, schedule, report, plan, sequence, progress) = (
            stack.clone(),
            url.clone(),
            schedule.clone(),
            report.clone(),
            plan.clone(),
            sequence.clone(),
            progress.clone(),
        );
        clients.push(tokio::spawn(async move {
            let errors = ErrorChainClassifier::new();
            let mut local = LoadReport::default();
            while started.elapsed() < end {
                let phase = schedule.phase_at(started.elapsed());
                let n = sequence.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let poison = phase == Phase::Poison && n % plan.poison_every == 0;
                let request = build_request(&url, n, poison);
                let begun = Instant::now();
                let result = stack.clone().oneshot(request).await;
                local.latencies.push(begun.elapsed());
                local.started_in[Phase::ALL.iter().position(|p| *p == phase).expect("listed")] +=
                    1;
                local.poison_sent += u64::from(poison);
                match result {
                    Ok(response) if response.status().is_success() => local.succeeded += 1,
                    Ok(_) => local.failed += 1,
                    Err(error) => {
                        local.failed += 1;
                        if let Outcome::Failure(f) = errors.classify_error(&*error) {
                            local.shed += u64::from(f.kind == FailureKind::Shed);
                        }
                    }
                }
                if let Some(progress) = &progress {
                    progress.inc(1);
                }
                tokio::time::sleep(plan.think).await;
            }
            let mut report = report.lock().await;
            for (sum, add) in report.started_in.iter_mut().zip(local.started_in) {
                *sum += add;
            }
            report.succeeded += local.succeeded;
            report.failed += local.failed;
            report.shed += local.shed;
            report.poison_sent += local.poison_sent;
            report.latencies.extend(local.latencies);
        }));
    }
    for client in clients {
        client.await.expect("client task");
    }
    let mut report = Arc::try_unwrap(report)
        .expect("all clients finished")
        .into_inner();
    report.latencies.sort_unstable();
    report
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
