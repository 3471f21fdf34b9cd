//! `rheo-bench`: the benchmark harness of Rheo. It runs the same workloads
//! on every `--backend` given and prints them side by side: events/s,
//! latency percentiles, round trips per event, and the raw fsync rate of the
//! disk measured in the same run (see `docs/benchmarks.md`).
//!
//! ```text
//! cargo run --release -p rheo-bench --features databases -- \
//!     --backend native:/tmp/n --backend "$RHEO_POSTGRES_URL" --producers 1,64
//! ```

#![deny(clippy::unwrap_used)]

mod bench;

use std::process::ExitCode;

use clap::Parser;

/// The same workloads on every backend given, side by side (events/s,
/// latency percentiles, round trips per event, the disk's fsync rate).
#[derive(Debug, Parser)]
#[command(name = "rheo-bench", version, about)]
struct Args {
    /// A backend to measure (repeat it to compare several): `native:PATH`,
    /// `memory:`, `sqlite:PATH`, `postgres://...`, `mongodb://...`,
    /// `redis://...`, or bare Redis Streams as a peer (`redis-streams://...`,
    /// with the `peers` feature). Default: a fresh native directory here.
    #[arg(long = "backend", global = true)]
    backends: Vec<String>,
    /// Print the results as one JSON document (the shape `--from` reads).
    #[arg(long, global = true)]
    json: bool,
    #[command(flatten)]
    bench: bench::BenchArgs,
}

/// The options every part of the harness sees.
#[derive(Debug, Clone)]
pub struct Globals {
    /// Every `--backend` given, in order.
    pub backends: Vec<String>,
    /// JSON output.
    pub json: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let ctx = Globals { backends: args.backends, json: args.json };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            let err = rheo_cli::error::CliError::new(format!("cannot start the async runtime: {e}"));
            err.print(ctx.json);
            return err.exit_code();
        }
    };
    rheo_cli::error::finish(runtime.block_on(bench::run(&ctx, args.bench)), ctx.json)
}
