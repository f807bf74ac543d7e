//! The reports of the cache's administration (`status`, `evict`, `verify`): what the
//! mount sends over its socket and the CLI prints, also when it works on a cache
//! directory itself.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::values::{
    Backend, Hold, InFlight, MetricsSnapshot, ModelKind, SourceHealth, StagingFailure, Stopping,
    Usage,
};

/// Everything `stagefs status` shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReport {
    /// The cache directory.
    pub cache_dir: PathBuf,
    /// The mirrored source, when known.
    pub source: Option<PathBuf>,
    /// The mount point, when a mount is running.
    pub mountpoint: Option<PathBuf>,
    /// Space used, the budget and free space.
    pub usage: Usage,
    /// Staged files grouped by model.
    pub models: Vec<ModelStatus>,
    /// Counters since the mount started (running mounts only).
    pub metrics: Option<MetricsSnapshot>,
    /// Copies in progress (running mounts only).
    pub in_flight: Vec<InFlight>,
    /// How the source answers the mount (running mounts only).
    #[serde(default)]
    pub source_health: Option<SourceHealth>,
    /// How the mount reaches the kernel (running mounts only).
    #[serde(default)]
    pub backend: Option<Backend>,
    /// The NFS export's libnfs URL (running NFS mounts only).
    #[serde(default)]
    pub export: Option<String>,
    /// How the running mount serves staged files, as its log said at mount time.
    #[serde(default)]
    pub read_path: Option<String>,
    /// The running mount refuses every change (`--read-only`).
    #[serde(default)]
    pub read_only: bool,
    /// The running mount reads a file the cache cannot hold from the source
    /// (`--on-full read-source`) instead of failing its open.
    #[serde(default)]
    pub reads_source_when_full: bool,
    /// Where a mount of this cache died and left a dead mount behind (filled in by
    /// the front end, which reads the mount table).
    #[serde(default)]
    pub dead_mount: Option<PathBuf>,
    /// Blobs the running mount refuses, relative to the source root: their bytes on
    /// the source do not match the sha256 in their names, so opens of them fail.
    #[serde(default)]
    pub refused: Vec<PathBuf>,
    /// The running mount was asked to stop and is still serving files open in it.
    #[serde(default)]
    pub stopping: Option<Stopping>,
    /// The last files the running mount could not stage, and why, oldest first.
    #[serde(default)]
    pub failures: Vec<StagingFailure>,
    /// Files larger than the cache's size limit (`--max-size`), the largest of each
    /// model that has one: they can never be staged.
    #[serde(default)]
    pub too_large: Vec<TooLarge>,
    /// Copies that are none of the models' files (`refs/main`, small files kept for
    /// when the source is away, a file outside any model), counted in `usage`; 0
    /// when the source could not be asked (it cannot be told then).
    #[serde(default)]
    pub other_files: usize,
    /// The first few of them, by source path.
    #[serde(default)]
    pub other_examples: Vec<PathBuf>,
}

/// A model's file the cache's size limit cannot hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TooLarge {
    /// The model, as `ModelStatus::model` names it.
    pub model: String,
    /// The file, relative to the source root.
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
}

/// One model's share of the cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelStatus {
    /// `org/name` for an HF repository (datasets and spaces keep their type,
    /// `datasets/org/name`); the path in the source for a folder or a file.
    pub model: String,
    /// The form it is kept in.
    pub kind: ModelKind,
    /// Relative to the source root: the repository directory, the folder, the file.
    pub path: PathBuf,
    /// Staged copies belonging to this model.
    pub staged_files: usize,
    /// Their bytes.
    pub staged_bytes: u64,
    /// Per snapshot of a repository, when the source is reachable.
    pub revisions: Vec<RevisionStatus>,
    /// Files of a folder or file model, when the source is reachable.
    pub total_files: Option<usize>,
    /// Their bytes.
    pub total_bytes: Option<u64>,
    /// Links of a folder model that lead to no file (its totals leave them out).
    #[serde(default)]
    pub unfollowable: Vec<UnfollowableLink>,
    /// Its staged copies, when they were asked for (`status MODEL`, `status --files`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileRef>,
    /// Whether it loads with the source away, per known revision of a repository
    /// (one entry for a folder); from a running mount's cache only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub offline: Vec<OfflineReadiness>,
}

/// Whether a model (a revision of a repository) loads with the source away: every
/// listing, link and file a loader reaches is known and has its copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfflineReadiness {
    /// The commit hash, for a repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Nothing is missing.
    pub ready: bool,
    /// What is missing, relative to the source root: the first few.
    pub missing: Vec<PathBuf>,
    /// How many names are missing in all.
    pub missing_count: usize,
}

/// One snapshot of a repository.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevisionStatus {
    /// The commit hash.
    pub revision: String,
    /// Refs (branches, tags) pointing at it.
    pub refs: Vec<String>,
    /// Files of the snapshot that are staged.
    pub staged_files: usize,
    /// Files of the snapshot.
    pub total_files: usize,
    /// Bytes of the staged files.
    pub staged_bytes: u64,
    /// Bytes of all files.
    pub total_bytes: u64,
    /// Links of the snapshot that lead to no file (its totals leave them out): a
    /// stock sshfs refuses every one, and the snapshot then counts 0/0 files.
    #[serde(default)]
    pub unfollowable: Vec<UnfollowableLink>,
}

/// A link in a snapshot or model folder that leads to no file, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnfollowableLink {
    /// The link, relative to the snapshot or the folder (the name users know).
    pub path: PathBuf,
    /// Why it cannot be followed (`it links to …, outside the source`).
    pub why: String,
}

/// Which copies `evict` drops.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "by", rename_all = "snake_case")]
pub enum EvictSelector {
    /// Every copy of a repository, `org/name`.
    Model {
        /// The repository id.
        id: String,
    },
    /// The copy of one source file, relative to the source root.
    Path {
        /// The path.
        path: PathBuf,
    },
    /// Every copy.
    All,
    /// Copies not used for this many seconds.
    OlderThan {
        /// Seconds.
        secs: u64,
    },
    /// Least recently used copies until the cache holds at most this many bytes.
    ToSize {
        /// Bytes.
        bytes: u64,
    },
}

/// What `evict` did (or would do, with `dry_run`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvictReport {
    /// Copies dropped.
    pub evicted: Vec<FileRef>,
    /// Copies selected but kept because they are open or being staged.
    pub in_use: Vec<FileRef>,
    /// Bytes freed.
    pub freed: u64,
    /// Nothing was changed.
    pub dry_run: bool,
}

/// A staged copy, named by its source path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRef {
    /// Source path, relative to the source root.
    pub path: PathBuf,
    /// Size.
    pub bytes: u64,
    /// Why it was kept, for a copy in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
}

/// What `verify` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// Copies re-hashed.
    pub checked: usize,
    /// Bytes re-hashed.
    pub bytes: u64,
    /// Copies that do not match.
    pub mismatches: Vec<Mismatch>,
    /// Copies the source has moved past: its file changed since they were staged
    /// (the next open stages it again; these only take room). Source paths.
    #[serde(default)]
    pub stale: Vec<PathBuf>,
    /// Mismatched and stale copies dropped (with `repair`).
    pub repaired: Vec<PathBuf>,
}

/// A copy whose bytes do not match what was recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mismatch {
    /// Source path.
    pub path: PathBuf,
    /// What did not match.
    pub reason: String,
}
