//! A source that misbehaves on demand, for tests: it serves a real directory and can
//! hang (like a NAS whose link was cut), answer slowly, fail with EIO, or change a file
//! while it is being copied. It counts the operations that reach it, so a test can
//! say "this was served without asking the source". Other crates get it with the
//! feature `fault-injection` (tests, and `readbench jukebox`); a shipped binary never
//! has it.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::error::SourceError;
use crate::locks::{lock, wait};
use crate::{
    CreateFile, LocalDir, ReadAt, SetTime, Source, SourceFile, SourceMeta, WritableFile, WriteOpen,
};

/// How the source behaves right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Like the directory it serves.
    Healthy,
    /// Every operation blocks until [`FaultySource::set`] changes this.
    Hang,
    /// Every operation takes this long first.
    Slow(Duration),
    /// Every read of a file's bytes takes this long first, and nothing else waits:
    /// a NAS behind a narrow link, whose metadata answers at once.
    SlowReads(Duration),
    /// Every change (a create, a write or truncation, a sync, a rename, a removal,
    /// a mkdir or symlink, a change of mode, owner or times) takes this long first,
    /// and nothing else waits: a NAS slow to commit, whose reads answer at once.
    SlowChanges(Duration),
    /// Every operation fails with EIO.
    Eio,
    /// Every operation fails at once with this errno, as a dead FUSE source
    /// (ENOTCONN) or a lost server (ESTALE, EHOSTDOWN) does.
    Fails(i32),
    /// Reads are healthy; every write that needs room (create, write, extend, mkdir,
    /// symlink) fails with ENOSPC, as on a full NAS.
    Full,
}

/// A file to rewrite once this many bytes of it have been read (a change mid-copy).
#[derive(Debug, Clone)]
struct Rewrite {
    rel: PathBuf,
    after: u64,
    bytes: Vec<u8>,
}

/// A source that misbehaves on demand; see the module docs.
#[derive(Debug)]
pub struct FaultySource {
    dir: LocalDir,
    faults: Arc<Faults>,
    /// Whether it says it is on a local disk; otherwise it stands for a network share.
    local_disk: AtomicBool,
}

/// The behaviour, shared with the files opened from the source.
#[derive(Debug)]
struct Faults {
    root: PathBuf,
    state: Mutex<State>,
    changed: Condvar,
    calls: AtomicUsize,
    /// Every change that reached the source: what it was, and the path.
    changes: Mutex<Vec<(&'static str, PathBuf)>>,
}

#[derive(Debug)]
struct State {
    behaviour: Behaviour,
    rewrite: Option<Rewrite>,
}

impl FaultySource {
    /// A healthy source serving directory `root`.
    pub fn new(root: impl Into<PathBuf>) -> Result<Arc<FaultySource>, SourceError> {
        let dir = LocalDir::new(root)?;
        let faults = Arc::new(Faults {
            root: dir.root().to_path_buf(),
            state: Mutex::new(State {
                behaviour: Behaviour::Healthy,
                rewrite: None,
            }),
            changed: Condvar::new(),
            calls: AtomicUsize::new(0),
            changes: Mutex::default(),
        });
        let local_disk = AtomicBool::new(false);
        Ok(Arc::new(FaultySource {
            dir,
            faults,
            local_disk,
        }))
    }

    /// From now on, says it is on a local disk, as a USB disk or an internal one does
    /// (the copy and prefetch rules differ by the source's kind).
    pub fn present_as_local_disk(&self) {
        self.local_disk.store(true, Ordering::Relaxed);
    }

    /// Changes how every operation from now on (and every hung one) behaves.
    pub fn set(&self, behaviour: Behaviour) {
        lock(&self.faults.state).behaviour = behaviour;
        self.faults.changed.notify_all();
    }

    /// Once `after` bytes of `rel` have been read, replaces its content with `bytes`
    /// (a new size and mtime), as a writer on the NAS would in the middle of a copy.
    pub fn rewrite_after(&self, rel: impl Into<PathBuf>, after: u64, bytes: Vec<u8>) {
        lock(&self.faults.state).rewrite = Some(Rewrite {
            rel: rel.into(),
            after,
            bytes,
        });
    }

    /// Operations that reached the source so far.
    pub fn calls(&self) -> usize {
        self.faults.calls.load(Ordering::Relaxed)
    }

    /// The changes that reached the source so far, in order: what each was
    /// ("create", "write", "truncate", "sync", "rename", "unlink", "mkdir", "rmdir",
    /// "symlink", "chmod", "chown", "utimes") and the path it was made at (a
    /// rename's source).
    pub fn changes(&self) -> Vec<(&'static str, PathBuf)> {
        lock(&self.faults.changes).clone()
    }

    fn enter_for(&self, rel: &Path) -> Result<(), SourceError> {
        self.faults.enter().map_err(|e| SourceError::io(rel, e))
    }

