//! The policy's attributes as NFSv3's `fattr3`.

use nfs3_server::nfs3_types::nfs3::{fattr3, ftype3, nfstime3, specdata3};
use stagefs_policy::Attr;
use stagefs_source::EntryKind;

/// One filesystem id for the whole export: it never crosses into another filesystem.
const FSID: u64 = 0x5354_4147_4546_5331; // "STAGEFS1"

/// `attr` as NFS attributes.
pub fn fattr(attr: &Attr) -> fattr3 {
    // A device's numbers, as NFS carries them: major, then minor.
    let (major, minor) = stagefs_source::sys::major_minor(attr.rdev);
    fattr3 {
        type_: ftype(attr.kind),
        mode: u32::from(attr.perm),
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        size: attr.size,
        used: attr.blocks.saturating_mul(512),
        rdev: specdata3 {
            specdata1: major,
            specdata2: minor,
        },
        fsid: FSID,
        fileid: attr.ino,
        atime: nfstime(attr.atime_ns),
        mtime: nfstime(attr.mtime_ns),
        ctime: nfstime(attr.ctime_ns),
    }
}

fn ftype(kind: EntryKind) -> ftype3 {
    match kind {
        EntryKind::File => ftype3::NF3REG,
        EntryKind::Dir => ftype3::NF3DIR,
        EntryKind::Symlink => ftype3::NF3LNK,
        EntryKind::Fifo => ftype3::NF3FIFO,
        EntryKind::Socket => ftype3::NF3SOCK,
        EntryKind::CharDevice => ftype3::NF3CHR,
        EntryKind::BlockDevice => ftype3::NF3BLK,
    }
}

/// NFSv3 times are unsigned 32-bit seconds: a time before 1970 shows as the epoch.
fn nfstime(ns: i64) -> nfstime3 {
    if ns < 0 {
        return nfstime3::default();
    }
    nfstime3 {
        seconds: u32::try_from(ns / 1_000_000_000).unwrap_or(u32::MAX),
        nseconds: (ns % 1_000_000_000) as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_keep_their_nanoseconds_and_clamp_before_the_epoch() {
        let t = nfstime(1_700_000_000_123_456_789);
        assert_eq!((t.seconds, t.nseconds), (1_700_000_000, 123_456_789));
        assert_eq!(nfstime(-5), nfstime3::default());
    }
}
