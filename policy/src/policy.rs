//! What the filesystem answers, apart from the kernel: lookups, attributes, links,
//! listings, opens and reads, and how each behaves while the source is slow or gone.
//! The FUSE adapter (`stagefs-fuse`) and the NFS adapter (`stagefs-nfs`) only turn
//! their protocol's requests into these and the results into replies, so every rule
//! here holds for both and is tested once, without a kernel (the tests at the
//! bottom), through a fault-injecting source.
//!
//! Rules while the source does not answer, or answers that it is away (a dead FUSE
//! mount's ENOTCONN, a lost server's EIO, ESTALE or network errnos, a root that is
//! no longer the directory mounted: [`SourceError::is_away`]); the two are one case:
//! - every source operation runs on the stager's [`SourcePool`]: at most its threads
//!   are ever stuck, and nothing local waits behind them;
//! - a request that can be answered from what the source said last (attributes, link
//!   targets, listings, stored copies of exactly the version looked up) is answered
//!   from memory once the source is known to be unresponsive, or as soon as any source
//!   operation is overdue ([`SUSPECT_AFTER`]), instead of waiting out the timeout;
//! - a blob named by its sha256 is its content: a stored copy is served without
//!   asking the source anything, up or not;
//! - what was never seen fails with EIO within the source timeout, or within
//!   [`KNOWN_AWAY_WAIT`](stagefs_source::KNOWN_AWAY_WAIT) once the source is known to
//!   be away; when every source thread is already stuck, a lookup fails at once
//!   (the kernel serializes lookups of one name, so waiting would multiply), and an
//!   open waits, without a thread, for one to come free, so a program retrying
//!   opens in a loop does not spin;
//! - nothing marks the source back but a probe of it (its statfs, which network
//!   clients cannot answer from a cache), and a request never skips the source just
//!   because it was marked down: a source that came back serves the next request
//!   (only a change waits the whole timeout, which may land late: it must not be
//!   told it failed and then happen).

use std::ffi::OsStr;
use std::fs::File;
use std::future::Future;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use stagefs_source::copy::read_at_most;
use stagefs_source::{SUSPECT_AFTER, SourceError, SourceMeta, SourcePool, Stamp, Unanswered, sys};
use stagefs_stage::prefetch::Prefetcher;
use stagefs_stage::{Handout, InFlight, Metrics, Pin, StageError, Staged, Stager, StoreError};
use tokio::runtime::Handle;
use tracing::{debug, info, warn};

use crate::attr::{Attr, attr_of, link_attr};
use crate::error::FsError;
use crate::finder;
use crate::handles::{DirEntry, Handles, Keepalive, OpenFile, Reader};
use crate::inodes::{Inodes, Node, ROOT_INO};
use crate::redirect::{Presented, RedirectPolicy};
use crate::taint::Taints;
use crate::tee;
use crate::{FsConfig, OnFull};

mod write;

pub use write::{Caller, RenameHow, SetAttr};

/// How often a request waiting for a stuck source pool looks for a free thread.
const SATURATED_RETRY: Duration = Duration::from_millis(250);

/// The filesystem's state and decisions.
#[derive(Debug)]
pub struct Policy {
    stager: Stager,
    config: FsConfig,
    runtime: Handle,
    inodes: Inodes,
    files: Handles<OpenFile>,
    dirs: Handles<Listing>,
    /// Set by an adapter whose kernel currently reads staged copies itself (FUSE
    /// passthrough): files then stay regular files, never links.
    kernel_passthrough: Arc<AtomicBool>,
    redirect: RedirectPolicy,
    prefetcher: Option<Arc<Prefetcher>>,
    /// Paths changed through the mount, whose stored copies must not be trusted
    /// until they are removed (`taint.rs`).
    taints: Arc<Taints>,
    /// Staging as written: the copies writers fill.
    tees: tee::Tees,
}

/// A directory listing held open by a handle.
#[derive(Debug)]
pub struct Listing {
    /// The directory listed.
    pub dir: u64,
    /// The directory holding it.
    pub parent: u64,
    /// Its entries, without "." and "..".
    pub entries: Vec<DirEntry>,
}

/// An open file ready to be handed to the kernel.
#[derive(Debug)]
pub struct Opened {
    pub(crate) reader: Reader,
    /// The version opened.
    pub stamp: Stamp,
    /// Present for staged copies, absent for files read from the source.
    pub(crate) pin: Option<Arc<Pin>>,
}

/// What an open through the source came to.
enum Attempt<T> {
    /// The source answered (the open may still have failed).
    Answered(Result<T, FsError>),
    /// The source timed out, or the copy stopped making progress.
    Unanswered,
}

/// What an open was served from.
enum Served<T> {
    /// The source, now.
    Fresh(T),
    /// A stored copy, the source being suspect.
    Stored(Staged),
}

impl Opened {
    fn staged(staged: Staged) -> Opened {
        Opened {
            reader: Reader::Copy(staged.file),
            stamp: staged.stamp,
            pin: Some(staged.pin),
        }
    }
}

impl Policy {
    /// The policy of a mount of `stager`'s source, doing its work on `runtime`.
    pub fn new(stager: Stager, config: FsConfig, runtime: Handle) -> Self {
        Self::with_inodes(stager, config, runtime, Inodes::new())
    }

    /// Like [`Policy::new`], with inode numbers that last across restarts of the
    /// server, kept in `journal` (NFS clients keep file handles across restarts).
    pub fn with_inode_journal(
        stager: Stager,
        config: FsConfig,
        runtime: Handle,
        journal: &Path,
    ) -> io::Result<Self> {
        Ok(Self::with_inodes(
            stager,
            config,
            runtime,
            Inodes::with_journal(journal)?,
        ))
    }

    fn with_inodes(stager: Stager, config: FsConfig, runtime: Handle, inodes: Inodes) -> Self {
        let prefetcher = config.prefetch.then(|| {
            Prefetcher::new(
                stager.clone(),
                config.prefetch_parallel,
                config.min_stage_size,
            )
        });
        let taints = Arc::new(Taints::default());
        let tees = tee::Tees::new(
            stager.clone(),
            Arc::clone(&taints),
            runtime.clone(),
            config.min_stage_size,
        );
        Policy {
            prefetcher,
            redirect: RedirectPolicy::new(&config),
            stager,
            config,
            runtime,
            inodes,
            files: Handles::new(),
            dirs: Handles::new(),
            kernel_passthrough: Arc::default(),
            tees,
            taints,
        }
    }

    /// The mount's configuration.
    pub fn config(&self) -> &FsConfig {
        &self.config
    }

