//! The source checks: what filesystem it is on, the model in it, and how fast it
//! reads. The worker probes in order ([`probe`]); the parent judges what arrived
//! ([`inspect`]), and the first probe that did not answer ends the checks with a
//! failed one.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;

use anyhow::anyhow;
use serde::{Deserialize, Serialize};
use stagefs_cache::models::{self, ModelKind, Survey};
use stagefs_cache::{SourceTree, hf};

use super::fskind::{FsInfo, FsKind};
use super::model::{self, Model};
use super::mounts;
use super::probe::{self, Probe, format_duration, format_latency, format_rate};
use super::report::Check;
use super::shape::shape_check;
use super::worker::{Gathered, Line, StepError, reply};
use crate::units::format_bytes;

/// Below this rate a model takes long enough to stage that it deserves a warning.
const SLOW_RATE: f64 = 25.0 * (1 << 20) as f64;
/// Small reads slower than this make every unstaged file (config, tokenizer) slow.
const SLOW_LATENCY_MS: f64 = 100.0;
/// Staging longer than this is worth doing ahead of time.
const LONG_STAGING_SECS: f64 = 600.0;

/// What doctor was asked to look at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Target {
    /// No argument and no configured source.
    Nothing,
    /// A directory or file: the argument, or the configured source.
    Path { path: PathBuf, configured: bool },
    /// A model id in the configured source `hub`.
    Model { id: String, hub: PathBuf },
}

