//! Crash tests of the native engine, in process (STYLE.md item 7, after redb's
//! `tests/crash_consistency.rs`).
//!
//! A scenario is one seed. The seed plans a workload (one or two streams of
//! 1–3 partitions; single appends and batches, some spanning partitions,
//! some keyed; `Durability::Sync`; 4 KiB segments so that they roll often),
//! runs it once without a fault to count the file-system operations, then
//! runs it again on a `FaultyVfs` over a `MemVfs` with one fault armed at a
//! random operation. The fault kind is `seed % 4` (crash, torn write, disk
//! full, failed fsync); each kind has its own test. Afterwards the machine
//! "loses power": in half the scenarios some unsynced files and directories
//! are first written back (the OS may flush dirty pages at any time; this is
//! what makes torn and unacknowledged writes reach the durable image), then
//! `restart()` drops everything else. A third of the scenarios crash a second
//! time, during recovery or just after it. The data directory is then
//! reopened and checked against the model of what was acknowledged:
//!
//! - (a) every append whose ticket resolved Ok is there, intact (id, key,
//!   type, metadata, payload, timestamp) at the partition and sequence it
//!   was given;
//! - (b) an append that failed is entirely present or entirely absent, across
//!   all its partitions, and nothing is present that was never appended;
//! - (c) each partition holds sequences 1..=n, and its high watermark is n;
//! - (d) appending works and continues at n+1, and stays after another
//!   crash (whose recovery must then find nothing to truncate: the first
//!   recovery's cut was durable);
//! - (e) reopening succeeds (a torn tail is truncated and reported).
//!
//! While the process runs: after a sync fails during the appends, every
//! later append is refused with `Error::Poisoned` (until reopen); after a
//! crash every append fails. (A sync failing while a stream is created has
//! its own test, `a_failed_sync_while_creating_a_stream_poisons_the_engine`.)
//!
//! Focused tests, each at an operation found by a dry run that records every
//! file-system operation: a torn record written back before the power cut
//! (cut durably, never resurrected by later crashes); an uncommitted batch
//! whose transaction id is reused after recovery; a segment whose creation
//! was cut short by a roll; a batch rolled back after a full disk; a failed
//! sync while creating a stream.
//!
//! Replay one seed (prints its trace):
//!
//! ```text
//! RHEO_CRASH_SEED=123 cargo test --test crash_native_log -- --nocapture
//! ```
//!
//! Soak: `RHEO_CRASH_SCENARIOS=20000` (per fault kind) and
//! `RHEO_CRASH_FIRST_SEED=1000000` run other seeds.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use rheo::engine::log::stream::Routed;
use rheo::engine::segment::format::{FLAG_END, FLAG_MULTI};
use rheo::engine::vfs::{Fault, FaultyVfs, MemVfs, Vfs};
use rheo::engine::{Durability, Engine, EngineOptions};
use rheo::{AppendOptions, Error, NewEvent, partition_for_key};
use serde_json::json;

#[path = "common/rng.rs"]
mod rng;
use rng::Rng;

#[path = "common/crash.rs"]
mod crash;
use crash::{Arming, OpRecord, Probe, Trace, assert_none_failed, run_each, seeds_of_kind, walk, write_back_some};

/// Scenarios per fault kind (four kinds: 4 × 750 = 3,000 scenarios, about
/// 12 s in a debug build on 2 cores).
const SCENARIOS_PER_KIND: u64 = 750;
const KINDS: [Fault; 4] = [Fault::Crash, Fault::TornWrite, Fault::DiskFull, Fault::FsyncFails];

#[test]
fn crash_at_a_random_operation_keeps_every_acknowledged_append() {
    run_kind(0);
}

#[test]
fn torn_write_at_a_random_operation_keeps_every_acknowledged_append() {
    run_kind(1);
}

#[test]
fn disk_full_at_a_random_operation_fails_appends_cleanly() {
    run_kind(2);
}

#[test]
fn failed_fsync_at_a_random_operation_poisons_until_reopen() {
    run_kind(3);
}

// ------------------------------------------------------------------ driver

/// Runs every scenario of one fault kind (`seed % 4 == kind`), or only
/// `RHEO_CRASH_SEED` when set.
fn run_kind(kind: u64) {
    let Some(seeds) = seeds_of_kind(kind, SCENARIOS_PER_KIND) else { return };
    let mut total = Stats::default();
    let failures = run_each(&seeds, |seed, trace| run_scenario(seed, trace).map(|stats| total.add(&stats)));
    let fault = KINDS[usize::try_from(kind).expect("kind")];
    println!("{fault:?}: {} scenarios, {total:?}", seeds.len());
    assert_none_failed(
        &failures,
        seeds.len(),
        "RHEO_CRASH_SEED=<seed> cargo test --test crash_native_log -- --nocapture",
    );
    if seeds.len() >= 100 {
        // Guard against a workload that stops exercising what it should.
        assert!(total.fired * 10 >= total.scenarios * 7, "{fault:?}: the fault fired too rarely: {total:?}");
        assert!(total.acked > 0 && total.failed > 0, "{fault:?}: {total:?}");
        if matches!(fault, Fault::Crash | Fault::TornWrite) {
            assert!(total.truncated > 0, "{fault:?}: no recovery ever truncated a tail: {total:?}");
        }
    }
}

