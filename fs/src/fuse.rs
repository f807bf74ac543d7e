//! The `fuser::Filesystem` implementation: each handler hands its work to the runtime
//! and replies from there; errors become errno only through [`FsError::errno`].

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, IoctlFlags,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs, Request,
};
use stagefs_cache::copy::read_at_most;
use stagefs_cache::prefetch::Prefetcher;
use stagefs_cache::store::Pin;
use stagefs_cache::{Metrics, StageError, Staged, Stager, Stamp, StoreError};
use tokio::runtime::Handle;
use tracing::{debug, info, warn};

use crate::attr::{attr_of, kind_of};
use crate::error::FsError;
use crate::handles::{DirEntry, Handles, OpenFile};
use crate::inodes::{Inodes, Node, ROOT_INO};
use crate::passthrough::Passthrough;
use crate::platform;
use crate::redirect::{Presented, RedirectPolicy};
use crate::{FsConfig, OnFull};

/// A mounted mirror of the stager's source.
#[derive(Debug)]
pub struct StageFs {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    stager: Stager,
    config: FsConfig,
    runtime: Handle,
    inodes: Inodes,
    files: Handles<OpenFile>,
    dirs: Handles<Vec<DirEntry>>,
    passthrough: Passthrough,
    redirect: RedirectPolicy,
    prefetcher: Option<Arc<Prefetcher>>,
    /// Set when a source operation timed out, cleared when one completes: while set,
    /// requests that can be answered from memory are, at once, instead of each
    /// waiting out the timeout again.
    source_unresponsive: AtomicBool,
    /// Whether a request is already finding out if the source is back.
    probing: AtomicBool,
}

/// An open file ready to be handed to the kernel.
struct Opened {
    file: Arc<File>,
    stamp: Stamp,
    /// Present for staged copies, absent for files read from the source.
    pin: Option<Arc<Pin>>,
}

impl StageFs {
    /// A filesystem serving `stager`'s source; its work runs on `runtime`.
    pub fn new(stager: Stager, config: FsConfig, runtime: Handle) -> Self {
        let prefetcher = config
            .prefetch
            .map(|parallel| Prefetcher::new(stager.clone(), parallel, config.min_stage_size));
        StageFs {
            shared: Arc::new(Shared {
                prefetcher,
                source_unresponsive: AtomicBool::new(false),
                probing: AtomicBool::new(false),
                stager,
                runtime,
                inodes: Inodes::new(),
                files: Handles::new(),
                dirs: Handles::new(),
                passthrough: Passthrough::new(),
                redirect: RedirectPolicy::new(&config),
                config,
            }),
        }
    }

