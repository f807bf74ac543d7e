//! Source metadata as the attributes a mount presents, in no protocol's types: the
//! FUSE adapter turns them into `fuser::FileAttr`, the NFS adapter into `fattr3`.

use stagefs_source::{EntryKind, SourceMeta, Stamp};

/// What a mount says about one of its inodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    /// The inode number (the NFS fileid).
    pub ino: u64,
    /// Size in bytes (a link's: the length of its target).
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// Access time, in nanoseconds since the epoch.
    pub atime_ns: i64,
    /// Modification time, in nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// Status change time, in nanoseconds since the epoch.
    pub ctime_ns: i64,
    /// What kind of entry it is.
    pub kind: EntryKind,
    /// Permission bits (mode & 0o7777).
    pub perm: u16,
    /// Hard links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number, for device nodes.
    pub rdev: u64,
    /// Preferred I/O size.
    pub blksize: u32,
}

/// The attributes of inode `ino`, mirroring `meta`. A file inode stands for one
/// version, so it reports that version's size and mtime even after the source moved on.
pub(crate) fn attr_of(ino: u64, meta: &SourceMeta, version: Option<Stamp>) -> Attr {
    let (size, mtime_ns) = match version {
        Some(stamp) => (stamp.size, stamp.mtime_ns),
        None => (meta.size, meta.mtime_ns),
    };
    Attr {
        ino,
        size,
        blocks: meta.blocks,
        atime_ns: meta.atime_ns,
        mtime_ns,
        ctime_ns: meta.ctime_ns,
        kind: meta.kind,
        perm: (meta.mode & 0o7777) as u16,
        nlink: u32::try_from(meta.nlink).unwrap_or(u32::MAX),
        uid: meta.uid,
        gid: meta.gid,
        rdev: meta.rdev,
        blksize: u32::try_from(meta.blksize).unwrap_or(4096),
    }
}

/// The attributes of a link whose text is `text_len` bytes long, standing for
/// `version` of a file whose source metadata is `meta`.
pub(crate) fn link_attr(ino: u64, meta: &SourceMeta, version: Stamp, text_len: usize) -> Attr {
    link_attr_of(attr_of(ino, meta, Some(version)), text_len)
}

/// `file`'s attributes as a link's whose text is `text_len` bytes long.
pub(crate) fn link_attr_of(file: Attr, text_len: usize) -> Attr {
    Attr {
        kind: EntryKind::Symlink,
        size: text_len as u64,
        blocks: 0,
        perm: 0o777,
        nlink: 1,
        ..file
    }
}
