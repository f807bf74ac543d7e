//! The source layer of stagefs: the slow directory (NAS share, USB disk) that it
//! mirrors, and everything about reaching it. The layers above are the store
//! (`stagefs-store`, the local cache directory), the layout (`stagefs-layout`, how
//! files form models) and the stage (`stagefs-stage`, copying files into the store).
//!
//! [`Source`] is what a backend implements: [`LocalDir`] for a mounted directory, and
//! `faulty::FaultySource` (feature `fault-injection`) for tests that need a
//! source that hangs, slows down, fails or changes under a copy. [`SourceTree`] is the
//! handle the rest of the code holds: it checks every path before a backend sees it,
//! so no request can reach outside the root. Symlinks are never followed: the mirror
//! returns them verbatim. Every operation on it runs on the bounded threads of
//! [`pool`], so a dead source strands a fixed number of them; [`fskind`] tells what
//! kind of filesystem it sits on (a local disk, a network share), which decides how
//! it is copied. [`copy`] is the engine that reads a source file into a local one,
//! hashing it on the way, which the stager drives and the store uses to re-check a
//! copy; [`error`] holds the source's errors and the helpers every layer's errors
//! use to show the system's words; [`sys`] the few system calls wrapped for all.

pub mod copy;
pub mod error;
#[cfg(any(test, feature = "fault-injection"))]
pub mod faulty;
pub mod fskind;
pub mod locks;
pub mod pool;
pub mod reconnecting;
pub mod sys;

pub use error::{
    SharedIo, SourceError, Unanswered, io_text, is_away_errno, logged, without_os_error,
};
pub use pool::{KNOWN_AWAY_WAIT, SUSPECT_AFTER, SourceHealth, SourcePool};

use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File, Metadata};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::locks::lock;
use crate::sys::time_from_ns;

/// What identifies one version of a source file: if any field changes, the file is
/// considered new and any staged copy of the old version is stale.
///
/// Size and mtime alone miss a file replaced by one of the same size whose mtime
/// was set back (`touch -r`, `cp -p`, `rsync -t`, a rename over it), so the inode
/// and change time count too, where the source has them: no one can set a change
/// time back, and a replacement is a new inode. Not every source does: sshfs
/// reports an inode number of its own, fixed per path, and its mtime (to the
/// second) as the change time, so over sshfs size and mtime are all there is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Stamp {
    /// Size in bytes.
    pub size: u64,
    /// Modification time in nanoseconds since the Unix epoch (negative before it).
    pub mtime_ns: i64,
    /// Inode number on the source; 0 where it has none (and in index entries
    /// written before it counted, which then match no file and are staged again).
    #[serde(default)]
    pub ino: u64,
    /// Status change time in nanoseconds since the Unix epoch; 0 where unknown.
    #[serde(default)]
    pub ctime_ns: i64,
}

impl Stamp {
    /// The stamp of a file as its source describes it.
    pub fn of(meta: &SourceMeta) -> Stamp {
        Stamp {
            size: meta.size,
            mtime_ns: meta.mtime_ns,
            ino: meta.ino,
            ctime_ns: meta.ctime_ns,
        }
    }
}

/// What kind of entry a source path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (returned verbatim, never followed).
    Symlink,
    /// A named pipe: mirrored, never opened through the mount.
    Fifo,
    /// A socket: mirrored, never opened through the mount.
    Socket,
    /// A character device: mirrored, never opened through the mount.
    CharDevice,
    /// A block device: mirrored, never opened through the mount.
    BlockDevice,
}

/// What a source says about one entry: everything the mirror shows. A backend fills
/// it in however it can (an object store has no inode numbers or owners of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SourceMeta {
    /// The kind of entry.
    pub kind: EntryKind,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
    /// Status change time, nanoseconds since the Unix epoch.
    pub ctime_ns: i64,
    /// Access time, nanoseconds since the Unix epoch.
    pub atime_ns: i64,
    /// Permission bits (and setuid/setgid/sticky).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Hard links.
    pub nlink: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// Preferred I/O size.
    pub blksize: u64,
    /// Device number, for device files.
    pub rdev: u64,
    /// Inode number; 0 for a backend without one.
    pub ino: u64,
}

impl SourceMeta {
    /// Whether this is a regular file.
    pub fn is_file(&self) -> bool {
        self.kind == EntryKind::File
    }

    /// Whether this is a directory.
    pub fn is_dir(&self) -> bool {
        self.kind == EntryKind::Dir
    }

    /// Whether this is a symbolic link.
    pub fn is_symlink(&self) -> bool {
        self.kind == EntryKind::Symlink
    }

    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.size
    }

    /// Whether the entry has no bytes.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// Modification time.
    pub fn modified(&self) -> SystemTime {
        time_from_ns(self.mtime_ns)
    }
}

