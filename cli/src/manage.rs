//! `status`, `evict` and `verify`: through a running mount's control socket when one
//! answers, otherwise on the cache directory directly (under its lock, so never
//! while a mount owns it).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use stagefs_control::{
    EvictReport, EvictSelector, FileRef, ModelStatus, Request, Response, StagingFailure,
    StatusReport, Stopping, TooLarge, UnfollowableLink, VerifyReport,
};
use stagefs_layout::models::{self, ModelKind};
use stagefs_mount::cache_dir::{self, CacheDirError};
use stagefs_source::SourceHealth;
use stagefs_store::Hold;

use crate::args::{EvictArgs, StatusArgs, VerifyArgs};
use crate::config::Config;
use crate::units::{count, format_bytes};

/// What `--on-full read-source` means, where the user sees it (the mount line,
/// status): the daemon's log alone says it only once a file is read that way.
pub(crate) const READS_SOURCE_WHEN_FULL: &str =
    "a file the cache cannot hold is read from the source, at its speed";

/// Why a mount refuses a blob, where status and doctor name one.
pub(crate) const REFUSED: &str =
    "its bytes on the source do not match the sha256 in its name, so opening it fails";

/// What to do about a refused blob at `path` (in the source): download its
/// repository's file again (`hf download org/name --force-download`).
pub(crate) fn download_again(path: &Path) -> String {
    let repo = stagefs_layout::hf::repo_of(path);
    let id = repo
        .as_deref()
        .and_then(Path::file_name)
        .and_then(|name| stagefs_layout::hf::id_of_repo_dir(&name.to_string_lossy()));
    let Some(id) = id else {
        return "download it again, or delete it on the source".into();
    };
    let typed = |kind: &str, prefix: &str| {
        let name = id.strip_prefix(prefix)?;
        Some(format!("{name} --repo-type {kind}"))
    };
    let args = typed("dataset", "datasets/")
        .or_else(|| typed("space", "spaces/"))
        .unwrap_or_else(|| id.clone());
    format!(
        "download it again (`hf download {args} --force-download`), or delete the blob on the source"
    )
}

/// `stagefs status`: the named cache, else every running mount's (one block each),
/// else the default cache. With a model, the cache whose mount serves it (picked as
/// for `evict`), that model alone, with its cached files; with `--files`, every
/// model's cached files.
pub(crate) fn status(args: &StatusArgs, config: &Config, verbose: bool) -> anyhow::Result<()> {
    let flag = args.cache.cache_dir.as_deref();
    let dirs = match args.model.as_deref() {
        Some(model) => vec![crate::mounts::cache_dir(config, flag, &[model])?],
        None => crate::mounts::cache_dirs(config, flag)?,
    };
    // A fresh account: no mount has made the cache yet, which is no error.
    if let [dir] = dirs.as_slice()
        && !dir.exists()
        && args.model.is_none()
    {
        match args.json {
            // No cache, no mount: no report in the list of them.
            true => print_json(&StatusJson { mounts: &[] })?,
            false => println!(
                "nothing mounted yet (no cache at {}); start with `stagefs mount SOURCE MOUNTPOINT`",
                dir.display()
            ),
        }
        return Ok(());
    }
    let reports = dirs
        .iter()
        .map(|dir| status_of(dir, args))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if args.json {
        return print_json(&StatusJson { mounts: &reports });
    }
    let blocks: Vec<String> = (dirs.iter().zip(&reports))
        .map(|(dir, report)| {
            let copying = report.in_flight.iter().map(|f| f.path.clone());
            let listed = report.models.iter().flat_map(|m| &m.files);
            let paths = (copying.chain(report.refused.iter().cloned()))
                .chain(listed.map(|f| f.path.clone()))
                .chain(report.too_large.iter().map(|t| t.path.clone()))
                .chain(report.failures.iter().map(|f| f.path.clone()))
                .chain(report.other_examples.iter().cloned())
                .collect();
            render_status(report, &Names::of(dir, paths, verbose))
        })
        .collect();
    print!("{}", blocks.join("\n"));
    Ok(())
}

