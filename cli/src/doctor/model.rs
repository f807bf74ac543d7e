//! Finding the model to judge and the file to measure, with stagefs-cache's view of
//! the HuggingFace layout. Everything here reads the source, so callers run it under
//! a deadline.

use std::fs;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use stagefs_cache::SourceTree;
use stagefs_cache::hf;

/// The revision looked up for a model id.
const REVISION: &str = "main";
/// Most directory entries a search for a file to measure looks at.
const SCAN_LIMIT: usize = 5000;

/// A model's snapshot in a source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Model {
    /// `org/name`.
    pub(crate) id: String,
    /// The snapshot directory (absolute).
    pub(crate) snapshot: PathBuf,
    /// Files in the snapshot (distinct blobs).
    pub(crate) files: usize,
    /// Their total size, following the snapshot's links to blobs.
    pub(crate) size_bytes: u64,
    /// Its largest weight file (absolute), what a loader waits on most.
    pub(crate) largest_weight: Option<PathBuf>,
}

/// Where a path lies in an HF cache: the hub directory, the model, and the snapshot
/// if the path is inside one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RepoPath {
    pub(crate) hub: PathBuf,
    pub(crate) id: String,
    /// Relative to `hub`.
    pub(crate) snapshot: Option<PathBuf>,
}

/// The model `id` in the hub directory `hub`, at `refs/main` or else its newest
/// snapshot; `Ok(None)` when the source has no such model.
pub(crate) fn find(hub: &Path, id: &str) -> anyhow::Result<Option<Model>> {
    let tree = SourceTree::new(hub)?;
    let snapshot = hf::snapshot_of(&tree, id, REVISION).or_else(|| newest_snapshot(&tree, id));
    Ok(snapshot.map(|snapshot| describe(&tree, id, &snapshot)))
}

/// The model a path lies in, if it is inside `models--org--name`.
pub(crate) fn containing(path: &Path) -> anyhow::Result<Option<Model>> {
    let Some(repo) = repo_path(path) else {
        return Ok(None);
    };
    let tree = SourceTree::new(&repo.hub)?;
    let snapshot = match repo.snapshot {
        Some(snapshot) => Some(snapshot),
        None => {
            hf::snapshot_of(&tree, &repo.id, REVISION).or_else(|| newest_snapshot(&tree, &repo.id))
        }
    };
    Ok(snapshot.map(|snapshot| describe(&tree, &repo.id, &snapshot)))
}

fn describe(tree: &SourceTree, id: &str, snapshot: &Path) -> Model {
    let size_of = |rel: &Path| tree.stat(rel).map_or(0, |m| m.len());
    let files = hf::all_files(tree, snapshot);
    let largest_weight = hf::weight_files(tree, snapshot)
        .into_iter()
        .max_by_key(|rel| size_of(rel))
        .map(|rel| tree.root().join(rel));
    Model {
        id: id.to_string(),
        snapshot: tree.root().join(snapshot),
        files: files.len(),
        size_bytes: files.iter().map(|rel| size_of(rel)).sum(),
        largest_weight,
    }
}

/// Without a `refs/main`, the most recently modified snapshot.
fn newest_snapshot(tree: &SourceTree, id: &str) -> Option<PathBuf> {
    let snapshots = hf::repo_dir_for(id)?.join("snapshots");
    tree.read_dir(&snapshots)
        .ok()?
        .into_iter()
        .filter(|(_, meta)| meta.is_dir())
        .max_by_key(|(_, meta)| meta.modified())
        .map(|(name, _)| snapshots.join(name))
}

