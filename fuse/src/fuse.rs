//! The `fuser::Filesystem` implementation: a thin adapter over [`Policy`]. Each
//! handler hands its request to the runtime, so the request loop never waits, and
//! replies from there; errors become errno only through [`FsError::errno`].

use std::ffi::OsStr;
use std::future::Future;
use std::io;
use std::sync::Arc;

use fuser::{
    Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, IoctlFlags,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs, Request,
};
use stagefs_cache::{Remedy, Stager};
use stagefs_policy::{FsConfig, FsError, Keepalive, Policy, backing_file};
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

fn errno_logged(op: &'static str, e: &FsError, hint: Option<fn(Remedy) -> &'static str>) -> Errno {
    if e.is_expected() {
        debug!(op, error = %e);
    } else {
        warn!(op, error = %e.described(hint));
    }
    Errno::from_i32(e.errno())
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
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let ttl = self.policy.config().attr_ttl;
        let name = name.to_owned();
        self.serve(
            "lookup",
            |p| async move { p.lookup(parent.0, &name).await },
            move |r| match r {
                Ok(attr) => reply.entry(&ttl, &file_attr(&attr), Generation(0)),
                Err(e) => reply.error(e),
            },
        );
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let ttl = self.policy.config().attr_ttl;
        self.serve(
            "getattr",
            |p| async move { p.getattr(ino.0).await },
            move |r| match r {
                Ok(attr) => reply.attr(&ttl, &file_attr(&attr)),
                Err(e) => reply.error(e),
            },
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
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            reply.error(errno_logged("open", &FsError::ReadOnly, None));
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
                // across opens.
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
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing is ever written, so there is nothing to flush.
        reply.ok();
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
