//! Unmounting, which differs per platform.

use std::path::Path;

use anyhow::bail;

/// Unmounts `mountpoint`; `lazy` detaches it even while files are open.
pub(crate) fn unmount(mountpoint: &Path, lazy: bool) -> anyhow::Result<()> {
    match platform::unmount(mountpoint, lazy) {
        Ok(()) => Ok(()),
        Err(e) => match e.raw_os_error() {
            Some(libc::EBUSY) => bail!(
                "{} is busy: a process has files open or its working directory there; close them or use --lazy",
                mountpoint.display()
            ),
            Some(libc::EINVAL) => bail!("{} is not a mount point", mountpoint.display()),
            Some(libc::ENOENT) => bail!("{} does not exist", mountpoint.display()),
            _ => bail!("unmounting {} failed: {e}", mountpoint.display()),
        },
    }
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
