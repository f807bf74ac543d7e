//! Working on a cache directory: through the mount that serves it when one answers on
//! its control socket, else on the directory itself, under its lock (so never while
//! a mount owns it).

use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::admin::{self, AdminError, Live};
use crate::place::open_recorded_source;
use crate::prefetch_plan::{self, FileProgress, Job, Target};
use stagefs_control::{self as control, MountRecord, Request, Response};
use stagefs_layout::models::ModelSource;
use stagefs_source::SourceError;
use stagefs_stage::Stager;
use stagefs_store::{Store, StoreError};
use tokio::runtime::Runtime;

/// Why a request on a cache directory got no answer.
#[derive(Debug, thiserror::Error)]
pub enum CacheDirError {
    /// The directory holds no stagefs cache.
    #[error("{} is not a stagefs cache directory", .0.display())]
    NotACache(PathBuf),
    /// Another process holds the lock but no mount answers on the socket.
    #[error(
        "the cache {} is locked by another stagefs process{} whose control socket does not answer; if no mount is running, that process is stuck: stop it and retry",
        dir.display(),
        pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    Stuck {
        /// The cache directory.
        dir: PathBuf,
        /// The lock holder, if it recorded itself.
        pid: Option<u32>,
    },
    /// The cache could not be opened.
    #[error(transparent)]
    Store(StoreError),
    /// No mount ever recorded its source here.
    #[error("this cache has never been mounted, so its source is unknown")]
    NeverMounted,
    /// The source a mount recorded cannot be opened.
    #[error("the source {} is not reachable", path.display())]
    SourceUnreachable {
        /// The recorded source.
        path: PathBuf,
        /// Why.
        #[source]
        source: SourceError,
    },
    /// A path is in neither the mount nor the source of this cache.
    #[error("{} is neither inside the mount {} nor the source {}", path.display(), mountpoint.display(), source_dir.display())]
    Outside {
        /// As given.
        path: PathBuf,
        /// The recorded mount point.
        mountpoint: PathBuf,
        /// The recorded source.
        source_dir: PathBuf,
    },
    /// The control socket failed other than by being absent.
    #[error("talking to the running mount")]
    Socket(#[source] io::Error),
    /// The mount, or the cache itself, refused the request.
    #[error("{0}")]
    Refused(String),
    /// The targets could not be resolved in the source.
    #[error(transparent)]
    Resolve(AdminError),
    /// The answer was not one the request has.
    #[error("unexpected answer from the mount: {0}")]
    Unexpected(String),
    /// Some other system call failed.
    #[error("{doing}")]
    Io {
        /// What was being done.
        doing: String,
        /// What the system said.
        #[source]
        source: io::Error,
    },
}

impl CacheDirError {
    /// The answer was not the kind the request has.
    pub fn unexpected(response: &Response) -> CacheDirError {
        CacheDirError::Unexpected(format!("{response:?}"))
    }
}

/// Whether no mount listens on the socket (none, or one left by a dead daemon).
fn no_mount(e: &io::Error) -> bool {
    // NotADirectory: the "cache directory" named is a file, so no mount serves from it.
    matches!(
        e.kind(),
        ErrorKind::NotFound | ErrorKind::ConnectionRefused | ErrorKind::NotADirectory
    )
}

/// Sends `request` to the mount serving from `dir`, or answers it from `dir`
/// directly when none runs. A `Response::Error` becomes [`CacheDirError::Refused`].
pub fn ask(dir: &Path, request: Request) -> Result<Response, CacheDirError> {
    let response = match control::query(&control::socket_path(dir), &request) {
        Ok(response) => response,
        Err(e) if no_mount(&e) => answer_locally(dir, request)?,
        Err(e) => return Err(CacheDirError::Socket(e)),
    };
    match response {
        Response::Error { message } => Err(CacheDirError::Refused(message)),
        response => Ok(response),
    }
}

fn answer_locally(dir: &Path, request: Request) -> Result<Response, CacheDirError> {
    let (store, record) = open_locally(dir)?;
    let model_dirs = record
        .as_ref()
        .map(|r| r.model_dirs.clone())
        .unwrap_or_default();
    let tree = record.and_then(|r| open_recorded_source(&r.source).ok());
    let source = tree.as_ref().map(|tree| ModelSource {
        tree,
        model_dirs: &model_dirs,
    });
    Ok(admin::answer(request, &store, source, Live::default()))
}

/// Opens the cache directory itself (no mount may be running), with what its last
/// mount recorded.
fn open_locally(dir: &Path) -> Result<(Store, Option<MountRecord>), CacheDirError> {
    if !dir.join(stagefs_store::LAYOUT_DIR).is_dir() {
        return Err(CacheDirError::NotACache(dir.to_path_buf()));
    }
    let record = MountRecord::read(dir);
    let budget = record.as_ref().map(|r| r.budget).unwrap_or_default();
    let store = Store::open(dir, budget).map_err(|e| match e {
        StoreError::Locked { pid, .. } => CacheDirError::Stuck {
            dir: dir.to_path_buf(),
            pid,
        },
        other => CacheDirError::Store(other),
    })?;
    Ok((store, record))
}

/// How users know the files at `paths` (source paths), in order
/// ([`crate::admin::names`]): asked of the mount serving from `dir`, else
/// worked out from the source its last mount recorded (no lock needed: only the
/// source is read), else from the paths alone.
pub fn names(dir: &Path, paths: &[PathBuf]) -> Vec<String> {
    let request = Request::Names {
        paths: paths.to_vec(),
    };
    match control::query(&control::socket_path(dir), &request) {
        Ok(Response::Names { names }) if names.len() == paths.len() => return names,
        Err(e) if no_mount(&e) => {
            let tree = MountRecord::read(dir).and_then(|r| open_recorded_source(&r.source).ok());
            return crate::admin::names(tree.as_ref(), paths);
        }
        _ => {}
    }
    crate::admin::names(None, paths)
}

/// Stages `targets` into the cache at `dir`, through its mount if one runs, else
/// straight into the directory; `progress` hears about every file now and then.
/// `parallel` files are copied at a time; through a mount, that many if `asked`,
/// else as many as the mount copies at a time.
/// Returns every file's final state (failures included: they are not an error here).
pub fn prefetch(
    dir: &Path,
    targets: Vec<Target>,
    (parallel, asked): (usize, bool),
    mut progress: impl FnMut(&[FileProgress]),
) -> Result<Vec<FileProgress>, CacheDirError> {
    let request = Request::Prefetch {
        targets: targets.clone(),
        dry_run: false,
        parallel: asked.then_some(parallel),
    };
    let socket = control::socket_path(dir);
    let answers = match control::stream(&socket, &request) {
        Ok(answers) => answers,
        Err(e) if no_mount(&e) => return prefetch_locally(dir, &targets, parallel, progress),
        Err(e) => return Err(CacheDirError::Socket(e)),
    };
    for answer in answers {
        match answer.map_err(CacheDirError::Socket)? {
            Response::Progress { files } => progress(&files),
            Response::Prefetched { files } => return Ok(files),
            Response::Error { message } => return Err(CacheDirError::Refused(message)),
            other => return Err(CacheDirError::unexpected(&other)),
        }
    }
    Err(CacheDirError::Refused(
        "the mount closed the connection before the prefetch finished".into(),
    ))
}

/// What a prefetch of `targets` would copy and what is staged already, copying
/// nothing: asked of the mount if one runs, else of the directory and its source.
/// The note says what limited the answer (the mount's source not answering).
pub fn plan(
    dir: &Path,
    targets: Vec<Target>,
) -> Result<(Vec<FileProgress>, Option<String>), CacheDirError> {
    let request = Request::Prefetch {
        targets: targets.clone(),
        dry_run: true,
        parallel: None,
    };
    match control::query(&control::socket_path(dir), &request) {
        Ok(Response::Planned { files, note }) => Ok((files, note)),
        Ok(Response::Error { message }) => Err(CacheDirError::Refused(message)),
        Ok(other) => Err(CacheDirError::unexpected(&other)),
        Err(e) if no_mount(&e) => plan_locally(dir, &targets).map(|files| (files, None)),
        Err(e) => Err(CacheDirError::Socket(e)),
    }
}

fn plan_locally(dir: &Path, targets: &[Target]) -> Result<Vec<FileProgress>, CacheDirError> {
    let local = local_files(dir, targets)?;
    let mut files = prefetch_plan::plan(&local.stager, &local.files);
    files.extend(local.failed);
    Ok(files)
}

fn prefetch_locally(
    dir: &Path,
    targets: &[Target],
    parallel: usize,
    mut progress: impl FnMut(&[FileProgress]),
) -> Result<Vec<FileProgress>, CacheDirError> {
    let Local {
        stager,
        files,
        failed,
        parts,
        min_stage_size,
        runtime,
    } = local_files(dir, targets)?;
    let job = Job::reporting(stager.clone(), files, failed);
    let running = runtime.spawn(Arc::clone(&job).run(parallel, true));
    while !running.is_finished() {
        progress(&job.progress());
        std::thread::sleep(Duration::from_millis(200));
    }
    // Then what loaders reach besides the weights, as a mount's prefetch does.
    let learning = runtime.spawn(async move {
        let learner = stager.clone();
        let learned = stager
            .source_pool()
            .run(move || learner.learn_tree(&parts, min_stage_size))
            .await;
        match learned {
            Ok(Ok(small)) => stager.keep_small_files(&small).await,
            Ok(Err(e)) => Err(e.to_string()),
            Err(why) => Err(format!("the source did not answer ({why})")),
        }
    });
    while !learning.is_finished() {
        progress(&job.progress());
        std::thread::sleep(Duration::from_millis(200));
    }
    if let Ok(Err(e)) = runtime.block_on(learning) {
        tracing::warn!(error = %e, "the prefetched models are not all ready offline");
    }
    Ok(job.progress())
}

/// What a command works on when no mount runs: a stager over the cache directory and
/// the source its last mount recorded, and the files the targets name there.
struct Local {
    stager: Stager,
    files: Vec<(PathBuf, u64)>,
    /// Links the targets hold that lead to no file (a prefetch reports them failed).
    failed: Vec<FileProgress>,
    /// What loaders reach of the targets' models besides the files.
    parts: Vec<stagefs_stage::offline::Part>,
    /// The recorded mount's smallest staged size.
    min_stage_size: u64,
    /// Where the stager's copies run.
    runtime: Runtime,
}

/// [`Local`] for the cache at `dir` and `targets`.
fn local_files(dir: &Path, targets: &[Target]) -> Result<Local, CacheDirError> {
    let (store, record) = open_locally(dir)?;
    let record = record.ok_or(CacheDirError::NeverMounted)?;
    let source = open_recorded_source(&record.source).map_err(|source| {
        CacheDirError::SourceUnreachable {
            path: record.source.clone(),
            source,
        }
    })?;
    let runtime = Runtime::new().map_err(|source| CacheDirError::Io {
        doing: "starting the copy runtime".into(),
        source,
    })?;
    let models = ModelSource {
        tree: &source,
        model_dirs: &record.model_dirs,
    };
    let files = prefetch_plan::resolve(models, targets, record.min_stage_size)
        .map_err(CacheDirError::Resolve)?;
    let failed = prefetch_plan::unfollowable(models, targets);
    let parts = prefetch_plan::learned_parts(models, targets);
    let stager = Stager::new(source, store, Arc::default(), runtime.handle().clone());
    Ok(Local {
        stager,
        files,
        failed,
        parts,
        min_stage_size: record.min_stage_size,
        runtime,
    })
}

/// `path`, inside the mount or the source of the cache at `dir`, relative to the
/// source root.
pub fn source_relative(path: &Path, dir: &Path) -> Result<PathBuf, CacheDirError> {
    // Only the directories are resolved, not the final name: in a mount without
    // kernel passthrough a staged file is a link to its copy in the cache, and
    // following it would leave the mount (and count as a use of the copy). The
    // mount resolves a snapshot link to its blob itself, from the source.
    let resolving = |source| CacheDirError::Io {
        doing: format!("resolving {}", path.display()),
        source,
    };
    let absolute = std::path::absolute(path).map_err(resolving)?;
    let real = match (absolute.parent(), absolute.file_name()) {
        (Some(parent), Some(name)) => parent.canonicalize().map_err(resolving)?.join(name),
        _ => absolute.canonicalize().map_err(resolving)?,
    };
    let record = MountRecord::read(dir).ok_or(CacheDirError::NeverMounted)?;
    // `stagefs serve` records no mount point (an empty path, which every path
    // starts with).
    let roots = [&record.mountpoint, &record.source];
    for root in roots.into_iter().filter(|r| !r.as_os_str().is_empty()) {
        let root = root.canonicalize().unwrap_or_else(|_| root.clone());
        if let Ok(rel) = real.strip_prefix(&root) {
            return Ok(rel.to_path_buf());
        }
    }
    Err(CacheDirError::Outside {
        path: path.to_path_buf(),
        mountpoint: record.mountpoint,
        source_dir: record.source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_in_the_source_of_a_served_export_is_made_relative() -> std::io::Result<()> {
        let (cache, source) = (tempfile::TempDir::new()?, tempfile::TempDir::new()?);
        std::fs::create_dir_all(source.path().join("models/m"))?;
        let record = MountRecord {
            source: source.path().to_path_buf(),
            // What `stagefs serve` records: no mount point.
            mountpoint: PathBuf::new(),
            budget: stagefs_control::Budget {
                max_size: None,
                min_free: None,
            },
            min_stage_size: 1 << 20,
            model_dirs: Vec::new(),
            backend: stagefs_control::Backend::Nfs,
            source_fs: None,
        };
        record.write(cache.path())?;
        let rel = source_relative(&source.path().join("models/m"), cache.path());
        assert_eq!(rel.ok(), Some(PathBuf::from("models/m")));
        Ok(())
    }
}
