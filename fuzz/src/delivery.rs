//! Helpers of the delivery-table targets (`wal_decoder`,
//! `checkpoint_decoder`, `delivery_model`): a tokio runtime, copies of a
//! `MemVfs` data directory, a data directory written by a real engine
//! session, and the checks run on a directory that opened.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rheo::engine::delivery::wal::{WAL_FRAME_LEN, WAL_HEADER_LEN};
use rheo::engine::vfs::{MemVfs, Vfs};
use rheo::engine::{Durability, Engine, EngineOptions};
use rheo::{AppendOptions, Backoff, FetchOptions, GroupInfo, GroupOptions, Lag, ManualClock, NewEvent, ReplayOptions, StreamOptions, Timestamp};
use rheo::backends::Backend;
use rheo::backends::native::NativeBackend;

/// The stream every delivery target uses (stream id 1).
pub const STREAM: &str = "s";
/// Its consumer-group directory.
pub const GROUPS_DIR: &str = "streams/0000000000000001/groups";
/// The first WAL generation's file.
pub const WAL1: &str = "streams/0000000000000001/groups/wal-00000000000000000001.log";
/// A checkpoint of generation 1.
pub const CKPT1: &str = "streams/0000000000000001/groups/checkpoint-00000000000000000001.ckpt";
/// The clock's start (2026-01-01).
pub const START: Timestamp = Timestamp::from_millis(1_767_225_600_000);

/// One current-thread runtime for every input (its blocking pool serves
/// the native backend's `spawn_blocking`).
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime"))
}

/// Small files, no zero-filling, no automatic checkpoints: cheap to open.
pub fn small_options() -> EngineOptions {
    // No builder thread, no commit thread per input: deterministic and
    // fast (commits run on the fuzzing thread).
    EngineOptions::new()
        .durability(Durability::Sync)
        .segment_bytes(4096)
        .preallocate_bytes(0)
        .checkpoint_bytes(u64::MAX)
        .checkpoint_interval(Duration::from_secs(1 << 40))
        .background_indexing(false)
        .inline_io(true)
}

/// Every directory (with `None`) and file (with its live content) of a
/// `MemVfs`, parents before children.
pub type Tree = Vec<(String, Option<Vec<u8>>)>;

