//! The mount's control socket: answers [`Request`]s from `stagefs` commands.
//! The socket is created private (0600) inside the cache directory.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::admin::{self, Live};
use crate::prefetch_plan::{self, FileProgress, FileState, Job, Target};
use stagefs_control::{Backend, EvictSelector, Request, Response, Stopping};
use stagefs_layout::models::ModelSource;
use stagefs_stage::Stager;
use stagefs_stage::offline::Part;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tracing::{debug, info, warn};

use crate::{MountError, MountSpec};

/// A bound control socket, not yet serving.
pub(crate) struct ControlServer {
    listener: UnixListener,
    stager: Stager,
    mountpoint: PathBuf,
    min_stage_size: u64,
    /// Files a prefetch copies at a time; None: by the source's kind.
    prefetch_parallel: Option<usize>,
    model_dirs: Arc<[PathBuf]>,
    /// How the mount reaches the kernel, and an NFS export's URL.
    backend: (Backend, Option<String>),
    /// How staged files are served, as `status` says it.
    pub(crate) read_path: String,
    read_only: bool,
    reads_source_when_full: bool,
    /// How far the mount has gone in stopping, set by the thread that stops it.
    pub(crate) stop_phase: StopPhase,
}

/// How far a mount has gone in stopping, shared by the thread that stops it and the
/// control socket, which answers status meanwhile (files still open there).
#[derive(Debug, Clone, Default)]
pub(crate) struct StopPhase(Arc<std::sync::Mutex<Option<Stopping>>>);

impl StopPhase {
    pub(crate) fn set(&self, phase: Stopping) {
        *stagefs_source::locks::lock(&self.0) = Some(phase);
    }

    fn get(&self) -> Option<Stopping> {
        *stagefs_source::locks::lock(&self.0)
    }
}

