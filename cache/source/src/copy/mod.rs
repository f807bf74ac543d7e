//! Copying one file, hashing in order as bytes arrive.
//!
//! From a network filesystem, with several reads in flight: it answers one read at a
//! time at its round-trip latency, and keeping `streams` reads outstanding lets it run
//! at the link's bandwidth. Memory stays bounded whatever the file size: at most
//! `window` chunks exist at once, because a reader needs a token to start a chunk and
//! the writer returns the token only once that chunk is written.
//!
//! From a local disk on Linux, inside the kernel (`in_kernel`): there the copy is
//! bound by the CPU, and moving the bytes through this process's memory is what costs.

mod hashers;
#[cfg(target_os = "linux")]
mod in_kernel;
mod name_check;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use hashers::Hashers;
pub use name_check::{NameCheck, Verdict};

use crate::ReadAt;
use crate::locks::lock;

/// Reads in flight while copying one file: four 2 MiB reads fill a 1 Gbit/s link
/// over sshfs (docs/BENCHMARKS.md) in 12 MiB of buffers per copy.
pub const COPY_STREAMS: usize = 4;

/// How a copy is spread over concurrent reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyOptions {
    /// Reads kept in flight.
    pub streams: usize,
    /// Bytes per read; None: by the source's kind ([`CopyOptions::for_source`]).
    pub chunk: Option<usize>,
}

/// How one copy runs: the options settled for its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyPlan {
    /// Reads in flight (for a copy that goes through this process).
    pub streams: usize,
    /// Bytes per read.
    pub chunk: usize,
    /// The source is on a local disk: on Linux its bytes move inside the kernel.
    pub local_source: bool,
}

impl CopyPlan {
    /// Most chunks held in memory at once.
    pub fn window(&self) -> usize {
        self.streams.max(1) + 2
    }
}

/// Which digests a copy computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Digests {
    /// blake3, what the index records to check a copy later.
    pub blake3: bool,
    /// sha256, the name of an LFS blob.
    pub sha256: bool,
}

impl Digests {
    /// What a copy needs: an LFS blob is checked against the sha256 that names it,
    /// which also identifies the copy later, so a blake3 of it would only cost time
    /// (a quarter of a second per GiB); any other file gets a blake3.
    pub fn for_copy(named_by_sha256: bool) -> Digests {
        Digests {
            blake3: !named_by_sha256,
            sha256: named_by_sha256,
        }
    }

    /// No digest: a copy checked otherwise ([`NameCheck`]).
    pub fn none() -> Digests {
        Digests {
            blake3: false,
            sha256: false,
        }
    }

    /// Whether any digest is asked for.
    pub fn any(&self) -> bool {
        self.blake3 || self.sha256
    }
}

/// Chunk from a network filesystem: four 2 MiB reads in flight fill a 1 Gbit/s link
/// over sshfs (docs/BENCHMARKS.md) in 12 MiB of buffers per copy.
pub const NETWORK_CHUNK: usize = 2 << 20;

/// Chunk from a local disk: small enough that a chunk is still in the CPU's cache
/// when the writer and the hasher read it. From a tmpfs, 2 MiB chunks spent about
/// twice the system time of 256 KiB ones copying into the page cache.
pub const LOCAL_CHUNK: usize = 256 << 10;

impl Default for CopyOptions {
    /// [`COPY_STREAMS`] reads in flight, of a size chosen by the
    /// source's kind.
    fn default() -> Self {
        CopyOptions {
            streams: COPY_STREAMS,
            chunk: None,
        }
    }
}

impl CopyOptions {
    /// These options settled for a source on a local disk or not: a chunk size left
    /// open is chosen by the source's kind.
    pub fn for_source(self, on_local_disk: bool) -> CopyPlan {
        let by_kind = if on_local_disk {
            LOCAL_CHUNK
        } else {
            NETWORK_CHUNK
        };
        CopyPlan {
            streams: self.streams.max(1),
            chunk: self.chunk.unwrap_or(by_kind).max(1),
            local_source: on_local_disk,
        }
    }
}

/// `digests` of the whole file at `path`, read on this thread (`bytes` is what was
/// read: 0 when no digest was asked for). The file is opened either way, so a missing
/// or unreadable one is an error.
pub fn digest_file(path: &std::path::Path, digests: Digests) -> io::Result<Copied> {
    hashers::of_file(path, digests)
}

