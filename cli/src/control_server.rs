//! The mount's control socket: answers [`Request`]s from `stagefs` commands.
//! The socket is created private (0600) inside the cache directory.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use stagefs_cache::Stager;
use stagefs_cache::admin::Live;
use stagefs_cache::control::{self, Request, Response};
use stagefs_cache::models::ModelSource;
use stagefs_cache::prefetch::{self, Job, Target};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tracing::debug;

use crate::daemon::MountSpec;

/// A bound control socket, not yet serving.
pub(crate) struct ControlServer {
    listener: UnixListener,
    stager: Stager,
    mountpoint: PathBuf,
    min_stage_size: u64,
    prefetch_parallel: usize,
    source_timeout: Duration,
    model_dirs: Arc<[PathBuf]>,
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
        min_stage_size: spec.fs.min_stage_size,
        prefetch_parallel: spec.fs.prefetch.unwrap_or(1),
        source_timeout: spec.fs.source_timeout,
        model_dirs: spec.model_dirs.clone().into(),
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
            let sent = match serde_json::from_str::<Request>(&line) {
                Ok(Request::Prefetch { targets }) => self.prefetch(targets, &mut write).await,
                Ok(request) => send(&mut write, &self.handle(request).await).await,
                Err(e) => {
                    let message = format!("bad request: {e}");
                    send(&mut write, &Response::Error { message }).await
                }
            };
            if sent.is_err() {
                return;
            }
        }
    }

    /// Streams progress every 200 ms until every file is settled. The copies go on if
    /// the client goes away: they are the cache's, not the connection's.
    async fn prefetch(
        &self,
        targets: Vec<Target>,
        write: &mut OwnedWriteHalf,
    ) -> std::io::Result<()> {
        let source = self.stager.source().clone();
        let model_dirs = Arc::clone(&self.model_dirs);
        let min_size = self.min_stage_size;
        let resolved = tokio::task::spawn_blocking(move || {
            let source = ModelSource {
                tree: &source,
                model_dirs: &model_dirs,
            };
            prefetch::resolve(source, &targets, min_size)
        })
        .await;
        let files = match resolved {
            Ok(Ok(files)) => files,
            Ok(Err(e)) => {
                return send(
                    write,
                    &Response::Error {
                        message: e.to_string(),
                    },
                )
                .await;
            }
            Err(e) => {
                return send(
                    write,
                    &Response::Error {
                        message: e.to_string(),
                    },
                )
                .await;
            }
        };
        let job = Job::new(self.stager.clone(), files);
        let running = tokio::spawn(Arc::clone(&job).run(self.prefetch_parallel, true));
        while !running.is_finished() {
            send(
                write,
                &Response::Progress {
                    files: job.progress(),
                },
            )
            .await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        send(
            write,
            &Response::Prefetched {
                files: job.progress(),
            },
        )
        .await
    }

    // Verify and status read the disk, so they run on the blocking pool; status also
    // walks the source, which may not answer: then it is answered without it.
    async fn handle(&self, request: Request) -> Response {
        // Only status walks the source; verify and evict read the cache alone and may
        // rightly take long (verify hashes everything).
        if request != Request::Status {
            return self.answer_request(request, true).await;
        }
        let with_source = self.answer_request(request.clone(), true);
        match tokio::time::timeout(self.source_timeout, with_source).await {
            Ok(response) => response,
            Err(_) => self.answer_request(request, false).await,
        }
    }

    async fn answer_request(&self, request: Request, use_source: bool) -> Response {
        let stager = self.stager.clone();
        let mountpoint = self.mountpoint.clone();
        let model_dirs = Arc::clone(&self.model_dirs);
        let answered = tokio::task::spawn_blocking(move || {
            let live = Live {
                metrics: Some(stager.metrics().snapshot()),
                in_flight: stager.in_flight(),
                mountpoint: Some(mountpoint),
            };
            let source = use_source.then(|| ModelSource {
                tree: stager.source(),
                model_dirs: &model_dirs,
            });
            control::answer(request, stager.store(), source, live)
        })
        .await;
        answered.unwrap_or_else(|e| Response::Error {
            message: format!("the request failed: {e}"),
        })
    }
}

async fn send(write: &mut OwnedWriteHalf, response: &Response) -> std::io::Result<()> {
    let mut out = serde_json::to_vec(response)?;
    out.push(b'\n');
    write.write_all(&out).await
}
