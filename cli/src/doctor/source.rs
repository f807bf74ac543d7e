//! The source checks: what filesystem it is on, the model in it, and how fast it
//! reads. Each step that touches the source runs under a deadline, and the first
//! step that does not answer ends the inspection with a failed check.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::anyhow;
use serde::{Deserialize, Serialize};
use stagefs_cache::models::{ModelKind, Survey};

use super::bounded::{SOURCE_TIMEOUT, Unanswered};
use super::fskind::{FsInfo, FsKind};
use super::model::Model;
use super::mounts;
use super::probe::{Probe, format_duration, format_latency, format_rate};
use super::report::Check;
use super::shape::shape_check;
use super::worker::{self, StepError};
use crate::units::format_bytes;

/// Below this rate a model takes long enough to stage that it deserves a warning.
const SLOW_RATE: f64 = 25.0 * (1 << 20) as f64;
/// Small reads slower than this make every unstaged file (config, tokenizer) slow.
const SLOW_LATENCY_MS: f64 = 100.0;
/// How long a second look at a path that did not answer may take.
const GUESS_TIMEOUT: Duration = Duration::from_secs(2);
/// Staging longer than this is worth doing ahead of time.
const LONG_STAGING_SECS: f64 = 600.0;

/// What doctor was asked to look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// No argument and no configured source.
    Nothing,
    /// A directory or file: the argument, or the configured source.
    Path { path: PathBuf, configured: bool },
    /// A model id in the configured source `hub`.
    Model { id: String, hub: PathBuf },
}

/// The source as reported in JSON.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SourceReport {
    /// The path examined, as given (absolute).
    pub(crate) path: PathBuf,
    /// The path with links resolved; null if the source did not answer.
    pub(crate) canonical: Option<PathBuf>,
    #[serde(flatten)]
    pub(crate) fs: FsInfo,
    /// Whether every step answered within the deadline.
    pub(crate) answered: bool,
    /// For a path in a stagefs mount: the filesystem of the mount's source, which is
    /// what the measurement reads.
    pub(crate) stagefs_source_fs: Option<FsInfo>,
    pub(crate) probe: Option<Probe>,
    pub(crate) probe_error: Option<String>,
}

/// Everything the source checks found.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    pub(crate) checks: Vec<Check>,
    pub(crate) report: Option<SourceReport>,
    pub(crate) model: Option<Model>,
    /// The shape of the directory examined (of a stagefs mount's source for a mount)
    /// and its models.
    pub(crate) survey: Option<Survey>,
    /// Where the cache must not be: the source, and a stagefs mount's source.
    pub(crate) roots: Vec<PathBuf>,
}

/// A path's place: resolved, its filesystem, and whether it is a file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Located {
    pub(crate) canonical: PathBuf,
    pub(crate) fs: FsInfo,
    pub(crate) is_file: bool,
}

/// Why the inspection ended early.
enum Stop {
    /// A step did not answer; the check named here fails.
    Unanswered(Unanswered, &'static str),
    /// The path could not be read at all.
    Unreadable(StepError),
    /// A bad argument: doctor reports it as an error.
    Invalid(anyhow::Error),
}

/// An inspection in progress.
struct Inspection {
    findings: Findings,
    report: SourceReport,
    /// The path is the configured source rather than an argument.
    configured: bool,
    /// Paths in the source searched for models like its root.
    model_dirs: Vec<PathBuf>,
}

/// Runs the source checks for `target`; `model_dirs` are searched for models like
/// the source's root. Errors only for a bad argument: a path that does not exist, a
/// model the source does not have.
pub(crate) fn inspect(target: &Target, model_dirs: &[PathBuf]) -> anyhow::Result<Findings> {
    let (path, configured, model_id) = match target {
        Target::Nothing => return Ok(unconfigured()),
        Target::Path { path, configured } => (path, *configured, None),
        Target::Model { id, hub } => (hub, true, Some(id.as_str())),
    };
    let mut run = Inspection::new(path, configured);
    run.model_dirs = model_dirs.to_vec();
    match run.steps(model_id) {
        Ok(()) => run.report.answered = true,
        Err(Stop::Unanswered(late, name)) => run.unanswered(&late, name),
        Err(Stop::Unreadable(e)) => run.unreadable(&e),
        Err(Stop::Invalid(e)) => return Err(e),
    }
    run.findings.report = Some(run.report);
    Ok(run.findings)
}

impl Inspection {
    fn new(path: &Path, configured: bool) -> Inspection {
        Inspection {
            findings: Findings::default(),
            report: SourceReport {
                path: path.to_path_buf(),
                canonical: None,
                fs: FsInfo::unknown(),
                answered: false,
                stagefs_source_fs: None,
                probe: None,
                probe_error: None,
            },
            configured,
            model_dirs: Vec::new(),
        }
    }

