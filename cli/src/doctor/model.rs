//! What the worker reads from the source: the model to judge (with stagefs-cache's
//! view of models: HF repositories, plain model folders, GGUF files), the file to
//! measure, and a short measurement of how it reads. Everything here may hang on a
//! dead source: only the worker runs it.

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use stagefs_layout::hf;
use stagefs_layout::models::{self, ModelError, ModelKind, ModelRef};
use stagefs_source::SourceTree;

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
    /// Seconds to stage it at the measured rate (one stream; a mount copies with
    /// several, so this is an upper estimate).
    pub(crate) staging_seconds: Option<f64>,
    /// Links of the model that lead to no file (left out of `files`).
    #[serde(default)]
    pub(crate) unfollowable: Vec<BrokenLink>,
}

/// A link of a model that leads to no file, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct BrokenLink {
    /// The link (absolute).
    pub(crate) path: PathBuf,
    pub(crate) why: String,
    /// The source refused to read it: sshfs's `contain_symlinks`.
    pub(crate) refused: bool,
}

impl BrokenLink {
    fn of(root: &Path, (rel, why): (PathBuf, hf::LinkError)) -> BrokenLink {
        BrokenLink {
            path: root.join(rel),
            refused: why == hf::LinkError::Refused,
            why: why.to_string(),
        }
    }
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

/// The model a path is, or lies in: a repository directory or anything in it (the
/// snapshot it is in, else the repository's main or newest), a model folder or a
/// file in it (or in its subdirectory), a GGUF file. Inside source `root`, a folder
/// or file is named by its path there (`me/other`).
pub(crate) fn containing(path: &Path, root: Option<&Path>) -> anyhow::Result<Option<Model>> {
    if let Some(repo) = models::repo_containing(path) {
        let (Some(hub), Some(name)) = (repo.path.parent(), repo.path.file_name()) else {
            return Ok(None);
        };
        let in_snapshots = path.strip_prefix(repo.path.join("snapshots"));
        let commit = in_snapshots.ok().and_then(|c| c.iter().next());
        let snapshot = commit.map(|commit| Path::new(name).join("snapshots").join(commit));
        // Described from the hub it lies in, so its path is its directory's name there.
        let model = ModelRef {
            path: name.into(),
            ..repo
        };
        return Ok(describe(&SourceTree::new(hub)?, &model, snapshot));
    }
    // A path in `root` is named by its path there; any other by its own name.
    let root = root.filter(|root| path.starts_with(root));
    let is_dir = fs::metadata(path)?.is_dir();
    // A file is its own model (a GGUF) only when no folder holds it.
    let itself = (!is_dir).then_some(path);
    let folders = path.ancestors().skip(usize::from(!is_dir)).take(2);
    for candidate in folders.chain(itself) {
        let (base, rel) = match root {
            Some(root) => match candidate.strip_prefix(root) {
                Ok(rel) if !rel.as_os_str().is_empty() => (root, rel),
                _ => continue,
            },
            None => match (candidate.parent(), candidate.file_name()) {
                (Some(parent), Some(name)) => (parent, Path::new(name)),
                _ => continue,
            },
        };
        let tree = SourceTree::new(base)?;
        if let Some(model) = models::model_at(&tree, rel) {
            return Ok(describe(&tree, &model, None));
        }
    }
    Ok(None)
}

/// Most models of a source a doctor of the whole source reads the links of.
const SAMPLED_MODELS: usize = 3;

/// The first of the first few models of the source `root` (as `survey` found them)
/// with links that lead to no file: a doctor of the whole source names no model, and
/// a share that refuses every link (sshfs's `contain_symlinks`) still lists every
/// model, so only reading a few models' links shows it.
pub(crate) fn sample_unfollowable(root: &Path, catalog: &models::Catalog) -> Option<Model> {
    let tree = SourceTree::new(root).ok()?;
    catalog
        .models
        .iter()
        .take(SAMPLED_MODELS)
        .filter_map(|model| describe(&tree, model, None))
        .find(|model| !model.unfollowable.is_empty())
}

/// Counts a model's files and finds its largest weight; None for a repository
/// without a snapshot.
fn describe(tree: &SourceTree, model: &ModelRef, snapshot: Option<PathBuf>) -> Option<Model> {
    let (snapshot, files, weights, links) = match model.kind {
        ModelKind::HfRepo => {
            let main = || hf::snapshot_of(tree, &model.path, "main");
            let newest = || hf::newest_snapshot(tree, &model.path);
            let snapshot = snapshot.or_else(main).or_else(newest)?;
            let files = hf::all_files(tree, &snapshot);
            let weights = hf::weight_files(tree, &snapshot);
            let links = hf::unfollowable_links(tree, &snapshot);
            (Some(tree.root().join(&snapshot)), files, weights, links)
        }
        ModelKind::Folder | ModelKind::File => {
            let files = models::files(tree, model, None).ok()?;
            let links = models::unfollowable(tree, model, None).unwrap_or_default();
            (None, files, models::weights(tree, model, None).ok()?, links)
        }
    };
    let unfollowable = links.into_iter().map(|l| BrokenLink::of(tree.root(), l));
    // A link to a missing blob resolves to a path that is no file: not one to count.
    let files: Vec<PathBuf> = files
        .into_iter()
        .filter(|rel| tree.stat(rel).is_ok())
        .collect();
    let size_of = |rel: &Path| tree.stat(rel).map_or(0, |m| m.len());
    let largest = weights
        .into_iter()
        .filter(|rel| files.contains(rel))
        .max_by_key(|rel| size_of(rel));
    Some(Model {
        id: model.id.clone(),
        kind: model.kind,
        path: tree.root().join(&model.path),
        snapshot,
        files: files.len(),
        size_bytes: files.iter().map(|rel| size_of(rel)).sum(),
        largest_weight: largest.map(|rel| tree.root().join(rel)),
        staging_seconds: None,
        unfollowable: unfollowable.collect(),
    })
}

/// The largest file to measure under `dir`: first among HF blobs (`blobs/`,
/// `models--*/blobs/`, `hub/models--*/blobs/`), else anywhere a few levels down.
/// Looks at no more than a bounded number of entries.
pub(crate) fn largest_file(dir: &Path) -> Option<PathBuf> {
    let (mut budget, mut best) = (SCAN_LIMIT, None);
    let listed = [dir.to_path_buf(), dir.join("hub")].map(fs::read_dir);
    let entries = listed.into_iter().flatten().flatten().flatten();
    let mut blobs = vec![dir.join("blobs")];
    for entry in entries.take_while(|_| spend(&mut budget)) {
        if entry.file_name().to_string_lossy().starts_with("models--") {
            blobs.push(entry.path().join("blobs"));
        }
    }
    for blobs in &blobs {
        scan(blobs, 0, &mut budget, &mut best);
    }
    if best.is_none() {
        scan(dir, 3, &mut budget, &mut best);
    }
    best.map(|(file, _)| file)
}

/// Takes one entry from `budget`; false when it is spent.
fn spend(budget: &mut usize) -> bool {
    let left = *budget > 0;
    *budget = budget.saturating_sub(1);
    left
}

/// Keeps the largest regular file (symlinks not followed) in `best`.
fn scan(dir: &Path, depth: usize, budget: &mut usize, best: &mut Option<(PathBuf, u64)>) {
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        if !spend(budget) {
            return;
        }
        let kind = entry.file_type().ok();
        if kind.is_some_and(|k| k.is_dir()) && depth > 0 {
            scan(&entry.path(), depth - 1, budget, best);
        } else if kind.is_some_and(|k| k.is_file()) {
            let size = entry.metadata().map_or(0, |m| m.len());
            if best.as_ref().is_none_or(|(_, largest)| size > *largest) {
                *best = Some((entry.path(), size));
            }
        }
    }
}

