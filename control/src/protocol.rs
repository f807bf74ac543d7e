//! The control protocol spoken over a mount's Unix socket: one JSON request per line,
//! answered by one JSON response line. The mount serves it (`stagefs_mount::admin::answer`);
//! the CLI and other front ends ask with [`query`] and [`stream`].

use std::fs::OpenOptions;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::prefetch::{FileProgress, Target};
use crate::report::{EvictReport, EvictSelector, StatusReport, VerifyReport};
use crate::values::{Backend, Budget, InFlight, MetricsSnapshot};

/// File name of the control socket inside the cache directory.
pub const SOCKET_NAME: &str = "control.sock";

/// Where a mount using `cache_dir` listens.
pub fn socket_path(cache_dir: &Path) -> PathBuf {
    cache_dir.join(SOCKET_NAME)
}

/// What the last mount of a cache directory used, kept in `mount.json` so commands
/// run without a mount still know the source and the budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountRecord {
    /// The mirrored source.
    pub source: PathBuf,
    /// The mount point.
    pub mountpoint: PathBuf,
    /// The budget in force.
    pub budget: Budget,
    /// Files at least this large are staged.
    pub min_stage_size: u64,
    /// Paths in the source searched for models like its root (`model_dirs`).
    #[serde(default)]
    pub model_dirs: Vec<PathBuf>,
    /// How it reached the kernel (records from before the NFS backend: FUSE).
    #[serde(default)]
    pub backend: Backend,
    /// What the source was on when it was mounted (records from before: unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_fs: Option<SourceFs>,
}

/// What filesystem a source was on, as a mount recorded it: so that a later mount
/// can tell that the NAS is not mounted there any more and the path now leads to
/// the directory under its mount point.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFs {
    /// Filesystem type as the mount table names it (`fuse.sshfs`, `nfs`, `smbfs`).
    pub fstype: String,
    /// Whether its reads crossed a network.
    pub network: bool,
    /// Where that filesystem was mounted.
    pub mount_point: PathBuf,
}

impl SourceFs {
    /// Whether this filesystem is no longer mounted where it was, given where the
    /// filesystem holding the source's path is mounted now: a mount point above its
    /// own means the path leads to the directory underneath (sshfs exited, the
    /// automounter or a reboot left the share unmounted). One mounted deeper, or
    /// elsewhere, is another matter.
    pub fn unmounted_given(&self, mount_point_now: &Path) -> bool {
        self.mount_point != mount_point_now && self.mount_point.starts_with(mount_point_now)
    }
}

impl MountRecord {
    fn path(cache_dir: &Path) -> PathBuf {
        cache_dir.join("mount.json")
    }

    /// Records this mount in `cache_dir`.
    pub fn write(&self, cache_dir: &Path) -> io::Result<()> {
        // Readable by its owner only, like the rest of the cache directory: it says
        // which models a user runs.
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(Self::path(cache_dir))?;
        file.write_all(&serde_json::to_vec_pretty(self)?)
    }