    fn steps(&mut self, model_id: Option<&str>) -> Result<(), Stop> {
        let located = self.locate()?;
        let readable = readable_path(&located);
        self.findings
            .checks
            .push(fs_check(&self.report, self.configured));
        if !located.is_file {
            self.survey(&readable, &located)?;
        }
        self.find_model(&readable, model_id)?;
        self.measure(&readable, located.is_file)
    }

    /// Where the path is; for a stagefs mount, also where its source is.
    fn locate(&mut self) -> Result<Located, Stop> {
        let path = &self.report.path;
        let located = match worker::locate(path, SOURCE_TIMEOUT) {
            Ok(Ok(located)) => located,
            Ok(Err(e)) if e.not_found && !self.configured => {
                return Err(Stop::Invalid(anyhow!("{} does not exist", path.display())));
            }
            Ok(Err(e)) => return Err(Stop::Unreadable(e)),
            Err(late) => return Err(Stop::Unanswered(late, "source")),
        };
        self.report.canonical = Some(located.canonical.clone());
        self.report.fs = located.fs.clone();
        self.findings.roots.push(located.canonical.clone());
        if let Some(source) = &located.fs.stagefs_source {
            self.findings.roots.push(source.clone());
            let fs = worker::filesystem_of(source, true, SOURCE_TIMEOUT)
                .map_err(|late| Stop::Unanswered(late, "source"))?;
            self.report.stagefs_source_fs = fs.ok();
        }
        Ok(located)
    }

    /// What shape the directory has, and how programs are pointed at it.
    fn survey(&mut self, readable: &Path, located: &Located) -> Result<(), Stop> {
        let answer = worker::survey(readable, &self.model_dirs, SOURCE_TIMEOUT)
            .map_err(|late| Stop::Unanswered(late, "shape"))?;
        match answer {
            Ok(survey) => {
                let is_mount = located.fs.kind == FsKind::Stagefs
                    && located.canonical == located.fs.mount_point;
                let advise_mounting = !self.configured && !is_mount;
                let check = shape_check(&self.report.path, &survey, advise_mounting);
                self.findings.checks.push(check);
                self.findings.survey = Some(survey);
            }
            Err(e) => self.findings.checks.push(Check::fail(
                "shape",
                format!("listing the source failed: {e}"),
            )),
        }
        Ok(())
    }

    /// The model asked for, or the one the path lies in.
    fn find_model(&mut self, readable: &Path, model_id: Option<&str>) -> Result<(), Stop> {
        let found = match model_id {
            Some(id) => worker::find_model(readable, id, &self.model_dirs, SOURCE_TIMEOUT),
            None => worker::model_containing(readable, SOURCE_TIMEOUT),
        };
        let model = match found.map_err(|late| Stop::Unanswered(late, "model"))? {
            Ok(model) => model,
            // An ambiguous or malformed id is the argument's fault.
            Err(e) if model_id.is_some() => return Err(Stop::Invalid(anyhow!("{e}"))),
            Err(e) => {
                let check = Check::fail("model", format!("reading the model failed: {e}"));
                self.findings.checks.push(check);
                None
            }
        };
        if let (Some(id), None) = (model_id, &model) {
            let repo = stagefs_cache::hf::repo_dir_for(id)
                .map(|dir| format!("no {} with a snapshot, ", dir.display()))
                .unwrap_or_default();
            return Err(Stop::Invalid(anyhow!(
                "model {id} is not in {}: {repo}no model folder or GGUF file whose path ends with {id}",
                readable.display(),
            )));
        }
        self.findings.checks.extend(model.as_ref().map(model_check));
        self.findings.model = model;
        Ok(())
    }