/// `/hub/models--org--name/snapshots/abc/x` -> hub `/hub`, `org/name`, snapshot
/// `models--org--name/snapshots/abc`.
pub(crate) fn repo_path(path: &Path) -> Option<RepoPath> {
    let components: Vec<Component> = path.components().collect();
    let at = components.iter().rposition(|c| {
        c.as_os_str()
            .to_str()
            .is_some_and(|name| id_of_repo_dir(name).is_some())
    })?;
    let repo_dir = components[at].as_os_str().to_str()?;
    let id = id_of_repo_dir(repo_dir)?;
    let hub: PathBuf = components[..at].iter().collect();
    let snapshot = match components.get(at + 1..at + 3) {
        Some([snapshots, commit]) if snapshots.as_os_str() == "snapshots" => {
            Some(Path::new(repo_dir).join("snapshots").join(commit))
        }
        _ => None,
    };
    Some(RepoPath { hub, id, snapshot })
}

/// `models--org--name` -> `org/name`.
fn id_of_repo_dir(name: &str) -> Option<String> {
    let (org, model) = name.strip_prefix("models--")?.split_once("--")?;
    let id = format!("{org}/{model}");
    hf::repo_dir_for(&id).map(|_| id)
}

/// The largest file to measure under `dir`: first among HF blobs (`blobs/`,
/// `models--*/blobs/`, `hub/models--*/blobs/`), else anywhere a few levels down.
/// Looks at no more than a bounded number of entries.
pub(crate) fn largest_file(dir: &Path) -> Option<(PathBuf, u64)> {
    let mut budget = SCAN_LIMIT;
    let mut best = None;
    for blobs in blob_dirs(dir, &mut budget) {
        scan(&blobs, 0, &mut budget, &mut best);
    }
    if best.is_none() {
        scan(dir, 3, &mut budget, &mut best);
    }
    best
}

fn blob_dirs(dir: &Path, budget: &mut usize) -> Vec<PathBuf> {
    let mut found = vec![dir.join("blobs")];
    for hub in [dir.to_path_buf(), dir.join("hub")] {
        for entry in fs::read_dir(&hub).into_iter().flatten().flatten() {
            if *budget == 0 {
                return found;
            }
            *budget -= 1;
            if entry.file_name().to_string_lossy().starts_with("models--") {
                found.push(entry.path().join("blobs"));
            }
        }
    }
    found
}

/// Keeps the largest regular file (symlinks not followed) in `best`.
fn scan(dir: &Path, depth: usize, budget: &mut usize, best: &mut Option<(PathBuf, u64)>) {
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() && depth > 0 {
            scan(&entry.path(), depth - 1, budget, best);
        } else if kind.is_file() {
            let size = entry.metadata().map_or(0, |m| m.len());
            if best.as_ref().is_none_or(|(_, largest)| size > *largest) {
                *best = Some((entry.path(), size));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_paths() {
        let p = repo_path(Path::new(
            "/nas/hub/models--org--m/snapshots/abc/model.safetensors",
        ))
        .expect("in a repo");
        assert_eq!(p.hub, Path::new("/nas/hub"));
        assert_eq!(p.id, "org/m");
        assert_eq!(
            p.snapshot.as_deref(),
            Some(Path::new("models--org--m/snapshots/abc"))
        );
        let repo = repo_path(Path::new("/nas/hub/models--org--m")).expect("repo dir");
        assert_eq!(repo.snapshot, None);
        assert_eq!(repo_path(Path::new("/nas/hub")), None);
        assert_eq!(repo_path(Path::new("/x/models--bad")), None);
    }

    #[test]
    fn finds_the_largest_blob() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let blobs = dir.path().join("models--o--m/blobs");
        fs::create_dir_all(&blobs)?;
        fs::write(blobs.join("small"), [0u8; 10])?;
        fs::write(blobs.join("big"), [0u8; 100])?;
        fs::write(dir.path().join("outside"), [0u8; 1000])?;
        let (path, size) = largest_file(dir.path()).expect("a blob");
        assert_eq!((path, size), (blobs.join("big"), 100));
        let plain = tempfile::tempdir()?;
        fs::create_dir_all(plain.path().join("a/b"))?;
        fs::write(plain.path().join("a/b/f"), [0u8; 5])?;
        assert_eq!(largest_file(plain.path()).map(|(_, s)| s), Some(5));
        Ok(())
    }
}
