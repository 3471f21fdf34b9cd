//! The dialect seam: the few places where PostgreSQL and SQLite SQL differ
//! (placeholders, column types, timestamps, JSON access). Everything else
//! in the SQL core is one text for both.

use crate::model::time::Timestamp;

/// One bound value.
#[derive(Debug, Clone)]
pub(crate) enum Arg {
    I64(i64),
    F64(f64),
    Text(String),
}

/// The SQL dialect of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Postgres,
    Sqlite,
}

impl Dialect {
    /// The backend name errors and metrics give.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Dialect::Postgres => "postgres",
            Dialect::Sqlite => "sqlite",
        }
    }

    /// The placeholder of the n-th (1-based) argument.
    pub(crate) fn placeholder(self, n: usize) -> String {
        match self {
            Dialect::Postgres => format!("${n}"),
            Dialect::Sqlite => format!("?{n}"),
        }
    }

    /// Column types of the shared schema: (json, timestamp, bigint).
    pub(crate) fn json_type(self) -> &'static str {
        match self {
            Dialect::Postgres => "JSONB",
            Dialect::Sqlite => "TEXT",
        }
    }
    pub(crate) fn ts_type(self) -> &'static str {
        match self {
            Dialect::Postgres => "TIMESTAMPTZ",
            Dialect::Sqlite => "TEXT",
        }
    }
    pub(crate) fn bigint_type(self) -> &'static str {
        match self {
            Dialect::Postgres => "BIGINT",
            Dialect::Sqlite => "INTEGER",
        }
    }

    /// How a timestamp is bound: milliseconds (PostgreSQL, converted in
    /// SQL), or the reference's fixed-width text (SQLite).
    pub(crate) fn ts_arg(self, t: Timestamp) -> Arg {
        match self {
            Dialect::Postgres => Arg::I64(t.as_millis()),
            Dialect::Sqlite => Arg::Text(format_ts(t)),
        }
    }

    /// The SQL value of a bound timestamp placeholder.
    pub(crate) fn ts_in(self, ph: &str) -> String {
        match self {
            Dialect::Postgres => format!("('epoch'::timestamptz + {ph}::bigint * interval '1 millisecond')"),
            Dialect::Sqlite => ph.to_owned(),
        }
    }

    /// A timestamp column as `Row::ts` reads it (milliseconds on
    /// PostgreSQL, truncating microseconds; the text on SQLite).
    pub(crate) fn ts_out(self, col: &str) -> String {
        match self {
            Dialect::Postgres => format!("floor(extract(epoch FROM {col}) * 1000)::bigint"),
            Dialect::Sqlite => col.to_owned(),
        }
    }

    /// `now + ms` for a timestamp expression `now` and a bound millisecond count.
    pub(crate) fn ts_plus(self, now: &str, ms_ph: &str) -> String {
        match self {
            Dialect::Postgres => format!("({now} + {ms_ph}::bigint * interval '1 millisecond')"),
            // SQLite never uses the database clock: the core adds in Rust.
            Dialect::Sqlite => format!("strftime('%Y-%m-%dT%H:%M:%f000Z', julianday({now}) + {ms_ph} / 86400000.0)"),
        }
    }

    /// A JSON value from bound text.
    pub(crate) fn json_in(self, ph: &str) -> String {
        match self {
            Dialect::Postgres => format!("{ph}::jsonb"),
            Dialect::Sqlite => ph.to_owned(),
        }
    }

    /// A JSON column as text.
    pub(crate) fn json_out(self, col: &str) -> String {
        match self {
            Dialect::Postgres => format!("{col}::text"),
            Dialect::Sqlite => col.to_owned(),
        }
    }

    /// The rows of a JSON array of arrays: `FROM <this> AS alias` gives
    /// columns `alias.c0 .. alias.c{n-1}` as text.
    pub(crate) fn json_rows(self, arr_ph: &str, n: usize) -> String {
        match self {
            Dialect::Postgres => {
                let cols: Vec<String> = (0..n).map(|i| format!("x.v ->> {i} AS c{i}")).collect();
                format!("(SELECT {} FROM jsonb_array_elements({arr_ph}::jsonb) AS x(v))", cols.join(", "))
            }
            Dialect::Sqlite => {
                let cols: Vec<String> = (0..n).map(|i| format!("json_extract(x.value, '$[{i}]') AS c{i}")).collect();
                format!("(SELECT {} FROM json_each({arr_ph}) AS x)", cols.join(", "))
            }
        }
    }

    /// An inner join whose left side stays the outer loop: SQLite's
    /// `CROSS JOIN` (its planner would otherwise scan the table and parse
    /// a JSON argument once per row); PostgreSQL's planner needs no hint.
    pub(crate) fn ordered_join(self) -> &'static str {
        match self {
            Dialect::Postgres => "JOIN",
            Dialect::Sqlite => "CROSS JOIN",
        }
    }

    /// A text column of `json_rows` as a bigint.
    pub(crate) fn as_int(self, expr: &str) -> String {
        match self {
            Dialect::Postgres => format!("({expr})::bigint"),
            Dialect::Sqlite => format!("CAST({expr} AS INTEGER)"),
        }
    }

    /// Text comparison in byte order (PostgreSQL's default collation may
    /// not be).
    pub(crate) fn bytewise(self, expr: &str) -> String {
        match self {
            Dialect::Postgres => format!("({expr}) COLLATE \"C\""),
            Dialect::Sqlite => expr.to_owned(),
        }
    }

    /// The sort key of a timestamp column in whole milliseconds (rows
    /// written by the reference carry microseconds).
    pub(crate) fn ts_key(self, col: &str) -> String {
        match self {
            Dialect::Postgres => format!("floor(extract(epoch FROM {col}) * 1000)::bigint"),
            Dialect::Sqlite => format!("substr({col}, 1, 23)"),
        }
    }

    /// A bound sort key of `ts_key`.
    pub(crate) fn ts_key_arg(self, t: Timestamp) -> Arg {
        match self {
            Dialect::Postgres => Arg::I64(t.as_millis()),
            Dialect::Sqlite => Arg::Text(format_ts(t)[..23].to_owned()),
        }
    }
}

