//! `stagefs doctor`: checks FUSE, the source, the cache volume and the environment,
//! and says what to fix. Each check is one line with a verdict (ok, warn, fail, note)
//! and, when there is something to do, advice. Nothing here may hang on a dead
//! source: every step that touches it runs under a deadline (`bounded`).

mod bounded;
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
mod worker;

use std::path::Path;
use std::process::ExitCode;

use anyhow::anyhow;
use serde::Serialize;

#[allow(unused_imports)]
// unused since stagefs-mount compares paths; goes with the doctor rewrite
pub(crate) use hub::same_place;
pub(crate) use shape::{shape_of, usage as shape_usage};

use crate::args::DoctorArgs;
use crate::config::Config;
use bounded::SOURCE_TIMEOUT;
use report::Check;
use source::Target;

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
    let target = target(args.target.as_deref(), config)?;
    let cache_dir = config.cache_dir_for(&args.cache)?;
    let report = examine(&target, &cache_dir, config)?;
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

fn examine(target: &Target, cache_dir: &Path, config: &Config) -> anyhow::Result<Report> {
    let mut checks = vec![fuse::check()];
    let configured = matches!(
        target,
        Target::Path {
            configured: true,
            ..
        } | Target::Model { .. }
    );
    let model_dirs = if configured { config.model_dirs() } else { &[] };
    let mut found = source::inspect(target, model_dirs)?;
    checks.append(&mut found.checks);
    let mountpoint = config.configured_mountpoint();
    let mut roots = found.roots.clone();
    roots.extend(mountpoint.map(Path::to_path_buf));
    let (cache_checks, cache) =
        space::inspect(cache_dir, limits(config), &roots, found.model.as_ref());
    checks.extend(cache_checks);
    let (judged_mount, shape) = environment_target(&found, configured, mountpoint);
    let (hub_check, hub_cache) = hub::hub_cache_check(judged_mount.as_deref(), shape);
    checks.push(hub_check);
    // The control socket lives in the cache directory: if that did not answer, a
    // connect could block in the kernel for good.
    let cache_answered = cache.fs.is_some();
    let mount = mountpoint.filter(|_| cache_answered).map(|m| {
        let (check, state) = hub::mount_check(m, cache_dir);
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
) -> (
    Option<std::path::PathBuf>,
    Option<stagefs_cache::models::Shape>,
) {
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
/// alone can be answered from the kernel's caches). It is asked from a child process,
/// so a dead share cannot hang the caller (`stagefs mount` checks its source this
/// way); whether the path exists is left to the caller.
#[allow(dead_code)] // unused since stagefs-mount checks the source; goes with the doctor rewrite
pub(crate) fn responds(path: &Path, timeout: std::time::Duration) -> Result<(), String> {
    match worker::locate(path, timeout) {
        Err(unanswered) => Err(unanswered.to_string()),
        Ok(_) => Ok(()),
    }
}

/// What to look at: a model id in the configured source, a path, or the configured
/// source.
fn target(arg: Option<&str>, config: &Config) -> anyhow::Result<Target> {
    let Some(arg) = arg else {
        return Ok(match config.source() {
            Some(source) => Target::Path {
                path: source.to_path_buf(),
                configured: true,
            },
            None => Target::Nothing,
        });
    };
    if looks_like_model_id(arg) {
        let hub = config.source().ok_or_else(|| {
            anyhow!("{arg} is a model id, but no source is configured: set `source` in the config file, or pass the directory to examine")
        })?;
        return Ok(Target::Model {
            id: arg.to_string(),
            hub: hub.to_path_buf(),
        });
    }
    Ok(Target::Path {
        path: std::path::absolute(arg)?,
        configured: false,
    })
}

/// `org/name`, unless a relative path of that name exists here.
fn looks_like_model_id(arg: &str) -> bool {
    if stagefs_cache::hf::repo_dir_for(arg).is_none() {
        return false;
    }
    // The working directory may itself be on a dead share.
    !matches!(worker::exists(Path::new(arg), SOURCE_TIMEOUT), Ok(Ok(true)))
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
    fn model_ids_and_paths() {
        assert!(looks_like_model_id("org/name"));
        assert!(!looks_like_model_id("/abs/path"));
        assert!(!looks_like_model_id("./org"));
        assert!(!looks_like_model_id("models--org--name"));
        let config = Config::default();
        assert!(
            target(Some("org/name"), &config).is_err(),
            "a model id needs a source"
        );
        assert_eq!(target(None, &config).ok(), Some(Target::Nothing));
        let path = target(Some("some/dir/x"), &config).expect("a path");
        assert!(matches!(
            path,
            Target::Path {
                configured: false,
                ..
            }
        ));
    }

    #[test]
    fn a_local_directory_end_to_end() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir_all(dir.path().join("models--o--m/blobs"))?;
        std::fs::write(dir.path().join("models--o--m/blobs/x"), vec![1u8; 1 << 20])?;
        let target = Target::Path {
            path: dir.path().to_path_buf(),
            configured: false,
        };
        let report = examine(
            &target,
            &dir.path().join("../doctor-cache"),
            &Config::default(),
        )?;
        let names: Vec<&str> = report.checks.iter().map(|c| c.name).collect();
        assert_eq!(
            names[..4],
            ["fuse", "source", "shape", "speed"],
            "{names:?}"
        );
        let probe = report.source.and_then(|s| s.probe).expect("measured");
        assert!(probe.throughput_bytes_per_sec > 0.0);
        Ok(())
    }
}
