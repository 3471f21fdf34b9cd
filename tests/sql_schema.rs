//! The SQL backends share the reference implementation's schema: the
//! tables, columns, types, keys and index names this crate creates are the
//! reference's (written out here from its migration, not from this crate's
//! code), on SQLite and PostgreSQL; a database the reference created is
//! used as it is; `rheo_*` tables of another shape are refused by name and
//! never written to; bad URLs and unusable databases get clear errors.
//!
//! SQLite cases run under `cargo test`; PostgreSQL cases are ignored unless
//! asked for (`.ci/run` starts a server and runs them).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use rheo::{Error, FetchOptions, GroupOptions, Rheo, StreamOptions};
use serde_json::json;

/// The reference's tables: (table, [(column, postgres type, sqlite type, not null)]).
type Expected = Vec<(&'static str, Vec<(&'static str, &'static str, &'static str, bool)>)>;

fn reference_tables() -> Expected {
    let (text, int, big, js, ts) = (
        ("text", "text"),
        ("integer", "integer"),
        ("bigint", "integer"),
        ("jsonb", "text"),
        ("timestamp with time zone", "text"),
    );
    let c = |name: &'static str, (pg, lite): (&'static str, &'static str), nn: bool| (name, pg, lite, nn);
    vec![
        ("rheo_streams", vec![c("name", text, true), c("partition_count", int, true), c("created_at", ts, true)]),
        (
            "rheo_stream_sequences",
            vec![c("stream", text, true), c("partition", int, true), c("next_sequence", big, true)],
        ),
        (
            "rheo_events",
            vec![
                c("id", text, true),
                c("stream", text, true),
                c("partition", int, true),
                c("sequence", big, true),
                c("timestamp", ts, true),
                c("key", text, false),
                c("type", text, false),
                c("metadata", js, true),
                c("payload", js, true),
            ],
        ),
        (
            "rheo_groups",
            vec![
                c("stream", text, true),
                c("name", text, true),
                c("cursors", js, true),
                c("frontiers", js, true),
                c("max_attempts", int, true),
                c("created_at", ts, true),
            ],
        ),
        (
            "rheo_deliveries",
            vec![
                c("stream", text, true),
                c("group_name", text, true),
                c("event_id", text, true),
                c("partition", int, true),
                c("sequence", big, true),
                c("status", text, true),
                c("attempt", int, true),
                c("lease_id", text, false),
                c("consumer_id", text, false),
                c("reason", text, false),
                c("leased_at", ts, false),
                c("expires_at", ts, false),
                c("renewed_at", ts, false),
                c("acked_at", ts, false),
                c("retried_at", ts, false),
                c("dead_lettered_at", ts, false),
                c("created_at", ts, true),
            ],
        ),
    ]
}

/// The reference's primary keys.
fn reference_keys() -> BTreeMap<&'static str, Vec<&'static str>> {
    BTreeMap::from([
        ("rheo_streams", vec!["name"]),
        ("rheo_stream_sequences", vec!["stream", "partition"]),
        ("rheo_events", vec!["id"]),
        ("rheo_groups", vec!["stream", "name"]),
        ("rheo_deliveries", vec!["stream", "group_name", "event_id"]),
    ])
}

/// The reference's indexes: name -> (table, columns, unique).
fn reference_indexes() -> BTreeMap<&'static str, (&'static str, Vec<&'static str>, bool)> {
    BTreeMap::from([
        ("rheo_events_stream_partition_sequence", ("rheo_events", vec!["stream", "partition", "sequence"], true)),
        ("rheo_events_stream_timestamp", ("rheo_events", vec!["stream", "timestamp"], false)),
        ("rheo_events_stream_type", ("rheo_events", vec!["stream", "type"], false)),
        ("rheo_events_stream_key", ("rheo_events", vec!["stream", "key"], false)),
        ("rheo_deliveries_claim", ("rheo_deliveries", vec!["stream", "group_name", "status", "expires_at"], false)),
        ("rheo_deliveries_frontier", ("rheo_deliveries", vec!["stream", "group_name", "partition", "sequence"], false)),
    ])
}

