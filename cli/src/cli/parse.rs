//! Parsing of command-line values: `--where` conditions, times, JSON values.

use rheo::{Op, Timestamp};
use serde_json::Value;

use super::CliError;

/// A value from the command line: JSON when it parses as JSON (`1`, `true`,
/// `"1"`, `{"a":1}`), else the text as a string.
pub fn value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// Parses one `--where`: `path=value`, `path>value`, `path>=value`,
/// `path<value`, `path<=value`, `path in a,b,c`, `path exists`,
/// `path missing`.
pub fn condition(text: &str) -> Result<(String, Op), CliError> {
    let bad = |why: &str| CliError::usage(format!("--where {text:?}: {why}"));
    let t = text.trim();
    if let Some(path) = t.strip_suffix(" exists") {
        return Ok((checked_path(path, text)?, Op::Exists(true)));
    }
    if let Some(path) = t.strip_suffix(" missing") {
        return Ok((checked_path(path, text)?, Op::Exists(false)));
    }
    if let Some((path, list)) = t.split_once(" in ") {
        let values: Vec<Value> = list.split(',').map(|v| value(v.trim())).collect();
        return Ok((checked_path(path, text)?, Op::In(values)));
    }
    let at = t.find(['=', '<', '>']).ok_or_else(|| {
        bad("expected path=value, path>value, path>=value, path<value, path<=value, 'path in a,b', 'path exists' or 'path missing'")
    })?;
    let (path, rest) = t.split_at(at);
    let (op, v, range): (fn(Value) -> Op, &str, bool) = if let Some(v) = rest.strip_prefix(">=") {
        (Op::Gte, v, true)
    } else if let Some(v) = rest.strip_prefix("<=") {
        (Op::Lte, v, true)
    } else if let Some(v) = rest.strip_prefix('>') {
        (Op::Gt, v, true)
    } else if let Some(v) = rest.strip_prefix('<') {
        (Op::Lt, v, true)
    } else if let Some(v) = rest.strip_prefix("==") {
        (Op::Eq, v, false)
    } else if let Some(v) = rest.strip_prefix('=') {
        (Op::Eq, v, false)
    } else {
        return Err(bad("unknown comparison"));
    };
    let path = checked_path(path, text)?;
    let comparison = &rest[..rest.len() - v.len()];
    let v = v.trim();
    // Unquoted text in a range comparison is almost always a typo of a
    // number: a number field compared with a string never matches.
    if range && serde_json::from_str::<Value>(v).is_err() {
        return Err(bad(&format!(
            "{v} is not a number: a number field compared with text never matches; quote it, {path}{comparison}\"{v}\", to compare text"
        )));
    }
    Ok((path, op(value(v))))
}

fn checked_path(path: &str, text: &str) -> Result<String, CliError> {
    let path = path.trim();
    if path.is_empty() || path.contains(char::is_whitespace) {
        return Err(CliError::usage(format!("--where {text:?}: the field path is empty or has spaces")));
    }
    Ok(path.to_owned())
}

/// A time: RFC 3339 (`2026-11-29T18:14:25Z`, `2026-11-29T18:14:25.5+01:00`,
/// `2026-11-29`) or milliseconds since the Unix epoch.
pub fn time(text: &str) -> Result<Timestamp, CliError> {
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(Timestamp::from_millis(ms));
    }
    text.parse::<Timestamp>().map_err(|_| {
        CliError::usage(format!("{text:?} is not a time (RFC 3339 like 2026-11-29T18:14:25Z, or milliseconds)"))
    })
}

/// Checks a number option: `FLAG VALUE: must be between MIN and MAX UNIT`
/// (a usage error) when it is outside `min..=max`.
pub fn in_range<T: PartialOrd + std::fmt::Display>(
    flag: &str,
    v: T,
    min: T,
    max: T,
    unit: &str,
) -> Result<T, CliError> {
    if v < min || v > max {
        let unit = if unit.is_empty() { String::new() } else { format!(" {unit}") };
        return Err(CliError::usage(format!("{flag} {v}: must be between {min} and {max}{unit}")));
    }
    Ok(v)
}

/// Checks a `--limit`: 1 to [`rheo::MAX_LIMIT`].
pub fn limit(v: usize) -> Result<usize, CliError> {
    in_range("--limit", v, 1, rheo::MAX_LIMIT, "")
}

/// A `--lease` (or `--delay` from `min` 0) in seconds: `min` to
/// [`rheo::MAX_LEASE`].
pub fn seconds(flag: &str, v: u64, min: u64) -> Result<std::time::Duration, CliError> {
    in_range(flag, v, min, rheo::MAX_LEASE.as_secs(), "seconds").map(std::time::Duration::from_secs)
}

