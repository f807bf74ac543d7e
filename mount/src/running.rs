//! A live mount served by this process: started, served, stopped, through either
//! backend (FUSE, or the loopback NFS server and the system's NFS client).

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fuser::SessionUnmounter;
use stagefs_control::{Backend, MountRecord, SourceFs, Stopping};
use stagefs_fuse::StageFs;
use stagefs_nfs::Serving;
use stagefs_policy::{FsConfig, Policy, ReadPath};
use stagefs_stage::{MetricsSnapshot, Stager, StagerOptions};
use stagefs_store::{Store, StoreError};
use tokio::runtime::Runtime;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::control::StopPhase;
use crate::{MountError, MountSpec, control, source_record};

/// How long [`Running::stop`] waits for the kernel to let go of the mount before
/// giving up.
const STOP_WAIT: Duration = Duration::from_secs(15);

/// How often a busy mount that cannot be detached (macOS) tries its unmount again.
const BUSY_RETRY: Duration = Duration::from_secs(1);

/// What the daemon logs when it stops while files are open in its mount.
const DETACHED_BUSY: &str =
    "mount busy (files open): detached; serving open files until they are closed";

/// How long an unmount waits for the runtime's tasks and workers to finish.
const WORKERS_WAIT: Duration = Duration::from_secs(2);

/// How often an NFS mount checks that it is still mounted.
const NFS_MOUNT_WATCH: Duration = Duration::from_secs(1);

/// Whether this build cannot mount FUSE: macOS without macFUSE (`no-macfuse`), where
/// fuser's mount only fails with a message meant for its own tests.
const FUSE_NOT_BUILT: bool = cfg!(all(target_os = "macos", feature = "no-macfuse"));

/// Where the NFS backend keeps its inode numbers (and so its file handles) across
/// restarts, in the cache directory.
const NFS_INODE_JOURNAL: &str = "nfs-inodes.jsonl";

/// A live mount served by this process. The FUSE session serves on a thread of its
/// own (the NFS server on the worker runtime) and the control socket on the mount's
/// worker runtime, so the process that started it may read through it. Stop it with
/// [`Running::stop`] or serve until the end with [`Running::wait`]; dropping it
/// leaves the mount in place.
pub struct Running {
    runtime: Runtime,
    session: Session,
    stager: Stager,
    socket: PathBuf,
    mountpoint: PathBuf,
    cache_dir: PathBuf,
    /// Told to the control socket, so that status says a stopping mount is one.
    stop_phase: StopPhase,
}

/// What serves the kernel.
enum Session {
    Fuse {
        unmounter: SessionUnmounter,
        done: oneshot::Receiver<std::io::Result<()>>,
    },
    /// The NFS server, and whether this process mounted it at `mountpoint`.
    Nfs { serving: Serving, mounted: bool },
}

impl Running {
    /// Checks the spec ([`MountSpec::check`], which clears a stale mount), creates
    /// the cache directory, opens the store (holding its lock), records the mount,
    /// mounts with the spec's backend and starts the control socket; returns once the
    /// mount point serves the source (FUSE: the kernel completed its handshake; NFS:
    /// the system's NFS client mounted the export).
    pub fn start(spec: &MountSpec) -> Result<Running, MountError> {
        if spec.backend == Backend::Fuse && FUSE_NOT_BUILT {
            return Err(MountError::FuseNotBuilt);
        }
        let _ = spec.check()?;
        match spec.backend {
            Backend::Fuse => Self::start_fuse(spec),
            Backend::Nfs => Self::start_nfs(spec, true),
        }
    }

    /// Serves the NFS export of `spec`'s source without mounting it (`stagefs
    /// serve`): the source and the cache are checked, the mount point is not used.
    pub fn serve_nfs(spec: &MountSpec) -> Result<Running, MountError> {
        spec.check_source_and_cache()?;
        Self::start_nfs(spec, false)
    }

    /// The NFS export's libnfs URL, for a mount served over NFS.
    pub fn nfs_url(&self) -> Option<String> {
        match &self.session {
            Session::Nfs { serving, .. } => Some(serving.url()),
            Session::Fuse { .. } => None,
        }
    }

