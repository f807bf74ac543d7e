//! Opens for NFS reads. NFSv3 has no OPEN, so a file is opened in the policy by its
//! first READ, and the policy's staging contract holds unchanged: a large file is
//! served only from a whole, verified copy.
//!
//! The macOS client marks a server "not responding" once a request waits about 5 s
//! (and a soft mount fails the call). So a READ waits at most [`HOLD`] for an open
//! still staging, then answers `NFS3ERR_JUKEBOX`: the client retries later (macOS
//! after 4 s, doubling to 30 s; Linux after 5 s) while the copy goes on, detached
//! from any request. Every READ of the file meanwhile joins the same open.
//!
//! An open handle pins its copy against eviction, so handles nobody read for
//! [`IDLE`] are closed; the next READ opens the file again, at once if its copy is
//! still stored. NFS never says when a reader is done, so when an open finds no
//! room in the cache, the handles idle for [`IDLE_UNDER_PRESSURE`] are closed first
//! and the open tried once more: a model larger than the budget, read file by file,
//! loads as it does over FUSE, where each close unpins.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use nfs3_server::nfs3_types::nfs3::nfsstat3;
use stagefs_cache::{StageError, StoreError};
use stagefs_policy::{FsError, Policy};
use tokio::sync::watch;

use crate::status::nfsstat_logged;

/// How long a READ waits for its file's open before answering JUKEBOX: well inside
/// the macOS client's 5 s "not responding" mark, with room for the read itself.
pub const HOLD: Duration = Duration::from_millis(2500);

/// How long an open handle nobody reads keeps its copy pinned.
pub const IDLE: Duration = Duration::from_secs(30);

/// How long a handle must have been idle to be closed when the cache needs room:
/// longer than a READ is ever held, so no READ in progress loses its file.
pub const IDLE_UNDER_PRESSURE: Duration = Duration::from_secs(2);

/// An open file's policy handle and the size of the version opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Open {
    /// The policy's handle.
    pub fh: u64,
    /// The size of the version opened.
    pub size: u64,
}

type Outcome = Option<Result<Open, nfsstat3>>;

#[derive(Debug)]
enum Slot {
    /// The open is under way; its outcome is sent once.
    Opening(watch::Receiver<Outcome>),
    Open {
        open: Open,
        used: Instant,
    },
}

/// The files open for NFS reads, by inode.
#[derive(Debug, Default)]
pub struct Reads {
    slots: Mutex<HashMap<u64, Slot>>,
}

impl Reads {
    /// The open handle for inode `ino`, opening it (and so staging it) if needed.
    /// Answers `NFS3ERR_JUKEBOX` if the open is not done within `hold`.
    pub async fn open(
        self: &Arc<Self>,
        policy: &Arc<Policy>,
        ino: u64,
        hold: Duration,
    ) -> Result<Open, nfsstat3> {
        let mut outcome = match self.slot(policy, ino) {
            Ok(open) => return Ok(open),
            Err(outcome) => outcome,
        };
        let waited = tokio::time::timeout(hold, outcome.wait_for(Option::is_some)).await;
        match waited {
            Ok(Ok(done)) => (*done).unwrap_or(Err(nfsstat3::NFS3ERR_SERVERFAULT)),
            // The opener dropped its sender without an outcome: it panicked.
            Ok(Err(_)) => Err(nfsstat3::NFS3ERR_SERVERFAULT),
            Err(_) => Err(nfsstat3::NFS3ERR_JUKEBOX),
        }
    }

    /// The open handle of `ino` if it is open already; never opens or waits.
    pub fn open_now(&self, ino: u64) -> Option<Open> {
        match self.lock().get_mut(&ino) {
            Some(Slot::Open { open, used }) => {
                *used = Instant::now();
                Some(*open)
            }
            _ => None,
        }
    }

    /// The open handle of `ino`, or the outcome to wait for of an open under way
    /// (started here if none is).
    fn slot(
        self: &Arc<Self>,
        policy: &Arc<Policy>,
        ino: u64,
    ) -> Result<Open, watch::Receiver<Outcome>> {
        let mut slots = self.lock();
        match slots.get_mut(&ino) {
            Some(Slot::Open { open, used }) => {
                *used = Instant::now();
                return Ok(*open);
            }
            Some(Slot::Opening(outcome)) => return Err(outcome.clone()),
            None => {}
        }
        let (tx, rx) = watch::channel(None);
        slots.insert(ino, Slot::Opening(rx.clone()));
        drop(slots);
        self.start_open(policy, ino, tx);
        Err(rx)
    }

    /// Opens `ino` in the background: the open outlives the READ that asked for it.
    fn start_open(self: &Arc<Self>, policy: &Arc<Policy>, ino: u64, done: watch::Sender<Outcome>) {
        let (this, policy) = (Arc::clone(self), Arc::clone(policy));
        let mine = done.subscribe();
        tokio::spawn(async move {
            let opened = match policy.open(ino).await {
                Err(e) if needs_room(&e) && this.close_idle(&policy, IDLE_UNDER_PRESSURE) > 0 => {
                    policy.open(ino).await
                }
                opened => opened,
            };
            let outcome = match opened {
                Ok(opened) => {
                    let size = opened.stamp.size;
                    let open = Open {
                        fh: policy.register(opened, None),
                        size,
                    };
                    let used = Instant::now();
                    let mut slots = this.lock();
                    // Forgotten meanwhile (a change through NFS): the version opened
                    // may be the old one, so it is not kept; a READ that waited for
                    // it finds its handle gone and opens the file anew.
                    let ours = matches!(
                        slots.get(&ino),
                        Some(Slot::Opening(outcome)) if outcome.same_channel(&mine)
                    );
                    if ours {
                        slots.insert(ino, Slot::Open { open, used });
                    } else {
                        drop(slots);
                        policy.release(open.fh);
                    }
                    Ok(open)
                }
                Err(e) => {
                    // The next READ tries again from scratch.
                    let mut slots = this.lock();
                    if matches!(
                        slots.get(&ino),
                        Some(Slot::Opening(outcome)) if outcome.same_channel(&mine)
                    ) {
                        slots.remove(&ino);
                    }
                    drop(slots);
                    Err(nfsstat_logged("read", &e))
                }
            };
            let _ = done.send(Some(outcome));
        });
    }

    /// Forgets the open of `ino` (its version is stale): the next READ opens anew.
    pub fn forget(&self, policy: &Policy, ino: u64) {
        let removed = self.lock().remove(&ino);
        if let Some(Slot::Open { open, .. }) = removed {
            policy.release(open.fh);
        }
    }

    /// Closes every handle nobody read for `idle`, releasing its copy's pin.
    pub fn close_idle(&self, policy: &Policy, idle: Duration) -> usize {
        let mut idle_handles = Vec::new();
        self.lock().retain(|_, slot| match slot {
            Slot::Open { open, used } if used.elapsed() >= idle => {
                idle_handles.push(open.fh);
                false
            }
            _ => true,
        });
        for fh in &idle_handles {
            policy.release(*fh);
        }
        idle_handles.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Slot>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Whether an open failed because the cache budget had no room for the file.
fn needs_room(e: &FsError) -> bool {
    matches!(
        e,
        FsError::Stage(StageError::Store(StoreError::NoRoom { .. }))
    )
}
