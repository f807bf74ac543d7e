//! Copying from a file on a local disk inside the kernel (Linux). There the copy is
//! bound by the CPU, and what costs is moving the bytes through this process: read
//! into a buffer, written out, each a full copy. `sendfile` moves them from the
//! source's page cache into the copy's in one, and the hashers read them back from
//! mappings of the copy, which copy nothing. The copy is mapped a window at a time and
//! each window unmapped once hashed: a mapping of a whole 50 GB shard would count as
//! 50 GB of the daemon's resident memory.
//!
//! Hashing the copy rather than the source also means the digests describe exactly
//! the bytes that will be served. (`copy_file_range` would do the same, but refuses
//! to cross filesystems, which is the whole point here.)

use std::fs::File;
use std::io;
use std::ops::Deref;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use memmap2::{Mmap, MmapOptions};

use super::hashers::Hashers;
use super::{Copied, CopyError, CopyJob, PIECE};

/// Bytes of the copy mapped at once, a multiple of any page size.
const WINDOW: u64 = 4 << 20;

/// How far ahead of the copy the kernel is asked to read the source. A copy reads
/// one file in order on one thread, so left to itself the kernel keeps only its
/// readahead window (128 KiB to a few MiB) in flight, and a disk that needs many
/// requests at once to reach its speed (NVMe, a virtual disk, RAID) serves it at a
/// fraction of what it can. Pages read ahead wait in the page cache, not in this
/// process's memory. Not more: every read of anyone else's waits behind what is
/// queued, and with 64 MiB per copy, a loader's own start (Python importing its
/// modules from the same disk) took 4 s longer while two shards were prefetched
/// (docs/BENCHMARKS.md).
const READ_AHEAD: u64 = 16 << 20;

/// The source is asked for read-ahead this much at a time.
const READ_AHEAD_STEP: u64 = 8 << 20;

/// Copies `job` from `src` to `dst`, from `dst`'s current position (the start of a new
/// file), a chunk at a time, at most 1 MiB: `job.bytes_read` and `on_bytes` advance
/// together, after each. None, having written nothing, when this kernel or these
/// filesystems cannot copy that way, or `dst` cannot be mapped.
pub(super) fn copy(
    src: &File,
    dst: &mut File,
    job: CopyJob<'_>,
    on_bytes: &mut impl FnMut(u64),
) -> Result<Option<Copied>, CopyError> {
    let size = job.size;
    let step = job.plan.chunk.clamp(1, PIECE) as u64;
    let mut windows = Windows::of(dst, size);
    // A copy on a filesystem that cannot be mapped (a FUSE one without mmap) is
    // copied the other way; asked before anything is written.
    if size > 0 && windows.window_at(0).is_err() {
        return Ok(None);
    }
    std::thread::scope(|scope| {
        let hashers = Hashers::spawn(scope, job.digests, step as usize);
        let mut read_ahead = ReadAhead::of(src, size);
        let mut copied = 0u64;
        while copied < size {
            read_ahead.keep_ahead_of(copied);
            let want = step.min(size - copied) as usize;
            let n = match send(src, dst, copied, want) {
                Err(CopyError::Read(e)) if copied == 0 && unsupported(&e) => return Ok(None),
                sent => sent?,
            };
            if n == 0 {
                break; // the source is shorter than it said: the caller sees `bytes`
            }
            job.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
            if job.digests.any() {
                for piece in windows.pieces(copied, copied + n as u64)? {
                    hashers.feed(&piece)?;
                }
            }
            copied += n as u64;
            on_bytes(n as u64);
        }
        hashers.finish(copied).map(Some)
    })
}

/// Whether a first `sendfile` failed because it cannot copy between these two files
/// at all (a filesystem without the support it needs, an old kernel).
fn unsupported(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
    )
}

/// The copy-to-be, `size` bytes, mapped a [`WINDOW`] at a time as the copy reaches it.
struct Windows<'f> {
    file: &'f File,
    size: u64,
    /// The window mapped last, and where in the file it starts. Pieces hold the
    /// windows they lie in; a window is unmapped when its last piece is hashed.
    current: Option<(u64, Arc<Mmap>)>,
}

impl<'f> Windows<'f> {
    fn of(file: &'f File, size: u64) -> Self {
        Windows {
            file,
            size,
            current: None,
        }
    }

    /// Bytes `start..end` of the copy, just written, as pieces for the hashers (two
    /// when they cross a window's edge).
    fn pieces(&mut self, start: u64, end: u64) -> Result<Vec<Piece>, CopyError> {
        let mut pieces = Vec::with_capacity(2);
        let mut at = start;
        while at < end {
            let (base, map) = self.window_at(at)?;
            let stop = end.min(base + map.len() as u64);
            pieces.push(Piece {
                map,
                start: (at - base) as usize,
                end: (stop - base) as usize,
            });
            at = stop;
        }
        Ok(pieces)
    }

