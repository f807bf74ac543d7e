//! Opens for NFS reads. NFSv3 has no OPEN, so a file is opened in the policy by its
//! first READ, and the policy's staging contract holds unchanged: a large file is
//! served only from a whole, verified copy.
//!
//! The macOS client marks a server "not responding" once a request waits about 5 s
//! (and a soft mount fails the call). So a READ of a file still staging is held at
//! most [`jukebox::MAX_HOLD`], then answered `NFS3ERR_JUKEBOX`: the client sends it
//! again later while the copy goes on, detached from any request. How long each
//! READ is held is planned so that a retry is being held when the copy ends
//! ([`jukebox`]): from the copy's progress, and from the JUKEBOXes this READ (the
//! same file, offset and count) has had and how long its client waited after them.
//! Every READ of the file meanwhile joins the same open.
//!
//! An open handle pins its copy against eviction, so handles nobody read for
//! [`IDLE`] are closed; the next READ opens the file again, at once if its copy is
//! still stored. NFS never says when a reader is done, so when an open finds no
//! room in the cache, the handles idle for [`IDLE_UNDER_PRESSURE`] are closed first
//! and the open tried once more: a model larger than the budget, read file by file,
//! loads as it does over FUSE, where each close unpins.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nfs3_server::nfs3_types::nfs3::nfsstat3;
use stagefs_policy::{FsError, Policy};
use stagefs_source::Stamp;
use stagefs_source::locks::lock;
use stagefs_stage::{StageError, StoreError};
use tokio::sync::watch;
use tracing::debug;

use crate::jukebox::{self, Backoff, CopyEnd, CopyPace, MAX_HOLD};
use crate::status::nfsstat_logged;

/// How often a held READ looks at its copy's progress.
const TICK: Duration = Duration::from_millis(100);

/// How long a READ answered JUKEBOX is remembered as one its client will resend:
/// past the longest wait of any client (Apple's 30 s) with room.
const RETRY_MEMORY: Duration = Duration::from_secs(120);

/// How often a copy some READ waits for is looked at.
const SAMPLE_EVERY: Duration = Duration::from_millis(50);

/// How long an open handle nobody reads keeps its copy pinned.
pub const IDLE: Duration = Duration::from_secs(30);

/// How long a handle must have been idle to be closed when the cache needs room:
/// longer than a READ is ever held ([`MAX_HOLD`]), so no READ in progress loses
/// its file.
pub const IDLE_UNDER_PRESSURE: Duration = Duration::from_secs(5);

/// An open file's policy handle and the version opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Open {
    /// The policy's handle.
    pub fh: u64,
    /// The size of the version opened.
    pub size: u64,
    /// The version opened: once the handle's file has moved past it (a change at
    /// the source, seen by a GETATTR or LOOKUP), READs open the file anew.
    pub stamp: Stamp,
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

/// A READ as its client sends it again after a JUKEBOX (with a new XID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadCall {
    /// The file's inode.
    pub ino: u64,
    /// Where the read starts.
    pub offset: u64,
    /// How many bytes it asks for.
    pub count: u32,
}

/// A READ answered JUKEBOX, which its client will send again.
#[derive(Debug, Clone, Copy)]
struct Retry {
    /// JUKEBOXes answered to it so far.
    tries: u32,
    /// When the last was.
    answered: Instant,
}

/// What the holds are planned from.
#[derive(Debug, Default)]
struct Pace {
    retries: HashMap<ReadCall, Retry>,
    /// How the copies of the inodes READs wait for have moved.
    moves: HashMap<u64, CopyPace>,
    /// The back-off the last client that retried showed, for the READs it has not
    /// retried yet.
    learned: Option<Backoff>,
}

/// The files open for NFS reads, by inode.
#[derive(Debug, Default)]
pub struct Reads {
    slots: Mutex<HashMap<u64, Slot>>,
    pace: Mutex<Pace>,
}