    fn measure(&mut self, readable: &Path, is_file: bool) -> Result<(), Stop> {
        let model = self.findings.model.as_ref();
        let check = match measure(readable, is_file, model) {
            Measured::Done(probe) => {
                let check = speed_check(&probe, model);
                self.report.probe = Some(probe);
                check
            }
            Measured::NothingToRead => Check::note(
                "speed",
                format!("no file to measure in {}", readable.display()),
            ),
            Measured::Failed(e) => {
                let check = Check::fail("speed", format!("reading the source failed: {e}"));
                self.report.probe_error = Some(e);
                check
            }
            Measured::Late(late) => return Err(Stop::Unanswered(late, "speed")),
        };
        self.findings.checks.push(check);
        Ok(())
    }

    /// Step `name` did not answer in time.
    fn unanswered(&mut self, late: &Unanswered, name: &'static str) {
        let report = &mut self.report;
        if report.canonical.is_none() {
            report.fs = guess_fs(&report.path);
        }
        let on = if report.fs.kind == FsKind::Unknown {
            String::new()
        } else {
            format!("; it is {}", report.fs.describe())
        };
        let summary = format!("the source {} {late}{on}", report.path.display());
        self.findings.checks.push(Check::fail(name, summary).advise(
            "check that the share is reachable (`ls` it); a dead NFS, SMB or sshfs mount has to be remounted",
        ));
    }

