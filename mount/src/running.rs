//! A live mount served by this process: started, served, stopped.

use std::fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fuser::SessionUnmounter;
use stagefs_cache::control::MountRecord;
use stagefs_cache::{MetricsSnapshot, SourceTree, Stager, StagerOptions, Store, StoreError};
use stagefs_fs::StageFs;
use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::{MountError, MountSpec, control};

/// How long stopping waits for the kernel to let go of the mount before giving up.
const STOP_WAIT: Duration = Duration::from_secs(15);

/// A live mount served by this process. The FUSE session serves on a thread of its
/// own and the control socket on the mount's worker runtime, so the process that
/// started it may read through it. Stop it with [`Running::stop`] or serve until
/// the end with [`Running::wait`]; dropping it leaves the mount in place.
pub struct Running {
    runtime: Runtime,
    unmounter: SessionUnmounter,
    done: oneshot::Receiver<std::io::Result<()>>,
    stager: Stager,
    socket: PathBuf,
    mountpoint: PathBuf,
    cache_dir: PathBuf,
}

impl Running {
    /// Checks the spec ([`MountSpec::check`], which clears a stale mount), creates
    /// the cache directory, opens the store (holding its lock), records the mount,
    /// mounts and starts the control socket; returns once the kernel has completed
    /// the FUSE handshake, so the mount point serves the source.
    pub fn start(spec: &MountSpec) -> Result<Running, MountError> {
        let _ = spec.check()?;
        // Decided before mounting: passthrough only where it is known to work.
        let (read_path, _) = spec.fs.read_path();
        let serving = spec.fs.describe_read_path();
        let mut spec = spec.clone();
        spec.fs.passthrough = read_path == stagefs_fs::ReadPath::Passthrough;
        let spec = &spec;
        spec.create_cache_dir()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("stagefs-worker")
            .enable_all()
            .build()
            .map_err(|e| MountError::io("starting the worker runtime", e))?;
        let stager = open_stager(spec, &runtime)?;
        let fs = StageFs::new(stager.clone(), spec.fs.clone(), runtime.handle().clone());
        let mut session =
            fuser::Session::new(fs, &spec.mountpoint, &spec.fs.session_config(&spec.source))
                .map_err(|e| {
                    MountError::io(format!("mounting at {}", spec.mountpoint.display()), e)
                })?;
        let unmounter = session.unmount_callable();
        let (done_tx, done) = oneshot::channel();
        std::thread::Builder::new()
            .name("stagefs-fuse".into())
            .spawn(move || {
                let _ = done_tx.send(session.run());
            })
            .map_err(|e| MountError::io("starting the request loop", e))?;
        let mut running = Running {
            runtime,
            unmounter,
            done,
            stager: stager.clone(),
            socket: stagefs_cache::control::socket_path(&spec.cache_dir),
            mountpoint: spec.mountpoint.clone(),
            cache_dir: spec.cache_dir.clone(),
        };
        let bound = running
            .runtime
            .block_on(control::bind(&running.socket, spec, stager));
        match bound {
            Ok(mut server) => {
                server.read_path = serving.clone();
                running.runtime.spawn(server.serve())
            }
            Err(e) => {
                // Without its socket the mount could never be asked or stopped by name.
                let _ = running.unmounter.unmount();
                return Err(e);
            }
        };
        if let Err(e) = crate::registry::add(&spec.mountpoint, &spec.cache_dir) {
            warn!(error = %e, mountpoint = %spec.mountpoint.display(), "could not record the mount for commands run without --cache-dir");
        }
        info!(source = %spec.source.display(), mountpoint = %spec.mountpoint.display(), cache = %spec.cache_dir.display(), "mounted");
        info!("{serving}");
        Ok(running)
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
    /// asked to stop (SIGINT, SIGTERM), then stops.
    pub fn wait(mut self) -> Result<(), MountError> {
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

    /// Unmounts and waits for the request loop to finish. A kernel that never lets
    /// go (a reader stuck in the mount) is given up on after a while: the mount is
    /// then detached by the kernel when its last user leaves.
    pub fn stop(mut self) -> Result<(), MountError> {
        info!("unmounting");
        if let Err(e) = self.unmounter.unmount() {
            warn!(error = %e, "unmount failed");
        }
        let waited = self
            .runtime
            .block_on(async { tokio::time::timeout(STOP_WAIT, &mut self.done).await });
        self.cleanup();
        match waited {
            Ok(result) => flatten(result),
            Err(_) => {
                warn!("the request loop did not finish after unmounting; going on anyway");
                Ok(())
            }
        }
    }

    fn cleanup(self) {
        let _ = fs::remove_file(&self.socket);
        crate::registry::remove(&self.mountpoint, &self.cache_dir);
        info!(metrics = ?self.metrics(), "stopped");
        // A worker stuck on an unreachable source must not keep the process alive.
        self.runtime.shutdown_background();
    }
}

/// Opens the source and the store (taking the cache lock), records the mount in the
/// cache directory and builds the stager on `runtime`.
fn open_stager(spec: &MountSpec, runtime: &Runtime) -> Result<Stager, MountError> {
    let source = SourceTree::new(&spec.source).map_err(MountError::Source)?;
    let budget = spec.budget()?;
    let store = Store::open(&spec.cache_dir, budget)
        .map_err(|e| match e {
            StoreError::Locked { .. } => MountError::CacheLocked {
                path: spec.cache_dir.clone(),
            },
            other => MountError::Store(other),
        })?
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
        .map_err(|e| MountError::io("recording the mount in the cache directory", e))?;
    let options = StagerOptions {
        copy: spec.copy,
        source_timeout: spec.fs.source_timeout,
        ..StagerOptions::default()
    };
    Ok(Stager::with_options(
        source,
        store,
        Arc::default(),
        runtime.handle().clone(),
        options,
    ))
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