    fn runtime() -> Result<Runtime, MountError> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("stagefs-worker")
            .enable_all()
            .build()
            .map_err(|e| MountError::io("starting the worker runtime", e))
    }

    fn start_nfs(spec: &MountSpec, mount: bool) -> Result<Running, MountError> {
        spec.create_cache_dir()?;
        let runtime = Self::runtime()?;
        let stager = open_stager(spec, &runtime)?;
        let journal = spec.cache_dir.join(NFS_INODE_JOURNAL);
        let policy = Policy::with_inode_journal(
            stager.clone(),
            nfs_config(&spec.fs),
            runtime.handle().clone(),
            &journal,
        )
        .map_err(|e| MountError::io(format!("opening {}", journal.display()), e))?;
        // SAFETY: geteuid has no preconditions.
        let owner = unsafe { libc::geteuid() };
        let serving = runtime
            .block_on(stagefs_nfs::serve(Arc::new(policy), spec.nfs_listen, owner))
            .map_err(|e| MountError::io(format!("serving NFS at {}", spec.nfs_listen), e))?;
        let export = serving.url();
        if mount
            && let Err(e) = stagefs_nfs::kernel_mount::mount(
                serving.addr.port(),
                &spec.mountpoint,
                spec.fs.read_only,
            )
        {
            serving.stop();
            return Err(MountError::io(
                format!("mounting the NFS export at {}", spec.mountpoint.display()),
                e,
            ));
        }
        let running = Running {
            runtime,
            session: Session::Nfs {
                serving,
                mounted: mount,
            },
            stager: stager.clone(),
            socket: stagefs_control::socket_path(&spec.cache_dir),
            mountpoint: spec.mountpoint.clone(),
            cache_dir: spec.cache_dir.clone(),
            stop_phase: StopPhase::default(),
        };
        let read_path = match nfs_config(&spec.fs).nfs_links_allowed() {
            true => ReadPath::NfsLinks,
            false => ReadPath::NfsServer,
        };
        let serving = format!("staged files are {}", read_path.describe());
        running.start_control(spec, stager, Some(export), serving)
    }

    fn start_fuse(spec: &MountSpec) -> Result<Running, MountError> {
        // Decided before mounting: passthrough only where it is known to work.
        let (read_path, _) = stagefs_fuse::read_path(&spec.fs);
        let serving = stagefs_fuse::describe_read_path(&spec.fs);
        let mut spec = spec.clone();
        spec.fs.passthrough = read_path == ReadPath::Passthrough;
        let spec = &spec;
        spec.create_cache_dir()?;
        let runtime = Self::runtime()?;
        let stager = open_stager(spec, &runtime)?;
        let fs = StageFs::new(stager.clone(), spec.fs.clone(), runtime.handle().clone());
        let mut session = fuser::Session::new(
            fs,
            &spec.mountpoint,
            &stagefs_fuse::session_config(&spec.fs, &spec.source),
        )
        .map_err(|e| MountError::io(format!("mounting at {}", spec.mountpoint.display()), e))?;
        let unmounter = session.unmount_callable();
        let (done_tx, done) = oneshot::channel();
        std::thread::Builder::new()
            .name("stagefs-fuse".into())
            .spawn(move || {
                let _ = done_tx.send(session.run());
            })
            .map_err(|e| MountError::io("starting the request loop", e))?;
        let running = Running {
            runtime,
            session: Session::Fuse { unmounter, done },
            stager: stager.clone(),
            socket: stagefs_control::socket_path(&spec.cache_dir),
            mountpoint: spec.mountpoint.clone(),
            cache_dir: spec.cache_dir.clone(),
            stop_phase: StopPhase::default(),
        };
        running.start_control(spec, stager, None, serving)
    }

    /// Starts the control socket; without it the mount could never be asked or
    /// stopped by name, so a mount whose socket fails is taken down again.
    fn start_control(
        self,
        spec: &MountSpec,
        stager: Stager,
        export: Option<String>,
        serving: String,
    ) -> Result<Running, MountError> {
        let bound = self
            .runtime
            .block_on(control::bind(&self.socket, spec, stager, export));
        match bound {
            Ok(mut server) => {
                server.read_path = serving.clone();
                server.stop_phase = self.stop_phase.clone();
                self.runtime.spawn(server.serve())
            }
            Err(e) => {
                let _ = self.stop();
                return Err(e);
            }
        };
        // `stagefs serve` mounts nothing: there is no mount point to find it by.
        if !spec.mountpoint.as_os_str().is_empty()
            && let Err(e) = crate::registry::add(&spec.mountpoint, &spec.cache_dir)
        {
            warn!(error = %e, mountpoint = %spec.mountpoint.display(), "could not record the mount for commands run without --cache-dir");
        }
        match spec.mountpoint.as_os_str().is_empty() {
            true => {
                info!(source = %spec.source.display(), cache = %spec.cache_dir.display(), backend = %spec.backend, "serving, not mounted")
            }
            false => {
                info!(source = %spec.source.display(), mountpoint = %spec.mountpoint.display(), cache = %spec.cache_dir.display(), backend = %spec.backend, "mounted")
            }
        }
        info!("{serving}");
        Ok(self)
    }

    /// The mount's counters so far.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.stager.metrics().snapshot()
    }

    /// Where it is mounted.
    pub fn mountpoint(&self) -> &std::path::Path {
        &self.mountpoint
    }

    /// Serves until the mount goes away (unmounted from outside) or the process is
    /// asked to stop (SIGINT, SIGTERM), then stops. A mount that is busy then (files
    /// open or mapped, a working directory inside) is detached and served until the
    /// kernel lets go of it, so no reader is cut off; a second signal stops at once.
    pub fn wait(mut self) -> Result<(), MountError> {
        let mountpoint = self.mountpoint.clone();
        let mut signals = {
            let _guard = self.runtime.enter();
            StopSignals::new()
        };
        let ended = match &mut self.session {
            Session::Fuse { done, .. } => self.runtime.block_on(async {
                tokio::select! {
                    result = done => Some(result),
                    () = signals.next() => None,
                }
            }),
            Session::Nfs { mounted, .. } => {
                let mounted = *mounted;
                self.runtime.block_on(async {
                    tokio::select! {
                        () = unmounted_from_outside(&mountpoint, mounted) => Some(Ok(Ok(()))),
                        () = signals.next() => None,
                    }
                })
            }
        };
        match ended {
            Some(result) => {
                if let Session::Nfs { mounted, .. } = &mut self.session {
                    // Already gone: nothing for stop to unmount.
                    *mounted = false;
                }
                self.cleanup();
                flatten(result)
            }
            None => self.stop_with(Patience::UntilReleased(signals)),
        }
    }

    /// Unmounts and waits for the request loop to finish. A busy mount (files open
    /// there) is detached (Linux; macOS keeps it mounted), so new lookups no longer
    /// see it, and served for at most 15 s more: after that the open files answer
    /// "not connected".
    pub fn stop(self) -> Result<(), MountError> {
        self.stop_with(Patience::Bounded)
    }

    fn stop_with(mut self, patience: Patience) -> Result<(), MountError> {
        let mounted = !matches!(self.session, Session::Nfs { mounted: false, .. });
        info!("{}", if mounted { "unmounting" } else { "stopping" });
        let phase = &self.stop_phase;
        phase.set(Stopping::Unmounting);
        let waited = match &mut self.session {
            Session::Fuse { unmounter, done } => {
                let at = (self.mountpoint.as_path(), phase);
                stop_fuse(&self.runtime, unmounter, done, at, patience)
            }
            Session::Nfs { serving, mounted } => {
                let released = match *mounted {
                    true => stop_nfs(
                        &self.runtime,
                        serving.addr,
                        (self.mountpoint.as_path(), phase),
                        patience,
                    ),
                    false => Some(()),
                };
                *mounted = false;
                released.map(|()| Ok(Ok(())))
            }
        };
        if waited.is_none() {
            // Given up on (15 s for the library's stop) or asked again to stop.
            warn!(mountpoint = %self.mountpoint.display(), "stopping while the kernel still holds the detached mount: files still open there now fail (not connected)");
        }
        self.cleanup();
        waited.map_or(Ok(()), flatten)
    }

    fn cleanup(self) {
        // Every copy answered is made durable before an unmount returns: the store
        // itself is dropped later, by whichever thread lets go of it last, and a
        // remount must find its lock free and its journal complete.
        self.stager.store().commit_now();
        let _ = fs::remove_file(&self.socket);
        if !self.mountpoint.as_os_str().is_empty() {
            crate::registry::remove(&self.mountpoint, &self.cache_dir);
        }
        info!(metrics = %self.metrics(), "stopped");
        if let Session::Nfs { serving, .. } = self.session {
            let _guard = self.runtime.enter();
            serving.stop();
        }
        // The store, and with it the cache directory's lock, goes with the last task
        // or worker holding the stager: wait a moment for them, so a remount right
        // after this returns finds the lock free (under load, tasks dropped in the
        // background still held it when the next mount began). A worker stuck on an
        // unreachable source must not keep the process alive: that one is left.
        self.runtime.shutdown_timeout(WORKERS_WAIT);
    }
}

