//! The mount's control socket: answers [`Request`]s from `stagefs` commands.
//! The socket is created private (0600) inside the cache directory.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use stagefs_cache::Metrics;
use stagefs_cache::control::{Request, Response};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tracing::debug;

use crate::daemon::MountSpec;

/// A bound control socket, not yet serving.
pub(crate) struct ControlServer {
    listener: UnixListener,
    metrics: Arc<Metrics>,
    mountpoint: PathBuf,
    source: PathBuf,
}

/// Binds the socket at `path`, replacing one left behind by a crashed mount (the
/// caller holds the cache lock, so no live mount can own it).
pub(crate) async fn bind(
    path: &Path,
    spec: &MountSpec,
    metrics: Arc<Metrics>,
) -> anyhow::Result<ControlServer> {
    let _ = fs::remove_file(path);
    let listener = UnixListener::bind(path)
        .with_context(|| format!("creating control socket {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    Ok(ControlServer {
        listener,
        metrics,
        mountpoint: spec.mountpoint.clone(),
        source: spec.source.clone(),
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
                Ok(request) => self.handle(request),
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

    fn handle(&self, request: Request) -> Response {
        match request {
            Request::Stats => Response::Stats {
                metrics: self.metrics.snapshot(),
                mountpoint: self.mountpoint.clone(),
                source: self.source.clone(),
            },
        }
    }
}