    /// The flag an adapter sets while its kernel reads staged copies itself.
    pub fn kernel_passthrough(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.kernel_passthrough)
    }

    /// Whether staged files may be presented as links to their copies on this mount.
    pub fn redirects_enabled(&self) -> bool {
        self.redirect.enabled()
    }

    /// Whether inode `ino` follows its file from version to version (it was written
    /// through the mount), so a kernel must not keep its cached pages across opens.
    pub fn follows_its_file(&self, ino: u64) -> bool {
        self.inodes.is_live(ino)
    }

    /// The generation of this mount's inode numbers (0 unless they are journaled).
    pub fn inode_generation(&self) -> u64 {
        self.inodes.generation()
    }

    fn pool(&self) -> &SourcePool {
        self.stager.source_pool()
    }

    fn node(&self, ino: u64) -> Result<Node, FsError> {
        self.inodes.get(ino).ok_or(FsError::UnknownInode(ino))
    }

    fn timeout_error(&self, path: &Path) -> FsError {
        FsError::SourceTimeout {
            path: path.to_path_buf(),
            secs: self.config.source_timeout.as_secs(),
        }
    }

    // ------------------------------------------------------------ the source's health

    fn source_timed_out(&self) {
        if self.pool().mark_unresponsive() {
            warn!(
                source = %self.stager.source().root().display(),
                "the source did not respond; answering from what it said last where possible"
            );
        }
    }

    /// The source failed in a way that says it is away (a dead or vanished mount, a
    /// lost server): from now on, like one that stopped answering.
    fn source_away(&self, why: &FsError) {
        if self.pool().mark_unresponsive() {
            warn!(
                source = %self.stager.source().root().display(),
                error = %why,
                "the source is not reachable; answering from what it said last where possible"
            );
        }
    }

    /// Whether a request that can be answered from memory should be, now.
    fn source_suspect(&self) -> bool {
        self.pool().suspect()
    }

    /// Finds out in the background, one probe at a time, whether the source is back.
    /// It asks for the source's statfs: sshfs, NFS and SMB clients answer stats and
    /// lookups from their own caches while the server is gone, but send statfs to it,
    /// so a cached answer cannot make a dead source look alive.
    fn probe(self: &Arc<Self>) {
        let Some(probing) = self.pool().start_probe() else {
            return;
        };
        let source = self.stager.source().clone();
        let asked = self.pool().run(move || source.statfs());
        let this = Arc::clone(self);
        self.runtime.spawn(async move {
            if matches!(asked.await, Ok(Ok(_))) && this.pool().mark_answered() {
                info!(source = %this.stager.source().root().display(), "the source responds again");
            }
            drop(probing);
        });
    }

    /// Runs `work` on the source pool. `recall` answers from memory: at once while the
    /// source is suspect, after [`SUSPECT_AFTER`] if the source has not answered by
    /// then (the work goes on, so a late answer still updates memory), and when the
    /// work times out. With nothing to recall, the request waits up to the timeout,
    /// or fails at once when every source thread is stuck: the kernel serializes
    /// lookups of one name, so a lookup that waited would make each of N programs
    /// asking for the same missing directory wait a timeout more than the one before.
    async fn ask<T: Send + 'static>(
        self: &Arc<Self>,
        what: &Path,
        work: impl FnOnce(&Policy) -> Result<T, FsError> + Send + 'static,
        recall: impl Fn(&Policy) -> Option<T>,
    ) -> Result<T, FsError> {
        if self.source_suspect()
            && let Some(known) = recall(self)
        {
            self.probe_if_down();
            return Ok(known);
        }
        let worker = Arc::clone(self);
        let patience = self.pool().patience();
        let mut asked = Box::pin(self.pool().run_for(patience, move || work(&worker)));
        let early = tokio::time::sleep(SUSPECT_AFTER);
        tokio::pin!(early);
        let answer = tokio::select! {
            answer = &mut asked => answer,
            () = &mut early => match recall(self) {
                Some(known) => {
                    self.listen_for_late_answer(asked);
                    return Ok(known);
                }
                None => asked.await,
            },
        };
        match answer {
            Ok(Err(e)) if e.is_source_away() => {
                debug!(path = %what.display(), error = %e, "the source is away");
                self.source_away(&e);
                self.probe();
                recall(self).ok_or(e)
            }
            Ok(result) => {
                // A network client may have answered from its own cache: only the
                // probe can tell that the source itself is back.
                self.probe_if_down();
                result
            }
            Err(why) => {
                debug!(path = %what.display(), %why, "no answer from the source");
                self.source_timed_out();
                recall(self).ok_or_else(|| self.timeout_error(what))
            }
        }
    }

    /// Every source thread is stuck and an open has no stored copy to fall back on.
    /// Failing at once would let a program that retries in a loop spin, and a few
    /// hundred of them starve the machine, staged reads included (measured:
    /// bench/outage.sh). So the open waits, without a thread, until a source thread
    /// comes free or `deadline` passes; true if it may try again. (Opens of one file
    /// are not serialized by the kernel, as lookups of one name are.)
    async fn wait_for_a_thread(self: &Arc<Self>, deadline: tokio::time::Instant) -> bool {
        self.source_timed_out();
        while tokio::time::Instant::now() < deadline {
            self.probe_if_down();
            tokio::time::sleep(SATURATED_RETRY.min(deadline - tokio::time::Instant::now())).await;
            if !self.pool().saturated() {
                return true;
            }
        }
        false
    }

    fn probe_if_down(self: &Arc<Self>) {
        if self.pool().is_unresponsive() {
            self.probe();
        }
    }

    /// Waits in the background for an answer already given from memory, so that a
    /// source that never answers is marked unresponsive.
    fn listen_for_late_answer<T: Send + 'static>(
        self: &Arc<Self>,
        asked: impl std::future::Future<Output = Result<T, Unanswered>> + Send + 'static,
    ) {
        let this = Arc::clone(self);
        self.runtime.spawn(async move {
            if asked.await.is_err() {
                this.source_timed_out();
            }
        });
    }

    // ------------------------------------------------------------ names and attributes

    /// The attributes of `name` in directory `parent`. Stages nothing.
    pub async fn lookup(self: &Arc<Self>, parent: u64, name: &OsStr) -> Result<Attr, FsError> {
        if self.config.hide_finder_files && finder::is_finder_file(name) {
            return Err(FsError::Source(SourceError::NotFound {
                path: self.node(parent)?.path.join(name),
            }));
        }
        let path = self.node(parent)?.path.join(name);
        let known_path = path.clone();
        let work_path = path.clone();
        self.ask(
            &path,
            move |p| {
                let meta = p.stager.source().stat(&work_path)?;
                let attr = p.entry_attr(&work_path, &meta);
                p.inodes.remember_attr(attr);
                Ok(attr)
            },
            move |p| p.inodes.known_attr_of_path(&known_path),
        )
        .await
    }

    /// The inode and attributes `path` is presented with: a staged file as a link to
    /// its copy where redirects are on, anything else as the source has it.
    fn entry_attr(&self, path: &Path, meta: &SourceMeta) -> Attr {
        if meta.is_file() {
            let version = Stamp::of(meta);
            if let Presented::Link(copy) = self.presented(path, version) {
                let ino = self.inodes.intern_redirect(path, version);
                return link_attr(ino, meta, version, &copy);
            }
        }
        let ino = self.inodes.intern(path, meta);
        attr_of(ino, meta, meta.is_file().then(|| Stamp::of(meta)))
    }

    /// How version `version` of file `path` is presented; asks the store, not the source.
    fn presented(&self, path: &Path, version: Stamp) -> Presented {
        if !self.copy_trusted_blocking(path) {
            return Presented::File;
        }
        let passthrough = self.kernel_passthrough.load(Ordering::Relaxed);
        self.redirect.present(version, passthrough, || {
            self.stager.copy_path(path, version, Handout::Present)
        })
    }

    /// The attributes of `ino`, from memory if the source gave them less than `age`
    /// ago (an NFS client asks before every read; the kernel's FUSE client caches).
    pub async fn getattr_within(
        self: &Arc<Self>,
        ino: u64,
        age: Duration,
    ) -> Result<Attr, FsError> {
        match self.inodes.recent_attr(ino, age) {
            Some(attr) => Ok(attr),
            None => self.getattr(ino).await,
        }
    }

    /// The attributes of `ino` as the source has them now (a file inode keeps its
    /// version's size and mtime). Stages nothing.
    pub async fn getattr(self: &Arc<Self>, ino: u64) -> Result<Attr, FsError> {
        let node = self.node(ino)?;
        // A redirect stands for one version; what it is does not depend on the source.
        if node.redirect
            && let Some(attr) = self.inodes.known_attr(ino)
        {
            return Ok(attr);
        }
        // Removed or replaced through the mount: only open handles lead to it.
        if self.inodes.is_gone(ino) {
            let attr = self.inodes.known_attr(ino).ok_or(FsError::Stale)?;
            return Ok(Attr { nlink: 0, ..attr });
        }
        let path = node.path.clone();
        self.ask(
            &path,
            move |p| {
                let meta = p.stager.source().stat(&node.path)?;
                // A file written through the mount follows its file.
                let attr = if p.inodes.is_live(ino) && meta.is_file() {
                    p.inodes.restamp(ino, Stamp::of(&meta));
                    attr_of(ino, &meta, None)
                } else {
                    attr_of(ino, &meta, node.stamp)
                };
                p.inodes.remember_attr(attr);
                Ok(attr)
            },
            move |p| p.inodes.known_attr(ino),
        )
        .await
    }

    /// The target of link `ino`: the source's verbatim, or a redirect's copy.
    pub async fn readlink(self: &Arc<Self>, ino: u64) -> Result<Vec<u8>, FsError> {
        let node = self.node(ino)?;
        if node.redirect {
            // Needs only the store, never the source: answered even while it is away.
            let this = Arc::clone(self);
            let target = self
                .runtime
                .spawn_blocking(move || this.redirect_target(&node))
                .await
                .map_err(|e| FsError::Read(io::Error::other(e)))?;
            // None: evicted or changed since the link was handed out; on ESTALE the
            // kernel looks the path up again and finds the file to stage.
            return target.ok_or(FsError::Stale);
        }
        let path = node.path.clone();
        let target = self
            .ask(
                &path,
                move |p| {
                    let target = p.stager.source().read_link(&node.path)?;
                    let target = target.as_os_str().as_bytes().to_vec();
                    p.inodes.remember_link(ino, &target);
                    Ok(target)
                },
                move |p| p.inodes.known_link(ino),
            )
            .await?;
        // The kernel follows it next: a copy of the blob it leads to is then named by
        // this link (the snapshot's file name) even while the source is too slow to ask.
        let followed = Path::new(OsStr::from_bytes(&target));
        self.stager.learn_link(&path, followed);
        Ok(target)
    }

    /// The target of redirect `node`, marking its copy in use; None if the copy is
    /// gone or changed since the link was handed out.
    fn redirect_target(&self, node: &Node) -> Option<Vec<u8>> {
        let version = node.stamp?;
        if !self.copy_trusted_blocking(&node.path) {
            return None;
        }
        let copy = self
            .stager
            .copy_path(&node.path, version, Handout::Resolve)?;
        Metrics::bump(&self.stager.metrics().redirects);
        Some(copy.into_os_string().into_vec())
    }

    // ------------------------------------------------------------ directories

    /// Lists directory `ino` and returns a handle to the listing.
    pub async fn opendir(self: &Arc<Self>, ino: u64) -> Result<u64, FsError> {
        let entries = self.list(ino).await?;
        let parent = self.parent_of(ino)?;
        Ok(self.dirs.insert(Listing {
            dir: ino,
            parent,
            entries,
        }))
    }

    /// The inode of the directory holding `ino` (the root's is the root).
    pub fn parent_of(&self, ino: u64) -> Result<u64, FsError> {
        let node = self.node(ino)?;
        Ok(node
            .path
            .parent()
            .and_then(|p| self.inodes.dir_ino(p))
            .unwrap_or(ROOT_INO))
    }

    /// The entries of directory `ino` ("." and ".." are the adapter's to add), with
    /// their attributes. Stages nothing.
    pub async fn list(self: &Arc<Self>, ino: u64) -> Result<Vec<DirEntry>, FsError> {
        let node = self.node(ino)?;
        if node.stamp.is_some() {
            return Err(FsError::NotADirectory);
        }
        let path = node.path.clone();
        self.ask(
            &path,
            move |p| p.list_dir(ino, &node),
            move |p| p.inodes.known_listing(ino),
        )
        .await
    }

    fn list_dir(&self, ino: u64, node: &Node) -> Result<Vec<DirEntry>, FsError> {
        let mut entries = Vec::new();
        for (name, meta) in self.stager.source().read_dir(&node.path)? {
            if self.config.hide_finder_files && finder::is_finder_file(&name) {
                continue;
            }
            let attr = self.entry_attr(&node.path.join(&name), &meta);
            // A later lookup or getattr (or one while the source is away) may be
            // answered from what the listing said.
            self.inodes.remember_attr(attr);
            entries.push(DirEntry { attr, name });
        }
        self.inodes.remember_listing(ino, &entries);
        Ok(entries)
    }

    /// The listing behind handle `fh`.
    pub fn listing(&self, fh: u64) -> Result<Arc<Listing>, FsError> {
        self.dirs.get(fh).ok_or(FsError::UnknownHandle(fh))
    }

    /// Forgets listing handle `fh`.
    pub fn releasedir(&self, fh: u64) {
        self.dirs.remove(fh);
    }

    /// The source's filesystem statistics.
    pub async fn statfs(self: &Arc<Self>) -> Result<libc::statvfs, FsError> {
        let root = self.stager.source().root().to_path_buf();
        self.ask(
            &root,
            |p| p.stager.source().statfs().map_err(FsError::Read),
            |_| None,
        )
        .await
    }

    // ------------------------------------------------------------ files

    /// Opens `ino` for reading: small files straight from the source, large ones from
    /// a complete staged copy (waiting for the copy if there is none yet). Opening any
    /// file of a snapshot starts a prefetch of its other weight files.
    pub async fn open(self: &Arc<Self>, ino: u64) -> Result<Opened, FsError> {
        let node = self.node(ino)?;
        if let Some(prefetcher) = &self.prefetcher {
            prefetcher.on_open(&node.path, &self.runtime);
        }
        let version = node.stamp.ok_or(FsError::IsADirectory)?;
        if version.size >= self.config.min_stage_size {
            // A copy of it written through the mount is being verified (a download
            // just finished): its outcome decides whether the copy below is that one.
            self.stager.written_settled(&node.path).await;
        }
        let opened = if version.size < self.config.min_stage_size {
            self.open_small(&node, version).await?
        } else if !self.copy_trusted(&node.path).await {
            // Being written through the mount, or its copy still held by a reader of
            // the version before: the source has the only right bytes.
            self.open_source(&node.path).await?
        } else {
            match self.stage_or_recall(&node, version).await {
                Ok(staged) => Opened::staged(staged),
                Err(FsError::Stage(e @ StageError::Store(StoreError::NoRoom { .. })))
                    if self.config.on_full == OnFull::ReadSource =>
                {
                    warn!(
                        error = %e,
                        "serving the file from the source, as configured for a full cache"
                    );
                    self.open_source(&node.path).await?
                }
                Err(e) => return Err(e),
            }
        };
        // The inode promised `version`; a newer one must come through a fresh lookup,
        // unless the inode follows a file written through the mount.
        if opened.stamp != version {
            if !self.inodes.is_live(ino) {
                return Err(FsError::Stale);
            }
            self.inodes.restamp(ino, opened.stamp);
        }
        Ok(opened)
    }

    /// Stages `node`, or serves a stored copy of exactly this version while the source
    /// is suspect (the source may be gone; the model is still here). Without one, the
    /// open fails with EIO once the source times out or the copy makes no progress
    /// for the timeout.
    async fn stage_or_recall(
        self: &Arc<Self>,
        node: &Node,
        version: Stamp,
    ) -> Result<Staged, FsError> {
        let attempt = async {
            let patience = self.pool().patience();
            let deadline = tokio::time::Instant::now() + patience;
            loop {
                let staged = self
                    .stager
                    .stage_version_within(&node.path, version, patience)
                    .await;
                let outcome = match staged {
                    // Every source thread is stuck: wait for one, then try again.
                    Err(StageError::Source(SourceError::Unanswered {
                        why: Unanswered::Saturated,
                        ..
                    })) => None,
                    Err(
                        StageError::Source(SourceError::Unanswered { .. })
                        | StageError::Stalled { .. },
                    ) => Some(Attempt::Unanswered),
                    staged => Some(Attempt::Answered(staged.map_err(FsError::from))),
                };
                match outcome {
                    Some(attempt) => break attempt,
                    None if self.wait_for_a_thread(deadline).await => {}
                    None => break Attempt::Unanswered,
                }
            }
        };
        Ok(
            match self.attempt_or_stored(node, version, attempt).await? {
                Served::Fresh(staged) | Served::Stored(staged) => staged,
            },
        )
    }

    /// Small files (configs, tokenizers, refs) are read from the source, so they are
    /// never staler than it. A copy is kept in the background and served while the
    /// source is suspect, so a staged model still loads with the NAS away.
    async fn open_small(self: &Arc<Self>, node: &Node, version: Stamp) -> Result<Opened, FsError> {
        let attempt = async {
            let deadline = tokio::time::Instant::now() + self.pool().patience();
            // Every source thread stuck: wait for one rather than fail at once.
            while self.pool().saturated() {
                if !self.wait_for_a_thread(deadline).await {
                    return Attempt::Unanswered;
                }
            }
            match self.open_source(&node.path).await {
                Err(FsError::SourceTimeout { .. }) => Attempt::Unanswered,
                opened => Attempt::Answered(opened),
            }
        };
        let served = self.attempt_or_stored(node, version, attempt).await?;
        self.probe_if_down();
        Ok(match served {
            Served::Fresh(opened) => {
                self.keep_copy(&node.path, opened.stamp);
                opened
            }
            Served::Stored(staged) => Opened::staged(staged),
        })
    }

    /// The outage rule for opens: a stored copy of exactly `version` of `node` is
    /// served instead of `attempt` (an open through the source) if the source is
    /// suspect before it, once it becomes suspect during it, or when the attempt gets
    /// no answer; without such a copy, the attempt's own outcome, or EIO.
    async fn attempt_or_stored<T>(
        self: &Arc<Self>,
        node: &Node,
        version: Stamp,
        attempt: impl Future<Output = Attempt<T>>,
    ) -> Result<Served<T>, FsError> {
        if self.source_suspect()
            && let Some(staged) = self.recall_stored(node, version).await
        {
            return Ok(Served::Stored(staged));
        }
        let suspect = self.pool().until_suspect();
        tokio::pin!(attempt, suspect);
        let mut recalled = false;
        let outcome = loop {
            tokio::select! {
                outcome = &mut attempt => break outcome,
                () = &mut suspect, if !recalled => {
                    recalled = true;
                    if let Some(staged) = self.recall_stored(node, version).await {
                        return Ok(Served::Stored(staged));
                    }
                }
            }
        };
        match outcome {
            Attempt::Answered(Err(e)) if e.is_source_away() => {
                self.source_away(&e);
                self.probe();
                let staged = self.recall_stored(node, version).await;
                staged.map(Served::Stored).ok_or(e)
            }
            Attempt::Answered(result) => result.map(Served::Fresh),
            Attempt::Unanswered => {
                self.source_timed_out();
                let staged = self.recall_stored(node, version).await;
                staged
                    .map(Served::Stored)
                    .ok_or_else(|| self.timeout_error(&node.path))
            }
        }
    }

    /// Stores a copy of small file `path` unless this version is already stored; like
    /// a prefetch, it never evicts anything and yields to opens.
    fn keep_copy(&self, path: &Path, version: Stamp) {
        let (stager, path) = (self.stager.clone(), path.to_path_buf());
        self.runtime.spawn(async move {
            if stager.stored_off_thread(&path, version).await.is_none()
                && let Err(e) = stager.keep(&path).await
            {
                debug!(path = %path.display(), error = %e, "keeping a copy of a small file failed");
            }
        });
    }

    /// A stored copy of exactly `version` of `node`, asking the source nothing.
    async fn recall_stored(self: &Arc<Self>, node: &Node, version: Stamp) -> Option<Staged> {
        if !self.copy_trusted(&node.path).await {
            return None;
        }
        let staged = self.stager.stored_off_thread(&node.path, version).await?;
        // Only ever called when the source is suspect or timed out.
        info!(path = %node.path.display(), "the source does not respond; serving the stored copy");
        Some(staged)
    }

    async fn open_source(&self, path: &Path) -> Result<Opened, FsError> {
        let (source, worker_path) = (self.stager.source().clone(), path.to_path_buf());
        let opened = self.pool().run_for(
            self.pool().patience(),
            move || -> Result<Opened, FsError> {
                let file = source.open(&worker_path)?;
                let meta = file.meta().map_err(FsError::Read)?;
                Ok(Opened {
                    stamp: Stamp::of(&meta),
                    reader: Reader::Source(Arc::from(file)),
                    pin: None,
                })
            },
        );
        opened.await.map_err(|_| self.timeout_error(path))?
    }

    /// Makes a handle for `opened`, counting which path serves its reads; `backing`
    /// is the adapter's passthrough state for it, kept while the handle is open.
    pub fn register(&self, opened: Opened, backing: Option<Keepalive>) -> u64 {
        let metrics = self.stager.metrics();
        let counter = match (&backing, opened.pin.is_some()) {
            (Some(_), _) => &metrics.passthrough_opens,
            (None, true) => &metrics.daemon_opens,
            (None, false) => &metrics.source_opens,
        };
        Metrics::bump(counter);
        self.files.insert(OpenFile {
            reader: opened.reader,
            _keep: backing,
            _pin: opened.pin,
            writer: None,
        })
    }

    /// Reads of a staged copy are local and run on the runtime's blocking pool;
    /// reads of a file open on the source run on the source pool, under its timeout.
    pub async fn read(
        self: &Arc<Self>,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> Result<Vec<u8>, FsError> {
        Metrics::bump(&self.stager.metrics().daemon_reads);
        let open = self.files.get(fh).ok_or(FsError::UnknownHandle(fh))?;
        let size = size as usize;
        match &open.reader {
            Reader::Copy(file) => {
                let file = Arc::clone(file);
                self.runtime
                    .spawn_blocking(move || sys::pread_new(file.as_ref(), offset, size))
                    .await
                    .map_err(|e| FsError::Read(io::Error::other(e)))?
                    .map_err(FsError::Read)
            }
            Reader::Source(file) => {
                let file = Arc::clone(file);
                let read = self
                    .pool()
                    .run(move || read_at_most(file.as_ref(), offset, size, |_| {}));
                match read.await {
                    Ok(Err(e)) if stagefs_source::is_away_errno(&e) => {
                        let e = FsError::Read(e);
                        self.source_away(&e);
                        self.probe();
                        Err(e)
                    }
                    Ok(read) => read.map_err(FsError::Read),
                    Err(_) => {
                        self.source_timed_out();
                        Err(FsError::SourceTimeout {
                            path: PathBuf::from("read"),
                            secs: self.config.source_timeout.as_secs(),
                        })
                    }
                }
            }
        }
    }

    /// How far the copy of `ino`'s file in progress has come, if one is: what an
    /// adapter that cannot wait for a copy (NFS answers JUKEBOX) plans its answers by.
    pub fn copy_progress(&self, ino: u64) -> Option<InFlight> {
        let node = self.node(ino).ok()?;
        self.stager.progress(&node.path)
    }

    /// The staged copy that handle `fh` reads from, for an adapter that hands the
    /// kernel a range of it rather than bytes (NFS replies by `sendfile`); `None`
    /// when the handle reads from the source, whose reads must go through
    /// [`Policy::read`] and its timeout. Counts as one read of the handle.
    pub fn staged_file(&self, fh: u64) -> Result<Option<Arc<File>>, FsError> {
        let open = self.files.get(fh).ok_or(FsError::UnknownHandle(fh))?;
        Metrics::bump(&self.stager.metrics().daemon_reads);
        Ok(match &open.reader {
            Reader::Copy(file) => Some(Arc::clone(file)),
            Reader::Source(_) => None,
        })
    }

    /// Closes handle `fh` off the request loop: unpinning a copy takes the store's
    /// lock, and closing a file open on a dead NAS may block.
    pub fn release(&self, fh: u64) {
        if let Some(open) = self.files.remove(fh) {
            if let Some(writer) = &open.writer {
                self.writer_released(writer);
            }
            self.runtime.spawn_blocking(move || drop(open));
        }
    }
}

