//! The store layer of stagefs: the on-disk cache ([`Store`]), its index and journal ([`index`]),
//! the keys that name copies ([`key`]) and the limits on its size ([`budget`]).
//!
//! Layout under the cache directory:
//! - `lock`: held (flock) by the one process that owns the store; it holds that pid;
//! - `v1/index.jsonl`: the `Index` journal;
//! - `v1/data/<key>`: complete staged copies, only ever created by rename of a
//!   verified copy;
//! - `v1/tmp/`: copies in progress, removed at startup.
//!
//! Invariants:
//! - the index names a data file only once it is complete and verified; the journal
//!   vouches for its bytes (records its identity) only once they are synced: commit
//!   journals the removal of any old entry, renames the new data into place and makes
//!   it the entry, uncommitted, so an open is served it at once; the committer then
//!   syncs it and the directory and journals it committed (`committer`); a restart
//!   re-hashes an uncommitted copy before serving it; startup drops entries whose data
//!   is missing or the wrong size and deletes data files the index does not name;
//! - a pinned copy (open, being staged, or waiting for its commit) is never evicted
//!   or removed;
//! - space is reserved before a copy starts, evicting least-recently-used unpinned
//!   copies to make room, so the budget holds even with copies in flight;
//! - the state lock covers memory and renames only: journal writes and their syncs
//!   (under a lock of their own, in the order the index changed), directory syncs and
//!   the unlinking of evicted copies (first renamed into `tmp/`) happen outside it, so
//!   an open, a readlink or `status` never waits for a disk;
//! - a copy whose inode or change time differ from those recorded when it was hashed
//!   (something wrote to it) is re-hashed before it is served; a mismatch is dropped
//!   and staged again, never served;
//! - a copy is read-only once committed, and can be handed out by path (a redirect)
//!   only while its inode and change time are the ones recorded when it was hashed;
//!   a copy whose path was handed out within the redirect grace counts as in use,
//!   since opens of it by path never reach this process.

use std::collections::HashMap;
use std::fs::{self, DirBuilder, File, TryLockError};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use stagefs_source::locks::lock;
use tempfile::NamedTempFile;
use tracing::{info, warn};

use stagefs_source::copy::{Digests, digest_file};

pub mod budget;
mod committer;
pub mod defaults;
pub mod error;
pub mod index;
pub mod key;
mod links;

pub use budget::Budget;
pub use error::StoreError;
pub use index::Entry;
pub use key::Key;
pub use links::LINK_HOLD;
pub use stagefs_source::Stamp;

use budget::{VolumeSpace, volume_space};
pub use committer::CommitsAwaited;
use committer::{Commit, Committer};
use index::{CopyId, Index, Journal};
use links::LinkHolds;

pub use stagefs_control::{Hold, Usage};

/// Name of the layout directory; a new layout gets a new name.
pub const LAYOUT_DIR: &str = "v1";

/// How long a copy whose path was handed out stays in use: see
/// [`crate::defaults::REDIRECT_GRACE`].
pub const DEFAULT_REDIRECT_GRACE: Duration = crate::defaults::REDIRECT_GRACE;

// Committed copies are read-only, so nothing writes to one by following a redirect.
const COPY_MODE: u32 = 0o400;

/// How long a copy presented as a link's target by a lookup stays in use: longer than
/// the kernel's 1 s entry cache, so a program that saw the link (`lstat` in
/// `realpath`) still finds its copy when it reads the link a moment later, even if
/// its lookup was answered from that cache. Short, since listing a directory presents
/// every staged file in it.
const PRESENT_HOLD: Duration = Duration::from_secs(2);

/// The longest a removal or a reservation waits for NFS links to a copy to be taken
/// back; a copy still held then (a client retrying after a JUKEBOX may keep old
/// attributes for longer) is in use.
const LINK_WAIT: Duration = Duration::from_secs(5);

/// A margin past a link hold's end before looking again.
const LINK_POLL: Duration = Duration::from_millis(50);

/// The cache directory, locked for the lifetime of this value.
#[derive(Debug)]
pub struct Store {
    /// Declared first so it is dropped first: a store going away makes every copy it
    /// answered durable before it lets go of the cache directory's lock.
    committer: Committer,
    dir: PathBuf,
    budget: Budget,
    redirect_grace: Duration,
    ledger: Ledger,
    _lock: File,
}

/// The store's ledger: the index, its journal and the data they describe, which the
/// store and its committer both change.
#[derive(Debug, Clone)]
struct Ledger {
    layout: PathBuf,
    state: Arc<Mutex<State>>,
    /// Taken after the state lock when both are, never the other way round.
    journal: Arc<Mutex<Journal>>,
}

#[derive(Debug)]
struct State {
    index: Index,
    pins: HashMap<Key, usize>,
    reserved: u64,
    /// When each copy's path was last handed out ([`Handout::Resolve`]).
    redirected: HashMap<Key, Instant>,
    /// When each copy was last presented as a link's target ([`Handout::Present`]).
    presented: HashMap<Key, Instant>,
    /// Copies named by NFS links' text ([`Handout::Link`]).
    links: LinkHolds,
    /// Bytes of evicted copies not unlinked yet: free as far as the budget goes.
    unlinking: u64,
    /// Names for evicted copies moved aside to be unlinked.
    next_evicted: u64,
}

impl State {
    /// Whether `key` must not be evicted or removed: a handle or copy holds it, or its
    /// path was handed out within `grace` and may be being opened right now.
    fn in_use(&self, key: &Key, grace: Duration) -> bool {
        self.hold(key, grace).is_some()
    }

    /// Why `key` must not be evicted or removed, if it must not.
    fn hold(&self, key: &Key, grace: Duration) -> Option<Hold> {
        if self.pins.contains_key(key) {
            return Some(Hold::Open);
        }
        if let Some(left) = self.links.left(key) {
            return Some(Hold::Link {
                secs_left: whole_secs(left),
            });
        }
        let left = |map: &HashMap<Key, Instant>, hold: Duration| {
            map.get(key).and_then(|at| hold.checked_sub(at.elapsed()))
        };
        let left = [
            left(&self.redirected, grace),
            left(&self.presented, PRESENT_HOLD),
        ]
        .into_iter()
        .flatten()
        .max()?;
        Some(Hold::Grace {
            secs_left: whole_secs(left),
            grace_secs: grace.as_secs(),
        })
    }
}

/// Keeps one staged copy from being evicted or removed while held.
/// (Dropping one takes the store's lock: never drop one while holding that lock.)
#[derive(Debug)]
pub struct Pin {
    key: Key,
    state: Arc<Mutex<State>>,
}

/// A copy taken out of the index, waiting to be unlinked.
#[derive(Debug)]
struct Evicted {
    /// Where it was moved aside; None if there was nothing to move.
    path: Option<PathBuf>,
    bytes: u64,
}

/// Counts a use of `key`'s copy now (its journal line is written by the caller).
fn touch_now(state: &mut State, key: &Key) {
    let now = stagefs_source::sys::now_secs();
    if state.index.get(key).is_some_and(|e| e.last_use != now) {
        state.index.touch(key, now);
    }
}

/// `left` in whole seconds, rounded up (a hold of 0.2 s is "1 s left", never "0").
fn whole_secs(left: Duration) -> u64 {
    left.as_secs() + u64::from(left.subsec_nanos() > 0)
}

/// The volume as the budget sees it: evicted copies not yet unlinked count as free.
fn with_unlinking(volume: VolumeSpace, state: &State) -> VolumeSpace {
    VolumeSpace {
        available: volume.available + state.unlinking,
        ..volume
    }
}

/// Space promised to a copy in progress; given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    bytes: u64,
    state: Arc<Mutex<State>>,
    /// The copy of the key it was made for, kept from eviction; none for a copy
    /// whose name is not settled yet ([`Store::reserve_unnamed`]).
    _pin: Option<Pin>,
}

impl Reservation {
    /// The bytes promised.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// A complete copy moved into place by [`Store::place`], its data synced, its name
/// and entry not yet durable.
#[derive(Debug)]
pub(crate) struct Placed {
    /// Where it lives.
    pub path: PathBuf,
}

impl Placed {
    /// Unlinks a copy that cannot be made the entry (handles to it keep reading it),
    /// and returns the error that stopped it.
    fn discard(self, error: io::Error) -> StoreError {
        let _ = remove_if_present(&self.path);
        StoreError::io(&self.path, error)
    }
}

/// What a caller of [`Store::redirect`] does with a copy's path, and so how long the
/// copy counts as in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handout {
    /// Only looks whether there is one (a prefetch, a plan): nothing is held.
    Peek,
    /// Presents it as a link's target to a lookup: held a moment (2 s),
    /// so the program that looked the link up can still read it (`realpath` calls
    /// `lstat`, then `readlink`).
    Present,
    /// Hands it out to be opened: held for the redirect grace (an open by path never
    /// reaches us, so this is the only sign of use there is) and counts as a use.
    Resolve,
    /// Names it in the text of a link an NFS client caches: refused for a copy being
    /// taken back, and held until no client can follow the link to it any more
    /// ([`LINK_HOLD`] after the last reply, longer after a JUKEBOX). `followed`: the
    /// client read the text to follow it, which counts as a use.
    Link {
        /// Whether this is a READLINK's answer rather than attributes'.
        followed: bool,
    },
}