/// What the scenarios exercised (printed; checked for coverage).
#[derive(Debug, Default)]
struct Stats {
    scenarios: u64,
    fired: u64,
    acked: u64,
    failed: u64,
    failed_then_present: u64,
    truncated: u64,
    second_crash: u64,
    rolled_segments: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.scenarios += o.scenarios;
        self.fired += o.fired;
        self.acked += o.acked;
        self.failed += o.failed;
        self.failed_then_present += o.failed_then_present;
        self.truncated += o.truncated;
        self.second_crash += o.second_crash;
        self.rolled_segments += o.rolled_segments;
    }
}

// ------------------------------------------------------------------ plan

/// One event of a planned append, with its partition and timestamp.
#[derive(Debug, Clone)]
struct Planned {
    event: NewEvent,
    partition: u32,
    ts: i64,
}

#[derive(Debug, Clone)]
struct PlannedAppend {
    stream: usize,
    events: Vec<Planned>,
}

#[derive(Debug, Clone)]
struct Plan {
    opts: EngineOptions,
    streams: Vec<(String, u32)>,
    appends: Vec<PlannedAppend>,
    /// Appended after the first recovery, in scenarios that crash twice.
    later: Vec<PlannedAppend>,
}

fn plan(seed: u64) -> Plan {
    let mut rng = Rng::new(seed, 1);
    let opts = EngineOptions::default()
        .durability(Durability::Sync)
        .segment_bytes(rng.pick(&[4096, 4096, 8192]))
        .preallocate_bytes(rng.pick(&[1024, 1024, 0]))
        .background_indexing(false);
    let streams: Vec<(String, u32)> =
        (0..rng.range(1, 2)).map(|i| (format!("s{i}"), u32::try_from(rng.range(1, 3)).expect("count"))).collect();
    let mut n = 0;
    let mut appends = |count: u64, rng: &mut Rng| -> Vec<PlannedAppend> {
        (0..count).map(|_| plan_append(seed, &streams, &mut n, rng)).collect()
    };
    let first = rng.range(8, 40);
    let a = appends(first, &mut rng);
    let later = appends(rng.range(2, 10), &mut rng);
    Plan { opts, streams, appends: a, later }
}

fn plan_append(seed: u64, streams: &[(String, u32)], n: &mut u64, rng: &mut Rng) -> PlannedAppend {
    let stream = usize::try_from(rng.range(0, streams.len() as u64 - 1)).expect("stream");
    let count = streams[stream].1;
    let size = if rng.chance(1, 2) { 1 } else { rng.range(2, 5) };
    let batch = *n;
    let events = (0..size)
        .map(|i| {
            *n += 1;
            let pad = if rng.chance(1, 10) { rng.range(800, 1600) } else { rng.range(0, 300) };
            let payload =
                json!({"type": "t", "batch": batch, "i": i, "pad": "x".repeat(usize::try_from(pad).expect("pad"))});
            let mut opts = AppendOptions::new().id(format!("e{seed}-{}", *n));
            if rng.chance(1, 4) {
                opts = opts.metadata("m", *n);
            }
            let partition = if rng.chance(1, 2) {
                let key = format!("k{}", rng.range(0, 7));
                let p = partition_for_key(&key, count);
                opts = opts.key(key);
                p
            } else {
                let p = u32::try_from(rng.range(0, u64::from(count) - 1)).expect("partition");
                opts = opts.partition(p);
                p
            };
            let ts = 1_700_000_000_000 + i64::try_from(*n).expect("ts");
            Planned { event: NewEvent::prepare(payload, opts), partition, ts }
        })
        .collect();
    PlannedAppend { stream, events }
}

// ------------------------------------------------------------------ model

#[derive(Debug, Clone)]
enum Outcome {
    Acked(Vec<(u32, u64)>),
    Failed { assigned: Option<Vec<(u32, u64)>>, poisoned: bool, error: String },
}

#[derive(Debug)]
struct Attempt {
    stream: String,
    events: Vec<Planned>,
    outcome: Outcome,
}

#[derive(Debug, Default)]
struct Model {
    /// name → (partition count, creation acknowledged)
    streams: BTreeMap<String, (u32, bool)>,
    attempts: Vec<Attempt>,
}

fn append(engine: &Engine, stream: &str, events: &[Planned]) -> Outcome {
    let failed = |assigned, e: Error| Outcome::Failed {
        assigned,
        poisoned: matches!(e, Error::Poisoned { .. }),
        error: e.to_string(),
    };
    let log = match engine.stream(stream) {
        Ok(log) => log,
        Err(e) => return failed(None, e),
    };
    let routed: Vec<Routed<'_>> =
        events.iter().map(|p| Routed { partition: p.partition, ts: p.ts, event: &p.event }).collect();
    match engine.append(&log, &routed) {
        Err(e) => failed(None, e),
        Ok((assigned, ticket)) => match ticket.wait() {
            Ok(()) => Outcome::Acked(assigned.into_vec()),
            Err(e) => failed(Some(assigned.into_vec()), e),
        },
    }
}