impl Target {
    /// What to look at: a model id (`org/name`, unless a relative path of that name
    /// exists here) in the configured `source`, a path, or the configured source.
    pub(crate) fn of(
        arg: Option<&str>,
        source: Option<&Path>,
        exists: impl Fn(&Path) -> bool,
    ) -> Result<Target, String> {
        let Some(arg) = arg else {
            let configured = |path: &Path| Target::Path {
                path: path.into(),
                configured: true,
            };
            return Ok(source.map_or(Target::Nothing, configured));
        };
        if hf::repo_dir_for(arg).is_some() && !exists(Path::new(arg)) {
            let hub = source.ok_or_else(|| format!("{arg} is a model id, but no source is configured: set `source` in the config file, or pass the directory to examine"))?;
            return Ok(Target::Model {
                id: arg.into(),
                hub: hub.into(),
            });
        }
        let path = std::path::absolute(arg).map_err(|e| e.to_string())?;
        Ok(Target::Path {
            path,
            configured: false,
        })
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

/// The source as reported in JSON.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct SourceReport {
    /// The path examined, as given (absolute).
    pub(crate) path: PathBuf,
    /// The path with links resolved; null if the source did not answer.
    pub(crate) canonical: Option<PathBuf>,
    #[serde(flatten)]
    pub(crate) fs: FsInfo,
    /// Whether every probe answered in time.
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

/// Resolves `path` (in the worker).
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

/// The worker's source probes, in the order the checks need them; each prints its
/// line, and one whose answer the next need ends them.
pub(crate) fn probe(
    arg: Option<&str>,
    source: Option<&Path>,
    model_dirs: Vec<PathBuf>,
    tx: &Sender<Line>,
) {
    let send = |line| reply(tx, line);
    let target = Target::of(arg, source, Path::exists);
    send(Line::Target(target.clone()));
    let Some((path, configured, model_id)) = target.as_ref().ok().and_then(Target::parts) else {
        return;
    };
    // For a path that does not answer: its filesystem by name (on Linux from the mount
    // table alone).
    let (lexical, guess) = (Path::new("/").join(hf::normalize(path)), tx.clone());
    std::thread::spawn(move || {
        if let Ok(fs) = mounts::filesystem_of(&lexical) {
            reply(&guess, Line::Lexical(fs));
        }
    });
    let located = locate(path).map_err(StepError::of);
    send(Line::Located(located.clone()));
    let Ok(located) = located else { return };
    if let Some(source) = &located.fs.stagefs_source {
        let fs = std::fs::canonicalize(source).and_then(|s| mounts::filesystem_of(&s));
        send(Line::SourceFs(fs.ok()));
    }
    let readable = readable_path(&located);
    let dirs = if configured { model_dirs } else { Vec::new() };
    if !located.is_file {
        let tree = SourceTree::new(&readable).map_err(StepError::of);
        send(Line::Survey(tree.map(|tree| models::survey(&tree, &dirs))));
    }
    let model = match model_id {
        Some(id) => model::find(&readable, id, &dirs),
        None => model::containing(&readable),
    };
    let model = model.map_err(StepError::of);
    send(Line::Model(model.clone()));
    let model = model.ok().flatten();
    if model_id.is_some() && model.is_none() {
        return;
    }
    let file = match model.and_then(|m| m.largest_weight) {
        Some(file) => Some(file),
        None if located.is_file => Some(readable),
        None => model::largest_file(&readable),
    };
    let measured = file.map(|file| probe::measure(&file)).transpose();
    send(Line::Measured(measured.map_err(StepError::of)));
}

/// Why the checks ended early: a probe did not answer (the check named fails), the
/// path could not be read at all, or a bad argument (doctor reports an error).
enum Stop {
    Unanswered(&'static str),
    Unreadable(StepError),
    Invalid(anyhow::Error),
}

/// The probe's answer, or the check that fails for want of it.
fn arrived<T>(answer: Option<T>, check: &'static str) -> Result<T, Stop> {
    answer.ok_or(Stop::Unanswered(check))
}

/// The source checks for `target` from what the worker answered. Errors only for a
/// bad argument: a path that does not exist, a model the source does not have.
pub(crate) fn inspect(gathered: &Gathered, target: &Target) -> anyhow::Result<Findings> {
    let mut found = Findings::default();
    let Some((path, configured, model_id)) = target.parts() else {
        let note = "no source configured: pass a path or set `source` in the config file";
        found.checks.push(Check::note("source", note));
        return Ok(found);
    };
    let mut report = SourceReport {
        path: path.to_path_buf(),
        ..SourceReport::default()
    };
    let done = steps(gathered, &mut found, &mut report, configured, model_id);
    let lexical = || got!(gathered, Lexical).cloned().unwrap_or_default();
    let check = match done {
        Ok(()) => None,
        Err(Stop::Invalid(e)) => return Err(e),
        Err(Stop::Unanswered(check)) => {
            if report.canonical.is_none() {
                report.fs = lexical();
            }
            let on = match report.fs.kind {
                FsKind::Unknown => String::new(),
                _ => format!("; it is {}", report.fs.describe()),
            };
            let (shown, late) = (path.display(), &gathered.missing);
            Some(Check::fail(check, format!("the source {shown} {late}{on}")).advise(
                "check that the share is reachable (`ls` it); a dead NFS, SMB or sshfs mount has to be remounted",
            ))
        }
        Err(Stop::Unreadable(e)) => {
            report.fs = lexical();
            let check = Check::fail("source", format!("cannot read {}: {e}", path.display()));
            let mount = report.fs.mount_point.display();
            Some(match report.fs.kind {
                FsKind::Stagefs => check.advise(format!(
                    "if its daemon is gone: `stagefs unmount --lazy {mount}`, then mount again"
                )),
                _ if configured && e.not_found => {
                    check.advise("mount the share first, or fix `source` in the config file")
                }
                _ => check,
            })
        }
    };
    report.answered = check.is_none();
    found.checks.extend(check);
    found.report = Some(report);
    Ok(found)
}

/// The checks in the order the worker probes; the first probe that did not answer
/// ends them.
fn steps(
    gathered: &Gathered,
    found: &mut Findings,
    report: &mut SourceReport,
    configured: bool,
    model_id: Option<&str>,
) -> Result<(), Stop> {
    let located = match arrived(got!(gathered, Located), "source")? {
        Ok(located) => located,
        Err(e) if e.not_found && !configured => {
            return Err(Stop::Invalid(anyhow!(
                "{} does not exist",
                report.path.display()
            )));
        }
        Err(e) => return Err(Stop::Unreadable(e.clone())),
    };
    report.canonical = Some(located.canonical.clone());
    report.fs = located.fs.clone();
    found.roots.push(located.canonical.clone());
    if let Some(source) = &located.fs.stagefs_source {
        found.roots.push(source.clone());
        report.stagefs_source_fs = arrived(got!(gathered, SourceFs), "source")?.clone();
    }
    found.checks.push(fs_check(report, configured));
    if !located.is_file {
        let check = match arrived(got!(gathered, Survey), "shape")? {
            Ok(survey) => {
                let mount = located.fs.kind == FsKind::Stagefs;
                let is_mount = mount && located.canonical == located.fs.mount_point;
                found.survey = Some(survey.clone());
                shape_check(&report.path, survey, !configured && !is_mount)
            }
            Err(e) => Check::fail("shape", format!("listing the source failed: {e}")),
        };
        found.checks.push(check);
    }
    let readable = readable_path(located);
    found.model = match (arrived(got!(gathered, Model), "model")?, model_id) {
        (Ok(Some(model)), _) => Some(model.clone()),
        // An ambiguous or malformed id is the argument's fault.
        (Err(e), Some(_)) => return Err(Stop::Invalid(anyhow!("{e}"))),
        (Ok(None), Some(id)) => return Err(Stop::Invalid(not_in(id, &readable))),
        (Ok(None), None) => None,
        (Err(e), None) => {
            let check = Check::fail("model", format!("reading the model failed: {e}"));
            found.checks.push(check);
            None
        }
    };
    found.checks.extend(found.model.as_ref().map(model_check));
    let check = match arrived(got!(gathered, Measured), "speed")? {
        Ok(Some(probe)) => {
            report.probe = Some(probe.clone());
            speed_check(probe, found.model.as_ref())
        }
        Ok(None) => Check::note(
            "speed",
            format!("no file to measure in {}", readable.display()),
        ),
        Err(e) => {
            report.probe_error = Some(e.to_string());
            Check::fail("speed", format!("reading the source failed: {e}"))
        }
    };
    found.checks.push(check);
    Ok(())
}

/// Model `id` is not in the source at `root`.
fn not_in(id: &str, root: &Path) -> anyhow::Error {
    let repo = hf::repo_dir_for(id).map(|dir| format!("no {} with a snapshot, ", dir.display()));
    let (root, repo) = (root.display(), repo.unwrap_or_default());
    anyhow!(
        "model {id} is not in {root}: {repo}no model folder or GGUF file whose path ends with {id}"
    )
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

fn fs_check(report: &SourceReport, configured: bool) -> Check {
    let fs = &report.fs;
    let summary = format!("{}: {}", report.path.display(), fs.describe());
    match fs.kind {
        FsKind::Stagefs => stagefs_check(report, configured),
        FsKind::Removable if fs.lacks_symlinks() => Check::ok("source", summary).advise(
            "exFAT and FAT hold no symlinks, so snapshots hold full copies instead of links to blobs/; stagefs mirrors them as they are",
        ),
        FsKind::Network | FsKind::Usb | FsKind::Removable => Check::ok("source", summary),
        FsKind::Local => Check::ok("source", summary)
            .advise("a local disk is already fast; stagefs pays off for network and USB sources"),
        FsKind::Fuse | FsKind::Unknown => {
            Check::note("source", format!("{summary}; whether it is remote is not known"))
        }
    }
}

fn stagefs_check(report: &SourceReport, configured: bool) -> Check {
    let fs = &report.fs;
    let source = fs
        .stagefs_source
        .as_deref()
        .map_or("?".into(), |p| p.display().to_string());
    let under = report
        .stagefs_source_fs
        .as_ref()
        .map(|f| format!(", {}", f.describe()));
    let summary = format!(
        "{} is in the stagefs mount at {}, which mirrors {source}{}",
        report.path.display(),
        fs.mount_point.display(),
        under.unwrap_or_default()
    );
    let check = if configured {
        Check::warn("source", summary)
    } else {
        Check::note("source", summary)
    };
    check.advise(format!(
        "the checks below read {source}; a stagefs mount is no source for another mount: use {source} itself"
    ))
}

fn model_check(model: &Model) -> Check {
    let place = match (model.kind, &model.snapshot) {
        (ModelKind::HfRepo, Some(snapshot)) => {
            let name = snapshot.file_name().unwrap_or_default().to_string_lossy();
            format!("snapshot {}", name.chars().take(12).collect::<String>())
        }
        (kind, _) => format!("{} {}", kind.describe(), model.path.display()),
    };
    let size = format_bytes(model.size_bytes);
    Check::ok(
        "model",
        format!("{}: {} files, {size} ({place})", model.id, model.files),
    )
}

/// Seconds to stage `model` at the measured rate (one stream; a mount copies with
/// several, so this is an upper estimate).
pub(crate) fn staging_seconds(probe: &Probe, model: &Model) -> f64 {
    model.size_bytes as f64 / probe.throughput_bytes_per_sec.max(1.0)
}

/// A file's name, with a blob's 64-digit hash cut to something readable.
fn short_name(path: &Path) -> String {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    if name.chars().count() > 24 {
        format!("{}…", name.chars().take(12).collect::<String>())
    } else {
        name.into_owned()
    }
}

fn speed_check(probe: &Probe, model: Option<&Model>) -> Check {
    let mut summary = format!(
        "latency {}, {} ({} of {})",
        format_latency(probe.latency_ms),
        format_rate(probe.throughput_bytes_per_sec),
        format_bytes(probe.bytes_read),
        short_name(&probe.file)
    );
    let staging = model.map(|m| (m, staging_seconds(probe, m)));
    if let Some((model, seconds)) = staging {
        let (size, time) = (format_bytes(model.size_bytes), format_duration(seconds));
        summary.push_str(&format!(
            "; staging {} ({size}) takes about {time}",
            model.id
        ));
    }
    let slow = probe.throughput_bytes_per_sec < SLOW_RATE || probe.latency_ms > SLOW_LATENCY_MS;
    let long = staging.is_some_and(|(_, s)| s > LONG_STAGING_SECS);
    let check = if slow {
        Check::warn("speed", summary)
    } else {
        Check::ok("speed", summary)
    };
    if !(slow || long) {
        return check;
    }
    let id = model.map_or("MODEL", |m| m.id.as_str());
    check.advise(format!(
        "stage models before loading them: `stagefs prefetch {id}`, or `stagefs run --model {id} -- COMMAND`"
    ))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::doctor::fskind::Disk;
    use crate::doctor::report::Verdict;
    use crate::doctor::worker::Unanswered;

    fn probe(mib_per_sec: f64, latency_ms: f64) -> Probe {
        let rate = mib_per_sec * (1 << 20) as f64;
        let json = serde_json::json!({"file": "/s/blobs/abc", "file_size": 1 << 30,
            "latency_ms": latency_ms, "throughput_bytes_per_sec": rate, "bytes_read": 64 << 20, "seconds": 1.0});
        serde_json::from_value(json).expect("a probe")
    }

    fn model(size_bytes: u64) -> Model {
        let json = serde_json::json!({"id": "o/m", "kind": "hf_repo", "path": "/s/models--o--m",
            "snapshot": "/s/models--o--m/snapshots/0123456789abcdef", "files": 3, "size_bytes": size_bytes, "largest_weight": null});
        serde_json::from_value(json).expect("a model")
    }

    #[test]
    fn speed_verdicts_and_staging_estimate() {
        let fast = speed_check(&probe(500.0, 0.2), Some(&model(1 << 30)));
        assert_eq!((fast.verdict, fast.advice), (Verdict::Ok, None));
        let expected =
            "latency 200 µs, 500 MiB/s (64.0 MiB of abc); staging o/m (1.0 GiB) takes about 2 s";
        assert_eq!(fast.summary, expected);
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
        let summary = model_check(&model(1 << 20)).summary;
        assert_eq!(summary, "o/m: 3 files, 1.0 MiB (snapshot 0123456789ab)");
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
        let canonical = "/mnt/models--o--m/blobs/x".into();
        let located = Located {
            canonical,
            fs: fs.clone(),
            is_file: true,
        };
        assert_eq!(
            readable_path(&located),
            Path::new("/nas/hub/models--o--m/blobs/x")
        );
        let mut report = SourceReport {
            path: "/mnt/models--o--m".into(),
            fs,
            ..Default::default()
        };
        let given = fs_check(&report, false);
        assert_eq!(given.verdict, Verdict::Note);
        let expected = "stagefs mount at /mnt, which mirrors /nas/hub";
        assert!(given.summary.contains(expected), "{}", given.summary);
        assert_eq!(fs_check(&report, true).verdict, Verdict::Warn);
        report.fs = FsInfo::new("exfat", "/dev/sdc1", "/x".into(), Disk::Usb, None);
        let usb = "/mnt/models--o--m: exfat on /dev/sdc1 (USB disk)";
        assert_eq!(fs_check(&report, true).summary, usb);
    }

    #[test]
    fn targets_are_model_ids_or_paths() {
        let (never, hub) = (|_: &Path| false, Some(Path::new("/hub")));
        let id = "org/name".to_string();
        assert_eq!(
            Target::of(Some(&id), hub, never),
            Ok(Target::Model {
                id,
                hub: "/hub".into()
            })
        );
        let here = Target::of(Some("org/name"), hub, |_| true);
        assert!(matches!(
            here,
            Ok(Target::Path {
                configured: false,
                ..
            })
        ));
        for path in ["/abs/path", "./org", "models--org--name"] {
            let target = Target::of(Some(path), None, never);
            assert!(
                matches!(
                    target,
                    Ok(Target::Path {
                        configured: false,
                        ..
                    })
                ),
                "{path}"
            );
        }
        let unconfigured = Target::of(Some("org/name"), None, never).expect_err("needs a source");
        assert!(
            unconfigured.contains("no source is configured"),
            "{unconfigured}"
        );
        assert_eq!(Target::of(None, None, never), Ok(Target::Nothing));
    }

    #[test]
    fn the_first_probe_that_did_not_answer_fails_its_check() -> anyhow::Result<()> {
        let late = |lines| Gathered {
            lines,
            missing: Unanswered::Late(Duration::from_secs(15)),
        };
        let dir = tempfile::tempdir()?;
        let target = Target::Path {
            path: dir.path().into(),
            configured: false,
        };
        let located = Line::Located(locate(dir.path()).map_err(StepError::of));
        let survey = Line::Survey(Err(StepError::of(anyhow!("denied"))));
        let found = inspect(&late(vec![located, survey]), &target)?;
        let checks: Vec<_> = found.checks.iter().map(|c| (c.name, c.verdict)).collect();
        let expected = [
            ("source", Verdict::Ok),
            ("shape", Verdict::Fail),
            ("model", Verdict::Fail),
        ];
        assert_eq!(checks, expected);
        assert!(
            found.checks[2]
                .summary
                .contains("did not answer within 15s")
        );
        let nothing = inspect(&late(Vec::new()), &target)?;
        assert!(
            nothing.checks[0]
                .summary
                .contains("did not answer within 15s")
        );
        assert!(!nothing.report.expect("reported").answered);
        let missing = Path::new("/nonexistent/doctor/path");
        let located = || late(vec![Line::Located(locate(missing).map_err(StepError::of))]);
        let given = Target::Path {
            path: missing.into(),
            configured: false,
        };
        assert!(inspect(&located(), &given).is_err(), "a bad argument");
        let configured = Target::Path {
            path: missing.into(),
            configured: true,
        };
        let found = inspect(&located(), &configured)?;
        assert_eq!(found.checks[0].verdict, Verdict::Fail);
        assert!(
            found.checks[0]
                .advice
                .as_deref()
                .unwrap_or_default()
                .contains("fix `source`")
        );
        let nothing = inspect(&late(Vec::new()), &Target::Nothing)?;
        assert!(nothing.checks[0].verdict == Verdict::Note && nothing.report.is_none());
        Ok(())
    }
}
