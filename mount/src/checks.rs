//! What is checked before anything is created or mounted, and the stale mount a
//! crashed daemon leaves behind.

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::info;

use crate::bounded::{self, Kind};
use crate::{MountError, MountSpec, SourcePlace};

/// What checking a mount did besides looking.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[must_use]
pub struct Checked {
    /// The mount point was a dead mount (its daemon crashed) and was unmounted.
    pub cleared_stale_mount: bool,
}

impl MountSpec {
    /// Refuses a mount that cannot work, before anything is created or mounted: the
    /// source must answer a `stat` within `fs.source_timeout` (asked by a child
    /// process, so a dead share cannot hang the caller) and be a directory this user
    /// can list; the mount
    /// point an empty directory that is not a mount already, outside the source; the
    /// cache directory outside both; the size limit no smaller than the smallest
    /// staged file. A mount point left dead by a crashed daemon is unmounted first.
    pub fn check(&self) -> Result<Checked, MountError> {
        let (source, cache) = self.resolved_source_and_cache()?;
        let checked = Checked {
            cleared_stale_mount: recover_stale_mount(&self.mountpoint)?,
        };
        let mountpoint = existing_dir(&self.mountpoint, "mount point")?;
        // The mount would list itself inside itself, without end (issue 36).
        if mountpoint.starts_with(&source) {
            return Err(MountError::MountpointInside {
                mountpoint: self.mountpoint.clone(),
                source_dir: self.source.clone(),
            });
        }
        if is_mount_point(&mountpoint).map_err(inaccessible("mount point", &mountpoint))? {
            return Err(MountError::AlreadyMounted {
                mountpoint: self.mountpoint.clone(),
            });
        }
        let mut entries =
            fs::read_dir(&mountpoint).map_err(inaccessible("mount point", &mountpoint))?;
        if entries.next().is_some() {
            return Err(MountError::NotEmpty {
                mountpoint: self.mountpoint.clone(),
            });
        }
        if cache.starts_with(&mountpoint) {
            return Err(MountError::CacheInside {
                cache_dir: self.cache_dir.clone(),
            });
        }
        Ok(checked)
    }

    /// The checks that do not involve a mount point (all `stagefs serve` needs): the
    /// source answers and is a directory, the cache directory lies outside it, and
    /// the size limit can hold a staged file. Returns the resolved cache directory.
    pub fn check_source_and_cache(&self) -> Result<PathBuf, MountError> {
        self.resolved_source_and_cache().map(|(_, cache)| cache)
    }

    /// [`Self::check_source_and_cache`], returning the resolved source too.
    fn resolved_source_and_cache(&self) -> Result<(PathBuf, PathBuf), MountError> {
        let source = match SourcePlace::of(&self.source)? {
            SourcePlace::Dir(dir) => match answering_dir(&dir, self.fs.source_timeout) {
                Ok(source) => source,
                // Away, but this cache served it and remembers it: mounted from that.
                Err(
                    MountError::SourceUnanswered { .. }
                    | MountError::Missing { .. }
                    | MountError::Inaccessible { .. },
                ) if crate::away::remembered(self).is_some() && dir.is_absolute() => {
                    self.source_verdict.set_away();
                    dir
                }
                Err(e) => return Err(e),
            },
            // An object store: asked in this process, since its client gives up by
            // itself after the timeout. Its URL is no path a cache lies under.
            bucket @ SourcePlace::Bucket(_) => {
                bucket.open_checked(self.fs.source_timeout)?;
                self.source.clone()
            }
        };
        let cache = canonical_prefix(&self.cache_dir)?;
        if cache.starts_with(&source) {
            return Err(MountError::CacheInside {
                cache_dir: self.cache_dir.clone(),
            });
        }
        if let Some(max_size) = self.max_size
            && max_size < self.fs.min_stage_size
        {
            return Err(MountError::LimitBelowStageSize {
                max_size,
                min_stage_size: self.fs.min_stage_size,
            });
        }
        Ok((source, cache))
    }