/// Runs planned appends while the process lives, checking the rules that
/// hold while it runs. Stops a few appends after the fault fired.
fn run_appends(
    engine: &Engine,
    probe: &Probe,
    plan: &Plan,
    appends: &[PlannedAppend],
    model: &mut Model,
    trace: &mut Trace,
) -> Result<(), String> {
    // Failed syncs while opening or creating streams are the business of
    // `a_failed_sync_while_creating_a_stream_poisons_the_engine`.
    let syncs_at_open = probe.failed_syncs();
    let mut after_fault = 0;
    for a in appends {
        let poisoned_before = probe.failed_syncs() > syncs_at_open;
        let dead_before = probe.faulty.crashed();
        if poisoned_before || dead_before {
            after_fault += 1;
            if after_fault > 3 {
                break;
            }
        }
        let stream = &plan.streams[a.stream].0;
        let outcome = append(engine, stream, &a.events);
        let where_ = a.events.iter().map(|e| e.partition).collect::<Vec<_>>();
        trace.log(format!(
            "op {:>4}: append #{} to {stream} partitions {where_:?}: {outcome:?}",
            probe.faulty.op_count(),
            model.attempts.len()
        ));
        match &outcome {
            Outcome::Failed { poisoned: false, error, .. } if poisoned_before => {
                return Err(format!("an append after a failed sync was not refused with Poisoned: {error}"));
            }
            Outcome::Acked(_) if poisoned_before => {
                return Err("an append after a failed sync succeeded (it must be refused until reopen)".into());
            }
            Outcome::Acked(_) if dead_before => return Err("an append succeeded after the process died".into()),
            _ => {}
        }
        model.attempts.push(Attempt { stream: stream.clone(), events: a.events.clone(), outcome });
    }
    if probe.failed_syncs() > syncs_at_open && !probe.faulty.crashed() && engine.poisoned().is_none() {
        return Err("a sync failed but the engine does not report itself poisoned".into());
    }
    Ok(())
}

/// Creates the planned streams (retrying once after a non-fatal failure).
fn create_streams(engine: &Engine, probe: &Probe, plan: &Plan, model: &mut Model, trace: &mut Trace) {
    for (name, count) in &plan.streams {
        let mut ok = false;
        for _ in 0..2 {
            if probe.faulty.crashed() {
                break;
            }
            let r = engine.create_stream(name, *count, &[], 0);
            trace.log(format!("op {:>4}: create stream {name} ({count} partitions): {r:?}", probe.faulty.op_count()));
            if r.is_ok() {
                ok = true;
                break;
            }
        }
        model.streams.insert(name.clone(), (*count, ok));
    }
}

// ------------------------------------------------------------------ scenario

fn run_scenario(seed: u64, trace: &mut Trace) -> Result<Stats, String> {
    let plan = plan(seed);
    let fault = KINDS[usize::try_from(seed % 4).expect("kind")];
    // The dry run: no fault, counts the operations, and must ack everything.
    let total_ops = {
        let probe = Probe::new(FaultyVfs::new(MemVfs::new(), fault, 0, seed), false);
        let mut model = Model::default();
        let mut quiet = Trace { lines: Vec::new(), print: false };
        let engine =
            Engine::open(Arc::new(probe.clone()), plan.opts.clone()).map_err(|e| format!("dry run open: {e}"))?;
        create_streams(&engine, &probe, &plan, &mut model, &mut quiet);
        run_appends(&engine, &probe, &plan, &plan.appends, &mut model, &mut quiet)?;
        if let Some(a) = model.attempts.iter().find(|a| !matches!(a.outcome, Outcome::Acked(_))) {
            return Err(format!("without a fault an append failed: {:?}", a.outcome));
        }
        probe.faulty.op_count()
    };
    let mut rng = Rng::new(seed, 2);
    let arming = Arming::new(fault, total_ops, &mut rng);
    trace.log(format!(
        "seed {seed}: {fault:?} at op {} of {total_ops}, write back {}, second crash {:?}, options {:?}, streams {:?}",
        arming.after, arming.write_back, arming.second, plan.opts, plan.streams
    ));
    run_armed(seed, &plan, &arming, &mut rng, trace)
}

