//! Helpers shared by the in-process crash tests (`crash_native_log.rs`,
//! `crash_native_groups.rs`): choosing the seeds, running them with a trace,
//! a probe over a `FaultyVfs`, and the OS writing back part of a `MemVfs`
//! before the power cut. Include it next to `common/rng.rs`:
//!
//! ```text
//! #[path = "common/rng.rs"]
//! mod rng;
//! #[path = "common/crash.rs"]
//! mod crash;
//! ```

#![allow(dead_code)]

use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use rheo::engine::vfs::{Fault, FaultyVfs, MemVfs, Vfs, VfsFile, VfsLock};

use crate::rng::{Rng, env_u64};

// ------------------------------------------------------------------ driver

/// The seeds of one fault kind (`seed % 4 == kind`): `RHEO_CRASH_SEED` alone
/// when set (`None` when it is of another kind), else
/// `RHEO_CRASH_SCENARIOS` (default `scenarios`) seeds from
/// `RHEO_CRASH_FIRST_SEED` (default 0).
pub fn seeds_of_kind(kind: u64, scenarios: u64) -> Option<Vec<u64>> {
    match env_u64("RHEO_CRASH_SEED") {
        Some(seed) if seed % 4 == kind => Some(vec![seed]),
        Some(_) => None,
        None => {
            let first = env_u64("RHEO_CRASH_FIRST_SEED").unwrap_or(0);
            let n = env_u64("RHEO_CRASH_SCENARIOS").unwrap_or(scenarios);
            Some((0..n).map(|i| first + i * 4 + kind).collect())
        }
    }
}

/// Runs `scenario` for each seed with a fresh trace (printed as it goes when
/// there is one seed; else the trace of the first failure goes to stderr).
/// Returns the failures, one line each.
pub fn run_each(seeds: &[u64], mut scenario: impl FnMut(u64, &mut Trace) -> Result<(), String>) -> Vec<String> {
    let verbose = seeds.len() == 1;
    let mut failures = Vec::new();
    for &seed in seeds {
        let mut trace = Trace { lines: Vec::new(), print: verbose };
        if let Err(msg) = scenario(seed, &mut trace) {
            if failures.is_empty() && !verbose {
                eprintln!("trace of seed {seed}:");
                for line in &trace.lines {
                    eprintln!("  {line}");
                }
            }
            failures.push(format!("seed {seed}: {msg}"));
        }
    }
    failures
}

/// Fails the test when any of the `scenarios` failed, listing them and how
/// to replay one (`replay`: the command, with `<seed>`).
#[track_caller]
pub fn assert_none_failed(failures: &[String], scenarios: usize, replay: &str) {
    assert!(
        failures.is_empty(),
        "{} of {} scenarios failed:\n{}\nreplay one: {replay}",
        failures.len(),
        scenarios,
        failures.join("\n")
    );
}

/// The steps of a scenario, printed when replaying one seed or on failure.
pub struct Trace {
    pub lines: Vec<String>,
    pub print: bool,
}

impl Trace {
    pub fn log(&mut self, line: String) {
        if self.print {
            println!("{line}");
        }
        self.lines.push(line);
    }
}

/// Where in a scenario's run a fault is armed, and how the crash looks.
pub struct Arming {
    pub fault: Fault,
    pub after: u64,
    pub write_back: bool,
    /// A second crash (kind, op count) armed on reopening.
    pub second: Option<(Fault, u64)>,
}

impl Arming {
    /// Arms `fault` at a random one of the `total_ops` operations of the run
    /// without a fault (or just past them), and picks the rest.
    pub fn new(fault: Fault, total_ops: u64, rng: &mut Rng) -> Self {
        Arming {
            fault,
            after: rng.range(1, total_ops + 2),
            write_back: rng.chance(1, 2),
            second: rng.chance(1, 3).then(|| (rng.pick(&[Fault::Crash, Fault::TornWrite]), rng.range(1, 60))),
        }
    }
}

// ------------------------------------------------------------------ probe

