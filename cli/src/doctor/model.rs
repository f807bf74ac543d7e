//! Finding the model to judge and the file to measure, with stagefs-cache's view of
//! models (HF repositories, plain model folders, GGUF files). Everything here reads
//! the source, so callers run it under a deadline.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use stagefs_cache::SourceTree;
use stagefs_cache::hf;
use stagefs_cache::models::{self, ModelError, ModelKind, ModelRef};

/// The revision looked up for a repository.
const REVISION: &str = "main";
/// Most directory entries a search for a file to measure looks at.
const SCAN_LIMIT: usize = 5000;

/// A model in a source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Model {
    /// `org/name` for a repository; the path in the source for a folder or a file.
    pub(crate) id: String,
    pub(crate) kind: ModelKind,
    /// The repository directory, the folder or the file (absolute).
    pub(crate) path: PathBuf,
    /// A repository's snapshot whose files are counted (absolute).
    pub(crate) snapshot: Option<PathBuf>,
    /// Files of the model (distinct blobs for a repository).
    pub(crate) files: usize,
    /// Their total size, following links.
    pub(crate) size_bytes: u64,
    /// Its largest weight file (absolute), what a loader waits on most.
    pub(crate) largest_weight: Option<PathBuf>,
}

/// The model `id` in the source `root`: a repository at `refs/main` or else its
/// newest snapshot, or a folder or file by its path. `Ok(None)` when the source has
/// no such model; an error when the id is ambiguous or not an id.
pub(crate) fn find(root: &Path, id: &str, model_dirs: &[PathBuf]) -> anyhow::Result<Option<Model>> {
    let tree = SourceTree::new(root)?;
    match models::find(&tree, id, model_dirs) {
        Ok(model) => Ok(describe(&tree, &model, None)),
        Err(ModelError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The model a path is, or lies in: a repository directory or anything in it, a
/// model folder or a file in it (or in its subdirectory), a GGUF file.
pub(crate) fn containing(path: &Path) -> anyhow::Result<Option<Model>> {
    if let Some(repo) = hf::repo_of(path) {
        return in_repository(path, &repo);
    }
    let is_dir = fs::metadata(path)?.is_dir();
    let ancestors = path.ancestors().take(if is_dir { 2 } else { 3 });
    let mut candidates: Vec<&Path> = ancestors.skip(usize::from(!is_dir)).collect();
    if !is_dir {
        // A file is its own model (a GGUF) only when no folder holds it.
        candidates.push(path);
    }
    for candidate in candidates {
        let (Some(parent), Some(name)) = (candidate.parent(), candidate.file_name()) else {
            continue;
        };
        let tree = SourceTree::new(parent)?;
        if let Some(model) = models::model_at(&tree, Path::new(name)) {
            return Ok(describe(&tree, &model, None));
        }
    }
    Ok(None)
}

/// `path` lies in the repository directory `repo` (both absolute): the snapshot it is
/// in, else the repository's main or newest.
fn in_repository(path: &Path, repo: &Path) -> anyhow::Result<Option<Model>> {
    let (Some(hub), Some(name)) = (repo.parent(), repo.file_name()) else {
        return Ok(None);
    };
    let Some(id) = name.to_str().and_then(hf::id_of_repo_dir) else {
        return Ok(None);
    };
    let tree = SourceTree::new(hub)?;
    let model = ModelRef {
        id,
        kind: ModelKind::HfRepo,
        path: PathBuf::from(name),
    };
    let snapshot = path
        .strip_prefix(repo.join("snapshots"))
        .ok()
        .and_then(|rest| rest.components().next())
        .map(|commit| model.path.join("snapshots").join(commit));
    Ok(describe(&tree, &model, snapshot))
}

/// Counts a model's files and finds its largest weight; None for a repository
/// without a snapshot.
fn describe(tree: &SourceTree, model: &ModelRef, snapshot: Option<PathBuf>) -> Option<Model> {
    let (snapshot, files, weights) = match model.kind {
        ModelKind::HfRepo => {
            let snapshot = snapshot
                .or_else(|| hf::snapshot_of(tree, &model.path, REVISION))
                .or_else(|| hf::newest_snapshot(tree, &model.path))?;
            let files = hf::all_files(tree, &snapshot);
            let weights = hf::weight_files(tree, &snapshot);
            (Some(tree.root().join(snapshot)), files, weights)
        }
        ModelKind::Folder | ModelKind::File => (
            None,
            models::files(tree, model, None).ok()?,
            models::weights(tree, model, None).ok()?,
        ),
    };
    let size_of = |rel: &Path| tree.stat(rel).map_or(0, |m| m.len());
    let largest_weight = weights
        .into_iter()
        .max_by_key(|rel| size_of(rel))
        .map(|rel| tree.root().join(rel));
    Some(Model {
        id: model.id.clone(),
        kind: model.kind,
        path: tree.root().join(&model.path),
        snapshot,
        files: files.len(),
        size_bytes: files.iter().map(|rel| size_of(rel)).sum(),
        largest_weight,
    })
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
    fn a_path_names_the_model_it_is_in() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let repo = dir.path().join("hub/models--org--m");
        fs::create_dir_all(repo.join("snapshots/abc"))?;
        fs::create_dir_all(repo.join("blobs"))?;
        fs::write(repo.join("blobs/w"), [0u8; 10])?;
        std::os::unix::fs::symlink(
            "../../blobs/w",
            repo.join("snapshots/abc/model.safetensors"),
        )?;
        let folder = dir.path().join("models/org/m");
        fs::create_dir_all(folder.join("original"))?;
        fs::write(folder.join("config.json"), "{}")?;
        fs::write(folder.join("model.safetensors"), [0u8; 30])?;
        fs::write(folder.join("original/params.json"), "{}")?;
        fs::write(dir.path().join("models/solo.gguf"), [0u8; 5])?;

        let named = |path: PathBuf| -> anyhow::Result<Option<(String, ModelKind, u64)>> {
            Ok(containing(&path)?.map(|m| (m.id, m.kind, m.size_bytes)))
        };
        let repo_model = Some(("org/m".to_string(), ModelKind::HfRepo, 10));
        assert_eq!(
            named(repo.join("snapshots/abc/model.safetensors"))?,
            repo_model
        );
        assert_eq!(named(repo.clone())?, repo_model);
        let snapshot = containing(&repo.join("snapshots/abc"))?.and_then(|m| m.snapshot);
        assert_eq!(snapshot, Some(repo.join("snapshots/abc")));
        let folder_model = Some(("m".to_string(), ModelKind::Folder, 34));
        for inside in [
            folder.clone(),
            folder.join("config.json"),
            folder.join("original/params.json"),
        ] {
            assert_eq!(named(inside.clone())?, folder_model, "{}", inside.display());
        }
        assert_eq!(
            named(dir.path().join("models/solo.gguf"))?,
            Some(("solo.gguf".to_string(), ModelKind::File, 5))
        );
        assert_eq!(named(dir.path().join("models"))?, None);

        let by_id = find(dir.path(), "org/m", &[])?.map(|m| m.path);
        assert_eq!(by_id, Some(repo.clone()));
        let by_path = find(dir.path(), "models/org/m", &[])?.map(|m| m.kind);
        assert_eq!(by_path, Some(ModelKind::Folder));
        assert_eq!(find(dir.path(), "org/absent", &[])?, None);
        Ok(())
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
