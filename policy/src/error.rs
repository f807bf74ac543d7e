//! The policy's error type and the one place where errors become errno values; each
//! adapter passes the errno on (FUSE) or turns it into its protocol's status (NFS).
//!
//! The matches below are exhaustive on purpose: a new core error variant does not
//! compile until someone decides what the kernel should see for it.

use std::io;

use stagefs_control::Remedy;
use stagefs_source::SourceError;
use stagefs_stage::{StageError, StoreError};
use thiserror::Error;

/// Why a filesystem request failed.
#[derive(Debug, Error)]
pub enum FsError {
    /// Reading the source failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// Staging the file failed.
    #[error(transparent)]
    Stage(#[from] StageError),
    /// Reading an open file failed.
    #[error("reading an open file failed: {0}")]
    Read(#[source] io::Error),
    /// The kernel named an inode this mount never handed out.
    #[error("unknown inode {0}")]
    UnknownInode(u64),
    /// The kernel named a file handle that is not open.
    #[error("unknown file handle {0}")]
    UnknownHandle(u64),
    /// The inode describes an older version of the file than the source now has;
    /// the kernel retries the path lookup on ESTALE and gets the new version.
    #[error("the source file changed since it was looked up")]
    Stale,
    /// The mount is read-only.
    #[error("the mount is read-only (--read-only)")]
    ReadOnly,
    /// The name may not be created here (the Finder's `._*` files on macOS).
    #[error("not permitted")]
    NotPermitted,
    /// A write through a handle that was not opened for writing.
    #[error("the file handle is not open for writing")]
    NotOpenForWriting,
    /// The kernel asked for a directory operation on a non-directory.
    #[error("not a directory")]
    NotADirectory,
    /// A file operation (open, read, write) on a directory.
    #[error("is a directory")]
    IsADirectory,
    /// The source did not answer (or a copy made no progress) within the source timeout.
    #[error("{path}: the source did not respond within {secs} s")]
    SourceTimeout {
        /// What was being accessed, relative to the source root.
        path: std::path::PathBuf,
        /// The timeout.
        secs: u64,
    },
}

impl FsError {
    /// The errno the kernel passes on to the caller.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::Source(e) => source_errno(e),
            FsError::Stage(e) => stage_errno(e),
            FsError::Read(e) => io_errno(e),
            FsError::UnknownInode(_) | FsError::UnknownHandle(_) | FsError::Stale => libc::ESTALE,
            FsError::ReadOnly => libc::EROFS,
            FsError::NotADirectory => libc::ENOTDIR,
            FsError::IsADirectory => libc::EISDIR,
            FsError::NotPermitted => libc::EPERM,
            FsError::NotOpenForWriting => libc::EBADF,
            FsError::SourceTimeout { .. } => libc::EIO,
        }
    }

    /// What would avoid this error, if the user can change anything.
    pub fn remedy(&self) -> Option<Remedy> {
        match self {
            FsError::Stage(e) => e.remedy(),
            FsError::SourceTimeout { .. } => Some(Remedy::LongerSourceTimeout),
            _ => None,
        }
    }

    /// This error as a log line: its text, then the front end's advice, if any.
    pub fn described(&self, hint: Option<fn(Remedy) -> &'static str>) -> String {
        match self.remedy().zip(hint) {
            Some((remedy, hint)) => format!("{self}; {}", hint(remedy)),
            None => self.to_string(),
        }
    }

    /// Whether this says the source is away (no answer, a dead or vanished mount, a
    /// lost server) rather than anything about the request.
    pub fn is_source_away(&self) -> bool {
        match self {
            FsError::Source(e) | FsError::Stage(StageError::Source(e)) => e.is_away(),
            FsError::Read(e) => stagefs_source::is_away_errno(e),
            FsError::SourceTimeout { .. } => true,
            _ => false,
        }
    }

    /// Whether this failure is an expected answer (a missing name) rather than a fault:
    /// expected ones are logged at debug so lookups of absent files do not flood logs.
    pub fn is_expected(&self) -> bool {
        matches!(
            self,
            FsError::Source(SourceError::NotFound { .. }) | FsError::Stale | FsError::ReadOnly
        )
    }
}

fn source_errno(e: &SourceError) -> i32 {
    match e {
        SourceError::NotFound { .. } => libc::ENOENT,
        SourceError::OutsideRoot { .. } => libc::EINVAL,
        // ENOTCONN, ESTALE and the network errnos mean nothing to a loader; EIO does.
        SourceError::Unanswered { .. }
        | SourceError::Away { .. }
        | SourceError::Unmounted { .. } => libc::EIO,
        SourceError::Io { source, .. } | SourceError::Write { source, .. } => io_errno(source),
        SourceError::NoSpace { .. } => libc::ENOSPC,
        SourceError::ReadOnly { .. } => libc::EROFS,
    }
}

fn stage_errno(e: &StageError) -> i32 {
    match e {
        StageError::Source(e) => source_errno(e),
        StageError::Store(StoreError::NoSpace { .. } | StoreError::NoRoom { .. }) => libc::ENOSPC,
        StageError::Store(StoreError::InUse { .. }) => libc::EBUSY,
        // Whatever went wrong in our own cache directory, the caller sees an I/O error.
        StageError::Store(StoreError::Io { .. } | StoreError::Locked { .. }) => libc::EIO,
        StageError::SourceChanged { .. }
        | StageError::ContentMismatch { .. }
        | StageError::NoWrittenCopy { .. }
        | StageError::Worker { .. }
        | StageError::Stalled { .. } => libc::EIO,
        StageError::NotAFile { .. } => libc::EISDIR,
    }
}

// Source errors keep their errno (EACCES stays EACCES); anything without one is EIO.
fn io_errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;

    use super::*;

    #[test]
    fn representative_mappings() {
        let nf = FsError::Source(SourceError::NotFound {
            path: PathBuf::from("x"),
        });
        assert_eq!(nf.errno(), libc::ENOENT);
        assert!(nf.is_expected());
        let acces = FsError::Source(SourceError::Io {
            path: PathBuf::from("x"),
            source: Arc::new(io::Error::from_raw_os_error(libc::EACCES)),
        });
        assert_eq!(acces.errno(), libc::EACCES);
        let changed = FsError::Stage(StageError::SourceChanged {
            path: PathBuf::from("x"),
        });
        assert_eq!(changed.errno(), libc::EIO);
        let full = FsError::Stage(StageError::Store(StoreError::NoSpace {
            path: PathBuf::from("x"),
        }));
        assert_eq!(full.errno(), libc::ENOSPC);
        assert_eq!(FsError::ReadOnly.errno(), libc::EROFS);
    }

    #[test]
    fn the_front_end_adds_its_advice_to_conditions_a_user_can_change() {
        let timeout = FsError::SourceTimeout {
            path: PathBuf::from("x"),
            secs: 30,
        };
        assert_eq!(timeout.remedy(), Some(Remedy::LongerSourceTimeout));
        assert_eq!(
            timeout.described(None),
            "x: the source did not respond within 30 s"
        );
        let hint: fn(Remedy) -> &'static str = |_| "try waiting longer";
        assert_eq!(
            timeout.described(Some(hint)),
            "x: the source did not respond within 30 s; try waiting longer"
        );
        assert_eq!(
            FsError::ReadOnly.described(Some(hint)),
            "the mount is read-only (--read-only)"
        );
    }
}
