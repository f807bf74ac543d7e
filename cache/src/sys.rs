//! Thin wrappers over the few system calls std does not offer.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `statvfs(2)` of the filesystem holding `path`.
pub fn statvfs(path: &Path) -> io::Result<libc::statvfs> {
    let c_path = CString::new(path.as_os_str().as_bytes())?;
    let mut out = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: c_path is NUL-terminated and out points to writable statvfs storage.
    if unsafe { libc::statvfs(c_path.as_ptr(), out.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs succeeded, so it initialised `out`.
    Ok(unsafe { out.assume_init() })
}
