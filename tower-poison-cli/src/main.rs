//! `tower-poison`: inspect, replay and purge a dead-letter store. The
//! README gives the commands, the output formats and the exit statuses.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Parser, Subcommand};
use http::header::{HeaderName, HeaderValue};
use http::Uri;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tower::timeout::Timeout;
use tower_classify::duration::{format_duration, parse_duration};
use tower_classify::{BoxError, FailureKind, HttpClassifier};
use tower_poison::replay::{http_request, ReplayOutcome, Replayer};
use tower_poison::store::{DeadLetterStore, ListQuery, PurgeFilter, RedbStore};
use tower_poison::{DeadLetterEntry, EntryId, EntryIdPrefix, HttpCapture};

/// Inspect, replay and purge a tower-poison dead-letter store: a redb file or
/// a Redis queue.
///
/// A redb file is locked while a service has it open: stop the service (or
/// point at a copy) first. A Redis queue is shared: the CLI reads it while
/// every node keeps writing.
#[derive(Debug, Parser)]
#[command(name = "tower-poison", version)]
struct Cli {
    /// The dead-letter store: a redb file, or a Redis server
    /// (`redis://host:port/db`, with the `redis` feature; a Redis Cluster's
    /// node URLs comma-separated) holding the queue named by --stream.
    #[arg(
        long,
        global = true,
        env = "TOWER_POISON_STORE",
        value_name = "PATH|URL"
    )]
    store: Option<String>,

    /// With a redis:// store: the queue's name.
    #[arg(
        long,
        global = true,
        env = "TOWER_POISON_STREAM",
        value_name = "NAME",
        default_value = "tower-poison:dead-letters"
    )]
    stream: String,

    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List entries, oldest first.
    List(ListArgs),
    /// Show one entry in full.
    Show {
        /// The entry id (32 hex digits, as `list` prints it), or enough of
        /// its first digits to match one entry alone.
        id: EntryIdPrefix,
    },
    /// Remove one entry (and any replay claim on it).
    Remove {
        /// The entry id, or enough of its first digits to match one entry
        /// alone.
        id: EntryIdPrefix,
    },
    /// Depth, oldest age and counts by failure kind.
    Stats,
    /// Send entries to a URL again: delivered entries are removed, failed
    /// ones kept with their attempt count raised.
    Replay(ReplayArgs),
    /// Remove entries (all, or those older than an age). Without `--yes` it
    /// only reports what it would remove.
    Purge {
        /// Only entries whose first failure is older than this (`7d`, `12h`).
        #[arg(long, value_parser = parse_age, value_name = "AGE")]
        older_than: Option<Duration>,
        /// Really remove them.
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Debug, Args)]
struct ListArgs {
    /// Only entries of this failure kind (server_error, rate_limited,
    /// timeout, connection, rejected, poison, shed).
    #[arg(long, value_parser = parse_kind)]
    kind: Option<FailureKind>,
    /// Only entries with this label.
    #[arg(long)]
    label: Option<String>,
    /// At most this many entries.
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Start after this id (the `next` of a previous page).
    #[arg(long)]
    after: Option<EntryId>,
}

#[derive(Debug, Args)]
struct ReplayArgs {
    /// The entry to replay: its id, or enough of its first digits to match
    /// one entry alone.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    id: Option<EntryIdPrefix>,
    /// Replay every entry (filtered by --kind and --label).
    #[arg(long)]
    all: bool,
    /// Where to send them: scheme, host and port (and an optional path
    /// prefix); each entry keeps its own method, path, query and body.
    #[arg(long, value_name = "URL")]
    to: Uri,
    /// At most this many requests per second.
    #[arg(long, default_value_t = 10.0)]
    rate: f64,
    /// Give up on one request after this long.
    #[arg(long, value_parser = parse_age, default_value = "30s")]
    timeout: Duration,
    /// Hold each entry this long while it is sent, so another replay of the
    /// same entry (a second operator, a second machine) sends nothing; at
    /// least --timeout.
    #[arg(long, value_parser = parse_age, default_value = "5m")]
    lease: Duration,
    /// An extra header for every request, such as fresh credentials for the
    /// redacted ones (`--header 'authorization: Bearer …'`).
    #[arg(long = "header", value_parser = parse_header, value_name = "NAME: VALUE")]
    headers: Vec<(HeaderName, HeaderValue)>,
    /// With --all: only entries of this kind.
    #[arg(long, value_parser = parse_kind)]
    kind: Option<FailureKind>,
    /// With --all: only entries with this label.
    #[arg(long)]
    label: Option<String>,
}