/// A staged copy that can be served: open for reading, and pinned while held.
#[derive(Debug)]
pub struct OpenCopy {
    /// Its description.
    pub entry: Entry,
    /// The copy, open for reading.
    pub file: File,
    /// Where it lives.
    pub path: PathBuf,
    /// Keeps it in the cache while held.
    pub pin: Pin,
}

/// A copy in the index whose check is still running (`Store::record_unverified`):
/// pinned, served, and neither synced nor journaled with an identity until it is
/// confirmed. Dropped undecided, it stays uncommitted: a restart re-hashes it.
#[derive(Debug)]
pub struct Unverified {
    commit: Commit,
    expected: committer::Expected,
    ledger: Ledger,
}

impl Unverified {
    /// The check passed: the copy goes to the committer like any other.
    pub fn confirm(self) {
        let Unverified {
            commit, expected, ..
        } = self;
        expected.submit(Commit {
            queued: Instant::now(),
            ..commit
        });
    }

    /// The check failed: the copy leaves the index (if it is still this copy) and is
    /// unlinked; handles to it keep their bytes.
    pub fn refute(self, why: &str) {
        let Unverified {
            commit,
            expected,
            ledger,
        } = self;
        let evicted =
            ledger.evict_copy_locked(&mut lock(&ledger.state), &commit.key, commit.copy, why);
        ledger.finish_evictions(evicted.into_iter().collect());
        // Its pin goes last, outside the state lock (dropping one takes it).
        drop((commit, expected));
    }
}

/// One entry as listed by [`Store::entries`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryInfo {
    /// Store key.
    pub key: String,
    /// What the index records.
    pub entry: Entry,
    /// Whether it is open, being staged, or its link was followed a moment ago.
    pub in_use: bool,
    /// Why it is in use, if it is.
    #[serde(default)]
    pub hold: Option<Hold>,
}

impl Store {
    /// Opens (creating if needed) the store in `dir`, takes its lock, removes copies
    /// left over by a crash and reconciles the index with the data files.
    pub fn open(dir: impl Into<PathBuf>, budget: Budget) -> Result<Store, StoreError> {
        let dir = dir.into();
        // Redirects hand out paths of copies, which must not depend on our cwd.
        let dir = std::path::absolute(&dir).map_err(|e| StoreError::io(&dir, e))?;
        let layout = dir.join(LAYOUT_DIR);
        for sub in ["data", "tmp"] {
            let path = layout.join(sub);
            private_dir_builder()
                .create(&path)
                .map_err(|e| StoreError::io(&path, e))?;
        }
        let lock = take_lock(&dir.join("lock"))?;
        remove_all_in(&layout.join("tmp"))?;
        let index_path = layout.join("index.jsonl");
        let (mut index, mut journal) =
            Index::load(&index_path).map_err(|e| StoreError::io(&index_path, e))?;
        reconcile(&mut index, &layout.join("data"))?;
        if index.has_pending() {
            journal
                .append(&index.take_pending(), true)
                .map_err(|e| StoreError::io(&index_path, e))?;
        }
        let ledger = Ledger {
            layout,
            state: Arc::new(Mutex::new(State {
                index,
                pins: HashMap::new(),
                reserved: 0,
                redirected: HashMap::new(),
                presented: HashMap::new(),
                links: LinkHolds::default(),
                unlinking: 0,
                next_evicted: 0,
            })),
            journal: Arc::new(Mutex::new(journal)),
        };
        let committer = Committer::start(ledger.clone()).map_err(|e| StoreError::io(&dir, e))?;
        Ok(Store {
            committer,
            dir,
            budget,
            redirect_grace: DEFAULT_REDIRECT_GRACE,
            ledger,
            _lock: lock,
        })
    }

    /// Sets how long a copy whose path was handed out counts as in use.
    pub fn with_redirect_grace(mut self, grace: Duration) -> Store {
        self.redirect_grace = grace;
        self
    }

    /// An NFS client may keep the link attributes it has until `until`, however old
    /// (it was answered JUKEBOX): no copy any link named goes before then.
    pub fn links_unsettled_until(&self, until: Instant) {
        lock(&self.ledger.state).links.unsettled_until(until);
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the copy for `key` lives.
    pub fn data_path(&self, key: &Key) -> PathBuf {
        self.ledger.data_path(key)
    }

    /// The usable copy for `key`, if one exists and `accept`s its entry. The copy is
    /// checked for completeness and, if anything touched it since it was hashed,
    /// re-hashed; a damaged copy is dropped (a miss), never returned. It may hash a
    /// whole copy and wait for the disk: never call it where a request waits.
    pub fn lookup(&self, key: &Key, accept: impl Fn(&Entry) -> bool) -> Option<OpenCopy> {
        let (mut entry, pin) = {
            let mut state = lock(&self.ledger.state);
            let entry = state.index.get(key).filter(|e| accept(e))?.clone();
            (entry, self.ledger.pin_locked(&mut state, key))
        };
        let path = self.data_path(key);
        let (file, rehashed) = match self.check_copy(&path, key, &entry) {
            Ok(checked) => checked,
            Err(reason) => {
                warn!(path = %stagefs_source::logged(&entry.source), copy = %stagefs_source::logged(&path), reason, "dropping a damaged staged copy; it will be staged again");
                drop(pin);
                self.remove_checked(key, &entry);
                return None;
            }
        };
        // Copies from before copies were made read-only become so once checked.
        let rehashed = make_read_only(&path, &file).or(rehashed);
        // A new identity vouches for the bytes just hashed, which may be in memory
        // only (a copy a crashed daemon never committed): on disk before it is recorded.
        if rehashed.is_some()
            && let Err(e) = file.sync_data().and_then(|()| self.ledger.sync_data_dir())
        {
            warn!(path = %stagefs_source::logged(&entry.source), error = %e, "dropping a staged copy the disk could not sync; it will be staged again");
            drop(pin);
            self.remove_checked(key, &entry);
            return None;
        }
        let mut state = lock(&self.ledger.state);
        if let Some(copy) = rehashed {
            entry.copy = copy;
            state.index.put(key.clone(), entry.clone());
        }
        state.index.touch(key, stagefs_source::sys::now_secs());
        drop(state);
        // A new identity must be durable, so it waits for the journal (after a
        // re-hash that cost far more); recency alone need not, and does not.
        let identity = rehashed.is_some();
        if self.ledger.write_journal(identity, identity).is_err() {
            warn!(path = %stagefs_source::logged(&entry.source), "could not record a re-hashed copy");
        }
        Some(OpenCopy {
            entry,
            file,
            path,
            pin,
        })
    }

    /// Opens a copy and checks it is whole. A copy whose inode or change time differs
    /// from when it was hashed (something wrote to it) is hashed again; returns the
    /// new identity when it was.
    fn check_copy(
        &self,
        path: &Path,
        key: &Key,
        entry: &Entry,
    ) -> Result<(File, Option<CopyId>), &'static str> {
        let file = File::open(path).map_err(|_| "the copy is missing")?;
        let meta = file.metadata().map_err(|_| "the copy is unreadable")?;
        if meta.len() != entry.stamp.size {
            return Err("the copy has the wrong size");
        }
        let now = CopyId::of(&meta);
        if now == entry.copy {
            return Ok((file, None));
        }
        let compared = compare_with_record(path, key, entry);
        if compared.map_err(|_| "the copy is unreadable")? != CopyCheck::Matches {
            return Err("the copy's digest does not match the index");
        }
        Ok((file, Some(now)))
    }

    /// The path of the copy for `key`, if one exists that `accept`s and can be
    /// handed out as it is: whole, read-only, and untouched since it was hashed (its
    /// inode and change time match). Never hashes; a copy that fails the check is
    /// left for [`Store::lookup`] to re-hash on the next open through the mount.
    /// What the copy's use counts as is `handout`'s.
    pub fn redirect(
        &self,
        key: &Key,
        accept: impl Fn(&Entry) -> bool,
        handout: Handout,
    ) -> Option<PathBuf> {
        let path = self.intact_copy(key, &accept)?;
        if handout == Handout::Peek {
            return Some(path);
        }
        let mut state = lock(&self.ledger.state);
        // It may have been evicted since it was checked; only a still-current
        // entry may be handed out.
        if !state.index.get(key).is_some_and(accept) {
            return None;
        }
        match handout {
            Handout::Peek => {}
            Handout::Present => {
                state.presented.insert(key.clone(), Instant::now());
            }
            Handout::Link { followed } => {
                if !state.links.name(key) {
                    return None;
                }
                if followed {
                    touch_now(&mut state, key);
                    drop(state);
                    let _ = self.ledger.write_journal(false, false);
                }
            }
            Handout::Resolve => {
                state.redirected.insert(key.clone(), Instant::now());
                touch_now(&mut state, key);
                drop(state);
                let _ = self.ledger.write_journal(false, false);
            }
        }
        Some(path)
    }