fn run_armed(seed: u64, plan: &Plan, arming: &Arming, rng: &mut Rng, trace: &mut Trace) -> Result<Stats, String> {
    let mem = MemVfs::new();
    let mut stats = Stats { scenarios: 1, ..Stats::default() };
    let mut model = Model::default();

    // Phase 1: the workload, with the fault armed.
    let faulty = FaultyVfs::new(mem.clone(), arming.fault, arming.after, seed);
    let probe = Probe::new(faulty.clone(), false);
    let mut engine = Engine::open(Arc::new(probe.clone()), plan.opts.clone());
    if let Err(e) = &engine {
        trace.log(format!("op {:>4}: open failed: {e}", faulty.op_count()));
        if !faulty.crashed() {
            // The process lives on (disk full, failed fsync): it retries.
            engine = Engine::open(Arc::new(probe.clone()), plan.opts.clone());
            if let Err(e) = &engine {
                return Err(format!("opening again after a non-fatal fault failed: {e}"));
            }
        }
    }
    if let Ok(engine) = engine {
        create_streams(&engine, &probe, plan, &mut model, trace);
        run_appends(&engine, &probe, plan, &plan.appends, &mut model, trace)?;
    }
    stats.fired = u64::from(faulty.crashed() || probe.failed_syncs() > 0 || probe.storage_full() > 0);
    power_cut(&faulty, arming.write_back, rng, trace);

    // Phase 2 (some scenarios): crash again, during or just after recovery.
    if let Some((fault2, after2)) = arming.second {
        stats.second_crash = 1;
        let faulty2 = FaultyVfs::new(mem.clone(), fault2, after2, seed ^ 0x5555);
        let probe2 = Probe::new(faulty2.clone(), false);
        match Engine::open(Arc::new(probe2.clone()), plan.opts.clone()) {
            Ok(engine) => {
                trace.log(format!("op {:>4}: reopened under a second fault", faulty2.op_count()));
                // Reading may rebuild an index (a write), so the fault can fire here too.
                match check_recovered(&engine, &model) {
                    Err(_) if faulty2.crashed() => trace.log("crashed while checking the first recovery".into()),
                    Err(e) => return Err(format!("after the first recovery: {e}")),
                    Ok(()) => run_appends(&engine, &probe2, plan, &plan.later, &mut model, trace)?,
                }
            }
            Err(e) if faulty2.crashed() => trace.log(format!("op {:>4}: reopen crashed: {e}", faulty2.op_count())),
            Err(e) => return Err(format!("reopen failed without a fault: {e}")),
        }
        power_cut(&faulty2, rng.chance(1, 2), rng, trace);
    }

    // Phase 3: recover and check; append; crash without write-back; check again.
    let engine =
        Engine::open(Arc::new(mem.clone()), plan.opts.clone()).map_err(|e| format!("(e) reopen failed: {e}"))?;
    let report = engine.recovery_report().to_vec();
    trace.log(format!("recovery report: {report:?}"));
    stats.truncated = u64::from(!report.is_empty());
    check_recovered(&engine, &model)?;
    append_after_recovery(&engine, &mut model, trace)?;
    stats.rolled_segments = count_rolled(&engine);
    drop(engine);
    mem.crash();
    let engine =
        Engine::open(Arc::new(mem), plan.opts.clone()).map_err(|e| format!("(e) second reopen failed: {e}"))?;
    if !engine.recovery_report().is_empty() {
        return Err(format!(
            "(d) after a clean crash the recovery truncated again (the first cut was not durable?): {:?}",
            engine.recovery_report()
        ));
    }
    check_recovered(&engine, &model).map_err(|e| format!("after the final crash: {e}"))?;
    for a in &model.attempts {
        match a.outcome {
            Outcome::Acked(_) => stats.acked += 1,
            Outcome::Failed { .. } => stats.failed += 1,
        }
    }
    stats.failed_then_present = present_failed(&engine, &model);
    Ok(stats)
}

/// The power cut: optionally some dirty data reaches the disk, then
/// everything unsynced is lost. The engine must be dropped before.
fn power_cut(faulty: &FaultyVfs, write_back: bool, rng: &mut Rng, trace: &mut Trace) {
    if write_back {
        write_back_some(faulty.mem(), rng, trace, 4);
    }
    faulty.restart();
}

// ------------------------------------------------------------------ checks

/// Checks (a), (b) and (c) against the model.
fn check_recovered(engine: &Engine, model: &Model) -> Result<(), String> {
    let entries = engine.stream_entries();
    for (name, (count, acked)) in &model.streams {
        match entries.iter().find(|e| &e.name == name) {
            Some(e) if e.partition_count != *count => {
                return Err(format!("stream {name} has {} partitions, created with {count}", e.partition_count));
            }
            None if *acked => return Err(format!("stream {name} was created (acknowledged) but is gone")),
            _ => {}
        }
    }
    // id → (stream, partition, seq, record)
    let mut found = HashMap::new();
    for entry in &entries {
        if !model.streams.contains_key(&entry.name) {
            return Err(format!("stream {} was never created", entry.name));
        }
        let stream = engine.stream(&entry.name).map_err(|e| e.to_string())?;
        let log = &stream.log;
        for p in 0..entry.partition_count {
            let records = log.read(p, 0, usize::MAX).map_err(|e| format!("(c) reading {}/{p}: {e}", entry.name))?;
            let seqs: Vec<u64> = records.iter().map(|r| r.header.seq).collect();
            if seqs.iter().zip(1..).any(|(&s, want)| s != want) {
                return Err(format!("(c) {}/{p} sequences are not 1..=n: {seqs:?}", entry.name));
            }
            if log.high_watermark(p) != seqs.len() as u64 {
                return Err(format!(
                    "(c) {}/{p} high watermark {} but {} records",
                    entry.name,
                    log.high_watermark(p),
                    seqs.len()
                ));
            }
            for r in records {
                let id = r.doc.id().to_owned();
                if found.insert(id.clone(), (entry.name.clone(), p, r)).is_some() {
                    return Err(format!("(b) event {id} is stored twice"));
                }
            }
        }
    }
    let mut known = 0;
    for (i, a) in model.attempts.iter().enumerate() {
        let present: Vec<_> = a.events.iter().map(|e| found.get(e.event.id())).collect();
        let n = present.iter().flatten().count();
        known += n;
        if let Outcome::Acked(_) = a.outcome
            && n < a.events.len()
        {
            let missing: Vec<_> =
                a.events.iter().zip(&present).filter(|(_, f)| f.is_none()).map(|(e, _)| e.event.id()).collect();
            return Err(format!("(a) acknowledged append #{i} lost events {missing:?}"));
        }
        if n != 0 && n != a.events.len() {
            return Err(format!(
                "(b) append #{i} ({:?}) is partly visible: {n} of {} events",
                a.outcome,
                a.events.len()
            ));
        }
        if n == a.events.len() {
            let present: Vec<_> = present.into_iter().flatten().collect();
            check_append(i, a, &present)?;
        }
    }
    if known != found.len() {
        let phantom: Vec<_> = found
            .keys()
            .filter(|id| !model.attempts.iter().any(|a| a.events.iter().any(|e| e.event.id() == id.as_str())))
            .collect();
        return Err(format!("(b) events that were never appended: {phantom:?}"));
    }
    Ok(())
}

