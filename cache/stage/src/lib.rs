//! The stage layer of stagefs: copying a whole source file into the store before
//! anyone reads it ([`Stager`], driving the copy engine of `stagefs_source::copy`),
//! adopting copies written through the mount, and staging files before a loader asks
//! for them ([`prefetch`]). It sits on the source (`stagefs-source`), the store
//! (`stagefs-store`) and the layout (`stagefs-layout`); the policy above it reaches the
//! store only through it.
//!
//! Invariants:
//! - one copy per file at a time (single flight): concurrent callers for the same path
//!   share one copy and all receive its result or its error;
//! - a copy runs on a worker thread, detached from whoever asked for it, so a caller
//!   that goes away (a closed handle, an interrupted open) never leaves a partial file;
//! - a copy is committed only if the source kept the same size and mtime from before
//!   the first byte to after the last one, and exactly that many bytes were read;
//! - a [`Staged`] carries an open descriptor of the verified copy, so later renames in
//!   the store cannot change what its holder reads;
//! - a caller gets the copy once it is whole, verified and in the index (renamed into
//!   place), so a copy anyone reads is one `status` lists and eviction can see; it is
//!   made durable in the background (`stagefs_store`), so no caller waits for the
//!   cache disk to write it.
//!
//! # When a copy fails
//!
//! Every way a copy goes wrong ends with nothing wrong served, in one of four ways:
//! - **An error** while copying (a source read fails, the cache disk is full, the
//!   worker dies): the temp file and the room reserved for it are dropped, and every
//!   caller sharing the flight gets the same [`StageError`] (`Source`, `Store`,
//!   `Worker`). Nothing was served: a caller gets a copy only once it is whole. The
//!   next open starts a new copy. A daemon killed mid-copy leaves only a temp file,
//!   which the store removes when it next opens.
//! - **A change** at the source during the copy (size, mtime, or the bytes read):
//!   [`StageError::SourceChanged`], checked once the last byte is in
//!   (`Inner::check_unchanged`); the copy is discarded.
//! - **A stall**: the source stops answering mid-file and the copy reads nothing.
//!   [`Stager::stage_version_within`] stops waiting after the caller's patience (the
//!   source timeout) with [`StageError::Stalled`]; the policy then serves a stored
//!   copy of exactly that version, if there is one, else EIO. The copy goes on,
//!   detached, and commits if it ends whole and unchanged.
//! - **A late mismatch**: a blob named by its sha256 (`blobs/<sha256>`) staged from a
//!   local disk is served once whole, and its sha256 is checked behind it
//!   (`Inner::settle_when_checked`, once copies have been quiet for a moment). If it
//!   is not its name, the copy leaves the index and is never trusted after a
//!   restart, and the blob is refused at that version ([`Stager::refused`],
//!   [`StageError::ContentMismatch`] for later opens, named by `status` and
//!   `doctor`) until it changes at the source. What was read already is exactly what
//!   the source holds. From a network source the check runs within the copy, so a
//!   mismatch fails the copy before anything is served.

pub mod answers;
pub mod defaults;
pub mod error;
pub mod metrics;
pub mod offline;
pub mod prefetch;
pub mod tee;
mod written;

use std::collections::{HashMap, VecDeque};
use std::fs::File;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use stagefs_source::locks::lock;
use tempfile::NamedTempFile;
use tokio::runtime::Handle;
use tracing::{debug, info, warn};

pub use stagefs_control::{InFlight, StagingFailure};

pub use error::StageError;
pub use metrics::{Metrics, MetricsSnapshot};
use stagefs_source::copy::{
    CopyError, CopyJob, CopyOptions, CopyPlan, Digests, NameCheck, Verdict, copy_to_file,
};
use stagefs_source::pool::{DEFAULT_SOURCE_THREADS, SourcePool};
use stagefs_source::{SourceError, SourceMeta, SourceTree, Stamp};
use stagefs_store::index::{CopyId, Entry};
use stagefs_store::key::Key;
use stagefs_store::{OpenCopy, Store};
pub use written::{SourceVersion, WrittenCopy};
// Store types that are part of this layer's API: what a staged copy holds open, and
// what a failed stage carries.
pub use stagefs_store::key::is_content_addressed;
pub use stagefs_store::{Handout, Pin, StoreError};
pub use tee::TeeWriter;

/// Whether `rel` names an LFS blob by its sha256 (`blobs/<sha256>`): its content
/// is its name, so a copy of it is checked against the name and never goes stale.
pub fn named_by_sha256(rel: &Path) -> bool {
    Key::for_source_path(rel).content_sha256().is_some()
}

/// A complete, verified local copy of one source file.
#[derive(Debug, Clone)]
pub struct Staged {
    /// The copy, open for reading.
    pub file: Arc<File>,
    /// Where the copy lives in the store.
    pub path: PathBuf,
    /// The current source version, which the copy's bytes are.
    pub stamp: Stamp,
    /// Whether this call copied the file (false: an existing copy was reused).
    pub copied: bool,
    /// Keeps the copy from being evicted while any clone of this is held.
    pub pin: Arc<Pin>,
}

#[derive(Debug, Default)]
struct Progress {
    copied: AtomicU64,
    read: AtomicU64,
    total: AtomicU64,
    /// An open waits for this copy.
    urgent: AtomicBool,
}

/// Counts copies an open is waiting for, while alive.
#[derive(Debug)]
struct UrgentGuard(Arc<AtomicUsize>);

impl UrgentGuard {
    fn new(count: &Arc<AtomicUsize>) -> UrgentGuard {
        count.fetch_add(1, Ordering::Relaxed);
        UrgentGuard(Arc::clone(count))
    }
}

impl Drop for UrgentGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How long no copy must have run before a blob's check against its name hashes: by
/// then the loader the copies were for has them (MLX opens every shard, then reads
/// them from the page cache), and the check no longer takes a core it needs.
const CHECK_AFTER_QUIET: Duration = Duration::from_secs(1);

/// The longest a check waits for that quiet moment after its copy, so a long
/// prefetch does not leave copies unchecked (pinned and uncommitted) for its length.
const CHECK_WAITS_MAX: Duration = Duration::from_secs(30);

/// When a blob's check against its name may hash.
#[derive(Debug, Clone, Copy)]
struct CheckTiming {
    after_quiet: Duration,
    waits_max: Duration,
}

impl Default for CheckTiming {
    fn default() -> Self {
        CheckTiming {
            after_quiet: CHECK_AFTER_QUIET,
            waits_max: CHECK_WAITS_MAX,
        }
    }
}

/// The copies running, and when the last one ended.
#[derive(Debug)]
struct Activity {
    running: AtomicUsize,
    last_end: Mutex<Instant>,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            running: AtomicUsize::new(0),
            last_end: Mutex::new(Instant::now()),
        }
    }
}

impl Activity {
    /// Counts one copy as running while the guard lives.
    fn begin(self: &Arc<Self>) -> RunningGuard {
        self.running.fetch_add(1, Ordering::SeqCst);
        RunningGuard(Arc::clone(self))
    }

    /// Whether no copy has run for `quiet`.
    fn quiet_for(&self, quiet: Duration) -> bool {
        self.running.load(Ordering::SeqCst) == 0 && lock(&self.last_end).elapsed() >= quiet
    }
}

