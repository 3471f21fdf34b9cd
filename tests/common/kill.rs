//! Helpers shared by the SIGKILL crash tests (`crash_native_kill.rs`,
//! `crash_native_groups_kill.rs`): the test re-runs its own binary as a
//! child, reads its stdout until it says `ready`, kills and reaps it.
//! Include it next to `common/rng.rs`:
//!
//! ```text
//! #[path = "common/rng.rs"]
//! mod rng;
//! #[path = "common/kill.rs"]
//! mod kill;
//! ```

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::rng::env_u64;

/// The seed (`RHEO_KILL_SEED`, else from the clock) and the number of rounds
/// (`RHEO_KILL_ROUNDS`, else `rounds`); prints the seed.
pub fn seed_and_rounds(test_name: &str, rounds: u64) -> (u64, u64) {
    let seed = env_u64("RHEO_KILL_SEED").unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock");
        t.as_secs() ^ u64::from(t.subsec_nanos())
    });
    let rounds = env_u64("RHEO_KILL_ROUNDS").unwrap_or(rounds);
    println!("{test_name}: seed {seed} (replay the random choices with RHEO_KILL_SEED={seed})");
    (seed, rounds)
}

/// Child: writes and flushes whole lines to stdout; exits when the parent is gone.
pub fn say(text: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{text}").and_then(|()| out.flush()).is_err() {
        std::process::exit(0);
    }
}

/// Parent: the command that runs `test_name` of the test binary `exe` alone,
/// its stdout piped; the caller adds the environment that makes it the child.
pub fn child_command(exe: &Path, test_name: &str) -> Command {
    let mut command = Command::new(exe);
    command
        .args(["--exact", test_name, "--nocapture", "--test-threads=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    command
}

/// What a killed child left: the complete lines it printed (with their
/// newline), and when it was certainly dead (after it was reaped), in ms
/// since the Unix epoch, the clock its leases are stamped with.
pub struct Killed {
    pub lines: Vec<String>,
    pub dead_at_ms: i64,
}

/// The wall clock in ms since the Unix epoch.
pub fn now_ms() -> i64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock");
    i64::try_from(t.as_millis()).expect("ms")
}

/// Parent: spawns the child, waits until it says `ready` (unless `early`),
/// sleeps `delay`, kills it with SIGKILL and reaps it. How long the child
/// really ran is not assumed: checks that depend on it read `dead_at_ms`.
pub fn spawn_and_kill(command: &mut Command, early: bool, delay: Duration) -> Result<Killed, String> {
    let mut child = command.spawn().expect("spawn the child");
    let stdout = child.stdout.take().expect("stdout");
    let (ready_tx, ready_rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        let mut r = BufReader::new(stdout);
        loop {
            let mut line = String::new();
            match r.read_line(&mut line) {
                Ok(0) | Err(_) => return lines,
                // A line cut by the kill has no newline: not acknowledged.
                Ok(_) if line.ends_with('\n') => {
                    if line == "ready\n" {
                        let _ = ready_tx.send(());
                    }
                    lines.push(line);
                }
                Ok(_) => {}
            }
        }
    });
    if !early && ready_rx.recv_timeout(Duration::from_secs(30)).is_err() {
        let _ = child.kill();
        return Err(format!("the child did not get ready: {:?}", child.wait()));
    }
    std::thread::sleep(delay);
    if let Ok(Some(status)) = child.try_wait() {
        return Err(format!("the child exited by itself ({status}): {:?}", reader.join()));
    }
    child.kill().expect("SIGKILL the child");
    child.wait().expect("reap the child");
    let dead_at_ms = now_ms();
    Ok(Killed { lines: reader.join().expect("reader"), dead_at_ms })
}

/// Whether the child was killed after it said `opening` and before `ready`.
pub fn killed_while_opening(lines: &[String]) -> bool {
    let said = |what: &str| lines.iter().any(|l| l.trim_end() == what);
    said("opening") && !said("ready")
}
