//! The engine's own errors, in two layers under the portable
//! [`crate::Error`]:
//!
//! - [`DecodeError`]: what a decoder of a file format found wrong with the
//!   bytes (no file, no offset: the caller knows where it read them);
//! - [`StorageError`]: a storage failure with the file and the operation,
//!   the system's `io::Error` kept as it was.
//!
//! Each becomes a [`crate::Error`] (`Corrupt`, `UnsupportedVersion`,
//! `NoSpace`, `Locked`, `Poisoned`, `Failed`) that keeps it as its
//! [`source`](std::error::Error::source), so a program can walk down to the
//! `io::Error` (see [`crate::Error::io_error_kind`]) and an operator still
//! reads one complete line.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use super::vfs::Vfs;
use crate::error::Error;

pub use crate::decode::DecodeError;

/// A storage failure, with the file and what was being done to it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// An I/O call failed.
    #[error("{op} {}: {source}", file.display())]
    Io {
        /// What was being done (`read`, `write`, `fsync`, `rename`, ...).
        op: &'static str,
        /// The file (or directory).
        file: PathBuf,
        /// What the system said.
        #[source]
        source: io::Error,
    },
    /// Bytes read from a file failed a check.
    #[error("corrupt data in {} at offset {offset}: {source}", file.display())]
    Corrupt {
        /// The file.
        file: PathBuf,
        /// The byte offset of the bad data.
        offset: u64,
        /// What the decoder found.
        #[source]
        source: DecodeError,
    },
}

impl StorageError {
    /// True for a full disk or quota (`ENOSPC`, `EDQUOT`).
    pub fn is_no_space(&self) -> bool {
        matches!(self, StorageError::Io { source, .. } if is_no_space(source))
    }
}

/// True for a full disk or quota (`ENOSPC`, `EDQUOT`).
pub(crate) fn is_no_space(e: &io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(e.kind(), ErrorKind::StorageFull | ErrorKind::QuotaExceeded) || matches!(e.raw_os_error(), Some(28 | 122))
}

impl From<StorageError> for Error {
    /// An I/O failure is `NoSpace` when the disk is full (nothing was
    /// changed), else `Failed` (definitely not done); a failed check is
    /// `Corrupt` (or `UnsupportedVersion`). The storage error stays the
    /// source.
    fn from(e: StorageError) -> Error {
        match &e {
            StorageError::Io { op, file, source } if is_no_space(source) => {
                let (file, reason) = (file.clone(), format!("{op}: {source}"));
                Error::NoSpace { file, reason, source: Some(Arc::new(e)) }
            }
            StorageError::Io { .. } => Error::Failed { operation: "storage", cause: Arc::new(e) },
            StorageError::Corrupt { file, source: DecodeError::Version { found, supported, .. }, .. } => {
                Error::UnsupportedVersion { file: file.clone(), found: *found, supported: *supported }
            }
            StorageError::Corrupt { file, offset, source } => {
                let (file, offset, reason) = (file.clone(), *offset, source.to_string());
                Error::Corrupt { file, offset, reason, source: Some(Arc::new(e)) }
            }
        }
    }
}

/// A failed `fsync` (or a write the engine cannot take back): the kernel
/// may have dropped dirty pages, so the engine refuses writes until it is
/// reopened. The `io::Error` stays the source.
pub(crate) fn poisoned(scope: impl Into<String>, what: &str, e: io::Error) -> Error {
    let reason = format!("{what}: {e}");
    Error::Poisoned { scope: scope.into(), reason, source: Some(Arc::new(e)) }
}

/// A failed sync of `path`: the kernel may have dropped the dirty pages, so
/// the caller must poison the engine (see `VfsFile::sync_data`).
pub(crate) fn sync_err(vfs: &dyn Vfs, path: &str, e: io::Error) -> Error {
    poisoned(vfs.describe(path).display().to_string(), "fsync failed", e)
}

/// An I/O failure on `path` as a definite failure naming the file and the
/// operation: a full disk or quota is `Error::NoSpace`, anything else
/// `Error::Failed`; the [`StorageError`] is the source either way.
pub(crate) fn io_err(vfs: &dyn Vfs, path: &str, op: &'static str, e: io::Error) -> Error {
    StorageError::Io { op, file: vfs.describe(path), source: e }.into()
}

/// Bad bytes at `offset` of `path`, as `Error::Corrupt` (or
/// `UnsupportedVersion`) with the decoder's error underneath.
pub(crate) fn corrupt(vfs: &dyn Vfs, path: &str, offset: u64, e: impl Into<DecodeError>) -> Error {
    StorageError::Corrupt { file: vfs.describe(path), offset, source: e.into() }.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn a_storage_failure_keeps_the_io_error_as_its_source() {
        let full = io::Error::from_raw_os_error(28);
        let e: Error = StorageError::Io { op: "write", file: "/d/x.log".into(), source: full }.into();
        assert!(e.is_no_space(), "{e}");
        assert_eq!(e.io_error_kind(), Some(io::ErrorKind::StorageFull));
        assert!(e.to_string().contains("/d/x.log"), "{e}");
        let storage = e.cause().and_then(|c| c.downcast_ref::<StorageError>()).expect("the storage error");
        assert!(storage.is_no_space(), "{storage}");
        assert!(storage.source().and_then(|s| s.downcast_ref::<io::Error>()).is_some(), "{storage}");

        let denied = io::Error::from(io::ErrorKind::PermissionDenied);
        let e: Error = StorageError::Io { op: "open", file: "/d/y".into(), source: denied }.into();
        assert!(matches!(e, Error::Failed { operation: "storage", .. }), "{e}");
        assert_eq!(e.io_error_kind(), Some(io::ErrorKind::PermissionDenied));
        assert!(e.to_string().contains("open /d/y"), "{e}");

        let bad =
            StorageError::Corrupt { file: "/d/z".into(), offset: 7, source: DecodeError::Checksum { what: "record" } };
        let e: Error = bad.into();
        assert!(matches!(&e, Error::Corrupt { offset: 7, reason, .. } if reason == "record checksum mismatch"), "{e}");
        let decode = e.cause().and_then(|c| c.source()).and_then(|s| s.downcast_ref::<DecodeError>());
        assert_eq!(decode, Some(&DecodeError::Checksum { what: "record" }));

        let newer = DecodeError::Version { kind: "segment", found: 9, supported: 1 };
        let e: Error = StorageError::Corrupt { file: "/d/s".into(), offset: 0, source: newer }.into();
        assert!(matches!(e, Error::UnsupportedVersion { found: 9, supported: 1, .. }), "{e}");

        let e = poisoned("/d", "fsync", io::Error::from_raw_os_error(5));
        assert!(matches!(e, Error::Poisoned { .. }) && e.io_error_kind().is_some(), "{e}");
    }
}
