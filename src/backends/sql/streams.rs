//! Streams and their events on SQL: the schema, create, append, read,
//! listing, and payload indexes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::Value;

use super::db::{Arg, Phase, Row, Tx};
use super::dialect::Dialect;
use super::schema::{self, SCHEMA_VERSION, TABLES};
use super::{IndexBuildState, Now, SqlBackend, TxError, TxResult, at_commit, safe};
use crate::backends::dedupe::{Plan, dedupe_plan, resolve_plan};
use crate::error::{Error, ObjectKind, Result};
use crate::model::append::NewEvent;
use crate::model::event::{Event, EventParts, Position};
use crate::model::group::check_partitions;
use crate::model::path::canonical_path;
use crate::model::payload::{Metadata, Payload};
use crate::model::query::{ALWAYS_INDEXED, check_index_field};
use crate::model::routing::route;
use crate::model::stream::{IndexStatus, MAX_INDEXES, StreamInfo, StreamOptions};
use crate::model::time::Timestamp;

/// The columns of an event, as `decode_event` reads them from `at`.
pub(super) fn event_cols(d: Dialect, alias: &str) -> String {
    format!(
        "{a}.id, {a}.partition, {a}.sequence, {}, {a}.\"key\", {a}.\"type\", {}, {}",
        d.ts_out(&format!("{alias}.\"timestamp\"")),
        d.json_out(&format!("{alias}.metadata")),
        d.json_out(&format!("{alias}.payload")),
        a = alias
    )
}

/// The number of columns `event_cols` selects.
pub(super) const EVENT_COLS: usize = 8;

/// Reads an event from the columns `event_cols` put at `at..at + 8`.
pub(super) fn decode_event(stream: &Arc<str>, r: &Row, at: usize) -> Result<Event> {
    let id = r.text(at)?;
    let bad = |what: &str, why: String| {
        Error::failed("reading an event", format!("stream {stream:?} event {id:?}: {what}: {why}"))
    };
    let metadata: Metadata = match serde_json::from_str::<Value>(&r.text(at + 6)?) {
        Ok(Value::Object(m)) => m,
        Ok(Value::Null) => Metadata::new(),
        Ok(other) => return Err(bad("metadata", format!("{other} is not an object"))),
        Err(e) => return Err(bad("metadata", e.to_string())),
    };
    let payload = Payload::from_stored_json(r.text(at + 7)?.into_bytes()).map_err(|e| bad("payload", e.to_string()))?;
    Ok(Event::from(EventParts {
        id: id.clone(),
        stream: stream.clone(),
        partition: r.u32(at + 1)?,
        sequence: r.u64(at + 2)?,
        timestamp: r.ts(at + 3)?,
        key: r.opt_text(at + 4)?,
        event_type: r.opt_text(at + 5)?,
        metadata,
        payload,
    }))
}

