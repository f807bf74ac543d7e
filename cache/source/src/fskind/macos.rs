//! macOS: the filesystem holding a path from statfs(2), and whether its disk is on
//! USB or external, from `diskutil info -plist` (run with a deadline).

use std::ffi::{CString, OsString};
use std::io::{self, Read};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::{Disk, FsInfo};

/// How long `diskutil` may take before the disk is reported as unknown.
const DISKUTIL_TIMEOUT: Duration = Duration::from_secs(5);

/// The filesystem holding `path` (statfs(2) may wait on a dead mount; `diskutil` is
/// given a deadline).
pub fn filesystem_of(path: &Path) -> io::Result<FsInfo> {
    let c_path = CString::new(path.as_os_str().as_bytes())?;
    let mut out = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: c_path is NUL-terminated and out points to writable statfs storage.
    if unsafe { libc::statfs(c_path.as_ptr(), out.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statfs succeeded, so it initialised `out`.
    let st = unsafe { out.assume_init() };
    let text = |chars: &[libc::c_char]| String::from_utf8_lossy(&c_bytes(chars)).into_owned();
    let (fstype, device) = (text(&st.f_fstypename), text(&st.f_mntfromname));
    let mount_point = PathBuf::from(OsString::from_vec(c_bytes(&st.f_mntonname)));
    #[allow(clippy::unnecessary_cast)] // MNT_LOCAL is a c_int, f_flags a u32
    let local = st.f_flags & (libc::MNT_LOCAL as u32) != 0;
    let on_disk = local && device.starts_with("/dev/disk");
    let disk = if on_disk {
        disk_of(&device)
    } else {
        Disk::Unknown
    };
    Ok(FsInfo::new(
        &fstype,
        &device,
        mount_point,
        disk,
        Some(local),
    ))
}

/// The bytes of a NUL-terminated C array.
#[allow(clippy::unnecessary_cast)] // c_char is i8 on some targets, u8 on others
fn c_bytes(chars: &[libc::c_char]) -> Vec<u8> {
    chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect()
}

/// The keys of `diskutil info -plist` that say where a disk is attached.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DiskInfo {
    bus_protocol: Option<String>,
    internal: Option<bool>,
    removable_media: Option<bool>,
}

fn disk_of(device: &str) -> Disk {
    let info = diskutil_info(device).map(|bytes| plist::from_bytes::<DiskInfo>(&bytes));
    match info {
        Some(Ok(info)) if info.bus_protocol.as_deref() == Some("USB") => Disk::Usb,
        Some(Ok(info)) if info.internal == Some(false) || info.removable_media == Some(true) => {
            Disk::External
        }
        Some(Ok(_)) => Disk::Internal,
        Some(Err(e)) => {
            tracing::debug!("diskutil info for {device}: {e}");
            Disk::Unknown
        }
        None => Disk::Unknown,
    }
}

/// `diskutil info -plist DEVICE`'s output, or None if it fails or takes too long.
fn diskutil_info(device: &str) -> Option<Vec<u8>> {
    let mut child = Command::new("diskutil")
        .args(["info", "-plist", device])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + DISKUTIL_TIMEOUT;
    // Its output (a few KiB) fits in the pipe, so waiting before reading cannot block it.
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let mut out = Vec::new();
    child.stdout.take()?.read_to_end(&mut out).ok()?;
    Some(out)
}
