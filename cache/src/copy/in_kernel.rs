//! Copying from a file on a local disk inside the kernel (Linux). There the copy is
//! bound by the CPU, and what costs is moving the bytes through this process: read
//! into a buffer, written out, each a full copy. `sendfile` moves them from the
//! source's page cache into the copy's in one, and the hashers read them back from a
//! mapping of the copy, which copies nothing.
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

/// Pieces a hasher may fall behind the copy. They are ranges of the copy, which is in
/// the page cache anyway, so a long queue costs no memory; it lets sha256, which takes
/// as long as the whole copy, run without ever waiting for it. With 2 pieces it
/// waited: a 1.2 GiB blob from a tmpfs took 0.96 to 1.02 s instead of 0.83 to
/// 0.87 s.
const HASH_QUEUE: usize = 128;

/// Copies `job` from `src` to `dst`, from `dst`'s current position (the start of a new
/// file), a chunk at a time, at most 1 MiB: `job.bytes_read` and `on_bytes` advance
/// together, after each. None, having written nothing, when this kernel or these
/// filesystems cannot copy that way.
pub(super) fn copy(
    src: &File,
    dst: &mut File,
    job: CopyJob<'_>,
    on_bytes: &mut impl FnMut(u64),
) -> Result<Option<Copied>, CopyError> {
    let size = job.size;
    let copy = map_copy(dst, size)?;
    let step = job.plan.chunk.clamp(1, PIECE) as u64;
    std::thread::scope(|scope| {
        let hashers = Hashers::spawn(scope, job.digests, HASH_QUEUE);
        let mut copied = 0u64;
        while copied < size {
            let want = step.min(size - copied) as usize;
            let n = match send(src, dst, copied, want) {
                Err(CopyError::Read(e)) if copied == 0 && unsupported(&e) => return Ok(None),
                sent => sent?,
            };
            if n == 0 {
                break; // the source is shorter than it said: the caller sees `bytes`
            }
            job.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
            if let Some(map) = &copy {
                hashers.feed(&Piece {
                    map: Arc::clone(map),
                    start: copied as usize,
                    end: (copied + n as u64) as usize,
                })?;
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

/// A read-only mapping of the whole copy-to-be, `size` bytes, none of them written
/// yet (None for an empty file, which cannot be mapped).
fn map_copy(dst: &File, size: u64) -> Result<Option<Arc<Mmap>>, CopyError> {
    if size == 0 {
        return Ok(None);
    }
    let len =
        usize::try_from(size).map_err(|_| CopyError::Write(io::ErrorKind::FileTooLarge.into()))?;
    // SAFETY: the file is this copy's own temporary file, which nothing else writes
    // or truncates while the copy runs, and the hashers touch only the bytes already
    // written to it (below its end, so no access faults). The mapping may reach past
    // the file's current end; Linux allows that, and those pages are never touched.
    let map = unsafe { MmapOptions::new().len(len).map(dst) };
    map.map(|m| Some(Arc::new(m))).map_err(CopyError::Write)
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
}