/// The staged copy behind `opened`, which the kernel may read directly (a FUSE
/// passthrough backing file); None for a file read from the source.
pub fn backing_file(opened: &Opened) -> Option<&Arc<File>> {
    match (&opened.reader, &opened.pin) {
        (Reader::Copy(file), Some(_)) => Some(file),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    //! The rules above, driven through a fault-injecting source without a kernel.
    //! Deadlines in these tests are liveness bounds far above what the rule allows
    //! (an answer from memory within seconds where the source timeout is minutes),
    //! never measurements.

    use std::ffi::OsString;
    use std::fs;
    use std::time::Instant;

    use sha2::{Digest, Sha256};
    use stagefs_source::faulty::{Behaviour, FaultySource};
    use stagefs_source::{EntryKind, SourceTree};
    use stagefs_stage::StagerOptions;
    use stagefs_store::{Budget, Store};
    use tempfile::TempDir;

    use super::*;

    const MIB: usize = 1 << 20;
    /// Far longer than any rule may make a request wait.
    const PATIENT: Duration = Duration::from_secs(120);
    /// How long a test waits for what must happen at once.
    const PROMPTLY: Duration = Duration::from_secs(10);

    struct Fixture {
        _dirs: (TempDir, TempDir),
        src: PathBuf,
        source: Arc<FaultySource>,
        policy: Arc<Policy>,
        blob: PathBuf,
    }

    fn bytes(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    /// A source with a small file, a large path-keyed file and an HF blob, behind a
    /// fault-injecting source, with a policy over it.
    fn fixture(edit: impl FnOnce(&mut FsConfig, &mut StagerOptions, &mut Budget)) -> Fixture {
        let (src_dir, cache_dir) = (TempDir::new().expect("src"), TempDir::new().expect("cache"));
        let src = src_dir.path().to_path_buf();
        fs::write(src.join("config.json"), b"{\"small\": true}").expect("write");
        fs::write(src.join("weights.bin"), bytes(2 * MIB, 1)).expect("write");
        let blob_bytes = bytes(2 * MIB, 2);
        let sha = format!("{:x}", Sha256::digest(&blob_bytes));
        let blobs = src.join("models--acme--m/blobs");
        fs::create_dir_all(&blobs).expect("mkdir");
        fs::write(blobs.join(&sha), &blob_bytes).expect("write");
        let mut config = FsConfig {
            source_timeout: PATIENT,
            // The read path's tests are of a read-only mount, which presents links to
            // staged copies whoever runs them; `writable` fixtures are not.
            read_only: true,
            ..FsConfig::default()
        };
        let mut options = StagerOptions {
            source_timeout: PATIENT,
            source_threads: 4,
            ..StagerOptions::default()
        };
        let mut budget = Budget::default();
        edit(&mut config, &mut options, &mut budget);
        options.source_timeout = config.source_timeout;
        let source = FaultySource::new(&src).expect("source");
        let store = Store::open(cache_dir.path(), budget).expect("store");
        let runtime = Handle::current();
        let stager = Stager::with_options(
            SourceTree::from_backend(source.clone()),
            store,
            Arc::default(),
            runtime.clone(),
            options,
        );
        Fixture {
            _dirs: (src_dir, cache_dir),
            src,
            source,
            policy: Arc::new(Policy::new(stager, config, runtime)),
            blob: PathBuf::from("models--acme--m/blobs").join(sha),
        }
    }

    fn healthy() -> Fixture {
        fixture(|_, _, _| {})
    }

    impl Fixture {
        /// Looks `rel` up component by component, as the kernel does.
        async fn lookup(&self, rel: impl AsRef<Path>) -> Result<Attr, FsError> {
            let mut parent = ROOT_INO;
            let mut attr = None;
            for name in rel.as_ref().iter() {
                let found = self.policy.lookup(parent, name).await?;
                parent = found.ino;
                attr = Some(found);
            }
            attr.ok_or(FsError::NotADirectory)
        }

        /// Looks `rel` up within a deadline no rule may come near.
        async fn lookup_promptly(&self, rel: impl AsRef<Path>) -> Result<Attr, FsError> {
            tokio::time::timeout(PROMPTLY, self.lookup(rel))
                .await
                .expect("answered promptly, not after the source timeout")
        }

        async fn open(&self, rel: impl AsRef<Path>) -> Result<Opened, FsError> {
            let attr = self.lookup(rel).await?;
            self.policy.open(attr.ino).await
        }

        /// Opens `rel` and reads it whole through a handle, then waits for a copy the
        /// open started in the background (a small file's kept copy) to settle.
        async fn read_all(&self, rel: impl AsRef<Path>) -> Result<Vec<u8>, FsError> {
            let opened = self.open(rel.as_ref()).await?;
            let size = opened.stamp.size;
            let fh = self.policy.register(opened, None);
            let data = self.policy.read(fh, 0, size as u32).await;
            self.policy.release(fh);
            self.committed(rel).await;
            data
        }

        /// Waits until no copy of `rel` is being staged or committed.
        async fn committed(&self, rel: impl AsRef<Path>) {
            let settled = self.policy.stager.settled(rel.as_ref());
            let _ = tokio::time::timeout(PROMPTLY, settled)
                .await
                .expect("the copy settles promptly");
        }

        fn source_bytes(&self, rel: impl AsRef<Path>) -> Vec<u8> {
            fs::read(self.src.join(rel)).expect("source file")
        }

        fn metrics(&self) -> stagefs_stage::MetricsSnapshot {
            self.policy.stager.metrics().snapshot()
        }

        fn stored(&self, rel: impl AsRef<Path>) -> bool {
            self.policy.stager.has_copy(rel.as_ref())
        }

        /// Whether the copy a writer's close staged for `rel` is in the store and
        /// trusted: the tee records the copy first and clears the writer's taint
        /// after, and an open between the two would take the copy for a stale one.
        fn trusted_copy(&self, rel: impl AsRef<Path>) -> bool {
            let rel = rel.as_ref();
            self.stored(rel) && self.policy.taints.trust(rel, false) == crate::taint::Trust::Trusted
        }
    }

    /// Asks for `rel` until a probe has seen the source back: a probe starts only
    /// with a request, and one started while the source was still away may be the
    /// one in flight when the first request after its return arrives.
    async fn until_back(f: &Fixture, rel: &str) {
        let deadline = Instant::now() + PROMPTLY;
        while f.policy.pool().is_unresponsive() {
            assert!(Instant::now() < deadline, "timed out waiting for the probe");
            let _ = f.lookup(rel).await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn wait_until(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + PROMPTLY;
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn errno(result: Result<impl std::fmt::Debug, FsError>) -> i32 {
        result.expect_err("an error").errno()
    }

    // ------------------------------------------------------------ a healthy source

    #[tokio::test(flavor = "multi_thread")]
    async fn a_lookup_mirrors_the_source() {
        let f = healthy();
        let attr = f.lookup("weights.bin").await.expect("lookup");
        assert_eq!(attr.kind, EntryKind::File);
        assert_eq!(attr.size, 2 * MIB as u64);
        let dir = f.lookup("models--acme--m").await.expect("lookup");
        assert_eq!(dir.kind, EntryKind::Dir);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_missing_name_is_enoent() {
        let f = healthy();
        assert_eq!(errno(f.lookup("absent").await), libc::ENOENT);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_small_file_is_read_from_the_source_and_a_copy_kept() {
        // (Opening config.json next to weights.bin would prefetch that plain folder.)
        let f = fixture(|c, _, _| c.prefetch = false);
        let opened = f.open("config.json").await.expect("open");
        assert!(matches!(opened.reader, Reader::Source(_)));
        assert!(opened.pin.is_none());
        drop(opened);
        assert_eq!(
            f.read_all("config.json").await.expect("read"),
            f.source_bytes("config.json")
        );
        wait_until("the kept copy", || f.stored("config.json")).await;
        assert_eq!(f.metrics().stage_copies, 0, "kept copies are not staging");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_large_file_is_whole_in_the_cache_when_its_open_returns() {
        let f = fixture(|c, _, _| c.prefetch = false);
        let opened = f.open("weights.bin").await.expect("open");
        assert!(matches!(opened.reader, Reader::Copy(_)));
        assert!(opened.pin.is_some());
        assert!(f.stored("weights.bin"));
        drop(opened);
        assert_eq!(
            f.read_all("weights.bin").await.expect("read"),
            f.source_bytes("weights.bin")
        );
        let m = f.metrics();
        assert_eq!((m.stage_copies, m.stage_hits), (1, 1), "{m:?}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_staged_file_is_then_presented_as_a_link_to_its_copy() {
        let f = healthy();
        f.read_all("weights.bin").await.expect("stage");
        let attr = f.lookup("weights.bin").await.expect("lookup");
        assert_eq!(attr.kind, EntryKind::Symlink);
        let target = f.policy.readlink(attr.ino).await.expect("readlink");
        let target = PathBuf::from(OsString::from_vec(target));
        assert!(target.is_absolute(), "{}", target.display());
        assert_eq!(
            fs::read(&target).expect("copy"),
            f.source_bytes("weights.bin")
        );
        assert_eq!(f.metrics().redirects, 1);
        // Attributes of the link need nothing from the source.
        f.source.set(Behaviour::Eio);
        assert_eq!(
            f.policy.getattr(attr.ino).await.expect("getattr").kind,
            EntryKind::Symlink
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_listing_shows_staged_files_as_links_and_stages_nothing() {
        let f = healthy();
        let root = f.policy.opendir(ROOT_INO).await.expect("opendir");
        let kinds: Vec<_> = f
            .policy
            .listing(root)
            .expect("listing")
            .entries
            .iter()
            .map(|e| e.attr.kind)
            .collect();
        assert!(!kinds.contains(&EntryKind::Symlink));
        assert_eq!(f.metrics().stage_copies, 0, "listing stages nothing");
        f.read_all("weights.bin").await.expect("stage");
        let again = f.policy.opendir(ROOT_INO).await.expect("opendir");
        let listing = f.policy.listing(again).expect("listing");
        let weights = listing
            .entries
            .iter()
            .find(|e| e.name == "weights.bin")
            .expect("listed");
        assert_eq!(weights.attr.kind, EntryKind::Symlink);
        f.policy.releasedir(again);
        assert!(f.policy.listing(again).is_err());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn with_redirects_off_a_staged_file_stays_a_file() {
        let f = fixture(|c, _, _| c.redirect = false);
        f.read_all("weights.bin").await.expect("stage");
        assert_eq!(
            f.lookup("weights.bin").await.expect("lookup").kind,
            EntryKind::File
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_link_whose_copy_was_evicted_answers_estale() {
        let f = healthy();
        f.read_all("weights.bin").await.expect("stage");
        let link = f.lookup("weights.bin").await.expect("lookup");
        // Evicted past its grace (nobody followed it yet, so nothing holds it).
        wait_until("the handle's pin to go", || {
            f.policy
                .stager
                .remove_copy(Path::new("weights.bin"))
                .is_ok()
        })
        .await;
        assert_eq!(errno(f.policy.readlink(link.ino).await), libc::ESTALE);
        // Looked up again, it is the file, whose open stages it anew.
        assert_eq!(
            f.lookup("weights.bin").await.expect("lookup").kind,
            EntryKind::File
        );
        assert_eq!(
            f.read_all("weights.bin").await.expect("read"),
            f.source_bytes("weights.bin")
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_open_of_a_version_the_source_replaced_is_estale() {
        let f = fixture(|c, _, _| c.redirect = false);
        let old = f.lookup("weights.bin").await.expect("lookup");
        std::thread::sleep(Duration::from_millis(10));
        fs::write(f.src.join("weights.bin"), bytes(3 * MIB, 9)).expect("rewrite");
        assert_eq!(errno(f.policy.open(old.ino).await), libc::ESTALE);
        assert_eq!(
            f.read_all("weights.bin").await.expect("read"),
            f.source_bytes("weights.bin")
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_file_replaced_by_one_of_the_same_size_and_mtime_is_staged_again() {
        let f = fixture(|c, _, _| {
            c.redirect = false;
            c.prefetch = false;
        });
        let old = f.read_all("weights.bin").await.expect("stage");
        // `cp -p`, `rsync -t` or a download renamed over it: a new inode, with the
        // old file's size and mtime.
        let path = f.src.join("weights.bin");
        let mtime = fs::metadata(&path)
            .expect("stat")
            .modified()
            .expect("mtime");
        let replacement = f.src.join(".weights.bin.part");
        fs::write(&replacement, bytes(old.len(), 99)).expect("write");
        fs::File::options()
            .write(true)
            .open(&replacement)
            .and_then(|file| file.set_modified(mtime))
            .expect("set the mtime back");
        fs::rename(&replacement, &path).expect("rename over");
        let read = f.read_all("weights.bin").await.expect("read");
        assert!(
            read == f.source_bytes("weights.bin"),
            "the old copy was served"
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_file_changing_mid_copy_is_refused_and_never_stored() {
        let f = fixture(|c, _, _| c.prefetch = false);
        f.source
            .rewrite_after("weights.bin", MIB as u64, bytes(2 * MIB, 7));
        assert_eq!(errno(f.open("weights.bin").await), libc::EIO);
        assert!(!f.stored("weights.bin"));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_blob_named_by_its_sha256_is_served_without_asking_the_source() {
        // (A prefetch scan on open would ask the source about the snapshot.)
        let f = fixture(|c, _, _| {
            c.redirect = false;
            c.prefetch = false;
        });
        let blob = f.lookup(&f.blob).await.expect("lookup");
        drop(f.policy.open(blob.ino).await.expect("stage"));
        let before = f.source.calls();
        let opened = f.policy.open(blob.ino).await.expect("open");
        assert_eq!(f.source.calls(), before, "the source was asked");
        assert!(matches!(opened.reader, Reader::Copy(_)));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_unreadable_source_passes_its_errno_on() {
        let f = healthy();
        f.source.set(Behaviour::Eio);
        assert_eq!(errno(f.lookup("weights.bin").await), libc::EIO);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_file_the_budget_cannot_hold_fails_with_enospc() {
        let f = fixture(|_, _, b| b.max_size = Some(MIB as u64));
        assert_eq!(errno(f.open("weights.bin").await), libc::ENOSPC);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn with_on_full_read_source_it_is_read_from_the_source() {
        let f = fixture(|c, _, b| {
            c.on_full = OnFull::ReadSource;
            b.max_size = Some(MIB as u64);
        });
        let opened = f.open("weights.bin").await.expect("open");
        assert!(matches!(opened.reader, Reader::Source(_)));
        drop(opened);
        assert_eq!(
            f.read_all("weights.bin").await.expect("read"),
            f.source_bytes("weights.bin")
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_open_handle_keeps_its_copy_until_released() {
        let f = fixture(|c, _, _| c.redirect = false);
        let weights = Path::new("weights.bin");
        let fh = f
            .policy
            .register(f.open("weights.bin").await.expect("open"), None);
        assert!(f.policy.stager.remove_copy(weights).is_err(), "in use");
        f.policy.release(fh);
        wait_until("the release", || {
            f.policy.stager.remove_copy(weights).is_ok()
        })
        .await;
        assert_eq!(errno(f.policy.read(fh, 0, 1).await), libc::ESTALE);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn directory_operations_on_files_and_file_operations_on_directories_fail() {
        let f = healthy();
        let file = f.lookup("config.json").await.expect("lookup");
        assert_eq!(errno(f.policy.opendir(file.ino).await), libc::ENOTDIR);
        let dir = f.lookup("models--acme--m").await.expect("lookup");
        assert_eq!(errno(f.policy.open(dir.ino).await), libc::EISDIR);
        assert_eq!(errno(f.policy.getattr(9_999).await), libc::ESTALE);
    }

    // ------------------------------------------------------------ a source that stops answering

    #[tokio::test(flavor = "multi_thread")]
    async fn while_the_source_hangs_a_staged_model_is_served_from_what_it_said_last() {
        let f = fixture(|c, _, _| c.redirect = false);
        let expected = f.source_bytes("weights.bin");
        f.read_all("weights.bin").await.expect("stage");
        f.read_all("config.json").await.expect("read");
        wait_until("the kept copy", || f.stored("config.json")).await;
        f.source.set(Behaviour::Hang);
        let read = tokio::time::timeout(PROMPTLY, async {
            (
                f.read_all("weights.bin").await,
                f.read_all("config.json").await,
            )
        })
        .await
        .expect("served promptly, not after the source timeout");
        assert_eq!(read.0.expect("weights"), expected);
        assert_eq!(read.1.expect("config"), f.source_bytes("config.json"));
        f.source.set(Behaviour::Healthy);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn while_the_source_hangs_links_to_staged_copies_keep_resolving() {
        let f = healthy();
        f.read_all("weights.bin").await.expect("stage");
        f.lookup("weights.bin").await.expect("lookup");
        f.source.set(Behaviour::Hang);
        let link = f.lookup_promptly("weights.bin").await.expect("from memory");
        assert_eq!(link.kind, EntryKind::Symlink);
        let target = tokio::time::timeout(PROMPTLY, f.policy.readlink(link.ino))
            .await
            .expect("readlink needs no source");
        assert!(target.is_ok());
        f.source.set(Behaviour::Healthy);
    }

    // ------------------------------------------------------------ a source that fails fast or vanishes

    /// A model read once, then a source that fails every call at once with `errno`.
    async fn staged_then_failing(errno: i32) -> (Fixture, Vec<u8>) {
        let f = fixture(|c, _, _| c.redirect = false);
        let expected = f.source_bytes("weights.bin");
        f.read_all("weights.bin").await.expect("stage");
        f.read_all("config.json").await.expect("read");
        wait_until("the kept copy", || f.stored("config.json")).await;
        f.policy.list(ROOT_INO).await.expect("listed");
        f.source.set(Behaviour::Fails(errno));
        (f, expected)
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_dead_fuse_source_serves_the_staged_model_and_fails_the_rest_with_eio() {
        // ENOTCONN is what a killed sshfs answers, at once, to everything.
        let (f, expected) = staged_then_failing(libc::ENOTCONN).await;
        assert_eq!(f.read_all("weights.bin").await.expect("staged"), expected);
        let config = f.read_all("config.json").await.expect("kept copy");
        assert_eq!(config, f.source_bytes("config.json"));
        let listed = f.policy.list(ROOT_INO).await.expect("listing from memory");
        assert!(listed.iter().any(|e| e.name == "weights.bin"));
        assert!(f.policy.pool().is_unresponsive(), "counted as away");
        assert_eq!(errno(f.lookup_promptly("never-seen").await), libc::EIO);
        f.source.set(Behaviour::Healthy);
        until_back(&f, "config.json").await;
        assert_eq!(errno(f.lookup("never-seen").await), libc::ENOENT, "back");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn every_errno_of_a_lost_server_counts_as_the_source_away() {
        for errno_away in [libc::EIO, libc::ESTALE, libc::EHOSTDOWN, libc::ENETUNREACH] {
            let (f, expected) = staged_then_failing(errno_away).await;
            assert_eq!(
                f.read_all("weights.bin").await.expect("staged"),
                expected,
                "{errno_away}"
            );
            assert!(f.policy.pool().is_unresponsive(), "{errno_away}");
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_errno_about_the_file_is_passed_on_and_is_no_outage() {
        let (f, _) = staged_then_failing(libc::EACCES).await;
        assert_eq!(errno(f.lookup("weights.bin").await), libc::EACCES);
        assert!(!f.policy.pool().is_unresponsive());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn once_the_source_is_known_away_a_name_never_seen_is_not_waited_for() {
        // The timeout is PATIENT (120 s); the source is known away from a fast error,
        // then hangs: a lookup of a name no one has seen fails well before it.
        let (f, _) = staged_then_failing(libc::EHOSTDOWN).await;
        assert_eq!(errno(f.lookup("first").await), libc::EIO);
        f.source.set(Behaviour::Hang);
        for name in ["trees", "refs-unseen"] {
            assert_eq!(errno(f.lookup_promptly(name).await), libc::EIO, "{name}");
        }
        f.source.set(Behaviour::Healthy);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_name_never_seen_fails_with_eio_within_the_source_timeout() {
        let f = fixture(|c, _, _| c.source_timeout = Duration::from_millis(300));
        f.source.set(Behaviour::Hang);
        let started = Instant::now();
        assert_eq!(errno(f.lookup("weights.bin").await), libc::EIO);
        assert!(started.elapsed() < PROMPTLY);
        assert!(f.policy.pool().is_unresponsive());
        f.source.set(Behaviour::Healthy);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_file_never_staged_fails_with_eio_while_the_source_hangs() {
        let f = fixture(|c, _, _| {
            c.source_timeout = Duration::from_millis(300);
            c.prefetch = false;
        });
        let attr = f.lookup("weights.bin").await.expect("lookup");
        f.source.set(Behaviour::Hang);
        assert_eq!(errno(f.policy.open(attr.ino).await), libc::EIO);
        f.source.set(Behaviour::Healthy);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn once_every_source_thread_is_stuck_a_lookup_fails_at_once() {
        let f = fixture(|c, o, _| {
            c.source_timeout = Duration::from_millis(200);
            o.source_threads = 2;
        });
        f.source.set(Behaviour::Hang);
        for name in ["a", "b"] {
            assert_eq!(errno(f.lookup(name).await), libc::EIO);
        }
        wait_until("both threads to be stuck", || f.policy.pool().saturated()).await;
        assert_eq!(errno(f.lookup("c").await), libc::EIO);
        assert_eq!(
            f.policy.pool().health().running,
            2,
            "no third thread was taken"
        );
        f.source.set(Behaviour::Healthy);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_open_waiting_for_a_stuck_pool_stages_once_a_thread_comes_free() {
        let f = fixture(|c, o, _| {
            c.source_timeout = Duration::from_millis(400);
            c.prefetch = false;
            o.source_threads = 1;
        });
        let attr = f.lookup("weights.bin").await.expect("lookup");
        f.source.set(Behaviour::Hang);
        assert_eq!(errno(f.lookup("a").await), libc::EIO);
        wait_until("the thread to be stuck", || f.policy.pool().saturated()).await;
        let policy = Arc::clone(&f.policy);
        let opening = tokio::spawn(async move { policy.open(attr.ino).await.map(|o| o.stamp) });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!opening.is_finished(), "it did not fail at once");
        f.source.set(Behaviour::Healthy);
        let stamp = tokio::time::timeout(PROMPTLY, opening)
            .await
            .expect("answered")
            .expect("task")
            .expect("staged once the thread came free");
        assert_eq!(stamp.size, 2 * MIB as u64);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_source_is_declared_back_by_a_probe_and_serves_at_once() {
        let f = fixture(|c, _, _| c.source_timeout = Duration::from_millis(300));
        f.lookup("config.json").await.expect("lookup");
        f.source.set(Behaviour::Hang);
        assert_eq!(errno(f.lookup("weights.bin").await), libc::EIO);
        assert!(f.policy.pool().is_unresponsive());
        f.source.set(Behaviour::Healthy);
        // A name never seen goes to the source even while it is marked down.
        assert!(f.lookup("weights.bin").await.is_ok());
        // A remembered one is answered from memory and sends the probe.
        f.lookup("config.json").await.expect("lookup");
        wait_until("the probe", || !f.policy.pool().is_unresponsive()).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_slow_source_is_waited_for_when_there_is_nothing_to_recall() {
        let f = healthy();
        f.source.set(Behaviour::Slow(SUSPECT_AFTER * 2));
        let attr = f.lookup("weights.bin").await.expect("slow but there");
        assert_eq!(attr.size, 2 * MIB as u64);
        assert!(!f.policy.pool().is_unresponsive(), "slow is not gone");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_listing_is_recalled_while_the_source_hangs() {
        let f = healthy();
        let fh = f.policy.opendir(ROOT_INO).await.expect("opendir");
        let names = f.policy.listing(fh).expect("listing").entries.len();
        f.source.set(Behaviour::Hang);
        let again = tokio::time::timeout(PROMPTLY, f.policy.opendir(ROOT_INO))
            .await
            .expect("from memory")
            .expect("listing");
        assert_eq!(
            f.policy.listing(again).expect("listing").entries.len(),
            names
        );
        f.source.set(Behaviour::Healthy);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn statfs_asks_the_source_and_fails_with_eio_when_it_hangs() {
        let f = fixture(|c, _, _| c.source_timeout = Duration::from_millis(200));
        assert!(f.policy.statfs().await.is_ok());
        f.source.set(Behaviour::Hang);
        assert_eq!(errno(f.policy.statfs().await), libc::EIO);
        f.source.set(Behaviour::Healthy);
    }

    // ------------------------------------------------------------ writing through the mount

    /// A fixture whose mount writes through.
    fn writable(edit: impl FnOnce(&mut FsConfig, &mut StagerOptions, &mut Budget)) -> Fixture {
        fixture(|c, o, b| {
            c.read_only = false;
            edit(c, o, b);
        })
    }

    fn me() -> Caller {
        // SAFETY: no preconditions.
        unsafe {
            Caller {
                uid: libc::geteuid(),
                gid: libc::getegid(),
            }
        }
    }

    const NEW: stagefs_source::CreateFile = stagefs_source::CreateFile {
        mode: 0o644,
        exclusive: true,
        open: stagefs_source::WriteOpen {
            read: true,
            truncate: false,
        },
    };

    impl Fixture {
        /// Creates `name` at the root, writes `data` and closes it.
        async fn write_new(&self, name: &str, data: &[u8]) -> Result<Attr, FsError> {
            let (attr, fh) = self
                .policy
                .create(ROOT_INO, OsStr::new(name), NEW, me())
                .await?;
            for (i, chunk) in data.chunks(128 << 10).enumerate() {
                let offset = (i * (128 << 10)) as u64;
                self.policy.write(fh, offset, chunk.to_vec()).await?;
            }
            self.policy.release(fh);
            Ok(attr)
        }

        /// Opens the version of `rel` now looked up and holds it, as a reader would.
        async fn hold(&self, rel: &str) -> u64 {
            let opened = self.open(rel).await.expect("open");
            self.policy.register(opened, None)
        }

        async fn read_handle(&self, fh: u64, len: usize) -> Vec<u8> {
            self.policy.read(fh, 0, len as u32).await.expect("read")
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_file_created_through_the_mount_is_written_to_the_source() {
        let f = writable(|_, _, _| {});
        let data = bytes(3 * MIB, 5);
        let attr = f.write_new("new.bin", &data).await.expect("write");
        assert_eq!(attr.kind, EntryKind::File);
        assert_eq!(f.source_bytes("new.bin"), data);
        let mode = fs::metadata(f.src.join("new.bin"))
            .expect("stat")
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o644
        );
        // The kernel's inode follows the file it wrote.
        assert_eq!(
            f.policy.getattr(attr.ino).await.expect("getattr").size,
            data.len() as u64
        );
        assert_eq!(f.read_all("new.bin").await.expect("read"), data);
        assert_eq!(
            errno(
                f.policy
                    .create(ROOT_INO, OsStr::new("new.bin"), NEW, me())
                    .await
            ),
            libc::EEXIST
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_rewrite_that_keeps_size_and_mtime_never_serves_the_old_copy() {
        let f = writable(|c, _, _| c.prefetch = false);
        let old = f.source_bytes("weights.bin");
        assert_eq!(f.read_all("weights.bin").await.expect("stage"), old);
        assert!(f.stored("weights.bin"));
        let mtime = f.lookup("weights.bin").await.expect("lookup").mtime_ns;
        // A reader holds the old version's copy.
        let reader = f.hold("weights.bin").await;
        let attr = f.lookup("weights.bin").await.expect("lookup");
        let new = bytes(old.len(), 77);
        let fh = f
            .policy
            .open_write(attr.ino, stagefs_source::WriteOpen::default())
            .await
            .expect("open for writing");
        f.policy.write(fh, 0, new.clone()).await.expect("write");
        // The old mtime set back, as `cp -p` or `rsync -t` would: the stamp matches.
        let back = SetAttr {
            mtime: Some(stagefs_source::SetTime::At(mtime)),
            ..SetAttr::default()
        };
        f.policy
            .setattr(attr.ino, Some(fh), back)
            .await
            .expect("utimes");
        f.policy.release(fh);
        assert_eq!(
            f.lookup("weights.bin").await.expect("lookup").mtime_ns,
            mtime
        );
        assert_eq!(
            f.read_all("weights.bin").await.expect("read"),
            new,
            "not the stale copy"
        );
        assert_eq!(
            f.read_handle(reader, old.len()).await,
            old,
            "the reader keeps its bytes"
        );
        f.policy.release(reader);
        // Once the reader is gone the stale copy goes, and the new version is staged.
        let deadline = Instant::now() + PROMPTLY;
        loop {
            assert_eq!(f.read_all("weights.bin").await.expect("read"), new);
            let meta = fs::symlink_metadata(f.src.join("weights.bin")).expect("stat");
            let stamp = Stamp::of(&SourceMeta::from(&meta));
            assert_eq!((stamp.size, stamp.mtime_ns), (new.len() as u64, mtime));
            if let Some(staged) = f.policy.stager.stored(Path::new("weights.bin"), stamp) {
                let copy = read_at_most(staged.file.as_ref(), 0, new.len(), |_| {}).expect("copy");
                if copy == new {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the new version was never staged"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_rename_over_a_staged_file_moves_the_name_and_the_reader_keeps_the_old() {
        let f = writable(|c, _, _| c.prefetch = false);
        let old = f.source_bytes("weights.bin");
        let reader = f.hold("weights.bin").await;
        let mtime = f.lookup("weights.bin").await.expect("lookup").mtime_ns;
        let new = bytes(old.len(), 99);
        let tmp = f.write_new("weights.bin.tmp", &new).await.expect("write");
        let same = SetAttr {
            mtime: Some(stagefs_source::SetTime::At(mtime)),
            ..SetAttr::default()
        };
        f.policy.setattr(tmp.ino, None, same).await.expect("utimes");
        f.policy
            .rename(
                ROOT_INO,
                OsStr::new("weights.bin.tmp"),
                ROOT_INO,
                OsStr::new("weights.bin"),
                RenameHow::default(),
            )
            .await
            .expect("rename over");
        assert_eq!(f.source_bytes("weights.bin"), new);
        assert_eq!(errno(f.lookup("weights.bin.tmp").await), libc::ENOENT);
        let moved = f.lookup("weights.bin").await.expect("lookup");
        assert_eq!(moved.ino, tmp.ino, "the inode moved with its name");
        assert_eq!(f.read_all("weights.bin").await.expect("read"), new);
        assert_eq!(f.read_handle(reader, old.len()).await, old);
        f.policy.release(reader);
        let no_replace = RenameHow { no_replace: true };
        f.write_new("other", b"x").await.expect("write");
        assert_eq!(
            errno(
                f.policy
                    .rename(
                        ROOT_INO,
                        OsStr::new("other"),
                        ROOT_INO,
                        OsStr::new("config.json"),
                        no_replace
                    )
                    .await
            ),
            libc::EEXIST
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_unlink_forgets_the_name_and_drops_the_copy() {
        let f = writable(|c, _, _| {
            c.prefetch = false;
            c.redirect = false;
        });
        f.read_all("weights.bin").await.expect("stage");
        assert!(f.stored("weights.bin"));
        let attr = f.lookup("weights.bin").await.expect("lookup");
        f.policy
            .unlink(ROOT_INO, OsStr::new("weights.bin"))
            .await
            .expect("unlink");
        assert!(!f.src.join("weights.bin").exists());
        // (Once the last handle's pin is gone.)
        wait_until("the copy of a removed file to be dropped", || {
            !f.stored("weights.bin")
        })
        .await;
        assert_eq!(errno(f.lookup("weights.bin").await), libc::ENOENT);
        // Even while the source is away, the removed name is not recalled.
        f.source.set(Behaviour::Eio);
        assert!(
            f.policy
                .lookup(ROOT_INO, OsStr::new("weights.bin"))
                .await
                .is_err()
        );
        // A handle still open on it (fstat) sees it unlinked.
        assert_eq!(f.policy.getattr(attr.ino).await.expect("getattr").nlink, 0);
        f.source.set(Behaviour::Healthy);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn directories_links_modes_and_renamed_trees() {
        let f = writable(|_, _, _| {});
        let d = f
            .policy
            .mkdir(ROOT_INO, OsStr::new("d"), 0o750, me())
            .await
            .expect("mkdir");
        assert_eq!((d.kind, d.perm), (EntryKind::Dir, 0o750));
        let (file, fh) = f
            .policy
            .create(d.ino, OsStr::new("f"), NEW, me())
            .await
            .expect("create");
        f.policy.write(fh, 0, b"abc".to_vec()).await.expect("write");
        f.policy.release(fh);
        let link = f
            .policy
            .symlink(d.ino, OsStr::new("l"), Path::new("f"), me())
            .await
            .expect("symlink");
        assert_eq!(f.policy.readlink(link.ino).await.expect("readlink"), b"f");
        let chmod = SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        };
        assert_eq!(
            f.policy
                .setattr(file.ino, None, chmod)
                .await
                .expect("chmod")
                .perm,
            0o600
        );
        let truncate = SetAttr {
            size: Some(1),
            ..SetAttr::default()
        };
        assert_eq!(
            f.policy
                .setattr(file.ino, None, truncate)
                .await
                .expect("truncate")
                .size,
            1
        );
        f.policy
            .rename(
                ROOT_INO,
                OsStr::new("d"),
                ROOT_INO,
                OsStr::new("e"),
                RenameHow::default(),
            )
            .await
            .expect("rename a directory");
        assert_eq!(
            f.policy
                .getattr(file.ino)
                .await
                .expect("moved with it")
                .size,
            1
        );
        assert_eq!(fs::read(f.src.join("e/f")).expect("read"), b"a");
        assert_eq!(
            errno(f.policy.rmdir(ROOT_INO, OsStr::new("e")).await),
            libc::ENOTEMPTY
        );
        for name in ["f", "l"] {
            f.policy
                .unlink(d.ino, OsStr::new(name))
                .await
                .expect("unlink");
        }
        f.policy
            .rmdir(ROOT_INO, OsStr::new("e"))
            .await
            .expect("rmdir");
        assert!(!f.src.join("e").exists());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_read_only_mount_refuses_every_change_with_erofs() {
        let f = fixture(|c, _, _| c.read_only = true);
        assert_eq!(errno(f.write_new("x", b"x").await), libc::EROFS);
        assert_eq!(
            errno(f.policy.mkdir(ROOT_INO, OsStr::new("d"), 0o755, me()).await),
            libc::EROFS
        );
        assert_eq!(
            errno(f.policy.unlink(ROOT_INO, OsStr::new("config.json")).await),
            libc::EROFS
        );
        let attr = f.lookup("config.json").await.expect("lookup");
        assert_eq!(
            errno(
                f.policy
                    .open_write(attr.ino, stagefs_source::WriteOpen::default())
                    .await
            ),
            libc::EROFS
        );
        assert!(f.src.join("config.json").exists());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_full_source_fails_the_writer_with_enospc() {
        let f = writable(|_, _, _| {});
        let (_, fh) = f
            .policy
            .create(ROOT_INO, OsStr::new("big"), NEW, me())
            .await
            .expect("create");
        f.source.set(Behaviour::Full);
        assert_eq!(
            errno(f.policy.write(fh, 0, vec![1; 4096]).await),
            libc::ENOSPC
        );
        f.policy.release(fh);
        assert_eq!(errno(f.write_new("other", b"x").await), libc::ENOSPC);
        assert_eq!(
            errno(f.policy.mkdir(ROOT_INO, OsStr::new("d"), 0o755, me()).await),
            libc::ENOSPC
        );
        // Reads are not affected.
        assert!(f.read_all("weights.bin").await.is_ok());
        f.source.set(Behaviour::Healthy);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_dead_source_fails_writes_with_eio_within_the_timeout_and_staged_files_stay() {
        let f = writable(|c, _, _| {
            c.source_timeout = Duration::from_millis(300);
            c.redirect = false;
        });
        let expected = f.source_bytes("weights.bin");
        f.read_all("weights.bin").await.expect("stage");
        let (_, fh) = f
            .policy
            .create(ROOT_INO, OsStr::new("w"), NEW, me())
            .await
            .expect("create");
        f.source.set(Behaviour::Hang);
        let started = Instant::now();
        assert_eq!(errno(f.policy.write(fh, 0, vec![1; 4096]).await), libc::EIO);
        assert_eq!(errno(f.policy.fsync(fh, false).await), libc::EIO);
        assert_eq!(errno(f.write_new("x", b"x").await), libc::EIO);
        assert_eq!(
            errno(f.policy.unlink(ROOT_INO, OsStr::new("config.json")).await),
            libc::EIO
        );
        assert!(started.elapsed() < PROMPTLY, "{:?}", started.elapsed());
        let read = tokio::time::timeout(PROMPTLY, f.read_all("weights.bin"))
            .await
            .expect("a staged file is served while the source is dead");
        assert_eq!(read.expect("read"), expected);
        f.policy.release(fh);
        f.source.set(Behaviour::Healthy);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_close_fails_with_eio_when_the_source_cannot_take_what_was_written() {
        let f = writable(|c, _, _| {
            c.source_timeout = Duration::from_millis(300);
            c.prefetch = false;
        });
        let data = bytes(3 * MIB, 46);
        let (_, fh) = f
            .policy
            .create(ROOT_INO, OsStr::new("saved.bin"), NEW, me())
            .await
            .expect("create");
        f.policy.write(fh, 0, data.clone()).await.expect("write");
        // Answered, and then the source goes away before the writer closes: the close
        // (a flush of what the source's client holds) must say so.
        f.source.set(Behaviour::Hang);
        let started = Instant::now();
        assert_eq!(errno(f.policy.flush(fh).await), libc::EIO);
        assert!(started.elapsed() < PROMPTLY, "{:?}", started.elapsed());
        f.policy.release(fh);
        f.source.set(Behaviour::Healthy);
        // The copy it filled is not staged: the source may not hold what it saw.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!f.stored("saved.bin"));
        assert!(f.read_all("saved.bin").await.expect("read") == f.source_bytes("saved.bin"));

        // A source that takes it: the close succeeds, and the copy is staged as written.
        let (_, fh) = f
            .policy
            .create(ROOT_INO, OsStr::new("kept.bin"), NEW, me())
            .await
            .expect("create");
        f.policy.write(fh, 0, data.clone()).await.expect("write");
        f.policy.flush(fh).await.expect("flush");
        f.policy.release(fh);
        wait_until("the written copy", || f.trusted_copy("kept.bin")).await;
        // A read handle has nothing to flush, even with the source gone.
        let reader = f.hold("kept.bin").await;
        f.source.set(Behaviour::Hang);
        f.policy.flush(reader).await.expect("nothing to flush");
        f.source.set(Behaviour::Healthy);
        f.policy.release(reader);
    }

    // ------------------------------------------------------------ staged as written

    impl Fixture {
        /// Creates `name` in directory `dir`, writes `data` front to back and closes it.
        async fn write_into(&self, dir: u64, name: &str, data: &[u8]) -> Attr {
            let (attr, fh) = self
                .policy
                .create(dir, OsStr::new(name), NEW, me())
                .await
                .expect("create");
            for (i, chunk) in data.chunks(128 << 10).enumerate() {
                let offset = (i * (128 << 10)) as u64;
                self.policy
                    .write(fh, offset, chunk.to_vec())
                    .await
                    .expect("write");
            }
            self.policy.release(fh);
            attr
        }
    }

    impl Fixture {
        /// Writes `data` as huggingface_hub does: into `blobs/<name>.incomplete`,
        /// then renamed to `blobs/<name>`.
        async fn download_blob(&self, name: &str, data: &[u8]) {
            let blobs = self.lookup("models--acme--m/blobs").await.expect("blobs");
            let incomplete = format!("{name}.incomplete");
            self.write_into(blobs.ino, &incomplete, data).await;
            self.policy
                .rename(
                    blobs.ino,
                    OsStr::new(&incomplete),
                    blobs.ino,
                    OsStr::new(name),
                    RenameHow::default(),
                )
                .await
                .expect("rename");
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_blob_downloaded_through_the_mount_is_staged_as_it_is_written() {
        let f = writable(|c, _, _| c.prefetch = false);
        let data = bytes(3 * MIB, 42);
        let sha = format!("{:x}", Sha256::digest(&data));
        f.download_blob(&sha, &data).await;
        let blob = PathBuf::from("models--acme--m/blobs").join(&sha);
        wait_until("the written copy", || f.stored(&blob)).await;
        assert!(f.read_all(&blob).await.expect("read") == data);
        let m = f.metrics();
        assert_eq!(
            (m.stage_copies, m.stage_hits),
            (0, 1),
            "nothing copied over the link: {m:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_written_blob_whose_bytes_do_not_match_its_name_is_not_staged() {
        let f = writable(|c, _, _| c.prefetch = false);
        let data = bytes(3 * MIB, 42);
        let wrong = format!("{:x}", Sha256::digest(b"something else"));
        f.download_blob(&wrong, &data).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!f.stored(PathBuf::from("models--acme--m/blobs").join(&wrong)));
        assert!(
            f.policy.stager.store().entries().len() <= 1,
            "nothing else either"
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_file_written_front_to_back_is_staged_and_one_written_out_of_order_is_not() {
        let f = writable(|c, _, _| c.prefetch = false);
        let data = bytes(3 * MIB, 43);
        f.write_into(ROOT_INO, "saved.bin", &data).await;
        wait_until("the written copy", || f.trusted_copy("saved.bin")).await;
        assert!(f.read_all("saved.bin").await.expect("read") == data);
        assert_eq!(f.metrics().stage_copies, 0, "nothing copied over the link");

        let (_, fh) = f
            .policy
            .create(ROOT_INO, OsStr::new("scattered.bin"), NEW, me())
            .await
            .expect("create");
        let half = data.len() / 2;
        f.policy
            .write(fh, half as u64, data[half..].to_vec())
            .await
            .expect("write");
        f.policy
            .write(fh, 0, data[..half].to_vec())
            .await
            .expect("write");
        f.policy.release(fh);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!f.stored("scattered.bin"));
        assert!(f.read_all("scattered.bin").await.expect("read") == data);
        assert_eq!(
            f.metrics().stage_copies,
            1,
            "staged from the source instead"
        );
    }

    impl Fixture {
        async fn rename_in_root(&self, from: &str, to: &str) {
            self.policy
                .rename(
                    ROOT_INO,
                    OsStr::new(from),
                    ROOT_INO,
                    OsStr::new(to),
                    RenameHow::default(),
                )
                .await
                .expect("rename");
        }
    }

    /// As safetensors' `save_file` writes (and transformers' `save_pretrained`
    /// through it): a temp file, its whole length set first, written front to back,
    /// renamed before its close reaches the daemon (FUSE sends RELEASE on its own
    /// time); then a careful caller reopens it to fsync and renames it again. The
    /// copy follows both renames, and the load reads nothing back over the link.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_preallocated_temp_file_renamed_before_its_close_and_again_keeps_its_copy() {
        let f = writable(|c, _, _| c.prefetch = false);
        let data = bytes(3 * MIB, 45);
        let (attr, fh) = f
            .policy
            .create(ROOT_INO, OsStr::new(".tmpAbC123"), NEW, me())
            .await
            .expect("create");
        let preallocate = SetAttr {
            size: Some(data.len() as u64),
            ..SetAttr::default()
        };
        f.policy
            .setattr(attr.ino, Some(fh), preallocate)
            .await
            .expect("ftruncate");
        for (i, chunk) in data.chunks(128 << 10).enumerate() {
            let offset = (i * (128 << 10)) as u64;
            f.policy
                .write(fh, offset, chunk.to_vec())
                .await
                .expect("write");
        }
        f.rename_in_root(".tmpAbC123", "model.safetensors.tmp")
            .await;
        f.policy.release(fh);
        wait_until("the written copy", || {
            f.trusted_copy("model.safetensors.tmp")
        })
        .await;
        // Reopened to fsync: no write, so no change.
        let tmp = f.lookup("model.safetensors.tmp").await.expect("lookup");
        let fh = f
            .policy
            .open_write(tmp.ino, stagefs_source::WriteOpen::default())
            .await
            .expect("open");
        f.policy.fsync(fh, false).await.expect("fsync");
        f.policy.release(fh);
        f.rename_in_root("model.safetensors.tmp", "model.safetensors")
            .await;
        assert!(f.read_all("model.safetensors").await.expect("read") == data);
        assert_eq!(f.metrics().stage_copies, 0, "nothing copied over the link");
        assert!(
            !f.stored("model.safetensors.tmp"),
            "one copy, under the final name"
        );
    }

    /// The copy follows a rename only if nothing else changed the file: a second
    /// handle's write in between leaves it to be staged from the source.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_file_changed_by_another_handle_before_its_rename_is_staged_from_the_source() {
        let f = writable(|c, _, _| c.prefetch = false);
        let data = bytes(3 * MIB, 46);
        f.write_into(ROOT_INO, "w.tmp", &data).await;
        wait_until("the written copy", || f.trusted_copy("w.tmp")).await;
        let tmp = f.lookup("w.tmp").await.expect("lookup");
        let fh = f
            .policy
            .open_write(tmp.ino, stagefs_source::WriteOpen::default())
            .await
            .expect("open");
        f.policy.write(fh, 7, b"X".to_vec()).await.expect("write");
        f.policy.release(fh);
        f.rename_in_root("w.tmp", "w.bin").await;
        let mut expected = data.clone();
        expected[7] = b'X';
        assert!(f.read_all("w.bin").await.expect("read") == expected);
        assert_eq!(f.metrics().stage_copies, 1, "staged from the source");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_copy_the_budget_has_no_room_for_is_not_filled_as_written() {
        // Room is asked for 32 MiB ahead; a 16 MiB budget has none.
        let f = writable(|c, _, b| {
            c.prefetch = false;
            b.max_size = Some(16 * MIB as u64);
        });
        let data = bytes(3 * MIB, 44);
        f.write_into(ROOT_INO, "big.bin", &data).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!f.stored("big.bin"));
        assert!(f.read_all("big.bin").await.expect("read") == data);
        assert_eq!(
            f.metrics().stage_copies,
            1,
            "staged from the source, which fits"
        );
    }
}