/// `status --json`: always an object with one report per cache in `mounts`, whether
/// none, one or several run, so that a script reads every case the same way.
#[derive(serde::Serialize)]
struct StatusJson<'a> {
    mounts: &'a [StatusReport],
}

/// Prints a command's report as JSON on stdout.
pub(crate) fn print_json(report: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(report)?);
    Ok(())
}

/// The status of the cache at `dir`, with the dead mount it left if any, and the
/// cached files `args` asks for under their models.
fn status_of(dir: &Path, args: &StatusArgs) -> anyhow::Result<StatusReport> {
    let mut report = match ask(dir, Request::Status)? {
        Response::Status { report } => report,
        other => return Err(unexpected(other)),
    };
    if report.mountpoint.is_none() {
        report.dead_mount = stagefs_mount::registry::dead_mount_of(dir);
    }
    if unmounted_underneath(&report) {
        report.stopping = Some(Stopping::Detached);
    }
    let selector = match args.model.as_deref() {
        Some(model) => named(model, dir)?,
        None if args.files => EvictSelector::All,
        None => return Ok(*report),
    };
    let files = match ask(
        dir,
        Request::Files {
            selector: selector.clone(),
        },
    )? {
        Response::Files { files } => files,
        other => return Err(unexpected(other)),
    };
    file_under_models(&mut report, files);
    if let Some(model) = args.model.as_deref() {
        report.models.retain(|m| is_named(m, model, &selector));
    }
    Ok(*report)
}

/// Puts each cached file under the model it belongs to (the deepest whose path holds it).
fn file_under_models(report: &mut StatusReport, files: Vec<FileRef>) {
    for file in files {
        let owner = report
            .models
            .iter_mut()
            .filter(|m| file.path.starts_with(&m.path))
            .max_by_key(|m| m.path.components().count());
        if let Some(model) = owner {
            model.files.push(file);
        }
    }
}

/// Whether `model` is the one `status MODEL` named: it has cached files the name
/// chose, or the name is its id, its path, or the end of it.
fn is_named(model: &ModelStatus, name: &str, selector: &EvictSelector) -> bool {
    let by_name = match selector {
        EvictSelector::Path { path } => {
            model.path.starts_with(path) || path.starts_with(&model.path)
        }
        _ => model.model == name || models::id_matches(name, &model.path),
    };
    by_name || !model.files.is_empty()
}

/// Right after a mount with a `--max-size`: one warning line if a model's file is
/// larger than it, since opening that file fails (or reads the source) and the
/// loader's own error would not say why. Asked of the mount, which knows the
/// models; says nothing if it does not answer.
pub(crate) fn warn_too_large(cache_dir: &Path) {
    let Ok(Response::Status { report }) = cache_dir::ask(cache_dir, Request::Status) else {
        return;
    };
    let Some(first) = report.too_large.first() else {
        return;
    };
    let paths = report.too_large.iter().map(|t| t.path.clone()).collect();
    let names = Names::of(cache_dir, paths, false);
    let more = match report.too_large.len() {
        1 => String::new(),
        n => format!(" (and the largest files of {} more models)", n - 1),
    };
    eprintln!(
        "stagefs: warning: {}{more}; `stagefs status` lists them",
        too_large_line(first, &report, &names)
    );
}

/// `stagefs evict`.
pub(crate) fn evict(args: &EvictArgs, config: &Config, verbose: bool) -> anyhow::Result<()> {
    let targets: Vec<&str> = args.target.as_deref().into_iter().collect();
    let dir = crate::mounts::cache_dir(config, args.cache.cache_dir.as_deref(), &targets)?;
    let selector = selector(args, &dir)?;
    let request = Request::Evict {
        selector,
        dry_run: args.dry_run,
    };
    let report = match ask(&dir, request)? {
        Response::Evicted { report } => report,
        other => return Err(unexpected(other)),
    };
    let paths: Vec<PathBuf> = (report.evicted.iter().chain(&report.in_use))
        .map(|f| f.path.clone())
        .collect();
    match args.json {
        true => print_json(&report)?,
        false => print!(
            "{}",
            render_evict(&report, &Names::of(&dir, paths, verbose))
        ),
    }
    if let Some(refusal) = kept_because(&report.in_use) {
        bail!("{refusal}");
    }
    Ok(())
}