    fn intact_copy(&self, key: &Key, accept: impl Fn(&Entry) -> bool) -> Option<PathBuf> {
        let entry = lock(&self.ledger.state)
            .index
            .get(key)
            .filter(|e| accept(e))?
            .clone();
        let path = self.data_path(key);
        let meta = fs::metadata(&path).ok()?;
        let intact = meta.is_file()
            && meta.len() == entry.stamp.size
            && meta.permissions().mode() & 0o222 == 0
            && CopyId::of(&meta) == entry.copy;
        intact.then_some(path)
    }

    /// Promises `bytes` of space to a new copy for `key`, evicting least-recently-used
    /// unpinned copies if the budget needs it. Fails without evicting anything when
    /// the copy could not fit even with every evictable copy gone.
    ///
    /// With `may_evict` false (prefetching), nothing is evicted: the copy is refused
    /// unless it fits as things are.
    pub fn reserve(
        &self,
        key: &Key,
        bytes: u64,
        source: &Path,
        may_evict: bool,
    ) -> Result<Reservation, StoreError> {
        self.reserve_for(Some(key), bytes, source, may_evict)
    }

    /// Promises `bytes` of space to a copy whose name is not settled yet (one being
    /// written through the mount, which may be renamed before it is committed):
    /// nothing is pinned and nothing evicted, so it is refused unless it fits as
    /// things are.
    pub fn reserve_unnamed(&self, bytes: u64, source: &Path) -> Result<Reservation, StoreError> {
        self.reserve_for(None, bytes, source, false)
    }

    /// Grows `reservation` (made by this store) to `bytes`, if the budget has room
    /// for the difference as things are: nothing is evicted. A copy whose final
    /// size is unknown (one being written through the mount) grows its promise as
    /// it fills, counted once throughout.
    pub fn grow(
        &self,
        reservation: &mut Reservation,
        bytes: u64,
        source: &Path,
    ) -> Result<(), StoreError> {
        let extra = bytes.saturating_sub(reservation.bytes);
        if extra == 0 {
            return Ok(());
        }
        let volume = self.volume()?;
        let mut state = lock(&self.ledger.state);
        let volume = with_unlinking(volume, &state);
        let used = state.index.bytes() + state.reserved;
        if !budget::fits(&self.budget, used, state.reserved, extra, volume) {
            return Err(self.no_room(&state, source, extra, volume));
        }
        state.reserved += extra;
        reservation.bytes = bytes;
        Ok(())
    }

    fn reserve_for(
        &self,
        key: Option<&Key>,
        bytes: u64,
        source: &Path,
        may_evict: bool,
    ) -> Result<Reservation, StoreError> {
        let mut evicted = Vec::new();
        let mut reserved = self.reserve_locked(key, bytes, source, may_evict, &mut evicted);
        // The victims left the index under the lock; their bytes go now, outside it.
        self.ledger.finish_evictions(std::mem::take(&mut evicted));
        // Copies waiting for their commit are pinned: commit them, and look again.
        if matches!(reserved, Err(StoreError::NoRoom { .. })) && self.committer.busy() {
            self.committer.commit_now();
            reserved = self.reserve_locked(key, bytes, source, may_evict, &mut evicted);
            self.ledger.finish_evictions(std::mem::take(&mut evicted));
        }
        // Copies that only NFS links name: taken back, and evicted once no client can
        // follow the links to them (a few seconds).
        if matches!(reserved, Err(StoreError::NoRoom { .. }))
            && may_evict
            && let Some(wait) = self.retract_links_for(key, bytes)
        {
            std::thread::sleep(wait + LINK_POLL);
            reserved = self.reserve_locked(key, bytes, source, may_evict, &mut evicted);
            self.ledger.finish_evictions(evicted);
        }
        reserved
    }

    fn reserve_locked(
        &self,
        key: Option<&Key>,
        bytes: u64,
        source: &Path,
        may_evict: bool,
        evicted: &mut Vec<Evicted>,
    ) -> Result<Reservation, StoreError> {
        let volume = self.volume()?;
        let mut state = lock(&self.ledger.state);
        let volume = with_unlinking(volume, &state);
        let replaced = key
            .and_then(|k| state.index.get(k))
            .map_or(0, |e| e.stamp.size);
        let used = |s: &State| s.index.bytes() + s.reserved - replaced;
        // The copy being replaced is never a victim: it goes when the new one lands.
        let grace = self.redirect_grace;
        let evictable = |s: &State, k: &Key| Some(k) != key && !s.in_use(k, grace);
        let evictable_bytes: u64 = state
            .index
            .iter_lru()
            .filter(|(k, _)| evictable(&state, k))
            .map(|(_, e)| e.stamp.size)
            .sum();
        let best_case = VolumeSpace {
            available: volume.available + evictable_bytes,
            ..volume
        };
        let best_used = used(&state).saturating_sub(evictable_bytes);
        if !budget::fits(&self.budget, best_used, state.reserved, bytes, best_case) {
            return Err(self.no_room(&state, source, bytes, volume));
        }
        let mut volume = volume;
        loop {
            if budget::fits(&self.budget, used(&state), state.reserved, bytes, volume) {
                state.reserved += bytes;
                let pin = key.map(|k| self.ledger.pin_locked(&mut state, k));
                return Ok(Reservation {
                    bytes,
                    state: Arc::clone(&self.ledger.state),
                    _pin: pin,
                });
            }
            let victim = state
                .index
                .iter_lru()
                .map(|(k, _)| k)
                .find(|k| evictable(&state, k))
                .cloned();
            match victim {
                Some(victim) if may_evict => {
                    let freed = self
                        .ledger
                        .evict_locked(&mut state, &victim, "to make room");
                    // Only a copy that was on disk frees space on the volume.
                    if let Some(Evicted {
                        path: Some(_),
                        bytes,
                    }) = &freed
                    {
                        volume.available += bytes;
                    }
                    evicted.extend(freed);
                }
                _ => return Err(self.no_room(&state, source, bytes, volume)),
            }
        }
    }

    fn no_room(
        &self,
        state: &State,
        source: &Path,
        needed: u64,
        volume: VolumeSpace,
    ) -> StoreError {
        StoreError::NoRoom {
            path: source.to_path_buf(),
            needed,
            budget: self.budget,
            in_use: state
                .index
                .iter_lru()
                .filter(|(k, _)| state.in_use(k, self.redirect_grace))
                .map(|(_, e)| e.stamp.size)
                .sum::<u64>()
                + state.reserved,
            available: volume.available,
        }
    }

    /// A new private temp file for a copy in progress, deleted if dropped uncommitted.
    pub fn create_temp(&self) -> Result<NamedTempFile, StoreError> {
        let tmp_dir = self.ledger.layout.join("tmp");
        NamedTempFile::new_in(&tmp_dir).map_err(|e| StoreError::io(&tmp_dir, e))
    }

    /// Makes a fully written temp file the copy for `key`: `Store::place` then
    /// `Store::record`.
    pub fn commit(
        &self,
        key: &Key,
        tmp: NamedTempFile,
        entry: Entry,
        reservation: Reservation,
    ) -> Result<OpenCopy, StoreError> {
        let placed = self.place(key, tmp, &entry)?;
        self.record(key, placed, entry, reservation)
    }

