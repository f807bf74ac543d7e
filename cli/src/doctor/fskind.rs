//! What kind of filesystem a path is on, decided from the mount table's type and
//! device plus what the platform knows about the disk. Pure, so it is tested here;
//! `mounts_linux` and `mounts_macos` gather the facts.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The kinds that matter for staging: how fast and how reliably the source answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum FsKind {
    /// An internal disk, or memory.
    Local,
    /// A disk on USB.
    Usb,
    /// Removable media, or a format used for external disks (exFAT, FAT, NTFS).
    Removable,
    /// NFS, SMB, sshfs and the like.
    Network,
    /// A FUSE filesystem whose backing store doctor cannot tell.
    Fuse,
    /// A stagefs mount.
    Stagefs,
    /// Nothing above matched.
    Unknown,
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

/// Where a path lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FsInfo {
    pub(crate) kind: FsKind,
    /// Filesystem type as the mount table names it (`ext4`, `fuse.sshfs`, `apfs`).
    pub(crate) fstype: String,
    /// Whether reads cross a network.
    pub(crate) network: bool,
    pub(crate) mount_point: PathBuf,
    /// The mount's source: a device, `host:/export`, `stagefs:/source`.
    pub(crate) device: String,
    /// For a stagefs mount, the directory it mirrors.
    pub(crate) stagefs_source: Option<PathBuf>,
}

impl FsInfo {
    /// Classifies a mount table entry; `local_flag` is macOS's MNT_LOCAL, when known.
    pub(crate) fn new(
        fstype: &str,
        device: &str,
        mount_point: PathBuf,
        disk: Disk,
        local_flag: Option<bool>,
    ) -> FsInfo {
        let stagefs_source = stagefs_source_of(fstype, device);
        let kind = if stagefs_source.is_some() {
            FsKind::Stagefs
        } else {
            classify(fstype, device, disk, local_flag)
        };
        FsInfo {
            kind,
            fstype: fstype.to_string(),
            network: kind == FsKind::Network,
            mount_point,
            device: device.to_string(),
            stagefs_source,
        }
    }

    /// For a path whose filesystem could not be found.
    pub(crate) fn unknown() -> FsInfo {
        FsInfo::new("unknown", "", PathBuf::new(), Disk::Unknown, None)
    }

