//! Staging a file as it is written: the copy one handle fills, in the store, from
//! the same bytes it writes to the source. The policy decides which handles tee and
//! what happens at their close (`stagefs_policy`'s `tee` module); this is the local
//! side, which owns the temp file and the space it takes.
//!
//! The copy holds a [`Reservation`] for what it has written plus the next
//! [`ROOM_STEP`] bytes, grown a step at a time ([`stagefs_store::Store::grow`]), so
//! the budget counts it once, as it counts any copy in progress. The reservation is unnamed (it pins no stored copy): the
//! file may be renamed before it is closed, and an older copy of its path is the
//! policy's to remove meanwhile. Like a prefetch, it never evicts to make room: where the
//! budget has none, the copy is dropped, and the file is staged from the source at
//! its first open instead.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use stagefs_source::locks::lock;
use stagefs_store::Reservation;
use tempfile::NamedTempFile;

use crate::{Stager, WrittenCopy};

/// Bytes by which a written copy's reservation grows: large enough that the budget
/// is asked rarely (a 4 GiB shard asks 128 times), small enough that a copy the
/// budget cannot hold is given up early.
pub const ROOM_STEP: u64 = 32 << 20;

/// The local copy one handle fills as it writes a file front to back
/// ([`Stager::tee`]). Any write out of order, a truncate below what it holds, a
/// failed local write or a budget without room drops it for good.
#[derive(Debug)]
pub struct TeeWriter {
    stager: Stager,
    /// The source path the handle opened, which the reservation is for.
    path: PathBuf,
    state: Mutex<Filling>,
}

#[derive(Debug)]
enum Filling {
    /// Nothing written yet: no temp file either.
    Empty,
    /// `next` bytes written so far, front to back, with room reserved for them and
    /// up to the next step.
    Copy {
        tmp: NamedTempFile,
        next: u64,
        room: Reservation,
    },
    /// Given up.
    Dropped,
}

impl Stager {
    /// A copy of `rel` to fill as a handle writes it ([`TeeWriter`]); nothing is
    /// created or reserved until its first write.
    pub fn tee(&self, rel: &Path) -> TeeWriter {
        TeeWriter {
            stager: self.clone(),
            path: rel.to_path_buf(),
            state: Mutex::new(Filling::Empty),
        }
    }
}

impl TeeWriter {
    /// Also writes `data` at `offset` to the copy (a temp file in the store, made at
    /// the first write), if it continues it; otherwise the copy is dropped. Local
    /// I/O, and the store's lock to grow the reservation: call it where blocking is
    /// allowed (a source thread, after the source took the same bytes).
    pub fn write(&self, data: &[u8], offset: u64) {
        let mut state = lock(&self.state);
        if matches!(*state, Filling::Empty) && offset == 0 {
            *state = self.start().unwrap_or(Filling::Dropped);
        }
        let kept = match &mut *state {
            Filling::Copy { tmp, next, room } if *next == offset => {
                let end = offset + data.len() as u64;
                self.room_for(room, end)
                    && FileExt::write_all_at(tmp.as_file(), data, offset)
                        .map(|()| *next = end)
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
    /// only writes that go on from where the copy stands keep it.
    pub fn set_len(&self, len: u64) {
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
    pub fn abandon(&self) {
        *lock(&self.state) = Filling::Dropped;
    }

    /// The whole copy, to adopt ([`Stager::adopt_written`]), if the handle wrote one;
    /// the copy is done with either way. Its reservation goes: adopting reserves the
    /// copy's size under the name it is committed as.
    pub fn take(&self) -> Option<WrittenCopy> {
        match std::mem::replace(&mut *lock(&self.state), Filling::Dropped) {
            Filling::Copy { tmp, next, .. } => Some(WrittenCopy { tmp, len: next }),
            _ => None,
        }
    }

    fn start(&self) -> Option<Filling> {
        let room = self.reserve(ROOM_STEP)?;
        let tmp = self.stager.store().create_temp().ok()?;
        Some(Filling::Copy { tmp, next: 0, room })
    }

    /// Whether `room` covers a copy `end` bytes long, growing it a step past `end`
    /// if not.
    fn room_for(&self, room: &mut Reservation, end: u64) -> bool {
        let wanted = end.div_ceil(ROOM_STEP).saturating_add(1) * ROOM_STEP;
        end <= room.bytes() || self.stager.store().grow(room, wanted, &self.path).is_ok()
    }

    fn reserve(&self, bytes: u64) -> Option<Reservation> {
        self.stager.store().reserve_unnamed(bytes, &self.path).ok()
    }
}
