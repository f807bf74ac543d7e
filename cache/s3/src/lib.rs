//! An object store as a stagefs source: an S3 bucket (AWS S3, MinIO, Cloudflare R2,
//! Ceph RGW), or a prefix in one, named `s3://BUCKET[/PREFIX]`, mirrored read-only.
//!
//! - **Names.** A listing with the `/` delimiter maps common prefixes to
//!   directories and objects to regular files; there are no symlinks (an HF cache
//!   uploaded with `aws s3 sync` holds real files in its snapshots). A key that is
//!   both an object and a prefix is shown as the directory.
//! - **Versions.** A HEAD (or the listing) gives size, mtime and ETag. The ETag is
//!   what tells a replaced object, whose size and second-resolution mtime may not
//!   change, so it is folded into the two [`Stamp`](stagefs_source::Stamp) fields
//!   an object store has no use for: `ino` is a hash of the ETag, and `ctime_ns` the
//!   mtime plus that hash modulo a second. A copy staged from one ETag never
//!   serves another, and each ranged GET names the ETag seen at open (`If-Match`).
//! - **Reads.** [`file`]: parallel ranged GETs of 8 MiB parts, retried with backoff
//!   on 5xx and 503 SlowDown until the source timeout.
//! - **Threads.** The [`Source`] trait is synchronous and called on the bounded
//!   `SourcePool`'s threads; this crate keeps a small tokio runtime of its own for
//!   `object_store` and those threads wait on it (never a tokio worker's).
//! - **Failures.** [`errors`]: an endpoint that is down, refuses, times out or
//!   answers 5xx is "away" (its errno is one of `is_away_errno`'s), a missing key is
//!   NotFound; at mount time [`S3Source::probe`] says in one line when the
//!   credentials are refused or the bucket does not exist.
//! - **Writes.** None: the trait's write methods keep their default, EROFS.
//!
//! Credentials and endpoint come from the environment as AWS tools take them
//! (`AmazonS3Builder::from_env`: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`, `AWS_REGION`, `AWS_ENDPOINT_URL`, web identity, container
//! and instance credentials), plus `AWS_ENDPOINT_URL_S3`, which wins as it does for
//! the AWS CLI. An `http://` endpoint is allowed as it is. No secret is ever logged.

pub mod errors;
mod file;
pub mod url;

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use object_store::aws::AmazonS3Builder;
use object_store::{ClientOptions, ObjectMeta, ObjectStore, RetryConfig};
use stagefs_source::{EntryKind, Source, SourceError, SourceFile, SourceMeta};

pub use errors::ProbeError;
pub use file::{AHEAD, PART};
pub use url::{ObjectUrl, UrlError};

use errors::{Place, probe_error, to_io};
use file::ObjectFile;

type ObjectPath = object_store::path::Path;

/// The environment variables that name the endpoint, the most specific first.
const ENDPOINT_VARS: [&str; 3] = ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"];

/// A file's type and permission bits: read-only for everyone, as the mirror is.
/// (POSIX's values; libc's constants differ in width between Linux and macOS.)
const FILE_MODE: u32 = 0o100_444;
/// A directory's type and permission bits.
const DIR_MODE: u32 = 0o040_555;

/// Worker threads of the runtime the requests run on: they only drive sockets.
const RUNTIME_THREADS: usize = 2;

/// The endpoint the environment names, if any.
pub fn endpoint_from_env() -> Option<String> {
    ENDPOINT_VARS
        .iter()
        .find_map(|var| std::env::var(var).ok().filter(|v| !v.is_empty()))
}

/// The runtime the requests run on, shut down without waiting when dropped: a
/// source may be dropped on a tokio worker, where waiting is not allowed.
struct Runtime(Option<tokio::runtime::Runtime>);

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

impl std::ops::Deref for Runtime {
    type Target = tokio::runtime::Runtime;

    fn deref(&self) -> &tokio::runtime::Runtime {
        self.0.as_ref().expect("runtime present until dropped")
    }
}