/// The reference's DDL for one dialect, as its migration renders it.
fn reference_ddl(pg: bool, schema: Option<&str>) -> Vec<String> {
    let t = |name: &str| match schema {
        Some(s) => format!("\"{s}\".{name}"),
        None => name.to_owned(),
    };
    let (json, ts, big) = if pg { ("JSONB", "TIMESTAMPTZ", "BIGINT") } else { ("TEXT", "TEXT", "INTEGER") };
    let mut out = Vec::new();
    if let Some(s) = schema {
        out.push(format!("CREATE SCHEMA IF NOT EXISTS \"{s}\""));
    }
    out.extend([
        format!("CREATE TABLE IF NOT EXISTS {} (name TEXT NOT NULL, partition_count INTEGER NOT NULL DEFAULT 1, created_at {ts} NOT NULL, PRIMARY KEY (name))", t("rheo_streams")),
        format!("CREATE TABLE IF NOT EXISTS {} (stream TEXT NOT NULL, partition INTEGER NOT NULL, next_sequence {big} NOT NULL DEFAULT 0, PRIMARY KEY (stream, partition))", t("rheo_stream_sequences")),
        format!("CREATE TABLE IF NOT EXISTS {} (id TEXT NOT NULL, stream TEXT NOT NULL, partition INTEGER NOT NULL DEFAULT 0, sequence {big} NOT NULL, \"timestamp\" {ts} NOT NULL, \"key\" TEXT, \"type\" TEXT, metadata {json} NOT NULL, payload {json} NOT NULL, PRIMARY KEY (id))", t("rheo_events")),
        format!("CREATE TABLE IF NOT EXISTS {} (stream TEXT NOT NULL, name TEXT NOT NULL, cursors {json} NOT NULL, frontiers {json} NOT NULL, max_attempts INTEGER NOT NULL DEFAULT 5, created_at {ts} NOT NULL, PRIMARY KEY (stream, name))", t("rheo_groups")),
        format!("CREATE TABLE IF NOT EXISTS {} (stream TEXT NOT NULL, group_name TEXT NOT NULL, event_id TEXT NOT NULL, partition INTEGER NOT NULL DEFAULT 0, sequence {big} NOT NULL, status TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 0, lease_id TEXT, consumer_id TEXT, reason TEXT, leased_at {ts}, expires_at {ts}, renewed_at {ts}, acked_at {ts}, retried_at {ts}, dead_lettered_at {ts}, created_at {ts} NOT NULL, PRIMARY KEY (stream, group_name, event_id))", t("rheo_deliveries")),
    ]);
    for (name, (table, cols, unique)) in reference_indexes() {
        let cols: Vec<String> = cols
            .iter()
            .map(|c| if ["timestamp", "key", "type"].contains(c) { format!("\"{c}\"") } else { (*c).to_owned() })
            .collect();
        out.push(format!(
            "CREATE {}INDEX IF NOT EXISTS {name} ON {} ({})",
            if unique { "UNIQUE " } else { "" },
            t(table),
            cols.join(", ")
        ));
    }
    out
}

// ---------------------------------------------------------------------------
// Reading a database's catalog (through sqlx directly: the test's own eyes)
// ---------------------------------------------------------------------------

/// (columns, primary key, indexes) of one table as the database reports them.
#[derive(Debug, PartialEq)]
struct Shape {
    columns: Vec<(String, String, bool)>,
    key: Vec<String>,
    indexes: BTreeMap<String, (Vec<String>, bool)>,
}

async fn sqlite_shape(pool: &sqlx::SqlitePool, table: &str) -> Shape {
    use sqlx::Row;
    let cols = sqlx::query("SELECT name, lower(type), \"notnull\", pk FROM pragma_table_info(?1) ORDER BY cid")
        .bind(table)
        .fetch_all(pool)
        .await
        .expect("table info");
    let mut key: Vec<(i64, String)> = Vec::new();
    let columns = cols
        .iter()
        .map(|r| {
            let name: String = r.get(0);
            let pk: i64 = r.get(3);
            if pk > 0 {
                key.push((pk, name.clone()));
            }
            (name, r.get::<String, _>(1), r.get::<i64, _>(2) == 1)
        })
        .collect();
    key.sort();
    let mut indexes = BTreeMap::new();
    let list = sqlx::query("SELECT name, \"unique\", origin FROM pragma_index_list(?1)")
        .bind(table)
        .fetch_all(pool)
        .await
        .expect("index list");
    for r in list {
        let (name, unique, origin): (String, i64, String) = (r.get(0), r.get(1), r.get(2));
        if origin == "pk" {
            continue;
        }
        let cols = sqlx::query("SELECT name FROM pragma_index_info(?1) ORDER BY seqno")
            .bind(&name)
            .fetch_all(pool)
            .await
            .expect("index info");
        indexes.insert(name, (cols.iter().map(|c| c.get::<String, _>(0)).collect(), unique == 1));
    }
    Shape { columns, key: key.into_iter().map(|k| k.1).collect(), indexes }
}

async fn pg_shape(pool: &sqlx::PgPool, schema: &str, table: &str) -> Shape {
    use sqlx::Row;
    let cols = sqlx::query(
        "SELECT column_name::text, data_type::text, is_nullable = 'NO' FROM information_schema.columns \
         WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position",
    )
    .bind(schema)
    .bind(table)
    .fetch_all(pool)
    .await
    .expect("columns");
    let columns = cols.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
    let idx = sqlx::query(
        "SELECT i.relname::text, ix.indisunique, ix.indisprimary, \
         array(SELECT a.attname::text FROM unnest(ix.indkey) WITH ORDINALITY k(n, o) \
               JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.n ORDER BY k.o) \
         FROM pg_index ix JOIN pg_class t ON t.oid = ix.indrelid JOIN pg_class i ON i.oid = ix.indexrelid \
         JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname = $1 AND t.relname = $2",
    )
    .bind(schema)
    .bind(table)
    .fetch_all(pool)
    .await
    .expect("indexes");
    let mut key = Vec::new();
    let mut indexes = BTreeMap::new();
    for r in idx {
        let (name, unique, primary, cols): (String, bool, bool, Vec<String>) = (r.get(0), r.get(1), r.get(2), r.get(3));
        if primary {
            key = cols;
        } else {
            indexes.insert(name, (cols, unique));
        }
    }
    Shape { columns, key, indexes }
}

