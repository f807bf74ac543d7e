//! The policy's attributes as fuser's.

use fuser::{FileAttr, FileType, INodeNo};
use stagefs_policy::Attr;
use stagefs_source::EntryKind;
use stagefs_source::sys::time_from_ns;

/// `attr` as the kernel's FUSE attributes.
pub(crate) fn file_attr(attr: &Attr) -> FileAttr {
    let ctime = time_from_ns(attr.ctime_ns);
    FileAttr {
        ino: INodeNo(attr.ino),
        size: attr.size,
        blocks: attr.blocks,
        atime: time_from_ns(attr.atime_ns),
        mtime: time_from_ns(attr.mtime_ns),
        ctime,
        // Not every platform records a birth time; the change time stands in.
        crtime: ctime,
        kind: file_type(attr.kind),
        perm: attr.perm,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: u32::try_from(attr.rdev).unwrap_or(0),
        blksize: attr.blksize,
        flags: 0,
    }
}

/// The FUSE file type of `kind`.
pub(crate) fn file_type(kind: EntryKind) -> FileType {
    match kind {
        EntryKind::File => FileType::RegularFile,
        EntryKind::Dir => FileType::Directory,
        EntryKind::Symlink => FileType::Symlink,
        EntryKind::Fifo => FileType::NamedPipe,
        EntryKind::Socket => FileType::Socket,
        EntryKind::CharDevice => FileType::CharDevice,
        EntryKind::BlockDevice => FileType::BlockDevice,
    }
}