    /// The path exists (or is configured) but could not be resolved.
    fn unreadable(&mut self, e: &StepError) {
        let report = &mut self.report;
        report.fs = guess_fs(&report.path);
        let mut check = Check::fail(
            "source",
            format!("cannot read {}: {e}", report.path.display()),
        );
        if report.fs.kind == FsKind::Stagefs {
            check = check.advise(format!(
                "if its daemon is gone: `stagefs unmount --lazy {}`, then mount again",
                report.fs.mount_point.display()
            ));
        } else if self.configured && e.not_found {
            check = check.advise("mount the share first, or fix `source` in the config file");
        }
        self.findings.checks.push(check);
    }
}

fn unconfigured() -> Findings {
    Findings {
        checks: vec![Check::note(
            "source",
            "no source configured: pass a path or set `source` in the config file",
        )],
        ..Findings::default()
    }
}

/// What doctor reads: the path itself, or for a path in a stagefs mount the same
/// path in the mount's source, so that measuring does not stage anything.
fn readable_path(located: &Located) -> PathBuf {
    match &located.fs.stagefs_source {
        Some(source) => match located.canonical.strip_prefix(&located.fs.mount_point) {
            Ok(rel) => source.join(rel),
            Err(_) => source.clone(),
        },
        None => located.canonical.clone(),
    }
}

/// Resolves `path` (run by a worker).
pub(crate) fn locate(path: &Path) -> io::Result<Located> {
    let canonical = std::fs::canonicalize(path)?;
    let is_file = std::fs::metadata(&canonical)?.is_file();
    let fs = mounts::filesystem_of(&canonical)?;
    Ok(Located {
        canonical,
        fs,
        is_file,
    })
}

/// The filesystem a path lexically lies on, for when the path itself does not answer
/// (on Linux this reads only the mount table).
fn guess_fs(path: &Path) -> FsInfo {
    let lexical = Path::new("/").join(stagefs_cache::hf::normalize(path));
    match worker::filesystem_of(&lexical, false, GUESS_TIMEOUT) {
        Ok(Ok(fs)) => fs,
        _ => FsInfo::unknown(),
    }
}

fn fs_check(report: &SourceReport, configured: bool) -> Check {
    let fs = &report.fs;
    let shown = report.path.display();
    match fs.kind {
        FsKind::Stagefs => stagefs_check(report, configured),
        FsKind::Network | FsKind::Usb => Check::ok("source", format!("{shown}: {}", fs.describe())),
        FsKind::Removable if fs.lacks_symlinks() => {
            Check::ok("source", format!("{shown}: {}", fs.describe())).advise(
                "exFAT and FAT hold no symlinks, so snapshots hold full copies instead of links to blobs/; stagefs mirrors them as they are",
            )
        }
        FsKind::Removable => Check::ok("source", format!("{shown}: {}", fs.describe())),
        FsKind::Local => Check::ok("source", format!("{shown}: {}", fs.describe()))
            .advise("a local disk is already fast; stagefs pays off for network and USB sources"),
        FsKind::Fuse | FsKind::Unknown => Check::note(
            "source",
            format!("{shown}: {}; whether it is remote is not known", fs.describe()),
        ),
    }
}

fn stagefs_check(report: &SourceReport, configured: bool) -> Check {
    let fs = &report.fs;
    let source = fs
        .stagefs_source
        .as_deref()
        .map_or_else(|| "?".to_string(), |p| p.display().to_string());
    let under = report
        .stagefs_source_fs
        .as_ref()
        .map_or_else(String::new, |f| format!(", {}", f.describe()));
    let summary = format!(
        "{} is in the stagefs mount at {}, which mirrors {source}{under}",
        report.path.display(),
        fs.mount_point.display()
    );
    let advice = format!(
        "the checks below read {source}; a stagefs mount is no source for another mount: use {source} itself"
    );
    let check = if configured {
        Check::warn("source", summary)
    } else {
        Check::note("source", summary)
    };
    check.advise(advice)
}

fn model_check(model: &Model) -> Check {
    let place = match (model.kind, &model.snapshot) {
        (ModelKind::HfRepo, Some(snapshot)) => {
            let commit: String = snapshot
                .file_name()
                .map(|n| n.to_string_lossy().chars().take(12).collect())
                .unwrap_or_default();
            format!("snapshot {commit}")
        }
        (kind, _) => format!("{} {}", kind.describe(), model.path.display()),
    };
    Check::ok(
        "model",
        format!(
            "{}: {} files, {} ({place})",
            model.id,
            model.files,
            format_bytes(model.size_bytes)
        ),
    )
}

enum Measured {
    Done(Probe),
    NothingToRead,
    Failed(String),
    Late(Unanswered),
}

/// Measures the model's largest weight file, the file given, or the largest file in
/// the directory.
fn measure(readable: &Path, is_file: bool, model: Option<&Model>) -> Measured {
    let chosen = match model.and_then(|m| m.largest_weight.clone()) {
        Some(file) => file,
        None => match worker::file_to_measure(readable, is_file, SOURCE_TIMEOUT) {
            Ok(Ok(Some(file))) => file,
            Ok(Ok(None)) => return Measured::NothingToRead,
            Ok(Err(e)) => return Measured::Failed(e.to_string()),
            Err(late) => return Measured::Late(late),
        },
    };
    match worker::probe(&chosen, SOURCE_TIMEOUT) {
        Ok(Ok(probe)) => Measured::Done(probe),
        Ok(Err(e)) => Measured::Failed(e.to_string()),
        Err(late) => Measured::Late(late),
    }
}

/// Seconds to stage `model` at the measured rate (one stream; a mount copies with
/// several, so this is an upper estimate).
pub(crate) fn staging_seconds(probe: &Probe, model: &Model) -> f64 {
    model.size_bytes as f64 / probe.throughput_bytes_per_sec.max(1.0)
}

/// A file's name, with a blob's 64-digit hash cut to something readable.
fn short_name(path: &Path) -> String {
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    if name.chars().count() > 24 {
        format!("{}…", name.chars().take(12).collect::<String>())
    } else {
        name
    }
}

fn speed_check(probe: &Probe, model: Option<&Model>) -> Check {
    let name = short_name(&probe.file);
    let mut summary = format!(
        "latency {}, {} ({} of {name})",
        format_latency(probe.latency_ms),
        format_rate(probe.throughput_bytes_per_sec),
        format_bytes(probe.bytes_read)
    );
    let staging = model.map(|m| (m, staging_seconds(probe, m)));
    if let Some((model, seconds)) = staging {
        summary.push_str(&format!(
            "; staging {} ({}) takes about {}",
            model.id,
            format_bytes(model.size_bytes),
            format_duration(seconds)
        ));
    }
    let slow = probe.throughput_bytes_per_sec < SLOW_RATE || probe.latency_ms > SLOW_LATENCY_MS;
    let long = staging.is_some_and(|(_, s)| s > LONG_STAGING_SECS);
    let check = if slow {
        Check::warn("speed", summary)
    } else {
        Check::ok("speed", summary)
    };
    if slow || long {
        let id = model.map_or("MODEL", |m| m.id.as_str());
        check.advise(format!(
            "stage models before loading them: `stagefs prefetch {id}`, or `stagefs run --model {id} -- COMMAND`"
        ))
    } else {
        check
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::fskind::Disk;
    use crate::doctor::report::Verdict;

    fn probe(rate_mib: f64, latency_ms: f64) -> Probe {
        Probe {
            file: PathBuf::from("/s/blobs/abc"),
            file_size: 1 << 30,
            latency_ms,
            throughput_bytes_per_sec: rate_mib * (1 << 20) as f64,
            bytes_read: 64 << 20,
            seconds: 1.0,
        }
    }

    fn model(size: u64) -> Model {
        Model {
            id: "o/m".into(),
            kind: ModelKind::HfRepo,
            path: PathBuf::from("/s/models--o--m"),
            snapshot: Some(PathBuf::from("/s/models--o--m/snapshots/0123456789abcdef")),
            files: 3,
            size_bytes: size,
            largest_weight: None,
        }
    }

    #[test]
    fn speed_verdicts_and_staging_estimate() {
        let fast = speed_check(&probe(500.0, 0.2), Some(&model(1 << 30)));
        assert_eq!(fast.verdict, Verdict::Ok);
        assert!(fast.summary.contains("500 MiB/s"), "{}", fast.summary);
        assert!(
            fast.summary
                .contains("staging o/m (1.0 GiB) takes about 2 s"),
            "{}",
            fast.summary
        );
        assert!(fast.advice.is_none());
        let slow = speed_check(&probe(10.0, 5.0), None);
        assert_eq!(slow.verdict, Verdict::Warn);
        assert!(
            slow.advice
                .unwrap_or_default()
                .contains("stagefs prefetch MODEL")
        );
        let huge = speed_check(&probe(500.0, 0.2), Some(&model(1 << 40)));
        assert_eq!(huge.verdict, Verdict::Ok);
        assert!(
            huge.advice
                .unwrap_or_default()
                .contains("stagefs prefetch o/m")
        );
    }

    #[test]
    fn a_stagefs_mount_is_named_with_its_source() {
        let fs = FsInfo::new(
            "fuse.stagefs",
            "stagefs:/nas/hub",
            "/mnt".into(),
            Disk::Unknown,
            None,
        );
        let located = Located {
            canonical: PathBuf::from("/mnt/models--o--m/blobs/x"),
            fs: fs.clone(),
            is_file: true,
        };
        assert_eq!(
            readable_path(&located),
            Path::new("/nas/hub/models--o--m/blobs/x")
        );
        let report = SourceReport {
            path: "/mnt/models--o--m".into(),
            canonical: None,
            fs,
            answered: true,
            stagefs_source_fs: None,
            probe: None,
            probe_error: None,
        };
        let given = fs_check(&report, false);
        assert_eq!(given.verdict, Verdict::Note);
        assert!(
            given
                .summary
                .contains("stagefs mount at /mnt, which mirrors /nas/hub"),
            "{}",
            given.summary
        );
        assert_eq!(fs_check(&report, true).verdict, Verdict::Warn);
    }

    #[test]
    fn a_missing_path_is_an_error_and_nothing_is_a_note() {
        let missing = Target::Path {
            path: PathBuf::from("/nonexistent/doctor/path"),
            configured: false,
        };
        assert!(inspect(&missing, &[]).is_err());
        let configured = Target::Path {
            path: PathBuf::from("/nonexistent/doctor/path"),
            configured: true,
        };
        let findings = inspect(&configured, &[]).expect("a failed check, not an error");
        assert_eq!(findings.checks[0].verdict, Verdict::Fail);
        let nothing = inspect(&Target::Nothing, &[]).expect("a note");
        assert_eq!(nothing.checks[0].verdict, Verdict::Note);
        assert!(nothing.report.is_none());
    }
}