/// What the source and its open files share: the store, the runtime its requests
/// run on, and how long a request may take.
pub(crate) struct Client {
    store: Arc<dyn ObjectStore>,
    runtime: Runtime,
    timeout: Duration,
    uid: u32,
    gid: u32,
}

impl Client {
    /// Runs `work` on the client's runtime and waits for it on this thread (one of
    /// the source pool's).
    fn wait<T: Send + 'static>(
        &self,
        work: impl Future<Output = T> + Send + 'static,
    ) -> io::Result<T> {
        futures::executor::block_on(self.runtime.spawn(work))
            .map_err(|e| io::Error::other(e.to_string()))
    }

    /// HEAD of `path`: its metadata and ETag.
    fn head(&self, path: &ObjectPath) -> io::Result<(SourceMeta, Option<String>)> {
        let (store, path) = (Arc::clone(&self.store), path.clone());
        let object = self.wait(async move { store.head(&path).await })?;
        let object = object.map_err(|e| to_io(&e))?;
        Ok((self.file_meta(&object), object.e_tag))
    }

    /// The first object under `prefix` (recursively), if any: one listing page.
    fn first_under(
        &self,
        prefix: Option<ObjectPath>,
    ) -> Result<Option<ObjectMeta>, object_store::Error> {
        let store = Arc::clone(&self.store);
        let first = self.wait(async move { store.list(prefix.as_ref()).next().await.transpose() });
        first.map_err(|e| object_store::Error::Generic {
            store: "S3",
            source: Box::new(e),
        })?
    }

    fn file_meta(&self, object: &ObjectMeta) -> SourceMeta {
        let mtime_ns = object.last_modified.timestamp_nanos_opt().unwrap_or(0);
        let version = object.e_tag.as_deref().map_or(0, etag_hash);
        SourceMeta {
            kind: EntryKind::File,
            size: object.size,
            mtime_ns,
            ctime_ns: mtime_ns + (version % 1_000_000_000) as i64,
            atime_ns: mtime_ns,
            mode: FILE_MODE,
            uid: self.uid,
            gid: self.gid,
            nlink: 1,
            blocks: object.size.div_ceil(512),
            blksize: file::PART,
            rdev: 0,
            ino: version,
        }
    }

    fn dir_meta(&self) -> SourceMeta {
        SourceMeta {
            kind: EntryKind::Dir,
            size: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            atime_ns: 0,
            mode: DIR_MODE,
            uid: self.uid,
            gid: self.gid,
            nlink: 2,
            blocks: 0,
            blksize: 4096,
            rdev: 0,
            ino: 0,
        }
    }
}

/// A 64-bit hash of an ETag, never 0 (which a stamp reads as "no inode"). The
/// quotes are dropped: a HEAD and a listing quote the same ETag differently on
/// some servers.
fn etag_hash(etag: &str) -> u64 {
    let hash = blake3::hash(etag.trim_matches('"').as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash.as_bytes()[..8]);
    u64::from_le_bytes(first).max(1)
}

/// An S3 bucket (or a prefix in it) as a source; see the crate docs.
pub struct S3Source {
    url: ObjectUrl,
    /// The URL as a path, which is what [`Source::root`] shows.
    root: PathBuf,
    endpoint: String,
    client: Arc<Client>,
}

