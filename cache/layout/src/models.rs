//! Models wherever they sit in a source, in the three forms people keep them in:
//! - an HF repository (`models--org--name` with `snapshots/`): at the root of a hub
//!   cache, under `hub/` of an `HF_HOME`, or anywhere else;
//! - a plain model folder: weight files (`*.safetensors`, `*.gguf`, `*.npz`, `*.bin`,
//!   `*.pt`, `*.pth`) beside a `config.json` or an index, as `save_pretrained` and
//!   `mlx_lm` write them and as loaders open them, by path;
//! - a lone GGUF file.
//!
//! A model is recognised from what lies at its own path, never from where the mount's
//! root happens to be, so one source may mix the forms. The [`Shape`] of a source as
//! a whole only decides how programs are pointed at its mount. Everything here reads
//! the source: callers run it on a blocking pool or under a deadline.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use stagefs_control::ModelKind;

use crate::hf;
use stagefs_source::{SourceTree, is_plain_relative};

/// How many directory levels below the root (and below each of `model_dirs`) a search
/// reads. A folder at `models/org/name` is 3 levels down; an HF_HOME's repositories
/// at `hub/models--org--name` are found by listing `hub/`, 1 level down.
pub const SEARCH_DEPTH: usize = 4;
/// Most directory entries one search reads, so a huge tree cannot stall a command.
const SEARCH_ENTRIES: usize = 20_000;
/// How many directories above an opened file its model folder may be (`original/`
/// holds files of the folder above it).
const FOLDER_LEVELS: usize = 2;
/// Directories never searched: hf_xet's chunk cache holds thousands of files and no
/// model.
const NOT_SEARCHED: [&str; 1] = ["xet"];
/// Besides `hub/`, what marks a directory as an HF_HOME.
const HF_HOME_MARKERS: [&str; 3] = ["token", "stored_tokens", "xet"];
/// What huggingface_hub keeps in a hub cache besides repositories; a `hub/` holding
/// nothing else (or nothing at all) is an HF_HOME's, not a folder of models.
const HUB_BOOKKEEPING: [&str; 3] = [".locks", "CACHEDIR.TAG", "version.txt"];
const CONFIG: &str = "config.json";

/// A model found in a source.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ModelRef {
    /// `org/name` for an HF repository; the path in the source for the others.
    pub id: String,
    /// Its form.
    pub kind: ModelKind,
    /// Relative to the source root: the repository directory, the folder, the file.
    pub path: PathBuf,
}

/// A model request that cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// Not an id or a relative path.
    #[error("'{id}' is neither a model id like org/name nor a path inside the source")]
    BadId {
        /// What was asked for.
        id: String,
    },
    /// Nothing in the source has that id or path.
    #[error(
        "{id}: no such model in the source (no HF repository {id}, and no model folder or GGUF file whose path ends with {id}, within {SEARCH_DEPTH} levels of the root, hub/ and model_dirs)"
    )]
    NotFound {
        /// What was asked for.
        id: String,
    },
    /// Several models end with that path.
    #[error("{id} names {count} models ({paths}); name one by its path")]
    Ambiguous {
        /// What was asked for.
        id: String,
        /// How many matched.
        count: usize,
        /// Their paths, comma separated.
        paths: String,
    },
    /// The repository has no snapshot at that revision.
    #[error("{id}: no snapshot for revision '{revision}' in the source")]
    NoSnapshot {
        /// The repository id.
        id: String,
        /// The ref or commit asked for.
        revision: String,
    },
    /// A revision was asked of a model that has none.
    #[error("{id} is a {kind} ({path}), which has no revisions")]
    NoRevisions {
        /// The model.
        id: String,
        /// Its form, described.
        kind: &'static str,
        /// Its path in the source.
        path: String,
    },
}

impl ModelError {
    /// What would avoid this error, if the user can change anything.
    pub fn remedy(&self) -> Option<stagefs_control::Remedy> {
        matches!(self, ModelError::NoRevisions { .. })
            .then_some(stagefs_control::Remedy::NoRevision)
    }
}

/// How a source is laid out as a whole, which decides what programs are pointed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// An `HF_HOME`: `hub/` inside (often also `xet/`, `token`, `stored_tokens`).
    HfHome,
    /// A hub cache: `models--org--name` directories at the root.
    HubCache,
    /// Plain model folders or GGUF files (or one model folder), loaded by path.
    ModelFolders,
    /// No model found.
    Unknown,
}

