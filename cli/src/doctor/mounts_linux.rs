//! Linux: which mount holds a path (`/proc/self/mountinfo`) and whether its disk is
//! on USB (`/sys/dev/block`).

use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use super::fskind::{Disk, FsInfo};

/// One line of mountinfo, the fields doctor uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MountEntry {
    /// Device number, `major:minor` (major 0 for filesystems without a block device).
    pub(crate) dev: (u32, u32),
    pub(crate) mount_point: PathBuf,
    pub(crate) fstype: String,
    pub(crate) source: String,
}

/// The filesystem holding `path`, which should be canonical: the mount table lists
/// resolved paths.
pub(crate) fn filesystem_of(path: &Path) -> io::Result<FsInfo> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    let entries = parse_mountinfo(&text);
    let entry = mount_containing(&entries, path).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "no mount in /proc/self/mountinfo holds it",
        )
    })?;
    Ok(FsInfo::new(
        &entry.fstype,
        &entry.source,
        entry.mount_point.clone(),
        disk_of(entry.dev),
        None,
    ))
}

/// Every parsable line of mountinfo, in mount order.
pub(crate) fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines().filter_map(parse_line).collect()
}

/// `36 35 98:0 /root /mnt rw,noatime master:1 - ext3 /dev/root rw`: after the mount
/// point and options come optional fields, then `-`, the type and the source.
fn parse_line(line: &str) -> Option<MountEntry> {
    let fields: Vec<&str> = line.split(' ').collect();
    let (major, minor) = fields.get(2)?.split_once(':')?;
    let mount_point = PathBuf::from(OsString::from_vec(unescape(fields.get(4)?)));
    let dash = fields.iter().skip(6).position(|f| *f == "-")? + 6;
    let fstype = String::from_utf8_lossy(&unescape(fields.get(dash + 1)?)).into_owned();
    let source = String::from_utf8_lossy(&unescape(fields.get(dash + 2)?)).into_owned();
    Some(MountEntry {
        dev: (major.parse().ok()?, minor.parse().ok()?),
        mount_point,
        fstype,
        source,
    })
}

/// Undoes the kernel's octal escapes (`\040` space, `\011` tab, `\012` newline,
/// `\134` backslash) in mountinfo fields.
pub(crate) fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(digits) => {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
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

/// The mount with the longest mount point that contains `path`; among mounts on the
/// same point, the last one, which hides the others.
pub(crate) fn mount_containing<'a>(
    entries: &'a [MountEntry],
    path: &Path,
) -> Option<&'a MountEntry> {
    entries
        .iter()
        .enumerate()
        .filter(|(_, e)| path.starts_with(&e.mount_point))
        .max_by_key(|(order, e)| (e.mount_point.components().count(), *order))
        .map(|(_, e)| e)
}

/// Whether the block device `dev` is a USB or removable disk. Device-mapper devices
/// (LVM, LUKS) are judged by the disks under them.
fn disk_of(dev: (u32, u32)) -> Disk {
    if dev.0 == 0 {
        return Disk::Unknown;
    }
    let link = PathBuf::from(format!("/sys/dev/block/{}:{}", dev.0, dev.1));
    match std::fs::canonicalize(&link) {
        Ok(sys) => disk_at(&sys, 0),
        Err(_) => Disk::Unknown,
    }
}

fn disk_at(sys: &Path, depth: usize) -> Disk {
    if sys.to_string_lossy().contains("/usb") {
        return Disk::Usb;
    }
    let below: Vec<Disk> = if depth < 4 {
        slaves(sys)
            .iter()
            .map(|slave| disk_at(slave, depth + 1))
            .collect()
    } else {
        Vec::new()
    };
    for wanted in [Disk::Usb, Disk::External] {
        if below.contains(&wanted) {
            return wanted;
        }
    }
    // A partition's `removable` flag lives on its disk, one directory up.
    let removable = [sys.join("removable"), sys.join("../removable")]
        .iter()
        .any(|p| std::fs::read_to_string(p).is_ok_and(|t| t.trim() == "1"));
    if removable {
        Disk::External
    } else {
        Disk::Internal
    }
}

/// The devices a device-mapper device is built on.
fn slaves(sys: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(sys.join("slaves"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| std::fs::canonicalize(e.path()).ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
42 27 254:0 /run/netns /run/netns rw,relatime shared:1 - ext4 /dev/vda rw
60 27 0:50 / /mnt/my\\040nas rw,nosuid shared:5 master:2 - fuse.sshfs root@10.0.0.2:/srv/hub rw,user_id=0
61 60 0:51 / /mnt/my\\040nas/sub rw - nfs4 nas:/export rw
70 27 0:60 / /tmp/x/mnt ro,nosuid,nodev,noatime - fuse.stagefs stagefs:/tmp/x/hub ro,user_id=0
71 27 0:61 / /tmp/x/mnt ro - fuse.stagefs stagefs:/other ro
";

    #[test]
    fn parses_fields_and_escapes() {
        let entries = parse_mountinfo(SAMPLE);
        assert_eq!(entries.len(), 6);
        assert_eq!(entries[2].mount_point, Path::new("/mnt/my nas"));
        assert_eq!(entries[2].fstype, "fuse.sshfs");
        assert_eq!(entries[2].source, "root@10.0.0.2:/srv/hub");
        assert_eq!(entries[0].dev, (254, 0));
        assert!(parse_mountinfo("garbage\n1 2 x\n").is_empty());
    }

    #[test]
    fn unescapes_octal_only() {
        assert_eq!(unescape("a\\040b\\011c\\134d"), b"a b\tc\\d");
        assert_eq!(unescape("x\\09y\\"), b"x\\09y\\");
    }

    #[test]
    fn longest_prefix_and_last_mount_win() {
        let entries = parse_mountinfo(SAMPLE);
        let at = |p: &str| mount_containing(&entries, Path::new(p)).map(|e| e.source.clone());
        assert_eq!(
            at("/mnt/my nas/hub").as_deref(),
            Some("root@10.0.0.2:/srv/hub")
        );
        assert_eq!(at("/mnt/my nas/sub/a").as_deref(), Some("nas:/export"));
        assert_eq!(at("/mnt/my nasty").as_deref(), Some("/dev/vda"));
        assert_eq!(
            at("/tmp/x/mnt/models--a--b").as_deref(),
            Some("stagefs:/other")
        );
    }

    #[test]
    fn this_machines_root_is_found() -> io::Result<()> {
        let info = filesystem_of(Path::new("/"))?;
        assert_eq!(info.mount_point, Path::new("/"));
        Ok(())
    }
}
