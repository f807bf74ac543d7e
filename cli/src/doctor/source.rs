//! The source checks: what filesystem it is on, the model in it, and how fast it
//! reads. The worker probes in order ([`probe`]); the parent judges what arrived
//! ([`inspect`]), and the first probe that did not answer ends the checks with a
//! failed one.

use std::io;
use std::path::{Path, PathBuf};

use anyhow::anyhow;
use serde::Serialize;
use stagefs_control::SourceFs;
use stagefs_layout::hf;
use stagefs_layout::models::{self, ModelKind, Survey};
use stagefs_source::SourceTree;
use stagefs_source::fskind::{FsInfo, FsKind, filesystem_of};

use super::lines::{Gathered, Line, Located, StepError, Target, Tx, reply};
use super::model::{self, Model, Probe};
use super::{Check, Verdict, hub};
use crate::units::{count, format_bytes};

/// What keeps an sshfs share mounted through a dropped connection, and makes a hung
/// one fail instead of hang.
const SSHFS_RECONNECT: &str = "-o reconnect,ServerAliveInterval=15";

/// Below this rate a model takes long enough to stage that it deserves a warning.
const SLOW_RATE: f64 = 25.0 * (1 << 20) as f64;
/// Small reads slower than this make every unstaged file (config, tokenizer) slow.
const SLOW_LATENCY_MS: f64 = 100.0;
/// Staging longer than this is worth doing ahead of time.
const LONG_STAGING_SECS: f64 = 600.0;
/// The least read that says anything about a source's rate: a read of a few bytes is
/// all latency, and would pass any source for a slow one.
const RATE_NEEDS_BYTES: u64 = 1 << 20;

/// The source as reported in JSON: the path as given (absolute) and with links
/// resolved (null if the source did not answer), whether every probe answered, and
/// for a path in a stagefs mount the filesystem of the mount's source, which is what
/// the measurement reads.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct SourceReport {
    pub(crate) path: PathBuf,
    pub(crate) canonical: Option<PathBuf>,
    #[serde(flatten)]
    pub(crate) fs: FsInfo,
    pub(crate) answered: bool,
    pub(crate) stagefs_source_fs: Option<FsInfo>,
    pub(crate) probe: Option<Probe>,
    pub(crate) probe_error: Option<String>,
    /// The path is the configured source rather than an argument.
    #[serde(skip)]
    pub(crate) configured: bool,
}

/// Everything the source checks found: the shape of the directory examined (of a
/// stagefs mount's source for a mount) and its models, and the `roots` where the
/// cache must not be (the source, and a stagefs mount's source).
#[derive(Debug, Default)]
pub(crate) struct Findings {
    pub(crate) checks: Vec<Check>,
    pub(crate) report: Option<SourceReport>,
    pub(crate) model: Option<Model>,
    pub(crate) survey: Option<Survey>,
    pub(crate) roots: Vec<PathBuf>,
    /// The source the examined path lies inside, which the survey describes.
    pub(crate) within: Option<PathBuf>,
}

/// Resolves `path` (in the worker).
pub(crate) fn locate(path: &Path) -> io::Result<Located> {
    let canonical = std::fs::canonicalize(path)?;
    Ok(Located {
        is_file: std::fs::metadata(&canonical)?.is_file(),
        fs: filesystem_of(&canonical)?,
        canonical,
    })
}

