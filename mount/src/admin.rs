//! Cache administration shared by a running mount (over its control socket) and the
//! CLI working on a cache directory directly: status, evict, verify.
//!
//! Requests name models and source paths, never cache files: a path is validated as a
//! plain relative path and turned into a [`Key`], so no request can reach outside the
//! cache directory.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use stagefs_control::report::{
    EvictReport, EvictSelector, FileRef, Mismatch, ModelStatus, RevisionStatus, StatusReport,
    UnfollowableLink, VerifyReport,
};
use stagefs_control::{
    Backend, InFlight, MetricsSnapshot, Request, Response, SourceHealth, StagingFailure, Stopping,
    TooLarge,
};
use stagefs_layout::hf;
use stagefs_layout::models::{self, Catalog, ModelError, ModelKind, ModelRef, ModelSource};
use stagefs_source::{SourceTree, Stamp, is_plain_relative};
use stagefs_store::StoreError;
use stagefs_store::key::Key;
use stagefs_store::{CopyCheck, EntryInfo, Hold, Store, compare_with_record};

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
    /// How the mount reaches the kernel, and an NFS export's URL.
    pub backend: Option<(Backend, Option<String>)>,
    /// How the mount serves staged files (`staged files are presented as links…`).
    pub read_path: Option<String>,
    /// The mount refuses every change.
    pub read_only: bool,
    /// The mount reads a file the cache cannot hold from the source.
    pub reads_source_when_full: bool,
    /// Blobs the mount refuses: their bytes are not the sha256 in their names.
    pub refused: Vec<PathBuf>,
    /// The last files the mount could not stage.
    pub failures: Vec<StagingFailure>,
    /// How far the mount has gone in stopping, if it was asked to.
    pub stopping: Option<Stopping>,
}

/// Serves `request` against `store`; `live` carries what only a running mount knows.
pub fn answer(
    request: Request,
    store: &Store,
    source: Option<ModelSource<'_>>,
    live: Live,
) -> Response {
    let result = match request {
        Request::Stats => match (live.metrics, live.mountpoint, source) {
            (Some(metrics), Some(mountpoint), Some(source)) => Ok(Response::Stats {
                metrics,
                mountpoint,
                source: source.tree.root().to_path_buf(),
                in_flight: live.in_flight,
            }),
            _ => Err(AdminError::BadRequest("no mount is running".into())),
        },
        Request::Status => status(store, source, live).map(|report| Response::Status {
            report: Box::new(report),
        }),
        Request::Evict { selector, dry_run } => evict(
            store,
            source,
            &selector,
            dry_run,
            stagefs_source::sys::now_secs(),
        )
        .map(|report| Response::Evicted { report }),
        Request::Verify {
            model,
            path,
            repair,
        } => verify(store, source, &verify_selector(model, path), repair)
            .map(|report| Response::Verified { report }),
        Request::Files { selector } => files(store, source, &selector),
        Request::Names { paths } => Ok(Response::Names {
            names: names(source.map(|s| s.tree), &paths),
        }),
        Request::Prefetch { .. } => Err(AdminError::BadRequest(
            "prefetch is served as a stream, not a single answer".into(),
        )),
    };
    result.unwrap_or_else(error_response)
}

/// An admin error as the control socket answers it.
pub fn error_response(e: AdminError) -> Response {
    Response::Error {
        message: e.to_string(),
    }
}

/// The copies a verify request names: a model's, those under a path, else all.
pub fn verify_selector(model: Option<String>, path: Option<PathBuf>) -> EvictSelector {
    match (model, path) {
        (Some(id), _) => EvictSelector::Model { id },
        (None, Some(path)) => EvictSelector::Path { path },
        (None, None) => EvictSelector::All,
    }
}

/// Why an admin request failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The request named something that is not a model id or a relative source path.
    #[error("{0}")]
    BadRequest(String),
    /// The request named a model the source does not have, or not that way.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The status of `store`, grouped by model, with per-model totals when `source` is