impl std::fmt::Debug for S3Source {
    // Never the client: its configuration holds the credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Source")
            .field("url", &self.url.to_string())
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl S3Source {
    /// A client for `url` configured from the environment, whose requests give up
    /// after `timeout` (retries included). Asks nothing of the server yet.
    pub fn new(url: ObjectUrl, timeout: Duration) -> Result<S3Source, ProbeError> {
        let setup = |why: String| ProbeError::Setup {
            url: url.to_string(),
            why,
        };
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(&url.bucket);
        let endpoint = endpoint_from_env();
        if let Some(endpoint) = &endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        // The client options replace any the environment set: an `http://` endpoint
        // (MinIO on a NAS) is allowed here, with no flag of its own.
        let plain_http = endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://"));
        let client_options = ClientOptions::new()
            .with_allow_http(plain_http)
            .with_connect_timeout(timeout.min(Duration::from_secs(5)))
            .with_timeout(timeout);
        let retry = RetryConfig {
            max_retries: 10,
            // The part reader asks again on its own until `timeout`; the client's
            // own retries must leave it room for one more try.
            retry_timeout: timeout / 3,
            ..RetryConfig::default()
        };
        let store = builder
            .with_client_options(client_options)
            .with_retry(retry)
            .build()
            .map_err(|e| setup(errors::one_line(&e)))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_THREADS)
            .thread_name("stagefs-s3")
            .enable_all()
            .build()
            .map_err(|e| setup(e.to_string()))?;
        // SAFETY: geteuid and getegid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Ok(S3Source {
            root: PathBuf::from(url.to_string()),
            endpoint: endpoint.unwrap_or_else(|| "AWS S3".into()),
            url,
            client: Arc::new(Client {
                store: Arc::new(store),
                runtime: Runtime(Some(runtime)),
                timeout,
                uid,
                gid,
            }),
        })
    }

    /// The URL it mirrors.
    pub fn url(&self) -> &ObjectUrl {
        &self.url
    }

    /// The endpoint it asks, as the user named it ("AWS S3" for AWS's own).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Checks that the endpoint answers, takes the credentials, holds the bucket and,
    /// for a prefix, some object under it: one listing request.
    pub fn probe(&self) -> Result<(), ProbeError> {
        let url = self.url.to_string();
        let place = Place {
            url: &url,
            bucket: &self.url.bucket,
            endpoint: &self.endpoint,
        };
        let first = self.client.first_under(self.prefix_path(Path::new("")));
        match first {
            Ok(Some(_)) => Ok(()),
            Ok(None) if self.url.prefix.is_empty() => Ok(()),
            Ok(None) => Err(ProbeError::EmptyPrefix { url }),
            Err(e) => Err(probe_error(&place, &e)),
        }
    }

    /// The largest of the first `scanned` objects under the prefix, as a path
    /// relative to it, and its size: what `stagefs doctor` measures the rate with.
    pub fn largest_object(&self, scanned: usize) -> Result<Option<(PathBuf, u64)>, ProbeError> {
        let (store, prefix) = (
            Arc::clone(&self.client.store),
            self.prefix_path(Path::new("")),
        );
        let listed = self.client.wait(async move {
            let objects = store.list(prefix.as_ref()).take(scanned);
            objects.collect::<Vec<_>>().await
        });
        let url = self.url.to_string();
        let place = Place {
            url: &url,
            bucket: &self.url.bucket,
            endpoint: &self.endpoint,
        };
        let listed = listed.map_err(|e| ProbeError::Other {
            url: url.clone(),
            why: e.to_string(),
        })?;
        let mut largest: Option<ObjectMeta> = None;
        for object in listed {
            let object = object.map_err(|e| probe_error(&place, &e))?;
            if largest.as_ref().is_none_or(|l| object.size > l.size) {
                largest = Some(object);
            }
        }
        let prefix = self.url.prefix.as_str();
        Ok(largest.map(|object| {
            let key = object.location.as_ref();
            let rel = key
                .strip_prefix(prefix)
                .unwrap_or(key)
                .trim_start_matches('/');
            (PathBuf::from(rel), object.size)
        }))
    }

    fn object_path(&self, rel: &Path) -> Result<ObjectPath, SourceError> {
        ObjectPath::parse(self.url.key(rel)).map_err(|e| {
            SourceError::io(
                rel,
                io::Error::new(io::ErrorKind::InvalidInput, e.to_string()),
            )
        })
    }

    /// The prefix of directory `rel`; None for the root of a whole bucket.
    fn prefix_path(&self, rel: &Path) -> Option<ObjectPath> {
        let key = self.url.key(rel);
        (!key.is_empty()).then(|| ObjectPath::parse(&key).unwrap_or_else(|_| ObjectPath::from(key)))
    }

    /// Whether `rel` is a directory: some object lies under it.
    fn is_dir(&self, rel: &Path) -> Result<bool, SourceError> {
        let first = self.client.first_under(self.prefix_path(rel));
        Ok(first
            .map_err(|e| SourceError::io(rel, to_io(&e)))?
            .is_some())
    }
}

