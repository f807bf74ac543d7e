//! The command line. Only this module knows about clap; it converts flags into the
//! library's plain configuration structs.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};
use stagefs_fs::{FsConfig, OnFull};

use crate::units::{parse_duration, parse_size};

/// Mount a slow HuggingFace cache and serve every opened weight file from a complete
/// local copy.
#[derive(Debug, Parser)]
#[command(name = "stagefs", version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Mount SOURCE (e.g. a HuggingFace cache on a NAS) read-only at MOUNTPOINT.
    Mount(MountArgs),
    /// Unmount a stagefs mount.
    Unmount(UnmountArgs),
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
    /// The directory to mirror.
    pub(crate) source: PathBuf,
    /// Where to mount it (an existing, empty directory).
    pub(crate) mountpoint: PathBuf,
    /// Local cache directory [default: $XDG_CACHE_HOME/stagefs or ~/.cache/stagefs;
    /// ~/Library/Caches/stagefs on macOS].
    #[arg(long)]
    pub(crate) cache_dir: Option<PathBuf>,
    /// Stay in the foreground and log to stderr.
    #[arg(long)]
    pub(crate) foreground: bool,
    /// Files at least this large are copied to the cache when opened.
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    pub(crate) min_stage_size: u64,
    /// Serve reads of staged files from the daemon instead of kernel passthrough.
    #[arg(long)]
    pub(crate) no_passthrough: bool,
    /// Most bytes of staged copies to keep [default: no limit besides --min-free].
    #[arg(long, value_parser = parse_size)]
    pub(crate) max_size: Option<u64>,
    /// Free space to leave on the cache volume [default: 10% of the volume, at most 50G].
    #[arg(long, value_parser = parse_size)]
    pub(crate) min_free: Option<u64>,
    /// When a file cannot fit in the cache: fail the open with ENOSPC, or serve it
    /// straight from the source with a warning.
    #[arg(long, value_enum, default_value_t = OnFullArg::Fail)]
    pub(crate) on_full: OnFullArg,
    /// Do not stage a snapshot's other weight files when one of its files is opened.
    #[arg(long, conflicts_with = "prefetch_parallel")]
    pub(crate) no_prefetch: bool,
    /// Files a prefetch copies at a time (one already keeps --copy-streams reads in flight).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(crate) prefetch_parallel: u16,
    /// Reads in flight while copying one file.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(crate) copy_streams: u16,
    /// A source operation, or a copy that stops making progress, fails with EIO
    /// after this long instead of hanging (45s, 2m, ...).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub(crate) source_timeout: u64,
    /// Let other users read through the mount (FUSE's allow_other; non-root users
    /// need `user_allow_other` in /etc/fuse.conf).
    #[arg(long)]
    pub(crate) allow_other: bool,
    /// Internal: report readiness on stdout (used when daemonizing).
    #[arg(long, hide = true)]
    pub(crate) notify_ready: bool,
}

/// `--on-full` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OnFullArg {
    /// Fail the open with ENOSPC.
    Fail,
    /// Read the file from the source.
    Passthrough,
}

/// Where the cache is, for commands that work on it.
#[derive(Debug, Args)]
pub(crate) struct CacheDirArg {
    /// Cache directory [default: as for `mount`].
    #[arg(long)]
    pub(crate) cache_dir: Option<PathBuf>,
}

impl CacheDirArg {
    /// The cache directory: the flag, or the platform default.
    pub(crate) fn resolve(&self) -> anyhow::Result<PathBuf> {
        match &self.cache_dir {
            Some(dir) => Ok(std::path::absolute(dir)?),
            None => crate::paths::default_cache_dir(),
        }
    }
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
    /// The mount point.
    pub(crate) mountpoint: PathBuf,
    /// Detach now even if files are open; the mount goes away when they are closed.
    #[arg(long)]
    pub(crate) lazy: bool,
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

impl MountArgs {
    /// The filesystem configuration these flags ask for.
    pub(crate) fn fs_config(&self) -> FsConfig {
        FsConfig {
            min_stage_size: self.min_stage_size,
            passthrough: !self.no_passthrough,
            attr_ttl: Duration::from_secs(1),
            on_full: match self.on_full {
                OnFullArg::Fail => OnFull::Fail,
                OnFullArg::Passthrough => OnFull::ReadSource,
            },
            prefetch: (!self.no_prefetch).then_some(usize::from(self.prefetch_parallel)),
            allow_other: self.allow_other,
            source_timeout: Duration::from_secs(self.source_timeout.max(1)),
            ..FsConfig::default()
        }
    }

    /// The cache directory: the flag, or the platform default.
    pub(crate) fn cache_dir(&self) -> anyhow::Result<PathBuf> {
        match &self.cache_dir {
            Some(dir) => Ok(dir.clone()),
            None => crate::paths::default_cache_dir(),
        }
    }
}
