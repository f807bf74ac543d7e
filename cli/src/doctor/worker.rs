//! Every step that touches the source (or a path that may lie on a dead mount) runs
//! in a child process: `stagefs --no-config doctor --worker`,
//! which reads one [`Step`] as JSON on stdin and prints its answer as JSON. A step
//! that is late is abandoned: the child is killed, and if the kernel holds it in a
//! FUSE request it dies when that request ends, while doctor itself exits on time.

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use stagefs_cache::SourceTree;
use stagefs_cache::models::{self, Shape, Survey};

use super::bounded::{Unanswered, bounded};
use super::fskind::FsInfo;
use super::model::{self, Model};
use super::mounts;
use super::probe::{self, Probe};
use super::source::{self, Located};
use super::space::{self, Place};

/// What a step reports when it ran but failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StepError {
    /// The path did not exist (a bad argument rather than a broken source).
    pub(crate) not_found: bool,
    pub(crate) message: String,
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<io::Error> for StepError {
    fn from(e: io::Error) -> Self {
        StepError {
            not_found: e.kind() == io::ErrorKind::NotFound,
            message: e.to_string(),
        }
    }
}

impl From<anyhow::Error> for StepError {
    fn from(e: anyhow::Error) -> Self {
        StepError {
            not_found: false,
            message: format!("{e:#}"),
        }
    }
}

/// A step's outcome: its answer or error, or no answer at all.
pub(crate) type Answer<T> = Result<Result<T, StepError>, Unanswered>;

/// The steps a worker runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
enum Step {
    Locate {
        path: PathBuf,
    },
    Filesystem {
        path: PathBuf,
        resolve: bool,
    },
    Canonicalize {
        path: PathBuf,
    },
    Exists {
        path: PathBuf,
    },
    FindModel {
        hub: PathBuf,
        id: String,
        model_dirs: Vec<PathBuf>,
    },
    Survey {
        path: PathBuf,
        model_dirs: Vec<PathBuf>,
    },
    Shape {
        path: PathBuf,
    },
    ModelContaining {
        path: PathBuf,
    },
    FileToMeasure {
        path: PathBuf,
        is_file: bool,
    },
    Probe {
        file: PathBuf,
    },
    CachePlace {
        dir: PathBuf,
    },
}

impl Step {
    /// Runs the step in this process; the answer as JSON.
    fn execute(self) -> serde_json::Result<String> {
        match self {
            Step::Locate { path } => reply(source::locate(&path).map_err(StepError::from)),
            Step::Filesystem { path, resolve } => {
                reply(filesystem(&path, resolve).map_err(StepError::from))
            }
            Step::Canonicalize { path } => {
                reply(std::fs::canonicalize(path).map_err(StepError::from))
            }
            Step::Exists { path } => reply(Ok::<_, StepError>(path.exists())),
            Step::FindModel {
                hub,
                id,
                model_dirs,
            } => reply(model::find(&hub, &id, &model_dirs).map_err(StepError::from)),
            Step::Survey { path, model_dirs } => reply(
                SourceTree::new(path)
                    .map(|tree| models::survey(&tree, &model_dirs))
                    .map_err(|e| StepError::from(anyhow::Error::from(e))),
            ),
            Step::Shape { path } => reply(
                SourceTree::new(path)
                    .map(|tree| models::shape(&tree))
                    .map_err(|e| StepError::from(anyhow::Error::from(e))),
            ),
            Step::ModelContaining { path } => {
                reply(model::containing(&path).map_err(StepError::from))
            }
            Step::FileToMeasure { path, is_file } => {
                let file = if is_file {
                    Some(path)
                } else {
                    model::largest_file(&path).map(|(p, _)| p)
                };
                reply(Ok::<_, StepError>(file))
            }
            Step::Probe { file } => reply(probe::measure(&file).map_err(StepError::from)),
            Step::CachePlace { dir } => reply(space::place(&dir).map_err(StepError::from)),
        }
    }
}

fn reply<T: Serialize>(result: Result<T, StepError>) -> serde_json::Result<String> {
    serde_json::to_string(&result)
}

fn filesystem(path: &Path, resolve: bool) -> io::Result<FsInfo> {
    if resolve {
        mounts::filesystem_of(&std::fs::canonicalize(path)?)
    } else {
        mounts::filesystem_of(path)
    }
}

/// The worker's side: one step from stdin, its answer on stdout.
pub(crate) fn serve() -> anyhow::Result<ExitCode> {
    let mut request = String::new();
    io::stdin().read_to_string(&mut request)?;
    let step: Step = serde_json::from_str(&request)?;
    println!("{}", step.execute()?);
    Ok(ExitCode::SUCCESS)
}

/// Resolves `path`, finds its filesystem and whether it is a file.
pub(crate) fn locate(path: &Path, timeout: Duration) -> Answer<Located> {
    ask(&Step::Locate { path: path.into() }, timeout)
}

/// The filesystem holding `path`; `resolve` follows links first (without, only the
/// mount table is read on Linux, which works even when the path does not answer).
pub(crate) fn filesystem_of(path: &Path, resolve: bool, timeout: Duration) -> Answer<FsInfo> {
    ask(
        &Step::Filesystem {
            path: path.into(),
            resolve,
        },
        timeout,
    )
}

