//! The planner of `stagefs prefetch`: which files a request's targets name, which of
//! them are staged already, and what the cache holds for them while the source does
//! not answer. The copying itself is a [`Job`] of the stage layer.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use stagefs_layout::hf;
use stagefs_layout::models::{self, ModelKind, ModelRef, ModelSource};
use stagefs_source::{SourceTree, Stamp};
use stagefs_stage::offline::Part;
pub use stagefs_stage::prefetch::{FileProgress, FileState, Job, Target};
use stagefs_stage::{Handout, Stager};
use stagefs_store::Store;

use crate::admin::AdminError;

/// Resolves targets to the files to stage (each at least `min_size` bytes), in order.
pub fn resolve(
    source: ModelSource<'_>,
    targets: &[Target],
    min_size: u64,
) -> Result<Vec<(PathBuf, u64)>, AdminError> {
    let mut files = Vec::new();
    let mut seen = HashSet::new();
    for target in targets {
        for path in target_files(source, target)? {
            let Ok(meta) = source.tree.stat(&path) else {
                continue;
            };
            if meta.is_file() && meta.len() >= min_size && seen.insert(path.clone()) {
                files.push((path, meta.len()));
            }
        }
    }
    Ok(files)
}

/// The links the targets hold that lead to no file, as failed files: [`resolve`]
/// leaves them out, and a model whose links all fail would otherwise look empty.
/// Targets that name nothing are [`resolve`]'s to refuse.
pub fn unfollowable(source: ModelSource<'_>, targets: &[Target]) -> Vec<FileProgress> {
    let tree = source.tree;
    let links = |target: &Target| match target {
        Target::Model { id, revision } => models::find(tree, id, source.model_dirs)
            .and_then(|model| models::unfollowable(tree, &model, revision_of(&model, revision)))
            .unwrap_or_default(),
        Target::Path { path } => match models::model_at(tree, path) {
            Some(model) => models::unfollowable(tree, &model, None).unwrap_or_default(),
            None if tree.stat(path).is_ok_and(|m| m.is_dir()) => hf::unfollowable_links(tree, path),
            None => Vec::new(),
        },
    };
    let mut seen = HashSet::new();
    let failed = |(path, why): (PathBuf, hf::LinkError)| FileProgress {
        path,
        total: 0,
        copied: 0,
        state: FileState::Failed {
            error: why.to_string(),
            remedy: None,
        },
    };
    targets
        .iter()
        .flat_map(links)
        .filter(|(path, _)| seen.insert(path.clone()))
        .map(failed)
        .collect()
}

/// The parts of the targets' models a prefetch asks the source for besides their
/// weights, so they load with the source away ([`crate::offline::learned_parts`]);
/// a path that is no model's is walked whole if it is a directory.
pub fn learned_parts(source: ModelSource<'_>, targets: &[Target]) -> Vec<Part> {
    let tree = source.tree;
    targets
        .iter()
        .flat_map(|target| match target {
            Target::Model { id, .. } => models::find(tree, id, source.model_dirs)
                .map(|model| crate::offline::learned_parts(&model))
                .unwrap_or_default(),
            Target::Path { path } => match models::model_at(tree, path) {
                Some(model) => crate::offline::learned_parts(&model),
                None if tree.stat(path).is_ok_and(|m| m.is_dir()) => vec![Part::whole(path)],
                None => Vec::new(),
            },
        })
        .collect()
}

fn target_files(source: ModelSource<'_>, target: &Target) -> Result<Vec<PathBuf>, AdminError> {
    match target {
        Target::Model { id, revision } => {
            let model = models::find(source.tree, id, source.model_dirs)?;
            let revision = revision_of(&model, revision);
            Ok(models::files(source.tree, &model, revision)?)
        }
        Target::Path { path } => path_files(source.tree, path),
    }
}

/// The revision asked of `model`: `main` is the default, and so what a folder or a
/// file is at too (they have no other), so asking it of them is no error.
fn revision_of<'a>(model: &ModelRef, revision: &'a Option<String>) -> Option<&'a str> {
    revision
        .as_deref()
        .filter(|r| model.kind == ModelKind::HfRepo || *r != "main")
}

/// A model directory's files (a repository's at `main`), any other directory's
/// (a snapshot's), or the one file, links followed.
fn path_files(source: &SourceTree, path: &Path) -> Result<Vec<PathBuf>, AdminError> {
    let meta = source
        .stat(path)
        .map_err(|e| AdminError::BadRequest(e.to_string()))?;
    if meta.is_dir() {
        Ok(match models::model_at(source, path) {
            Some(model) => models::files(source, &model, None)?,
            None => models::files_under(source, path),
        })
    } else if meta.is_symlink() {
        let target = source
            .read_link(path)
            .map_err(|e| AdminError::BadRequest(e.to_string()))?;
        let parent = path.parent().unwrap_or(Path::new(""));
        Ok(vec![hf::normalize(&parent.join(target))])
    } else {
        Ok(vec![path.to_path_buf()])
    }
}

/// What a prefetch of `files` (from [`resolve`]) would do, copying nothing: a file
/// whose current version has a whole, untouched copy is `AlreadyStaged`, any other
/// is `Waiting` (it would be copied). Asks the source for each file's version, so
/// call it where a dead source may block (the source pool).
pub fn plan(stager: &Stager, files: &[(PathBuf, u64)]) -> Vec<FileProgress> {
    plan_with(stager, stager.source(), files)
}

