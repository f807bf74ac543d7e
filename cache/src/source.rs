//! The source tree: the slow directory (NAS share, USB disk) that stagefs mirrors.
//!
//! All paths handed in are relative to the source root and may only contain normal
//! components, so no request can reach outside the root. Symlinks are never followed:
//! the mirror returns them verbatim.

use std::ffi::OsString;
use std::fs::{self, File, Metadata};
use std::path::{Component, Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

use crate::error::SourceError;

/// What identifies one version of a source file: if either field changes, the file is
/// considered new and any staged copy of the old version is stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Stamp {
    /// Size in bytes.
    pub size: u64,
    /// Modification time in nanoseconds since the Unix epoch (negative before it).
    pub mtime_ns: i64,
}

impl Stamp {
    /// The stamp of a file as described by its metadata.
    pub fn of(meta: &Metadata) -> Stamp {
        let mtime_ns = match meta.modified() {
            Ok(t) => match t.duration_since(UNIX_EPOCH) {
                Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
                Err(e) => -i64::try_from(e.duration().as_nanos()).unwrap_or(i64::MAX),
            },
            // Platforms without mtime still get a usable (size-only) stamp.
            Err(_) => 0,
        };
        Stamp {
            size: meta.len(),
            mtime_ns,
        }
    }
}

/// A read-only view of the source directory.
#[derive(Debug, Clone)]
pub struct SourceTree {
    root: PathBuf,
}

impl SourceTree {
    /// Opens the source rooted at `root`, which must be an existing directory.
    pub fn new(root: impl Into<PathBuf>) -> Result<Self, SourceError> {
        let root = root.into();
        let meta = fs::metadata(&root).map_err(|e| SourceError::io(&root, e))?;
        if !meta.is_dir() {
            return Err(SourceError::io(
                &root,
                std::io::Error::from_raw_os_error(libc::ENOTDIR),
            ));
        }
        Ok(SourceTree { root })
    }

    /// The absolute root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Absolute path of `rel`, refusing anything but plain relative components.
    pub fn resolve(&self, rel: &Path) -> Result<PathBuf, SourceError> {
        if rel
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        {
            Ok(self.root.join(rel))
        } else {
            Err(SourceError::OutsideRoot {
                path: rel.to_path_buf(),
            })
        }
    }

    /// Metadata of `rel` itself (symlinks are not followed).
    pub fn stat(&self, rel: &Path) -> Result<Metadata, SourceError> {
        let abs = self.resolve(rel)?;
        fs::symlink_metadata(abs).map_err(|e| SourceError::io(rel, e))
    }

    /// The entries of directory `rel` with their own metadata, sorted by name so that
    /// listings are stable across calls.
    pub fn read_dir(&self, rel: &Path) -> Result<Vec<(OsString, Metadata)>, SourceError> {
        let abs = self.resolve(rel)?;
        let mut entries = Vec::new();
        for entry in fs::read_dir(abs).map_err(|e| SourceError::io(rel, e))? {
            let entry = entry.map_err(|e| SourceError::io(rel, e))?;
            match entry.metadata() {
                Ok(meta) => entries.push((entry.file_name(), meta)),
                // Vanished between listing and stat: it is simply not there any more.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(SourceError::io(rel.join(entry.file_name()), e)),
            }
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(entries)
    }

    /// The target of symlink `rel`, verbatim.
    pub fn read_link(&self, rel: &Path) -> Result<PathBuf, SourceError> {
        let abs = self.resolve(rel)?;
        fs::read_link(abs).map_err(|e| SourceError::io(rel, e))
    }

    /// Opens regular file `rel` for reading.
    pub fn open(&self, rel: &Path) -> Result<File, SourceError> {
        let abs = self.resolve(rel)?;
        File::open(abs).map_err(|e| SourceError::io(rel, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_rejects_escapes() {
        let tree = SourceTree {
            root: PathBuf::from("/src"),
        };
        assert!(tree.resolve(Path::new("../etc/passwd")).is_err());
        assert!(tree.resolve(Path::new("/etc/passwd")).is_err());
        assert!(tree.resolve(Path::new("a/../../b")).is_err());
        assert_eq!(
            tree.resolve(Path::new("models--a--b/blobs/x")).ok(),
            Some(PathBuf::from("/src/models--a--b/blobs/x"))
        );
        assert_eq!(
            tree.resolve(Path::new("")).ok(),
            Some(PathBuf::from("/src/"))
        );
    }

    #[test]
    fn stamp_changes_with_content_length() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("f");
        fs::write(&path, b"abc")?;
        let a = Stamp::of(&fs::metadata(&path)?);
        fs::write(&path, b"abcd")?;
        let b = Stamp::of(&fs::metadata(&path)?);
        assert_ne!(a, b);
        assert_eq!(b.size, 4);
        Ok(())
    }
}