fn parse_age(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|e| e.to_string())
}

fn parse_kind(text: &str) -> Result<FailureKind, String> {
    text.parse::<FailureKind>()
        .map_err(|e| e.reason().to_owned())
}

fn parse_header(text: &str) -> Result<(HeaderName, HeaderValue), String> {
    let (name, value) = text
        .split_once(':')
        .ok_or_else(|| format!("expected `NAME: VALUE`, got {text:?}"))?;
    let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|e| e.to_string())?;
    let value = HeaderValue::from_str(value.trim()).map_err(|e| e.to_string())?;
    Ok((name, value))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(error) => {
            let chain = tower_poison::error_chain(&*error);
            eprintln!("error: {}", chain.join(": "));
            ExitCode::from(1)
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, BoxError> {
    let Some(location) = cli.store.clone() else {
        return Err(
            "no store given: pass --store PATH or --store redis://HOST:PORT (or set TOWER_POISON_STORE)"
                .into(),
        );
    };
    if location.starts_with("redis://")
        || location.starts_with("rediss://")
        || location.starts_with("redis+unix://")
    {
        return run_redis(cli, &location).await;
    }
    let path = PathBuf::from(location);
    if !path.exists() {
        return Err(format!("dead-letter store {} does not exist", path.display()).into());
    }
    let store = RedbStore::builder().open(&path)?;
    dispatch(&store, cli).await
}

#[cfg(feature = "redis")]
async fn run_redis(cli: Cli, url: &str) -> Result<ExitCode, BoxError> {
    let store = tower_poison::store::RedisDeadLetterStore::builder()
        .connect(url, cli.stream.clone())
        .await?;
    dispatch(&store, cli).await
}

#[cfg(not(feature = "redis"))]
async fn run_redis(_cli: Cli, url: &str) -> Result<ExitCode, BoxError> {
    Err(format!(
        "{url} is a Redis store, and this tower-poison was built without the `redis` feature \
         (cargo install tower-poison-cli --features redis)"
    )
    .into())
}

/// What every command needs: the store, `--json`, and when the command began.
struct Ctx<'a, St> {
    store: &'a St,
    json: bool,
    now: SystemTime,
}

async fn dispatch(store: &impl DeadLetterStore, cli: Cli) -> Result<ExitCode, BoxError> {
    let (json, now) = (cli.json, SystemTime::now());
    let cx = &Ctx { store, json, now };
    match cli.command {
        Command::List(args) => list(cx, args).await,
        Command::Show { id } => show(cx, resolve(store, id).await?).await,
        Command::Remove { id } => remove(cx, resolve(store, id).await?).await,
        Command::Stats => stats(cx).await,
        Command::Replay(args) => replay_command(cx, args).await,
        Command::Purge { older_than, yes } => purge(cx, older_than, yes).await,
    }
}

