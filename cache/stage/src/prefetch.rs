//! Staging sets of files before a loader asks for them.
//!
//! A [`Job`] stages a list of files in order, some at a time, with per-file progress;
//! the mount's [`Prefetcher`] runs one, on the open of any file of a snapshot, for that
//! snapshot's weight files in shard order in the background (never evicting, and
//! stopping at the budget); `stagefs prefetch` runs one for whole models (its planner
//! is in `stagefs-mount`). An open of a file being prefetched joins that copy (single
//! flight in the stager).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
pub use stagefs_control::prefetch::{FileProgress, FileState, Target};
use stagefs_layout::models;
use stagefs_source::locks::lock;
use stagefs_source::{SourceTree, Stamp};
use stagefs_store::{Handout, StoreError};
use tracing::{debug, info};

use crate::Stager;
use crate::error::StageError;

/// A set of files being staged, with per-file progress.
#[derive(Debug)]
pub struct Job {
    stager: Stager,
    files: Vec<(PathBuf, u64)>,
    states: Mutex<Vec<FileState>>,
    /// Files that failed before the job began (links that lead nowhere).
    failed: Vec<FileProgress>,
    /// Whoever asked for the job is gone ([`Job::stop`]): no file is started after.
    stopped: AtomicBool,
}

impl Job {
    /// A job staging `files` (path, size) in order.
    pub fn new(stager: Stager, files: Vec<(PathBuf, u64)>) -> Arc<Job> {
        Job::reporting(stager, files, Vec::new())
    }

    /// A job staging `files` that also reports `failed` (from [`stagefs_layout::models::unfollowable`]).
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
            stopped: AtomicBool::new(false),
        })
    }

    /// Starts no more of the job's files: `stagefs prefetch` was interrupted. Copies
    /// under way finish, since an open may be waiting on the same copy; the files
    /// not started stay waiting, and a later prefetch or open stages them.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }

    /// Stages every file, `parallel` at a time. A prefetch someone `requested`
    /// (`stagefs prefetch`) may evict to make room, and reports a file staged only
    /// once its copy is durable and checked (`Job::commit_staged`). A background
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
                    if job.stopped.load(Ordering::Relaxed) {
                        return;
                    }
                    if out_of_room.load(Ordering::Relaxed) {
                        job.set(
                            i,
                            FileState::Failed {
                                error: "skipped: the cache budget is full".into(),
                                remedy: Some(stagefs_control::Remedy::MoreRoom),
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
        self.stager.commit_off_thread().await;
        for (i, stamp) in stamps.into_iter().enumerate() {
            let path = &self.files[i].0;
            let Some(stamp) = stamp else { continue };
            if self.stager.copy_path(path, stamp, Handout::Peek).is_some() {
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
        lock(&self.states)[i] = state;
    }

    /// Every file's progress now.
    pub fn progress(&self) -> Vec<FileProgress> {
        let in_flight = self.stager.in_flight();
        let states = lock(&self.states).clone();
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
        debug!(snapshot = %stagefs_source::logged(&snapshot), files = files.len(), "prefetching");
        let job = Job::new(self.stager.clone(), files);
        Arc::clone(&job).run(width, false).await;
        let progress = job.progress();
        let staged = progress
            .iter()
            .filter(|f| f.state == FileState::Staged)
            .count();
        if staged > 0 {
            info!(snapshot = %stagefs_source::logged(&snapshot), staged, "prefetched");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_requested_prefetch_reports_staged_only_what_was_committed_and_matched_its_name() {
        use crate::tests::{fixture, journaled, write_empty_named_blob, write_named_blob};
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
                .is_some_and(|c| *c != stagefs_store::index::CopyId::default()),
            "{identities:?}"
        );
        assert_eq!(fx.stager.store().entries().len(), 1);
    }
}