impl Reads {
    /// The open handle of the file `call` reads, opening it (and so staging it) if
    /// needed. Answers `NFS3ERR_JUKEBOX` when the hold [`jukebox`] plans for this
    /// call runs out before the open is done.
    pub async fn open(
        self: &Arc<Self>,
        policy: &Arc<Policy>,
        call: ReadCall,
    ) -> Result<Open, nfsstat3> {
        let mut outcome = match self.slot(policy, call.ino) {
            Ok(open) => {
                self.settled(call);
                return Ok(open);
            }
            Err(outcome) => outcome,
        };
        let arrived = Instant::now();
        let (tries, clients) = self.retry_of(call, arrived);
        loop {
            let held = arrived.elapsed();
            let end = self.copy_end(policy, call.ino);
            if !jukebox::keep_holding(held, end, tries, &clients) {
                debug!(
                    ino = call.ino,
                    tries,
                    ?held,
                    ?end,
                    ?clients,
                    "READ answered JUKEBOX"
                );
                self.answered_jukebox(call, tries);
                // A Mac keeps attributes past their time from a call's second JUKEBOX.
                if tries >= 1 {
                    jukebox::answered(policy);
                }
                return Err(nfsstat3::NFS3ERR_JUKEBOX);
            }
            let tick = TICK.min(MAX_HOLD.saturating_sub(held));
            let done = match tokio::time::timeout(tick, outcome.wait_for(Option::is_some)).await {
                Ok(Ok(done)) => (*done).unwrap_or(Err(nfsstat3::NFS3ERR_SERVERFAULT)),
                // The opener dropped its sender without an outcome: it panicked.
                Ok(Err(_)) => Err(nfsstat3::NFS3ERR_SERVERFAULT),
                Err(_) => continue,
            };
            self.settled(call);
            return done;
        }
    }

    /// How many JUKEBOXes `call` has had, and the back-offs its client may follow:
    /// the one the wait after a READ's first JUKEBOX showed (the last client seen
    /// retrying), else either of those a mount has.
    fn retry_of(&self, call: ReadCall, now: Instant) -> (u32, Vec<Backoff>) {
        let mut pace = self.pace();
        let retry = pace.retries.get(&call).copied();
        let tries = match retry {
            Some(retry) if now.saturating_duration_since(retry.answered) <= RETRY_MEMORY => {
                if retry.tries == 1 {
                    let waited = now.saturating_duration_since(retry.answered);
                    pace.learned = Some(Backoff::from_first_wait(waited));
                }
                retry.tries
            }
            _ => 0,
        };
        let clients = match pace.learned {
            Some(learned) => vec![learned],
            None => Backoff::UNKNOWN.to_vec(),
        };
        (tries, clients)
    }

    fn answered_jukebox(&self, call: ReadCall, tries: u32) {
        let now = Instant::now();
        let mut pace = self.pace();
        if pace.retries.len() > 4096 {
            pace.retries
                .retain(|_, retry| now.saturating_duration_since(retry.answered) < RETRY_MEMORY);
        }
        pace.retries.insert(
            call,
            Retry {
                tries: tries + 1,
                answered: now,
            },
        );
    }

    /// `call` was answered with something other than JUKEBOX: it will not come back.
    fn settled(&self, call: ReadCall) {
        self.pace().retries.remove(&call);
    }

    /// When the copy of `ino` in progress is expected to end, from how it has moved
    /// ([`CopyPace`]); unknown when no copy is under way.
    fn copy_end(&self, policy: &Policy, ino: u64) -> CopyEnd {
        match self.sample(policy, ino) {
            Some(pace) => pace.end(Instant::now()),
            None => CopyEnd::Unknown,
        }
    }

    /// Looks at the copy of `ino` in progress and notes how it moved.
    fn sample(&self, policy: &Policy, ino: u64) -> Option<CopyPace> {
        let progress = policy.copy_progress(ino).filter(|p| p.total > 0)?;
        let now = Instant::now();
        let mut pace = self.pace();
        let fresh = || CopyPace::new(now, progress.read, progress.total);
        let moves = pace.moves.entry(ino).or_insert_with(fresh);
        if progress.read < moves.seen() {
            // A new copy of the file (the last one failed): start over.
            *moves = fresh();
        }
        moves.look(now, progress.read, progress.total);
        Some(*moves)
    }

