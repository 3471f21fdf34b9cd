//! The shared schema: the reference implementation's five `rheo_*` tables
//! and six indexes, exactly (so a Rust producer and an Elixir consumer can
//! share a database), plus side tables of this crate's own, named
//! `rheo_rs_*`, which the reference never reads. See `docs/guides/sql.md`.

use super::dialect::Dialect;

/// The schema version this build writes and reads (kept in
/// `rheo_rs_meta`; the shared tables carry no version).
///
/// 2: `rheo_rs_claims` (claimed ranges, ADR 0021). A build of version 1
/// would take a range's positions for settled, so it refuses a database
/// of version 2.
///
/// 3: `rheo_rs_scheduled` (scheduled delivery, ADR 0036). A build of
/// version 2 would claim a scheduled event before its time.
pub(crate) const SCHEMA_VERSION: u16 = 3;

/// One column: name, PostgreSQL type, SQLite type, NOT NULL, default.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Column {
    pub name: &'static str,
    /// `json`, `ts`, `bigint`, `text` or `int` (dialect-neutral).
    pub kind: &'static str,
    pub not_null: bool,
    pub default: Option<&'static str>,
}

/// One table of the schema.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Table {
    pub name: &'static str,
    pub columns: &'static [Column],
    pub key: &'static [&'static str],
}

const fn col(name: &'static str, kind: &'static str, not_null: bool, default: Option<&'static str>) -> Column {
    Column { name, kind, not_null, default }
}