/// One running copy, counted in its [`Activity`].
#[derive(Debug)]
struct RunningGuard(Arc<Activity>);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        // Stamped before the count drops, so a count of zero is never seen with the
        // end time of an earlier copy.
        *lock(&self.0.last_end) = Instant::now();
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

type StageResult = Result<Staged, StageError>;

/// Why a copy was started: an open may evict to make room, a prefetch may not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    Open,
    Prefetch,
    /// A small file's copy, kept for when the source does not respond.
    Keep,
    /// A copy written through the mount, being verified ([`written`]).
    Written,
}

#[derive(Debug, Clone)]
struct Flight {
    path: PathBuf,
    purpose: Purpose,
    progress: Arc<Progress>,
    /// The committed copy, or why there is none.
    result: Shared<BoxFuture<'static, StageResult>>,
}

impl Flight {
    /// Where the copy stands, as `status` and the NFS adapter's holds read it.
    fn report(&self) -> InFlight {
        InFlight {
            path: self.path.clone(),
            copied: self.progress.copied.load(Ordering::Relaxed),
            read: self.progress.read.load(Ordering::Relaxed),
            total: self.progress.total.load(Ordering::Relaxed),
        }
    }
}

/// Stages source files into a store, one copy per file at a time.
#[derive(Debug, Clone)]
pub struct Stager {
    inner: Arc<Inner>,
}

/// Links a stager remembers the names of (a few models' files): see
/// [`Stager::learn_link`].
const REMEMBERED_LINKS: usize = 16_384;

/// Bytes written between two requests to start writing them back to disk.
const WRITEBACK_STEP: u64 = 32 << 20;

/// How a stager copies and how long it waits for its source.
#[derive(Debug, Clone, Copy)]
pub struct StagerOptions {
    /// Reads in flight and chunk size of each copy.
    pub copy: CopyOptions,
    /// How long a source operation may take before it fails.
    pub source_timeout: std::time::Duration,
    /// Threads for source operations: the most that can be stuck on a dead source.
    pub source_threads: usize,
}

impl Default for StagerOptions {
    fn default() -> Self {
        StagerOptions {
            copy: CopyOptions::default(),
            source_timeout: crate::defaults::SOURCE_TIMEOUT,
            source_threads: DEFAULT_SOURCE_THREADS,
        }
    }
}

#[derive(Debug)]
struct Inner {
    source: SourceTree,
    /// What the source answered, kept with the cache (`answers.rs`).
    answers: Arc<answers::Answers>,
    pool: SourcePool,
    store: Store,
    metrics: Arc<Metrics>,
    runtime: Handle,
    copy: CopyOptions,
    /// `copy` settled for the source's kind, once known.
    settled_copy: std::sync::OnceLock<CopyPlan>,
    inflight: Mutex<HashMap<Key, Flight>>,
    /// Copies started for opens and not finished: prefetch copies from a network
    /// source wait for zero, so the file a loader is blocked on gets the whole link.
    urgent_copies: Arc<AtomicUsize>,
    /// Blobs whose copy was found not to match their name, by path, at the version
    /// copied: refused until the source file changes.
    refused: Arc<Mutex<HashMap<PathBuf, Stamp>>>,
    /// The link each file was last reached through (a snapshot's name for its blob),
    /// by the file's path: names a copy without asking a slow source.
    reached_through: Mutex<HashMap<PathBuf, PathBuf>>,
    /// Copies running, which checks against blobs' names wait out.
    activity: Arc<Activity>,
    check_timing: CheckTiming,
    /// The last files that could not be staged, oldest first: otherwise only the log
    /// says why a loader's open failed.
    failures: Mutex<VecDeque<StagingFailure>>,
}

impl Stager {
    /// A stager copying from `source` into `store`; copies run on `runtime`'s blocking pool.
    pub fn new(source: SourceTree, store: Store, metrics: Arc<Metrics>, runtime: Handle) -> Self {
        Self::with_copy_options(source, store, metrics, runtime, CopyOptions::default())
    }

    /// A stager whose copies use `copy` (reads in flight, chunk size).
    pub fn with_copy_options(
        source: SourceTree,
        store: Store,
        metrics: Arc<Metrics>,
        runtime: Handle,
        copy: CopyOptions,
    ) -> Self {
        let options = StagerOptions {
            copy,
            ..StagerOptions::default()
        };
        Self::with_options(source, store, metrics, runtime, options)
    }

    /// A stager with every option spelled out.
    pub fn with_options(
        source: SourceTree,
        store: Store,
        metrics: Arc<Metrics>,
        runtime: Handle,
        options: StagerOptions,
    ) -> Self {
        Stager {
            inner: Arc::new(Inner {
                answers: Arc::new(answers::Answers::open(&store.dir().join(answers::JOURNAL))),
                source,
                pool: SourcePool::new(options.source_threads, options.source_timeout),
                store,
                metrics,
                runtime,
                copy: options.copy,
                settled_copy: std::sync::OnceLock::new(),
                inflight: Mutex::new(HashMap::new()),
                urgent_copies: Arc::default(),
                refused: Arc::default(),
                reached_through: Mutex::default(),
                activity: Arc::default(),
                check_timing: CheckTiming::default(),
                failures: Mutex::default(),
            }),
        }
    }

    /// What the source answered, kept with the cache: what the mount answers with
    /// while the source is away.
    pub fn answers(&self) -> &answers::Answers {
        &self.inner.answers
    }

    /// The source as the cache remembers it, asking the real one nothing: for status
    /// while it is away.
    pub fn remembered_source(&self) -> SourceTree {
        let root = self.inner.source.root().to_path_buf();
        let answers = Arc::clone(&self.inner.answers);
        SourceTree::from_backend(Arc::new(answers::RememberedSource::new(root, answers)))
    }

    /// The mirrored source.
    pub fn source(&self) -> &SourceTree {
        &self.inner.source
    }

    /// The executor every source operation runs on, and the source's health.
    pub fn source_pool(&self) -> &SourcePool {
        &self.inner.pool
    }

    /// Files a background prefetch copies at once: `configured`, else by the source's
    /// kind ([`defaults::prefetch_parallel`]). May ask the source: call it on the
    /// source pool.
    pub fn prefetch_width(&self, configured: Option<usize>) -> usize {
        let by_kind = || defaults::prefetch_parallel(self.inner.copy_plan_on_pool().local_source);
        configured.unwrap_or_else(by_kind).max(1)
    }

    /// The local store.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Removes the stored copy of `rel` (for a file changed or gone on the source),
    /// if nothing holds it open. Ok also when there was none. May block: the
    /// store's removal journals and syncs.
    pub fn remove_copy(&self, rel: &Path) -> Result<(), StoreError> {
        self.inner
            .store
            .remove(&Key::for_source_path(rel))
            .map(drop)
    }

    /// [`Stager::remove_copy`] without waiting for NFS links to the copy to be
    /// taken back: it is refused as in use meanwhile, and goes at a later call.
    pub fn remove_copy_now(&self, rel: &Path) -> Result<(), StoreError> {
        self.inner
            .store
            .remove_or_take_back(&Key::for_source_path(rel))
            .map(drop)
    }

    /// Whether the store holds a copy of `rel`, of any version.
    pub fn has_copy(&self, rel: &Path) -> bool {
        self.inner.store.contains(&Key::for_source_path(rel))
    }

    /// The counters this stager updates.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// Returns a complete local copy of the current version of source file `rel`,
    /// copying it first unless an up-to-date copy is already stored.
    pub async fn stage(&self, rel: &Path) -> StageResult {
        self.join(rel, Purpose::Open).await
    }

