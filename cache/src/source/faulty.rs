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
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::error::SourceError;
use crate::source::{LocalDir, ReadAt, Source, SourceFile, SourceMeta};

/// How the source behaves right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Like the directory it serves.
    Healthy,
    /// Every operation blocks until [`FaultySource::set`] changes this.
    Hang,
    /// Every operation takes this long first.
    Slow(Duration),
    /// Every operation fails with EIO.
    Eio,
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
}

#[derive(Debug)]
struct State {
    behaviour: Behaviour,
    rewrite: Option<Rewrite>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
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

    fn enter_for(&self, rel: &Path) -> Result<(), SourceError> {
        self.faults.enter().map_err(|e| SourceError::io(rel, e))
    }
}

impl Faults {
    /// Applies the current behaviour to one operation.
    fn enter(&self) -> io::Result<()> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let mut state = lock(&self.state);
        loop {
            match state.behaviour {
                Behaviour::Healthy => return Ok(()),
                Behaviour::Eio => return Err(io::Error::from_raw_os_error(libc::EIO)),
                Behaviour::Slow(delay) => {
                    drop(state);
                    std::thread::sleep(delay);
                    return Ok(());
                }
                Behaviour::Hang => {
                    state = self
                        .changed
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                }
            }
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
            file,
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
}

/// A file opened from a [`FaultySource`]: its reads misbehave with the source.
#[derive(Debug)]
struct FaultyFile {
    faults: Arc<Faults>,
    rel: PathBuf,
    file: Box<dyn SourceFile>,
    read: AtomicU64,
}

impl ReadAt for FaultyFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.faults.enter()?;
        let n = self.file.read_at(buf, offset)?;
        let so_far = self.read.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
        self.faults.maybe_rewrite(&self.rel, so_far);
        Ok(n)
    }
}

impl SourceFile for FaultyFile {
    fn meta(&self) -> io::Result<SourceMeta> {
        self.faults.enter()?;
        self.file.meta()
    }
}