    /// `ext4 on /dev/vda (local disk)`.
    pub(crate) fn describe(&self) -> String {
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
    pub(crate) fn lacks_symlinks(&self) -> bool {
        matches!(self.fstype.as_str(), "exfat" | "vfat" | "msdos" | "fat")
    }
}

/// Types whose reads cross a network. FUSE types carry their program's name.
const NETWORK_TYPES: &[&str] = &[
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "afpfs",
    "webdav",
    "davfs",
    "ncpfs",
    "9p",
    "afs",
    "ceph",
    "glusterfs",
    "lustre",
    "gpfs",
    "beegfs",
    "fuse.sshfs",
    "fuse.rclone",
    "fuse.s3fs",
    "fuse.gcsfuse",
    "fuse.goofys",
    "fuse.juicefs",
    "fuse.glusterfs",
    "fuse.ceph-fuse",
    "fuse.davfs",
    "fuse.mountpoint-s3",
    "fuse.blobfuse2",
];

/// Formats found on external disks more than internal ones.
const EXTERNAL_FORMATS: &[&str] = &["exfat", "vfat", "msdos", "fat", "ntfs", "ntfs3"];

/// Disk-backed or in-memory types.
const LOCAL_TYPES: &[&str] = &[
    "ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "bcachefs", "jfs", "reiserfs", "tmpfs",
    "ramfs", "overlay", "squashfs", "apfs", "hfs", "ufs", "fuseblk",
];

fn classify(fstype: &str, device: &str, disk: Disk, local_flag: Option<bool>) -> FsKind {
    let fuse = is_fuse(fstype);
    if NETWORK_TYPES.contains(&fstype) || local_flag == Some(false) {
        return FsKind::Network;
    }
    if fuse && looks_remote(device) {
        // sshfs and friends under macFUSE all report the type `macfuse`.
        return FsKind::Network;
    }
    match disk {
        Disk::Usb => return FsKind::Usb,
        Disk::External => return FsKind::Removable,
        Disk::Internal | Disk::Unknown => {}
    }
    if EXTERNAL_FORMATS.contains(&fstype) && disk == Disk::Unknown {
        FsKind::Removable
    } else if LOCAL_TYPES.contains(&fstype) || EXTERNAL_FORMATS.contains(&fstype) {
        FsKind::Local
    } else if fuse {
        FsKind::Fuse
    } else if device.starts_with("/dev/") {
        FsKind::Local
    } else {
        FsKind::Unknown
    }
}

fn is_fuse(fstype: &str) -> bool {
    fstype == "fuse" || fstype.starts_with("fuse.") || matches!(fstype, "macfuse" | "osxfuse")
}

/// `user@host:/path` or `host:/path`, as sshfs and NFS name their source.
fn looks_remote(device: &str) -> bool {
    !device.starts_with('/')
        && device
            .split_once(':')
            .is_some_and(|(host, path)| !host.is_empty() && path.starts_with('/'))
}

/// A stagefs mount names itself `stagefs:<source>` (see `FsConfig::session_config`).
fn stagefs_source_of(fstype: &str, device: &str) -> Option<PathBuf> {
    let source = device.strip_prefix("stagefs:")?;
    (fstype == "fuse.stagefs" || is_fuse(fstype)).then(|| PathBuf::from(source))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(fstype: &str, device: &str, disk: Disk) -> FsKind {
        FsInfo::new(fstype, device, "/m".into(), disk, None).kind
    }

    #[test]
    fn linux_types() {
        assert_eq!(kind("ext4", "/dev/vda", Disk::Internal), FsKind::Local);
        assert_eq!(kind("ext4", "/dev/sdb1", Disk::Usb), FsKind::Usb);
        assert_eq!(kind("tmpfs", "tmpfs", Disk::Unknown), FsKind::Local);
        assert_eq!(kind("nfs4", "nas:/export", Disk::Unknown), FsKind::Network);
        assert_eq!(kind("cifs", "//nas/share", Disk::Unknown), FsKind::Network);
        let sshfs = kind("fuse.sshfs", "root@10.0.0.2:/hub", Disk::Unknown);
        assert_eq!(sshfs, FsKind::Network);
        assert_eq!(kind("exfat", "/dev/sdc1", Disk::Unknown), FsKind::Removable);
        assert_eq!(
            kind("vfat", "/dev/nvme0n1p1", Disk::Internal),
            FsKind::Local
        );
        assert_eq!(kind("fuse.mergerfs", "a:b", Disk::Unknown), FsKind::Fuse);
        assert_eq!(kind("weirdfs", "none", Disk::Unknown), FsKind::Unknown);
    }

    #[test]
    fn a_stagefs_mount_names_its_source() {
        let info = FsInfo::new(
            "fuse.stagefs",
            "stagefs:/nas/hub",
            "/m".into(),
            Disk::Unknown,
            None,
        );
        assert_eq!(info.kind, FsKind::Stagefs);
        assert_eq!(info.stagefs_source, Some(PathBuf::from("/nas/hub")));
        assert!(!info.network);
        let mac = FsInfo::new(
            "macfuse",
            "stagefs:/Volumes/nas",
            "/m".into(),
            Disk::Unknown,
            Some(true),
        );
        assert_eq!(mac.kind, FsKind::Stagefs);
    }

    #[test]
    fn macos_types() {
        let k =
            |t: &str, d: &str, disk, local| FsInfo::new(t, d, "/m".into(), disk, Some(local)).kind;
        assert_eq!(
            k("apfs", "/dev/disk3s5", Disk::Internal, true),
            FsKind::Local
        );
        assert_eq!(k("apfs", "/dev/disk5s1", Disk::Usb, true), FsKind::Usb);
        assert_eq!(
            k("smbfs", "//u@nas/hf", Disk::Unknown, false),
            FsKind::Network
        );
        assert_eq!(
            k("macfuse", "u@host:/hub", Disk::Unknown, true),
            FsKind::Network
        );
        assert_eq!(
            k("exfat", "/dev/disk4s1", Disk::External, true),
            FsKind::Removable
        );
    }

    #[test]
    fn describes_and_flags() {
        let info = FsInfo::new("exfat", "/dev/sdc1", "/media/x".into(), Disk::Usb, None);
        assert_eq!(info.describe(), "exfat on /dev/sdc1 (USB disk)");
        assert!(info.lacks_symlinks());
    }
}
