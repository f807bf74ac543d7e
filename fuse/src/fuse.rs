//! The `fuser::Filesystem` implementation: a thin adapter over [`Policy`]. Each
//! handler hands its request to the runtime, so the request loop never waits, and
//! replies from there; errors become errno only through [`FsError::errno`].

use std::ffi::OsStr;
use std::future::Future;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    BsdFileFlags, Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use stagefs_control::Remedy;
use stagefs_policy::{
    Attr, Caller, FsConfig, FsError, Keepalive, Policy, RenameHow, SetAttr, backing_file,
};
use stagefs_source::{CreateFile, SetTime, WriteOpen};
use stagefs_stage::Stager;
use tokio::runtime::Handle;
use tracing::{debug, warn};

use crate::attr::{file_attr, file_type};
use crate::passthrough::Passthrough;
use crate::platform;

/// A mounted mirror of the stager's source.
#[derive(Debug)]
pub struct StageFs {
    policy: Arc<Policy>,
    passthrough: Arc<Passthrough>,
    runtime: Handle,
}

impl StageFs {
    /// A filesystem serving `stager`'s source; its work runs on `runtime`.
    pub fn new(stager: Stager, config: FsConfig, runtime: Handle) -> Self {
        let policy = Arc::new(Policy::new(stager, config, runtime.clone()));
        StageFs {
            passthrough: Arc::new(Passthrough::new(policy.kernel_passthrough())),
            policy,
            runtime,
        }
    }