/// The worker's source probes, in the order the checks need them; each prints its
/// line, and one whose answer the next need ends them.
pub(crate) fn probe(arg: Option<&str>, source: Option<&Path>, dirs: Vec<PathBuf>, tx: &Tx) {
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
        if let Ok(fs) = filesystem_of(&lexical) {
            reply(&guess, Line::Lexical(fs));
        }
    });
    let located = locate(path).map_err(StepError::of);
    send(Line::Located(located.clone()));
    let Ok(located) = located else { return };
    if let Some(source) = &located.fs.stagefs_source {
        let fs = std::fs::canonicalize(source).and_then(|s| filesystem_of(&s));
        send(Line::SourceFs(fs.ok()));
    }
    let readable = readable_path(&located);
    // A path inside a source is judged as part of it: the source's shape, and its
    // model named as in the source (`me/other`, not `other`).
    let within = source_root(&located, source).filter(|root| *root != readable);
    let dirs = if configured || within.is_some() {
        dirs
    } else {
        Vec::new()
    };
    if let Some(root) = &within {
        send(Line::Within(root.clone()));
    }
    let surveyed = within.clone().unwrap_or_else(|| readable.clone());
    let mut catalog = None;
    if !located.is_file || within.is_some() {
        // The survey skips what it cannot list: a source nobody may read would look
        // empty ("no model found") instead of refused.
        let listed = std::fs::read_dir(&surveyed).map_err(StepError::of);
        let tree = listed.and_then(|_| SourceTree::new(&surveyed).map_err(StepError::of));
        let survey = tree.map(|tree| models::survey(&tree, &dirs));
        let Ok(found) = &survey else {
            send(Line::Survey(survey));
            return;
        };
        catalog = Some(found.catalog.clone());
        send(Line::Survey(survey));
    }
    let model = match model_id {
        Some(id) => model::find(&readable, id, &dirs),
        None => model::containing(&readable, within.as_deref()),
    }
    .map_err(StepError::of);
    send(Line::Model(model.clone()));
    let model = model.ok().flatten();
    if let (None, Some(catalog)) = (&model, &catalog) {
        send(Line::Unfollowable(model::sample_unfollowable(
            &surveyed, catalog,
        )));
    }
    if model_id.is_some() && model.is_none() {
        return;
    }
    let file = match model.and_then(|m| m.largest_weight) {
        Some(file) => Some(file),
        None if located.is_file => Some(readable),
        None => model::largest_file(&readable),
    };
    let measured = file.map(|file| model::measure(&file)).transpose();
    let measured = measured.map(Option::flatten);
    send(Line::Measured(measured.map_err(StepError::of)));
}

/// The source `located` lies inside, resolved: a stagefs mount's source for a path
/// in the mount, else the configured `source` if it holds the path.
fn source_root(located: &Located, source: Option<&Path>) -> Option<PathBuf> {
    if let Some(mounted) = &located.fs.stagefs_source {
        return std::fs::canonicalize(mounted).ok();
    }
    let source = std::fs::canonicalize(source?).ok()?;
    located.canonical.starts_with(&source).then_some(source)
}

