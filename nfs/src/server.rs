//! The NFS procedures, translated to the policy's calls. Nothing here decides what a
//! file is or when it is staged: LOOKUP, GETATTR and READDIRPLUS ask the policy for
//! attributes (which never stages), READ opens through [`Reads`] (which stages),
//! WRITE writes through a handle of [`Writes`], every other change is the policy's
//! write path, and every error becomes a status in [`crate::status`].
//!
//! Coherence: every change to a file through NFS (WRITE, a SETATTR of its size or
//! mtime, a RENAME over it, its REMOVE) forgets its READ handle, before and after the
//! change, so neither the library nor the connection front (which answers READs of
//! handles [`Reads`] holds) serves the old version's copy again. While a write
//! handle is open, READs of its file read through it, from the source.
//!
//! The library calls REMOVE and RMDIR alike ([`NfsFileSystem::remove`]): the entry's
//! kind decides which the policy is asked for. It also passes no credentials to the
//! filesystem, so changes are made as the serving user (new entries are theirs; a
//! server run by root serves root alone, so root's), and MKDIR's attributes never
//! reach it: a directory is made 0755.
//!
//! An exclusive CREATE (`open(O_CREAT|O_EXCL)` on a Mac or on Linux) is an `O_EXCL`
//! create on the source, so of two creators racing for one name exactly one
//! succeeds. Its file is made 0644 (the library passes it no attributes; clients
//! send the mode in a SETATTR right after). Its verifier is kept in memory with the
//! file made (`Verifiers`, `exclusive.rs`), not in the file's times, which a source
//! of any kind may not keep exactly: the same CREATE sent again gets that file, one
//! with another verifier `NFS3ERR_EXIST`. (It answered `NFS3ERR_NOTSUPP` before,
//! after which macOS's client creates UNCHECKED, which is not atomic: Apple's
//! nfs_vnops.c.)

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::Duration;

use std::path::Path;

use nfs3_server::nfs3_types::nfs3::{
    Nfs3Option, createverf3, fattr3, filename3, nfspath3, nfsstat3, nfstime3, sattr3, set_atime,
    set_mtime, stable_how,
};
use nfs3_server::nfs3_types::rpc::auth_unix;
use nfs3_server::vfs::{
    DirEntryPlus, NextResult, NfsFileSystem, NfsReadFileSystem, ReadDirPlusIterator,
    VFSCapabilities,
};
use stagefs_policy::{Caller, DirEntry, FsError, Policy, ROOT_INO, RenameHow, SetAttr};
use stagefs_source::{CreateFile, EntryKind, SetTime, WriteOpen};

use crate::access::serving_caller;
use crate::attrs::fattr;
use crate::exclusive::Verifiers;
use crate::handle::NodeHandle;
use crate::intents::{Intent, Intents};
use crate::reads::{ReadCall, Reads};
use crate::status::nfsstat_logged;
use crate::writes::Writes;

/// The mode of a file CREATE gives none.
const DEFAULT_FILE_MODE: u32 = 0o644;
/// The mode of a directory MKDIR gives none (the front notes the one it gives:
/// `intents.rs`).
const DIR_MODE: u32 = 0o755;

/// An NFS export of a policy's source (read-only when the policy is).
#[derive(Debug)]
pub struct StageNfs {
    policy: Arc<Policy>,
    reads: Arc<Reads>,
    writes: Arc<Writes>,
    /// What the library drops of MKDIR and RMDIR calls, noted by the front.
    intents: Arc<Intents>,
    /// The verifiers of the exclusive CREATEs made lately.
    verifiers: Verifiers,
    /// The user the export serves (besides root).
    owner: u32,
}

impl StageNfs {
    /// An export of `policy`'s mount, served to `owner` (and root) alone.
    pub fn new(policy: Arc<Policy>, owner: u32) -> StageNfs {
        StageNfs {
            policy,
            reads: Arc::default(),
            writes: Arc::default(),
            intents: Arc::default(),
            verifiers: Verifiers::default(),
            owner,
        }
    }

    /// The files open for reads.
    pub fn reads(&self) -> &Arc<Reads> {
        &self.reads
    }

    /// The files open for writes.
    pub fn writes(&self) -> &Arc<Writes> {
        &self.writes
    }