fn expected_shape(pg: bool, table: &str) -> Shape {
    let cols = reference_tables().into_iter().find(|(t, _)| *t == table).expect("a reference table").1;
    Shape {
        columns: cols
            .into_iter()
            .map(|(c, pgt, lite, nn)| (c.to_owned(), if pg { pgt } else { lite }.to_owned(), nn))
            .collect(),
        key: reference_keys()[table].iter().map(|s| (*s).to_owned()).collect(),
        indexes: reference_indexes()
            .into_iter()
            .filter(|(_, (t, _, _))| *t == table)
            .map(|(n, (_, cols, u))| (n.to_owned(), (cols.iter().map(|c| (*c).to_owned()).collect(), u)))
            .collect(),
    }
}

async fn sqlite_pool(path: &std::path::Path) -> sqlx::SqlitePool {
    let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(path).create_if_missing(true);
    sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect_with(opts).await.expect("sqlite opens")
}

/// Polls `read` (a JSON column as text) until it reads `want`, for at
/// most 5 s: the frontier is written by a flush after the acks (ADR 0021).
async fn eventually_json<F, Fut>(what: &str, want: serde_json::Value, read: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = String>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let got: serde_json::Value = serde_json::from_str(&read().await).expect("json");
        if got == want {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: {got} never became {want}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Works a backend a little: a stream, a group, an event through a claim
/// and an ack, so that every shared table holds a row.
async fn exercise(rheo: &Rheo) {
    rheo.create_stream("orders", StreamOptions::new().partitions(2)).await.expect("stream");
    rheo.create_group("orders", "billing", GroupOptions::new()).await.expect("group");
    rheo.append("orders", &json!({"type": "placed", "total": 5}), rheo::AppendOptions::new().key("k1"))
        .await
        .expect("append");
    let leases = rheo.fetch("orders", "billing", FetchOptions::new()).await.expect("fetch");
    assert_eq!(leases.len(), 1);
    rheo.ack(&leases[0]).await.expect("ack");
    assert_eq!(rheo.lag("orders", "billing").await.expect("lag").total, 0);
}

// ---------------------------------------------------------------------------
// SQLite
// ---------------------------------------------------------------------------

#[tokio::test]
async fn sqlite_creates_exactly_the_reference_tables_and_indexes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("rheo.db");
    let rheo = Rheo::open(&format!("sqlite:{}", path.display())).await.expect("open");
    exercise(&rheo).await;
    // Opening again is idempotent.
    drop(rheo);
    let rheo = Rheo::open(&format!("sqlite:{}", path.display())).await.expect("reopen");
    assert_eq!(rheo.list_streams().await.expect("list").len(), 1);
    let pool = sqlite_pool(&path).await;
    for (table, _) in reference_tables() {
        assert_eq!(sqlite_shape(&pool, table).await, expected_shape(false, table), "{table}");
    }
    // The rows the reference reads are in its shapes: the frontier (once
    // flushed) and the cursor keyed by decimal partition.
    use sqlx::Row;
    eventually_json("frontiers", json!({"0": 1, "1": 0}), || async {
        let g = sqlx::query("SELECT frontiers FROM rheo_groups").fetch_one(&pool).await.expect("group");
        g.get::<String, _>(0)
    })
    .await;
    let g = sqlx::query("SELECT cursors FROM rheo_groups").fetch_one(&pool).await.expect("group");
    let cursors: serde_json::Value = serde_json::from_str(&g.get::<String, _>(0)).expect("json");
    assert_eq!(cursors, json!({"0": 2, "1": 1}), "the claimed event is behind the cursor");
    // A claimed range and its ack need no delivery row; the flush deleted
    // the settled claim.
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM rheo_deliveries").fetch_one(&pool).await.expect("n");
    assert_eq!(rows, 0, "ranges write no delivery row");
    let claims: i64 = sqlx::query_scalar("SELECT count(*) FROM rheo_rs_claims").fetch_one(&pool).await.expect("n");
    assert_eq!(claims, 0, "a settled claim is deleted by the flush");
    // With rheo_claims=rows a delivery is a row in the reference's shape.
    drop(rheo);
    let rows_url = format!("sqlite:{}?rheo_claims=rows", path.display());
    let rheo = Rheo::open(&rows_url).await.expect("open in rows mode");
    rheo.create_group("orders", "audit", GroupOptions::new()).await.expect("group");
    let leases = rheo.fetch("orders", "audit", FetchOptions::new()).await.expect("fetch");
    assert_eq!(leases.len(), 1);
    rheo.ack(&leases[0]).await.expect("ack");
    let d = sqlx::query("SELECT status, acked_at, created_at FROM rheo_deliveries WHERE group_name = 'audit'")
        .fetch_one(&pool)
        .await
        .expect("row");
    assert_eq!(d.get::<String, _>(0), "acked");
    for col in [1, 2] {
        let t: String = d.get(col);
        assert_eq!(t.len(), 27, "{t}: the reference's fixed-width text");
        assert!(t.ends_with("000Z") && t.as_bytes()[10] == b'T', "{t}");
    }
    let e = sqlx::query("SELECT \"key\", \"type\", payload, metadata FROM rheo_events")
        .fetch_one(&pool)
        .await
        .expect("event");
    assert_eq!((e.get::<String, _>(0), e.get::<String, _>(1)), ("k1".to_owned(), "placed".to_owned()));
    let payload: serde_json::Value = serde_json::from_str(&e.get::<String, _>(2)).expect("json payload");
    assert_eq!(payload, json!({"type": "placed", "total": 5}));
}

/// Scheduled delivery on SQLite (ADR 0036, amendment): a database of
/// schema version 2 gets `rheo_rs_scheduled` at open and is raised to 3
/// (a newer one is refused); a scheduled append writes its row there; a
/// fetch that meets the event early parks it as a delivery row in the
/// reference's retry shape (leased, no lease id, attempt 0, expiring at the
/// time); retention deletes the schedule with the events.
#[tokio::test]
async fn sqlite_scheduled_delivery_rows_and_the_schema_upgrade() {
    use sqlx::Row;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("rheo.db");
    let url = format!("sqlite:{}?rheo_retention_interval_ms=0", path.display());
    let rheo = Rheo::open(&url).await.expect("open");
    exercise(&rheo).await;
    drop(rheo);
    // As a build of version 2 left it.
    let pool = sqlite_pool(&path).await;
    sqlx::query("DROP TABLE rheo_rs_scheduled").execute(&pool).await.expect("drop");
    sqlx::query("UPDATE rheo_rs_meta SET value = '2' WHERE \"key\" = 'schema_version'")
        .execute(&pool)
        .await
        .expect("version 2");
    let rheo = Rheo::open(&url).await.expect("a version 2 database opens");
    let version: String = sqlx::query_scalar("SELECT value FROM rheo_rs_meta WHERE \"key\" = 'schema_version'")
        .fetch_one(&pool)
        .await
        .expect("version");
    assert_eq!(version, "3", "raised once its table exists");
    assert!(rheo.capabilities().scheduled_delivery);

    let at = rheo::Timestamp::now().saturating_add(Duration::from_secs(3600));
    let opts = rheo::AppendOptions::new().partition(0).deliver_at(at);
    let e = rheo.append("orders", &json!({"type": "remind"}), opts).await.expect("scheduled append");
    let sched = sqlx::query("SELECT partition, sequence, deliver_at FROM rheo_rs_scheduled")
        .fetch_all(&pool)
        .await
        .expect("schedule");
    assert_eq!(sched.len(), 1);
    assert_eq!((sched[0].get::<i64, _>(0), sched[0].get::<i64, _>(1)), (0, i64::try_from(e.sequence()).expect("seq")));
    let report = rheo.fetch_report("orders", "billing", FetchOptions::new()).await.expect("fetch");
    assert_eq!((report.leases.len(), report.scheduled), (0, 1));
    let d = sqlx::query(
        "SELECT status, lease_id, attempt, expires_at FROM rheo_deliveries WHERE group_name = 'billing' AND sequence = ?",
    )
    .bind(i64::try_from(e.sequence()).expect("seq"))
    .fetch_one(&pool)
    .await
    .expect("parked row");
    assert_eq!(d.get::<String, _>(0), "leased");
    assert_eq!(d.get::<Option<String>, _>(1), None, "no holder");
    assert_eq!(d.get::<i64, _>(2), 0, "no attempt used");
    assert_eq!(d.get::<String, _>(3), sched[0].get::<String, _>(2), "waits until the event's time");
    let info = rheo.group_info("orders", "billing").await.expect("info");
    assert_eq!((info.scheduled, info.next_due, info.retry_waiting), (1, Some(at), 0));

    // Retention drops the events, and their schedule with them.
    let plain = rheo::AppendOptions::new().partition(0);
    rheo.append("orders", &json!({"type": "later"}), plain).await.expect("append");
    rheo.set_retention("orders", rheo::Retention::new().max_events(1)).await.expect("retention");
    rheo.enforce_retention("orders").await.expect("pass");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM rheo_rs_scheduled").fetch_one(&pool).await.expect("n");
    assert_eq!(left, 0, "the schedule goes with its events");
    drop(rheo);

    sqlx::query("UPDATE rheo_rs_meta SET value = '4' WHERE \"key\" = 'schema_version'")
        .execute(&pool)
        .await
        .expect("version 4");
    match Rheo::open(&url).await {
        Err(rheo::Error::UnsupportedVersion { found: 4, supported: 3, .. }) => {}
        other => panic!("a newer schema must be refused: {other:?}"),
    }
}

#[tokio::test]
async fn sqlite_uses_a_database_the_reference_created() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("elixir.db");
    let pool = sqlite_pool(&path).await;
    for sql in reference_ddl(false, None) {
        sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&pool).await.expect("reference DDL");
    }
    // A stream and a group as the reference writes them: frontier 0 for a
    // group that starts after sequence 1 (its known defect).
    for sql in [
        "INSERT INTO rheo_streams VALUES ('orders', 1, '2026-01-15T12:00:00.000000Z')",
        "INSERT INTO rheo_stream_sequences VALUES ('orders', 0, 1)",
        "INSERT INTO rheo_events VALUES ('ev-1', 'orders', 0, 1, '2026-01-15T12:00:00.123456Z', NULL, 'placed', '{}', '{\"type\":\"placed\"}')",
        "INSERT INTO rheo_groups VALUES ('orders', 'billing', '{\"0\":2}', '{\"0\":0}', 5, '2026-01-15T12:00:00.000000Z')",
    ] {
        sqlx::query(sql).execute(&pool).await.expect("reference rows");
    }
    drop(pool);
    let rheo = Rheo::open(&format!("sqlite:{}", path.display())).await.expect("open on the reference's tables");
    let events = rheo.read("orders", 0, 0, 10).await.expect("read");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].timestamp().as_millis() % 1000, 123, "microseconds truncate to milliseconds");
    rheo.append("orders", &json!({"type": "paid"}), rheo::AppendOptions::new()).await.expect("append");
    let leases = rheo.fetch("orders", "billing", FetchOptions::new()).await.expect("fetch");
    assert_eq!(leases.iter().map(|l| l.sequence()).collect::<Vec<_>>(), vec![2]);
    rheo.ack(&leases[0]).await.expect("ack");
    let lag = rheo.lag("orders", "billing").await.expect("lag");
    assert_eq!((lag.partitions[0].frontier, lag.total), (2, 0), "a frontier left at 0 by the reference is repaired");
}

