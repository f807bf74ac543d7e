//! The `stagefs mount` process: serving a mount in the foreground (the lifecycle is
//! `stagefs_mount`'s), and the launcher that starts that as a background daemon
//! and returns once the mount is live. Errors get what to try here.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use stagefs_control::Backend;
use stagefs_mount::{MountError, MountSpec, Running, UnmountError, Unmounted};
use stagefs_policy::OnFull;

/// The library's error with what to try: the flag or command that helps.
pub(crate) fn explain(e: MountError) -> anyhow::Error {
    match &e {
        MountError::SourceUnanswered { path, .. } => anyhow!(
            "{e}; check that the share is reachable (`stagefs doctor {}` examines it)",
            path.display()
        ),
        MountError::AlreadyMounted { mountpoint } => anyhow!(
            "{e}; unmount it first (`stagefs unmount {}` if it is a stagefs mount)",
            mountpoint.display()
        ),
        MountError::NotEmpty { .. } => anyhow!("{e}; use an empty directory"),
        MountError::LimitBelowStageSize {
            max_size,
            min_stage_size,
        } => anyhow!(
            "--max-size ({max_size} bytes) is smaller than --min-stage-size ({min_stage_size} bytes): no file could ever be staged"
        ),
        MountError::CacheLocked { path } => match stagefs_mount::registry::known_for_cache(path) {
            Some(mount) => anyhow!(
                "cache directory {} is in use by the mount at {}; unmount it (`stagefs unmount {}`) or pass a different --cache-dir",
                path.display(),
                mount.mountpoint.display(),
                mount.mountpoint.display()
            ),
            None => {
                let pid = stagefs_mount::registry::lock_holder(path)
                    .map(|p| format!(" (pid {p})"))
                    .unwrap_or_default();
                anyhow!("{e}{pid}; unmount or wait for it, or pass a different --cache-dir")
            }
        },
        MountError::StaleMount { mountpoint, source } => anyhow!("{source}").context(format!(
            "{e}; run `stagefs unmount --lazy {}`",
            mountpoint.display()
        )),
        _ => anyhow::Error::new(e),
    }
}

/// `stagefs unmount`: the library's unmount (which acts only on a mount of ours),
/// saying what to try where something is left to do.
pub(crate) fn unmount(mountpoint: &Path, how: stagefs_mount::UnmountHow) -> anyhow::Result<()> {
    let unmounted = stagefs_mount::unmount_how(mountpoint, how).map_err(|e| match &e {
        UnmountError::Busy(_) => anyhow!("{e}; close them or use --lazy"),
        UnmountError::NotOurs { .. } => anyhow!("{e} (use umount for other filesystems)"),
        UnmountError::Unrecorded(path) => anyhow!(
            "{e}; as its owner, run `fusermount3 -u {}` (Linux) or `umount {}`",
            path.display(),
            path.display()
        ),
        UnmountError::DaemonLingers { .. } => {
            anyhow!("{e}; `stagefs status` shows when it has exited")
        }
        _ => anyhow!(e),
    })?;
    match unmounted {
        Unmounted::Detached { pid } => eprintln!(
            "stagefs: detached {}; its daemon{} exits once the files still open there are closed",
            mountpoint.display(),
            pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
        ),
        // Silence would leave the user to check the mount table.
        Unmounted::Released => println!("unmounted {}", mountpoint.display()),
    }
    Ok(())
}

/// Serves `spec` in this process until unmounted; with `notify_ready`, tells the
/// launcher on stdout whether the mount came up.
pub(crate) fn serve_foreground(spec: &MountSpec, notify_ready: bool) -> anyhow::Result<()> {
    let running = match Running::start(spec).map_err(explain) {
        Ok(running) => running,
        Err(e) => {
            if notify_ready {
                println!("error: {e:#}");
            }
            return Err(e);
        }
    };
    if notify_ready {
        // The launcher tells its user which of the two it is.
        match spec.source_verdict.is_away() {
            true => println!("{READY_AWAY}"),
            false => println!("{READY}"),
        }
        let _ = std::io::stdout().flush();
        detach_stdout();
    }
    running.wait().map_err(explain)
}