async fn list(cx: &Ctx<'_, impl DeadLetterStore>, args: ListArgs) -> Result<ExitCode, BoxError> {
    let Ctx { store, json, now } = *cx;
    let query = ListQuery {
        limit: args.limit,
        after: args.after,
        kind: args.kind,
        label: args.label,
        ..ListQuery::default()
    };
    let page = store.list(query).await?;
    if json {
        let entries: Vec<Value> = page.entries.iter().map(entry_json).collect();
        let out = json!({
            "entries": entries,
            "next": page.next.map(|id| id.to_string()),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = page
        .entries
        .iter()
        .map(|e| {
            vec![
                e.id.to_string(),
                age(now.duration_since(e.first_failed_at).unwrap_or_default()),
                e.kind.to_string(),
                e.attempts.to_string(),
                e.label.clone(),
                e.method.clone().unwrap_or_default(),
                clip(e.uri.as_deref().unwrap_or(""), 48),
                clip(&e.error.join(": "), 60),
            ]
        })
        .collect();
    print_table(
        &[
            "ID", "AGE", "KIND", "ATTEMPTS", "LABEL", "METHOD", "URI", "ERROR",
        ],
        &rows,
    );
    match page.next {
        Some(next) => println!("more: --after {next}"),
        None => println!("{} entries", rows.len()),
    }
    Ok(ExitCode::SUCCESS)
}

/// How many of the entries an ambiguous prefix matches are named in the
/// error.
const AMBIGUOUS_SHOWN: usize = 5;

/// The entry id `prefix` stands for: a whole id as it is (whether or not it
/// is stored; the command reports a missing entry), a shorter prefix only
/// when exactly one stored id starts with it.
async fn resolve(store: &impl DeadLetterStore, prefix: EntryIdPrefix) -> Result<EntryId, BoxError> {
    // A whole id is the one id its range holds.
    let (first, last) = prefix.range();
    if first == last {
        return Ok(first);
    }
    let matches = store.match_prefix(prefix, AMBIGUOUS_SHOWN).await?;
    if let Some(id) = matches.unique() {
        return Ok(id);
    }
    if matches.count == 0 {
        return Err(format!("no entry id starts with {prefix}").into());
    }
    let shown: Vec<String> = matches.ids.iter().map(EntryId::to_string).collect();
    let more = match matches.count.saturating_sub(shown.len() as u64) {
        0 => String::new(),
        more => format!(" and {more} more"),
    };
    Err(format!(
        "id prefix {prefix} is ambiguous: {} entries match ({}{more}); give more digits",
        matches.count,
        shown.join(", ")
    )
    .into())
}

async fn remove(cx: &Ctx<'_, impl DeadLetterStore>, id: EntryId) -> Result<ExitCode, BoxError> {
    if !cx.store.remove(id).await? {
        return Err(format!("no entry {id}").into());
    }
    if cx.json {
        println!("{}", json!({"removed": id.to_string()}));
    } else {
        println!("removed {id}");
    }
    Ok(ExitCode::SUCCESS)
}

async fn show(cx: &Ctx<'_, impl DeadLetterStore>, id: EntryId) -> Result<ExitCode, BoxError> {
    let e = cx.store.get(id).await?.ok_or(format!("no entry {id}"))?;
    if cx.json {
        println!("{}", serde_json::to_string_pretty(&entry_json(&e))?);
    } else {
        print_entry(&e, cx.now);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_entry(e: &DeadLetterEntry, now: SystemTime) {
    let field = |name: &str, value: &str| println!("{name:<16}{value}");
    field("id", &e.id.to_string());
    field("label", &e.label);
    if let Some(message_id) = &e.message_id {
        field("message id", message_id);
    }
    field("kind", e.kind.as_str());
    field("attempts", &e.attempts.to_string());
    field(
        "first failed",
        &format!(
            "{} ({} ago)",
            httpdate::fmt_http_date(e.first_failed_at),
            age(now.duration_since(e.first_failed_at).unwrap_or_default())
        ),
    );
    field("last failed", &httpdate::fmt_http_date(e.last_failed_at));
    field("method", e.method.as_deref().unwrap_or("-"));
    field("uri", e.uri.as_deref().unwrap_or("-"));
    println!("error");
    for (depth, message) in e.error.iter().enumerate() {
        println!("  {}{message}", "  ".repeat(depth));
    }
    if e.failed_replays > 0 {
        let shown = e.replays.len() as u64;
        let latest = match shown < e.failed_replays {
            true => format!(" (the latest {shown} below)"),
            false => String::new(),
        };
        field("replays", &format!("{} failed{latest}", e.failed_replays));
        for replay in &e.replays {
            let status = replay
                .status
                .map_or_else(|| "-".to_owned(), |status| status.to_string());
            println!(
                "  {}  attempt {}  {}  status {status}  {}",
                httpdate::fmt_http_date(replay.at),
                replay.attempt,
                replay.kind,
                replay.error.join(": ")
            );
        }
    }
    println!("headers");
    for header in &e.headers {
        println!("  {}: {}", header.name, header.value);
    }
    match (e.body_truncated, e.body_len) {
        (true, Some(len)) if e.body.is_empty() => println!("body not captured ({len} bytes)"),
        (true, Some(len)) => println!("body ({} of {len} bytes, truncated)", e.body.len()),
        (true, None) => println!("body ({} bytes, truncated)", e.body.len()),
        (false, _) => println!("body ({} bytes)", e.body.len()),
    }
    match std::str::from_utf8(&e.body) {
        Ok(text) => println!("{text}"),
        Err(_) => println!("{:02x?}", &e.body[..]),
    }
}

async fn stats(cx: &Ctx<'_, impl DeadLetterStore>) -> Result<ExitCode, BoxError> {
    let Ctx { store, json, now } = *cx;
    let stats = store.stats(now).await?;
    if json {
        let oldest = stats
            .oldest_age
            .and_then(|age| now.checked_sub(age))
            .map(rfc3339);
        let out = json!({
            "depth": stats.depth,
            "oldest_age_seconds": stats.oldest_age.map(|a| a.as_secs()),
            "oldest_failed_at_rfc3339": oldest,
            "by_kind": stats.by_kind,
            "by_label": stats.by_label,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:<16}{}", "depth", stats.depth);
    println!(
        "{:<16}{}",
        "oldest age",
        stats.oldest_age.map_or("-".to_owned(), age)
    );
    for (header, counts) in [("KIND", &stats.by_kind), ("LABEL", &stats.by_label)] {
        if !counts.is_empty() {
            let rows: Vec<Vec<String>> = counts
                .iter()
                .map(|(name, count)| vec![name.clone(), count.to_string()])
                .collect();
            println!();
            print_table(&[header, "ENTRIES"], &rows);
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn replay_command(
    cx: &Ctx<'_, impl DeadLetterStore>,
    args: ReplayArgs,
) -> Result<ExitCode, BoxError> {
    let Ctx { store, json, .. } = *cx;
    if args.to.scheme().is_none() || args.to.authority().is_none() {
        return Err(format!(
            "--to {} must be an absolute URL (http://host:port)",
            args.to
        )
        .into());
    }
    if !(args.rate > 0.0 && args.rate.is_finite()) {
        return Err("--rate must be a positive number of requests per second".into());
    }
    if args.lease < args.timeout {
        return Err(format!(
            "--lease {}s must be at least --timeout {}s: a request still in flight when its lease ends may be sent again by another replay",
            args.lease.as_secs(),
            args.timeout.as_secs()
        )
        .into());
    }
    let ids = match args.id {
        Some(id) => vec![resolve(store, id).await?],
        None => {
            let query = ListQuery {
                kind: args.kind,
                label: args.label.clone(),
                ..ListQuery::default()
            };
            all_ids(store, query).await?
        }
    };
    let client = Client::builder(TokioExecutor::new()).build_http();
    let mut client = Timeout::new(client, args.timeout);
    let replayer = Replayer::new(store)
        .lease(args.lease)
        .describe(HttpCapture::default());
    let classifier = HttpClassifier::new();
    let mut pace = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate));
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    let mut results = Vec::new();
    let (mut delivered, mut failed) = (0, 0);
    for id in ids {
        pace.tick().await;
        let result = replayer
            .replay(id, &mut client, &classifier, |e| {
                http_request(e, &args.to, &args.headers)
            })
            .await;
        let (status, detail) = match result {
            Ok(ReplayOutcome::Delivered) => ("delivered", json!({})),
            Ok(ReplayOutcome::Failed {
                attempts,
                kind,
                error,
            }) => (
                "failed",
                json!({"attempts": attempts, "kind": kind.as_str(), "error": error}),
            ),
            Ok(ReplayOutcome::Gone { kind, error }) => {
                ("gone", json!({"kind": kind.as_str(), "error": error}))
            }
            Ok(ReplayOutcome::NotFound) => ("not_found", json!({})),
            Ok(ReplayOutcome::InProgress { until }) => {
                let shown = httpdate::fmt_http_date(until);
                (
                    "in_progress",
                    json!({
                        "error": format!("another replay holds it until {shown}"),
                        "until": epoch_millis(until),
                        "until_rfc3339": rfc3339(until),
                    }),
                )
            }
            Err(error) => {
                let text = tower_poison::error_chain(&error).join(": ");
                ("error", json!({ "error": text }))
            }
            // An outcome this CLI does not know (a newer library): not a
            // delivery, so counted as a failure.
            Ok(other) => ("unknown", json!({ "error": format!("{other:?}") })),
        };
        if status == "delivered" {
            delivered += 1;
        } else {
            failed += 1;
        }
        if !json {
            let extra = detail["error"]
                .as_str()
                .map(|error| match detail.get("attempts") {
                    Some(attempts) => format!(" (attempts {attempts}: {error})"),
                    None => format!(" ({error})"),
                });
            println!("{id} {status}{}", extra.unwrap_or_default());
        }
        let mut row = detail;
        (row["id"], row["result"]) = (json!(id.to_string()), json!(status));
        results.push(row);
    }
    if json {
        let out = json!({"delivered": delivered, "failed": failed, "results": results});
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("{delivered} delivered, {failed} failed");
    }
    // 3: some entries failed again.
    Ok(ExitCode::from(if failed == 0 { 0 } else { 3 }))
}

async fn purge(
    cx: &Ctx<'_, impl DeadLetterStore>,
    older_than: Option<Duration>,
    yes: bool,
) -> Result<ExitCode, BoxError> {
    let Ctx { store, json, now } = *cx;
    let filter = older_than.map_or_else(PurgeFilter::default, |age| {
        PurgeFilter::older_than(age, now)
    });
    let count = if yes {
        store.purge(filter).await?
    } else {
        let query = ListQuery {
            failed_before: filter.failed_before,
            ..ListQuery::default()
        };
        all_ids(store, query).await?.len() as u64
    };
    if json {
        let purged = if yes { count } else { 0 };
        let out = json!({"purged": purged, "matching": count, "dry_run": !yes});
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else if yes {
        println!("purged {count} entries");
    } else {
        println!("would purge {count} entries; run again with --yes to remove them");
    }
    Ok(ExitCode::SUCCESS)
}

/// The ids of every entry `query` matches, read a page of 1000 at a time.
async fn all_ids(
    store: &impl DeadLetterStore,
    mut query: ListQuery,
) -> Result<Vec<EntryId>, BoxError> {
    query.limit = 1000;
    let mut ids = Vec::new();
    loop {
        let page = store.list(query.clone()).await?;
        ids.extend(page.entries.iter().map(|e| e.id));
        match page.next {
            Some(next) => query.after = Some(next),
            None => return Ok(ids),
        }
    }
}

/// `entry` as `--json` prints it: the stored form (times in milliseconds
/// since the Unix epoch, as the stores keep them), plus each time again in
/// RFC 3339 (`first_failed_at_rfc3339`, `last_failed_at_rfc3339`, and
/// `at_rfc3339` in each replay record) for people and `jq`'s `fromdate`.
fn entry_json(entry: &DeadLetterEntry) -> Value {
    let mut value = serde_json::to_value(entry).expect("a dead-letter entry serializes");
    if let Some(fields) = value.as_object_mut() {
        for (name, time) in [
            ("first_failed_at_rfc3339", entry.first_failed_at),
            ("last_failed_at_rfc3339", entry.last_failed_at),
        ] {
            fields.insert(name.into(), rfc3339(time).into());
        }
        if let Some(Value::Array(records)) = fields.get_mut("replays") {
            for (record, replay) in records.iter_mut().zip(&entry.replays) {
                if let Some(record) = record.as_object_mut() {
                    record.insert("at_rfc3339".into(), rfc3339(replay.at).into());
                }
            }
        }
    }
    value
}

/// `time` in milliseconds since the Unix epoch (0 before it).
fn epoch_millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}

/// `time` in RFC 3339, UTC, to the millisecond: `2024-02-29T23:59:59.000Z`.
///
/// The stores keep milliseconds, so nothing finer is lost; a time before the
/// Unix epoch prints as the epoch (the stores cannot hold one).
fn rfc3339(time: SystemTime) -> String {
    let millis = epoch_millis(time);
    let (secs, millis) = (millis / 1000, millis % 1000);
    let (days, secs_of_day) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        secs_of_day / 3600,
        secs_of_day / 60 % 60,
        secs_of_day % 60
    )
}

/// The proleptic Gregorian date `days` days after 1970-01-01, by Howard
/// Hinnant's `civil_from_days` (<https://howardhinnant.github.io/date_algorithms.html>):
/// the calendar is counted in 400-year eras of 146,097 days, each era's
/// years starting on 1 March so that the leap day falls at the end.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Days since 0000-03-01, the start of an era.
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    // Months from March: 0 = March, ..., 11 = February.
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = era * 400 + year_of_era + u64::from(month <= 2);
    (year, month, day)
}

/// An age for people: whole seconds (`"3d2h"`, `"0s"`).
fn age(duration: Duration) -> String {
    match duration.as_secs() {
        0 => "0s".to_owned(),
        secs => format_duration(Duration::from_secs(secs)),
    }
}

fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut clipped: String = text.chars().take(max - 1).collect();
    clipped.push('…');
    clipped
}

fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(millis: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(millis)
    }

    #[test]
    fn rfc3339_on_known_instants() {
        for (millis, expected) in [
            (0, "1970-01-01T00:00:00.000Z"),
            (94_694_399_000, "1972-12-31T23:59:59.000Z"),
            // 2000 is a leap year (divisible by 400).
            (951_782_400_000, "2000-02-29T00:00:00.000Z"),
            (1_700_000_000_123, "2023-11-14T22:13:20.123Z"),
            (1_709_251_199_000, "2024-02-29T23:59:59.000Z"),
            // 2100 is not (divisible by 100, not by 400).
            (4_107_499_200_000, "2100-02-28T12:00:00.000Z"),
            (4_107_542_400_000, "2100-03-01T00:00:00.000Z"),
            // The latest instant the stores write.
            (253_402_300_799_999, "9999-12-31T23:59:59.999Z"),
        ] {
            assert_eq!(rfc3339(at(millis)), expected, "{millis}");
        }
        assert_eq!(
            rfc3339(UNIX_EPOCH - Duration::from_secs(1)),
            "1970-01-01T00:00:00.000Z"
        );
        // Past the stores' cap (a bad clock, a hand-made entry): printed,
        // not a panic.
        assert_eq!(
            rfc3339(at(253_402_300_800_000)),
            "10000-01-01T00:00:00.000Z"
        );
        assert!(rfc3339(at(u64::MAX)).ends_with(".615Z"));
    }

    /// The fields of `httpdate`'s IMF-fixdate (`Sun, 06 Nov 1994 08:49:37
    /// GMT`) as an RFC 3339 date and time, to the second.
    fn from_http_date(http: &str) -> String {
        const MONTHS: [&str; 12] = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ];
        let parts: Vec<&str> = http.split(' ').collect();
        let month = MONTHS.iter().position(|m| *m == parts[2]).unwrap() + 1;
        format!("{}-{month:02}-{}T{}", parts[3], parts[1], parts[4])
    }

    proptest! {
        /// Every second the stores can hold formats as `httpdate` (an
        /// independent implementation) formats it.
        #[test]
        fn rfc3339_agrees_with_httpdate(secs in 0u64..253_402_300_800, millis in 0u64..1000) {
            let time = at(secs * 1000 + millis);
            let ours = rfc3339(time);
            let theirs = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(secs));
            prop_assert_eq!(&ours[..19], from_http_date(&theirs));
            prop_assert_eq!(&ours[19..], format!(".{millis:03}Z"));
        }
    }
}
