//! `stagefs run -- COMMAND`: the everyday way to use the mount. It brings the
//! configured mount up if it is not, stages the named models, and then becomes
//! COMMAND (exec), so COMMAND's exit code and signals are the caller's without any
//! forwarding.

use std::ffi::{OsStr, OsString};
use std::io::ErrorKind;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::{Context, bail};
use stagefs_layout::models::Shape;

use crate::args::RunArgs;
use crate::config::Config;
use crate::daemon;
use stagefs_mount::bounded::{same_place, shape};
use stagefs_mount::{MountSpec, live_mount};

/// Files staged at a time for `--model`.
const STAGE_PARALLEL: usize = 2;
/// How long finding out the source's shape may take; past it, the mount is taken for
/// a hub cache.
const SHAPE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the source itself is asked for its shape before the mount is.
const SOURCE_SHAPE_WAIT: Duration = Duration::from_secs(3);
/// How long resolving a mount point or source may take; past it, the path is compared
/// as written.
const PATH_TIMEOUT: Duration = Duration::from_secs(5);

/// The variable that relaxes the macOS Metal command-buffer watchdog for one process.
pub(crate) const RELAX_WATCHDOG_VAR: &str = "AGX_RELAX_CDM_CTXSTORE_TIMEOUT";

/// Runs the command; only returns if COMMAND could not be started.
pub(crate) fn run(args: &RunArgs, config: &Config) -> anyhow::Result<ExitCode> {
    let (program, rest) = args.command.split_first().context("no COMMAND given")?;
    // A mistyped command is said before anything is mounted, staged or announced.
    if let Err(error) = runnable(program) {
        return Ok(cannot_run(program, &error));
    }
    let spec = mount_spec(args, config)?;
    ensure_mounted(&spec)?;
    if !args.models.is_empty() {
        // COMMAND owns stdout; everything stagefs says goes to stderr.
        let stage = crate::prefetch::Stage {
            parallel: STAGE_PARALLEL,
            verbose: false,
            results: crate::prefetch::Results::Stderr,
        };
        let summary = stage.run(&spec.cache_dir, &args.models, args.revision.as_deref())?;
        eprintln!("stagefs: {summary}");
    }
    // The source, not the mount: through the mount, staged files may be links. A
    // source that does not answer is asked through the mount, which answers from
    // what the cache remembers of it.
    let timeout = spec.fs.source_timeout.min(SHAPE_TIMEOUT);
    let shape = shape(&spec.source, timeout.min(SOURCE_SHAPE_WAIT))
        .or_else(|| shape(&spec.mountpoint, timeout))
        .unwrap_or(Shape::Unknown);
    // A read-only mount cannot take a download: there, a load must not try one.
    let offline = args.offline || read_only(&spec.mountpoint);
    let env = environment(
        shape,
        &spec.mountpoint,
        &spec.cache_dir,
        offline,
        args.relax_gpu_watchdog,
    );
    announce(&env, shape, &spec.mountpoint, args.relax_gpu_watchdog);
    let error = Command::new(program).args(rest).envs(env).exec();
    Ok(cannot_run(program, &error))
}

/// Says why COMMAND could not be run; the shell's exit codes, so scripts can tell
/// "not found" (127) from "not executable" (126).
fn cannot_run(program: &OsStr, error: &std::io::Error) -> ExitCode {
    eprintln!(
        "stagefs: cannot run {}: {}",
        Path::new(program).display(),
        stagefs_source::io_text(error)
    );
    ExitCode::from(match error.kind() {
        ErrorKind::NotFound => 127,
        _ => 126,
    })
}

