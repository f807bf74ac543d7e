//! The life of one stagefs mount, as a library: check that a mount can work, recover a
//! mount point left stale by a crashed daemon, open the cache, start the control
//! socket, mount FUSE, serve, and stop. The `stagefs` binary is one user of it; tests
//! and other programs start a mount in-process with [`Running::start`]:
//!
//! ```no_run
//! use stagefs_mount::{MountSpec, Running};
//!
//! let spec = MountSpec::new("/mnt/nas/hub", "/tmp/hub-mirror", "/var/tmp/stagefs-cache");
//! let running = Running::start(&spec)?; // mounted and serving on threads of its own
//! let config = std::fs::read("/tmp/hub-mirror/models--org--name/refs/main")?;
//! running.stop()?; // unmounted; the mount point is a plain directory again
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Around it: [`live_mount`] asks a cache directory's control socket which mount it
//! serves; [`cache_dir`] sends a request to that mount, or works on the directory
//! itself when none runs; [`bounded`] asks questions about paths that may lie on a
//! dead share in a child process under a deadline; [`unmount()`] unmounts a mount of ours
//! (and only one: [`table`] and [`registry`] tell ours from anything else mounted).
//! [`admin`] answers status, evict and verify over a cache (for a running mount's
//! control socket, or for the CLI on a cache no mount serves), and [`prefetch_plan`]
//! turns a `stagefs prefetch` request into the files to stage.
//!
//! Errors are typed ([`MountError`], [`CacheDirError`], [`UnmountError`]) and
//! describe the condition; a caller with flags to offer (the CLI) adds what to try.
//!
//! Dependencies flow one way: `stagefs-source` <- `stagefs-store`, `stagefs-layout` <-
//! `stagefs-stage` <- `stagefs-policy` <- `stagefs-fuse`, `stagefs-nfs` <- this crate <- `stagefs`.

pub mod admin;
pub mod away;
pub mod bounded;
pub mod cache_dir;
mod checks;
mod control;
mod error;
mod live;
pub mod offline;
pub mod place;
pub mod prefetch_plan;
pub mod registry;
mod running;
mod source_record;
mod spec;
pub mod table;
pub mod unmount;

pub use cache_dir::CacheDirError;
pub use checks::Checked;
pub use error::MountError;
pub use live::{live_mount, mounted};
pub use place::{SourcePlace, open_source};
pub use running::Running;
pub use spec::MountSpec;
pub use unmount::{How as UnmountHow, unmount_how};
pub use unmount::{UnmountError, Unmounted, unmount};