/// The reference's SQLite timestamp text: fixed width, six fractional
/// digits, so that text order is time order (`2026-01-15T12:00:00.000000Z`).
pub(crate) fn format_ts(t: Timestamp) -> String {
    let s = t.to_string(); // 2026-01-15T12:00:00.123Z
    match s.strip_suffix('Z') {
        Some(head) if head.len() == 23 => format!("{head}000Z"),
        _ => s,
    }
}

/// Reads `format_ts` text, and what the reference writes: any number of
/// fractional digits (truncated to milliseconds), `Z` or `+00:00`, a space
/// or `T` between date and time.
pub(crate) fn parse_ts(s: &str) -> Option<Timestamp> {
    let s = s.trim();
    let b = s.as_bytes();
    if b.len() < 19 {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> { s.get(r)?.parse().ok() };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if b[4] != b'-' || b[7] != b'-' || !(b[10] == b'T' || b[10] == b' ') || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let mut rest = &s[19..];
    let mut ms = 0i64;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits: String = frac.chars().take_while(char::is_ascii_digit).collect();
        rest = &frac[digits.len()..];
        let mut padded = digits.clone();
        padded.push_str("000");
        ms = padded.get(..3)?.parse().ok()?;
    }
    if !(rest.is_empty() || rest == "Z" || rest == "+00:00" || rest == "+0000") {
        return None;
    }
    let days = crate::model::time::days_from_civil(y, mo, d);
    Some(Timestamp::from_millis(((days * 86_400 + h * 3600 + mi * 60 + sec) * 1000) + ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_timestamps_use_the_reference_text_and_read_back() {
        let t = Timestamp::from_millis(1_768_478_400_123);
        assert_eq!(format_ts(t), "2026-01-15T12:00:00.123000Z");
        assert_eq!(parse_ts("2026-01-15T12:00:00.123000Z"), Some(t));
        assert_eq!(parse_ts("2026-01-15T12:00:00.123456Z"), Some(t), "microseconds truncate");
        assert_eq!(parse_ts("2026-01-15 12:00:00.123+00:00"), Some(t));
        assert_eq!(parse_ts("2026-01-15T12:00:00Z"), Some(Timestamp::from_millis(1_768_478_400_000)));
        assert_eq!(parse_ts("1969-12-31T23:59:59.999000Z"), Some(Timestamp::from_millis(-1)));
        for bad in ["", "2026-01-15", "2026/01/15T12:00:00Z", "2026-01-15T12:00:00+02:00"] {
            assert_eq!(parse_ts(bad), None, "{bad:?}");
        }
        let mut order: Vec<String> = [5_000_000_000_000i64, 1, 1_000, 1_768_478_400_123]
            .iter()
            .map(|&ms| format_ts(Timestamp::from_millis(ms)))
            .collect();
        order.sort();
        assert_eq!(order.first().map(String::as_str), Some("1970-01-01T00:00:00.001000Z"), "text order is time order");
    }
}
