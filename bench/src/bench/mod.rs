//! `rheo-bench`: the same workloads on every backend given, side by side,
//! each case with its throughput, its latency percentiles and the raw
//! fsync rate of the disk measured in the same run.

mod engine;
mod peer;
mod probe;
mod report;
mod stats;
mod workload;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use clap::Args;
use indicatif::ProgressBar;
use rheo::{MAX_BATCH_EVENTS, MAX_LIMIT, MAX_PARTITIONS, Rheo};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use self::probe::{FsyncProbe, Machine, Pattern};
use self::stats::{Latencies, Summary};
use self::workload::{Phase, PhaseOut, RheoTarget, Target, Workload};
use rheo_cli::error::{CliError, CliResult};
use rheo_cli::output::{Output, align_right, markdown_table, progress, render};

use crate::Globals;

/// The most events one case appends.
const MAX_EVENTS: u64 = 100_000_000;
/// The most producer or consumer tasks per process.
const MAX_TASKS: usize = 4096;
/// The most processes of one case.
const MAX_PROCESSES: usize = 64;
/// The most payload bytes.
const MAX_PAYLOAD: usize = 1 << 20;
/// `--streams` at most.
const MAX_STREAMS: u32 = 1000;

/// Arguments of `rheo-bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Workloads to run (repeat it; default: all but `fsync`).
    #[arg(long = "workload", value_enum)]
    workloads: Vec<Workload>,
    /// Producer tasks per process; a list (`1,16,256`) runs one case each.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    producers: Vec<usize>,
    /// Consumer (or querier) tasks per process; a list runs one case each.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    consumers: Vec<usize>,
    /// OS processes per case, each running the producers and consumers
    /// given; a list runs one case each.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    processes: Vec<usize>,
    /// Events per append_batch call, per fetch, per query.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Events per case (prefilled for `consume` and `query`).
    #[arg(long, default_value_t = 10_000)]
    events: u64,
    /// Size of each event's JSON payload, about.
    #[arg(long, default_value_t = 200)]
    payload_bytes: usize,
    /// Partitions of each case's stream.
    #[arg(long, default_value_t = 4)]
    partitions: u32,
    /// Streams each case spreads over (`NAME-0`, `NAME-1`, ...): producer
    /// and consumer i start on stream i mod N, and a consumer whose stream
    /// is drained moves on to the next. On a Redis Cluster each stream is
    /// a slot of its own, so this is how a case spreads over the masters.
    #[arg(long, default_value_t = 1)]
    streams: u32,
    /// Gives every appended event an id of its own (`AppendOptions::id`),
    /// as a producer that retries safely does: measures the dedupe check
    /// (compare `native:DIR` with `native:DIR?dedupe_window_ms=0`).
    #[arg(long)]
    ids: bool,
    /// Gives each case's stream a retention of this many events per
    /// partition (`limits`): with a short `retention_interval_ms` in a
    /// native URL, passes drop segments while the case runs (the cost of
    /// retention beside appends).
    #[arg(long, value_name = "N")]
    retain_events: Option<u64>,
    /// Before each `consume` case, appends this many events scheduled a
    /// day ahead and has the group set them aside: the case then measures
    /// due events behind them (backends of this crate only).
    #[arg(long, value_name = "N")]
    scheduled_ahead: Option<u64>,
    /// Creates each case's group keyed (`GroupOptions::ordered_by_key`):
    /// at most one event of a key in flight, the next once it is settled.
    /// Backends without keyed groups skip the cases.
    #[arg(long)]
    keyed: bool,
    /// Handlers each managed consumer runs at once (`handle`; without
    /// `--keyed` only 1 keeps a key's order, so only 1 is taken).
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Milliseconds each handler of `handle` sleeps before its ack (0: none).
    #[arg(long, default_value_t = 1)]
    handler_ms: u64,
    /// Runs every case this many times, alternating the backends' order.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Seconds of each fsync probe.
    #[arg(long, default_value_t = 1.0)]
    fsync_seconds: f64,
    /// Where the fsync probe of a server backend writes (default: the
    /// current directory; a native or SQLite backend's own directory is
    /// probed for it).
    #[arg(long)]
    fsync_dir: Option<PathBuf>,
    /// Writes `backends.md` and SVG charts of the results to this directory.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Results of earlier runs (`--json` output, or the peers script's) to
    /// add to the report; with no `--backend`, nothing new runs.
    #[arg(long = "from")]
    from: Vec<PathBuf>,
    /// Internal: runs one process's share of a case (`rheo-bench` spawns it).
    #[arg(long, hide = true)]
    worker: Option<String>,
}