/// Small reads for the latency figure.
const LATENCY_READS: u64 = 5;
const SMALL_READ: u64 = 4 << 10;
/// The sequential read stops after this many bytes or this long, whichever is first.
const THROUGHPUT_BYTES: u64 = 64 << 20;
const THROUGHPUT_TIME: Duration = Duration::from_secs(3);

/// What was measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Probe {
    pub(crate) file: PathBuf,
    pub(crate) file_size: u64,
    /// Median time of one small read at a spread-out offset.
    pub(crate) latency_ms: f64,
    pub(crate) throughput_bytes_per_sec: f64,
    pub(crate) bytes_read: u64,
    pub(crate) seconds: f64,
}

/// Measures `file`; None for an empty one, which has nothing to measure (and says
/// nothing about the source).
pub(crate) fn measure(path: &Path) -> io::Result<Option<Probe>> {
    let mut file = File::open(path)?;
    let file_size = file.metadata()?.len();
    if file_size == 0 {
        return Ok(None);
    }
    forget_cached(&file, Access::Random);
    let mut buf = vec![0u8; 1 << 20];
    let mut times = Vec::new();
    for i in 0..LATENCY_READS {
        // Page-aligned offsets at the middle of each fifth of the file.
        let offset = (file_size * (2 * i + 1) / (2 * LATENCY_READS)) & !(SMALL_READ - 1);
        let start = Instant::now();
        file.read_at(&mut buf[..SMALL_READ as usize], offset)?;
        times.push(start.elapsed());
    }
    times.sort();
    forget_cached(&file, Access::Sequential);
    let (mut bytes_read, start) = (0u64, Instant::now());
    while bytes_read < THROUGHPUT_BYTES && start.elapsed() < THROUGHPUT_TIME {
        match file.read(&mut buf)? {
            0 => break,
            n => bytes_read += n as u64,
        }
    }
    // A tiny local file can read in less than a clock tick; never divide by zero.
    let seconds = start.elapsed().as_secs_f64().max(1e-6);
    Ok(Some(Probe {
        file: path.to_path_buf(),
        file_size,
        latency_ms: times[times.len() / 2].as_secs_f64() * 1000.0,
        throughput_bytes_per_sec: bytes_read as f64 / seconds,
        bytes_read,
        seconds,
    }))
}