    /// The last mount of `cache_dir`, if one was recorded.
    pub fn read(cache_dir: &Path) -> Option<MountRecord> {
        let bytes = std::fs::read(Self::path(cache_dir)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

/// A request to a running mount (or, for all but `Stats`, to a cache directory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// The mount's counters.
    Stats,
    /// Usage, models, counters and copies in flight.
    Status,
    /// Drop copies.
    Evict {
        /// Which.
        selector: EvictSelector,
        /// Only report what would be dropped.
        dry_run: bool,
    },
    /// Stage whole models or files; answered by a stream of [`Response::Progress`]
    /// lines ending with [`Response::Prefetched`].
    Prefetch {
        /// What to stage.
        targets: Vec<Target>,
        /// Only say what would be staged and what already is, answered by one
        /// [`Response::Planned`].
        #[serde(default)]
        dry_run: bool,
        /// Files copied at a time, as the command asked (`prefetch --parallel`);
        /// absent: the mount's own (`--prefetch-parallel`, else by the source's kind).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parallel: Option<usize>,
    },
    /// Re-hash copies.
    Verify {
        /// Only this model (`org/name`, or a folder's or file's path).
        model: Option<String>,
        /// Only the copies under this path (relative to the source root), as for
        /// [`EvictSelector::Path`]; absent from older clients' requests.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<PathBuf>,
        /// Drop mismatches.
        repair: bool,
    },
    /// The staged copies a selector names, as `evict --dry-run` would list them
    /// without the grace it gives links (`status MODEL`, `status --files`).
    Files {
        /// Which.
        selector: EvictSelector,
    },
    /// How users know the files at these source paths (`stagefs_mount::admin::names`).
    Names {
        /// Source paths, relative to the source root.
        paths: Vec<PathBuf>,
    },
}

/// A running mount's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Response {
    /// Answer to [`Request::Stats`].
    Stats {
        /// The counters.
        metrics: MetricsSnapshot,
        /// Where the mount is.
        mountpoint: PathBuf,
        /// What it mirrors.
        source: PathBuf,
        /// Copies in progress (cheap to ask for, unlike a full status).
        in_flight: Vec<InFlight>,
    },
    /// Answer to [`Request::Status`].
    Status {
        /// The report.
        report: Box<StatusReport>,
    },
    /// Answer to [`Request::Evict`].
    Evicted {
        /// The report.
        report: EvictReport,
    },
    /// Answer to [`Request::Verify`].
    Verified {
        /// The report.
        report: VerifyReport,
    },
    /// Progress of a prefetch.
    Progress {
        /// Every file of the prefetch.
        files: Vec<FileProgress>,
    },
    /// A prefetch finished.
    Prefetched {
        /// Every file and how it ended.
        files: Vec<FileProgress>,
    },
    /// Answer to a dry-run [`Request::Prefetch`]: each file `Waiting` (it would be
    /// copied) or `AlreadyStaged`.
    Planned {
        /// The files.
        files: Vec<FileProgress>,
        /// What limits the answer (the source did not answer, so only staged copies
        /// are listed).
        #[serde(default)]
        note: Option<String>,
    },
    /// Answer to [`Request::Files`].
    Files {
        /// The copies, by source path, oldest use first.
        files: Vec<crate::report::FileRef>,
    },
    /// Answer to [`Request::Names`]: one name per path, in order.
    Names {
        /// The names.
        names: Vec<String>,
    },
    /// The request could not be served.
    Error {
        /// Why.
        message: String,
    },
}

/// Sends one request to the mount listening on `socket` and waits for its answer.
pub fn query(socket: &Path, request: &Request) -> io::Result<Response> {
    let mut answers = stream(socket, request)?;
    answers
        .next()
        .unwrap_or_else(|| Err(io::Error::new(io::ErrorKind::UnexpectedEof, "no answer")))
}

/// Sends one request and returns its answers as they arrive, one per line.
pub fn stream(
    socket: &Path,
    request: &Request,
) -> io::Result<impl Iterator<Item = io::Result<Response>>> {
    let mut stream = UnixStream::connect(socket)?;
    let mut line = serde_json::to_vec(request)?;
    line.push(b'\n');
    stream.write_all(&line)?;
    Ok(BufReader::new(stream)
        .lines()
        .map(|line| line.and_then(|l| Ok(serde_json::from_str(&l)?))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_format_is_stable() -> Result<(), serde_json::Error> {
        assert_eq!(serde_json::to_string(&Request::Stats)?, r#"{"op":"stats"}"#);
        let err = Response::Error {
            message: "x".into(),
        };
        assert_eq!(
            serde_json::to_string(&err)?,
            r#"{"kind":"error","message":"x"}"#
        );
        assert!(serde_json::from_str::<Request>(r#"{"op":"rm -rf"}"#).is_err());
        Ok(())
    }
}