/// Parses a byte count: a whole number with an optional binary unit (`K`,
/// `M`, `G`, `T`, also written `KiB`, `MiB`, `GiB`, `TiB`), e.g. `512MiB`.
pub fn bytes(flag: &str, text: &str) -> Result<u64, CliError> {
    let bad = || CliError::usage(format!("{flag} {text:?}: expected a whole number of bytes, e.g. 1073741824 or 1GiB"));
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let shift = match unit {
        "" | "B" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        "T" | "TiB" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1u64 << shift).filter(|&b| b > 0).ok_or_else(bad)
}

/// Parses a duration for a flag (`7d`, `12h`, `30m`, `90s`, `1500ms`).
pub fn duration(flag: &str, text: &str) -> Result<std::time::Duration, CliError> {
    rheo::parse_duration(text).map_err(|_| {
        CliError::usage(format!("{flag} {text:?}: expected a whole number and a unit (ms, s, m, h, d), e.g. 7d"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn where_values_are_json_when_they_parse() {
        assert_eq!(condition("n=1").ok(), Some(("n".into(), Op::Eq(json!(1)))));
        assert_eq!(condition("s=\"1\"").ok(), Some(("s".into(), Op::Eq(json!("1")))));
        assert_eq!(condition("s=abc").ok(), Some(("s".into(), Op::Eq(json!("abc")))));
        assert_eq!(condition("a.b>=2.5").ok(), Some(("a.b".into(), Op::Gte(json!(2.5)))));
        assert_eq!(condition("x<3").ok(), Some(("x".into(), Op::Lt(json!(3)))));
        assert_eq!(condition("t in a,2").ok(), Some(("t".into(), Op::In(vec![json!("a"), json!(2)]))));
        assert_eq!(condition("t exists").ok(), Some(("t".into(), Op::Exists(true))));
        assert_eq!(condition("t missing").ok(), Some(("t".into(), Op::Exists(false))));
        assert!(condition("nothing here").is_err());
        assert!(condition("=1").is_err());
        let err = condition("total>abc").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("abc is not a number") && err.contains(r#"quote it, total>"abc""#), "{err}");
        assert_eq!(condition(r#"total>="abc""#).ok(), Some(("total".into(), Op::Gte(json!("abc")))));
        assert!(condition("n<=x").is_err_and(|e| e.kind() == super::super::ErrorKind::Usage));
    }

    #[test]
    fn ranges_say_the_flag_value_and_bounds() {
        let err = seconds("--lease", 0, 1).err().map(|e| e.to_string());
        assert_eq!(err.as_deref(), Some("--lease 0: must be between 1 and 86400 seconds"));
        assert_eq!(seconds("--delay", 0, 0).ok(), Some(std::time::Duration::ZERO));
        assert_eq!(
            limit(20_000).err().map(|e| e.to_string()).as_deref(),
            Some("--limit 20000: must be between 1 and 10000")
        );
        assert_eq!(limit(10_000).ok(), Some(10_000));
    }

    #[test]
    fn times_parse_as_rfc3339_or_millis() {
        assert_eq!(time("1000").ok(), Some(Timestamp::from_millis(1000)));
        assert_eq!(time("1970-01-01T00:00:01Z").ok(), Some(Timestamp::from_millis(1000)));
        assert_eq!(time("1970-01-01T01:00:01.5+01:00").ok(), Some(Timestamp::from_millis(1500)));
        assert_eq!(
            time("2026-11-29T18:14:25.123Z").map(|t| t.to_string()).ok(),
            Some("2026-11-29T18:14:25.123Z".into())
        );
        assert_eq!(time("1970-01-02").ok(), Some(Timestamp::from_millis(86_400_000)));
        assert!(time("yesterday").is_err());
        assert!(time("2026-13-01T00:00:00Z").is_err());
    }

    #[test]
    fn byte_counts_take_binary_units() {
        assert_eq!(super::bytes("--max-bytes", "1024").ok(), Some(1024));
        assert_eq!(super::bytes("--max-bytes", "512MiB").ok(), Some(512 << 20));
        assert_eq!(super::bytes("--max-bytes", "2G").ok(), Some(2 << 30));
        for bad in ["", "0", "1.5G", "10 GB", "10GB", "99999999999T"] {
            assert!(super::bytes("--max-bytes", bad).is_err(), "{bad}");
        }
    }
}
