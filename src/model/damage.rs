//! Damage: a stored record that failed a check, and where it is.
//!
//! Reads that meet damage keep it to the positions it covers: a fetch
//! claims what it can read and reports the rest as [`Damage`] (see
//! [`crate::Rheo::fetch_report`]), a dead-letter listing shows a damaged
//! entry with its damage instead of failing (see
//! [`crate::DeadLetter::damage`]). An operator gets past a damaged position
//! with [`crate::Rheo::skip`] or by restoring the file (the operations
//! guide's runbook).

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// A position of a stream whose stored record can't be read: its record
/// failed a check (a checksum, a length, a sequence), or damage just
/// before it leaves no trusted way to it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Damage {
    /// The stream.
    pub stream: String,
    /// The partition of the position.
    pub partition: u32,
    /// The sequence of the position.
    pub sequence: u64,
    /// The file that holds (or should hold) the record.
    pub file: PathBuf,
    /// The byte offset of the damage in that file.
    pub offset: u64,
    /// What check failed.
    pub reason: String,
}

impl Damage {
    /// The damage of a position, from the `Error::Corrupt` its read gave;
    /// None for any other error (which is not damage: an I/O failure, say).
    pub(crate) fn from_error(stream: &str, partition: u32, sequence: u64, e: &Error) -> Option<Damage> {
        match e {
            Error::Corrupt { file, offset, reason, .. } => Some(Damage {
                stream: stream.to_owned(),
                partition,
                sequence,
                file: file.clone(),
                offset: *offset,
                reason: reason.clone(),
            }),
            _ => None,
        }
    }

    /// The same damage as an [`Error::Corrupt`] naming the position.
    pub fn to_error(&self) -> Error {
        Error::Corrupt { file: self.file.clone(), offset: self.offset, reason: self.to_string(), source: None }
    }
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stream {:?} partition {} sequence {} can't be read: {} at offset {} of {}",
            self.stream,
            self.partition,
            self.sequence,
            self.reason,
            self.offset,
            self.file.display()
        )
    }
}
