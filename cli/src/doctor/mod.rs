//! `stagefs doctor`: checks FUSE, the source, the cache volume and the environment,
//! and says what to fix. Each check is one line with a verdict (ok, warn, fail, note)
//! and, when there is something to do, advice. Nothing here may hang on a dead
//! source: whatever touches it runs in one worker process under one deadline
//! (`worker`).

#[macro_use]
mod worker;
mod fskind;
mod fuse;
mod hub;
mod model;
#[cfg(target_os = "linux")]
#[path = "mounts_linux.rs"]
mod mounts;
#[cfg(target_os = "macos")]
#[path = "mounts_macos.rs"]
mod mounts;
mod probe;
mod report;
mod shape;
mod source;
mod space;
mod watchdog;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::anyhow;
use serde::Serialize;
use stagefs_cache::models::Shape;

pub(crate) use hub::same_place;
pub(crate) use shape::{shape_of, usage as shape_usage};

use crate::args::DoctorArgs;
use crate::config::Config;
use report::Check;
use source::Target;
use worker::{DEADLINE, Gathered, Task};

/// The whole report, as `--json` prints it.
#[derive(Debug, Serialize)]
struct Report {
    checks: Vec<Check>,
    /// Whether any check failed (then the exit code is 1).
    failed: bool,
    source: Option<source::SourceReport>,
    model: Option<ModelReport>,
    cache: space::CacheReport,
    hub_cache: Option<hub::HubCache>,
    mount: Option<hub::MountState>,
}

/// The model with the time staging it would take at the measured rate.
#[derive(Debug, Serialize)]
struct ModelReport {
    #[serde(flatten)]
    model: model::Model,
    staging_seconds: Option<f64>,
}

