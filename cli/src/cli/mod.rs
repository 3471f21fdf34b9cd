//! Argument parsing and dispatch of the `rheo` command. Each command group
//! lives in its own file; this one holds the arguments and the error type.

mod bench;
mod demo;
mod events;
mod files;
mod group;
mod output;
mod parse;
mod stream;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Rheo: durable consumer groups over an immutable, queryable event log.
#[derive(Debug, Parser)]
#[command(name = "rheo", version, about)]
struct Args {
    /// Backend URL: `native:PATH[?options]` (the embedded engine, durable),
    /// `memory:` (ephemeral), `sqlite:PATH`, `postgres://user@host/db` or
    /// `mongodb://host/db?replicaSet=rs0`.
    /// `rheo bench` takes it more than once, to run each backend in turn.
    /// Default: `native:./rheo-data` (`rheo bench`: a fresh directory
    /// here, removed afterwards).
    #[arg(long, global = true)]
    backend: Vec<String>,
    /// Machine-readable output: one JSON document, or JSON lines for
    /// `read` and `tail`.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs a complete, narrated scenario: partitions, producers, two groups,
    /// a retry that ends in the dead-letter queue, lag, a history query, a replay.
    Demo,
    /// Creates and lists streams.
    #[command(subcommand)]
    Stream(stream::StreamCommand),
    /// Creates secondary indexes and shows how far they are built.
    #[command(subcommand)]
    Index(stream::IndexCommand),
    /// Appends events: JSON payloads from the arguments, or JSON lines from stdin.
    Append(events::AppendArgs),
    /// Reads one partition in sequence order.
    Read(events::ReadArgs),
    /// Queries a stream's history.
    Query(events::QueryArgs),
    /// Follows a stream: prints new events as they arrive.
    Tail(events::TailArgs),
    /// Manages consumer groups.
    #[command(subcommand)]
    Group(group::GroupCommand),
    /// Lists dead-lettered deliveries.
    #[command(subcommand)]
    Dlq(group::DlqCommand),
    /// Claims deliveries for a group and prints their lease references.
    Fetch(group::FetchArgs),
    /// Acknowledges leases by their references (as printed by `fetch`).
    Ack(group::AckArgs),
    /// Dumps the records of one data file (segment, index, WAL, checkpoint).
    Inspect(files::InspectArgs),
    /// Checks every checksum of a native data directory without opening it.
    Verify(files::VerifyArgs),
    /// Runs the same workloads on every `--backend` given and prints them
    /// side by side (events/s, latency percentiles, the disk's fsync rate).
    Bench(bench::BenchArgs),
}

/// A failed command: the one line printed after `error: `.
#[derive(Debug)]
pub struct CliError {
    message: String,
    /// A bad argument or value (exit code 2), not a failed operation.
    usage: bool,
}

impl CliError {
    /// A failed operation (exit code 1) with this message.
    pub fn new(message: impl Into<String>) -> Self {
        CliError { message: message.into(), usage: false }
    }

    /// A bad argument or value (exit code 2) with this message.
    pub fn usage(message: impl Into<String>) -> Self {
        CliError { message: message.into(), usage: true }
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<rheo::Error> for CliError {
    fn from(e: rheo::Error) -> Self {
        CliError::new(e.to_string())
    }
}

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> Self {
        CliError::new(format!("writing output: {e}"))
    }
}

impl From<demo::DemoError> for CliError {
    fn from(e: demo::DemoError) -> Self {
        CliError::new(e.to_string())
    }
}

/// The result of a command: `Ok(false)` when it ran but found a problem
/// (a corrupt file, a failed ack) and already said so.
pub type CliResult = Result<bool, CliError>;

/// The global options every command sees.
#[derive(Debug, Clone)]
pub struct Globals {
    /// The backend URL of every command but `bench`.
    pub backend: String,
    /// Every `--backend` given, in order (`rheo bench` runs each).
    pub backends: Vec<String>,
    /// JSON output.
    pub json: bool,
}

impl Globals {
    /// Opens the backend.
    pub async fn open(&self) -> Result<rheo::Rheo, CliError> {
        Ok(rheo::Rheo::open(&self.backend).await?)
    }
}

/// Runs the command line: exit 0 on success, 1 when the command failed or
/// found a problem, 2 on bad arguments; any error is one line on stderr.
pub fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = e.print();
                return ExitCode::from(2);
            }
            // One line: clap's message (which may continue on the next
            // lines) without its usage block.
            let rendered = e.render().to_string();
            let message: Vec<&str> = rendered
                .lines()
                .take_while(|l| !l.starts_with("Usage:"))
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            eprintln!("{} (see --help)", message.join(" "));
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.backend.len() > 1 && !matches!(args.command, Command::Bench(_)) {
        eprintln!("--backend was given {} times; only `rheo bench` takes several (see --help)", args.backend.len());
        return ExitCode::from(2);
    }
    let backend = args.backend.last().cloned().unwrap_or_else(|| "native:./rheo-data".to_owned());
    let ctx = Globals { backend, backends: args.backend, json: args.json };
    let result = runtime.block_on(dispatch(&ctx, args.command));
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            if e.usage { ExitCode::from(2) } else { ExitCode::FAILURE }
        }
    }
}

async fn dispatch(ctx: &Globals, command: Command) -> CliResult {
    match command {
        Command::Demo => demo_command(ctx).await,
        Command::Stream(c) => stream::run_stream(ctx, c).await,
        Command::Index(c) => stream::run_index(ctx, c).await,
        Command::Append(a) => events::append(ctx, a).await,
        Command::Read(a) => events::read(ctx, a).await,
        Command::Query(a) => events::query(ctx, a).await,
        Command::Tail(a) => events::tail(ctx, a).await,
        Command::Group(c) => group::run_group(ctx, c).await,
        Command::Dlq(c) => group::run_dlq(ctx, c).await,
        Command::Fetch(a) => group::fetch(ctx, a).await,
        Command::Ack(a) => group::ack(ctx, a).await,
        Command::Inspect(a) => files::inspect(ctx, a),
        Command::Verify(a) => files::verify(ctx, a),
        Command::Bench(a) => bench::run(ctx, a).await,
    }
}

/// `rheo demo`: the narration on stdout, or under `--json` its lines as
/// `{"backend": .., "lines": [..]}`.
async fn demo_command(ctx: &Globals) -> CliResult {
    if !ctx.json {
        demo::run(&ctx.backend, &mut std::io::stdout()).await?;
        return Ok(true);
    }
    let mut buf = Vec::new();
    demo::run(&ctx.backend, &mut buf).await?;
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    output::print_json(&serde_json::json!({"backend": ctx.backend, "lines": lines}))?;
    Ok(true)
}
