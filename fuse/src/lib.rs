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
use stagefs_policy::FsConfig;

pub use fuse::StageFs;

/// The fuser session configuration for a mount of `source` configured by `config`.
pub fn session_config(config: &FsConfig, source: &std::path::Path) -> Config {
    let mut mount_options = vec![
        MountOption::RO,
        MountOption::FSName(fs_name_for(&config.fs_name, source)),
        MountOption::Subtype("stagefs".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
    ];
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
