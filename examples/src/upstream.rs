//! A flaky upstream: an HTTP server on 127.0.0.1 that goes through phases.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::scripted::serve_until_dropped;

/// What the upstream does during one stretch of time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Answers 200 after a short think.
    Healthy,
    /// A full outage: every request gets 503.
    Outage,
    /// Throttling: every request gets 429 with `Retry-After`.
    RateLimited,
    /// Healthy again.
    Recovered,
    /// Healthy, while clients send a few poison requests that it rejects with 422.
    Poison,
}

impl Phase {
    /// Every phase, in the order of [`Schedule::demo`].
    pub const ALL: [Phase; 5] = [
        Phase::Healthy,
        Phase::Outage,
        Phase::RateLimited,
        Phase::Recovered,
        Phase::Poison,
    ];

    /// A short label.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Healthy => "healthy",
            Phase::Outage => "outage (503)",
            Phase::RateLimited => "throttled (429)",
            Phase::Recovered => "recovered",
            Phase::Poison => "poison input",
        }
    }

    fn index(self) -> usize {
        Phase::ALL.iter().position(|p| *p == self).expect("listed")
    }
}

/// Consecutive phases, each lasting a given time.
#[derive(Debug, Clone)]
pub struct Schedule {
    phases: Vec<(Phase, Duration)>,
    retry_after: Duration,
}

impl Schedule {
    /// The demo's schedule over `total`: healthy 20 %, outage 30 %, throttled
    /// 15 %, recovered 20 %, poison 15 %. Throttled answers say `Retry-After: 1`.
    pub fn demo(total: Duration) -> Self {
        let share = |percent: u32| total * percent / 100;
        Schedule {
            phases: vec![
                (Phase::Healthy, share(20)),
                (Phase::Outage, share(30)),
                (Phase::RateLimited, share(15)),
                (Phase::Recovered, share(20)),
                (Phase::Poison, share(15)),
            ],
            retry_after: Duration::from_secs(1),
        }
    }

    /// One phase for all time (for tests and examples).
    pub fn constant(phase: Phase) -> Self {
        Schedule {
            phases: vec![(phase, Duration::MAX)],
            retry_after: Duration::from_secs(1),
        }
    }

    /// The phases, in order.
    pub fn phases(&self) -> &[(Phase, Duration)] {
        &self.phases
    }

    /// The whole schedule's length.
    pub fn total(&self) -> Duration {
        self.phases
            .iter()
            .fold(Duration::ZERO, |sum, (_, d)| sum.saturating_add(*d))
    }

    /// The phase `elapsed` after the start (the last phase after the end).
    pub fn phase_at(&self, elapsed: Duration) -> Phase {
        let mut end = Duration::ZERO;
        for (phase, length) in &self.phases {
            end = end.saturating_add(*length);
            if elapsed < end {
                return *phase;
            }
        }
        self.phases.last().map_or(Phase::Healthy, |(p, _)| *p)
    }

    /// When `phase` starts and ends, if it is in the schedule.
    pub fn window(&self, phase: Phase) -> Option<(Duration, Duration)> {
        let mut start = Duration::ZERO;
        for (p, length) in &self.phases {
            let end = start.saturating_add(*length);
            if *p == phase {
                return Some((start, end));
            }
            start = end;
        }
        None
    }
}

/// What the upstream saw: requests per phase and per time bucket.
#[derive(Debug)]
pub struct UpstreamStats {
    started: Instant,
    bucket: Duration,
    buckets: Vec<AtomicU64>,
    by_phase: [AtomicU64; 5],
    total: AtomicU64,
}

impl UpstreamStats {
    fn new(started: Instant, bucket: Duration, length: Duration) -> Self {
        let count = (length.as_millis() / bucket.as_millis().max(1)) as usize + 1;
        UpstreamStats {
            started,
            bucket,
            buckets: (0..count.min(100_000)).map(|_| AtomicU64::new(0)).collect(),
            by_phase: Default::default(),
            total: AtomicU64::new(0),
        }
    }

    fn record(&self, phase: Phase) {
        self.total.fetch_add(1, Ordering::Relaxed);
        self.by_phase[phase.index()].fetch_add(1, Ordering::Relaxed);
        let index = (self.started.elapsed().as_millis() / self.bucket.as_millis().max(1)) as usize;
        if let Some(bucket) = self.buckets.get(index) {
            bucket.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every request received.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Requests received during `phase`.
    pub fn in_phase(&self, phase: Phase) -> u64 {
        self.by_phase[phase.index()].load(Ordering::Relaxed)
    }

    /// Requests per second in each time bucket.
    pub fn rate_series(&self) -> Vec<f64> {
        let per_second = 1.0 / self.bucket.as_secs_f64();
        self.buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed) as f64 * per_second)
            .collect()
    }

    /// The width of one time bucket.
    pub fn bucket(&self) -> Duration {
        self.bucket
    }
}

/// A running flaky upstream. Dropping it stops the server.
#[derive(Debug)]
pub struct FlakyUpstream {
    addr: SocketAddr,
    stats: Arc<UpstreamStats>,
    _shutdown: oneshot::Sender<()>,
}

/// The header a client sets on a poison request.
pub const POISON_HEADER: &str = "x-poison";

#[derive(Clone)]
struct AppState {
    schedule: Arc<Schedule>,
    stats: Arc<UpstreamStats>,
}

impl FlakyUpstream {
    /// Starts the server on 127.0.0.1 (a free port); its schedule starts at `started`.
    pub async fn start(schedule: Schedule, started: Instant) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let length = schedule.total().min(Duration::from_secs(3_600));
        let stats = Arc::new(UpstreamStats::new(
            started,
            Duration::from_millis(250),
            length,
        ));
        let state = AppState {
            schedule: Arc::new(schedule),
            stats: stats.clone(),
        };
        let app = Router::new()
            .route("/{*path}", any(handle))
            .route("/", any(handle))
            .with_state(state);
        let shutdown = serve_until_dropped(listener, app);
        Ok(FlakyUpstream {
            addr,
            stats,
            _shutdown: shutdown,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What the upstream has seen so far.
    pub fn stats(&self) -> &Arc<UpstreamStats> {
        &self.stats
    }
}

async fn handle(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let phase = state.schedule.phase_at(state.stats.started.elapsed());
    state.stats.record(phase);
    if headers.contains_key(POISON_HEADER) {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            "cannot process this payload",
        )
            .into_response();
    }
    match phase {
        Phase::Outage => (StatusCode::SERVICE_UNAVAILABLE, "upstream down").into_response(),
        Phase::RateLimited => (
            StatusCode::TOO_MANY_REQUESTS,
            [(
                "retry-after",
                state.schedule.retry_after.as_secs().to_string(),
            )],
            "slow down",
        )
            .into_response(),
        Phase::Healthy | Phase::Recovered | Phase::Poison => {
            tokio::time::sleep(Duration::from_millis(2)).await;
            (StatusCode::OK, "ok").into_response()
        }
    }
}