fn ns(secs: i64, nanos: i64) -> i64 {
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

impl From<&Metadata> for SourceMeta {
    fn from(meta: &Metadata) -> SourceMeta {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        let kind = if t.is_dir() {
            EntryKind::Dir
        } else if t.is_symlink() {
            EntryKind::Symlink
        } else if t.is_fifo() {
            EntryKind::Fifo
        } else if t.is_socket() {
            EntryKind::Socket
        } else if t.is_char_device() {
            EntryKind::CharDevice
        } else if t.is_block_device() {
            EntryKind::BlockDevice
        } else {
            EntryKind::File
        };
        let mtime_ns = match meta.modified() {
            Ok(t) => match t.duration_since(UNIX_EPOCH) {
                Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
                Err(e) => -i64::try_from(e.duration().as_nanos()).unwrap_or(i64::MAX),
            },
            // Platforms without mtime still get a usable (size-only) stamp.
            Err(_) => 0,
        };
        SourceMeta {
            kind,
            size: meta.len(),
            mtime_ns,
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
            atime_ns: ns(meta.atime(), meta.atime_nsec()),
            mode: meta.mode(),
            uid: meta.uid(),
            gid: meta.gid(),
            nlink: meta.nlink(),
            blocks: meta.blocks(),
            blksize: meta.blksize(),
            rdev: meta.rdev(),
            ino: meta.ino(),
        }
    }
}

/// Positioned reads, as copies and the daemon's read path do them.
pub trait ReadAt: Send + Sync + fmt::Debug {
    /// Reads into `buf` at `offset`; fewer bytes only at end of file (or when
    /// interrupted, like `pread`).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;

    /// The plain file behind this, which a copy may read by other means than
    /// `read_at` (inside the kernel). None for anything that must see every read: a
    /// source that injects faults or counts bytes.
    fn as_file(&self) -> Option<&File> {
        None
    }
}

impl ReadAt for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(self, buf, offset)
    }

    fn as_file(&self) -> Option<&File> {
        Some(self)
    }
}

/// A source file open for reading.
pub trait SourceFile: ReadAt {
    /// What the source says about the open file now.
    fn meta(&self) -> io::Result<SourceMeta>;
}

impl SourceFile for File {
    fn meta(&self) -> io::Result<SourceMeta> {
        self.metadata().map(|m| SourceMeta::from(&m))
    }
}

/// A source file open for writing (and for reading, when it was opened so).
pub trait WritableFile: SourceFile {
    /// Writes all of `buf` at `offset`; an error means an unknown part was written.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Truncates or extends the file to `len` bytes.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Makes what was written durable on the source (`fdatasync` with `data_only`).
    fn sync(&self, data_only: bool) -> io::Result<()>;
    /// Hands what was written to the source itself, as a `close` does, and says
    /// whether it got there: a network client (sshfs, NFS) answers a write once it
    /// has taken the bytes in, before the server has them, and reports a write that
    /// never arrived only when a descriptor of the file is closed.
    fn flush(&self) -> io::Result<()>;
}

impl WritableFile for File {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(self, buf, offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }

    fn sync(&self, data_only: bool) -> io::Result<()> {
        if data_only {
            self.sync_data()
        } else {
            self.sync_all()
        }
    }

    fn flush(&self) -> io::Result<()> {
        // Every close of a descriptor calls the filesystem's flush (the file stays
        // open through this one): sshfs waits there for the replies to its writes,
        // NFS writes its dirty pages back; a local disk has nothing to do.
        let duplicate = std::os::fd::IntoRawFd::into_raw_fd(self.try_clone()?);
        // SAFETY: `duplicate` is a descriptor this function owns, closed once.
        match unsafe { libc::close(duplicate) } {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }
}

/// How a file is opened for writing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteOpen {
    /// Also open it for reading (`O_RDWR`).
    pub read: bool,
    /// Truncate it to zero bytes (`O_TRUNC`).
    pub truncate: bool,
}

/// How a file is created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CreateFile {
    /// Permission bits of a new file, the caller's umask already applied; set exactly
    /// (the daemon's own umask does not apply).
    pub mode: u32,
    /// Fail with EEXIST if it exists (`O_EXCL`); otherwise an existing file is opened.
    pub exclusive: bool,
    /// How it is opened.
    pub open: WriteOpen,
}

/// A time to set on an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    /// The source's current time.
    Now,
    /// Nanoseconds since the Unix epoch.
    At(i64),
}

/// Whether `path` is plain: relative, and names only (no root, no `..` anywhere, even
/// one that would stay inside: a link below could make it leave). The empty path is
/// the root itself. A leading `./` is not plain: typed by a user it means "from the
/// current directory". The one check of a path that comes from outside (a request, a
/// model id, a config line) before it is joined to a root.
pub fn is_plain_relative(path: &Path) -> bool {
    path.components().all(|c| matches!(c, Component::Normal(_)))
}

