//! Query paths: which names read which value of an event. Every reader of
//! a path (queries, [`Event::field`](crate::Event::field), the index
//! builder) goes by these rules.

/// The metadata entry holding an event's scheduled delivery time
/// (milliseconds since the Unix epoch): see
/// [`AppendOptions::deliver_at`](crate::AppendOptions::deliver_at).
pub const DELIVER_AT: &str = "deliver_at";

/// The lineage metadata keys.
pub const LINEAGE_FIELDS: [&str; 5] = ["correlation_id", "causation_id", "producer", "schema", "schema_version"];

/// The canonical form of a query path, so that paths that read the same
/// value have one name (the name an index on them has): `currency` and
/// `payload.currency` are `payload.currency`; `metadata.producer` is
/// `producer`. `None` for the fields the log itself orders and bounds
/// (`stream`, `partition`, `sequence`, `timestamp`), which need no index.
///
/// ```
/// assert_eq!(rheo::canonical_path("order.customer_id").as_deref(), Some("payload.order.customer_id"));
/// assert_eq!(rheo::canonical_path("metadata.producer").as_deref(), Some("producer"));
/// assert_eq!(rheo::canonical_path("sequence"), None);
/// ```
pub fn canonical_path(path: &str) -> Option<String> {
    match path {
        "stream" | "partition" | "sequence" | "timestamp" => None,
        "id" | "key" | "type" => Some(path.to_owned()),
        _ if LINEAGE_FIELDS.contains(&path) => Some(path.to_owned()),
        _ => {
            if let Some(rest) = path.strip_prefix("metadata.") {
                if LINEAGE_FIELDS.contains(&rest) {
                    return Some(rest.to_owned());
                }
                return Some(format!("metadata.{rest}"));
            }
            Some(format!("payload.{}", path.strip_prefix("payload.").unwrap_or(path)))
        }
    }
}

/// True when a query path names a value: it is not empty and has no empty
/// dotted segment (`payload.`, `.a`, `a..b` name nothing). This is the one
/// rule for every reader of a path: queries refuse such paths,
/// [`Event::field`](crate::Event::field) answers `None` for them, and the
/// index builder never indexes them, so a payload key `""` is reachable by
/// no path.
///
/// ```
/// assert!(rheo::is_valid_path("order.total"));
/// assert!(!rheo::is_valid_path("payload."));
/// assert!(!rheo::is_valid_path("a..b"));
/// ```
pub fn is_valid_path(path: &str) -> bool {
    !path.split('.').any(str::is_empty)
}
