//! Running a mount: the serving process (foreground) and the launcher that starts it
//! in the background and returns once the mount is live.

use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use fuser::SessionUnmounter;
use stagefs_cache::budget::volume_space;
use stagefs_cache::control::MountRecord;
use stagefs_cache::copy::CopyOptions;
use stagefs_cache::{
    Budget, MetricsSnapshot, SourceTree, Stager, StagerOptions, Store, StoreError,
};
use stagefs_fs::{FsConfig, OnFull, StageFs};
use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::control_server;

/// Everything needed to start serving one mount.
#[derive(Debug, Clone)]
pub(crate) struct MountSpec {
    pub(crate) source: PathBuf,
    pub(crate) mountpoint: PathBuf,
    pub(crate) cache_dir: PathBuf,
    pub(crate) fs: FsConfig,
    pub(crate) max_size: Option<u64>,
    /// None: the default share of the cache volume.
    pub(crate) min_free: Option<u64>,
    /// How long a copy whose link was followed counts as in use.
    pub(crate) redirect_grace: Duration,
    pub(crate) copy: CopyOptions,
    /// Paths in the source searched for models like its root.
    pub(crate) model_dirs: Vec<PathBuf>,
}

impl MountSpec {
    /// The budget, with defaults resolved against the cache volume.
    fn budget(&self) -> anyhow::Result<Budget> {
        let min_free = match self.min_free {
            Some(bytes) => bytes,
            None => Budget::default_min_free(volume_space(&self.cache_dir)?),
        };
        Ok(Budget {
            max_size: self.max_size,
            min_free: Some(min_free),
        })
    }
}

/// A live mount served by this process.
pub(crate) struct Running {
    runtime: Runtime,
    unmounter: SessionUnmounter,
    done: oneshot::Receiver<std::io::Result<()>>,
    stager: Stager,
    socket: PathBuf,
}

impl Running {
    /// Mounts and starts serving; returns once the kernel has completed the handshake.
    pub(crate) fn start(spec: &MountSpec) -> anyhow::Result<Running> {
        validate(spec)?;
        create_cache_dir(spec)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("stagefs-worker")
            .enable_all()
            .build()
            .context("starting the worker runtime")?;
        let source = SourceTree::new(&spec.source)?;
        let budget = spec.budget()?;
        let store = Store::open(&spec.cache_dir, budget)
            .map_err(|e| store_open_error(e, spec))?
            .with_redirect_grace(spec.redirect_grace);
        let record = MountRecord {
            source: spec.source.clone(),
            mountpoint: spec.mountpoint.clone(),
            budget,
            min_stage_size: spec.fs.min_stage_size,
            model_dirs: spec.model_dirs.clone(),
        };
        record
            .write(&spec.cache_dir)
            .context("recording the mount in the cache directory")?;
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
        let fs = StageFs::new(stager.clone(), spec.fs.clone(), runtime.handle().clone());
        let mut session =
            fuser::Session::new(fs, &spec.mountpoint, &spec.fs.session_config(&spec.source))
                .with_context(|| format!("mounting at {}", spec.mountpoint.display()))?;
        let unmounter = session.unmount_callable();
        let (done_tx, done) = oneshot::channel();
        std::thread::Builder::new()
            .name("stagefs-fuse".into())
            .spawn(move || {
                let _ = done_tx.send(session.run());
            })
            .context("starting the request loop")?;
        let socket = stagefs_cache::control::socket_path(&spec.cache_dir);
        let server = runtime.block_on(control_server::bind(&socket, spec, stager.clone()))?;
        runtime.spawn(server.serve());
        info!(source = %spec.source.display(), mountpoint = %spec.mountpoint.display(), cache = %spec.cache_dir.display(), "mounted");
        Ok(Running {
            runtime,
            unmounter,
            done,
            stager,
            socket,
        })
    }

    /// The mount's counters so far.
    pub(crate) fn metrics(&self) -> MetricsSnapshot {
        self.stager.metrics().snapshot()
    }

    /// Serves until the mount goes away or the process is asked to stop (SIGINT, SIGTERM).
    pub(crate) fn wait(mut self) -> anyhow::Result<()> {
        let ended = self.runtime.block_on(async {
            tokio::select! {
                result = &mut self.done => Some(result),
                () = shutdown_signal() => None,
            }
        });
        match ended {
            Some(result) => {
                self.cleanup();
                flatten(result)
            }
            None => self.stop(),
        }
    }

    /// Unmounts and waits for the request loop to finish.
    pub(crate) fn stop(mut self) -> anyhow::Result<()> {
        info!("unmounting");
        if let Err(e) = self.unmounter.unmount() {
            warn!(error = %e, "unmount failed");
        }
        // The request loop ends once the kernel lets go of the mount; if it never
        // does, the process exits anyway rather than hang.
        let waited = self.runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(15), &mut self.done).await
        });
        self.cleanup();
        match waited {
            Ok(result) => flatten(result),
            Err(_) => {
                warn!("the request loop did not finish after unmounting; exiting anyway");
                Ok(())
            }
        }
    }

    fn cleanup(self) {
        let _ = fs::remove_file(&self.socket);
        info!(metrics = ?self.metrics(), "stopped");
        // A worker stuck on an unreachable source must not keep the process alive.
        self.runtime.shutdown_background();
    }
}