type Found = (String, u32, rheo::engine::log::partition::StoredRecord);

/// A present append: every event intact, where it was assigned (or, when
/// unknown, contiguous per partition in input order), flagged as one append.
fn check_append(i: usize, a: &Attempt, present: &[&Found]) -> Result<(), String> {
    let assigned = match &a.outcome {
        Outcome::Acked(x) => Some(x),
        Outcome::Failed { assigned, .. } => assigned.as_ref(),
    };
    let multi = a.events.iter().any(|e| e.partition != a.events[0].partition);
    let mut last_seq: HashMap<u32, u64> = HashMap::new();
    let mut txns = Vec::new();
    for (k, (e, (stream, p, r))) in a.events.iter().zip(present).enumerate() {
        let want = (e.event.id(), e.event.key(), e.event.event_type(), e.event.metadata(), e.event.payload());
        let got = (r.doc.id(), r.doc.key(), r.doc.event_type(), r.doc.metadata(), r.doc.payload());
        let same = got == want;
        if *stream != a.stream || *p != e.partition || !same || r.header.ts != e.ts {
            return Err(format!(
                "(a) append #{i} event {k} differs: stored in {stream}/{p} {:?} ts {}, appended to {}/{} {want:?} ts {}",
                r.doc, r.header.ts, a.stream, e.partition, e.ts
            ));
        }
        if let Some(assigned) = assigned
            && assigned[k] != (*p, r.header.seq)
        {
            return Err(format!(
                "(a) append #{i} event {k} is at {p}/{}, it was assigned {:?}",
                r.header.seq, assigned[k]
            ));
        }
        if let Some(prev) = last_seq.insert(*p, r.header.seq)
            && prev + 1 != r.header.seq
        {
            return Err(format!("(b) append #{i} is not contiguous in partition {p}: {prev} then {}", r.header.seq));
        }
        if (r.header.flags & FLAG_MULTI != 0) != multi {
            return Err(format!("append #{i} event {k}: flags {:#x} but multi-partition = {multi}", r.header.flags));
        }
        txns.push(r.header.txn);
        let last_in_partition = !a.events[k + 1..].iter().any(|x| x.partition == e.partition);
        if (r.header.flags & FLAG_END != 0) != last_in_partition {
            return Err(format!(
                "append #{i} event {k}: flags {:#x}, last in its partition = {last_in_partition}",
                r.header.flags
            ));
        }
    }
    if (multi && (txns[0] == 0 || txns.iter().any(|&t| t != txns[0]))) || (!multi && txns.iter().any(|&t| t != 0)) {
        return Err(format!("append #{i}: transaction ids {txns:?} (multi-partition = {multi})"));
    }
    Ok(())
}

/// (d): a batch over every partition of every stream and a single append
/// continue at n+1 and are acknowledged.
fn append_after_recovery(engine: &Engine, model: &mut Model, trace: &mut Trace) -> Result<(), String> {
    for entry in engine.stream_entries() {
        let stream = engine.stream(&entry.name).map_err(|e| e.to_string())?;
        let log = &stream.log;
        let hw: Vec<u64> = (0..entry.partition_count).map(|p| log.high_watermark(p)).collect();
        let n = model.attempts.len();
        let planned = |p: u32, j: usize| Planned {
            event: NewEvent::prepare(
                json!({"after": "recovery", "j": j}),
                AppendOptions::new().id(format!("r{n}-{j}")).partition(p),
            ),
            partition: p,
            ts: 1,
        };
        let batch: Vec<Planned> =
            (0..entry.partition_count).map(|p| planned(p, usize::try_from(p).expect("p"))).collect();
        let single = vec![planned(0, 99)];
        for (events, want) in [
            (batch, (0..entry.partition_count).map(|p| (p, hw[p as usize] + 1)).collect::<Vec<_>>()),
            (single, vec![(0, hw[0] + 2)]),
        ] {
            let outcome = append(engine, &entry.name, &events);
            trace.log(format!("(d) append to {}: {outcome:?}", entry.name));
            match &outcome {
                Outcome::Acked(assigned) if *assigned == want => {}
                other => {
                    return Err(format!(
                        "(d) appending after recovery to {}: {other:?}, expected {want:?}",
                        entry.name
                    ));
                }
            }
            model.attempts.push(Attempt { stream: entry.name.clone(), events, outcome });
        }
        model.streams.insert(entry.name.clone(), (entry.partition_count, true));
    }
    Ok(())
}