/// A backend stagefs can mirror. Paths are relative to the root and already checked
/// by [`SourceTree`] to hold only normal components.
///
/// Contract: every method may block for as long as the backend does (a dead NAS
/// blocks forever); callers run them on [`pool::SourcePool`], never on
/// an async worker. Errors name the relative path; a missing entry is
/// [`SourceError::NotFound`], so the mirror answers ENOENT.
pub trait Source: Send + Sync + fmt::Debug {
    /// Where the source lives, for messages and status.
    fn root(&self) -> &Path;
    /// The entry at `rel` itself (a symlink is not followed).
    fn stat(&self, rel: &Path) -> Result<SourceMeta, SourceError>;
    /// The entries of directory `rel` with their own metadata, in any order. An
    /// entry that vanishes between listing and stat is left out.
    fn read_dir(&self, rel: &Path) -> Result<Vec<(OsString, SourceMeta)>, SourceError>;
    /// The target of symlink `rel`, verbatim.
    fn read_link(&self, rel: &Path) -> Result<PathBuf, SourceError>;
    /// Opens regular file `rel` for reading.
    fn open(&self, rel: &Path) -> Result<Box<dyn SourceFile>, SourceError>;
    /// The source filesystem's space and limits. A network client must ask its server
    /// for this (nothing else it answers from its own caches), so it doubles as the
    /// probe of whether the server is there.
    fn statfs(&self) -> io::Result<libc::statvfs>;
    /// Whether the source is on a local disk (or in memory), where copies are bound
    /// by the CPU rather than by round trips. Asks the filesystem; may block.
    fn on_local_disk(&self) -> bool {
        false
    }

    // Writes. A backend that cannot write leaves these as they are: every write
    // through the mount then fails with EROFS.

    /// Creates regular file `rel` (or opens an existing one, unless exclusive).
    fn create(&self, rel: &Path, how: CreateFile) -> Result<Box<dyn WritableFile>, SourceError> {
        let _ = how;
        Err(SourceError::read_only(rel))
    }
    /// Opens existing regular file `rel` for writing.
    fn open_write(&self, rel: &Path, how: WriteOpen) -> Result<Box<dyn WritableFile>, SourceError> {
        let _ = how;
        Err(SourceError::read_only(rel))
    }
    /// Truncates or extends regular file `rel` to `len` bytes.
    fn set_len(&self, rel: &Path, len: u64) -> Result<(), SourceError> {
        let _ = len;
        Err(SourceError::read_only(rel))
    }
    /// Renames `from` to `to`, replacing an existing `to` unless `no_replace`.
    fn rename(&self, from: &Path, to: &Path, no_replace: bool) -> Result<(), SourceError> {
        let _ = (to, no_replace);
        Err(SourceError::read_only(from))
    }
    /// Removes file or link `rel`.
    fn unlink(&self, rel: &Path) -> Result<(), SourceError> {
        Err(SourceError::read_only(rel))
    }
    /// Creates directory `rel` with exactly `mode`.
    fn mkdir(&self, rel: &Path, mode: u32) -> Result<(), SourceError> {
        let _ = mode;
        Err(SourceError::read_only(rel))
    }
    /// Removes empty directory `rel`.
    fn rmdir(&self, rel: &Path) -> Result<(), SourceError> {
        Err(SourceError::read_only(rel))
    }
    /// Creates symlink `rel` pointing at `target`, verbatim.
    fn symlink(&self, target: &Path, rel: &Path) -> Result<(), SourceError> {
        let _ = target;
        Err(SourceError::read_only(rel))
    }
    /// Makes `rel` a new name (a hard link) of the existing entry `existing`, which is
    /// not followed if it is a symlink.
    fn link(&self, existing: &Path, rel: &Path) -> Result<(), SourceError> {
        let _ = existing;
        Err(SourceError::read_only(rel))
    }
    /// Creates special file `rel` (a fifo, a socket, a character or block device:
    /// `mode` holds the type and exactly the permission bits; `rdev` the device).
    fn mknod(&self, rel: &Path, mode: u32, rdev: u64) -> Result<(), SourceError> {
        let _ = (mode, rdev);
        Err(SourceError::read_only(rel))
    }
    /// Sets the permission bits of `rel` (a symlink's own, where the system allows).
    fn set_mode(&self, rel: &Path, mode: u32) -> Result<(), SourceError> {
        let _ = mode;
        Err(SourceError::read_only(rel))
    }
    /// Sets the owner and group of `rel` itself (None leaves one as it is).
    fn set_owner(&self, rel: &Path, uid: Option<u32>, gid: Option<u32>) -> Result<(), SourceError> {
        let _ = (uid, gid);
        Err(SourceError::read_only(rel))
    }
    /// Sets the access and modification times of `rel` itself (None leaves one).
    fn set_times(
        &self,
        rel: &Path,
        atime: Option<SetTime>,
        mtime: Option<SetTime>,
    ) -> Result<(), SourceError> {
        let _ = (atime, mtime);
        Err(SourceError::read_only(rel))
    }
}