/// How the request loop ends, as its thread reports it.
type SessionEnd = Result<std::io::Result<()>, oneshot::error::RecvError>;

/// How long stopping waits for the kernel to let go of a busy mount.
enum Patience {
    /// At most [`STOP_WAIT`]: the library's [`Running::stop`].
    Bounded,
    /// As long as files are open there, or until a second SIGTERM/SIGINT: the daemon.
    UntilReleased(StopSignals),
}

impl Patience {
    /// Runs `released` to its end on `runtime`; `None` if this gave up first.
    fn wait<T>(self, runtime: &Runtime, released: impl Future<Output = T>) -> Option<T> {
        match self {
            Patience::Bounded => runtime
                .block_on(async { tokio::time::timeout(STOP_WAIT, released).await })
                .ok(),
            Patience::UntilReleased(mut signals) => runtime.block_on(async {
                tokio::select! {
                    result = released => Some(result),
                    () = signals.next() => None,
                }
            }),
        }
    }
}

/// Whether an unmount was refused because the mount is in use.
fn is_busy(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::ResourceBusy
}

/// Unmounts the FUSE mount and waits, as `patience` allows, for the request loop to
/// end. A busy mount is detached (Linux) and served until its files are closed; on
/// macOS, where the only way past busy is a forced unmount that breaks open files
/// and mappings, it stays mounted and served until a plain unmount succeeds.
fn stop_fuse(
    runtime: &Runtime,
    unmounter: &mut SessionUnmounter,
    done: &mut oneshot::Receiver<std::io::Result<()>>,
    (mountpoint, phase): (&Path, &StopPhase),
    patience: Patience,
) -> Option<SessionEnd> {
    match plain_unmount(unmounter, mountpoint) {
        Ok(()) => Patience::Bounded.wait(runtime, done),
        Err(e) if is_busy(&e) && cfg!(target_os = "linux") => {
            match crate::unmount::detach(mountpoint) {
                Ok(()) => {
                    phase.set(Stopping::Detached);
                    info!(mountpoint = %mountpoint.display(), "{DETACHED_BUSY}")
                }
                Err(e) => {
                    warn!(error = %e, mountpoint = %mountpoint.display(), "mount busy (files open) and detaching it failed; serving it until it is unmounted")
                }
            }
            patience.wait(runtime, done)
        }
        Err(e) if is_busy(&e) => {
            phase.set(Stopping::Busy);
            info!(mountpoint = %mountpoint.display(), "mount busy (files open): still mounted; serving until they are closed, then unmounting");
            patience.wait(runtime, async {
                unmount_once_free(mountpoint, crate::unmount::try_unmount).await;
                done.await
            })
        }
        Err(e) => {
            warn!(error = %e, mountpoint = %mountpoint.display(), "unmount failed");
            Patience::Bounded.wait(runtime, done)
        }
    }
}