/// A sequence as SQL stores it (BIGINT): above `i64::MAX` is refused.
pub(super) fn seq_arg(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// An SQL string literal (for DDL and index expressions, which take no
/// parameters).
pub(super) fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The SQL expression reading a canonical index field, the same text in
/// `create_index` and in compiled queries (so the planner matches them).
/// None for the fields the shared schema already indexes.
pub(super) fn field_expr(d: Dialect, canonical: &str, alias: &str) -> Option<String> {
    let (col, path): (&str, Vec<&str>) = match canonical {
        "id" | "key" | "type" => return None,
        c if crate::model::path::LINEAGE_FIELDS.contains(&c) => ("metadata", vec![c]),
        c => match c.strip_prefix("metadata.") {
            Some(rest) => ("metadata", rest.split('.').collect()),
            None => ("payload", c.strip_prefix("payload.").unwrap_or(c).split('.').collect()),
        },
    };
    json_path_expr(d, &format!("{alias}.{col}"), &path)
}

/// The JSON value at a path of a JSON column: PostgreSQL `jsonb_extract_path`
/// (an array index is a number segment); SQLite `json_extract` with
/// quoted keys. None where SQLite can't say it exactly (a segment of
/// digits may be a key or an index; a segment with a `"`).
pub(super) fn json_path_expr(d: Dialect, col: &str, path: &[&str]) -> Option<String> {
    match d {
        Dialect::Postgres => {
            let segs: Vec<String> = path.iter().map(|s| literal(s)).collect();
            Some(format!("jsonb_extract_path({col}, {})", segs.join(", ")))
        }
        Dialect::Sqlite => Some(format!("json_extract({col}, {})", literal(&sqlite_path(path)?))),
    }
}

/// A SQLite JSON path with every key quoted: `$."a"."b"`.
pub(super) fn sqlite_path(path: &[&str]) -> Option<String> {
    let mut out = String::from("$");
    for seg in path {
        if seg.is_empty() || seg.contains('"') || seg.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        out.push_str(&format!(".\"{seg}\""));
    }
    Some(out)
}

/// The name of the expression index on a canonical field (one per field,
/// shared by every stream that declares it): `rheo_events_ix_` and a
/// stable 64-bit FNV-1a hash of the field.
pub(super) fn index_name(canonical: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in canonical.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("rheo_events_ix_{h:016x}")
}

impl SqlBackend {
    /// Checks the shape of the tables that exist (changing nothing when
    /// one differs), then creates what is missing, idempotently.
    pub(super) async fn ensure_schema_impl(&self) -> Result<()> {
        let present = self.check_shape().await?;
        // DDL only when something is missing: `CREATE INDEX IF NOT EXISTS`
        // takes its table's lock before it looks, so opening a handle would
        // wait behind a long write or a concurrent index build.
        let complete = present.len() == TABLES.len() && {
            let have = self.index_names().await?;
            schema::INDEXES.iter().all(|(name, ..)| have.contains(*name))
        };
        for sql in if complete { Vec::new() } else { schema::ddl(self.d, &self.names) } {
            let mut s = self.stmt();
            s.push(&sql);
            if let Err(e) = self.pool.exec(&s).await {
                // Two processes creating the schema at once: one wins.
                if super::db::is_unique_violation(&e) {
                    continue;
                }
                return Err(self.schema_error(e));
            }
        }
        let mut s = self.stmt();
        let v = s.text(SCHEMA_VERSION.to_string());
        s.push(&format!(
            "INSERT INTO {} (\"key\", value) VALUES ('schema_version', {v}) ON CONFLICT (\"key\") DO NOTHING",
            self.names.meta()
        ));
        self.pool.exec(&s).await.map_err(|e| self.schema_error(e))?;
        let mut s = self.stmt();
        s.push(&format!("SELECT value FROM {} WHERE \"key\" = 'schema_version'", self.names.meta()));
        let rows = self.pool.all(&s).await.map_err(self.err("ensure_schema", Phase::Safe))?;
        let found = rows.first().map(|r| r.text(0)).transpose()?.unwrap_or_default();
        match found.parse::<u16>() {
            Ok(v) if v < SCHEMA_VERSION => {
                // The tables of the newer version were created above
                // (every change so far adds a table): record it, so that
                // an older build refuses this database from now on.
                let mut s = self.stmt();
                let v = s.text(SCHEMA_VERSION.to_string());
                let old = s.text(found.clone());
                s.push(&format!(
                    "UPDATE {} SET value = {v} WHERE \"key\" = 'schema_version' AND value = {old}",
                    self.names.meta()
                ));
                self.pool.exec(&s).await.map_err(|e| self.schema_error(e))?;
                Ok(())
            }
            Ok(SCHEMA_VERSION) => Ok(()),
            Ok(v) => Err(Error::UnsupportedVersion {
                file: format!("{} table rheo_rs_meta", self.be()).into(),
                found: v,
                supported: SCHEMA_VERSION,
            }),
            Err(_) => Err(Error::failed(
                "ensure_schema",
                format!("{}: rheo_rs_meta holds schema_version {found:?}, not a number", self.be()),
            )),
        }
    }

    fn schema_error(&self, e: sqlx::Error) -> Error {
        let detail = match &e {
            sqlx::Error::Database(db) => format!("{} (code {})", db.message(), db.code().as_deref().unwrap_or("?")),
            other => other.to_string(),
        };
        match super::db::map_err(self.be(), "ensure_schema", Phase::Safe, e) {
            unavailable @ Error::BackendUnavailable { .. } => unavailable,
            _ => Error::failed(
                "ensure_schema",
                format!("{}: cannot create the rheo tables: {detail} (a read-only database or user?)", self.be()),
            ),
        }
    }

    /// Every column the schema expects of a table that exists must be
    /// there with its type: a `rheo_*` table of another shape is refused
    /// by name, and never written to.
    /// Names of the indexes in the schema's namespace.
    async fn index_names(&self) -> Result<BTreeSet<String>> {
        let mut s = self.stmt();
        match self.d {
            Dialect::Postgres => {
                let schema = self.pg_namespace(&mut s);
                s.push(&format!("SELECT indexname::text FROM pg_indexes WHERE schemaname = {schema}"));
            }
            Dialect::Sqlite => {
                s.push("SELECT name FROM sqlite_master WHERE type = 'index'");
            }
        }
        let rows = self.pool.all(&s).await.map_err(|e| self.schema_error(e))?;
        rows.iter().map(|r| r.text(0)).collect()
    }

    /// Returns the tables that exist (of `TABLES`).
    async fn check_shape(&self) -> Result<BTreeSet<&'static str>> {
        let mut present = BTreeSet::new();
        for t in TABLES {
            let mut s = self.stmt();
            match self.d {
                Dialect::Postgres => {
                    let name = s.text(t.name);
                    let schema = match self.names.schema() {
                        Some(sc) => s.text(sc),
                        None => "current_schema()".to_owned(),
                    };
                    s.push(&format!(
                        "SELECT column_name::text, data_type::text FROM information_schema.columns \
                         WHERE table_schema = {schema} AND table_name = {name}"
                    ));
                }
                Dialect::Sqlite => {
                    let name = s.text(t.name);
                    s.push(&format!("SELECT name, lower(type) FROM pragma_table_info({name})"));
                }
            }
            let rows = match self.pool.all(&s).await {
                Ok(rows) => rows,
                Err(e) => return Err(self.schema_error(e)),
            };
            if rows.is_empty() {
                continue;
            }
            present.insert(t.name);
            let found: BTreeMap<String, String> =
                rows.iter().map(|r| Ok((r.text(0)?, r.text(1)?.to_lowercase()))).collect::<Result<_>>()?;
            for c in t.columns {
                let want = schema::reported_type(self.d, c.kind);
                match found.get(c.name) {
                    None => {
                        return Err(Error::failed(
                            "ensure_schema",
                            format!(
                                "{}: table {} has no column {:?} (expected {want}); rheo writes nothing to a table of another shape",
                                self.be(),
                                t.name,
                                c.name
                            ),
                        ));
                    }
                    Some(ty) if ty != want => {
                        return Err(Error::failed(
                            "ensure_schema",
                            format!(
                                "{}: table {} column {:?} is {ty}, expected {want}; rheo writes nothing to a table of another shape",
                                self.be(),
                                t.name,
                                c.name
                            ),
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(present)
    }

    /// The schema the tables live in, as an SQL expression.
    fn pg_namespace(&self, s: &mut super::db::Stmt) -> String {
        match self.names.schema() {
            Some(sc) => s.text(sc),
            None => "current_schema()".to_owned(),
        }
    }

    /// A stream's partition count (`StreamNotFound`), cached: it never changes.
    pub(super) async fn partition_count(&self, stream: &str) -> Result<u32> {
        if let Some(&n) = self.partition_counts.read().get(stream) {
            return Ok(n);
        }
        let mut s = self.stmt();
        let name = s.text(stream);
        s.push(&format!("SELECT partition_count FROM {} WHERE name = {name}", self.names.streams()));
        let rows = self.pool.all(&s).await.map_err(self.err("read", Phase::Safe))?;
        let n = rows.first().ok_or_else(|| Error::stream_not_found(stream))?.u32(0)?;
        self.partition_counts.write().insert(stream.to_owned(), n);
        Ok(n)
    }

    /// High watermarks of a stream, in partition order.
    pub(super) async fn high_watermarks(&self, stream: &str, count: u32) -> Result<Vec<u64>> {
        let mut s = self.stmt();
        let name = s.text(stream);
        s.push(&format!("SELECT partition, next_sequence FROM {} WHERE stream = {name}", self.names.seqs()));
        let rows = self.pool.all(&s).await.map_err(self.err("read", Phase::Safe))?;
        let mut out = vec![0; count as usize];
        for r in rows {
            let p = r.u32(0)? as usize;
            if let Some(slot) = out.get_mut(p) {
                *slot = r.u64(1)?;
            }
        }
        Ok(out)
    }

    pub(super) async fn create_stream_impl(&self, stream: &str, opts: &StreamOptions) -> Result<StreamInfo> {
        opts.validate(stream)?;
        let now = self.now();
        let created = super::retry_tx!(self, "create_stream", self.create_stream_tx(stream, opts, now).await)?;
        self.partition_counts.write().insert(stream.to_owned(), opts.partition_count);
        for field in &opts.indexes {
            if let Some(canonical) = canonical_path(field).filter(|c| !ALWAYS_INDEXED.contains(&c.as_str())) {
                self.build_index(&canonical).await?;
            }
        }
        Ok(StreamInfo::new(
            stream,
            opts.partition_count,
            opts.indexes.clone(),
            vec![0; opts.partition_count as usize],
            created,
        ))
    }

    async fn create_stream_tx(&self, stream: &str, opts: &StreamOptions, now: Now) -> TxResult<Timestamp> {
        let mut tx = self.pool.begin().await.map_err(safe)?;
        let mut s = self.stmt();
        let name = s.text(stream);
        let count = s.int(i64::from(opts.partition_count));
        let at = self.now_sql(&mut s, now);
        s.push(&format!(
            "INSERT INTO {} (name, partition_count, created_at) VALUES ({name}, {count}, {at}) \
             ON CONFLICT (name) DO NOTHING RETURNING {}",
            self.names.streams(),
            self.d.ts_out("created_at")
        ));
        let rows = tx.all(&s).await.map_err(safe)?;
        let Some(row) = rows.first() else {
            return Err(Error::AlreadyExists { kind: ObjectKind::Stream, name: stream.to_owned() }.into());
        };
        let created = row.ts(0)?;
        let parts: Vec<Value> = (0..opts.partition_count).map(|p| Value::from(vec![p])).collect();
        let mut s = self.stmt();
        let name = s.text(stream);
        let arr = s.text(Value::from(parts).to_string());
        s.push(&format!(
            "INSERT INTO {} (stream, partition, next_sequence) SELECT {name}, {}, 0 FROM {} AS x WHERE true \
             ON CONFLICT (stream, partition) DO NOTHING",
            self.names.seqs(),
            self.d.as_int("x.c0"),
            self.d.json_rows(&arr, 1)
        ));
        tx.exec(&s).await.map_err(safe)?;
        for (i, field) in opts.indexes.iter().enumerate() {
            if let Some(canonical) = canonical_path(field) {
                self.declare_index(&mut tx, stream, &canonical, field, created, i).await?;
            }
        }
        if !opts.retention.is_unlimited() {
            tx.exec(&self.store_retention_stmt(stream, &opts.retention)?).await.map_err(safe)?;
        }
        tx.commit().await.map_err(at_commit)?;
        Ok(created)
    }

    /// Records a declared index in `rheo_rs_stream_indexes` (its order by
    /// `created_at` plus `i` milliseconds).
    async fn declare_index(
        &self,
        tx: &mut Tx,
        stream: &str,
        canonical: &str,
        spelling: &str,
        at: Timestamp,
        i: usize,
    ) -> TxResult<bool> {
        let mut s = self.stmt();
        let name = s.text(stream);
        let f = s.text(canonical);
        let sp = s.text(spelling);
        let when = s.ts(at.saturating_add(std::time::Duration::from_millis(i as u64)));
        s.push(&format!(
            "INSERT INTO {} (stream, field, spelling, created_at) VALUES ({name}, {f}, {sp}, {when}) \
             ON CONFLICT (stream, field) DO NOTHING",
            self.names.stream_indexes()
        ));
        Ok(tx.exec(&s).await.map_err(safe)? > 0)
    }

    pub(super) async fn append_impl(&self, stream: &str, events: &[NewEvent]) -> Result<Vec<Position>> {
        if events.is_empty() {
            self.partition_count(stream).await?;
            return Ok(Vec::new());
        }
        let count = self.partition_count(stream).await?;
        // Route every event first so that a bad partition writes nothing.
        let routed: Vec<u32> = events.iter().map(|e| route(stream, e, count)).collect::<Result<_>>()?;
        let now = self.now();
        if events.iter().any(|e| e.id_given) {
            // The duplicate check reads the table inside the append's own
            // transaction: these do not combine.
            let out = super::retry_tx!(self, "append", self.append_tx(stream, events, &routed, now).await)?;
            self.appender.committed(stream, out.iter().filter(|p| !p.duplicate).count());
            return Ok(out);
        }
        let (rows, bytes) = self.appender.encode(events, &routed, now)?;
        let one = routed.first().copied().filter(|&p| routed.iter().all(|&q| q == p));
        self.appends.submit((Arc::from(stream), one), rows, bytes).await
    }

    async fn append_tx(&self, stream: &str, events: &[NewEvent], routed: &[u32], now: Now) -> TxResult<Vec<Position>> {
        let mut tx = self.pool.begin().await.map_err(safe)?;
        // Producer-given ids already stored (the primary key keeps every id
        // forever): those events write nothing and answer their original.
        let known = if events.iter().any(|e| e.id_given) {
            self.stored_ids(&mut tx, stream, events).await?
        } else {
            BTreeMap::new()
        };
        let plan = dedupe_plan(events, &known);
        let (events, routed): (Vec<&NewEvent>, Vec<u32>) = plan
            .iter()
            .zip(events.iter().zip(routed))
            .filter(|(p, _)| matches!(p, Plan::Store))
            .map(|(_, (e, &r))| (e, r))
            .unzip();
        if events.is_empty() {
            tx.commit().await.map_err(at_commit)?;
            return resolve_plan(plan, &[]).map_err(TxError::Rheo);
        }
        let mut next = self.allocate_sequences(&mut tx, stream, &routed).await?;
        let mut rows = Vec::with_capacity(events.len());
        let mut positions = Vec::with_capacity(events.len());
        for (e, &p) in events.iter().zip(&routed) {
            let slot = next.entry(p).or_insert(1);
            let seq = *slot;
            *slot += 1;
            let ts = match (e.timestamp, now, self.d) {
                (Some(t), _, Dialect::Sqlite) | (None, Now::At(t), Dialect::Sqlite) => {
                    Value::from(super::dialect::format_ts(t))
                }
                (Some(t), _, Dialect::Postgres) | (None, Now::At(t), Dialect::Postgres) => Value::from(t.as_millis()),
                (None, Now::Db, _) => Value::Null,
            };
            let payload = e.payload.json().map_err(TxError::Rheo)?.clone();
            rows.push(Value::Array(vec![
                Value::from(e.id.as_str()),
                Value::from(p),
                Value::from(seq),
                ts,
                e.key.as_deref().map_or(Value::Null, Value::from),
                e.event_type.as_deref().map_or(Value::Null, Value::from),
                Value::Object(e.metadata.clone()),
                payload,
            ]));
            positions.push((p, seq));
        }
        let mut s = self.stmt();
        let name = s.text(stream);
        let arr = s.text(Value::Array(rows).to_string());
        let (src, ts_expr) = match self.d {
            Dialect::Postgres => (
                format!("jsonb_array_elements({arr}::jsonb) AS x(v)"),
                "COALESCE('epoch'::timestamptz + (x.v ->> 3)::bigint * interval '1 millisecond', now())".to_owned(),
            ),
            Dialect::Sqlite => (format!("json_each({arr}) AS x"), "x.value ->> 3".to_owned()),
        };
        let (get, getj) = match self.d {
            Dialect::Postgres => ("x.v ->> ", "x.v -> "),
            Dialect::Sqlite => ("x.value ->> ", "x.value -> "),
        };
        s.push(&format!(
            "INSERT INTO {t} (id, stream, partition, sequence, \"timestamp\", \"key\", \"type\", metadata, payload) \
             SELECT {get}0, {name}, {p}, {q}, {ts_expr}, {get}4, {get}5, {getj}6, {getj}7 FROM {src} \
             RETURNING partition, sequence, {ts}",
            t = self.names.events(),
            p = self.d.as_int(&format!("{get}1")),
            q = self.d.as_int(&format!("{get}2")),
            ts = self.d.ts_out("\"timestamp\"")
        ));
        let inserted = match tx.all(&s).await {
            Ok(rows) => rows,
            Err(e)
                if super::db::is_unique_violation(&e)
                    && super::db::names_constraint(&e, &["pkey", "rheo_events.id"]) =>
            {
                // An id committed by a concurrent append since the check:
                // run again, and it is answered as a duplicate.
                return Err(TxError::Raced(Error::invalid(
                    "id",
                    format!(
                        "stream {stream:?}: an event with one of these ids was appended concurrently, again and again"
                    ),
                )));
            }
            Err(e) => return Err(safe(e)),
        };
        let mut stamps: BTreeMap<(u32, u64), Timestamp> = BTreeMap::new();
        for r in &inserted {
            stamps.insert((r.u32(0)?, r.u64(1)?), r.ts(2)?);
        }
        // The schedule of the scheduled ones, in the same transaction.
        let scheduled: Vec<(u32, u64, &str, Timestamp)> = events
            .iter()
            .zip(&positions)
            .filter_map(|(e, &(p, q))| e.deliver_at().map(|t| (p, q, e.id.as_str(), t)))
            .collect();
        self.record_schedule(&mut tx, stream, &scheduled).await?;
        tx.commit().await.map_err(at_commit)?;
        let stored = positions
            .into_iter()
            .map(|(partition, sequence)| {
                let timestamp = stamps.get(&(partition, sequence)).copied().ok_or_else(|| {
                    TxError::Rheo(Error::ambiguous(
                        "append",
                        format!(
                            "stream {stream:?}: the insert did not report partition {partition} sequence {sequence}"
                        ),
                    ))
                })?;
                Ok(Position::new(partition, sequence, timestamp))
            })
            .collect::<TxResult<Vec<_>>>()?;
        resolve_plan(plan, &stored).map_err(TxError::Rheo)
    }

    /// Allocates the sequences of appends routed to `routed`, partition by
    /// partition in ascending order (the row locks serialize appenders; the
    /// order rules out deadlocks): each partition's first new sequence.
    async fn allocate_sequences(&self, tx: &mut Tx, stream: &str, routed: &[u32]) -> TxResult<BTreeMap<u32, u64>> {
        let mut per: BTreeMap<u32, u64> = BTreeMap::new();
        for &p in routed {
            *per.entry(p).or_default() += 1;
        }
        let mut next: BTreeMap<u32, u64> = BTreeMap::new();
        for (&p, &n) in &per {
            // One upsert: a stream whose writer left no sequence row gets one.
            let mut s = self.stmt();
            let name = s.text(stream);
            let part = s.int(i64::from(p));
            let add = s.int(seq_arg(n));
            let seqs = self.names.seqs();
            s.push(&format!(
                "INSERT INTO {seqs} AS q (stream, partition, next_sequence) VALUES ({name}, {part}, {add}) \
                 ON CONFLICT (stream, partition) DO UPDATE SET next_sequence = q.next_sequence + excluded.next_sequence \
                 RETURNING next_sequence"
            ));
            let rows = tx.all(&s).await.map_err(safe)?;
            let last = rows
                .first()
                .ok_or_else(|| Error::failed("append", format!("stream {stream:?}: no sequence was allocated")))?
                .u64(0)?;
            next.insert(p, last + 1 - n);
        }
        Ok(next)
    }

    /// The stored position of each producer-given id of `events` already
    /// in the database, read in the append's transaction. An id stored in
    /// another stream is an error (ids are unique across the database).
    async fn stored_ids(&self, tx: &mut Tx, stream: &str, events: &[NewEvent]) -> TxResult<BTreeMap<String, Position>> {
        let ids: Vec<&str> = events.iter().filter(|e| e.id_given).map(|e| e.id.as_str()).collect();
        let mut s = self.stmt();
        let arr =
            s.text(serde_json::to_string(&ids).map_err(|e| TxError::Rheo(Error::failed("append", e.to_string())))?);
        let list = match self.d {
            Dialect::Postgres => format!("SELECT jsonb_array_elements_text({arr}::jsonb)"),
            Dialect::Sqlite => format!("SELECT value FROM json_each({arr})"),
        };
        s.push(&format!(
            "SELECT id, stream, partition, sequence, {ts} FROM {t} WHERE id IN ({list})",
            t = self.names.events(),
            ts = self.d.ts_out("\"timestamp\"")
        ));
        let mut out = BTreeMap::new();
        for r in tx.all(&s).await.map_err(safe)? {
            let (id, owner) = (r.text(0)?, r.text(1)?);
            if owner != stream {
                return Err(Error::invalid(
                    "id",
                    format!("stream {stream:?}: id {id:?} is already used by an event of stream {owner:?} (ids are unique across the database)"),
                )
                .into());
            }
            out.insert(id, Position::duplicate_of(r.u32(2)?, r.u64(3)?, r.ts(4)?));
        }
        Ok(out)
    }

    pub(super) async fn read_impl(&self, stream: &str, partition: u32, after: u64, limit: usize) -> Result<Vec<Event>> {
        let count = self.partition_count(stream).await?;
        check_partitions(stream, &[partition], count)?;
        let mut s = self.stmt();
        let name = s.text(stream);
        let p = s.int(i64::from(partition));
        let a = s.int(seq_arg(after));
        let l = s.int(i64::try_from(limit).unwrap_or(i64::MAX));
        s.push(&format!(
            "SELECT {} FROM {} e WHERE e.stream = {name} AND e.partition = {p} AND e.sequence > {a} \
             ORDER BY e.sequence LIMIT {l}",
            event_cols(self.d, "e"),
            self.names.events()
        ));
        let rows = self.pool.all(&s).await.map_err(self.err("read", Phase::Safe))?;
        let name: Arc<str> = Arc::from(stream);
        rows.iter().map(|r| decode_event(&name, r, 0)).collect()
    }

    /// Every stream (or one), by name in byte order.
    pub(super) async fn list_streams_impl(&self, only: Option<&str>) -> Result<Vec<StreamInfo>> {
        let mut s = self.stmt();
        let filter = match only {
            Some(n) => format!("WHERE name = {}", s.text(n)),
            None => String::new(),
        };
        s.push(&format!(
            "SELECT name, partition_count, {} FROM {} {filter}",
            self.d.ts_out("created_at"),
            self.names.streams()
        ));
        let streams = self.pool.all(&s).await.map_err(self.err("list_streams", Phase::Safe))?;
        let mut s = self.stmt();
        s.push(&format!("SELECT stream, partition, next_sequence FROM {}", self.names.seqs()));
        if let Some(n) = only {
            let ph = s.text(n);
            s.push(&format!(" WHERE stream = {ph}"));
        }
        let seqs = self.pool.all(&s).await.map_err(self.err("list_streams", Phase::Safe))?;
        let mut s = self.stmt();
        s.push(&format!("SELECT stream, spelling FROM {} ORDER BY created_at, field", self.names.stream_indexes()));
        let indexes = self.pool.all(&s).await.map_err(self.err("list_streams", Phase::Safe))?;
        let mut out: Vec<StreamInfo> = Vec::with_capacity(streams.len());
        let mut hws: BTreeMap<String, BTreeMap<u32, u64>> = BTreeMap::new();
        for r in &seqs {
            hws.entry(r.text(0)?).or_default().insert(r.u32(1)?, r.u64(2)?);
        }
        let mut idx: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for r in &indexes {
            idx.entry(r.text(0)?).or_default().push(r.text(1)?);
        }
        for r in &streams {
            let name = r.text(0)?;
            let count = r.u32(1)?;
            let hw = hws.get(&name);
            out.push(StreamInfo::new(
                &name,
                count,
                idx.remove(&name).unwrap_or_default(),
                (0..count).map(|p| hw.and_then(|m| m.get(&p)).copied().unwrap_or(0)).collect(),
                r.ts(2)?,
            ));
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    pub(super) async fn create_index_impl(&self, stream: &str, field: &str) -> Result<()> {
        let canonical = check_index_field(stream, field)?;
        self.partition_count(stream).await?;
        if ALWAYS_INDEXED.contains(&canonical.as_str()) {
            return Ok(());
        }
        let now = self.now();
        let declared = super::retry_tx!(self, "create_index", self.declare_tx(stream, &canonical, field, now).await)?;
        // Built when new, or when a build left no valid index behind.
        if declared || !self.index_state(&canonical).await?.0 {
            self.build_index(&canonical).await?;
        }
        Ok(())
    }

    async fn declare_tx(&self, stream: &str, canonical: &str, spelling: &str, now: Now) -> TxResult<bool> {
        let mut tx = self.pool.begin().await.map_err(safe)?;
        let mut s = self.stmt();
        let name = s.text(stream);
        s.push(&format!("SELECT field FROM {} WHERE stream = {name}", self.names.stream_indexes()));
        let existing = tx.all(&s).await.map_err(safe)?;
        let fields: Vec<String> = existing.iter().map(|r| r.text(0)).collect::<Result<_>>()?;
        if fields.iter().any(|f| f == canonical) {
            return Ok(false);
        }
        if fields.len() >= MAX_INDEXES {
            return Err(
                Error::invalid("indexes", format!("stream {stream:?} has {MAX_INDEXES} indexes, the maximum")).into()
            );
        }
        let at = match now {
            Now::At(t) => t,
            Now::Db => Timestamp::now(),
        };
        let declared = self.declare_index(&mut tx, stream, canonical, spelling, at, 0).await?;
        tx.commit().await.map_err(at_commit)?;
        Ok(declared)
    }

    /// Creates the expression index of a field: on PostgreSQL `CREATE
    /// INDEX CONCURRENTLY` in the background (writers are never blocked;
    /// `index_status` reports it); on SQLite at once.
    async fn build_index(&self, canonical: &str) -> Result<()> {
        let Some(expr) = field_expr(self.d, canonical, &self.names.events()) else {
            // SQLite can't name this path exactly: queries on it scan.
            return Ok(());
        };
        // The index expression names the column, not the qualified table.
        let expr = expr.replace(&format!("{}.", self.names.events()), "");
        let name = index_name(canonical);
        match self.d {
            Dialect::Sqlite => {
                let mut s = self.stmt();
                s.push(&format!("CREATE INDEX IF NOT EXISTS {name} ON {} (stream, {expr})", self.names.events()));
                self.pool.exec(&s).await.map_err(self.err("create_index", Phase::Safe))?;
                Ok(())
            }
            Dialect::Postgres => {
                let key = canonical.to_owned();
                {
                    let mut builds = self.index_builds.lock();
                    if matches!(builds.get(&key), Some(IndexBuildState::Running)) {
                        return Ok(());
                    }
                    builds.insert(key.clone(), IndexBuildState::Running);
                }
                let pool = self.pool.clone();
                let builds = self.index_builds.clone();
                let mut s = self.stmt();
                s.push(&format!(
                    "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {} (stream, ({expr}))",
                    self.names.events()
                ));
                let qualified = match self.names.schema() {
                    Some(sc) => format!("\"{sc}\".{name}"),
                    None => name.clone(),
                };
                let mut drop_invalid = self.stmt();
                drop_invalid.push(&format!("DROP INDEX CONCURRENTLY IF EXISTS {qualified}"));
                // An index is also invalid while another session builds it.
                let mut elsewhere = self.stmt();
                let ph = elsewhere.text(qualified);
                elsewhere.push(&format!(
                    "SELECT 1 FROM pg_stat_progress_create_index WHERE index_relid = to_regclass({ph})"
                ));
                let backend = self.be();
                let invalid = self.index_state(canonical).await.is_ok_and(|(ready, _)| !ready);
                tokio::spawn(async move {
                    // An invalid index of an interrupted build is dropped first
                    // (IF NOT EXISTS would keep it); a valid one is kept, and so
                    // is one another process is building now.
                    if invalid {
                        if pool.all(&elsewhere).await.is_ok_and(|rows| !rows.is_empty()) {
                            builds.lock().remove(&key);
                            return;
                        }
                        let _ = pool.exec(&drop_invalid).await;
                    }
                    let failure = pool.exec(&s).await.err().map(|e| e.to_string());
                    if let Some(e) = &failure {
                        tracing::warn!(backend, field = %key, error = %e, "building a payload index failed");
                        // A failed concurrent build leaves an invalid index behind.
                        let _ = pool.exec(&drop_invalid).await;
                    }
                    let mut builds = builds.lock();
                    match failure {
                        None => builds.remove(&key),
                        Some(_) => builds.insert(key, IndexBuildState::Failed),
                    };
                });
                Ok(())
            }
        }
    }

    pub(super) async fn index_status_impl(&self, stream: &str) -> Result<Vec<IndexStatus>> {
        self.partition_count(stream).await?;
        let mut s = self.stmt();
        let name = s.text(stream);
        s.push(&format!("SELECT field FROM {} WHERE stream = {name}", self.names.stream_indexes()));
        let declared: Vec<String> = self
            .pool
            .all(&s)
            .await
            .map_err(self.err("index_status", Phase::Safe))?
            .iter()
            .map(|r| r.text(0))
            .collect::<Result<_>>()?;
        let mut fields: Vec<String> = ALWAYS_INDEXED.iter().map(|f| (*f).to_owned()).collect();
        fields.extend(declared.iter().cloned());
        fields.sort();
        fields.dedup();
        let mut out = Vec::with_capacity(fields.len());
        for field in fields {
            let always = ALWAYS_INDEXED.contains(&field.as_str());
            let (ready, failed) = if !always && declared.contains(&field) && field_expr(self.d, &field, "e").is_some() {
                self.index_state(&field).await?
            } else {
                (true, false)
            };
            out.push(IndexStatus {
                field,
                segments_ready: u64::from(ready),
                segments_total: 1,
                segments_failed: u64::from(failed),
            });
        }
        Ok(out)
    }

    /// (ready, failed) of a field's expression index.
    async fn index_state(&self, canonical: &str) -> Result<(bool, bool)> {
        let failed = matches!(self.index_builds.lock().get(canonical), Some(IndexBuildState::Failed));
        let mut s = self.stmt();
        let name = s.text(index_name(canonical));
        match self.d {
            Dialect::Postgres => {
                let ns = self.pg_namespace(&mut s);
                s.push(&format!(
                    "SELECT i.indisvalid::int FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid \
                     JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relname = {name} AND n.nspname = {ns}"
                ))
            }
            Dialect::Sqlite => s.push(&format!("SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = {name}")),
        };
        let rows = self.pool.all(&s).await.map_err(self.err("index_status", Phase::Safe))?;
        let ready = match rows.first() {
            Some(r) => r.i64(0)? == 1,
            None => false,
        };
        Ok((ready, failed && !ready))
    }
}

/// Arguments of the positions of leases: `[[partition, sequence, lease id], ...]`.
pub(super) fn lease_rows<'a>(leases: impl Iterator<Item = (u32, u64, String)> + 'a) -> Arg {
    let rows: Vec<Value> =
        leases.map(|(p, s, l)| Value::Array(vec![Value::from(p), Value::from(s), Value::from(l)])).collect();
    Arg::Text(Value::Array(rows).to_string())
}
