//! `rheo inspect` and `rheo verify`: render what `rheo::inspect` reads from
//! a native data directory's files (directly, never through the engine,
//! which would repair them).

use std::path::PathBuf;

use clap::Args;
use rheo::inspect::{self, FileFinding};
use serde_json::json;

use super::output::{Output, render};
use super::{CliError, CliResult, ErrorKind, Globals};

/// The most records `inspect` lists from one file unless `--limit`.
const INSPECT_RECORDS_DEFAULT: usize = 1000;

/// Arguments of `rheo inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// A segment `.log`, sparse index `.idx`, secondary index `.six`,
    /// delivery WAL `wal-*.log`, checkpoint `.ckpt`, `MANIFEST` or `txn`.
    file: PathBuf,
    /// The most records to list.
    #[arg(long, default_value_t = INSPECT_RECORDS_DEFAULT)]
    limit: usize,
}

/// Arguments of `rheo verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The data directory (default: the `--backend` path when it is
    /// `native:PATH`).
    dir: Option<PathBuf>,
}

/// Runs `rheo inspect FILE`.
pub fn inspect(ctx: &Globals, a: InspectArgs) -> CliResult {
    if !a.file.exists() {
        return Err(CliError::of(ErrorKind::NotFound, format!("{}: no such file", a.file.display())));
    }
    let (kind, bytes, r) = inspect::inspect_file(&a.file, a.limit)?;
    let mut out = Output::new(&json!({"file": a.file.display().to_string(), "kind": kind, "bytes": bytes,
        "header": r.header, "records": r.records, "record_count": r.count, "trailer": r.trailer,
        "problems": r.problems, "warnings": r.warnings}))?
    .line(format!("{} ({kind:?}, {bytes} bytes)", a.file.display()))
    .line(format!("header: {}", r.header));
    for rec in &r.records {
        out = out.line(format!("  {rec}"));
    }
    if r.count > r.records.len() as u64 {
        out = out.line(format!("  ... {} more (use --limit)", r.count - r.records.len() as u64));
    }
    out = out.line(format!("records: {}", r.count));
    if !r.trailer.is_null() {
        out = out.line(format!("trailer: {}", r.trailer));
    }
    for p in &r.problems {
        out = out.line(format!("problem at offset {}: {}", p.offset, p.reason));
    }
    for p in &r.warnings {
        out = out.line(format!("warning at offset {}: {}", p.offset, p.reason));
    }
    render(ctx.json, out)?;
    Ok(r.problems.is_empty())
}

/// Runs `rheo verify [DIR]`: every problem on one line `file offset reason`
/// and every warning on one line `file offset warning: reason` (or under
/// `--json` one document); exit 1 when a problem was found. Warnings are
/// what the next open repairs on its own (a torn tail). A directory with no
/// data file is a failure (a wrong path).
pub fn verify(ctx: &Globals, a: VerifyArgs) -> CliResult {
    let dir = match a.dir {
        Some(d) => d,
        None => native_dir(&ctx.backend)?,
    };
    if !dir.is_dir() {
        return Err(CliError::of(ErrorKind::NotFound, format!("{}: no such directory", dir.display())));
    }
    let report = inspect::verify_dir(&dir)?;
    let entry = |p: &FileFinding| json!({"file": p.file.display().to_string(), "kind": p.kind, "offset": p.offset, "reason": p.reason});
    let mut out = Output::new(&json!({"dir": dir.display().to_string(), "files": report.files,
        "records": report.records, "ok": report.ok(),
        "problems": report.problems.iter().map(entry).collect::<Vec<_>>(),
        "warnings": report.warnings.iter().map(entry).collect::<Vec<_>>()}))?;
    for p in &report.problems {
        out = out.line(format!("{} {} {}", p.file.display(), p.offset, p.reason));
    }
    for p in &report.warnings {
        out = out.line(format!("{} {} warning: {}", p.file.display(), p.offset, p.reason));
    }
    let verdict = match (report.problems.len(), report.warnings.len()) {
        (0, 0) => "ok".to_owned(),
        (0, w) => format!("ok, {w} warning(s): the next open repairs them"),
        (p, 0) => format!("{p} problem(s)"),
        (p, w) => format!("{p} problem(s), {w} warning(s)"),
    };
    out =
        out.line(format!("checked {} files, {} records in {}: {verdict}", report.files, report.records, dir.display()));
    render(ctx.json, out)?;
    Ok(report.ok())
}

/// The directory of a `native:PATH[?options]` URL.
fn native_dir(backend: &str) -> Result<PathBuf, CliError> {
    let path = backend.strip_prefix("native:").ok_or_else(|| {
        CliError::usage(format!("verify reads a native data directory; give DIR (the backend is {backend:?})"))
    })?;
    Ok(PathBuf::from(path.split('?').next().unwrap_or(path)))
}