/// A plain unmount of the FUSE mount, refused as busy while files are open there.
/// On Linux through stagefs's own: fuser's detaches an ordinary user's mount lazily
/// at once (`fusermount3 -u -z`), so a busy mount could not be told from an idle one
/// and would be served for only [`STOP_WAIT`].
fn plain_unmount(unmounter: &mut SessionUnmounter, mountpoint: &Path) -> std::io::Result<()> {
    match cfg!(target_os = "linux") {
        true => crate::unmount::try_unmount(mountpoint),
        false => unmounter.unmount(),
    }
}

/// Unmounts the kernel's NFS mount of the export served at `server`. A busy mount is
/// detached (Linux `umount -l`) and served until the kernel's client lets go of it;
/// on macOS, where `umount -f` would break open files and mappings, it stays mounted
/// and served until a plain unmount succeeds. Forced where `patience` runs out.
/// `None` if files were still open when this gave up.
fn stop_nfs(
    runtime: &Runtime,
    server: SocketAddr,
    (mountpoint, phase): (&Path, &StopPhase),
    patience: Patience,
) -> Option<()> {
    match stagefs_nfs::kernel_mount::unmount(mountpoint, false) {
        Ok(()) => return Some(()),
        Err(e) if is_busy(&e) => {}
        Err(e) => {
            warn!(error = %e, mountpoint = %mountpoint.display(), "unmount failed; forcing it");
            force_unmount_nfs(mountpoint);
            return Some(());
        }
    }
    let released = if cfg!(target_os = "linux") {
        if let Err(e) = stagefs_nfs::kernel_mount::unmount(mountpoint, true) {
            warn!(error = %e, mountpoint = %mountpoint.display(), "mount busy (files open) and detaching it failed");
            return None;
        }
        phase.set(Stopping::Detached);
        info!(mountpoint = %mountpoint.display(), "{DETACHED_BUSY}");
        patience.wait(runtime, nfs_client_lets_go(server.port()))
    } else {
        phase.set(Stopping::Busy);
        info!(mountpoint = %mountpoint.display(), "mount busy (files open): still mounted; serving until they are closed, then unmounting");
        patience.wait(
            runtime,
            unmount_once_free(mountpoint, |path| {
                stagefs_nfs::kernel_mount::unmount(path, false)
            }),
        )
    };
    if released.is_none() && !cfg!(target_os = "linux") {
        // Asked again, or out of patience: the old way, whatever it breaks.
        force_unmount_nfs(mountpoint);
    }
    released
}

