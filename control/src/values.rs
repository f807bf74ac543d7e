//! The values the reports are made of: the cache's limits and usage, a mount's
//! counters, copies in progress, the source's health, the forms of models, and the
//! remedies a front end names. the cache's layers compute them and re-exports each
//! where it is made (a `Store`'s usage, a `Stager`'s copies in flight).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The cache's limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    /// Most bytes of staged copies the cache may hold.
    pub max_size: Option<u64>,
    /// Bytes to leave free on the cache volume.
    pub min_free: Option<u64>,
}

/// Space on the volume holding a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeSpace {
    /// Size of the volume.
    pub total: u64,
    /// Bytes an unprivileged user may still write.
    pub available: u64,
}

/// How full the cache is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Bytes of staged copies.
    pub used: u64,
    /// Number of staged copies.
    pub entries: usize,
    /// Bytes reserved by copies in progress.
    pub reserved: u64,
    /// The limits.
    pub budget: Budget,
    /// The cache volume.
    pub volume: VolumeSpace,
}

/// Why a copy must not be evicted or removed right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "why", rename_all = "snake_case")]
pub enum Hold {
    /// A handle has it open, or a copy of it is in progress.
    Open,
    /// Its link was followed (or presented by a listing) a moment ago: a program may
    /// be opening it through the link, which the daemon cannot see.
    Grace {
        /// Whole seconds until the grace ends.
        secs_left: u64,
        /// The grace in force (`--redirect-grace`), in seconds.
        grace_secs: u64,
    },
    /// An NFS client may still follow a link to it: it was named by a link's text a
    /// moment ago, or, after a JUKEBOX, a client may keep old attributes for longer.
    Link {
        /// Whole seconds until no client can follow the link to it.
        secs_left: u64,
    },
}

/// A point-in-time copy of a running mount's counters (`stagefs_stage::Metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetricsSnapshot {
    /// Opens served by an existing, current staged copy.
    pub stage_hits: u64,
    /// Copies started because no current staged copy existed.
    pub stage_copies: u64,
    /// Bytes copied from the source into the cache by those copies.
    pub bytes_copied: u64,
    /// Copies of small files kept for when the source does not respond.
    #[serde(default)]
    pub kept_copies: u64,
    /// Opens answered with kernel passthrough to the staged copy.
    pub passthrough_opens: u64,
    /// Opens of staged files whose reads the daemon serves.
    pub daemon_opens: u64,
    /// Opens of small files read straight from the source.
    pub source_opens: u64,
    /// Read requests the daemon answered (passthrough reads never arrive here).
    pub daemon_reads: u64,
    /// Staged files handed out as a link to their local copy (readlink answers).
    #[serde(default)]
    pub redirects: u64,
    /// Bytes written through the mount to the source.
    #[serde(default)]
    pub bytes_written: u64,
}

/// One line for logs and `--foreground`'s stderr: what was served and copied, in
/// words, the zeros left out.
impl std::fmt::Display for MetricsSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let counts = [
            (
                self.stage_hits,
                "open of a staged copy",
                "opens of staged copies",
            ),
            (self.stage_copies, "copy", "copies"),
            (self.bytes_copied, "byte copied", "bytes copied"),
            (self.kept_copies, "small file kept", "small files kept"),
            (
                self.passthrough_opens,
                "passthrough open",
                "passthrough opens",
            ),
            (
                self.daemon_opens,
                "open read through the daemon",
                "opens read through the daemon",
            ),
            (
                self.source_opens,
                "open read from the source",
                "opens read from the source",
            ),
            (self.daemon_reads, "read answered", "reads answered"),
            (
                self.redirects,
                "link to a local copy",
                "links to local copies",
            ),
            (
                self.bytes_written,
                "byte written through",
                "bytes written through",
            ),
        ];
        let said: Vec<String> = (counts.iter().filter(|(n, ..)| *n > 0))
            .map(|(n, one, many)| format!("{n} {}", if *n == 1 { one } else { many }))
            .collect();
        match said.is_empty() {
            true => f.write_str("nothing served"),
            false => f.write_str(&said.join(", ")),
        }
    }
}

/// A copy in progress, as reported by `stagefs_stage::Stager::in_flight`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InFlight {
    /// Source path, relative to the source root.
    pub path: PathBuf,
    /// Bytes copied so far (written in order).
    pub copied: u64,
    /// Bytes read from the source so far, in any order: grows while the source answers.
    pub read: u64,
    /// Bytes to copy (0 until the source has been looked at).
    pub total: u64,
}

/// How the source looks from here, for `status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceHealth {
    /// An operation timed out and no probe has seen the source answer since.
    pub unresponsive: bool,
    /// Operations running on the source right now.
    pub running: usize,
    /// Of those, the ones running for longer than the timeout.
    pub stuck: usize,
    /// Threads available to source operations: the most that can be stuck.
    pub threads: usize,
}

/// The form a model is kept in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    /// `models--org--name` with `refs/`, `snapshots/` and `blobs/`.
    HfRepo,
    /// A directory of weight files with a `config.json` or an index.
    Folder,
    /// A lone GGUF file.
    File,
}

impl ModelKind {
    /// How users call it.
    pub fn describe(self) -> &'static str {
        match self {
            ModelKind::HfRepo => "HF repository",
            ModelKind::Folder => "plain model folder",
            ModelKind::File => "GGUF file",
        }
    }
}

/// How far a mount asked to stop (SIGINT, SIGTERM, `stagefs unmount`) has gone
/// while files are still open in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stopping {
    /// Unmounting now.
    Unmounting,
    /// Detached from the mount point (Linux): new opens no longer reach it, the
    /// files still open are served until they are closed.
    Detached,
    /// Still mounted, busy (macOS): served until its files are closed, then unmounted.
    Busy,
}

/// A file a running mount could not stage, as `status` lists the last few.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagingFailure {
    /// Source path, relative to the source root.
    pub path: std::path::PathBuf,
    /// Why, as the core says it.
    pub error: String,
    /// What would let it be staged, for the front end to name.
    #[serde(default)]
    pub remedy: Option<Remedy>,
    /// When, in seconds since the Unix epoch.
    pub at_secs: u64,
}

/// What a user can change so an error does not recur. The core's texts describe
/// only the condition; each front end names the remedy in its own terms (the CLI
/// as the flag to try), so no core text goes stale when a flag is renamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Remedy {
    /// Give the cache more room: a larger size limit or a smaller free-space
    /// reserve, free disk space, or close models in use.
    MoreRoom,
    /// Wait longer for a slow source.
    LongerSourceTimeout,
    /// Ask for the model without a revision: it has none.
    NoRevision,
}

#[cfg(test)]
mod metrics_line {
    use super::MetricsSnapshot;

    #[test]
    fn metrics_read_as_words_without_the_zeros() {
        assert_eq!(MetricsSnapshot::default().to_string(), "nothing served");
        let m = MetricsSnapshot {
            stage_copies: 1,
            bytes_copied: 4096,
            ..MetricsSnapshot::default()
        };
        assert_eq!(m.to_string(), "1 copy, 4096 bytes copied");
    }
}

/// How a mount reaches the kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// A FUSE filesystem (Linux; macOS with macFUSE's kernel extension).
    #[default]
    Fuse,
    /// A loopback NFSv3 server, mounted with the system's NFS client (macOS without
    /// a kernel extension), or served alone (`stagefs serve`).
    Nfs,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Fuse => "fuse",
            Backend::Nfs => "nfs",
        })
    }
}
