//! Unmounting, which differs per platform.

use std::io;
use std::path::{Path, PathBuf};

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
    /// Anything else the system said.
    #[error("unmounting {} failed: {error}", path.display())]
    Failed {
        /// The mount point.
        path: PathBuf,
        /// What the system said.
        error: io::Error,
    },
}

/// Unmounts `mountpoint`; `lazy` detaches it even while files are open.
pub fn unmount(mountpoint: &Path, lazy: bool) -> Result<(), UnmountError> {
    platform::unmount(mountpoint, lazy).map_err(|e| {
        let path = mountpoint.to_path_buf();
        match e.raw_os_error() {
            Some(libc::EBUSY) => UnmountError::Busy(path),
            Some(libc::EINVAL) => UnmountError::NotMounted(path),
            Some(libc::ENOENT) => UnmountError::Missing(path),
            _ => UnmountError::Failed { path, error: e },
        }
    })
}

#[cfg(target_os = "linux")]
mod platform {
    use std::ffi::CString;
    use std::io;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::process::Command;

    pub(super) fn unmount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
        let path = CString::new(mountpoint.as_os_str().as_bytes())?;
        let flags = if lazy { libc::MNT_DETACH } else { 0 };
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
        if lazy {
            helper.arg("-z");
        }
        let status = helper.status()?;
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "fusermount3 -u exited with {status}"
            )))
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod platform {
    use std::ffi::CString;
    use std::io;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    pub(super) fn unmount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
        let path = CString::new(mountpoint.as_os_str().as_bytes())?;
        let flags = if lazy { libc::MNT_FORCE } else { 0 };
        // SAFETY: path is a valid NUL-terminated string.
        if unsafe { libc::unmount(path.as_ptr(), flags) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}
