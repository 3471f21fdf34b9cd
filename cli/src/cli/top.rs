//! `rheo top`: a live view of every group's lag, in-flight deliveries,
//! dead letters and rates, refreshed every `--interval`.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use clap::Args;
use rheo::{Rheo, Timestamp};
use serde::Serialize;

use super::output::{Output, align_right, table};
use super::{CliError, CliResult, Globals, events, parse};

/// Arguments of `rheo top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// The streams to show (default: every stream).
    streams: Vec<String>,
    /// Seconds between refreshes (0.1 to 3600).
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    interval: f64,
    /// Stops after this many refreshes (default: until Ctrl-C).
    #[arg(long, value_name = "N")]
    iterations: Option<u64>,
}

/// One group in one refresh.
#[derive(Debug, Serialize)]
struct Row {
    stream: String,
    group: String,
    /// Events not yet settled behind the group's frontier, all partitions.
    lag: u64,
    /// Deliveries leased now.
    in_flight: u64,
    dead_letters: u64,
    /// Events appended to the stream per second since the last refresh
    /// (null on the first).
    append_rate: Option<f64>,
    /// Events the group's frontier moved past per second since the last
    /// refresh (null on the first).
    settle_rate: Option<f64>,
}

/// One refresh: `{"at": .., "groups": [..]}`.
#[derive(Debug, Serialize)]
struct Refresh {
    at: Timestamp,
    groups: Vec<Row>,
}

/// What the rates are computed from: per stream and group, the stream's
/// appended events and the group's frontier, and when they were read.
type Counters = HashMap<(String, String), (u64, u64, Instant)>;

/// Runs `rheo top`: until `--iterations` refreshes or Ctrl-C (exit 0).
pub async fn run(ctx: &Globals, a: TopArgs) -> CliResult {
    let interval = Duration::from_secs_f64(parse::in_range("--interval", a.interval, 0.1, 3600.0, "seconds")?);
    if a.iterations == Some(0) {
        return Err(CliError::usage("--iterations 0: must be at least 1"));
    }
    let rheo = ctx.open_read().await?;
    // A terminal gets a redrawn table; a pipe or --json, one JSON line per refresh.
    let screen = !ctx.json && std::io::stdout().is_terminal();
    let watch = async {
        let mut last = Counters::new();
        let mut n = 0u64;
        loop {
            let refresh = snapshot(&rheo, &a.streams, &mut last).await?;
            show(ctx, &refresh, screen, interval)?;
            n += 1;
            if a.iterations.is_some_and(|max| n >= max) {
                return Ok(true);
            }
            tokio::time::sleep(interval).await;
        }
    };
    tokio::select! {
        r = watch => r,
        _ = tokio::signal::ctrl_c() => Ok(true),
    }
}

/// Reads every group of the streams (all streams when none is named).
async fn snapshot(rheo: &Rheo, names: &[String], last: &mut Counters) -> Result<Refresh, CliError> {
    let streams = if names.is_empty() {
        rheo.list_streams().await?
    } else {
        let mut v = Vec::with_capacity(names.len());
        for name in names {
            v.push(events::stream_info(rheo, name).await?);
        }
        v
    };
    let mut groups = Vec::new();
    for s in streams {
        let appended: u64 = s.high_watermarks.iter().sum();
        for g in rheo.list_groups(&s.name).await? {
            let info = rheo.group_info(&s.name, &g.name).await?;
            let frontier: u64 = info.lag.partitions.iter().map(|p| p.frontier).sum();
            let now = Instant::now();
            let key = (s.name.clone(), g.name.clone());
            let rate = |before: u64, after: u64, since: Instant| {
                let secs = now.duration_since(since).as_secs_f64();
                (secs > 0.0).then(|| after.saturating_sub(before) as f64 / secs)
            };
            let (append_rate, settle_rate) = match last.get(&key) {
                Some(&(a0, f0, t0)) => (rate(a0, appended, t0), rate(f0, frontier, t0)),
                None => (None, None),
            };
            last.insert(key, (appended, frontier, now));
            groups.push(Row {
                stream: s.name.clone(),
                group: g.name,
                lag: info.lag.total,
                in_flight: info.inflight,
                dead_letters: info.dead_letters,
                append_rate,
                settle_rate,
            });
        }
    }
    Ok(Refresh { at: Timestamp::now(), groups })
}

/// Prints a refresh: a JSON line, or the screen redrawn.
fn show(ctx: &Globals, refresh: &Refresh, screen: bool, interval: Duration) -> Result<(), CliError> {
    let rate = |r: Option<f64>| r.map_or_else(|| "-".to_owned(), |r| format!("{r:.1}"));
    let mut t = table(&["STREAM", "GROUP", "LAG", "IN_FLIGHT", "DEAD", "APPENDED/S", "SETTLED/S"]);
    for g in &refresh.groups {
        t.add_row([
            g.stream.clone(),
            g.group.clone(),
            g.lag.to_string(),
            g.in_flight.to_string(),
            g.dead_letters.to_string(),
            rate(g.append_rate),
            rate(g.settle_rate),
        ]);
    }
    align_right(&mut t, 2..7);
    if screen {
        // Clear the screen and go home, then draw.
        print!("\x1b[2J\x1b[H");
        std::io::stdout().flush()?;
    }
    let header = format!(
        "rheo top: {} at {}, every {:.1}s (Ctrl-C to stop)",
        rheo::redact_url(&ctx.backend),
        refresh.at,
        interval.as_secs_f64()
    );
    Output::lines(std::slice::from_ref(refresh))?.line(header).table(t, "no consumer groups").print(!screen)
}