/// One measured case.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Case {
    /// What ran: a backend's scheme with its durability setting, or a peer.
    pub backend: String,
    /// Its URL, password hidden.
    pub url: String,
    /// The stream (or stream key) the case ran on.
    #[serde(default)]
    pub stream: String,
    /// A peer (not this crate), measured the same way.
    #[serde(default)]
    pub peer: bool,
    /// What measured it.
    pub tool: String,
    /// The workload.
    pub workload: Workload,
    /// OS processes.
    pub processes: usize,
    /// Producer tasks per process (0 where the workload has none).
    pub producers: usize,
    /// Consumer tasks per process (0 where the workload has none).
    pub consumers: usize,
    /// Events per call.
    pub batch: usize,
    /// Payload bytes, about.
    pub payload_bytes: usize,
    /// Partitions (streams, for a peer).
    pub partitions: u32,
    /// Streams the case spread over (`--streams`).
    #[serde(default = "one")]
    pub streams: u32,
    /// Events appended, settled or returned in the timed part.
    pub events: u64,
    /// Calls or cycles.
    pub ops: u64,
    /// Seconds of the timed part.
    pub secs: f64,
    /// `events / secs`.
    pub events_per_sec: f64,
    /// What a latency sample is.
    pub latency_of: String,
    /// Latency percentiles.
    pub latency: Summary,
    /// The raw fsync rate (overwrite pattern) of the disk under the
    /// backend, measured just before its cases; none for a volatile one.
    pub fsync_per_sec: Option<f64>,
    /// Whether the backend keeps what it acknowledged across a crash, as
    /// configured.
    pub durable: bool,
    /// The 1-minute load average when it ended.
    pub load: f64,
    /// Which round.
    pub round: usize,
    /// Round trips to the database server (statements, `BEGIN`s and
    /// `COMMIT`s) in the timed part, for the backends that count them.
    #[serde(default)]
    pub round_trips: Option<u64>,
}

/// A whole run: the machine, the probes and the cases.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Run {
    /// The machine (absent from a peer tool's results).
    #[serde(default)]
    pub machine: Machine,
    /// Every fsync probe of the run.
    pub fsync: Vec<FsyncProbe>,
    /// Every case.
    pub cases: Vec<Case>,
    /// Cases not run, and why.
    #[serde(default)]
    pub skipped: Vec<String>,
}

/// A backend opened for the bench.
struct Opened {
    /// The URL as given (passwords included: it is passed to workers).
    raw: String,
    url: String,
    label: String,
    durable: bool,
    /// Where its data is, when on this machine's disk.
    dir: Option<PathBuf>,
    /// Whether several processes can open it at once.
    shared: bool,
    kind: Kind,
}

enum Kind {
    Rheo(Rheo),
    Engine(engine::EngineStore),
    #[cfg(feature = "peers")]
    Redis(peer::RedisPeer),
}

impl Kind {
    /// Whether it is a peer: not this crate's code (its stream is one log).
    fn is_peer(&self) -> bool {
        match self {
            Kind::Rheo(_) | Kind::Engine(_) => false,
            #[cfg(feature = "peers")]
            Kind::Redis(_) => true,
        }
    }
}