fn count_rolled(engine: &Engine) -> u64 {
    let mut n = 0;
    for entry in engine.stream_entries() {
        let stream = engine.stream(&entry.name).expect("stream");
        let log = &stream.log;
        for p in 0..entry.partition_count {
            n += log.partition(p).expect("partition").segments().len() as u64 - 1;
        }
    }
    n
}

fn present_failed(engine: &Engine, model: &Model) -> u64 {
    let mut ids = std::collections::HashSet::new();
    for entry in engine.stream_entries() {
        let stream = engine.stream(&entry.name).expect("stream");
        let log = &stream.log;
        for p in 0..entry.partition_count {
            ids.extend(log.read(p, 0, usize::MAX).expect("read").into_iter().map(|r| r.doc.id().to_owned()));
        }
    }
    let failed = model.attempts.iter().filter(|a| matches!(a.outcome, Outcome::Failed { .. }));
    failed.filter(|a| ids.contains(a.events[0].event.id())).count() as u64
}

// ------------------------------------------------------------------ torn tails

fn small() -> EngineOptions {
    EngineOptions::default().segment_bytes(4096).preallocate_bytes(1024).background_indexing(false)
}

fn event(id: &str, p: u32, pad: usize) -> Planned {
    let payload = json!({"id": id, "pad": "y".repeat(pad)});
    Planned { event: NewEvent::prepare(payload, AppendOptions::new().id(id).partition(p)), partition: p, ts: 7 }
}

fn acked(engine: &Engine, events: &[Planned]) -> Vec<(u32, u64)> {
    match append(engine, "s", events) {
        Outcome::Acked(a) => a,
        other => panic!("append failed: {other:?}"),
    }
}

fn ids(engine: &Engine, p: u32) -> Vec<String> {
    let stream = engine.stream("s").expect("stream");
    let log = &stream.log;
    log.read(p, 0, usize::MAX).expect("read").into_iter().map(|r| r.doc.id().to_owned()).collect()
}

/// Runs `steps` on a recording probe without a fault and returns the op
/// number of the operation that `pick` selects among those of the last step.
fn find_op(opts: EngineOptions, steps: &dyn Fn(&Engine, bool), pick: &dyn Fn(&[OpRecord]) -> Option<u64>) -> u64 {
    let probe = Probe::new(FaultyVfs::new(MemVfs::new(), Fault::Crash, 0, 1), true);
    let engine = Engine::open(Arc::new(probe.clone()), opts).expect("open");
    steps(&engine, false);
    let before = probe.faulty.op_count();
    steps(&engine, true);
    let ops: Vec<OpRecord> = probe.ops().into_iter().filter(|o| o.0 > before).collect();
    pick(&ops).unwrap_or_else(|| panic!("no operation to fault among {ops:#?}"))
}

/// A record torn by the crash (its prefix reached the disk) is cut at
/// recovery, durably: a second crash finds nothing to truncate, and records
/// appended over the cut region are the only ones there after a third.
#[test]
fn a_torn_record_is_cut_durably_and_never_resurrects() {
    let setup = |engine: &Engine| {
        engine.create_stream("s", 3, &[], 0).expect("create");
        for i in 0..3 {
            acked(engine, &[event(&format!("a{i}"), 0, 100)]);
        }
    };
    let victim = || event("victim", 0, 700);
    let steps = |engine: &Engine, last: bool| {
        if last {
            let _ = append(engine, "s", &[victim()]);
        } else {
            setup(engine);
        }
    };
    // The write of the victim's record: the last write to a segment before a sync.
    let op = find_op(small(), &steps, &|ops| {
        let first_sync = ops.iter().position(|o| o.1.starts_with("sync")).unwrap_or(ops.len());
        ops[..first_sync].iter().rev().find(|o| o.1 == "write" && o.2.ends_with(".log") && o.3 > 700).map(|o| o.0)
    });
    let mut torn_cases = 0;
    for tear_seed in 1..=24 {
        let mem = MemVfs::new();
        let faulty = FaultyVfs::new(mem.clone(), Fault::TornWrite, op, tear_seed);
        let engine = Engine::open(Arc::new(faulty.clone()), small()).expect("open");
        setup(&engine);
        let outcome = append(&engine, "s", &[victim()]);
        assert!(faulty.crashed(), "tear seed {tear_seed}: the fault fired at op {op}: {outcome:?}");
        assert!(matches!(outcome, Outcome::Failed { .. }), "tear seed {tear_seed}: {outcome:?}");
        drop(engine);
        // The OS wrote the torn page back before the power cut.
        let path = "streams/0000000000000001/00000/00000000000000000001.log";
        mem.open(path, false).and_then(|f| f.sync_data()).expect("write back");
        faulty.restart();

        let engine = Engine::open(Arc::new(mem.clone()), small()).expect("reopen after a torn write");
        let report = engine.recovery_report().to_vec();
        torn_cases += usize::from(!report.is_empty());
        assert!(report.iter().all(|(f, _)| f == path), "tear seed {tear_seed}: {report:?}");
        assert_eq!(ids(&engine, 0), ["a0", "a1", "a2"], "tear seed {tear_seed}");
        drop(engine);

        mem.crash();
        let engine = Engine::open(Arc::new(mem.clone()), small()).expect("reopen after a second crash");
        assert!(
            engine.recovery_report().is_empty(),
            "tear seed {tear_seed}: the first recovery's cut was not durable: {:?}",
            engine.recovery_report()
        );
        assert_eq!(ids(&engine, 0), ["a0", "a1", "a2"], "tear seed {tear_seed}");
        // Small records over the cut region; then crash with nothing written back.
        assert_eq!(acked(&engine, &[event("b0", 0, 10), event("b1", 0, 10)]), [(0, 4), (0, 5)]);
        drop(engine);
        mem.crash();
        let engine = Engine::open(Arc::new(mem.clone()), small()).expect("third reopen");
        assert!(engine.recovery_report().is_empty(), "tear seed {tear_seed}: {:?}", engine.recovery_report());
        assert_eq!(ids(&engine, 0), ["a0", "a1", "a2", "b0", "b1"], "tear seed {tear_seed}: old bytes came back");
        assert_eq!(acked(&engine, &[event("c0", 0, 10)]), [(0, 6)]);
    }
    assert!(torn_cases >= 12, "only {torn_cases} of 24 tears left a tail to truncate");
}

