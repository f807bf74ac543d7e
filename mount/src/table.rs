//! The system's mount table, read without touching the mounts themselves (a dead
//! FUSE mount answers ENOTCONN to anything that stats it), and which of its entries
//! look like stagefs's by their filesystem type.

use std::io;
use std::path::{Path, PathBuf};

/// One mounted filesystem, as the mount table lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Where it is mounted.
    pub mountpoint: PathBuf,
    /// Its filesystem type (`fuse.stagefs`, `tmpfs`, `ext4`, `macfuse`).
    pub fstype: String,
    /// What the table names as its source (`stagefs:/mnt/nas/hub`, `tmpfs`, `/dev/sda1`).
    pub source: String,
}

impl MountEntry {
    /// Whether the filesystem type is one a stagefs mount has. The one place that
    /// knows what stagefs mounts look like in the table; what makes a mount *ours* is
    /// also the cache's record of it (see `registry`).
    pub fn looks_like_stagefs(&self) -> bool {
        is_stagefs_type(&self.fstype, &self.source)
    }

    /// How a user would name what is mounted here: `a tmpfs (tmpfs)`.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.fstype, self.source)
    }
}

/// A FUSE mount with stagefs's subtype (Linux: `fuse.stagefs`), a macFUSE mount
/// whose source stagefs named (`stagefs:<source>`), or an NFS mount of a loopback
/// server (the NFS backend mounts `127.0.0.1:/`; other programs may too, which is why
/// the cache's record must also name the mount point).
fn is_stagefs_type(fstype: &str, source: &str) -> bool {
    match fstype {
        "fuse.stagefs" => true,
        "macfuse" | "osxfuse" | "fuse" => source.starts_with("stagefs:"),
        "nfs" | "nfs3" => source.starts_with("127.0.0.1:"),
        _ => false,
    }
}

/// The filesystem mounted on `path` (the topmost, when several are stacked), if any.
/// `path` is compared as given after resolving its parent: the mount point itself
/// is never stat'ed.
pub fn mounted_at(path: &Path) -> io::Result<Option<MountEntry>> {
    let path = resolve(path)?;
    Ok(entries()?.into_iter().rev().find(|e| e.mountpoint == path))
}

/// Whether a stagefs mount is on `path` now (an unreadable table counts as no), as
/// [`mounted_at`] finds it: what tells a running daemon's mount from one detached
/// with files still open.
pub fn stagefs_mounted_at(path: &Path) -> bool {
    matches!(mounted_at(path), Ok(Some(entry)) if entry.looks_like_stagefs())
}

/// `path` made absolute with its parent resolved, without following its last part.
pub fn resolve(path: &Path) -> io::Result<PathBuf> {
    let absolute = std::path::absolute(path)?;
    match (absolute.parent(), absolute.file_name()) {
        (Some(parent), Some(name)) => Ok(parent.canonicalize()?.join(name)),
        _ => Ok(absolute),
    }
}

/// Every mounted filesystem, in mount order.
pub fn entries() -> io::Result<Vec<MountEntry>> {
    platform::entries()
}

#[cfg(target_os = "linux")]
mod platform {
    use std::ffi::OsString;
    use std::io;
    use std::os::unix::ffi::OsStringExt;
    use std::path::PathBuf;

    use super::MountEntry;

    pub(super) fn entries() -> io::Result<Vec<MountEntry>> {
        let text = std::fs::read_to_string("/proc/self/mountinfo")?;
        Ok(text.lines().filter_map(parse_line).collect())
    }

    /// `36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw`: the
    /// fifth field is the mount point; after the `-`, the type and the source.
    pub(super) fn parse_line(line: &str) -> Option<MountEntry> {
        let (before, after) = line.split_once(" - ")?;
        let mountpoint = before.split(' ').nth(4)?;
        let mut after = after.split(' ');
        let fstype = after.next()?;
        let source = after.next().unwrap_or_default();
        Some(MountEntry {
            mountpoint: PathBuf::from(OsString::from_vec(unescape(mountpoint))),
            fstype: String::from_utf8_lossy(&unescape(fstype)).into_owned(),
            source: String::from_utf8_lossy(&unescape(source)).into_owned(),
        })
    }

    /// The kernel writes space, tab, newline and backslash as `\ooo`.
    fn unescape(field: &str) -> Vec<u8> {
        let bytes = field.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            let octal = bytes.get(i + 1..i + 4).filter(|_| bytes[i] == b'\\');
            match octal.and_then(|o| u8::from_str_radix(std::str::from_utf8(o).ok()?, 8).ok()) {
                Some(byte) => {
                    out.push(byte);
                    i += 4;
                }
                None => {
                    out.push(bytes[i]);
                    i += 1;
                }
            }
        }
        out
    }
}

#[cfg(not(target_os = "linux"))]
mod platform {
    use std::ffi::CStr;
    use std::io;
    use std::os::unix::ffi::OsStrExt;
    use std::path::PathBuf;

    use super::MountEntry;

    pub(super) fn entries() -> io::Result<Vec<MountEntry>> {
        let mut list: *mut libc::statfs = std::ptr::null_mut();
        // SAFETY: getmntinfo points `list` at a buffer it owns, valid until the next
        // call in this thread; MNT_NOWAIT asks no filesystem anything (a dead one
        // cannot hang us).
        let count = unsafe { libc::getmntinfo(&mut list, libc::MNT_NOWAIT) };
        if count <= 0 || list.is_null() {
            return Err(io::Error::last_os_error());
        }
        let count = usize::try_from(count).unwrap_or_default();
        // SAFETY: getmntinfo returned `count` entries at `list`.
        let all = unsafe { std::slice::from_raw_parts(list, count) };
        let text = |field: &[libc::c_char]| {
            // SAFETY: the kernel NUL-terminates these fixed-size fields.
            unsafe { CStr::from_ptr(field.as_ptr()) }
        };
        Ok(all
            .iter()
            .map(|fs| MountEntry {
                mountpoint: PathBuf::from(std::ffi::OsStr::from_bytes(
                    text(&fs.f_mntonname).to_bytes(),
                )),
                fstype: text(&fs.f_fstypename).to_string_lossy().into_owned(),
                source: text(&fs.f_mntfromname).to_string_lossy().into_owned(),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_stagefs_types_look_like_stagefs() {
        assert!(is_stagefs_type("fuse.stagefs", "stagefs:/mnt/nas"));
        assert!(is_stagefs_type("macfuse", "stagefs:/Volumes/nas"));
        assert!(
            is_stagefs_type("nfs", "127.0.0.1:/"),
            "the NFS backend's mount"
        );
        for (fstype, source) in [
            ("tmpfs", "tmpfs"),
            ("ext4", "/dev/sda1"),
            ("fuse.sshfs", "me@nas:/x"),
            ("macfuse", "sshfs@nas"),
            ("nfs", "nas:/export"),
        ] {
            assert!(!is_stagefs_type(fstype, source), "{fstype}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn mountinfo_lines_are_parsed_and_unescaped() {
        let line =
            "36 35 0:52 / /tmp/a\\040b rw,nosuid - fuse.stagefs stagefs:/src\\054x ro,user_id=0";
        let entry = platform::parse_line(line).expect("a line");
        assert_eq!(entry.mountpoint, Path::new("/tmp/a b"));
        assert_eq!(entry.fstype, "fuse.stagefs");
        assert_eq!(entry.source, "stagefs:/src,x");
        assert!(entry.looks_like_stagefs());
    }
}
