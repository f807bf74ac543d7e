//! Making answered copies durable, in the background.
//!
//! A copy is served as soon as it is whole and verified ([`super::Store::record`]).
//! This thread then syncs its data and its name and journals its entry again, now
//! with its identity ([`crate::index::Index::commit`]). Until then the copy is pinned,
//! so no eviction or `evict` races its commit, and its journal line has no identity,
//! so a restart re-hashes it before serving it (or drops it, if what reached the disk
//! is not what was verified).
//!
//! Commits wait while other copies are in progress, up to [`WAIT_FOR_COPIES_MAX`]:
//! with the source on the cache's disk, writing one shard while the next is read
//! from the same disk slowed both, and the loader waits for the reads, not for the
//! writes. Several copies waiting are synced together, with one directory sync and
//! one journal sync.

use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use stagefs_source::locks::{lock, wait};
use tracing::{debug, warn};

use super::{Ledger, Pin};
use crate::index::CopyId;
use crate::key::Key;

/// The longest a verified copy waits for other copies to finish before it is synced
/// anyway, so a long prefetch does not leave a finished shard in memory only.
pub(super) const WAIT_FOR_COPIES_MAX: Duration = Duration::from_secs(5);

/// How often a waiting commit looks again.
const POLL: Duration = Duration::from_millis(20);

/// One copy to make durable.
#[derive(Debug)]
pub(super) struct Commit {
    pub(super) key: Key,
    /// The copy, open (a descriptor of its own, so it is synced even if evicted).
    pub(super) file: File,
    /// Its identity when it was recorded: the commit applies to that copy only.
    pub(super) copy: CopyId,
    /// Its source path, for the log.
    pub(super) source: PathBuf,
    /// Keeps it from being evicted or removed until it is committed.
    pub(super) _pin: Pin,
    pub(super) queued: Instant,
}

/// The committer thread and its queue. Dropping it commits everything queued first.
#[derive(Debug)]
pub(super) struct Committer {
    queue: Option<Sender<Commit>>,
    thread: Option<JoinHandle<()>>,
    outstanding: Arc<Outstanding>,
}

/// Commits submitted and not yet finished, for [`Committer::commit_now`].
#[derive(Debug, Default)]
struct Outstanding {
    count: Mutex<usize>,
    idle: Condvar,
    /// Callers waiting in [`Committer::commit_now`]: while any does, commits do not
    /// wait for copies.
    hurry: AtomicUsize,
}

impl Outstanding {
    fn add(&self, n: usize) {
        *lock(&self.count) += n;
    }

    fn finish(&self, n: usize) {
        let mut count = lock(&self.count);
        *count -= n;
        if *count == 0 {
            self.idle.notify_all();
        }
    }
}

impl Committer {
    /// Starts the thread that commits copies recorded in `ledger`.
    pub(super) fn start(ledger: Ledger) -> io::Result<Committer> {
        let (queue, jobs) = channel();
        let outstanding = Arc::new(Outstanding::default());
        let thread = std::thread::Builder::new()
            .name("stagefs-commit".into())
            .spawn({
                let outstanding = Arc::clone(&outstanding);
                move || run(&ledger, &jobs, &outstanding)
            })?;
        Ok(Committer {
            queue: Some(queue),
            thread: Some(thread),
            outstanding,
        })
    }

    /// Whether anyone waits for commits, for a check that waits for a quiet moment to
    /// decide whether a copy is committed.
    pub(super) fn awaited(&self) -> CommitsAwaited {
        CommitsAwaited(Arc::clone(&self.outstanding))
    }

    /// A commit to be submitted later (a copy served while its check runs), counted
    /// as outstanding from now: [`Committer::commit_now`], and so an unmount or an
    /// eviction that needs room, waits for it too.
    pub(super) fn expect(&self) -> Expected {
        self.outstanding.add(1);
        Expected {
            queue: self.queue.clone(),
            outstanding: Arc::clone(&self.outstanding),
        }
    }

    /// Whether any commit is queued or running.
    pub(super) fn busy(&self) -> bool {
        *lock(&self.outstanding.count) > 0
    }

    /// Commits everything queued without waiting for copies in progress, and returns
    /// once every commit submitted so far is finished.
    pub(super) fn commit_now(&self) {
        self.outstanding.hurry.fetch_add(1, Ordering::SeqCst);
        self.wait_idle();
        self.outstanding.hurry.fetch_sub(1, Ordering::SeqCst);
    }

