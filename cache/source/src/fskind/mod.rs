//! What kind of filesystem a path is on: a local disk, a USB or removable disk, a
//! network filesystem, another FUSE filesystem or a stagefs mount. How fast and how
//! reliably a source answers depends on it, so the stager can size its copies by it
//! and `stagefs doctor` reports it.
//!
//! [`filesystem_of`] gathers the facts per platform (`linux`: the mount table and
//! sysfs; `macos`: statfs(2) and `diskutil`); classifying them is pure and tested
//! here.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
pub use linux::filesystem_of;
#[cfg(target_os = "macos")]
mod macos;
#[cfg(target_os = "macos")]
pub use macos::filesystem_of;

/// The kinds that matter for staging: how fast and how reliably the source answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FsKind {
    /// An internal disk, or memory.
    Local,
    /// A disk on USB.
    Usb,
    /// Removable media, or a format used for external disks (exFAT, FAT, NTFS).
    Removable,
    /// NFS, SMB, sshfs and the like.
    Network,
    /// A FUSE filesystem whose backing store cannot be told.
    Fuse,
    /// A stagefs mount.
    Stagefs,
    /// Nothing above matched.
    Unknown,
}

impl FsKind {
    /// Whether reads are served by a disk (or memory) of this machine, where a copy
    /// is bound by the CPU rather than by round trips: how the stager sizes its reads.
    pub fn is_local_disk(self) -> bool {
        matches!(self, FsKind::Local | FsKind::Usb | FsKind::Removable)
    }
}

/// What the platform says about the disk behind a filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Disk {
    /// On a USB bus.
    Usb,
    /// Removable or external, bus unknown.
    External,
    /// A disk that is neither.
    Internal,
    /// No block device, or it could not be told.
    Unknown,
}

/// The filesystem a path lives on, as [`filesystem_of`] finds it; the default is
/// for a path whose filesystem could not be found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsInfo {
    /// What kind of filesystem it is.
    pub kind: FsKind,
    /// Filesystem type as the mount table names it (`ext4`, `fuse.sshfs`, `apfs`).
    pub fstype: String,
    /// Whether reads cross a network.
    pub network: bool,
    /// Where the filesystem is mounted.
    pub mount_point: PathBuf,
    /// The mount's source: a device, `host:/export`, `stagefs:/source`.
    pub device: String,
    /// For a stagefs mount, the directory it mirrors.
    pub stagefs_source: Option<PathBuf>,
}

/// Types whose reads cross a network. FUSE types carry their program's name.
const NETWORK_TYPES: &str = "nfs nfs4 cifs smb3 smbfs afpfs webdav davfs ncpfs 9p afs ceph \
    glusterfs lustre gpfs beegfs fuse.sshfs fuse.rclone fuse.s3fs fuse.gcsfuse fuse.goofys \
    fuse.juicefs fuse.glusterfs fuse.ceph-fuse fuse.davfs fuse.mountpoint-s3 fuse.blobfuse2";
/// Formats found on external disks more than internal ones.
const EXTERNAL_FORMATS: &str = "exfat vfat msdos fat ntfs ntfs3";
/// Disk-backed or in-memory types.
const LOCAL_TYPES: &str = "ext2 ext3 ext4 xfs btrfs zfs f2fs bcachefs jfs reiserfs tmpfs ramfs \
    overlay squashfs apfs hfs ufs fuseblk";

fn listed(types: &str, fstype: &str) -> bool {
    types.split_whitespace().any(|t| t == fstype)
}

/// For a path whose filesystem could not be found.
impl Default for FsInfo {
    fn default() -> FsInfo {
        FsInfo::new("unknown", "", PathBuf::new(), Disk::Unknown, None)
    }
}

impl FsInfo {
    /// Classifies a mount table entry; `local` is macOS's MNT_LOCAL, when known.
    pub(crate) fn new(
        fstype: &str,
        device: &str,
        mount_point: PathBuf,
        disk: Disk,
        local: Option<bool>,
    ) -> FsInfo {
        let stagefs_source = stagefs_source_of(fstype, device);
        let kind = match stagefs_source {
            Some(_) => FsKind::Stagefs,
            None => classify(fstype, device, disk, local),
        };
        let (fstype, device, network) = (fstype.into(), device.into(), kind == FsKind::Network);
        FsInfo {
            kind,
            fstype,
            network,
            mount_point,
            device,
            stagefs_source,
        }
    }

    /// `ext4 on /dev/vda (local disk)`.
    pub fn describe(&self) -> String {
        let what = match self.kind {
            FsKind::Local => "local disk",
            FsKind::Usb => "USB disk",
            FsKind::Removable => "removable or external disk",
            FsKind::Network => "network filesystem",
            FsKind::Fuse => "FUSE filesystem",
            FsKind::Stagefs => "stagefs mount",
            FsKind::Unknown => "unknown kind",
        };
        format!("{} on {} ({what})", self.fstype, self.device)
    }