impl Shape {
    /// How users call it.
    pub fn describe(self) -> &'static str {
        match self {
            Shape::HfHome => "an HF_HOME",
            Shape::HubCache => "a hub cache",
            Shape::ModelFolders => "plain model folders",
            Shape::Unknown => "no recognised model layout",
        }
    }

    /// The variable to export so that programs find the models of a mount of this
    /// source at `mountpoint`; None for plain folders, which are loaded by path.
    pub fn export(self, mountpoint: &Path) -> Option<(&'static str, PathBuf)> {
        match self {
            Shape::HfHome => Some(("HF_HOME", mountpoint.to_path_buf())),
            Shape::HubCache => Some(("HF_HUB_CACHE", mountpoint.to_path_buf())),
            Shape::ModelFolders | Shape::Unknown => None,
        }
    }

    /// The HuggingFace variables a program started against a mount of this source
    /// gets. An HF_HOME is given as `HF_HOME` (so `hub/`, tokens and `xet/` resolve
    /// as the user expects) and its `hub/` as `HF_HUB_CACHE` too, which huggingface_hub
    /// would otherwise take from the caller's environment first. Plain folders get
    /// none: they load by path, and the program's own hub cache stays usable.
    /// With no model found, the mount is taken for an empty hub cache.
    pub fn hf_variables(self, mountpoint: &Path) -> Vec<(&'static str, PathBuf)> {
        match self {
            Shape::HfHome => vec![
                ("HF_HOME", mountpoint.to_path_buf()),
                ("HF_HUB_CACHE", mountpoint.join("hub")),
            ],
            Shape::HubCache | Shape::Unknown => vec![("HF_HUB_CACHE", mountpoint.to_path_buf())],
            Shape::ModelFolders => Vec::new(),
        }
    }

    /// Where huggingface_hub's xet chunk cache goes for programs using a mount of
    /// this source with the stagefs cache in `cache_dir`. An HF_HOME keeps it at
    /// `xet/`, which on the mount would be the NAS: a scratch area of chunks read and
    /// written constantly during downloads, that nobody else needs. So it goes beside
    /// the stagefs cache, on the local disk (`HF_XET_CACHE`). Other shapes leave it in
    /// the program's own HF_HOME, which is local already.
    pub fn xet_cache(self, cache_dir: &Path) -> Option<PathBuf> {
        (self == Shape::HfHome).then(|| cache_dir.join("xet"))
    }

    /// The hub cache inside a mount of this source, where huggingface_hub must look.
    pub fn hub_cache(self, mountpoint: &Path) -> Option<PathBuf> {
        match self {
            Shape::HfHome => Some(mountpoint.join("hub")),
            Shape::HubCache | Shape::Unknown => Some(mountpoint.to_path_buf()),
            Shape::ModelFolders => None,
        }
    }
}

/// A source, and the directories in it where models lie beyond those a search finds
/// on its own (the `model_dirs` setting).
#[derive(Debug, Clone, Copy)]
pub struct ModelSource<'a> {
    /// The source.
    pub tree: &'a SourceTree,
    /// Paths in the source, searched like its root.
    pub model_dirs: &'a [PathBuf],
}

/// The models a search found, by path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    /// Every model found, sorted by path. Repositories are named by their directory
    /// alone here; [`find`] checks that a snapshot exists.
    pub models: Vec<ModelRef>,
    /// False when the search stopped at its entry limit before reading everything.
    pub complete: bool,
}

impl Catalog {
    /// The model a source path belongs to: the repository it lies in, else the
    /// innermost listed folder holding it, or the listed file it is.
    pub fn owner(&self, path: &Path) -> Option<ModelRef> {
        if let Some(repo) = repo_containing(path) {
            return Some(repo);
        }
        self.models
            .iter()
            .filter(|m| m.kind != ModelKind::HfRepo && path.starts_with(&m.path))
            .max_by_key(|m| m.path.components().count())
            .cloned()
    }

    /// How many models of `kind` were found.
    pub fn count(&self, kind: ModelKind) -> usize {
        self.models.iter().filter(|m| m.kind == kind).count()
    }
}

/// What a source holds: its shape and its models.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Survey {
    /// The layout as a whole.
    pub shape: Shape,
    /// Every model found.
    pub catalog: Catalog,
}

/// The shape of `source`, from its top level (and `hub/`); only a source that is
/// neither an HF_HOME nor a hub cache is searched for folders.
pub fn shape(source: &SourceTree) -> Shape {
    top_level_shape(source).unwrap_or_else(|| shape_from(&discover(source, &[])))
}

/// The shape and the models of `source`.
pub fn survey(source: &SourceTree, model_dirs: &[PathBuf]) -> Survey {
    let catalog = discover(source, model_dirs);
    let shape = top_level_shape(source).unwrap_or_else(|| shape_from(&catalog));
    Survey { shape, catalog }
}