impl Opened {
    async fn open(given: &str) -> Result<Self, CliError> {
        let (name, url) = name_of(given);
        if url.starts_with(peer::SCHEME) {
            #[cfg(feature = "peers")]
            {
                let p = peer::RedisPeer::open(url).await?;
                let label = if given.contains('#') { name } else { p.label() };
                return Ok(Opened {
                    raw: given.to_owned(),
                    url: rheo::redact_url(url),
                    label,
                    durable: p.durable(),
                    dir: None,
                    shared: true,
                    kind: Kind::Redis(p),
                });
            }
            #[cfg(not(feature = "peers"))]
            return Err(CliError::new(format!(
                "{url}: bare Redis Streams is measured only by a build with the `peers` feature (scripts/bench-peers)"
            )));
        }
        if url.starts_with(engine::SCHEME) {
            let e = engine::EngineStore::open(url)?;
            return Ok(Opened {
                raw: given.to_owned(),
                url: url.to_owned(),
                label: if given.contains('#') { name } else { e.label() },
                durable: true,
                dir: engine::dir_of(url),
                shared: false,
                kind: Kind::Engine(e),
            });
        }
        let rheo = Rheo::open(url).await?;
        let durable = rheo.capabilities().durable;
        Ok(Opened {
            raw: given.to_owned(),
            url: rheo::redact_url(url),
            label: name,
            durable,
            dir: local_dir(url),
            // Several processes reach the same data: not a native directory
            // (locked), `memory:` or `sqlite::memory:` (one per process).
            shared: !(url.starts_with("native:") || url.starts_with("memory:"))
                && (!url.starts_with("sqlite:") || local_dir(url).is_some()),
            kind: Kind::Rheo(rheo),
        })
    }

    fn target(&self, stream: &str, streams: u32) -> Target {
        match &self.kind {
            Kind::Rheo(r) => Target::Rheo(RheoTarget::new(r.clone(), stream, streams)),
            Kind::Engine(e) => Target::Engine(e.target(RheoTarget::stream_names(stream, streams))),
            #[cfg(feature = "peers")]
            Kind::Redis(p) => Target::Redis(p.target(stream)),
        }
    }
}

/// A URL's name in the results: the `#name` after it, else its scheme
/// (with the native engine's `durability` when set); and the URL without
/// the name.
fn name_of(url: &str) -> (String, &str) {
    if let Some((url, name)) = url.split_once('#') {
        if !name.is_empty() {
            return (name.to_owned(), url);
        }
        return (scheme_label(url), url);
    }
    (scheme_label(url), url)
}

fn scheme_label(url: &str) -> String {
    let scheme = url.split(':').next().unwrap_or(url);
    let scheme = if scheme == "postgresql" { "postgres" } else { scheme };
    if scheme == "native"
        && let Some((_, rest)) = url.split_once("durability=")
    {
        return format!("native (durability={})", rest.split('&').next().unwrap_or(rest));
    }
    scheme.to_owned()
}

/// The directory of a native or SQLite backend's data.
fn local_dir(url: &str) -> Option<PathBuf> {
    let path = url.strip_prefix("native:").or_else(|| url.strip_prefix("sqlite:"))?;
    let path = path.split('?').next().unwrap_or(path).trim_start_matches("//");
    if path.is_empty() || path.starts_with(':') {
        return None;
    }
    let p = Path::new(path);
    if url.starts_with("native:") { Some(p.to_path_buf()) } else { p.parent().map(Path::to_path_buf) }
}

