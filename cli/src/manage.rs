//! `status`, `evict` and `verify`: through a running mount's control socket when one
//! answers, otherwise on the cache directory directly (under its lock, so never
//! while a mount owns it).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, anyhow, bail};
use stagefs_cache::SourceHealth;
use stagefs_cache::admin::{EvictReport, EvictSelector, ModelStatus, StatusReport, VerifyReport};
use stagefs_cache::control::{Request, Response};
use stagefs_cache::models::{self, ModelKind};
use stagefs_mount::cache_dir::{self, CacheDirError};

use crate::args::{EvictArgs, StatusArgs, VerifyArgs};
use crate::config::Config;
use crate::units::format_bytes;

/// `stagefs status`.
pub(crate) fn status(args: &StatusArgs, config: &Config) -> anyhow::Result<()> {
    let dir = config.cache_dir_for(&args.cache, &[])?;
    let mut report = match ask(&dir, Request::Status)? {
        Response::Status { report } => report,
        other => return Err(unexpected(other)),
    };
    if report.mountpoint.is_none() {
        report.dead_mount = crate::mounts::dead_mount_line(&dir).map(|(mountpoint, _)| mountpoint);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render_status(&report));
    }
    Ok(())
}

/// `stagefs evict`.
pub(crate) fn evict(args: &EvictArgs, config: &Config) -> anyhow::Result<()> {
    let targets: Vec<&str> = args.target.as_deref().into_iter().collect();
    let dir = config.cache_dir_for(&args.cache, &targets)?;
    let selector = selector(args, &dir)?;
    let request = Request::Evict {
        selector,
        dry_run: args.dry_run,
    };
    let report = match ask(&dir, request)? {
        Response::Evicted { report } => report,
        other => return Err(unexpected(other)),
    };
    print!("{}", render_evict(&report));
    if !report.in_use.is_empty() {
        bail!(
            "{} file(s) in use were not evicted; close the programs reading them and retry",
            report.in_use.len()
        );
    }
    Ok(())
}

/// `stagefs verify`.
pub(crate) fn verify(args: &VerifyArgs, config: &Config) -> anyhow::Result<()> {
    let targets: Vec<&str> = args.model.as_deref().into_iter().collect();
    let dir = config.cache_dir_for(&args.cache, &targets)?;
    let request = Request::Verify {
        model: args.model.clone(),
        repair: args.repair,
    };
    let report = match ask(&dir, request)? {
        Response::Verified { report } => report,
        other => return Err(unexpected(other)),
    };
    print!("{}", render_verify(&report));
    let unrepaired = report.mismatches.len() - report.repaired.len();
    if unrepaired > 0 {
        bail!(
            "{unrepaired} staged copies do not match; run `stagefs verify --repair` to drop them"
        );
    }
    Ok(())
}

fn ask(dir: &Path, request: Request) -> anyhow::Result<Response> {
    cache_dir::ask(dir, request).map_err(|e| match e {
        CacheDirError::NotACache(_) => anyhow!("{e} (pass --cache-dir)"),
        e => anyhow!(e),
    })
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
    let target = args.target.as_deref().context("name what to evict")?;
    if names_a_path(target) {
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

/// Whether `text` names something on disk. The name itself is not followed: in a
/// mount without kernel passthrough a staged file is a link to its copy, and
/// following it would count as a use of that copy.
pub(crate) fn names_a_path(text: &str) -> bool {
    std::fs::symlink_metadata(text).is_ok()
}

fn render_status(r: &StatusReport) -> String {
    let mut out = String::new();
    let u = &r.usage;
    let _ = writeln!(out, "cache     {}", r.cache_dir.display());
    if let Some(mnt) = &r.mountpoint {
        let _ = writeln!(out, "mount     {} (running)", mnt.display());
    } else if let Some(dead) = &r.dead_mount {
        let _ = writeln!(out, "mount     {}", crate::mounts::dead_line(dead));
    } else {
        let _ = writeln!(out, "mount     not running");
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
        "used      {} in {} files (max {max}); volume {} free of {} (keep {min_free} free)",
        format_bytes(u.used),
        u.entries,
        format_bytes(u.volume.available),
        format_bytes(u.volume.total),
    );
    if let Some(how) = &r.read_path {
        let _ = writeln!(out, "serving   {how}");
    }
    if let Some(m) = &r.metrics {
        let _ = writeln!(
            out,
            "activity  {} hits, {} copies ({} copied), {} links to local copies followed since the mount started",
            m.stage_hits,
            m.stage_copies,
            format_bytes(m.bytes_copied),
            m.redirects
        );
    }
    for f in &r.in_flight {
        let pct = (f.copied * 100).checked_div(f.total).unwrap_or(0);
        let _ = writeln!(
            out,
            "staging   {} {}/{} ({pct}%)",
            f.path.display(),
            format_bytes(f.copied),
            format_bytes(f.total)
        );
    }
    for m in &r.models {
        let _ = writeln!(out, "{}", model_line(m));
        for rev in &m.revisions {
            let refs = if rev.refs.is_empty() {
                String::new()
            } else {
                format!(" ({})", rev.refs.join(", "))
            };
            let _ = writeln!(
                out,
                "  {}{refs}: {}/{} files, {} of {}",
                &rev.revision[..rev.revision.len().min(12)],
                rev.staged_files,
                rev.total_files,
                format_bytes(rev.staged_bytes),
                format_bytes(rev.total_bytes)
            );
        }
    }
    out
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
            "{} staged files, {}",
            m.staged_files,
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

fn render_evict(r: &EvictReport) -> String {
    let verb = if r.dry_run { "would evict" } else { "evicted" };
    let mut out = String::new();
    for f in &r.evicted {
        let _ = writeln!(
            out,
            "{verb} {} ({})",
            f.path.display(),
            format_bytes(f.bytes)
        );
    }
    for f in &r.in_use {
        let _ = writeln!(out, "in use, kept: {}", f.path.display());
    }
    let _ = writeln!(
        out,
        "{verb} {} files, {}",
        r.evicted.len(),
        format_bytes(r.freed)
    );
    out
}

fn render_verify(r: &VerifyReport) -> String {
    let mut out = String::new();
    for m in &r.mismatches {
        let fixed = if r.repaired.contains(&m.path) {
            " (dropped; it will be staged again)"
        } else {
            ""
        };
        let _ = writeln!(out, "MISMATCH {}: {}{fixed}", m.path.display(), m.reason);
    }
    let _ = writeln!(
        out,
        "checked {} staged files ({}): {} mismatches",
        r.checked,
        format_bytes(r.bytes),
        r.mismatches.len()
    );
    out
}

/// What status says of a source that does not answer, if anything.
fn health_note(health: Option<SourceHealth>) -> String {
    match health {
        Some(h) if h.unresponsive || h.stuck > 0 => format!(
            " (not answering: {} of {} source threads stuck; staged models are served from the cache)",
            h.stuck, h.threads
        ),
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
}
