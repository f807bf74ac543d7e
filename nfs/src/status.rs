//! The one place where the policy's errors become NFS statuses. The policy decides
//! the errno of every error ([`FsError::errno`]); this maps errno to `nfsstat3`, so
//! FUSE and NFS callers see the same condition for the same failure.

use nfs3_server::nfs3_types::nfs3::nfsstat3;
use stagefs_policy::FsError;
use tracing::{debug, warn};

/// The status an NFS client gets for `e`, logged as the FUSE adapter logs errors.
pub fn nfsstat_logged(op: &'static str, e: &FsError) -> nfsstat3 {
    if e.is_expected() {
        debug!(op, error = %e);
    } else {
        warn!(op, error = %e);
    }
    nfsstat(e)
}

/// The status an NFS client gets for `e`.
pub fn nfsstat(e: &FsError) -> nfsstat3 {
    from_errno(e.errno())
}

/// The NFSv3 status for errno `errno` (RFC 1813 names each after its errno).
fn from_errno(errno: i32) -> nfsstat3 {
    match errno {
        libc::EPERM => nfsstat3::NFS3ERR_PERM,
        libc::ENOENT => nfsstat3::NFS3ERR_NOENT,
        libc::ENXIO => nfsstat3::NFS3ERR_NXIO,
        libc::EACCES => nfsstat3::NFS3ERR_ACCES,
        libc::EEXIST => nfsstat3::NFS3ERR_EXIST,
        libc::EXDEV => nfsstat3::NFS3ERR_XDEV,
        libc::ENODEV => nfsstat3::NFS3ERR_NODEV,
        libc::ENOTDIR => nfsstat3::NFS3ERR_NOTDIR,
        libc::EISDIR => nfsstat3::NFS3ERR_ISDIR,
        libc::EINVAL => nfsstat3::NFS3ERR_INVAL,
        libc::EFBIG => nfsstat3::NFS3ERR_FBIG,
        libc::ENOSPC => nfsstat3::NFS3ERR_NOSPC,
        libc::EROFS => nfsstat3::NFS3ERR_ROFS,
        libc::EMLINK => nfsstat3::NFS3ERR_MLINK,
        libc::ENAMETOOLONG => nfsstat3::NFS3ERR_NAMETOOLONG,
        libc::ENOTEMPTY => nfsstat3::NFS3ERR_NOTEMPTY,
        libc::EDQUOT => nfsstat3::NFS3ERR_DQUOT,
        libc::ESTALE => nfsstat3::NFS3ERR_STALE,
        libc::ENOTSUP => nfsstat3::NFS3ERR_NOTSUPP,
        // Whatever else went wrong (EIO, EBUSY, a timeout), the caller sees an I/O error.
        _ => nfsstat3::NFS3ERR_IO,
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use stagefs_source::SourceError;
    use stagefs_stage::{StageError, StoreError};

    use super::*;

    #[test]
    fn statuses_follow_the_policys_errno() {
        let missing = FsError::Source(SourceError::NotFound {
            path: PathBuf::from("x"),
        });
        assert_eq!(nfsstat(&missing), nfsstat3::NFS3ERR_NOENT);
        assert_eq!(nfsstat(&FsError::Stale), nfsstat3::NFS3ERR_STALE);
        assert_eq!(nfsstat(&FsError::ReadOnly), nfsstat3::NFS3ERR_ROFS);
        let timeout = FsError::SourceTimeout {
            path: PathBuf::from("x"),
            secs: 5,
        };
        assert_eq!(nfsstat(&timeout), nfsstat3::NFS3ERR_IO);
        let full = FsError::Stage(StageError::Store(StoreError::NoSpace {
            path: PathBuf::from("x"),
        }));
        assert_eq!(nfsstat(&full), nfsstat3::NFS3ERR_NOSPC);
        assert_eq!(nfsstat(&FsError::UnknownInode(9)), nfsstat3::NFS3ERR_STALE);
    }
}
