//! [`DecodeError`]: what a decoder found wrong with stored bytes. It sits
//! below both the data model (an event's stored document) and the engine
//! (every file format), which report damage with it; the engine wraps it
//! with the file and offset (`engine::error::StorageError::Corrupt`).

/// What a decoder found wrong with the bytes of a file format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Not a file of this kind: its magic is wrong, or it is shorter than
    /// its header.
    #[error("not a {kind} (bad magic or shorter than its header)")]
    NotThisKind {
        /// The kind of file expected (`segment`, `delivery WAL`, ...).
        kind: &'static str,
    },
    /// A checksum does not match the bytes it covers.
    #[error("{what} checksum mismatch")]
    Checksum {
        /// What the checksum covers (`segment header`, `record`, ...).
        what: &'static str,
    },
    /// Written by a format version this build does not read.
    #[error("{kind} version {found} is not supported (this build reads {supported})")]
    Version {
        /// The kind of file.
        kind: &'static str,
        /// The version found.
        found: u16,
        /// The version this build reads.
        supported: u16,
    },
    /// The bytes end inside a structure.
    #[error("{0}")]
    Truncated(String),
    /// A field holds a value the format does not allow.
    #[error("{0}")]
    Invalid(String),
}

impl DecodeError {
    /// An invalid field, described.
    pub fn invalid(what: impl Into<String>) -> Self {
        DecodeError::Invalid(what.into())
    }

    /// Bytes that end inside a structure, described.
    pub fn truncated(what: impl Into<String>) -> Self {
        DecodeError::Truncated(what.into())
    }
}

impl From<String> for DecodeError {
    fn from(what: String) -> Self {
        DecodeError::Invalid(what)
    }
}

impl From<&str> for DecodeError {
    fn from(what: &str) -> Self {
        DecodeError::Invalid(what.to_owned())
    }
}