/// Which side of a copy failed.
#[derive(Debug)]
pub enum CopyError {
    /// Reading the source.
    Read(io::Error),
    /// Writing the destination.
    Write(io::Error),
}

/// What a finished copy produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// Bytes copied (less than asked if the source ended early).
    pub bytes: u64,
    /// blake3 of those bytes, hex, when asked for.
    pub blake3: Option<String>,
    /// sha256 of those bytes, hex, when asked for.
    pub sha256: Option<String>,
}

type Chunk = (u64, io::Result<Buffer>);

/// Buffers of one copy, reused: a fresh 2 MiB allocation per chunk costs page faults
/// and zeroing for every byte copied, which was a tenth of a fast copy's CPU time.
#[derive(Debug, Default)]
struct BufferPool {
    free: std::sync::Mutex<Vec<Vec<u8>>>,
}

impl BufferPool {
    /// A buffer of exactly `len` bytes, of any content, back in the pool once dropped.
    fn take(self: &Arc<Self>, len: usize) -> Buffer {
        let reused = lock(&self.free).pop();
        let mut bytes = reused.unwrap_or_default();
        // Only a buffer that grows is written to; a reused one keeps its old bytes,
        // every one of which the read overwrites.
        bytes.resize(len, 0);
        Buffer {
            bytes,
            pool: Arc::clone(self),
        }
    }
}

/// One chunk's bytes, shared by the writer and the hashers, returned to its pool
/// when the last of them is done with it.
#[derive(Debug)]
struct Buffer {
    bytes: Vec<u8>,
    pool: Arc<BufferPool>,
}

impl std::ops::Deref for Buffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl AsRef<[u8]> for Buffer {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let bytes = std::mem::take(&mut self.bytes);
        lock(&self.pool.free).push(bytes);
    }
}

/// One copy: the first `size` bytes of a source, the way `plan` says, computing
/// `digests`. `bytes_read` counts bytes as they arrive, in any order and in pieces of
/// at most 1 MiB, so a watcher can tell a slow source from a dead one.
#[derive(Debug, Clone, Copy)]
pub struct CopyJob<'a> {
    /// Bytes to copy (fewer are copied if the source ends first).
    pub size: u64,
    /// How.
    pub plan: CopyPlan,
    /// Digests of the copied bytes to compute.
    pub digests: Digests,
    /// Bytes read so far.
    pub bytes_read: &'a AtomicU64,
}

/// Copies `job` from `src` into the file `dst`, calling `on_bytes` with each written
/// amount: inside the kernel when the source is a plain file on a local disk and the
/// system allows it, else as [`copy_file`] does.
pub fn copy_to_file(
    src: &dyn ReadAt,
    dst: &mut File,
    job: CopyJob<'_>,
    mut on_bytes: impl FnMut(u64),
) -> Result<Copied, CopyError> {
    #[cfg(target_os = "linux")]
    if let Some(file) = src.as_file().filter(|_| job.plan.local_source)
        && let Some(copied) = in_kernel::copy(file, dst, job, &mut on_bytes)?
    {
        return Ok(copied);
    }
    copy_file(src, dst, job, &mut on_bytes)
}

/// Copies `job` from `src` into `dst` in order, with `job.plan.streams` reads in
/// flight, calling `on_bytes` with each written amount.
pub fn copy_file(
    src: &dyn ReadAt,
    dst: &mut impl Write,
    job: CopyJob<'_>,
    mut on_bytes: impl FnMut(u64),
) -> Result<Copied, CopyError> {
    let CopyJob {
        size,
        plan,
        digests,
        bytes_read,
    } = job;
    let chunk = plan.chunk as u64;
    let chunks = size.div_ceil(chunk);
    let next = AtomicU64::new(0);
    let (tokens_tx, tokens_rx) = sync_channel::<()>(plan.window());
    for _ in 0..plan.window() {
        let _ = tokens_tx.send(());
    }
    let tokens_rx = std::sync::Mutex::new(tokens_rx);
    let (chunks_tx, chunks_rx) = sync_channel::<Chunk>(plan.window());
    let buffers = Arc::new(BufferPool::default());
    std::thread::scope(|scope| {
        for _ in 0..plan.streams.max(1) {
            let chunks_tx = chunks_tx.clone();
            let (next, tokens_rx) = (&next, &tokens_rx);
            let reader = Reader {
                src,
                size,
                chunk,
                chunks,
                next,
                bytes_read,
                buffers: Arc::clone(&buffers),
            };
            scope.spawn(move || reader.run(tokens_rx, chunks_tx));
        }
        drop(chunks_tx);
        // The hashers run on threads of their own so hashing does not hold up the
        // disk: blake3, sha256 and the writes one after another made a 1.2 GiB blob
        // copy from tmpfs take 3.8 s where cp + sync took 0.8 s.
        let hashers = Hashers::spawn(scope, digests, plan.chunk);
        // Handing over both channel ends means they close when the writer stops,
        // early or not, so every reader wakes up and the scope can end.
        let bytes = write_chunks(dst, chunks, chunks_rx, tokens_tx, &hashers, &mut on_bytes)?;
        hashers.finish(bytes)
    })
}

