//! Staged as it is written: the bytes a handle writes to a new file go to the source
//! and, in the same pass, to a temp file in the cache, which becomes the file's
//! staged copy once the file is complete, closed and verified. So the first load
//! after a download through the mount reads nothing back over the link.
//!
//! A tee only follows a handle that created its file (or truncated it to nothing)
//! with no other writer on it, and that writes it front to back: any write out of
//! order, a truncate below what it holds, or a failed local write drops the tee
//! (the file is then staged from the source at its first open, as any other). A
//! preallocating extension does not (safetensors sets the whole length first). At
//! close:
//! - the source must hold exactly the bytes the tee saw (its size, from the source);
//! - a file named as an LFS blob (`blobs/<sha256>`) is committed only if its sha256
//!   is its name, whatever else wrote to it;
//! - `blobs/<sha256>[.<random>].incomplete`, huggingface_hub's temp name, waits (a
//!   minute at most) for its rename to a blob's name, and is committed under it;
//! - any other file is committed under its path, with its blake3, only if nothing
//!   but this handle changed it through the mount while it was open (no taint but
//!   its own, no other handle that wrote); a rename before the close (FUSE's
//!   RELEASE comes on its own time) or after it, with nothing changed in between,
//!   takes the copy to the new name (a careful saver's temp name to its final one).
//!
//! A copy is committed like a prefetched one: it never evicts anything. One waiting
//! for a rename that does not come is dropped after a minute.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use stagefs_cache::stage::{SourceVersion, WrittenCopy};
use stagefs_cache::{Key, SourceError, Stager, WritableFile};
use tempfile::NamedTempFile;

use tokio::runtime::Handle;
use tracing::debug;

use crate::written::Written;

/// How often, in bytes written, a copy being filled asks whether the cache's budget
/// still has room for it (like a prefetch, it may not evict to make some).
const ROOM_EVERY: u64 = 32 << 20;

/// How long a written `.incomplete` blob waits for its rename.
const PARKED_FOR: Duration = Duration::from_secs(60);

/// The local copy one handle fills as it writes.
#[derive(Debug)]
pub(crate) struct Tee {
    state: Mutex<Filling>,
    /// The path's taint when the handle opened, or from its own latest change of
    /// the file's attributes (a preallocating `ftruncate`): to tell at close whether
    /// anything else changed the file through the mount meanwhile.
    baseline: AtomicU64,
}

#[derive(Debug)]
enum Filling {
    /// Nothing written yet: no temp file either.
    Empty,
    /// `next` bytes written so far, front to back.
    Copy { tmp: NamedTempFile, next: u64 },
    /// Given up.
    Dropped,
}

/// A written copy waiting for its file's rename (`.incomplete` to the blob's name).
#[derive(Debug)]
struct Parked {
    tmp: NamedTempFile,
    len: u64,
    since: Instant,
}

/// What staging as written needs of the mount, apart from the policy itself (a
/// handle's close may come where only a reference to the policy is at hand).
#[derive(Debug, Clone)]
pub(crate) struct WrittenCopies {
    stager: Stager,
    written: Arc<Written>,
    runtime: Handle,
    min_stage_size: u64,
    /// Written copies waiting for their renames, by inode.
    parked: Arc<Mutex<HashMap<u64, Parked>>>,
    /// Files outside `blobs/` whose written copy was adopted, with the taint their
    /// close left: a rename that follows with nothing changed since (a careful
    /// saver's temp name to its final one) carries the copy over.
    closes: Arc<Mutex<HashMap<PathBuf, u64>>>,
}