/// Why the checks ended early: a probe did not answer (the check named fails), the
/// path could not be read at all, a failed check said why the rest cannot run, or a
/// bad argument (doctor reports an error).
enum Stop {
    Unanswered(&'static str),
    Unreadable(StepError),
    Failed,
    Invalid(anyhow::Error),
}

/// The probe's answer, or the check that fails for want of it.
fn arrived<T>(answer: Option<T>, check: &'static str) -> Result<T, Stop> {
    answer.ok_or(Stop::Unanswered(check))
}

/// The source checks for `target` from what the worker answered; `last` is the
/// filesystem the cache's last mount found its source on, if it recorded one.
/// Errors only for a bad argument: a path that does not exist, a model the source
/// does not have.
pub(crate) fn inspect(
    gathered: &Gathered,
    target: &Target,
    last: Option<&SourceFs>,
) -> anyhow::Result<Findings> {
    let mut found = Findings::default();
    let Some((path, configured, model_id)) = target.parts() else {
        let note = "no source configured: pass a path or set `source` in the config file";
        found.checks.push(Check::note("source", note));
        return Ok(found);
    };
    let mut report = SourceReport {
        path: path.into(),
        configured,
        ..Default::default()
    };
    let stopped = match found.steps(gathered, &mut report, model_id, last) {
        Ok(()) | Err(Stop::Failed) => None,
        Err(Stop::Invalid(e)) => return Err(e),
        Err(Stop::Unanswered(check)) => Some(unanswered(gathered, &mut report, check)),
        Err(Stop::Unreadable(e)) => Some(unreadable(gathered, &mut report, &e)),
    };
    report.answered = stopped.is_none();
    found.checks.extend(stopped);
    found.report = Some(report);
    Ok(found)
}

impl Findings {
    /// The checks in the order the worker probes; the first probe that did not answer
    /// ends them.
    fn steps(
        &mut self,
        gathered: &Gathered,
        report: &mut SourceReport,
        model_id: Option<&str>,
        last: Option<&SourceFs>,
    ) -> Result<(), Stop> {
        let located = match arrived(got!(gathered, Located), "source")? {
            Ok(located) => located,
            Err(e) if e.not_found && !report.configured => {
                let missing = anyhow!("{} does not exist", report.path.display());
                return Err(Stop::Invalid(missing));
            }
            Err(e) => return Err(Stop::Unreadable(e.clone())),
        };
        (report.canonical, report.fs) = (Some(located.canonical.clone()), located.fs.clone());
        self.roots.push(located.canonical.clone());
        if let Some(source) = &located.fs.stagefs_source {
            self.roots.push(source.clone());
            report.stagefs_source_fs = arrived(got!(gathered, SourceFs), "source")?.clone();
        }
        // What an unmounted share leaves looks like a local directory: say so, and
        // judge nothing in it.
        if let Some(check) = last.and_then(|was| unmounted(report, located, was)) {
            self.checks.push(check);
            return Err(Stop::Failed);
        }
        self.checks.push(fs_check(report));
        self.within = got!(gathered, Within).cloned();
        if !located.is_file || self.within.is_some() {
            match arrived(got!(gathered, Survey), "shape")? {
                Ok(survey) => {
                    self.survey = Some(survey.clone());
                    // A mount, a path in one, or a path in the configured source (whose
                    // mount the mount check reports on) needs no advice to mount it.
                    let in_mount = located.fs.stagefs_source.is_some();
                    let advise_mounting = !report.configured && !in_mount && self.within.is_none();
                    let examined = self.within.as_deref().unwrap_or(&report.path);
                    let check = hub::shape_check(examined, survey, advise_mounting);
                    self.checks.push(check);
                }
                // A dead mount can still answer a stat of its root (the kernel's
                // cached attributes) and fail the listing: the source check says so.
                Err(e) if e.dead_mount() || e.away() => {
                    self.checks.pop();
                    self.checks.push(source_failed(report, e));
                    return Err(Stop::Failed);
                }
                Err(e) => {
                    self.checks.push(unlisted(&readable_path(located), e));
                    return Err(Stop::Failed);
                }
            }
        }
        let readable = readable_path(located);
        self.model = match (arrived(got!(gathered, Model), "model")?, model_id) {
            (Ok(model), None) => model.clone(),
            (Ok(Some(model)), Some(_)) => Some(model.clone()),
            (Ok(None), Some(id)) => return Err(Stop::Invalid(not_in(id, &readable))),
            // An ambiguous or malformed id is the argument's fault.
            (Err(e), Some(_)) => return Err(Stop::Invalid(anyhow!("{e}"))),
            (Err(e), None) => {
                let failed = format!("reading the model failed: {e}");
                self.checks.push(Check::fail("model", failed));
                None
            }
        };
        self.checks.extend(self.model.as_ref().map(model_check));
        self.checks.extend(own_source_note(
            report,
            located,
            self.within.as_deref(),
            self.model.as_ref(),
        ));
        // A whole source: a model of it whose links cannot be followed fails here, or
        // doctor would call a share that refuses every link all ok.
        if let Some(Some(sample)) = got!(gathered, Unfollowable).filter(|_| self.model.is_none()) {
            self.checks.extend(links_check(sample));
        }
        let check = match arrived(got!(gathered, Measured), "speed")? {
            Ok(Some(probe)) => {
                report.probe = Some(probe.clone());
                if let Some(model) = &mut self.model
                    && probe.bytes_read >= RATE_NEEDS_BYTES
                    && model.size_bytes > 0
                {
                    model.staging_seconds = Some(staging_seconds(probe, model));
                }
                speed_check(probe, self.model.as_ref())
            }
            Ok(None) => {
                let nothing = format!("no non-empty file to measure in {}", readable.display());
                Check::note("speed", nothing)
            }
            Err(e) => {
                report.probe_error = Some(e.to_string());
                Check::fail("speed", format!("reading the source failed: {e}"))
            }
        };
        self.checks.push(check);
        Ok(())
    }
}

/// The failed check for a probe that did not answer in time.
fn unanswered(gathered: &Gathered, report: &mut SourceReport, check: &'static str) -> Check {
    if report.canonical.is_none() {
        report.fs = got!(gathered, Lexical).cloned().unwrap_or_default();
    }
    let on = match report.fs.kind {
        FsKind::Unknown => String::new(),
        _ => format!("; it is {}", report.fs.describe()),
    };
    let (shown, late) = (report.path.display(), &gathered.missing);
    let check = Check::fail(check, format!("the source {shown} {late}{on}"));
    let fs = &report.fs;
    if !fs.network {
        return check.advise("check that the disk or share is connected (`ls` it)");
    }
    let mount = fs.mount_point.display();
    let mut advice = format!(
        "its server or the network to it does not answer: check that the NAS is on and reachable; if it stays hung, `umount -l {mount}` (as root) and mount the share again"
    );
    advice.push_str(&sshfs_hint(&fs.fstype));
    check.advise(advice)
}

/// The failed check for a path that exists (or is configured) but could not be
/// resolved.
fn unreadable(gathered: &Gathered, report: &mut SourceReport, e: &StepError) -> Check {
    report.fs = got!(gathered, Lexical).cloned().unwrap_or_default();
    source_failed(report, e)
}

/// The failed source check for `e`, on the filesystem the report names.
fn source_failed(report: &SourceReport, e: &StepError) -> Check {
    let (path, fs) = (report.path.display(), &report.fs);
    let mount = match fs.mount_point.as_os_str().is_empty() {
        true => report.path.display(),
        false => fs.mount_point.display(),
    };
    let check = Check::fail("source", format!("cannot read {path}: {e}"));
    match fs.kind {
        // A live mount whose source is away fails what it has not staged with EIO.
        FsKind::Stagefs if !e.dead_mount() && e.away() => {
            let source = fs.stagefs_source.as_deref().unwrap_or(Path::new("SOURCE"));
            check.advise(format!(
                "the mount's source {0} does not answer (staged files are still served): `stagefs doctor {0}` says why",
                source.display()
            ))
        }
        FsKind::Stagefs => check.advise(format!(
            "if its daemon is gone: `stagefs unmount --lazy {mount}`, then mount again"
        )),
        _ if e.dead_mount() => {
            let summary = format!("{path}: the {} mount at {mount} is dead: {e}", fs.fstype);
            let unmount = unmount_dead(&mount.to_string());
            let mut advice = format!("unmount it with {unmount}, then mount the share again");
            advice.push_str(&sshfs_hint(&fs.fstype));
            Check::fail("source", summary).advise(advice)
        }
        _ if e.away() => {
            let mut advice = format!(
                "its server or the network to it is gone: check that the NAS is on and reachable; if it does not recover, `umount -l {mount}` (as root) and mount the share again"
            );
            advice.push_str(&sshfs_hint(&fs.fstype));
            check.advise(advice)
        }
        _ if e.denied() => check.advise(denied_advice(&report.path)),
        _ if report.configured && e.not_found => {
            check.advise("mount the share first, or fix `source` in the config file")
        }
        _ => check,
    }
}

/// The failed check for a source directory that could not be listed.
fn unlisted(dir: &Path, e: &StepError) -> Check {
    let check = Check::fail("shape", format!("cannot list {}: {e}", dir.display()));
    match e.denied() {
        true => check.advise(denied_advice(dir)),
        false => check,
    }
}

fn denied_advice(path: &Path) -> String {
    format!(
        "give the user who runs stagefs read and search (x) permission on it and the directories above (`ls -ld {}` shows who has them)",
        path.display()
    )
}

/// The failed check for a path under the mount point of the filesystem that the
/// cache's last mount found its source on (`was`), when that filesystem is no longer
/// mounted there: the path then leads to the directory underneath, which holds
/// nothing of the share. For a path in a stagefs mount, its source is judged.
fn unmounted(report: &SourceReport, located: &Located, was: &SourceFs) -> Option<Check> {
    let (source, now) = match (&located.fs.stagefs_source, &report.stagefs_source_fs) {
        (Some(source), Some(fs)) => (source, fs),
        (Some(_), None) => return None,
        (None, _) => (&located.canonical, &located.fs),
    };
    if !source.starts_with(&was.mount_point) || !was.unmounted_given(&now.mount_point) {
        return None;
    }
    let (at, below) = (was.mount_point.display(), now.mount_point.display());
    let summary = format!(
        "{}: the share is not mounted any more: it was {} at {at} when this cache was last mounted, and the path is now a directory of {below} ({})",
        source.display(),
        was.fstype,
        now.fstype
    );
    let mut advice = format!("mount the share at {at} again");
    advice.push_str(&sshfs_hint(&was.fstype));
    if located.fs.kind == FsKind::Stagefs {
        let mount = located.fs.mount_point.display();
        advice.push_str(&format!("; the stagefs mount at {mount} serves what it staged meanwhile, and reads the share again once it is back"));
    }
    Some(Check::fail("source", summary).advise(advice))
}

/// How to clear a dead mount at `mount` on this platform.
fn unmount_dead(mount: &str) -> String {
    match cfg!(target_os = "macos") {
        true => format!("`umount -f {mount}` (or `diskutil unmount force {mount}`)"),
        false => format!("`fusermount3 -u {mount}` (as root: `umount -l {mount}`)"),
    }
}

/// For an sshfs share, the options that keep it mounted through a dropped
/// connection; nothing for other filesystems.
fn sshfs_hint(fstype: &str) -> String {
    match fstype.ends_with("sshfs") {
        true => format!(
            "; add `{SSHFS_RECONNECT}` to the sshfs command so that it survives dropped connections"
        ),
        false => String::new(),
    }
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
    let Located { canonical, fs, .. } = located;
    match (&fs.stagefs_source, canonical.strip_prefix(&fs.mount_point)) {
        (Some(source), Ok(rel)) => source.join(rel),
        (Some(source), Err(_)) => source.clone(),
        (None, _) => canonical.clone(),
    }
}

fn fs_check(report: &SourceReport) -> Check {
    let fs = &report.fs;
    let summary = format!("{}: {}", report.path.display(), fs.describe());
    let advice = match fs.kind {
        FsKind::Stagefs => return stagefs_check(report),
        FsKind::Fuse | FsKind::Unknown => {
            let unknown = format!("{summary}; whether it is remote is not known");
            return Check::note("source", unknown);
        }
        FsKind::Removable if fs.lacks_symlinks() => {
            "exFAT and FAT hold no symlinks, so snapshots hold full copies instead of links to blobs/; stagefs mirrors them as they are"
        }
        FsKind::Local => {
            "a local disk is already fast; stagefs pays off for network and USB sources"
        }
        // Whether sshfs was started with them is not in the mount table: said before
        // the first dropped connection leaves a dead mount, not only after.
        _ if fs.fstype.ends_with("sshfs") => {
            return Check::ok("source", summary).advise(format!(
                "unless the sshfs command has them, add `{SSHFS_RECONNECT}` so that it survives dropped connections"
            ));
        }
        _ => return Check::ok("source", summary),
    };
    Check::ok("source", summary).advise(advice)
}

fn stagefs_check(report: &SourceReport) -> Check {
    let (fs, path) = (&report.fs, report.path.display());
    let source = fs.stagefs_source.clone().unwrap_or_else(|| "?".into());
    let under = report.stagefs_source_fs.as_ref().map(FsInfo::describe);
    let under = under.map(|fs| format!(", {fs}")).unwrap_or_default();
    let (mount, source) = (fs.mount_point.display(), source.display());
    let summary =
        format!("{path} is in the stagefs mount at {mount}, which mirrors {source}{under}");
    let verdict = match report.configured {
        true => Verdict::Warn,
        false => Verdict::Note,
    };
    Check::new("source", verdict, summary).advise(format!(
        "the checks below read {source}; a stagefs mount is no source for another mount: use {source} itself"
    ))
}

/// The note for a model folder examined with no source known to hold it (no mount of
/// one runs, the config file names none): it is judged as a source of its own, which
/// is what it is if mounted alone, and its model is named by its own name. Nothing
/// could tell which larger directory, if any, the user means to mount instead.
fn own_source_note(
    report: &SourceReport,
    located: &Located,
    within: Option<&Path>,
    model: Option<&Model>,
) -> Option<Check> {
    let in_a_source = report.configured || located.fs.stagefs_source.is_some() || within.is_some();
    let itself = model.is_some_and(|m| m.path == located.canonical && m.snapshot.is_none());
    if in_a_source || !itself {
        return None;
    }
    let path = located.canonical.display();
    Some(
        Check::note(
            "source",
            format!("no mount or config file names a source holding {path}, so it is judged as a source of its own"),
        )
        .advise("if it lies in a larger source you mount, set `source` in the config file (or mount that source) and run doctor again to judge it as part of that source"),
    )
}

fn model_check(model: &Model) -> Check {
    if let Some(check) = links_check(model) {
        return check;
    }
    let place = match (model.kind, &model.snapshot) {
        (ModelKind::HfRepo, Some(snapshot)) => {
            let name = snapshot.file_name().unwrap_or_default().to_string_lossy();
            format!("snapshot {}", name.chars().take(12).collect::<String>())
        }
        (kind, _) => format!("{} {}", kind.describe(), model.path.display()),
    };
    let (id, size) = (&model.id, format_bytes(model.size_bytes));
    let files = count(model.files, "file", "files");
    Check::ok("model", format!("{id}: {files}, {size} ({place})"))
}

/// The failed model check for a model with links that lead to no file, naming the
/// first; None when every link leads to a file.
fn links_check(model: &Model) -> Option<Check> {
    let first = model.unfollowable.first()?;
    let base = model.snapshot.as_deref().unwrap_or(&model.path);
    let name = first.path.strip_prefix(base).unwrap_or(&first.path);
    let links = count(model.unfollowable.len(), "link", "links");
    let summary = format!(
        "{}: {links} cannot be followed ({} of its files can be read); {}: {}",
        model.id,
        model.files,
        name.display(),
        first.why
    );
    let advice = match first.refused {
        true => {
            "mount the share again with `-o no_contain_symlinks`: sshfs refuses links with `..` by default, and every snapshot file links to ../../blobs/"
        }
        false => {
            "make each link lead to a file in the source (a snapshot's to its repository's blobs/): stagefs cannot stage the others"
        }
    };
    Some(Check::fail("model", summary).advise(advice))
}

/// Seconds to stage `model` at the measured rate (one stream; a mount copies with
/// several, so this is an upper estimate).
fn staging_seconds(probe: &Probe, model: &Model) -> f64 {
    model.size_bytes as f64 / probe.throughput_bytes_per_sec.max(1.0)
}

pub(super) fn speed_check(probe: &Probe, model: Option<&Model>) -> Check {
    let (latency, rate) = (probe.latency_ms, probe.throughput_bytes_per_sec);
    let (read, name) = (format_bytes(probe.bytes_read), probe.file.file_name());
    // A file's name, with a blob's 64-digit hash cut to something readable.
    let name = name.unwrap_or_default().to_string_lossy();
    let name = match name.chars().count() {
        ..=24 => name.into_owned(),
        _ => name.chars().take(12).collect::<String>() + "…",
    };
    let shown_latency = format_latency(latency);
    if probe.bytes_read < RATE_NEEDS_BYTES {
        let summary =
            format!("latency {shown_latency} ({read} of {name}: too little to measure a rate)");
        let verdict = match latency > SLOW_LATENCY_MS {
            true => Verdict::Warn,
            false => Verdict::Ok,
        };
        return Check::new("speed", verdict, summary);
    }
    let shown_rate = format_rate(rate);
    let mut summary = format!("latency {shown_latency}, {shown_rate} ({read} of {name})");
    // Nothing to stage (every link broken, or empty files): no estimate to give.
    let staging = model
        .filter(|m| m.size_bytes > 0)
        .map(|m| (m, staging_seconds(probe, m)));
    if let Some((model, seconds)) = staging {
        let (id, size) = (&model.id, format_bytes(model.size_bytes));
        let time = format_duration(seconds);
        summary.push_str(&format!("; staging {id} ({size}) takes about {time}"));
    }
    let slow = rate < SLOW_RATE || latency > SLOW_LATENCY_MS;
    let verdict = if slow { Verdict::Warn } else { Verdict::Ok };
    let check = Check::new("speed", verdict, summary);
    if !slow && staging.is_none_or(|(_, s)| s <= LONG_STAGING_SECS) {
        return check;
    }
    let id = model.map_or("MODEL", |m| m.id.as_str());
    check.advise(format!(
        "stage models before loading them: `stagefs prefetch {id}`, or `stagefs run --model {id} -- COMMAND`"
    ))
}

/// `12 µs`, `1.5 ms`, `42 ms`, `2.3 s`.
fn format_latency(ms: f64) -> String {
    match ms {
        ..1.0 => format!("{:.0} µs", ms * 1000.0),
        ..10.0 => format!("{ms:.1} ms"),
        ..1000.0 => format!("{ms:.0} ms"),
        _ => format!("{:.1} s", ms / 1000.0),
    }
}

/// `850 MiB/s`, `2.4 MiB/s`.
fn format_rate(bytes_per_sec: f64) -> String {
    match bytes_per_sec / f64::from(1u32 << 20) {
        mib if mib >= 10.0 => format!("{mib:.0} MiB/s"),
        mib => format!("{mib:.1} MiB/s"),
    }
}

/// `45 s`, `12 min`, `3.5 h`.
fn format_duration(seconds: f64) -> String {
    match seconds {
        ..90.0 => format!("{:.0} s", seconds.max(1.0)),
        ..5400.0 => format!("{:.0} min", seconds / 60.0),
        _ => format!("{:.1} h", seconds / 3600.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speed_verdicts_and_staging_estimate() -> serde_json::Result<()> {
        let probe = |mib: f64, latency_ms: f64| -> serde_json::Result<Probe> {
            let rate = mib * (1 << 20) as f64;
            serde_json::from_value(serde_json::json!({"file": "/s/blobs/abc", "file_size": 1,
                "latency_ms": latency_ms, "throughput_bytes_per_sec": rate, "bytes_read": 64 << 20, "seconds": 1.0}))
        };
        let model = |size_bytes: u64| -> serde_json::Result<Model> {
            serde_json::from_value(
                serde_json::json!({"id": "o/m", "kind": "hf_repo", "path": "/s/m", "files": 3,
                "snapshot": "/s/m/snapshots/0123456789abcdef", "size_bytes": size_bytes, "largest_weight": null}),
            )
        };
        let fast = speed_check(&probe(500.0, 0.2)?, Some(&model(1 << 30)?));
        assert_eq!((fast.verdict, fast.advice), (Verdict::Ok, None));
        let expected =
            "latency 200 µs, 500 MiB/s (64.0 MiB of abc); staging o/m (1.0 GiB) takes about 2 s";
        assert_eq!(fast.summary, expected);
        let slow = speed_check(&probe(10.0, 5.0)?, None).advice;
        assert!(slow.unwrap_or_default().contains("stagefs prefetch MODEL"));
        let huge = speed_check(&probe(500.0, 0.2)?, Some(&model(1 << 40)?));
        assert_eq!(huge.verdict, Verdict::Ok);
        assert!(huge.advice.unwrap_or_default().contains("prefetch o/m"));
        let mut tiny = probe(0.001, 0.2)?;
        tiny.bytes_read = 3;
        let tiny = speed_check(&tiny, None);
        assert_eq!(
            tiny.verdict,
            Verdict::Ok,
            "a 3-byte read says nothing of the rate"
        );
        assert_eq!(
            tiny.summary,
            "latency 200 µs (3 B of abc: too little to measure a rate)"
        );
        let summary = model_check(&model(1 << 20)?).summary;
        assert_eq!(summary, "o/m: 3 files, 1.0 MiB (snapshot 0123456789ab)");
        let latencies = [0.084, 1.54, 42.4, 2300.0].map(format_latency);
        assert_eq!(latencies, ["84 µs", "1.5 ms", "42 ms", "2.3 s"]);
        assert_eq!(format_rate(2.4 * 1048576.0), "2.4 MiB/s");
        let durations = [0.2, 600.0, 3.5 * 3600.0].map(format_duration);
        assert_eq!(durations, ["1 s", "10 min", "3.5 h"]);
        Ok(())
    }

    #[test]
    fn an_id_that_is_also_a_path_here_is_a_path() {
        let (id, hub) = (Some("org/name"), Some(Path::new("/hub")));
        let is_model =
            |exists| Target::of(id, hub, |_| exists).map(|t| t.parts().map(|p| p.2.is_some()));
        assert_eq!(is_model(false), Ok(Some(true)));
        assert_eq!(is_model(true), Ok(Some(false)));
        assert_eq!(Target::of(None, None, |_| false), Ok(Target::Nothing));
    }

    fn fs_at(mount_point: &str, fstype: &str, kind: FsKind) -> FsInfo {
        FsInfo {
            kind,
            fstype: fstype.into(),
            network: kind == FsKind::Network,
            mount_point: mount_point.into(),
            device: "dev".into(),
            stagefs_source: None,
        }
    }

    #[test]
    fn a_source_whose_share_was_unmounted_underneath_fails() {
        let was = SourceFs {
            fstype: "fuse.sshfs".into(),
            network: true,
            mount_point: "/mnt/nas".into(),
        };
        let located = |fs| Located {
            canonical: "/mnt/nas/hub".into(),
            fs,
            is_file: false,
        };
        let root_disk = located(fs_at("/", "ext4", FsKind::Local));
        let check = unmounted(&SourceReport::default(), &root_disk, &was).expect("fails");
        let expected = "/mnt/nas/hub: the share is not mounted any more: it was fuse.sshfs at /mnt/nas when this cache was last mounted, and the path is now a directory of / (ext4)";
        assert_eq!(
            (check.verdict, check.summary.as_str()),
            (Verdict::Fail, expected)
        );
        let advice = check.advice.unwrap_or_default();
        assert!(
            advice.starts_with("mount the share at /mnt/nas again; add `-o reconnect"),
            "{advice}"
        );
        let mounted = located(fs_at("/mnt/nas", "fuse.sshfs", FsKind::Network));
        assert!(unmounted(&SourceReport::default(), &mounted, &was).is_none());
    }

    #[test]
    fn a_dead_mount_names_the_unmount_and_a_refusal_names_permissions() -> anyhow::Result<()> {
        let failed = |errno| {
            let e = StepError::of(io::Error::from_raw_os_error(errno));
            let sshfs = fs_at("/mnt/nas", "fuse.sshfs", FsKind::Network);
            let lines = vec![Line::Lexical(sshfs), Line::Located(Err(e))];
            let target = Target::Path {
                path: "/mnt/nas/hub".into(),
                configured: true,
            };
            inspect(&Gathered::late(lines), &target, None).map(|f| f.checks[0].clone())
        };
        let dead = failed(libc::ENOTCONN)?;
        let summary = "/mnt/nas/hub: the fuse.sshfs mount at /mnt/nas is dead: ";
        assert!(dead.summary.starts_with(summary), "{}", dead.summary);
        let advice = dead.advice.unwrap_or_default();
        assert!(advice.contains("then mount the share again"), "{advice}");
        let denied = failed(libc::EACCES)?.advice.unwrap_or_default();
        assert!(denied.contains("`ls -ld /mnt/nas/hub`"), "{denied}");
        Ok(())
    }

    #[test]
    fn the_first_probe_that_did_not_answer_fails_its_check() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let judge = |lines: Vec<Line>, path: &Path, configured| {
            let target = Target::Path {
                path: path.into(),
                configured,
            };
            inspect(&Gathered::late(lines), &target, None)
        };
        let located = |path| Line::Located(locate(path).map_err(StepError::of));
        let names = |found: &Findings| -> Vec<_> {
            found.checks.iter().map(|c| (c.name, c.verdict)).collect()
        };
        let (ok, fail) = (Verdict::Ok, Verdict::Fail);
        // A source that cannot be listed ends the checks: nothing below could be found.
        let survey = Line::Survey(Err(StepError::of(anyhow!("denied"))));
        let found = judge(vec![located(dir.path()), survey], dir.path(), false)?;
        assert_eq!(names(&found), [("source", ok), ("shape", fail)]);
        let empty = models::survey(&SourceTree::new(dir.path())?, &[]);
        let found = judge(
            vec![located(dir.path()), Line::Survey(Ok(empty))],
            dir.path(),
            false,
        )?;
        let shape = found.checks[1].verdict;
        assert_eq!(
            names(&found),
            [("source", ok), ("shape", shape), ("model", fail)]
        );
        let late = "did not answer within 15s";
        assert!(found.checks[2].summary.contains(late));
        let nothing = judge(Vec::new(), dir.path(), false)?;
        assert!(nothing.checks[0].summary.contains(late));
        assert!(!nothing.report.expect("reported").answered);
        let missing = Path::new("/nonexistent/doctor/path");
        assert!(
            judge(vec![located(missing)], missing, false).is_err(),
            "a bad argument"
        );
        let found = judge(vec![located(missing)], missing, true)?;
        assert_eq!(found.checks[0].verdict, Verdict::Fail);
        let advice = found.checks[0].advice.clone().unwrap_or_default();
        assert!(advice.contains("fix `source`"), "{advice}");
        Ok(())
    }
}