fn top_level_shape(source: &SourceTree) -> Option<Shape> {
    let top = names(source, Path::new(""));
    let holds_repos = |names: &[(String, bool)]| {
        names
            .iter()
            .any(|(name, is_dir)| *is_dir && hf::id_of_repo_dir(name).is_some())
    };
    if holds_repos(&top) {
        return Some(Shape::HubCache);
    }
    let has_hub = top.iter().any(|(name, is_dir)| *is_dir && name == "hub");
    let marked = top
        .iter()
        .any(|(name, _)| HF_HOME_MARKERS.contains(&name.as_str()));
    if !has_hub {
        return None;
    }
    // An HF_HOME that has downloaded nothing yet (or was emptied by `hf cache delete`)
    // has an empty `hub/`: taken for an empty hub cache, a download through the mount
    // would land beside `hub/` instead of in it.
    let hub = names(source, Path::new("hub"));
    let only_bookkeeping = hub
        .iter()
        .all(|(name, _)| HUB_BOOKKEEPING.contains(&name.as_str()));
    (marked || only_bookkeeping || holds_repos(&hub)).then_some(Shape::HfHome)
}

fn shape_from(catalog: &Catalog) -> Shape {
    let mut kinds = catalog.models.iter().map(|m| m.kind);
    if kinds.any(|k| k != ModelKind::HfRepo) {
        Shape::ModelFolders
    } else if catalog.models.is_empty() {
        Shape::Unknown
    } else {
        // Repositories deeper down only: the hub cache is wherever they are.
        Shape::HubCache
    }
}

/// (name, is a directory) of each entry of `dir`; nothing if it cannot be read.
fn names(source: &SourceTree, dir: &Path) -> Vec<(String, bool)> {
    source
        .read_dir(dir)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(name, meta)| Some((name.into_string().ok()?, meta.is_dir())))
        .collect()
}

/// The model `rel` itself is: a repository directory with snapshots, a model folder,
/// or a GGUF file.
pub fn model_at(source: &SourceTree, rel: &Path) -> Option<ModelRef> {
    let meta = source.stat(rel).ok()?;
    if meta.is_dir() {
        repo_at(source, rel).or_else(|| folder_at(source, rel))
    } else {
        lone_file(source, rel)
    }
}

/// The model an opened file belongs to: the repository it lies in, the nearest model
/// folder at most `FOLDER_LEVELS` directories above it, or the GGUF file itself.
pub fn model_of_file(source: &SourceTree, rel: &Path) -> Option<ModelRef> {
    if let Some(repo) = repo_containing(rel) {
        return Some(repo);
    }
    rel.ancestors()
        .skip(1)
        .take(FOLDER_LEVELS)
        .find_map(|dir| folder_at(source, dir))
        .or_else(|| lone_file(source, rel))
}

/// The repository a path lies in, named by its directory as `path` names it.
pub fn repo_containing(path: &Path) -> Option<ModelRef> {
    let repo = hf::repo_of(path)?;
    let id = hf::id_of_repo_dir(repo.file_name()?.to_str()?)?;
    Some(ModelRef {
        id,
        kind: ModelKind::HfRepo,
        path: repo,
    })
}

fn repo_at(source: &SourceTree, rel: &Path) -> Option<ModelRef> {
    let id = hf::id_of_repo_dir(rel.file_name()?.to_str()?)?;
    source
        .stat(&rel.join("snapshots"))
        .ok()
        .filter(|m| m.is_dir())?;
    Some(ModelRef {
        id,
        kind: ModelKind::HfRepo,
        path: rel.to_path_buf(),
    })
}

fn folder_at(source: &SourceTree, rel: &Path) -> Option<ModelRef> {
    if hf::repo_of(rel).is_some() {
        // A snapshot looks like a folder, but belongs to its repository.
        return None;
    }
    let files: Vec<String> = names(source, rel)
        .into_iter()
        .filter(|(_, is_dir)| !is_dir)
        .map(|(name, _)| name)
        .collect();
    is_model_folder(&files).then(|| ModelRef {
        id: path_id(source, rel),
        kind: ModelKind::Folder,
        path: rel.to_path_buf(),
    })
}

/// Weight files beside a `config.json` or an index (`model.safetensors.index.json`,
/// `pytorch_model.bin.index.json`).
fn is_model_folder(file_names: &[String]) -> bool {
    let weights = file_names.iter().any(|n| hf::is_weight_file(n));
    let described = file_names
        .iter()
        .any(|n| n == CONFIG || n.ends_with(".index.json"));
    weights && described
}

fn lone_file(source: &SourceTree, rel: &Path) -> Option<ModelRef> {
    let name = rel.file_name()?.to_str()?;
    if !name.ends_with(".gguf") || hf::repo_of(rel).is_some() {
        return None;
    }
    source.stat(rel).ok().filter(|m| !m.is_dir())?;
    Some(ModelRef {
        id: path_id(source, rel),
        kind: ModelKind::File,
        path: rel.to_path_buf(),
    })
}

