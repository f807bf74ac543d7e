//! Where a mount's source lies: a directory (a NAS share, a USB disk, a hub cache)
//! or an object store (`s3://BUCKET[/PREFIX]`). A source is given, recorded and
//! shown as a path (an `s3://` URL is kept verbatim in one); this is the one place
//! that tells the two apart and opens either as a [`SourceTree`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use stagefs_s3::{ObjectUrl, S3Source};
use stagefs_source::SourceTree;

use crate::MountError;

/// A source as a user names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourcePlace {
    /// A directory on a mounted filesystem.
    Dir(PathBuf),
    /// A bucket, or a prefix in one, of an S3-compatible object store.
    Bucket(ObjectUrl),
}

impl SourcePlace {
    /// The place `source` names: an `s3://` URL, or else a directory.
    pub fn of(source: &Path) -> Result<SourcePlace, MountError> {
        match source.to_str().and_then(ObjectUrl::parse) {
            Some(url) => Ok(SourcePlace::Bucket(url?)),
            None => Ok(SourcePlace::Dir(source.to_path_buf())),
        }
    }

    /// Whether `source` names an object store (so no filesystem question applies).
    pub fn is_bucket(source: &Path) -> bool {
        ObjectUrl::is_url_path(source)
    }

    /// Opens it, asking nothing of an object store yet; its requests give up after
    /// `timeout`.
    pub fn open(&self, timeout: Duration) -> Result<SourceTree, MountError> {
        match self {
            SourcePlace::Dir(dir) => SourceTree::new(dir).map_err(MountError::Source),
            SourcePlace::Bucket(url) => {
                let source = S3Source::new(url.clone(), timeout)?;
                Ok(SourceTree::from_backend(Arc::new(source)))
            }
        }
    }

    /// Opens it and, for an object store, checks that the endpoint answers, takes
    /// the credentials and holds the bucket (and something under the prefix).
    pub fn open_checked(&self, timeout: Duration) -> Result<SourceTree, MountError> {
        match self {
            SourcePlace::Dir(_) => self.open(timeout),
            SourcePlace::Bucket(url) => {
                let source = S3Source::new(url.clone(), timeout)?;
                source.probe()?;
                Ok(SourceTree::from_backend(Arc::new(source)))
            }
        }
    }
}

/// Opens the source named `source` (see [`SourcePlace::open`]).
pub fn open_source(source: &Path, timeout: Duration) -> Result<SourceTree, MountError> {
    SourcePlace::of(source)?.open(timeout)
}

/// [`open_source`] with the source layer's error, for the callers that report one
/// (a prefetch or status on a cache that no mount serves), and the source
/// timeout's default.
pub fn open_recorded_source(source: &Path) -> Result<SourceTree, stagefs_source::SourceError> {
    open_source(source, stagefs_stage::defaults::SOURCE_TIMEOUT).map_err(|e| match e {
        MountError::Source(e) => e,
        other => stagefs_source::SourceError::io(source, std::io::Error::other(other.to_string())),
    })
}