/// Checks the arguments' bounds (exit 2 on any).
fn check(a: &BenchArgs) -> Result<(), CliError> {
    let bad = |m: String| Err(CliError::usage(m));
    if a.events == 0 || a.events > MAX_EVENTS {
        return bad(format!("--events must be 1 to {MAX_EVENTS}"));
    }
    if a.batch == 0 || a.batch > MAX_BATCH_EVENTS.min(MAX_LIMIT) {
        return bad(format!("--batch must be 1 to {}", MAX_BATCH_EVENTS.min(MAX_LIMIT)));
    }
    if a.partitions == 0 || a.partitions > MAX_PARTITIONS {
        return bad(format!("--partitions must be 1 to {MAX_PARTITIONS}"));
    }
    if a.streams == 0 || a.streams > MAX_STREAMS {
        return bad(format!("--streams must be 1 to {MAX_STREAMS}"));
    }
    if a.payload_bytes > MAX_PAYLOAD {
        return bad(format!("--payload-bytes must be at most {MAX_PAYLOAD}"));
    }
    for (name, list, max) in [
        ("--producers", &a.producers, MAX_TASKS),
        ("--consumers", &a.consumers, MAX_TASKS),
        ("--processes", &a.processes, MAX_PROCESSES),
    ] {
        if list.iter().any(|&n| n == 0 || n > max) {
            return bad(format!("{name} values must be 1 to {max}"));
        }
    }
    if a.concurrency == 0 || a.concurrency > MAX_LIMIT {
        return bad(format!("--concurrency must be 1 to {MAX_LIMIT}"));
    }
    if a.handler_ms > 60_000 {
        return bad("--handler-ms must be at most 60000".to_owned());
    }
    if a.workloads.contains(&Workload::Handle) && !a.keyed {
        // An unkeyed group keeps a key's order only with one handler per
        // partition, each partition owned by one consumer.
        if a.concurrency != 1 {
            return bad("handle without --keyed keeps per-key order: --concurrency must be 1".to_owned());
        }
        if a.consumers.iter().any(|&c| c > a.partitions as usize) {
            return bad(
                "handle without --keyed: each consumer owns partitions, so --consumers ≤ --partitions".to_owned()
            );
        }
    }
    if a.workloads.contains(&Workload::Handle) && a.streams > 1 {
        return bad("handle runs on one stream (--streams 1)".to_owned());
    }
    if a.rounds == 0 || a.rounds > 100 {
        return bad("--rounds must be 1 to 100".to_owned());
    }
    if !(0.05..=60.0).contains(&a.fsync_seconds) {
        return bad("--fsync-seconds must be 0.05 to 60".to_owned());
    }
    Ok(())
}

/// The cases of one backend: every workload with the producer, consumer
/// and process counts that apply to it.
fn cases(a: &BenchArgs, workloads: &[Workload]) -> Vec<(Workload, usize, usize, usize)> {
    let mut out = Vec::new();
    for &w in workloads {
        let producers: &[usize] = if w.has_producers() { &a.producers } else { &[0] };
        let consumers: &[usize] = if w.has_consumers() { &a.consumers } else { &[0] };
        for &processes in &a.processes {
            for &p in producers {
                for &c in consumers {
                    out.push((w, processes, p, c));
                }
            }
        }
    }
    out
}

/// A progress bar on stderr, drawn only on a terminal.
fn bar(len: u64, message: String) -> ProgressBar {
    progress(Some(len), "{msg} [{bar:30}] {pos}/{len} ({per_sec}, {eta} left)", message)
}

impl Run {
    /// Adds the cases, fsync probes and skips of a run saved with `--json`
    /// (`--from`); the report's machine stays this one, its start becomes
    /// the earliest run's.
    fn merge(&mut self, path: &Path) -> Result<(), CliError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| CliError::new(format!("cannot read {}: {e}", path.display())))?;
        let earlier: Run = serde_json::from_str(&text)
            .map_err(|e| CliError::new(format!("{} is not a bench result: {e}", path.display())))?;
        if !earlier.machine.started_at.is_empty() && earlier.machine.started_at < self.machine.started_at {
            self.machine.started_at = earlier.machine.started_at;
        }
        self.fsync.extend(earlier.fsync);
        self.cases.extend(earlier.cases);
        for why in earlier.skipped {
            if !self.skipped.contains(&why) {
                self.skipped.push(why);
            }
        }
        Ok(())
    }
}