    /// Runs `answer` on the runtime and hands its outcome, as an errno on failure,
    /// to `reply`.
    fn serve<T, A, R>(&self, op: &'static str, answer: impl FnOnce(Arc<Policy>) -> A, reply: R)
    where
        T: Send + 'static,
        A: Future<Output = Result<T, FsError>> + Send + 'static,
        R: FnOnce(Result<T, Errno>) + Send + 'static,
    {
        let answering = answer(Arc::clone(&self.policy));
        let hint = self.policy.config().hint;
        self.runtime.spawn(async move {
            reply(answering.await.map_err(|e| errno_logged(op, &e, hint)));
        });
    }
}

/// Answers a lookup, mkdir or symlink with the entry's attributes, or the errno.
fn entry_reply(reply: ReplyEntry, ttl: Duration) -> impl FnOnce(Result<Attr, Errno>) + Send {
    move |r| match r {
        Ok(attr) => reply.entry(&ttl, &file_attr(&attr), Generation(0)),
        Err(e) => reply.error(e),
    }
}

/// Answers a getattr or setattr with the attributes, or the errno.
fn attr_reply(reply: ReplyAttr, ttl: Duration) -> impl FnOnce(Result<Attr, Errno>) + Send {
    move |r| match r {
        Ok(attr) => reply.attr(&ttl, &file_attr(&attr)),
        Err(e) => reply.error(e),
    }
}

/// Answers a call with nothing to say but success, or the errno.
fn empty_reply(reply: ReplyEmpty) -> impl FnOnce(Result<(), Errno>) + Send {
    move |r| match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn set_time(time: TimeOrNow) -> SetTime {
    match time {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(match t.duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
            Err(e) => -i64::try_from(e.duration().as_nanos()).unwrap_or(i64::MAX),
        }),
    }
}

/// How an open's flags ask for writing: None for a read-only open. One that
/// truncates (`O_RDONLY | O_TRUNC`, which Linux honours) writes: with atomic O_TRUNC
/// the truncation is the open's to do.
fn write_open(flags: i32) -> Option<WriteOpen> {
    let truncate = flags & libc::O_TRUNC != 0;
    match flags & libc::O_ACCMODE {
        libc::O_RDONLY if !truncate => None,
        libc::O_RDONLY => Some(WriteOpen {
            read: true,
            truncate,
        }),
        libc::O_WRONLY => Some(WriteOpen {
            read: false,
            truncate,
        }),
        _ => Some(WriteOpen {
            read: true,
            truncate,
        }),
    }
}

fn errno_logged(op: &'static str, e: &FsError, hint: Option<fn(Remedy) -> &'static str>) -> Errno {
    if e.is_expected() {
        debug!(op, error = %e);
    } else {
        warn!(op, error = %e.described(hint));
    }
    Errno::from_i32(e.errno())
}

/// What a rename's flags ask for; None for what is not supported.
fn rename_how(flags: RenameFlags) -> Option<RenameHow> {
    #[cfg(target_os = "linux")]
    {
        let no_replace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let rest = flags.difference(RenameFlags::RENAME_NOREPLACE);
        rest.is_empty().then_some(RenameHow { no_replace })
    }
    #[cfg(not(target_os = "linux"))]
    {
        flags.is_empty().then_some(RenameHow::default())
    }
}

// The statvfs field types differ per platform (u32 block counts on macOS).
#[allow(clippy::unnecessary_cast)]
fn reply_statfs(reply: ReplyStatfs, st: &libc::statvfs) {
    reply.statfs(
        st.f_blocks as u64,
        st.f_bfree as u64,
        st.f_bavail as u64,
        st.f_files as u64,
        st.f_ffree as u64,
        st.f_bsize as u32,
        st.f_namemax as u32,
        st.f_frsize as u32,
    );
}

impl Filesystem for StageFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let policy = &self.policy;
        self.passthrough
            .negotiate(policy.config().passthrough, config);
        // The mount logged how it serves before mounting (`crate::read_path`).
        debug!(
            passthrough = policy
                .kernel_passthrough()
                .load(std::sync::atomic::Ordering::Relaxed),
            redirects = policy.redirects_enabled(),
            "FUSE init"
        );
        platform::tune_kernel(config);
        // An open with O_TRUNC then reaches `open` with the flag, instead of as an
        // open and then a setattr to size 0: a handle that empties its file starts
        // with it empty, and so is staged as it is written, like one that created it
        // (without this, `open(path, "wb")` over an existing file never was).
        let _ = config.add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let ttl = self.policy.config().attr_ttl;
        let name = name.to_owned();
        self.serve(
            "lookup",
            |p| async move { p.lookup(parent.0, &name).await },
            entry_reply(reply, ttl),
        );
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let ttl = self.policy.config().attr_ttl;
        self.serve(
            "getattr",
            |p| async move { p.getattr(ino.0).await },
            attr_reply(reply, ttl),
        );
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.serve(
            "readlink",
            |p| async move { p.readlink(ino.0).await },
            move |r| match r {
                Ok(target) => reply.data(&target),
                Err(e) => reply.error(e),
            },
        );
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if let Some(how) = write_open(flags.0) {
            // The kernel keeps no page cache of ours across a write open: the file is
            // the source's, as it is now.
            self.serve(
                "open",
                |p| async move { p.open_write(ino.0, how).await },
                move |r| match r {
                    Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
                    Err(e) => reply.error(e),
                },
            );
            return;
        }
        let policy = Arc::clone(&self.policy);
        let passthrough = Arc::clone(&self.passthrough);
        self.runtime.spawn(async move {
            let opened = match policy.open(ino.0).await {
                Ok(opened) => opened,
                Err(e) => return reply.error(errno_logged("open", &e, policy.config().hint)),
            };
            let backing = backing_file(&opened)
                .filter(|_| policy.config().passthrough)
                .and_then(|file| passthrough.backing(ino.0, file, &reply));
            let keep = backing.clone().map(|id| id as Keepalive);
            let fh = FileHandle(policy.register(opened, keep));
            match backing {
                // The kernel refuses any other open flag with passthrough (the page
                // cache is the backing file's own, kept across opens anyway).
                Some(id) => reply.opened_passthrough(fh, FopenFlags::empty(), &id),
                // An inode is one immutable version, so its page cache stays valid
                // across opens; one written through the mount follows its file, whose
                // pages the kernel must read again.
                None if policy.follows_its_file(ino.0) => reply.opened(fh, FopenFlags::empty()),
                None => reply.opened(fh, FopenFlags::FOPEN_KEEP_CACHE),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.serve(
            "read",
            |p| async move { p.read(fh.0, offset, size).await },
            move |r| match r {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(e),
            },
        );
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.policy.release(fh.0);
        reply.ok();
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Each close(2): the source's client may still hold what a handle wrote, so the
        // close waits for it to reach the source, and fails if it does not.
        // (No getlk/setlk: the kernel then keeps flock and fcntl locks itself, between
        // the processes of this machine, which is what filelock needs.)
        self.serve(
            "flush",
            |p| async move { p.flush(fh.0).await },
            empty_reply(reply),
        );
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.serve(
            "fsync",
            |p| async move { p.fsync(fh.0, datasync).await },
            empty_reply(reply),
        );
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let data = data.to_vec();
        self.serve(
            "write",
            |p| async move { p.write(fh.0, offset, data).await },
            move |r| match r {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(e),
            },
        );
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let ttl = self.policy.config().attr_ttl;
        let how = CreateFile {
            mode: mode & !umask & 0o7777,
            exclusive: flags & libc::O_EXCL != 0,
            open: write_open(flags).unwrap_or(WriteOpen {
                read: true,
                truncate: false,
            }),
        };
        let (name, caller) = (name.to_owned(), caller(req));
        self.serve(
            "create",
            |p| async move { p.create(parent.0, &name, how, caller).await },
            move |r| match r {
                Ok((attr, fh)) => reply.created(
                    &ttl,
                    &file_attr(&attr),
                    Generation(0),
                    FileHandle(fh),
                    FopenFlags::empty(),
                ),
                Err(e) => reply.error(e),
            },
        );
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let ttl = self.policy.config().attr_ttl;
        let change = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
        };
        self.serve(
            "setattr",
            |p| async move { p.setattr(ino.0, fh.map(|f| f.0), change).await },
            attr_reply(reply, ttl),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let ttl = self.policy.config().attr_ttl;
        let (name, caller, mode) = (name.to_owned(), caller(req), mode & !umask & 0o7777);
        self.serve(
            "mkdir",
            |p| async move { p.mkdir(parent.0, &name, mode, caller).await },
            entry_reply(reply, ttl),
        );
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let ttl = self.policy.config().attr_ttl;
        let (name, target, caller) = (link_name.to_owned(), target.to_owned(), caller(req));
        self.serve(
            "symlink",
            |p| async move { p.symlink(parent.0, &name, &target, caller).await },
            entry_reply(reply, ttl),
        );
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let ttl = self.policy.config().attr_ttl;
        let name = newname.to_owned();
        self.serve(
            "link",
            |p| async move { p.link(ino.0, newparent.0, &name).await },
            entry_reply(reply, ttl),
        );
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let ttl = self.policy.config().attr_ttl;
        // The type bits stay; the umask narrows only the permissions.
        let mode = mode & !(umask & 0o7777);
        let (name, caller) = (name.to_owned(), caller(req));
        self.serve(
            "mknod",
            |p| async move {
                p.mknod(parent.0, &name, mode, u64::from(rdev), caller)
                    .await
            },
            entry_reply(reply, ttl),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.to_owned();
        self.serve(
            "unlink",
            |p| async move { p.unlink(parent.0, &name).await },
            empty_reply(reply),
        );
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.to_owned();
        self.serve(
            "rmdir",
            |p| async move { p.rmdir(parent.0, &name).await },
            empty_reply(reply),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let Some(how) = rename_how(flags) else {
            // RENAME_EXCHANGE and RENAME_WHITEOUT are not passed on.
            reply.error(Errno::EINVAL);
            return;
        };
        let (name, newname) = (name.to_owned(), newname.to_owned());
        self.serve(
            "rename",
            |p| async move { p.rename(parent.0, &name, newparent.0, &newname, how).await },
            empty_reply(reply),
        );
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        // Callers probe files with ioctls (isatty's TCGETS); a plain file answers ENOTTY.
        reply.error(Errno::ENOTTY);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.serve(
            "opendir",
            |p| async move { p.opendir(ino.0).await },
            move |r| match r {
                Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
                Err(e) => reply.error(e),
            },
        );
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listing = match self.policy.listing(fh.0) {
            Ok(listing) => listing,
            Err(e) => return reply.error(errno_logged("readdir", &e, self.policy.config().hint)),
        };
        let dots = [(listing.dir, "."), (listing.parent, "..")]
            .map(|(ino, name)| (ino, FileType::Directory, OsStr::new(name)));
        let entries = listing
            .entries
            .iter()
            .map(|e| (e.attr.ino, file_type(e.attr.kind), e.name.as_os_str()));
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, (ino, kind, name)) in dots.into_iter().chain(entries).enumerate().skip(start) {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.policy.releasedir(fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.serve(
            "statfs",
            |p| async move { p.statfs().await },
            move |r| match r {
                Ok(st) => reply_statfs(reply, &st),
                Err(e) => reply.error(e),
            },
        );
    }
}