/// `stagefs verify`.
pub(crate) fn verify(args: &VerifyArgs, config: &Config, verbose: bool) -> anyhow::Result<()> {
    let targets: Vec<&str> = args.target.as_deref().into_iter().collect();
    let dir = crate::mounts::cache_dir(config, args.cache.cache_dir.as_deref(), &targets)?;
    let (model, path) = match args.target.as_deref().map(|t| named(t, &dir)).transpose()? {
        Some(EvictSelector::Path { path }) => (None, Some(path)),
        Some(EvictSelector::Model { id }) => (Some(id), None),
        _ => (None, None),
    };
    let request = Request::Verify {
        model,
        path,
        repair: args.repair,
    };
    let report = match ask(&dir, request)? {
        Response::Verified { report } => report,
        other => return Err(unexpected(other)),
    };
    let mismatched = report.mismatches.iter().map(|m| &m.path);
    let paths = mismatched.chain(&report.stale).cloned().collect();
    match args.json {
        true => print_json(&report)?,
        false => print!(
            "{}",
            render_verify(&report, &Names::of(&dir, paths, verbose))
        ),
    }
    let repaired = |path: &PathBuf| report.repaired.contains(path);
    let unrepaired = report
        .mismatches
        .iter()
        .filter(|m| !repaired(&m.path))
        .count();
    let stale = report.stale.iter().filter(|p| !repaired(p)).count();
    // A stale copy is never served (the next open copies the file again): said, not
    // a failure.
    if stale > 0 && !args.json {
        let (is, was, it) = match stale {
            1 => ("is", "it was", "it"),
            _ => ("are", "they were", "them"),
        };
        eprintln!(
            "stagefs: {} {is} stale (the source changed since {was} staged; the next open stages {it} again); `stagefs verify --repair` drops {it} now",
            count(stale, "staged copy", "staged copies"),
        );
    }
    if unrepaired > 0 {
        let verb = if unrepaired == 1 { "does" } else { "do" };
        bail!(
            "{} {verb} not match; run `stagefs verify --repair` to drop them",
            count(unrepaired, "staged copy", "staged copies")
        );
    }
    Ok(())
}

/// How users know the files a command reports on: `org/name: file`, a folder's path;
/// with `-v`, followed by the path in the source (a blob's hash).
pub(crate) struct Names {
    names: HashMap<PathBuf, String>,
    verbose: bool,
}

impl Names {
    /// The names of `paths`, asked of the mount serving `dir` (or its recorded source).
    pub(crate) fn of(dir: &Path, paths: Vec<PathBuf>, verbose: bool) -> Names {
        let names = match paths.is_empty() {
            true => Vec::new(),
            false => cache_dir::names(dir, &paths),
        };
        Names {
            names: paths.into_iter().zip(names).collect(),
            verbose,
        }
    }

    /// Names by the paths alone, without asking anything (tests, and where nothing
    /// may be asked).
    #[cfg(test)]
    pub(crate) fn offline(paths: &[PathBuf], verbose: bool) -> Names {
        let names = stagefs_mount::admin::names(None, paths);
        Names {
            names: paths.iter().cloned().zip(names).collect(),
            verbose,
        }
    }

    /// `path` as users know it, on one line whatever its name holds.
    pub(crate) fn show(&self, path: &Path) -> String {
        let name = self
            .names
            .get(path)
            .cloned()
            .unwrap_or_else(|| path.display().to_string());
        match self.verbose && name != path.display().to_string() {
            true => escaped(&format!("{name} [{}]", path.display())),
            false => escaped(&name),
        }
    }
}

/// `text` with control characters (a newline in a file name) written as escapes, so
/// that one file stays one line of output.
pub(crate) fn escaped(text: &str) -> String {
    match text.contains(char::is_control) {
        false => text.to_string(),
        true => text
            .chars()
            .map(|c| match c.is_control() {
                true => c.escape_default().to_string(),
                false => c.to_string(),
            })
            .collect(),
    }
}

