//! A flaky upstream: an HTTP server on 127.0.0.1 that goes through phases.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
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

/// What the upstream saw: requests per phase, and when each one arrived.
#[derive(Debug)]
pub struct UpstreamStats {
    started: Instant,
    length: Duration,
    bucket: Duration,
    /// Every request's arrival, as time since `started`, in order. Kept
    /// whole rather than bucketed so that any window can be measured
    /// afterwards (the chart's 250 ms buckets, the recovery peak's 100 ms).
    arrivals: Mutex<Vec<Duration>>,
    by_phase: [AtomicU64; 5],
}

impl UpstreamStats {
    fn new(started: Instant, bucket: Duration, length: Duration) -> Self {
        UpstreamStats {
            started,
            length,
            bucket,
            arrivals: Mutex::new(Vec::new()),
            by_phase: Default::default(),
        }
    }

    fn record(&self, phase: Phase) {
        self.by_phase[phase.index()].fetch_add(1, Ordering::Relaxed);
        let mut arrivals = self.arrivals();
        // The clock is read under the lock, so the arrivals stay sorted.
        arrivals.push(self.started.elapsed());
    }

    fn arrivals(&self) -> MutexGuard<'_, Vec<Duration>> {
        self.arrivals.lock().expect("no panics while locked")
    }

    /// Every request received.
    pub fn total(&self) -> u64 {
        self.arrivals().len() as u64
    }

    /// Requests received during `phase`.
    pub fn in_phase(&self, phase: Phase) -> u64 {
        self.by_phase[phase.index()].load(Ordering::Relaxed)
    }

    /// The most requests that arrived within `width` of one another, among
    /// those that arrived between `from` and `to` (since the start): the
    /// busiest `width`-long window of that stretch, wherever it begins.
    pub fn busiest_window(&self, width: Duration, from: Duration, to: Duration) -> u64 {
        let arrivals = self.arrivals();
        let first = arrivals.partition_point(|at| *at < from);
        let end = arrivals.partition_point(|at| *at < to);
        let stretch = &arrivals[first..end];
        // The busiest window can be taken to begin at an arrival: slide one
        // pointer over the window's first arrival, the other past its last.
        let mut past_last = 0;
        let mut busiest = 0;
        for (first_in, at) in stretch.iter().enumerate() {
            while past_last < stretch.len() && stretch[past_last] < *at + width {
                past_last += 1;
            }
            busiest = busiest.max(past_last - first_in);
        }
        busiest as u64
    }

    /// Requests per second in each time bucket, from the start to the end
    /// of the schedule.
    pub fn rate_series(&self) -> Vec<f64> {
        let bucket_of = |at: Duration| (at.as_millis() / self.bucket.as_millis().max(1)) as usize;
        let mut counts = vec![0u64; bucket_of(self.length) + 1];
        for at in self.arrivals().iter() {
            if let Some(count) = counts.get_mut(bucket_of(*at)) {
                *count += 1;
            }
        }
        let per_second = 1.0 / self.bucket.as_secs_f64();
        counts.into_iter().map(|c| c as f64 * per_second).collect()
    }

    /// The width of one time bucket of [`rate_series`](Self::rate_series).
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
