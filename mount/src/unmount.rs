//! Unmounting a mount of ours, and only one of ours: the mount table must show a
//! filesystem of stagefs's type at the path and the cache the registry points to
//! must record that mount point. Then the call returns once the daemon has let go
//! of its cache, so the next command finds the cache free.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::registry;
use crate::table;

/// How long [`unmount`] waits for the daemon to exit after the kernel let go (the
/// daemon itself gives its request loop 15 s).
pub const DAEMON_EXIT_WAIT: Duration = Duration::from_secs(30);

/// Why an unmount failed.
#[derive(Debug, thiserror::Error)]
pub enum UnmountError {
    /// A process has files open or its working directory in the mount.
    #[error("{} is busy: a process has files open or its working directory there", .0.display())]
    Busy(PathBuf),
    /// Nothing is mounted there.
    #[error("{} is not a mount point", .0.display())]
    NotMounted(PathBuf),
    /// The path does not exist.
    #[error("{} does not exist", .0.display())]
    Missing(PathBuf),
    /// Something other than stagefs is mounted there.
    #[error("{} is not a stagefs mount: {what} is mounted there; left alone", path.display())]
    NotOurs {
        /// The mount point.
        path: PathBuf,
        /// The mount table's type and source of what is there.
        what: String,
    },
    /// A mount of stagefs's type that no cache of this user records.
    #[error("{} is a stagefs mount that this user's stagefs has no record of (another user's, or made by another stagefs); left alone", .0.display())]
    Unrecorded(PathBuf),
    /// The kernel let go but the daemon still holds its cache.
    #[error(
        "unmounted {}, but its daemon{} still holds the cache {} after {}s",
        path.display(),
        pid.map(|p| format!(" (pid {p})")).unwrap_or_default(),
        cache_dir.display(),
        waited.as_secs()
    )]
    DaemonLingers {
        /// The mount point.
        path: PathBuf,
        /// Its cache.
        cache_dir: PathBuf,
        /// The daemon, if it recorded itself.
        pid: Option<u32>,
        /// How long this waited.
        waited: Duration,
    },
    /// The mount table could not be read.
    #[error("reading the mount table")]
    Table(#[source] io::Error),
    /// Anything else the system said.
    #[error("unmounting {} failed: {error}", path.display())]
    Failed {
        /// The mount point.
        path: PathBuf,
        /// What the system said.
        error: io::Error,
    },
}

/// How long a lazy unmount waits for the daemon: while files are open the kernel keeps
/// the detached mount, and so the daemon, until the last one closes.
const LAZY_EXIT_WAIT: Duration = Duration::from_secs(2);

/// What an unmount achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Unmounted {
    /// The mount is gone and its daemon released the cache.
    Released,
    /// A lazy unmount detached the mount, but files opened in it keep its daemon
    /// (this pid, if recorded) serving them until they are closed.
    Detached {
        /// The daemon.
        pid: Option<u32>,
    },
}

/// How to unmount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// Refused while files are open there.
    Normal,
    /// Detach now even while files are open (Linux); forced on macOS.
    Lazy,
    /// Abort the mount's pending requests first, for a daemon that hangs (Linux, as
    /// root; an ordinary user's unmount through fusermount3 is not forced). macOS: as
    /// `Lazy`.
    Force,
}

/// Unmounts the mount of ours at `mountpoint` (`lazy`: detach it even while files
/// are open) and waits, at most [`DAEMON_EXIT_WAIT`], for its daemon to release the
/// cache. Refuses anything that is not ours: see the module's doc.
pub fn unmount(mountpoint: &Path, lazy: bool) -> Result<Unmounted, UnmountError> {
    unmount_how(mountpoint, if lazy { How::Lazy } else { How::Normal })
}

/// [`unmount`], forced or lazy as `how` says; the same rule for every way.
pub fn unmount_how(mountpoint: &Path, how: How) -> Result<Unmounted, UnmountError> {
    let lazy = how == How::Lazy;
    let path = mountpoint.to_path_buf();
    let resolved = table::resolve(mountpoint).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => UnmountError::Missing(path.clone()),
        _ => UnmountError::Failed {
            path: path.clone(),
            error: e,
        },
    })?;
    let entry = table::mounted_at(&resolved).map_err(UnmountError::Table)?;
    let Some(entry) = entry else {
        return Err(match std::fs::symlink_metadata(&resolved) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => UnmountError::Missing(path),
            _ => UnmountError::NotMounted(path),
        });
    };
    if !entry.looks_like_stagefs() {
        return Err(UnmountError::NotOurs {
            path,
            what: entry.describe(),
        });
    }
    let Some(known) = registry::known_at(&resolved) else {
        return Err(UnmountError::Unrecorded(path));
    };
    unmount_within_busy_grace(&resolved, how).map_err(|e| system_error(e, path.clone()))?;
    let wait = if lazy {
        LAZY_EXIT_WAIT
    } else {
        DAEMON_EXIT_WAIT
    };
    match wait_for_release(&known.cache_dir, wait) {
        true => Ok(Unmounted::Released),
        false if lazy => Ok(Unmounted::Detached {
            pid: registry::lock_holder(&known.cache_dir),
        }),
        false => Err(UnmountError::DaemonLingers {
            path,
            pid: registry::lock_holder(&known.cache_dir),
            cache_dir: known.cache_dir,
            waited: wait,
        }),
    }
}

