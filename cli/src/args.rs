//! The command line. Only this module knows about clap; it converts flags into the
//! library's plain configuration structs.

use clap::{ArgGroup, Args, CommandFactory, Parser, Subcommand, ValueEnum};
use stagefs_control::units::format_duration;
use stagefs_control::{Backend, Remedy};
use stagefs_policy::OnFull;
use stagefs_stage::defaults;
use std::path::PathBuf;

use crate::units::{format_bytes, parse_duration, parse_listen, parse_size, parse_source_dir};

/// The command line, with the default of each mount option (from the defaults table
/// the config file falls back to) shown in its help.
pub(crate) fn command() -> clap::Command {
    Cli::command()
        .mut_subcommand("mount", show_defaults)
        .mut_subcommand("run", show_defaults)
        .mut_subcommand("serve", |serve| show_defaults(hide_fuse_only(serve)))
}

/// The argument ids of the mount options only a FUSE mount has
/// ([`MountOptions::fuse_only_flags`]).
const FUSE_ONLY: [&str; 4] = [
    "no_passthrough",
    "no_redirect",
    "redirect_grace",
    "allow_other",
];

/// `serve` keeps the FUSE-only flags (so that giving one is refused with a reason,
/// not as an unknown argument) but does not list them.
fn hide_fuse_only(command: clap::Command) -> clap::Command {
    FUSE_ONLY.into_iter().fold(command, |command, id| {
        command.mut_arg(id, |arg| arg.hide(true))
    })
}

/// Each mount option that has a default, by argument id, and the default as shown.
/// Flags are optional rather than defaulted in clap, so that the config file can
/// fill in what they leave out; the defaults apply only after both.
pub(crate) fn mount_defaults() -> [(&'static str, String); 8] {
    let on_full = OnFullArg::from(OnFull::default());
    [
        ("min_stage_size", format_bytes(defaults::MIN_STAGE_SIZE)),
        ("redirect_grace", format_duration(defaults::REDIRECT_GRACE)),
        ("max_size", "no limit besides --min-free".into()),
        (
            "min_free",
            format!(
                "{}% of the volume, at most {}",
                defaults::MIN_FREE_PERCENT,
                format_bytes(defaults::MIN_FREE_CAP)
            ),
        ),
        ("on_full", on_full.name().into()),
        (
            "prefetch_parallel",
            format!(
                "{} from a network source, one per core (at most {}) from a local disk",
                defaults::PREFETCH_PARALLEL,
                defaults::LOCAL_PREFETCH_PARALLEL_MAX
            ),
        ),
        ("copy_streams", defaults::COPY_STREAMS.to_string()),
        ("source_timeout", format_duration(defaults::SOURCE_TIMEOUT)),
    ]
}

fn show_defaults(command: clap::Command) -> clap::Command {
    mount_defaults()
        .into_iter()
        .fold(command, |command, (id, shown)| {
            command.mut_arg(id, |arg| {
                let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
                arg.help(format!("{help} [default: {shown}]"))
            })
        })
}

/// Arguments that parse but cannot go together, found after parsing: reported as
/// clap's own usage errors are, exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct UsageError(pub(crate) String);

/// The flag to try for a condition the core reports, added to its message.
pub(crate) fn flag_hint(remedy: Remedy) -> &'static str {
    match remedy {
        Remedy::MoreRoom => {
            "raise --max-size, lower --min-free, free disk space, or close models in use"
        }
        Remedy::LongerSourceTimeout => "raise --source-timeout if the source is only slow",
        Remedy::NoRevision => "drop --revision",
    }
}

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
    /// Also show where each file lies in the source (a blob's hash).
    #[arg(short, long, global = true)]
    pub(crate) verbose: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Mount SOURCE (e.g. a HuggingFace cache on a NAS) at MOUNTPOINT: reads are staged to
    /// the local cache, writes pass through to SOURCE (--read-only refuses them).
    Mount(MountArgs),
    /// Serve SOURCE over NFSv3 on a loopback port in the foreground, without mounting
    /// it; the first line on stdout is the export's URL (for libnfs clients).
    Serve(ServeArgs),
    /// Unmount a stagefs mount.
    Unmount(UnmountArgs),
    /// Run a command against the mount: mount if needed, stage models, then run it
    /// with the HF variables the source's shape needs (HF_HOME and
    /// HF_HUB_CACHE for an HF_HOME, HF_HUB_CACHE for a hub cache, none for plain
    /// folders) pointing at the mount; --offline (and a --read-only mount) also sets
    /// HF_HUB_OFFLINE=1.
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
    pub(crate) backend: BackendOption,
    #[command(flatten)]
    pub(crate) options: MountOptions,
    /// Stay in the foreground and log to stderr.
    #[arg(long)]
    pub(crate) foreground: bool,
    /// Internal: report readiness on stdout (used when daemonizing).
    #[arg(long, hide = true)]
    pub(crate) notify_ready: bool,
    /// Internal: the launcher cleared a stale mount here, for the daemon's log.
    #[arg(long, hide = true)]
    pub(crate) cleared_stale_mount: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// The directory to mirror [default: `source` in the config file].
    pub(crate) source: Option<PathBuf>,
    /// Where to listen: a loopback address or host name and a port (127.0.0.1:2049,
    /// localhost:0); port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:0", value_parser = parse_listen)]
    pub(crate) listen: std::net::SocketAddr,
    /// Present staged HF blobs as links to their local copies, so the client's kernel
    /// reads them itself (as an NFS mount made by `stagefs mount` does). Only for an NFS
    /// client on this machine, mounted by the user serving: the links name paths
    /// of this machine's cache.
    #[arg(long)]
    pub(crate) links: bool,
    #[command(flatten)]
    pub(crate) options: MountOptions,
}