    /// Runs blocking `work` on the runtime's blocking pool and passes its outcome to
    /// `respond`; a source that does not answer within the timeout gets EIO.
    fn serve<T, W, R>(&self, op: &'static str, work: W, respond: R)
    where
        T: Send + 'static,
        W: FnOnce(&Shared) -> Result<T, FsError> + Send + 'static,
        R: FnOnce(Result<T, Errno>) + Send + 'static,
    {
        self.serve_or_recall(op, work, |_| None, respond);
    }

    /// Like [`StageFs::serve`], but when the source times out, answers from what
    /// `recall` remembers of it, if anything (so staged models stay usable while the
    /// NAS is away).
    fn serve_or_recall<T, W, F, R>(&self, op: &'static str, work: W, recall: F, respond: R)
    where
        T: Send + 'static,
        W: FnOnce(&Shared) -> Result<T, FsError> + Send + 'static,
        F: FnOnce(&Shared) -> Option<T> + Send + 'static,
        R: FnOnce(Result<T, Errno>) + Send + 'static,
    {
        let shared = Arc::clone(&self.shared);
        if shared.source_unresponsive.load(Ordering::Relaxed) {
            if let Some(known) = recall(&shared) {
                respond(Ok(known));
                shared.probe();
                return;
            }
            self.serve_timed(op, work, |_| None, respond);
            return;
        }
        self.serve_timed(op, work, recall, respond);
    }

    fn serve_timed<T, W, F, R>(&self, op: &'static str, work: W, recall: F, respond: R)
    where
        T: Send + 'static,
        W: FnOnce(&Shared) -> Result<T, FsError> + Send + 'static,
        F: FnOnce(&Shared) -> Option<T> + Send + 'static,
        R: FnOnce(Result<T, Errno>) + Send + 'static,
    {
        let shared = Arc::clone(&self.shared);
        let limit = shared.config.source_timeout;
        self.shared.runtime.spawn(async move {
            let worker = Arc::clone(&shared);
            let task = tokio::task::spawn_blocking(move || work(&worker));
            let result = match tokio::time::timeout(limit, task).await {
                Ok(Ok(result)) => {
                    // A network client may have answered from its own cache: only
                    // the probe can tell that the source itself is back.
                    if shared.source_unresponsive.load(Ordering::Relaxed) {
                        shared.probe();
                    }
                    result
                }
                Ok(Err(e)) => Err(FsError::Read(io::Error::other(e))),
                Err(_) => {
                    shared.source_timed_out();
                    match recall(&shared) {
                        Some(known) => Ok(known),
                        None => Err(FsError::SourceTimeout {
                            path: std::path::PathBuf::from(op),
                            secs: limit.as_secs(),
                        }),
                    }
                }
            };
            respond(result.map_err(|e| errno_logged(op, &e)));
        });
    }
}

fn errno_logged(op: &'static str, e: &FsError) -> Errno {
    if e.is_expected() {
        debug!(op, error = %e);
    } else {
        warn!(op, error = %e);
    }
    e.errno()
}

impl Shared {
    fn source_timed_out(&self) {
        if !self.source_unresponsive.swap(true, Ordering::Relaxed) {
            warn!(
                source = %self.stager.source().root().display(),
                "the source did not respond; answering from what it said last where possible"
            );
        }
    }

    fn source_answered(&self) {
        if self.source_unresponsive.swap(false, Ordering::Relaxed) {
            info!(source = %self.stager.source().root().display(), "the source responds again");
        }
    }

    /// Finds out in the background, one probe at a time, whether the source is back.
    /// It asks for the source's statfs: sshfs, NFS and SMB clients answer stats and
    /// lookups from their own caches while the server is gone, but send statfs to it,
    /// so a cached answer cannot make a dead source look alive.
    fn probe(self: &Arc<Self>) {
        if self.probing.swap(true, Ordering::Relaxed) {
            return;
        }
        let shared = Arc::clone(self);
        self.runtime.spawn_blocking(move || {
            if stagefs_cache::sys::statvfs(shared.stager.source().root()).is_ok() {
                shared.source_answered();
            }
            shared.probing.store(false, Ordering::Relaxed);
        });
    }

    fn node(&self, ino: INodeNo) -> Result<Node, FsError> {
        self.inodes.get(ino.0).ok_or(FsError::UnknownInode(ino.0))
    }

    fn lookup(&self, parent: INodeNo, name: &OsStr) -> Result<FileAttr, FsError> {
        let path = self.node(parent)?.path.join(name);
        let meta = self.stager.source().stat(&path)?;
        let attr = self.entry_attr(&path, &meta);
        self.inodes.remember_attr(attr);
        Ok(attr)
    }

    /// The inode and attributes `path` is presented with: a staged file as a link to
    /// its copy where redirects are on, anything else as the source has it.
    fn entry_attr(&self, path: &Path, meta: &std::fs::Metadata) -> FileAttr {
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
        self.redirect
            .present(version, self.passthrough.active(), || {
                self.stager.redirect_target(path, version, false)
            })
    }

    /// The target of redirect `node`, marking its copy in use; None if the copy is
    /// gone or changed since the link was handed out.
    fn redirect_target(&self, node: &Node) -> Option<Vec<u8>> {
        let version = node.stamp?;
        let copy = self.stager.redirect_target(&node.path, version, true)?;
        Metrics::bump(&self.stager.metrics().redirects);
        Some(copy.into_os_string().into_vec())
    }

    fn recall_lookup(&self, parent: INodeNo, name: &OsStr) -> Option<FileAttr> {
        let path = self.inodes.get(parent.0)?.path.join(name);
        self.inodes.known_attr_of_path(&path)
    }

    fn getattr(&self, ino: INodeNo) -> Result<FileAttr, FsError> {
        let node = self.node(ino)?;
        // A redirect stands for one version; what it is does not depend on the source.
        if node.redirect
            && let Some(attr) = self.inodes.known_attr(ino.0)
        {
            return Ok(attr);
        }
        let meta = self.stager.source().stat(&node.path)?;
        let attr = attr_of(ino.0, &meta, node.stamp);
        self.inodes.remember_attr(attr);
        Ok(attr)
    }

    fn readlink(&self, ino: INodeNo) -> Result<Vec<u8>, FsError> {
        let node = self.node(ino)?;
        let target = self.stager.source().read_link(&node.path)?;
        let target = target.as_os_str().as_bytes().to_vec();
        self.inodes.remember_link(ino.0, &target);
        Ok(target)
    }

    fn list_dir(&self, ino: INodeNo) -> Result<Vec<DirEntry>, FsError> {
        let node = self.node(ino)?;
        if node.stamp.is_some() {
            return Err(FsError::NotADirectory);
        }
        let parent_ino = node
            .path
            .parent()
            .and_then(|p| self.inodes.dir_ino(p))
            .unwrap_or(ROOT_INO);
        let mut entries = vec![dot_entry(ino.0, "."), dot_entry(parent_ino, "..")];
        for (name, meta) in self.stager.source().read_dir(&node.path)? {
            let attr = self.entry_attr(&node.path.join(&name), &meta);
            if attr.kind != kind_of(&meta) {
                // A redirect: a lookup of it may be answered from memory later.
                self.inodes.remember_attr(attr);
            }
            entries.push(DirEntry {
                ino: attr.ino.0,
                kind: attr.kind,
                name,
            });
        }
        self.inodes.remember_listing(ino.0, &entries);
        Ok(entries)
    }

    /// Opens `node` for reading: small files straight from the source, large ones
    /// from a complete staged copy (waiting for the copy if there is none yet).
    async fn open(&self, node: &Node) -> Result<Opened, FsError> {
        let version = node.stamp.ok_or(FsError::NotADirectory)?;
        let opened = if version.size < self.config.min_stage_size {
            self.open_small(node, version).await?
        } else {
            match self.stage_or_recall(node, version).await {
                Ok(staged) => Opened {
                    stamp: staged.stamp,
                    file: staged.file,
                    pin: Some(staged.pin),
                },
                Err(FsError::Stage(e @ StageError::Store(StoreError::NoRoom { .. })))
                    if self.config.on_full == OnFull::ReadSource =>
                {
                    warn!(error = %e, "serving the file from the source (--on-full passthrough)");
                    self.open_source(&node.path).await?
                }
                Err(e) => return Err(e),
            }
        };
        // The inode promised `version`; a newer one must come through a fresh lookup.
        if opened.stamp != version {
            return Err(FsError::Stale);
        }
        Ok(opened)
    }

    /// Stages `node`, unless the copy stops making progress for the source timeout:
    /// then a stored copy of exactly this version is served if there is one (the
    /// source may be gone, the model is still here), else the open fails with EIO.
    async fn stage_or_recall(&self, node: &Node, version: Stamp) -> Result<Staged, FsError> {
        let limit = self.config.source_timeout;
        let known_down = self.source_unresponsive.load(Ordering::Relaxed);
        if !known_down {
            tokio::select! {
                staged = self.stager.stage(&node.path) => return staged.map_err(FsError::from),
                () = stalled(&self.stager, &node.path, limit) => self.source_timed_out(),
            }
        }
        self.recall_stored(node, version)
            .await
            .ok_or_else(|| FsError::SourceTimeout {
                path: node.path.clone(),
                secs: limit.as_secs(),
            })
    }

    /// Small files (configs, tokenizers, refs) are read from the source, so they are
    /// never staler than it. A copy is kept in the background and served while the
    /// source does not respond, so a staged model still loads with the NAS away.
    async fn open_small(&self, node: &Node, version: Stamp) -> Result<Opened, FsError> {
        if !self.source_unresponsive.load(Ordering::Relaxed) {
            match self.open_source(&node.path).await {
                Ok(opened) => {
                    self.keep_copy(&node.path, opened.stamp);
                    return Ok(opened);
                }
                Err(FsError::SourceTimeout { .. }) => self.source_timed_out(),
                Err(e) => return Err(e),
            }
        }
        match self.recall_stored(node, version).await {
            Some(staged) => Ok(Opened {
                stamp: staged.stamp,
                file: staged.file,
                pin: Some(staged.pin),
            }),
            None => Err(FsError::SourceTimeout {
                path: node.path.clone(),
                secs: self.config.source_timeout.as_secs(),
            }),
        }
    }

    /// Stores a copy of small file `path` unless this version is already stored; like
    /// a prefetch, it never evicts anything and yields to opens.
    fn keep_copy(&self, path: &Path, version: Stamp) {
        let (stager, path) = (self.stager.clone(), path.to_path_buf());
        self.runtime.spawn(async move {
            let lookup = stager.clone();
            let lookup_path = path.clone();
            let stored =
                tokio::task::spawn_blocking(move || lookup.stored(&lookup_path, version).is_some())
                    .await;
            if matches!(stored, Ok(false))
                && let Err(e) = stager.keep(&path).await
            {
                debug!(path = %path.display(), error = %e, "keeping a copy of a small file failed");
            }
        });
    }

    /// A stored copy of exactly `version` of `node`, asking the source nothing.
    async fn recall_stored(&self, node: &Node, version: Stamp) -> Option<Staged> {
        let (stager, path) = (self.stager.clone(), node.path.clone());
        let recalled = self
            .runtime
            .spawn_blocking(move || stager.stored(&path, version))
            .await;
        let staged = recalled.ok().flatten()?;
        warn!(path = %node.path.display(), "the source does not respond; serving the stored copy");
        Some(staged)
    }

    async fn open_source(&self, path: &Path) -> Result<Opened, FsError> {
        let source = self.stager.source().clone();
        let path = path.to_path_buf();
        let worker_path = path.clone();
        let opened = self
            .runtime
            .spawn_blocking(move || -> Result<Opened, FsError> {
                let file = source.open(&worker_path)?;
                let meta = file.metadata().map_err(FsError::Read)?;
                Ok(Opened {
                    stamp: Stamp::of(&meta),
                    file: Arc::new(file),
                    pin: None,
                })
            });
        match tokio::time::timeout(self.config.source_timeout, opened).await {
            Ok(joined) => joined.map_err(|e| FsError::Read(io::Error::other(e)))?,
            Err(_) => Err(FsError::SourceTimeout {
                path,
                secs: self.config.source_timeout.as_secs(),
            }),
        }
    }

    fn read(&self, fh: FileHandle, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        Metrics::bump(&self.stager.metrics().daemon_reads);
        let open = self.files.get(fh.0).ok_or(FsError::UnknownHandle(fh.0))?;
        read_at_most(&open.file, offset, size as usize, |_| {}).map_err(FsError::Read)
    }

    fn statfs(&self) -> Result<libc::statvfs, FsError> {
        stagefs_cache::sys::statvfs(self.stager.source().root()).map_err(FsError::Read)
    }

    fn reply_opened(&self, ino: INodeNo, opened: Opened, reply: ReplyOpen) {
        let metrics = self.stager.metrics();
        let staged = opened.pin.is_some();
        let backing = if staged && self.config.passthrough {
            self.passthrough.backing(ino.0, &opened.file, &reply)
        } else {
            None
        };
        let counter = match (&backing, staged) {
            (Some(_), _) => &metrics.passthrough_opens,
            (None, true) => &metrics.daemon_opens,
            (None, false) => &metrics.source_opens,
        };
        Metrics::bump(counter);
        let fh = self.files.insert(OpenFile {
            file: opened.file,
            _backing: backing.clone(),
            _pin: opened.pin,
        });
        match backing {
            // The kernel refuses any other open flag with passthrough (the page cache
            // is the backing file's own, kept across opens anyway).
            Some(id) => reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id),
            // An inode is one immutable version, so its page cache stays valid across opens.
            None => reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE),
        }
    }
}

/// The attributes of a link to staged copy `copy` standing for `version` of a file
/// whose source metadata is `meta`.
fn link_attr(ino: u64, meta: &std::fs::Metadata, version: Stamp, copy: &Path) -> FileAttr {
    let mut attr = attr_of(ino, meta, Some(version));
    attr.kind = FileType::Symlink;
    attr.size = copy.as_os_str().len() as u64;
    attr.blocks = 0;
    attr.perm = 0o777;
    attr.nlink = 1;
    attr
}

/// Returns once the copy of `path` has made no progress for `limit`.
async fn stalled(stager: &Stager, path: &Path, limit: std::time::Duration) {
    let tick = limit.min(std::time::Duration::from_millis(250));
    let mut last = None;
    let mut since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(tick).await;
        let copied = stager
            .in_flight()
            .into_iter()
            .find(|f| f.path == path)
            .map(|f| f.read);
        if copied != last {
            last = copied;
            since = tokio::time::Instant::now();
        } else if since.elapsed() >= limit {
            return;
        }
    }
}

