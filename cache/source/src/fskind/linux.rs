//! Linux: which mount holds a path (`/proc/self/mountinfo`) and whether its disk is
//! on USB (`/sys/dev/block`).

use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use super::{Disk, FsInfo};

/// One line of mountinfo, the fields used here: the device number (major 0 for
/// filesystems without a block device), the mount point, the type and the source.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MountEntry((u32, u32), PathBuf, String, String);

/// The filesystem holding `path`, which should be canonical: the mount table lists
/// resolved paths. Reads only the mount table and sysfs, never `path` itself, so it
/// answers even for a path on a dead mount.
pub fn filesystem_of(path: &Path) -> io::Result<FsInfo> {
    let entries = parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo")?);
    let missing = || io::Error::new(io::ErrorKind::NotFound, "no mount in mountinfo holds it");
    let MountEntry(dev, mount, fstype, source) =
        mount_containing(&entries, path).ok_or_else(missing)?;
    Ok(FsInfo::new(
        fstype,
        source,
        mount.clone(),
        disk_of(*dev),
        None,
    ))
}

/// Every parsable line of mountinfo, in mount order.
fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines().filter_map(parse_line).collect()
}

/// `36 35 98:0 /root /mnt rw,noatime master:1 - ext3 /dev/root rw`: after the mount
/// point and options come optional fields, then `-`, the type and the source.
fn parse_line(line: &str) -> Option<MountEntry> {
    let fields: Vec<&str> = line.split(' ').collect();
    let (major, minor) = fields.get(2)?.split_once(':')?;
    let mount = PathBuf::from(OsString::from_vec(unescape(fields.get(4)?)));
    let dash = fields.iter().skip(6).position(|f| *f == "-")? + 6;
    let text = |i: usize| Some(String::from_utf8_lossy(&unescape(fields.get(i)?)).into_owned());
    let dev = (major.parse().ok()?, minor.parse().ok()?);
    Some(MountEntry(dev, mount, text(dash + 1)?, text(dash + 2)?))
}

/// Undoes the kernel's octal escapes (`\040` space, `\011` tab, `\012` newline,
/// `\134` backslash) in mountinfo fields.
fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let digits = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match digits.filter(|_| bytes[i] == b'\\') {
            Some(d) => {
                let value = d.iter().fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
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
fn mount_containing<'a>(entries: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    let containing = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| path.starts_with(&e.1));
    containing
        .max_by_key(|(order, e)| (e.1.components().count(), *order))
        .map(|(_, e)| e)
}

/// Whether the block device `dev` is a USB or removable disk.
fn disk_of((major, minor): (u32, u32)) -> Disk {
    match std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")) {
        Ok(sys) if major != 0 => disk_at(&sys, 0),
        _ => Disk::Unknown,
    }
}

/// Device-mapper devices (LVM, LUKS) are judged by the disks under them.
fn disk_at(sys: &Path, depth: usize) -> Disk {
    if sys.to_string_lossy().contains("/usb") {
        return Disk::Usb;
    }
    let slaves = std::fs::read_dir(sys.join("slaves"))
        .into_iter()
        .flatten()
        .flatten();
    let below: Vec<Disk> = slaves
        .filter(|_| depth < 4)
        .filter_map(|slave| std::fs::canonicalize(slave.path()).ok())
        .map(|slave| disk_at(&slave, depth + 1))
        .collect();
    if let Some(found) = [Disk::Usb, Disk::External]
        .into_iter()
        .find(|d| below.contains(d))
    {
        return found;
    }
    // A partition's `removable` flag lives on its disk, one directory up.
    let flag = |p: PathBuf| std::fs::read_to_string(p).is_ok_and(|t| t.trim() == "1");
    if flag(sys.join("removable")) || flag(sys.join("../removable")) {
        Disk::External
    } else {
        Disk::Internal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
42 27 254:0 /run/netns /run/netns rw,relatime shared:1 - ext4 /dev/vda rw
60 27 0:50 / /mnt/my\\040nas rw,nosuid shared:5 master:2 - fuse.sshfs root@10.0.0.2:/srv/hub rw
61 60 0:51 / /mnt/my\\040nas/sub rw - nfs4 nas:/export rw
70 27 0:60 / /tmp/x/mnt ro,nosuid,nodev,noatime - fuse.stagefs stagefs:/tmp/x/hub ro,user_id=0
71 27 0:61 / /tmp/x/mnt ro - fuse.stagefs stagefs:/other ro
garbage
1 2 x
";

    #[test]
    fn parses_mountinfo_and_finds_the_mount_of_a_path() -> io::Result<()> {
        let entries = parse_mountinfo(SAMPLE);
        assert_eq!(entries.len(), 6);
        let sshfs = (
            (0, 50),
            "/mnt/my nas".into(),
            "fuse.sshfs".into(),
            "root@10.0.0.2:/srv/hub".into(),
        );
        assert_eq!(entries[2], MountEntry(sshfs.0, sshfs.1, sshfs.2, sshfs.3));
        let at = |p: &str| mount_containing(&entries, Path::new(p)).map(|e| e.3.as_str());
        assert_eq!(at("/mnt/my nas/hub"), Some("root@10.0.0.2:/srv/hub"));
        assert_eq!(at("/mnt/my nas/sub/a"), Some("nas:/export"));
        assert_eq!(at("/mnt/my nasty"), Some("/dev/vda"));
        assert_eq!(at("/tmp/x/mnt/models--a--b"), Some("stagefs:/other"));
        assert_eq!(unescape("a\\040b\\011c\\134d"), b"a b\tc\\d");
        assert_eq!(unescape("x\\09y\\"), b"x\\09y\\");
        assert_eq!(filesystem_of(Path::new("/"))?.mount_point, Path::new("/"));
        Ok(())
    }
}
