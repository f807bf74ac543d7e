//! `stagefs prefetch`: stage whole models ahead of time, through a running mount or
//! straight into the cache directory, with progress bars on a terminal and plain log
//! lines otherwise.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::bail;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use stagefs_control::Remedy;
use stagefs_mount::bounded::same_place;
use stagefs_mount::cache_dir;
use stagefs_stage::prefetch::{FileProgress, FileState, Target};

use crate::args::PrefetchArgs;
use crate::config::Config;
use crate::manage::{Names, with_cache_hint};
use crate::mounts::names_a_path;
use crate::units::{count, format_bytes};

/// How long comparing the configured source with a cache's recorded one may take.
const SOURCE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Runs the command; fails if any file could not be staged.
pub(crate) fn run(args: &PrefetchArgs, config: &Config, verbose: bool) -> anyhow::Result<()> {
    let targets: Vec<&str> = args.targets.iter().map(String::as_str).collect();
    let flag = args.cache.cache_dir.as_deref();
    let dir = crate::mounts::cache_dir(config, flag, &targets)?;
    refuse_a_forgotten_source(config, flag, &dir, &targets)?;
    if args.json {
        return json(args, &dir);
    }
    if args.dry_run {
        return dry_run(&dir, &args.targets, args.revision.as_deref(), verbose);
    }
    let stage = Stage {
        parallel: parallel(args),
        verbose,
        results: Results::Stdout,
    };
    let asked = args.parallel.is_some();
    let summary = stage.run_asking(&dir, &args.targets, args.revision.as_deref(), asked)?;
    println!("{summary}");
    Ok(())
}

/// `prefetch --json`: every file and how it ended (or, with `--dry-run`, would), as
/// one JSON object once it is over; no progress is shown. Fails as without `--json`
/// when a file could not be staged.
fn json(args: &PrefetchArgs, dir: &Path) -> anyhow::Result<()> {
    let targets = args
        .targets
        .iter()
        .map(|t| target(t, args.revision.as_deref(), dir))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (files, note) = match args.dry_run {
        true => cache_dir::plan(dir, targets),
        false => {
            let parallel = (parallel(args), args.parallel.is_some());
            cache_dir::prefetch(dir, targets, parallel, |_| {}).map(|files| (files, None))
        }
    }
    .map_err(with_cache_hint)?;
    crate::manage::print_json(&PrefetchJson {
        dry_run: args.dry_run,
        files: &files,
        note,
    })?;
    let failed = files
        .iter()
        .filter(|f| matches!(f.state, FileState::Failed { .. }))
        .count();
    if failed > 0 {
        bail!("{} could not be staged", count(failed, "file", "files"));
    }
    Ok(())
}

/// Files copied at a time: `--parallel`, else the command's default.
fn parallel(args: &PrefetchArgs) -> usize {
    usize::from(
        args.parallel
            .unwrap_or(stagefs_stage::defaults::PREFETCH_COMMAND_PARALLEL),
    )
}

/// What `prefetch --json` prints.
#[derive(serde::Serialize)]
struct PrefetchJson<'a> {
    dry_run: bool,
    /// Each file: `path` in the source, `total` bytes, `state` (`staged`,
    /// `already_staged`, `failed` with its `error`; `waiting` in a dry run: it would
    /// be copied).
    files: &'a [FileProgress],
    /// What limits a dry run's answer (the source did not answer).
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

/// With no mount running, a prefetch stages from the source the cache recorded last.
/// A record left in a cache nobody named (not `--cache-dir`, not the config file's
/// `cache_dir`) by an old mount is history, as it is for `run`: a model id is not
/// looked up in it unless it is the configured `source`. A path names its source
/// itself, and is taken.
fn refuse_a_forgotten_source(
    config: &Config,
    flag: Option<&Path>,
    dir: &Path,
    targets: &[&str],
) -> anyhow::Result<()> {
    if targets.iter().all(|t| names_a_path(t))
        || crate::mounts::standing(config, flag, dir).is_some()
    {
        return Ok(());
    }
    let Some(record) = crate::mounts::recorded(dir) else {
        return Ok(());
    };
    // Asked in a child process under a deadline: the recorded source may be a dead share.
    let same = |source: &Path| same_place(source, &record.source, SOURCE_WAIT);
    if config.source().is_some_and(same) {
        return Ok(());
    }
    bail!(
        "no stagefs mount is running, and the cache {} last served {}, which nothing names now: mount the source first (`stagefs mount SOURCE MOUNTPOINT`), or pass --cache-dir {} to stage from it into that cache",
        dir.display(),
        record.source.display(),
        dir.display()
    )
}