/// A folder's or file's id: its path in the source; the root's own name when the
/// source is one model folder.
fn path_id(source: &SourceTree, rel: &Path) -> String {
    if rel.as_os_str().is_empty() {
        return source.root().file_name().map_or_else(
            || ".".to_string(),
            |name| name.to_string_lossy().into_owned(),
        );
    }
    rel.to_string_lossy().into_owned()
}

/// Searches the root and each of `model_dirs` (paths in the source) breadth first,
/// [`SEARCH_DEPTH`] levels down, for models. A model's own directory is not searched
/// further, nor are hidden directories and hf_xet's cache.
pub fn discover(source: &SourceTree, model_dirs: &[PathBuf]) -> Catalog {
    let mut search = Search {
        budget: SEARCH_ENTRIES,
        found: BTreeMap::new(),
    };
    let mut complete = true;
    for start in std::iter::once(PathBuf::new()).chain(model_dirs.iter().cloned()) {
        complete &= search.from(source, start);
    }
    Catalog {
        models: search.found.into_values().collect(),
        complete,
    }
}

struct Search {
    budget: usize,
    found: BTreeMap<PathBuf, ModelRef>,
}

impl Search {
    /// Searches below `start`; false if the entry budget ran out.
    fn from(&mut self, source: &SourceTree, start: PathBuf) -> bool {
        if let Some(model) = repo_at(source, &start) {
            self.found.insert(start, model);
            return true;
        }
        let mut queue = VecDeque::from([(start, 0)]);
        while let Some((dir, depth)) = queue.pop_front() {
            let entries = names(source, &dir);
            if entries.len() > self.budget {
                return false;
            }
            self.budget -= entries.len();
            for sub in self.visit(source, &dir, &entries) {
                if depth < SEARCH_DEPTH {
                    queue.push_back((sub, depth + 1));
                }
            }
        }
        true
    }

    /// Records the models `dir` is or holds; returns the directories to search next.
    fn visit(
        &mut self,
        source: &SourceTree,
        dir: &Path,
        entries: &[(String, bool)],
    ) -> Vec<PathBuf> {
        let files: Vec<String> = entries
            .iter()
            .filter(|(_, is_dir)| !is_dir)
            .map(|(name, _)| name.clone())
            .collect();
        if is_model_folder(&files) {
            let model = ModelRef {
                id: path_id(source, dir),
                kind: ModelKind::Folder,
                path: dir.to_path_buf(),
            };
            self.found.insert(dir.to_path_buf(), model);
            return Vec::new();
        }
        let mut next = Vec::new();
        for (name, is_dir) in entries {
            let path = dir.join(name);
            if !is_dir {
                if name.ends_with(".gguf") {
                    let model = ModelRef {
                        id: path_id(source, &path),
                        kind: ModelKind::File,
                        path: path.clone(),
                    };
                    self.found.insert(path, model);
                }
            } else if let Some(id) = hf::id_of_repo_dir(name) {
                let model = ModelRef {
                    id,
                    kind: ModelKind::HfRepo,
                    path: path.clone(),
                };
                self.found.insert(path, model);
            } else if !name.starts_with('.') && !NOT_SEARCHED.contains(&name.as_str()) {
                next.push(path);
            }
        }
        next
    }
}

/// `id` as a path in the source, refusing absolute paths and `..`.
fn checked_id(id: &str) -> Result<PathBuf, ModelError> {
    if is_plain_relative(Path::new(id)) && !id.is_empty() {
        Ok(PathBuf::from(id))
    } else {
        Err(ModelError::BadId { id: id.to_string() })
    }
}

/// Whether `text` could name a model: an `org/name` id, or a plain relative path.
pub fn is_model_id(text: &str) -> bool {
    checked_id(text).is_ok()
}

