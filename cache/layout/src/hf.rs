//! What stagefs knows of the HuggingFace cache layout, and the one place that turns
//! repository ids into directory names and back:
//! `models--org--name/{blobs/<hash>, refs/<ref>, snapshots/<commit>/<file> -> ../../blobs/<hash>}`.
//!
//! A repository directory may sit anywhere in a source (at its root for a hub cache,
//! under `hub/` for an `HF_HOME`); every path here is relative to the source root.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use stagefs_source::{SourceError, SourceTree};

/// Files whose presence in a snapshot means "model weights".
const WEIGHT_SUFFIXES: [&str; 6] = [".safetensors", ".gguf", ".bin", ".pt", ".pth", ".npz"];
/// The index transformers and MLX write for sharded safetensors.
pub const SAFETENSORS_INDEX: &str = "model.safetensors.index.json";
/// Repository types and the prefix of their directories; models have no id prefix.
const REPO_TYPES: [(&str, &str); 3] = [
    ("models--", ""),
    ("datasets--", "datasets/"),
    ("spaces--", "spaces/"),
];
/// Most bytes read of a ref or an index: real ones are far smaller.
pub(crate) const INDEX_LIMIT: usize = 16 << 20;

/// Whether a file name is a weight file's (by its suffix).
pub fn is_weight_file(name: &str) -> bool {
    WEIGHT_SUFFIXES.iter().any(|s| name.ends_with(s))
}

/// `org/name` → `models--org--name` (`datasets/org/name` → `datasets--org--name`),
/// refusing anything that is not such an id.
pub fn repo_dir_for(id: &str) -> Option<PathBuf> {
    // `datasets/org/set` is a dataset; `datasets/name` is a model of the org "datasets".
    let (dir_prefix, rest) = REPO_TYPES
        .iter()
        .filter(|(_, id_prefix)| !id_prefix.is_empty())
        .find_map(|(dir_prefix, id_prefix)| {
            let rest = id.strip_prefix(id_prefix)?;
            rest.contains('/').then_some((*dir_prefix, rest))
        })
        .unwrap_or(("models--", id));
    let (org, name) = rest.split_once('/')?;
    (valid_id_part(org) && valid_id_part(name))
        .then(|| PathBuf::from(format!("{dir_prefix}{org}--{name}")))
}