/// The whole tree of `vfs`.
pub fn copy_tree(vfs: &MemVfs) -> Tree {
    fn walk(vfs: &MemVfs, dir: &str, out: &mut Tree) {
        let Ok(names) = vfs.list(dir) else { return };
        for name in names {
            let path = if dir.is_empty() { name } else { format!("{dir}/{name}") };
            match vfs.read_file(&path) {
                Some(bytes) => out.push((path, Some(bytes))),
                None => {
                    out.push((path.clone(), None));
                    walk(vfs, &path, out);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(vfs, "", &mut out);
    out
}

/// A fresh `MemVfs` holding `tree`, all of it durable.
pub fn restore_tree(tree: &Tree) -> MemVfs {
    let vfs = MemVfs::new();
    for (path, content) in tree {
        match content {
            None => {
                vfs.create_dir_all(path).expect("mkdir");
                let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
                vfs.sync_dir(parent).expect("sync dir");
            }
            Some(bytes) => vfs.write_file(path, bytes).expect("write file"),
        }
    }
    vfs
}

/// A data directory written by a real engine session.
#[derive(Debug)]
pub struct Base {
    /// Stream `s` (2 partitions, 6 events), groups `g` and `h` with claims,
    /// settles and a replay in WAL generation 1; no checkpoint.
    pub tree: Tree,
    /// The WAL of generation 1 as written (header and records).
    pub wal: Vec<u8>,
    /// The checkpoint the same state gives (generation 2 as written).
    pub checkpoint: Vec<u8>,
}

/// The base directory, built once per process.
pub fn base() -> &'static Base {
    static BASE: OnceLock<Base> = OnceLock::new();
    BASE.get_or_init(|| runtime().block_on(build_base()))
}

async fn build_base() -> Base {
    let mem = MemVfs::new();
    let clock = ManualClock::new(START);
    let engine = Engine::open(Arc::new(mem.clone()), small_options()).expect("open");
    let b = NativeBackend::with_engine(engine, Arc::new(clock.clone()));
    b.create_stream(STREAM, &StreamOptions::new().partitions(2)).await.expect("stream");
    b.create_group(STREAM, "g", &GroupOptions::new().max_attempts(3)).await.expect("group g");
    let h = GroupOptions::new().partitions(vec![1]).retry_backoff(Backoff::Fixed(Duration::from_millis(500)));
    b.create_group(STREAM, "h", &h).await.expect("group h");
    let events: Vec<NewEvent> = (0..6u32)
        .map(|i| NewEvent::prepare(serde_json::json!({"i": i}), AppendOptions::new().partition(i % 2)))
        .collect();
    b.append_batch(STREAM, &events).await.expect("append");
    let fetch = FetchOptions::new().limit(4).consumer("c").lease(Duration::from_secs(5));
    let leases = b.fetch(STREAM, "g", &fetch).await.expect("fetch").leases;
    b.ack(&leases[0].to_ref()).await.expect("ack");
    b.retry(&leases[1].to_ref(), "again", Some(Duration::from_millis(100))).await.expect("retry");
    b.reject(&leases[2].to_ref(), "bad").await.expect("reject");
    b.renew(&leases[3].to_ref(), Duration::from_secs(9)).await.expect("renew");
    let hl = b.fetch(STREAM, "h", &fetch).await.expect("fetch h").leases;
    b.ack_many(&[hl[0].to_ref(), hl[1].to_ref()]).await.expect("ack_many");
    clock.advance(Duration::from_secs(6));
    b.retry(&hl[2].to_ref(), "later", None).await.expect("retry h");
    b.replay(STREAM, "g", &ReplayOptions::from_sequence(2).partitions(vec![0]).validate(STREAM, "g").expect("valid"))
        .await
        .expect("replay");
    let _ = b.fetch(STREAM, "g", &fetch).await.expect("fetch again").leases;
    let tree = copy_tree(&mem);
    let wal = mem.read_file(WAL1).expect("WAL generation 1");
    b.engine().checkpoint(STREAM).expect("checkpoint");
    let ckpt = format!("{GROUPS_DIR}/checkpoint-00000000000000000002.ckpt");
    let checkpoint = mem.read_file(&ckpt).expect("checkpoint generation 2");
    Base { tree, wal, checkpoint }
}

/// Rewrites the CRC of each WAL record frame from `at` on, as long as the
/// lengths stay inside the buffer. Returns where the fixed records end.
pub fn fix_wal_crcs(b: &mut [u8], mut at: usize) -> usize {
    while at + WAL_FRAME_LEN <= b.len() {
        let mut len = [0u8; 4];
        len.copy_from_slice(&b[at..at + 4]);
        let len = u32::from_le_bytes(len) as usize;
        if len == 0 || b.len() - at - WAL_FRAME_LEN < len {
            break;
        }
        let end = at + WAL_FRAME_LEN + len;
        let crc = crc32fast::hash(&b[at + WAL_FRAME_LEN..end]);
        b[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
        at = end;
    }
    at
}

/// Where the records of a WAL file start.
pub const RECORDS_AT: usize = WAL_HEADER_LEN;

/// What the public API says about every group.
pub type Summary = Vec<(String, rheo::Result<GroupInfo>, rheo::Result<Lag>)>;

/// Every group's info and lag.
pub async fn summary(b: &NativeBackend) -> rheo::Result<Summary> {
    let mut out = Vec::new();
    for g in b.list_groups(STREAM).await? {
        let info = b.group_info(STREAM, &g.name).await;
        let lag = b.lag(STREAM, &g.name, None).await;
        out.push((g.name, info, lag));
    }
    Ok(out)
}

fn same(a: &rheo::Result<Summary>, b: &rheo::Result<Summary>) -> bool {
    // `Error` has no `PartialEq`: compare the rendered form.
    format!("{a:?}") == format!("{b:?}")
}

/// Opens `vfs` with `opts`: `Ok` or a typed error, never a panic. When it
/// opened: reopening (after its own recovery) gives the same groups; a few
/// calls on every group answer (errors allowed), and what they wrote reopens.
/// Returns whether the first open succeeded.
pub fn open_and_exercise(vfs: &MemVfs, opts: &EngineOptions) -> bool {
    runtime().block_on(async {
        let clock = ManualClock::new(START);
        let open = |what: &str| match Engine::open(Arc::new(vfs.clone()), opts.clone()) {
            Ok(e) => NativeBackend::with_engine(e, Arc::new(clock.clone())),
            Err(e) => panic!("{what}: the directory opened before, now fails: {e}"),
        };
        let Ok(engine) = Engine::open(Arc::new(vfs.clone()), opts.clone()) else { return false };
        let b = NativeBackend::with_engine(engine, Arc::new(clock.clone()));
        let first = summary(&b).await;
        drop(b);
        let b = open("second open");
        let second = summary(&b).await;
        assert!(same(&first, &second), "groups differ between two opens:\n{first:?}\n{second:?}");
        let groups = b.list_groups(STREAM).await.unwrap_or_default();
        for g in &groups {
            let fetch = FetchOptions::new().limit(4).consumer("x").lease(Duration::from_secs(1));
            if let Ok(report) = b.fetch(STREAM, &g.name, &fetch).await {
                let mut it = report.leases.iter().map(|l| l.to_ref());
                if let Some(l) = it.next() {
                    let _ = b.ack(&l).await;
                }
                if let Some(l) = it.next() {
                    let _ = b.retry(&l, "fuzz", Some(Duration::ZERO)).await;
                }
                if let Some(l) = it.next() {
                    let _ = b.reject(&l, "fuzz").await;
                }
            }
            let replay = ReplayOptions::from_sequence(1).validate(STREAM, &g.name).expect("valid");
            let _ = b.replay(STREAM, &g.name, &replay).await;
            clock.advance(Duration::from_secs(2));
            let _ = b.fetch(STREAM, &g.name, &fetch).await;
        }
        let before = summary(&b).await;
        drop(b);
        let b = open("open after calls on the recovered groups");
        let after = summary(&b).await;
        assert!(same(&before, &after), "groups differ after reopening the calls' WAL:\n{before:?}\n{after:?}");
        true
    })
}