/// One of the concurrent readers of a copy.
struct Reader<'a> {
    src: &'a dyn ReadAt,
    size: u64,
    chunk: u64,
    chunks: u64,
    next: &'a AtomicU64,
    bytes_read: &'a AtomicU64,
    buffers: Arc<BufferPool>,
}

/// Largest single read: progress is visible at least this often.
const PIECE: usize = 1 << 20;

impl Reader<'_> {
    /// Claims the next chunk index (after taking a token) and reads it, until done.
    fn run(&self, tokens: &std::sync::Mutex<Receiver<()>>, out: SyncSender<Chunk>) {
        loop {
            let token = tokens
                .lock()
                .map_or(Err(std::sync::mpsc::RecvError), |rx| rx.recv());
            if token.is_err() {
                return; // the writer is gone
            }
            let index = self.next.fetch_add(1, Ordering::Relaxed);
            if index >= self.chunks {
                return;
            }
            let offset = index * self.chunk;
            let len = self.chunk.min(self.size - offset) as usize;
            if out.send((index, self.read_chunk(offset, len))).is_err() {
                return;
            }
        }
    }

    fn read_chunk(&self, offset: u64, len: usize) -> io::Result<Buffer> {
        let mut buf = self.buffers.take(len);
        let filled = read_into(self.src, offset, &mut buf.bytes, |n| {
            self.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
        })?;
        buf.bytes.truncate(filled);
        Ok(buf)
    }
}

/// Reads `len` bytes of `file` at `offset`, fewer only at end of file, in reads of at
/// most 1 MiB, calling `on_read` after each.
pub fn read_at_most(
    file: &(impl ReadAt + ?Sized),
    offset: u64,
    len: usize,
    on_read: impl FnMut(usize),
) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let filled = read_into(file, offset, &mut buf, on_read)?;
    buf.truncate(filled);
    Ok(buf)
}