#[tokio::test]
async fn sqlite_refuses_tables_of_another_shape_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("other.db");
    let pool = sqlite_pool(&path).await;
    sqlx::query("CREATE TABLE rheo_events (id TEXT PRIMARY KEY, stream TEXT, body BLOB)")
        .execute(&pool)
        .await
        .expect("other");
    drop(pool);
    let err = Rheo::open(&format!("sqlite:{}", path.display())).await.expect_err("another shape");
    let msg = err.to_string();
    assert!(msg.contains("rheo_events") && msg.contains("\"partition\""), "{msg}");
    let pool = sqlite_pool(&path).await;
    use sqlx::Row;
    let tables: Vec<String> = sqlx::query("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .fetch_all(&pool)
        .await
        .expect("tables")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(tables, vec!["rheo_events".to_owned()], "nothing was created");
}

/// A flush that fails inside its transaction (here: another writer set the
/// counter row back, so the sequences collide) changes nothing, answers
/// every call in it with an error, and leaves the connection usable: the
/// next append, once the counter is right, goes through. A quote in the
/// stream name and the payload travels intact (the flush writes literals).
#[tokio::test]
async fn sqlite_failed_flush_rolls_back_and_the_next_one_works() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("rheo.db");
    let rheo = Rheo::open(&format!("sqlite:{}", path.display())).await.expect("open");
    let s = "it's";
    rheo.create_stream(s, StreamOptions::new()).await.expect("stream");
    for i in 0..3 {
        rheo.append(s, &json!({"n": i, "note": "o'clock"}), rheo::AppendOptions::new()).await.expect("append");
    }
    let pool = sqlite_pool(&path).await;
    sqlx::query("UPDATE rheo_stream_sequences SET next_sequence = 1").execute(&pool).await.expect("rewind");
    let err = rheo.append(s, &json!({"n": 3}), rheo::AppendOptions::new()).await.expect_err("sequence 2 is taken");
    assert!(!err.is_transient(), "a unique violation is definite: {err}");
    let (counter, events): (i64, i64) =
        sqlx::query_as("SELECT (SELECT next_sequence FROM rheo_stream_sequences), (SELECT count(*) FROM rheo_events)")
            .fetch_one(&pool)
            .await
            .expect("state");
    assert_eq!((counter, events), (1, 3), "the failed flush wrote nothing");
    sqlx::query("UPDATE rheo_stream_sequences SET next_sequence = 3").execute(&pool).await.expect("repair");
    let p = rheo.append(s, &json!({"n": 3}), rheo::AppendOptions::new()).await.expect("append after the failure");
    assert_eq!(p.sequence(), 4);
    let events = rheo.read(s, 0, 0, 10).await.expect("read");
    assert_eq!(events.len(), 4);
    assert_eq!(events[0].payload().json().expect("payload")["note"], json!("o'clock"));
}