/// Runs the checks; exits non-zero when one fails.
pub(crate) fn run(args: &DoctorArgs, config: &Config) -> anyhow::Result<ExitCode> {
    if args.worker {
        return worker::serve();
    }
    let cache_dir = config.cache_dir_for(&args.cache)?;
    let report = examine(args.target.as_deref(), &cache_dir, config)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report::render(&report.checks));
    }
    Ok(if report.failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn examine(arg: Option<&str>, cache_dir: &Path, config: &Config) -> anyhow::Result<Report> {
    let mountpoint = config.configured_mountpoint();
    let source = config.source();
    let mut tasks = vec![
        Task::Source {
            arg: arg.map(str::to_string),
            source: source.map(Path::to_path_buf),
            model_dirs: config.model_dirs().to_vec(),
        },
        Task::Cache {
            dir: cache_dir.to_path_buf(),
            mountpoint: mountpoint.map(Path::to_path_buf),
        },
    ];
    tasks.extend(
        hub::paths_to_resolve(mountpoint)
            .into_iter()
            .map(Task::Resolve),
    );
    let gathered = worker::gather(tasks, DEADLINE);
    judge(&gathered, arg, cache_dir, config)
}

/// The report from what the worker answered.
fn judge(
    gathered: &Gathered,
    arg: Option<&str>,
    cache_dir: &Path,
    config: &Config,
) -> anyhow::Result<Report> {
    let mountpoint = config.configured_mountpoint();
    // Without the worker's word, whether `org/name` is a path here is not known.
    let target = match got!(gathered, Target) {
        Some(target) => target.clone(),
        None => Target::of(arg, config.source(), |_| false),
    }
    .map_err(|e| anyhow!(e))?;
    let configured = matches!(
        target,
        Target::Path {
            configured: true,
            ..
        } | Target::Model { .. }
    );
    let mut checks = vec![fuse::check()];
    let mut found = source::inspect(gathered, &target)?;
    checks.append(&mut found.checks);
    let mut roots = found.roots.clone();
    roots.extend(mountpoint.map(Path::to_path_buf));
    let (cache_checks, cache) = space::inspect(
        gathered,
        cache_dir,
        limits(config),
        &roots,
        found.model.as_ref(),
    );
    checks.extend(cache_checks);
    let (judged_mount, shape) = environment_target(&found, configured, mountpoint);
    let (hub_check, hub_cache) = hub::hub_cache_check(gathered, judged_mount.as_deref(), shape);
    checks.push(hub_check);
    // The control socket lives in the cache directory: the worker asks it only once
    // that answered.
    let cache_answered = cache.fs.is_some();
    let mount = mountpoint.filter(|_| cache_answered).map(|m| {
        let (check, state) = hub::mount_check(gathered, m, cache_dir);
        checks.push(check);
        state
    });
    checks.extend(watchdog::checks());
    let probe = found.report.as_ref().and_then(|r| r.probe.as_ref());
    let model = found.model.map(|model| ModelReport {
        staging_seconds: probe.map(|p| source::staging_seconds(p, &model)),
        model,
    });
    Ok(Report {
        failed: report::any_failed(&checks),
        checks,
        source: found.report,
        model,
        cache,
        hub_cache,
        mount,
    })
}

/// The mount whose use the environment is judged against, and its source's shape: the
/// stagefs mount examined, else the configured mount (whose source's shape is known
/// when the configured source was examined).
fn environment_target(
    found: &source::Findings,
    configured: bool,
    mountpoint: Option<&Path>,
) -> (Option<PathBuf>, Option<Shape>) {
    let shape = found.survey.as_ref().map(|s| s.shape);
    let examined_mount = found.report.as_ref().and_then(|r| {
        let is_mount = r.fs.kind == fskind::FsKind::Stagefs
            && r.canonical.as_deref() == Some(r.fs.mount_point.as_path());
        is_mount.then(|| r.fs.mount_point.clone())
    });
    match examined_mount {
        Some(mount) => (Some(mount), shape),
        None => (
            mountpoint.map(Path::to_path_buf),
            shape.filter(|_| configured),
        ),
    }
}

/// Fails when `path` does not answer a `stat` within `timeout` (resolving its name
/// alone can be answered from the kernel's caches). It is asked of a worker process,
/// so a dead share cannot hang the caller (`stagefs mount` checks its source this
/// way); whether the path exists is left to the caller.
pub(crate) fn responds(path: &Path, timeout: std::time::Duration) -> Result<(), String> {
    let gathered = worker::gather(vec![Task::Locate(path.to_path_buf())], timeout);
    match got!(gathered, Located) {
        Some(_) => Ok(()),
        None => Err(gathered.missing.to_string()),
    }
}

/// The config file's budget; the reserve defaults as for a mount.
fn limits(config: &Config) -> space::Limits {
    let (max_size, min_free) = config.budget();
    space::Limits { min_free, max_size }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_directory_end_to_end() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir_all(dir.path().join("models--o--m/blobs"))?;
        std::fs::write(dir.path().join("models--o--m/blobs/x"), vec![1u8; 1 << 20])?;
        let arg = dir.path().to_str();
        let report = examine(arg, &dir.path().join("../doctor-cache"), &Config::default())?;
        let names: Vec<&str> = report.checks.iter().map(|c| c.name).collect();
        assert_eq!(
            names[..4],
            ["fuse", "source", "shape", "speed"],
            "{names:?}"
        );
        let probe = report.source.and_then(|s| s.probe).expect("measured");
        assert!(probe.throughput_bytes_per_sec > 0.0);
        let unconfigured = examine(Some("org/name"), dir.path(), &Config::default());
        assert!(unconfigured.is_err(), "a model id needs a source");
        Ok(())
    }

    #[test]
    fn without_the_workers_answers_the_source_did_not_answer() -> anyhow::Result<()> {
        let late = Gathered {
            lines: Vec::new(),
            missing: worker::Unanswered::Late(DEADLINE),
        };
        let report = judge(&late, Some("/nas/hub"), Path::new("/c"), &Config::default())?;
        let failed: Vec<&str> = report
            .checks
            .iter()
            .filter(|c| c.verdict == report::Verdict::Fail)
            .map(|c| c.name)
            .collect();
        assert_eq!(failed, ["source", "cache"]);
        assert!(
            report.checks[1]
                .summary
                .starts_with("the source /nas/hub did not answer within 15s")
        );
        Ok(())
    }
}