    /// Stages `rel` ahead of use: like [`Stager::stage`], but never evicts anything.
    pub async fn prefetch(&self, rel: &Path) -> StageResult {
        self.join(rel, Purpose::Prefetch).await
    }

    /// Keeps a copy of small file `rel`, to serve while the source does not respond:
    /// like [`Stager::prefetch`], but counted apart (`kept_copies`), since the file
    /// itself is still read from the source.
    pub async fn keep(&self, rel: &Path) -> StageResult {
        self.join(rel, Purpose::Keep).await
    }

    /// The result of the copy of `rel` in flight, started for `purpose` if none is.
    /// Joining one started for another purpose, it tries once more on its own where
    /// that one's failure need not be its own: a prefetch's or a kept copy's lack of
    /// room (an open may evict), and any refusal of a written copy (a copy from the
    /// source may still succeed).
    async fn join(&self, rel: &Path, purpose: Purpose) -> StageResult {
        let flight = self.flight_for(rel, purpose);
        if purpose == Purpose::Open {
            // Someone is waiting for this one: a prefetch of it stops yielding to opens.
            flight.progress.urgent.store(true, Ordering::Relaxed);
        }
        let result = flight.result.await;
        let again = match &result {
            Err(_) if flight.purpose == Purpose::Written => true,
            Err(StageError::Store(StoreError::NoRoom { .. })) => {
                purpose == Purpose::Open && flight.purpose != Purpose::Open
            }
            _ => false,
        };
        if !again {
            return result;
        }
        let retry = self.flight_for(rel, purpose);
        if purpose == Purpose::Open {
            retry.progress.urgent.store(true, Ordering::Relaxed);
        }
        retry.result.await
    }

    /// A complete copy of version `version` of `rel`, which the caller looked up a
    /// moment ago. A blob named by its sha256 is its content, so a stored copy of it is
    /// served without asking the source anything; any other file is staged as its
    /// current version (the caller checks that it is still `version`).
    pub async fn stage_version(&self, rel: &Path, version: Stamp) -> StageResult {
        if Key::for_source_path(rel).content_sha256().is_some()
            && let Some(staged) = self.stored_off_thread(rel, version).await
        {
            Metrics::bump(&self.inner.metrics.stage_hits);
            return Ok(staged);
        }
        self.stage(rel).await
    }

    /// [`Stager::stage_version`], given up with [`StageError::Stalled`] once the copy
    /// in progress has read nothing for `patience` (or none has started in that time).
    /// A source that answers slowly but steadily is waited for however long the file
    /// takes; one that hangs mid-file is not.
    pub async fn stage_version_within(
        &self,
        rel: &Path,
        version: Stamp,
        patience: Duration,
    ) -> StageResult {
        tokio::select! {
            staged = self.stage_version(rel, version) => staged,
            () = self.stalled(rel, patience) => Err(StageError::Stalled {
                path: rel.to_path_buf(),
                idle: patience,
            }),
        }
    }

    /// Returns once the copy of `rel` has read nothing for `limit`: its progress is
    /// looked at every 250 ms (at most), as a copy reports it, not as bytes arrive.
    async fn stalled(&self, rel: &Path, limit: Duration) {
        let tick = limit.min(Duration::from_millis(250));
        let mut last = None;
        let mut since = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(tick).await;
            let copied = self.progress(rel).map(|f| f.read);
            if copied != last {
                last = copied;
                since = tokio::time::Instant::now();
            } else if since.elapsed() >= limit {
                return;
            }
        }
    }

    /// Waits until every copy made so far is committed (synced, in the index), on a
    /// thread where that may block.
    pub async fn commit_off_thread(&self) {
        let stager = self.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || stager.store().commit_now()).await {
            debug!(error = %e, "the wait for the commits ended early");
        }
    }

    /// [`Stager::stored`], run where it may block (it may re-hash the copy).
    pub async fn stored_off_thread(&self, rel: &Path, version: Stamp) -> Option<Staged> {
        let (stager, path) = (self.clone(), rel.to_path_buf());
        self.inner
            .runtime
            .spawn_blocking(move || stager.stored(&path, version))
            .await
            .ok()
            .flatten()
    }

    /// A stored copy of source file `rel` at version `stamp`, without asking the source
    /// anything (for when it does not answer). May re-hash the copy: call off the
    /// request loop.
    pub fn stored(&self, rel: &Path, stamp: Stamp) -> Option<Staged> {
        let key = Key::for_source_path(rel);
        let hit = self
            .inner
            .store
            .lookup(&key, |e| reusable(e, &key, rel, stamp))?;
        Some(staged(hit, stamp, false))
    }

    /// Where a stored copy of source file `rel` at version `stamp` can be read
    /// directly, if one is whole and untouched; `handout` says what the caller does
    /// with the path, and so how long the copy stays in use ([`Handout`]). Asks the
    /// source nothing and never hashes: a stat of the copy at most.
    pub fn copy_path(&self, rel: &Path, stamp: Stamp, handout: Handout) -> Option<PathBuf> {
        let key = Key::for_source_path(rel);
        let accept = |e: &Entry| reusable(e, &key, rel, stamp);
        self.inner.store.redirect(&key, accept, handout)
    }

    /// Whether the copy of `rel` is being taken back from NFS links, to be removed.
    pub fn copy_taken_back(&self, rel: &Path) -> bool {
        self.inner.store.taken_back(&Key::for_source_path(rel))
    }

    /// An NFS client may keep the link attributes it has until `until` (see
    /// [`stagefs_store::Store::links_unsettled_until`]).
    pub fn links_unsettled_until(&self, until: std::time::Instant) {
        self.inner.store.links_unsettled_until(until);
    }

    /// Whether blob `rel` at version `stamp` is refused: its copy was dropped
    /// because its bytes are not the sha256 its name gives.
    pub fn refused(&self, rel: &Path, stamp: Stamp) -> bool {
        self.inner.was_refused(rel, stamp)
    }

    /// The blobs refused (their bytes on the source are not the sha256 in their
    /// names), by path, sorted; some may have changed on the source since, which
    /// only a stat tells ([`Stager::refused_now`]).
    pub fn refused_blobs(&self) -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = lock(&self.inner.refused).keys().cloned().collect();
        paths.sort();
        paths
    }

    /// [`Stager::refused_blobs`] still at the version refused: one that changed or
    /// went away on the source is refused no more. Stats each: call where the source
    /// may block.
    pub fn refused_now(&self) -> Vec<PathBuf> {
        let still = |path: &PathBuf| match self.inner.source.stat(path) {
            Ok(meta) => self.inner.was_refused(path, Stamp::of(&meta)),
            Err(SourceError::NotFound { .. }) => {
                lock(&self.inner.refused).remove(path);
                false
            }
            // Unknown: still refused as far as this mount knows.
            Err(_) => true,
        };
        self.refused_blobs().into_iter().filter(still).collect()
    }

    /// The last files that could not be staged and why, oldest first; a file staged
    /// since is left out.
    pub fn recent_failures(&self) -> Vec<StagingFailure> {
        lock(&self.inner.failures).iter().cloned().collect()
    }

    /// Waits until no copy of `rel` is in progress: the one under way, if any (a
    /// prefetch, or a small file's kept copy, which no open waits for), is committed
    /// or has failed (its error is returned).
    pub async fn settled(&self, rel: &Path) -> Result<(), StageError> {
        match self.flight_of(rel) {
            Some(flight) => flight.result.await.map(drop),
            None => Ok(()),
        }
    }

    /// Records that link `link` (relative to the source root) leads to `target`, as
    /// the mount just read it: the file at the end is then named by the link (a blob
    /// by its snapshot's file name) where the source is too slow to ask.
    pub fn learn_link(&self, link: &Path, target: &Path) {
        let Some(file) = stagefs_layout::hf::link_inside(link.parent().unwrap_or(link), target)
        else {
            return;
        };
        let mut known = lock(&self.inner.reached_through);
        // Names only: a mount that has followed this many links forgets the oldest
        // batch rather than grow without end.
        if known.len() >= REMEMBERED_LINKS && !known.contains_key(&file) {
            known.clear();
        }
        known.insert(file, link.to_path_buf());
    }

    /// The link `path` was last reached through, if the mount followed one to it.
    pub fn reached_through(&self, path: &Path) -> Option<PathBuf> {
        let known = self.inner.reached_through.lock();
        known
            .unwrap_or_else(PoisonError::into_inner)
            .get(path)
            .cloned()
    }

    /// Copies in progress.
    pub fn in_flight(&self) -> Vec<InFlight> {
        let inflight = self.inner.flights();
        let mut list: Vec<InFlight> = inflight.values().map(Flight::report).collect();
        list.sort_by(|a, b| a.path.cmp(&b.path));
        list
    }

    /// How far the copy of `rel` in progress has come, if one is.
    pub fn progress(&self, rel: &Path) -> Option<InFlight> {
        self.flight_of(rel).as_ref().map(Flight::report)
    }

    /// The copy of `rel` in flight, if any.
    fn flight_of(&self, rel: &Path) -> Option<Flight> {
        self.inner
            .flights()
            .get(&Key::for_source_path(rel))
            .cloned()
    }

    fn flight_for(&self, rel: &Path, purpose: Purpose) -> Flight {
        let key = Key::for_source_path(rel);
        let mut inflight = self.inner.flights();
        inflight
            .entry(key.clone())
            .or_insert_with(|| {
                self.start_flight(
                    rel.to_path_buf(),
                    key,
                    purpose,
                    move |inner, rel, key, progress| {
                        inner.copy_and_commit(rel, key, progress, purpose)
                    },
                )
            })
            .clone()
    }

    /// Starts `work` for `rel` on a worker thread, as the flight the caller enters in
    /// `inflight` under `key`; the worker takes it out once `work` is done.
    fn start_flight(
        &self,
        rel: PathBuf,
        key: Key,
        purpose: Purpose,
        work: impl FnOnce(&Inner, &Path, &Key, &Progress) -> StageResult + Send + 'static,
    ) -> Flight {
        let inner = Arc::clone(&self.inner);
        let worker_rel = rel.clone();
        let progress = Arc::new(Progress::default());
        let worker_progress = Arc::clone(&progress);
        // Counted from now, so a prefetch starting a moment later already yields.
        let urgent =
            (purpose == Purpose::Open).then(|| UrgentGuard::new(&self.inner.urgent_copies));
        let running = self.inner.activity.begin();
        let task = self.inner.runtime.spawn_blocking(move || {
            let result = work(&inner, &worker_rel, &key, &worker_progress);
            inner.note_outcome(&worker_rel, &result);
            drop((urgent, running));
            // Later callers start afresh (and hit the store) once this copy is settled.
            inner.flights().remove(&key);
            result
        });
        let path = rel.clone();
        let result = async move {
            task.await.unwrap_or_else(|e| {
                Err(StageError::Worker {
                    path: rel,
                    reason: e.to_string(),
                })
            })
        }
        .boxed()
        .shared();
        Flight {
            path,
            purpose,
            progress,
            result,
        }
    }
}

