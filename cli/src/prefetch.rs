//! `stagefs prefetch`: stage whole models ahead of time, through a running mount or
//! straight into the cache directory, with progress bars on a terminal and plain log
//! lines otherwise.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use stagefs_cache::prefetch::{FileProgress, FileState, Target};
use stagefs_mount::cache_dir::{self, CacheDirError};

use crate::args::PrefetchArgs;
use crate::config::Config;
use crate::manage::names_a_path;
use crate::units::format_bytes;

/// Runs the command; fails if any file could not be staged.
pub(crate) fn run(args: &PrefetchArgs, config: &Config) -> anyhow::Result<()> {
    let targets: Vec<&str> = args.targets.iter().map(String::as_str).collect();
    let dir = config.cache_dir_for(&args.cache, &targets)?;
    if args.dry_run {
        return dry_run(&dir, &args.targets, args.revision.as_deref());
    }
    let summary = stage(
        &dir,
        &args.targets,
        args.revision.as_deref(),
        usize::from(args.parallel),
    )?;
    println!("{summary}");
    Ok(())
}

/// Lists what staging `targets` would copy and what is staged already.
fn dry_run(dir: &Path, targets: &[String], revision: Option<&str>) -> anyhow::Result<()> {
    let targets = targets
        .iter()
        .map(|t| target(t, revision, dir))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (files, note) = cache_dir::plan(dir, targets).map_err(with_hint)?;
    if let Some(note) = note {
        eprintln!("note: {note}");
    }
    for f in &files {
        match f.state {
            FileState::AlreadyStaged => println!("already staged {}", f.path.display()),
            _ => println!(
                "would stage {} ({})",
                f.path.display(),
                format_bytes(f.total)
            ),
        }
    }
    let (staged, to_copy): (Vec<_>, Vec<_>) = files
        .iter()
        .partition(|f| f.state == FileState::AlreadyStaged);
    let bytes = |files: &[&FileProgress]| format_bytes(files.iter().map(|f| f.total).sum());
    println!(
        "dry run: {} to stage ({}), {} already staged ({}); nothing was copied",
        to_copy.len(),
        bytes(&to_copy),
        staged.len(),
        bytes(&staged)
    );
    Ok(())
}

fn with_hint(e: CacheDirError) -> anyhow::Error {
    match e {
        CacheDirError::NotACache(_) => anyhow!("{e} (pass --cache-dir)"),
        e => anyhow!(e),
    }
}

/// Stages `targets` (model ids or paths) into the cache at `dir`, through its mount
/// if one is running, showing progress on stderr; returns a one-line summary.
pub(crate) fn stage(
    dir: &Path,
    targets: &[String],
    revision: Option<&str>,
    parallel: usize,
) -> anyhow::Result<String> {
    let targets = targets
        .iter()
        .map(|t| target(t, revision, dir))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut view = View::new(std::io::stderr().is_terminal());
    let files = cache_dir::prefetch(dir, targets, parallel, |files| view.update(files))
        .map_err(with_hint)?;
    view.finish(&files)
}

fn target(text: &str, revision: Option<&str>, dir: &Path) -> anyhow::Result<Target> {
    if names_a_path(text) {
        return Ok(Target::Path {
            path: cache_dir::source_relative(Path::new(text), dir)?,
        });
    }
    if stagefs_cache::models::is_model_id(text) {
        return Ok(Target::Model {
            id: text.to_string(),
            revision: revision.map(str::to_string),
        });
    }
    bail!("{text}: neither an existing path nor a model id like org/name or a path in the source")
}

/// Progress as bars (terminal) or one line per finished file.
struct View {
    bars: Option<(MultiProgress, ProgressBar, HashMap<PathBuf, ProgressBar>)>,
    reported: HashMap<PathBuf, bool>,
}

