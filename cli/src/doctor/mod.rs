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

#[allow(unused_imports)]
// unused since stagefs-mount compares paths; goes with the doctor rewrite
pub(crate) use shape::{shape_of, usage as shape_usage};

use crate::args::DoctorArgs;
use crate::config::Config;
use fskind::FsKind;
use report::Check;
use source::{Findings, Target};
use worker::{DEADLINE, Gathered, Task};

/// The whole report, as `--json` prints it; `failed` when a check failed (then the
/// exit code is 1).
#[derive(Debug, Serialize)]
struct Report {
    checks: Vec<Check>,
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
    match args.json {
        true => println!("{}", serde_json::to_string_pretty(&report)?),
        false => print!("{}", report::render(&report.checks)),
    }
    Ok(if report.failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Asks one worker everything that touches a path, then judges what it answered.
fn examine(arg: Option<&str>, cache_dir: &Path, config: &Config) -> anyhow::Result<Report> {
    let (mountpoint, dirs) = (config.configured_mountpoint(), config.model_dirs().to_vec());
    let source = Task::Source(arg.map(Into::into), config.source().map(Into::into), dirs);
    let cache = Task::Cache(cache_dir.to_path_buf(), mountpoint.map(Into::into));
    let resolve = hub::paths_to_resolve(mountpoint)
        .into_iter()
        .map(Task::Resolve);
    let gathered = worker::gather(
        [source, cache].into_iter().chain(resolve).collect(),
        DEADLINE,
    );
    judge(&gathered, arg, cache_dir, config)
}

/// The report from what the worker answered.
fn judge(
    gathered: &Gathered,
    arg: Option<&str>,
    cache: &Path,
    config: &Config,
) -> anyhow::Result<Report> {
    // Without the worker's word, whether `org/name` is a path here is not known.
    let told = got!(gathered, Target).cloned();
    let target = told.unwrap_or_else(|| Target::of(arg, config.source(), |_| false));
    let target = target.map_err(|e| anyhow!(e))?;
    let mut found = source::inspect(gathered, &target)?;
    let mountpoint = config.configured_mountpoint();
    let roots = [
        found.roots.clone(),
        mountpoint.into_iter().map(Into::into).collect(),
    ]
    .concat();
    let model = found.model.as_ref();
    let (cache_checks, cache_report) =
        space::inspect(gathered, cache, config.budget(), &roots, model);
    let (mount, shape) = environment_target(&found, &target, mountpoint);
    let (hub_check, hub_cache) = hub::hub_cache_check(gathered, mount.as_deref(), shape);
    // The worker asks the control socket in the cache directory only once that answered.
    let answered = mountpoint.filter(|_| cache_report.fs.is_some());
    let (mount_check, mount) = answered
        .map(|m| hub::mount_check(gathered, m, cache))
        .unzip();
    let mut checks = vec![fuse::check()];
    checks.append(&mut found.checks);
    checks.extend(
        cache_checks
            .into_iter()
            .chain([hub_check])
            .chain(mount_check),
    );
    checks.extend(watchdog::checks());
    let probe = found.report.as_ref().and_then(|r| r.probe.as_ref());
    let staging_seconds = |model: &model::Model| probe.map(|p| source::staging_seconds(p, model));
    let model = found.model.map(|model| ModelReport {
        staging_seconds: staging_seconds(&model),
        model,
    });
    let (failed, source) = (report::any_failed(&checks), found.report);
    let cache = cache_report;
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

/// The mount whose use the environment is judged against, and its source's shape: the
/// stagefs mount examined, else the configured mount (whose source's shape is known
/// when the configured source was examined).
fn environment_target(
    found: &Findings,
    target: &Target,
    mountpoint: Option<&Path>,
) -> (Option<PathBuf>, Option<Shape>) {
    let shape = found.survey.as_ref().map(|s| s.shape);
    let examined = found
        .report
        .as_ref()
        .map(|r| (&r.fs, r.canonical.as_deref()));
    match examined {
        Some((fs, Some(path))) if fs.kind == FsKind::Stagefs && path == fs.mount_point => {
            (Some(fs.mount_point.clone()), shape)
        }
        _ => {
            let configured = target.parts().is_some_and(|(_, configured, _)| configured);
            (
                mountpoint.map(Path::to_path_buf),
                shape.filter(|_| configured),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_directory_end_to_end() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir_all(dir.path().join("models--o--m/blobs"))?;
        std::fs::write(dir.path().join("models--o--m/blobs/x"), vec![1u8; 1 << 20])?;
        let (config, cache) = (Config::default(), dir.path().join("../doctor-cache"));
        let report = examine(dir.path().to_str(), &cache, &config)?;
        let names: Vec<&str> = report.checks.iter().map(|c| c.name).collect();
        assert_eq!(
            names[..4],
            ["fuse", "source", "shape", "speed"],
            "{names:?}"
        );
        let probe = report.source.and_then(|s| s.probe).expect("measured");
        assert!(probe.throughput_bytes_per_sec > 0.0);
        assert!(
            examine(Some("org/name"), &cache, &config).is_err(),
            "a model id needs a source"
        );
        let late = Gathered::new(Vec::new(), worker::Unanswered::Late(DEADLINE));
        let report = judge(&late, Some("/nas/hub"), Path::new("/c"), &config)?;
        let failed = report
            .checks
            .iter()
            .filter(|c| c.verdict == report::Verdict::Fail);
        assert_eq!(
            failed.map(|c| c.name).collect::<Vec<_>>(),
            ["source", "cache"]
        );
        let summary = &report.checks[1].summary;
        assert!(
            summary.starts_with("the source /nas/hub did not answer within 15s"),
            "{summary}"
        );
        Ok(())
    }
}