fn force_unmount_nfs(mountpoint: &Path) {
    if let Err(e) = stagefs_nfs::kernel_mount::unmount(mountpoint, true) {
        warn!(error = %e, mountpoint = %mountpoint.display(), "forced unmount failed");
    }
}

/// Returns once the kernel's NFS client no longer holds a mount of the export on
/// `port` (the last file open in a detached mount was closed).
async fn nfs_client_lets_go(port: u16) {
    while stagefs_nfs::kernel_mount::client_holds(port) {
        tokio::time::sleep(NFS_MOUNT_WATCH).await;
    }
}

/// Tries `unmount` every [`BUSY_RETRY`] while it is refused as busy; returns once it
/// succeeded or failed otherwise (e.g. unmounted from outside meanwhile).
async fn unmount_once_free(mountpoint: &Path, unmount: fn(&Path) -> std::io::Result<()>) {
    loop {
        tokio::time::sleep(BUSY_RETRY).await;
        let path = mountpoint.to_path_buf();
        match tokio::task::spawn_blocking(move || unmount(&path)).await {
            Ok(Err(e)) if is_busy(&e) => continue,
            Ok(Err(e)) => {
                warn!(error = %e, mountpoint = %mountpoint.display(), "unmount failed");
                return;
            }
            _ => return,
        }
    }
}

/// Opens the source and the store (taking the cache lock), records the mount in the
/// cache directory and builds the stager on `runtime`.
fn open_stager(spec: &MountSpec, runtime: &Runtime) -> Result<Stager, MountError> {
    let previous = MountRecord::read(&spec.cache_dir);
    let (source, source_fs) = match away_at_start(spec, previous.as_ref())? {
        Some(was) => (crate::away::waiting_source(spec, &was), Some(was)),
        None => {
            let source_fs = source_record::source_fs(&spec.source);
            (
                crate::open_source(&spec.source, spec.fs.source_timeout)?,
                source_fs,
            )
        }
    };
    let budget = spec.budget()?;
    let store = Store::open(&spec.cache_dir, budget)
        .map_err(|e| match e {
            StoreError::Locked { .. } => MountError::CacheLocked {
                path: spec.cache_dir.clone(),
            },
            other => MountError::Store(other),
        })?
        .with_redirect_grace(spec.redirect_grace);
    source_record::forget_another_sources_copies(&store, previous.as_ref(), &spec.source);
    let record = MountRecord {
        source: spec.source.clone(),
        mountpoint: spec.mountpoint.clone(),
        budget,
        min_stage_size: spec.fs.min_stage_size,
        model_dirs: spec.model_dirs.clone(),
        backend: spec.backend,
        source_fs,
    };
    record
        .write(&spec.cache_dir)
        .map_err(|e| MountError::io("recording the mount in the cache directory", e))?;
    let options = StagerOptions {
        copy: spec.copy,
        source_timeout: spec.fs.source_timeout,
        ..StagerOptions::default()
    };
    let stager = Stager::with_options(
        source,
        store,
        Arc::default(),
        runtime.handle().clone(),
        options,
    );
    if previous
        .as_ref()
        .is_some_and(|was| !source_record::same_dir(&was.source, &spec.source))
    {
        // Another source's answers would be taken for this one's while it is away.
        stager.answers().forget(Path::new(""));
    }
    if spec.source_verdict.is_away() {
        // Every request answers from what the cache remembers until a probe finds
        // the share back.
        stager.source_pool().mark_unresponsive();
        warn!(
            source = %spec.source.display(),
            "the source is away: serving what the cache remembers of it, read-only, until it is back"
        );
    }
    Ok(stager)
}

