//! The MongoDB backend (feature `mongo`) on a real MongoDB-wire server:
//! the reference's collections and indexes, atomic appends with contiguous
//! sequences, reads, and the errors at its boundary.
//!
//! Every case that needs a server is ignored unless asked for: `.ci/run`
//! starts one (SecantusDB, `.ci/services.sh`) and runs them with
//! `RHEO_MONGO_URL` set (`cargo test --test mongo_backend -- --ignored`).
//! Each case works in a database of its own, dropped at its end. Built
//! with the `mongo` feature only (`cargo test --features mongo --test
//! mongo_backend`; see Cargo.toml on why `cargo test` leaves it out).

#![cfg(feature = "mongo")]

#[path = "common/scale.rs"]
mod scale;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mongodb::bson::{Document, doc};
use rheo::{AppendOptions, Error, FetchOptions, GroupOptions, Rheo, StreamOptions};
use serde_json::json;

/// The server's URL (`RHEO_MONGO_URL`, e.g.
/// `mongodb://127.0.0.1:PORT/?directConnection=true`) with a fresh
/// database in its path.
fn fresh_url() -> (String, String) {
    let db = format!("rheo_{}", uuid::Uuid::new_v4().simple());
    (url_for(&db), db)
}

/// The server's URL with `db` in its path.
fn url_for(db: &str) -> String {
    let base = std::env::var("RHEO_MONGO_URL")
        .expect("RHEO_MONGO_URL names a MongoDB-wire server (mongodb://host:port/?...); .ci/run starts one");
    let (head, query) = base.split_once('?').unwrap_or((&base, ""));
    let head = head.trim_end_matches('/');
    if query.is_empty() { format!("{head}/{db}") } else { format!("{head}/{db}?{query}") }
}

/// A driver client on the same server, to look at what the backend wrote.
async fn client() -> mongodb::Client {
    let base = std::env::var("RHEO_MONGO_URL").expect("RHEO_MONGO_URL");
    mongodb::Client::with_uri_str(&base).await.expect("client")
}

/// Drops the case's database when the case ends, passed or failed.
struct Drop_(String);

impl Drop for Drop_ {
    fn drop(&mut self) {
        let db = self.0.clone();
        // A fresh runtime on its own thread: the case's may be gone.
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() {
                rt.block_on(async { client().await.database(&db).drop().await.ok() });
            }
        })
        .join();
    }
}

async fn open() -> (Rheo, String, Drop_) {
    let (url, db) = fresh_url();
    let rheo = Rheo::open(&url).await.expect("the mongo backend opens");
    (rheo, db.clone(), Drop_(db))
}

const NEEDS: &str = "needs a MongoDB-wire server: .ci/run starts one and runs these with RHEO_MONGO_URL set";

#[tokio::test]
#[ignore = "needs a MongoDB-wire server: .ci/run starts one and runs these with RHEO_MONGO_URL set"]
async fn mongo_creates_the_reference_indexes_idempotently() {
    let _ = NEEDS;
    let (rheo, db, _drop) = open().await;
    drop(rheo);
    Rheo::open(&url_for(&db)).await.expect("opening again changes nothing");
    let c = client().await;
    let mut found: BTreeMap<String, Vec<(String, bool)>> = BTreeMap::new();
    for coll in ["streams", "events", "groups", "deliveries"] {
        let specs = c.database(&db).collection::<Document>(coll).list_indexes().await.expect("list");
        use futures::TryStreamExt;
        let specs: Vec<mongodb::IndexModel> = specs.try_collect().await.expect("indexes");
        for m in specs {
            let opts = m.options.unwrap_or_default();
            let name = opts.name.unwrap_or_default();
            if name != "_id_" {
                found.entry(coll.to_owned()).or_default().push((name, opts.unique.unwrap_or(false)));
            }
        }
    }
    for v in found.values_mut() {
        v.sort();
    }
    let want = |v: &[(&str, bool)]| v.iter().map(|(n, u)| ((*n).to_owned(), *u)).collect::<Vec<_>>();
    assert_eq!(found["streams"], want(&[("streams_name", true)]));
    assert_eq!(
        found["events"],
        want(&[
            ("events_stream_correlation", false),
            ("events_stream_key", false),
            ("events_stream_partition_sequence", true),
            ("events_stream_schema", false),
            ("events_stream_timestamp", false),
            ("events_stream_type", false),
        ])
    );
    assert_eq!(found["groups"], want(&[("groups_stream_name", true)]));
    assert_eq!(
        found["deliveries"],
        want(&[
            ("deliveries_claim", false),
            ("deliveries_frontier", false),
            ("deliveries_stream_group_event", true),
            // Ours: a keyed group's deliveries by key (ADR 0037).
            ("rheo_rs_deliveries_partition_key", false),
        ])
    );
}

