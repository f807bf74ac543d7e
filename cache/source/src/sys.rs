//! Thin wrappers over the few system calls std does not offer.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
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

/// `mknod(2)`: creates special file `path` of the type and permissions in `mode`
/// (the process's umask applies), for device `rdev`.
pub fn mknod(path: &Path, mode: u32, rdev: u64) -> io::Result<()> {
    let c_path = CString::new(path.as_os_str().as_bytes())?;
    // mode_t and dev_t differ in width between Linux and macOS.
    let mode =
        libc::mode_t::try_from(mode).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let rdev =
        libc::dev_t::try_from(rdev).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: c_path is NUL-terminated; mknod reads nothing else from memory.
    if unsafe { libc::mknod(c_path.as_ptr(), mode, rdev) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The device number of `major` and `minor`, as this system encodes it.
pub fn makedev(major: u32, minor: u32) -> u64 {
    #[cfg(target_os = "linux")]
    {
        libc::makedev(major, minor)
    }
    #[cfg(not(target_os = "linux"))]
    {
        // The BSDs' and macOS's dev_t: 8 bits of major, 24 of minor.
        (u64::from(major & 0xff) << 24) | u64::from(minor & 0xff_ffff)
    }
}

/// The major and minor numbers of device number `dev`.
pub fn major_minor(dev: u64) -> (u32, u32) {
    #[cfg(target_os = "linux")]
    {
        (libc::major(dev), libc::minor(dev))
    }
    #[cfg(not(target_os = "linux"))]
    {
        (((dev >> 24) & 0xff) as u32, (dev & 0xff_ffff) as u32)
    }
}

/// Creates (or truncates) `path` for writing, readable by its owner only: the cache
/// says which models a user runs, which is nobody else's business.
pub fn create_private(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A time given in nanoseconds since the Unix epoch (negative before it).
pub fn time_from_ns(ns: i64) -> std::time::SystemTime {
    let magnitude = std::time::Duration::from_nanos(ns.unsigned_abs());
    if ns >= 0 {
        std::time::UNIX_EPOCH + magnitude
    } else {
        std::time::UNIX_EPOCH - magnitude
    }
}

/// Starts writing back ranges of a file being written, without waiting for them,
/// so that its final sync finds most of it on disk already.
#[derive(Debug, Clone, Copy)]
pub struct Writeback {
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    fd: std::os::fd::RawFd,
}

impl Writeback {
    /// For `file`, which must outlive every [`Writeback::start`].
    pub fn of(file: &File) -> Writeback {
        use std::os::fd::AsRawFd;
        Writeback {
            fd: file.as_raw_fd(),
        }
    }

    /// Asks the kernel to start writing `len` bytes at `offset` to disk. Best effort:
    /// the final sync is what makes the copy durable.
    #[cfg(target_os = "linux")]
    pub fn start(&self, offset: u64, len: u64) {
        let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
            return;
        };
        // SAFETY: fd is open for the lifetime the caller promised; the call only
        // schedules I/O on it.
        unsafe {
            libc::sync_file_range(self.fd, offset, len, libc::SYNC_FILE_RANGE_WRITE);
        }
    }

    /// Other systems have no such call; the final sync does it all.
    #[cfg(not(target_os = "linux"))]
    pub fn start(&self, _offset: u64, _len: u64) {}
}

/// Reads `len` bytes of `file` at `offset` into a new buffer, fewer only at end of
/// file. The buffer is never zeroed first: a staged read of 1 MiB is a copy out of
/// the page cache, and zeroing the buffer beforehand costs as much again.
pub fn pread_new(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    use std::os::fd::AsRawFd;
    let mut buf = Vec::<u8>::with_capacity(len);
    while buf.len() < len {
        let filled = buf.len();
        let at = libc::off_t::try_from(offset + filled as u64)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: the destination is the vector's spare capacity, `len - filled`
        // bytes past its initialised part, and pread writes at most that many.
        let n = unsafe {
            libc::pread(
                file.as_raw_fd(),
                buf.as_mut_ptr().add(filled).cast(),
                len - filled,
                at,
            )
        };
        match n {
            0 => break,
            n if n > 0 => {
                // SAFETY: pread initialised the `n` bytes after `filled`.
                unsafe { buf.set_len(filled + n as usize) };
            }
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn pread_new_reads_the_range_and_stops_short_only_at_the_end() {
        let mut file = tempfile::tempfile().expect("temp file");
        let bytes: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        file.write_all(&bytes).expect("write");
        assert_eq!(
            pread_new(&file, 100, 1000).expect("read"),
            &bytes[100..1100]
        );
        assert_eq!(pread_new(&file, 2500, 1000).expect("read"), &bytes[2500..]);
        assert!(pread_new(&file, 5000, 10).expect("read").is_empty());
    }
}