    /// Like `enter_for`, for change `what` that needs room on the source.
    fn enter_to_grow(&self, what: &'static str, rel: &Path) -> Result<(), SourceError> {
        self.faults.change(what, rel);
        self.faults
            .enter_to_grow()
            .map_err(|e| SourceError::write(rel, e))
    }

    /// Like `enter_for`, for change `what` that needs no room (rename, removal,
    /// chmod).
    fn enter_to_change(&self, what: &'static str, rel: &Path) -> Result<(), SourceError> {
        self.faults.change(what, rel);
        self.faults.enter().map_err(|e| SourceError::write(rel, e))
    }

    fn writable(&self, rel: &Path, file: Box<dyn WritableFile>) -> Box<dyn WritableFile> {
        Box::new(FaultyFile {
            faults: Arc::clone(&self.faults),
            rel: rel.to_path_buf(),
            file: Inner::Writable(file),
            read: AtomicU64::new(0),
        })
    }
}

impl Faults {
    /// Applies the current behaviour to one operation.
    fn enter(&self) -> io::Result<()> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let mut state = lock(&self.state);
        loop {
            match state.behaviour {
                Behaviour::Healthy
                | Behaviour::Full
                | Behaviour::SlowReads(_)
                | Behaviour::SlowChanges(_) => return Ok(()),
                Behaviour::Eio => return Err(io::Error::from_raw_os_error(libc::EIO)),
                Behaviour::Fails(errno) => return Err(io::Error::from_raw_os_error(errno)),
                Behaviour::Slow(delay) => {
                    drop(state);
                    std::thread::sleep(delay);
                    return Ok(());
                }
                Behaviour::Hang => {
                    state = wait(&self.changed, state);
                }
            }
        }
    }

    /// Notes change `what` at `rel`, and makes it wait as the behaviour says.
    fn change(&self, what: &'static str, rel: &Path) {
        lock(&self.changes).push((what, rel.to_path_buf()));
        let behaviour = lock(&self.state).behaviour;
        if let Behaviour::SlowChanges(delay) = behaviour {
            std::thread::sleep(delay);
        }
    }

    /// Applies the current behaviour to a read of a file's bytes.
    fn enter_to_read(&self) -> io::Result<()> {
        let behaviour = lock(&self.state).behaviour;
        if let Behaviour::SlowReads(delay) = behaviour {
            std::thread::sleep(delay);
        }
        self.enter()
    }

    /// Applies the current behaviour to a write that needs room.
    fn enter_to_grow(&self) -> io::Result<()> {
        self.enter()?;
        match lock(&self.state).behaviour {
            Behaviour::Full => Err(io::Error::from_raw_os_error(libc::ENOSPC)),
            _ => Ok(()),
        }
    }

    fn maybe_rewrite(&self, rel: &Path, read_so_far: u64) {
        let due = {
            let mut state = lock(&self.state);
            let due = state
                .rewrite
                .as_ref()
                .is_some_and(|r| r.rel == rel && read_so_far >= r.after);
            if due { state.rewrite.take() } else { None }
        };
        if let Some(rewrite) = due {
            let path = self.root.join(&rewrite.rel);
            // A later mtime too, as a real writer would leave.
            std::thread::sleep(Duration::from_millis(5));
            let _ = std::fs::write(path, &rewrite.bytes);
        }
    }
}

impl Source for FaultySource {
    fn root(&self) -> &Path {
        self.dir.root()
    }

    fn stat(&self, rel: &Path) -> Result<SourceMeta, SourceError> {
        self.enter_for(rel)?;
        self.dir.stat(rel)
    }

    fn read_dir(&self, rel: &Path) -> Result<Vec<(OsString, SourceMeta)>, SourceError> {
        self.enter_for(rel)?;
        self.dir.read_dir(rel)
    }

    fn read_link(&self, rel: &Path) -> Result<PathBuf, SourceError> {
        self.enter_for(rel)?;
        self.dir.read_link(rel)
    }

    fn open(&self, rel: &Path) -> Result<Box<dyn SourceFile>, SourceError> {
        self.enter_for(rel)?;
        let file = self.dir.open(rel)?;
        Ok(Box::new(FaultyFile {
            faults: Arc::clone(&self.faults),
            rel: rel.to_path_buf(),
            file: Inner::Read(file),
            read: AtomicU64::new(0),
        }))
    }

    fn statfs(&self) -> io::Result<libc::statvfs> {
        self.faults.enter()?;
        self.dir.statfs()
    }

    fn on_local_disk(&self) -> bool {
        self.local_disk.load(Ordering::Relaxed)
    }

    fn create(&self, rel: &Path, how: CreateFile) -> Result<Box<dyn WritableFile>, SourceError> {
        self.enter_to_grow("create", rel)?;
        Ok(self.writable(rel, self.dir.create(rel, how)?))
    }