/// `stagefs serve`: the NFS export of `spec`, in this process until interrupted.
/// The first line on stdout is the export's URL.
pub(crate) fn serve_nfs(spec: &MountSpec) -> anyhow::Result<()> {
    let running = Running::serve_nfs(spec).map_err(explain)?;
    if let Some(url) = running.nfs_url() {
        println!("{url}");
        let _ = std::io::stdout().flush();
    }
    running.wait().map_err(explain)
}

// After the launcher has read "ready" it exits; later writes to stdout must not fail.
fn detach_stdout() {
    if let Ok(devnull) = OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        // SAFETY: both descriptors are valid for the duration of the call.
        unsafe { libc::dup2(devnull.as_raw_fd(), libc::STDOUT_FILENO) };
    }
}

/// Whether the mount `spec` describes (its source at its mount point, with its cache)
/// is up already: then `mount` has nothing to do, and a service restarted on failure
/// must not fail at every try. Paths compare as given (both absolute): resolving the
/// source could hang on a share that is away. A mount detached with files still open
/// is not up: its daemon answers, but nothing is mounted there.
pub(crate) fn already_up(spec: &MountSpec) -> bool {
    matches!(
        stagefs_mount::mounted(&spec.cache_dir),
        Ok(Some((source, mountpoint))) if source == spec.source && mountpoint == spec.mountpoint
    )
}

/// What a daemon says once it serves: the source live, or away and served from what
/// the cache remembers of it.
const READY: &str = "ready";
const READY_AWAY: &str = "ready: the source is away";

/// A mount started in the background.
pub(crate) struct Launched {
    /// Its log.
    pub(crate) log: PathBuf,
    /// Whether its source was away, so it serves what the cache remembers.
    pub(crate) away: bool,
}

/// The line a user reads when a mount started with its source away.
pub(crate) fn away_line(spec: &MountSpec) -> String {
    format!(
        "the source {} is away (not answering, or not mounted): {} serves what the cache remembers of it, read-only, and serves the source again by itself once it is back there",
        spec.source.display(),
        spec.mountpoint.display()
    )
}

/// Starts this program again as a detached `mount --foreground` and returns once it
/// reports the mount live; its log goes to `stagefs.log` in the cache directory.
pub(crate) fn launch_background(spec: &MountSpec) -> anyhow::Result<Launched> {
    let cleared = spec.check().map_err(explain)?.cleared_stale_mount;
    // Before the log is opened: the daemon would be refused the lock, and its error
    // would land in the log of the mount that holds it.
    if stagefs_mount::registry::locked(&spec.cache_dir) {
        return Err(explain(MountError::CacheLocked {
            path: spec.cache_dir.clone(),
        }));
    }
    if cleared {
        eprintln!(
            "stagefs: cleared a stale mount at {} left by a crashed daemon",
            spec.mountpoint.display()
        );
    }
    spec.create_cache_dir().map_err(explain)?;
    let log_path = spec.cache_dir.join("stagefs.log");
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log_path)
        .with_context(|| format!("opening log file {}", log_path.display()))?;
    let exe = std::env::current_exe().context("finding the stagefs executable")?;
    let mut command = Command::new(exe);
    command
        .args(foreground_args(spec))
        .args(cleared.then_some("--cleared-stale-mount"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log);
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from our terminal.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = command.spawn().context("starting the mount daemon")?;
    let stdout = child.stdout.take().context("daemon stdout")?;
    match first_line(stdout, Duration::from_secs(120)) {
        Some(line) if line == READY || line == READY_AWAY => Ok(Launched {
            log: log_path,
            away: line == READY_AWAY,
        }),
        Some(line) => bail!("{}", line.trim_start_matches("error: ")),
        None => {
            let _ = child.kill();
            bail!(
                "the mount daemon did not come up; see {}",
                log_path.display()
            )
        }
    }
}