#[tokio::test]
async fn sqlite_bad_urls_and_files_get_clear_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let not_db = dir.path().join("notes.txt");
    let text = b"these are notes, not a database at all.\n".repeat(100);
    std::fs::write(&not_db, &text).expect("write");
    let err = Rheo::open(&format!("sqlite:{}", not_db.display())).await.expect_err("not a database");
    assert!(err.to_string().contains("not a database"), "{err}");
    assert_eq!(std::fs::read(&not_db).expect("read"), text, "the file is untouched");
    let err = Rheo::open(&format!("sqlite:{}/missing/dir/x.db", dir.path().display())).await.expect_err("missing dir");
    assert!(matches!(err, Error::InvalidArgument { .. }) && err.to_string().contains("does not exist"), "{err}");
    for (url, says) in [
        ("sqlite:", "expected sqlite:PATH"),
        ("sqlite:x.db?synchronous=sometimes", "synchronous"),
        ("sqlite:x.db?rheo_schema=a", "rheo_schema"),
    ] {
        let err = Rheo::open(url).await.expect_err(url);
        assert!(matches!(err, Error::InvalidArgument { .. }) && err.to_string().contains(says), "{url}: {err}");
    }
    // A read-only database file: reads work, writes fail clearly and change nothing.
    let ro = dir.path().join("ro.db");
    {
        let rheo = Rheo::open(&format!("sqlite:{}", ro.display())).await.expect("open");
        rheo.create_stream("s", StreamOptions::new()).await.expect("stream");
    }
    let mut perms = std::fs::metadata(&ro).expect("meta").permissions();
    perms.set_readonly(true);
    std::fs::set_permissions(&ro, perms).expect("chmod");
    if nix_is_root() {
        // root writes through file permissions: nothing to check here.
        return;
    }
    let rheo = Rheo::open(&format!("sqlite:{}", ro.display())).await;
    if let Ok(rheo) = rheo {
        let err = rheo.create_stream("t", StreamOptions::new()).await.expect_err("read-only");
        assert!(err.to_string().to_lowercase().contains("readonly") || err.to_string().contains("read-only"), "{err}");
    }
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