    /// Samples the copy of `ino` every [`SAMPLE_EVERY`] until its open is done.
    /// Between a READ's JUKEBOX and its retry nothing else looks at the copy, and a
    /// step first seen at the retry would be dated then: the rate would be taken as
    /// slower than it is, and the retries planned past the copy's end.
    fn watch_copy(
        self: &Arc<Self>,
        policy: &Arc<Policy>,
        ino: u64,
        mut done: watch::Receiver<Outcome>,
    ) {
        let (this, policy) = (Arc::clone(self), Arc::clone(policy));
        tokio::spawn(async move {
            while done.borrow().is_none() {
                this.sample(&policy, ino);
                if let Ok(Err(_)) = tokio::time::timeout(SAMPLE_EVERY, done.changed()).await {
                    return;
                }
            }
        });
    }

    /// The open handle of `ino` if it is open already, on the version `ino` stands
    /// for now; never opens or waits.
    pub fn open_now(&self, policy: &Policy, ino: u64) -> Option<Open> {
        let current = policy.version_of(ino);
        match self.lock().get_mut(&ino) {
            Some(Slot::Open { open, used }) if current == Some(open.stamp) => {
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
        let current = policy.version_of(ino);
        let mut slots = self.lock();
        let mut outdated = None;
        match slots.get_mut(&ino) {
            Some(Slot::Open { open, used }) if current == Some(open.stamp) => {
                *used = Instant::now();
                return Ok(*open);
            }
            // The file changed at the source since this handle was opened: its
            // client was shown the new attributes, so it must read the new version.
            Some(Slot::Open { open, .. }) => outdated = Some(open.fh),
            Some(Slot::Opening(outcome)) => return Err(outcome.clone()),
            None => {}
        }
        let (tx, rx) = watch::channel(None);
        slots.insert(ino, Slot::Opening(rx.clone()));
        drop(slots);
        if let Some(fh) = outdated {
            policy.release(fh);
        }
        self.start_open(policy, ino, tx);
        Err(rx)
    }

    /// Opens `ino` in the background: the open outlives the READ that asked for it.
    fn start_open(self: &Arc<Self>, policy: &Arc<Policy>, ino: u64, done: watch::Sender<Outcome>) {
        self.watch_copy(policy, ino, done.subscribe());
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
                    let stamp = opened.stamp;
                    let open = Open {
                        fh: policy.register(opened, None),
                        size: stamp.size,
                        stamp,
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
            this.pace().moves.remove(&ino);
            let _ = done.send(Some(outcome));
        });
    }

    /// Forgets the open of `ino` (its version is stale), and those of the other names
    /// of the same file, hard links: the next READ of any of them opens anew.
    pub fn forget(&self, policy: &Policy, ino: u64) {
        // The other names of a hard-linked file read the same bytes on the source:
        // their open copies are of the version before the change too.
        let linked = policy.source_inode(ino);
        let same_file = |other: u64| {
            other == ino || linked.is_some_and(|s| policy.source_inode(other) == Some(s))
        };
        let mut released = Vec::new();
        self.lock().retain(|&other, slot| match slot {
            Slot::Open { open, .. } if same_file(other) => {
                released.push(open.fh);
                false
            }
            Slot::Opening(_) if other == ino => false,
            _ => true,
        });
        for fh in released {
            policy.release(fh);
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
        lock(&self.slots)
    }

    fn pace(&self) -> std::sync::MutexGuard<'_, Pace> {
        lock(&self.pace)
    }
}

/// Whether an open failed because the cache budget had no room for the file.
fn needs_room(e: &FsError) -> bool {
    matches!(
        e,
        FsError::Stage(StageError::Store(StoreError::NoRoom { .. }))
    )
}
