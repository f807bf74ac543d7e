//! The write path: what a mount does with create, write, truncate, chmod, utimes,
//! rename, unlink, mkdir, rmdir, symlink and fsync, in no protocol's terms.
//!
//! Every change passes through to the source, on the source pool under the source
//! timeout, like reads: a dead source fails the writer with EIO within the timeout
//! (at once when every source thread is stuck), a full one with ENOSPC, and any other
//! errno of the source (EACCES, EEXIST, ENOTEMPTY) is the writer's. Nothing is written
//! anywhere but the source: no temporary file, no copy (not yet staged as written).
//!
//! The policy's tables follow: a rename moves the names (and every inode under a
//! renamed directory), a removal forgets them, a file written through the mount is
//! a *live* inode that follows its file instead of standing for one version, and
//! every path changed is tainted (`taint.rs`) until its stored copy is removed.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use stagefs_source::{
    CreateFile, SetTime, SourceError, SourceMeta, SourceTree, Stamp, WritableFile, WriteOpen,
};

use super::Policy;
use crate::attr::{Attr, attr_of};
use crate::error::FsError;
use crate::finder;
use crate::handles::{OpenFile, Reader, Writer};
use crate::taint::Trust;
use crate::tee::Tee;

/// How often, and how many times, the copy of a removed file is asked to go while
/// something holds it.
const DROP_RETRY: std::time::Duration = std::time::Duration::from_millis(500);
const DROP_TRIES: u32 = 240;

/// Who asks for a change: new entries are given to them when the daemon runs as
/// root (otherwise they belong to the daemon's user, the only one let in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    /// The caller's user id.
    pub uid: u32,
    /// The caller's group id.
    pub gid: u32,
}

/// The attribute changes of a setattr; None leaves one as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// New permission bits.
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate or extend).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<SetTime>,
    /// New modification time.
    pub mtime: Option<SetTime>,
}

/// How a rename may treat an existing target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenameHow {
    /// Fail with EEXIST rather than replace the target.
    pub no_replace: bool,
}

impl Policy {
    fn writable(&self) -> Result<(), FsError> {
        if self.config.read_only {
            Err(FsError::ReadOnly)
        } else {
            Ok(())
        }
    }

    /// The path of `name` in directory `parent`, for a change there.
    fn child(&self, parent: u64, name: &OsStr) -> Result<PathBuf, FsError> {
        self.writable()?;
        let dir = self.node(parent)?;
        if dir.stamp.is_some() {
            return Err(FsError::NotADirectory);
        }
        if self.config.hide_finder_files && finder::is_finder_file(name) {
            return Err(FsError::NotPermitted);
        }
        Ok(dir.path.join(name))
    }