/// Every table, in creation order.
pub(crate) const TABLES: &[Table] = &[
    Table {
        name: "rheo_streams",
        columns: &[
            col("name", "text", true, None),
            col("partition_count", "int", true, Some("1")),
            col("created_at", "ts", true, None),
        ],
        key: &["name"],
    },
    Table {
        name: "rheo_stream_sequences",
        columns: &[
            col("stream", "text", true, None),
            col("partition", "int", true, None),
            col("next_sequence", "bigint", true, Some("0")),
        ],
        key: &["stream", "partition"],
    },
    Table {
        name: "rheo_events",
        columns: &[
            col("id", "text", true, None),
            col("stream", "text", true, None),
            col("partition", "int", true, Some("0")),
            col("sequence", "bigint", true, None),
            col("timestamp", "ts", true, None),
            col("key", "text", false, None),
            col("type", "text", false, None),
            col("metadata", "json", true, None),
            col("payload", "json", true, None),
        ],
        key: &["id"],
    },
    Table {
        name: "rheo_groups",
        columns: &[
            col("stream", "text", true, None),
            col("name", "text", true, None),
            col("cursors", "json", true, None),
            col("frontiers", "json", true, None),
            col("max_attempts", "int", true, Some("5")),
            col("created_at", "ts", true, None),
        ],
        key: &["stream", "name"],
    },
    Table {
        name: "rheo_deliveries",
        columns: &[
            col("stream", "text", true, None),
            col("group_name", "text", true, None),
            col("event_id", "text", true, None),
            col("partition", "int", true, Some("0")),
            col("sequence", "bigint", true, None),
            col("status", "text", true, None),
            col("attempt", "int", true, Some("0")),
            col("lease_id", "text", false, None),
            col("consumer_id", "text", false, None),
            col("reason", "text", false, None),
            col("leased_at", "ts", false, None),
            col("expires_at", "ts", false, None),
            col("renewed_at", "ts", false, None),
            col("acked_at", "ts", false, None),
            col("retried_at", "ts", false, None),
            col("dead_lettered_at", "ts", false, None),
            col("created_at", "ts", true, None),
        ],
        key: &["stream", "group_name", "event_id"],
    },
    Table {
        name: "rheo_rs_meta",
        columns: &[col("key", "text", true, None), col("value", "text", true, None)],
        key: &["key"],
    },
    Table {
        name: "rheo_rs_group_settings",
        columns: &[
            col("stream", "text", true, None),
            col("name", "text", true, None),
            col("settings", "json", true, None),
        ],
        key: &["stream", "name"],
    },
    Table {
        name: "rheo_rs_stream_indexes",
        columns: &[
            col("stream", "text", true, None),
            col("field", "text", true, None),
            col("spelling", "text", true, None),
            col("created_at", "ts", true, None),
        ],
        key: &["stream", "field"],
    },
    Table {
        name: "rheo_rs_stream_settings",
        columns: &[col("stream", "text", true, None), col("settings", "json", true, None)],
        key: &["stream"],
    },
    Table {
        name: "rheo_rs_dead_letter_order",
        columns: &[
            col("stream", "text", true, None),
            col("group_name", "text", true, None),
            col("partition", "int", true, None),
            col("sequence", "bigint", true, None),
            col("mark", "bigint", true, None),
        ],
        key: &["stream", "group_name", "partition", "sequence"],
    },
    // A claimed range of fresh positions (ADR 0021): one row stands for
    // the leases of `first_seq..=last_seq`, all in one block of 256
    // sequences; `w0`..`w7` are that block's bitmap, 32 positions a word,
    // a bit set when its position is settled or not the claim's.
    Table {
        name: "rheo_rs_claims",
        columns: &[
            col("stream", "text", true, None),
            col("group_name", "text", true, None),
            col("partition", "int", true, None),
            col("first_seq", "bigint", true, None),
            col("last_seq", "bigint", true, None),
            col("base", "bigint", true, None),
            col("consumer_id", "text", true, None),
            col("leased_at", "ts", true, None),
            col("expires_at", "ts", true, None),
            col("w0", "bigint", true, None),
            col("w1", "bigint", true, None),
            col("w2", "bigint", true, None),
            col("w3", "bigint", true, None),
            col("w4", "bigint", true, None),
            col("w5", "bigint", true, None),
            col("w6", "bigint", true, None),
            col("w7", "bigint", true, None),
            // What the last settle of the claim set (its eight words as
            // `n0:…:n7`): an UPDATE's RETURNING shows new values only, and
            // a settle answers for the bits it set itself.
            col("acked", "text", false, None),
        ],
        key: &["stream", "group_name", "partition", "first_seq"],
    },
    // The events appended with a delivery time (ADR 0036), written with
    // them: a fetch that meets one before its time sets it aside as a
    // delivery row waiting until `deliver_at` (status `leased`, no
    // holder, attempt 0, expiring then), which the reference's claim
    // index finds once due.
    Table {
        name: "rheo_rs_scheduled",
        columns: &[
            col("stream", "text", true, None),
            col("partition", "int", true, None),
            col("sequence", "bigint", true, None),
            col("event_id", "text", true, None),
            col("deliver_at", "ts", true, None),
        ],
        key: &["stream", "partition", "sequence"],
    },
];

/// The reference's indexes: (name, table, columns, unique).
pub(crate) const INDEXES: &[(&str, &str, &[&str], bool)] = &[
    ("rheo_events_stream_partition_sequence", "rheo_events", &["stream", "partition", "sequence"], true),
    ("rheo_events_stream_timestamp", "rheo_events", &["stream", "timestamp"], false),
    ("rheo_events_stream_type", "rheo_events", &["stream", "type"], false),
    ("rheo_events_stream_key", "rheo_events", &["stream", "key"], false),
    ("rheo_deliveries_claim", "rheo_deliveries", &["stream", "group_name", "status", "expires_at"], false),
    ("rheo_deliveries_frontier", "rheo_deliveries", &["stream", "group_name", "partition", "sequence"], false),
];

/// A column name as SQL writes it (the reference quotes these three).
pub(crate) fn quote_col(name: &str) -> String {
    match name {
        "timestamp" | "key" | "type" => format!("\"{name}\""),
        _ => name.to_owned(),
    }
}

/// The SQL type of a neutral column kind.
pub(crate) fn sql_type(d: Dialect, kind: &str) -> &'static str {
    match kind {
        "json" => d.json_type(),
        "ts" => d.ts_type(),
        "bigint" => d.bigint_type(),
        "int" => "INTEGER",
        _ => "TEXT",
    }
}