/// The command line that serves `spec` in the foreground. Every setting is spelled
/// out, so the daemon serves what was resolved here even if the config file changes.
fn foreground_args(spec: &MountSpec) -> Vec<OsString> {
    let fs = &spec.fs;
    let mut args: Vec<OsString> = vec![
        "--no-config".into(),
        "mount".into(),
        spec.source.clone().into(),
        spec.mountpoint.clone().into(),
        "--cache-dir".into(),
        spec.cache_dir.clone().into(),
        format!("--backend={}", spec.backend).into(),
        format!("--min-stage-size={}", fs.min_stage_size).into(),
        format!("--copy-streams={}", spec.copy.streams).into(),
        format!("--source-timeout={}s", fs.source_timeout.as_secs()).into(),
        format!(
            "--on-full={}",
            match fs.on_full {
                OnFull::Fail => "fail",
                OnFull::ReadSource => "read-source",
            }
        )
        .into(),
    ];
    let optional = [
        spec.max_size.map(|n| format!("--max-size={n}")),
        spec.min_free.map(|n| format!("--min-free={n}")),
        match (fs.prefetch, fs.prefetch_parallel) {
            (false, _) => Some("--no-prefetch".into()),
            (true, Some(parallel)) => Some(format!("--prefetch-parallel={parallel}")),
            (true, None) => None,
        },
        fs.read_only.then(|| "--read-only".into()),
    ];
    args.extend(optional.into_iter().flatten().map(OsString::from));
    // The daemon of an NFS mount refuses these, as `mount --backend nfs` does.
    if spec.backend == Backend::Fuse {
        let fuse_only = [
            Some(format!(
                "--redirect-grace={}s",
                spec.redirect_grace.as_secs()
            )),
            (!fs.passthrough).then(|| "--no-passthrough".into()),
            (!fs.redirect).then(|| "--no-redirect".into()),
            fs.allow_other.then(|| "--allow-other".into()),
        ];
        args.extend(fuse_only.into_iter().flatten().map(OsString::from));
    }
    args.extend(
        spec.model_dirs
            .iter()
            .map(|dir| OsString::from(format!("--model-dir={}", dir.display()))),
    );
    args.extend(["--foreground", "--notify-ready"].map(OsString::from));
    args
}

fn first_line(stdout: impl std::io::Read + Send + 'static, timeout: Duration) -> Option<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(timeout).ok()?;
    let line = line.trim_end().to_string();
    (!line.is_empty()).then_some(line)
}

/// Shown after a successful background mount.
pub(crate) fn describe(spec: &MountSpec, log: &Path) -> String {
    let mut modes = Vec::new();
    if spec.fs.read_only {
        modes.push("read-only".to_string());
    }
    // Otherwise only the daemon's log would say it, at the first such open.
    if spec.fs.on_full == OnFull::ReadSource {
        let when_full = crate::manage::READS_SOURCE_WHEN_FULL;
        modes.push(format!("--on-full read-source: {when_full}"));
    }
    let modes: String = modes.iter().map(|m| format!("{m}; ")).collect();
    format!(
        "mounted {} at {} ({modes}cache {}, log {})",
        spec.source.display(),
        spec.mountpoint.display(),
        spec.cache_dir.display(),
        log.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::FromArgMatches;

    /// The daemon's command line as the daemon parses it: the options it was given.
    fn reparsed(spec: &MountSpec) -> crate::args::MountOptions {
        let args = std::iter::once(OsString::from("stagefs")).chain(foreground_args(spec));
        let matches = crate::args::command()
            .try_get_matches_from(args)
            .expect("the daemon's arguments parse");
        match crate::args::Cli::from_arg_matches(&matches).expect("a command") {
            crate::args::Cli {
                command: crate::args::Command::Mount(mount),
                ..
            } => mount.options(),
            other => panic!("not a mount: {other:?}"),
        }
    }

    #[test]
    fn an_nfs_daemon_is_given_no_fuse_only_flag_and_a_fuse_daemon_all_of_its_own() {
        let mut spec = MountSpec::new("/src", "/mnt", "/cache");
        (spec.fs.passthrough, spec.fs.redirect, spec.fs.allow_other) = (false, false, true);
        spec.backend = Backend::Nfs;
        assert_eq!(reparsed(&spec).fuse_only_flags(), Vec::<&str>::new());
        spec.backend = Backend::Fuse;
        let fuse = reparsed(&spec);
        assert_eq!(
            fuse.fuse_only_flags(),
            [
                "--no-passthrough",
                "--no-redirect",
                "--redirect-grace",
                "--allow-other"
            ]
        );
    }
}