/// Fills `buf` from `file` at `offset`, short only at end of file, in reads of at
/// most 1 MiB, calling `on_read` after each. Returns the bytes read.
fn read_into(
    file: &(impl ReadAt + ?Sized),
    offset: u64,
    buf: &mut [u8],
    mut on_read: impl FnMut(usize),
) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        let end = buf.len().min(filled + PIECE);
        match file.read_at(&mut buf[filled..end], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => {
                filled += n;
                on_read(n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// The writer's loop: takes chunks in order as they arrive, hands each to the hashers,
/// writes it, and returns its token. Returns the bytes written.
fn write_chunks(
    dst: &mut impl Write,
    chunks: u64,
    incoming: Receiver<Chunk>,
    tokens: SyncSender<()>,
    hashers: &Hashers<'_, Arc<Buffer>>,
    on_bytes: &mut impl FnMut(u64),
) -> Result<u64, CopyError> {
    let mut pending: BTreeMap<u64, Buffer> = BTreeMap::new();
    let mut written = 0u64;
    let mut bytes = 0u64;
    while written < chunks {
        let Some(buf) = pending.remove(&written) else {
            let (index, data) = incoming
                .recv()
                .map_err(|_| CopyError::Read(io::Error::other("all readers stopped")))?;
            pending.insert(index, data.map_err(CopyError::Read)?);
            continue;
        };
        let buf = Arc::new(buf);
        hashers.feed(&buf)?;
        dst.write_all(&buf).map_err(CopyError::Write)?;
        bytes += buf.len() as u64;
        on_bytes(buf.len() as u64);
        written += 1;
        // A source shorter than expected yields short or empty chunks; the caller
        // compares `bytes` with the size it asked for.
        let _ = tokens.send(());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Seek as _, Write as _};

    use sha2::{Digest as _, Sha256};

    use super::*;

    fn source(len: usize) -> (tempfile::NamedTempFile, Vec<u8>) {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let mut f = tempfile::NamedTempFile::new().expect("temp");
        f.write_all(&data).expect("write");
        (f, data)
    }

    const BOTH: Digests = Digests {
        blake3: true,
        sha256: true,
    };

    fn plan(streams: usize, chunk: usize, local_source: bool) -> CopyPlan {
        CopyPlan {
            streams,
            chunk,
            local_source,
        }
    }

    /// A job copying `size` bytes the way `plan` says, with both digests.
    fn job(size: u64, plan: CopyPlan, bytes_read: &AtomicU64) -> CopyJob<'_> {
        CopyJob {
            size,
            plan,
            digests: BOTH,
            bytes_read,
        }
    }

    fn assert_digests(copied: &Copied, data: &[u8], what: &str) {
        assert_eq!(copied.bytes, data.len() as u64, "{what}");
        let blake3 = blake3::hash(data).to_hex().to_string();
        assert_eq!(copied.blake3, Some(blake3), "{what}");
        let sha = format!("{:x}", Sha256::digest(data));
        assert_eq!(copied.sha256, Some(sha), "{what}");
    }

    #[test]
    fn a_chunk_size_left_open_is_chosen_by_the_source_kind_and_a_set_one_is_kept() {
        let open = CopyOptions::default();
        assert_eq!(open.for_source(true).chunk, LOCAL_CHUNK);
        assert!(open.for_source(true).local_source);
        assert_eq!(open.for_source(false).chunk, NETWORK_CHUNK);
        let set = CopyOptions {
            chunk: Some(12345),
            ..open
        };
        assert_eq!(set.for_source(true).chunk, 12345);
    }

    #[test]
    fn a_blob_is_hashed_by_its_name_alone_and_anything_else_by_blake3() {
        assert_eq!(
            Digests::for_copy(true),
            Digests {
                blake3: false,
                sha256: true
            }
        );
        assert_eq!(
            Digests::for_copy(false),
            Digests {
                blake3: true,
                sha256: false
            }
        );
    }

    #[test]
    fn a_file_is_hashed_with_the_digests_asked_for_and_opened_even_for_none() {
        let (src, data) = source(3 << 20);
        assert_digests(&digest_file(src.path(), BOTH).expect("hash"), &data, "file");
        let none = Digests {
            blake3: false,
            sha256: false,
        };
        let unread = digest_file(src.path(), none).expect("opened");
        assert_eq!(
            (unread.bytes, unread.blake3, unread.sha256),
            (0, None, None)
        );
        let missing = src.path().with_extension("missing");
        assert!(
            digest_file(&missing, none).is_err(),
            "a missing file is an error"
        );
    }

    #[test]
    fn copies_in_order_with_any_number_of_streams() {
        for (len, streams, chunk) in [
            (0, 3, 5),
            (1, 1, 5),
            (1000, 3, 7),
            (4096, 8, 4096),
            (10_001, 2, 100),
        ] {
            let (src, data) = source(len);
            let mut out = Vec::new();
            let mut reported = 0;
            let read = AtomicU64::new(0);
            let job = job(len as u64, plan(streams, chunk, false), &read);
            let copied = copy_file(src.as_file(), &mut out, job, |n| reported += n).expect("copy");
            let what = format!("len {len} streams {streams} chunk {chunk}");
            assert_eq!(out, data, "{what}");
            assert_eq!(reported, len as u64, "{what}");
            assert_digests(&copied, &data, &what);
        }
    }

    /// Copies `len` bytes of `src` to a new file with `copy_to_file`; returns what it
    /// said, what the file holds, and the bytes counted as read and as written.
    fn copy_to_new_file(
        src: &dyn ReadAt,
        len: u64,
        plan: CopyPlan,
    ) -> (Result<Copied, CopyError>, Vec<u8>, u64, u64) {
        let mut dst = tempfile::tempfile().expect("temp");
        let read = AtomicU64::new(0);
        let mut written = 0;
        let result = copy_to_file(src, &mut dst, job(len, plan, &read), |n| written += n);
        let mut held = Vec::new();
        dst.rewind().expect("rewind");
        dst.read_to_end(&mut held).expect("read back");
        (result, held, read.load(Ordering::Relaxed), written)
    }

    #[test]
    fn a_local_file_is_copied_whole_and_hashed_as_written() {
        for (len, chunk) in [
            (0, 5),
            (1, 5),
            (1000, 7),
            (3 << 20, LOCAL_CHUNK),
            (1_000_003, 4 << 20),
        ] {
            let (src, data) = source(len);
            let (copied, held, read, written) =
                copy_to_new_file(src.as_file(), len as u64, plan(4, chunk, true));
            let what = format!("len {len} chunk {chunk}");
            let copied = copied.expect("copy");
            assert_eq!(held, data, "{what}");
            assert_eq!((read, written), (len as u64, len as u64), "{what}");
            assert_digests(&copied, &data, &what);
        }
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_file_the_kernel_cannot_copy_is_copied_the_other_way() {
        // sendfile refuses a directory (EINVAL); read_at, tried next, says EISDIR.
        let dir = tempfile::tempdir().expect("dir");
        let src = std::fs::File::open(dir.path()).expect("open dir");
        let (copied, held, _, _) = copy_to_new_file(&src, 10, plan(1, 5, true));
        assert!(
            matches!(&copied, Err(CopyError::Read(e)) if e.raw_os_error() == Some(libc::EISDIR)),
            "{copied:?}"
        );
        assert!(held.is_empty());
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_destination_that_cannot_be_mapped_is_written_the_other_way() {
        // /dev/null takes sendfile's bytes but refuses a mapping (ENODEV).
        let (src, data) = source(5000);
        let mut dst = std::fs::File::options()
            .read(true)
            .write(true)
            .open("/dev/null")
            .expect("open /dev/null");
        let read = AtomicU64::new(0);
        let copied = copy_to_file(
            src.as_file(),
            &mut dst,
            job(5000, plan(2, 1000, true), &read),
            |_| {},
        );
        assert_digests(&copied.expect("copy"), &data, "/dev/null");
    }

    #[test]
    fn a_local_file_shorter_than_expected_copies_what_exists() {
        let (src, data) = source(1000);
        let (copied, held, read, _) = copy_to_new_file(src.as_file(), 5000, plan(1, 300, true));
        let copied = copied.expect("copy");
        assert_eq!(held, data);
        assert_eq!(read, 1000);
        assert_digests(&copied, &data, "short source");
    }

    /// A source that counts the reads that reach it, as a fault-injecting one must.
    #[derive(Debug)]
    struct Counted(std::fs::File, AtomicU64);

    impl ReadAt for Counted {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            self.1.fetch_add(1, Ordering::Relaxed);
            ReadAt::read_at(&self.0, buf, offset)
        }
    }

    #[test]
    fn a_source_that_hides_its_file_is_read_through_read_at_even_from_a_local_disk() {
        let (src, data) = source(10_000);
        let counted = Counted(src.reopen().expect("reopen"), AtomicU64::new(0));
        let (copied, held, _, _) = copy_to_new_file(&counted, 10_000, plan(2, 1000, true));
        assert_digests(&copied.expect("copy"), &data, "counted");
        assert_eq!(held, data);
        assert!(
            counted.1.load(Ordering::Relaxed) >= 10,
            "every chunk went through read_at"
        );
    }

    /// A destination that fails after `limit` bytes, like a disk filling up.
    struct FullAfter(usize);

    impl std::io::Write for FullAfter {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if buf.len() > self.0 {
                return Err(io::Error::from_raw_os_error(28));
            }
            self.0 -= buf.len();
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_failing_destination_stops_every_reader() {
        let (src, _) = source(100_000);
        let read = AtomicU64::new(0);
        let job = job(100_000, plan(4, 1000, false), &read);
        let result = copy_file(src.as_file(), &mut FullAfter(5000), job, |_| {});
        assert!(matches!(result, Err(CopyError::Write(e)) if e.raw_os_error() == Some(28)));
    }

    #[test]
    fn a_source_shorter_than_expected_copies_what_exists() {
        let (src, data) = source(1000);
        let mut out = Vec::new();
        let read = AtomicU64::new(0);
        let copied = copy_file(
            src.as_file(),
            &mut out,
            job(5000, plan(3, 300, false), &read),
            |_| {},
        )
        .expect("copy");
        assert_eq!(read.load(Ordering::Relaxed), 1000);
        assert_eq!(out, data);
        assert_digests(&copied, &data, "short source");
    }
}
