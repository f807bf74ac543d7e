//! LINK and MKNOD, which the `nfs3_server` library lacks (it answers
//! `PROC_UNAVAIL`, which a Mac reports as "Bad procedure for program"): the
//! connection front takes them and answers them here, through the policy's
//! [`Policy::link`] and [`Policy::mknod`], as a FUSE mount does.
//!
//! Each is made as the serving user, as every change through the library is (it
//! passes no credentials on). A hard link is a name of its own in the export, with
//! its own handle, as in a FUSE mount (README, "What the filesystem promises"). The
//! replies carry the new entry's attributes and no directory attributes before or
//! after, which tells the client to ask for the directory's again.

use std::ffi::OsStr;
use std::io::Cursor;
use std::os::unix::ffi::OsStrExt;

use nfs3_server::nfs3_types::nfs3::{
    self as nfs, LINK3args, LINK3resok, MKNOD3args, MKNOD3resok, Nfs3Option, mknoddata3, nfs_fh3,
    nfsstat3, sattr3, wcc_data,
};
use nfs3_server::nfs3_types::xdr_codec::{Opaque, Pack, Unpack};
use stagefs_policy::{Attr, Caller, Policy};

use crate::attrs::fattr;
use crate::status::nfsstat_logged;

/// The mode of a special file MKNOD gives none.
const DEFAULT_MODE: u32 = 0o644;

/// The type bits of a mode (`libc`'s are u16 on macOS).
const S_IFIFO: u32 = 0o010_000;
const S_IFCHR: u32 = 0o020_000;
const S_IFBLK: u32 = 0o060_000;
const S_IFSOCK: u32 = 0o140_000;

/// A LINK or MKNOD call, read from its arguments.
#[derive(Debug)]
pub(crate) enum Special {
    /// Make `name` in `dir` another name of `file`.
    Link { file: u64, dir: u64, name: Vec<u8> },
    /// Make special file `name` in `dir`: `mode` holds its type and permissions.
    Mknod {
        dir: u64,
        name: Vec<u8>,
        mode: u32,
        rdev: u64,
    },
    /// A MKNOD of a type MKNOD cannot make (a regular file, a directory, a link).
    BadType,
}

impl Special {
    /// The call of procedure `proc` with XDR arguments `args`, if it is a LINK or a
    /// MKNOD whose handles are this export's (`ino_of` reads one).
    pub(crate) fn parse(
        proc: u32,
        args: &[u8],
        ino_of: impl Fn(&nfs_fh3) -> Option<u64>,
    ) -> Option<Special> {
        let mut cursor = Cursor::new(args);
        if proc == nfs::NFS_PROGRAM::NFSPROC3_LINK as u32 {
            let (args, _) = LINK3args::unpack(&mut cursor).ok()?;
            return Some(Special::Link {
                file: ino_of(&args.file)?,
                dir: ino_of(&args.link.dir)?,
                name: args.link.name.0.as_ref().to_vec(),
            });
        }
        if proc != nfs::NFS_PROGRAM::NFSPROC3_MKNOD as u32 {
            return None;
        }
        let (args, _) = MKNOD3args::unpack(&mut cursor).ok()?;
        let (dir, name) = (
            ino_of(&args.where_.dir)?,
            args.where_.name.0.as_ref().to_vec(),
        );
        let (kind, attrs, rdev) = match args.what {
            mknoddata3::NF3CHR(device) => (S_IFCHR, device.dev_attributes, device.spec),
            mknoddata3::NF3BLK(device) => (S_IFBLK, device.dev_attributes, device.spec),
            mknoddata3::NF3SOCK(attrs) => (S_IFSOCK, attrs, Default::default()),
            mknoddata3::NF3FIFO(attrs) => (S_IFIFO, attrs, Default::default()),
            mknoddata3::default => return Some(Special::BadType),
        };
        Some(Special::Mknod {
            dir,
            name,
            mode: kind | mode_of(&attrs),
            rdev: stagefs_source::sys::makedev(rdev.specdata1, rdev.specdata2),
        })
    }

    /// How many XDR FALSEs follow the status in this procedure's failure result:
    /// LINK3resfail's attributes and directory change, MKNOD3resfail's change.
    pub(crate) fn failure_falses(proc: u32) -> Option<usize> {
        match proc {
            p if p == nfs::NFS_PROGRAM::NFSPROC3_LINK as u32 => Some(3),
            p if p == nfs::NFS_PROGRAM::NFSPROC3_MKNOD as u32 => Some(2),
            _ => None,
        }
    }

    /// Does it, as `caller`; the XDR results (status, then the result's body), and
    /// the handle of a new entry as `handle` makes it.
    pub(crate) async fn answer(
        self,
        policy: &std::sync::Arc<Policy>,
        caller: Caller,
        handle: impl Fn(u64) -> Vec<u8>,
    ) -> Result<Vec<u8>, nfsstat3> {
        let mut results = Vec::with_capacity(256);
        let pack = |results: &mut Vec<u8>, ok: &dyn Fn(&mut Vec<u8>) -> bool| {
            let packed = nfsstat3::NFS3_OK.pack(results).is_ok() && ok(results);
            debug_assert!(packed, "packing into a Vec cannot fail");
        };
        match self {
            Special::Link { file, dir, name } => {
                let attr = policy
                    .link(file, dir, OsStr::from_bytes(&name))
                    .await
                    .map_err(|e| nfsstat_logged("link", &e))?;
                let ok = LINK3resok {
                    file_attributes: Nfs3Option::Some(fattr(&attr)),
                    linkdir_wcc: unknown_change(),
                };
                pack(&mut results, &|r| ok.pack(r).is_ok());
            }
            Special::Mknod {
                dir,
                name,
                mode,
                rdev,
            } => {
                let attr: Attr = policy
                    .mknod(dir, OsStr::from_bytes(&name), mode, rdev, caller)
                    .await
                    .map_err(|e| nfsstat_logged("mknod", &e))?;
                let ok = MKNOD3resok {
                    obj: Nfs3Option::Some(nfs_fh3 {
                        data: Opaque::owned(handle(attr.ino)),
                    }),
                    obj_attributes: Nfs3Option::Some(fattr(&attr)),
                    dir_wcc: unknown_change(),
                };
                pack(&mut results, &|r| ok.pack(r).is_ok());
            }
            Special::BadType => return Err(nfsstat3::NFS3ERR_BADTYPE),
        }
        Ok(results)
    }
}

/// The permission bits MKNOD asks for, or the default.
fn mode_of(attrs: &sattr3) -> u32 {
    match attrs.mode {
        Nfs3Option::Some(mode) => mode & 0o7777,
        Nfs3Option::None => DEFAULT_MODE,
    }
}

/// A directory change whose attributes before and after are not told.
fn unknown_change() -> wcc_data {
    wcc_data {
        before: Nfs3Option::None,
        after: Nfs3Option::None,
    }
}