// ---------------------------------------------------------------------------
// PostgreSQL (ignored unless asked for)
// ---------------------------------------------------------------------------

const NEEDS_POSTGRES: &str = "needs PostgreSQL";

async fn pg_admin() -> sqlx::PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&common::postgres_url())
        .await
        .expect("connect to RHEO_POSTGRES_URL")
}

fn pg_url_with(schema: &str) -> String {
    let base = common::postgres_url();
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}rheo_schema={schema}")
}

fn fresh_schema() -> String {
    format!("s_{}", uuid::Uuid::new_v4().simple())
}

#[tokio::test]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs these with RHEO_POSTGRES_URL set"]
async fn postgres_creates_exactly_the_reference_tables_and_indexes() {
    let _ = NEEDS_POSTGRES;
    let schema = fresh_schema();
    let rheo = Rheo::open(&pg_url_with(&schema)).await.expect("open");
    exercise(&rheo).await;
    drop(rheo);
    let rheo = Rheo::open(&pg_url_with(&schema)).await.expect("reopen (idempotent)");
    assert_eq!(rheo.list_streams().await.expect("list").len(), 1);
    let pool = pg_admin().await;
    for (table, _) in reference_tables() {
        assert_eq!(pg_shape(&pool, &schema, table).await, expected_shape(true, table), "{table}");
    }
    use sqlx::Row;
    eventually_json("frontiers", json!({"0": 1, "1": 0}), || async {
        let g = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT frontiers::text FROM \"{schema}\".rheo_groups")))
            .fetch_one(&pool)
            .await
            .expect("group");
        g.get::<String, _>(0)
    })
    .await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs these with RHEO_POSTGRES_URL set"]
async fn postgres_uses_a_database_the_reference_created() {
    let schema = fresh_schema();
    let pool = pg_admin().await;
    for sql in reference_ddl(true, Some(&schema)) {
        sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&pool).await.expect("reference DDL");
    }
    let t = |n: &str| format!("\"{schema}\".{n}");
    for sql in [
        format!("INSERT INTO {} VALUES ('orders', 1, now())", t("rheo_streams")),
        format!("INSERT INTO {} VALUES ('orders', 0, 1)", t("rheo_stream_sequences")),
        format!(
            "INSERT INTO {} VALUES ('ev-1', 'orders', 0, 1, '2026-01-15T12:00:00.123456Z', NULL, 'placed', '{{}}', '{{\"type\":\"placed\"}}')",
            t("rheo_events")
        ),
        format!(
            "INSERT INTO {} VALUES ('orders', 'billing', '{{\"0\":2}}', '{{\"0\":0}}', 5, now())",
            t("rheo_groups")
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&pool).await.expect("reference rows");
    }
    let rheo = Rheo::open(&pg_url_with(&schema)).await.expect("open on the reference's tables");
    let events = rheo.read("orders", 0, 0, 10).await.expect("read");
    assert_eq!(events[0].timestamp().as_millis() % 1000, 123);
    rheo.append("orders", &json!({"type": "paid"}), rheo::AppendOptions::new()).await.expect("append");
    let leases = rheo.fetch("orders", "billing", FetchOptions::new()).await.expect("fetch");
    assert_eq!(leases.iter().map(|l| l.sequence()).collect::<Vec<_>>(), vec![2]);
    rheo.ack(&leases[0]).await.expect("ack");
    assert_eq!(rheo.lag("orders", "billing").await.expect("lag").total, 0, "the frontier left at 0 is repaired");
    // The cursor is past the claimed event, so an Elixir fetch of the
    // same group materializes nothing; the frontier it reads is flushed.
    use sqlx::Row;
    let g = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT cursors::text FROM {}", t("rheo_groups"))))
        .fetch_one(&pool)
        .await
        .expect("group");
    let cursors: serde_json::Value = serde_json::from_str(&g.get::<String, _>(0)).expect("json");
    assert_eq!(cursors, json!({"0": 3}));
    eventually_json("frontiers", json!({"0": 2}), || async {
        let g = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT frontiers::text FROM {}", t("rheo_groups"))))
            .fetch_one(&pool)
            .await
            .expect("group");
        g.get::<String, _>(0)
    })
    .await;
    // With rheo_claims=rows (for groups with Elixir consumers) a Rust lease
    // is a row with the reference's status and a text lease id.
    let rheo = Rheo::open(&format!("{}&rheo_claims=rows", pg_url_with(&schema))).await.expect("rows mode");
    rheo.append("orders", &json!({"type": "shipped"}), rheo::AppendOptions::new()).await.expect("append");
    let leases = rheo.fetch("orders", "billing", FetchOptions::new()).await.expect("fetch");
    assert_eq!(leases.iter().map(|l| l.sequence()).collect::<Vec<_>>(), vec![3]);
    let r = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT status, lease_id FROM {} WHERE sequence = 3",
        t("rheo_deliveries")
    )))
    .fetch_one(&pool)
    .await
    .expect("row");
    assert_eq!(r.get::<String, _>(0), "leased");
    assert_eq!(r.get::<Option<String>, _>(1), Some(leases[0].lease_id.to_string()));
    rheo.ack(&leases[0]).await.expect("ack");
    let r = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT status, lease_id FROM {} WHERE sequence = 3",
        t("rheo_deliveries")
    )))
    .fetch_one(&pool)
    .await
    .expect("row");
    assert_eq!((r.get::<String, _>(0), r.get::<Option<String>, _>(1)), ("acked".to_owned(), None));
}

