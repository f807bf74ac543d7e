//! How the on-disk cache store fails.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use stagefs_control::units::format_bytes;
use stagefs_control::{Budget, Remedy};
use stagefs_source::error::{SharedIo, io_text};
use thiserror::Error;

/// Failures of the on-disk cache store.
#[derive(Debug, Clone, Error)]
pub enum StoreError {
    /// The cache volume has no room left for this file.
    #[error("{path}: the cache disk is full")]
    NoSpace {
        /// The cache path being written.
        path: PathBuf,
    },
    /// The cache budget cannot make room for this file, even after evicting every
    /// copy not in use.
    #[error(
        "{path}: needs {} but the cache cannot make room ({}; {} in use, {} free on the volume)",
        format_bytes(*needed), describe_budget(budget), format_bytes(*in_use), format_bytes(*available)
    )]
    NoRoom {
        /// The source file that did not fit.
        path: PathBuf,
        /// Its size.
        needed: u64,
        /// The limits in force.
        budget: Budget,
        /// Bytes that could not be evicted because they are open or being staged.
        in_use: u64,
        /// Free bytes on the cache volume.
        available: u64,
    },
    /// The copy is open or being staged, so it cannot be removed.
    #[error("{path}: in use (open, being staged, or its link followed a moment ago)")]
    InUse {
        /// The source path of the copy.
        path: PathBuf,
    },
    /// Another process holds the cache directory's lock.
    #[error("{path}: the cache directory is in use by another stagefs process (a mount, or a command working on the cache){}", pid.map(|p| format!(", pid {p}")).unwrap_or_default())]
    Locked {
        /// The lock file.
        path: PathBuf,
        /// The holder, if it recorded itself.
        pid: Option<u32>,
    },
    /// Any other I/O failure in the cache directory.
    #[error("{}: cache I/O failed: {}", path.display(), io_text(source))]
    Io {
        /// The cache path involved.
        path: PathBuf,
        /// The underlying error.
        source: SharedIo,
    },
}

impl StoreError {
    /// What would avoid this error, if the user can change anything.
    pub fn remedy(&self) -> Option<Remedy> {
        matches!(self, StoreError::NoRoom { .. }).then_some(Remedy::MoreRoom)
    }

    /// A failed I/O on the cache path `path`: a full volume is [`StoreError::NoSpace`].
    pub fn io(path: impl Into<PathBuf>, err: io::Error) -> Self {
        let path = path.into();
        // Wrapped errors (tempfile adds the path) keep their kind but lose the errno.
        if err.raw_os_error() == Some(libc::ENOSPC) || err.kind() == io::ErrorKind::StorageFull {
            StoreError::NoSpace { path }
        } else {
            StoreError::Io {
                path,
                source: Arc::new(err),
            }
        }
    }
}

fn describe_budget(budget: &Budget) -> String {
    let max = budget.max_size.map_or("no size limit".to_string(), |m| {
        format!("size limit {}", format_bytes(m))
    });
    let free = budget
        .min_free
        .map_or("no free-space reserve".to_string(), |m| {
            format!("free-space reserve {}", format_bytes(m))
        });
    format!("{max}, {free}")
}
