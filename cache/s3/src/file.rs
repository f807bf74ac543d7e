//! One object open for reading: positioned reads served from parts of the object
//! fetched by ranged GETs, several in flight ahead of the reader.
//!
//! An object store answers one GET at its round-trip latency and one connection's
//! throughput; the bandwidth is reached only with several requests at once (boto3's
//! transfer manager keeps ten 8 MiB parts in flight). The copy engine reads a file
//! in order, so the first read of a part asks for the next [`AHEAD`] parts too, and a
//! part is dropped once every byte of it has been read: a whole-file copy holds at
//! most [`MAX_HELD`] parts, whatever the file's size. Every GET names the ETag seen
//! at open (`If-Match`), so a replaced object fails the read instead of mixing two
//! versions' bytes.

use std::collections::BTreeMap;
use std::io;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};
use object_store::{GetOptions, ObjectStore};
use stagefs_source::{ReadAt, SourceFile, SourceMeta};

use crate::errors::{copied, retryable, to_io};
use crate::{Client, ObjectPath};

/// Bytes per ranged GET: boto3's and the AWS CLI's part size, big enough that a
/// request's latency is small beside its transfer.
pub const PART: u64 = 8 << 20;

/// Parts asked for ahead of the one being read.
pub const AHEAD: u64 = 8;

/// Most parts held at once per open object (in flight or read in part): 80 MiB.
pub(crate) const MAX_HELD: usize = AHEAD as usize + 2;

/// First wait before asking again for a part that failed; doubled each time.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between two tries.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

type PartResult = Result<Bytes, Arc<io::Error>>;

/// One part: its bytes once fetched, and how many of them were read.
struct Part {
    bytes: Shared<BoxFuture<'static, PartResult>>,
    /// Its GET, cancelled if the file is closed before it arrived.
    fetch: tokio::task::AbortHandle,
    len: u64,
    read: u64,
}

#[derive(Default)]
struct Parts {
    held: BTreeMap<u64, Part>,
    /// The first part not yet asked for ahead of a reader.
    ahead_from: u64,
}

/// An object open for reading; see the module docs.
pub(crate) struct ObjectFile {
    client: Arc<Client>,
    path: ObjectPath,
    rel: PathBuf,
    meta: SourceMeta,
    etag: Option<String>,
    parts: Mutex<Parts>,
}

impl std::fmt::Debug for ObjectFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectFile")
            .field("key", &self.path.as_ref())
            .field("size", &self.meta.size)
            .finish_non_exhaustive()
    }
}

impl ObjectFile {
    pub(crate) fn new(
        client: Arc<Client>,
        path: ObjectPath,
        rel: PathBuf,
        meta: SourceMeta,
        etag: Option<String>,
    ) -> ObjectFile {
        ObjectFile {
            client,
            path,
            rel,
            meta,
            etag,
            parts: Mutex::default(),
        }
    }

    fn parts_count(&self) -> u64 {
        self.meta.size.div_ceil(PART)
    }

    fn range(&self, index: u64) -> Range<u64> {
        let start = index * PART;
        start..(start + PART).min(self.meta.size)
    }

    /// Starts fetching part `index` on the client's runtime.
    fn request(&self, index: u64) -> Part {
        let range = self.range(index);
        let len = range.end - range.start;
        let fetch = fetch_part(
            Arc::clone(&self.client),
            self.path.clone(),
            range,
            self.etag.clone(),
        );
        let task = self.client.runtime.spawn(fetch);
        let fetch = task.abort_handle();
        let bytes = async move {
            task.await
                .unwrap_or_else(|e| Err(Arc::new(io::Error::other(e.to_string()))))
        }
        .boxed()
        .shared();
        Part {
            bytes,
            fetch,
            len,
            read: 0,
        }
    }