/// Runs `rheo-bench`.
pub async fn run(ctx: &Globals, a: BenchArgs) -> CliResult {
    if let Some(spec) = &a.worker {
        return worker(spec).await;
    }
    check(&a)?;
    let mut workloads = if a.workloads.is_empty() { Workload::CASES.to_vec() } else { a.workloads.clone() };
    let mut seen = Vec::new();
    workloads.retain(|w| {
        let first = !seen.contains(w);
        seen.push(*w);
        first
    });
    let mut results = Run { machine: Machine::read(), fsync: Vec::new(), cases: Vec::new(), skipped: Vec::new() };
    for path in &a.from {
        results.merge(path)?;
    }
    // No backend given: a fresh native directory here (a real disk, unlike
    // a tmpfs /tmp), removed afterwards.
    let scratch;
    let backends: Vec<String> = if !ctx.backends.is_empty() {
        ctx.backends.clone()
    } else if a.from.is_empty() {
        scratch = tempfile::Builder::new()
            .prefix("rheo-bench-")
            .tempdir_in(".")
            .map_err(|e| CliError::new(format!("cannot make a bench directory here: {e}")))?;
        vec![format!("native:{}", scratch.path().display())]
    } else {
        Vec::new()
    };
    let fsync_dir = match &a.fsync_dir {
        Some(d) => d.clone(),
        None => PathBuf::from("."),
    };
    let fsync_time = Duration::from_secs_f64(a.fsync_seconds);
    if workloads.contains(&Workload::Fsync) {
        for pattern in [Pattern::Overwrite, Pattern::Append] {
            let p = probe::fsync_rate(&fsync_dir, pattern, fsync_time)?;
            eprintln!("fsync probe in {}: {:.0} fdatasync/s ({:?})", p.dir.display(), p.per_sec, p.pattern);
            results.fsync.push(p);
        }
        workloads.retain(|w| *w != Workload::Fsync);
    }
    let new_cases = if workloads.is_empty() { Vec::new() } else { cases(&a, &workloads) };
    for round in 0..if new_cases.is_empty() { 0 } else { a.rounds } {
        let mut order: Vec<&String> = backends.iter().collect();
        order.rotate_left(round % backends.len().max(1));
        for url in order {
            let opened = Opened::open(url).await?;
            let fsync_per_sec = if opened.durable {
                let dir = opened.dir.clone().unwrap_or_else(|| fsync_dir.clone());
                let p = probe::fsync_rate(&dir, Pattern::Overwrite, fsync_time)?;
                let rate = p.per_sec;
                results.fsync.push(p);
                Some(rate)
            } else {
                None
            };
            for &(w, processes, producers, consumers) in &new_cases {
                let stream = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
                let target = opened.target(&stream, a.streams);
                let skip = if !target.supports(w) {
                    Some(format!("{} on {}: not supported", w.name(), opened.label))
                } else if a.keyed && !target.keyed_groups() {
                    Some(format!("{} on {}: no keyed groups (--keyed)", w.name(), opened.label))
                } else if processes > 1 && !opened.shared {
                    Some(format!(
                        "{} on {} with {processes} processes: one process owns its data",
                        w.name(),
                        opened.label
                    ))
                } else {
                    None
                };
                if let Some(why) = skip {
                    if !results.skipped.contains(&why) {
                        results.skipped.push(why);
                    }
                    continue;
                }
                let case =
                    run_case(&a, &opened, &target, &stream, (w, processes, producers, consumers)).await.map_err(|e| {
                        CliError::new(format!(
                            "{} on {} ({processes} processes, {producers} producers, {consumers} consumers, stream {stream}): {e}",
                            w.name(),
                            opened.label
                        ))
                    })?;
                let case = Case { fsync_per_sec, round, ..case };
                eprintln!(
                    "{:<24} {:<12} proc {:>2} prod {:>4} cons {:>2}: {:>10.0} events/s  p50 {}  p99 {}",
                    case.backend,
                    w.name(),
                    processes,
                    case.producers,
                    case.consumers,
                    case.events_per_sec,
                    ms(case.latency.p50_us),
                    ms(case.latency.p99_us)
                );
                results.cases.push(case);
            }
        }
    }
    if let Some(dir) = &a.report {
        let written = report::write(dir, &results)?;
        for path in written {
            eprintln!("wrote {}", path.display());
        }
    }
    let mut out = Output::new(&results)?.table(table(&results.cases), "");
    for s in &results.skipped {
        out = out.line(format!("skipped: {s}"));
    }
    render(ctx.json, out)?;
    Ok(true)
}

/// Round trips per event, for a table cell (`-` where not counted).
pub fn trips_per_event(c: &Case) -> String {
    match c.round_trips {
        Some(n) if c.events > 0 => format!("{:.3}", n as f64 / c.events as f64),
        _ => "-".to_owned(),
    }
}

/// Counts the backends' round trips ([`rheo::observe::ROUND_TRIPS`])
/// through a metrics recorder of this process (only that counter; every
/// other metric goes nowhere).
mod trips {
    use std::sync::Arc;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