/// A directory on a mounted filesystem: a NAS share, a USB disk, a local folder.
///
/// It remembers which directory its root was when it was opened (device and inode)
/// and where the filesystem holding it is mounted. A NAS can be unmounted
/// underneath a mount (sshfs exits when its connection drops; an automounter times
/// out), and its mount point is then an empty directory on the laptop's own disk:
/// while the root is on a filesystem mounted above that mount point, every change
/// is refused and every "not found" or foreign answer is checked against the root,
/// so nothing is written to that disk and an empty listing is never taken for the
/// source's. A filesystem mounted at the same place again (the share remounted, with
/// a new device number) is the source again. (A check and the operation after it
/// are two calls: an unmount landing between them is not caught.)
#[derive(Debug, Clone)]
pub struct LocalDir {
    root: PathBuf,
    /// The root directory's device and inode as last seen on the right filesystem.
    root_id: Arc<Mutex<(u64, u64)>>,
    /// Where the filesystem holding the root was mounted when it was opened.
    mount_point: PathBuf,
}

impl LocalDir {
    /// The directory at `root`, which must exist.
    pub fn new(root: impl Into<PathBuf>) -> Result<LocalDir, SourceError> {
        let root = root.into();
        let meta = fs::metadata(&root).map_err(|e| SourceError::io(&root, e))?;
        if !meta.is_dir() {
            return Err(SourceError::io(
                &root,
                io::Error::from_raw_os_error(libc::ENOTDIR),
            ));
        }
        let mount_point = mount_point_of(&root, meta.dev());
        Ok(LocalDir {
            root,
            root_id: Arc::new(Mutex::new((meta.dev(), meta.ino()))),
            mount_point,
        })
    }

    /// Fails unless the root is still on the filesystem it was opened on: `Away` if
    /// it cannot be asked (a dead mount), `Unmounted` if the filesystem mounted where
    /// the source's was is gone and the root is a directory of the one above.
    fn still_mounted(&self) -> Result<(), SourceError> {
        let meta = fs::metadata(&self.root).map_err(|e| SourceError::io(Path::new(""), e))?;
        let now = (meta.dev(), meta.ino());
        let mut known = lock(&self.root_id);
        if now == *known {
            return Ok(());
        }
        if mount_point_of(&self.root, now.0) == self.mount_point {
            // Mounted again where it was (a new device number), or the directory
            // made anew on the same filesystem: the source, as it is now.
            *known = now;
            return Ok(());
        }
        Err(SourceError::Unmounted {
            root: self.root.clone(),
        })
    }

    /// `answer`, unless it could come from the directory under a vanished mount:
    /// "not found", or an entry of another device than the root's (which a source
    /// with mounts inside it also gives, so the root is asked then, not refused).
    fn checked<T>(
        &self,
        answer: Result<T, SourceError>,
        device: impl FnOnce(&T) -> Option<u64>,
    ) -> Result<T, SourceError> {
        let root_dev = lock(&self.root_id).0;
        let suspicious = match &answer {
            Err(SourceError::NotFound { .. }) => true,
            Ok(found) => device(found).is_some_and(|dev| dev != root_dev),
            Err(_) => false,
        };
        if suspicious {
            self.still_mounted()?;
        }
        answer
    }
}

/// The directory where the filesystem of `dir` (on device `dev`) is mounted: its
/// highest ancestor on the same device. (A bind mount of a directory of the same
/// filesystem is not told apart; nothing here needs it.)
fn mount_point_of(dir: &Path, dev: u64) -> PathBuf {
    let dir = fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut top = dir.as_path();
    while let Some(parent) = top.parent() {
        match fs::metadata(parent) {
            Ok(meta) if meta.dev() == dev => top = parent,
            _ => break,
        }
    }
    top.to_path_buf()
}

impl Source for LocalDir {
    fn root(&self) -> &Path {
        &self.root
    }

    fn stat(&self, rel: &Path) -> Result<SourceMeta, SourceError> {
        let meta = fs::symlink_metadata(self.root.join(rel)).map_err(|e| SourceError::io(rel, e));
        self.checked(meta, |m| Some(m.dev()))
            .map(|m| SourceMeta::from(&m))
    }

    fn read_dir(&self, rel: &Path) -> Result<Vec<(OsString, SourceMeta)>, SourceError> {
        let listed = self.list(rel);
        // An empty listing is what the directory under a vanished mount gives.
        self.checked(listed, |(entries, dev)| {
            if entries.is_empty() {
                Some(u64::MAX)
            } else {
                *dev
            }
        })
        .map(|(entries, _)| entries)
    }

    fn read_link(&self, rel: &Path) -> Result<PathBuf, SourceError> {
        let target = fs::read_link(self.root.join(rel)).map_err(|e| SourceError::io(rel, e));
        self.checked(target, |_| None)
    }

    fn open(&self, rel: &Path) -> Result<Box<dyn SourceFile>, SourceError> {
        let file = File::open(self.root.join(rel)).map_err(|e| SourceError::io(rel, e));
        let file = self.checked(file, |f| f.metadata().ok().map(|m| m.dev()))?;
        Ok(Box::new(file))
    }

