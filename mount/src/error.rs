//! Why a mount could not start or ended badly. Each message states the condition;
//! what to try (a flag, a command) is the caller's to add.

use std::io;
use std::path::PathBuf;

use stagefs_source::SourceError;
use stagefs_store::StoreError;

use crate::bounded::Unanswered;
use crate::unmount::UnmountError;

/// A mount that cannot start, or a serving session that failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// An `s3://` source that names no bucket, or an odd prefix.
    #[error(transparent)]
    SourceUrl(#[from] stagefs_s3::UrlError),
    /// An object store that cannot be mirrored: unreachable, credentials refused,
    /// no such bucket, nothing under the prefix.
    #[error(transparent)]
    ObjectStore(#[from] stagefs_s3::ProbeError),
    /// The source did not answer a `stat` within the source timeout.
    #[error("source {} {why}", path.display())]
    SourceUnanswered {
        /// The source as given.
        path: PathBuf,
        /// Late, or the check could not run.
        why: Unanswered,
    },
    /// A directory the mount needs (`what`: "source", "mount point") is missing.
    #[error("{what} {} does not exist", path.display())]
    Missing {
        /// Which one.
        what: &'static str,
        /// As given.
        path: PathBuf,
    },
    /// A path that must be a directory is something else.
    #[error("{what} {} is not a directory", path.display())]
    NotADirectory {
        /// Which one.
        what: &'static str,
        /// As given.
        path: PathBuf,
    },
    /// A directory the mount needs could not be examined.
    #[error("{what} {}", path.display())]
    Inaccessible {
        /// Which one.
        what: &'static str,
        /// As given.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: io::Error,
    },
    /// The mount point answers ENOTCONN (its daemon died) and unmounting it failed.
    #[error("{} is a stale mount left by a crashed daemon and could not be cleared", mountpoint.display())]
    StaleMount {
        /// The dead mount.
        mountpoint: PathBuf,
        /// Why it could not be unmounted.
        #[source]
        source: UnmountError,
    },
    /// Something is mounted on the mount point already.
    #[error("mount point {} is already a mount point", mountpoint.display())]
    AlreadyMounted {
        /// As given.
        mountpoint: PathBuf,
    },
    /// The mount point holds files, which the mount would hide.
    #[error("mount point {} is not empty", mountpoint.display())]
    NotEmpty {
        /// As given.
        mountpoint: PathBuf,
    },
    /// The cache directory lies inside the source or the mount point.
    #[error("cache directory {} must not be inside the source or the mount point", cache_dir.display())]
    CacheInside {
        /// As given.
        cache_dir: PathBuf,
    },
    /// The mount point lies inside the source, so the mount would contain itself.
    #[error("mount point {} must not be inside the source {}: the mount would contain itself without end", mountpoint.display(), source_dir.display())]
    MountpointInside {
        /// As given.
        mountpoint: PathBuf,
        /// As given.
        source_dir: PathBuf,
    },
    /// The cache size limit is below the smallest file that is staged.
    #[error(
        "the cache size limit ({max_size} bytes) is smaller than the smallest staged file ({min_stage_size} bytes): no file could ever be staged"
    )]
    LimitBelowStageSize {
        /// The cache limit.
        max_size: u64,
        /// The smallest file staged.
        min_stage_size: u64,
    },
    /// The cache directory could not be created.
    #[error("cache directory {} cannot be created", path.display())]
    CacheUncreatable {
        /// As given.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: io::Error,
    },
    /// The cache directory exists but cannot be written.
    #[error("cache directory {} is not writable", path.display())]
    CacheUnwritable {
        /// As given.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: io::Error,
    },
    /// Another process holds the cache directory's lock.
    #[error("cache directory {} is in use by another stagefs process (a mount, or a prefetch, verify or evict working on it)", path.display())]
    CacheLocked {
        /// As given.
        path: PathBuf,
    },
    /// The cache directory could not be opened.
    #[error("opening the cache directory")]
    Store(#[source] StoreError),
    /// The source could not be opened.
    #[error("opening the source")]
    Source(#[source] SourceError),
    /// The filesystem the source was on when this cache was last mounted is no
    /// longer mounted where it was: the path leads to the directory underneath.
    #[error(
        "{} is not on {} any more: {} is not mounted at {}, so the path is a directory of {} ({}); mount the share again and retry",
        source_dir.display(), was.fstype, was.fstype, was.mount_point.display(), now.mount_point.display(), now.fstype
    )]
    SourceNotMounted {
        /// The source as given.
        source_dir: PathBuf,
        /// What it was on when last mounted.
        was: Box<stagefs_control::SourceFs>,
        /// What it is on now.
        now: Box<stagefs_control::SourceFs>,
    },
    /// A step of starting or serving failed in the system.
    #[error("{doing}")]
    Io {
        /// What was being done.
        doing: String,
        /// What the system said.
        #[source]
        source: io::Error,
    },
    /// The FUSE request loop ended in an error.
    #[error("the FUSE session failed")]
    Session(#[source] io::Error),
    /// The FUSE request loop ended without saying why (its thread died).
    #[error("the FUSE request loop died")]
    SessionDied,
    /// `--backend fuse` asked of a macOS build without macFUSE (feature `no-macfuse`,
    /// as Homebrew and the release binaries build it).
    #[error(
        "this stagefs was built without macFUSE (the Homebrew and release builds are), so it mounts only with --backend nfs; for --backend fuse install macFUSE and build stagefs with it (docs/MACOS.md)"
    )]
    FuseNotBuilt,
}

impl MountError {
    pub(crate) fn io(doing: impl Into<String>, source: io::Error) -> MountError {
        MountError::Io {
            doing: doing.into(),
            source,
        }
    }
}
