//! Source metadata as FUSE attributes.

use std::path::Path;

use fuser::{FileAttr, FileType, INodeNo};
use stagefs_cache::sys::time_from_ns;
use stagefs_cache::{EntryKind, SourceMeta, Stamp};

/// The attributes of inode `ino`, mirroring `meta`. A file inode stands for one
/// version, so it reports that version's size and mtime even after the source moved on.
pub(crate) fn attr_of(ino: u64, meta: &SourceMeta, version: Option<Stamp>) -> FileAttr {
    let (size, mtime_ns) = match version {
        Some(stamp) => (stamp.size, stamp.mtime_ns),
        None => (meta.size, meta.mtime_ns),
    };
    let ctime = time_from_ns(meta.ctime_ns);
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: meta.blocks,
        atime: time_from_ns(meta.atime_ns),
        mtime: time_from_ns(mtime_ns),
        ctime,
        // Not every platform records a birth time; the change time stands in.
        crtime: ctime,
        kind: kind_of(meta),
        perm: (meta.mode & 0o7777) as u16,
        nlink: u32::try_from(meta.nlink).unwrap_or(u32::MAX),
        uid: meta.uid,
        gid: meta.gid,
        rdev: u32::try_from(meta.rdev).unwrap_or(0),
        blksize: u32::try_from(meta.blksize).unwrap_or(4096),
        flags: 0,
    }
}

/// The attributes of a link to staged copy `copy` standing for `version` of a file
/// whose source metadata is `meta`.
pub(crate) fn link_attr(ino: u64, meta: &SourceMeta, version: Stamp, copy: &Path) -> FileAttr {
    let mut attr = attr_of(ino, meta, Some(version));
    attr.kind = FileType::Symlink;
    attr.size = copy.as_os_str().len() as u64;
    attr.blocks = 0;
    attr.perm = 0o777;
    attr.nlink = 1;
    attr
}

/// The FUSE file type of `meta`.
pub(crate) fn kind_of(meta: &SourceMeta) -> FileType {
    match meta.kind {
        EntryKind::File => FileType::RegularFile,
        EntryKind::Dir => FileType::Directory,
        EntryKind::Symlink => FileType::Symlink,
        EntryKind::Fifo => FileType::NamedPipe,
        EntryKind::Socket => FileType::Socket,
        EntryKind::CharDevice => FileType::CharDevice,
        EntryKind::BlockDevice => FileType::BlockDevice,
    }
}