/// A multi-partition batch whose data was synced but whose commit was lost is
/// cut from every partition at recovery. Its transaction id is then reused by
/// the next batch (over other partitions); after another crash the old
/// records must not come back as if that commit were theirs.
#[test]
fn an_uncommitted_batch_never_resurrects_under_a_reused_transaction_id() {
    let setup = |engine: &Engine| {
        engine.create_stream("s", 3, &[], 0).expect("create");
        acked(engine, &[event("a0", 0, 50), event("a1", 1, 50)]);
    };
    let victim = || vec![event("v0", 0, 50), event("v1", 1, 50)];
    let steps = |engine: &Engine, last: bool| {
        if last {
            let _ = append(engine, "s", &victim());
        } else {
            setup(engine);
        }
    };
    // The victim's commit: the write to the transaction log.
    let op = find_op(small(), &steps, &|ops| ops.iter().find(|o| o.1 == "write" && o.2.contains("/txn")).map(|o| o.0));
    let mem = MemVfs::new();
    let faulty = FaultyVfs::new(mem.clone(), Fault::Crash, op, 1);
    let engine = Engine::open(Arc::new(faulty.clone()), small()).expect("open");
    setup(&engine);
    let outcome = append(&engine, "s", &victim());
    assert!(faulty.crashed() && matches!(outcome, Outcome::Failed { .. }), "{outcome:?}");
    drop(engine);
    faulty.restart();

    let engine = Engine::open(Arc::new(mem.clone()), small()).expect("reopen");
    assert_eq!(engine.recovery_report().len(), 2, "cut from both partitions: {:?}", engine.recovery_report());
    assert_eq!((ids(&engine, 0), ids(&engine, 1)), (vec!["a0".to_owned()], vec!["a1".to_owned()]));
    // The next batch gets the victim's transaction id, over partitions 1 and 2.
    assert_eq!(acked(&engine, &[event("n1", 1, 10), event("n2", 2, 10)]), [(1, 2), (2, 1)]);
    drop(engine);
    mem.crash();

    let engine = Engine::open(Arc::new(mem), small()).expect("reopen after the second crash");
    assert_eq!(ids(&engine, 0), ["a0"], "the uncommitted batch came back in partition 0");
    assert_eq!(ids(&engine, 1), ["a1", "n1"]);
    assert_eq!(ids(&engine, 2), ["n2"]);
    assert!(engine.recovery_report().is_empty(), "{:?}", engine.recovery_report());
}

