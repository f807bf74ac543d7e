//! Cache administration shared by a running mount (over its control socket) and the
//! CLI working on a cache directory directly: status, evict, verify.
//!
//! Requests name models and source paths, never cache files: a path is validated as a
//! plain relative path and turned into a [`Key`], so no request can reach outside the
//! cache directory.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::StoreError;
use crate::hf::{self, INDEX_LIMIT as SMALL_TEXT};
use crate::key::Key;
use crate::metrics::MetricsSnapshot;
use crate::source::SourceTree;
use crate::source_pool::SourceHealth;
use crate::stage::InFlight;
use crate::store::{EntryInfo, Store, Usage};

/// What a running mount adds to the cache's own state.
#[derive(Debug, Clone, Default)]
pub struct Live {
    /// Counters since the mount started.
    pub metrics: Option<MetricsSnapshot>,
    /// Copies in progress.
    pub in_flight: Vec<InFlight>,
    /// Where the mount is.
    pub mountpoint: Option<PathBuf>,
    /// How the source answers the mount.
    pub source_health: Option<SourceHealth>,
}

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
}

/// One repository's share of the cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelStatus {
    /// `org/name` (datasets and spaces keep their `datasets--` prefix).
    pub model: String,
    /// Staged copies belonging to this repository.
    pub staged_files: usize,
    /// Their bytes.
    pub staged_bytes: u64,
    /// Per snapshot, when the source is reachable.
    pub revisions: Vec<RevisionStatus>,
}