    fn statfs(&self) -> io::Result<libc::statvfs> {
        // The probe that declares the source back: the laptop's own disk under a
        // vanished mount point answers statfs too.
        // It answers with an errno the policy counts as the source being away.
        self.still_mounted().map_err(|e| match e {
            SourceError::Away { source, .. } | SourceError::Io { source, .. } => {
                io::Error::from_raw_os_error(source.raw_os_error().unwrap_or(libc::EIO))
            }
            _ => io::Error::from_raw_os_error(libc::ENOTCONN),
        })?;
        crate::sys::statvfs(&self.root)
    }

    fn on_local_disk(&self) -> bool {
        let root = self.root.canonicalize();
        let kind = root.and_then(|root| fskind::filesystem_of(&root));
        kind.is_ok_and(|fs| fs.kind.is_local_disk())
    }

    fn create(&self, rel: &Path, how: CreateFile) -> Result<Box<dyn WritableFile>, SourceError> {
        self.still_mounted()?;
        let path = self.root.join(rel);
        let fail = |e| SourceError::write(rel, e);
        let mut options = write_options(how.open);
        options.create_new(true).mode(how.mode);
        match options.open(&path) {
            Ok(file) => {
                // The daemon's umask must not narrow the mode the caller asked for.
                file.set_permissions(fs::Permissions::from_mode(how.mode & 0o7777))
                    .map_err(fail)?;
                Ok(Box::new(file))
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && !how.exclusive => {
                self.open_write(rel, how.open)
            }
            Err(e) => Err(fail(e)),
        }
    }

    fn open_write(&self, rel: &Path, how: WriteOpen) -> Result<Box<dyn WritableFile>, SourceError> {
        self.still_mounted()?;
        let file = write_options(how)
            .truncate(how.truncate)
            .open(self.root.join(rel))
            .map_err(|e| SourceError::write(rel, e))?;
        Ok(Box::new(file))
    }

    fn set_len(&self, rel: &Path, len: u64) -> Result<(), SourceError> {
        self.still_mounted()?;
        let fail = |e| SourceError::write(rel, e);
        let file = write_options(WriteOpen::default())
            .open(self.root.join(rel))
            .map_err(fail)?;
        file.set_len(len).map_err(fail)
    }

    fn rename(&self, from: &Path, to: &Path, no_replace: bool) -> Result<(), SourceError> {
        self.still_mounted()?;
        let (old, new) = (self.root.join(from), self.root.join(to));
        let renamed = if no_replace {
            rename_no_replace(&old, &new)
        } else {
            fs::rename(&old, &new)
        };
        renamed.map_err(|e| SourceError::write(from, e))
    }

    fn unlink(&self, rel: &Path) -> Result<(), SourceError> {
        self.still_mounted()?;
        fs::remove_file(self.root.join(rel)).map_err(|e| SourceError::write(rel, e))
    }

    fn mkdir(&self, rel: &Path, mode: u32) -> Result<(), SourceError> {
        self.still_mounted()?;
        let path = self.root.join(rel);
        let fail = |e| SourceError::write(rel, e);
        fs::DirBuilder::new()
            .mode(mode)
            .create(&path)
            .map_err(fail)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o7777)).map_err(fail)
    }

    fn rmdir(&self, rel: &Path) -> Result<(), SourceError> {
        self.still_mounted()?;
        fs::remove_dir(self.root.join(rel)).map_err(|e| SourceError::write(rel, e))
    }

    fn symlink(&self, target: &Path, rel: &Path) -> Result<(), SourceError> {
        self.still_mounted()?;
        std::os::unix::fs::symlink(target, self.root.join(rel))
            .map_err(|e| SourceError::write(rel, e))
    }

    fn link(&self, existing: &Path, rel: &Path) -> Result<(), SourceError> {
        self.still_mounted()?;
        // linkat without AT_SYMLINK_FOLLOW: a link to a symlink names the symlink.
        fs::hard_link(self.root.join(existing), self.root.join(rel))
            .map_err(|e| SourceError::write(rel, e))
    }

    fn mknod(&self, rel: &Path, mode: u32, rdev: u64) -> Result<(), SourceError> {
        self.still_mounted()?;
        let path = self.root.join(rel);
        let fail = |e| SourceError::write(rel, e);
        crate::sys::mknod(&path, mode, rdev).map_err(fail)?;
        // The daemon's umask must not narrow the mode the caller asked for.
        chmod_no_follow(&path, mode & 0o7777).map_err(fail)
    }

    fn set_mode(&self, rel: &Path, mode: u32) -> Result<(), SourceError> {
        self.still_mounted()?;
        chmod_no_follow(&self.root.join(rel), mode & 0o7777).map_err(|e| SourceError::write(rel, e))
    }

    fn set_owner(&self, rel: &Path, uid: Option<u32>, gid: Option<u32>) -> Result<(), SourceError> {
        self.still_mounted()?;
        std::os::unix::fs::lchown(self.root.join(rel), uid, gid)
            .map_err(|e| SourceError::write(rel, e))
    }

    fn set_times(
        &self,
        rel: &Path,
        atime: Option<SetTime>,
        mtime: Option<SetTime>,
    ) -> Result<(), SourceError> {
        self.still_mounted()?;
        set_times_no_follow(&self.root.join(rel), atime, mtime)
            .map_err(|e| SourceError::write(rel, e))
    }
}

