//! The command line. Only this module knows about clap; it converts flags into the
//! library's plain configuration structs.

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

use crate::units::{parse_duration, parse_size, parse_source_dir};

/// Mount a slow HuggingFace cache and serve every opened weight file from a complete
/// local copy.
#[derive(Debug, Parser)]
#[command(name = "stagefs", version, about)]
pub(crate) struct Cli {
    /// Config file [default: $STAGEFS_CONFIG, else ~/.config/stagefs/config.toml].
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Ignore the config file.
    #[arg(long, global = true, conflicts_with = "config")]
    pub(crate) no_config: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Mount SOURCE (e.g. a HuggingFace cache on a NAS) read-only at MOUNTPOINT.
    Mount(MountArgs),
    /// Unmount a stagefs mount.
    Unmount(UnmountArgs),
    /// Run a command against the mount: mount if needed, stage models, then run it
    /// offline with HF_HUB_CACHE pointing at the mount.
    Run(RunArgs),
    /// Check FUSE, the source, the cache volume and the environment, and say what to fix.
    Doctor(DoctorArgs),
    /// Start the configured mount at login (a launchd agent or a systemd user unit).
    #[command(subcommand)]
    Service(ServiceCommand),
    /// Show cache usage, models, and a running mount's activity.
    Status(StatusArgs),
    /// Drop staged copies to free space.
    Evict(EvictArgs),
    /// Re-hash staged copies and report (or repair) any that do not match.
    Verify(VerifyArgs),
    /// Stage whole models ahead of time.
    Prefetch(PrefetchArgs),
    /// Generate a small model, mount it, load it through the mount and report.
    Demo(DemoArgs),
    /// Write a synthetic HuggingFace cache (sharded safetensors model) into DIR.
    #[command(hide = true)]
    GenDemo(GenDemoArgs),
}

#[derive(Debug, Args)]
pub(crate) struct MountArgs {
    /// The directory to mirror [default: `source` in the config file].
    pub(crate) source: Option<PathBuf>,
    /// Where to mount it, an existing empty directory [default: `mountpoint` in the
    /// config file].
    pub(crate) mountpoint: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) options: MountOptions,
    /// Stay in the foreground and log to stderr.
    #[arg(long)]
    pub(crate) foreground: bool,
    /// Internal: report readiness on stdout (used when daemonizing).
    #[arg(long, hide = true)]
    pub(crate) notify_ready: bool,
}

/// How a mount behaves. Every flag overrides the config file's key of the same name;
/// what neither sets takes the default shown.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct MountOptions {
    /// Local cache directory [default: $XDG_CACHE_HOME/stagefs or ~/.cache/stagefs;
    /// ~/Library/Caches/stagefs on macOS].
    #[arg(long)]
    pub(crate) cache_dir: Option<PathBuf>,
    /// Files at least this large are copied to the cache when opened [default: 1M].
    #[arg(long, value_parser = parse_size)]
    pub(crate) min_stage_size: Option<u64>,
    /// Serve reads of staged files from the daemon instead of kernel passthrough.
    #[arg(long)]
    pub(crate) no_passthrough: bool,
    /// Serve reads of staged files from the daemon instead of presenting them as links
    /// to their local copies (used where kernel passthrough is not).
    #[arg(long)]
    pub(crate) no_redirect: bool,
    /// How long a copy whose link was just followed counts as in use and is not
    /// evicted (10s, 2m, ...) [default: 30s].
    #[arg(long, value_parser = parse_duration)]
    pub(crate) redirect_grace: Option<u64>,
    /// Most bytes of staged copies to keep [default: no limit besides --min-free].
    #[arg(long, value_parser = parse_size)]
    pub(crate) max_size: Option<u64>,
    /// Free space to leave on the cache volume [default: 10% of the volume, at most 50G].
    #[arg(long, value_parser = parse_size)]
    pub(crate) min_free: Option<u64>,
    /// When a file cannot fit in the cache: fail the open with ENOSPC, or serve it
    /// straight from the source with a warning [default: fail].
    #[arg(long, value_enum)]
    pub(crate) on_full: Option<OnFullArg>,
    /// Do not stage a snapshot's other weight files when one of its files is opened.
    #[arg(long, conflicts_with = "prefetch_parallel")]
    pub(crate) no_prefetch: bool,
    /// Files a prefetch copies at a time; one already keeps --copy-streams reads in
    /// flight [default: 1].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(crate) prefetch_parallel: Option<u16>,
    /// Reads in flight while copying one file [default: 4].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(crate) copy_streams: Option<u16>,
    /// A source operation, or a copy that stops making progress, fails with EIO
    /// after this long instead of hanging (45s, 2m, ...) [default: 30s].
    #[arg(long, value_parser = parse_duration)]
    pub(crate) source_timeout: Option<u64>,
    /// Let other users read through the mount (FUSE's allow_other; non-root users
    /// need `user_allow_other` in /etc/fuse.conf).
    #[arg(long)]
    pub(crate) allow_other: bool,
    /// A directory inside the source, relative to it, where models lie deeper than
    /// the root, `hub/` and 4 levels down are searched; repeat for more.
    #[arg(long = "model-dir", value_name = "DIR", value_parser = parse_source_dir)]
    pub(crate) model_dirs: Vec<PathBuf>,
}