    /// Where the front notes what the library drops of a call.
    pub(crate) fn intents(&self) -> &Arc<Intents> {
        &self.intents
    }

    /// Who the policy is told makes a change ([`serving_caller`]).
    fn caller(&self) -> Caller {
        serving_caller(self.owner)
    }

    /// The inode `name` in `dir` names now, if any.
    async fn child_ino(&self, dir: &NodeHandle, name: &OsStr) -> Result<(u64, bool), FsError> {
        let attr = self.policy.lookup(dir.ino(), name).await?;
        Ok((attr.ino, attr.kind == EntryKind::Dir))
    }

    /// The file an exclusive CREATE with `verifier` made as `name` in `dir`, if it
    /// did lately and `name` names it still.
    async fn made_by(
        &self,
        dir: &NodeHandle,
        name: &OsStr,
        verifier: createverf3,
    ) -> Option<NodeHandle> {
        let made = self
            .verifiers
            .made_with(dir.ino(), name.as_bytes(), verifier.0)?;
        let (named, _) = self.child_ino(dir, name).await.ok()?;
        (named == made).then(|| NodeHandle::of(made))
    }

    /// Forgets what is open of `ino` before a change that replaces or removes it:
    /// its READ handle, and its write handle unless a WRITE is using it.
    fn let_go(&self, ino: u64) {
        self.writes.close(&self.policy, ino);
        self.reads.forget(&self.policy, ino);
    }

    fn attr_ttl(&self) -> Duration {
        self.policy.config().attr_ttl
    }

    /// Reads `count` bytes at `offset` of the file `ino` opened, reopening once if
    /// its handle was closed for idleness between the open and the read.
    async fn read_open(
        &self,
        ino: u64,
        offset: u64,
        count: u32,
    ) -> Result<(Vec<u8>, bool), nfsstat3> {
        if let Some(writing) = self.writes.open_now(ino) {
            // Being written: from the source, through the writer's handle.
            let data = self
                .policy
                .read(writing.fh, offset, count)
                .await
                .map_err(|e| nfsstat_logged("read", &e))?;
            let eof = (data.len() as u64) < u64::from(count);
            return Ok((data, eof));
        }
        for _ in 0..2 {
            let call = ReadCall { ino, offset, count };
            let open = self.reads.open(&self.policy, call).await?;
            match self.policy.read(open.fh, offset, count).await {
                Ok(data) => {
                    let eof = offset.saturating_add(data.len() as u64) >= open.size;
                    return Ok((data, eof));
                }
                Err(FsError::UnknownHandle(_)) => self.reads.forget(&self.policy, ino),
                Err(e) => return Err(nfsstat_logged("read", &e)),
            }
        }
        crate::jukebox::answered(&self.policy);
        Err(nfsstat3::NFS3ERR_JUKEBOX)
    }
}

impl NfsReadFileSystem for StageNfs {
    type Handle = NodeHandle;

    fn root_dir(&self) -> NodeHandle {
        NodeHandle::of(ROOT_INO)
    }

    /// AUTH_UNIX calls of the serving user or root; nothing else (AUTH_NULL would be
    /// served as root by the server library). A NULL ping never gets here: the
    /// front answers it for any credentials.
    fn authorize(&self, auth: Option<&auth_unix>) -> bool {
        auth.is_some_and(|auth| crate::access::serves(self.owner, auth))
    }

    async fn lookup(&self, dir: &NodeHandle, name: &filename3<'_>) -> Result<NodeHandle, nfsstat3> {
        let name = OsStr::from_bytes(name.0.as_ref());
        let found = match name.as_bytes() {
            b"." => self.policy.getattr(dir.ino()).await.map(|a| a.ino),
            b".." => self.policy.parent_of(dir.ino()),
            _ => self.policy.lookup(dir.ino(), name).await.map(|a| a.ino),
        };
        found
            .map(NodeHandle::of)
            .map_err(|e| nfsstat_logged("lookup", &e))
    }

    async fn getattr(&self, id: &NodeHandle) -> Result<fattr3, nfsstat3> {
        // Asked before every READ: from memory while the source's answer is fresh.
        self.policy
            .getattr_within(id.ino(), self.attr_ttl())
            .await
            .map(|attr| fattr(&attr))
            .map_err(|e| nfsstat_logged("getattr", &e))
    }