impl View {
    fn new(terminal: bool) -> View {
        let bars = terminal.then(|| {
            let multi = MultiProgress::new();
            let total = multi.add(ProgressBar::new(0).with_style(style("total")));
            (multi, total, HashMap::new())
        });
        View {
            bars,
            reported: HashMap::new(),
        }
    }

    fn update(&mut self, files: &[FileProgress]) {
        match &mut self.bars {
            Some((multi, total, per_file)) => {
                total.set_length(files.iter().map(|f| f.total).sum());
                total.set_position(files.iter().map(|f| f.copied).sum());
                for f in files {
                    let bar = per_file.entry(f.path.clone()).or_insert_with(|| {
                        multi.add(ProgressBar::new(f.total).with_style(style(&short(&f.path))))
                    });
                    bar.set_position(f.copied);
                    if f.is_settled() && !bar.is_finished() {
                        bar.finish();
                    }
                }
            }
            None => {
                for f in files.iter().filter(|f| f.is_settled()) {
                    if self.reported.insert(f.path.clone(), true).is_none() {
                        eprintln!("{}", line(f));
                    }
                }
            }
        }
    }

    fn finish(mut self, files: &[FileProgress]) -> anyhow::Result<String> {
        self.update(files);
        if let Some((_, total, _)) = &self.bars {
            total.finish();
        }
        let count = |want: fn(&FileState) -> bool| files.iter().filter(|f| want(&f.state)).count();
        let failed: Vec<&FileProgress> = files
            .iter()
            .filter(|f| matches!(f.state, FileState::Failed { .. }))
            .collect();
        for f in &failed {
            eprintln!("{}", line(f));
        }
        let summary = format!(
            "{} staged, {} already staged, {} failed ({})",
            count(|s| *s == FileState::Staged),
            count(|s| *s == FileState::AlreadyStaged),
            failed.len(),
            format_bytes(files.iter().map(|f| f.total).sum())
        );
        if !failed.is_empty() {
            bail!("{summary}: {} file(s) could not be staged", failed.len());
        }
        Ok(summary)
    }
}

fn style(name: &str) -> ProgressStyle {
    ProgressStyle::with_template(&format!(
        "{name:>24} [{{bar:30}}] {{bytes}}/{{total_bytes}} {{bytes_per_sec}} eta {{eta}}"
    ))
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ")
}

fn short(path: &Path) -> String {
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    name.chars().take(24).collect()
}

fn line(f: &FileProgress) -> String {
    match &f.state {
        FileState::Staged => format!("staged {} ({})", f.path.display(), format_bytes(f.total)),
        FileState::AlreadyStaged => format!("already staged {}", f.path.display()),
        FileState::Failed {
            error,
            remedy: None,
        } => format!("FAILED {}: {error}", f.path.display()),
        FileState::Failed {
            error,
            remedy: Some(remedy),
        } => format!(
            "FAILED {}: {error}; {}",
            f.path.display(),
            crate::args::flag_hint(*remedy)
        ),
        FileState::Waiting | FileState::Copying => format!("pending {}", f.path.display()),
    }
}

#[cfg(test)]
mod tests {
    use stagefs_cache::Remedy;

    use super::*;

    fn failed(remedy: Option<Remedy>) -> FileProgress {
        FileProgress {
            path: PathBuf::from("o/m/model.safetensors"),
            total: 3 << 20,
            copied: 0,
            state: FileState::Failed {
                error: "o/m/model.safetensors: needs 3.0 MiB but the cache cannot make room".into(),
                remedy,
            },
        }
    }

    #[test]
    fn a_failed_file_names_the_flag_to_try_when_there_is_one() {
        assert_eq!(
            line(&failed(Some(Remedy::MoreRoom))),
            "FAILED o/m/model.safetensors: o/m/model.safetensors: needs 3.0 MiB but the cache cannot make room; raise --max-size, lower --min-free, free disk space, or close models in use"
        );
        assert!(line(&failed(None)).ends_with("cannot make room"));
    }
}