/// Whether `program` names a file `exec` can run, as `execvp` looks for it: a name
/// with a slash as it is, any other in the directories of `PATH`. What exec would
/// say if not: not found, or permission denied for a file without an execute bit.
fn runnable(program: &OsStr) -> std::io::Result<()> {
    let executable = |path: &Path| {
        std::fs::metadata(path).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let denied = || std::io::Error::from_raw_os_error(libc::EACCES);
    if program.as_bytes().contains(&b'/') {
        return match executable(Path::new(program))? {
            true => Ok(()),
            false => Err(denied()),
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut found_unexecutable = false;
    for dir in std::env::split_paths(&path) {
        match executable(&dir.join(program)) {
            Ok(true) => return Ok(()),
            Ok(false) => found_unexecutable = true,
            Err(_) => {}
        }
    }
    Err(match found_unexecutable {
        true => denied(),
        false => std::io::Error::from_raw_os_error(libc::ENOENT),
    })
}

/// The mount asked for; with none given or configured, the one the cache directory
/// serves (so `stagefs mount SRC MNT` then `stagefs run -- ...` just works), else,
/// if the cache directory is named, the one it recorded last (mounted again). The
/// cache directory is the flag's, the config file's, or the running mount's
/// (`mounts::cache_dir`), picked among several by `--model`, `--mountpoint` or
/// `--source` as the other commands pick by what they name. With nothing mounted
/// and nothing given, refuses: a mount recorded in the default cache by some
/// earlier session is not brought back (issue 36).
fn mount_spec(args: &RunArgs, config: &Config) -> anyhow::Result<MountSpec> {
    let asked = config.mount_spec(
        args.source.as_deref(),
        args.mountpoint.as_deref(),
        &args.options(),
    );
    let flag = args.options.cache_dir.as_deref();
    let Err(missing) = asked else {
        return with_running_cache(asked?, args, config, flag);
    };
    let targets = targets(args);
    if flag.is_none() && config.configured_cache_dir().is_none() && targets.is_empty() {
        refuse_several_running()?;
    }
    let cache_dir = crate::mounts::cache_dir(config, flag, &targets)?;
    let known = match live_mount(&cache_dir)? {
        Some(live) => Some(live),
        None => crate::mounts::standing(config, flag, &cache_dir).map(|r| (r.source, r.mountpoint)),
    };
    let mut options = args.options();
    options.cache_dir = Some(cache_dir);
    match known {
        Some((source, mountpoint)) => config.mount_spec(
            Some(args.source.as_deref().unwrap_or(&source)),
            Some(args.mountpoint.as_deref().unwrap_or(&mountpoint)),
            &options,
        ),
        None if args.source.is_none() && args.mountpoint.is_none() => bail!(
            "no source given and no stagefs mount is running: mount one first (`stagefs mount SOURCE MOUNTPOINT`), pass --source and --mountpoint, or set `source` and `mountpoint` in {}",
            config.file_shown()
        ),
        None => Err(missing),
    }
}

/// With several mounts running and nothing given to pick one, names them with every
/// way `run` picks one: the others' refusal offers only `--cache-dir`.
fn refuse_several_running() -> anyhow::Result<()> {
    let known = stagefs_mount::registry::known();
    let [first, _, ..] = known.as_slice() else {
        return Ok(());
    };
    bail!(
        "{} stagefs mounts are running: {}; pick one with --mountpoint (`stagefs run --mountpoint {} -- …`), --source, --cache-dir, or --model naming a model only one holds",
        known.len(),
        crate::mounts::listed(&known),
        first.mountpoint.display()
    )
}

/// `spec` with the cache of the mount already running at its mount point, when no
/// cache directory was named: a mount made with its own `--cache-dir` is found by its
/// mount point, as every other command finds it, instead of being mounted over.
fn with_running_cache(
    spec: MountSpec,
    args: &RunArgs,
    config: &Config,
    flag: Option<&Path>,
) -> anyhow::Result<MountSpec> {
    if flag.is_some() || config.configured_cache_dir().is_some() {
        return Ok(spec);
    }
    let Some(running) = stagefs_mount::registry::known_at(&spec.mountpoint) else {
        return Ok(spec);
    };
    let mut options = args.options();
    options.cache_dir = Some(running.cache_dir);
    config.mount_spec(args.source.as_deref(), args.mountpoint.as_deref(), &options)
}

/// What picks one of several running mounts: the models to stage (by the source
/// that holds them), the mount point and the source given.
fn targets(args: &RunArgs) -> Vec<&str> {
    let paths = [&args.mountpoint, &args.source].into_iter().flatten();
    let paths = paths.filter_map(|p| p.to_str());
    args.models
        .iter()
        .map(String::as_str)
        .chain(paths)
        .collect()
}

/// Leaves a matching mount alone, starts one if none runs, and refuses when the
/// cache directory already serves a different mount. A mount detached with files
/// still open counts as none: starting one then says its cache is in use.
fn ensure_mounted(spec: &MountSpec) -> anyhow::Result<()> {
    let same = |a: &Path, b: &Path| same_place(a, b, PATH_TIMEOUT);
    match stagefs_mount::mounted(&spec.cache_dir)? {
        Some((source, mountpoint))
            if same(&mountpoint, &spec.mountpoint) && same(&source, &spec.source) =>
        {
            keeping_its_options(spec)
        }
        Some((source, mountpoint)) => bail!(
            "cache directory {} already serves {} at {}; unmount it or use another --cache-dir",
            spec.cache_dir.display(),
            source.display(),
            mountpoint.display()
        ),
        None => {
            let launched = daemon::launch_background(spec)?;
            eprintln!(
                "stagefs: {}; it stays mounted (`stagefs unmount` stops it)",
                daemon::describe(spec, &launched.log)
            );
            if launched.away {
                eprintln!("stagefs: {}", daemon::away_line(spec));
            }
            Ok(())
        }
    }
}

/// A mount already running keeps the options it was started with; this run's are
/// said to be ignored, and `--read-only` on a writable mount is refused: the user
/// asked that COMMAND change nothing on the source, which that mount would let it.
fn keeping_its_options(spec: &MountSpec) -> anyhow::Result<()> {
    let mountpoint = spec.mountpoint.display();
    if spec.fs.read_only && !read_only(&spec.mountpoint) {
        bail!(
            "the mount at {mountpoint} is already running and writable, so --read-only would not hold for COMMAND; unmount it first (`stagefs unmount {mountpoint}`) and run again"
        );
    }
    eprintln!(
        "stagefs: using the mount already running at {mountpoint}; its own options stand (unmount it first to change them)"
    );
    Ok(())
}

/// The variables COMMAND gets, by the shape of the source: the HF variables that
/// point huggingface_hub at the mount (see [`Shape::hf_variables`]), with
/// `HF_HUB_OFFLINE=1` if `offline` (otherwise a load may ask the Hub for a newer
/// revision and download it through the mount, which writes it through and stages
/// it), and for an HF_HOME, `HF_XET_CACHE` beside the cache in `cache_dir` (see
/// [`Shape::xet_cache`]); for plain model folders, loaded by path, none of them.
fn environment(
    shape: Shape,
    mountpoint: &Path,
    cache_dir: &Path,
    offline: bool,
    relax_watchdog: bool,
) -> Vec<(&'static str, OsString)> {
    let mut env: Vec<(&'static str, OsString)> = shape
        .hf_variables(mountpoint)
        .into_iter()
        .map(|(name, value)| (name, value.into_os_string()))
        .collect();
    if offline && !env.is_empty() {
        env.push(("HF_HUB_OFFLINE", "1".into()));
    }
    if let Some(xet) = shape.xet_cache(cache_dir) {
        env.push(("HF_XET_CACHE", xet.into_os_string()));
    }
    if relax_watchdog {
        env.push((RELAX_WATCHDOG_VAR, "1".into()));
    }
    env
}

/// Whether the mount at `mountpoint` is read-only (`--read-only`, this run's or the
/// running mount's): the kernel says so for both backends.
fn read_only(mountpoint: &Path) -> bool {
    stagefs_source::sys::statvfs(mountpoint)
        .is_ok_and(|st| st.f_flag & libc::ST_RDONLY as libc::c_ulong != 0)
}

/// Says in one line what COMMAND's environment is; the watchdog change is never silent.
fn announce(env: &[(&str, OsString)], shape: Shape, mountpoint: &Path, relax_watchdog: bool) {
    let shown: Vec<String> = env
        .iter()
        .map(|(k, v)| format!("{k}={}", v.to_string_lossy()))
        .collect();
    if shape == Shape::ModelFolders {
        let set = if shown.is_empty() {
            String::new()
        } else {
            format!(" {}", shown.join(" "))
        };
        eprintln!(
            "stagefs: running with no HF variables set{set}: the source holds plain model folders, load them by path under {}",
            mountpoint.display()
        );
    } else {
        eprintln!(
            "stagefs: running with {} ({})",
            shown.join(" "),
            shape_origin(shape)
        );
    }
    if relax_watchdog {
        let effect = if cfg!(target_os = "macos") {
            "relaxes the Metal GPU watchdog for this command only; the system and other processes keep the default"
        } else {
            "has no effect outside macOS"
        };
        eprintln!("stagefs: {RELAX_WATCHDOG_VAR}=1 {effect}");
    }
}

fn shape_origin(shape: Shape) -> &'static str {
    match shape {
        Shape::HfHome => "the source is an HF_HOME",
        Shape::HubCache => "the source is a hub cache",
        Shape::ModelFolders | Shape::Unknown => "no model recognised in the source yet",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(shape: Shape, relax: bool) -> Vec<&'static str> {
        environment(shape, Path::new("/m"), Path::new("/c"), true, relax)
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    }

    #[test]
    fn the_environment_follows_the_shape_of_the_source() {
        assert_eq!(
            environment(Shape::HfHome, Path::new("/m"), Path::new("/c"), true, false),
            [
                ("HF_HOME", OsString::from("/m")),
                ("HF_HUB_CACHE", OsString::from("/m/hub")),
                ("HF_HUB_OFFLINE", OsString::from("1")),
                ("HF_XET_CACHE", OsString::from("/c/xet"))
            ]
        );
        assert_eq!(
            names(Shape::HubCache, false),
            ["HF_HUB_CACHE", "HF_HUB_OFFLINE"]
        );
        assert_eq!(
            names(Shape::Unknown, false),
            ["HF_HUB_CACHE", "HF_HUB_OFFLINE"]
        );
        assert!(names(Shape::ModelFolders, false).is_empty());
    }

    #[test]
    fn online_unless_asked_or_read_only() {
        let online = environment(
            Shape::HubCache,
            Path::new("/m"),
            Path::new("/c"),
            false,
            false,
        );
        assert_eq!(online, [("HF_HUB_CACHE", OsString::from("/m"))]);
        let folders = environment(
            Shape::ModelFolders,
            Path::new("/m"),
            Path::new("/c"),
            true,
            false,
        );
        assert!(folders.is_empty(), "loaded by path: {folders:?}");
    }

    #[test]
    fn a_writable_directory_is_not_read_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(!read_only(dir.path()));
    }

    #[test]
    fn watchdog_variable_only_when_asked() {
        assert!(!names(Shape::HubCache, false).contains(&RELAX_WATCHDOG_VAR));
        assert!(names(Shape::HubCache, true).contains(&RELAX_WATCHDOG_VAR));
        assert_eq!(names(Shape::ModelFolders, true), [RELAX_WATCHDOG_VAR]);
    }
}
