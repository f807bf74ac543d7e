//! What the worker's probes answer, one [`Line`] each, and what they were asked
//! about: the types the worker and every check share. The checks read the lines
//! (`got!`); the worker only runs the probes and carries their lines, so the checks
//! depend on this module and not on the worker that runs them.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use stagefs_layout::hf;
use stagefs_layout::models::{self, Shape, Survey};
use stagefs_source::fskind::FsInfo;
// Why a probe has no answer: the words `mount` uses for a source that does not answer.
use stagefs_mount::bounded::Unanswered;
use stagefs_store::budget::VolumeSpace;

use super::model::{Model, Probe};

/// How long one doctor run waits for its worker's answers.
pub(crate) const DEADLINE: Duration = Duration::from_secs(15);

/// The answer of the probe printed as `Line::$kind`, if it came.
macro_rules! got {
    ($gathered:expr, $kind:ident) => {
        $gathered.lines.iter().find_map(|line| match line {
            $crate::doctor::lines::Line::$kind(answer) => Some(answer),
            _ => None,
        })
    };
}

/// What doctor was asked to look at: nothing (no argument and no configured source),
/// a directory or file (the argument, or the configured source), or a model id in
/// the configured source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Target {
    Nothing,
    Path { path: PathBuf, configured: bool },
    Model { id: String, hub: PathBuf },
}

impl Target {
    /// What to look at: a model id in the configured `source` (`org/name`, or a
    /// short name such as a folder's, as prefetch takes them), unless a path of that
    /// name exists here; a path; or the configured source. A path that is the
    /// configured source (compared lexically: the source may not answer) counts as
    /// configured, so its shape decides the advice.
    pub(crate) fn of(
        arg: Option<&str>,
        source: Option<&Path>,
        exists: impl Fn(&Path) -> bool,
    ) -> Result<Target, String> {
        let path = |path: PathBuf, configured| Target::Path { path, configured };
        let Some(arg) = arg else {
            return Ok(source.map_or(Target::Nothing, |s| path(s.into(), true)));
        };
        let is_id = match source {
            Some(_) => models::is_model_id(arg),
            None => hf::repo_dir_for(arg).is_some(),
        };
        if !is_id || exists(Path::new(arg)) {
            let absolute = std::path::absolute(arg).map_err(|e| e.to_string())?;
            let same = |s: &Path| hf::normalize(&absolute) == hf::normalize(s);
            let configured = source.is_some_and(same);
            return Ok(path(absolute, configured));
        }
        let hub = source.ok_or_else(|| format!("{arg} is a model id, but no source is configured: set `source` in the config file, or pass the directory to examine"))?;
        let (id, hub) = (arg.into(), hub.into());
        Ok(Target::Model { id, hub })
    }

    /// The path examined, whether it is the configured source, and the model asked for.
    pub(crate) fn parts(&self) -> Option<(&Path, bool, Option<&str>)> {
        match self {
            Target::Nothing => None,
            Target::Path { path, configured } => Some((path, *configured, None)),
            Target::Model { id, hub } => Some((hub, true, Some(id))),
        }
    }
}

/// A path's place: resolved, its filesystem, and whether it is a file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Located {
    pub(crate) canonical: PathBuf,
    pub(crate) fs: FsInfo,
    pub(crate) is_file: bool,
}

/// Where the cache directory is: resolved as far as it exists, whether it does, its
/// filesystem and its volume's space.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Place(
    pub(crate) PathBuf,
    pub(crate) bool,
    pub(crate) FsInfo,
    pub(crate) VolumeSpace,
);

