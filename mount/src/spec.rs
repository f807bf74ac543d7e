//! What a mount serves, from where, with which limits.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use stagefs_control::Backend;
use stagefs_policy::FsConfig;
use stagefs_source::copy::CopyOptions;
use stagefs_store::budget::{default_min_free, volume_space};
use stagefs_store::{Budget, DEFAULT_REDIRECT_GRACE};

use crate::MountError;

/// Everything needed to start serving one mount.
#[derive(Debug, Clone)]
pub struct MountSpec {
    /// The directory mirrored (a NAS share, a hub cache).
    pub source: PathBuf,
    /// An empty directory the mount is placed on.
    pub mountpoint: PathBuf,
    /// Where staged copies, the index, the lock and the control socket live.
    pub cache_dir: PathBuf,
    /// How the filesystem serves requests.
    pub fs: FsConfig,
    /// The most the cache may hold; None: no limit but `min_free`.
    pub max_size: Option<u64>,
    /// Space left free on the cache volume; None: the default share of the volume.
    pub min_free: Option<u64>,
    /// How long a copy whose link was followed counts as in use.
    pub redirect_grace: Duration,
    /// How staging copies read the source.
    pub copy: CopyOptions,
    /// Paths in the source searched for models like its root.
    pub model_dirs: Vec<PathBuf>,
    /// How the mount reaches the kernel.
    pub backend: Backend,
    /// Where the NFS backend listens (a loopback address; port 0: any free port).
    pub nfs_listen: SocketAddr,
    /// Whether the check found the source away (`away.rs`); set by the check.
    pub source_verdict: crate::away::SourceVerdict,
}

impl MountSpec {
    /// A mount of `source` at `mountpoint` with the cache in `cache_dir` and every
    /// other setting at its default.
    pub fn new(
        source: impl Into<PathBuf>,
        mountpoint: impl Into<PathBuf>,
        cache_dir: impl Into<PathBuf>,
    ) -> MountSpec {
        MountSpec {
            source: source.into(),
            mountpoint: mountpoint.into(),
            cache_dir: cache_dir.into(),
            fs: FsConfig::default(),
            max_size: None,
            min_free: None,
            redirect_grace: DEFAULT_REDIRECT_GRACE,
            copy: CopyOptions::default(),
            model_dirs: Vec::new(),
            backend: Backend::default(),
            nfs_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            source_verdict: crate::away::SourceVerdict::default(),
        }
    }

    /// The budget, with defaults resolved against the cache volume.
    pub(crate) fn budget(&self) -> Result<Budget, MountError> {
        let min_free = match self.min_free {
            Some(bytes) => bytes,
            None => default_min_free(
                volume_space(&self.cache_dir)
                    .map_err(|e| MountError::io("measuring the cache volume", e))?,
            ),
        };
        Ok(Budget {
            max_size: self.max_size,
            min_free: Some(min_free),
        })
    }
}