    async fn read(
        &self,
        id: &NodeHandle,
        offset: u64,
        count: u32,
    ) -> Result<(Vec<u8>, bool), nfsstat3> {
        self.read_open(id.ino(), offset, count).await
    }

    async fn readdirplus(
        &self,
        dir: &NodeHandle,
        cookie: u64,
    ) -> Result<impl ReadDirPlusIterator<NodeHandle>, nfsstat3> {
        let mut entries = self
            .policy
            .list(dir.ino())
            .await
            .map_err(|e| nfsstat_logged("readdirplus", &e))?;
        // Cookies are positions, so the order must not change between pages.
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Page {
            entries,
            next: usize::try_from(cookie).unwrap_or(usize::MAX),
        })
    }

    async fn readlink(&self, id: &NodeHandle) -> Result<nfspath3<'_>, nfsstat3> {
        self.policy
            .readlink(id.ino())
            .await
            .map(nfspath3::from)
            .map_err(|e| nfsstat_logged("readlink", &e))
    }
}

impl NfsFileSystem for StageNfs {
    /// Read-only when the policy is: the library then answers every change
    /// `NFS3ERR_ROFS` itself, and ACCESS grants no writes.
    fn capabilities(&self) -> VFSCapabilities {
        if self.policy.config().read_only {
            VFSCapabilities::ReadOnly
        } else {
            VFSCapabilities::ReadWrite
        }
    }

    async fn setattr(&self, id: &NodeHandle, setattr: sattr3) -> Result<fattr3, nfsstat3> {
        let ino = id.ino();
        let change = set_attr(&setattr);
        let versioned = change.size.is_some() || change.mtime.is_some();
        // A new size goes through the file's write handle, if it has one, so the copy
        // it stages follows.
        let writing = change.size.and_then(|_| self.writes.open_now(ino));
        if versioned {
            self.reads.forget(&self.policy, ino);
        }
        let attr = self
            .policy
            .setattr(ino, writing.as_ref().map(|w| w.fh), change)
            .await
            .map_err(|e| nfsstat_logged("setattr", &e));
        if versioned {
            self.reads.forget(&self.policy, ino);
        }
        attr.map(|attr| fattr(&attr))
    }

    async fn write(
        &self,
        id: &NodeHandle,
        offset: u64,
        data: &[u8],
        stable: stable_how,
    ) -> Result<(fattr3, stable_how), nfsstat3> {
        let ino = id.ino();
        let writing = self
            .writes
            .open(&self.policy, ino)
            .await
            .map_err(|e| nfsstat_logged("write", &e))?;
        // From here on a READ of it reads through the write handle.
        self.reads.forget(&self.policy, ino);
        let written = self.policy.write(writing.fh, offset, data.to_vec()).await;
        self.reads.forget(&self.policy, ino);
        written.map_err(|e| nfsstat_logged("write", &e))?;
        // Each WRITE is answered once the source has it; the server keeps nothing
        // back, so a restart of it loses nothing either (the write verifier may stay
        // the inode journal's generation). A sync only where asked for.
        let committed = match stable {
            stable_how::UNSTABLE => stable_how::UNSTABLE,
            how => {
                self.policy
                    .fsync(writing.fh, how == stable_how::DATA_SYNC)
                    .await
                    .map_err(|e| nfsstat_logged("write", &e))?;
                how
            }
        };
        let attr = self
            .policy
            .getattr(ino)
            .await
            .map_err(|e| nfsstat_logged("write", &e))?;
        Ok((fattr(&attr), committed))
    }

