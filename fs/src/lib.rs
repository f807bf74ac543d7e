//! The FUSE adapter of stagefs: a read-only mirror of a source tree whose large files
//! are staged into the local cache when opened.
//!
//! Handlers never do I/O on the request loop: source operations run on the runtime's
//! blocking pool and opens await the stager, so a long copy never stalls `ls`, `stat`
//! or reads of other files (macFUSE runs a single request loop and kills volumes whose
//! requests outlive `daemon_timeout`).

mod attr;
mod error;
mod fuse;
mod handles;
mod inodes;
mod passthrough;
mod platform;
mod policy;
mod redirect;

use std::path::PathBuf;
use std::time::Duration;

use fuser::{Config, MountOption, SessionACL};
use stagefs_cache::{Remedy, defaults};

pub use error::FsError;
pub use fuse::StageFs;

/// How a mount behaves; built by the CLI from its flags.
#[derive(Debug, Clone)]
pub struct FsConfig {
    /// Files at least this large are staged on open; smaller ones are read from the source.
    pub min_stage_size: u64,
    /// Use kernel passthrough for staged files when the kernel allows it.
    pub passthrough: bool,
    /// Where passthrough is not in use, present staged files as links to their local
    /// copies, so the kernel reads the copies directly (see `redirect.rs`).
    pub redirect: bool,
    /// How long the kernel may cache names and attributes.
    pub attr_ttl: Duration,
    /// Shown as the filesystem name in the mount table.
    pub fs_name: String,
    /// What to do with a file the cache cannot make room for.
    pub on_full: OnFull,
    /// Opening a file prefetches its snapshot's other weight files.
    pub prefetch: bool,
    /// Copies at a time when prefetching; None: by the source's kind (one from a
    /// network, one per core from a local disk; `defaults::prefetch_parallel`).
    pub prefetch_parallel: Option<usize>,
    /// Let users other than the mounting one in.
    pub allow_other: bool,
    /// How long a source operation (or a copy that stopped making progress) may take
    /// before the request fails with EIO instead of hanging.
    pub source_timeout: Duration,
    /// How the front end tells a user to avoid an error the mount logs (the CLI
    /// names the flag to try); None: the core's description of the condition alone.
    pub hint: Option<fn(Remedy) -> &'static str>,
}

/// What an open does when the cache budget cannot make room for the file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnFull {
    /// Fail the open with ENOSPC (the default: a file is served from a complete local
    /// copy or not at all, unless the user chose otherwise).
    #[default]
    Fail,
    /// Serve the file straight from the source (read through the daemon), with a
    /// warning. Not to be confused with kernel passthrough of staged copies.
    ReadSource,
}

impl Default for FsConfig {
    fn default() -> Self {
        FsConfig {
            min_stage_size: defaults::MIN_STAGE_SIZE,
            passthrough: defaults::PASSTHROUGH,
            redirect: defaults::REDIRECT,
            attr_ttl: Duration::from_secs(1),
            fs_name: "stagefs".into(),
            on_full: OnFull::default(),
            prefetch: defaults::PREFETCH,
            prefetch_parallel: None,
            allow_other: defaults::ALLOW_OTHER,
            source_timeout: defaults::SOURCE_TIMEOUT,
            hint: None,
        }
    }
}

/// How reads of staged files are served, decided before the first file is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadPath {
    /// The kernel reads the copy itself (FUSE passthrough).
    Passthrough,
    /// A staged file is presented as a link to its copy, which the kernel opens.
    Links,
    /// The daemon reads the copy for every request.
    Daemon,
}

impl ReadPath {
    /// How it is said everywhere (log, `status`, `doctor`).
    pub fn describe(self) -> &'static str {
        match self {
            ReadPath::Passthrough => "read by the kernel through FUSE passthrough",
            ReadPath::Links => "presented as links to their local copies",
            ReadPath::Daemon => "read through the daemon",
        }
    }
}

impl FsConfig {
    /// How this mount will serve staged files in this process, and why not by
    /// passthrough when not: asked of the kernel version and this process's
    /// capabilities, so no open has to find out. Redirects are off with
    /// `allow_other` (other users could not follow links into a private cache).
    pub fn read_path(&self) -> (ReadPath, Option<&'static str>) {
        let why_not = match self.passthrough {
            false => Some("turned off (--no-passthrough)"),
            true => passthrough::unavailable(),
        };
        let Some(why_not) = why_not else {
            return (ReadPath::Passthrough, None);
        };
        match self.redirect && !self.allow_other {
            true => (ReadPath::Links, Some(why_not)),
            false => (ReadPath::Daemon, Some(why_not)),
        }
    }

    /// The one line that says how staged files are served and why.
    pub fn describe_read_path(&self) -> String {
        match self.read_path() {
            (path, None) => format!("staged files are {}", path.describe()),
            (path, Some(why)) => format!(
                "staged files are {} (kernel passthrough: {why})",
                path.describe()
            ),
        }
    }

    /// The fuser session configuration for a mount of `source`.
    pub fn session_config(&self, source: &std::path::Path) -> Config {
        let mut mount_options = vec![
            MountOption::RO,
            MountOption::FSName(fs_name_for(&self.fs_name, source)),
            MountOption::Subtype("stagefs".into()),
            MountOption::DefaultPermissions,
            MountOption::NoAtime,
        ];
        mount_options.extend(platform::mount_options());
        let mut config = Config::default();
        config.mount_options = mount_options;
        config.acl = if self.allow_other {
            SessionACL::All
        } else {
            SessionACL::Owner
        };
        config
    }
}

fn fs_name_for(name: &str, source: &std::path::Path) -> String {
    // Commas would split the mount option string.
    let source: PathBuf = source.into();
    format!("{name}:{}", source.display()).replace(',', "_")
}