/// The most closes remembered for a rename; past it they are forgotten (such a
/// rename then stages the file at its first open, as before).
const CLOSES_KEPT: usize = 1024;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Tee {
    pub(crate) fn new(opened_at: u64) -> Tee {
        Tee {
            state: Mutex::new(Filling::Empty),
            baseline: AtomicU64::new(opened_at),
        }
    }

    /// The taint this handle's own changes left last (see [`Tee::baseline`]).
    pub(crate) fn baseline(&self) -> u64 {
        self.baseline.load(Ordering::Relaxed)
    }

    /// The handle changed the file itself, leaving taint `generation`, with nothing
    /// else changing it since the baseline.
    pub(crate) fn rebase(&self, generation: u64) {
        self.baseline.store(generation, Ordering::Relaxed);
    }

    /// Also writes `data` at `offset` to the copy (a temp file in `store`, made at
    /// the first write), if it continues it; otherwise the copy is dropped. Local
    /// I/O: called where blocking is allowed (a source thread, after the source
    /// took the same bytes).
    pub(crate) fn write(&self, store: &stagefs_cache::Store, data: &[u8], offset: u64) {
        let mut state = lock(&self.state);
        if matches!(*state, Filling::Empty) && offset == 0 {
            *state = match store.create_temp() {
                Ok(tmp) => Filling::Copy { tmp, next: 0 },
                Err(_) => Filling::Dropped,
            };
        }
        let len = data.len() as u64;
        let kept = match &mut *state {
            Filling::Copy { tmp, next } if *next == offset => {
                let crosses = offset == 0 || (offset + len) / ROOM_EVERY != offset / ROOM_EVERY;
                let room = !crosses || has_room(store, offset);
                room && FileExt::write_all_at(tmp.as_file(), data, offset)
                    .map(|()| *next += len)
                    .is_ok()
            }
            _ => false,
        };
        if !kept {
            *state = Filling::Dropped;
        }
    }

    /// The file was truncated or extended to `len`: the copy goes on unless that
    /// cuts into what it holds. An extension is what a writer that preallocates does
    /// (safetensors' `save_file` sets the whole length, then writes front to back):
    /// only writes that go on from where the copy stands keep it, and at close the
    /// source must hold exactly the bytes it has.
    pub(crate) fn set_len(&self, len: u64) {
        let mut state = lock(&self.state);
        let at = match &*state {
            Filling::Empty => 0,
            Filling::Copy { next, .. } => *next,
            Filling::Dropped => return,
        };
        if len < at {
            *state = Filling::Dropped;
        }
    }

    /// Drops the copy: a write to the source failed, so the file is not what it saw.
    pub(crate) fn abandon(&self) {
        *lock(&self.state) = Filling::Dropped;
    }

    fn take(&self) -> Option<(NamedTempFile, u64)> {
        match std::mem::replace(&mut *lock(&self.state), Filling::Dropped) {
            Filling::Copy { tmp, next } => Some((tmp, next)),
            _ => None,
        }
    }
}

/// Whether the cache's budget has room for the next [`ROOM_EVERY`] bytes of a copy
/// that holds `filled` bytes in its temp file (counted as the cache's; the volume's
/// free space already lacks them).
fn has_room(store: &stagefs_cache::Store, filled: u64) -> bool {
    store.usage().is_ok_and(|u| {
        let used = u.used.saturating_add(u.reserved).saturating_add(filled);
        stagefs_cache::store::budget::fits(&u.budget, used, u.reserved, ROOM_EVERY, u.volume)
    })
}

/// `blobs/<sha256>.incomplete` or `blobs/<sha256>.<random>.incomplete`:
/// huggingface_hub's names for a blob being downloaded.
fn incomplete_blob(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    let Some(sha) = name
        .strip_suffix(".incomplete")
        .and_then(|n| n.split('.').next())
    else {
        return false;
    };
    Key::for_source_path(&path.with_file_name(sha))
        .content_sha256()
        .is_some()
}

impl WrittenCopies {
    pub(crate) fn new(
        stager: Stager,
        written: Arc<Written>,
        runtime: Handle,
        min_stage_size: u64,
    ) -> Self {
        WrittenCopies {
            stager,
            written,
            runtime,
            min_stage_size,
            parked: Arc::default(),
            closes: Arc::default(),
        }
    }