/// Why copies were kept, as the one line `evict` fails with: a reader (close it) or
/// the redirect grace (wait), each with its count.
fn kept_because(kept: &[FileRef]) -> Option<String> {
    if kept.is_empty() {
        return None;
    }
    let open = kept
        .iter()
        .filter(|f| !matches!(f.hold, Some(Hold::Grace { .. })))
        .count();
    let graced: Vec<(u64, u64)> = kept
        .iter()
        .filter_map(|f| match f.hold {
            Some(Hold::Grace {
                secs_left,
                grace_secs,
            }) => Some((secs_left, grace_secs)),
            _ => None,
        })
        .collect();
    let wait = graced.iter().map(|(left, _)| *left).max().unwrap_or(0);
    let grace = graced.iter().map(|(_, g)| *g).max().unwrap_or(0);
    let (were, them) = match kept.len() {
        1 => ("was", "it"),
        _ => ("were", "them"),
    };
    let kept_line = format!(
        "{} in use {were} not evicted",
        count(kept.len(), "file", "files")
    );
    let links = match graced.len() {
        1 => "its link was",
        _ => "their links were",
    };
    let linked: Vec<u64> = kept
        .iter()
        .filter_map(|f| match f.hold {
            Some(Hold::Link { secs_left }) => Some(secs_left),
            _ => None,
        })
        .collect();
    if linked.len() == kept.len() {
        let wait = linked.iter().max().copied().unwrap_or(0);
        return Some(format!(
            "{kept_line}: a client of the NFS mount was answered JUKEBOX lately and may still follow links to {them}; retry in {wait}s"
        ));
    }
    Some(match (open, graced.len()) {
        (_, 0) => format!(
            "{kept_line}: open, or being staged; close the programs reading {them} and retry"
        ),
        (0, _) => format!(
            "{kept_line}: {links} followed less than {grace}s ago (--redirect-grace), so a program may be opening {them}; retry in {wait}s"
        ),
        _ => format!(
            "{kept_line}: {open} open or being staged, {} whose links were followed less than {grace}s ago (--redirect-grace); close the programs reading them and retry in {wait}s",
            graced.len()
        ),
    })
}

fn ask(dir: &Path, request: Request) -> anyhow::Result<Response> {
    cache_dir::ask(dir, request).map_err(with_cache_hint)
}

/// A cache directory error as users read it: a cache that does not exist yet is a
/// fresh account's (nothing was ever mounted with it), not a wrong directory.
pub(crate) fn with_cache_hint(e: CacheDirError) -> anyhow::Error {
    match e {
        CacheDirError::NotACache(dir) if !dir.exists() => anyhow!(
            "nothing mounted yet (no cache at {}); start with `stagefs mount SOURCE MOUNTPOINT`",
            dir.display()
        ),
        CacheDirError::NotACache(dir) => anyhow!(
            "{} is not a stagefs cache directory; name the cache directory of a mount with --cache-dir",
            dir.display()
        ),
        e => anyhow!(e),
    }
}

fn unexpected(response: Response) -> anyhow::Error {
    CacheDirError::unexpected(&response).into()
}

/// A model id, or a path inside the mount or the source turned into a source path.
fn selector(args: &EvictArgs, dir: &Path) -> anyhow::Result<EvictSelector> {
    if args.all {
        return Ok(EvictSelector::All);
    }
    if let Some(secs) = args.older_than {
        return Ok(EvictSelector::OlderThan { secs });
    }
    if let Some(bytes) = args.to_size {
        return Ok(EvictSelector::ToSize { bytes });
    }
    named(args.target.as_deref().context("name what to evict")?, dir)
}

/// What `evict` and `verify` take as a target: a path inside the mount or the source,
/// turned into a source path, or a model id.
fn named(target: &str, dir: &Path) -> anyhow::Result<EvictSelector> {
    if crate::mounts::names_a_path(target) {
        return Ok(EvictSelector::Path {
            path: cache_dir::source_relative(Path::new(target), dir)?,
        });
    }
    if models::is_model_id(target) {
        return Ok(EvictSelector::Model {
            id: target.to_string(),
        });
    }
    bail!("{target}: neither an existing path nor a model id like org/name or a path in the source")
}