fn flatten(result: Result<std::io::Result<()>, oneshot::error::RecvError>) -> anyhow::Result<()> {
    match result {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(anyhow!(e).context("the FUSE session failed")),
        Err(_) => Err(anyhow!("the FUSE request loop died")),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

fn store_open_error(e: StoreError, spec: &MountSpec) -> anyhow::Error {
    match e {
        StoreError::Locked { .. } => anyhow!(
            "cache directory {} is in use by another stagefs process (a mount, or a prefetch, verify or evict working on it); unmount or wait for it, or pass a different --cache-dir",
            spec.cache_dir.display()
        ),
        other => anyhow!(other).context("opening the cache directory"),
    }
}

/// Refuses a mount that cannot work, before anything is created or mounted.
fn validate(spec: &MountSpec) -> anyhow::Result<()> {
    if let Err(why) = crate::doctor::responds(&spec.source, spec.fs.source_timeout) {
        bail!(
            "source {} {why}; check that the share is reachable (`stagefs doctor {}` examines it)",
            spec.source.display(),
            spec.source.display()
        );
    }
    let source = existing_dir(&spec.source, "source")?;
    recover_stale_mount(&spec.mountpoint)?;
    let mountpoint = existing_dir(&spec.mountpoint, "mount point")?;
    if is_mount_point(&mountpoint)? {
        bail!(
            "mount point {} is already a mount point; unmount it first (`stagefs unmount {}` if it is a stagefs mount)",
            spec.mountpoint.display(),
            spec.mountpoint.display()
        );
    }
    if fs::read_dir(&mountpoint)?.next().is_some() {
        bail!(
            "mount point {} is not empty; use an empty directory",
            spec.mountpoint.display()
        );
    }
    let cache = canonical_prefix(&spec.cache_dir)?;
    if cache.starts_with(&source) || cache.starts_with(&mountpoint) {
        bail!(
            "cache directory {} must not be inside the source or the mount point",
            spec.cache_dir.display()
        );
    }
    if let Some(max) = spec.max_size
        && max < spec.fs.min_stage_size
    {
        bail!(
            "--max-size ({max} bytes) is smaller than --min-stage-size ({} bytes): no file could ever be staged",
            spec.fs.min_stage_size
        );
    }
    Ok(())
}

fn existing_dir(path: &Path, what: &str) -> anyhow::Result<PathBuf> {
    let real = match fs::canonicalize(path) {
        Ok(real) => real,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("{what} {} does not exist", path.display())
        }
        Err(e) => bail!("{what} {}: {e}", path.display()),
    };
    if !real.is_dir() {
        bail!("{what} {} is not a directory", path.display());
    }
    Ok(real)
}

/// A FUSE mount whose daemon died answers ENOTCONN; clear it so the new mount can
/// take its place (this is what a user would otherwise have to do by hand).
fn recover_stale_mount(mountpoint: &Path) -> anyhow::Result<()> {
    match fs::metadata(mountpoint) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            crate::unmount::unmount(mountpoint, true).with_context(|| {
                format!(
                    "{} is a stale mount left by a crashed daemon and could not be cleared; run `stagefs unmount --lazy {}`",
                    mountpoint.display(),
                    mountpoint.display()
                )
            })?;
            warn!(mountpoint = %mountpoint.display(), "cleared a stale mount left by a crashed daemon");
            eprintln!(
                "stagefs: cleared a stale mount at {} left by a crashed daemon",
                mountpoint.display()
            );
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Whether `dir` is the root of a mounted filesystem (its device differs from its
/// parent's, or it is `/`).
fn is_mount_point(dir: &Path) -> anyhow::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let Some(parent) = dir.parent() else {
        return Ok(true);
    };
    Ok(fs::metadata(dir)?.dev() != fs::metadata(parent)?.dev())
}

/// `path` with its longest existing prefix canonicalized, so a cache directory can
/// be checked before anything is created.
fn canonical_prefix(path: &Path) -> anyhow::Result<PathBuf> {
    let mut existing = path;
    let mut rest = Vec::new();
    while !existing.exists() {
        let (Some(parent), Some(name)) = (existing.parent(), existing.file_name()) else {
            break;
        };
        rest.push(name);
        existing = parent;
    }
    let mut out =
        fs::canonicalize(existing).with_context(|| format!("resolving {}", existing.display()))?;
    out.extend(rest.iter().rev());
    Ok(out)
}

fn create_cache_dir(spec: &MountSpec) -> anyhow::Result<()> {
    let dir = &spec.cache_dir;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cache directory {} cannot be created", dir.display()))?;
    tempfile::tempfile_in(dir)
        .map(drop)
        .with_context(|| format!("cache directory {} is not writable", dir.display()))
}

/// Serves `spec` in this process until unmounted; with `notify_ready`, tells the
/// launcher on stdout whether the mount came up.
pub(crate) fn serve_foreground(spec: &MountSpec, notify_ready: bool) -> anyhow::Result<()> {
    let running = match Running::start(spec) {
        Ok(running) => running,
        Err(e) => {
            if notify_ready {
                println!("error: {e:#}");
            }
            return Err(e);
        }
    };
    if notify_ready {
        println!("ready");
        let _ = std::io::stdout().flush();
        detach_stdout();
    }
    running.wait()
}

// After the launcher has read "ready" it exits; later writes to stdout must not fail.
fn detach_stdout() {
    if let Ok(devnull) = OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        // SAFETY: both descriptors are valid for the duration of the call.
        unsafe { libc::dup2(devnull.as_raw_fd(), libc::STDOUT_FILENO) };
    }
}

/// Starts this program again as a detached `mount --foreground` and returns once it
/// reports the mount live; its log goes to `stagefs.log` in the cache directory.
pub(crate) fn launch_background(spec: &MountSpec) -> anyhow::Result<PathBuf> {
    validate(spec)?;
    create_cache_dir(spec)?;
    let log_path = spec.cache_dir.join("stagefs.log");
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log_path)
        .with_context(|| format!("opening log file {}", log_path.display()))?;
    let exe = std::env::current_exe().context("finding the stagefs executable")?;
    let mut command = Command::new(exe);
    command
        .args(foreground_args(spec))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log);
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from our terminal.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = command.spawn().context("starting the mount daemon")?;
    let stdout = child.stdout.take().context("daemon stdout")?;
    match first_line(stdout, Duration::from_secs(120)) {
        Some(line) if line == "ready" => Ok(log_path),
        Some(line) => bail!("{}", line.trim_start_matches("error: ")),
        None => {
            let _ = child.kill();
            bail!(
                "the mount daemon did not come up; see {}",
                log_path.display()
            )
        }
    }
}

