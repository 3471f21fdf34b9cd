//! History queries compiled to SQL with the crate's typed comparison
//! rules: `1` never equals `"1"`, ranges compare numbers with numbers and
//! strings with strings (bytewise), dotted paths read nested values. The
//! SQL selects a superset where a dialect can't say a filter exactly
//! (`TRUE` for that filter), and every row is checked again by
//! [`Query::matches`] before it is paged, so results and cursors are those
//! of every other backend. Paging is keyset on the query's order.

use std::sync::Arc;

use serde_json::Value;

use super::SqlBackend;
use super::db::{Arg, Phase, Stmt};
use super::dialect::Dialect;
use super::streams::{decode_event, event_cols, json_path_expr, seq_arg};
use crate::error::Result;
use crate::model::path::LINEAGE_FIELDS;
use crate::model::query::{Filter, Op, OrderBy, Page, Query};
use crate::model::time::Timestamp;

/// The most values of an `in` filter compiled to SQL (beyond: checked in Rust).
const IN_MAX: usize = 64;

#[derive(Clone, Copy, PartialEq)]
enum Cmp {
    Eq,
    Gt,
    Gte,
    Lt,
    Lte,
}

impl Cmp {
    fn sql(self) -> &'static str {
        match self {
            Cmp::Eq => "=",
            Cmp::Gt => ">",
            Cmp::Gte => ">=",
            Cmp::Lt => "<",
            Cmp::Lte => "<=",
        }
    }
    fn inclusive(self) -> bool {
        matches!(self, Cmp::Eq | Cmp::Gte | Cmp::Lte)
    }
}