/// Whether the daemon says it runs a mount that the mount table no longer lists:
/// unmounted with `--lazy` (or `umount -l`) while files were open there, which the
/// daemon serves until they are closed. Nothing is mounted there any more.
fn unmounted_underneath(report: &StatusReport) -> bool {
    let Some(mnt) = report.mountpoint.as_deref() else {
        return false;
    };
    report.stopping.is_none()
        && report.export.is_none()
        && !mnt.as_os_str().is_empty()
        && !stagefs_mount::table::stagefs_mounted_at(mnt)
}

/// The status report; `names` show the files being copied (with `-v`, their paths
/// in the source too).
fn render_status(r: &StatusReport, names: &Names) -> String {
    let mut out = String::new();
    let u = &r.usage;
    let _ = writeln!(out, "cache     {}", r.cache_dir.display());
    match (&r.mountpoint, &r.export) {
        (Some(mnt), _) if !mnt.as_os_str().is_empty() => {
            let backend = r.backend.map(|b| format!(", {b}")).unwrap_or_default();
            let read_only = if r.read_only { ", read-only" } else { "" };
            let state = match r.stopping {
                None => "running",
                Some(Stopping::Unmounting) => "stopping",
                Some(Stopping::Detached) => "detached",
                Some(Stopping::Busy) => "stopping",
            };
            let _ = writeln!(
                out,
                "mount     {} ({state}{backend}{read_only}){}",
                mnt.display(),
                stopping_note(r.stopping)
            );
        }
        // `stagefs serve`: an export, mounted by no one here.
        (Some(_), Some(export)) => {
            let _ = writeln!(out, "mount     not mounted; serving {export} (nfs)");
        }
        _ => match &r.dead_mount {
            Some(dead) => {
                let _ = writeln!(out, "mount     {}", crate::mounts::dead_line(dead));
            }
            None => {
                let _ = writeln!(out, "mount     not running");
            }
        },
    }
    let note = health_note(r.source_health);
    match &r.source {
        Some(src) => {
            let _ = writeln!(out, "source    {}{note}", src.display());
        }
        // Answered without the source because it is away: say so.
        None if !note.is_empty() => {
            let _ = writeln!(out, "source   {note}");
        }
        None => {}
    }
    let max = u.budget.max_size.map_or("no limit".into(), format_bytes);
    let min_free = u.budget.min_free.map_or("none".into(), format_bytes);
    let _ = writeln!(
        out,
        "used      {} in {}{} (max {max}); volume {} free of {} (keep {min_free} free)",
        format_bytes(u.used),
        count(u.entries, "file", "files"),
        others_note(r, names),
        format_bytes(u.volume.available),
        format_bytes(u.volume.total),
    );
    if let Some(how) = &r.read_path {
        let _ = writeln!(out, "serving   {how}");
    }
    if r.reads_source_when_full {
        let _ = writeln!(
            out,
            "on full   {READS_SOURCE_WHEN_FULL} (--on-full read-source)"
        );
    }
    if let Some(m) = &r.metrics {
        let _ = writeln!(
            out,
            "activity  {}, {} ({} copied), {} to local copies followed (reads through them never reach stagefs), {} served by stagefs, {} written through since the mount started",
            count(to_usize(m.stage_hits), "hit", "hits"),
            count(to_usize(m.stage_copies), "copy", "copies"),
            format_bytes(m.bytes_copied),
            count(to_usize(m.redirects), "link", "links"),
            count(to_usize(m.daemon_reads), "read", "reads"),
            format_bytes(m.bytes_written)
        );
    }
    for f in &r.in_flight {
        let pct = (f.copied * 100).checked_div(f.total).unwrap_or(0);
        let _ = writeln!(
            out,
            "staging   {} {}/{} ({pct}%)",
            names.show(&f.path),
            format_bytes(f.copied),
            format_bytes(f.total)
        );
    }
    for path in &r.refused {
        let _ = writeln!(
            out,
            "refused   {}: {REFUSED}; {}",
            names.show(path),
            download_again(path)
        );
    }
    for big in &r.too_large {
        let _ = writeln!(out, "too large {}", too_large_line(big, r, names));
    }
    for failure in &r.failures {
        let _ = writeln!(out, "failed    {}", failure_line(failure, names));
    }
    for m in &r.models {
        let _ = writeln!(out, "{}", escaped(&model_line(m)));
        if let Some(line) = links_line(&m.unfollowable) {
            let _ = writeln!(out, "  {}", escaped(&line));
        }
        for rev in &m.revisions {
            let refs = if rev.refs.is_empty() {
                String::new()
            } else {
                format!(" ({})", rev.refs.join(", "))
            };
            let _ = writeln!(
                out,
                "  {}{refs}: {}/{} files, {} of {}",
                // Whole, as `prefetch --revision` and `hf download --revision` take it.
                rev.revision,
                rev.staged_files,
                rev.total_files,
                format_bytes(rev.staged_bytes),
                format_bytes(rev.total_bytes)
            );
            if let Some(line) = links_line(&rev.unfollowable) {
                let _ = writeln!(out, "    {}", escaped(&line));
            }
        }
        for readiness in &m.offline {
            let _ = writeln!(out, "  {}", escaped(&offline_line(m, readiness)));
        }
        for f in &m.files {
            let in_use = if f.hold.is_some() { ", in use" } else { "" };
            let _ = writeln!(
                out,
                "  cached  {} ({}{in_use})",
                names.show(&f.path),
                format_bytes(f.bytes)
            );
        }
    }
    out
}