#[tokio::test]
#[ignore = "needs a MongoDB-wire server: .ci/run starts one and runs these with RHEO_MONGO_URL set"]
async fn mongo_appends_atomically_with_contiguous_sequences_and_reads_them_back() {
    let (rheo, db, _drop) = open().await;
    rheo.create_stream("orders", StreamOptions::new().partitions(2)).await.expect("create");
    let e = rheo.create_stream("orders", StreamOptions::new()).await.expect_err("twice");
    assert!(matches!(e, Error::AlreadyExists { .. }), "{e}");
    let payload = json!({"type": "placed", "n": 1, "big": 9_007_199_254_740_993_i64, "f": 2.0, "s": "1",
                         "nested": {"a": [1, "1", null, true]}});
    let one = rheo
        .append("orders", &payload, AppendOptions::new().key("k1").metadata("schema", json!("v1")))
        .await
        .expect("append");
    let items: Vec<_> = (0..10).map(|i| (json!({"i": i}), AppendOptions::new().partition(i % 2))).collect();
    let batch = rheo.append_batch_with("orders", items).await.expect("batch");
    let mut per: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    per.entry(one.partition()).or_default().push(one.sequence());
    for e in &batch {
        per.entry(e.partition()).or_default().push(e.sequence());
    }
    for (p, seqs) in &per {
        let want: Vec<u64> = (1..=seqs.len() as u64).collect();
        assert_eq!(seqs, &want, "partition {p}: contiguous from 1");
    }
    let back = rheo.read("orders", one.partition(), 0, 100).await.expect("read");
    let first = back.iter().find(|e| e.id() == one.id()).expect("the first event");
    assert_eq!(first.payload().json().expect("payload"), &payload, "the payload comes back exactly");
    assert_eq!(first.key(), Some("k1"));
    assert_eq!(first.event_type(), Some("placed"));
    assert_eq!(first.metadata().get("schema"), Some(&json!("v1")));
    assert_eq!(first.timestamp(), one.timestamp());
    // A batch holding an id this stream already stored appends the rest and
    // answers the original for it (idempotent appends), with no gap.
    let dup = vec![
        (json!({"x": 1}), AppendOptions::new().partition(0)),
        (json!({"x": 2}), AppendOptions::new().partition(0).id(one.id())),
    ];
    let out = rheo.append_batch_with("orders", dup).await.expect("a batch with a stored id");
    assert_eq!(out[0].sequence(), per[&0].len() as u64 + 1);
    assert!(!out[0].is_duplicate());
    assert!(out[1].is_duplicate());
    assert_eq!(
        (out[1].partition(), out[1].sequence(), out[1].payload().json().expect("json")),
        (one.partition(), one.sequence(), &payload)
    );
    // An id stored by another stream is refused, and the batch writes nothing.
    rheo.create_stream("others", StreamOptions::new()).await.expect("stream");
    let foreign = vec![(json!({"x": 3}), AppendOptions::new()), (json!({"x": 4}), AppendOptions::new().id(one.id()))];
    let e = rheo.append_batch_with("others", foreign).await.expect_err("an id of another stream");
    assert!(e.to_string().contains("already used by an event of stream \"orders\""), "{e}");
    let after = rheo.append("orders", &json!({"x": 3}), AppendOptions::new().partition(0)).await.expect("append");
    assert_eq!(after.sequence(), per[&0].len() as u64 + 2, "no gap");
    let others = rheo.append("others", &json!({"x": 5}), AppendOptions::new()).await.expect("append");
    assert_eq!(others.sequence(), 1, "the refused batch left no event and no gap");
    // What the reference would see: its field names, a BSON date.
    let d = client()
        .await
        .database(&db)
        .collection::<Document>("events")
        .find_one(doc! {"_id": one.id()})
        .await
        .expect("find")
        .expect("stored");
    for field in ["stream", "partition", "sequence", "timestamp", "key", "type", "metadata", "payload"] {
        assert!(d.contains_key(field), "{field} in {d}");
    }
    assert!(matches!(d.get("timestamp"), Some(mongodb::bson::Bson::DateTime(_))));
    let streams = rheo.list_streams().await.expect("list");
    assert_eq!(streams.len(), 2);
    let orders = streams.iter().find(|s| s.name == "orders").expect("orders");
    // 11 before, one from the batch with a stored id, one after.
    assert_eq!(orders.high_watermarks.iter().sum::<u64>(), 13);
}