    /// Owner and group to give a new entry: the caller's when the daemon is root.
    fn owner_for(caller: Caller) -> Option<(u32, u32)> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        (root && (caller.uid, caller.gid) != (0, 0)).then_some((caller.uid, caller.gid))
    }

    /// Runs `work` on the source pool under the source timeout.
    async fn change<T: Send + 'static>(
        self: &Arc<Self>,
        what: &Path,
        work: impl FnOnce(&Policy) -> Result<T, FsError> + Send + 'static,
    ) -> Result<T, FsError> {
        let worker = Arc::clone(self);
        // The whole timeout even while the source is known to be away: a change that
        // gave up early could still land once the source is back, after its caller
        // was told it failed.
        match self.pool().run(move || work(&worker)).await {
            Ok(Err(e)) if e.is_source_away() => {
                self.source_away(&e);
                self.probe();
                Err(e)
            }
            Ok(result) => {
                self.probe_if_down();
                result
            }
            Err(_) => {
                self.source_timed_out();
                Err(self.timeout_error(what))
            }
        }
    }

    /// The attributes of new entry `path` as the source describes it.
    fn new_entry(&self, path: &Path, meta: &SourceMeta) -> Attr {
        self.inodes.created(path);
        self.stager.answers().made(path);
        let attr = self.entry_attr(path, meta);
        if meta.is_file() {
            self.inodes.set_live(attr.ino);
        }
        self.inodes.remember_attr(attr);
        attr
    }

    fn writer_handle(&self, ino: u64, file: Box<dyn WritableFile>, tee: Option<Tee>) -> u64 {
        let file: Arc<dyn WritableFile> = Arc::from(file);
        self.files.insert(OpenFile {
            reader: Reader::Source(file.clone()),
            _keep: None,
            _pin: None,
            writer: Some(Writer {
                file,
                ino,
                tee,
                wrote: Default::default(),
            }),
        })
    }

    /// A tee for a handle that has `path` to itself and starts it empty (`size`).
    fn tee_for(&self, path: &Path, size: u64, opened_at: u64) -> Option<Tee> {
        let alone = self.taints.writers_of(path) == 1;
        (size == 0 && alone).then(|| Tee::new(self.stager.tee(path), opened_at))
    }

    /// Creates (or, unless exclusive, opens) regular file `name` in `parent` and
    /// opens it for writing: its attributes and a handle.
    pub async fn create(
        self: &Arc<Self>,
        parent: u64,
        name: &OsStr,
        how: CreateFile,
        caller: Caller,
    ) -> Result<(Attr, u64), FsError> {
        let path = self.child(parent, name)?;
        let opened_at = self.taints.writer_opened(&path, true);
        let work_path = path.clone();
        let created = self
            .change(&path, move |p| {
                let source = p.stager.source();
                let file = source.create(&work_path, how)?;
                if let Some((uid, gid)) = Self::owner_for(caller) {
                    source.set_owner(&work_path, Some(uid), Some(gid))?;
                }
                let meta = file.meta().map_err(FsError::Read)?;
                Ok((file, meta))
            })
            .await;
        let (file, meta) = match created {
            Ok(created) => created,
            Err(e) => {
                self.taints.writer_closed(&path, false);
                return Err(e);
            }
        };
        let attr = self.new_entry(&path, &meta);
        let tee = self.tee_for(&path, meta.size, opened_at);
        Ok((attr, self.writer_handle(attr.ino, file, tee)))
    }

    /// Opens existing regular file `ino` for writing (and reading, with `how.read`).
    pub async fn open_write(self: &Arc<Self>, ino: u64, how: WriteOpen) -> Result<u64, FsError> {
        self.writable()?;
        let node = self.node(ino)?;
        if node.stamp.is_none() {
            return Err(FsError::IsADirectory);
        }
        let opened_at = self.taints.writer_opened(&node.path, how.truncate);
        self.inodes.set_live(ino);
        let path = node.path.clone();
        let opened = self
            .change(&path, move |p| {
                let file = p.stager.source().open_write(&node.path, how)?;
                let meta = file.meta().map_err(FsError::Read)?;
                p.inodes.restamp(ino, Stamp::of(&meta));
                p.inodes.remember_attr(attr_of(ino, &meta, None));
                Ok((file, meta.size))
            })
            .await;
        match opened {
            Ok((file, size)) => {
                let tee = self.tee_for(&path, size, opened_at);
                Ok(self.writer_handle(ino, file, tee))
            }
            Err(e) => {
                self.taints.writer_closed(&path, false);
                Err(e)
            }
        }
    }

    /// Writes `data` at `offset` through handle `fh`; the bytes written.
    pub async fn write(
        self: &Arc<Self>,
        fh: u64,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<u32, FsError> {
        let open = self.files.get(fh).ok_or(FsError::UnknownHandle(fh))?;
        let Some(writer) = &open.writer else {
            return Err(FsError::NotOpenForWriting);
        };
        let (file, ino) = (Arc::clone(&writer.file), writer.ino);
        let path = self.node(ino).map(|n| n.path).unwrap_or_default();
        // Before the attempt: a write that fails may still have landed in part.
        if !writer
            .wrote
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            self.taints.first_write(&path);
        }
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        let work_path = path.clone();
        let handle = Arc::clone(&open);
        let written = self
            .change(&path, move |_| {
                let written = file.write_all_at(&data, offset);
                // The same bytes into the local copy, once the source has them.
                if let Some(tee) = tee_of(&handle) {
                    match &written {
                        Ok(()) => tee.write(&data, offset),
                        Err(_) => tee.abandon(),
                    }
                }
                written.map_err(|e| FsError::Source(SourceError::write(&work_path, e)))
            })
            .await;
        if written.is_err()
            && let Some(tee) = tee_of(&open)
        {
            // (Timed out: the write may still land, or not.)
            tee.abandon();
        }
        written?;
        let metrics = self.stager.metrics();
        metrics
            .bytes_written
            .fetch_add(u64::from(len), std::sync::atomic::Ordering::Relaxed);
        Ok(len)
    }

    /// Makes what handle `fh` wrote durable on the source.
    pub async fn fsync(self: &Arc<Self>, fh: u64, data_only: bool) -> Result<(), FsError> {
        let open = self.files.get(fh).ok_or(FsError::UnknownHandle(fh))?;
        let Some(writer) = &open.writer else {
            // Nothing was written through a read handle.
            return Ok(());
        };
        self.on_written_file(writer, move |file| file.sync(data_only))
            .await
    }

    /// Runs `op` on `writer`'s file on the source, as a change of its path (on the
    /// source pool, under the timeout).
    async fn on_written_file(
        self: &Arc<Self>,
        writer: &Writer,
        op: impl FnOnce(&dyn WritableFile) -> std::io::Result<()> + Send + 'static,
    ) -> Result<(), FsError> {
        let file = Arc::clone(&writer.file);
        let path = self.node(writer.ino).map(|n| n.path).unwrap_or_default();
        let work_path = path.clone();
        self.change(&path, move |_| {
            op(file.as_ref()).map_err(|e| FsError::Source(SourceError::write(&work_path, e)))
        })
        .await
    }

    /// A descriptor of handle `fh` was closed (FUSE's flush): what the handle wrote
    /// is handed to the source itself, and the close fails if it did not get there.
    /// A write is answered once the source's client took it, which for a network
    /// filesystem (sshfs, NFS) is before the server has it: those clients report a
    /// write the server never got only at a close. The handle's own file is closed
    /// later, off the request loop, where nobody hears its error; without this a
    /// writer whose link died after its last write would be told its file was
    /// written (measured: sshfs had 2 MiB of answered writes still to send at 40
    /// mbit). A failed flush drops the handle's local copy: the source may not hold
    /// what it saw.
    pub async fn flush(self: &Arc<Self>, fh: u64) -> Result<(), FsError> {
        // Nothing was written through a read handle (nor one unknown here).
        let Some(open) = self.files.get(fh) else {
            return Ok(());
        };
        let Some(writer) = &open.writer else {
            return Ok(());
        };
        let flushed = self.on_written_file(writer, |file| file.flush()).await;
        if flushed.is_err()
            && let Some(tee) = tee_of(&open)
        {
            tee.abandon();
        }
        flushed
    }

    /// A handle writing to `ino` was closed: its file is tainted anew (what it wrote
    /// may have left a stale copy's stamp). The inode, being live, takes the file's
    /// new version at its next lookup, getattr or open.
    pub(super) fn writer_released(&self, writer: &Writer) {
        let Ok(node) = self.node(writer.ino) else {
            return;
        };
        // Nothing else changed it: no taint since its open, and no other handle open
        // on it sent a write (one that only reads or syncs changes nothing).
        let untouched = writer.tee.as_ref().is_some_and(|tee| {
            self.taints.latest(&node.path) == tee.baseline()
                && self.taints.writers_that_wrote(&node.path) <= 1
        });
        let wrote = writer.wrote.load(std::sync::atomic::Ordering::Relaxed);
        let closed_at = self.taints.writer_closed(&node.path, wrote);
        if let Some(tee) = &writer.tee {
            let file = Arc::clone(&writer.file);
            self.tees
                .closed(writer.ino, node.path, tee, file, untouched, Some(closed_at));
        }
    }

    /// Changes the attributes of `ino` (through handle `fh`, if given, for a size).
    pub async fn setattr(
        self: &Arc<Self>,
        ino: u64,
        fh: Option<u64>,
        change: SetAttr,
    ) -> Result<Attr, FsError> {
        self.writable()?;
        let node = self.node(ino)?;
        let handle = fh.and_then(|fh| self.files.get(fh));
        let tee = handle
            .as_ref()
            .and_then(|h| h.writer.as_ref()?.tee.as_ref());
        if let (Some(size), Some(tee)) = (change.size, tee) {
            tee.set_len(size);
        }
        let writer = handle
            .as_ref()
            .and_then(|open| open.writer.as_ref().map(|w| Arc::clone(&w.file)));
        if self.inodes.is_gone(ino) && (writer.is_none() || change != size_only(change.size)) {
            // Its name now leads elsewhere (or nowhere).
            return Err(FsError::Stale);
        }
        let is_file = node.stamp.is_some();
        let versioned = change.size.is_some() || change.mtime.is_some();
        // A change through a tee's handle with nothing else changing the file in
        // between is the tee's own: its copy stands (see `Tee::rebase`).
        let mut own = false;
        if is_file && versioned {
            own = self.taint_for(&node.path, tee, true).1;
            self.inodes.set_live(ino);
        }
        let path = node.path.clone();
        let attr = self
            .change(&path, move |p| {
                let source = p.stager.source();
                let path = &node.path;
                if let Some(size) = change.size {
                    match &writer {
                        Some(file) => file
                            .set_len(size)
                            .map_err(|e| SourceError::write(path, e))?,
                        None => source.set_len(path, size)?,
                    }
                }
                if let Some(mode) = change.mode {
                    source.set_mode(path, mode)?;
                }
                if change.uid.is_some() || change.gid.is_some() {
                    source.set_owner(path, change.uid, change.gid)?;
                }
                if change.atime.is_some() || change.mtime.is_some() {
                    source.set_times(path, change.atime, change.mtime)?;
                }
                let meta = match &writer {
                    Some(file) => file.meta().map_err(FsError::Read)?,
                    None => source.stat(path)?,
                };
                if meta.is_file() {
                    p.inodes.set_live(ino);
                    p.inodes.restamp(ino, Stamp::of(&meta));
                }
                let attr = attr_of(ino, &meta, None);
                p.inodes.remember_attr(attr);
                Ok(attr)
            })
            .await;
        if is_file && versioned {
            // Tainted again after the change, so a copy made meanwhile is not trusted.
            self.taint_for(&path, tee, own);
        }
        attr
    }

    /// Renames `name` in `parent` to `new_name` in `new_parent`, replacing an
    /// existing target (its inodes are forgotten; open handles keep their files).
    pub async fn rename(
        self: &Arc<Self>,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        how: RenameHow,
    ) -> Result<(), FsError> {
        let from = self.child(parent, name)?;
        let to = self.child(new_parent, new_name)?;
        // Asked before this rename taints it.
        let carry = self
            .tees
            .unchanged_since_close(&from, self.taints.latest(&from));
        // A handle still filling a copy of `from`: a writer's close may reach the
        // daemon after its rename (FUSE sends RELEASE on its own time), and the copy
        // then follows the file to its new name, if nothing else changed it.
        let filling = self.open_tee_of(&from);
        let tee = filling.as_deref().and_then(tee_of);
        let own = self.taint_for(&from, tee, true).1;
        let before = self.taints.taint(&to);
        if own && let Some(tee) = tee {
            // Its file is at `to` once renamed: so is its baseline.
            tee.rebase(before);
        }
        let (work_from, work_to) = (from.clone(), to.clone());
        self.change(&from, move |p| {
            p.stager
                .source()
                .rename(&work_from, &work_to, how.no_replace)?;
            let moved = p.inodes.latest_ino(&work_from);
            p.inodes.rename(&work_from, &work_to);
            p.stager.answers().removed(&work_from);
            p.stager.answers().forget(&work_to);
            p.stager.answers().made(&work_to);
            p.taints.writers_renamed(&work_from, &work_to);
            if let Some(ino) = moved {
                p.tees.renamed(ino, &work_to);
            }
            Ok(())
        })
        .await?;
        self.taints.taint(&from);
        let generation = self.taint_for(&to, tee, own).0;
        if carry {
            // A temp name's copy, staged as written, is the final name's now.
            self.tees.carry_over(&from, &to, generation);
        }
        // A copy of what was at `from` serves no path (once carried over, if it is).
        self.drop_copy(&from, carry.then_some(to)).await;
        Ok(())
    }

    /// Removes file or link `name` from `parent`.
    pub async fn unlink(self: &Arc<Self>, parent: u64, name: &OsStr) -> Result<(), FsError> {
        let path = self.child(parent, name)?;
        self.taints.taint(&path);
        let work_path = path.clone();
        self.change(&path, move |p| {
            p.stager.source().unlink(&work_path)?;
            p.inodes.forget(&work_path);
            p.stager.answers().removed(&work_path);
            Ok(())
        })
        .await?;
        self.drop_copy(&path, None).await;
        Ok(())
    }

    /// Removes the stored copy of `path`, which is gone from the source, once
    /// nothing holds it (a reader, a link followed a moment ago); meanwhile its taint
    /// keeps it from being served. Gives up after a while: eviction then takes it.
    /// `after`: a path whose copy in flight is taking this one's, waited for first.
    async fn drop_copy(self: &Arc<Self>, path: &Path, after: Option<PathBuf>) {
        let (this, path) = (Arc::clone(self), path.to_path_buf());
        self.runtime.spawn(async move {
            if let Some(after) = after {
                this.stager.written_settled(&after).await;
            }
            for _ in 0..DROP_TRIES {
                let Trust::RemoveFirst(generation) = this.taints.trust(&path, false) else {
                    return;
                };
                let (worker, gone) = (Arc::clone(&this), path.clone());
                let removed =
                    tokio::task::spawn_blocking(move || worker.stager.remove_copy(&gone).is_ok());
                if removed.await.unwrap_or(false) {
                    this.taints.cleared(&path, generation);
                    return;
                }
                tokio::time::sleep(DROP_RETRY).await;
            }
        });
    }

    /// Creates directory `name` in `parent` with exactly `mode` (umask applied).
    pub async fn mkdir(
        self: &Arc<Self>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        caller: Caller,
    ) -> Result<Attr, FsError> {
        let path = self.child(parent, name)?;
        self.make_entry(path, caller, move |source, path| source.mkdir(path, mode))
            .await
    }

    /// Removes empty directory `name` from `parent`.
    pub async fn rmdir(self: &Arc<Self>, parent: u64, name: &OsStr) -> Result<(), FsError> {
        let path = self.child(parent, name)?;
        let work_path = path.clone();
        self.change(&path, move |p| {
            p.stager.source().rmdir(&work_path)?;
            p.inodes.forget(&work_path);
            p.stager.answers().removed(&work_path);
            Ok(())
        })
        .await
    }

    /// Creates symlink `name` in `parent` pointing at `target`, verbatim.
    pub async fn symlink(
        self: &Arc<Self>,
        parent: u64,
        name: &OsStr,
        target: &Path,
        caller: Caller,
    ) -> Result<Attr, FsError> {
        let path = self.child(parent, name)?;
        let target = target.to_path_buf();
        self.make_entry(path, caller, move |source, path| {
            source.symlink(&target, path)
        })
        .await
    }

    /// Makes `new_name` in `new_parent` another name (a hard link) of `ino`, on the
    /// source. Each name is its own entry here (its own inode number), staged and
    /// tainted by its path: a write through one name changes the source file's
    /// times, so the other name's stored copy no longer matches its version and is
    /// never served for it. The attributes the kernel keeps of the other name (link
    /// count, mode) are its own, for up to `attr_ttl`.
    pub async fn link(
        self: &Arc<Self>,
        ino: u64,
        new_parent: u64,
        new_name: &OsStr,
    ) -> Result<Attr, FsError> {
        let path = self.child(new_parent, new_name)?;
        let existing = self.node(ino)?.path;
        let work_path = path.clone();
        self.change(&path, move |p| {
            let source = p.stager.source();
            source.link(&existing, &work_path)?;
            let meta = source.stat(&work_path)?;
            Ok(p.new_entry(&work_path, &meta))
        })
        .await
    }

    /// Creates special file `name` in `parent` (a fifo, a socket, or, as root, a
    /// device): `mode` holds its type and exactly its permission bits. Such a file is
    /// mirrored, never opened through the mount.
    pub async fn mknod(
        self: &Arc<Self>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u64,
        caller: Caller,
    ) -> Result<Attr, FsError> {
        let path = self.child(parent, name)?;
        self.make_entry(path, caller, move |source, path| {
            source.mknod(path, mode, rdev)
        })
        .await
    }

    /// Makes new entry `path` on the source with `make`, gives it to `caller` where
    /// the daemon is root, and returns its attributes.
    async fn make_entry(
        self: &Arc<Self>,
        path: PathBuf,
        caller: Caller,
        make: impl FnOnce(&SourceTree, &Path) -> Result<(), SourceError> + Send + 'static,
    ) -> Result<Attr, FsError> {
        let work_path = path.clone();
        self.change(&path, move |p| {
            let source = p.stager.source();
            make(source, &work_path)?;
            if let Some((uid, gid)) = Self::owner_for(caller) {
                source.set_owner(&work_path, Some(uid), Some(gid))?;
            }
            let meta = source.stat(&work_path)?;
            Ok(p.new_entry(&work_path, &meta))
        })
        .await
    }

    /// Whether the stored copy of `path` may be used now, removing it first where a
    /// change through the mount made it suspect. May block: the store's removal
    /// commits and syncs.
    pub(super) fn copy_trusted_blocking(&self, path: &Path) -> bool {
        match self.taints.trust(path, false) {
            Trust::Trusted => true,
            Trust::Untrusted => false,
            Trust::RemoveFirst(_) => {
                let copying = self.stager.progress(path).is_some();
                let Trust::RemoveFirst(generation) = self.taints.trust(path, copying) else {
                    return false;
                };
                // Maybe on a source thread: a copy NFS links still name is taken
                // back now and removed at a later call, not waited for here.
                let removed = self.stager.remove_copy_now(path);
                if removed.is_ok() {
                    self.taints.cleared(path, generation);
                }
                removed.is_ok()
            }
        }
    }

    /// [`Policy::copy_trusted_blocking`] for async callers.
    pub(super) async fn copy_trusted(self: &Arc<Self>, path: &Path) -> bool {
        match self.taints.trust(path, false) {
            Trust::Trusted => true,
            Trust::Untrusted => false,
            Trust::RemoveFirst(_) => {
                let (this, path) = (Arc::clone(self), path.to_path_buf());
                self.runtime
                    .spawn_blocking(move || this.copy_trusted_blocking(&path))
                    .await
                    .unwrap_or(false)
            }
        }
    }
}