    static TRIPS: OnceLock<Arc<AtomicU64>> = OnceLock::new();

    struct Counting(Arc<AtomicU64>);

    impl Recorder for Counting {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            if key.name() == rheo::observe::ROUND_TRIPS { Counter::from_arc(self.0.clone()) } else { Counter::noop() }
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    /// Installs the recorder once (when no other is installed); the count now.
    pub fn start() -> u64 {
        let trips = TRIPS.get_or_init(|| {
            let n = Arc::new(AtomicU64::new(0));
            // Another recorder already installed: nothing is counted (`-`).
            let _ = metrics::set_global_recorder(Counting(n.clone()));
            n
        });
        trips.load(Ordering::Relaxed)
    }

    /// Round trips since `start` returned `from`.
    pub fn since(from: u64) -> u64 {
        TRIPS.get().map_or(0, |t| t.load(Ordering::Relaxed).saturating_sub(from))
    }
}

/// Milliseconds, for a table cell.
pub fn ms(us: u64) -> String {
    let ms = us as f64 / 1000.0;
    if ms >= 100.0 { format!("{ms:.0} ms") } else { format!("{ms:.2} ms") }
}

/// The cases as a table, one row per case (rounds merged by their median).
pub fn table(cases: &[Case]) -> comfy_table::Table {
    let mut t = markdown_table(&[
        "backend",
        "workload",
        "proc",
        "prod",
        "cons",
        "batch",
        "events",
        "events/s",
        "p50",
        "p99",
        "max",
        "fsync/s",
        "trips/event",
    ]);
    let mut rows = report::medians(cases);
    // By workload, then the counts; backends in the order they ran.
    rows.sort_by_key(|c| (c.workload, c.processes, c.producers, c.consumers));
    for c in rows {
        t.add_row([
            if c.streams > 1 { format!("{} ({} streams)", c.backend, c.streams) } else { c.backend.clone() },
            c.workload.name().to_owned(),
            c.processes.to_string(),
            c.producers.to_string(),
            c.consumers.to_string(),
            c.batch.to_string(),
            c.events.to_string(),
            format!("{:.0}", c.events_per_sec),
            ms(c.latency.p50_us),
            ms(c.latency.p99_us),
            ms(c.latency.max_us),
            c.fsync_per_sec.map_or_else(|| "-".to_owned(), |f| format!("{f:.0}")),
            trips_per_event(&c),
        ]);
    }
    align_right(&mut t, 2..13);
    t
}

/// Runs one case: sets its stream up, prefills it, runs its timed part in
/// this process or in `processes` workers.
async fn run_case(
    a: &BenchArgs,
    opened: &Opened,
    target: &Target,
    stream: &str,
    (w, processes, producers, consumers): (Workload, usize, usize, usize),
) -> Result<Case, CliError> {
    let retention = a.retain_events.map_or_else(rheo::Retention::new, |n| rheo::Retention::new().max_events(n));
    target.setup(a.partitions, retention, a.keyed).await?;
    let backend = case_label(a, &opened.label, w);
    let label = format!("{backend} {}", w.name());
    if let Some(n) = a.scheduled_ahead.filter(|&n| n > 0) {
        if w != Workload::Consume {
            return Err(CliError::new(format!("--scheduled-ahead applies to consume cases, not {}", w.name())));
        }
        let bar = bar(n, format!("{label}: {n} scheduled ahead"));
        workload::schedule_ahead(target, n, a.payload_bytes, &bar).await?;
        bar.finish_and_clear();
    }
    if w.prefilled() {
        let bar = bar(a.events, format!("{label}: prefill"));
        workload::prefill(target, a.events, a.payload_bytes, &bar).await?;
        bar.finish_and_clear();
    }
    let total = if w == Workload::Query { (a.events / a.batch as u64).max(1) } else { a.events };
    let bar = bar(total, label);
    let per_process = |i: usize| Phase {
        workload: w,
        producers,
        consumers,
        batch: a.batch,
        events: if w.has_producers() || w == Workload::Query {
            a.events / processes as u64 + u64::from((i as u64) < a.events % processes as u64)
        } else {
            0
        },
        total_events: a.events,
        processes,
        payload_bytes: a.payload_bytes,
        ids: a.ids,
        concurrency: a.concurrency,
        handler_ms: a.handler_ms,
        keyed: a.keyed,
        partitions: a.partitions,
        first: 1
            + (0..i)
                .map(|j| a.events / processes as u64 + u64::from((j as u64) < a.events % processes as u64))
                .sum::<u64>(),
    };
    let (out, secs, round_trips) = if processes == 1 {
        let phase = per_process(0);
        let t0 = trips::start();
        let started = Instant::now();
        let out = workload::run(target, &phase, &bar).await?;
        (out, started.elapsed().as_secs_f64(), trips::since(t0))
    } else {
        spawn_workers(&opened.raw, (stream, a.streams), (0..processes).map(per_process).collect(), &bar).await?
    };
    bar.finish_and_clear();
    let secs = secs.max(1e-9);
    Ok(Case {
        backend,
        url: opened.url.clone(),
        stream: stream.to_owned(),
        peer: opened.kind.is_peer(),
        tool: "rheo-bench".to_owned(),
        workload: w,
        processes,
        producers: if w.has_producers() { producers } else { 0 },
        consumers: if w.has_consumers() { consumers } else { 0 },
        batch: if w == Workload::Append { 1 } else { a.batch },
        payload_bytes: a.payload_bytes,
        // A peer's stream is one log.
        partitions: if opened.kind.is_peer() { 1 } else { a.partitions },
        streams: if opened.kind.is_peer() { 1 } else { a.streams },
        events: out.events,
        ops: out.ops,
        secs,
        events_per_sec: out.events as f64 / secs,
        latency_of: w.latency_of().to_owned(),
        latency: out.latencies.summary(),
        fsync_per_sec: None,
        durable: opened.durable,
        load: probe::load_average(),
        round: 0,
        round_trips: (round_trips > 0).then_some(round_trips),
    })
}

/// A case's backend column: the backend's label, then `keyed` for a keyed
/// group and the handlers of a `handle` case.
fn case_label(a: &BenchArgs, backend: &str, w: Workload) -> String {
    let mut label = backend.to_owned();
    if a.keyed {
        label.push_str(", keyed");
    }
    if w == Workload::Handle {
        let s = if a.concurrency == 1 { "" } else { "s" };
        label.push_str(&format!(", {} handler{s} of {} ms per consumer", a.concurrency, a.handler_ms));
    }
    label
}

/// What a worker process is told to run.
#[derive(Debug, Serialize, Deserialize)]
struct WorkerSpec {
    stream: String,
    #[serde(default = "one")]
    streams: u32,
    phase: Phase,
}

fn one() -> u32 {
    1
}

/// What a worker process reports.
#[derive(Debug, Serialize, Deserialize)]
struct WorkerOut {
    events: u64,
    ops: u64,
    latencies: Vec<(u64, u64)>,
    #[serde(default)]
    round_trips: u64,
}

/// The environment variable that hands a worker its backend URL (not its
/// command line, which `ps` shows with any password in it).
const WORKER_BACKEND: &str = "RHEO_BENCH_WORKER_BACKEND";

/// Runs a case's timed part in one worker process per phase: each opens
/// the backend and says `ready`; the clock starts when all are, with a
/// `go` line to each, and stops when the last has reported (before the
/// processes exit). A worker that fails fails the case at once.
async fn spawn_workers(
    url: &str,
    (stream, streams): (&str, u32),
    phases: Vec<Phase>,
    bar: &ProgressBar,
) -> Result<(PhaseOut, f64, u64), CliError> {
    let exe =
        std::env::current_exe().map_err(|e| CliError::new(format!("cannot find the rheo-bench executable: {e}")))?;
    let mut children = Vec::new();
    for (i, phase) in phases.into_iter().enumerate() {
        let spec = serde_json::to_string(&WorkerSpec { stream: stream.to_owned(), streams, phase })
            .map_err(|e| CliError::new(format!("encoding worker {i}'s spec: {e}")))?;
        let mut child = tokio::process::Command::new(&exe)
            .env(WORKER_BACKEND, url)
            .args(["--worker", &spec])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| CliError::new(format!("cannot start worker process {i}: {e}")))?;
        let stdout = child.stdout.take().ok_or_else(|| CliError::new(format!("worker {i} has no stdout")))?;
        let stdin = child.stdin.take().ok_or_else(|| CliError::new(format!("worker {i} has no stdin")))?;
        children.push((child, stdin, BufReader::new(stdout).lines()));
    }
    for (i, (_, _, lines)) in children.iter_mut().enumerate() {
        match lines.next_line().await {
            Ok(Some(l)) if l == "ready" => {}
            Ok(Some(l)) => return Err(CliError::new(format!("worker process {i} said {l:?} instead of `ready`"))),
            Ok(None) => {
                return Err(CliError::new(format!(
                    "worker process {i} exited before it was ready (its error is above)"
                )));
            }
            Err(e) => return Err(CliError::new(format!("reading worker process {i}: {e}"))),
        }
    }
    let started = Instant::now();
    for (i, (_, stdin, _)) in children.iter_mut().enumerate() {
        let go = async {
            stdin.write_all(b"go\n").await?;
            stdin.flush().await
        };
        go.await.map_err(|e| CliError::new(format!("cannot start worker process {i}: {e}")))?;
    }
    // Every report is read at once: the first to fail ends the case.
    let mut reports = tokio::task::JoinSet::new();
    let mut processes = Vec::new();
    for (i, (child, stdin, mut lines)) in children.into_iter().enumerate() {
        processes.push((child, stdin));
        reports.spawn(async move { (i, lines.next_line().await) });
    }
    let mut out = PhaseOut { events: 0, ops: 0, latencies: Latencies::new()? };
    let mut trips = 0;
    while let Some(joined) = reports.join_next().await {
        let (i, line) = joined.map_err(|e| CliError::new(format!("reading a worker process: {e}")))?;
        let line = match line {
            Ok(Some(line)) => line,
            Ok(None) => return Err(CliError::new(format!("worker process {i} failed (its error is above)"))),
            Err(e) => return Err(CliError::new(format!("reading worker process {i}: {e}"))),
        };
        let w: WorkerOut = serde_json::from_str(&line)
            .map_err(|e| CliError::new(format!("worker process {i}'s report {line:?}: {e}")))?;
        out.events += w.events;
        out.ops += w.ops;
        trips += w.round_trips;
        out.latencies.merge(&Latencies::from_buckets(&w.latencies)?);
        bar.inc(w.events);
    }
    let secs = started.elapsed().as_secs_f64();
    for (i, (mut child, _)) in processes.into_iter().enumerate() {
        let status = child.wait().await.map_err(|e| CliError::new(format!("waiting for worker process {i}: {e}")))?;
        if !status.success() {
            return Err(CliError::new(format!("worker process {i} exited with {status} after its report")));
        }
    }
    Ok((out, secs, trips))
}

/// The worker side of [`spawn_workers`].
async fn worker(spec: &str) -> CliResult {
    let spec: WorkerSpec =
        serde_json::from_str(spec).map_err(|e| CliError::usage(format!("--worker is not a worker spec: {e}")))?;
    let url = std::env::var(WORKER_BACKEND)
        .map_err(|_| CliError::usage(format!("a worker takes its backend from {WORKER_BACKEND}")))?;
    let opened = Opened::open(&url).await?;
    let target = opened.target(&spec.stream, spec.streams);
    println!("ready");
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    match stdin.next_line().await {
        Ok(Some(l)) if l == "go" => {}
        other => return Err(CliError::new(format!("worker: expected `go`, got {other:?}"))),
    }
    let trips = trips::start();
    let out = workload::run(&target, &spec.phase, &ProgressBar::hidden()).await?;
    let report = WorkerOut {
        events: out.events,
        ops: out.ops,
        latencies: out.latencies.buckets(),
        round_trips: trips::since(trips),
    };
    let line = serde_json::to_string(&report).map_err(|e| CliError::new(format!("encoding a report: {e}")))?;
    println!("{line}");
    Ok(true)
}
