//! The NFS procedures, translated to the policy's calls. Nothing here decides what a
//! file is or when it is staged: LOOKUP, GETATTR and READDIRPLUS ask the policy for
//! attributes (which never stages), READ opens through [`Reads`] (which stages), and
//! every error becomes a status in [`crate::status`].

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::Duration;

use nfs3_server::nfs3_types::nfs3::{fattr3, filename3, nfspath3, nfsstat3};
use nfs3_server::nfs3_types::rpc::auth_unix;
use nfs3_server::vfs::{DirEntryPlus, NextResult, NfsReadFileSystem, ReadDirPlusIterator};
use stagefs_policy::{DirEntry, FsError, Policy, ROOT_INO};

use crate::attrs::fattr;
use crate::handle::NodeHandle;
use crate::reads::{HOLD, Reads};
use crate::status::nfsstat_logged;

/// A read-only NFS export of a policy's source.
#[derive(Debug)]
pub struct StageNfs {
    policy: Arc<Policy>,
    reads: Arc<Reads>,
    /// The user the export serves (besides root).
    owner: u32,
}

impl StageNfs {
    /// An export of `policy`'s mount, served to `owner` (and root) alone.
    pub fn new(policy: Arc<Policy>, owner: u32) -> StageNfs {
        StageNfs {
            policy,
            reads: Arc::default(),
            owner,
        }
    }

    /// The files open for reads.
    pub fn reads(&self) -> &Arc<Reads> {
        &self.reads
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
        for _ in 0..2 {
            let open = self.reads.open(&self.policy, ino, HOLD).await?;
            match self.policy.read(open.fh, offset, count).await {
                Ok(data) => {
                    let eof = offset.saturating_add(data.len() as u64) >= open.size;
                    return Ok((data, eof));
                }
                Err(FsError::UnknownHandle(_)) => self.reads.forget(&self.policy, ino),
                Err(e) => return Err(nfsstat_logged("read", &e)),
            }
        }
        Err(nfsstat3::NFS3ERR_JUKEBOX)
    }
}

impl NfsReadFileSystem for StageNfs {
    type Handle = NodeHandle;

    fn root_dir(&self) -> NodeHandle {
        NodeHandle::of(ROOT_INO)
    }

    /// AUTH_UNIX calls of the serving user or root; nothing else (AUTH_NULL would be
    /// served as root by the server library).
    fn authorize(&self, auth: Option<&auth_unix>) -> bool {
        auth.is_some_and(|auth| crate::front::serves(self.owner, auth))
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