    /// Part `index`, asked for now if it is not held, with the parts after it.
    fn part(&self, index: u64) -> Shared<BoxFuture<'static, PartResult>> {
        let mut parts = self.parts.lock().unwrap_or_else(PoisonError::into_inner);
        if let std::collections::btree_map::Entry::Vacant(slot) = parts.held.entry(index) {
            slot.insert(self.request(index));
        }
        let end = (index + 1 + AHEAD).min(self.parts_count());
        let mut next = parts.ahead_from.max(index + 1);
        while next < end && parts.held.len() < MAX_HELD {
            if let std::collections::btree_map::Entry::Vacant(slot) = parts.held.entry(next) {
                slot.insert(self.request(next));
            }
            next += 1;
        }
        parts.ahead_from = parts.ahead_from.max(next);
        // Reads out of order (a reader that seeks back) can leave parts never read
        // whole: the oldest go first.
        while parts.held.len() > MAX_HELD {
            let oldest = parts.held.keys().copied().find(|&k| k != index);
            match oldest {
                Some(k) => parts.held.remove(&k),
                None => break,
            };
        }
        parts.held[&index].bytes.clone()
    }

    /// Counts `n` bytes of part `index` as read; a part read whole is dropped.
    fn mark_read(&self, index: u64, n: usize) {
        let mut parts = self.parts.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(part) = parts.held.get_mut(&index) {
            part.read += n as u64;
            if part.read >= part.len {
                parts.held.remove(&index);
            }
        }
    }

    /// Forgets part `index` after it failed, so the next read asks again.
    fn forget(&self, index: u64) {
        let mut parts = self.parts.lock().unwrap_or_else(PoisonError::into_inner);
        parts.held.remove(&index);
    }
}

/// Fetches `range` of the object, asking again with backoff while the store is
/// away or failing (5xx, 503 SlowDown), until the client's timeout has passed.
async fn fetch_part(
    client: Arc<Client>,
    path: ObjectPath,
    range: Range<u64>,
    etag: Option<String>,
) -> PartResult {
    let deadline = Instant::now() + client.timeout;
    let mut backoff = FIRST_BACKOFF;
    loop {
        let options = GetOptions {
            range: Some(range.clone().into()),
            if_match: etag.clone(),
            ..GetOptions::default()
        };
        let attempt = async {
            let got = client.store.get_opts(&path, options).await?;
            got.bytes().await
        };
        let failed = match attempt.await {
            Ok(bytes) if bytes.len() as u64 == range.end - range.start => return Ok(bytes),
            Ok(bytes) => io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "the store sent {} bytes of a {}-byte range",
                    bytes.len(),
                    range.end - range.start
                ),
            ),
            Err(e) => to_io(&e),
        };
        if !retryable(&failed) || Instant::now() + backoff >= deadline {
            return Err(Arc::new(failed));
        }
        tracing::debug!(key = %path, start = range.start, error = %failed, "asking again for a part of an object");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

impl Drop for ObjectFile {
    /// A file closed early (a copy that failed, a small read) leaves no GET running
    /// to take the link from the next copy. (A part dropped while the file is open
    /// keeps its GET: another reader may be waiting for it.)
    fn drop(&mut self) {
        let parts = self.parts.get_mut().unwrap_or_else(PoisonError::into_inner);
        for part in parts.held.values() {
            part.fetch.abort();
        }
    }
}

impl ReadAt for ObjectFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut filled = 0usize;
        while filled < buf.len() {
            let at = offset + filled as u64;
            if at >= self.meta.size {
                break;
            }
            let index = at / PART;
            let bytes = match futures::executor::block_on(self.part(index)) {
                Ok(bytes) => bytes,
                Err(e) => {
                    self.forget(index);
                    tracing::debug!(path = %stagefs_source::logged(&self.rel), error = %e, "reading an object failed");
                    return Err(copied(&e));
                }
            };
            let start = (at - index * PART) as usize;
            let n = (buf.len() - filled).min(bytes.len() - start);
            buf[filled..filled + n].copy_from_slice(&bytes[start..start + n]);
            self.mark_read(index, n);
            filled += n;
        }
        Ok(filled)
    }
}

impl SourceFile for ObjectFile {
    /// The object as the store describes it now (a new HEAD), so a copy can tell a
    /// replacement that happened while it ran.
    fn meta(&self) -> io::Result<SourceMeta> {
        self.client.head(&self.path).map(|(meta, _)| meta)
    }
}