    fn open_write(&self, rel: &Path, how: WriteOpen) -> Result<Box<dyn WritableFile>, SourceError> {
        // Opening changes nothing yet, unless it truncates.
        if how.truncate {
            self.faults.change("truncate", rel);
        }
        self.faults
            .enter()
            .map_err(|e| SourceError::write(rel, e))?;
        Ok(self.writable(rel, self.dir.open_write(rel, how)?))
    }

    fn set_len(&self, rel: &Path, len: u64) -> Result<(), SourceError> {
        self.enter_to_grow("truncate", rel)?;
        self.dir.set_len(rel, len)
    }

    fn rename(&self, from: &Path, to: &Path, no_replace: bool) -> Result<(), SourceError> {
        self.enter_to_change("rename", from)?;
        self.dir.rename(from, to, no_replace)
    }

    fn unlink(&self, rel: &Path) -> Result<(), SourceError> {
        self.enter_to_change("unlink", rel)?;
        self.dir.unlink(rel)
    }

    fn mkdir(&self, rel: &Path, mode: u32) -> Result<(), SourceError> {
        self.enter_to_grow("mkdir", rel)?;
        self.dir.mkdir(rel, mode)
    }

    fn rmdir(&self, rel: &Path) -> Result<(), SourceError> {
        self.enter_to_change("rmdir", rel)?;
        self.dir.rmdir(rel)
    }

    fn symlink(&self, target: &Path, rel: &Path) -> Result<(), SourceError> {
        self.enter_to_grow("symlink", rel)?;
        self.dir.symlink(target, rel)
    }

    fn link(&self, existing: &Path, rel: &Path) -> Result<(), SourceError> {
        self.enter_to_grow("link", rel)?;
        self.dir.link(existing, rel)
    }

    fn mknod(&self, rel: &Path, mode: u32, rdev: u64) -> Result<(), SourceError> {
        self.enter_to_grow("mknod", rel)?;
        self.dir.mknod(rel, mode, rdev)
    }

    fn set_mode(&self, rel: &Path, mode: u32) -> Result<(), SourceError> {
        self.enter_to_change("chmod", rel)?;
        self.dir.set_mode(rel, mode)
    }

    fn set_owner(&self, rel: &Path, uid: Option<u32>, gid: Option<u32>) -> Result<(), SourceError> {
        self.enter_to_change("chown", rel)?;
        self.dir.set_owner(rel, uid, gid)
    }

    fn set_times(
        &self,
        rel: &Path,
        atime: Option<SetTime>,
        mtime: Option<SetTime>,
    ) -> Result<(), SourceError> {
        self.enter_to_change("utimes", rel)?;
        self.dir.set_times(rel, atime, mtime)
    }
}

/// A file opened from a [`FaultySource`]: its reads and writes misbehave with the
/// source.
#[derive(Debug)]
struct FaultyFile {
    faults: Arc<Faults>,
    rel: PathBuf,
    file: Inner,
    read: AtomicU64,
}

/// The real file behind a [`FaultyFile`].
#[derive(Debug)]
enum Inner {
    Read(Box<dyn SourceFile>),
    Writable(Box<dyn WritableFile>),
}

impl Inner {
    fn file(&self) -> &dyn SourceFile {
        match self {
            Inner::Read(file) => file.as_ref(),
            Inner::Writable(file) => file.as_ref(),
        }
    }

    fn writable(&self) -> io::Result<&dyn WritableFile> {
        match self {
            Inner::Read(_) => Err(io::Error::from_raw_os_error(libc::EBADF)),
            Inner::Writable(file) => Ok(file.as_ref()),
        }
    }
}

impl ReadAt for FaultyFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.faults.enter_to_read()?;
        let n = self.file.file().read_at(buf, offset)?;
        let so_far = self.read.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
        self.faults.maybe_rewrite(&self.rel, so_far);
        Ok(n)
    }
}

impl SourceFile for FaultyFile {
    fn meta(&self) -> io::Result<SourceMeta> {
        self.faults.enter()?;
        self.file.file().meta()
    }
}

impl WritableFile for FaultyFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.faults.change("write", &self.rel);
        self.faults.enter_to_grow()?;
        self.file.writable()?.write_all_at(buf, offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.faults.change("truncate", &self.rel);
        self.faults.enter_to_grow()?;
        self.file.writable()?.set_len(len)
    }

    fn sync(&self, data_only: bool) -> io::Result<()> {
        self.faults.change("sync", &self.rel);
        self.faults.enter()?;
        self.file.writable()?.sync(data_only)
    }

    fn flush(&self) -> io::Result<()> {
        self.faults.enter()?;
        self.file.writable()?.flush()
    }
}