impl Inner {
    fn copy_and_commit(
        &self,
        rel: &Path,
        key: &Key,
        progress: &Progress,
        purpose: Purpose,
    ) -> StageResult {
        let meta = self.stat_source(rel)?;
        if !meta.is_file() {
            return Err(StageError::NotAFile {
                path: rel.to_path_buf(),
            });
        }
        let stamp = Stamp::of(&meta);
        progress.total.store(stamp.size, Ordering::Relaxed);
        if let Some(hit) = self.store.lookup(key, |e| reusable(e, key, rel, stamp)) {
            Metrics::bump(&self.metrics.stage_hits);
            progress.copied.store(stamp.size, Ordering::Relaxed);
            return Ok(staged(hit, stamp, false));
        }
        // After the store: a good copy of the same blob, staged from another
        // repository's path, is still the blob's content.
        if self.was_refused(rel, stamp) {
            return Err(StageError::ContentMismatch {
                path: rel.to_path_buf(),
            });
        }
        let plan = self.copy_plan();
        // A prefetch from a network source would split the link with the file a loader
        // waits for. From a local disk parallel copies keep the disk and the cores
        // busier: waiting made a sequential cold load on the 2-core VM take 1.21 s
        // instead of 0.71 s (docs/BENCHMARKS.md).
        if purpose != Purpose::Open && !plan.local_source {
            self.yield_to_opens(progress);
        }
        let may_evict = purpose == Purpose::Open;
        let reservation = self.store.reserve(key, stamp.size, rel, may_evict)?;
        let kept = purpose == Purpose::Keep;
        Metrics::bump(if kept {
            &self.metrics.kept_copies
        } else {
            &self.metrics.stage_copies
        });
        let started = Instant::now();
        info!(path = %stagefs_source::logged(rel), bytes = stamp.size, "staging");
        let (tmp, blake3, check) =
            self.copy(rel, stamp, plan, progress, !kept)
                .inspect_err(|e| {
                    warn!(path = %stagefs_source::logged(rel), error = %e, "staging failed");
                    // Checked before anything was served (a network source): refused
                    // at this version as a local disk's blob is once checked, so that
                    // status and doctor can name it and no open copies it again.
                    if matches!(e, StageError::ContentMismatch { .. }) {
                        self.refuse(rel, stamp);
                    }
                })?;
        let entry = Entry {
            source: rel.to_path_buf(),
            stamp,
            blake3,
            last_use: stagefs_source::sys::now_secs(),
            copy: CopyId::default(),
        };
        // The caller gets the copy once it is in the index (status lists it, eviction
        // sees it), and not only once it is durable: the store syncs it in the
        // background, so the loader never waits for the disk to write what it reads.
        let hit = match check {
            None => self.store.commit(key, tmp, entry, reservation)?,
            Some(check) => {
                let (hit, unverified) =
                    self.store.commit_unverified(key, tmp, entry, reservation)?;
                self.settle_when_checked(rel, stamp, check, unverified);
                hit
            }
        };
        let secs = started.elapsed().as_secs_f64();
        info!(
            path = %stagefs_source::logged(rel),
            bytes = stamp.size,
            secs,
            mib_per_s = stamp.size as f64 / (1 << 20) as f64 / secs.max(1e-9),
            "staged"
        );
        Ok(staged(hit, stamp, true))
    }

    /// Stats `rel` on the source pool, so a dead source holds one of its threads
    /// rather than one of the runtime's, and fails within the timeout.
    fn stat_source(&self, rel: &Path) -> Result<SourceMeta, StageError> {
        let (source, path) = (self.source.clone(), rel.to_path_buf());
        self.meta_on_pool(rel, move || source.stat(&path))
    }

