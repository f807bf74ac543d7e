//! Copying one file with several reads in flight, hashing in order as bytes arrive.
//!
//! A network filesystem answers one read at a time at its round-trip latency; keeping
//! `streams` reads outstanding lets it run at the link's bandwidth. Memory stays
//! bounded whatever the file size: at most `window` chunks exist at once, because a
//! reader needs a token to start a chunk and the writer returns the token only once
//! that chunk is written.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use sha2::{Digest, Sha256};

use crate::source::ReadAt;

/// How a copy is spread over concurrent reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyOptions {
    /// Reads kept in flight.
    pub streams: usize,
    /// Bytes per read; None: by the source's kind ([`CopyOptions::for_source`]).
    pub chunk: Option<usize>,
}

/// Chunk from a network filesystem: four 2 MiB reads in flight fill a 1 Gbit/s link
/// over sshfs (docs/BENCHMARKS.md) in 12 MiB of buffers per copy.
pub const NETWORK_CHUNK: usize = 2 << 20;

/// Chunk from a local disk: small enough that a chunk is still in the CPU's cache
/// when the writer and both hashers read it. From a tmpfs, 2 MiB chunks spent about
/// twice the system time of 256 KiB ones copying into the page cache.
pub const LOCAL_CHUNK: usize = 256 << 10;

impl Default for CopyOptions {
    /// [`crate::defaults::COPY_STREAMS`] reads in flight, of a size chosen by the
    /// source's kind.
    fn default() -> Self {
        CopyOptions {
            streams: crate::defaults::COPY_STREAMS,
            chunk: None,
        }
    }
}

impl CopyOptions {
    /// Most chunks held in memory at once.
    pub fn window(&self) -> usize {
        self.streams.max(1) + 2
    }

    /// These options with the chunk size settled for a source on a local disk or not.
    pub fn for_source(self, on_local_disk: bool) -> CopyOptions {
        let by_kind = if on_local_disk {
            LOCAL_CHUNK
        } else {
            NETWORK_CHUNK
        };
        CopyOptions {
            chunk: Some(self.chunk.unwrap_or(by_kind)),
            ..self
        }
    }