/// What a mount asked to stop still does, after its mount line.
fn stopping_note(stopping: Option<Stopping>) -> &'static str {
    match stopping {
        None | Some(Stopping::Unmounting) => "",
        Some(Stopping::Detached) => {
            ": detached with files still open there (asked to stop, or unmounted with --lazy); new opens no longer reach it, the open files are served until they are closed, then it exits (SIGINT or SIGTERM to it once more stops it at once)"
        }
        Some(Stopping::Busy) => {
            ": asked to stop with files still open there; served until they are closed, then unmounted (a second SIGINT or SIGTERM stops it at once)"
        }
    }
}

/// `, 2 of them no model's (org/r: refs/main, token)` when copies are none of the
/// models' files, so that the count agrees with the models' below.
fn others_note(r: &StatusReport, names: &Names) -> String {
    if r.other_files == 0 {
        return String::new();
    }
    let mut named: Vec<String> = r.other_examples.iter().map(|p| names.show(p)).collect();
    if r.other_files > named.len() {
        named.push("…".into());
    }
    format!(
        ", {} of them no model's ({})",
        r.other_files,
        named.join(", ")
    )
}

/// `org/name: FILE (2.0 GiB) is larger than the cache's --max-size (1.0 GiB): …`:
/// a file that can never be staged, and what opening it does.
pub(crate) fn too_large_line(big: &TooLarge, r: &StatusReport, names: &Names) -> String {
    let max = r
        .usage
        .budget
        .max_size
        .map_or("no limit".into(), format_bytes);
    let opening = match r.reads_source_when_full {
        true => "it is read from the source, at its speed (--on-full read-source)",
        false => "opening it fails",
    };
    format!(
        "{} ({}) is larger than the cache's --max-size ({max}): {opening}; raise --max-size",
        names.show(&big.path),
        format_bytes(big.bytes)
    )
}

/// `org/name: FILE: why; what to try (3m ago)`: a file the mount could not stage.
fn failure_line(f: &StagingFailure, names: &Names) -> String {
    let why = f
        .error
        .strip_prefix(&format!("{}: ", f.path.display()))
        .unwrap_or(&f.error);
    let hint = f
        .remedy
        .map(|r| format!("; {}", crate::args::flag_hint(r)))
        .unwrap_or_default();
    let ago = stagefs_source::sys::now_secs().saturating_sub(f.at_secs);
    format!(
        "{}: {why}{hint} ({} ago)",
        names.show(&f.path),
        stagefs_control::units::format_duration(std::time::Duration::from_secs(ago))
    )
}