#[tokio::test]
#[ignore = "needs a MongoDB-wire server: .ci/run starts one and runs these with RHEO_MONGO_URL set"]
async fn mongo_concurrent_appenders_never_share_or_skip_a_sequence() {
    let (rheo, _db, _drop) = open().await;
    rheo.create_stream("s", StreamOptions::new()).await.expect("create");
    let rheo = std::sync::Arc::new(rheo);
    let mut tasks = Vec::new();
    for t in 0..4 {
        let rheo = rheo.clone();
        tasks.push(tokio::spawn(async move {
            let mut seqs = Vec::new();
            for b in 0..5 {
                let items: Vec<_> = (0..5).map(|i| (json!({"t": t, "b": b, "i": i}), AppendOptions::new())).collect();
                for e in rheo.append_batch_with("s", items).await.expect("append") {
                    seqs.push(e.sequence());
                }
            }
            seqs
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    all.sort_unstable();
    assert_eq!(all, (1..=100).collect::<Vec<u64>>());
    let read = rheo.read("s", 0, 0, 1000).await.expect("read");
    assert_eq!(read.iter().map(|e| e.sequence()).collect::<Vec<_>>(), (1..=100).collect::<Vec<u64>>());
}

#[tokio::test]
#[ignore = "needs a MongoDB-wire server: .ci/run starts one and runs these with RHEO_MONGO_URL set"]
async fn mongo_errors_name_what_is_wrong() {
    let (rheo, _db, _drop) = open().await;
    let e = rheo.read("nope", 0, 0, 10).await.expect_err("no stream");
    assert!(matches!(e, Error::StreamNotFound { .. }), "{e}");
    rheo.create_stream("s", StreamOptions::new().partitions(2)).await.expect("create");
    let e = rheo.read("s", 5, 0, 10).await.expect_err("bad partition");
    assert!(matches!(e, Error::InvalidPartition { .. }), "{e}");
    let e = rheo.append("s", &json!({"n": u64::MAX}), AppendOptions::new()).await.expect_err("u64::MAX");
    assert!(matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("2^63"), "{e}");
    assert_eq!(rheo.read("s", 0, 0, 10).await.expect("read").len(), 0, "nothing written");
    let e = rheo.fetch("s", "g", FetchOptions::new()).await.expect_err("no group");
    assert!(matches!(e, Error::GroupNotFound { .. }), "{e}");
    let e = rheo.create_group("nope", "g", GroupOptions::new()).await.expect_err("no stream");
    assert!(matches!(e, Error::StreamNotFound { .. }), "{e}");
}

/// Groups and deliveries are stored as the reference stores them: the
/// field `group` (not `group_name`), status strings, maps keyed by decimal
/// partition, one lease id per delivery.
#[tokio::test]
#[ignore = "needs a MongoDB-wire server: .ci/run starts one and runs these with RHEO_MONGO_URL set"]
async fn mongo_groups_and_deliveries_have_the_reference_shape() {
    let (rheo, db, _drop) = open().await;
    rheo.create_stream("s", StreamOptions::new().partitions(2)).await.expect("create");
    rheo.create_group("s", "g", GroupOptions::new()).await.expect("group");
    for p in [0, 1, 1] {
        rheo.append("s", &json!({"p": p}), AppendOptions::new().partition(p)).await.expect("append");
    }
    let leases = rheo.fetch("s", "g", FetchOptions::new().limit(2)).await.expect("fetch");
    assert_eq!(leases.len(), 2);
    assert_ne!(leases[0].lease_id, leases[1].lease_id, "one lease id per delivery");
    rheo.ack(&leases[0]).await.expect("ack");
    let c = client().await;
    let d = c.database(&db);
    let g = d.collection::<Document>("groups").find_one(doc! {"stream": "s", "name": "g"}).await.expect("find");
    let g = g.expect("the group document");
    let frontiers = g.get_document("frontiers").expect("frontiers");
    assert_eq!((frontiers.get_i64("0"), frontiers.get_i64("1")), (Ok(1), Ok(0)), "{g}");
    assert!(g.get_document("cursors").is_ok_and(|c| c.contains_key("0") && c.contains_key("1")), "{g}");
    let dl = d.collection::<Document>("deliveries");
    let acked = dl.find_one(doc! {"group": "g", "partition": 0_i64, "sequence": 1_i64}).await.expect("find");
    let acked = acked.expect("the acked delivery");
    assert_eq!(acked.get_str("status"), Ok("acked"), "{acked}");
    assert!(acked.get("acked_at").is_some_and(|t| matches!(t, mongodb::bson::Bson::DateTime(_))), "{acked}");
    let leased = dl.find_one(doc! {"group": "g", "partition": 1_i64, "sequence": 1_i64}).await.expect("find");
    let leased = leased.expect("the leased delivery");
    assert_eq!(leased.get_str("status"), Ok("leased"));
    assert_eq!(leased.get_str("lease_id"), Ok(leases[1].lease_id.to_string().as_str()));
    assert_eq!(leased.get_i64("attempt"), Ok(1));
    assert!(dl.find_one(doc! {"group_name": "g"}).await.expect("find").is_none(), "no group_name field");
}

/// Needs no server: an unreachable one is `BackendUnavailable` within the
/// connect timeout, and bad options are refused before anything is tried.
#[tokio::test]
async fn mongo_unreachable_server_and_bad_urls_get_clear_errors() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let url = format!("mongodb://app:s3cret@127.0.0.1:{port}/db?directConnection=true&rheo_connect_timeout_ms=300");
    let t = Instant::now();
    let e = Rheo::open(&url).await.expect_err("nothing listens there");
    assert!(matches!(e, Error::BackendUnavailable { .. }), "{e}");
    assert!(t.elapsed() < Duration::from_secs(10), "gave up after {:?}", t.elapsed());
    assert!(!e.to_string().contains("s3cret"), "the password is never printed: {e}");
    for (url, says) in [
        ("mongodb://127.0.0.1/db?rheo_pool=0", "from 1 to 256"),
        ("mongodb://127.0.0.1/db?rheo_colour=red", "unknown mongo option"),
        ("mongodb://127.0.0.1/a.b", "database name"),
        ("mongodb://", "url"),
    ] {
        let e = Rheo::open(url).await.expect_err(url);
        assert!(matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains(says), "{url}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a worker process of the scale-out cases (run by them)"]
async fn mongo_worker_process() {
    scale::worker_process("mongo_worker_process").await;
}

/// Competing consumers in 1 and then 2 OS processes on one group share 400
/// events: each handled once, never held by two at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a MongoDB-wire server: .ci/run starts one and runs these with RHEO_MONGO_URL set"]
async fn mongo_processes_share_a_group_and_never_double_lease() {
    let (url, db) = fresh_url();
    let _drop = Drop_(db);
    scale::processes_share_a_group(&url, "mongo_worker_process", 400, &[1, 2]).await;
}

/// A consumer process SIGKILLed mid-batch: its leases come back after
/// expiry, its acks never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a MongoDB-wire server: .ci/run starts one and runs these with RHEO_MONGO_URL set"]
async fn mongo_consumer_killed_mid_batch_is_redelivered_but_not_what_it_acked() {
    let (url, db) = fresh_url();
    let _drop = Drop_(db);
    scale::killed_mid_batch(&url, "mongo_worker_process").await;
}

/// An append through one handle wakes a subscriber of another (the change
/// stream), long before the wait's timeout; a wait with nothing appended
/// times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a MongoDB-wire server: .ci/run starts one and runs these with RHEO_MONGO_URL set"]
async fn mongo_appends_wake_subscribers_of_other_handles() {
    let (writer, db, _drop) = open().await;
    writer.create_stream("s", StreamOptions::new()).await.expect("create");
    let reader = Rheo::open(&url_for(&db)).await.expect("a second handle");
    let mut sub = reader.subscribe("s").await.expect("subscribe");
    assert!(sub.wakes(), "the backend has wakeups");
    // The change stream opens in the background: appends until one is seen.
    let t = Instant::now();
    let mut woke = false;
    for i in 0..20 {
        writer.append("s", &json!({"i": i}), AppendOptions::new()).await.expect("append");
        if sub.wait(Duration::from_secs(3)).await {
            woke = true;
            break;
        }
    }
    assert!(woke, "an append by another handle woke the subscriber ({:?})", t.elapsed());
    while sub.wait(Duration::from_millis(300)).await {}
    assert!(!sub.wait(Duration::from_millis(300)).await, "nothing appended: the wait times out");
    writer.append("s", &json!({"last": true}), AppendOptions::new()).await.expect("append");
    assert!(sub.wait(Duration::from_secs(30)).await, "woken again");
}

/// A sequence the reference counted but has not stored yet (it allocates,
/// then inserts, in two writes) is never taken for settled: the group
/// waits for it, delivers it once stored, and a gap that never fills is
/// passed with `skip`.
#[tokio::test]
#[ignore = "needs a MongoDB-wire server: .ci/run starts one and runs these with RHEO_MONGO_URL set"]
async fn mongo_a_counted_but_unstored_sequence_holds_the_group_until_stored_or_skipped() {
    let (rheo, db, _drop) = open().await;
    rheo.create_stream("s", StreamOptions::new()).await.expect("create");
    rheo.create_group("s", "g", GroupOptions::new()).await.expect("group");
    rheo.append("s", &json!({"n": 1}), AppendOptions::new()).await.expect("append 1");
    let c = client().await;
    let d = c.database(&db);
    // The reference's first write for sequences 2 and 3: the counter only.
    d.collection::<Document>("streams")
        .update_one(doc! {"name": "s"}, doc! {"$inc": {"next_sequences.0": 2_i32}})
        .await
        .expect("bump");
    let got = rheo.fetch("s", "g", FetchOptions::new().limit(10)).await.expect("fetch");
    assert_eq!(got.iter().map(|l| l.sequence()).collect::<Vec<_>>(), [1]);
    rheo.ack(&got[0]).await.expect("ack");
    assert_eq!(rheo.lag("s", "g").await.expect("lag").total, 2, "2 and 3 are not settled");
    // Its second write lands for 2 (as the reference writes it: int32).
    let event = |seq: i32| {
        doc! {"_id": format!("ref-{seq}"), "stream": "s", "partition": 0_i32, "sequence": seq,
        "timestamp": mongodb::bson::DateTime::now(), "key": null, "type": null, "metadata": {}, "payload": {"n": seq}}
    };
    d.collection::<Document>("events").insert_one(event(2)).await.expect("insert 2");
    let got = rheo.fetch("s", "g", FetchOptions::new().limit(10)).await.expect("fetch");
    assert_eq!(got.iter().map(|l| l.sequence()).collect::<Vec<_>>(), [2], "delivered once stored");
    rheo.ack(&got[0]).await.expect("ack");
    assert_eq!(rheo.lag("s", "g").await.expect("lag").total, 1);
    // 3 never comes: an operator skips it, and the group moves on.
    assert!(rheo.skip("s", "g", 0, 3, "lost by the producer").await.expect("skip"));
    assert_eq!(rheo.lag("s", "g").await.expect("lag").total, 0);
    rheo.append("s", &json!({"n": 4}), AppendOptions::new()).await.expect("append 4");
    let got = rheo.fetch("s", "g", FetchOptions::new().limit(10)).await.expect("fetch");
    assert_eq!(got.iter().map(|l| l.sequence()).collect::<Vec<_>>(), [4]);
    let dead = rheo.dead_letters("s", "g", rheo::DeadLetterOptions::default()).await.expect("dead letters");
    assert_eq!((dead.len(), dead[0].sequence, dead[0].event.is_none()), (1, 3, true), "{dead:?}");
}

#[tokio::test]
#[ignore = "needs a MongoDB-wire server: .ci/run starts one and runs these with RHEO_MONGO_URL set"]
async fn mongo_settles_on_a_group_deleted_by_hand_say_the_group_is_gone() {
    let (rheo, db, _drop) = open().await;
    rheo.create_stream("s", StreamOptions::new().partitions(2)).await.expect("create");
    rheo.create_group("s", "g", GroupOptions::new()).await.expect("group");
    for p in [0, 1, 0, 1] {
        rheo.append("s", &json!({"p": p}), AppendOptions::new().partition(p)).await.expect("append");
    }
    let leases = rheo.fetch("s", "g", FetchOptions::new().limit(4)).await.expect("fetch");
    assert_eq!(leases.len(), 4);
    let d = client().await.database(&db);
    d.collection::<Document>("groups").delete_many(doc! {"stream": "s", "name": "g"}).await.expect("delete");
    d.collection::<Document>("deliveries").delete_many(doc! {"stream": "s", "group": "g"}).await.expect("delete");
    for r in rheo.ack_many(&leases[..2]).await.expect("the call answers per lease") {
        assert!(matches!(r, Err(Error::GroupNotFound { .. })), "{r:?}");
    }
    for r in rheo.renew_many(&leases[2..], Duration::from_secs(30)).await.expect("per lease") {
        assert!(matches!(r, Err(Error::GroupNotFound { .. })), "{r:?}");
    }
    let e = rheo.reject(&leases[3], "bad").await.expect_err("the group is gone");
    assert!(matches!(e, Error::GroupNotFound { .. }), "{e:?}");
}