impl Policy {
    /// Taints `path`. With `tee`, the copy a handle on it is filling, and `own`
    /// (every change so far was that handle's), the taint is the tee's own too if
    /// nothing else tainted the path since the tee's baseline: the tee is then
    /// rebased onto it. The taint's generation, and whether it was the tee's own.
    fn taint_for(&self, path: &Path, tee: Option<&Tee>, own: bool) -> (u64, bool) {
        let Some(tee) = tee.filter(|_| own) else {
            return (self.taints.taint(path), false);
        };
        let (generation, unchanged) = self.taints.taint_after(path, tee.baseline());
        if unchanged {
            tee.rebase(generation);
        }
        (generation, unchanged)
    }

    /// The open handle filling a copy of `path` as it writes, if any (at most one:
    /// a tee needs its file to itself when it opens).
    fn open_tee_of(&self, path: &Path) -> Option<Arc<OpenFile>> {
        let ino = self.inodes.latest_ino(path)?;
        self.files.find(|open| {
            open.writer
                .as_ref()
                .is_some_and(|w| w.ino == ino && w.tee.is_some())
        })
    }
}

/// The local copy a handle fills as it writes, if it has one.
fn tee_of(open: &OpenFile) -> Option<&Tee> {
    open.writer.as_ref().and_then(|w| w.tee.as_ref())
}

fn size_only(size: Option<u64>) -> SetAttr {
    SetAttr {
        size,
        ..SetAttr::default()
    }
}
