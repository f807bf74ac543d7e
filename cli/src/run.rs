//! `stagefs run -- COMMAND`: the everyday way to use the mount. It brings the
//! configured mount up if it is not, stages the named models, and then becomes
//! COMMAND (exec), so COMMAND's exit code and signals are the caller's without any
//! forwarding.

use std::ffi::OsString;
use std::io::ErrorKind;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, bail};

use crate::args::RunArgs;
use crate::config::Config;
use crate::daemon::{self, MountSpec};
use crate::doctor::same_place;

/// Files staged at a time for `--model`.
const STAGE_PARALLEL: usize = 2;

/// The variable that relaxes the macOS Metal command-buffer watchdog for one process.
pub(crate) const RELAX_WATCHDOG_VAR: &str = "AGX_RELAX_CDM_CTXSTORE_TIMEOUT";

/// Runs the command; only returns if COMMAND could not be started.
pub(crate) fn run(args: &RunArgs, config: &Config) -> anyhow::Result<ExitCode> {
    let spec = mount_spec(args, config)?;
    ensure_mounted(&spec)?;
    if !args.models.is_empty() {
        // COMMAND owns stdout; everything stagefs says goes to stderr.
        let summary = crate::prefetch::stage(
            &spec.cache_dir,
            &args.models,
            args.revision.as_deref(),
            STAGE_PARALLEL,
        )?;
        eprintln!("stagefs: {summary}");
    }
    let env = environment(&spec.mountpoint, args.relax_gpu_watchdog);
    announce(&env, args.relax_gpu_watchdog);
    let (program, rest) = args.command.split_first().context("no COMMAND given")?;
    let error = Command::new(program).args(rest).envs(env).exec();
    eprintln!(
        "stagefs: cannot run {}: {error}",
        Path::new(program).display()
    );
    // The shell's codes, so scripts can tell "not found" from "not executable".
    Ok(ExitCode::from(match error.kind() {
        ErrorKind::NotFound => 127,
        _ => 126,
    }))
}

/// The mount asked for; with none given or configured, the one the cache directory
/// already serves (so `stagefs mount SRC MNT` then `stagefs run -- ...` just works).
fn mount_spec(args: &RunArgs, config: &Config) -> anyhow::Result<MountSpec> {
    let asked = config.mount_spec(
        args.source.as_deref(),
        args.mountpoint.as_deref(),
        &args.options,
    );
    let Err(missing) = asked else {
        return asked;
    };
    let cache_dir = config.cache_dir(args.options.cache_dir.as_deref())?;
    match daemon::live_mount(&cache_dir)? {
        Some((source, mountpoint)) => config.mount_spec(
            Some(args.source.as_deref().unwrap_or(&source)),
            Some(args.mountpoint.as_deref().unwrap_or(&mountpoint)),
            &args.options,
        ),
        None => Err(missing),
    }
}

/// Leaves a matching mount alone, starts one if none runs, and refuses when the
/// cache directory already serves a different mount.
fn ensure_mounted(spec: &MountSpec) -> anyhow::Result<()> {
    match daemon::live_mount(&spec.cache_dir)? {
        Some((source, mountpoint))
            if same_place(&mountpoint, &spec.mountpoint) && same_place(&source, &spec.source) =>
        {
            Ok(())
        }
        Some((source, mountpoint)) => bail!(
            "cache directory {} already serves {} at {}; unmount it or use another --cache-dir",
            spec.cache_dir.display(),
            source.display(),
            mountpoint.display()
        ),
        None => {
            let log = daemon::launch_background(spec)?;
            eprintln!(
                "stagefs: {}; it stays mounted (`stagefs unmount` stops it)",
                daemon::describe(spec, &log)
            );
            Ok(())
        }
    }
}

/// The variables COMMAND gets. HF_HUB_CACHE wins over HF_HOME and the legacy names in
/// huggingface_hub, so one variable is enough and the user's HF_HOME (token, other
/// caches) stays usable; offline mode keeps the hub from writing to a read-only mount.
fn environment(mountpoint: &Path, relax_watchdog: bool) -> Vec<(&'static str, OsString)> {
    let mut env = vec![
        ("HF_HUB_CACHE", hub_dir(mountpoint).into_os_string()),
        ("HF_HUB_OFFLINE", "1".into()),
    ];
    if relax_watchdog {
        env.push((RELAX_WATCHDOG_VAR, "1".into()));
    }
    env
}

/// The hub cache inside the mount: the mount itself, or its `hub/` when the source
/// is a whole HF_HOME.
fn hub_dir(mountpoint: &Path) -> PathBuf {
    let has_models = |dir: &Path| {
        std::fs::read_dir(dir).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("models--"))
        })
    };
    let hub = mountpoint.join("hub");
    if !has_models(mountpoint) && has_models(&hub) {
        hub
    } else {
        mountpoint.to_path_buf()
    }
}

/// Says what COMMAND's environment is; the watchdog change is never silent.
fn announce(env: &[(&str, OsString)], relax_watchdog: bool) {
    let shown: Vec<String> = env
        .iter()
        .map(|(k, v)| format!("{k}={}", v.to_string_lossy()))
        .collect();
    eprintln!("stagefs: running with {}", shown.join(" "));
    if relax_watchdog {
        let effect = if cfg!(target_os = "macos") {
            "relaxes the Metal GPU watchdog for this command only; the system and other processes keep the default"
        } else {
            "has no effect outside macOS"
        };
        eprintln!("stagefs: {RELAX_WATCHDOG_VAR}=1 {effect}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_dir_finds_an_hf_home_layout() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(hub_dir(dir.path()), dir.path());
        std::fs::create_dir_all(dir.path().join("hub/models--a--b")).expect("mkdir");
        assert_eq!(hub_dir(dir.path()), dir.path().join("hub"));
        std::fs::create_dir_all(dir.path().join("models--c--d")).expect("mkdir");
        assert_eq!(hub_dir(dir.path()), dir.path());
    }

    #[test]
    fn watchdog_variable_only_when_asked() {
        let names = |relax| -> Vec<&str> {
            environment(Path::new("/m"), relax)
                .into_iter()
                .map(|(k, _)| k)
                .collect()
        };
        assert_eq!(names(false), ["HF_HUB_CACHE", "HF_HUB_OFFLINE"]);
        assert!(names(true).contains(&RELAX_WATCHDOG_VAR));
    }
}