impl Source for S3Source {
    fn root(&self) -> &Path {
        &self.root
    }

    fn stat(&self, rel: &Path) -> Result<SourceMeta, SourceError> {
        if rel.as_os_str().is_empty() {
            return Ok(self.client.dir_meta());
        }
        match self.client.head(&self.object_path(rel)?) {
            Ok((meta, _)) => Ok(meta),
            Err(e) if e.kind() == io::ErrorKind::NotFound => match self.is_dir(rel)? {
                true => Ok(self.client.dir_meta()),
                false => Err(SourceError::io(rel, e)),
            },
            Err(e) => Err(SourceError::io(rel, e)),
        }
    }

    fn read_dir(&self, rel: &Path) -> Result<Vec<(OsString, SourceMeta)>, SourceError> {
        let (store, prefix) = (Arc::clone(&self.client.store), self.prefix_path(rel));
        let listed = self
            .client
            .wait(async move { store.list_with_delimiter(prefix.as_ref()).await })
            .map_err(|e| SourceError::io(rel, e))?
            .map_err(|e| SourceError::io(rel, to_io(&e)))?;
        let mut entries: Vec<(OsString, SourceMeta)> = Vec::new();
        let dirs: std::collections::HashSet<&str> = listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename())
            .collect();
        for dir in &dirs {
            entries.push((OsString::from(*dir), self.client.dir_meta()));
        }
        for object in &listed.objects {
            // A key both an object and a prefix shows as the directory; an object
            // named like the directory itself (a "folder marker") is not an entry.
            match object.location.filename() {
                Some(name)
                    if !dirs.contains(name)
                        && self.prefix_path(rel).as_ref() != Some(&object.location) =>
                {
                    entries.push((OsString::from(name), self.client.file_meta(object)));
                }
                _ => {}
            }
        }
        if entries.is_empty() && !rel.as_os_str().is_empty() {
            // S3 has no empty directories: nothing under the prefix is no directory.
            return Err(SourceError::io(
                rel,
                io::Error::from(io::ErrorKind::NotFound),
            ));
        }
        Ok(entries)
    }

    fn read_link(&self, rel: &Path) -> Result<PathBuf, SourceError> {
        // An object store has no symlinks.
        Err(SourceError::io(
            rel,
            io::Error::from_raw_os_error(libc::EINVAL),
        ))
    }

    fn open(&self, rel: &Path) -> Result<Box<dyn SourceFile>, SourceError> {
        let path = self.object_path(rel)?;
        let (meta, etag) = self
            .client
            .head(&path)
            .map_err(|e| SourceError::io(rel, e))?;
        let file = ObjectFile::new(
            Arc::clone(&self.client),
            path,
            rel.to_path_buf(),
            meta,
            etag,
        );
        Ok(Box::new(file))
    }

    /// The probe of whether the store answers: one listing page of the root. An
    /// object store has no size, so the figures are zero.
    fn statfs(&self) -> io::Result<libc::statvfs> {
        self.client
            .first_under(self.prefix_path(Path::new("")))
            .map_err(|e| to_io(&e))?;
        // SAFETY: statvfs is a plain C struct of integers, for which all zeroes is
        // a valid value.
        let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
        stats.f_bsize = 4096;
        stats.f_frsize = 4096;
        stats.f_namemax = 1024;
        Ok(stats)
    }

    // Writes: none. The trait's defaults answer every change with EROFS ("the source
    // is read-only"); writing would take multipart uploads staged locally until close.
}
