//! Open file and directory handles.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use stagefs_source::locks::lock;
use stagefs_source::{SourceFile, WritableFile};
use stagefs_stage::Pin;

use crate::attr::Attr;

/// Something an adapter keeps alive as long as a handle is open (FUSE: the kernel's
/// passthrough backing id).
pub type Keepalive = Arc<dyn std::any::Any + Send + Sync>;

/// Where a handle's reads come from.
#[derive(Debug, Clone)]
pub(crate) enum Reader {
    /// A staged copy on the local disk.
    Copy(Arc<File>),
    /// The file on the source itself (small files, or `--on-full` reading the source).
    Source(Arc<dyn SourceFile>),
}

/// What an open file handle reads from.
#[derive(Debug)]
pub(crate) struct OpenFile {
    /// Where its reads come from.
    pub(crate) reader: Reader,
    /// Keeps the adapter's state for this handle (a passthrough backing id) alive.
    pub(crate) _keep: Option<Keepalive>,
    /// Keeps the staged copy from being evicted while this handle is open.
    pub(crate) _pin: Option<Arc<Pin>>,
    /// For a handle open for writing: the file on the source it writes to.
    pub(crate) writer: Option<Writer>,
}

/// A handle's writes: the source file, and the inode it was opened on (whose path
/// follows renames, so the handle's file is always known by its current name).
#[derive(Debug)]
pub(crate) struct Writer {
    pub(crate) file: Arc<dyn WritableFile>,
    pub(crate) ino: u64,
    /// The local copy it fills as it writes, for a new file (`policy/src/tee.rs`).
    pub(crate) tee: Option<crate::tee::Tee>,
    /// Whether a write was sent through it (even one that failed: it may have
    /// landed in part). A handle that wrote nothing changes nothing at its close.
    pub(crate) wrote: std::sync::atomic::AtomicBool,
}

/// One entry of a directory listing snapshot, with the attributes it is presented with.
#[derive(Debug, Clone)]
pub struct DirEntry {
    /// The entry's attributes (its inode, kind, size...).
    pub attr: Attr,
    /// Its name in the directory.
    pub name: OsString,
}

/// A table of handles of type `T`, keyed by the numbers handed to the kernel.
#[derive(Debug)]
pub(crate) struct Handles<T> {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Arc<T>>>,
}

impl<T> Handles<T> {
    pub(crate) fn new() -> Self {
        Handles {
            next: AtomicU64::new(1),
            open: Mutex::default(),
        }
    }

    pub(crate) fn insert(&self, value: T) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(fh, Arc::new(value));
        fh
    }

    pub(crate) fn get(&self, fh: u64) -> Option<Arc<T>> {
        self.lock().get(&fh).cloned()
    }

    pub(crate) fn remove(&self, fh: u64) -> Option<Arc<T>> {
        self.lock().remove(&fh)
    }

    /// The first open handle `pick` takes.
    pub(crate) fn find(&self, pick: impl Fn(&T) -> bool) -> Option<Arc<T>> {
        self.lock().values().find(|v| pick(v)).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<T>>> {
        lock(&self.open)
    }
}
