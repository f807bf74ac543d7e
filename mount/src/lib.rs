//! The life of one stagefs mount, as a library: check that a mount can work, recover a
//! mount point left stale by a crashed daemon, open the cache, start the control
//! socket, mount FUSE, serve, and stop. The `stagefs` binary is one user of it; tests
//! and other programs start a mount in-process with [`Running::start`].
//!
//! Errors are [`MountError`]s that describe the condition; a caller with flags to
//! offer (the CLI) adds what to try.
//!
//! Dependencies flow one way: `stagefs-cache` <- `stagefs-fs` <- this crate <- `stagefs`.

pub mod bounded;
pub mod cache_dir;
mod checks;
mod control;
mod error;
mod live;
mod running;
mod spec;
pub mod unmount;

pub use cache_dir::CacheDirError;
pub use checks::Checked;
pub use error::MountError;
pub use live::live_mount;
pub use running::Running;
pub use spec::MountSpec;
pub use unmount::{UnmountError, unmount};