/// reachable. Without it, only copies of HF repositories can be told apart by their
/// paths; copies of folders and files are counted in the usage alone.
pub fn status(
    store: &Store,
    source: Option<ModelSource<'_>>,
    live: Live,
) -> Result<StatusReport, AdminError> {
    let catalog = source
        .map(|s| models::discover(s.tree, s.model_dirs))
        .unwrap_or_default();
    let mut models: BTreeMap<PathBuf, ModelStatus> = BTreeMap::new();
    let mut others = Vec::new();
    for info in &store.entries() {
        let owner = catalog.owner(&info.entry.source);
        let Some(owner) = owner.filter(|o| is_model_file(o, &info.entry.source)) else {
            others.push(info.entry.source.clone());
            continue;
        };
        let model = models
            .entry(owner.path.clone())
            .or_insert_with(|| empty_status(&owner));
        model.staged_files += 1;
        model.staged_bytes += info.entry.stamp.size;
    }
    let mut largest = Vec::new();
    if let Some(source) = source {
        largest = add_totals(store, source.tree, &catalog, &mut models);
    }
    let usage = store.usage()?;
    // Without the source, copies of folders and files cannot be told from others.
    if source.is_none() {
        others.clear();
    }
    let too_large = largest
        .into_iter()
        .filter(|l| usage.budget.max_size.is_some_and(|max| l.bytes > max))
        .collect();
    Ok(StatusReport {
        cache_dir: store.dir().to_path_buf(),
        source: source.map(|s| s.tree.root().to_path_buf()),
        mountpoint: live.mountpoint,
        usage,
        models: models.into_values().collect(),
        metrics: live.metrics,
        in_flight: live.in_flight,
        source_health: live.source_health,
        backend: live.backend.as_ref().map(|(backend, _)| *backend),
        export: live.backend.and_then(|(_, export)| export),
        read_path: live.read_path,
        read_only: live.read_only,
        reads_source_when_full: live.reads_source_when_full,
        dead_mount: None,
        refused: live.refused,
        stopping: live.stopping,
        failures: live.failures,
        too_large,
        other_files: others.len(),
        other_examples: others.into_iter().take(OTHER_EXAMPLES).collect(),
    })
}

/// Copies of no model's files that status names (the rest it counts).
const OTHER_EXAMPLES: usize = 3;

/// Drops the copies `selector` names, except those in use. The source, when
/// reachable, resolves the snapshot links under a directory to the blobs they name,
/// and tells a model id that names nothing (a typo) from one with nothing staged.
pub fn evict(
    store: &Store,
    source: Option<ModelSource<'_>>,
    selector: &EvictSelector,
    dry_run: bool,
    now_secs: u64,
) -> Result<EvictReport, AdminError> {
    let chosen = choose_for_eviction(store, source, selector, now_secs)?;
    evict_chosen(store, chosen, dry_run)
}

/// The copies `selector` names, for [`evict_chosen`]: the part of an eviction that
/// may ask the source (run where a slow source may hold it).
pub fn choose_for_eviction(
    store: &Store,
    source: Option<ModelSource<'_>>,
    selector: &EvictSelector,
    now_secs: u64,
) -> Result<Vec<EntryInfo>, AdminError> {
    // A copy waiting for its commit is pinned: committed first, it can go.
    store.commit_now();
    select(store, source, selector, now_secs)
}

