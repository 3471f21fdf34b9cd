//! Measures the raw fsync rate of the disk under a directory, the ceiling of
//! any durable append: `cargo run --release --example fsync_probe -- DIR [SECONDS]`.
//!
//! Two patterns, each for the given time (default 3 s):
//! - overwrite: 256-byte writes into a zero-filled, synced file, each followed
//!   by `fdatasync` (what the engine does with preallocated segments);
//! - append: 256-byte writes that extend the file, each followed by
//!   `fdatasync` (the file size changes every time).

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| std::env::temp_dir().display().to_string());
    let seconds: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(3);
    let path = std::path::Path::new(&dir).join("rheo-fsync-probe.tmp");
    let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path)?;
    let record = [7u8; 256];
    let run = |name: &str, extend: bool| -> std::io::Result<()> {
        let zero_fill = 64u64 << 20;
        file.set_len(0)?;
        if !extend {
            let zeros = vec![0u8; 1 << 20];
            for i in 0..(zero_fill >> 20) {
                file.write_all_at(&zeros, i << 20)?;
            }
        }
        file.sync_all()?;
        let mut latencies = Vec::new();
        let start = Instant::now();
        let mut offset = 0u64;
        while start.elapsed() < Duration::from_secs(seconds) && offset + 256 < zero_fill {
            let t = Instant::now();
            file.write_all_at(&record, offset)?;
            file.sync_data()?;
            latencies.push(t.elapsed());
            offset += 256;
        }
        let elapsed = start.elapsed().as_secs_f64();
        latencies.sort();
        let pct = |per_mille: usize| latencies[(latencies.len() - 1) * per_mille / 1000];
        println!(
            "{name:>9}: {:>8.0} fdatasync/s  (p50 {:?}, p99 {:?}, {} syncs in {elapsed:.1} s)",
            latencies.len() as f64 / elapsed,
            pct(500),
            pct(990),
            latencies.len()
        );
        Ok(())
    };
    println!("fsync probe in {dir}");
    run("overwrite", false)?;
    run("append", true)?;
    std::fs::remove_file(&path)?;
    Ok(())
}