    fn chunk_bytes(&self) -> usize {
        self.chunk.unwrap_or(NETWORK_CHUNK).max(1)
    }
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
    /// blake3 of those bytes, hex.
    pub blake3: String,
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
        let reused = self
            .free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop();
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

impl Drop for Buffer {
    fn drop(&mut self) {
        let bytes = std::mem::take(&mut self.bytes);
        self.pool
            .free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(bytes);
    }
}

/// Copies the first `size` bytes of `src` into `dst` in order, calling `on_bytes`
/// with each written amount. `bytes_read` counts bytes as they arrive, in any order
/// and in pieces of at most 1 MiB, so a watcher can tell a slow source from a dead one.
pub fn copy_file(
    src: &dyn ReadAt,
    dst: &mut impl Write,
    size: u64,
    options: CopyOptions,
    bytes_read: &AtomicU64,
    with_sha256: bool,
    mut on_bytes: impl FnMut(u64),
) -> Result<Copied, CopyError> {
    let chunk = options.chunk_bytes() as u64;
    let chunks = size.div_ceil(chunk);
    let next = AtomicU64::new(0);
    let (tokens_tx, tokens_rx) = sync_channel::<()>(options.window());
    for _ in 0..options.window() {
        let _ = tokens_tx.send(());
    }
    let tokens_rx = std::sync::Mutex::new(tokens_rx);
    let (chunks_tx, chunks_rx) = sync_channel::<Chunk>(options.window());
    let buffers = Arc::new(BufferPool::default());
    std::thread::scope(|scope| {
        for _ in 0..options.streams.max(1) {
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
        let sha256 = with_sha256.then(Sha256::new);
        // Handing over both channel ends means they close when the writer stops,
        // early or not, so every reader wakes up and the scope can end.
        write_in_order(dst, chunks, chunks_rx, tokens_tx, sha256, &mut on_bytes)
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

/// Writes chunks in order as they arrive. The two hashes run on threads of their own,
/// fed the same buffers, so hashing does not hold up the disk: sha256 alone runs at
/// about the speed of a fast SSD (1.8 GB/s with SHA-NI), and blake3, sha256 and the
/// writes one after another made a 1.2 GiB blob copy from tmpfs take 3.8 s where cp +
/// sync took 0.8 s. The bounded queues keep memory bounded: a hasher that falls
/// behind holds up the writer.
fn write_in_order(
    dst: &mut impl Write,
    chunks: u64,
    incoming: Receiver<Chunk>,
    tokens: SyncSender<()>,
    sha256: Option<Sha256>,
    on_bytes: &mut impl FnMut(u64),
) -> Result<Copied, CopyError> {
    std::thread::scope(|scope| {
        let (blake3_tx, blake3_rx) = sync_channel::<Arc<Buffer>>(HASH_QUEUE);
        let blake3 = scope.spawn(move || {
            let mut hasher = blake3::Hasher::new();
            for buf in blake3_rx {
                hasher.update(&buf);
            }
            hasher.finalize().to_hex().to_string()
        });
        let sha256 = sha256.map(|mut hasher| {
            let (tx, rx) = sync_channel::<Arc<Buffer>>(HASH_QUEUE);
            let done = scope.spawn(move || {
                for buf in rx {
                    hasher.update(&buf[..]);
                }
                format!("{:x}", hasher.finalize())
            });
            (tx, done)
        });
        let hashers: Vec<&SyncSender<Arc<Buffer>>> = std::iter::once(&blake3_tx)
            .chain(sha256.as_ref().map(|(tx, _)| tx))
            .collect();
        let written = write_chunks(dst, chunks, incoming, &tokens, &hashers, on_bytes);
        // Closing the queues ends the hashers, whatever happened to the writes.
        drop(hashers);
        drop(blake3_tx);
        let sha256 = sha256.map(|(tx, done)| {
            drop(tx);
            done.join()
        });
        let bytes = written?;
        let hashed = |joined: std::thread::Result<String>| {
            joined.map_err(|_| CopyError::Write(io::Error::other("a hashing thread failed")))
        };
        Ok(Copied {
            bytes,
            blake3: hashed(blake3.join())?,
            sha256: sha256.map(hashed).transpose()?,
        })
    })
}

/// Chunks queued for each hasher: enough to keep it busy while the writer writes.
const HASH_QUEUE: usize = 2;

/// The writer's loop: takes chunks in order, hands each to the hashers, writes it,
/// and returns its token. Returns the bytes written.
fn write_chunks(
    dst: &mut impl Write,
    chunks: u64,
    incoming: Receiver<Chunk>,
    tokens: &SyncSender<()>,
    hashers: &[&SyncSender<Arc<Buffer>>],
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
        for hasher in hashers {
            hasher
                .send(Arc::clone(&buf))
                .map_err(|_| CopyError::Write(io::Error::other("a hashing thread stopped")))?;
        }
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
    use std::io::Write as _;

    use super::*;

    fn source(len: usize) -> (tempfile::NamedTempFile, Vec<u8>) {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let mut f = tempfile::NamedTempFile::new().expect("temp");
        f.write_all(&data).expect("write");
        (f, data)
    }

    #[test]
    fn a_chunk_size_left_open_is_chosen_by_the_source_kind_and_a_set_one_is_kept() {
        let open = CopyOptions::default();
        assert_eq!(open.for_source(true).chunk, Some(LOCAL_CHUNK));
        assert_eq!(open.for_source(false).chunk, Some(NETWORK_CHUNK));
        let set = CopyOptions {
            chunk: Some(12345),
            ..open
        };
        assert_eq!(set.for_source(true).chunk, Some(12345));
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
            let copied = copy_file(
                src.as_file(),
                &mut out,
                len as u64,
                CopyOptions {
                    streams,
                    chunk: Some(chunk),
                },
                &AtomicU64::new(0),
                true,
                |n| reported += n,
            )
            .map_err(|e| format!("{e:?}"))
            .expect("copy");
            assert_eq!(out, data, "len {len} streams {streams} chunk {chunk}");
            assert_eq!(copied.bytes, len as u64);
            assert_eq!(reported, len as u64);
            assert_eq!(copied.blake3, blake3::hash(&data).to_hex().to_string());
            let sha = format!("{:x}", Sha256::digest(&data));
            assert_eq!(copied.sha256, Some(sha));
        }
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
        let options = CopyOptions {
            streams: 4,
            chunk: Some(1000),
        };
        let result = copy_file(
            src.as_file(),
            &mut FullAfter(5000),
            100_000,
            options,
            &read,
            false,
            |_| {},
        );
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
            5000,
            CopyOptions {
                streams: 3,
                chunk: Some(300),
            },
            &read,
            false,
            |_| {},
        )
        .map_err(|e| format!("{e:?}"))
        .expect("copy");
        assert_eq!(copied.bytes, 1000);
        assert_eq!(read.load(Ordering::Relaxed), 1000);
        assert_eq!(out, data);
    }
}
