//! Argument parsing and dispatch of the `rheo` command.

mod demo;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Rheo: durable consumer groups over an immutable, queryable event log.
#[derive(Debug, Parser)]
#[command(name = "rheo", version, about)]
struct Args {
    /// Backend URL: `native:PATH[?options]` (the embedded engine, durable) or
    /// `memory:` (ephemeral).
    #[arg(long, global = true, default_value = "native:./rheo-data")]
    backend: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs a complete, narrated scenario: partitions, producers, two groups,
    /// a retry that ends in the dead-letter queue, lag, a history query, a replay.
    Demo,
}

/// Runs the command line; any error is one line on stderr and exit code 1.
pub fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rheo: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match args.command {
            Command::Demo => demo::run(&args.backend, &mut std::io::stdout()).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rheo: {e}");
            ExitCode::FAILURE
        }
    }
}