/// Where the lines naming each staged file go: stdout for `prefetch`, whose results
/// they are; stderr for `run`, whose stdout is COMMAND's, as `stagefs: LINE` like
/// run's own lines, so they are told from COMMAND's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Results {
    Stdout,
    Stderr,
}

impl Results {
    fn print(self, line: &str) {
        match self {
            Results::Stdout => println!("{line}"),
            Results::Stderr => eprintln!("stagefs: {line}"),
        }
    }

    /// A failure: on stderr in either case.
    fn diagnostic(self, line: &str) {
        match self {
            Results::Stdout => eprintln!("{line}"),
            Results::Stderr => eprintln!("stagefs: {line}"),
        }
    }
}

/// How to stage and report.
pub(crate) struct Stage {
    /// Files copied at a time (without a mount).
    pub(crate) parallel: usize,
    /// Show source paths too.
    pub(crate) verbose: bool,
    /// Where per-file results go.
    pub(crate) results: Results,
}

/// Lists what staging `targets` would copy and what is staged already.
fn dry_run(
    dir: &Path,
    targets: &[String],
    revision: Option<&str>,
    verbose: bool,
) -> anyhow::Result<()> {
    let targets = targets
        .iter()
        .map(|t| target(t, revision, dir))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (files, note) = cache_dir::plan(dir, targets).map_err(with_cache_hint)?;
    if let Some(note) = note {
        eprintln!("note: {note}");
    }
    let names = Names::of(dir, files.iter().map(|f| f.path.clone()).collect(), verbose);
    for f in &files {
        match &f.state {
            FileState::AlreadyStaged => println!("already staged {}", names.show(&f.path)),
            FileState::Failed { error, remedy } => println!(
                "{}",
                failed_line(&names.show(&f.path), &f.path, error, *remedy)
            ),
            _ => println!(
                "would stage {} ({})",
                names.show(&f.path),
                format_bytes(f.total)
            ),
        }
    }
    let of = |want: fn(&FileState) -> bool| -> Vec<&FileProgress> {
        files.iter().filter(|f| want(&f.state)).collect()
    };
    let staged = of(|s| *s == FileState::AlreadyStaged);
    let failed = of(|s| matches!(s, FileState::Failed { .. }));
    let to_copy = of(|s| !matches!(s, FileState::AlreadyStaged | FileState::Failed { .. }));
    let bytes = |files: &[&FileProgress]| format_bytes(files.iter().map(|f| f.total).sum());
    let summary = format!(
        "dry run: {} to stage ({}), {} already staged ({}); nothing was copied",
        to_copy.len(),
        bytes(&to_copy),
        staged.len(),
        bytes(&staged)
    );
    // A prefetch would fail on these: so does its dry run.
    if !failed.is_empty() {
        bail!(
            "{summary}; {} could not be staged",
            count(failed.len(), "file", "files")
        );
    }
    println!("{summary}");
    Ok(())
}

impl Stage {
    /// Stages `targets` (model ids or paths) into the cache at `dir`, through its
    /// mount if one is running, showing progress on stderr; returns a one-line summary.
    pub(crate) fn run(
        &self,
        dir: &Path,
        targets: &[String],
        revision: Option<&str>,
    ) -> anyhow::Result<String> {
        self.run_asking(dir, targets, revision, false)
    }

    /// [`Stage::run`]; `asked`: the user named how many files to copy at a time,
    /// which a mount then copies too (else it copies as many as it does itself).
    pub(crate) fn run_asking(
        &self,
        dir: &Path,
        targets: &[String],
        revision: Option<&str>,
        asked: bool,
    ) -> anyhow::Result<String> {
        let targets = targets
            .iter()
            .map(|t| target(t, revision, dir))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut view = View::new(std::io::stderr().is_terminal(), dir, self);
        let parallel = (self.parallel, asked);
        let files = cache_dir::prefetch(dir, targets, parallel, |files| view.update(files))
            .map_err(with_cache_hint)?;
        view.finish(&files)
    }
}