    /// Creates the cache directory (private to its owner) if missing and makes sure
    /// it can be written.
    pub fn create_cache_dir(&self) -> Result<(), MountError> {
        let dir = &self.cache_dir;
        if fs::metadata(dir).is_ok_and(|meta| !meta.is_dir()) {
            return Err(MountError::NotADirectory {
                what: "cache directory",
                path: dir.clone(),
            });
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| MountError::CacheUncreatable {
                path: dir.clone(),
                source,
            })?;
        tempfile::tempfile_in(dir)
            .map(drop)
            .map_err(|source| MountError::CacheUnwritable {
                path: dir.clone(),
                source,
            })
    }
}

fn inaccessible(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> MountError {
    let path = path.to_path_buf();
    move |source| MountError::Inaccessible { what, path, source }
}

/// The source, resolved, once it has answered within `timeout`.
fn answering_dir(source: &Path, timeout: Duration) -> Result<PathBuf, MountError> {
    let unanswered = |why| MountError::SourceUnanswered {
        path: source.to_path_buf(),
        why,
    };
    match bounded::stat(source, timeout).map_err(unanswered)? {
        Ok(Kind::Directory) => {}
        Ok(Kind::Other) => {
            return Err(MountError::NotADirectory {
                what: "source",
                path: source.to_path_buf(),
            });
        }
        Err(e) => return Err(dir_error(e, "source", source)),
    }
    bounded::canonicalize(source, timeout)
        .map_err(unanswered)?
        .map_err(|e| dir_error(e, "source", source))
}

fn existing_dir(path: &Path, what: &'static str) -> Result<PathBuf, MountError> {
    let real = fs::canonicalize(path).map_err(|e| dir_error(e, what, path))?;
    if !real.is_dir() {
        return Err(MountError::NotADirectory {
            what,
            path: path.to_path_buf(),
        });
    }
    Ok(real)
}

fn dir_error(e: io::Error, what: &'static str, path: &Path) -> MountError {
    let path = path.to_path_buf();
    match e.kind() {
        io::ErrorKind::NotFound => MountError::Missing { what, path },
        _ => MountError::Inaccessible {
            what,
            path,
            source: e,
        },
    }
}

/// A FUSE mount whose daemon died answers ENOTCONN; clear it so the new mount can
/// take its place (what a user would otherwise have to do by hand). True if cleared.
fn recover_stale_mount(mountpoint: &Path) -> Result<bool, MountError> {
    match fs::metadata(mountpoint) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            crate::unmount::clear_dead(mountpoint).map_err(|source| MountError::StaleMount {
                mountpoint: mountpoint.to_path_buf(),
                source,
            })?;
            // The caller says so to the user; this is for the log.
            info!(mountpoint = %mountpoint.display(), "cleared a stale mount left by a crashed daemon");
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Whether `dir` is the root of a mounted filesystem (its device differs from its
/// parent's, or it is `/`).
pub(crate) fn is_mount_point(dir: &Path) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let Some(parent) = dir.parent() else {
        return Ok(true);
    };
    Ok(fs::metadata(dir)?.dev() != fs::metadata(parent)?.dev())
}

/// `path` with its longest existing prefix canonicalized, so a cache directory can
/// be checked before anything is created.
fn canonical_prefix(path: &Path) -> Result<PathBuf, MountError> {
    let mut existing = path;
    let mut rest = Vec::new();
    while !existing.exists() {
        let (Some(parent), Some(name)) = (existing.parent(), existing.file_name()) else {
            break;
        };
        rest.push(name);
        existing = parent;
    }
    let mut out = fs::canonicalize(existing)
        .map_err(|e| MountError::io(format!("resolving {}", existing.display()), e))?;
    out.extend(rest.iter().rev());
    Ok(out)
}