/// Binds the socket at `path`, replacing one left behind by a crashed mount (the
/// caller holds the cache lock, so no live mount can own it).
pub(crate) async fn bind(
    path: &Path,
    spec: &MountSpec,
    stager: Stager,
    export: Option<String>,
) -> Result<ControlServer, MountError> {
    let _ = fs::remove_file(path);
    let doing = || format!("creating control socket {}", path.display());
    let listener = UnixListener::bind(path).map_err(|e| MountError::io(doing(), e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))
        .map_err(|e| MountError::io(doing(), e))?;
    Ok(ControlServer {
        listener,
        stager,
        mountpoint: spec.mountpoint.clone(),
        min_stage_size: spec.fs.min_stage_size,
        prefetch_parallel: spec.fs.prefetch_parallel,
        model_dirs: spec.model_dirs.clone().into(),
        backend: (spec.backend, export),
        // Set by the caller, which decided it before mounting.
        read_path: String::new(),
        read_only: spec.fs.read_only,
        reads_source_when_full: spec.fs.on_full == stagefs_policy::OnFull::ReadSource,
        stop_phase: StopPhase::default(),
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
                Ok(Request::Prefetch {
                    targets,
                    dry_run: false,
                    parallel,
                }) => self.prefetch(targets, parallel, &mut write).await,
                Ok(Request::Prefetch {
                    targets,
                    dry_run: true,
                    ..
                }) => send(&mut write, &self.plan(targets).await).await,
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

    /// Streams progress every 200 ms until every file is settled. If the client goes
    /// away (`stagefs prefetch` interrupted), no more files are started; the copies
    /// under way finish, as they are the cache's, and an open may be waiting on one.
    /// `asked` files are copied at a time if the command asked, else the mount's own
    /// number.
    async fn prefetch(
        &self,
        targets: Vec<Target>,
        asked: Option<usize>,
        write: &mut OwnedWriteHalf,
    ) -> std::io::Result<()> {
        let source = self.stager.source().clone();
        let min_size = self.min_stage_size;
        let model_dirs = Arc::clone(&self.model_dirs);
        let parallel = asked.or(self.prefetch_parallel);
        let stager = self.stager.clone();
        if self.source_suspect() {
            let response = match self.prefetched_already(targets).await {
                Ok(files) => Response::Prefetched { files },
                Err(message) => Response::Error { message },
            };
            return send(write, &response).await;
        }
        let resolved = self
            .stager
            .source_pool()
            .run(move || {
                let source = ModelSource {
                    tree: &source,
                    model_dirs: &model_dirs,
                };
                let files = prefetch_plan::resolve(source, &targets, min_size);
                let failed = prefetch_plan::unfollowable(source, &targets);
                let parts = prefetch_plan::learned_parts(source, &targets);
                files.map(|files| (files, failed, parts, stager.prefetch_width(parallel)))
            })
            .await
            .map_err(|why| format!("the source did not answer ({why})"))
            .and_then(|resolved| resolved.map_err(|e| e.to_string()));
        let (files, failed, parts, width) = match resolved {
            Ok(planned) => planned,
            Err(message) => return send(write, &Response::Error { message }).await,
        };
        info!(
            files = files.len(),
            at_a_time = width,
            "prefetching on request"
        );
        let job = Job::reporting(self.stager.clone(), files, failed);
        let running = tokio::spawn(Arc::clone(&job).run(width, true));
        while !running.is_finished() {
            let progress = Response::Progress {
                files: job.progress(),
            };
            if let Err(e) = send(write, &progress).await {
                info!("the prefetch's command went away: starting no more of its files");
                job.stop();
                return Err(e);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let learning = self.learn_for_offline(parts);
        tokio::pin!(learning);
        loop {
            tokio::select! {
                () = &mut learning => break,
                () = tokio::time::sleep(Duration::from_millis(200)) => {
                    let progress = Response::Progress { files: job.progress() };
                    send(write, &progress).await?;
                }
            }
        }
        send(
            write,
            &Response::Prefetched {
                files: job.progress(),
            },
        )
        .await
    }

    /// A prefetch while the source is away: nothing to do for models whose files are
    /// all staged as the cache remembers them (`run --model` of a model ready
    /// offline goes on); refused, as nothing can be copied, for any other.
    async fn prefetched_already(&self, targets: Vec<Target>) -> Result<Vec<FileProgress>, String> {
        let min = self.min_stage_size;
        let planned = self
            .answer_from_remembered_source(move |stager, source| {
                let files =
                    prefetch_plan::resolve(source, &targets, min).map_err(|e| e.to_string())?;
                Ok::<_, String>(prefetch_plan::plan_with(stager, source.tree, &files))
            })
            .await?;
        let away = "the source is not answering; nothing can be staged from it now";
        let files = planned.map_err(|e| format!("{away} ({e})"))?;
        let missing = files
            .iter()
            .filter(|f| f.state != FileState::AlreadyStaged)
            .count();
        match missing {
            0 => Ok(files),
            n => Err(format!(
                "{away}, and {} of what was asked {} not staged",
                crate::prefetch_plan::files_phrase(n),
                if n == 1 { "is" } else { "are" }
            )),
        }
    }

    /// `answer` of the models as the cache remembers the source (its kept answers), on
    /// a thread where reading the cache may block.
    async fn answer_from_remembered_source<T: Send + 'static>(
        &self,
        answer: impl FnOnce(&Stager, ModelSource<'_>) -> T + Send + 'static,
    ) -> Result<T, String> {
        let (stager, dirs) = (self.stager.clone(), self.dirs());
        tokio::task::spawn_blocking(move || {
            let remembered = stager.remembered_source();
            let source = ModelSource {
                tree: &remembered,
                model_dirs: &dirs,
            };
            answer(&stager, source)
        })
        .await
        .map_err(|e| format!("the request failed: {e}"))
    }

    /// Asks the source for what loaders reach of the prefetched models besides their
    /// weights (listings, links, small files), so they load with it away. A failure
    /// leaves them short of that, which status says; the weights are staged anyway.
    async fn learn_for_offline(&self, parts: Vec<Part>) {
        let (stager, min) = (self.stager.clone(), self.min_stage_size);
        let learned = self
            .stager
            .source_pool()
            .run(move || stager.learn_tree(&parts, min))
            .await;
        let small = match learned {
            Ok(Ok(small)) => small,
            Ok(Err(e)) => {
                warn!(error = %e, "the prefetched models are not all ready offline: the source failed");
                return;
            }
            Err(why) => {
                warn!(%why, "the prefetched models are not all ready offline: the source did not answer");
                return;
            }
        };
        if let Err(e) = self.stager.keep_small_files(&small).await {
            warn!(error = %e, "the prefetched models are not all ready offline: a small file could not be kept");
        }
    }

    /// A dry run: what a prefetch would copy, asking the source while it answers, and
    /// listing the copies already staged from the cache alone once it looks stuck
    /// (at once while it is suspect), as status does.
    async fn plan(&self, targets: Vec<Target>) -> Response {
        let (asked, min_size) = (targets.clone(), self.min_stage_size);
        let planned = self.while_the_source_answers(move |stager, source| {
            prefetch_plan::resolve(source, &asked, min_size).map(|files| {
                let mut planned = prefetch_plan::plan(stager, &files);
                // Links that cannot be followed would fail the prefetch: said now.
                planned.extend(prefetch_plan::unfollowable(source, &asked));
                planned
            })
        });
        match planned.await {
            Some(Ok(files)) => return Response::Planned { files, note: None },
            Some(Err(e)) => {
                return Response::Error {
                    message: e.to_string(),
                };
            }
            None => {}
        }
        let note = format!(
            "the source {} is not answering: only copies already staged are listed",
            self.stager.source().root().display()
        );
        Response::Planned {
            files: prefetch_plan::staged_copies(self.stager.store(), &targets, self.min_stage_size),
            note: Some(note),
        }
    }

    /// Answers every request but prefetch. Only status and evict consult the
    /// source, and only while it answers: status and evict of staged data must
    /// answer at once while the NAS is away (without status's per-revision totals,
    /// and evicting by model id or cache path alone).
    async fn handle(&self, request: Request) -> Response {
        match request {
            Request::Status => self.status().await,
            Request::Evict { selector, dry_run } if !self.source_suspect() => {
                self.evict(selector, dry_run).await
            }
            Request::Evict { .. } | Request::Files { .. } if !self.source_suspect() => {
                let (stager, live, dirs) = (self.stager.clone(), self.live(), self.dirs());
                let asked = self.stager.source_pool().run(move || {
                    let source = ModelSource {
                        tree: stager.source(),
                        model_dirs: &dirs,
                    };
                    admin::answer(request, stager.store(), Some(source), live)
                });
                asked.await.unwrap_or_else(|why| Response::Error {
                    message: format!(
                        "the source did not answer ({why}); name the copies by model id, or try again"
                    ),
                })
            }
            Request::Evict { .. } | Request::Files { .. } => {
                self.answer_locally(request, false).await
            }
            Request::Names { paths } => self.names(paths).await,
            Request::Verify {
                model,
                path,
                repair,
            } => {
                self.verify(admin::verify_selector(model, path), repair)
                    .await
            }
            // Stats only names the source.
            request => self.answer_locally(request, true).await,
        }
    }

    /// Verify: the copies chosen, and which the source has moved past, asked of the
    /// source while it answers (else chosen from the cache alone, none of them known
    /// stale); then hashed on the blocking pool, which may take minutes, so no
    /// source thread waits on it.
    async fn verify(&self, selector: EvictSelector, repair: bool) -> Response {
        let asked = selector.clone();
        let from_source = self.while_the_source_answers(move |stager, source| {
            admin::to_verify(stager.store(), Some(source), &asked)
        });
        let stager = self.stager.clone();
        let chosen = from_source.await;
        let answered = tokio::task::spawn_blocking(move || {
            let copies = match chosen {
                Some(chosen) => chosen?,
                None => admin::to_verify(stager.store(), None, &selector)?,
            };
            Ok::<_, admin::AdminError>(admin::verify_copies(stager.store(), copies, repair))
        })
        .await;
        match answered {
            Ok(Ok(report)) => Response::Verified { report },
            Ok(Err(e)) => Response::Error {
                message: e.to_string(),
            },
            Err(e) => Response::Error {
                message: format!("the request failed: {e}"),
            },
        }
    }

    /// Names from the source's snapshots while it answers, else from the paths alone.
    async fn names(&self, paths: Vec<PathBuf>) -> Response {
        let asked = paths.clone();
        let from_source = self.while_the_source_answers(move |stager, source| {
            admin::answer(
                Request::Names { paths: asked },
                stager.store(),
                Some(source),
                Live::default(),
            )
        });
        match from_source.await {
            Some(response) => response,
            // A blob the mount reached through a snapshot link is named by that link;
            // any other by its path alone (`org/name: blob 1a2b3c4d5e6f…`).
            None => {
                let through = |p: &PathBuf| self.stager.reached_through(p);
                let named: Vec<PathBuf> = (paths.iter())
                    .map(|p| through(p).unwrap_or_else(|| p.clone()))
                    .collect();
                Response::Names {
                    names: crate::admin::names(None, &named),
                }
            }
        }
    }

    /// Status with the source's per-revision totals if it answers before it looks
    /// stuck, else without them, at once.
    async fn status(&self) -> Response {
        let live = self.live();
        let with_source = self.while_the_source_answers(move |stager, source| {
            // Those repaired on the source since are no longer refused.
            let live = Live {
                refused: stager.refused_now(),
                ..live
            };
            admin::answer(Request::Status, stager.store(), Some(source), live)
        });
        let response = match with_source.await {
            Some(response) => response,
            None => self.status_without_source().await,
        };
        self.with_offline_readiness(response).await
    }

    /// Adds to each model of a status whether it loads with the source away, from
    /// the cache alone.
    async fn with_offline_readiness(&self, response: Response) -> Response {
        let Response::Status { mut report } = response else {
            return response;
        };
        let stager = self.stager.clone();
        let filled = tokio::task::spawn_blocking(move || {
            for model in &mut report.models {
                crate::offline::fill_readiness(&stager, model);
            }
            report
        })
        .await;
        match filled {
            Ok(report) => Response::Status { report },
            Err(e) => Response::Error {
                message: format!("the request failed: {e}"),
            },
        }
    }

    /// Runs `ask` on the source pool and returns its answer, unless the source is
    /// suspect now or becomes so first: then None at once, and the caller answers
    /// from the cache alone.
    async fn while_the_source_answers<T: Send + 'static>(
        &self,
        ask: impl for<'a> FnOnce(&'a Stager, ModelSource<'a>) -> T + Send + 'static,
    ) -> Option<T> {
        if self.source_suspect() {
            return None;
        }
        let (stager, dirs) = (self.stager.clone(), self.dirs());
        let asked = self.stager.source_pool().run(move || {
            let source = ModelSource {
                tree: stager.source(),
                model_dirs: &dirs,
            };
            ask(&stager, source)
        });
        tokio::select! {
            Ok(answer) = asked => Some(answer),
            () = self.stager.source_pool().until_suspect() => None,
        }
    }

    /// Status from the cache alone, still naming the source it could not ask: its
    /// models and totals as the cache remembers the source.
    async fn status_without_source(&self) -> Response {
        let live = self.live();
        let answered = self
            .answer_from_remembered_source(move |stager, source| {
                admin::answer(Request::Status, stager.store(), Some(source), live)
            })
            .await
            .unwrap_or_else(|message| Response::Error { message });
        match answered {
            Response::Status { mut report } => {
                report.source = Some(self.stager.source().root().to_path_buf());
                Response::Status { report }
            }
            other => other,
        }
    }

    /// Status and evict must answer at once while the source is away.
    fn source_suspect(&self) -> bool {
        self.stager.source_pool().suspect()
    }

    fn dirs(&self) -> Arc<[PathBuf]> {
        Arc::clone(&self.model_dirs)
    }

    fn live(&self) -> Live {
        Live {
            metrics: Some(self.stager.metrics().snapshot()),
            in_flight: self.stager.in_flight(),
            mountpoint: Some(self.mountpoint.clone()),
            source_health: Some(self.stager.source_pool().health()),
            backend: Some(self.backend.clone()),
            read_path: Some(self.read_path.clone()),
            read_only: self.read_only,
            reads_source_when_full: self.reads_source_when_full,
            refused: self.stager.refused_blobs(),
            failures: self.stager.recent_failures(),
            stopping: self.stop_phase.get(),
        }
    }

    /// Answers without asking the source anything, on the blocking pool (verify
    /// hashes copies). `name_source` hands the source over for its name only.
    /// Evicts what `selector` names: chosen on the source pool (the source resolves
    /// snapshot links), removed off it, since a removal may wait seconds for NFS
    /// clients to stop following links to a copy, and a source thread held that
    /// long would make the source look hung.
    async fn evict(&self, selector: EvictSelector, dry_run: bool) -> Response {
        let (stager, dirs) = (self.stager.clone(), self.dirs());
        let chosen = self.stager.source_pool().run(move || {
            let source = ModelSource {
                tree: stager.source(),
                model_dirs: &dirs,
            };
            let now = stagefs_source::sys::now_secs();
            admin::choose_for_eviction(stager.store(), Some(source), &selector, now)
        });
        let chosen = match chosen.await {
            Ok(Ok(chosen)) => chosen,
            Ok(Err(e)) => return admin::error_response(e),
            Err(why) => {
                return Response::Error {
                    message: format!(
                        "the source did not answer ({why}); name the copies by model id, or try again"
                    ),
                };
            }
        };
        let stager = self.stager.clone();
        let removed = tokio::task::spawn_blocking(move || {
            admin::evict_chosen(stager.store(), chosen, dry_run)
        })
        .await;
        match removed {
            Ok(Ok(report)) => Response::Evicted { report },
            Ok(Err(e)) => admin::error_response(e),
            Err(e) => Response::Error {
                message: format!("the request failed: {e}"),
            },
        }
    }

    async fn answer_locally(&self, request: Request, name_source: bool) -> Response {
        let (stager, live, dirs) = (self.stager.clone(), self.live(), self.dirs());
        let answered = tokio::task::spawn_blocking(move || {
            let source = name_source.then(|| ModelSource {
                tree: stager.source(),
                model_dirs: &dirs,
            });
            admin::answer(request, stager.store(), source, live)
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
