//! Streams: their options (`create_stream`), what `stream_info` says, and
//! the secondary indexes a stream keeps.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::limits::MAX_PARTITIONS;
use super::retention::{PartitionInfo, Retention};
use super::time::Timestamp;
use crate::error::{Error, Result};

/// Options of `create_stream`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StreamOptions {
    /// How many partitions (1 to [`MAX_PARTITIONS`]) (default: 1).
    pub partition_count: u32,
    /// Payload fields to index beyond the always-indexed ones.
    pub indexes: Vec<String>,
    /// How much of the log is kept (default: everything). Change it later
    /// with [`crate::Rheo::set_retention`].
    #[serde(default)]
    pub retention: Retention,
    /// How long the native backend remembers producer-given event ids to
    /// answer a retried append with its original (None: the backend's
    /// setting, by default 2 minutes; zero: off). The other backends check
    /// ids forever through their unique key and ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedupe_window: Option<Duration>,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions { partition_count: 1, indexes: Vec::new(), retention: Retention::default(), dedupe_window: None }
    }
}

impl StreamOptions {
    /// One partition, no extra indexes.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets the partition count.
    pub fn partitions(mut self, n: u32) -> Self {
        self.partition_count = n;
        self
    }
    /// Declares indexed payload fields (dotted paths).
    pub fn indexes<I, S>(mut self, fields: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.indexes = fields.into_iter().map(Into::into).collect();
        self
    }
    /// Sets the retention (see [`Retention`]).
    pub fn retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }
    /// Sets the native backend's dedupe window for this stream (zero: off).
    pub fn dedupe_window(mut self, window: Duration) -> Self {
        self.dedupe_window = Some(window);
        self
    }

    pub(crate) fn validate(&self, stream: &str) -> Result<()> {
        if self.partition_count == 0 || self.partition_count > MAX_PARTITIONS {
            return Err(Error::InvalidPartitionCount {
                stream: stream.to_owned(),
                count: self.partition_count,
                max: MAX_PARTITIONS,
            });
        }
        if self.indexes.len() > MAX_INDEXES {
            return Err(Error::invalid(
                "indexes",
                format!("stream {stream:?} declares {} indexes, above the maximum {MAX_INDEXES}", self.indexes.len()),
            ));
        }
        for f in &self.indexes {
            super::query::check_index_field(stream, f)?;
        }
        self.retention.validate(stream)?;
        if self.dedupe_window.is_some_and(|w| w > super::retention::MAX_DEDUPE_WINDOW) {
            return Err(Error::invalid(
                "dedupe_window",
                format!("stream {stream:?}: the dedupe window is at most a day"),
            ));
        }
        Ok(())
    }
}

/// How far an index is built on a stream (see `Rheo::create_index`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct IndexStatus {
    /// The field, canonical (see [`crate::canonical_path`]).
    pub field: String,
    /// Segments (over all partitions) whose index covers it.
    pub segments_ready: u64,
    /// All segments (0 on a backend without segments, where an index is
    /// ready at once).
    pub segments_total: u64,
    /// Segments whose index could not be built (a read error; logged):
    /// queries scan them, and the build is retried after a while.
    pub segments_failed: u64,
}

impl IndexStatus {
    /// True when every segment's index covers the field.
    pub fn ready(&self) -> bool {
        self.segments_ready >= self.segments_total
    }
}

/// The most fields a stream may declare for indexing.
pub const MAX_INDEXES: usize = 64;

/// A stream as listed by `list_streams`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StreamInfo {
    /// Its name.
    pub name: String,
    /// Its partition count.
    pub partition_count: u32,
    /// Its declared payload indexes.
    pub indexes: Vec<String>,
    /// The high watermark of each partition, in partition order.
    pub high_watermarks: Vec<u64>,
    /// When it was created.
    pub created_at: Timestamp,
    /// Each partition's first and last sequence and size, in partition
    /// order: filled by `stream_info` on every backend, and by
    /// `list_streams` on memory and native only (the database backends
    /// would scan every stream; they leave it empty there).
    #[serde(default)]
    pub partitions: Vec<PartitionInfo>,
    /// Its retention (from `stream_info` on every backend; the database
    /// backends' `list_streams` leaves the default).
    #[serde(default)]
    pub retention: Retention,
    /// How long a producer-given event id is remembered: None when forever
    /// (the backend's unique key), zero when not at all.
    #[serde(default, with = "super::retention::opt_ms", skip_serializing_if = "Option::is_none")]
    pub dedupe_window: Option<Duration>,
}

impl StreamInfo {
    /// A stream's description; `partitions` empty, the retention unlimited
    /// and ids checked forever until the backend says otherwise.
    pub fn new(
        name: &str,
        partition_count: u32,
        indexes: Vec<String>,
        high_watermarks: Vec<u64>,
        created_at: Timestamp,
    ) -> Self {
        StreamInfo {
            name: name.to_owned(),
            partition_count,
            indexes,
            high_watermarks,
            created_at,
            partitions: Vec::new(),
            retention: Retention::default(),
            dedupe_window: None,
        }
    }
    /// Sets the partitions' bounds and sizes (and the high watermarks from them).
    pub fn with_partitions(mut self, partitions: Vec<PartitionInfo>) -> Self {
        self.high_watermarks = partitions.iter().map(|p| p.last_sequence).collect();
        self.partitions = partitions;
        self
    }
    /// Sets the retention and dedupe window it reports.
    pub fn with_options(mut self, retention: Retention, dedupe_window: Option<Duration>) -> Self {
        self.retention = retention;
        self.dedupe_window = dedupe_window;
        self
    }
    /// Bytes stored, over every partition.
    pub fn bytes(&self) -> u64 {
        self.partitions.iter().map(|p| p.bytes).sum()
    }
}