/// A mutating operation seen by the probe: (op number after it, what, path, bytes).
pub type OpRecord = (u64, &'static str, String, usize);

#[derive(Debug, Default)]
struct Observed {
    /// Syncs that failed while the process was alive (FsyncFails, or DiskFull
    /// landing on a sync).
    failed_syncs: u64,
    /// Operations that failed with `StorageFull`.
    storage_full: u64,
    /// Every mutating operation, when recording.
    ops: Option<Vec<OpRecord>>,
}

/// Passes everything through to a `FaultyVfs` and notes what failed, so the
/// test knows when a non-fatal fault fired.
#[derive(Debug, Clone)]
pub struct Probe {
    pub faulty: FaultyVfs,
    seen: Arc<Mutex<Observed>>,
}

impl Probe {
    /// A probe over `faulty`; with `record`, it keeps every mutating operation.
    pub fn new(faulty: FaultyVfs, record: bool) -> Self {
        let seen = Observed { ops: record.then(Vec::new), ..Observed::default() };
        Probe { faulty, seen: Arc::new(Mutex::new(seen)) }
    }

    pub fn failed_syncs(&self) -> u64 {
        self.seen.lock().expect("probe").failed_syncs
    }

    pub fn storage_full(&self) -> u64 {
        self.seen.lock().expect("probe").storage_full
    }

    pub fn ops(&self) -> Vec<OpRecord> {
        self.seen.lock().expect("probe").ops.clone().unwrap_or_default()
    }

    fn observe<T>(
        &self,
        what: &'static str,
        path: &str,
        bytes: usize,
        f: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<T> {
        let before = self.faulty.op_count();
        let r = f();
        let after = self.faulty.op_count();
        let mut seen = self.seen.lock().expect("probe");
        if let Err(e) = &r {
            if e.kind() == io::ErrorKind::StorageFull {
                seen.storage_full += 1;
            }
            if what.starts_with("sync") && !self.faulty.crashed() {
                seen.failed_syncs += 1;
            }
        }
        if after > before
            && let Some(ops) = seen.ops.as_mut()
        {
            ops.push((after, what, path.to_owned(), bytes));
        }
        r
    }
}

#[derive(Debug)]
struct ProbeFile {
    inner: Arc<dyn VfsFile>,
    path: String,
    probe: Probe,
}

impl VfsFile for ProbeFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.probe.observe("write", &self.path, buf.len(), || self.inner.write_all_at(buf, offset))
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.probe.observe("set_len", &self.path, 0, || self.inner.set_len(len))
    }
    fn sync_data(&self) -> io::Result<()> {
        self.probe.observe("sync_data", &self.path, 0, || self.inner.sync_data())
    }
}

impl Vfs for Probe {
    fn open(&self, path: &str, create: bool) -> io::Result<Arc<dyn VfsFile>> {
        let inner = self.observe("create", path, 0, || self.faulty.open(path, create))?;
        Ok(Arc::new(ProbeFile { inner, path: path.to_owned(), probe: self.clone() }))
    }
    fn exists(&self, path: &str) -> io::Result<bool> {
        self.faulty.exists(path)
    }
    fn create_dir_all(&self, path: &str) -> io::Result<()> {
        self.observe("mkdir", path, 0, || self.faulty.create_dir_all(path))
    }
    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        self.faulty.list(dir)
    }
    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.observe("rename", to, 0, || self.faulty.rename(from, to))
    }
    fn remove_file(&self, path: &str) -> io::Result<()> {
        self.observe("remove", path, 0, || self.faulty.remove_file(path))
    }
    fn remove_dir_all(&self, path: &str) -> io::Result<()> {
        self.observe("remove", path, 0, || self.faulty.remove_dir_all(path))
    }
    fn sync_dir(&self, dir: &str) -> io::Result<()> {
        self.observe("sync_dir", dir, 0, || self.faulty.sync_dir(dir))
    }
    fn lock(&self, path: &str) -> io::Result<Box<dyn VfsLock>> {
        self.faulty.lock(path)
    }
    fn describe(&self, path: &str) -> PathBuf {
        self.faulty.describe(path)
    }
}

// ------------------------------------------------------------------ power cut

/// Simulates the OS writing back dirty pages before the power cut: persists
/// the live content of half the files and the live entries of one directory
/// in `dir_one_in`.
pub fn write_back_some(mem: &MemVfs, rng: &mut Rng, trace: &mut Trace, dir_one_in: u64) {
    let (mut files, mut dirs) = (Vec::new(), Vec::new());
    walk(mem, "", &mut files, &mut dirs);
    let mut done = Vec::new();
    for f in files {
        if rng.chance(1, 2) {
            mem.open(&f, false).and_then(|h| h.sync_data()).expect("write back a file");
            done.push(f);
        }
    }
    for d in dirs {
        if rng.chance(1, dir_one_in) {
            mem.sync_dir(&d).expect("write back a directory");
            done.push(format!("{d}/"));
        }
    }
    trace.log(format!("write back before the power cut: {done:?}"));
}

/// Every file and every directory (`""` is the root) of a `MemVfs`.
pub fn walk(mem: &MemVfs, dir: &str, files: &mut Vec<String>, dirs: &mut Vec<String>) {
    dirs.push(dir.to_owned());
    for name in mem.list(dir).unwrap_or_default() {
        let path = if dir.is_empty() { name } else { format!("{dir}/{name}") };
        if mem.open(&path, false).is_ok() {
            files.push(path);
        } else {
            walk(mem, &path, files, dirs);
        }
    }
}