/// Drops the copies `chosen`, except those in use. Asks nothing of the source, but
/// may wait a few seconds: a copy NFS links name goes once no client can follow
/// them to it.
pub fn evict_chosen(
    store: &Store,
    chosen: Vec<EntryInfo>,
    dry_run: bool,
) -> Result<EvictReport, AdminError> {
    let mut report = EvictReport {
        evicted: Vec::new(),
        in_use: Vec::new(),
        freed: 0,
        dry_run,
    };
    for info in chosen {
        let mut file = FileRef {
            path: info.entry.source.clone(),
            bytes: info.entry.stamp.size,
            hold: None,
        };
        // A copy only NFS links hold is taken back and removed (`Store::remove` waits
        // until no client can follow them).
        let only_links = matches!(info.hold, Some(Hold::Link { .. }));
        if info.in_use && (dry_run || !only_links) {
            file.hold = Some(info.hold.unwrap_or(Hold::Open));
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
                    file.hold = Some(store.hold_of(&key).unwrap_or(Hold::Open));
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

/// The copies `selector` names, each with what holds it if it is in use.
fn files(
    store: &Store,
    source: Option<ModelSource<'_>>,
    selector: &EvictSelector,
) -> Result<Response, AdminError> {
    let chosen = select(store, source, selector, stagefs_source::sys::now_secs())?;
    let files = chosen
        .into_iter()
        .map(|info| FileRef {
            path: info.entry.source,
            bytes: info.entry.stamp.size,
            hold: info.in_use.then(|| info.hold.unwrap_or(Hold::Open)),
        })
        .collect();
    Ok(Response::Files { files })
}

fn select(
    store: &Store,
    source: Option<ModelSource<'_>>,
    selector: &EvictSelector,
    now_secs: u64,
) -> Result<Vec<EntryInfo>, AdminError> {
    let entries = store.entries();
    Ok(match selector {
        EvictSelector::All => entries,
        EvictSelector::Model { id } => {
            let id = checked_id(id)?;
            let found = found_model(source, id)?;
            let chosen: Vec<EntryInfo> = entries
                .into_iter()
                .filter(|i| {
                    let path = &i.entry.source;
                    models::id_matches(id, path)
                        && !is_repo_bookkeeping(path)
                        && found.as_ref().is_none_or(|m| is_of(m, path))
                })
                .collect();
            if found.is_none() {
                one_owner(id, &chosen)?;
            }
            if chosen.is_empty() {
                known_model(source, id)?;
            }
            chosen
        }
        EvictSelector::Path { path } => {
            let path = checked_relative(path)?;
            let keys = keys_under(source.map(|s| s.tree), &path);
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

/// The model `id` names in the source, when it is reachable and has it; fails when
/// `id` names several of its models (`a/TinyLlama`, `b/TinyLlama`), as prefetch does.
fn found_model(source: Option<ModelSource<'_>>, id: &str) -> Result<Option<ModelRef>, AdminError> {
    let Some(source) = source else {
        return Ok(None);
    };
    match models::find(source.tree, id, source.model_dirs) {
        Ok(model) => Ok(Some(model)),
        Err(e @ ModelError::Ambiguous { .. }) => Err(e.into()),
        Err(_) => Ok(None),
    }
}

/// Whether the copy of source path `path` is one of `model`'s files.
fn is_of(model: &ModelRef, path: &Path) -> bool {
    match model.kind {
        // Its id names it wherever it lies (the root, `hub/`, model_dirs).
        ModelKind::HfRepo => true,
        ModelKind::Folder | ModelKind::File => path.starts_with(&model.path),
    }
}

/// Without the source to ask, the copies `id` chose tell by their paths whether it
/// names several models: refused as the source would refuse it.
fn one_owner(id: &str, chosen: &[EntryInfo]) -> Result<(), AdminError> {
    let owners: std::collections::BTreeSet<PathBuf> = chosen
        .iter()
        .filter_map(|i| owner_by_path(id, &i.entry.source))
        .collect();
    if owners.len() < 2 {
        return Ok(());
    }
    Err(ModelError::Ambiguous {
        id: id.to_string(),
        count: owners.len(),
        paths: owners
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    }
    .into())
}

/// The model a copy of `path` belongs to as `id` matched it: its repository (by its
/// directory's name: one id, wherever it lies), or the folder or file whose path
/// ends with `id`.
fn owner_by_path(id: &str, path: &Path) -> Option<PathBuf> {
    if let Some(repo) = hf::repo_of(path) {
        return repo.file_name().map(PathBuf::from);
    }
    path.ancestors()
        .find(|a| !a.as_os_str().is_empty() && a.ends_with(id))
        .map(Path::to_path_buf)
}

/// Fails with [`ModelError::NotFound`] when the source is reachable and has no model
/// `id`: with nothing staged either, the id is most likely a typo. Without the source
/// nothing can be told, and an ambiguous id is still a model.
fn known_model(source: Option<ModelSource<'_>>, id: &str) -> Result<(), AdminError> {
    let Some(source) = source else {
        return Ok(());
    };
    match models::find(source.tree, id, source.model_dirs) {
        Err(e @ ModelError::NotFound { .. }) => Err(e.into()),
        _ => Ok(()),
    }
}

/// A copy `verify` checks, and whether the source has moved past it.
#[derive(Debug)]
pub struct ToVerify {
    info: EntryInfo,
    /// The source's file is no longer the version staged: the next open copies it
    /// again, and this copy only takes room.
    stale: bool,
}

/// The copies `selector` names (as for [`evict`]; by age or size makes no sense
/// here but works), each compared with the source's file when `source` is reachable.
/// This is the part of `verify` that asks the source.
pub fn to_verify(
    store: &Store,
    source: Option<ModelSource<'_>>,
    selector: &EvictSelector,
) -> Result<Vec<ToVerify>, AdminError> {
    let chosen = select(store, source, selector, stagefs_source::sys::now_secs())?;
    Ok(chosen
        .into_iter()
        .map(|info| ToVerify {
            stale: source.is_some_and(|s| moved_past(s.tree, &info)),
            info,
        })
        .collect())
}

/// Whether the source's file at the copy's path is another version than the one
/// staged, by the rule the stager reuses copies by. A file gone from the source is
/// not: its copy still holds what was staged, and the source may be away.
fn moved_past(source: &SourceTree, info: &EntryInfo) -> bool {
    let Some(key) = Key::parse(&info.key) else {
        return false;
    };
    let path = &info.entry.source;
    match source.stat(path) {
        Ok(meta) if meta.is_file() => {
            !stagefs_stage::reusable(&info.entry, &key, path, Stamp::of(&meta))
        }
        _ => false,
    }
}

/// Re-hashes the copies `selector` names against the recorded blake3 and, for LFS
/// blobs, the sha256 in their name, and reports those the source has moved past;
/// with `repair`, drops the mismatched and the stale, so they are staged again on
/// the next open.
pub fn verify(
    store: &Store,
    source: Option<ModelSource<'_>>,
    selector: &EvictSelector,
    repair: bool,
) -> Result<VerifyReport, AdminError> {
    Ok(verify_copies(
        store,
        to_verify(store, source, selector)?,
        repair,
    ))
}

/// The part of [`verify`] that reads the cache alone: hashes every copy but the
/// stale ones (staged again on the next open whatever their bytes).
pub fn verify_copies(store: &Store, copies: Vec<ToVerify>, repair: bool) -> VerifyReport {
    let mut report = VerifyReport {
        checked: 0,
        bytes: 0,
        mismatches: Vec::new(),
        stale: Vec::new(),
        repaired: Vec::new(),
    };
    for ToVerify { info, stale } in copies {
        let Some(key) = Key::parse(&info.key) else {
            continue;
        };
        report.checked += 1;
        report.bytes += info.entry.stamp.size;
        if stale {
            report.stale.push(info.entry.source.clone());
        } else if let Some(reason) = mismatch(store, &key, &info) {
            report.mismatches.push(Mismatch {
                path: info.entry.source.clone(),
                reason,
            });
        } else {
            continue;
        }
        if repair && matches!(store.remove(&key), Ok(Some(_))) {
            report.repaired.push(info.entry.source.clone());
        }
    }
    report
}

/// How users know the files at `paths` (relative to the source root), in order:
/// `org/name: model-00001-of-00002.safetensors` for a file of an HF repository (a
/// blob by the name a snapshot gives it, from `source` when it is reachable, else
/// `org/name: blob 1a2b3c4d5e6f…`), the path itself for a plain folder's or a lone
/// file's.
pub fn names(source: Option<&SourceTree>, paths: &[PathBuf]) -> Vec<String> {
    let mut by_repo: HashMap<PathBuf, HashMap<PathBuf, PathBuf>> = HashMap::new();
    paths
        .iter()
        .map(|path| name_of(source, path, &mut by_repo))
        .collect()
}

fn name_of(
    source: Option<&SourceTree>,
    path: &Path,
    by_repo: &mut HashMap<PathBuf, HashMap<PathBuf, PathBuf>>,
) -> String {
    let Some(repo) = hf::repo_of(path) else {
        return path.display().to_string();
    };
    let id = repo
        .file_name()
        .and_then(|n| hf::id_of_repo_dir(&n.to_string_lossy()))
        .unwrap_or_else(|| repo.display().to_string());
    let inside = path.strip_prefix(&repo).unwrap_or(path);
    if let Ok(in_snapshot) = inside.strip_prefix("snapshots") {
        let file: PathBuf = in_snapshot.components().skip(1).collect();
        return format!("{id}: {}", file.display());
    }
    if !inside.starts_with("blobs") {
        return format!("{id}: {}", inside.display());
    }
    let names = by_repo.entry(repo.clone()).or_insert_with(|| {
        source
            .map(|source| blob_names(source, &repo))
            .unwrap_or_default()
    });
    match names.get(path) {
        Some(file) => format!("{id}: {}", file.display()),
        None => {
            let hash = path
                .file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default();
            format!("{id}: blob {}…", &hash[..hash.len().min(12)])
        }
    }
}

/// The name each blob of the repository at `repo` has in a snapshot (the newest
/// snapshot's name first, where two disagree), by the blob's path.
fn blob_names(source: &SourceTree, repo: &Path) -> HashMap<PathBuf, PathBuf> {
    let newest = hf::newest_snapshot(source, repo);
    let mut snapshots: Vec<PathBuf> = hf::snapshots(source, repo)
        .into_iter()
        .map(|rev| repo.join("snapshots").join(rev))
        .collect();
    snapshots.sort_by_key(|s| Some(s) != newest.as_ref());
    let mut names = HashMap::new();
    for snapshot in snapshots {
        for (file, blob) in hf::snapshot_files(source, &snapshot) {
            let name = file.strip_prefix(&snapshot).unwrap_or(&file).to_path_buf();
            names.entry(blob).or_insert(name);
        }
    }
    names
}

/// Why a copy does not hold what was staged, if it does not.
fn mismatch(store: &Store, key: &Key, info: &EntryInfo) -> Option<String> {
    let reason = match compare_with_record(&store.data_path(key), key, &info.entry) {
        Err(e) => return Some(format!("unreadable: {}", stagefs_source::io_text(&e))),
        Ok(CopyCheck::Matches) => return None,
        Ok(CopyCheck::Blake3Differs) => "blake3 differs from the one recorded when it was staged",
        // Staging checked the copy against the name, so the copy changed since.
        Ok(CopyCheck::Sha256Differs) => {
            "sha256 differs from the blob's name: the cached copy changed since it was staged (disk corruption or a write)"
        }
        Ok(CopyCheck::Unrecorded) => "no digest was recorded for it",
    };
    Some(reason.into())
}

/// A model id (`org/name`, or a folder's or file's path in the source); refuses
/// absolute paths and `..`.
fn checked_id(id: &str) -> Result<&str, AdminError> {
    if models::is_model_id(id) {
        Ok(id)
    } else {
        Err(AdminError::BadRequest(format!(
            "'{id}' is not a model id like org/name or a path in the source"
        )))
    }
}

fn checked_relative(path: &Path) -> Result<PathBuf, AdminError> {
    if is_plain_relative(path) && !path.as_os_str().is_empty() {
        Ok(path.to_path_buf())
    } else {
        Err(AdminError::BadRequest(format!(
            "{}: not a path inside the source",
            path.display()
        )))
    }
}

/// Fills in per-snapshot totals of the repositories and totals of the folders and
/// files in `catalog`, adding those with nothing staged. A repository without a
/// snapshot (a download that never finished) is left out. Returns each model's
/// largest file.
fn add_totals(
    store: &Store,
    source: &SourceTree,
    catalog: &Catalog,
    models: &mut BTreeMap<PathBuf, ModelStatus>,
) -> Vec<TooLarge> {
    let mut largest = Vec::new();
    for found in &catalog.models {
        let files = match found.kind {
            ModelKind::HfRepo => {
                let (revisions, files) = revisions(store, source, &found.path);
                if revisions.is_empty() {
                    continue;
                }
                let model = model_entry(models, found);
                model.revisions = revisions;
                // A blob two repositories share is one copy, staged from either's
                // path: counted for each, as their revisions count it.
                model.staged_files = files.iter().filter(|f| f.staged).count();
                model.staged_bytes = files.iter().filter(|f| f.staged).map(|f| f.bytes).sum();
                largest.extend(largest_of(found, files.iter().map(|f| (&f.path, f.bytes))));
                continue;
            }
            ModelKind::Folder => {
                model_entry(models, found).unfollowable = unfollowable(source, &found.path);
                sized(source, hf::all_files(source, &found.path))
            }
            ModelKind::File => sized(source, vec![found.path.clone()]),
        };
        largest.extend(largest_of(found, files.iter().map(|(p, size)| (p, *size))));
        let model = model_entry(models, found);
        model.total_files = Some(files.len());
        model.total_bytes = Some(files.iter().map(|(_, size)| size).sum());
    }
    largest
}

/// The largest of `model`'s `files` (path, size).
fn largest_of<'a>(
    model: &ModelRef,
    files: impl Iterator<Item = (&'a PathBuf, u64)>,
) -> Option<TooLarge> {
    let (path, bytes) = files.max_by_key(|(_, size)| *size)?;
    Some(TooLarge {
        model: model.id.clone(),
        path: path.clone(),
        bytes,
    })
}

/// Whether a copy at `path` is one of `model`'s files: a repository's `refs/` and
/// `.no_exist/` are bookkeeping that no revision lists, and counting them would make
/// the model's line disagree with its revisions' (`4 staged files` beside `3/3`).
fn is_model_file(model: &ModelRef, path: &Path) -> bool {
    model.kind != ModelKind::HfRepo || !is_repo_bookkeeping(path)
}

/// Whether `path` lies in an HF repository outside its `blobs/` and `snapshots/`
/// (`refs/main`, `.no_exist/`): a copy of it goes with no model's files, so `evict`
/// and `verify` of a model leave it out, as `status` does.
fn is_repo_bookkeeping(path: &Path) -> bool {
    hf::repo_of(path).is_some_and(|repo| {
        let inside = path.strip_prefix(&repo).unwrap_or(path);
        !(inside.starts_with("blobs") || inside.starts_with("snapshots"))
    })
}

fn empty_status(model: &ModelRef) -> ModelStatus {
    ModelStatus {
        model: model.id.clone(),
        kind: model.kind,
        path: model.path.clone(),
        staged_files: 0,
        staged_bytes: 0,
        revisions: Vec::new(),
        total_files: None,
        total_bytes: None,
        unfollowable: Vec::new(),
        files: Vec::new(),
        offline: Vec::new(),
    }
}

fn model_entry<'a>(
    models: &'a mut BTreeMap<PathBuf, ModelStatus>,
    found: &ModelRef,
) -> &'a mut ModelStatus {
    models
        .entry(found.path.clone())
        .or_insert_with(|| empty_status(found))
}

/// A file of a repository's snapshots, once however many list it.
struct RepoFile {
    path: PathBuf,
    bytes: u64,
    staged: bool,
}

/// Each snapshot's totals, and the files of all of them.
fn revisions(
    store: &Store,
    source: &SourceTree,
    repo: &Path,
) -> (Vec<RevisionStatus>, Vec<RepoFile>) {
    let refs = hf::refs_by_commit(source, repo);
    let mut files: BTreeMap<PathBuf, RepoFile> = BTreeMap::new();
    let revisions = hf::snapshots(source, repo)
        .into_iter()
        .map(|rev| {
            let snapshot = repo.join("snapshots").join(&rev);
            let mut status = RevisionStatus {
                refs: refs.get(&rev).cloned().unwrap_or_default(),
                revision: rev.clone(),
                staged_files: 0,
                total_files: 0,
                staged_bytes: 0,
                total_bytes: 0,
                unfollowable: unfollowable(source, &snapshot),
            };
            for (file, size) in snapshot_files(source, &snapshot) {
                let staged = store.contains(&Key::for_source_path(&file));
                status.total_files += 1;
                status.total_bytes += size;
                if staged {
                    status.staged_files += 1;
                    status.staged_bytes += size;
                }
                files.entry(file.clone()).or_insert(RepoFile {
                    path: file,
                    bytes: size,
                    staged,
                });
            }
            status
        })
        .collect();
    (revisions, files.into_values().collect())
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

/// The links under `dir` that lead to no file, named relative to `dir`: the totals
/// leave them out, and a snapshot whose links all fail would read as empty. Sorted,
/// so that the first (the one status names) does not depend on the source's order.
fn unfollowable(source: &SourceTree, dir: &Path) -> Vec<UnfollowableLink> {
    let mut links: Vec<UnfollowableLink> = hf::unfollowable_links(source, dir)
        .into_iter()
        .map(|(path, why)| UnfollowableLink {
            path: path.strip_prefix(dir).unwrap_or(&path).to_path_buf(),
            why: why.to_string(),
        })
        .collect();
    links.sort_by(|a, b| a.path.cmp(&b.path));
    links
}

/// Files of a snapshot as (path the link resolves to, size).
fn snapshot_files(source: &SourceTree, dir: &Path) -> Vec<(PathBuf, u64)> {
    sized(
        source,
        hf::snapshot_files(source, dir)
            .into_iter()
            .map(|(_, resolved)| resolved)
            .collect(),
    )
}

/// Each regular file, with its size: a link that leads to no file (a loop, one out
/// of the source) is listed among the unfollowable, not counted as one of the files.
fn sized(source: &SourceTree, files: Vec<PathBuf>) -> Vec<(PathBuf, u64)> {
    files
        .into_iter()
        .filter_map(|file| {
            let meta = source.stat(&file).ok().filter(|m| m.is_file())?;
            Some((file, meta.len()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;
    use std::sync::Arc;

    use super::*;
    use stagefs_stage::Stager;
    use stagefs_store::budget::Budget;

    #[test]
    fn model_ids_and_paths_are_validated() {
        for good in ["org/name", "models/mlx-community/m", "solo.gguf"] {
            assert!(checked_id(good).is_ok(), "{good}");
        }
        for bad in ["../x", "org/..", "/abs", "", "./a"] {
            assert!(checked_id(bad).is_err(), "{bad}");
        }
        assert!(checked_relative(Path::new("models--a--b/blobs/x")).is_ok());
        for bad in ["", "/etc/passwd", "../x", "a/../../b", "./a"] {
            assert!(checked_relative(Path::new(bad)).is_err(), "{bad}");
        }
    }

    /// An HF_HOME-like source holding all three forms, with one file of each staged.
    async fn mixed() -> Result<(tempfile::TempDir, Stager), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let src = dir.path().join("src");
        let repo = src.join("hub/models--org--r");
        fs::create_dir_all(repo.join("snapshots/c1"))?;
        fs::create_dir_all(repo.join("blobs"))?;
        fs::create_dir_all(repo.join("refs"))?;
        fs::write(repo.join("refs/main"), "c1")?;
        fs::write(repo.join("blobs/w"), "repo weights")?;
        symlink("../../blobs/w", repo.join("snapshots/c1/model.safetensors"))?;
        let folder = src.join("models/org/m");
        fs::create_dir_all(&folder)?;
        fs::write(folder.join("config.json"), "{}")?;
        fs::write(folder.join("model.safetensors"), "folder weights")?;
        fs::write(src.join("models/solo.gguf"), "gguf")?;
        let store = Store::open(dir.path().join("cache"), Budget::default())?;
        let source = SourceTree::new(&src)?;
        let stager = Stager::new(
            source,
            store,
            Arc::default(),
            tokio::runtime::Handle::current(),
        );
        for file in [
            "hub/models--org--r/blobs/w",
            "models/org/m/model.safetensors",
            "models/solo.gguf",
        ] {
            stager.stage(Path::new(file)).await?;
        }
        Ok((dir, stager))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn status_names_every_form_of_model() -> Result<(), Box<dyn std::error::Error>> {
        let (_dir, stager) = mixed().await?;
        let source = ModelSource {
            tree: stager.source(),
            model_dirs: &[],
        };
        let report = status(stager.store(), Some(source), Live::default())?;
        let named: Vec<(&str, ModelKind, usize)> = report
            .models
            .iter()
            .map(|m| (m.model.as_str(), m.kind, m.staged_files))
            .collect();
        assert_eq!(
            named,
            [
                ("org/r", ModelKind::HfRepo, 1),
                ("models/org/m", ModelKind::Folder, 1),
                ("models/solo.gguf", ModelKind::File, 1)
            ]
        );
        assert_eq!(report.models[0].revisions[0].refs, ["main"]);
        assert_eq!(report.models[0].revisions[0].staged_files, 1);
        assert_eq!(report.models[1].total_files, Some(2));
        assert_eq!(report.models[1].total_bytes, Some(16));
        // Without the source, only repositories are told apart by their paths.
        let offline = status(stager.store(), None, Live::default())?;
        assert_eq!(offline.models.len(), 1);
        assert_eq!(offline.models[0].path, Path::new("hub/models--org--r"));
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn evict_and_verify_take_any_form_by_id() -> Result<(), Box<dyn std::error::Error>> {
        let (_dir, stager) = mixed().await?;
        let store = stager.store();
        let one = EvictSelector::Model { id: "org/m".into() };
        let verified = verify(store, None, &one, false)?;
        assert_eq!((verified.checked, verified.mismatches.len()), (1, 0));
        for (id, path) in [
            ("org/r", "hub/models--org--r/blobs/w"),
            ("org/m", "models/org/m/model.safetensors"),
            ("solo.gguf", "models/solo.gguf"),
        ] {
            let selector = EvictSelector::Model { id: id.into() };
            let report = evict(store, None, &selector, false, 0)?;
            let evicted: Vec<&Path> = report.evicted.iter().map(|f| f.path.as_path()).collect();
            assert_eq!(evicted, [Path::new(path)], "{id}");
        }
        assert!(store.entries().is_empty());
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn evict_and_verify_of_a_repository_count_its_files_not_its_refs()
    -> Result<(), Box<dyn std::error::Error>> {
        let (_dir, stager) = mixed().await?;
        // A kept copy of refs/main, as a mount keeps one of every small file it reads.
        stager
            .stage(Path::new("hub/models--org--r/refs/main"))
            .await?;
        let store = stager.store();
        let repo = EvictSelector::Model { id: "org/r".into() };
        assert_eq!(
            verify(store, None, &repo, false)?.checked,
            1,
            "the blob only"
        );
        let report = evict(store, None, &repo, false, 0)?;
        let evicted: Vec<&Path> = report.evicted.iter().map(|f| f.path.as_path()).collect();
        assert_eq!(evicted, [Path::new("hub/models--org--r/blobs/w")]);
        let left: Vec<PathBuf> = store
            .entries()
            .into_iter()
            .map(|i| i.entry.source)
            .collect();
        assert!(
            left.contains(&PathBuf::from("hub/models--org--r/refs/main")),
            "{left:?}"
        );
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_model_named_nowhere_is_not_found_and_verify_takes_a_path()
    -> Result<(), Box<dyn std::error::Error>> {
        let (_dir, stager) = mixed().await?;
        let (store, dirs) = (stager.store(), Vec::new());
        let source = Some(ModelSource {
            tree: stager.source(),
            model_dirs: &dirs,
        });
        let typo = EvictSelector::Model {
            id: "org/nonexistent".into(),
        };
        let missing = |e: AdminError| matches!(e, AdminError::Model(ModelError::NotFound { .. }));
        assert!(evict(store, source, &typo, true, 0).is_err_and(missing));
        assert!(verify(store, source, &typo, false).is_err_and(missing));
        // Without the source a typo cannot be told from a model that is away.
        assert_eq!(evict(store, None, &typo, true, 0)?.evicted.len(), 0);
        let folder = EvictSelector::Path {
            path: "models/org/m".into(),
        };
        assert_eq!(verify(store, source, &folder, false)?.checked, 1);
        Ok(())
    }
}