/// The model `id` names: the HF repository `org/name` at the root, in `hub/` or in one
/// of `model_dirs`; else the repository, folder or file at that path; else the one
/// model found (see [`discover`]) whose id is `id` or whose path ends with it.
pub fn find(source: &SourceTree, id: &str, model_dirs: &[PathBuf]) -> Result<ModelRef, ModelError> {
    let wanted = checked_id(id)?;
    // A repository's directory name (`models--org--name`) names it as its id does.
    let named_by_dir = hf::id_of_repo_dir(id);
    let repo_id = named_by_dir.as_deref().unwrap_or(id);
    if let Some(repo_dir) = hf::repo_dir_for(repo_id) {
        let places = [PathBuf::new(), PathBuf::from("hub")];
        for place in places.iter().chain(model_dirs) {
            if let Some(model) = repo_at(source, &place.join(&repo_dir)) {
                return Ok(model);
            }
        }
    }
    if let Some(model) = model_at(source, &wanted) {
        return Ok(model);
    }
    let matching: Vec<ModelRef> = discover(source, model_dirs)
        .models
        .into_iter()
        .filter(|m| match m.kind {
            ModelKind::HfRepo => m.id == repo_id && repo_at(source, &m.path).is_some(),
            ModelKind::Folder | ModelKind::File => m.path.ends_with(&wanted),
        })
        .collect();
    match matching.as_slice() {
        [] => Err(ModelError::NotFound { id: id.to_string() }),
        [one] => Ok(one.clone()),
        many => Err(ModelError::Ambiguous {
            id: id.to_string(),
            count: many.len(),
            paths: many
                .iter()
                .map(|m| m.path.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// Whether source path `path` belongs to the model `id` names, judged by the path
/// alone, so copies of a model no longer in the source (or while the source is away)
/// are still found: it lies in the repository `id` names, or at or under a folder or
/// file whose path ends with `id`, or in the repository directory `id` names as a
/// path (`hub/models--org--a`).
pub fn id_matches(id: &str, path: &Path) -> bool {
    if let Some(repo) = hf::repo_of(path) {
        let by_id =
            hf::repo_dir_for(id).is_some_and(|dir| repo.file_name() == Some(dir.as_os_str()));
        // The repository's directory as a path in the source (`hub/models--org--a`).
        let by_dir = Path::new(id).file_name() == repo.file_name() && repo.ends_with(id);
        return by_id || by_dir;
    }
    let wanted = Path::new(id);
    path.ancestors()
        .any(|a| !a.as_os_str().is_empty() && a.ends_with(wanted))
}

/// The directory whose files make up `model` at `revision` (the snapshot for a
/// repository, default `main`; the folder itself), or None for a lone file.
pub fn model_dir(
    source: &SourceTree,
    model: &ModelRef,
    revision: Option<&str>,
) -> Result<Option<PathBuf>, ModelError> {
    match model.kind {
        ModelKind::HfRepo => {
            let revision = revision.unwrap_or("main");
            hf::snapshot_of(source, &model.path, revision)
                .map(Some)
                .ok_or_else(|| ModelError::NoSnapshot {
                    id: model.id.clone(),
                    revision: revision.to_string(),
                })
        }
        ModelKind::Folder | ModelKind::File => match revision {
            Some(_) => Err(ModelError::NoRevisions {
                id: model.id.clone(),
                kind: model.kind.describe(),
                path: model.path.display().to_string(),
            }),
            None => Ok((model.kind == ModelKind::Folder).then(|| model.path.clone())),
        },
    }
}

/// The weight files of `model` in the order a loader reads them, resolved to the
/// files they link to: a snapshot's or a folder's indexed shards in shard order, then
/// its other weight files by name. A folder's subdirectories are left out (the
/// `original/` of a `--local-dir` download repeats the weights in another format).
pub fn weights(
    source: &SourceTree,
    model: &ModelRef,
    revision: Option<&str>,
) -> Result<Vec<PathBuf>, ModelError> {
    let Some(dir) = model_dir(source, model, revision)? else {
        return Ok(vec![model.path.clone()]);
    };
    Ok(match model.kind {
        ModelKind::HfRepo => hf::weight_files(source, &dir),
        ModelKind::Folder | ModelKind::File => folder_weights(source, &dir),
    })
}

fn folder_weights(source: &SourceTree, dir: &Path) -> Vec<PathBuf> {
    let files = hf::entries(source, dir)
        .into_iter()
        .filter_map(|(path, resolved, is_dir)| Some((path, resolved.filter(|_| !is_dir)?)))
        .collect();
    hf::order_weights(dir, files, &hf::indexed_shards(source, dir))
}

/// Every file of `model` for a whole-model prefetch: the weights in load order, then
/// the other files (subdirectories included) by name, each resolved file once.
pub fn files(
    source: &SourceTree,
    model: &ModelRef,
    revision: Option<&str>,
) -> Result<Vec<PathBuf>, ModelError> {
    let weights = weights(source, model, revision)?;
    let rest = match model_dir(source, model, revision)? {
        Some(dir) => hf::all_files(source, &dir),
        None => Vec::new(),
    };
    Ok(weights_then(weights, rest))
}

/// The links of `model` that lead to no file, with why: what [`files`] leaves out.
pub fn unfollowable(
    source: &SourceTree,
    model: &ModelRef,
    revision: Option<&str>,
) -> Result<Vec<(PathBuf, hf::LinkError)>, ModelError> {
    Ok(match model_dir(source, model, revision)? {
        Some(dir) => hf::unfollowable_links(source, &dir),
        None => Vec::new(),
    })
}

/// The files under a directory that is no model of its own (a snapshot, say): its
/// weights in load order, then the rest.
pub fn files_under(source: &SourceTree, dir: &Path) -> Vec<PathBuf> {
    weights_then(hf::weight_files(source, dir), hf::all_files(source, dir))
}

fn weights_then(mut files: Vec<PathBuf>, rest: Vec<PathBuf>) -> Vec<PathBuf> {
    for file in rest {
        if !files.contains(&file) {
            files.push(file);
        }
    }
    files
}

/// What to stage in the background when `rel` is opened, as (group, files in load
/// order), one group per snapshot or folder: for a file of a repository, the weights
/// of each snapshot holding it; for a file of a model folder, the folder's weights.
/// A lone file is staged by its own open.
pub fn siblings_to_prefetch(source: &SourceTree, rel: &Path) -> Vec<(PathBuf, Vec<PathBuf>)> {
    match model_of_file(source, rel) {
        Some(model) if model.kind == ModelKind::HfRepo => hf::snapshots_containing(source, rel)
            .into_iter()
            .map(|snapshot| {
                let files = hf::weight_files(source, &snapshot);
                (snapshot, files)
            })
            .collect(),
        Some(model) if model.kind == ModelKind::Folder => {
            let files = folder_weights(source, &model.path);
            vec![(model.path, files)]
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;

    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// An HF repository with one snapshot at `dir` (a path under `root`).
    fn repo(root: &Path, dir: &str) -> std::io::Result<()> {
        let r = root.join(dir);
        fs::create_dir_all(r.join("blobs"))?;
        fs::create_dir_all(r.join("snapshots/c1"))?;
        fs::create_dir_all(r.join("refs"))?;
        fs::write(r.join("refs/main"), "c1")?;
        fs::write(r.join("blobs/w"), "weights")?;
        symlink("../../blobs/w", r.join("snapshots/c1/model.safetensors"))
    }

    /// A plain model folder at `dir` with two indexed shards, an unindexed extra weight
    /// file (which sorts first by name), a tokenizer, and `original/` weights.
    fn folder(root: &Path, dir: &str) -> std::io::Result<()> {
        let f = root.join(dir);
        fs::create_dir_all(f.join("original"))?;
        fs::write(f.join(CONFIG), "{}")?;
        fs::write(f.join("tokenizer.json"), "{}")?;
        fs::write(f.join("b-shard.safetensors"), "1")?;
        fs::write(f.join("a-shard.safetensors"), "2")?;
        fs::write(f.join("aa-extra.npz"), "3")?;
        fs::write(f.join("original/consolidated.pth"), "4")?;
        let index = r#"{"weight_map":{"x":"b-shard.safetensors","y":"a-shard.safetensors"}}"#;
        fs::write(f.join(hf::SAFETENSORS_INDEX), index)
    }

    fn tree() -> Result<(tempfile::TempDir, SourceTree), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let tree = SourceTree::new(dir.path())?;
        Ok((dir, tree))
    }

    fn ids(catalog: &Catalog) -> Vec<(&str, ModelKind)> {
        catalog
            .models
            .iter()
            .map(|m| (m.id.as_str(), m.kind))
            .collect()
    }

    #[test]
    fn an_hf_home_a_hub_cache_and_plain_folders_have_their_shapes() -> TestResult {
        let (home, source) = tree()?;
        repo(home.path(), "hub/models--org--a")?;
        fs::create_dir_all(home.path().join("xet/chunk-cache"))?;
        fs::write(home.path().join("token"), "hf_x")?;
        let found = survey(&source, &[]);
        assert_eq!(found.shape, Shape::HfHome);
        assert_eq!(ids(&found.catalog), [("org/a", ModelKind::HfRepo)]);
        // An HF_HOME that has downloaded nothing yet is still one.
        fs::remove_dir_all(home.path().join("hub/models--org--a"))?;
        assert_eq!(shape(&source), Shape::HfHome);

        // Nor do its token and xet/ make it one: an empty hub/ does (issue 46), and
        // one with only huggingface_hub's lock files.
        fs::remove_dir_all(home.path().join("xet"))?;
        fs::remove_file(home.path().join("token"))?;
        assert_eq!(shape(&source), Shape::HfHome);
        fs::create_dir_all(home.path().join("hub/.locks/models--org--a"))?;
        fs::write(home.path().join("hub/CACHEDIR.TAG"), "Signature")?;
        assert_eq!(shape(&source), Shape::HfHome);
        // A hub/ of plain model folders is a folder named hub.
        folder(home.path(), "hub/mlx-community/m")?;
        assert_eq!(shape(&source), Shape::ModelFolders);

        let (hub, source) = tree()?;
        repo(hub.path(), "models--org--a")?;
        assert_eq!(shape(&source), Shape::HubCache);

        let (models, source) = tree()?;
        folder(models.path(), "mlx-community/Llama-4bit")?;
        fs::write(models.path().join("lone.gguf"), "g")?;
        fs::create_dir_all(models.path().join("empty/dir"))?;
        let found = survey(&source, &[]);
        assert_eq!(found.shape, Shape::ModelFolders);
        assert_eq!(
            ids(&found.catalog),
            [
                ("lone.gguf", ModelKind::File),
                ("mlx-community/Llama-4bit", ModelKind::Folder)
            ]
        );
        assert!(found.catalog.complete);

        let (nothing, source) = tree()?;
        fs::write(nothing.path().join("notes.txt"), "x")?;
        assert_eq!(shape(&source), Shape::Unknown);
        Ok(())
    }

    #[test]
    fn one_source_may_mix_forms_at_any_depth() -> TestResult {
        let (dir, source) = tree()?;
        repo(dir.path(), "hub/models--org--a")?;
        folder(dir.path(), "models/mlx-community/m")?;
        fs::create_dir_all(dir.path().join("gguf/q"))?;
        fs::write(dir.path().join("gguf/q/m-Q4_K_M.gguf"), "g")?;
        // Deeper than the search goes, unless model_dirs names it.
        repo(dir.path(), "a/b/c/d/e/models--deep--r")?;
        // Never searched: hidden directories and hf_xet's cache.
        folder(dir.path(), ".trash/m")?;
        folder(dir.path(), "xet/m")?;
        let found = discover(&source, &[]);
        assert_eq!(
            ids(&found),
            [
                ("gguf/q/m-Q4_K_M.gguf", ModelKind::File),
                ("org/a", ModelKind::HfRepo),
                ("models/mlx-community/m", ModelKind::Folder)
            ]
        );
        let deeper = discover(&source, &[PathBuf::from("a/b/c/d/e")]);
        assert!(ids(&deeper).contains(&("deep/r", ModelKind::HfRepo)));
        assert_eq!(
            find(&source, "deep/r", &[PathBuf::from("a/b/c/d/e")])?.path,
            Path::new("a/b/c/d/e/models--deep--r")
        );
        assert_eq!(
            find(&source, "deep/r", &[]),
            Err(ModelError::NotFound {
                id: "deep/r".into()
            })
        );
        Ok(())
    }

    #[test]
    fn models_are_found_by_id_or_by_path() -> TestResult {
        let (dir, source) = tree()?;
        repo(dir.path(), "hub/models--org--a")?;
        folder(dir.path(), "models/mlx-community/m")?;
        folder(dir.path(), "other/mlx-community/m")?;
        fs::write(dir.path().join("models/solo.gguf"), "g")?;
        let found = |id: &str| find(&source, id, &[]);
        assert_eq!(found("org/a")?.path, Path::new("hub/models--org--a"));
        assert_eq!(
            found("models--org--a")?.id,
            "org/a",
            "by its directory's name"
        );
        let folder = found("models/mlx-community/m")?;
        assert_eq!(folder.kind, ModelKind::Folder);
        assert_eq!(folder.id, "models/mlx-community/m");
        assert_eq!(found("solo.gguf")?.kind, ModelKind::File);
        assert!(matches!(
            found("mlx-community/m"),
            Err(ModelError::Ambiguous { count: 2, .. })
        ));
        assert_eq!(
            found("other/mlx-community/m")?.path,
            Path::new("other/mlx-community/m")
        );
        assert!(matches!(
            found("org/absent"),
            Err(ModelError::NotFound { .. })
        ));
        for bad in ["/etc", "../x", "a/../../b", ""] {
            assert!(matches!(found(bad), Err(ModelError::BadId { .. })), "{bad}");
        }
        Ok(())
    }

    #[test]
    fn a_folder_prefetches_indexed_shards_then_other_weights() -> TestResult {
        let (dir, source) = tree()?;
        folder(dir.path(), "m")?;
        let expected: Vec<PathBuf> = [
            "m/a-shard.safetensors",
            "m/b-shard.safetensors",
            "m/aa-extra.npz",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        for opened in [
            "m/config.json",
            "m/a-shard.safetensors",
            "m/original/consolidated.pth",
        ] {
            let groups = siblings_to_prefetch(&source, Path::new(opened));
            assert_eq!(
                groups,
                vec![(PathBuf::from("m"), expected.clone())],
                "{opened}"
            );
        }
        let model = model_at(&source, Path::new("m")).ok_or("a folder")?;
        let all = files(&source, &model, None)?;
        assert_eq!(all[..3], expected[..]);
        assert!(all.contains(&PathBuf::from("m/original/consolidated.pth")));
        assert!(all.contains(&PathBuf::from("m/tokenizer.json")));
        assert!(matches!(
            files(&source, &model, Some("v1")),
            Err(ModelError::NoRevisions { .. })
        ));
        // Files outside any model, and lone files, start no prefetch.
        fs::write(dir.path().join("solo.gguf"), "g")?;
        fs::write(dir.path().join("notes.txt"), "n")?;
        assert!(siblings_to_prefetch(&source, Path::new("solo.gguf")).is_empty());
        assert!(siblings_to_prefetch(&source, Path::new("notes.txt")).is_empty());
        Ok(())
    }

    #[test]
    fn an_hf_home_repository_prefetches_its_snapshot() -> TestResult {
        let (dir, source) = tree()?;
        repo(dir.path(), "hub/models--org--a")?;
        let groups = siblings_to_prefetch(
            &source,
            Path::new("hub/models--org--a/snapshots/c1/model.safetensors"),
        );
        assert_eq!(
            groups,
            vec![(
                PathBuf::from("hub/models--org--a/snapshots/c1"),
                vec![PathBuf::from("hub/models--org--a/blobs/w")]
            )]
        );
        let model = find(&source, "org/a", &[])?;
        assert_eq!(
            files(&source, &model, Some("nope")),
            Err(ModelError::NoSnapshot {
                id: "org/a".into(),
                revision: "nope".into()
            })
        );
        Ok(())
    }

    #[test]
    fn a_source_that_is_one_model_folder_is_named_after_itself() -> TestResult {
        let dir = tempfile::tempdir()?;
        folder(dir.path(), "Llama-4bit")?;
        let source = SourceTree::new(dir.path().join("Llama-4bit"))?;
        let found = survey(&source, &[]);
        assert_eq!(found.shape, Shape::ModelFolders);
        assert_eq!(ids(&found.catalog), [("Llama-4bit", ModelKind::Folder)]);
        assert_eq!(
            siblings_to_prefetch(&source, Path::new("config.json"))[0]
                .1
                .len(),
            3
        );
        Ok(())
    }

    #[test]
    fn copies_are_matched_to_ids_by_their_paths() {
        let matches = |id: &str, path: &str| id_matches(id, Path::new(path));
        assert!(matches("org/a", "hub/models--org--a/blobs/x"));
        assert!(matches("org/a", "models--org--a/blobs/x"));
        assert!(!matches("org/a", "hub/models--org--ab/blobs/x"));
        assert!(matches(
            "mlx-community/m",
            "models/mlx-community/m/w.safetensors"
        ));
        assert!(matches(
            "models/mlx-community/m",
            "models/mlx-community/m/w.safetensors"
        ));
        assert!(!matches(
            "mlx-community/m",
            "models/mlx-community/m2/w.safetensors"
        ));
        assert!(matches("q/m.gguf", "gguf/q/m.gguf"));
        assert!(!matches("org/a", "org/ab/config.json"));
        assert!(matches("hub/models--org--a", "hub/models--org--a/blobs/x"));
        assert!(matches("models--org--a", "hub/models--org--a/refs/main"));
        assert!(!matches(
            "hub/models--org--a",
            "hub/models--org--ab/blobs/x"
        ));
        assert!(!matches("blobs", "hub/models--org--a/blobs/x"));
    }

    #[test]
    fn owners_of_copies() {
        let catalog = Catalog {
            models: vec![
                ModelRef {
                    id: "models/m".into(),
                    kind: ModelKind::Folder,
                    path: "models/m".into(),
                },
                ModelRef {
                    id: "solo.gguf".into(),
                    kind: ModelKind::File,
                    path: "solo.gguf".into(),
                },
            ],
            complete: true,
        };
        let owner = |p: &str| catalog.owner(Path::new(p)).map(|m| m.id);
        assert_eq!(
            owner("models/m/original/x.pth").as_deref(),
            Some("models/m")
        );
        assert_eq!(owner("solo.gguf").as_deref(), Some("solo.gguf"));
        assert_eq!(owner("hub/models--o--r/blobs/b").as_deref(), Some("o/r"));
        assert_eq!(owner("token"), None);
    }

    #[test]
    fn only_an_hf_homes_xet_cache_is_moved_beside_the_stagefs_cache() {
        let cache = Path::new("/c");
        assert_eq!(
            Shape::HfHome.xet_cache(cache),
            Some(PathBuf::from("/c/xet"))
        );
        for shape in [Shape::HubCache, Shape::ModelFolders, Shape::Unknown] {
            assert_eq!(shape.xet_cache(cache), None, "{shape:?}");
        }
    }

    #[test]
    fn each_shape_points_programs_at_the_mount_its_own_way() {
        let mnt = Path::new("/m");
        assert_eq!(
            Shape::HfHome.hf_variables(mnt),
            [
                ("HF_HOME", PathBuf::from("/m")),
                ("HF_HUB_CACHE", PathBuf::from("/m/hub"))
            ]
        );
        assert_eq!(
            Shape::HfHome.export(mnt),
            Some(("HF_HOME", PathBuf::from("/m")))
        );
        assert_eq!(
            Shape::HubCache.hf_variables(mnt),
            [("HF_HUB_CACHE", PathBuf::from("/m"))]
        );
        assert!(Shape::ModelFolders.hf_variables(mnt).is_empty());
        assert_eq!(Shape::ModelFolders.export(mnt), None);
    }
}