    async fn create(
        &self,
        dirid: &NodeHandle,
        filename: &filename3<'_>,
        attr: sattr3,
    ) -> Result<(NodeHandle, fattr3), nfsstat3> {
        let name = OsStr::from_bytes(filename.0.as_ref());
        let mode = match attr.mode {
            Nfs3Option::Some(mode) => mode & 0o7777,
            Nfs3Option::None => DEFAULT_FILE_MODE,
        };
        let truncate = matches!(attr.size, Nfs3Option::Some(0));
        let how = CreateFile {
            mode,
            exclusive: false,
            open: WriteOpen {
                read: true,
                truncate,
            },
        };
        let (created, fh) = self
            .policy
            .create(dirid.ino(), name, how, self.caller())
            .await
            .map_err(|e| nfsstat_logged("create", &e))?;
        // CREATE is the file's OPEN: its WRITEs go through this handle, which stages
        // the file as it is written.
        self.writes.adopt(&self.policy, created.ino, fh);
        self.reads.forget(&self.policy, created.ino);
        Ok((NodeHandle::of(created.ino), fattr(&created)))
    }

    async fn create_exclusive(
        &self,
        dirid: &NodeHandle,
        filename: &filename3<'_>,
        createverf: createverf3,
    ) -> Result<NodeHandle, nfsstat3> {
        let name = OsStr::from_bytes(filename.0.as_ref());
        let how = CreateFile {
            // The library passes no attributes: the client sets them next.
            mode: DEFAULT_FILE_MODE,
            exclusive: true,
            open: WriteOpen {
                read: true,
                truncate: false,
            },
        };
        let stat = match self
            .policy
            .create(dirid.ino(), name, how, self.caller())
            .await
        {
            Ok((created, fh)) => {
                let (dir, verifier) = (dirid.ino(), createverf.0);
                self.verifiers
                    .made(dir, name.as_bytes(), verifier, created.ino);
                // As CREATE's (see `create`): this is the file's OPEN.
                self.writes.adopt(&self.policy, created.ino, fh);
                self.reads.forget(&self.policy, created.ino);
                return Ok(NodeHandle::of(created.ino));
            }
            Err(e) => nfsstat_logged("create", &e),
        };
        if stat != nfsstat3::NFS3ERR_EXIST {
            return Err(stat);
        }
        // The same CREATE sent again gets the file it made.
        self.made_by(dirid, name, createverf).await.ok_or(stat)
    }

    async fn mkdir(
        &self,
        dirid: &NodeHandle,
        dirname: &filename3<'_>,
    ) -> Result<(NodeHandle, fattr3), nfsstat3> {
        let name = OsStr::from_bytes(dirname.0.as_ref());
        let mode = match self.intents.take(dirid.ino(), name.as_bytes()) {
            Some(Intent::Mkdir(Some(mode))) => mode,
            _ => DIR_MODE,
        };
        self.policy
            .mkdir(dirid.ino(), name, mode, self.caller())
            .await
            .map(|attr| (NodeHandle::of(attr.ino), fattr(&attr)))
            .map_err(|e| nfsstat_logged("mkdir", &e))
    }

    async fn remove(&self, dirid: &NodeHandle, filename: &filename3<'_>) -> Result<(), nfsstat3> {
        let name = OsStr::from_bytes(filename.0.as_ref());
        let (ino, is_dir) = self
            .child_ino(dirid, name)
            .await
            .map_err(|e| nfsstat_logged("remove", &e))?;
        // The library sends RMDIR here too: the call, not the entry, says which.
        match self.intents.take(dirid.ino(), name.as_bytes()) {
            Some(Intent::Rmdir) if !is_dir => return Err(nfsstat3::NFS3ERR_NOTDIR),
            Some(Intent::Remove) if is_dir => return Err(nfsstat3::NFS3ERR_ISDIR),
            _ => {}
        }
        self.let_go(ino);
        let removed = if is_dir {
            self.policy.rmdir(dirid.ino(), name).await
        } else {
            self.policy.unlink(dirid.ino(), name).await
        };
        self.reads.forget(&self.policy, ino);
        removed.map_err(|e| nfsstat_logged("remove", &e))
    }