/// How the file is about to be read.
#[derive(Clone, Copy)]
enum Access {
    Random,
    Sequential,
}

/// Drops the file's cached pages (clean ones; a just-written file may stay cached)
/// and says how it will be read, so small reads do not trigger readahead.
#[cfg(target_os = "linux")]
fn forget_cached(file: &File, access: Access) {
    use std::os::fd::AsRawFd;
    let pattern = match access {
        Access::Random => libc::POSIX_FADV_RANDOM,
        Access::Sequential => libc::POSIX_FADV_SEQUENTIAL,
    };
    // SAFETY: the descriptor is open for the life of `file`; fadvise only gives hints.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, pattern);
    }
}

/// macOS has no per-file cache drop; F_NOCACHE makes this descriptor's reads bypass
/// the cache instead.
#[cfg(target_os = "macos")]
fn forget_cached(file: &File, _access: Access) {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open for the life of `file`; F_NOCACHE takes an int.
    unsafe {
        libc::fcntl(file.as_raw_fd(), libc::F_NOCACHE, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Repositories and ids are found through the binary (tests/tests/doctor.rs,
    /// shapes.rs); these are the folder and file cases.
    #[test]
    fn a_path_names_the_model_folder_or_file_it_is_in() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let folder = dir.path().join("models/org/m");
        fs::create_dir_all(folder.join("original"))?;
        fs::write(folder.join("config.json"), "{}")?;
        fs::write(folder.join("model.safetensors"), [0u8; 30])?;
        fs::write(folder.join("original/params.json"), "{}")?;
        fs::write(dir.path().join("models/solo.gguf"), [0u8; 5])?;
        let named = |path: PathBuf| -> anyhow::Result<_> {
            Ok(containing(&path, None)?.map(|m| (m.id, m.kind, m.size_bytes)))
        };
        let in_folder = Some(("m".to_string(), ModelKind::Folder, 34));
        for inside in ["", "config.json", "original/params.json"] {
            assert_eq!(named(folder.join(inside))?, in_folder, "{inside}");
        }
        let solo = Some(("solo.gguf".to_string(), ModelKind::File, 5));
        assert_eq!(named(dir.path().join("models/solo.gguf"))?, solo);
        assert_eq!(named(dir.path().join("models"))?, None);
        Ok(())
    }

    #[test]
    fn finds_the_largest_blob_and_measures_it() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let blobs = dir.path().join("models--o--m/blobs");
        fs::create_dir_all(&blobs)?;
        fs::write(blobs.join("small"), [0u8; 10])?;
        fs::write(blobs.join("big"), [0u8; 100])?;
        fs::write(dir.path().join("outside"), [0u8; 1000])?;
        assert_eq!(largest_file(dir.path()), Some(blobs.join("big")));
        let plain = tempfile::tempdir()?;
        fs::create_dir_all(plain.path().join("a/b"))?;
        fs::write(plain.path().join("a/b/f"), [0u8; 5])?;
        assert_eq!(largest_file(plain.path()), Some(plain.path().join("a/b/f")));
        let big = measure(&blobs.join("big"))?.map(|p| p.bytes_read);
        assert_eq!(big, Some(100));
        fs::write(blobs.join("empty"), b"")?;
        assert_eq!(measure(&blobs.join("empty"))?, None, "nothing to measure");
        Ok(())
    }
}