/// How a mount reaches the kernel (`--backend`, `backend` in the config file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum BackendArg {
    /// A FUSE filesystem (fuse3 on Linux; macFUSE's kernel extension on macOS).
    Fuse,
    /// A loopback NFSv3 server mounted with the system's NFS client: no kernel
    /// extension on macOS.
    Nfs,
}

impl BackendArg {
    /// The backend used when neither the flag nor the config file picks one: NFS on
    /// macOS (no kernel extension to install), FUSE elsewhere.
    pub(crate) fn platform_default() -> Backend {
        if cfg!(target_os = "macos") {
            Backend::Nfs
        } else {
            Backend::Fuse
        }
    }

    /// The mount's backend.
    pub(crate) fn backend(self) -> Backend {
        match self {
            BackendArg::Fuse => Backend::Fuse,
            BackendArg::Nfs => Backend::Nfs,
        }
    }
}

/// `--backend`, which `mount` and `run` take; `serve` is always NFS and has none.
#[derive(Debug, Clone, Copy, Default, Args)]
pub(crate) struct BackendOption {
    /// How the mount reaches the kernel [default: nfs on macOS, fuse elsewhere].
    #[arg(long, value_enum)]
    pub(crate) backend: Option<BackendArg>,
}

impl MountArgs {
    /// The mount options, with the backend.
    pub(crate) fn options(&self) -> MountOptions {
        self.options.with(self.backend)
    }
}

impl RunArgs {
    /// The mount options, with the backend.
    pub(crate) fn options(&self) -> MountOptions {
        self.options.with(self.backend)
    }
}

/// How a mount behaves. Every flag overrides the config file's key of the same name;
/// what neither sets takes the default shown.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct MountOptions {
    /// Set from [`BackendOption`] by the commands that take `--backend`.
    #[arg(skip)]
    pub(crate) backend: Option<BackendArg>,
    /// Local cache directory [default: $XDG_CACHE_HOME/stagefs or ~/.cache/stagefs;
    /// ~/Library/Caches/stagefs on macOS].
    #[arg(long)]
    pub(crate) cache_dir: Option<PathBuf>,
    /// Files at least this large are copied to the cache when opened.
    #[arg(long, value_parser = parse_size)]
    pub(crate) min_stage_size: Option<u64>,
    /// Do not use kernel passthrough (Linux 6.9+ as root), even where it works:
    /// staged files are then presented as links to their local copies on a
    /// --read-only mount, and read through the daemon on a writable one (root's
    /// writes through a link would land in the copy) or with --no-redirect.
    #[arg(long)]
    pub(crate) no_passthrough: bool,
    /// Where kernel passthrough is not used (macOS, an ordinary user, --no-passthrough),
    /// read staged files through the daemon instead of presenting them as links to
    /// their local copies.
    #[arg(long)]
    pub(crate) no_redirect: bool,
    /// How long a copy whose link was just followed counts as in use and is not
    /// evicted (a number and s, m, h, d or w: 10s, 2m, 1h30m).
    #[arg(long, value_parser = parse_duration)]
    pub(crate) redirect_grace: Option<u64>,
    /// Most bytes of staged copies to keep (500G, 1.5T, ...).
    #[arg(long, value_parser = parse_size)]
    pub(crate) max_size: Option<u64>,
    /// Free space to leave on the cache volume (50G, 0, ...).
    #[arg(long, value_parser = parse_size)]
    pub(crate) min_free: Option<u64>,
    /// When a file cannot fit in the cache: fail the open with ENOSPC, or read it
    /// from the source with a warning.
    #[arg(long, value_enum)]
    pub(crate) on_full: Option<OnFullArg>,
    /// Do not stage a snapshot's other weight files when one of its files is opened.
    #[arg(long, conflicts_with = "prefetch_parallel")]
    pub(crate) no_prefetch: bool,
    /// Files a prefetch copies at a time. From a network source one already keeps
    /// --copy-streams reads in flight; from a local disk parallel copies keep the disk and
    /// the cores busier.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(crate) prefetch_parallel: Option<u16>,
    /// Reads in flight while copying one file.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(crate) copy_streams: Option<u16>,
    /// A source operation, or a copy that stops making progress, fails with EIO
    /// after this long instead of hanging (a number and s, m, h, d or w: 45s, 2m, 1h30m;
    /// 0 counts as 1s, the shortest).
    #[arg(long, value_parser = parse_duration)]
    pub(crate) source_timeout: Option<u64>,
    /// Let other users read through the mount (FUSE's allow_other; non-root users
    /// need `user_allow_other` in /etc/fuse.conf).
    #[arg(long)]
    pub(crate) allow_other: bool,
    /// Refuse every change through the mount with EROFS (read-only file system).
    /// Otherwise creates, writes, renames,
    /// removals, chmod and utimes pass through to the source.
    #[arg(long)]
    pub(crate) read_only: bool,
    /// A directory inside the source, relative to it, where models lie deeper than
    /// the root, `hub/` and 4 levels down are searched; repeat for more.
    #[arg(long = "model-dir", value_name = "DIR", value_parser = parse_source_dir)]
    pub(crate) model_dirs: Vec<PathBuf>,
}