    /// What `ask` says of source file `rel`, asked on the source pool, so a dead
    /// source holds one of its threads rather than one of the runtime's, and fails
    /// within the timeout.
    fn meta_on_pool(
        &self,
        rel: &Path,
        ask: impl FnOnce() -> Result<SourceMeta, SourceError> + Send + 'static,
    ) -> Result<SourceMeta, StageError> {
        self.pool
            .run_blocking(ask)
            .map_err(|why| SourceError::Unanswered {
                path: rel.to_path_buf(),
                why,
            })?
            .map_err(StageError::from)
    }

    /// The copies in flight, by key.
    fn flights(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Flight>> {
        lock(&self.inflight)
    }

    /// The copy options settled for the source's kind: asked of the source once (on
    /// the source pool, so a dead source fails this like any other call), and a
    /// network's until it answers.
    fn copy_plan(&self) -> CopyPlan {
        if let Some(settled) = self.settled_copy.get() {
            return *settled;
        }
        let source = self.source.clone();
        match self.pool.run_blocking(move || source.on_local_disk()) {
            Ok(local) => self.settle_copy(local),
            Err(_) => self.copy.for_source(false),
        }
    }

    /// The copy plan, asking the source here if it is not settled yet: only for a
    /// caller already on the source pool, which may block on the source.
    fn copy_plan_on_pool(&self) -> CopyPlan {
        match self.settled_copy.get() {
            Some(settled) => *settled,
            None => self.settle_copy(self.source.on_local_disk()),
        }
    }

    fn settle_copy(&self, on_local_disk: bool) -> CopyPlan {
        *self.settled_copy.get_or_init(|| {
            let settled = self.copy.for_source(on_local_disk);
            info!(
                local_disk = on_local_disk,
                chunk = settled.chunk,
                "copy settled for the source"
            );
            settled
        })
    }

    /// Waits while opens wait for other copies, unless an open waits for this one.
    fn yield_to_opens(&self, progress: &Progress) {
        while self.urgent_copies.load(Ordering::Relaxed) > 0
            && !progress.urgent.load(Ordering::Relaxed)
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Refuses blob `rel` at version `stamp`: its bytes are not its name's.
    fn refuse(&self, rel: &Path, stamp: Stamp) {
        let mut refused = lock(&self.refused);
        refused.insert(rel.to_path_buf(), stamp);
    }

    /// Whether `rel` is a blob refused at version `stamp` ([`Inner::settle_when_checked`]).
    fn was_refused(&self, rel: &Path, stamp: Stamp) -> bool {
        let mut refused = lock(&self.refused);
        match refused.get(rel) {
            Some(at) if *at == stamp => true,
            Some(_) => {
                refused.remove(rel);
                false
            }
            None => false,
        }
    }

    /// Once `check` has its verdict on the copy just recorded, commits it or, if
    /// the blob's bytes are not its name's, drops it and refuses the blob at this
    /// version: what was read already is what the source holds, but no later open
    /// gets it, and it is never trusted after a restart. The check hashes once no
    /// copy has run for [`CHECK_AFTER_QUIET`], or someone waits for the commit, or
    /// [`CHECK_WAITS_MAX`] has passed (see `check_timing`).
    fn settle_when_checked(
        &self,
        rel: &Path,
        stamp: Stamp,
        check: NameCheck,
        unverified: stagefs_store::Unverified,
    ) {
        let (rel, refused) = (rel.to_path_buf(), Arc::clone(&self.refused));
        let (activity, awaited, since, timing) = (
            Arc::clone(&self.activity),
            self.store.commits_awaited(),
            Instant::now(),
            self.check_timing,
        );
        let may_run = move || {
            awaited.now()
                || since.elapsed() >= timing.waits_max
                || activity.quiet_for(timing.after_quiet)
        };
        check.settle(stamp.size, may_run, move |verdict| match verdict {
            Verdict::Matches => {
                debug!(path = %stagefs_source::logged(&rel), "checked against the sha256 in its name");
                unverified.confirm();
            }
            Verdict::Differs => {
                lock(&refused)
                    .insert(rel.clone(), stamp);
                unverified.refute("does not match its name");
                warn!(path = %stagefs_source::logged(&rel), "the copied bytes do not match the sha256 in the blob's name (the blob on the source is corrupt, or changed during the copy): the copy was dropped, and the blob is refused until it changes");
            }
            Verdict::Unreadable(e) => {
                unverified.refute("unreadable");
                warn!(path = %stagefs_source::logged(&rel), error = %e, "could not read a staged copy back to check it; it will be staged again");
            }
        });
    }

    /// Copies `rel` into a temp file (not yet synced) the way `plan` says, hashing as
    /// it goes, and checks that the source did not change underneath. A blob from a
    /// local disk comes with its check against its name still to run
    /// ([`NameCheck`]): there sha256 is slower than the disk, and neither the copy
    /// nor the open waits for it.
    fn copy(
        &self,
        rel: &Path,
        expected: Stamp,
        plan: CopyPlan,
        progress: &Progress,
        count_bytes: bool,
    ) -> Result<(NamedTempFile, Option<String>, Option<NameCheck>), StageError> {
        let src = self.source.open(rel)?;
        let mut tmp = self.store.create_temp()?;
        let tmp_path = tmp.path().to_path_buf();
        let mut copied = 0u64;
        let expected_sha256 = Key::for_source_path(rel)
            .content_sha256()
            .map(str::to_string);
        let name_check = match &expected_sha256 {
            Some(sha256) if plan.local_source => Some(
                tmp.as_file()
                    .try_clone()
                    .and_then(|copy| NameCheck::start(copy, sha256.clone()))
                    .map_err(|e| StoreError::io(&tmp_path, e))?,
            ),
            _ => None,
        };
        // Where the copy is not checked against a name before it is served, the
        // source's own descriptor must show no change at all, its change time
        // included, which no writer can avoid moving.
        let before = match name_check {
            Some(_) => Some(src.meta().map_err(|e| SourceError::io(rel, e))?),
            None => None,
        };
        let writeback = stagefs_source::sys::Writeback::of(tmp.as_file());
        let mut started = 0u64;
        let job = CopyJob {
            size: expected.size,
            plan,
            digests: match name_check {
                Some(_) => Digests::none(),
                None => Digests::for_copy(expected_sha256.is_some()),
            },
            bytes_read: &progress.read,
        };
        let outcome = copy_to_file(src.as_ref(), tmp.as_file_mut(), job, |n| {
            copied += n;
            progress.copied.store(copied, Ordering::Relaxed);
            if count_bytes {
                self.metrics.bytes_copied.fetch_add(n, Ordering::Relaxed);
            }
            // From a network source the disk is idle while the link is the limit:
            // it writes as the copy goes on, so the commit's sync has little left.
            // From a local disk it would write while the next bytes are read, maybe
            // from the same disk; there the commit writes once the copies are done.
            if !plan.local_source && copied - started >= WRITEBACK_STEP {
                writeback.start(started, copied - started);
                started = copied;
            }
        })
        .map_err(|e| match e {
            CopyError::Read(e) => StageError::from(SourceError::io(rel, e)),
            CopyError::Write(e) => StoreError::io(&tmp_path, e).into(),
        })?;
        self.check_unchanged(rel, expected, outcome.bytes)?;
        if let Some(before) = before {
            let after = src.meta().map_err(|e| SourceError::io(rel, e))?;
            if (after.size, after.mtime_ns, after.ctime_ns)
                != (before.size, before.mtime_ns, before.ctime_ns)
            {
                return Err(StageError::SourceChanged {
                    path: rel.to_path_buf(),
                });
            }
            return Ok((tmp, outcome.blake3, name_check));
        }
        // An LFS blob is named by its content: this catches a change the source's
        // attribute cache hid, and a corrupt blob on the source.
        if outcome.sha256 != expected_sha256 {
            return Err(StageError::ContentMismatch {
                path: rel.to_path_buf(),
            });
        }
        Ok((tmp, outcome.blake3, None))
    }

    fn check_unchanged(&self, rel: &Path, expected: Stamp, copied: u64) -> Result<(), StageError> {
        let changed = || StageError::SourceChanged {
            path: rel.to_path_buf(),
        };
        let now = match self.stat_source(rel) {
            Ok(meta) => Stamp::of(&meta),
            Err(StageError::Source(SourceError::NotFound { .. })) => return Err(changed()),
            Err(e) => return Err(e),
        };
        if now != expected || copied != expected.size {
            return Err(changed());
        }
        Ok(())
    }
}

/// Staging failures [`Stager::recent_failures`] keeps.
const REMEMBERED_FAILURES: usize = 5;

impl Inner {
    /// Remembers a failure to stage `rel`, or forgets its earlier one once staged.
    fn note_outcome(&self, rel: &Path, result: &StageResult) {
        let mut failures = lock(&self.failures);
        failures.retain(|f| f.path != rel);
        let Err(e) = result else {
            return;
        };
        if failures.len() == REMEMBERED_FAILURES {
            failures.pop_front();
        }
        failures.push_back(StagingFailure {
            path: rel.to_path_buf(),
            error: e.to_string(),
            remedy: e.remedy(),
            at_secs: stagefs_source::sys::now_secs(),
        });
    }
}

/// Whether a stored copy may serve source file `rel` at version `stamp`: the same
/// version of the same file, or, for an LFS blob (named by its sha256, so its
/// content), a copy of that blob of the right size: from the same path with the
/// same mtime whatever its inode and change time (an sshfs remount numbers inodes
/// anew, a chmod on the NAS changes the change time: neither is worth copying every
/// model again), or from another repository's path.
pub fn reusable(entry: &Entry, key: &Key, rel: &Path, stamp: Stamp) -> bool {
    match (key.content_sha256().is_some(), entry.source == rel) {
        (true, true) => (entry.stamp.size, entry.stamp.mtime_ns) == (stamp.size, stamp.mtime_ns),
        (true, false) => entry.stamp.size == stamp.size,
        (false, same_path) => same_path && entry.stamp == stamp,
    }
}

fn staged(hit: OpenCopy, stamp: Stamp, copied: bool) -> Staged {
    Staged {
        file: Arc::new(hit.file),
        path: hit.path,
        stamp,
        copied,
        pin: Arc::new(hit.pin),
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::io::{Read, Seek, SeekFrom};

    use super::*;
    use stagefs_store::budget::Budget;

    /// A stager over a fresh source directory and store (also `written.rs`'s).
    pub(super) struct Fixture {
        pub(super) src: tempfile::TempDir,
        pub(super) cache: tempfile::TempDir,
        pub(super) stager: Stager,
    }

    pub(super) fn fixture() -> Fixture {
        let src = tempfile::tempdir().expect("tempdir");
        let cache = tempfile::tempdir().expect("tempdir");
        let source = SourceTree::new(src.path()).expect("source");
        let store = Store::open(cache.path(), Budget::default()).expect("store");
        let stager = Stager::new(source, store, Arc::default(), Handle::current());
        Fixture { src, cache, stager }
    }

    pub(super) fn contents(staged: &Staged) -> Vec<u8> {
        let mut file = staged.file.as_ref();
        let mut out = Vec::new();
        file.seek(SeekFrom::Start(0)).expect("seek");
        file.read_to_end(&mut out).expect("read");
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stages_once_then_reuses() {
        let fx = fixture();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        fs::write(fx.src.path().join("w.bin"), &data).expect("write");
        let first = fx.stager.stage(Path::new("w.bin")).await.expect("stage");
        assert!(first.copied);
        assert_eq!(contents(&first), data);
        let second = fx.stager.stage(Path::new("w.bin")).await.expect("stage");
        assert!(!second.copied);
        let m = fx.stager.metrics().snapshot();
        assert_eq!((m.stage_copies, m.stage_hits), (1, 1));
        assert_eq!(m.bytes_copied, data.len() as u64);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_callers_share_one_copy() {
        let fx = fixture();
        fs::write(fx.src.path().join("w.bin"), vec![7u8; 20 << 20]).expect("write");
        let calls = (0..16).map(|_| fx.stager.stage(Path::new("w.bin")));
        let results = futures::future::join_all(calls).await;
        assert!(
            results
                .iter()
                .all(|r| r.as_ref().is_ok_and(|s| s.stamp.size == 20 << 20))
        );
        assert_eq!(fx.stager.metrics().snapshot().stage_copies, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn changed_source_is_staged_again() {
        let fx = fixture();
        let path = fx.src.path().join("w.bin");
        fs::write(&path, b"old contents").expect("write");
        fx.stager.stage(Path::new("w.bin")).await.expect("stage");
        fs::write(&path, b"new contents, longer").expect("write");
        let staged = fx.stager.stage(Path::new("w.bin")).await.expect("stage");
        assert!(staged.copied);
        assert_eq!(contents(&staged), b"new contents, longer");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn missing_and_non_files_are_typed_errors() {
        let fx = fixture();
        fs::create_dir(fx.src.path().join("d")).expect("mkdir");
        assert!(matches!(
            fx.stager.stage(Path::new("nope")).await,
            Err(StageError::Source(SourceError::NotFound { .. }))
        ));
        assert!(matches!(
            fx.stager.stage(Path::new("d")).await,
            Err(StageError::NotAFile { .. })
        ));
    }

    const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    /// Writes `bytes` as the blob named by the sha256 of nothing, in `src`.
    pub(super) fn write_empty_named_blob(src: &Path, bytes: &[u8]) -> PathBuf {
        write_blob(src, EMPTY_SHA256, bytes)
    }

    /// Writes `bytes` as the blob their sha256 names, in `src`.
    pub(super) fn write_named_blob(src: &Path, bytes: &[u8]) -> PathBuf {
        let sha = format!("{:x}", <sha2::Sha256 as sha2::Digest>::digest(bytes));
        write_blob(src, &sha, bytes)
    }

    fn write_blob(src: &Path, sha: &str, bytes: &[u8]) -> PathBuf {
        let rel = PathBuf::from(format!("models--a--b/blobs/{sha}"));
        fs::create_dir_all(src.join("models--a--b/blobs")).expect("mkdir");
        fs::write(src.join(&rel), bytes).expect("write");
        rel
    }

    /// The identities the journal of the store in `cache` records for source file
    /// `rel`, in order: a committed copy's has an inode, an uncommitted one's not.
    pub(super) fn journaled(cache: &Path, rel: &Path) -> Vec<stagefs_store::index::CopyId> {
        let key = Key::for_source_path(rel);
        fs::read_to_string(cache.join("v1/index.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|line| match serde_json::from_str(line) {
                Ok(stagefs_store::index::Record::Put { key: k, entry }) if k == key.as_str() => {
                    Some(entry.copy)
                }
                _ => None,
            })
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_copy_that_reads_nothing_for_the_patience_is_given_up_and_commits_later() {
        let src = tempfile::tempdir().expect("tempdir");
        let cache = tempfile::tempdir().expect("tempdir");
        let data = vec![7u8; 1 << 20];
        fs::write(src.path().join("slow.bin"), &data).expect("write");
        let faulty = stagefs_source::faulty::FaultySource::new(src.path()).expect("source");
        let stager = Stager::new(
            SourceTree::from_backend(Arc::clone(&faulty) as Arc<dyn stagefs_source::Source>),
            Store::open(cache.path(), Budget::default()).expect("store"),
            Arc::default(),
            Handle::current(),
        );
        let rel = Path::new("slow.bin");
        let version = Stamp::of(&stager.source().stat(rel).expect("stat"));
        // Each read of the file's bytes waits 1.5 s: nothing is read within 0.3 s.
        faulty.set(stagefs_source::faulty::Behaviour::SlowReads(
            Duration::from_millis(1500),
        ));
        let given_up = stager
            .stage_version_within(rel, version, Duration::from_millis(300))
            .await;
        assert!(
            matches!(&given_up, Err(StageError::Stalled { path, .. }) if path == rel),
            "{given_up:?}"
        );
        assert!(!stager.has_copy(rel), "nothing committed yet");
        // The copy went on, detached, and commits the whole file once it ends.
        faulty.set(stagefs_source::faulty::Behaviour::Healthy);
        stager.settled(rel).await.expect("the detached copy");
        let staged = stager.stage_version(rel, version).await.expect("staged");
        assert!(!staged.copied, "served from the copy that went on");
        assert_eq!(contents(&staged), data);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_lfs_blob_from_a_network_source_is_refused_before_serving_unless_it_matches_its_name()
     {
        let src = tempfile::tempdir().expect("tempdir");
        let cache = tempfile::tempdir().expect("tempdir");
        let rel = write_empty_named_blob(src.path(), b"not empty");
        // Not presented as a local disk: a network filesystem's attribute cache can
        // hide a change, so only the name vouches for the bytes.
        let faulty = stagefs_source::faulty::FaultySource::new(src.path()).expect("source");
        let store = Store::open(cache.path(), Budget::default()).expect("store");
        let stager = Stager::new(
            SourceTree::from_backend(faulty),
            store,
            Arc::default(),
            Handle::current(),
        );
        assert!(matches!(
            stager.stage(&rel).await,
            Err(StageError::ContentMismatch { .. })
        ));
        assert!(stager.store().entries().is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_lfs_blob_from_a_local_disk_is_served_whole_then_dropped_and_refused_if_it_does_not_match_its_name()
     {
        let fx = fixture();
        let rel = write_empty_named_blob(fx.src.path(), b"not empty");
        // Served as the source holds it, the moment it is copied and the source
        // is seen unchanged, as any file from a local disk is.
        let served = fx.stager.stage(&rel).await.expect("served");
        assert_eq!(contents(&served), b"not empty");
        drop(served);
        // The check's verdict, which an eviction would wait for too.
        fx.stager.store().commit_now();
        assert!(fx.stager.store().entries().is_empty(), "dropped");
        assert!(matches!(
            fx.stager.stage(&rel).await,
            Err(StageError::ContentMismatch { .. })
        ));
        // Once the source file changes (repaired), it is staged and kept again.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        fs::write(fx.src.path().join(&rel), b"").expect("repair");
        let served = fx.stager.stage(&rel).await.expect("served");
        assert!(served.copied && contents(&served).is_empty());
        drop(served);
        fx.stager.store().commit_now();
        assert_eq!(fx.stager.store().entries().len(), 1, "kept");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_blob_checked_after_its_open_is_journaled_as_committed_only_once_it_matched() {
        let fx = fixture();
        let data: Vec<u8> = (0..(24u32 << 20)).map(|i| (i % 241) as u8).collect();
        let rel = write_named_blob(fx.src.path(), &data);
        let served = fx.stager.stage(&rel).await.expect("served");
        assert_eq!(contents(&served), data);
        fx.stager.store().commit_now();
        let journal = fs::read_to_string(fx.cache.path().join("v1/index.jsonl")).expect("journal");
        let identity = stagefs_store::index::CopyId::of(&served.file.metadata().expect("meta"));
        let last = journal.lines().last().expect("a line");
        let record: stagefs_store::index::Record = serde_json::from_str(last).expect("record");
        assert!(
            matches!(record, stagefs_store::index::Record::Put { ref entry, .. } if entry.copy == identity),
            "{last}"
        );
    }

    fn inner_for(source: SourceTree, cache: &Path, rt: &tokio::runtime::Runtime) -> Inner {
        Inner {
            answers: Arc::new(answers::Answers::in_memory()),
            source,
            pool: SourcePool::new(1, std::time::Duration::from_secs(10)),
            store: Store::open(cache, Budget::default()).expect("store"),
            metrics: Arc::default(),
            runtime: rt.handle().clone(),
            copy: CopyOptions::default(),
            settled_copy: std::sync::OnceLock::new(),
            inflight: Mutex::default(),
            urgent_copies: Arc::default(),
            refused: Arc::default(),
            reached_through: Mutex::default(),
            activity: Arc::default(),
            check_timing: CheckTiming::default(),
            failures: Mutex::default(),
        }
    }

    #[test]
    fn change_during_copy_is_detected() {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let src = tempfile::tempdir().expect("tempdir");
        let cache = tempfile::tempdir().expect("tempdir");
        fs::write(src.path().join("f"), b"0123456789").expect("write");
        let source = SourceTree::new(src.path()).expect("source");
        let inner = inner_for(source, cache.path(), &rt);
        let stale = Stamp {
            size: 10,
            mtime_ns: 1,
            ..Stamp::default()
        };
        assert!(matches!(
            inner.copy(
                Path::new("f"),
                stale,
                inner.copy_plan(),
                &Progress::default(),
                true
            ),
            Err(StageError::SourceChanged { .. })
        ));
        assert_eq!(
            fs::read_dir(cache.path().join("v1/tmp"))
                .expect("ls")
                .count(),
            0
        );
    }

    fn copy_and_commit(inner: &Inner, rel: &str) -> StageResult {
        let rel = Path::new(rel);
        let key = Key::for_source_path(rel);
        inner.copy_and_commit(rel, &key, &Progress::default(), Purpose::Open)
    }

    #[test]
    fn a_blobs_check_waits_while_copies_run_unless_its_commit_is_awaited() {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let (src, cache) = (
            tempfile::tempdir().expect("src"),
            tempfile::tempdir().expect("cache"),
        );
        let corrupt = write_empty_named_blob(src.path(), b"not empty");
        let corrupt = corrupt.to_str().expect("utf-8");
        let mut inner = inner_for(
            SourceTree::new(src.path()).expect("source"),
            cache.path(),
            &rt,
        );
        // Only the quiet moment or someone waiting may start it here.
        inner.check_timing.waits_max = Duration::from_secs(3600);
        inner.check_timing.after_quiet = Duration::from_millis(200);
        let inner = Arc::new(inner);

        // While another copy runs, nobody waiting: no verdict, however long.
        let running = inner.activity.begin();
        drop(copy_and_commit(&inner, corrupt).expect("served"));
        std::thread::sleep(Duration::from_secs(1));
        assert_eq!(
            inner.store.entries().len(),
            1,
            "not checked while a copy runs"
        );
        // An unmount or an eviction waiting for commits starts it at once.
        let (done, finished) = std::sync::mpsc::channel();
        let waiter = Arc::clone(&inner);
        std::thread::spawn(move || {
            waiter.store.commit_now();
            let _ = done.send(());
        });
        finished
            .recv_timeout(Duration::from_secs(60))
            .expect("the awaited check ran while a copy was still running");
        assert!(
            inner.store.entries().is_empty(),
            "dropped: not its name's bytes"
        );

        // Once no copy has run for a moment, it runs on its own.
        let good = write_named_blob(src.path(), &vec![5u8; 3 << 20]);
        drop(copy_and_commit(&inner, good.to_str().expect("utf-8")).expect("served"));
        let committed = || journaled(cache.path(), &good).iter().any(|c| c.ino != 0);
        std::thread::sleep(Duration::from_millis(600));
        assert!(
            !committed(),
            "not checked, so not committed, while a copy runs"
        );
        drop(running);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !committed() {
            assert!(
                Instant::now() < deadline,
                "checked and committed once quiet"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn an_open_is_served_the_whole_verified_copy_once_it_is_committed() {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let src = tempfile::tempdir().expect("tempdir");
        let cache = tempfile::tempdir().expect("tempdir");
        let data: Vec<u8> = (0..5_000_000u32).map(|i| (i % 253) as u8).collect();
        fs::write(src.path().join("w.bin"), &data).expect("write");
        let source = SourceTree::new(src.path()).expect("source");
        let stamp = Stamp::of(&source.stat(Path::new("w.bin")).expect("stat"));
        let inner = inner_for(source, cache.path(), &rt);
        let key = Key::for_source_path(Path::new("w.bin"));
        let served = copy_and_commit(&inner, "w.bin").expect("stage");
        // Already in the index: status lists it and eviction can see it.
        assert!(inner.store.contains(&key));
        assert_eq!(
            inner.store.redirect(&key, |_| true, Handout::Peek),
            Some(served.path.clone())
        );
        assert!(served.copied);
        assert_eq!(served.stamp, stamp);
        assert_eq!(contents(&served), data, "the served copy is whole");
        assert_eq!(fs::read(&served.path).expect("copy"), data);
    }

    #[test]
    fn a_source_change_during_the_copy_is_refused_before_anything_is_served() {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let src = tempfile::tempdir().expect("tempdir");
        let cache = tempfile::tempdir().expect("tempdir");
        fs::write(src.path().join("w.bin"), vec![1u8; 4 << 20]).expect("write");
        let faulty = stagefs_source::faulty::FaultySource::new(src.path()).expect("source");
        faulty.rewrite_after("w.bin", 1 << 20, vec![2u8; 5 << 20]);
        let inner = inner_for(SourceTree::from_backend(faulty), cache.path(), &rt);
        let result = copy_and_commit(&inner, "w.bin");
        assert!(
            matches!(result, Err(StageError::SourceChanged { .. })),
            "{result:?}"
        );
        assert!(inner.store.entries().is_empty());
    }

    /// Stages `rel` as a prefetch on another thread; its result arrives on the channel.
    fn prefetch_in_background(
        inner: &Arc<Inner>,
        rel: &'static str,
    ) -> std::sync::mpsc::Receiver<StageResult> {
        let (tx, rx) = std::sync::mpsc::channel();
        let inner = Arc::clone(inner);
        std::thread::spawn(move || {
            let (path, key) = (Path::new(rel), Key::for_source_path(Path::new(rel)));
            let _ =
                tx.send(inner.copy_and_commit(path, &key, &Progress::default(), Purpose::Prefetch));
        });
        rx
    }

    #[test]
    fn a_prefetch_from_a_network_source_waits_for_opens_and_one_from_a_local_disk_does_not() {
        use std::sync::mpsc::RecvTimeoutError;
        use std::time::Duration;
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let src = tempfile::tempdir().expect("tempdir");
        fs::write(src.path().join("w.bin"), vec![3u8; 1 << 20]).expect("write");
        for local in [false, true] {
            let cache = tempfile::tempdir().expect("tempdir");
            let faulty = stagefs_source::faulty::FaultySource::new(src.path()).expect("source");
            if local {
                faulty.present_as_local_disk();
            }
            let inner = Arc::new(inner_for(
                SourceTree::from_backend(faulty),
                cache.path(),
                &rt,
            ));
            // An open is waiting for a copy of another file.
            let open_waiting = UrgentGuard::new(&inner.urgent_copies);
            let prefetched = prefetch_in_background(&inner, "w.bin");
            if local {
                let result = prefetched.recv_timeout(Duration::from_secs(60));
                assert!(result.expect("finished").expect("staged").copied);
                continue;
            }
            // Still waiting a while later (a wrong rule would have copied 1 MiB by then).
            let early = prefetched.recv_timeout(Duration::from_millis(300));
            assert_eq!(early.err(), Some(RecvTimeoutError::Timeout));
            drop(open_waiting);
            let result = prefetched.recv_timeout(Duration::from_secs(60));
            assert!(result.expect("finished").expect("staged").copied);
        }
    }

    #[test]
    fn a_prefetch_copies_as_many_files_at_once_as_configured_or_as_suit_the_source() {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let src = tempfile::tempdir().expect("tempdir");
        let stager_over = |local: bool| {
            let cache = tempfile::tempdir().expect("tempdir");
            let faulty = stagefs_source::faulty::FaultySource::new(src.path()).expect("source");
            if local {
                faulty.present_as_local_disk();
            }
            let store = Store::open(cache.path(), Budget::default()).expect("store");
            let source = SourceTree::from_backend(faulty);
            (
                Stager::new(source, store, Arc::default(), rt.handle().clone()),
                cache,
            )
        };
        let (network, _cache) = stager_over(false);
        assert_eq!(network.prefetch_width(None), defaults::PREFETCH_PARALLEL);
        assert_eq!(network.prefetch_width(Some(3)), 3);
        assert_eq!(network.prefetch_width(Some(0)), 1);
        let (local, _cache) = stager_over(true);
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let expected = cores.min(defaults::LOCAL_PREFETCH_PARALLEL_MAX);
        assert_eq!(local.prefetch_width(None), expected);
        assert_eq!(defaults::prefetch_parallel(false), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn opens_share_one_copy_and_a_prefetch_right_after_neither_copies_again_nor_returns_before_the_commit()
     {
        let fx = fixture();
        let data = vec![5u8; 6 << 20];
        fs::write(fx.src.path().join("w.bin"), &data).expect("write");
        let rel = Path::new("w.bin");
        let (first, second) = tokio::join!(fx.stager.stage(rel), fx.stager.stage(rel));
        assert_eq!(contents(&first.expect("stage")), data);
        assert_eq!(contents(&second.expect("stage")), data);
        // A prefetch returns only once the copy is in the store.
        fx.stager.prefetch(rel).await.expect("prefetch");
        assert!(fx.stager.store().contains(&Key::for_source_path(rel)));
        let m = fx.stager.metrics().snapshot();
        assert_eq!(m.stage_copies, 1, "{m:?}");
        fx.stager.settled(rel).await.expect("settled");
        assert!(fx.stager.in_flight().is_empty());
    }
}
