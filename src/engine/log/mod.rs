//! Partitions (segment sets, roll, recovery), streams and the manifest.

pub mod manifest;
pub mod partition;
pub mod stream;
pub mod txn;