fn target(text: &str, revision: Option<&str>, dir: &Path) -> anyhow::Result<Target> {
    if names_a_path(text) {
        return Ok(Target::Path {
            path: cache_dir::source_relative(Path::new(text), dir)?,
        });
    }
    if stagefs_layout::models::is_model_id(text) {
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
    /// Asked once, when the files are first known.
    names: Option<Names>,
    dir: PathBuf,
    verbose: bool,
    results: Results,
    /// Since when every byte has been copied, and whether the wait was announced.
    settling: (Option<std::time::Instant>, bool),
}

impl View {
    fn new(terminal: bool, dir: &Path, stage: &Stage) -> View {
        let bars = terminal.then(|| {
            let multi = MultiProgress::new();
            let total = ProgressBar::new(0).with_style(style()).with_message(TOTAL);
            let total = multi.add(total);
            (multi, total, HashMap::new())
        });
        View {
            bars,
            reported: HashMap::new(),
            names: None,
            dir: dir.to_path_buf(),
            verbose: stage.verbose,
            results: stage.results,
            settling: (None, false),
        }
    }

    /// Once every byte is copied, a file is reported staged only when its copy is
    /// checked and on disk, which can take seconds for a large model with nothing
    /// moving on screen: a wait past [`SETTLING_UNTOLD`] is said once, with its reason.
    fn tell_settling(&mut self, files: &[FileProgress]) {
        // A file shows as staged once its copy is in the index, and the prefetch
        // answers once every copy is also checked and durable: what it waits for is
        // every file this run copies, whatever its line says.
        let copying = |f: &&FileProgress| {
            !matches!(f.state, FileState::AlreadyStaged | FileState::Failed { .. })
        };
        let settling = files.iter().filter(copying).count();
        if settling == 0 || !files.iter().filter(copying).all(|f| f.copied >= f.total) {
            self.settling.0 = None;
            return;
        }
        let since = *self.settling.0.get_or_insert_with(std::time::Instant::now);
        if self.settling.1 || since.elapsed() < SETTLING_UNTOLD {
            return;
        }
        self.settling.1 = true;
        let said = format!(
            "stagefs: every byte is copied; waiting for {} to be checked and written to disk",
            count(settling, "copy", "copies")
        );
        match &self.bars {
            Some((multi, _, _)) => {
                let _ = multi.println(said);
            }
            None => eprintln!("{said}"),
        }
    }

    fn update(&mut self, files: &[FileProgress]) {
        self.tell_settling(files);
        let names = self.names.get_or_insert_with(|| {
            Names::of(
                &self.dir,
                files.iter().map(|f| f.path.clone()).collect(),
                self.verbose,
            )
        });
        match &mut self.bars {
            Some((multi, total, per_file)) => {
                total.set_length(files.iter().map(|f| f.total).sum());
                total.set_position(files.iter().map(|f| f.copied).sum());
                // Every file is known from the first update: pad to the longest name
                // so that the bars line up.
                let width = files
                    .iter()
                    .map(|f| label(&names.show(&f.path)).chars().count())
                    .fold(TOTAL.len(), usize::max);
                if per_file.is_empty() {
                    total.set_message(format!("{TOTAL:>width$}"));
                }
                for f in files {
                    let bar = per_file.entry(f.path.clone()).or_insert_with(|| {
                        let shown = names.show(&f.path);
                        let name = label(&shown);
                        let bar = ProgressBar::new(f.total).with_style(style());
                        multi.add(bar.with_message(format!("{name:>width$}")))
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
                        print_line(self.results, &line(f, names), f);
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
        let tally = |want: fn(&FileState) -> bool| files.iter().filter(|f| want(&f.state)).count();
        let failed: Vec<&FileProgress> = files
            .iter()
            .filter(|f| matches!(f.state, FileState::Failed { .. }))
            .collect();
        let fallback;
        let names = match &self.names {
            Some(names) => names,
            None => {
                fallback = Names::of(&self.dir, Vec::new(), self.verbose);
                &fallback
            }
        };
        if self.bars.is_some() {
            for f in &failed {
                self.results.diagnostic(&line(f, names));
            }
        }
        let summary = format!(
            "{} staged, {} already staged, {} failed ({})",
            tally(|s| *s == FileState::Staged),
            tally(|s| *s == FileState::AlreadyStaged),
            failed.len(),
            // What is in the cache now: a failed file's bytes are not.
            format_bytes(
                files
                    .iter()
                    .filter(|f| !matches!(f.state, FileState::Failed { .. }))
                    .map(|f| f.total)
                    .sum()
            )
        );
        if !failed.is_empty() {
            bail!(
                "{summary}: {} could not be staged",
                count(failed.len(), "file", "files")
            );
        }
        Ok(summary)
    }
}

/// The total bar's label.
const TOTAL: &str = "total";

/// How long the wait after the last byte goes unexplained.
const SETTLING_UNTOLD: std::time::Duration = std::time::Duration::from_secs(1);

/// A bar labelled by its message, the file's whole name: a name cut to fit
/// (`model-00001-of-00002.saf`) cannot be told from its neighbours, so the bar takes
/// the width the name leaves (none, on a narrow terminal), and a line wider than the
/// terminal wraps rather than losing the name's end. The name goes in the message, not the template, so a
/// `{` in it is just a character.
fn style() -> ProgressStyle {
    ProgressStyle::with_template(
        "{msg} [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ")
}

/// A file's name within its model for a progress bar's label: `org/name: ` is left
/// out (the model is named by the lines and the summary around the bars), the rest
/// is kept whole.
fn label(name: &str) -> &str {
    name.split_once(": ").map_or(name, |(_, file)| file)
}

/// A failure is a diagnostic (stderr); every other line is a result.
fn print_line(results: Results, line: &str, f: &FileProgress) {
    match f.state {
        FileState::Failed { .. } => results.diagnostic(line),
        _ => results.print(line),
    }
}

fn line(f: &FileProgress, names: &Names) -> String {
    let name = names.show(&f.path);
    match &f.state {
        FileState::Failed { error, remedy } => failed_line(&name, &f.path, error, *remedy),
        FileState::Staged => format!("staged {name} ({})", format_bytes(f.total)),
        FileState::AlreadyStaged => format!("already staged {name}"),
        FileState::Waiting | FileState::Copying => format!("pending {name}"),
    }
}

/// `FAILED name: why`, the file named as users know it once: the core's message
/// starts with the path in the source (for a blob, `…/blobs/<sha256>`), which the
/// name already stands for (`-v` shows it).
fn failed_line(name: &str, path: &Path, error: &str, remedy: Option<Remedy>) -> String {
    let why = error
        .strip_prefix(&format!("{}: ", path.display()))
        .unwrap_or(error);
    match remedy {
        None => format!("FAILED {name}: {why}"),
        Some(remedy) => format!("FAILED {name}: {why}; {}", crate::args::flag_hint(remedy)),
    }
}

#[cfg(test)]
mod tests {

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
        let names = Names::offline(&[], false);
        let line = |f: &FileProgress| line(f, &names);
        assert_eq!(
            line(&failed(Some(Remedy::MoreRoom))),
            "FAILED o/m/model.safetensors: needs 3.0 MiB but the cache cannot make room; raise --max-size, lower --min-free, free disk space, or close models in use"
        );
        assert!(line(&failed(None)).ends_with("cannot make room"));
    }

    #[test]
    fn a_wait_after_the_last_byte_is_told_once_and_only_once_it_lasts() {
        let stage = Stage {
            parallel: 1,
            verbose: false,
            results: Results::Stderr,
        };
        let mut view = View::new(false, Path::new("/cache"), &stage);
        let file = |copied, state| FileProgress {
            path: PathBuf::from("o/m/model.safetensors"),
            total: 8,
            copied,
            state,
        };
        view.tell_settling(&[file(4, FileState::Copying)]);
        assert_eq!(view.settling, (None, false), "still copying");
        view.tell_settling(&[file(8, FileState::Copying)]);
        assert!(
            view.settling.0.is_some() && !view.settling.1,
            "not yet: {:?}",
            view.settling
        );
        view.settling.0 = std::time::Instant::now().checked_sub(SETTLING_UNTOLD);
        view.tell_settling(&[file(8, FileState::Copying)]);
        assert!(view.settling.1, "told once the wait lasted");
        let mut again = View::new(false, Path::new("/cache"), &stage);
        again.tell_settling(&[file(8, FileState::Staged)]);
        assert!(again.settling.0.is_some(), "staged, and not yet answered");
        again.tell_settling(&[file(8, FileState::AlreadyStaged)]);
        assert_eq!(again.settling.0, None, "nothing to wait for");
    }
}
