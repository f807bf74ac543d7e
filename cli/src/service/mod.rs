//! `stagefs service`: start the configured mount at login, as a launchd agent on
//! macOS or a systemd user unit on Linux. The service runs `stagefs mount
//! --foreground` with the config file, so editing the file and restarting the
//! service is all a change needs; only the launchd agent's backend is fixed when it
//! is installed (`--backend`, NFS unless the file named another).

// Both managers are compiled (and unit-tested) everywhere; each platform uses one.
#[cfg_attr(not(target_os = "macos"), allow(dead_code))]
mod launchd;
#[cfg_attr(target_os = "macos", allow(dead_code))]
mod systemd;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use anyhow::{Context, bail};
use stagefs_control::Backend;
use stagefs_mount::MountError;
use stagefs_mount::bounded::{self, Kind};

use crate::args::{MountOptions, ServiceCommand};
use crate::config::Config;

/// What the service starts: the program and the config file it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Service {
    pub(crate) exe: PathBuf,
    pub(crate) config: PathBuf,
    pub(crate) source: PathBuf,
    pub(crate) mountpoint: PathBuf,
    /// Where launchd sends the daemon's output (systemd has the journal).
    pub(crate) log: PathBuf,
    /// The config file's `backend`, if it names one.
    pub(crate) backend: Option<Backend>,
    /// Whether this mount is up already (a non-empty mount point is then ours).
    pub(crate) up: bool,
}

impl Service {
    /// The command line the service manager runs.
    pub(crate) fn arguments(&self) -> Vec<String> {
        vec![
            self.exe.display().to_string(),
            "--config".into(),
            self.config.display().to_string(),
            "mount".into(),
            "--foreground".into(),
        ]
    }
}

/// A service file and the commands that load or unload it.
pub(crate) struct Plan {
    pub(crate) file: PathBuf,
    pub(crate) content: String,
    pub(crate) load: Vec<Vec<String>>,
}

/// The platform's service manager.
#[cfg(target_os = "macos")]
use launchd as manager;
#[cfg(not(target_os = "macos"))]
use systemd as manager;

/// Runs a service subcommand.
pub(crate) fn run(command: &ServiceCommand, config: &Config) -> anyhow::Result<()> {
    match command {
        ServiceCommand::Install(args) => install(&service(config)?, args.dry_run),
        ServiceCommand::Uninstall(args) => uninstall(args.dry_run),
        ServiceCommand::Status => status(config),
    }
}

/// The service for the configured mount; refuses what could never start.
fn service(config: &Config) -> anyhow::Result<Service> {
    let Some(path) = &config.path else {
        bail!(
            "no config file: the service mounts what {} describes; write it first (set at least `source` and `mountpoint`)",
            crate::config::default_path()?.display()
        );
    };
    let spec = config.mount_spec(None, None, &MountOptions::default())?;
    refuse_a_mountpoint_inside_the_source(&spec.source, &spec.mountpoint)?;
    let exe = std::env::current_exe()
        .and_then(std::fs::canonicalize)
        .context("finding the stagefs executable")?;
    Ok(Service {
        exe,
        up: crate::daemon::already_up(&spec),
        config: path.clone(),
        log: spec.cache_dir.join("stagefs.log"),
        backend: config.backend(),
        source: spec.source,
        mountpoint: spec.mountpoint,
    })
}

fn install(service: &Service, dry_run: bool) -> anyhow::Result<()> {
    let plan = manager::install_plan(service)?;
    warn_unstartable(service);
    if dry_run {
        println!("would write {}:\n{}", plan.file.display(), plan.content);
        print_commands("would run", &plan.load);
        return Ok(());
    }
    if let Some(dir) = plan.file.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&plan.file, &plan.content)
        .with_context(|| format!("writing {}", plan.file.display()))?;
    println!("wrote {}", plan.file.display());
    if let Err(e) = run_all(&plan.load) {
        bail!(
            "{e:#}; {} is written, load it from your login session with: {}",
            plan.file.display(),
            render(&plan.load).join(" && ")
        );
    }
    println!(
        "the service mounts {} at {} now and at every login",
        service.source.display(),
        service.mountpoint.display()
    );
    Ok(())
}

/// How long installing waits for the source to answer a `stat`.
const SOURCE_WAIT: Duration = Duration::from_secs(3);

/// Refuses what could never start: a mount point inside the source, which `mount`
/// refuses at every start. Compared as written and, where each answers within
/// [`SOURCE_WAIT`], with links resolved (a share may be away now).
fn refuse_a_mountpoint_inside_the_source(source: &Path, mountpoint: &Path) -> anyhow::Result<()> {
    let resolved = |path: &Path| match bounded::canonicalize(path, SOURCE_WAIT) {
        Ok(Ok(real)) => Some(real),
        _ => None,
    };
    let written = |path: &Path| std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let inside = mountpoint.starts_with(source)
        || written(mountpoint).starts_with(written(source))
        || resolved(mountpoint)
            .zip(resolved(source))
            .is_some_and(|(mnt, src)| mnt.starts_with(src));
    if inside {
        return Err(MountError::MountpointInside {
            mountpoint: mountpoint.to_path_buf(),
            source_dir: source.to_path_buf(),
        }
        .into());
    }
    Ok(())
}

