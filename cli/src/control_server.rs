//! The mount's control socket: answers [`Request`]s from `stagefs` commands.
//! The socket is created private (0600) inside the cache directory.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use stagefs_cache::Stager;
use stagefs_cache::admin::Live;
use stagefs_cache::control::{self, Request, Response};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tracing::debug;

use crate::daemon::MountSpec;

/// A bound control socket, not yet serving.
pub(crate) struct ControlServer {
    listener: UnixListener,
    stager: Stager,
    mountpoint: PathBuf,
}

/// Binds the socket at `path`, replacing one left behind by a crashed mount (the
/// caller holds the cache lock, so no live mount can own it).
pub(crate) async fn bind(
    path: &Path,
    spec: &MountSpec,
    stager: Stager,
) -> anyhow::Result<ControlServer> {
    let _ = fs::remove_file(path);
    let listener = UnixListener::bind(path)
        .with_context(|| format!("creating control socket {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    Ok(ControlServer {
        listener,
        stager,
        mountpoint: spec.mountpoint.clone(),
    })
}

impl ControlServer {
    /// Accepts and answers connections until the runtime shuts down.
    pub(crate) async fn serve(self) {
        let server = Arc::new(self);
        loop {
            match server.listener.accept().await {
                Ok((stream, _)) => {
                    let server = Arc::clone(&server);
                    tokio::spawn(async move { server.answer(stream).await });
                }
                Err(e) => debug!(error = %e, "control socket accept failed"),
            }
        }
    }

    async fn answer(&self, stream: UnixStream) {
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let response = match serde_json::from_str::<Request>(&line) {
                Ok(request) => self.handle(request).await,
                Err(e) => Response::Error {
                    message: format!("bad request: {e}"),
                },
            };
            let Ok(mut out) = serde_json::to_vec(&response) else {
                return;
            };
            out.push(b'\n');
            if write.write_all(&out).await.is_err() {
                return;
            }
        }
    }

    // Verify and status read the disk, so they run on the blocking pool.
    async fn handle(&self, request: Request) -> Response {
        let stager = self.stager.clone();
        let mountpoint = self.mountpoint.clone();
        let answered = tokio::task::spawn_blocking(move || {
            let live = Live {
                metrics: Some(stager.metrics().snapshot()),
                in_flight: stager.in_flight(),
                mountpoint: Some(mountpoint),
            };
            control::answer(request, stager.store(), Some(stager.source()), live)
        })
        .await;
        answered.unwrap_or_else(|e| Response::Error {
            message: format!("the request failed: {e}"),
        })
    }
}