    async fn rename<'a>(
        &self,
        from_dirid: &NodeHandle,
        from_filename: &filename3<'a>,
        to_dirid: &NodeHandle,
        to_filename: &filename3<'a>,
    ) -> Result<(), nfsstat3> {
        let from = OsStr::from_bytes(from_filename.0.as_ref());
        let to = OsStr::from_bytes(to_filename.0.as_ref());
        let (moved, _) = self
            .child_ino(from_dirid, from)
            .await
            .map_err(|e| nfsstat_logged("rename", &e))?;
        // Closed first, so a file written under a temp name (huggingface_hub's
        // `blobs/<sha>.incomplete`) has its copy committed at the rename.
        self.writes.close(&self.policy, moved);
        let replaced = self.child_ino(to_dirid, to).await.ok().map(|(ino, _)| ino);
        if let Some(replaced) = replaced.filter(|&ino| ino != moved) {
            self.let_go(replaced);
        }
        let renamed = self
            .policy
            .rename(
                from_dirid.ino(),
                from,
                to_dirid.ino(),
                to,
                RenameHow::default(),
            )
            .await;
        if let Some(replaced) = replaced.filter(|&ino| ino != moved) {
            self.reads.forget(&self.policy, replaced);
        }
        renamed.map_err(|e| nfsstat_logged("rename", &e))
    }

    async fn symlink<'a>(
        &self,
        dirid: &NodeHandle,
        linkname: &filename3<'a>,
        symlink: &nfspath3<'a>,
        _attr: &sattr3,
    ) -> Result<(NodeHandle, fattr3), nfsstat3> {
        let name = OsStr::from_bytes(linkname.0.as_ref());
        let target = Path::new(OsStr::from_bytes(symlink.0.as_ref()));
        self.policy
            .symlink(dirid.ino(), name, target, self.caller())
            .await
            .map(|attr| (NodeHandle::of(attr.ino), fattr(&attr)))
            .map_err(|e| nfsstat_logged("symlink", &e))
    }

    async fn commit(&self, id: &NodeHandle, _offset: u64, _count: u32) -> Result<(), nfsstat3> {
        if self.policy.config().read_only {
            return Err(nfsstat3::NFS3ERR_ROFS);
        }
        // The whole file is synced, whatever the range. A handle closed for idleness
        // since its WRITEs is opened again for it (without truncating).
        let writing = self
            .writes
            .open(&self.policy, id.ino())
            .await
            .map_err(|e| nfsstat_logged("commit", &e))?;
        self.policy
            .fsync(writing.fh, false)
            .await
            .map_err(|e| nfsstat_logged("commit", &e))
    }
}

/// A SETATTR's changes as the policy's.
fn set_attr(s: &sattr3) -> SetAttr {
    fn opt<
        T: Copy
            + nfs3_server::nfs3_types::xdr_codec::Pack
            + nfs3_server::nfs3_types::xdr_codec::Unpack,
    >(
        o: &Nfs3Option<T>,
    ) -> Option<T> {
        match o {
            Nfs3Option::Some(v) => Some(*v),
            Nfs3Option::None => None,
        }
    }
    fn at(t: nfstime3) -> SetTime {
        SetTime::At(i64::from(t.seconds) * 1_000_000_000 + i64::from(t.nseconds))
    }
    SetAttr {
        mode: opt(&s.mode).map(|m| m & 0o7777),
        uid: opt(&s.uid),
        gid: opt(&s.gid),
        size: opt(&s.size),
        atime: match s.atime {
            set_atime::DONT_CHANGE => None,
            set_atime::SET_TO_SERVER_TIME => Some(SetTime::Now),
            set_atime::SET_TO_CLIENT_TIME(t) => Some(at(t)),
        },
        mtime: match s.mtime {
            set_mtime::DONT_CHANGE => None,
            set_mtime::SET_TO_SERVER_TIME => Some(SetTime::Now),
            set_mtime::SET_TO_CLIENT_TIME(t) => Some(at(t)),
        },
    }
}

/// A listing handed out from entry `next` on; entry i's cookie is i + 1.
struct Page {
    entries: Vec<DirEntry>,
    next: usize,
}

impl ReadDirPlusIterator<NodeHandle> for Page {
    async fn next(&mut self) -> NextResult<DirEntryPlus<NodeHandle>> {
        let Some(entry) = self.entries.get(self.next) else {
            return NextResult::Eof;
        };
        self.next += 1;
        NextResult::Ok(DirEntryPlus {
            fileid: entry.attr.ino,
            name: filename3::from(entry.name.as_bytes().to_vec()),
            cookie: self.next as u64,
            name_attributes: Some(fattr(&entry.attr)),
            name_handle: Some(NodeHandle::of(entry.attr.ino)),
        })
    }
}
