//! The FUSE adapter of stagefs: serves a [`stagefs_policy::Policy`] to the kernel
//! through fuser. It translates requests into the policy's calls and its answers into
//! replies, and owns what only FUSE has: kernel passthrough of staged copies, mount
//! options and the session configuration.
//!
//! Handlers never do I/O on the request loop: source operations run on the runtime's
//! blocking pool and opens await the stager, so a long copy never stalls `ls`, `stat`
//! or reads of other files (macFUSE runs a single request loop and kills volumes whose
//! requests outlive `daemon_timeout`).

mod attr;
mod fuse;
mod passthrough;
mod platform;

use std::path::PathBuf;

use fuser::{Config, MountOption, SessionACL};
use stagefs_policy::{FsConfig, ReadPath};

pub use fuse::StageFs;

/// How a FUSE mount configured by `config` will serve staged files in this process,
/// and why not by passthrough when not: asked of the kernel version and this
/// process's capabilities, so no open has to find out. Redirects are off with
/// `allow_other` (other users could not follow links into a private cache) and on a
/// mount served by root ([`FsConfig::redirects_allowed`]).
pub fn read_path(config: &FsConfig) -> (ReadPath, Option<&'static str>) {
    let why_not = match config.passthrough {
        false => Some("turned off (--no-passthrough)"),
        true => passthrough::unavailable(),
    };
    let Some(why_not) = why_not else {
        return (ReadPath::Passthrough, None);
    };
    match config.redirects_allowed() {
        true => (ReadPath::Links, Some(why_not)),
        false => (ReadPath::Daemon, Some(why_not)),
    }
}

/// The one line that says how a FUSE mount serves staged files and why.
pub fn describe_read_path(config: &FsConfig) -> String {
    match read_path(config) {
        (path, None) => format!("staged files are {}", path.describe()),
        (path, Some(why)) => format!(
            "staged files are {} (kernel passthrough: {why})",
            path.describe()
        ),
    }
}

/// The fuser session configuration for a mount of `source` configured by `config`.
pub fn session_config(config: &FsConfig, source: &std::path::Path) -> Config {
    let mut mount_options = vec![
        MountOption::FSName(fs_name_for(&config.fs_name, source)),
        MountOption::Subtype("stagefs".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
    ];
    if config.read_only {
        mount_options.push(MountOption::RO);
    }
    mount_options.extend(platform::mount_options());
    let mut session = Config::default();
    session.mount_options = mount_options;
    session.acl = if config.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    session
}

fn fs_name_for(name: &str, source: &std::path::Path) -> String {
    // Commas would split the mount option string.
    let source: PathBuf = source.into();
    format!("{name}:{}", source.display()).replace(',', "_")
}