/// A crash while a roll creates the next segment can leave its directory
/// entry durable (the file system may commit a creation before the
/// directory is synced) with no or part of its header. Nothing was written
/// to that segment yet, so recovery must treat it as not created.
#[test]
fn a_segment_whose_creation_was_cut_short_does_not_block_recovery() {
    let setup = |engine: &Engine| {
        engine.create_stream("s", 1, &[], 0).expect("create");
        for i in 0..7 {
            acked(engine, &[event(&format!("a{i}"), 0, 500)]);
        }
    };
    let roller = || event("roller", 0, 500);
    let steps = |engine: &Engine, last: bool| {
        if last {
            let _ = append(engine, "s", &[roller()]);
        } else {
            setup(engine);
        }
    };
    // The creation of the next segment during the roll.
    let create =
        find_op(small(), &steps, &|ops| ops.iter().find(|o| o.1 == "create" && o.2.ends_with(".log")).map(|o| o.0));
    let dir = "streams/0000000000000001/00000";
    // (fault, at op, what the OS wrote back): crash before the header is
    // written; header torn and written back; header written, not synced.
    let cases =
        [(Fault::Crash, create + 1, false), (Fault::TornWrite, create + 2, true), (Fault::Crash, create + 3, true)];
    let mut failures = Vec::new();
    for (fault, at, file_too) in cases {
        let mem = MemVfs::new();
        let faulty = FaultyVfs::new(mem.clone(), fault, at, 5);
        let engine = Engine::open(Arc::new(faulty.clone()), small()).expect("open");
        setup(&engine);
        let outcome = append(&engine, "s", &[roller()]);
        assert!(faulty.crashed() && matches!(outcome, Outcome::Failed { .. }), "{fault:?} at {at}: {outcome:?}");
        drop(engine);
        let segments = mem.list(dir).expect("list");
        let new = segments.iter().rfind(|n| n.ends_with(".log")).expect("segments").clone();
        if file_too {
            mem.open(&format!("{dir}/{new}"), false).and_then(|f| f.sync_data()).expect("write back the file");
        }
        mem.sync_dir(dir).expect("write back the directory");
        faulty.restart();
        match Engine::open(Arc::new(mem.clone()), small()) {
            Ok(engine) => {
                assert_eq!(ids(&engine, 0), ["a0", "a1", "a2", "a3", "a4", "a5", "a6"]);
                assert_eq!(acked(&engine, &[roller()]), [(0, 8)]);
            }
            Err(e) => failures.push(format!(
                "{fault:?} at op {at} (the entry of {new} durable, its data written back: {file_too}): reopen failed: {e}"
            )),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A failed sync while creating a stream: stream creation fails, and — as
/// for any failed sync (the kernel may have dropped dirty pages; see the
/// `VfsFile::sync_data` contract) — every later append is refused with
/// `Poisoned` until the data directory is reopened.
#[test]
fn a_failed_sync_while_creating_a_stream_poisons_the_engine() {
    let setup = |engine: &Engine| {
        engine.create_stream("s", 1, &[], 0).expect("create");
        acked(engine, &[event("a0", 0, 10)]);
    };
    let ops_before = {
        let faulty = FaultyVfs::new(MemVfs::new(), Fault::FsyncFails, 0, 1);
        let engine = Engine::open(Arc::new(faulty.clone()), small()).expect("open");
        setup(&engine);
        faulty.op_count()
    };
    let faulty = FaultyVfs::new(MemVfs::new(), Fault::FsyncFails, ops_before + 1, 1);
    let probe = Probe::new(faulty, false);
    let engine = Engine::open(Arc::new(probe.clone()), small()).expect("open");
    setup(&engine);
    let created = engine.create_stream("t", 2, &[], 0);
    assert_eq!(probe.failed_syncs(), 1, "the sync failed while creating the stream");
    assert!(created.is_err(), "{created:?}");
    let outcome = append(&engine, "s", &[event("a1", 0, 10)]);
    assert!(
        matches!(outcome, Outcome::Failed { poisoned: true, .. }),
        "after a failed sync an append must be refused with Poisoned, got {outcome:?} (engine.poisoned() = {:?})",
        engine.poisoned()
    );
}

/// Under `Sync` an append's records wait in memory for the commit thread,
/// and a full disk (met while zero-filling ahead) fails an append before any
/// of them reach a file. Under `Batched` and `None` they are written at once:
/// a batch over partitions 0 and 1 whose write to partition 1 hits a full
/// disk is rolled back in partition 0 while the process goes on. The next
/// batch commits a later transaction id, and the transaction log keeps only
/// the last id, so rolled-back records left in partition 0's page would count
/// as committed once the OS writes that page back: rollback must zero them.
#[test]
fn a_batch_rolled_back_after_a_full_disk_never_resurrects() {
    let none = small().durability(Durability::None);
    let setup = |engine: &Engine| {
        engine.create_stream("s", 3, &[], 0).expect("create");
        acked(engine, &[event("a0", 0, 50), event("a1", 1, 50)]);
    };
    let victim = || vec![event("v0", 0, 50), event("v1", 1, 50)];
    let steps = |engine: &Engine, last: bool| {
        if last {
            let _ = append(engine, "s", &victim());
        } else {
            setup(engine);
        }
    };
    // The victim's record write to partition 1 (after zero-filling, if any).
    let op = find_op(none.clone(), &steps, &|ops| {
        ops.iter().rev().find(|o| o.1 == "write" && o.2.contains("/00001/") && o.2.ends_with(".log")).map(|o| o.0)
    });
    let mem = MemVfs::new();
    let faulty = FaultyVfs::new(mem.clone(), Fault::DiskFull, op, 3);
    let engine = Engine::open(Arc::new(faulty.clone()), none.clone()).expect("open");
    setup(&engine);
    let outcome = append(&engine, "s", &victim());
    assert!(
        matches!(&outcome, Outcome::Failed { poisoned: false, error, .. } if error.contains("no space")),
        "{outcome:?}"
    );
    assert_eq!(acked(&engine, &[event("n1", 1, 10), event("n2", 2, 10)]), [(1, 2), (2, 1)]);
    drop(engine);
    // The OS writes everything back, then the power goes.
    let (mut files, mut dirs) = (Vec::new(), Vec::new());
    walk(&mem, "", &mut files, &mut dirs);
    for f in &files {
        mem.open(f, false).and_then(|h| h.sync_data()).expect("write back");
    }
    mem.crash();
    let engine = Engine::open(Arc::new(mem), none).expect("reopen");
    assert_eq!(ids(&engine, 0), ["a0"], "the rolled-back batch came back in partition 0");
    assert_eq!(ids(&engine, 1), ["a1", "n1"]);
    assert_eq!(ids(&engine, 2), ["n2"]);
}
