//! Prefetch: staging files before a loader asks for them.
//!
//! Two users: the mount, which on the open of any file of a snapshot stages that
//! snapshot's weight files in shard order in the background (never evicting, and
//! stopping at the budget), and `stagefs prefetch`, which stages whole models and
//! reports progress. An open of a file being prefetched joins that copy (single
//! flight in the stager).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
pub use stagefs_control::prefetch::{FileProgress, FileState, Target};
use tracing::{debug, info};

use crate::admin::AdminError;
use crate::error::{StageError, StoreError};
use crate::layout::hf;
use crate::layout::models::{self, ModelSource};
use crate::source::{SourceTree, Stamp};
use crate::stage::Stager;
use crate::store::Store;

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
            .and_then(|model| models::unfollowable(tree, &model, revision.as_deref()))
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

fn target_files(source: ModelSource<'_>, target: &Target) -> Result<Vec<PathBuf>, AdminError> {
    match target {
        Target::Model { id, revision } => {
            let model = models::find(source.tree, id, source.model_dirs)?;
            Ok(models::files(source.tree, &model, revision.as_deref())?)
        }
        Target::Path { path } => path_files(source.tree, path),
    }
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
    let staged = |path: &Path| {
        let meta = stager.source().stat(path).ok().filter(|m| m.is_file());
        meta.is_some_and(|m| stager.redirect_target(path, Stamp::of(&m), false).is_some())
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

/// A set of files being staged, with per-file progress.
#[derive(Debug)]
pub struct Job {
    stager: Stager,
    files: Vec<(PathBuf, u64)>,
    states: Mutex<Vec<FileState>>,
    /// Files that failed before the job began (links that lead nowhere).
    failed: Vec<FileProgress>,
}

impl Job {
    /// A job staging `files` (path, size) in order.
    pub fn new(stager: Stager, files: Vec<(PathBuf, u64)>) -> Arc<Job> {
        Job::reporting(stager, files, Vec::new())
    }

    /// A job staging `files` that also reports `failed` (from [`unfollowable`]).
    pub fn reporting(
        stager: Stager,
        files: Vec<(PathBuf, u64)>,
        failed: Vec<FileProgress>,
    ) -> Arc<Job> {
        let states = Mutex::new(vec![FileState::Waiting; files.len()]);
        Arc::new(Job {
            stager,
            files,
            states,
            failed,
        })
    }

    /// Stages every file, `parallel` at a time. A prefetch someone `requested`
    /// (`stagefs prefetch`) may evict to make room, and reports a file staged only
    /// once its copy is durable and checked ([`Job::commit_staged`]). A background
    /// prefetch evicts nothing, stops at the first file the budget has no room
    /// for, and leaves the commits to their own pace, which defers a blob's check
    /// while loads copy.
    pub async fn run(self: Arc<Self>, parallel: usize, requested: bool) {
        let out_of_room = AtomicBool::new(false);
        let stamps = Mutex::new(vec![None; self.files.len()]);
        futures::stream::iter(0..self.files.len())
            .for_each_concurrent(parallel.max(1), |i| {
                let (job, out_of_room, stamps) = (Arc::clone(&self), &out_of_room, &stamps);
                async move {
                    if out_of_room.load(Ordering::Relaxed) {
                        job.set(
                            i,
                            FileState::Failed {
                                error: "skipped: the cache budget is full".into(),
                                remedy: Some(crate::Remedy::MoreRoom),
                            },
                        );
                        return;
                    }
                    job.set(i, FileState::Copying);
                    let path = &job.files[i].0;
                    let result = if requested {
                        job.stager.stage(path).await
                    } else {
                        job.stager.prefetch(path).await
                    };
                    let state = match result {
                        Ok(staged) if staged.copied => {
                            lock(stamps)[i] = Some(staged.stamp);
                            FileState::Staged
                        }
                        Ok(_) => FileState::AlreadyStaged,
                        Err(e) => {
                            if matches!(e, StageError::Store(StoreError::NoRoom { .. }))
                                && !requested
                            {
                                out_of_room.store(true, Ordering::Relaxed);
                            }
                            FileState::Failed {
                                error: e.to_string(),
                                remedy: e.remedy(),
                            }
                        }
                    };
                    job.set(i, state);
                }
            })
            .await;
        if requested {
            let stamps = stamps.into_inner().unwrap_or_else(PoisonError::into_inner);
            self.commit_staged(stamps).await;
        }
    }

    /// Waits for the commits of the copies this job made (`stamps`: each copied
    /// file's version), then fails any whose copy is gone: "staged" then means the
    /// copy survives a power cut and matched the sha256 its blob's name gives,
    /// which a blob from a local disk is checked for only after it was answered.
    async fn commit_staged(&self, stamps: Vec<Option<Stamp>>) {
        if stamps.iter().all(Option::is_none) {
            return;
        }
        let stager = self.stager.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || stager.store().commit_now()).await {
            debug!(error = %e, "the wait for the prefetch's commits ended early");
        }
        for (i, stamp) in stamps.into_iter().enumerate() {
            let path = &self.files[i].0;
            let Some(stamp) = stamp else { continue };
            if self.stager.redirect_target(path, stamp, false).is_some() {
                continue;
            }
            let error = match self.stager.refused(path, stamp) {
                true => "its bytes do not match the sha256 in the blob's name; nothing was kept",
                false => "its copy was dropped before it was committed (evicted, or unreadable)",
            };
            self.set(
                i,
                FileState::Failed {
                    error: error.into(),
                    remedy: None,
                },
            );
        }
    }

    fn set(&self, i: usize, state: FileState) {
        self.states.lock().unwrap_or_else(PoisonError::into_inner)[i] = state;
    }

    /// Every file's progress now.
    pub fn progress(&self) -> Vec<FileProgress> {
        let in_flight = self.stager.in_flight();
        let states = self
            .states
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        self.files
            .iter()
            .zip(states)
            .map(|((path, total), state)| {
                let copied = match state {
                    FileState::Staged | FileState::AlreadyStaged => *total,
                    FileState::Copying => in_flight
                        .iter()
                        .find(|f| &f.path == path)
                        .map_or(0, |f| f.copied),
                    FileState::Waiting | FileState::Failed { .. } => 0,
                };
                FileProgress {
                    path: path.clone(),
                    total: *total,
                    copied,
                    state,
                }
            })
            .chain(self.failed.iter().cloned())
            .collect()
    }
}

/// Background prefetch of the snapshots a mount's opens touch.
#[derive(Debug)]
pub struct Prefetcher {
    stager: Stager,
    /// Files copied at a time; None: by the source's kind.
    parallel: Option<usize>,
    min_size: u64,
    active: Mutex<HashSet<PathBuf>>,
    /// Snapshots fully staged by an earlier prefetch of this mount.
    done: Mutex<HashSet<PathBuf>>,
}

impl Prefetcher {
    /// Prefetches with `parallel` copies at a time (None: as many as suit the source's
    /// kind, [`Stager::prefetch_width`]), files of at least `min_size` bytes.
    pub fn new(stager: Stager, parallel: Option<usize>, min_size: u64) -> Arc<Prefetcher> {
        Arc::new(Prefetcher {
            stager,
            parallel,
            min_size,
            active: Mutex::default(),
            done: Mutex::default(),
        })
    }

    /// `rel` was opened: stage the weight files of every snapshot containing it, or
    /// of the model folder it is in, unless a prefetch of that snapshot or folder is
    /// already running.
    pub fn on_open(self: &Arc<Self>, rel: &Path, runtime: &tokio::runtime::Handle) {
        let (this, rel) = (Arc::clone(self), rel.to_path_buf());
        runtime.spawn(async move {
            let pool = this.stager.source_pool();
            // A source that is slow or gone right now is left alone: the open that
            // triggered this comes first, and a prefetch can wait for the next one.
            if pool.is_unresponsive() {
                return;
            }
            let (source, scanner) = (this.stager.source().clone(), Arc::clone(&this));
            let scan = pool.run(move || {
                let snapshots = models::siblings_to_prefetch(&source, &rel)
                    .into_iter()
                    .filter(|(s, _)| !scanner.started(s))
                    .map(|(s, files)| (s, sized(&source, files, scanner.min_size)))
                    .collect::<Vec<_>>();
                (snapshots, scanner.stager.prefetch_width(scanner.parallel))
            });
            let Ok((snapshots, width)) = scan.await else {
                return;
            };
            for (snapshot, files) in snapshots {
                this.prefetch_snapshot(snapshot, files, width).await;
            }
        });
    }

    /// Whether `snapshot` was prefetched already, or is being prefetched.
    fn started(&self, snapshot: &Path) -> bool {
        lock(&self.done).contains(snapshot) || lock(&self.active).contains(snapshot)
    }

    async fn prefetch_snapshot(
        self: &Arc<Self>,
        snapshot: PathBuf,
        files: Vec<(PathBuf, u64)>,
        width: usize,
    ) {
        if lock(&self.done).contains(&snapshot) || !lock(&self.active).insert(snapshot.clone()) {
            return;
        }
        debug!(snapshot = %snapshot.display(), files = files.len(), "prefetching");
        let job = Job::new(self.stager.clone(), files);
        Arc::clone(&job).run(width, false).await;
        let progress = job.progress();
        let staged = progress
            .iter()
            .filter(|f| f.state == FileState::Staged)
            .count();
        if staged > 0 {
            info!(snapshot = %snapshot.display(), staged, "prefetched");
        }
        if progress
            .iter()
            .all(|f| !matches!(f.state, FileState::Failed { .. }))
        {
            lock(&self.done).insert(snapshot.clone());
        }
        lock(&self.active).remove(&snapshot);
    }
}

/// `files` with their sizes, those of at least `min_size` bytes (smaller ones are read
/// from the source, never staged), in the order given.
fn sized(source: &SourceTree, files: Vec<PathBuf>, min_size: u64) -> Vec<(PathBuf, u64)> {
    files
        .into_iter()
        .filter_map(|f| source.stat(&f).ok().map(|m| (f, m.len())))
        .filter(|(_, size)| *size >= min_size)
        .collect()
}

fn lock<T>(set: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    set.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::store::budget::Budget;

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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_requested_prefetch_reports_staged_only_what_was_committed_and_matched_its_name() {
        use crate::stage::tests::{fixture, journaled, write_empty_named_blob, write_named_blob};
        let fx = fixture();
        let good: Vec<u8> = (0..(3u32 << 20)).map(|i| (i % 239) as u8).collect();
        let good = write_named_blob(fx.src.path(), &good);
        // Named for the empty file: its bytes cannot match.
        let bad = write_empty_named_blob(fx.src.path(), &[7u8; 1 << 20]);
        let job = Job::new(
            fx.stager.clone(),
            vec![(good.clone(), 3 << 20), (bad, 1 << 20)],
        );
        // A local disk's blobs are answered before their check, which waits for a
        // quiet second: the job's report must wait for it, not race it.
        Arc::clone(&job).run(2, true).await;
        let progress = job.progress();
        assert_eq!(progress[0].state, FileState::Staged, "{progress:?}");
        assert!(
            matches!(&progress[1].state, FileState::Failed { error, .. } if error.contains("sha256")),
            "{progress:?}"
        );
        // The good copy's last journal line is the committed one, with its identity
        // (an uncommitted line has none, and a restart would hash it again).
        let identities = journaled(fx.cache.path(), &good);
        assert!(
            identities
                .last()
                .is_some_and(|c| *c != crate::store::index::CopyId::default()),
            "{identities:?}"
        );
        assert_eq!(fx.stager.store().entries().len(), 1);
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