/// One finished probe.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Line {
    Target(Result<Target, String>),
    /// The filesystem the examined path lies on by its name alone (the mount table).
    Lexical(FsInfo),
    Located(Result<Located, StepError>),
    /// The filesystem of a stagefs mount's source.
    SourceFs(Option<FsInfo>),
    Survey(Result<Survey, StepError>),
    /// The source root the examined path lies inside (a stagefs mount's source, or
    /// the configured source), whose shape the survey describes.
    Within(PathBuf),
    Model(Result<Option<Model>, StepError>),
    /// For a whole source (no model named or containing the path): the first of a few
    /// of its models whose links lead to no file.
    Unfollowable(Option<Model>),
    /// The measurement; None when there is no file to measure.
    Measured(Result<Option<Probe>, StepError>),
    Cache(Result<Place, StepError>),
    /// The mount served from the cache directory, as (source, mount point).
    Daemon(Result<Option<(PathBuf, PathBuf)>, String>),
    /// The filesystem the configured mount point lies on, when no daemon answered.
    MountFs(FsInfo),
    /// Whether the configured mount point, when no daemon answered, is an empty
    /// directory (`true`) or holds entries; an error when it cannot be listed.
    MountEmpty(Result<bool, StepError>),
    /// A path and the same path with links resolved.
    Resolved(PathBuf, PathBuf),
    /// The shape of the source of the mount the cache directory serves at the
    /// configured mount point.
    MountShape(Shape),
    /// The blobs the running mount refuses (their bytes are not their names'), each
    /// as (path in the source, the name users know it by).
    Refused(Vec<(PathBuf, String)>),
}

/// What a probe reports when it ran but failed; `not_found` when the path did not
/// exist (a bad argument rather than a broken source), and the errno where the
/// system gave one, which tells a dead mount and a refused permission apart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub(crate) struct StepError {
    pub(crate) not_found: bool,
    pub(crate) message: String,
    #[serde(default)]
    pub(crate) errno: Option<i32>,
}

impl StepError {
    pub(crate) fn of(e: impl Into<anyhow::Error>) -> StepError {
        let e = e.into();
        let io = e.downcast_ref::<io::Error>();
        let not_found = io.is_some_and(|io| io.kind() == io::ErrorKind::NotFound);
        let message = stagefs_source::without_os_error(&format!("{e:#}"));
        let (errno, message) = (io.and_then(io::Error::raw_os_error), message);
        StepError {
            not_found,
            message,
            errno,
        }
    }

    /// Whether the errno says the mount the path is on is dead: its FUSE process (or
    /// the connection under it) is gone, and every request fails at once.
    pub(crate) fn dead_mount(&self) -> bool {
        self.errno == Some(libc::ENOTCONN)
    }

    /// Whether the errno says the source's server or the network to it is away
    /// (ESTALE, EHOSTDOWN, ...), as the mount's source pool judges it.
    pub(crate) fn away(&self) -> bool {
        let errno = self.errno.map(io::Error::from_raw_os_error);
        errno.is_some_and(|e| stagefs_source::is_away_errno(&e))
    }

    pub(crate) fn denied(&self) -> bool {
        self.errno == Some(libc::EACCES) || self.errno == Some(libc::EPERM)
    }
}

/// The lines a worker printed in time, and why any other probe has no answer.
#[derive(Debug)]
pub(crate) struct Gathered {
    pub(crate) lines: Vec<Line>,
    pub(crate) missing: Unanswered,
}

impl Gathered {
    /// What arrived before the deadline.
    #[cfg(test)]
    pub(crate) fn late(lines: Vec<Line>) -> Gathered {
        let missing = Unanswered::Late(DEADLINE);
        Gathered { lines, missing }
    }

    /// `path` with links resolved where it answered, else as written.
    pub(crate) fn resolved(&self, path: &Path) -> PathBuf {
        let found = self.lines.iter().find_map(|line| match line {
            Line::Resolved(asked, resolved) if asked == path => Some(resolved.clone()),
            _ => None,
        });
        found.unwrap_or_else(|| std::path::absolute(path).unwrap_or_else(|_| path.into()))
    }
}

/// Where a task sends its lines.
pub(crate) type Tx = Sender<Line>;

/// Sends `line` to the worker's main thread, which prints it. It lives until every
/// task has ended, so the send cannot fail.
pub(crate) fn reply(tx: &Tx, line: Line) {
    let _ = tx.send(line);
}