    /// Moves a complete, verified temp file to where the copy for `key` lives, not yet
    /// in the index: so nothing hands out its path or lists it, and a crash leaves a
    /// data file the index does not name, which startup deletes. The old entry goes
    /// (durably) first. [`Store::record`] makes it the entry.
    pub(crate) fn place(
        &self,
        key: &Key,
        tmp: NamedTempFile,
        entry: &Entry,
    ) -> Result<Placed, StoreError> {
        let data_path = self.data_path(key);
        // A copy followed through a redirect shows the source's mtime, as the mirror does.
        tmp.as_file()
            .set_modified(stagefs_source::sys::time_from_ns(entry.stamp.mtime_ns))
            .map_err(|e| StoreError::io(tmp.path(), e))?;
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(COPY_MODE))
            .map_err(|e| StoreError::io(tmp.path(), e))?;
        // Out of the index first: nothing serves or evicts this key in between (one
        // copy per key is staged at a time), and the reservation pins it.
        if lock(&self.ledger.state).index.remove(key).is_some() {
            self.ledger.write_journal(true, true)?;
        }
        tmp.persist(&data_path)
            .map_err(|e| StoreError::io(&data_path, e.error))?;
        Ok(Placed { path: data_path })
    }

    /// Makes a placed copy the entry for `key` at once, uncommitted, and hands it to
    /// the committer, which makes it durable in the background: the caller gets a
    /// copy that is whole and verified, and never waits for the disk to write it
    /// (with the source on the same disk, that wait was the write of the whole
    /// model). Until it is committed the copy is pinned, so nothing evicts it while
    /// its commit is pending, and its journal line makes a restart re-hash it. On
    /// failure the copy is unlinked: handles to it keep reading it, and the next open
    /// stages it again.
    pub(crate) fn record(
        &self,
        key: &Key,
        placed: Placed,
        entry: Entry,
        reservation: Reservation,
    ) -> Result<OpenCopy, StoreError> {
        let (hit, unverified) = self.record_unverified(key, placed, entry, reservation)?;
        unverified.confirm();
        Ok(hit)
    }

    /// `Store::place` then `Store::record_unverified`.
    pub fn commit_unverified(
        &self,
        key: &Key,
        tmp: NamedTempFile,
        entry: Entry,
        reservation: Reservation,
    ) -> Result<(OpenCopy, Unverified), StoreError> {
        let placed = self.place(key, tmp, &entry)?;
        self.record_unverified(key, placed, entry, reservation)
    }

    /// [`Store::record`] for a copy whose check is still running: the entry is made
    /// and served as [`Store::record`] makes it, but committed only once the check
    /// [`Unverified::confirm`]s it, and taken out if it [`Unverified::refute`]s it.
    /// Until then its journal line has no identity, so a restart re-hashes it before
    /// serving it, and [`Store::commit_now`] waits for the verdict.
    pub(crate) fn record_unverified(
        &self,
        key: &Key,
        placed: Placed,
        mut entry: Entry,
        mut reservation: Reservation,
    ) -> Result<(OpenCopy, Unverified), StoreError> {
        let expected = self.committer.expect();
        let opened = File::open(&placed.path).and_then(|file| {
            let meta = file.metadata()?;
            let for_committer = file.try_clone()?;
            Ok((file, for_committer, meta))
        });
        let (file, for_committer, meta) = match opened {
            Ok(opened) => opened,
            Err(e) => return Err(placed.discard(e)),
        };
        let path = placed.path;
        entry.copy = CopyId::of(&meta);
        let (pin, commit_pin) = {
            let mut state = lock(&self.ledger.state);
            state.index.put_uncommitted(key.clone(), entry.clone());
            // The copy now counts as used space, so its reservation goes in the same
            // step: counted twice, it would refuse (ENOSPC) another open's copy that
            // fits.
            state.reserved -= std::mem::take(&mut reservation.bytes);
            let pin = self.ledger.pin_locked(&mut state, key);
            (pin, self.ledger.pin_locked(&mut state, key))
        };
        // Written at once but not synced: after a kill -9 the restart finds the copy
        // and re-hashes it rather than copying it again.
        if let Err(e) = self.ledger.write_journal(false, false) {
            warn!(path = %stagefs_source::logged(&entry.source), error = %e, "could not journal a new copy yet");
        }
        drop(reservation);
        let unverified = Unverified {
            commit: Commit {
                key: key.clone(),
                file: for_committer,
                copy: entry.copy,
                source: entry.source.clone(),
                _pin: commit_pin,
                queued: Instant::now(),
            },
            expected,
            ledger: self.ledger.clone(),
        };
        let hit = OpenCopy {
            entry,
            file,
            path,
            pin,
        };
        Ok((hit, unverified))
    }

    /// Whether anyone waits for commits now ([`Store::commit_now`], or this store
    /// going away): a copy's check waiting for a quiet moment starts at once then.
    pub fn commits_awaited(&self) -> CommitsAwaited {
        self.committer.awaited()
    }

    /// Makes every copy answered so far durable and journaled as such, now: for a
    /// caller about to evict, since a copy waiting for its commit is pinned.
    pub fn commit_now(&self) {
        self.committer.commit_now();
    }

    /// The cache volume's space, asked without holding the state lock.
    fn volume(&self) -> Result<VolumeSpace, StoreError> {
        volume_space(&self.dir).map_err(|e| StoreError::io(&self.dir, e))
    }

    /// Removes the copy for `key`; refuses if it is in use (a copy waiting for its
    /// commit is committed first, and is then not in use on that account).
    pub fn remove(&self, key: &Key) -> Result<Option<Entry>, StoreError> {
        self.remove_if(key, |_| true)
    }

    /// Removes the copy for `key` if it is still the one `checked` describes: a copy
    /// found damaged may have been replaced by a good one meanwhile (another open
    /// found the damage first and staged it again), and that one must stay.
    fn remove_checked(&self, key: &Key, checked: &Entry) {
        let _ = self.remove_if(key, |now| {
            now.copy == checked.copy && now.stamp == checked.stamp
        });
    }

    fn remove_if(
        &self,
        key: &Key,
        still: impl Fn(&Entry) -> bool,
    ) -> Result<Option<Entry>, StoreError> {
        self.commit_now();
        let deadline = Instant::now() + LINK_WAIT;
        loop {
            let mut state = lock(&self.ledger.state);
            let Some(entry) = state.index.get(key).filter(|e| still(e)).cloned() else {
                return Ok(None);
            };
            match state.hold(key, self.redirect_grace) {
                None => return Ok(Some(self.evict_on_request(state, key, entry))),
                // Named by NFS links only: taken back, and removed once no client
                // can follow them to it.
                Some(Hold::Link { .. }) if Instant::now() < deadline => {
                    state.links.retract(key);
                    let left = state.links.left(key).unwrap_or_default();
                    drop(state);
                    std::thread::sleep(left.min(deadline - Instant::now()) + LINK_POLL);
                }
                Some(_) => {
                    state.links.restore(key);
                    return Err(StoreError::InUse { path: entry.source });
                }
            }
        }
    }

    /// [`Store::remove`] without waiting: a copy only NFS links hold is taken back
    /// and refused as in use, and goes at a call once no client can follow the
    /// links (for a caller that must not wait: one on a source thread).
    pub fn remove_or_take_back(&self, key: &Key) -> Result<Option<Entry>, StoreError> {
        self.commit_now();
        let mut state = lock(&self.ledger.state);
        let Some(entry) = state.index.get(key).cloned() else {
            return Ok(None);
        };
        match state.hold(key, self.redirect_grace) {
            None => Ok(Some(self.evict_on_request(state, key, entry))),
            Some(hold) => {
                if matches!(hold, Hold::Link { .. }) {
                    state.links.retract(key);
                }
                Err(StoreError::InUse { path: entry.source })
            }
        }
    }

    /// Evicts `key`'s copy, described by `entry`, under `state`'s lock; unlinks it
    /// after letting go of the lock.
    fn evict_on_request(
        &self,
        mut state: std::sync::MutexGuard<'_, State>,
        key: &Key,
        entry: Entry,
    ) -> Entry {
        let evicted = self.ledger.evict_locked(&mut state, key, "on request");
        drop(state);
        self.ledger.finish_evictions(evicted.into_iter().collect());
        entry
    }

    /// Takes back links to copies that only links hold, least recently used first,
    /// until `bytes` of them are on their way out; how long until they can go.
    fn retract_links_for(&self, keep: Option<&Key>, bytes: u64) -> Option<Duration> {
        let mut state = lock(&self.ledger.state);
        let held: Vec<(Key, u64)> = state
            .index
            .iter_lru()
            .filter(|(k, _)| Some(*k) != keep)
            .filter(|(k, _)| matches!(state.hold(k, self.redirect_grace), Some(Hold::Link { .. })))
            .map(|(k, e)| (k.clone(), e.stamp.size))
            .collect();
        let mut freed = 0;
        let mut wait = None;
        for (key, size) in held {
            if freed >= bytes {
                break;
            }
            state.links.retract(&key);
            wait = wait.max(state.links.left(&key));
            freed += size;
        }
        wait.map(|left| left.min(LINK_WAIT))
    }

    /// Takes the copy for `key` out of the store, if `accept` takes its entry and
    /// nothing uses it: the copy, as a temp file of the store (unverified from here
    /// on: whoever commits it again checks it). For a file renamed on the source,
    /// whose copy is to be committed under its new name.
    pub fn take(
        &self,
        key: &Key,
        accept: impl Fn(&Entry) -> bool,
    ) -> Result<Option<NamedTempFile>, StoreError> {
        self.commit_now();
        let mut state = lock(&self.ledger.state);
        if !state.index.get(key).is_some_and(&accept) || state.in_use(key, self.redirect_grace) {
            return Ok(None);
        }
        let taken = self
            .ledger
            .evict_locked(&mut state, key, "to be committed under a new name");
        let aside = match taken {
            Some(Evicted {
                path: Some(aside),
                bytes,
            }) => {
                // Handed over, not unlinked: its bytes count again once committed.
                state.unlinking -= bytes;
                Some(aside)
            }
            _ => None,
        };
        drop(state);
        // Out of the index either way (a copy whose file was missing too).
        self.ledger.write_journal(true, true)?;
        let Some(aside) = aside else {
            return Ok(None);
        };
        let opened = File::open(&aside)
            .and_then(|file| Ok((file, tempfile::TempPath::try_from_path(&aside)?)));
        let (file, path) = opened.map_err(|e| StoreError::io(&aside, e))?;
        Ok(Some(NamedTempFile::from_parts(file, path)))
    }

    /// Keeps the copy for `key` from being evicted or removed while the pin is held,
    /// including one committed after the pin was taken.
    pub fn pin(&self, key: &Key) -> Pin {
        self.ledger.pin_locked(&mut lock(&self.ledger.state), key)
    }

    /// Whether the copy for `key` is being taken back from NFS links, to be removed
    /// once no client can follow them to it: a new reader should not hold it.
    pub fn taken_back(&self, key: &Key) -> bool {
        lock(&self.ledger.state).links.retracting(key)
    }

    /// What keeps the copy for `key` from being removed now, if anything.
    pub fn hold_of(&self, key: &Key) -> Option<Hold> {
        lock(&self.ledger.state).hold(key, self.redirect_grace)
    }

    /// Whether a copy for `key` is stored.
    pub fn contains(&self, key: &Key) -> bool {
        lock(&self.ledger.state).index.get(key).is_some()
    }

    /// Every entry, least recently used first.
    pub fn entries(&self) -> Vec<EntryInfo> {
        let state = lock(&self.ledger.state);
        state
            .index
            .iter_lru()
            .map(|(k, e)| {
                let hold = state.hold(k, self.redirect_grace);
                EntryInfo {
                    key: k.as_str().to_string(),
                    entry: e.clone(),
                    in_use: hold.is_some(),
                    hold,
                }
            })
            .collect()
    }

    /// How full the cache is.
    pub fn usage(&self) -> Result<Usage, StoreError> {
        let volume = volume_space(&self.dir).map_err(|e| StoreError::io(&self.dir, e))?;
        let state = lock(&self.ledger.state);
        Ok(Usage {
            used: state.index.bytes(),
            entries: state.index.len(),
            reserved: state.reserved,
            budget: self.budget,
            volume,
        })
    }
}