/// `3 links cannot be followed; config.json: <why>` under a snapshot or folder whose
/// links lead nowhere: its counts leave them out, so without this line a stock
/// sshfs's snapshot reads `0/0 files` with no cause. The first link names the cause,
/// as doctor's model check does.
fn links_line(links: &[UnfollowableLink]) -> Option<String> {
    let first = links.first()?;
    Some(format!(
        "{} cannot be followed; {}: {}",
        count(links.len(), "link", "links"),
        first.path.display(),
        first.why
    ))
}

/// Whether `m` (a revision of it) loads with the source away, and what it lacks if
/// not, named inside the model.
fn offline_line(m: &ModelStatus, readiness: &stagefs_control::OfflineReadiness) -> String {
    let revision = readiness
        .revision
        .as_ref()
        .map(|r| format!("{r}: "))
        .unwrap_or_default();
    if readiness.ready {
        return format!("{revision}ready offline");
    }
    let inside = |p: &PathBuf| {
        let rel = p.strip_prefix(&m.path).unwrap_or(p);
        match rel.as_os_str().is_empty() {
            true => m.path.display().to_string(),
            false => rel.display().to_string(),
        }
    };
    let shown: Vec<String> = readiness.missing.iter().map(inside).collect();
    let more = readiness.missing_count.saturating_sub(shown.len());
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!(
        "{revision}not ready offline: {} never read or staged ({}{more}); `stagefs prefetch {}` makes it ready",
        count(readiness.missing_count, "name", "names"),
        shown.join(", "),
        m.model
    )
}

/// `model     org/name: 2 staged files, 80.0 MiB` for a repository (its revisions
/// follow), `model     models/m (plain model folder): 2/4 files staged, 6.0 MiB of
/// 6.1 MiB` for a folder or a file.
fn model_line(m: &ModelStatus) -> String {
    let staged = match (m.total_files, m.total_bytes) {
        (Some(files), Some(bytes)) => format!(
            "{}/{files} files staged, {} of {}",
            m.staged_files,
            format_bytes(m.staged_bytes),
            format_bytes(bytes)
        ),
        _ => format!(
            "{}, {}",
            count(m.staged_files, "staged file", "staged files"),
            format_bytes(m.staged_bytes)
        ),
    };
    let what = match m.kind {
        ModelKind::HfRepo => String::new(),
        kind if Path::new(&m.model) == m.path => format!(" ({})", kind.describe()),
        kind if m.path.as_os_str().is_empty() => {
            format!(" ({}: the source itself)", kind.describe())
        }
        kind => format!(" ({} {})", kind.describe(), m.path.display()),
    };
    format!("model     {}{what}: {staged}", m.model)
}

fn render_evict(r: &EvictReport, names: &Names) -> String {
    let verb = if r.dry_run { "would evict" } else { "evicted" };
    let mut out = String::new();
    for f in &r.evicted {
        let _ = writeln!(
            out,
            "{verb} {} ({})",
            names.show(&f.path),
            format_bytes(f.bytes)
        );
    }
    for f in &r.in_use {
        let why = match f.hold {
            Some(Hold::Grace {
                secs_left,
                grace_secs,
            }) => format!(
                "its link was followed less than {grace_secs}s ago (--redirect-grace); evictable in {secs_left}s"
            ),
            Some(Hold::Link { secs_left }) => format!(
                "a client of the NFS mount may still follow its link (it was answered JUKEBOX lately); evictable in {secs_left}s"
            ),
            _ => "open, or being staged".into(),
        };
        let _ = writeln!(out, "in use, kept: {} ({why})", names.show(&f.path));
    }
    let _ = writeln!(
        out,
        "{verb} {}, {}",
        count(r.evicted.len(), "file", "files"),
        format_bytes(r.freed)
    );
    out
}

/// What `verify` says of a copy the source has moved past.
pub(crate) const STALE: &str = "stale: the source changed since it was staged";

