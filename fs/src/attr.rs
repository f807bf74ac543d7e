//! Source metadata as FUSE attributes.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::time::UNIX_EPOCH;

use fuser::{FileAttr, FileType, INodeNo};
use stagefs_cache::Stamp;
use stagefs_cache::sys::time_from_ns;

/// The attributes of inode `ino`, mirroring `meta`. A file inode stands for one
/// version, so it reports that version's size and mtime even after the source moved on.
pub(crate) fn attr_of(ino: u64, meta: &Metadata, version: Option<Stamp>) -> FileAttr {
    let (size, mtime) = match version {
        Some(stamp) => (stamp.size, time_from_ns(stamp.mtime_ns)),
        None => (meta.len(), meta.modified().unwrap_or(UNIX_EPOCH)),
    };
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: meta.blocks(),
        atime: meta.accessed().unwrap_or(UNIX_EPOCH),
        mtime,
        ctime: time_from_ns(
            meta.ctime()
                .saturating_mul(1_000_000_000)
                .saturating_add(meta.ctime_nsec()),
        ),
        crtime: meta.created().unwrap_or(UNIX_EPOCH),
        kind: kind_of(meta),
        perm: (meta.mode() & 0o7777) as u16,
        nlink: u32::try_from(meta.nlink()).unwrap_or(u32::MAX),
        uid: meta.uid(),
        gid: meta.gid(),
        rdev: u32::try_from(meta.rdev()).unwrap_or(0),
        blksize: u32::try_from(meta.blksize()).unwrap_or(4096),
        flags: 0,
    }
}

/// The FUSE file type of `meta`.
pub(crate) fn kind_of(meta: &Metadata) -> FileType {
    FileType::from_std(meta.file_type()).unwrap_or(FileType::RegularFile)
}
