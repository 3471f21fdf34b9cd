//! `rheo bench`: a quick append and fetch+ack throughput run.

use std::time::{Duration, Instant};

use clap::Args;
use rheo::{FetchOptions, GroupOptions, StreamOptions};
use serde_json::json;

use super::output::{line, print_json};
use super::{CliError, CliResult, Globals};

/// Events per append batch and per fetch.
const BATCH: usize = 500;

/// Arguments of `rheo bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Events to append, then fetch and ack.
    #[arg(long, default_value_t = 20_000)]
    events: usize,
    /// Partitions of the bench stream.
    #[arg(long, default_value_t = 4)]
    partitions: u32,
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9)
}

/// Runs the bench on a new stream `bench-<random>` of the backend.
pub async fn run(ctx: &Globals, a: BenchArgs) -> CliResult {
    if a.events == 0 {
        return Err(CliError::new("--events must be at least 1"));
    }
    let rheo = ctx.open().await?;
    let stream = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    rheo.create_stream(&stream, StreamOptions::new().partitions(a.partitions)).await?;
    rheo.create_group(&stream, "bench", GroupOptions::new()).await?;
    if !ctx.json {
        line(format!("bench on {} (stream {stream}): {} events, batches of {BATCH}", ctx.backend, a.events))?;
    }
    let started = Instant::now();
    let mut left = a.events;
    let mut n = 0u64;
    while left > 0 {
        let take = left.min(BATCH);
        let batch: Vec<_> = (0..take)
            .map(|_| {
                n += 1;
                json!({"type": "bench", "n": n})
            })
            .collect();
        rheo.append_batch(&stream, batch).await?;
        left -= take;
    }
    let append = started.elapsed();
    let started = Instant::now();
    let mut settled = 0usize;
    while settled < a.events {
        let leases = rheo.fetch(&stream, "bench", FetchOptions::new().limit(BATCH)).await?;
        if leases.is_empty() {
            return Err(CliError::new(format!("fetch returned nothing after {settled} of {} events", a.events)));
        }
        let results = rheo.ack_many(leases.iter()).await?;
        if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
            return Err(e.into());
        }
        settled += leases.len();
    }
    let consume = started.elapsed();
    let (append_rate, consume_rate) = (rate(a.events, append), rate(a.events, consume));
    if ctx.json {
        print_json(&json!({"backend": ctx.backend, "stream": stream, "events": a.events,
            "append_secs": append.as_secs_f64(), "append_events_per_sec": append_rate,
            "fetch_ack_secs": consume.as_secs_f64(), "fetch_ack_events_per_sec": consume_rate}))?;
    } else {
        line(format!("append     {:>10.0} events/s  ({:.3} s)", append_rate, append.as_secs_f64()))?;
        line(format!("fetch+ack  {:>10.0} events/s  ({:.3} s)", consume_rate, consume.as_secs_f64()))?;
    }
    Ok(true)
}