/// `--on-full` values (`on_full` in the config file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum OnFullArg {
    /// Fail the open with ENOSPC.
    Fail,
    /// Read the file from the source.
    Passthrough,
}

/// Where the cache is, for commands that work on it.
#[derive(Debug, Args)]
pub(crate) struct CacheDirArg {
    /// Cache directory [default: `cache_dir` in the config file, else as for `mount`].
    #[arg(long)]
    pub(crate) cache_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    pub(crate) cache: CacheDirArg,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("which").required(true).args(["target", "all", "older_than", "to_size"])))]
pub(crate) struct EvictArgs {
    #[command(flatten)]
    pub(crate) cache: CacheDirArg,
    /// A model id (org/name) or a file path inside the mount or the source.
    pub(crate) target: Option<String>,
    /// Every staged copy.
    #[arg(long)]
    pub(crate) all: bool,
    /// Copies not used for this long (45s, 90m, 12h, 30d, 2w).
    #[arg(long, value_parser = parse_duration)]
    pub(crate) older_than: Option<u64>,
    /// Least recently used copies until the cache holds at most SIZE.
    #[arg(long, value_parser = parse_size)]
    pub(crate) to_size: Option<u64>,
    /// Show what would be dropped without dropping it.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

#[derive(Debug, Args)]
pub(crate) struct VerifyArgs {
    #[command(flatten)]
    pub(crate) cache: CacheDirArg,
    /// Only this model (org/name).
    pub(crate) model: Option<String>,
    /// Drop copies that do not match, so they are staged again on the next open.
    #[arg(long)]
    pub(crate) repair: bool,
}

#[derive(Debug, Args)]
pub(crate) struct PrefetchArgs {
    #[command(flatten)]
    pub(crate) cache: CacheDirArg,
    /// Model ids (org/name) or paths (a snapshot directory or a file) in the mount or the source.
    #[arg(required = true)]
    pub(crate) targets: Vec<String>,
    /// Revision of the models: a ref (branch, tag) or a commit [default: main].
    #[arg(long)]
    pub(crate) revision: Option<String>,
    /// Files copied at a time.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(crate) parallel: u16,
}

#[derive(Debug, Args)]
pub(crate) struct UnmountArgs {
    /// The mount point [default: `mountpoint` in the config file].
    pub(crate) mountpoint: Option<PathBuf>,
    /// Detach now even if files are open; the mount goes away when they are closed.
    #[arg(long)]
    pub(crate) lazy: bool,
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The directory to mirror [default: `source` in the config file].
    #[arg(long)]
    pub(crate) source: Option<PathBuf>,
    /// Where to mount it [default: `mountpoint` in the config file].
    #[arg(long)]
    pub(crate) mountpoint: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) options: MountOptions,
    /// Stage this model (org/name) before running; repeat for more.
    #[arg(long = "model", value_name = "ID")]
    pub(crate) models: Vec<String>,
    /// Revision of the models: a ref (branch, tag) or a commit [default: main].
    #[arg(long)]
    pub(crate) revision: Option<String>,
    /// Also set AGX_RELAX_CDM_CTXSTORE_TIMEOUT=1 for COMMAND only, which relaxes the
    /// macOS Metal GPU watchdog for that process.
    #[arg(long)]
    pub(crate) relax_gpu_watchdog: bool,
    /// The command and its arguments (after `--`).
    #[arg(required = true, last = true, value_name = "COMMAND")]
    pub(crate) command: Vec<std::ffi::OsString>,
}

#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// A model id (org/name) in the source, or any path (a source directory, a
    /// model directory, a file) to examine [default: the configured source].
    pub(crate) target: Option<String>,
    #[command(flatten)]
    pub(crate) cache: CacheDirArg,
    /// Print the checks as JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// Internal: run the probes of a parent doctor (its tasks as JSON on stdin, one JSON
    /// line per finished probe on stdout).
    #[arg(long, hide = true)]
    pub(crate) worker: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ServiceCommand {
    /// Write the service file for the configured mount and start it.
    Install(ServiceInstallArgs),
    /// Stop the service and remove its file.
    Uninstall(ServiceUninstallArgs),
    /// Show whether the service is installed and running.
    Status,
}

#[derive(Debug, Args)]
pub(crate) struct ServiceInstallArgs {
    /// Print the service file and the commands instead of installing.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ServiceUninstallArgs {
    /// Print the commands instead of running them.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Number of weight shards to generate.
    #[arg(long, default_value_t = 4)]
    pub(crate) shards: usize,
    /// Size of each shard.
    #[arg(long, default_value = "32M", value_parser = parse_size)]
    pub(crate) shard_size: u64,
}

#[derive(Debug, Args)]
pub(crate) struct GenDemoArgs {
    /// Directory to write the cache into (it becomes an HF_HUB_CACHE).
    pub(crate) dir: PathBuf,
    /// Repository id of the generated model.
    #[arg(long, default_value = "stagefs/demo-model")]
    pub(crate) repo: String,
    /// Number of weight shards.
    #[arg(long, default_value_t = 4)]
    pub(crate) shards: usize,
    /// Size of each shard.
    #[arg(long, default_value = "8M", value_parser = parse_size)]
    pub(crate) shard_size: u64,
}