    /// The handle with `tee`, writing `file` at `path` (inode `ino`), was closed.
    /// `untouched`: nothing else changed the path through the mount while it was
    /// open; `closed_at`: the taint its close left, which a commit clears.
    pub(crate) fn closed(
        &self,
        ino: u64,
        path: PathBuf,
        tee: &Tee,
        file: Arc<dyn WritableFile>,
        untouched: bool,
        closed_at: Option<u64>,
    ) {
        let Some((tmp, len)) = tee.take() else {
            debug!(path = %path.display(), "closed without a whole written copy");
            return;
        };
        if len < self.min_stage_size {
            // Small files are read from the source; nothing to stage.
            return;
        }
        let content = Key::for_source_path(&path).content_sha256().is_some();
        if incomplete_blob(&path) {
            // Parked at once: the rename follows the close at once, and may come
            // before anything asked here could answer. It checks the size itself.
            let parked = Parked {
                tmp,
                len,
                since: Instant::now(),
            };
            lock(&self.parked).insert(ino, parked);
            let expiring = Arc::clone(&self.parked);
            self.runtime.spawn(async move {
                tokio::time::sleep(PARKED_FOR).await;
                lock(&expiring).retain(|_, p| p.since.elapsed() < PARKED_FOR);
            });
            return;
        }
        if !content && !untouched {
            debug!(path = %path.display(), "changed by another handle too; not staged as written");
            return;
        }
        if let Some(generation) = closed_at {
            let mut closes = lock(&self.closes);
            if closes.len() >= CLOSES_KEPT {
                closes.clear();
            }
            closes.insert(path.clone(), generation);
        }
        let source_path = path.clone();
        let version: SourceVersion =
            Box::new(move || file.meta().map_err(|e| SourceError::io(&source_path, e)));
        let (written, cleared) = (Arc::clone(&self.written), path.clone());
        let committed = move || {
            // The copy is of the file as this handle left it: a later change taints
            // it anew.
            if let Some(generation) = closed_at {
                written.cleared(&cleared, generation);
            }
        };
        self.stager
            .adopt_written(&path, WrittenCopy { tmp, len }, version, committed);
    }

    /// Whether `path`'s written copy can follow a rename: one was adopted at a close
    /// whose taint is still `latest`, its latest (nothing changed it since).
    pub(crate) fn unchanged_since_close(&self, path: &Path, latest: u64) -> bool {
        lock(&self.closes).remove(path) == Some(latest)
    }

    /// What the source holds at `path` now, for a written copy's check.
    fn source_version(&self, path: &Path) -> SourceVersion {
        let (source, path) = (self.stager.source().clone(), path.to_path_buf());
        Box::new(move || source.stat(&path))
    }

    /// `from`, unchanged since its written copy was adopted, was renamed to `to`
    /// (whose taint from the rename is `generation`): the copy becomes `to`'s,
    /// checked against what the source holds there, and may follow a further rename.
    pub(crate) fn carry_over(&self, from: &Path, to: &Path, generation: u64) {
        lock(&self.closes).insert(to.to_path_buf(), generation);
        let version = self.source_version(to);
        let (written, cleared) = (Arc::clone(&self.written), to.to_path_buf());
        self.stager.adopt_renamed(from, to, version, move || {
            written.cleared(&cleared, generation);
        });
    }

    /// `ino` was renamed to `to`: a copy of it parked for that is committed under
    /// the new name, if it is a blob's. Entered as the blob's copy in flight before
    /// the rename is answered, so an open of the blob that follows waits for it.
    pub(crate) fn renamed(&self, ino: u64, to: &Path) {
        let parked = {
            let mut parked = lock(&self.parked);
            parked.retain(|_, p| p.since.elapsed() < PARKED_FOR);
            parked.remove(&ino)
        };
        let Some(parked) = parked else {
            return;
        };
        if Key::for_source_path(to).content_sha256().is_none() {
            return;
        }
        let version = self.source_version(to);
        let copy = WrittenCopy {
            tmp: parked.tmp,
            len: parked.len,
        };
        self.stager.adopt_written(to, copy, version, || {});
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huggingface_hubs_temp_names_for_blobs_are_recognised() {
        let sha = "e".repeat(64);
        for name in [
            format!("{sha}.incomplete"),
            format!("{sha}.5b32a042.incomplete"),
        ] {
            assert!(incomplete_blob(&Path::new("m/blobs").join(name)));
        }
        for name in [format!("{sha}.part"), "abc.incomplete".into(), sha.clone()] {
            assert!(!incomplete_blob(&Path::new("m/blobs").join(name)));
        }
        assert!(!incomplete_blob(
            &Path::new("m/other").join(format!("{sha}.incomplete"))
        ));
    }
}
