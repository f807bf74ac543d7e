//! What stagefs knows of the HuggingFace cache layout:
//! `models--org--name/{blobs/<hash>, refs/<ref>, snapshots/<commit>/<file> -> ../../blobs/<hash>}`.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use crate::source::SourceTree;

/// Files whose presence in a snapshot means "model weights".
const WEIGHT_SUFFIXES: [&str; 6] = [".safetensors", ".gguf", ".bin", ".pt", ".pth", ".npz"];
const SAFETENSORS_INDEX: &str = "model.safetensors.index.json";
/// Most bytes read of a ref or an index: real ones are far smaller.
pub(crate) const INDEX_LIMIT: usize = 16 << 20;

/// The repository directory (`models--org--name`) a source path lies in.
pub fn repo_of(rel: &Path) -> Option<PathBuf> {
    let first = rel.components().next()?;
    let name = first.as_os_str().to_str()?;
    name.contains("--").then(|| PathBuf::from(name))
}

/// `org/name` → `models--org--name`, refusing anything that is not such an id.
pub fn repo_dir_for(id: &str) -> Option<PathBuf> {
    let (org, name) = id.split_once('/')?;
    let valid = |part: &str| {
        !part.is_empty()
            && part != "."
            && part != ".."
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    (valid(org) && valid(name)).then(|| PathBuf::from(format!("models--{org}--{name}")))
}

/// Lexically resolves `..` and `.` (snapshot links are relative and stay inside the repo).
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

/// The snapshot directories that contain `rel`: its own snapshot if it is a snapshot
/// path, else every snapshot with an entry linking to it (a blob).
pub fn snapshots_containing(source: &SourceTree, rel: &Path) -> Vec<PathBuf> {
    let Some(repo) = repo_of(rel) else {
        return Vec::new();
    };
    let snapshots = repo.join("snapshots");
    if let Ok(inside) = rel.strip_prefix(&snapshots) {
        return inside
            .components()
            .next()
            .map(|commit| vec![snapshots.join(commit)])
            .unwrap_or_default();
    }
    source
        .read_dir(&snapshots)
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, meta)| meta.is_dir())
        .map(|(name, _)| snapshots.join(name))
        .filter(|snapshot| {
            snapshot_files(source, snapshot)
                .iter()
                .any(|(_, resolved)| resolved == rel)
        })
        .collect()
}

/// The files of a snapshot (recursively) as (path in the snapshot, path it resolves to).
pub fn snapshot_files(source: &SourceTree, dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    let mut out = Vec::new();
    for (name, meta) in source.read_dir(dir).unwrap_or_default() {
        let path = dir.join(&name);
        if meta.is_dir() {
            out.extend(snapshot_files(source, &path));
        } else if meta.is_symlink() {
            if let Ok(target) = source.read_link(&path) {
                let resolved = normalize(&dir.join(target));
                out.push((path, resolved));
            }
        } else {
            out.push((path.clone(), path));
        }
    }
    out
}

/// The weight files of a snapshot, resolved to the files they link to, in the order a
/// loader reads them: the shards named by `model.safetensors.index.json` in shard
/// order, then any other weight files by name.
pub fn weight_files(source: &SourceTree, snapshot: &Path) -> Vec<PathBuf> {
    let files = snapshot_files(source, snapshot);
    let indexed = indexed_shards(source, snapshot);
    let is_weight = |p: &Path| {
        let name = p.to_string_lossy();
        WEIGHT_SUFFIXES.iter().any(|s| name.ends_with(s))
    };
    let mut ordered: Vec<(usize, PathBuf, PathBuf)> = files
        .into_iter()
        .filter(|(path, _)| is_weight(path))
        .map(|(path, resolved)| {
            let rank = path
                .strip_prefix(snapshot)
                .ok()
                .and_then(|rel| indexed.iter().position(|s| Path::new(s) == rel))
                .unwrap_or(usize::MAX);
            (rank, path, resolved)
        })
        .collect();
    ordered.sort();
    let mut seen = BTreeSet::new();
    ordered
        .into_iter()
        .map(|(_, _, resolved)| resolved)
        .filter(|resolved| seen.insert(resolved.clone()))
        .collect()
}

