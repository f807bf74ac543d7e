//! The command line. Only this module knows about clap; it converts flags into the
//! library's plain configuration structs.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use stagefs_fs::FsConfig;

use crate::units::parse_size;

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
    /// Internal: report readiness on stdout (used when daemonizing).
    #[arg(long, hide = true)]
    pub(crate) notify_ready: bool,
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