impl MountOptions {
    /// The flags given that only a FUSE mount has, as typed.
    pub(crate) fn fuse_only_flags(&self) -> Vec<&'static str> {
        let given = [
            (self.no_passthrough, "--no-passthrough"),
            (self.no_redirect, "--no-redirect"),
            (self.redirect_grace.is_some(), "--redirect-grace"),
            (self.allow_other, "--allow-other"),
        ];
        given
            .into_iter()
            .filter_map(|(given, flag)| given.then_some(flag))
            .collect()
    }

    fn with(&self, backend: BackendOption) -> MountOptions {
        MountOptions {
            backend: backend.backend,
            ..self.clone()
        }
    }
}

/// `--on-full` values (`on_full` in the config file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum OnFullArg {
    /// Fail the open with ENOSPC.
    Fail,
    /// Read the file from the source, through the daemon.
    ReadSource,
    /// The old name of `read-source`: "passthrough" now means only kernel passthrough.
    #[value(hide = true)]
    Passthrough,
}

impl OnFullArg {
    /// The spelling users write.
    pub(crate) fn name(self) -> &'static str {
        match self {
            OnFullArg::Fail => "fail",
            OnFullArg::ReadSource => "read-source",
            OnFullArg::Passthrough => "passthrough",
        }
    }

    /// What the mount does; the old spelling means `read-source`.
    pub(crate) fn on_full(self) -> OnFull {
        match self {
            OnFullArg::Fail => OnFull::Fail,
            OnFullArg::ReadSource | OnFullArg::Passthrough => OnFull::ReadSource,
        }
    }

    /// Whether this is a deprecated spelling, which earns a warning.
    pub(crate) fn is_deprecated(self) -> bool {
        self == OnFullArg::Passthrough
    }
}

