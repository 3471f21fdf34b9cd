//! Validation of user-supplied names and limits shared by every backend.

use crate::error::{Error, ObjectKind, Result};

/// The longest stream, group or consumer name, in bytes.
pub const MAX_NAME_BYTES: usize = 255;
/// The largest partition count of a stream.
pub const MAX_PARTITIONS: u32 = 4096;
/// The default maximum encoded size of one event (1 MiB).
pub const DEFAULT_MAX_EVENT_BYTES: usize = 1 << 20;
/// The most events one `append_batch` call accepts.
pub const MAX_BATCH_EVENTS: usize = 10_000;
/// The largest `limit` of a fetch, read, query page or dead-letter listing.
pub const MAX_LIMIT: usize = 10_000;
/// The longest lease or retry delay accepted (24 hours).
pub const MAX_LEASE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
/// The longest retry or reject reason, in bytes.
pub const MAX_REASON_BYTES: usize = 4096;
/// The most filters in one query, and the most values in one `in` filter.
pub const MAX_QUERY_TERMS: usize = 1024;
/// The largest `max_attempts` of a group.
pub const MAX_ATTEMPTS: u32 = 1_000_000;

/// Checks a stream, group or consumer name: non-empty UTF-8, at most
/// [`MAX_NAME_BYTES`] bytes, no NUL or other control characters.
///
/// ```
/// use rheo::{validate_name, ObjectKind};
/// assert!(validate_name(ObjectKind::Stream, "orders.v2").is_ok());
/// assert!(validate_name(ObjectKind::Stream, "").is_err());
/// assert!(validate_name(ObjectKind::Group, "a\0b").is_err());
/// ```
pub fn validate_name(kind: ObjectKind, name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        "must not be empty"
    } else if name.len() > MAX_NAME_BYTES {
        "must be at most 255 bytes"
    } else if name.chars().any(char::is_control) {
        "must not contain NUL or control characters"
    } else {
        return Ok(());
    };
    let mut shown: String = name.chars().take(64).collect();
    if shown.len() < name.len() {
        shown.push('…');
    }
    Err(Error::InvalidName { kind, name: shown, reason })
}

/// Checks a `limit` argument: between 1 and [`MAX_LIMIT`].
pub(crate) fn validate_limit(argument: &'static str, limit: usize) -> Result<()> {
    if limit == 0 || limit > MAX_LIMIT {
        return Err(Error::invalid(argument, format!("{limit} is outside 1..={MAX_LIMIT}")));
    }
    Ok(())
}

/// Checks a lease or delay duration: above zero and at most [`MAX_LEASE`].
pub(crate) fn validate_lease(argument: &'static str, d: std::time::Duration) -> Result<()> {
    if d.is_zero() || d > MAX_LEASE {
        return Err(Error::invalid(argument, format!("{d:?} is outside (0, 24h]")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_at_the_byte_limit() {
        assert!(validate_name(ObjectKind::Stream, &"x".repeat(255)).is_ok());
        assert!(validate_name(ObjectKind::Stream, &"x".repeat(256)).is_err());
        // multi-byte characters count in bytes
        assert!(validate_name(ObjectKind::Stream, &"é".repeat(128)).is_err());
    }

    #[test]
    fn path_like_names_are_just_names() {
        assert!(validate_name(ObjectKind::Stream, "../../etc/passwd").is_ok());
        assert!(validate_name(ObjectKind::Stream, "line\nbreak").is_err());
    }
}
