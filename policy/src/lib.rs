//! What a stagefs mount answers, in no kernel protocol's terms: the [`Policy`] decides
//! every lookup, attribute, listing, open and read, and how each behaves while the
//! source is slow or gone. The FUSE adapter (`stagefs-fuse`) and the NFS adapter
//! (`stagefs-nfs`) only translate their protocol to its calls and its answers back;
//! errors become errno in one place ([`FsError::errno`]).
//!
//! Invariant (the staging contract): no byte of a file of at least
//! [`FsConfig::min_stage_size`] reaches a reader before a whole, verified copy of
//! exactly the version looked up is committed in the cache.

mod attr;
mod error;
pub mod finder;
mod handles;
mod inodes;
pub mod links;
mod policy;
mod redirect;
mod taint;
mod tee;

use std::time::Duration;

use stagefs_control::Remedy;
use stagefs_stage::defaults;

pub use attr::Attr;
pub use error::FsError;
pub use handles::{DirEntry, Keepalive};
pub use inodes::ROOT_INO;
pub use policy::{Caller, Listing, Opened, Policy, RenameHow, SetAttr, backing_file};

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
    /// Refuse the names the macOS Finder and Spotlight probe for (`._*`,
    /// `.DS_Store`...) without asking the source, and leave them out of listings.
    pub hide_finder_files: bool,
    /// Refuse every change with EROFS: a mount that only reads.
    pub read_only: bool,
    /// Whether the daemon serving the mount runs as root; by default, whether this
    /// process does. A mount served by root presents no links to copies
    /// ([`FsConfig::redirects_allowed`]).
    pub served_by_root: bool,
    /// On an NFS mount whose client runs on this machine, present HF blobs as links
    /// whose text names their local copy once staged (see `links.rs`).
    pub nfs_links: bool,
}

impl FsConfig {
    /// Whether staged files may be presented as links to their copies. Not with
    /// `allow_other` (other users could not follow a link into a private cache), and
    /// not on a mount served by root: an open for writing follows a link out of the
    /// mount, into the copy, so a write lands there, not on the source, and root's
    /// writes ignore the copy's 0400 (an ordinary user's are refused with EACCES; see
    /// "Write path" in docs/DESIGN.md). That holds for a `--read-only` mount too: the
    /// link leads past it.
    pub fn redirects_allowed(&self) -> bool {
        self.redirect && !self.allow_other && !self.served_by_root
    }

    /// Whether blobs may be presented as NFS links (`links.rs`): asked for, and for
    /// the reasons [`FsConfig::redirects_allowed`] gives, neither shared with other
    /// users nor served by root.
    pub fn nfs_links_allowed(&self) -> bool {
        self.nfs_links && !self.allow_other && !self.served_by_root
    }
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
            hide_finder_files: cfg!(target_os = "macos"),
            read_only: defaults::READ_ONLY,
            // SAFETY: geteuid has no preconditions and cannot fail.
            served_by_root: unsafe { libc::geteuid() } == 0,
            nfs_links: false,
        }
    }
}

/// How reads of staged files are served, decided before the first file is read (by
/// the adapter: FUSE probes passthrough, the NFS server always reads the copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadPath {
    /// The kernel reads the copy itself (FUSE passthrough).
    Passthrough,
    /// A staged file is presented as a link to its copy, which the kernel opens.
    Links,
    /// The daemon reads the copy for every request.
    Daemon,
    /// The NFS server reads the copy for every READ.
    NfsServer,
    /// Blobs are NFS links whose text names the local copy once staged; other files
    /// are read by the NFS server.
    NfsLinks,
}

impl ReadPath {
    /// How it is said everywhere (log, `status`, `doctor`).
    pub fn describe(self) -> &'static str {
        match self {
            ReadPath::Passthrough => "read by the kernel through FUSE passthrough",
            ReadPath::Links => "presented as links to their local copies",
            ReadPath::Daemon => "read through the daemon",
            ReadPath::NfsServer => "read from their local copies by the NFS server",
            ReadPath::NfsLinks => {
                "read by the kernel from their local copies through links (blobs), or by the NFS server (other files)"
            }
        }
    }
}