fn valid_id_part(part: &str) -> bool {
    !part.is_empty()
        && part != "."
        && part != ".."
        && part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// `models--org--name` → `org/name`; datasets and spaces keep their type
/// (`datasets/org/name`). None for any other name.
pub fn id_of_repo_dir(name: &str) -> Option<String> {
    REPO_TYPES.iter().find_map(|(dir_prefix, id_prefix)| {
        let (org, repo) = name.strip_prefix(dir_prefix)?.split_once("--")?;
        (!org.is_empty() && !repo.is_empty()).then(|| format!("{id_prefix}{org}/{repo}"))
    })
}

/// The repository directory a source path lies in (`hub/models--org--name` for
/// `hub/models--org--name/blobs/x`), wherever it sits in the source.
pub fn repo_of(rel: &Path) -> Option<PathBuf> {
    let mut repo = PathBuf::new();
    for component in rel.components() {
        repo.push(component);
        if component
            .as_os_str()
            .to_str()
            .is_some_and(|name| id_of_repo_dir(name).is_some())
        {
            return Some(repo);
        }
    }
    None
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

/// Where the link `target`, found in directory `dir`, leads: a path relative to the
/// source root, or None when it leaves the source (an absolute target, or more `..`
/// than there are directories above it), as a `--local-dir` download's links into a
/// cache elsewhere do. Those files cannot be staged through this source.
pub fn link_inside(dir: &Path, target: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in dir.join(target).components() {
        match c {
            Component::ParentDir if !out.pop() => return None,
            Component::ParentDir | Component::CurDir => {}
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
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
/// Links that leave the source are left out.
pub fn snapshot_files(source: &SourceTree, dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    let mut out = Vec::new();
    for (path, resolved, is_dir) in entries(source, dir) {
        if is_dir {
            out.extend(snapshot_files(source, &path));
        } else if let Some(resolved) = resolved {
            out.push((path, resolved));
        }
    }
    out
}

/// The entries of one directory as (path, what it resolves to, is a directory). A
/// link resolves to its target inside the source, or to None when it leaves it.
pub fn entries(source: &SourceTree, dir: &Path) -> Vec<(PathBuf, Option<PathBuf>, bool)> {
    source
        .read_dir(dir)
        .unwrap_or_default()
        .into_iter()
        .map(|(name, meta)| {
            let path = dir.join(&name);
            if meta.is_dir() {
                (path, None, true)
            } else if meta.is_symlink() {
                let resolved = source
                    .read_link(&path)
                    .ok()
                    .and_then(|target| link_inside(dir, &target));
                (path, resolved, false)
            } else {
                (path.clone(), Some(path), false)
            }
        })
        .collect()
}

/// Why a link in a snapshot (or model folder) leads to nothing stagefs can stage.
/// The layout functions above leave such links out; these say why, so that a model
/// whose links all fail is reported as broken instead of as empty.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// The source refuses to read the link at all (EPERM). sshfs does this for every
    /// link with `..` or an absolute target unless mounted with `no_contain_symlinks`,
    /// and every snapshot link is `../../blobs/<hash>`.
    #[error(
        "the source refuses to read the link (sshfs does unless mounted with `-o no_contain_symlinks`)"
    )]
    Refused,
    /// Reading the link failed otherwise.
    #[error("its link cannot be read: {0}")]
    Unreadable(String),
    /// The target leaves the source (absolute, or too many `..`).
    #[error("it links to {}, outside the source", .0.display())]
    Outside(PathBuf),
    /// The target is itself a link: stagefs follows one link, so a chain or a loop
    /// ends here.
    #[error("it links to {}, which is a link again (a loop or a chain of links)", .0.display())]
    LinkToLink(PathBuf),
    /// The target is missing or unreadable.
    #[error("it links to {}, which {why}", target.display())]
    Target {
        /// The target, relative to the source root.
        target: PathBuf,
        /// What stat-ing it said.
        why: String,
    },
}

/// The links under `dir` (recursively) that lead to no file, with why: what
/// [`snapshot_files`] and [`all_files`] leave out.
pub fn unfollowable_links(source: &SourceTree, dir: &Path) -> Vec<(PathBuf, LinkError)> {
    let mut out = Vec::new();
    for (name, meta) in source.read_dir(dir).unwrap_or_default() {
        let path = dir.join(&name);
        if meta.is_dir() {
            out.extend(unfollowable_links(source, &path));
        } else if meta.is_symlink()
            && let Err(why) = follow(source, dir, &path)
        {
            out.push((path, why));
        }
    }
    out
}

/// Where the link at `path` (in `dir`) leads, if to something that is no link.
fn follow(source: &SourceTree, dir: &Path, path: &Path) -> Result<PathBuf, LinkError> {
    let target = source.read_link(path).map_err(|e| match io_of(&e) {
        Some(io) if io.raw_os_error() == Some(libc::EPERM) => LinkError::Refused,
        _ => LinkError::Unreadable(plain(&e)),
    })?;
    let inside = link_inside(dir, &target).ok_or_else(|| LinkError::Outside(target.clone()))?;
    match source.stat(&inside) {
        Ok(meta) if meta.is_symlink() => Err(LinkError::LinkToLink(inside)),
        Ok(_) => Ok(inside),
        Err(e) => Err(LinkError::Target {
            target: inside,
            why: match e {
                SourceError::NotFound { .. } => "does not exist".into(),
                e => format!("cannot be read: {}", plain(&e)),
            },
        }),
    }
}

/// The OS error under a source error, if it carries one.
fn io_of(e: &SourceError) -> Option<&std::io::Error> {
    match e {
        SourceError::Io { source, .. } | SourceError::Away { source, .. } => Some(source),
        _ => None,
    }
}

/// What went wrong without the path (the caller names the file already).
fn plain(e: &SourceError) -> String {
    io_of(e).map_or_else(|| e.to_string(), ToString::to_string)
}

/// The weight files of a snapshot, resolved to the files they link to, in the order a
/// loader reads them: the shards named by `model.safetensors.index.json` in shard
/// order, then any other weight files by name.
pub fn weight_files(source: &SourceTree, snapshot: &Path) -> Vec<PathBuf> {
    let files = snapshot_files(source, snapshot);
    order_weights(snapshot, files, &indexed_shards(source, snapshot))
}

/// The weight files among `files` (path as listed under `dir`, path it resolves to),
/// in load order: the shards `indexed` names (already in shard order) first, then the
/// others by name; each resolved file once.
pub fn order_weights(
    dir: &Path,
    files: Vec<(PathBuf, PathBuf)>,
    indexed: &[String],
) -> Vec<PathBuf> {
    let mut ordered: Vec<(usize, PathBuf, PathBuf)> = files
        .into_iter()
        .filter(|(path, _)| is_weight_file(&path.to_string_lossy()))
        .map(|(path, resolved)| {
            let rank = path
                .strip_prefix(dir)
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

/// Shard file names from the directory's safetensors index, sorted (shard order).
pub fn indexed_shards(source: &SourceTree, dir: &Path) -> Vec<String> {
    let Some(text) = read_small(source, &dir.join(SAFETENSORS_INDEX)) else {
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

/// The text of a small file (an index, a ref); None if it cannot be read.
fn read_small(source: &SourceTree, rel: &Path) -> Option<String> {
    source.read_text(rel, INDEX_LIMIT).ok()
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

/// The snapshot directory of the repository at `repo` (a path in the source) at
/// `revision` (a ref such as `main`, or a commit hash), if the source has it.
pub fn snapshot_of(source: &SourceTree, repo: &Path, revision: &str) -> Option<PathBuf> {
    if revision.contains('/') || revision.contains("..") || revision.is_empty() {
        return None;
    }
    let commit = read_small(source, &repo.join("refs").join(revision))
        .map_or_else(|| revision.to_string(), |text| text.trim().to_string());
    let snapshot = repo.join("snapshots").join(commit);
    source
        .stat(&snapshot)
        .ok()
        .filter(|m| m.is_dir())
        .map(|_| snapshot)
}

/// The most recently modified snapshot of the repository at `repo`, for a cache
/// without `refs/main` (a model downloaded by commit).
pub fn newest_snapshot(source: &SourceTree, repo: &Path) -> Option<PathBuf> {
    let snapshots = repo.join("snapshots");
    source
        .read_dir(&snapshots)
        .ok()?
        .into_iter()
        .filter(|(_, meta)| meta.is_dir())
        .max_by_key(|(_, meta)| meta.modified())
        .map(|(name, _)| snapshots.join(name))
}

/// The snapshot directories (commit names) of the repository at `repo`.
pub fn snapshots(source: &SourceTree, repo: &Path) -> Vec<String> {
    source
        .read_dir(&repo.join("snapshots"))
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, meta)| meta.is_dir())
        .filter_map(|(name, _)| name.to_str().map(str::to_string))
        .collect()
}

/// The refs (branches, tags) of the repository at `repo`, by the commit they name.
pub fn refs_by_commit(source: &SourceTree, repo: &Path) -> BTreeMap<String, Vec<String>> {
    let mut refs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, meta) in source.read_dir(&repo.join("refs")).unwrap_or_default() {
        let Some(name) = name.to_str() else { continue };
        if !meta.is_file() {
            continue;
        }
        if let Some(commit) = read_small(source, &repo.join("refs").join(name)) {
            refs.entry(commit.trim().to_string())
                .or_default()
                .push(name.to_string());
        }
    }
    refs
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;

    use super::*;

    fn repo(under: &str) -> Result<(tempfile::TempDir, SourceTree), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let r = dir.path().join(under).join("models--o--m");
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
        symlink("/etc/passwd", r.join("snapshots/c1/outside.bin"))?;
        let tree = SourceTree::new(dir.path())?;
        Ok((dir, tree))
    }

    #[test]
    fn weights_come_in_shard_order_resolved_to_blobs() -> Result<(), Box<dyn std::error::Error>> {
        for under in ["", "hub", "deep/er/hub"] {
            let (_dir, source) = repo(under)?;
            let repo = Path::new(under).join("models--o--m");
            let snapshot = snapshot_of(&source, &repo, "main").ok_or("no snapshot")?;
            assert_eq!(snapshot, repo.join("snapshots/c1"));
            let weights = weight_files(&source, &snapshot);
            let names: Vec<_> = weights
                .iter()
                .map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect();
            assert_eq!(
                names,
                [Some("b1".into()), Some("b2".into()), Some("bg".into())],
                "a link leaving the source is not a weight of the model"
            );
            let containing = snapshots_containing(&source, &repo.join("blobs/b2"));
            assert_eq!(containing, vec![snapshot]);
            assert!(snapshot_of(&source, &repo, "../x").is_none());
            assert!(snapshot_of(&source, Path::new("models--o--other"), "main").is_none());
            assert_eq!(
                refs_by_commit(&source, &repo).get("c1"),
                Some(&vec!["main".to_string()])
            );
        }
        Ok(())
    }

    #[test]
    fn ids_and_repo_dirs_round_trip() {
        assert_eq!(repo_dir_for("org/name"), Some("models--org--name".into()));
        assert_eq!(
            repo_dir_for("datasets/org/set"),
            Some("datasets--org--set".into())
        );
        assert_eq!(
            repo_dir_for("datasets/name"),
            Some("models--datasets--name".into())
        );
        for bad in ["org", "../x", "org/..", "a/b/c", "org/na me", "/abs", ""] {
            assert_eq!(repo_dir_for(bad), None, "{bad}");
        }
        assert_eq!(
            id_of_repo_dir("models--org--name").as_deref(),
            Some("org/name")
        );
        assert_eq!(
            id_of_repo_dir("models--org--name--x").as_deref(),
            Some("org/name--x")
        );
        assert_eq!(
            id_of_repo_dir("datasets--org--set").as_deref(),
            Some("datasets/org/set")
        );
        for not_a_repo in ["models--bad", "mlx-community", "a--b", "models----x"] {
            assert_eq!(id_of_repo_dir(not_a_repo), None, "{not_a_repo}");
        }
    }

    #[test]
    fn repos_are_found_wherever_they_sit() {
        let repo_of = |p: &str| repo_of(Path::new(p));
        assert_eq!(
            repo_of("hub/models--o--m/blobs/x"),
            Some("hub/models--o--m".into())
        );
        assert_eq!(repo_of("models--o--m"), Some("models--o--m".into()));
        assert_eq!(repo_of("models/o/m/config.json"), None);
        assert_eq!(repo_of("token"), None);
    }

    #[test]
    fn links_that_leave_the_source_resolve_to_nothing() {
        let inside = |dir: &str, target: &str| link_inside(Path::new(dir), Path::new(target));
        assert_eq!(
            inside("r/snapshots/c", "../../blobs/b"),
            Some("r/blobs/b".into())
        );
        assert_eq!(inside("m", "../../x"), None);
        assert_eq!(inside("m", "/abs/x"), None);
        assert_eq!(inside("m/sub", "./x"), Some("m/sub/x".into()));
    }
}