/// The command line that serves `spec` in the foreground. Every setting is spelled
/// out, so the daemon serves what was resolved here even if the config file changes.
fn foreground_args(spec: &MountSpec) -> Vec<OsString> {
    let fs = &spec.fs;
    let mut args: Vec<OsString> = vec![
        "--no-config".into(),
        "mount".into(),
        spec.source.clone().into(),
        spec.mountpoint.clone().into(),
        "--cache-dir".into(),
        spec.cache_dir.clone().into(),
        format!("--min-stage-size={}", fs.min_stage_size).into(),
        format!("--copy-streams={}", spec.copy.streams).into(),
        format!("--source-timeout={}s", fs.source_timeout.as_secs()).into(),
        format!("--redirect-grace={}s", spec.redirect_grace.as_secs()).into(),
        format!(
            "--on-full={}",
            match fs.on_full {
                OnFull::Fail => "fail",
                OnFull::ReadSource => "passthrough",
            }
        )
        .into(),
    ];
    let optional = [
        spec.max_size.map(|n| format!("--max-size={n}")),
        spec.min_free.map(|n| format!("--min-free={n}")),
        match fs.prefetch {
            Some(parallel) => Some(format!("--prefetch-parallel={parallel}")),
            None => Some("--no-prefetch".into()),
        },
        (!fs.passthrough).then(|| "--no-passthrough".into()),
        (!fs.redirect).then(|| "--no-redirect".into()),
        fs.allow_other.then(|| "--allow-other".into()),
    ];
    args.extend(optional.into_iter().flatten().map(OsString::from));
    args.extend(
        spec.model_dirs
            .iter()
            .map(|dir| OsString::from(format!("--model-dir={}", dir.display()))),
    );
    args.extend(["--foreground", "--notify-ready"].map(OsString::from));
    args
}

fn first_line(stdout: impl std::io::Read + Send + 'static, timeout: Duration) -> Option<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(timeout).ok()?;
    let line = line.trim_end().to_string();
    (!line.is_empty()).then_some(line)
}

/// Shown after a successful background mount.
pub(crate) fn describe(spec: &MountSpec, log: &Path) -> String {
    format!(
        "mounted {} at {} (cache {}, log {})",
        spec.source.display(),
        spec.mountpoint.display(),
        spec.cache_dir.display(),
        log.display()
    )
}

/// The mount served from `cache_dir` right now, as (source, mountpoint); None when no
/// daemon answers on its control socket.
pub(crate) fn live_mount(cache_dir: &Path) -> anyhow::Result<Option<(PathBuf, PathBuf)>> {
    use stagefs_cache::control::{self, Request, Response};
    match control::query(&control::socket_path(cache_dir), &Request::Stats) {
        Ok(Response::Stats {
            source, mountpoint, ..
        }) => Ok(Some((source, mountpoint))),
        Ok(other) => bail!("unexpected answer from the running mount: {other:?}"),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(anyhow!(e).context("talking to the running mount")),
    }
}
