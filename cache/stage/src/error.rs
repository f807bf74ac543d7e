//! How staging one file fails: the source's and the store's errors, and the ways a
//! copy itself goes wrong.

use std::path::PathBuf;
use std::time::Duration;

use stagefs_control::Remedy;
use stagefs_source::SourceError;
use stagefs_store::StoreError;
use thiserror::Error;

/// Failures of staging one file into the cache.
#[derive(Debug, Clone, Error)]
pub enum StageError {
    /// Reading the source failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// Writing the cache failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The source file changed (size, mtime or length read) while it was being copied;
    /// the copy was discarded.
    #[error("{path}: the source file changed while it was being copied; the copy was discarded")]
    SourceChanged {
        /// Path relative to the source root.
        path: PathBuf,
    },
    /// The copied bytes do not hash to the sha256 an LFS blob is named by.
    #[error(
        "{path}: the copied bytes do not match the sha256 in the blob's name (the source changed during the copy, or the blob on the source is corrupt); the copy was discarded"
    )]
    ContentMismatch {
        /// Path relative to the source root.
        path: PathBuf,
    },
    /// A renamed file's copy, written through the mount, was gone by the time it
    /// was to be committed under the new name (an open then copies from the source).
    #[error("{path}: the copy written under its old name is gone")]
    NoWrittenCopy {
        /// Path relative to the source root.
        path: PathBuf,
    },
    /// The copy read nothing for `idle` (a source that hangs mid-file): the caller
    /// stopped waiting ([`crate::Stager::stage_version_within`]). The copy itself goes
    /// on, detached, and commits only if it ends whole and unchanged.
    #[error("{path}: the copy read nothing for {}s; stopped waiting for it", idle.as_secs())]
    Stalled {
        /// Path relative to the source root.
        path: PathBuf,
        /// How long it read nothing.
        idle: Duration,
    },
    /// The path is not a regular file, so there is nothing to stage.
    #[error("{path}: not a regular file")]
    NotAFile {
        /// Path relative to the source root.
        path: PathBuf,
    },
    /// The worker running the copy died (panicked or was cancelled).
    #[error("{path}: the staging worker failed: {reason}")]
    Worker {
        /// Path relative to the source root.
        path: PathBuf,
        /// What the runtime reported.
        reason: String,
    },
}

impl StageError {
    /// What would avoid this error, if the user can change anything.
    pub fn remedy(&self) -> Option<Remedy> {
        match self {
            StageError::Store(e) => e.remedy(),
            _ => None,
        }
    }
}