fn render_verify(r: &VerifyReport, names: &Names) -> String {
    let mut out = String::new();
    let fixed = |path: &PathBuf| match r.repaired.contains(path) {
        true => " (dropped; it will be staged again)",
        false => "",
    };
    for m in &r.mismatches {
        let (name, fixed) = (names.show(&m.path), fixed(&m.path));
        let _ = writeln!(out, "MISMATCH {name}: {}{fixed}", m.reason);
    }
    for path in &r.stale {
        let _ = writeln!(out, "STALE {}: {STALE}{}", names.show(path), fixed(path));
    }
    let stale = match r.stale.len() {
        0 => String::new(),
        n => format!(", {n} stale"),
    };
    let _ = writeln!(
        out,
        "checked {} ({}): {}{stale}",
        count(r.checked, "staged file", "staged files"),
        format_bytes(r.bytes),
        count(r.mismatches.len(), "mismatch", "mismatches")
    );
    out
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// What status says of a source that does not answer, if anything.
fn health_note(health: Option<SourceHealth>) -> String {
    match health {
        Some(h) if h.stuck > 0 => format!(
            " (not answering: {} of {} source threads stuck; staged models are served from the cache)",
            h.stuck, h.threads
        ),
        // Away without a stuck thread: it failed at once (a dead mount's ENOTCONN)
        // or was unmounted underneath.
        Some(h) if h.unresponsive => {
            " (not answering; staged models are served from the cache)".to_string()
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(model: &str, kind: ModelKind, path: &str, totals: bool) -> ModelStatus {
        ModelStatus {
            model: model.into(),
            kind,
            path: path.into(),
            staged_files: 2,
            staged_bytes: 3 << 20,
            revisions: Vec::new(),
            total_files: totals.then_some(4),
            total_bytes: totals.then_some(4 << 20),
            unfollowable: Vec::new(),
            files: Vec::new(),
            offline: Vec::new(),
        }
    }

    #[test]
    fn every_form_of_model_gets_one_line() {
        let line = |m: ModelStatus| model_line(&m);
        assert_eq!(
            line(status(
                "org/r",
                ModelKind::HfRepo,
                "hub/models--org--r",
                false
            )),
            "model     org/r: 2 staged files, 3.0 MiB"
        );
        assert_eq!(
            line(status("models/m", ModelKind::Folder, "models/m", true)),
            "model     models/m (plain model folder): 2/4 files staged, 3.0 MiB of 4.0 MiB"
        );
        assert_eq!(
            line(status("Llama", ModelKind::Folder, "", true)),
            "model     Llama (plain model folder: the source itself): 2/4 files staged, 3.0 MiB of 4.0 MiB"
        );
        assert_eq!(
            line(status("q.gguf", ModelKind::File, "q.gguf", false)),
            "model     q.gguf (GGUF file): 2 staged files, 3.0 MiB"
        );
    }

    #[test]
    fn a_refused_blob_is_downloaded_again_by_its_repository() {
        let blob = |repo: &str| PathBuf::from(format!("hub/{repo}/blobs/ab12"));
        assert_eq!(
            download_again(&blob("models--acme--big-llm")),
            "download it again (`hf download acme/big-llm --force-download`), or delete the blob on the source"
        );
        assert_eq!(
            download_again(&blob("datasets--acme--set")),
            "download it again (`hf download acme/set --repo-type dataset --force-download`), or delete the blob on the source"
        );
        assert_eq!(
            download_again(Path::new("models/m/x.bin")),
            "download it again, or delete it on the source"
        );
    }

    #[test]
    fn names_stay_on_one_line_and_verbose_adds_the_path() {
        let path = PathBuf::from("hub/models--acme--big-llm/snapshots/abc/a\nb.safetensors");
        let names = Names::offline(std::slice::from_ref(&path), false);
        assert_eq!(names.show(&path), "acme/big-llm: a\\nb.safetensors");
        let names = Names::offline(std::slice::from_ref(&path), true);
        assert_eq!(
            names.show(&path),
            "acme/big-llm: a\\nb.safetensors [hub/models--acme--big-llm/snapshots/abc/a\\nb.safetensors]"
        );
    }
}