    /// The window holding byte `at`, mapped if it is not yet.
    fn window_at(&mut self, at: u64) -> Result<(u64, Arc<Mmap>), CopyError> {
        let base = at - at % WINDOW;
        if let Some((start, map)) = &self.current
            && *start == base
        {
            return Ok((base, Arc::clone(map)));
        }
        let len = usize::try_from(WINDOW.min(self.size - base)).unwrap_or(usize::MAX);
        // SAFETY: the file is this copy's own temporary file, which nothing else
        // writes or truncates while the copy runs, and the hashers touch only bytes
        // already written to it (below its end, so no access faults). The window may
        // reach past the file's current end; Linux allows that, and those pages are
        // touched only once written.
        let map = unsafe { MmapOptions::new().offset(base).len(len).map(self.file) };
        let map = Arc::new(map.map_err(CopyError::Write)?);
        self.current = Some((base, Arc::clone(&map)));
        Ok((base, map))
    }
}

/// Asks the kernel to read the source [`READ_AHEAD`] ahead of the copy.
struct ReadAhead<'f> {
    src: &'f File,
    size: u64,
    /// Where the range asked for so far ends.
    asked: u64,
}

impl<'f> ReadAhead<'f> {
    fn of(src: &'f File, size: u64) -> Self {
        // Best effort, like every hint here: a larger readahead window for the rest.
        // SAFETY: the descriptor is open; the call only sets a hint on it.
        unsafe { libc::posix_fadvise(src.as_raw_fd(), 0, 0, libc::POSIX_FADV_SEQUENTIAL) };
        ReadAhead {
            src,
            size,
            asked: 0,
        }
    }

    /// Asks for the source's bytes up to [`READ_AHEAD`] past `copied`, a step at a time.
    fn keep_ahead_of(&mut self, copied: u64) {
        let until = (copied + READ_AHEAD).min(self.size);
        while self.asked < until {
            let len = READ_AHEAD_STEP.min(self.size - self.asked);
            let (Ok(at), Ok(n)) = (
                libc::off_t::try_from(self.asked),
                libc::off_t::try_from(len),
            ) else {
                return;
            };
            // SAFETY: as above; WILLNEED starts reads into the page cache and returns.
            unsafe { libc::posix_fadvise(self.src.as_raw_fd(), at, n, libc::POSIX_FADV_WILLNEED) };
            self.asked += len;
        }
    }
}

/// Moves up to `len` bytes from `src` at `offset` to the end of what `dst` holds.
/// Returns how many moved; 0 at the source's end.
fn send(src: &File, dst: &File, offset: u64, len: usize) -> Result<usize, CopyError> {
    let mut at = libc::off_t::try_from(offset)
        .map_err(|_| CopyError::Read(io::ErrorKind::InvalidInput.into()))?;
    loop {
        // SAFETY: both descriptors are open files for the duration of the call, and
        // `at` is a valid offset the call updates.
        let n = unsafe { libc::sendfile(dst.as_raw_fd(), src.as_raw_fd(), &mut at, len) };
        if let Ok(n) = usize::try_from(n) {
            return Ok(n);
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(blame(src, offset, error));
        }
    }
}

/// Which side a failed `sendfile` failed on. It does not say; a read of the source's
/// byte at the same place does: if that works, the write failed (a full disk, most
/// often), and staging must say so rather than call the source broken.
fn blame(src: &File, offset: u64, error: io::Error) -> CopyError {
    use std::os::unix::fs::FileExt;
    match src.read_at(&mut [0u8; 1], offset) {
        Ok(_) => CopyError::Write(error),
        Err(_) => CopyError::Read(error),
    }
}

/// Bytes `start..end` of the copy, as the hashers see them.
#[derive(Clone)]
struct Piece {
    map: Arc<Mmap>,
    start: usize,
    end: usize,
}

impl Deref for Piece {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.map[self.start..self.end]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_sendfile_is_blamed_on_the_side_that_fails() {
        let mut readable = tempfile::tempfile().expect("temp");
        std::io::Write::write_all(&mut readable, b"abc").expect("write");
        let full = || io::Error::from_raw_os_error(libc::ENOSPC);
        assert!(matches!(blame(&readable, 1, full()), CopyError::Write(_)));
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("w");
        let write_only = File::create(&path).expect("create");
        assert!(matches!(blame(&write_only, 0, full()), CopyError::Read(_)));
    }

    #[test]
    fn a_range_across_a_windows_edge_is_two_pieces_of_the_right_bytes() -> io::Result<()> {
        let size = WINDOW + 100;
        let bytes: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let mut file = tempfile::tempfile()?;
        std::io::Write::write_all(&mut file, &bytes)?;
        let mut windows = Windows::of(&file, size);
        let (start, end) = (WINDOW - 10, WINDOW + 30);
        let pieces = windows
            .pieces(start, end)
            .map_err(|e| io::Error::other(format!("{e:?}")))?;
        assert_eq!(pieces.len(), 2);
        let joined: Vec<u8> = pieces.iter().flat_map(|p| p.to_vec()).collect();
        assert_eq!(joined, bytes[start as usize..end as usize]);
        let within = windows
            .pieces(5, 50)
            .map_err(|e| io::Error::other(format!("{e:?}")))?;
        assert_eq!(within.len(), 1);
        assert_eq!(&within[0][..], &bytes[5..50]);
        Ok(())
    }
}