/// Says so when the service would fail at its next start (and retry every 30 s): the
/// mount point is missing, not empty or not a directory, or the source is not a
/// directory or does not answer.
/// Neither is refused: a share mounted at login may come up after the service, and
/// the mount point may be made later.
fn warn_unstartable(service: &Service) {
    let source = service.source.display();
    let problem = match stagefs_mount::SourcePlace::of(&service.source) {
        Ok(bucket @ stagefs_mount::SourcePlace::Bucket(_)) => bucket_problem(&bucket),
        _ => directory_problem(&service.source),
    };
    if let Some(problem) = problem {
        eprintln!(
            "stagefs: warning: the source {source}: {problem}; the service's mount fails until it is there (mount the share, or fix `source` in the config file)"
        );
    }
    if service.up {
        return;
    }
    let mnt = service.mountpoint.display();
    let problem = match std::fs::read_dir(&service.mountpoint).map(|mut e| e.next().is_some()) {
        Ok(true) => Some("is not empty; empty it or pick another".to_string()),
        Ok(false) => None,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Some(format!("does not exist; create it (mkdir -p {mnt})"))
        }
        Err(e) => Some(format!("cannot be used: {}", stagefs_source::io_text(&e))),
    };
    if let Some(problem) = problem {
        eprintln!(
            "stagefs: warning: the mount point {mnt} {problem}, or the service fails at every start"
        );
    }
}

/// What keeps the directory `source` from being mounted now, if anything.
fn directory_problem(source: &Path) -> Option<String> {
    match bounded::stat(source, SOURCE_WAIT) {
        Ok(Ok(Kind::Directory)) => None,
        Ok(Ok(Kind::Other)) => Some("is not a directory".to_string()),
        Ok(Err(e)) => Some(stagefs_source::io_text(&e)),
        Err(_) => Some(format!("did not answer in {}s", SOURCE_WAIT.as_secs())),
    }
}

/// What keeps the object store `bucket` from being mounted now, asked with this
/// shell's AWS variables: the service has only those its manager gives it.
fn bucket_problem(bucket: &stagefs_mount::SourcePlace) -> Option<String> {
    bucket
        .open_checked(SOURCE_WAIT)
        .err()
        .map(|e| e.to_string())
}

fn uninstall(dry_run: bool) -> anyhow::Result<()> {
    let (file, unload) = manager::uninstall_plan()?;
    if dry_run {
        print_commands("would run", &unload);
        println!("would remove {}", file.display());
        return Ok(());
    }
    if !file.exists() {
        println!("no service installed ({} does not exist)", file.display());
        return Ok(());
    }
    // Unloading fails when the service is not loaded, which is the goal anyway.
    if let Err(e) = run_all(&unload) {
        eprintln!("stagefs: {e:#}");
    }
    std::fs::remove_file(&file).with_context(|| format!("removing {}", file.display()))?;
    println!("removed {}", file.display());
    Ok(())
}

fn status(config: &Config) -> anyhow::Result<()> {
    let (file, _) = manager::uninstall_plan()?;
    if file.exists() {
        println!("service: installed ({})", file.display());
        println!("state:   {}", manager::state());
    } else {
        println!("service: not installed (`stagefs service install` adds it)");
    }
    let cache_dir = config.cache_dir(None)?;
    match stagefs_mount::live_mount(&cache_dir)? {
        Some((source, mountpoint)) => println!(
            "mount:   {} is up, serving {}",
            mountpoint.display(),
            source.display()
        ),
        None => println!("mount:   not running for cache {}", cache_dir.display()),
    }
    Ok(())
}

fn print_commands(prefix: &str, commands: &[Vec<String>]) {
    for command in render(commands) {
        println!("{prefix}: {command}");
    }
}

fn render(commands: &[Vec<String>]) -> Vec<String> {
    commands.iter().map(|c| c.join(" ")).collect()
}

/// Runs each command in turn; the first failure stops and names the command.
fn run_all(commands: &[Vec<String>]) -> anyhow::Result<()> {
    for command in commands {
        output_of(command)?;
    }
    Ok(())
}

/// Runs `command` and returns its stdout; a failure carries its stderr.
pub(crate) fn output_of(command: &[String]) -> anyhow::Result<String> {
    let (status, stdout, stderr) = answer_of(command)?;
    if !status.success() {
        bail!("`{}` failed: {stderr}", command.join(" "));
    }
    Ok(stdout)
}

/// Runs `command` and returns its status, stdout and stderr (trimmed), for commands
/// like `systemctl is-active` whose answer is in stdout whatever the status.
pub(crate) fn answer_of(command: &[String]) -> anyhow::Result<(ExitStatus, String, String)> {
    let (program, args) = command.split_first().context("empty command")?;
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("`{}` could not be started", command.join(" ")))?;
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).trim().to_string();
    Ok((out.status, text(&out.stdout), text(&out.stderr)))
}

#[cfg(test)]
pub(crate) fn sample() -> Service {
    Service {
        exe: "/opt/stage fs/bin/stagefs".into(),
        config: "/home/ann/.config/stagefs/config.toml".into(),
        source: "/mnt/nas/hub".into(),
        mountpoint: "/home/ann/hf".into(),
        log: "/home/ann/.cache/stagefs/stagefs.log".into(),
        backend: None,
        up: false,
    }
}