impl Ledger {
    /// Writes the index's queued records to the journal, in order, with an fdatasync
    /// if `durable`. A caller that must not wait for another's sync (recency from a
    /// request) passes `wait` false and leaves its records for the next writer.
    fn write_journal(&self, durable: bool, wait: bool) -> Result<(), StoreError> {
        let mut journal = match self.journal.try_lock() {
            Ok(journal) => journal,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) if !wait => return Ok(()),
            Err(std::sync::TryLockError::WouldBlock) => lock(&self.journal),
        };
        let (records, compacted) = {
            let mut state = lock(&self.state);
            if !durable && !state.index.has_pending() {
                return Ok(());
            }
            let records = state.index.take_pending();
            let compacted = journal
                .due_for_compaction(records.len(), state.index.len())
                .then(|| state.index.snapshot());
            (records, compacted)
        };
        let written = match compacted {
            // The snapshot already holds what the records say.
            Some(entries) => journal.compact(&entries),
            None => journal.append(&records, durable),
        };
        written.map_err(|e| StoreError::io(journal.path(), e))
    }

    /// Takes `key` out of the index and moves its copy aside into `tmp/` (a rename,
    /// so a new copy of the same key can land at once); [`Ledger::finish_evictions`]
    /// journals the removal and unlinks it once the lock is released.
    fn evict_locked(&self, state: &mut State, key: &Key, why: &str) -> Option<Evicted> {
        let entry = state.index.remove(key)?;
        state.redirected.remove(key);
        state.presented.remove(key);
        state.links.forget(key);
        state.next_evicted += 1;
        let aside = self
            .layout
            .join("tmp")
            .join(format!("evicted-{}", state.next_evicted));
        let data = self.data_path(key);
        let moved = match fs::rename(&data, &aside) {
            Ok(()) => Some(aside),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => {
                // Left in place: startup removes data files the index does not name.
                warn!(path = %stagefs_source::logged(&data), error = %e, "could not move an evicted copy aside");
                None
            }
        };
        let bytes = entry.stamp.size;
        if moved.is_some() {
            state.unlinking += bytes;
        }
        info!(path = %stagefs_source::logged(&entry.source), bytes, why, "evicted");
        Some(Evicted { path: moved, bytes })
    }

    /// [`Ledger::evict_locked`] if the entry for `key` is still copy `copy`: the
    /// copy may have been replaced since someone decided to evict it.
    fn evict_copy_locked(
        &self,
        state: &mut State,
        key: &Key,
        copy: CopyId,
        why: &str,
    ) -> Option<Evicted> {
        let ours = state.index.get(key).is_some_and(|entry| entry.copy == copy);
        ours.then(|| self.evict_locked(state, key, why)).flatten()
    }

    /// Journals evictions and unlinks their copies, outside the state lock.
    fn finish_evictions(&self, evicted: Vec<Evicted>) {
        if evicted.is_empty() {
            return;
        }
        if let Err(e) = self.write_journal(true, true) {
            // The copies are gone either way; startup drops entries without data.
            warn!(error = %e, "could not journal evictions");
        }
        for victim in evicted {
            let Some(path) = victim.path else { continue };
            if let Err(e) = remove_if_present(&path) {
                warn!(error = %e, "could not unlink an evicted copy; startup removes it");
            }
            lock(&self.state).unlinking -= victim.bytes;
        }
    }

    fn pin_locked(&self, state: &mut State, key: &Key) -> Pin {
        *state.pins.entry(key.clone()).or_insert(0) += 1;
        Pin {
            key: key.clone(),
            state: Arc::clone(&self.state),
        }
    }

    fn data_path(&self, key: &Key) -> PathBuf {
        self.layout.join("data").join(key.as_str())
    }

    /// Makes the names of the copies in `data/` durable (a rename is durable only once
    /// its directory is synced).
    fn sync_data_dir(&self) -> io::Result<()> {
        sync_dir(&self.layout.join("data"))
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut state = lock(&self.state);
        if let Some(count) = state.pins.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                state.pins.remove(&self.key);
            }
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        lock(&self.state).reserved -= self.bytes;
    }
}

/// How a copy's bytes compare with what its entry says they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyCheck {
    /// Every digest that can be checked matches.
    Matches,
    /// The blake3 recorded when it was staged differs.
    Blake3Differs,
    /// The sha256 an LFS blob's name carries differs.
    Sha256Differs,
    /// Nothing to check it against: no blake3 recorded, and no blob name.
    Unrecorded,
}

/// Hashes the file at `path`, the copy for `key`, with what can be checked: the
/// blake3 `entry` recorded, the sha256 a blob's name carries. Shared by the re-check
/// of a touched copy and by `verify`.
pub fn compare_with_record(path: &Path, key: &Key, entry: &Entry) -> io::Result<CopyCheck> {
    let (recorded, named) = (entry.blake3.as_deref(), key.content_sha256());
    let digests = Digests {
        blake3: recorded.is_some(),
        sha256: named.is_some(),
    };
    let found = digest_file(path, digests)?;
    let check = if recorded.is_some() && found.blake3.as_deref() != recorded {
        CopyCheck::Blake3Differs
    } else if named.is_some() && found.sha256.as_deref() != named {
        CopyCheck::Sha256Differs
    } else if recorded.is_none() && named.is_none() {
        CopyCheck::Unrecorded
    } else {
        CopyCheck::Matches
    };
    Ok(check)
}

/// Drops entries whose data is missing or the wrong size, and data files the index
/// does not name (a crash between rename and journal).
fn reconcile(index: &mut Index, data_dir: &Path) -> Result<(), StoreError> {
    let mut on_disk = HashMap::new();
    for entry in fs::read_dir(data_dir).map_err(|e| StoreError::io(data_dir, e))? {
        let entry = entry.map_err(|e| StoreError::io(data_dir, e))?;
        let len = entry.metadata().map(|m| m.len()).ok();
        on_disk.insert(entry.file_name(), (entry.path(), len));
    }
    let stale: Vec<Key> = index
        .iter_lru()
        .filter(|(k, e)| {
            on_disk
                .get(std::ffi::OsStr::new(k.as_str()))
                .is_none_or(|(_, len)| *len != Some(e.stamp.size))
        })
        .map(|(k, _)| k.clone())
        .collect();
    for key in stale {
        warn!(key = %key, "dropping an index entry whose copy is missing or incomplete");
        index.remove(&key);
    }
    for (name, (path, _)) in on_disk {
        let named = name
            .to_str()
            .and_then(Key::parse)
            .is_some_and(|k| index.get(&k).is_some());
        if !named {
            warn!(path = %stagefs_source::logged(&path), "removing a copy the index does not name");
            remove_if_present(&path)?;
        }
    }
    Ok(())
}

/// Makes a copy written by an older stagefs read-only; returns its new identity
/// (a mode change is a change of its change time), or None if it already was.
fn make_read_only(path: &Path, file: &File) -> Option<CopyId> {
    let meta = file.metadata().ok()?;
    if meta.permissions().mode() & 0o222 == 0 {
        return None;
    }
    fs::set_permissions(path, fs::Permissions::from_mode(COPY_MODE)).ok()?;
    fs::metadata(path).ok().map(|m| CopyId::of(&m))
}

fn private_dir_builder() -> DirBuilder {
    let mut builder = DirBuilder::new();
    builder.recursive(true).mode(0o700);
    builder
}

fn take_lock(path: &Path) -> Result<File, StoreError> {
    let mut file = File::options()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| StoreError::io(path, e))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let holder = fs::read_to_string(path).unwrap_or_default();
            return Err(StoreError::Locked {
                path: path.to_path_buf(),
                pid: holder.trim().parse().ok(),
            });
        }
        Err(TryLockError::Error(e)) => return Err(StoreError::io(path, e)),
    }
    // Best effort: tells a refused second process who holds the cache.
    let _ = file
        .set_len(0)
        .and_then(|()| write!(file, "{}", std::process::id()));
    Ok(file)
}

fn remove_all_in(dir: &Path) -> Result<(), StoreError> {
    for entry in fs::read_dir(dir)
        .map_err(|e| StoreError::io(dir, e))?
        .flatten()
    {
        remove_if_present(&entry.path())?;
    }
    Ok(())
}