/// Shard file names from the snapshot's safetensors index, sorted (shard order).
fn indexed_shards(source: &SourceTree, snapshot: &Path) -> Vec<String> {
    let Ok(text) = source.read_text(&snapshot.join(SAFETENSORS_INDEX), INDEX_LIMIT) else {
        return Vec::new();
    };
    let Ok(index) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Vec::new();
    };
    let shards: BTreeSet<String> = index["weight_map"]
        .as_object()
        .map(|map| {
            map.values()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    shards.into_iter().collect()
}

/// Every file of a snapshot, resolved, in name order (for whole-model prefetch).
pub fn all_files(source: &SourceTree, snapshot: &Path) -> Vec<PathBuf> {
    let mut files: Vec<(PathBuf, PathBuf)> = snapshot_files(source, snapshot);
    files.sort();
    let mut seen = BTreeSet::new();
    files
        .into_iter()
        .map(|(_, resolved)| resolved)
        .filter(|resolved| seen.insert(resolved.clone()))
        .collect()
}

/// The snapshot directory of model `id` at `revision` (a ref such as `main`, or a
/// commit hash), if the source has it.
pub fn snapshot_of(source: &SourceTree, id: &str, revision: &str) -> Option<PathBuf> {
    let repo = repo_dir_for(id)?;
    if revision.contains('/') || revision.contains("..") {
        return None;
    }
    let commit = match source.read_text(&repo.join("refs").join(revision), INDEX_LIMIT) {
        Ok(text) => text.trim().to_string(),
        Err(_) => revision.to_string(),
    };
    let snapshot = repo.join("snapshots").join(commit);
    source
        .stat(&snapshot)
        .ok()
        .filter(|m| m.is_dir())
        .map(|_| snapshot)
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;

    use super::*;

    fn repo() -> Result<(tempfile::TempDir, SourceTree), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let r = dir.path().join("models--o--m");
        fs::create_dir_all(r.join("blobs"))?;
        fs::create_dir_all(r.join("snapshots/c1"))?;
        fs::create_dir_all(r.join("refs"))?;
        fs::write(r.join("refs/main"), "c1")?;
        for (name, blob) in [
            ("model-00002-of-00002.safetensors", "b2"),
            ("model-00001-of-00002.safetensors", "b1"),
            ("config.json", "bc"),
            ("extra.gguf", "bg"),
        ] {
            fs::write(r.join("blobs").join(blob), name)?;
            symlink(
                format!("../../blobs/{blob}"),
                r.join("snapshots/c1").join(name),
            )?;
        }
        let index = r#"{"weight_map":{"a":"model-00002-of-00002.safetensors","b":"model-00001-of-00002.safetensors"}}"#;
        fs::write(r.join("blobs/bi"), index)?;
        symlink(
            "../../blobs/bi",
            r.join("snapshots/c1").join(SAFETENSORS_INDEX),
        )?;
        let tree = SourceTree::new(dir.path())?;
        Ok((dir, tree))
    }

    #[test]
    fn weights_come_in_shard_order_resolved_to_blobs() -> Result<(), Box<dyn std::error::Error>> {
        let (_dir, source) = repo()?;
        let snapshot = snapshot_of(&source, "o/m", "main").ok_or("no snapshot")?;
        assert_eq!(snapshot, PathBuf::from("models--o--m/snapshots/c1"));
        let weights = weight_files(&source, &snapshot);
        let names: Vec<_> = weights
            .iter()
            .map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        assert_eq!(
            names,
            [Some("b1".into()), Some("b2".into()), Some("bg".into())]
        );
        let containing = snapshots_containing(&source, Path::new("models--o--m/blobs/b2"));
        assert_eq!(containing, vec![snapshot]);
        assert!(snapshot_of(&source, "o/m", "../x").is_none());
        assert!(snapshot_of(&source, "o/other", "main").is_none());
        Ok(())
    }
}
