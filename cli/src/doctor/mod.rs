//! `stagefs doctor`: checks FUSE, the source, the cache volume and the environment,
//! and says what to fix. Each check is one line with a verdict (ok, warn, fail, note)
//! and, when there is something to do, advice. Nothing here may hang on a dead
//! source: whatever touches it runs in one worker process under one deadline
//! (`worker`).

#[macro_use]
mod lines;
mod fuse;
mod hub;
mod model;
mod objects;
mod refused;
mod source;
mod space;
mod worker;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail};
use serde::Serialize;
use stagefs_control::SourceFs;
use stagefs_layout::models::Shape;

pub(crate) use hub::usage as shape_usage;

use crate::args::{BackendArg, DoctorArgs};
use crate::config::Config;
use crate::manage::escaped;
use crate::run::RELAX_WATCHDOG_VAR;
use lines::{DEADLINE, Gathered, Target};
use source::Findings;
use worker::Task;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Verdict {
    /// Nothing to do.
    Ok,
    /// Works, but worth fixing.
    Warn,
    /// Will not work until fixed; doctor exits non-zero.
    Fail,
    /// Context, not a judgement.
    Note,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct Check {
    /// Stable identifier (`fuse`, `source`, ...); scripts match on it.
    name: &'static str,
    verdict: Verdict,
    /// What was found.
    summary: String,
    /// What to do about it, if anything.
    advice: Option<String>,
}

impl Check {
    fn new(name: &'static str, verdict: Verdict, summary: impl Into<String>) -> Check {
        let (summary, advice) = (summary.into(), None);
        Check {
            name,
            verdict,
            summary,
            advice,
        }
    }

    fn ok(name: &'static str, summary: impl Into<String>) -> Check {
        Check::new(name, Verdict::Ok, summary)
    }

    fn warn(name: &'static str, summary: impl Into<String>) -> Check {
        Check::new(name, Verdict::Warn, summary)
    }

    fn fail(name: &'static str, summary: impl Into<String>) -> Check {
        Check::new(name, Verdict::Fail, summary)
    }

    fn note(name: &'static str, summary: impl Into<String>) -> Check {
        Check::new(name, Verdict::Note, summary)
    }

    fn advise(mut self, advice: impl Into<String>) -> Check {
        self.advice = Some(advice.into());
        self
    }
}

/// The whole report, as `--json` prints it; `failed` when a check failed (then the
/// exit code is 1).
#[derive(Debug, Serialize)]
struct Report {
    checks: Vec<Check>,
    failed: bool,
    source: Option<source::SourceReport>,
    model: Option<model::Model>,
    cache: space::CacheReport,
    hub_cache: Option<hub::HubCache>,
    mount: Option<hub::MountState>,
}

/// Runs the checks; exits non-zero when one fails. `config_error`: the config file
/// could not be read, so the checks run without it and that is reported first.
pub(crate) fn run(
    args: &DoctorArgs,
    config: &Config,
    config_error: Option<&crate::config::ConfigError>,
) -> anyhow::Result<ExitCode> {
    if args.worker {
        return worker::serve();
    }
    let report = report_of(args, config, config_error);
    if let (Err(e), true) = (&report, args.json) {
        // A script reading --json gets JSON even for what doctor cannot examine;
        // the error's line still goes to stderr, and the exit status is 1.
        let summary = stagefs_source::without_os_error(&format!("{e:#}"));
        let refused = Refused {
            checks: vec![Check::fail("target", summary)],
            failed: true,
        };
        println!("{}", serde_json::to_string_pretty(&refused)?);
    }
    let report = report?;
    match args.json {
        true => println!("{}", serde_json::to_string_pretty(&report)?),
        false => print!("{}", render(&report.checks)),
    }
    Ok(ExitCode::from(u8::from(report.failed)))
}

/// What `--json` prints when there is nothing doctor can examine (no such path, a
/// name several models answer to): the report's first two fields.
#[derive(Debug, Serialize)]
struct Refused {
    checks: Vec<Check>,
    failed: bool,
}

/// The report on what `args` names.
fn report_of(
    args: &DoctorArgs,
    config: &Config,
    config_error: Option<&crate::config::ConfigError>,
) -> anyhow::Result<Report> {
    let targets: Vec<&str> = args.target.as_deref().into_iter().collect();
    let holders = match (args.target.as_deref(), args.cache.cache_dir.is_some()) {
        (Some(id), false) if names_no_mount(config) => mounts_holding(id),
        _ => Vec::new(),
    };
    // Several running mounts hold the model: the first is examined, and the report
    // says so (below), rather than picking one without a word.
    let flag = match holders.as_slice() {
        [first, _, ..] => Some(first.cache_dir.as_path()),
        _ => args.cache.cache_dir.as_deref(),
    };
    let cache_dir = crate::mounts::cache_dir_or_default(config, flag, &targets)?;
    // The mount this cache serves (or, named, served last) stands in for a configured one.
    let config = match &crate::mounts::standing(config, flag, &cache_dir) {
        Some(record) => config.clone().filled_from(record),
        None => config.clone(),
    };
    // What the source was on when this cache was last mounted: a share unmounted
    // since leaves a directory that looks like any other.
    let last = crate::mounts::recorded(&cache_dir).and_then(|r| r.source_fs);
    let mut report = examine(args.target.as_deref(), &cache_dir, &config, last.as_ref())?;
    if args.target.is_none()
        && config.source().is_none()
        && let Some(check) = running_mounts()
    {
        // Beside the source note, which says there is nothing to examine.
        let at = report.checks.iter().position(|c| c.name == "source");
        report
            .checks
            .insert(at.map_or(report.checks.len(), |i| i + 1), check);
    }
    if let Some(check) = holders_note(args.target.as_deref(), &holders) {
        let at = report.checks.iter().position(|c| c.name == "source");
        report
            .checks
            .insert(at.map_or(report.checks.len(), |i| i + 1), check);
    }
    if let Some(error) = config_error {
        let check = Check::fail("config", error.to_string()).advise(error.advice());
        report.checks.insert(0, check);
        report.failed = true;
    }
    Ok(report)
}

/// With nothing to examine and several mounts running (none picked), the mounts
/// doctor could examine: one is named by its mount point or source.
fn running_mounts() -> Option<Check> {
    let known = stagefs_mount::registry::known();
    if known.len() < 2 {
        return None;
    }
    let mounts = crate::mounts::listed(&known);
    let summary = format!("{} stagefs mounts are running: {mounts}", known.len());
    Some(
        Check::note("mounts", summary)
            .advise("name one to examine it: `stagefs doctor MOUNTPOINT`"),
    )
}

/// How long asking a running mount's source whether it holds a model may take.
const MODEL_LOOKUP_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether the config names neither a cache directory nor a source: the running
/// mounts are then what a model id is looked up in.
fn names_no_mount(config: &Config) -> bool {
    config.configured_cache_dir().is_none() && config.source().is_none()
}

/// The running mounts whose sources hold the model `id` (none for a path, or with
/// fewer than two mounts running), each asked under a deadline: a source may be a
/// dead share.
fn mounts_holding(id: &str) -> Vec<stagefs_mount::registry::KnownMount> {
    let known = stagefs_mount::registry::known();
    if known.len() < 2
        || crate::mounts::names_a_path(id)
        || !stagefs_layout::models::is_model_id(id)
    {
        return Vec::new();
    }
    let holds = |m: &stagefs_mount::registry::KnownMount| {
        let (source, dirs) = (&m.record.source, &m.record.model_dirs);
        stagefs_mount::bounded::holds_model(source, id, dirs, MODEL_LOOKUP_WAIT) == Ok(true)
    };
    known.into_iter().filter(holds).collect()
}

/// With several running mounts holding the model asked about: which one the report
/// is about, and how to ask about another.
fn holders_note(
    id: Option<&str>,
    holders: &[stagefs_mount::registry::KnownMount],
) -> Option<Check> {
    let ([first, rest @ ..], Some(id)) = (holders, id) else {
        return None;
    };
    let [other, ..] = rest else { return None };
    let summary = format!(
        "{} running mounts hold {id}: {}; this report is about the one at {}",
        holders.len(),
        crate::mounts::listed(holders),
        first.mountpoint.display()
    );
    let advice = format!(
        "for the one at {}: `stagefs doctor {id} --cache-dir {}`",
        other.mountpoint.display(),
        other.cache_dir.display()
    );
    Some(Check::note("mounts", summary).advise(advice))
}

/// The report for a terminal: `ok    fuse         summary`, advice indented below
/// (the columns are 6 and 13 wide).
fn render(checks: &[Check]) -> String {
    // A file name with a newline in it stays on its check's line.
    let line = |check: &Check| {
        let verdict = format!("{:?}", check.verdict).to_lowercase();
        let advice = check
            .advice
            .as_ref()
            .map(|a| format!("{:19}{}\n", "", escaped(a)));
        let (summary, advice) = (escaped(&check.summary), advice.unwrap_or_default());
        let name = check.name;
        format!("{verdict:<6}{name:<13}{summary}\n{advice}")
    };
    checks.iter().map(line).collect()
}

/// Asks one worker everything that touches a path, then judges what it answered.
fn examine(
    arg: Option<&str>,
    cache_dir: &Path,
    config: &Config,
    last: Option<&SourceFs>,
) -> anyhow::Result<Report> {
    let (mountpoint, dirs) = (config.configured_mountpoint(), config.model_dirs().to_vec());
    let bucket = bucket_examined(arg, config.source(), mountpoint)?;
    // An object store is asked here (see `objects`), never by the worker.
    let source = bucket
        .is_none()
        .then(|| Task::Source(arg.map(Into::into), config.source().map(Into::into), dirs));
    // Without an argument the source examined is the mount's: its survey says the shape.
    let mount_shape = arg.is_some();
    let cache = Task::Cache(cache_dir.into(), mountpoint.map(Into::into), mount_shape);
    let resolve = hub::paths_to_resolve(mountpoint).map(Task::Resolve);
    let tasks = source.into_iter().chain([cache]).chain(resolve).collect();
    let gathered = worker::gather(tasks, DEADLINE);
    judge(&gathered, arg, bucket.as_ref(), cache_dir, config, last)
}

/// The object store examined: the argument when it is an `s3://` URL, else the
/// configured (or running mount's) source when it is one. A model or a path in the
/// mount of a bucket is examined with its bucket: it has no directory to read.
fn bucket_examined(
    arg: Option<&str>,
    source: Option<&Path>,
    mountpoint: Option<&Path>,
) -> anyhow::Result<Option<stagefs_s3::ObjectUrl>> {
    if let Some(url) = arg.and_then(stagefs_s3::ObjectUrl::parse) {
        return Ok(Some(url?));
    }
    if let Some(arg) = arg.filter(|a| a.starts_with("s3:")) {
        bail!("{arg} is not an object store's URL: write it s3://BUCKET[/PREFIX]");
    }
    let source = source.and_then(Path::to_str);
    let Some(url) = source.and_then(stagefs_s3::ObjectUrl::parse).transpose()? else {
        return Ok(None);
    };
    // A path outside the mount is examined as itself. Told by its text alone: a
    // path on a dead share must never be asked of in this process.
    let in_mount = |p: &Path| mountpoint.is_some_and(|m| p.starts_with(m));
    let outside = arg.is_some_and(|arg| {
        let path = Path::new(arg);
        let written_as_path = arg.starts_with(['/', '.', '~']);
        written_as_path && !std::path::absolute(path).is_ok_and(|p| in_mount(&p))
    });
    Ok((!outside).then_some(url))
}

/// The report from what the worker answered.
fn judge(
    gathered: &Gathered,
    arg: Option<&str>,
    bucket: Option<&stagefs_s3::ObjectUrl>,
    cache_dir: &Path,
    config: &Config,
    last: Option<&SourceFs>,
) -> anyhow::Result<Report> {
    let found = match bucket {
        Some(url) => objects::inspect(url),
        None => {
            // Without the worker's word, whether `org/name` is a path here is not known.
            let told = got!(gathered, Target).cloned();
            let target = told.unwrap_or_else(|| Target::of(arg, config.source(), |_| false));
            source::inspect(gathered, &target.map_err(|e| anyhow!(e))?, last)?
        }
    };
    let mountpoint = config.configured_mountpoint();
    let mut roots = found.roots.clone();
    roots.extend(mountpoint.map(Into::into));
    let model = found.model.as_ref();
    let (cache_checks, cache) = space::inspect(gathered, cache_dir, config.budget(), &roots, model);
    let (mount, shape) = environment_target(&found, mountpoint);
    // Of a mount doctor was not asked about, its running daemon's source tells.
    let shape = shape.or_else(|| got!(gathered, MountShape).copied());
    let (hub_check, hub_cache) = hub::hub_cache_check(gathered, mount.as_deref(), shape);
    // The worker asks the control socket in the cache directory only once that answered;
    // a path that is neither the mount, in it, nor its source gets no line about it.
    let answered = mountpoint.filter(|_| cache.fs.is_some() && !unrelated(&found));
    let sources = configured_sources(&found, config.source());
    let (mount_check, mount) = answered
        .map(|m| hub::mount_check(gathered, m, cache_dir, &sources))
        .unzip();
    let backend = config
        .backend()
        .unwrap_or_else(BackendArg::platform_default);
    let mut checks = vec![fuse::check(backend)];
    checks.extend(found.checks.into_iter().chain(cache_checks));
    checks.push(hub_check);
    checks.extend(mount_check);
    checks.extend(refused::check(gathered));
    if cfg!(target_os = "macos") {
        let value = std::env::var_os(RELAX_WATCHDOG_VAR);
        checks.extend(watchdog_notes(value.as_deref()));
    }
    let failed = checks.iter().any(|c| c.verdict == Verdict::Fail);
    let (source, model) = (found.report, found.model);
    Ok(Report {
        checks,
        failed,
        source,
        model,
        cache,
        hub_cache,
        mount,
    })
}

/// The configured source as written (absolute) and, when it was examined, resolved:
/// where the mount point must not be.
fn configured_sources(found: &Findings, source: Option<&Path>) -> Vec<PathBuf> {
    let report = found.report.as_ref().filter(|r| r.configured);
    let resolved = report.and_then(|r| r.canonical.clone());
    let written = source.and_then(|s| std::path::absolute(s).ok());
    resolved.into_iter().chain(written).collect()
}

/// Whether doctor was asked about a path that has nothing to do with the configured
/// (or running) mount: not the mount, not in it, not its source nor in that.
fn unrelated(found: &Findings) -> bool {
    found.report.as_ref().is_some_and(|report| {
        !report.configured && report.fs.stagefs_source.is_none() && found.within.is_none()
    })
}

/// The mount whose use the environment is judged against, and its source's shape: the
/// stagefs mount examined, else the configured mount (whose source's shape is known
/// when the configured source was examined).
fn environment_target(
    found: &Findings,
    mountpoint: Option<&Path>,
) -> (Option<PathBuf>, Option<Shape>) {
    let shape = found.survey.as_ref().map(|s| s.shape);
    match found.report.as_ref() {
        // The mount, or a path in it: the survey is of the mount's source.
        Some(report) if report.fs.stagefs_source.is_some() => {
            (Some(report.fs.mount_point.clone()), shape)
        }
        report => {
            let configured = report.is_some_and(|r| r.configured) || found.within.is_some();
            (mountpoint.map(Into::into), shape.filter(|_| configured))
        }
    }
}

/// The macOS Metal watchdog notes, given the variable's value in doctor's own
/// environment. Built on every platform so they are tested; shown only on macOS.
fn watchdog_notes(value: Option<&OsStr>) -> Vec<Check> {
    let state = match value.map(|v| v.to_str().unwrap_or("(not UTF-8)")) {
        Some(value) => format!("{RELAX_WATCHDOG_VAR}={value} is set in this environment"),
        None => format!("{RELAX_WATCHDOG_VAR} is not set in this environment"),
    };
    vec![
        Check::note("gpu-watchdog", state).advise(
            "it relaxes the Metal command-buffer watchdog only for a process that starts with it, before Metal initialises: set it where the program is launched, or use `stagefs run --relax-gpu-watchdog -- COMMAND`",
        ),
        Check::note(
            "gpu-eval",
            "staging cannot help a single mx.eval over roughly 300 GB: that GPU work alone can outlast the watchdog",
        )
        .advise("evaluate such graphs in chunks (several smaller mx.eval calls)"),
        Check::note("gpu-display", "with a display active, the GPU interactivity watchdog is stricter")
            .advise("run long GPU jobs with the display asleep or from a remote session"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newline_in_a_name_stays_on_its_line() {
        let check = Check::fail("model", "me/x: a\nb.safetensors: it links to nothing");
        assert_eq!(
            render(&[check]),
            "fail  model        me/x: a\\nb.safetensors: it links to nothing\n"
        );
    }

    #[test]
    fn renders_aligned_lines_with_advice_below() {
        let fail = Check::fail("source", "did not answer").advise("check the share");
        let checks = [Check::ok("fuse", "/dev/fuse is usable"), fail];
        let expected = "ok    fuse         /dev/fuse is usable\n\
                        fail  source       did not answer\n\
                        \x20                  check the share\n";
        assert_eq!(render(&checks), expected);
    }

    #[test]
    fn a_source_and_cache_that_do_not_answer_fail() -> anyhow::Result<()> {
        let late = Gathered::late(Vec::new());
        let report = judge(
            &late,
            Some("/nas/hub"),
            None,
            Path::new("/c"),
            &Config::default(),
            None,
        )?;
        let fails = report.checks.iter().filter(|c| c.verdict == Verdict::Fail);
        let failed: Vec<_> = fails.map(|c| c.name).collect();
        assert_eq!(failed, ["source", "cache"]);
        assert!(report.failed);
        let summary = &report.checks[1].summary;
        let expected = "the source /nas/hub did not answer within 15s";
        assert!(summary.starts_with(expected), "{summary}");
        Ok(())
    }

    #[test]
    fn watchdog_notes_say_whether_the_variable_is_set_and_how_to_set_it() {
        let (unset, set) = (watchdog_notes(None), watchdog_notes(Some(OsStr::new("1"))));
        let expected = "AGX_RELAX_CDM_CTXSTORE_TIMEOUT is not set in this environment";
        assert_eq!(unset[0].summary, expected);
        assert!(set[0].summary.ends_with("=1 is set in this environment"));
        let advice = unset[0].advice.as_deref().unwrap_or_default();
        assert!(advice.contains("before Metal initialises"), "{advice}");
    }
}
