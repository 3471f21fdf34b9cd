//! Argument parsing and dispatch of the `rheo` command. Each command group
//! lives in its own file; this one holds the arguments and the error type.

mod demo;
mod events;
mod files;
mod group;
mod parse;
mod stream;
mod top;

use std::path::Path;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
pub use rheo_cli::error::{CliError, CliResult, ErrorKind};
use rheo_cli::output;

/// Rheo: durable consumer groups over an immutable, queryable event log.
#[derive(Debug, Parser)]
#[command(name = "rheo", version, about)]
struct Args {
    /// Backend URL: `native:PATH[?options]` (the embedded engine, durable),
    /// `memory:` (ephemeral), `sqlite:PATH`, `postgres://user@host/db` or
    /// `mongodb://host/db?replicaSet=rs0`, `redis://host:port/`.
    /// Default: `native:./rheo-data`.
    #[arg(long, global = true)]
    backend: Option<String>,
    /// Machine-readable output: one JSON document, or JSON lines for
    /// `read`, `tail` and `top`; an error is one JSON object on stderr,
    /// `{"error": KIND, "message": ...}`.
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
    /// Reads events in sequence order: one partition (`--partition`), or
    /// every partition in turn (0's events, then 1's, ...) up to `--limit`.
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
    /// Gives leased deliveries back for another attempt (after `--delay`
    /// seconds, or the group's backoff); out of attempts, dead-letters them.
    Retry(group::RetryArgs),
    /// Dead-letters leased deliveries (`dlq list` shows them).
    Reject(group::RejectArgs),
    /// Extends leases to `--lease` seconds from now.
    Renew(group::RenewArgs),
    /// A live view, refreshed every `--interval`: per stream and group the
    /// lag, in-flight deliveries, dead letters, and appended/acked events
    /// per second. In a terminal it redraws the screen; piped or under
    /// `--json`, one JSON line per refresh.
    Top(top::TopArgs),
    /// Dumps the records of one data file (segment, index, WAL, checkpoint).
    Inspect(files::InspectArgs),
    /// Checks every checksum of a native data directory without opening it.
    Verify(files::VerifyArgs),
}

impl From<demo::DemoError> for CliError {
    fn from(e: demo::DemoError) -> Self {
        match e {
            demo::DemoError::Rheo(e) => e.into(),
            demo::DemoError::Io(e) => e.into(),
        }
    }
}

/// The global options every command sees.
#[derive(Debug, Clone)]
pub struct Globals {
    /// The backend URL.
    pub backend: String,
    /// JSON output.
    pub json: bool,
}

impl Globals {
    /// Opens the backend for a command that changes it (creating a
    /// missing native directory or SQLite file).
    pub async fn open_write(&self) -> Result<rheo::Rheo, CliError> {
        rheo::Rheo::open(&self.backend).await.map_err(|e| {
            let locked = matches!(e, rheo::Error::Locked { .. });
            let mut err = CliError::from(e);
            if locked {
                err = err.with_note(format!(
                    "This command writes; these only read and work while it runs: {READ_ONLY_COMMANDS}"
                ));
            }
            err
        })
    }

    /// Opens the backend for a command that only reads: a native
    /// directory or SQLite file that does not exist is an error (a wrong
    /// `--backend`), never created.
    pub async fn open_read(&self) -> Result<rheo::Rheo, CliError> {
        let missing = |what: String| Err(CliError::of(ErrorKind::NotFound, format!("{what}; check --backend")));
        if let Some(rest) = self.backend.strip_prefix("native:") {
            let dir = Path::new(rest.split('?').next().unwrap_or(rest));
            if !dir.as_os_str().is_empty() && !dir.join("MANIFEST").is_file() {
                return missing(format!("no Rheo data directory at {} (no MANIFEST)", dir.display()));
            }
        } else if let Some(rest) = self.backend.strip_prefix("sqlite:") {
            let rest = rest.strip_prefix("//").unwrap_or(rest);
            let file = rest.split('?').next().unwrap_or(rest);
            if !file.is_empty() && file != ":memory:" && !Path::new(file).is_file() {
                return missing(format!("no SQLite database at {file}"));
            }
        }
        Ok(rheo::Rheo::open(&read_only_url(&self.backend)).await?)
    }
}

/// The commands that only read (they open a native directory read-only, so
/// they work beside the process that holds it).
pub const READ_ONLY_COMMANDS: &str = "read, query, tail, stream list, stream info, index status, group list, \
     group info, group lag, dlq list, top, inspect, verify";