/// What a path reads.
enum Target {
    Text(&'static str),
    Int(&'static str),
    Time,
    Json(String, Vec<String>),
    Anything,
}

fn target(path: &str) -> Target {
    match path {
        "id" => Target::Text("e.id"),
        "key" => Target::Text("e.\"key\""),
        "type" => Target::Text("e.\"type\""),
        "partition" => Target::Int("e.partition"),
        "sequence" => Target::Int("e.sequence"),
        "timestamp" => Target::Time,
        "stream" => Target::Anything,
        p if LINEAGE_FIELDS.contains(&p) => Target::Json("e.metadata".into(), vec![p.to_owned()]),
        p => match p.strip_prefix("metadata.") {
            Some(rest) => Target::Json("e.metadata".into(), rest.split('.').map(str::to_owned).collect()),
            None => Target::Json(
                "e.payload".into(),
                p.strip_prefix("payload.").unwrap_or(p).split('.').map(str::to_owned).collect(),
            ),
        },
    }
}

impl SqlBackend {
    /// The SQL of one filter (`TRUE` where it can only narrow in Rust).
    fn filter_sql(&self, s: &mut Stmt, f: &Filter) -> String {
        let t = target(&f.path);
        let one = |s: &mut Stmt, cmp: Cmp, v: &Value| self.compare_sql(s, &t, cmp, v);
        match &f.op {
            Op::Eq(v) => one(s, Cmp::Eq, v),
            Op::Gt(v) => one(s, Cmp::Gt, v),
            Op::Gte(v) => one(s, Cmp::Gte, v),
            Op::Lt(v) => one(s, Cmp::Lt, v),
            Op::Lte(v) => one(s, Cmp::Lte, v),
            Op::In(vs) if vs.is_empty() => "FALSE".into(),
            // A long list would make a deep expression tree (SQLite caps it):
            // narrow in Rust.
            Op::In(vs) if vs.len() > IN_MAX => "TRUE".into(),
            Op::In(vs) => {
                let parts: Vec<String> = vs.iter().map(|v| one(s, Cmp::Eq, v)).collect();
                format!("({})", parts.join(" OR "))
            }
            Op::Exists(want) => {
                let not = if *want { "NOT " } else { "" };
                match &t {
                    Target::Text(col) => format!("{col} IS {not}NULL"),
                    Target::Int(_) | Target::Time => if *want { "TRUE" } else { "FALSE" }.into(),
                    Target::Anything => "TRUE".into(),
                    Target::Json(col, path) => match self.json_type_expr(col, path) {
                        Some(ty) => format!("{ty} IS {not}NULL"),
                        None => "TRUE".into(),
                    },
                }
            }
        }
    }

    /// The JSON type of a path (SQL NULL when absent): PostgreSQL
    /// `jsonb_typeof`, SQLite `json_type`.
    fn json_type_expr(&self, col: &str, path: &[String]) -> Option<String> {
        let segs: Vec<&str> = path.iter().map(String::as_str).collect();
        match self.d {
            Dialect::Postgres => Some(format!("jsonb_typeof({})", json_path_expr(self.d, col, &segs)?)),
            Dialect::Sqlite => {
                let p = super::streams::sqlite_path(&segs)?;
                Some(format!("json_type({col}, {})", super::streams::literal(&p)))
            }
        }
    }

    fn compare_sql(&self, s: &mut Stmt, t: &Target, cmp: Cmp, v: &Value) -> String {
        let op = cmp.sql();
        match t {
            Target::Anything => "TRUE".into(),
            Target::Text(col) => match v {
                Value::String(x) => {
                    let ph = s.text(x.clone());
                    if cmp == Cmp::Eq { format!("{col} = {ph}") } else { format!("{} {op} {ph}", self.d.bytewise(col)) }
                }
                _ => "FALSE".into(),
            },
            Target::Int(col) => match v {
                Value::Number(n) => match (n.as_i64(), n.as_f64()) {
                    (Some(i), _) => format!("{col} {op} {}", s.int(i)),
                    (None, Some(x)) => format!("{col} {op} {}", s.arg(Arg::F64(x))),
                    _ => "TRUE".into(),
                },
                _ => "FALSE".into(),
            },
            Target::Time => match v {
                Value::Number(n) => match n.as_i64() {
                    Some(ms) => {
                        let at = Timestamp::from_millis(ms);
                        let next = Timestamp::from_millis(ms.saturating_add(1));
                        let col = "e.\"timestamp\"";
                        match cmp {
                            Cmp::Eq => format!("{col} >= {} AND {col} < {}", s.ts(at), s.ts(next)),
                            Cmp::Gt => format!("{col} >= {}", s.ts(next)),
                            Cmp::Gte => format!("{col} >= {}", s.ts(at)),
                            Cmp::Lt => format!("{col} < {}", s.ts(at)),
                            Cmp::Lte => format!("{col} < {}", s.ts(next)),
                        }
                    }
                    None => "TRUE".into(),
                },
                _ => "FALSE".into(),
            },
            Target::Json(col, path) => {
                let segs: Vec<&str> = path.iter().map(String::as_str).collect();
                let (Some(x), Some(ty)) = (json_path_expr(self.d, col, &segs), self.json_type_expr(col, path)) else {
                    return "TRUE".into();
                };
                match self.d {
                    Dialect::Postgres => self.compare_pg(s, &x, &ty, cmp, v),
                    Dialect::Sqlite => self.compare_lite(s, &x, &ty, cmp, v),
                }
            }
        }
    }

    fn compare_pg(&self, s: &mut Stmt, x: &str, ty: &str, cmp: Cmp, v: &Value) -> String {
        let op = cmp.sql();
        let json = |s: &mut Stmt| {
            let ph = s.text(v.to_string());
            format!("{ph}::jsonb")
        };
        match (cmp, v) {
            (Cmp::Eq, _) => format!("{x} = {}", json(s)),
            (_, Value::Number(_)) => format!("({ty} = 'number' AND {x} {op} {})", json(s)),
            (_, Value::Bool(_)) => format!("({ty} = 'boolean' AND {x} {op} {})", json(s)),
            (_, Value::String(t)) => {
                let ph = s.text(t.clone());
                format!("({ty} = 'string' AND ({x} #>> '{{}}') COLLATE \"C\" {op} {ph})")
            }
            (c, Value::Null) if c.inclusive() => format!("{ty} = 'null'"),
            (c, _) if c.inclusive() => format!("{x} = {}", json(s)),
            _ => "FALSE".into(),
        }
    }

    fn compare_lite(&self, s: &mut Stmt, x: &str, ty: &str, cmp: Cmp, v: &Value) -> String {
        let op = cmp.sql();
        match v {
            Value::String(t) => format!("({ty} = 'text' AND {x} {op} {})", s.text(t.clone())),
            Value::Number(n) => {
                let ph = match (n.as_i64(), n.as_f64()) {
                    (Some(i), _) => s.int(i),
                    (None, Some(f)) => s.arg(Arg::F64(f)),
                    _ => return "TRUE".into(),
                };
                format!("({ty} IN ('integer', 'real') AND {x} {op} {ph})")
            }
            Value::Bool(b) => match cmp {
                Cmp::Eq => format!("{ty} = '{b}'"),
                _ => format!("{ty} IN ('true', 'false')"),
            },
            Value::Null if cmp.inclusive() => format!("{ty} = 'null'"),
            Value::Array(_) if cmp.inclusive() => format!("{ty} = 'array'"),
            Value::Object(_) if cmp.inclusive() => format!("{ty} = 'object'"),
            _ => "FALSE".into(),
        }
    }

    /// The sort key columns of an order.
    fn order_cols(&self, order: OrderBy) -> Vec<String> {
        match order {
            OrderBy::Sequence => vec!["e.sequence".into(), "e.partition".into()],
            OrderBy::Timestamp => {
                vec![self.d.ts_key("e.\"timestamp\""), "e.partition".into(), "e.sequence".into()]
            }
            OrderBy::Partition => vec!["e.partition".into(), "e.sequence".into()],
        }
    }

    /// Binds a keyset position (the last key seen) for `order_cols`.
    fn key_args(&self, s: &mut Stmt, order: OrderBy, key: (i64, u64, u64)) -> Vec<String> {
        match order {
            OrderBy::Sequence | OrderBy::Partition => vec![s.int(seq_arg(key.1)), s.int(seq_arg(key.2))],
            OrderBy::Timestamp => {
                let t = s.arg(self.d.ts_key_arg(Timestamp::from_millis(key.0)));
                vec![t, s.int(seq_arg(key.1)), s.int(seq_arg(key.2))]
            }
        }
    }

    pub(super) async fn query_impl(&self, q: &Query) -> Result<Page> {
        let name: Arc<str> = Arc::from(q.stream.as_str());
        let count = self.partition_count(&q.stream);
        crate::backends::common::keyset_query(q, count, |b| {
            let mut s = self.stmt();
            let st = s.text(q.stream.clone());
            let mut conds = vec![format!("e.stream = {st}")];
            if !b.every_partition {
                let list: Vec<String> = b.parts.iter().map(u32::to_string).collect();
                conds.push(format!("e.partition IN ({})", list.join(", ")));
            }
            if q.after_sequences.is_empty() {
                if let Some(a) = q.after_sequence {
                    conds.push(format!("e.sequence > {}", s.int(seq_arg(a))));
                }
            } else {
                let base = q.after_sequence.unwrap_or(0);
                let mut case = String::from("CASE e.partition");
                for (&p, &a) in &q.after_sequences {
                    case.push_str(&format!(" WHEN {p} THEN {}", s.int(seq_arg(a.max(base)))));
                }
                case.push_str(&format!(" ELSE {} END", s.int(seq_arg(base))));
                conds.push(format!("e.sequence > {case}"));
            }
            if let Some(u) = q.until_sequence {
                conds.push(format!("e.sequence <= {}", s.int(seq_arg(u))));
            }
            if let Some(t) = q.from {
                conds.push(format!("e.\"timestamp\" >= {}", s.ts(t)));
            }
            if let Some(t) = q.to {
                let next = Timestamp::from_millis(t.as_millis().saturating_add(1));
                conds.push(format!("e.\"timestamp\" < {}", s.ts(next)));
            }
            for f in &q.filters {
                conds.push(self.filter_sql(&mut s, f));
            }
            let cols = self.order_cols(q.order_by);
            if let Some(key) = b.after {
                let args = self.key_args(&mut s, q.order_by, key);
                let cmp = if q.descending { "<" } else { ">" };
                conds.push(format!("({}) {cmp} ({})", cols.join(", "), args.join(", ")));
            }
            let dir = if q.descending { " DESC" } else { "" };
            let order: Vec<String> = cols.iter().map(|c| format!("{c}{dir}")).collect();
            let lim = s.int(i64::try_from(b.limit).unwrap_or(i64::MAX));
            s.push(&format!(
                "SELECT {} FROM {} e WHERE {} ORDER BY {} LIMIT {lim}",
                event_cols(self.d, "e"),
                self.names.events(),
                conds.join(" AND "),
                order.join(", ")
            ));
            let name = name.clone();
            async move {
                let rows = self.pool.all(&s).await.map_err(self.err("query", Phase::Safe))?;
                rows.iter().map(|r| decode_event(&name, r, 0)).collect()
            }
        })
        .await
    }
}