/// The filesystem to wait for if the source is away and this cache may serve it
/// anyway: the check found it not answering, or it answers as the directory under
/// its share's mount point (the share is not mounted). None: serve it live. A share
/// not mounted where this cache never served it is refused, as before.
fn away_at_start(
    spec: &MountSpec,
    previous: Option<&MountRecord>,
) -> Result<Option<SourceFs>, MountError> {
    if spec.source_verdict.is_away() {
        return Ok(crate::away::remembered(spec));
    }
    let now = source_record::source_fs(&spec.source);
    match source_record::refuse_an_unmounted_source(previous, &spec.source, now.as_ref()) {
        Ok(()) => Ok(None),
        Err(refused) => match crate::away::remembered(spec) {
            Some(was) => {
                spec.source_verdict.set_away();
                Ok(Some(was))
            }
            None => Err(refused),
        },
    }
}

/// The policy configuration for the NFS backend: a staged file is never turned into
/// a link (that would change its type under one fileid, while the client caches
/// names and attributes); blobs are links from the start where `nfs_links` says so
/// (`stagefs_policy::links`); and there is no passthrough.
fn nfs_config(fs: &FsConfig) -> FsConfig {
    FsConfig {
        redirect: false,
        passthrough: false,
        hide_finder_files: true,
        ..fs.clone()
    }
}

/// Returns once `mountpoint` is no longer mounted (`umount` from outside); never,
/// for an export that was not mounted by this process.
///
/// It reads the mount table and never stats the mount point: a stat walks into the
/// mount and holds it for as long as its GETATTR takes, and an `umount` that lands
/// in that moment is refused as busy (`stagefs unmount` then failed now and then).
async fn unmounted_from_outside(mountpoint: &Path, mounted: bool) {
    if !mounted {
        return std::future::pending().await;
    }
    loop {
        tokio::time::sleep(NFS_MOUNT_WATCH).await;
        let mountpoint = mountpoint.to_path_buf();
        let still = tokio::task::spawn_blocking(move || {
            crate::table::mounted_at(&mountpoint).map(|entry| entry.is_some())
        })
        .await;
        if matches!(still, Ok(Ok(false))) {
            info!("the NFS mount was unmounted");
            return;
        }
    }
}

fn flatten(
    result: Result<std::io::Result<()>, oneshot::error::RecvError>,
) -> Result<(), MountError> {
    match result {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(MountError::Session(e)),
        Err(_) => Err(MountError::SessionDied),
    }
}

/// SIGTERM and SIGINT, the ways a daemon is asked to stop (`systemctl stop`, launchd,
/// a logout, Ctrl-C). Kept for the whole stop, so a second signal is seen too.
struct StopSignals {
    streams: Option<(Signal, Signal)>,
}

impl StopSignals {
    /// Listens from now on; call within the runtime.
    fn new() -> StopSignals {
        let streams = match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(int)) => Some((term, int)),
            (Err(e), _) | (_, Err(e)) => {
                warn!(error = %e, "cannot listen for SIGTERM/SIGINT; only an unmount stops this mount");
                None
            }
        };
        StopSignals { streams }
    }

    /// Returns at the next SIGTERM or SIGINT (never, where they cannot be listened for).
    async fn next(&mut self) {
        let Some((term, int)) = &mut self.streams else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
}