/// A `native:` URL with `read_only=true` added, a database URL with its
/// background retention rounds off (a command that reads deletes nothing),
/// unless the URL says otherwise; `memory:` as it is.
fn read_only_url(url: &str) -> String {
    let key = if url.starts_with("native:") {
        "read_only"
    } else if ["sqlite:", "postgres:", "postgresql:", "mongodb:", "mongodb+srv:"].iter().any(|s| url.starts_with(s)) {
        "rheo_retention_interval_ms"
    } else {
        return url.to_owned();
    };
    let value = if key == "read_only" { "true" } else { "0" };
    match url.split_once('?') {
        Some((_, query)) if query.split('&').any(|kv| kv.starts_with(&format!("{key}="))) => url.to_owned(),
        Some(_) => format!("{url}&{key}={value}"),
        None => format!("{url}?{key}={value}"),
    }
}

/// Runs the command line: exit 0 on success, 1 when the command failed or
/// found a problem, 2 on bad arguments; any error is one line on stderr.
pub fn main() -> ExitCode {
    // Known before clap parses, so that its errors are JSON too.
    let json = std::env::args().skip(1).take_while(|a| a != "--").any(|a| a == "--json");
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            use clap::error::ErrorKind as Clap;
            if matches!(e.kind(), Clap::DisplayHelp | Clap::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            if e.kind() == Clap::DisplayHelpOnMissingArgumentOrSubcommand {
                if !json {
                    let _ = e.print();
                    return ExitCode::from(2);
                }
                let err = CliError::usage("a subcommand is missing (see --help)");
                err.print(json);
                return err.exit_code();
            }
            // One line: clap's message (which may continue on the next
            // lines) without its usage block and its `error: `.
            let rendered = e.render().to_string();
            let message: Vec<&str> = rendered
                .lines()
                .take_while(|l| !l.starts_with("Usage:"))
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            let message = message.join(" ");
            let message = message.strip_prefix("error: ").unwrap_or(&message);
            let err = CliError::usage(format!("{message} (see --help)"));
            err.print(json);
            return err.exit_code();
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            let err = CliError::new(format!("cannot start the async runtime: {e}"));
            err.print(json);
            return err.exit_code();
        }
    };
    let backend = args.backend.unwrap_or_else(|| "native:./rheo-data".to_owned());
    let ctx = Globals { backend, json: args.json };
    rheo_cli::error::finish(runtime.block_on(dispatch(&ctx, args.command)), ctx.json)
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
        Command::Retry(a) => group::retry(ctx, a).await,
        Command::Reject(a) => group::reject(ctx, a).await,
        Command::Renew(a) => group::renew(ctx, a).await,
        Command::Top(a) => top::run(ctx, a).await,
        Command::Inspect(a) => files::inspect(ctx, a),
        Command::Verify(a) => files::verify(ctx, a),
    }
}

/// `rheo demo`: the narration on stdout as it runs, or under `--json` its
/// lines as `{"backend": .., "lines": [..]}`.
async fn demo_command(ctx: &Globals) -> CliResult {
    if !ctx.json {
        demo::run(&ctx.backend, &mut std::io::stdout()).await?;
        return Ok(true);
    }
    let mut buf = Vec::new();
    demo::run(&ctx.backend, &mut buf).await?;
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    output::render(ctx.json, output::Output::new(&serde_json::json!({"backend": ctx.backend, "lines": lines}))?)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    #[test]
    fn read_commands_open_native_directories_read_only() {
        assert_eq!(super::read_only_url("native:./d"), "native:./d?read_only=true");
        assert_eq!(super::read_only_url("native:./d?recovery=strict"), "native:./d?recovery=strict&read_only=true");
        assert_eq!(super::read_only_url("native:./d?read_only=false"), "native:./d?read_only=false");
        assert_eq!(super::read_only_url("sqlite:x.db"), "sqlite:x.db?rheo_retention_interval_ms=0");
        assert_eq!(
            super::read_only_url("postgres://u@h/db?sslmode=disable"),
            "postgres://u@h/db?sslmode=disable&rheo_retention_interval_ms=0"
        );
        assert_eq!(
            super::read_only_url("sqlite:x.db?rheo_retention_interval_ms=5"),
            "sqlite:x.db?rheo_retention_interval_ms=5"
        );
        assert_eq!(super::read_only_url("memory:"), "memory:");
    }
}