/// Unmounts a dead mount of stagefs's type at `mountpoint` that a new mount is about
/// to replace (the caller checked it answers ENOTCONN). Anything else is refused.
pub(crate) fn clear_dead(mountpoint: &Path) -> Result<(), UnmountError> {
    let path = mountpoint.to_path_buf();
    match table::mounted_at(mountpoint).map_err(UnmountError::Table)? {
        Some(entry) if entry.looks_like_stagefs() => {
            unmount_path(mountpoint, How::Lazy).map_err(|e| system_error(e, path))
        }
        Some(entry) => Err(UnmountError::NotOurs {
            path,
            what: entry.describe(),
        }),
        None => Err(UnmountError::NotMounted(path)),
    }
}

/// How long a plain unmount keeps trying while the mount is busy. A file closed a
/// moment ago can still hold it: a program's children exiting after it, or a process
/// forked while the file was open that has not reached its `exec` yet (seen in CI:
/// `cat`-like read, then `stagefs unmount` at once, refused as busy). A mount still
/// busy after this is busy for the user too.
const BUSY_GRACE: Duration = Duration::from_secs(2);

/// [`unmount_path`], tried again for [`BUSY_GRACE`] while a plain unmount finds the
/// mount busy.
fn unmount_within_busy_grace(mountpoint: &Path, how: How) -> io::Result<()> {
    let start = Instant::now();
    loop {
        match unmount_path(mountpoint, how) {
            Err(e)
                if how == How::Normal
                    && e.raw_os_error() == Some(libc::EBUSY)
                    && start.elapsed() < BUSY_GRACE =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            done => return done,
        }
    }
}

fn system_error(e: io::Error, path: PathBuf) -> UnmountError {
    match e.raw_os_error() {
        Some(libc::EBUSY) => UnmountError::Busy(path),
        Some(libc::EINVAL) => UnmountError::NotMounted(path),
        Some(libc::ENOENT) => UnmountError::Missing(path),
        _ => UnmountError::Failed { path, error: e },
    }
}

/// Waits, at most `limit`, until no process holds the cache's lock: the daemon has
/// exited, so a command right after finds the cache free. False if it still holds it.
fn wait_for_release(cache_dir: &Path, limit: Duration) -> bool {
    let start = Instant::now();
    while registry::locked(cache_dir) {
        if start.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Detaches the mount at `mountpoint` lazily (Linux `umount2(MNT_DETACH)`, or
/// `fusermount3 -u -z` for an ordinary user's mount): new lookups no longer see it,
/// and the kernel keeps it for the files open in it until the last one is closed.
/// For a daemon stopping while its mount is busy; the caller checked it is its own.
pub(crate) fn detach(mountpoint: &Path) -> io::Result<()> {
    unmount_path(mountpoint, How::Lazy)
}

/// A plain unmount of the mount at `mountpoint`, refused (EBUSY) while it is in use.
pub(crate) fn try_unmount(mountpoint: &Path) -> io::Result<()> {
    unmount_path(mountpoint, How::Normal)
}

fn unmount_path(mountpoint: &Path, how: How) -> io::Result<()> {
    platform::unmount(mountpoint, how)
}

#[cfg(target_os = "linux")]
mod platform {
    use std::ffi::CString;
    use std::io;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::process::Command;

    use super::How;

    pub(super) fn unmount(mountpoint: &Path, how: How) -> io::Result<()> {
        let path = CString::new(mountpoint.as_os_str().as_bytes())?;
        let flags = match how {
            How::Normal => 0,
            How::Lazy => libc::MNT_DETACH,
            How::Force => libc::MNT_FORCE,
        };
        // SAFETY: path is a valid NUL-terminated string.
        if unsafe { libc::umount2(path.as_ptr(), flags) } == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EPERM) {
            return Err(err);
        }
        // Unprivileged users unmount FUSE filesystems through the setuid helper.
        let mut helper = Command::new("fusermount3");
        helper.arg("-u").arg(mountpoint);
        if how == How::Lazy {
            helper.arg("-z");
        }
        let output = helper.output()?;
        if output.status.success() {
            return Ok(());
        }
        let said = String::from_utf8_lossy(&output.stderr);
        // fusermount3 says why in words only ("…: Device or resource busy"): a busy
        // mount must read as EBUSY, as the root's umount2 gives it, to be told apart.
        if said.contains("busy") {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        Err(io::Error::other(format!(
            "fusermount3 -u exited with {}: {}",
            output.status,
            said.trim()
        )))
    }
}

#[cfg(not(target_os = "linux"))]
mod platform {
    use std::ffi::CString;
    use std::io;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    use super::How;

    pub(super) fn unmount(mountpoint: &Path, how: How) -> io::Result<()> {
        let path = CString::new(mountpoint.as_os_str().as_bytes())?;
        let flags = match how {
            How::Normal => 0,
            How::Lazy | How::Force => libc::MNT_FORCE,
        };
        // SAFETY: path is a valid NUL-terminated string.
        if unsafe { libc::unmount(path.as_ptr(), flags) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}