    /// exFAT and FAT cannot hold the snapshot -> blob symlinks of an HF cache.
    pub fn lacks_symlinks(&self) -> bool {
        listed("exfat vfat msdos fat", &self.fstype)
    }
}

fn classify(fstype: &str, device: &str, disk: Disk, local: Option<bool>) -> FsKind {
    let fuse = is_fuse(fstype);
    // sshfs and friends under macFUSE all report the type `macfuse`.
    if listed(NETWORK_TYPES, fstype) || local == Some(false) || (fuse && looks_remote(device)) {
        return FsKind::Network;
    }
    let external = listed(EXTERNAL_FORMATS, fstype);
    match disk {
        Disk::Usb => FsKind::Usb,
        Disk::External => FsKind::Removable,
        Disk::Unknown if external => FsKind::Removable,
        _ if external || listed(LOCAL_TYPES, fstype) => FsKind::Local,
        _ if fuse => FsKind::Fuse,
        _ if device.starts_with("/dev/") => FsKind::Local,
        _ => FsKind::Unknown,
    }
}

fn is_fuse(fstype: &str) -> bool {
    fstype == "fuse" || fstype.starts_with("fuse.") || matches!(fstype, "macfuse" | "osxfuse")
}

/// `user@host:/path` or `host:/path`, as sshfs and NFS name their source.
fn looks_remote(device: &str) -> bool {
    let host_path = device.split_once(':');
    !device.starts_with('/') && host_path.is_some_and(|(h, p)| !h.is_empty() && p.starts_with('/'))
}

/// A stagefs mount names itself `stagefs:<source>` (see `FsConfig::session_config`).
fn stagefs_source_of(fstype: &str, device: &str) -> Option<PathBuf> {
    let source = device.strip_prefix("stagefs:")?;
    is_fuse(fstype).then(|| PathBuf::from(source))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn a_disk_or_memory_filesystem_is_local_and_a_virtual_one_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let local = |path: &std::path::Path| {
            let path = path.canonicalize().expect("canonical");
            filesystem_of(&path)
                .expect("mountinfo")
                .kind
                .is_local_disk()
        };
        assert!(local(dir.path()), "{:?}", filesystem_of(dir.path()));
        assert!(local(std::path::Path::new("/dev/shm")));
        // procfs stands in for any kind not known as a disk (as NFS, SMB and FUSE are not).
        assert!(!local(std::path::Path::new("/proc")));
    }

    #[test]
    fn kinds_from_the_mount_table_and_the_disk() {
        use {Disk as D, FsKind as K};
        let cases = [
            ("ext4", "/dev/vda", D::Internal, None, K::Local),
            ("ext4", "/dev/sdb1", D::Usb, None, K::Usb),
            ("tmpfs", "tmpfs", D::Unknown, None, K::Local),
            ("nfs4", "nas:/export", D::Unknown, None, K::Network),
            ("cifs", "//nas/share", D::Unknown, None, K::Network),
            ("fuse.sshfs", "u@h:/hub", D::Unknown, None, K::Network),
            ("exfat", "/dev/sdc1", D::Unknown, None, K::Removable),
            ("vfat", "/dev/nvme0n1p1", D::Internal, None, K::Local),
            ("fuse.mergerfs", "a:b", D::Unknown, None, K::Fuse),
            ("weirdfs", "none", D::Unknown, None, K::Unknown),
            ("apfs", "/dev/disk3s5", D::Internal, Some(true), K::Local),
            ("apfs", "/dev/disk5s1", D::Usb, Some(true), K::Usb),
            ("smbfs", "//u@nas/hf", D::Unknown, Some(false), K::Network),
            ("macfuse", "u@host:/hub", D::Unknown, Some(true), K::Network),
            ("exfat", "/dev/disk4", D::External, Some(true), K::Removable),
            ("fuse.stagefs", "stagefs:/hub", D::Unknown, None, K::Stagefs),
            (
                "macfuse",
                "stagefs:/nas",
                D::Unknown,
                Some(true),
                K::Stagefs,
            ),
        ];
        for (fstype, device, disk, local, kind) in cases {
            let info = FsInfo::new(fstype, device, "/m".into(), disk, local);
            assert_eq!(info.kind, kind, "{fstype} {device}");
            assert_eq!(info.network, kind == K::Network);
        }
        let mount = FsInfo::new(
            "fuse.stagefs",
            "stagefs:/hub",
            "/m".into(),
            D::Unknown,
            None,
        );
        assert_eq!(mount.stagefs_source, Some(PathBuf::from("/hub")));
        let usb = FsInfo::new("exfat", "/dev/sdc1", "/x".into(), D::Usb, None);
        assert_eq!(usb.describe(), "exfat on /dev/sdc1 (USB disk)");
        assert!(usb.lacks_symlinks());
    }
}
