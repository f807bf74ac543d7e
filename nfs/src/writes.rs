//! Opens for NFS writes. NFSv3 has no OPEN or CLOSE, so a file is opened for writing
//! in the policy by its CREATE (which hands back a write handle) or by the first
//! WRITE that finds none, and every later WRITE, COMMIT and size change of it goes
//! through that one handle, as a FUSE writer's would.
//!
//! A handle no WRITE used for [`IDLE`] is closed; its close is what commits the copy
//! staged as it was written (`policy/src/tee.rs`). A kernel client writes a
//! file's dirty pages back at close (close-to-open), so the last WRITE of a file
//! comes as its writer closes it: 2 s later the copy is committed, and a WRITE that
//! comes after a pause longer than that opens the file anew (its bytes still reach
//! the source; only that write's local copy is given up, and the file is staged
//! from the source at its first open, as any other). A handle is never closed while
//! a WRITE through it is in progress. Before a RENAME or REMOVE of the file, its
//! handle is closed too (when nothing writes through it), so a blob written as
//! `blobs/<sha>.incomplete` is committed under its final name at the rename.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stagefs_policy::{FsError, Policy};
use stagefs_source::WriteOpen;
use stagefs_source::locks::lock;
use tokio::sync::OnceCell;

/// How long a write handle nobody writes through stays open.
pub const IDLE: Duration = Duration::from_secs(2);

/// How often write handles are looked at for idleness.
pub const SWEEP: Duration = Duration::from_millis(500);

#[derive(Debug)]
struct Slot {
    /// The policy's write handle, once opened (concurrent first WRITEs share it).
    fh: OnceCell<u64>,
    /// WRITEs (and COMMITs) in progress through it.
    busy: AtomicUsize,
    used: Mutex<Instant>,
}

impl Default for Slot {
    fn default() -> Slot {
        Slot {
            fh: OnceCell::new(),
            busy: AtomicUsize::new(0),
            used: Mutex::new(Instant::now()),
        }
    }
}

impl Slot {
    fn touch(&self) {
        *lock(&self.used) = Instant::now();
    }

    fn idle_for(&self) -> Duration {
        lock(&self.used).elapsed()
    }
}

/// A write handle in use: closing waits for its user to drop this.
#[derive(Debug)]
pub struct InUse {
    slot: Arc<Slot>,
    /// The policy's write handle.
    pub fh: u64,
}

impl Drop for InUse {
    fn drop(&mut self) {
        self.slot.touch();
        self.slot.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The files open for NFS writes, by inode.
#[derive(Debug, Default)]
pub struct Writes {
    slots: Mutex<HashMap<u64, Arc<Slot>>>,
}

impl Writes {
    /// Keeps write handle `fh` of `ino`, just created (CREATE), for the WRITEs to
    /// come. A handle already kept for `ino` is closed.
    pub fn adopt(&self, policy: &Policy, ino: u64, fh: u64) {
        let slot = Arc::new(Slot::default());
        let _ = slot.fh.set(fh);
        slot.touch();
        let old = self.lock().insert(ino, slot);
        if let Some(old) = old.and_then(|old| old.fh.get().copied()) {
            policy.release(old);
        }
    }

    /// The write handle of `ino`, opened if none is open; held until dropped.
    pub async fn open(&self, policy: &Arc<Policy>, ino: u64) -> Result<InUse, FsError> {
        let slot = {
            let mut slots = self.lock();
            let slot = Arc::clone(slots.entry(ino).or_default());
            slot.busy.fetch_add(1, Ordering::AcqRel);
            slot
        };
        let opened = slot
            .fh
            .get_or_try_init(|| async {
                let how = WriteOpen {
                    read: true,
                    truncate: false,
                };
                policy.open_write(ino, how).await
            })
            .await
            .copied();
        match opened {
            Ok(fh) => Ok(InUse { slot, fh }),
            Err(e) => {
                slot.busy.fetch_sub(1, Ordering::AcqRel);
                let mut slots = self.lock();
                if slots
                    .get(&ino)
                    .is_some_and(|s| Arc::ptr_eq(s, &slot) && s.fh.get().is_none())
                {
                    slots.remove(&ino);
                }
                Err(e)
            }
        }
    }

    /// The write handle of `ino` if one is open; held until dropped. Never opens.
    pub fn open_now(&self, ino: u64) -> Option<InUse> {
        let slots = self.lock();
        let slot = slots.get(&ino)?;
        let fh = *slot.fh.get()?;
        slot.busy.fetch_add(1, Ordering::AcqRel);
        Some(InUse {
            slot: Arc::clone(slot),
            fh,
        })
    }

    /// Closes the write handle of `ino` unless a WRITE is using it; whether none is
    /// left open.
    pub fn close(&self, policy: &Policy, ino: u64) -> bool {
        let closed = {
            let mut slots = self.lock();
            match slots.get(&ino) {
                None => return true,
                Some(slot) if slot.busy.load(Ordering::Acquire) > 0 => return false,
                Some(_) => slots.remove(&ino),
            }
        };
        if let Some(fh) = closed.and_then(|slot| slot.fh.get().copied()) {
            policy.release(fh);
        }
        true
    }

    /// Closes every handle nobody wrote through for `idle`; how many.
    pub fn close_idle(&self, policy: &Policy, idle: Duration) -> usize {
        let mut closing = Vec::new();
        self.lock().retain(|_, slot| {
            let idle = slot.busy.load(Ordering::Acquire) == 0
                && slot.idle_for() >= idle
                && slot.fh.initialized();
            if idle {
                closing.extend(slot.fh.get().copied());
            }
            !idle
        });
        for fh in &closing {
            policy.release(*fh);
        }
        closing.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Slot>>> {
        lock(&self.slots)
    }
}
