//! The demo: naive retry vs the tower resilience family, side by side, against
//! a flaky upstream that goes healthy → full outage → throttled → recovered →
//! poison input.
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
use examples::family::family_stack;
use examples::load::{drive, LoadPlan, LoadReport};
use examples::naive::naive_stack;
use examples::upstream::{FlakyUpstream, Phase, Schedule};
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
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Pause between one client's requests (e.g. "20ms").
    #[arg(long, default_value = "20ms", value_parser = parse_duration)]
    think: Duration,
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
    let family_upstream = FlakyUpstream::start((*schedule).clone(), started).await?;

    let naive = naive_stack(http_client(), NAIVE_RETRIES, NAIVE_PAUSE);
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
        think: args.think,
        poison_every: 10,
    };
    let (naive_report, family_report) = tokio::join!(
        drive(naive, naive_upstream.url(), schedule.clone(), plan.clone(), started, None),
        drive(family, family_upstream.url(), schedule.clone(), plan, started, None),
    );
    if let Some(ticker) = ticker {
        let _ = ticker.await;
    }
    if let Some(bar) = &progress {
        bar.finish_and_clear();
    }

    let family_summary = handles.summary().await?;
    let naive_row = Row::new(&naive_report, &naive_upstream, &schedule);
    let family_row = Row::new(&family_report, &family_upstream, &schedule);
    print_table(&naive_row, &family_row, &family_summary);

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
                label: "tower family",
                rates: &family_upstream.stats().rate_series(),
                color: RGBColor(31, 119, 180),
            },
        ],
    )?;
    println!("\nchart of upstream load: {}", args.chart.display());
    println!("dead-letter store:      {}", args.dead_letters.display());
    println!(
        "inspect it with:        cargo run -p tower-poison --features cli -- --store {} stats",
        args.dead_letters.display()
    );

    let family_ok = family_row.outage_amplification <= 1.3;
    let naive_storm = naive_row.outage_amplification >= 3.0;
    println!(
        "\noutage amplification: tower family {:.2} (goal ≤ 1.3: {}), naive retry {:.2} (≥ 3: {})",
        family_row.outage_amplification,
        verdict(family_ok),
        naive_row.outage_amplification,
        verdict(naive_storm),
    );
    if !(family_ok && naive_storm) {
        return Err("the comparison did not show what it should; see the table above".into());
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

/// One stack's figures.
struct Row {
    requests: u64,
    succeeded: u64,
    upstream: u64,
    outage_amplification: f64,
    success_rate: f64,
    p50: Duration,
    p99: Duration,
}

impl Row {
    fn new(report: &LoadReport, upstream: &FlakyUpstream, _schedule: &Schedule) -> Self {
        let outage_requests = report.started_during(Phase::Outage).max(1);
        Row {
            requests: report.requests(),
            succeeded: report.succeeded,
            upstream: upstream.stats().total(),
            outage_amplification: upstream.stats().in_phase(Phase::Outage) as f64
                / outage_requests as f64,
            success_rate: report.succeeded as f64 / report.requests().max(1) as f64,
            p50: report.latency_quantile(0.5),
            p99: report.latency_quantile(0.99),
        }
    }
}

fn print_table(naive: &Row, family: &Row, summary: &examples::family::FamilySummary) {
    let line = |label: &str, a: String, b: String| println!("{label:<34}{a:>16}{b:>16}");
    println!();
    line("", "naive retry".into(), "tower family".into());
    line(
        "client requests",
        naive.requests.to_string(),
        family.requests.to_string(),
    );
    line(
        "requests that reached the upstream",
        naive.upstream.to_string(),
        family.upstream.to_string(),
    );
    line(
        "amplification during the outage",
        format!("{:.2}", naive.outage_amplification),
        format!("{:.2}", family.outage_amplification),
    );
    line(
        "amplification overall",
        format!("{:.2}", naive.upstream as f64 / naive.requests.max(1) as f64),
        format!("{:.2}", family.upstream as f64 / family.requests.max(1) as f64),
    );
    line(
        "successful requests",
        naive.succeeded.to_string(),
        family.succeeded.to_string(),
    );
    line(
        "success rate",
        format!("{:.1} %", naive.success_rate * 100.0),
        format!("{:.1} %", family.success_rate * 100.0),
    );
    line(
        "latency p50",
        format!("{:.1?}", naive.p50),
        format!("{:.1?}", family.p50),
    );
    line(
        "latency p99",
        format!("{:.1?}", naive.p99),
        format!("{:.1?}", family.p99),
    );
    line(
        "breaker opens",
        "-".into(),
        summary.breaker_opens.to_string(),
    );
    line(
        "calls refused while open",
        "-".into(),
        summary.breaker_rejections.to_string(),
    );
    line(
        "retries refused by the budget",
        "-".into(),
        summary.budget_refusals.to_string(),
    );
    line(
        "dead letters stored",
        "-".into(),
        summary.dead_letters.to_string(),
    );
}
