//! What the machine can do, measured beside the cases: the raw fsync rate
//! of a disk, the load average, the CPU.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::stats::{Latencies, Summary};
use rheo_cli::error::CliError;

/// Bytes written before each sync: one small record.
const RECORD: usize = 256;
/// The preallocated file of the overwrite pattern (and the most either
/// pattern writes).
const FILE_BYTES: u64 = 64 << 20;

/// How a probe writes before each `fdatasync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Into a zero-filled, synced file (what the engine does with its
    /// preallocated segments).
    Overwrite,
    /// At the end of the file, which grows at every write.
    Append,
}

/// One fsync probe: 256-byte writes, each followed by `fdatasync`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FsyncProbe {
    /// The directory it wrote in.
    pub dir: PathBuf,
    /// How it wrote.
    pub pattern: Pattern,
    /// Syncs per second.
    pub per_sec: f64,
    /// Latency of one write + sync.
    pub latency: Summary,
    /// When it ran (RFC 3339).
    pub at: String,
}

/// Measures the fsync rate in `dir` for `time`; the file it writes is
/// removed afterwards.
pub fn fsync_rate(dir: &Path, pattern: Pattern, time: Duration) -> Result<FsyncProbe, CliError> {
    let path = dir.join(format!(".rheo-fsync-probe-{}.tmp", std::process::id()));
    let fail = |what: &str, e: std::io::Error| CliError::new(format!("fsync probe: {what} {}: {e}", path.display()));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .map_err(|e| fail("cannot create", e))?;
    let result = (|| -> Result<FsyncProbe, CliError> {
        if pattern == Pattern::Overwrite {
            let zeros = vec![0u8; 1 << 20];
            for i in 0..(FILE_BYTES >> 20) {
                file.write_all_at(&zeros, i << 20).map_err(|e| fail("cannot fill", e))?;
            }
        }
        file.sync_all().map_err(|e| fail("cannot sync", e))?;
        let record = [7u8; RECORD];
        let mut latencies = Latencies::new()?;
        let start = Instant::now();
        let mut offset = 0u64;
        while start.elapsed() < time && offset + (RECORD as u64) < FILE_BYTES {
            let t = Instant::now();
            file.write_all_at(&record, offset).map_err(|e| fail("cannot write", e))?;
            file.sync_data().map_err(|e| fail("cannot sync", e))?;
            latencies.record(micros(t.elapsed()));
            offset += RECORD as u64;
        }
        let secs = start.elapsed().as_secs_f64().max(1e-9);
        Ok(FsyncProbe {
            dir: dir.to_path_buf(),
            pattern,
            per_sec: latencies.len() as f64 / secs,
            latency: latencies.summary(),
            at: rheo::Timestamp::now().to_string(),
        })
    })();
    let removed = std::fs::remove_file(&path).map_err(|e| fail("cannot remove", e));
    let probe = result?;
    removed?;
    Ok(probe)
}

/// A duration in whole microseconds (saturating).
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The machine a run measured on.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Machine {
    /// The CPU model, from `/proc/cpuinfo`.
    pub cpu: String,
    /// Logical CPUs.
    pub cpus: usize,
    /// Memory, in GiB.
    pub memory_gib: f64,
    /// The kernel release.
    pub kernel: String,
    /// This `rheo-bench` build.
    pub rheo: String,
    /// When the run started (RFC 3339).
    pub started_at: String,
}

impl Machine {
    /// Reads what Linux says about this machine (fields it cannot read are
    /// `unknown`).
    pub fn read() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, v)| v.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned());
        let memory_kib = std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix("MemTotal:").and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            })
            .unwrap_or(0.0);
        Machine {
            cpu,
            cpus: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            memory_gib: (memory_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned()),
            rheo: env!("CARGO_PKG_VERSION").to_owned(),
            started_at: rheo::Timestamp::now().to_string(),
        }
    }
}

/// The 1-minute load average (0 when unreadable).
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_probe_syncs_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        for pattern in [Pattern::Overwrite, Pattern::Append] {
            let p = fsync_rate(dir.path(), pattern, Duration::from_millis(50)).unwrap();
            assert!(p.per_sec > 0.0, "{p:?}");
            assert!(p.latency.p50_us > 0);
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the probe file is removed");
    }

    #[test]
    fn a_missing_directory_is_named() {
        let e = fsync_rate(Path::new("/nonexistent/rheo"), Pattern::Append, Duration::from_millis(10)).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/rheo"), "{e}");
    }
}