fn remove_if_present(path: &Path) -> Result<(), StoreError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(StoreError::io(path, e)),
        _ => Ok(()),
    }
}

// A rename is durable only once its directory is synced.
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use index::Record;
    use stagefs_source::Stamp;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn budget(max: u64) -> Budget {
        Budget {
            max_size: Some(max),
            min_free: None,
        }
    }

    fn key(name: &str) -> Key {
        Key::for_source_path(Path::new(name))
    }

    /// Stages a file named `name` of `size` bytes (all `fill`) the way the stager does.
    fn stage(store: &Store, name: &str, size: usize, fill: u8) -> Result<OpenCopy, StoreError> {
        let (tmp, entry, reservation) = copied(store, name, &vec![fill; size])?;
        store.commit(&key(name), tmp, entry, reservation)
    }

    /// A copy of `bytes` for `name` as the stager leaves it before the store takes
    /// it: a written temp file, its entry and its reservation.
    fn copied(
        store: &Store,
        name: &str,
        bytes: &[u8],
    ) -> Result<(NamedTempFile, Entry, Reservation), StoreError> {
        let reservation = store.reserve(&key(name), bytes.len() as u64, Path::new(name), true)?;
        let mut tmp = store.create_temp()?;
        tmp.write_all(bytes)
            .map_err(|e| StoreError::io(tmp.path(), e))?;
        let entry = Entry {
            source: PathBuf::from(name),
            stamp: Stamp {
                size: bytes.len() as u64,
                mtime_ns: 1,
                ..Stamp::default()
            },
            // As the stager records it: nothing for a blob, named by its sha256.
            blake3: key(name)
                .content_sha256()
                .is_none()
                .then(|| blake3::hash(bytes).to_hex().to_string()),
            last_use: stagefs_source::sys::now_secs(),
            copy: CopyId::default(),
        };
        Ok((tmp, entry, reservation))
    }

    fn names(store: &Store) -> Vec<String> {
        store
            .entries()
            .into_iter()
            .map(|i| i.entry.source.display().to_string())
            .collect()
    }

    #[test]
    fn evicts_least_recently_used_first() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), budget(300))?;
        for name in ["a", "b", "c"] {
            drop(stage(&store, name, 100, 1)?);
        }
        // Using "a" makes "b" the least recently used.
        assert!(store.lookup(&key("a"), |_| true).is_some());
        drop(stage(&store, "d", 100, 1)?);
        assert_eq!(names(&store), ["c", "a", "d"]);
        assert!(!store.data_path(&key("b")).exists());
        Ok(())
    }

    #[test]
    fn pinned_copies_are_never_evicted_or_removed() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), budget(200))?;
        let held_a = stage(&store, "a", 100, 1)?;
        let held_b = stage(&store, "b", 100, 1)?;
        assert!(matches!(
            stage(&store, "c", 100, 1),
            Err(StoreError::NoRoom { in_use: 200, .. })
        ));
        assert!(matches!(
            store.remove(&key("a")),
            Err(StoreError::InUse { .. })
        ));
        drop(held_a);
        drop(stage(&store, "c", 100, 1)?);
        assert_eq!(names(&store), ["b", "c"]);
        drop(held_b);
        Ok(())
    }

    #[test]
    fn a_file_larger_than_the_budget_evicts_nothing() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), budget(200))?;
        drop(stage(&store, "a", 100, 1)?);
        assert!(matches!(
            stage(&store, "huge", 201, 1),
            Err(StoreError::NoRoom { needed: 201, .. })
        ));
        assert_eq!(names(&store), ["a"]);
        Ok(())
    }

    #[test]
    fn index_survives_reopen_and_drops_broken_or_unknown_copies() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), budget(1000))?;
        for name in ["a", "b", "c"] {
            drop(stage(&store, name, 10, 1)?);
        }
        let (a, b) = (store.data_path(&key("a")), store.data_path(&key("b")));
        let orphan = a.with_file_name(key("orphan").as_str());
        drop(store);
        fs::remove_file(&a)?;
        fs::write(&b, b"short")?;
        fs::write(&orphan, b"left by a crash")?;
        let store = Store::open(dir.path(), budget(1000))?;
        assert_eq!(names(&store), ["c"]);
        assert!(!orphan.exists() && !b.exists());
        assert_eq!(store.usage()?.used, 10);
        Ok(())
    }

    /// Copies a cache directory as a crash leaves it (the lock aside).
    pub(crate) fn copy_tree(from: &Path, to: &Path) {
        for entry in fs::read_dir(from).expect("ls") {
            let entry = entry.expect("entry");
            let target = to.join(entry.file_name());
            if entry.file_type().expect("type").is_dir() {
                fs::create_dir_all(&target).expect("mkdir");
                copy_tree(&entry.path(), &target);
            } else if entry.file_name() != "lock" {
                fs::copy(entry.path(), &target).expect("copy");
            }
        }
    }

    /// The identities the journal in `dir` records for `name`, in order.
    fn journaled(dir: &Path, name: &str) -> Vec<CopyId> {
        let journal =
            fs::read_to_string(dir.join(LAYOUT_DIR).join("index.jsonl")).expect("journal");
        journal
            .lines()
            .filter_map(|line| match serde_json::from_str(line) {
                Ok(Record::Put { key: k, entry }) if k == key(name).as_str() => Some(entry.copy),
                _ => None,
            })
            .collect()
    }

    /// A copy in progress, which holds commits back.
    fn copy_in_progress(store: &Store) -> Reservation {
        store
            .reserve(&key("in-progress"), 1, Path::new("in-progress"), false)
            .expect("room")
    }

    #[test]
    fn a_copy_is_served_before_its_commit_and_journaled_with_its_identity_once_synced() -> TestResult
    {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), budget(1000))?;
        let other = copy_in_progress(&store);
        let hit = stage(&store, "a", 100, 7)?;
        let mut read = Vec::new();
        io::Read::read_to_end(&mut &hit.file, &mut read)?;
        assert_eq!(read, [7; 100], "served whole before its commit");
        drop(hit);
        // Not durable yet: the journal vouches for no file, and nothing may evict it.
        assert_eq!(journaled(dir.path(), "a"), [CopyId::UNVERIFIED]);
        assert_eq!(store.entries()[0].hold, Some(Hold::Open));
        drop(other);
        store.commit_now();
        let identity = CopyId::of(&fs::metadata(store.data_path(&key("a")))?);
        assert_eq!(journaled(dir.path(), "a"), [CopyId::UNVERIFIED, identity]);
        assert_eq!(store.entries()[0].hold, None);
        Ok(())
    }

    #[test]
    fn a_store_going_away_commits_what_it_answered_without_waiting_for_copies() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), budget(1000))?;
        let other = copy_in_progress(&store);
        drop(stage(&store, "a", 100, 7)?);
        let identity = CopyId::of(&fs::metadata(store.data_path(&key("a")))?);
        let started = Instant::now();
        drop(store);
        assert!(started.elapsed() < committer::WAIT_FOR_COPIES_MAX);
        assert_eq!(journaled(dir.path(), "a"), [CopyId::UNVERIFIED, identity]);
        drop(other);
        Ok(())
    }

    #[test]
    fn a_copy_waiting_for_its_commit_is_committed_rather_than_refused_when_room_is_needed()
    -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), budget(150))?;
        let other = copy_in_progress(&store);
        drop(stage(&store, "a", 100, 1)?);
        drop(stage(&store, "b", 100, 2)?);
        assert_eq!(names(&store), ["b"], "a was committed, then evicted");
        assert_eq!(store.remove(&key("b"))?.map(|e| e.stamp.size), Some(100));
        drop(other);
        Ok(())
    }

    #[test]
    fn a_crash_before_the_commit_keeps_a_whole_copy_and_drops_one_whose_tail_was_lost() -> TestResult
    {
        let dir = tempfile::tempdir()?;
        let image = tempfile::tempdir()?;
        let store = Store::open(dir.path(), budget(10_000))?;
        drop(stage(&store, "committed", 100, 1)?);
        store.commit_now();
        let other = copy_in_progress(&store);
        drop(stage(&store, "whole", 100, 2)?);
        drop(stage(&store, "torn", 100, 3)?);
        // The cache directory as a kill -9 leaves it between the answers and the commits.
        copy_tree(dir.path(), image.path());
        drop(other);
        drop(store);
        assert_eq!(journaled(image.path(), "whole"), [CopyId::UNVERIFIED]);
        // Power lost before the tail of "torn" reached the disk.
        let torn = image
            .path()
            .join(LAYOUT_DIR)
            .join("data")
            .join(key("torn").as_str());
        fs::set_permissions(&torn, fs::Permissions::from_mode(0o600))?;
        let mut bytes = fs::read(&torn)?;
        bytes[90..].fill(0);
        fs::write(&torn, bytes)?;

        let restarted = Store::open(image.path(), budget(10_000))?;
        assert!(restarted.lookup(&key("torn"), |_| true).is_none());
        let whole = restarted
            .lookup(&key("whole"), |_| true)
            .expect("re-hashed, kept");
        assert_eq!(fs::read(&whole.path)?, [2; 100]);
        let committed = restarted.lookup(&key("committed"), |_| true).expect("kept");
        assert_eq!(fs::read(&committed.path)?, [1; 100]);
        drop((whole, committed));
        let mut kept = names(&restarted);
        kept.sort();
        assert_eq!(kept, ["committed", "whole"]);
        // Re-hashed and synced, "whole" is vouched for again.
        let identity = CopyId::of(&fs::metadata(restarted.data_path(&key("whole")))?);
        assert_eq!(journaled(image.path(), "whole").last(), Some(&identity));
        Ok(())
    }

    /// Records `bytes` as the blob they are the sha256 of, its check still running.
    fn stage_blob_unchecked(
        store: &Store,
        bytes: &[u8],
    ) -> Result<(String, Unverified), StoreError> {
        let sha = format!("{:x}", <sha2::Sha256 as sha2::Digest>::digest(bytes));
        let name = format!("models--a--b/blobs/{sha}");
        let (tmp, entry, reservation) = copied(store, &name, bytes)?;
        let (hit, unverified) = store.commit_unverified(&key(&name), tmp, entry, reservation)?;
        drop(hit);
        Ok((name, unverified))
    }

    #[test]
    fn a_blob_served_before_its_check_is_neither_evicted_nor_trusted_before_the_verdict()
    -> TestResult {
        let dir = tempfile::tempdir()?;
        let image = tempfile::tempdir()?;
        let store = Store::open(dir.path(), budget(10_000))?;
        let (good, good_check) = stage_blob_unchecked(&store, &[5; 100])?;
        let (torn, torn_check) = stage_blob_unchecked(&store, &[6; 100])?;
        // The cache directory as a kill -9 leaves it between the answers and the verdicts.
        copy_tree(dir.path(), image.path());
        assert_eq!(journaled(dir.path(), &good), [CopyId::UNVERIFIED]);
        std::thread::scope(|scope| -> TestResult {
            let eviction = scope.spawn(|| store.remove(&key(&good)));
            std::thread::sleep(Duration::from_millis(200));
            assert!(
                !eviction.is_finished(),
                "an eviction waits for the verdicts"
            );
            good_check.confirm();
            torn_check.refute("test");
            let evicted = eviction.join().map_err(|_| "eviction panicked")??;
            assert_eq!(evicted.map(|e| e.source), Some(PathBuf::from(&good)));
            Ok(())
        })?;
        assert!(store.entries().is_empty());
        assert_eq!(store.usage()?.used, 0);
        drop(store);

        // Power lost before the tail of "torn" reached the disk.
        let torn_copy = image
            .path()
            .join(LAYOUT_DIR)
            .join("data")
            .join(key(&torn).as_str());
        fs::set_permissions(&torn_copy, fs::Permissions::from_mode(0o600))?;
        let mut bytes = fs::read(&torn_copy)?;
        bytes[90..].fill(0);
        fs::write(&torn_copy, bytes)?;
        let restarted = Store::open(image.path(), budget(10_000))?;
        assert!(restarted.lookup(&key(&torn), |_| true).is_none());
        let kept = restarted
            .lookup(&key(&good), |_| true)
            .expect("re-hashed against its name, kept");
        assert_eq!(fs::read(&kept.path)?, [5; 100]);
        drop(kept);
        assert_eq!(names(&restarted), [good.as_str()]);
        Ok(())
    }

    #[test]
    fn a_damaged_copy_found_by_one_open_never_takes_out_the_good_one_another_staged() -> TestResult
    {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), budget(1000))?;
        drop(stage(&store, "a", 100, 1)?);
        // What one open checked, and found damaged, while another open staged it again.
        let checked = store.entries()[0].entry.clone();
        drop(stage(&store, "a", 100, 2)?);
        store.remove_checked(&key("a"), &checked);
        let kept = store
            .lookup(&key("a"), |_| true)
            .expect("the new copy stays");
        assert_eq!(fs::read(&kept.path)?, [2; 100]);
        drop(kept);
        // The copy it checked is still the entry: that one goes.
        let current = store.entries()[0].entry.clone();
        store.remove_checked(&key("a"), &current);
        assert!(store.entries().is_empty());
        Ok(())
    }

    #[test]
    fn a_corrupt_copy_is_dropped_on_first_use_after_restart() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), budget(1000))?;
        drop(stage(&store, "a", 64, 7)?);
        let data = store.data_path(&key("a"));
        drop(store);
        let mut bytes = fs::read(&data)?;
        bytes[10] ^= 1;
        fs::write(&data, bytes)?;
        let store = Store::open(dir.path(), budget(1000))?;
        assert!(store.lookup(&key("a"), |_| true).is_none());
        assert!(!store.contains(&key("a")) && !data.exists());
        Ok(())
    }

    #[test]
    fn a_touched_blob_copy_is_checked_against_its_name_and_kept_only_if_it_matches() -> TestResult {
        use sha2::Digest as _;
        let (size, fill) = (64, 7u8);
        let sha = format!("{:x}", sha2::Sha256::digest(vec![fill; size]));
        let blob = format!("models--a--x/blobs/{sha}");
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), budget(1000))?;
        drop(stage(&store, &blob, size, fill)?);
        let data = store.data_path(&key(&blob));
        // A chmod changes the change time, not the bytes: re-hashed, and kept.
        fs::set_permissions(&data, fs::Permissions::from_mode(0o444))?;
        assert!(store.lookup(&key(&blob), |_| true).is_some());
        // Changed bytes no longer match the name: dropped.
        fs::set_permissions(&data, fs::Permissions::from_mode(0o644))?;
        let mut bytes = fs::read(&data)?;
        bytes[10] ^= 1;
        fs::write(&data, bytes)?;
        assert!(store.lookup(&key(&blob), |_| true).is_none());
        assert!(!store.contains(&key(&blob)) && !data.exists());
        Ok(())
    }

    #[test]
    fn a_second_store_on_one_directory_is_refused() -> TestResult {
        let dir = tempfile::tempdir()?;
        let _store = Store::open(dir.path(), Budget::default())?;
        assert!(matches!(
            Store::open(dir.path(), Budget::default()),
            Err(StoreError::Locked { pid: Some(p), .. }) if p == std::process::id()
        ));
        Ok(())
    }

    #[test]
    fn a_committed_copy_is_read_only_and_carries_the_source_mtime() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), budget(1000))?;
        drop(stage(&store, "a", 10, 1)?);
        let meta = fs::metadata(store.data_path(&key("a")))?;
        assert_eq!(meta.permissions().mode() & 0o777, 0o400);
        assert_eq!(meta.modified()?, stagefs_source::sys::time_from_ns(1));
        Ok(())
    }

    #[test]
    fn a_redirect_is_handed_out_only_for_a_current_untouched_copy() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), budget(1000))?;
        drop(stage(&store, "a", 10, 1)?);
        let path = store.data_path(&key("a"));
        assert!(path.is_absolute());
        assert_eq!(
            store.redirect(&key("a"), |_| true, Handout::Peek),
            Some(path.clone())
        );
        assert_eq!(store.redirect(&key("a"), |_| false, Handout::Peek), None);
        assert_eq!(
            store.redirect(&key("missing"), |_| true, Handout::Peek),
            None
        );
        // Anything done to the copy changes its change time: no redirect until an
        // open through the mount has re-hashed it.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o400))?;
        assert_eq!(store.redirect(&key("a"), |_| true, Handout::Peek), None);
        assert!(store.lookup(&key("a"), |_| true).is_some());
        assert_eq!(
            store.redirect(&key("a"), |_| true, Handout::Peek),
            Some(path)
        );
        Ok(())
    }

    #[test]
    fn a_writable_copy_from_an_older_stagefs_is_made_read_only_when_served() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), budget(1000))?;
        drop(stage(&store, "a", 10, 1)?);
        let path = store.data_path(&key("a"));
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600))?;
        drop(store);
        let store = Store::open(dir.path(), budget(1000))?;
        assert_eq!(store.redirect(&key("a"), |_| true, Handout::Peek), None);
        assert!(store.lookup(&key("a"), |_| true).is_some());
        assert_eq!(fs::metadata(&path)?.permissions().mode() & 0o777, 0o400);
        assert_eq!(
            store.redirect(&key("a"), |_| true, Handout::Peek),
            Some(path)
        );
        Ok(())
    }

    #[test]
    fn a_followed_redirect_keeps_its_copy_for_the_grace_but_a_peek_does_not() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store =
            Store::open(dir.path(), budget(200))?.with_redirect_grace(Duration::from_secs(3600));
        drop(stage(&store, "a", 100, 1)?);
        drop(stage(&store, "b", 100, 2)?);
        assert!(store.redirect(&key("a"), |_| true, Handout::Peek).is_some());
        assert!(
            store
                .redirect(&key("b"), |_| true, Handout::Resolve)
                .is_some()
        );
        assert!(matches!(
            store.remove(&key("b")),
            Err(StoreError::InUse { .. })
        ));
        assert!(
            store
                .entries()
                .iter()
                .any(|e| e.key == key("b").as_str() && e.in_use)
        );
        // "a" was only looked at, so it goes; "b" was followed a moment ago, so it stays.
        drop(stage(&store, "c", 100, 3)?);
        assert_eq!(names(&store), ["b", "c"]);
        drop(stage(&store, "d", 100, 4)?);
        assert_eq!(names(&store), ["b", "d"]);
        Ok(())
    }

    #[test]
    fn a_link_a_lookup_presented_keeps_its_copy_until_it_can_have_been_read() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), budget(100))?.with_redirect_grace(Duration::ZERO);
        drop(stage(&store, "a", 100, 1)?);
        // A lookup presented "a" as a link: `realpath` reads that link a moment later.
        let path = store.redirect(&key("a"), |_| true, Handout::Present);
        assert_eq!(path, Some(store.data_path(&key("a"))));
        assert!(matches!(
            store.remove(&key("a")),
            Err(StoreError::InUse { .. })
        ));
        assert_eq!(store.redirect(&key("a"), |_| false, Handout::Present), None);
        std::thread::sleep(PRESENT_HOLD + Duration::from_millis(100));
        assert!(store.remove(&key("a"))?.is_some());
        assert_eq!(store.redirect(&key("a"), |_| true, Handout::Present), None);
        Ok(())
    }

    const LINK: Handout = Handout::Link { followed: false };

    #[test]
    fn a_removal_takes_an_nfs_link_back_and_waits_until_no_client_can_follow_it() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), budget(200))?;
        drop(stage(&store, "a", 100, 1)?);
        assert!(store.redirect(&key("a"), |_| true, LINK).is_some());
        let asked = Instant::now();
        assert!(store.remove(&key("a"))?.is_some());
        let waited = asked.elapsed();
        assert!(
            waited >= LINK_HOLD - Duration::from_millis(100),
            "removed {waited:?} after the link named it"
        );
        assert!(!store.data_path(&key("a")).exists());
        Ok(())
    }

    #[test]
    fn a_copy_being_taken_back_is_named_by_no_link() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(Store::open(dir.path(), budget(200))?);
        drop(stage(&store, "a", 100, 1)?);
        assert!(store.redirect(&key("a"), |_| true, LINK).is_some());
        let remover = {
            let store = Arc::clone(&store);
            std::thread::spawn(move || store.remove(&key("a")))
        };
        // While the removal waits, replies carry the link's other text.
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(store.redirect(&key("a"), |_| true, LINK), None);
        assert!(remover.join().expect("joined")?.is_some());
        Ok(())
    }

    #[test]
    fn a_copy_open_through_the_mount_is_still_in_use_and_named_again() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), budget(200))?;
        let open = stage(&store, "a", 100, 1)?;
        assert!(store.redirect(&key("a"), |_| true, LINK).is_some());
        assert!(matches!(
            store.remove(&key("a")),
            Err(StoreError::InUse { .. })
        ));
        drop(open);
        assert!(store.redirect(&key("a"), |_| true, LINK).is_some());
        Ok(())
    }

    #[test]
    fn after_a_jukebox_a_once_linked_copy_stays_until_clients_settle() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), budget(200))?;
        drop(stage(&store, "a", 100, 1)?);
        drop(stage(&store, "b", 100, 2)?);
        assert!(store.redirect(&key("a"), |_| true, LINK).is_some());
        store.links_unsettled_until(Instant::now() + Duration::from_secs(3600));
        let asked = Instant::now();
        assert!(matches!(
            store.remove(&key("a")),
            Err(StoreError::InUse { .. })
        ));
        assert!(asked.elapsed() >= LINK_WAIT, "waited what it may first");
        let held = store
            .entries()
            .into_iter()
            .find(|e| e.key == key("a").as_str());
        assert!(matches!(
            held.and_then(|e| e.hold),
            Some(Hold::Link { secs_left }) if secs_left > 3000
        ));
        // Never named by a link: nothing holds it.
        assert!(store.remove(&key("b"))?.is_some());
        Ok(())
    }

    #[test]
    fn a_full_cache_takes_back_links_to_make_room() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), budget(200))?;
        drop(stage(&store, "a", 100, 1)?);
        drop(stage(&store, "b", 100, 2)?);
        assert!(store.redirect(&key("a"), |_| true, LINK).is_some());
        assert!(store.redirect(&key("b"), |_| true, LINK).is_some());
        let asked = Instant::now();
        drop(stage(&store, "c", 100, 3)?);
        assert!(asked.elapsed() >= LINK_HOLD - Duration::from_millis(100));
        // The least recently used goes; the other is named again.
        assert_eq!(names(&store), ["b", "c"]);
        assert!(store.redirect(&key("b"), |_| true, LINK).is_some());
        Ok(())
    }

    #[test]
    fn a_followed_redirect_is_evictable_once_its_grace_is_over() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), budget(100))?.with_redirect_grace(Duration::ZERO);
        drop(stage(&store, "a", 100, 1)?);
        assert!(
            store
                .redirect(&key("a"), |_| true, Handout::Resolve)
                .is_some()
        );
        drop(stage(&store, "b", 100, 2)?);
        assert_eq!(names(&store), ["b"]);
        assert_eq!(store.redirect(&key("a"), |_| true, Handout::Resolve), None);
        Ok(())
    }

    #[test]
    fn serving_copies_never_waits_for_a_journal_write_in_progress() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(Store::open(dir.path(), budget(1000))?);
        drop(stage(&store, "a", 10, 1)?);
        // Another thread is in the middle of a slow journal sync.
        let writing = lock(&store.ledger.journal);
        let (tx, rx) = std::sync::mpsc::channel();
        let server = Arc::clone(&store);
        std::thread::spawn(move || {
            let hit = server.lookup(&key("a"), |_| true).is_some();
            let link = server
                .redirect(&key("a"), |_| true, Handout::Resolve)
                .is_some();
            let listed = server.entries().len();
            let _ = tx.send((hit, link, listed));
        });
        let served = rx.recv_timeout(std::time::Duration::from_secs(10));
        drop(writing);
        assert_eq!(served?, (true, true, 1));
        Ok(())
    }

    #[test]
    fn an_evicted_copy_is_moved_aside_and_unlinked_and_its_key_restaged() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path(), budget(100))?;
        drop(stage(&store, "a", 100, 1)?);
        drop(stage(&store, "b", 100, 2)?);
        assert_eq!(names(&store), ["b"]);
        assert_eq!(
            fs::read_dir(dir.path().join("v1/tmp"))?.count(),
            0,
            "unlinked"
        );
        assert_eq!(lock(&store.ledger.state).unlinking, 0);
        drop(stage(&store, "a", 100, 3)?);
        let hit = store.lookup(&key("a"), |_| true).ok_or("restaged")?;
        assert_eq!(fs::read(hit.path)?, vec![3; 100]);
        drop(store);
        let store = Store::open(dir.path(), budget(100))?;
        assert_eq!(names(&store), ["a"], "the journal agrees after a reopen");
        Ok(())
    }

    #[test]
    fn a_crash_during_the_commit_leaves_nothing_a_restart_would_serve() {
        let cache = tempfile::tempdir().expect("tempdir");
        let image = tempfile::tempdir().expect("tempdir");
        let store = Store::open(cache.path(), Budget::default()).expect("store");
        let key = Key::for_source_path(Path::new("w.bin"));
        let reservation = store
            .reserve(&key, 3 << 20, Path::new("w.bin"), true)
            .expect("room");
        let mut tmp = store.create_temp().expect("temp");
        std::io::Write::write_all(&mut tmp, &[9u8; 3 << 20]).expect("write");
        let entry = crate::index::Entry {
            source: PathBuf::from("w.bin"),
            stamp: Stamp {
                size: 3 << 20,
                mtime_ns: 1,
                ..Stamp::default()
            },
            blake3: Some(blake3::hash(&[9u8; 3 << 20]).to_hex().to_string()),
            last_use: 0,
            copy: crate::index::CopyId::default(),
        };
        let placed = store.place(&key, tmp, &entry).expect("place");
        // The cache directory as a crash between the rename and the journal leaves it.
        copy_tree(cache.path(), image.path());
        drop((placed, reservation));
        // The copy is in place, named by no index entry.
        assert_eq!(
            image.path().join("v1/data").read_dir().expect("ls").count(),
            1
        );
        let restarted = Store::open(image.path(), Budget::default()).expect("reopen");
        assert!(restarted.entries().is_empty());
        assert!(restarted.lookup(&key, |_| true).is_none());
        assert_eq!(restarted.redirect(&key, |_| true, Handout::Peek), None);
        assert_eq!(
            image.path().join("v1/data").read_dir().expect("ls").count(),
            0
        );
    }

    #[test]
    fn a_reservation_grows_while_the_budget_has_room_and_counts_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path(), budget(100)).expect("store");
        let source = Path::new("written.bin");
        let mut room = store.reserve_unnamed(40, source).expect("room");
        store
            .grow(&mut room, 90, source)
            .expect("grows within the budget");
        assert_eq!(room.bytes(), 90);
        assert_eq!(store.usage().expect("usage").reserved, 90, "counted once");
        assert!(matches!(
            store.grow(&mut room, 101, source),
            Err(StoreError::NoRoom { .. })
        ));
        assert_eq!(
            room.bytes(),
            90,
            "a refused growth keeps the promise as it was"
        );
        drop(room);
        assert_eq!(store.usage().expect("usage").reserved, 0);
    }
}