/// [`plan`], with each file's version as `tree` gives it (the source as the cache
/// remembers it, while the source is away).
pub fn plan_with(
    stager: &Stager,
    tree: &SourceTree,
    files: &[(PathBuf, u64)],
) -> Vec<FileProgress> {
    let staged = |path: &Path| {
        let meta = tree.stat(path).ok().filter(|m| m.is_file());
        meta.is_some_and(|m| {
            stager
                .copy_path(path, Stamp::of(&m), Handout::Peek)
                .is_some()
        })
    };
    files
        .iter()
        .map(|(path, size)| planned(path.clone(), *size, staged(path)))
        .collect()
}

/// The copies `targets` name, from the cache alone, for a dry run while the source
/// does not answer: a model's copies by its id, a path's by the source path each
/// was staged from (a snapshot's links cannot be followed without the source, so a
/// snapshot directory finds only copies staged by their blob's path under it). Like
/// [`resolve`], it leaves out files under `min_size`, which a prefetch does not stage.
pub fn staged_copies(store: &Store, targets: &[Target], min_size: u64) -> Vec<FileProgress> {
    let named = |source: &Path| {
        targets.iter().any(|target| match target {
            Target::Model { id, .. } => models::id_matches(id, source),
            Target::Path { path } => source.starts_with(path),
        })
    };
    store
        .entries()
        .into_iter()
        .filter(|info| info.entry.stamp.size >= min_size && named(&info.entry.source))
        .map(|info| planned(info.entry.source, info.entry.stamp.size, true))
        .collect()
}

/// "1 file", "3 files".
pub(crate) fn files_phrase(n: usize) -> String {
    match n {
        1 => "1 file".into(),
        n => format!("{n} files"),
    }
}

fn planned(path: PathBuf, total: u64, staged: bool) -> FileProgress {
    let (copied, state) = match staged {
        true => (total, FileState::AlreadyStaged),
        false => (0, FileState::Waiting),
    };
    FileProgress {
        path,
        total,
        copied,
        state,
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use std::sync::Arc;

    use stagefs_store::Budget;

    use super::*;

    /// A source with one model folder of two weight files and a config, and a stager
    /// over it with `staged` already staged and committed.
    async fn stager_with(
        staged: &str,
    ) -> Result<(tempfile::TempDir, Stager), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let folder = dir.path().join("src/models/org/m");
        fs::create_dir_all(&folder)?;
        fs::write(folder.join("config.json"), "{}")?;
        fs::write(folder.join("a.safetensors"), vec![1u8; 4096])?;
        fs::write(folder.join("b.safetensors"), vec![2u8; 4096])?;
        let store = Store::open(dir.path().join("cache"), Budget::default())?;
        let source = SourceTree::new(dir.path().join("src"))?;
        let stager = Stager::new(
            source,
            store,
            Arc::default(),
            tokio::runtime::Handle::current(),
        );
        for file in ["models/org/m/config.json", staged] {
            stager.stage(Path::new(file)).await?;
        }
        Ok((dir, stager))
    }

    fn states(files: &[FileProgress]) -> Vec<(String, FileState)> {
        let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
        files
            .iter()
            .map(|f| (name(&f.path).unwrap_or_default(), f.state.clone()))
            .collect()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_plan_copies_nothing_and_tells_staged_from_waiting()
    -> Result<(), Box<dyn std::error::Error>> {
        let (_dir, stager) = stager_with("models/org/m/a.safetensors").await?;
        let folder = ModelSource {
            tree: stager.source(),
            model_dirs: &[],
        };
        let target = [Target::Path {
            path: "models/org/m".into(),
        }];
        let files = resolve(folder, &target, 1024)?;
        let before = stager.store().entries().len();
        let planned = plan(&stager, &files);
        assert_eq!(
            stager.store().entries().len(),
            before,
            "a plan copied something"
        );
        assert_eq!(
            states(&planned),
            [
                ("a.safetensors".into(), FileState::AlreadyStaged),
                ("b.safetensors".into(), FileState::Waiting)
            ]
        );
        // A changed source file is no longer staged: its copy is of another version.
        fs::write(
            stager.source().root().join("models/org/m/a.safetensors"),
            vec![3u8; 8192],
        )?;
        let files = resolve(folder, &target, 1024)?;
        assert!(
            plan(&stager, &files)
                .iter()
                .all(|f| f.state == FileState::Waiting)
        );
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn staged_copies_are_found_by_model_id_or_path_without_the_source()
    -> Result<(), Box<dyn std::error::Error>> {
        let (_dir, stager) = stager_with("models/org/m/b.safetensors").await?;
        let by_id = [Target::Model {
            id: "org/m".into(),
            revision: None,
        }];
        let by_path = [Target::Path {
            path: "models/org".into(),
        }];
        let elsewhere = [Target::Path {
            path: "models/other".into(),
        }];
        let only_b = [("b.safetensors".to_string(), FileState::AlreadyStaged)];
        // The config's copy is under the prefetch size, as resolve would leave it out.
        assert_eq!(states(&staged_copies(stager.store(), &by_id, 1024)), only_b);
        assert_eq!(
            states(&staged_copies(stager.store(), &by_path, 1024)),
            only_b
        );
        assert!(staged_copies(stager.store(), &elsewhere, 1024).is_empty());
        assert_eq!(staged_copies(stager.store(), &by_id, 0).len(), 2);
        Ok(())
    }
}
