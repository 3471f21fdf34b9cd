//! Segment files: record framing, headers, footers, index entries, scans.

pub mod file;
pub mod format;
pub mod record;
pub mod scan;