impl From<OnFull> for OnFullArg {
    fn from(on_full: OnFull) -> Self {
        match on_full {
            OnFull::Fail => OnFullArg::Fail,
            OnFull::ReadSource => OnFullArg::ReadSource,
        }
    }
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
    /// Only this model (org/name, a folder's path or the end of it), with its cached files.
    pub(crate) model: Option<String>,
    /// List each model's cached files.
    #[arg(long)]
    pub(crate) files: bool,
    /// Print the report as JSON: `{"mounts": [...]}`, one report per cache.
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
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct VerifyArgs {
    #[command(flatten)]
    pub(crate) cache: CacheDirArg,
    /// Only this model id (org/name), or a file path inside the mount or the source.
    pub(crate) target: Option<String>,
    /// Drop copies that do not match, and those the source has moved past, so they
    /// are staged again on the next open.
    #[arg(long)]
    pub(crate) repair: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
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
    /// Files copied at a time [default: 2; through a running mount, as many as it
    /// copies at a time (its --prefetch-parallel, else by the source's kind)].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(crate) parallel: Option<u16>,
    /// Only list what would be copied and what is staged already; copy nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Print every file's outcome as JSON at the end, instead of progress and lines.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct UnmountArgs {
    /// The mount point [default: `mountpoint` in the config file].
    pub(crate) mountpoint: Option<PathBuf>,
    /// Detach now even if files are open; the mount goes away when they are closed.
    #[arg(long)]
    pub(crate) lazy: bool,
    /// Abort a hung mount's pending requests and unmount it (Linux, as root; on
    /// macOS what --lazy does).
    #[arg(long, conflicts_with = "lazy")]
    pub(crate) force: bool,
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
    pub(crate) backend: BackendOption,
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
    /// Set HF_HUB_OFFLINE=1 for COMMAND: loads never ask the Hub, names resolve
    /// through the cache's refs/ [always so on a read-only mount].
    #[arg(long)]
    pub(crate) offline: bool,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn help_of(subcommand: &str) -> String {
        let mut command = command();
        command
            .find_subcommand_mut(subcommand)
            .expect("subcommand")
            .render_help()
            .to_string()
    }

    #[test]
    fn help_shows_the_defaults_table() {
        for subcommand in ["mount", "run"] {
            let help = help_of(subcommand);
            for (id, shown) in mount_defaults() {
                assert!(
                    help.contains(&format!("[default: {shown}]")),
                    "{id} in {help}"
                );
            }
            assert!(help.contains("[default: 1.0 MiB]"), "{help}");
            assert!(help.contains("[default: 30s]"), "{help}");
            assert!(
                help.contains("[default: 10% of the volume, at most 50.0 GiB]"),
                "{help}"
            );
            assert!(help.contains("[default: fail]"), "{help}");
            assert!(
                help.contains("[possible values: fail, read-source]"),
                "{help}"
            );
        }
        let help = help_of("prefetch");
        let parallel = defaults::PREFETCH_COMMAND_PARALLEL;
        assert!(help.contains(&format!("[default: {parallel};")), "{help}");
    }

    #[test]
    fn serve_shows_its_defaults_and_not_the_fuse_only_flags() {
        let help = help_of("serve");
        assert!(help.contains("[default: 30s]"), "{help}");
        assert!(help.contains("[default: fail]"), "{help}");
        for flag in [
            "--no-passthrough",
            "--no-redirect",
            "--redirect-grace",
            "--allow-other",
        ] {
            assert!(!help.contains(flag), "{flag} in {help}");
        }
        let mount = help_of("mount");
        assert!(mount.contains("--allow-other"), "{mount}");
    }

    #[test]
    fn the_shown_defaults_read_back_as_the_table_says() {
        assert_eq!(
            parse_size(&format_bytes(defaults::MIN_STAGE_SIZE)),
            Ok(defaults::MIN_STAGE_SIZE)
        );
        let timeout = format_duration(defaults::SOURCE_TIMEOUT);
        assert_eq!(
            parse_duration(&timeout),
            Ok(defaults::SOURCE_TIMEOUT.as_secs())
        );
    }

    fn on_full_flag(value: &str) -> Result<Option<OnFullArg>, clap::Error> {
        let matches =
            command().try_get_matches_from(["stagefs", "mount", "/s", "/m", "--on-full", value])?;
        match clap::FromArgMatches::from_arg_matches(&matches)? {
            Cli {
                command: Command::Mount(args),
                ..
            } => Ok(args.options.on_full),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn on_full_read_source_and_its_old_spelling() {
        let new = on_full_flag("read-source").expect("read-source");
        assert_eq!(new, Some(OnFullArg::ReadSource));
        let old = on_full_flag("passthrough").expect("the old spelling still parses");
        assert_eq!(old, Some(OnFullArg::Passthrough));
        for arg in [OnFullArg::ReadSource, OnFullArg::Passthrough] {
            assert_eq!(arg.on_full(), OnFull::ReadSource);
        }
        assert!(!OnFullArg::ReadSource.is_deprecated() && OnFullArg::Passthrough.is_deprecated());
        assert_eq!(on_full_flag("fail").expect("fail"), Some(OnFullArg::Fail));
        assert!(on_full_flag("maybe").is_err());
    }

    #[test]
    fn help_says_what_run_sets_and_what_the_read_flags_do() {
        let mut top = command();
        let help = top.render_help().to_string();
        let run = help
            .lines()
            .find(|l| l.trim_start().starts_with("run"))
            .unwrap_or_default();
        assert!(
            run.contains("HF_HOME") && run.contains("HF_HUB_CACHE"),
            "{help}"
        );
        let mount = help_of("mount");
        assert!(
            mount.contains("staged files are then presented as links to their local copies"),
            "{mount}"
        );
        assert!(
            !mount.contains("from the daemon instead of kernel passthrough"),
            "{mount}"
        );
    }

    #[test]
    fn hints_name_the_flags() {
        assert!(flag_hint(Remedy::MoreRoom).starts_with("raise --max-size"));
        assert!(flag_hint(Remedy::LongerSourceTimeout).contains("--source-timeout"));
        assert!(flag_hint(Remedy::NoRevision).contains("--revision"));
    }
}