#[tokio::test]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs these with RHEO_POSTGRES_URL set"]
async fn postgres_refuses_tables_of_another_shape_and_writes_nothing() {
    let schema = fresh_schema();
    let pool = pg_admin().await;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA \"{schema}\""))).execute(&pool).await.expect("schema");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE \"{schema}\".rheo_groups (stream TEXT, name TEXT, cursors TEXT, frontiers TEXT)"
    )))
    .execute(&pool)
    .await
    .expect("other shape");
    let err = Rheo::open(&pg_url_with(&schema)).await.expect_err("another shape");
    let msg = err.to_string();
    assert!(msg.contains("rheo_groups") && msg.contains("cursors") && msg.contains("jsonb"), "{msg}");
    use sqlx::Row;
    let n: i64 = sqlx::query("SELECT count(*) FROM information_schema.tables WHERE table_schema = $1")
        .bind(&schema)
        .fetch_one(&pool)
        .await
        .expect("count")
        .get(0);
    assert_eq!(n, 1, "nothing was created");
}

#[tokio::test]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs these with RHEO_POSTGRES_URL set"]
async fn postgres_bad_urls_and_databases_get_clear_errors() {
    let base = common::postgres_url();
    let (head, _) = base.rsplit_once('/').expect("a database in the URL");
    let err = Rheo::open(&format!("{head}/no_such_db")).await.expect_err("missing database");
    assert!(err.to_string().contains("no_such_db") && err.to_string().contains("does not exist"), "{err}");
    let no_role = base.replacen("postgres@", "nobody_here@", 1);
    let err = Rheo::open(&no_role).await.expect_err("unknown role");
    assert!(err.to_string().contains("nobody_here"), "{err}");
    let err =
        Rheo::open("postgres://u:secret@127.0.0.1:1/db?rheo_connect_timeout_ms=300").await.expect_err("no server");
    assert!(err.is_transient(), "unreachable is BackendUnavailable: {err}");
    assert!(!err.to_string().contains("secret"), "the password is never shown: {err}");
    for (url, says) in [
        (format!("{base}?rheo_pool=0"), "rheo_pool"),
        (format!("{base}?rheo_schema=bad-name"), "rheo_schema"),
        (format!("{base}?rheo_what=1"), "rheo_what"),
        ("postgres://[::1".to_owned(), "postgres"),
    ] {
        let err = Rheo::open(&url).await.expect_err(&url);
        assert!(matches!(err, Error::InvalidArgument { .. }) && err.to_string().contains(says), "{url}: {err}");
    }
    // A read-only user: the schema check reads, creating fails clearly.
    let pool = pg_admin().await;
    let role = format!("ro_{}", uuid::Uuid::new_v4().simple());
    let schema = fresh_schema();
    for sql in [
        format!("CREATE ROLE {role} LOGIN"),
        format!("CREATE SCHEMA \"{schema}\""),
        format!("GRANT USAGE ON SCHEMA \"{schema}\" TO {role}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&pool).await.expect("setup");
    }
    let ro = pg_url_with(&schema).replacen("postgres@", &format!("{role}@"), 1);
    let err = Rheo::open(&ro).await.expect_err("read-only user");
    assert!(err.to_string().contains("cannot create the rheo tables"), "{err}");
}

/// (oid, valid) of the payload indexes in `schema`.
async fn pg_payload_indexes(pool: &sqlx::PgPool, schema: &str) -> Vec<(i64, bool)> {
    use sqlx::Row;
    sqlx::query(
        "SELECT c.oid::bigint, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
         JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname LIKE 'rheo_events_ix_%'",
    )
    .bind(schema)
    .fetch_all(pool)
    .await
    .expect("catalog")
    .iter()
    .map(|r| (r.get::<i64, _>(0), r.get::<bool, _>(1)))
    .collect()
}

#[tokio::test]
#[ignore = "needs PostgreSQL: .ci/run starts one and runs these with RHEO_POSTGRES_URL set"]
async fn postgres_index_build_is_left_alone_by_other_handles_and_opens_do_not_wait_for_it() {
    let schema = fresh_schema();
    let url = pg_url_with(&schema);
    let a = Rheo::open(&url).await.expect("open a");
    a.create_stream("s", StreamOptions::new()).await.expect("stream");
    a.append("s", &json!({"n": 1}), rheo::AppendOptions::new()).await.expect("append");
    // Opened before the blocker below, though a handle opened during a
    // build must not wait for it either (checked after the build starts).
    let b = Rheo::open(&url).await.expect("open b");
    let pool = pg_admin().await;
    // An open transaction that may write the events table holds a
    // concurrent build in its wait phase, with its index invalid.
    let mut blocker = pool.begin().await.expect("begin");
    sqlx::query(sqlx::AssertSqlSafe(format!("LOCK TABLE \"{schema}\".rheo_events IN ROW EXCLUSIVE MODE")))
        .execute(&mut *blocker)
        .await
        .expect("lock");
    a.create_index("s", "n").await.expect("a declares and starts the build");
    let started = tokio::time::Instant::now();
    let building = loop {
        let ix = pg_payload_indexes(&pool, &schema).await;
        if let [(oid, false)] = ix[..] {
            break oid;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "a's build never showed up: {ix:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Another handle (as another process would) asks for the same index
    // while it is being built: it must not drop it to build its own.
    let c = tokio::time::timeout(Duration::from_secs(10), Rheo::open(&url))
        .await
        .expect("opening a handle does not wait for a build")
        .expect("open c");
    drop(c);
    b.create_index("s", "n").await.expect("b's create_index");
    tokio::time::sleep(Duration::from_millis(300)).await;
    blocker.commit().await.expect("release");
    let started = tokio::time::Instant::now();
    loop {
        let ix = pg_payload_indexes(&pool, &schema).await;
        if ix.iter().all(|(_, valid)| *valid) && !ix.is_empty() {
            assert_eq!(ix, vec![(building, true)], "the index a started is the one that finished");
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the build never finished: {ix:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Nothing drops it afterwards either (b's task, had it decided to
    // rebuild, would be waiting for a's build to end).
    let settled = tokio::time::Instant::now();
    while settled.elapsed() < Duration::from_secs(3) {
        assert_eq!(pg_payload_indexes(&pool, &schema).await, vec![(building, true)], "b dropped a's index");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let found = b.query(&rheo::Query::new("s").eq("n", 1)).await.expect("query");
    assert_eq!(found.len(), 1);
}

/// A group deleted by hand (its row, its deliveries and claims) while its
/// leases are out: every settle answers `GroupNotFound`, never a stale
/// lease, and paging its dead letters does too.
#[tokio::test]
async fn sqlite_settles_on_a_group_deleted_by_hand_say_the_group_is_gone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("rheo.db");
    let rheo = Rheo::open(&format!("sqlite:{}", path.display())).await.expect("open");
    rheo.create_stream("s", StreamOptions::new().partitions(2)).await.expect("stream");
    rheo.create_group("s", "g", GroupOptions::new()).await.expect("group");
    for i in 0..4 {
        rheo.append("s", &json!({"n": i}), rheo::AppendOptions::new().partition(i % 2)).await.expect("append");
    }
    let leases = rheo.fetch("s", "g", FetchOptions::new().limit(4)).await.expect("fetch");
    assert_eq!(leases.len(), 4);
    let pool = sqlite_pool(&path).await;
    for t in ["rheo_groups", "rheo_deliveries", "rheo_rs_claims"] {
        let col = if t == "rheo_groups" { "name" } else { "group_name" };
        sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {t} WHERE stream = 's' AND {col} = 'g'")))
            .execute(&pool)
            .await
            .expect("delete by hand");
    }
    let acks = rheo.ack_many(&leases[..2]).await.expect("the call answers per lease");
    assert_eq!(acks.len(), 2);
    for r in acks {
        assert!(matches!(r, Err(Error::GroupNotFound { .. })), "{r:?}");
    }
    let renewed = rheo.renew_many(&leases[2..], Duration::from_secs(30)).await.expect("per lease");
    for r in renewed {
        assert!(matches!(r, Err(Error::GroupNotFound { .. })), "{r:?}");
    }
    let e = rheo.reject(&leases[3], "bad").await.expect_err("the group is gone");
    assert!(matches!(e, Error::GroupNotFound { .. }), "{e:?}");
    let e = rheo.dead_letters("s", "g", rheo::DeadLetterOptions::new()).await.expect_err("the group is gone");
    assert!(matches!(e, Error::GroupNotFound { .. }), "{e:?}");
}

/// Retention refuses a group whose settings it cannot read, and leaves
/// them and the events as they were (it never writes defaults over them).
#[tokio::test]
async fn sqlite_retention_refuses_group_settings_it_cannot_read_and_keeps_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("rheo.db");
    let rheo = Rheo::open(&format!("sqlite:{}", path.display())).await.expect("open");
    rheo.create_stream("s", StreamOptions::new()).await.expect("stream");
    rheo.create_group("s", "g", GroupOptions::new()).await.expect("group");
    for i in 0..5 {
        rheo.append("s", &json!({"n": i}), rheo::AppendOptions::new()).await.expect("append");
    }
    rheo.set_retention("s", rheo::Retention::new().max_events(1)).await.expect("retention");
    let pool = sqlite_pool(&path).await;
    sqlx::query("UPDATE rheo_rs_group_settings SET settings = '{not json' WHERE name = 'g'")
        .execute(&pool)
        .await
        .expect("damage the settings");
    let e = rheo.enforce_retention("s").await.expect_err("unreadable settings");
    assert!(e.to_string().contains("\"g\""), "names the group: {e}");
    let kept: String = sqlx::query_scalar("SELECT settings FROM rheo_rs_group_settings WHERE name = 'g'")
        .fetch_one(&pool)
        .await
        .expect("settings");
    assert_eq!(kept, "{not json", "the settings are as they were");
    assert_eq!(rheo.read("s", 0, 0, 10).await.expect("read").len(), 5, "no event was dropped");
}