    fn wait_idle(&self) {
        let mut count = lock(&self.outstanding.count);
        while *count > 0 {
            count = wait(&self.outstanding.idle, count);
        }
    }
}

/// Whether anyone waits for the commits outstanding: `Committer::commit_now` (an
/// unmount, an eviction that needs room, `stagefs prefetch`), or a store going away.
#[derive(Debug, Clone)]
pub struct CommitsAwaited(Arc<Outstanding>);

impl CommitsAwaited {
    /// Whether someone waits now.
    pub fn now(&self) -> bool {
        self.0.hurry.load(Ordering::SeqCst) > 0
    }
}

/// A commit counted as outstanding and not submitted yet. Dropped unsubmitted, it is
/// no longer counted, and its copy stays uncommitted (a restart re-hashes it).
#[derive(Debug)]
pub(super) struct Expected {
    /// The committer's queue, until submitted. Holding it keeps the committer's
    /// thread running, so a store going away still commits this copy once it is
    /// submitted.
    queue: Option<Sender<Commit>>,
    outstanding: Arc<Outstanding>,
}

impl Expected {
    pub(super) fn submit(mut self, commit: Commit) {
        let sent = self.queue.take().map(|queue| queue.send(commit));
        if !matches!(sent, Some(Ok(()))) {
            // Only if the thread died: the copy stays uncommitted, so a restart
            // re-hashes it; nothing is served wrong.
            warn!("the commit thread is gone; a staged copy stays uncommitted");
            self.outstanding.finish(1);
        }
    }
}

impl Drop for Expected {
    fn drop(&mut self) {
        if self.queue.take().is_some() {
            self.outstanding.finish(1);
        }
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        // Closing the queue lets the thread finish what is queued, then stop; a store
        // going away (an unmount) does not wait for copies that will never finish.
        self.outstanding.hurry.fetch_add(1, Ordering::SeqCst);
        self.queue.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(ledger: &Ledger, jobs: &Receiver<Commit>, outstanding: &Outstanding) {
    while let Ok(first) = jobs.recv() {
        wait_for_copies(ledger, first.queued, &outstanding.hurry);
        let mut batch = vec![first];
        batch.extend(jobs.try_iter());
        let n = batch.len();
        commit_all(ledger, batch);
        outstanding.finish(n);
    }
}

/// Waits while a copy is in progress (space is reserved only for those), at most
/// until [`WAIT_FOR_COPIES_MAX`] after `queued`, and not while anyone is in a hurry.
fn wait_for_copies(ledger: &Ledger, queued: Instant, hurry: &AtomicUsize) {
    let hurried = || hurry.load(Ordering::SeqCst) > 0;
    // A prefetch starts its next copy as the last one ends: looking at once would
    // miss it, and sync the copy just made while the next one reads the disk.
    if !hurried() {
        std::thread::sleep(POLL);
    }
    while !hurried() && lock(&ledger.state).reserved > 0 && queued.elapsed() < WAIT_FOR_COPIES_MAX {
        std::thread::sleep(POLL);
    }
}

/// Syncs every copy of `batch` and their directory, then journals them as committed.
/// A copy the disk could not sync is taken out of the index (a handle reading it
/// keeps its bytes; the next open stages it again).
fn commit_all(ledger: &Ledger, batch: Vec<Commit>) {
    let synced: Vec<(Commit, io::Result<()>)> = batch
        .into_iter()
        .map(|commit| {
            let result = commit.file.sync_data();
            (commit, result)
        })
        .collect();
    let dir = ledger.sync_data_dir();
    let mut evicted = Vec::new();
    {
        let mut state = lock(&ledger.state);
        for (commit, result) in &synced {
            match result.as_ref().and(dir.as_ref()) {
                Ok(()) => {
                    if state.index.commit(&commit.key, commit.copy) {
                        debug!(path = %stagefs_source::logged(&commit.source), waited_ms = commit.queued.elapsed().as_millis() as u64, "committed");
                    }
                }
                Err(e) => {
                    warn!(path = %stagefs_source::logged(&commit.source), error = %e, "the cache disk could not sync a staged copy; it will be staged again");
                    evicted.extend(ledger.evict_copy_locked(
                        &mut state,
                        &commit.key,
                        commit.copy,
                        "not synced",
                    ));
                }
            }
        }
    }
    if let Err(e) = ledger.write_journal(true, true) {
        // The entries stay uncommitted in the journal: a restart re-hashes them.
        warn!(error = %e, "could not journal committed copies");
    }
    ledger.finish_evictions(evicted);
    // The pins go last, outside the state lock (dropping one takes it).
    drop(synced);
}