pub(crate) fn canonicalize(path: &Path, timeout: Duration) -> Answer<PathBuf> {
    ask(&Step::Canonicalize { path: path.into() }, timeout)
}

pub(crate) fn exists(path: &Path, timeout: Duration) -> Answer<bool> {
    ask(&Step::Exists { path: path.into() }, timeout)
}

/// Model `id` in the source `hub`.
pub(crate) fn find_model(
    hub: &Path,
    id: &str,
    model_dirs: &[PathBuf],
    timeout: Duration,
) -> Answer<Option<Model>> {
    ask(
        &Step::FindModel {
            hub: hub.into(),
            id: id.into(),
            model_dirs: model_dirs.to_vec(),
        },
        timeout,
    )
}

/// The shape of the source at `path` alone (no search unless it is neither an
/// HF_HOME nor a hub cache).
pub(crate) fn shape(path: &Path, timeout: Duration) -> Answer<Shape> {
    ask(&Step::Shape { path: path.into() }, timeout)
}

/// The shape of the source at `path` and the models in it.
pub(crate) fn survey(path: &Path, model_dirs: &[PathBuf], timeout: Duration) -> Answer<Survey> {
    ask(
        &Step::Survey {
            path: path.into(),
            model_dirs: model_dirs.to_vec(),
        },
        timeout,
    )
}

/// The model `path` lies in, if any.
pub(crate) fn model_containing(path: &Path, timeout: Duration) -> Answer<Option<Model>> {
    ask(&Step::ModelContaining { path: path.into() }, timeout)
}

/// `path` itself if it is a file, else the largest file found under it.
pub(crate) fn file_to_measure(
    path: &Path,
    is_file: bool,
    timeout: Duration,
) -> Answer<Option<PathBuf>> {
    ask(
        &Step::FileToMeasure {
            path: path.into(),
            is_file,
        },
        timeout,
    )
}

pub(crate) fn probe(file: &Path, timeout: Duration) -> Answer<Probe> {
    ask(&Step::Probe { file: file.into() }, timeout)
}

/// Where the cache directory is and how much room its volume has.
pub(crate) fn cache_place(dir: &Path, timeout: Duration) -> Answer<Place> {
    ask(&Step::CachePlace { dir: dir.into() }, timeout)
}

/// Runs `step` in a worker and waits at most `timeout` for its answer.
fn ask<T: DeserializeOwned>(step: &Step, timeout: Duration) -> Answer<T> {
    let broken = |what: &str, e: &dyn std::fmt::Display| Unanswered::Broken(format!("{what}: {e}"));
    let request = serde_json::to_string(step).map_err(|e| broken("encoding the step", &e))?;
    let answer = run(request, timeout)?;
    serde_json::from_str(&answer).map_err(|e| broken("reading the worker's answer", &e))
}

/// Unit tests have no stagefs binary to start; they run steps on a thread.
#[cfg(test)]
fn run(request: String, timeout: Duration) -> Result<String, Unanswered> {
    bounded(timeout, move || {
        serde_json::from_str::<Step>(&request)
            .and_then(Step::execute)
            .map_err(|e| Unanswered::Broken(e.to_string()))
    })?
}

#[cfg(not(test))]
fn run(request: String, timeout: Duration) -> Result<String, Unanswered> {
    use std::io::Write;
    use std::process::{Command, Stdio};

    let broken = |what: &str, e: io::Error| Unanswered::Broken(format!("{what}: {e}"));
    let exe = std::env::current_exe().map_err(|e| broken("finding the stagefs executable", e))?;
    // Its own pipes, never doctor's stdout or stderr: a worker stuck in the kernel
    // would otherwise keep whoever reads doctor's output waiting.
    let mut child = Command::new(exe)
        .args(["--no-config", "doctor", "--worker"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| broken("starting a worker", e))?;
    // A few hundred bytes: they fit in the pipe whatever the worker does.
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(request.as_bytes())
            .map_err(|e| broken("talking to the worker", e))?;
    }
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| Unanswered::Broken("the worker has no stdout".into()))?;
    let read = bounded(timeout, move || {
        let mut answer = String::new();
        stdout.read_to_string(&mut answer).map(|_| answer)
    });
    match read {
        Ok(Ok(answer)) => {
            let _ = child.wait();
            Ok(answer)
        }
        Ok(Err(e)) => Err(broken("reading the worker's answer", e)),
        Err(late) => {
            // No wait: the kernel may hold it until the source answers.
            let _ = child.kill();
            tracing::debug!("abandoned worker {} after {late}", child.id());
            Err(late)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::bounded::SOURCE_TIMEOUT;

    #[test]
    fn steps_round_trip_through_json() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("f");
        std::fs::write(&file, [1u8; 8192])?;
        let located = locate(&file, SOURCE_TIMEOUT)
            .expect("answered")
            .expect("located");
        assert!(located.is_file);
        assert_eq!(exists(&file, SOURCE_TIMEOUT), Ok(Ok(true)));
        let missing = canonicalize(&dir.path().join("nope"), SOURCE_TIMEOUT).expect("answered");
        assert!(missing.expect_err("missing").not_found);
        let probe = probe(&file, SOURCE_TIMEOUT)
            .expect("answered")
            .expect("measured");
        assert_eq!(probe.bytes_read, 8192);
        Ok(())
    }
}
