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

use std::ffi::{OsStr, OsString};
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
use stagefs_stage::answers::Remembered;
use stagefs_stage::prefetch::Prefetcher;
use stagefs_stage::{Handout, InFlight, Metrics, Pin, StageError, Staged, Stager, StoreError};
use tokio::runtime::Handle;
use tracing::{debug, info, warn};

use crate::attr::{Attr, attr_of, link_attr, link_attr_of};
use crate::error::FsError;
use crate::finder;
use crate::handles::{DirEntry, Handles, Keepalive, OpenFile, Reader};
use crate::inodes::{Inodes, Known, Node, ROOT_INO};
use crate::links::{self, NfsLinks};
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
    links: NfsLinks,
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

    /// Like [`Policy::new`], with inode numbers as an NFS client needs them: they
    /// last across restarts of the server, kept in `journal` (clients keep file
    /// handles across restarts), and a file's number follows it from version to
    /// version (a client sees a change at the source only in the attributes of the
    /// handle it holds: `Inodes::follow_files`).
    pub fn with_inode_journal(
        stager: Stager,
        config: FsConfig,
        runtime: Handle,
        journal: &Path,
    ) -> io::Result<Self> {
        let inodes = Inodes::with_journal(journal)?;
        inodes.follow_files();
        Ok(Self::with_inodes(stager, config, runtime, inodes))
    }

    /// The version of its file that inode `ino` stands for now (None for a directory
    /// or link): a handle opened on another version must not serve it.
    pub fn version_of(&self, ino: u64) -> Option<Stamp> {
        self.inodes.get(ino)?.stamp
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
            links: NfsLinks::new(&config),
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

    /// Whether blobs are presented as NFS links on this mount (`links.rs`).
    pub fn nfs_links_enabled(&self) -> bool {
        self.links.enabled()
    }

    /// An NFS client may keep the attributes it has until `until`, however old (it
    /// was answered JUKEBOX): no copy a link named is removed before then.
    pub fn links_unsettled_until(&self, until: std::time::Instant) {
        self.stager.links_unsettled_until(until);
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

    /// The source's inode number of the file version `ino` stands for, if known:
    /// two names of one hard-linked file share it, so that a change through one
    /// can let go of what is held for the other (the NFS server's open copies).
    pub fn source_inode(&self, ino: u64) -> Option<u64> {
        let stamp = self.inodes.get(ino)?.stamp?;
        (stamp.ino != 0).then_some(stamp.ino)
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
                debug!(path = %stagefs_source::logged(what), error = %e, "the source is away");
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
                debug!(path = %stagefs_source::logged(what), %why, "no answer from the source");
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
        if let Some(blob) = self.links.aliased(name) {
            return self.lookup_alias(parent, &blob).await;
        }
        let path = self.node(parent)?.path.join(name);
        let known_path = path.clone();
        let work_path = path.clone();
        let known = self
            .ask(
                &path,
                move |p| match p.stager.source().stat(&work_path) {
                    Ok(meta) => {
                        p.stager.answers().saw(&work_path, &meta);
                        let attr = p.entry_attr(&work_path, &meta);
                        p.inodes.remember_attr(attr);
                        Ok(Known::Entry(attr))
                    }
                    // Remembered, so a loader's probe of a name the model lacks
                    // gets the same answer while the source is away.
                    Err(SourceError::NotFound { .. }) => {
                        p.inodes.remember_absent(&work_path);
                        p.stager.answers().saw_absent(&work_path);
                        Ok(Known::Absent)
                    }
                    Err(e) => Err(e.into()),
                },
                move |p| {
                    p.inodes
                        .known_entry(&known_path)
                        .or_else(|| p.recall_entry(&known_path))
                },
            )
            .await?;
        match known {
            Known::Entry(attr) => Ok(attr),
            Known::Absent => Err(FsError::Source(SourceError::NotFound { path })),
        }
    }

    /// The regular file blob `blob` of directory `parent` is a link to, looked up by
    /// its alias (`links.rs`): what a link to a blob not staged yet leads to.
    async fn lookup_alias(self: &Arc<Self>, parent: u64, blob: &OsStr) -> Result<Attr, FsError> {
        let path = self.node(parent)?.path.join(blob);
        let work_path = path.clone();
        let recall_path = path.clone();
        self.ask(
            &path,
            move |p| {
                let meta = p.stager.source().stat(&work_path)?;
                p.stager.answers().saw(&work_path, &meta);
                if !meta.is_file() {
                    return Err(SourceError::NotFound { path: work_path }.into());
                }
                let attr = p.file_attr(&work_path, &meta);
                p.inodes.remember_attr(attr);
                Ok(attr)
            },
            move |p| match p.stager.answers().entry(&recall_path)? {
                Remembered::Entry(meta) if meta.is_file() => Some(p.file_attr(&recall_path, &meta)),
                _ => None,
            },
        )
        .await
    }

    /// The inode and attributes `path` is presented with: a blob as an NFS link
    /// where those are on, a staged file as a link to its copy where redirects are
    /// on, anything else as the source has it.
    fn entry_attr(&self, path: &Path, meta: &SourceMeta) -> Attr {
        if meta.is_file() {
            let version = Stamp::of(meta);
            if self.links.presents(path, version.size) {
                let ino = self.inodes.intern_redirect(path, version);
                let base = attr_of(ino, meta, Some(version));
                return self.shown_link(base, path, version, false).0;
            }
            if let Presented::Link(copy) = self.presented(path, version) {
                let ino = self.inodes.intern_redirect(path, version);
                return link_attr(ino, meta, version, copy.as_os_str().len());
            }
        }
        self.file_attr(path, meta)
    }

    /// The inode and attributes of `path` as the source has it.
    fn file_attr(&self, path: &Path, meta: &SourceMeta) -> Attr {
        let ino = self.inodes.intern(path, meta);
        attr_of(ino, meta, meta.is_file().then(|| Stamp::of(meta)))
    }

    /// NFS link `base.ino` to version `version` of blob `path` as it is shown now:
    /// its attributes and its text, from one record (`links.rs`). `followed`: for a
    /// READLINK, which counts as a use of the copy it names.
    fn shown_link(
        &self,
        base: Attr,
        path: &Path,
        version: Stamp,
        followed: bool,
    ) -> (Attr, Vec<u8>) {
        let (text, changed_ns) = self.link_text(base.ino, path, version, followed);
        let attr = Attr {
            atime_ns: changed_ns,
            mtime_ns: changed_ns,
            ctime_ns: changed_ns,
            ..link_attr_of(base, text.len())
        };
        (attr, text)
    }

    /// The text NFS link `ino` to version `version` of blob `path` shows now, and
    /// when that text last changed: recorded before any attributes carrying that
    /// time are handed out.
    fn link_text(&self, ino: u64, path: &Path, version: Stamp, followed: bool) -> (Vec<u8>, i64) {
        let copy = match self.copy_trusted_blocking(path) {
            true => self
                .stager
                .copy_path(path, version, Handout::Link { followed }),
            false => None,
        };
        if followed && copy.is_some() {
            Metrics::bump(&self.stager.metrics().redirects);
        }
        let text = copy.map_or_else(
            || links::alias_text(path),
            |c| c.into_os_string().into_vec(),
        );
        let changed_ns = self.links.show(ino, &text);
        (text, changed_ns)
    }

    /// [`Policy::shown_link`] off the async runtime (it may stat the copy).
    async fn shown_link_async(
        self: &Arc<Self>,
        base: Attr,
        node: Node,
        followed: bool,
    ) -> Result<(Attr, Vec<u8>), FsError> {
        let version = node.stamp.ok_or(FsError::Stale)?;
        let this = Arc::clone(self);
        self.runtime
            .spawn_blocking(move || this.shown_link(base, &node.path, version, followed))
            .await
            .map_err(|e| FsError::Read(io::Error::other(e)))
    }

    /// How version `version` of file `path` is presented; asks the store, not the source.
    fn presented(&self, path: &Path, version: Stamp) -> Presented {
        if !self.copy_trusted_blocking(path) {
            return Presented::File;
        }
        let passthrough = self.kernel_passthrough.load(Ordering::Relaxed);
        self.redirect.present(path, version, passthrough, || {
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
        // An NFS link's attributes say which text it shows: never from memory.
        let link = self.links.enabled() && self.inodes.get(ino).is_some_and(|n| n.redirect);
        let recent = match link {
            true => None,
            false => self.inodes.recent_attr(ino, age),
        };
        match recent {
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
            return match self.links.enabled() {
                true => Ok(self.shown_link_async(attr, node, false).await?.0),
                false => Ok(attr),
            };
        }
        let link = (node.redirect && self.links.enabled()).then(|| node.clone());
        // Removed or replaced through the mount: only open handles lead to it.
        if self.inodes.is_gone(ino) {
            let attr = self.inodes.known_attr(ino).ok_or(FsError::Stale)?;
            return Ok(Attr { nlink: 0, ..attr });
        }
        let path = node.path.clone();
        let recall_path = path.clone();
        let attr = self
            .ask(
                &path,
                move |p| {
                    let meta = p.stager.source().stat(&node.path)?;
                    p.stager.answers().saw(&node.path, &meta);
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
                move |p| {
                    let recalled = || p.recall_attr(ino, &recall_path);
                    p.inodes.known_attr(ino).or_else(recalled)
                },
            )
            .await;
        match link {
            Some(node) => Ok(self.shown_link_async(attr?, node, false).await?.0),
            None => attr,
        }
    }

    /// What the source said of `path` before this mount started, kept with the
    /// cache: an entry (interned as any looked up) or its absence.
    fn recall_entry(&self, path: &Path) -> Option<Known> {
        Some(match self.stager.answers().entry(path)? {
            Remembered::Entry(meta) => {
                let attr = self.entry_attr(path, &meta);
                self.inodes.remember_attr(attr);
                Known::Entry(attr)
            }
            Remembered::Absent => Known::Absent,
        })
    }

    /// The attributes of `ino` (at `path`) as kept with the cache.
    fn recall_attr(&self, ino: u64, path: &Path) -> Option<Attr> {
        let node = self.inodes.get(ino)?;
        match self.stager.answers().entry(path)? {
            Remembered::Entry(meta) => Some(attr_of(ino, &meta, node.stamp)),
            Remembered::Absent => None,
        }
    }

    /// The listing of directory `ino` (at `path`) as kept with the cache.
    fn recall_listing(&self, ino: u64, path: &Path) -> Option<Vec<DirEntry>> {
        let listed = self.stager.answers().listing(path)?;
        Some(self.listed_entries(ino, path, listed))
    }

    /// The target of link `ino`: the source's verbatim, or a redirect's copy.
    pub async fn readlink(self: &Arc<Self>, ino: u64) -> Result<Vec<u8>, FsError> {
        let node = self.node(ino)?;
        if node.redirect && self.links.enabled() {
            // Only the text: it needs no attributes remembered (a handle kept across
            // a restart may be read before any GETATTR answered).
            let version = node.stamp.ok_or(FsError::Stale)?;
            let this = Arc::clone(self);
            let text = self
                .runtime
                .spawn_blocking(move || this.link_text(ino, &node.path, version, true).0)
                .await
                .map_err(|e| FsError::Read(io::Error::other(e)))?;
            return Ok(text);
        }
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
        let recall_path = path.clone();
        let target = self
            .ask(
                &path,
                move |p| {
                    let target = p.stager.source().read_link(&node.path)?;
                    let target = target.as_os_str().as_bytes().to_vec();
                    p.inodes.remember_link(ino, &target);
                    p.stager.answers().saw_link(&node.path, &target);
                    Ok(target)
                },
                move |p| {
                    let recalled = || p.stager.answers().link(&recall_path);
                    p.inodes.known_link(ino).or_else(recalled)
                },
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
        let recall_path = path.clone();
        self.ask(
            &path,
            move |p| p.list_dir(ino, &node),
            move |p| {
                p.inodes
                    .known_listing(ino)
                    .or_else(|| p.recall_listing(ino, &recall_path))
            },
        )
        .await
    }

    fn list_dir(&self, ino: u64, node: &Node) -> Result<Vec<DirEntry>, FsError> {
        let listed = self.stager.source().read_dir(&node.path)?;
        self.stager.answers().saw_listing(&node.path, &listed);
        Ok(self.listed_entries(ino, &node.path, listed))
    }

    /// The entries of directory `ino` (at `dir`) as `listed`, the source's or kept,
    /// Finder's files left out if configured; remembered with their attributes.
    fn listed_entries(
        &self,
        ino: u64,
        dir: &Path,
        listed: Vec<(OsString, SourceMeta)>,
    ) -> Vec<DirEntry> {
        let mut entries = Vec::new();
        for (name, meta) in listed {
            if self.config.hide_finder_files && finder::is_finder_file(&name) {
                continue;
            }
            let attr = self.entry_attr(&dir.join(&name), &meta);
            // A later lookup or getattr (or one while the source is away) may be
            // answered from what the listing said.
            self.inodes.remember_attr(attr);
            entries.push(DirEntry { attr, name });
        }
        self.inodes.remember_listing(ino, &entries);
        entries
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
        } else if let Some(opened) = self.open_copy_taken_back(&node, version).await {
            opened
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

    /// `node`'s copy, if it is being taken back from NFS links (to be removed once
    /// no client can follow them), opened without holding it in the cache: a
    /// reader that came by the link's other text meanwhile reads the copy through
    /// its descriptor, which keeps the bytes after the copy is removed, and does not
    /// keep the removal waiting.
    async fn open_copy_taken_back(self: &Arc<Self>, node: &Node, version: Stamp) -> Option<Opened> {
        if !self.stager.copy_taken_back(&node.path) {
            return None;
        }
        let this = Arc::clone(self);
        let path = node.path.clone();
        let file = self
            .runtime
            .spawn_blocking(move || {
                let copy = this.stager.copy_path(&path, version, Handout::Peek)?;
                File::open(copy).ok()
            })
            .await
            .ok()??;
        Some(Opened {
            reader: Reader::Copy(Arc::new(file)),
            stamp: version,
            pin: None,
        })
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
                debug!(path = %stagefs_source::logged(&path), error = %e, "keeping a copy of a small file failed");
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
        info!(path = %stagefs_source::logged(&node.path), "the source does not respond; serving the stored copy");
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
mod tests;