// The statvfs field types differ per platform (u32 block counts on macOS).
#[allow(clippy::unnecessary_cast)]
fn reply_statfs(reply: ReplyStatfs, st: &libc::statvfs) {
    reply.statfs(
        st.f_blocks as u64,
        st.f_bfree as u64,
        st.f_bavail as u64,
        st.f_files as u64,
        st.f_ffree as u64,
        st.f_bsize as u32,
        st.f_namemax as u32,
        st.f_frsize as u32,
    );
}

fn dot_entry(ino: u64, name: &str) -> DirEntry {
    DirEntry {
        ino,
        kind: FileType::Directory,
        name: name.into(),
    }
}

impl Filesystem for StageFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        self.shared
            .passthrough
            .negotiate(self.shared.config.passthrough, config);
        if self.shared.redirect.enabled() {
            info!(
                "staged files are presented as links to their local copies where kernel passthrough does not serve them"
            );
        }
        platform::tune_kernel(config);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = name.to_owned();
        let ttl = self.shared.config.attr_ttl;
        let recalled = name.clone();
        self.serve_or_recall(
            "lookup",
            move |s| s.lookup(parent, &name),
            move |s| s.recall_lookup(parent, &recalled),
            move |r| match r {
                Ok(attr) => reply.entry(&ttl, &attr, Generation(0)),
                Err(e) => reply.error(e),
            },
        );
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let ttl = self.shared.config.attr_ttl;
        self.serve_or_recall(
            "getattr",
            move |s| s.getattr(ino),
            move |s| s.inodes.known_attr(ino.0),
            move |r| match r {
                Ok(attr) => reply.attr(&ttl, &attr),
                Err(e) => reply.error(e),
            },
        );
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        if let Some(node) = self.shared.inodes.get(ino.0).filter(|n| n.redirect) {
            // Needs only the store, never the source: answered even while it is away.
            let shared = Arc::clone(&self.shared);
            self.shared.runtime.spawn_blocking(move || {
                match shared.redirect_target(&node) {
                    Some(target) => reply.data(&target),
                    // Evicted or changed since the link was handed out: the kernel
                    // looks the path up again and finds the file to stage.
                    None => reply.error(errno_logged("readlink", &FsError::Stale)),
                }
            });
            return;
        }
        self.serve_or_recall(
            "readlink",
            move |s| s.readlink(ino),
            move |s| s.inodes.known_link(ino.0),
            move |r| match r {
                Ok(target) => reply.data(&target),
                Err(e) => reply.error(e),
            },
        );
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            reply.error(errno_logged("open", &FsError::ReadOnly));
            return;
        }
        let shared = Arc::clone(&self.shared);
        self.shared.runtime.spawn(async move {
            let opened = match shared.node(ino) {
                Ok(node) => {
                    // Siblings start copying while this file stages.
                    if let Some(prefetcher) = &shared.prefetcher {
                        prefetcher.on_open(&node.path, &shared.runtime);
                    }
                    shared.open(&node).await
                }
                Err(e) => Err(e),
            };
            match opened {
                Ok(opened) => shared.reply_opened(ino, opened, reply),
                Err(e) => reply.error(errno_logged("open", &e)),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.serve(
            "read",
            move |s| s.read(fh, offset, size),
            move |r| match r {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(e),
            },
        );
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.shared.files.remove(fh.0);
        reply.ok();
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing is ever written, so there is nothing to flush.
        reply.ok();
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        // Callers probe files with ioctls (isatty's TCGETS); a plain file answers ENOTTY.
        reply.error(Errno::ENOTTY);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // The handle is made in `respond`: a listing that arrives after its timeout
        // was answered from memory is dropped instead of leaving a handle behind.
        let shared = Arc::clone(&self.shared);
        self.serve_or_recall(
            "opendir",
            move |s| s.list_dir(ino),
            move |s| s.inodes.known_listing(ino.0),
            move |r| match r {
                Ok(entries) => {
                    let fh = shared.dirs.insert(entries);
                    reply.opened(FileHandle(fh), FopenFlags::empty());
                }
                Err(e) => reply.error(e),
            },
        );
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let Some(entries) = self.shared.dirs.get(fh.0) else {
            reply.error(errno_logged("readdir", &FsError::UnknownHandle(fh.0)));
            return;
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, entry) in entries.iter().enumerate().skip(start) {
            if reply.add(INodeNo(entry.ino), i as u64 + 1, entry.kind, &entry.name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.shared.dirs.remove(fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.serve(
            "statfs",
            |s| s.statfs(),
            move |r| match r {
                Ok(st) => reply_statfs(reply, &st),
                Err(e) => reply.error(e),
            },
        );
    }
}
