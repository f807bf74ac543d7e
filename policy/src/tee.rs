//! Staged as it is written: the bytes a handle writes to a new file go to the source
//! and, in the same pass, to a temp file in the cache, which becomes the file's
//! staged copy once the file is complete, closed and verified. So the first load
//! after a download through the mount reads nothing back over the link.
//!
//! The local side (the temp file, the room it takes in the budget) is the stage
//! layer's [`TeeWriter`]; this decides which handles tee and what their close does.
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
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stagefs_source::locks::lock;
use stagefs_source::{SourceError, WritableFile};
use stagefs_stage::{SourceVersion, Stager, TeeWriter, WrittenCopy, named_by_sha256};
use tempfile::NamedTempFile;

use tokio::runtime::Handle;
use tracing::debug;

use crate::taint::Taints;

/// How long a written `.incomplete` blob waits for its rename.
const PARKED_FOR: Duration = Duration::from_secs(60);

/// What one handle's staging as it writes needs: the local copy it fills (the stage
/// layer's [`TeeWriter`]) and what tells at close whether anything else changed the
/// file through the mount meanwhile.
#[derive(Debug)]
pub(crate) struct Tee {
    copy: TeeWriter,
    /// The path's taint when the handle opened, or from its own latest change of
    /// the file's attributes (a preallocating `ftruncate`).
    baseline: AtomicU64,
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
pub(crate) struct Tees {
    stager: Stager,
    taints: Arc<Taints>,
    runtime: Handle,
    min_stage_size: u64,
    /// Taints copies waiting for their renames, by inode.
    parked: Arc<Mutex<HashMap<u64, Parked>>>,
    /// Files outside `blobs/` whose written copy was adopted, with the taint their
    /// close left: a rename that follows with nothing changed since (a careful
    /// saver's temp name to its final one) carries the copy over.
    closes: Arc<Mutex<HashMap<PathBuf, u64>>>,
}

/// The most closes remembered for a rename; past it they are forgotten (such a
/// rename then stages the file at its first open, as any file not written through
/// the mount).
const CLOSES_KEPT: usize = 1024;

impl Tee {
    pub(crate) fn new(copy: TeeWriter, opened_at: u64) -> Tee {
        Tee {
            copy,
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

    /// Also writes `data` at `offset` to the local copy ([`TeeWriter::write`]):
    /// called where blocking is allowed, after the source took the same bytes.
    pub(crate) fn write(&self, data: &[u8], offset: u64) {
        self.copy.write(data, offset);
    }

    /// The file was truncated or extended to `len` ([`TeeWriter::set_len`]).
    pub(crate) fn set_len(&self, len: u64) {
        self.copy.set_len(len);
    }

    /// Drops the copy: a write to the source failed, so the file is not what it saw.
    pub(crate) fn abandon(&self) {
        self.copy.abandon();
    }
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
    named_by_sha256(&path.with_file_name(sha))
}

impl Tees {
    pub(crate) fn new(
        stager: Stager,
        taints: Arc<Taints>,
        runtime: Handle,
        min_stage_size: u64,
    ) -> Self {
        Tees {
            stager,
            taints,
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
        let Some(copy) = tee.copy.take() else {
            debug!(path = %stagefs_source::logged(&path), "closed without a whole written copy");
            return;
        };
        if copy.len < self.min_stage_size {
            // Small files are read from the source; nothing to stage.
            return;
        }
        let content = named_by_sha256(&path);
        if incomplete_blob(&path) {
            // Parked at once: the rename follows the close at once, and may come
            // before anything asked here could answer. It checks the size itself.
            let parked = Parked {
                tmp: copy.tmp,
                len: copy.len,
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
            debug!(path = %stagefs_source::logged(&path), "changed by another handle too; not staged as written");
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
        let (taints, cleared) = (Arc::clone(&self.taints), path.clone());
        let committed = move || {
            // The copy is of the file as this handle left it: a later change taints
            // it anew.
            if let Some(generation) = closed_at {
                taints.cleared(&cleared, generation);
            }
        };
        self.stager.adopt_written(&path, copy, version, committed);
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
        let (taints, cleared) = (Arc::clone(&self.taints), to.to_path_buf());
        self.stager.adopt_renamed(from, to, version, move || {
            taints.cleared(&cleared, generation);
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
        if !named_by_sha256(to) {
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