impl LocalDir {
    /// The entries of `rel` with their metadata, and the device of one of them.
    #[allow(clippy::type_complexity)]
    fn list(&self, rel: &Path) -> Result<(Vec<(OsString, SourceMeta)>, Option<u64>), SourceError> {
        let mut entries = Vec::new();
        let mut device = None;
        for entry in fs::read_dir(self.root.join(rel)).map_err(|e| SourceError::io(rel, e))? {
            let entry = entry.map_err(|e| SourceError::io(rel, e))?;
            match entry.metadata() {
                Ok(meta) => {
                    device.get_or_insert(meta.dev());
                    entries.push((entry.file_name(), SourceMeta::from(&meta)));
                }
                // Vanished between listing and stat: it is simply not there any more.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(SourceError::io(rel.join(entry.file_name()), e)),
            }
        }
        Ok((entries, device))
    }
}

/// Open options for writing: never following a final symlink, which could point
/// anywhere outside the source.
fn write_options(how: WriteOpen) -> fs::OpenOptions {
    let mut options = fs::OpenOptions::new();
    options
        .read(how.read)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW);
    options
}

fn c_path(path: &Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// Renames `old` to `new`, failing with EEXIST if `new` exists.
fn rename_no_replace(old: &Path, new: &Path) -> io::Result<()> {
    let (old, new) = (c_path(old)?, c_path(new)?);
    #[cfg(target_os = "linux")]
    // SAFETY: both paths are NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            old.as_ptr(),
            libc::AT_FDCWD,
            new.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    #[cfg(target_os = "macos")]
    // SAFETY: both paths are NUL-terminated strings that outlive the call.
    let rc = unsafe { libc::renamex_np(old.as_ptr(), new.as_ptr(), libc::RENAME_EXCL) };
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    let rc = {
        let _ = (old, new);
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets the mode of `path` itself: a symlink's mode cannot be set (EOPNOTSUPP), and
/// its target, which may lie outside the source, is never touched.
fn chmod_no_follow(path: &Path, mode: u32) -> io::Result<()> {
    if fs::symlink_metadata(path)?.file_type().is_symlink() {
        return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
    }
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

/// Sets the times of `path` itself (`utimensat` without following a symlink).
fn set_times_no_follow(
    path: &Path,
    atime: Option<SetTime>,
    mtime: Option<SetTime>,
) -> io::Result<()> {
    fn spec(time: Option<SetTime>) -> libc::timespec {
        let (tv_sec, tv_nsec) = match time {
            None => (0, libc::UTIME_OMIT),
            Some(SetTime::Now) => (0, libc::UTIME_NOW),
            Some(SetTime::At(ns)) => (ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000)),
        };
        libc::timespec {
            tv_sec: tv_sec as libc::time_t,
            tv_nsec: tv_nsec as _,
        }
    }
    let path = c_path(path)?;
    let times = [spec(atime), spec(mtime)];
    // SAFETY: the path is a NUL-terminated string and `times` two timespecs, both
    // outliving the call.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            path.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The source being mirrored, as the rest of stagefs holds it: a cheap handle that
/// checks paths and hands them to the backend.
#[derive(Debug, Clone)]
pub struct SourceTree {
    backend: Arc<dyn Source>,
}

impl SourceTree {
    /// A local directory at `root`, which must exist.
    pub fn new(root: impl Into<PathBuf>) -> Result<Self, SourceError> {
        Ok(Self::from_backend(Arc::new(LocalDir::new(root)?)))
    }

    /// Any backend.
    pub fn from_backend(backend: Arc<dyn Source>) -> Self {
        SourceTree { backend }
    }

    /// The root, for messages and status.
    pub fn root(&self) -> &Path {
        self.backend.root()
    }

    /// Refuses anything but a [`is_plain_relative`] path.
    pub fn check(&self, rel: &Path) -> Result<(), SourceError> {
        // `.` and a leading `./` are the root, as callers inside stagefs may write it.
        if is_plain_relative(rel.strip_prefix(".").unwrap_or(rel)) {
            Ok(())
        } else {
            Err(SourceError::OutsideRoot {
                path: rel.to_path_buf(),
            })
        }
    }

    /// Absolute path of `rel` under the root, refusing anything but plain relative
    /// components.
    pub fn resolve(&self, rel: &Path) -> Result<PathBuf, SourceError> {
        self.check(rel)?;
        Ok(self.root().join(rel))
    }

    /// The entry at `rel` itself (symlinks are not followed).
    pub fn stat(&self, rel: &Path) -> Result<SourceMeta, SourceError> {
        self.check(rel)?;
        self.backend.stat(rel)
    }

    /// The entries of directory `rel` with their own metadata, sorted by name so that
    /// listings are stable across calls.
    pub fn read_dir(&self, rel: &Path) -> Result<Vec<(OsString, SourceMeta)>, SourceError> {
        self.check(rel)?;
        let mut entries = self.backend.read_dir(rel)?;
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(entries)
    }

    /// The target of symlink `rel`, verbatim.
    pub fn read_link(&self, rel: &Path) -> Result<PathBuf, SourceError> {
        self.check(rel)?;
        self.backend.read_link(rel)
    }

    /// Opens regular file `rel` for reading.
    pub fn open(&self, rel: &Path) -> Result<Box<dyn SourceFile>, SourceError> {
        self.check(rel)?;
        self.backend.open(rel)
    }

    /// The whole text of small file `rel` (refs, indexes, configs); at most `limit`
    /// bytes are read, so a huge file named like one cannot fill memory.
    pub fn read_text(&self, rel: &Path, limit: usize) -> Result<String, SourceError> {
        let file = self.open(rel)?;
        let bytes = crate::copy::read_at_most(file.as_ref(), 0, limit, |_| {})
            .map_err(|e| SourceError::io(rel, e))?;
        String::from_utf8(bytes)
            .map_err(|e| SourceError::io(rel, io::Error::new(io::ErrorKind::InvalidData, e)))
    }

    /// Whether the source is on a local disk; see [`Source::on_local_disk`].
    pub fn on_local_disk(&self) -> bool {
        self.backend.on_local_disk()
    }

    /// The source filesystem's space; also the probe of whether it answers.
    pub fn statfs(&self) -> io::Result<libc::statvfs> {
        self.backend.statfs()
    }

    /// Creates regular file `rel`; see [`Source::create`].
    pub fn create(
        &self,
        rel: &Path,
        how: CreateFile,
    ) -> Result<Box<dyn WritableFile>, SourceError> {
        self.check_named(rel)?;
        self.backend.create(rel, how)
    }

    /// Opens existing regular file `rel` for writing.
    pub fn open_write(
        &self,
        rel: &Path,
        how: WriteOpen,
    ) -> Result<Box<dyn WritableFile>, SourceError> {
        self.check_named(rel)?;
        self.backend.open_write(rel, how)
    }

    /// Truncates or extends regular file `rel` to `len` bytes.
    pub fn set_len(&self, rel: &Path, len: u64) -> Result<(), SourceError> {
        self.check_named(rel)?;
        self.backend.set_len(rel, len)
    }

    /// Renames `from` to `to`, replacing an existing `to` unless `no_replace`.
    pub fn rename(&self, from: &Path, to: &Path, no_replace: bool) -> Result<(), SourceError> {
        self.check_named(from)?;
        self.check_named(to)?;
        self.backend.rename(from, to, no_replace)
    }

    /// Removes file or link `rel`.
    pub fn unlink(&self, rel: &Path) -> Result<(), SourceError> {
        self.check_named(rel)?;
        self.backend.unlink(rel)
    }

    /// Creates directory `rel` with exactly `mode`.
    pub fn mkdir(&self, rel: &Path, mode: u32) -> Result<(), SourceError> {
        self.check_named(rel)?;
        self.backend.mkdir(rel, mode)
    }

    /// Removes empty directory `rel`.
    pub fn rmdir(&self, rel: &Path) -> Result<(), SourceError> {
        self.check_named(rel)?;
        self.backend.rmdir(rel)
    }

    /// Creates symlink `rel` pointing at `target`, verbatim (the target is not a path
    /// of the source, only the link's text).
    pub fn symlink(&self, target: &Path, rel: &Path) -> Result<(), SourceError> {
        self.check_named(rel)?;
        self.backend.symlink(target, rel)
    }

    /// Makes `rel` a new name of the existing entry `existing`; see [`Source::link`].
    pub fn link(&self, existing: &Path, rel: &Path) -> Result<(), SourceError> {
        self.check(existing)?;
        self.check_named(rel)?;
        self.backend.link(existing, rel)
    }

    /// Creates special file `rel`; see [`Source::mknod`].
    pub fn mknod(&self, rel: &Path, mode: u32, rdev: u64) -> Result<(), SourceError> {
        self.check_named(rel)?;
        self.backend.mknod(rel, mode, rdev)
    }

    /// Sets the permission bits of `rel`.
    pub fn set_mode(&self, rel: &Path, mode: u32) -> Result<(), SourceError> {
        self.check(rel)?;
        self.backend.set_mode(rel, mode)
    }

    /// Sets the owner and group of `rel` itself.
    pub fn set_owner(
        &self,
        rel: &Path,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> Result<(), SourceError> {
        self.check(rel)?;
        self.backend.set_owner(rel, uid, gid)
    }

    /// Sets the access and modification times of `rel` itself.
    pub fn set_times(
        &self,
        rel: &Path,
        atime: Option<SetTime>,
        mtime: Option<SetTime>,
    ) -> Result<(), SourceError> {
        self.check(rel)?;
        self.backend.set_times(rel, atime, mtime)
    }

    /// Like [`SourceTree::check`], and refuses the root itself, which no write may
    /// create, replace or remove.
    fn check_named(&self, rel: &Path) -> Result<(), SourceError> {
        self.check(rel)?;
        if rel.file_name().is_none() {
            return Err(SourceError::OutsideRoot {
                path: rel.to_path_buf(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_relative_path_has_no_root_and_no_parent() {
        for plain in ["org/name", "org/name/", "", "a/./b"] {
            assert!(is_plain_relative(Path::new(plain)), "{plain}");
        }
        for outside in ["/etc", "../x", "a/../b", "a/..", "./a", "."] {
            assert!(!is_plain_relative(Path::new(outside)), "{outside}");
        }
    }

    #[test]
    fn resolve_rejects_escapes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tree = SourceTree::new(dir.path()).expect("source");
        assert!(tree.resolve(Path::new("../etc/passwd")).is_err());
        assert!(tree.resolve(Path::new("/etc/passwd")).is_err());
        assert!(tree.resolve(Path::new("a/../../b")).is_err());
        assert_eq!(
            tree.resolve(Path::new("models--a--b/blobs/x")).ok(),
            Some(dir.path().join("models--a--b/blobs/x"))
        );
        assert!(tree.stat(Path::new("../x")).is_err());
        assert!(tree.stat(Path::new("")).is_ok_and(|m| m.is_dir()));
    }

    #[test]
    fn the_mount_point_of_a_directory_is_its_highest_ancestor_on_its_device() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dev = fs::metadata(dir.path()).expect("stat").dev();
        let top = mount_point_of(dir.path(), dev);
        let real = fs::canonicalize(dir.path()).expect("canonicalize");
        assert!(
            real.starts_with(&top),
            "{} above {}",
            top.display(),
            real.display()
        );
        assert_eq!(fs::metadata(&top).expect("stat").dev(), dev);
        if let Some(above) = top.parent() {
            assert_ne!(
                fs::metadata(above).expect("stat").dev(),
                dev,
                "not the highest"
            );
        }
    }

    #[test]
    fn a_local_dir_writes_creates_renames_and_removes() -> Result<(), SourceError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let tree = SourceTree::new(dir.path())?;
        let how = CreateFile {
            mode: 0o640,
            exclusive: true,
            open: WriteOpen {
                read: true,
                truncate: false,
            },
        };
        let file = tree.create(Path::new("a"), how)?;
        file.write_all_at(b"hello", 0).expect("write");
        file.sync(true).expect("sync");
        drop(file);
        let meta = tree.stat(Path::new("a"))?;
        assert_eq!((meta.size, meta.mode & 0o7777), (5, 0o640), "exact mode");
        assert!(matches!(
            tree.create(Path::new("a"), how).map(drop),
            Err(SourceError::Write { source, .. }) if source.raw_os_error() == Some(libc::EEXIST)
        ));
        fs::write(dir.path().join("b"), b"old").expect("write");
        assert!(tree.rename(Path::new("a"), Path::new("b"), true).is_err());
        tree.rename(Path::new("a"), Path::new("b"), false)?;
        assert_eq!(fs::read(dir.path().join("b")).expect("read"), b"hello");
        tree.set_len(Path::new("b"), 2)?;
        assert_eq!(tree.stat(Path::new("b"))?.size, 2);
        tree.set_times(Path::new("b"), None, Some(SetTime::At(1_000_000_000_123)))?;
        assert_eq!(tree.stat(Path::new("b"))?.mtime_ns, 1_000_000_000_123);
        tree.mkdir(Path::new("d"), 0o750)?;
        assert_eq!(tree.stat(Path::new("d"))?.mode & 0o7777, 0o750);
        tree.symlink(Path::new("/etc/passwd"), Path::new("d/l"))?;
        assert!(
            tree.set_mode(Path::new("d/l"), 0o600).is_err(),
            "never follows"
        );
        assert!(
            tree.open_write(Path::new("d/l"), WriteOpen::default())
                .is_err(),
            "never follows"
        );
        assert!(tree.rmdir(Path::new("d")).is_err(), "not empty");
        tree.unlink(Path::new("d/l"))?;
        tree.rmdir(Path::new("d"))?;
        tree.unlink(Path::new("b"))?;
        assert!(matches!(
            tree.stat(Path::new("b")),
            Err(SourceError::NotFound { .. })
        ));
        assert!(tree.unlink(Path::new("")).is_err(), "not the root");
        assert!(tree.mkdir(Path::new("../x"), 0o700).is_err());
        Ok(())
    }

    #[test]
    fn a_full_source_is_no_space() {
        let full = SourceError::write("x", io::Error::from_raw_os_error(libc::ENOSPC));
        assert!(matches!(full, SourceError::NoSpace { .. }));
        let quota = SourceError::write("x", io::Error::from_raw_os_error(libc::EDQUOT));
        assert!(matches!(quota, SourceError::NoSpace { .. }));
    }

    #[test]
    fn stamp_changes_with_content_length() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("f");
        fs::write(&path, b"abc")?;
        let a = Stamp::of(&(&fs::metadata(&path)?).into());
        fs::write(&path, b"abcd")?;
        let b = Stamp::of(&(&fs::metadata(&path)?).into());
        assert_ne!(a, b);
        assert_eq!(b.size, 4);
        Ok(())
    }
}