impl ModelStatus {
    fn empty(repo_dir: &str) -> ModelStatus {
        ModelStatus {
            model: model_id(repo_dir),
            staged_files: 0,
            staged_bytes: 0,
            revisions: Vec::new(),
        }
    }
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
    /// Mismatched copies dropped (with `repair`).
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

/// Why an admin request failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The request named something that is not a model id or a relative source path.
    #[error("{0}")]
    BadRequest(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The status of `store`, with per-snapshot totals when `source` is reachable.
pub fn status(
    store: &Store,
    source: Option<&SourceTree>,
    live: Live,
) -> Result<StatusReport, AdminError> {
    let entries = store.entries();
    let mut models: BTreeMap<String, ModelStatus> = BTreeMap::new();
    for info in &entries {
        let Some(repo_dir) = repo_dir_of(&info.entry.source) else {
            continue;
        };
        let model = models
            .entry(repo_dir.clone())
            .or_insert_with(|| ModelStatus::empty(&repo_dir));
        model.staged_files += 1;
        model.staged_bytes += info.entry.stamp.size;
    }
    if let Some(source) = source {
        for repo_dir in repo_dirs(source) {
            let revisions = revisions(store, source, &repo_dir);
            if revisions.is_empty() {
                continue;
            }
            let model = models
                .entry(repo_dir.clone())
                .or_insert_with(|| ModelStatus::empty(&repo_dir));
            model.revisions = revisions;
        }
    }
    Ok(StatusReport {
        cache_dir: store.dir().to_path_buf(),
        source: source.map(|s| s.root().to_path_buf()),
        mountpoint: live.mountpoint,
        usage: store.usage()?,
        models: models.into_values().collect(),
        metrics: live.metrics,
        in_flight: live.in_flight,
        source_health: live.source_health,
    })
}

/// Drops the copies `selector` names, except those in use. The source, when
/// reachable, resolves the snapshot links under a directory to the blobs they name.
pub fn evict(
    store: &Store,
    source: Option<&SourceTree>,
    selector: &EvictSelector,
    dry_run: bool,
    now_secs: u64,
) -> Result<EvictReport, AdminError> {
    let chosen = select(store, source, selector, now_secs)?;
    let mut report = EvictReport {
        evicted: Vec::new(),
        in_use: Vec::new(),
        freed: 0,
        dry_run,
    };
    for info in chosen {
        let file = FileRef {
            path: info.entry.source.clone(),
            bytes: info.entry.stamp.size,
        };
        if info.in_use {
            report.in_use.push(file);
            continue;
        }
        if !dry_run {
            let Some(key) = Key::parse(&info.key) else {
                continue;
            };
            match store.remove(&key) {
                Ok(Some(_)) => {}
                Ok(None) => continue,
                Err(StoreError::InUse { .. }) => {
                    report.in_use.push(file);
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
        }
        report.freed += file.bytes;
        report.evicted.push(file);
    }
    Ok(report)
}

fn select(
    store: &Store,
    source: Option<&SourceTree>,
    selector: &EvictSelector,
    now_secs: u64,
) -> Result<Vec<EntryInfo>, AdminError> {
    let entries = store.entries();
    Ok(match selector {
        EvictSelector::All => entries,
        EvictSelector::Model { id } => {
            let dir = repo_dir_for(id)?;
            entries
                .into_iter()
                .filter(|i| i.entry.source.starts_with(&dir))
                .collect()
        }
        EvictSelector::Path { path } => {
            let path = checked_relative(path)?;
            let keys = keys_under(source, &path);
            entries
                .into_iter()
                .filter(|i| keys.contains(&i.key) || i.entry.source.starts_with(&path))
                .collect()
        }
        EvictSelector::OlderThan { secs } => entries
            .into_iter()
            .filter(|i| i.entry.last_use.saturating_add(*secs) < now_secs)
            .collect(),
        EvictSelector::ToSize { bytes } => {
            let mut excess = store.usage()?.used.saturating_sub(*bytes);
            // Least recently used first; copies in use are listed but free nothing.
            let mut chosen = Vec::new();
            for info in entries {
                if excess == 0 {
                    break;
                }
                if !info.in_use {
                    excess = excess.saturating_sub(info.entry.stamp.size);
                }
                chosen.push(info);
            }
            chosen
        }
    })
}

/// Re-hashes staged copies (all, or one model's) against the recorded blake3 and,
/// for LFS blobs, the sha256 in their name; with `repair`, drops the mismatches so
/// they are staged again on the next open.
pub fn verify(
    store: &Store,
    model: Option<&str>,
    repair: bool,
) -> Result<VerifyReport, AdminError> {
    let dir = model.map(repo_dir_for).transpose()?;
    let mut report = VerifyReport {
        checked: 0,
        bytes: 0,
        mismatches: Vec::new(),
        repaired: Vec::new(),
    };
    for info in store.entries() {
        if dir
            .as_ref()
            .is_some_and(|d| !info.entry.source.starts_with(d))
        {
            continue;
        }
        let Some(key) = Key::parse(&info.key) else {
            continue;
        };
        report.checked += 1;
        report.bytes += info.entry.stamp.size;
        let Some(reason) = mismatch(store, &key, &info) else {
            continue;
        };
        report.mismatches.push(Mismatch {
            path: info.entry.source.clone(),
            reason,
        });
        if repair && matches!(store.remove(&key), Ok(Some(_))) {
            report.repaired.push(info.entry.source.clone());
        }
    }
    Ok(report)
}

fn mismatch(store: &Store, key: &Key, info: &EntryInfo) -> Option<String> {
    let (blake3, sha256) = match hash_both(&store.data_path(key)) {
        Ok(hashes) => hashes,
        Err(e) => return Some(format!("unreadable: {e}")),
    };
    if blake3 != info.entry.blake3 {
        return Some("blake3 differs from the one recorded when it was staged".into());
    }
    match key.content_sha256() {
        Some(expected) if expected != sha256 => Some(
            "sha256 differs from the blob's name (the source blob itself may be corrupt)".into(),
        ),
        _ => None,
    }
}

fn hash_both(path: &Path) -> io::Result<(String, String)> {
    let mut file = File::open(path)?;
    let mut blake3 = blake3::Hasher::new();
    let mut sha256 = Sha256::new();
    let mut buf = vec![0u8; 4 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        blake3.update(&buf[..n]);
        sha256.update(&buf[..n]);
    }
    let sha = sha256
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok((blake3.finalize().to_hex().to_string(), sha))
}

/// `org/name` → `models--org--name`; refuses anything else.
fn repo_dir_for(id: &str) -> Result<PathBuf, AdminError> {
    hf::repo_dir_for(id)
        .ok_or_else(|| AdminError::BadRequest(format!("'{id}' is not a model id like org/name")))
}

fn checked_relative(path: &Path) -> Result<PathBuf, AdminError> {
    let plain = path.components().all(|c| matches!(c, Component::Normal(_)));
    if plain && !path.as_os_str().is_empty() {
        Ok(path.to_path_buf())
    } else {
        Err(AdminError::BadRequest(format!(
            "{}: not a path inside the source",
            path.display()
        )))
    }
}

/// The repository directory (`models--org--name`) a source path belongs to.
fn repo_dir_of(path: &Path) -> Option<String> {
    let first = path.components().next()?.as_os_str().to_str()?;
    first.contains("--").then(|| first.to_string())
}

/// `models--org--name` → `org/name`; other repo types keep their prefix.
fn model_id(repo_dir: &str) -> String {
    match repo_dir.strip_prefix("models--") {
        Some(rest) => rest.replacen("--", "/", 1),
        None => repo_dir.replacen("--", "/", 2),
    }
}

fn repo_dirs(source: &SourceTree) -> Vec<String> {
    source
        .read_dir(Path::new(""))
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, meta)| meta.is_dir())
        .filter_map(|(name, _)| name.to_str().map(str::to_string))
        .filter(|name| name.contains("--"))
        .collect()
}

fn revisions(store: &Store, source: &SourceTree, repo_dir: &str) -> Vec<RevisionStatus> {
    let repo = Path::new(repo_dir);
    let refs = refs_by_commit(source, repo);
    let snapshots = source.read_dir(&repo.join("snapshots")).unwrap_or_default();
    snapshots
        .into_iter()
        .filter(|(_, meta)| meta.is_dir())
        .filter_map(|(name, _)| name.to_str().map(str::to_string))
        .map(|rev| {
            let mut status = RevisionStatus {
                refs: refs.get(&rev).cloned().unwrap_or_default(),
                revision: rev.clone(),
                staged_files: 0,
                total_files: 0,
                staged_bytes: 0,
                total_bytes: 0,
            };
            for (file, size) in snapshot_files(source, &repo.join("snapshots").join(&rev)) {
                status.total_files += 1;
                status.total_bytes += size;
                if store.contains(&Key::for_source_path(&file)) {
                    status.staged_files += 1;
                    status.staged_bytes += size;
                }
            }
            status
        })
        .collect()
}

/// The key of `path`, and for a directory the keys of every file under it, with
/// snapshot links followed to their blobs (a directory's own copies outside it are
/// found only this way).
fn keys_under(source: Option<&SourceTree>, path: &Path) -> HashSet<String> {
    let mut keys = HashSet::from([Key::for_source_path(path).as_str().to_string()]);
    let Some(source) = source else {
        return keys;
    };
    let key_of = |p: &Path| Key::for_source_path(p).as_str().to_string();
    match source.stat(path) {
        Ok(meta) if meta.is_dir() => {
            let files = hf::snapshot_files(source, path);
            keys.extend(files.iter().map(|(_, resolved)| key_of(resolved)));
        }
        // A snapshot file names its blob by a relative link.
        Ok(meta) if meta.is_symlink() => {
            if let Ok(target) = source.read_link(path) {
                let parent = path.parent().unwrap_or(Path::new(""));
                keys.insert(key_of(&hf::normalize(&parent.join(target))));
            }
        }
        _ => {}
    }
    keys
}

/// Files of a snapshot as (path the link resolves to, size).
fn snapshot_files(source: &SourceTree, dir: &Path) -> Vec<(PathBuf, u64)> {
    hf::snapshot_files(source, dir)
        .into_iter()
        .filter_map(|(_, resolved)| source.stat(&resolved).ok().map(|m| (resolved, m.len())))
        .collect()
}

fn refs_by_commit(source: &SourceTree, repo: &Path) -> BTreeMap<String, Vec<String>> {
    let mut refs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, meta) in source.read_dir(&repo.join("refs")).unwrap_or_default() {
        let Some(name) = name.to_str() else { continue };
        if !meta.is_file() {
            continue;
        }
        if let Ok(commit) = source.read_text(&repo.join("refs").join(name), SMALL_TEXT) {
            refs.entry(commit.trim().to_string())
                .or_default()
                .push(name.to_string());
        }
    }
    refs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_ids_and_paths_are_validated() {
        assert_eq!(
            repo_dir_for("org/name").ok(),
            Some("models--org--name".into())
        );
        for bad in ["org", "../x", "org/..", "a/b/c", "org/na me", "/abs"] {
            assert!(repo_dir_for(bad).is_err(), "{bad}");
        }
        assert!(checked_relative(Path::new("models--a--b/blobs/x")).is_ok());
        for bad in ["", "/etc/passwd", "../x", "a/../../b", "./a"] {
            assert!(checked_relative(Path::new(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn ids_round_trip() {
        assert_eq!(model_id("models--org--name"), "org/name");
        assert_eq!(model_id("models--org--name--x"), "org/name--x");
        assert_eq!(model_id("datasets--org--set"), "datasets/org/set");
    }
}