/// What the database reports for a column type (lower case): PostgreSQL's
/// `information_schema.columns.data_type`, SQLite's declared type.
pub(crate) fn reported_type(d: Dialect, kind: &str) -> &'static str {
    match (d, kind) {
        (Dialect::Postgres, "json") => "jsonb",
        (Dialect::Postgres, "ts") => "timestamp with time zone",
        (Dialect::Postgres, "bigint") => "bigint",
        (Dialect::Postgres, "int") => "integer",
        (Dialect::Postgres, _) => "text",
        (Dialect::Sqlite, "bigint" | "int") => "integer",
        (Dialect::Sqlite, _) => "text",
    }
}

/// Table and index names, qualified by an optional PostgreSQL schema
/// (the reference's `:prefix` option).
#[derive(Debug, Clone)]
pub(crate) struct Names {
    schema: Option<String>,
}

impl Names {
    pub(crate) fn new(schema: Option<String>) -> Self {
        Names { schema }
    }

    pub(crate) fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// A table as statements name it.
    pub(crate) fn t(&self, table: &str) -> String {
        match &self.schema {
            Some(s) => format!("\"{}\".{table}", s.replace('"', "\"\"")),
            None => table.to_owned(),
        }
    }

    pub(crate) fn streams(&self) -> String {
        self.t("rheo_streams")
    }
    pub(crate) fn seqs(&self) -> String {
        self.t("rheo_stream_sequences")
    }
    pub(crate) fn events(&self) -> String {
        self.t("rheo_events")
    }
    pub(crate) fn groups(&self) -> String {
        self.t("rheo_groups")
    }
    pub(crate) fn deliveries(&self) -> String {
        self.t("rheo_deliveries")
    }
    pub(crate) fn settings(&self) -> String {
        self.t("rheo_rs_group_settings")
    }
    pub(crate) fn stream_indexes(&self) -> String {
        self.t("rheo_rs_stream_indexes")
    }
    pub(crate) fn stream_settings(&self) -> String {
        self.t("rheo_rs_stream_settings")
    }
    pub(crate) fn dl_order(&self) -> String {
        self.t("rheo_rs_dead_letter_order")
    }
    pub(crate) fn meta(&self) -> String {
        self.t("rheo_rs_meta")
    }
    pub(crate) fn claims(&self) -> String {
        self.t("rheo_rs_claims")
    }
    pub(crate) fn scheduled(&self) -> String {
        self.t("rheo_rs_scheduled")
    }
}

/// The idempotent DDL, in order: tables, then indexes (`docs/guides/sql.md`
/// shows it for a DBA to review).
pub(crate) fn ddl(d: Dialect, names: &Names) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(s) = names.schema() {
        out.push(format!("CREATE SCHEMA IF NOT EXISTS \"{}\"", s.replace('"', "\"\"")));
    }
    for t in TABLES {
        let mut cols: Vec<String> = t
            .columns
            .iter()
            .map(|c| {
                let mut s = format!("{} {}", quote_col(c.name), sql_type(d, c.kind));
                if c.not_null {
                    s.push_str(" NOT NULL");
                }
                if let Some(def) = c.default {
                    s.push_str(" DEFAULT ");
                    s.push_str(def);
                }
                s
            })
            .collect();
        let key: Vec<String> = t.key.iter().map(|c| quote_col(c)).collect();
        cols.push(format!("PRIMARY KEY ({})", key.join(", ")));
        out.push(format!("CREATE TABLE IF NOT EXISTS {} ({})", names.t(t.name), cols.join(", ")));
    }
    // Claims change on every settle and are few: room in their pages keeps
    // those updates HOT (no new index entries).
    if d == Dialect::Postgres {
        out.push(format!("ALTER TABLE {} SET (fillfactor = 50)", names.claims()));
    }
    for (name, table, cols, unique) in INDEXES {
        let cols: Vec<String> = cols.iter().map(|c| quote_col(c)).collect();
        out.push(format!(
            "CREATE {}INDEX IF NOT EXISTS {name} ON {} ({})",
            if *unique { "UNIQUE " } else { "" },
            names.t(table),
            cols.join(", ")
        ));
    }
    out
}
