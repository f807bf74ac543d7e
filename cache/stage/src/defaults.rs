//! The defaults of every setting a user can change, in one table: the config file
//! falls back to these, `--help` shows them, and the core's `Default` impls read them.
//! The few that a lower layer reads are defined there and named here.

use std::time::Duration;

pub use stagefs_source::copy::COPY_STREAMS;
pub use stagefs_store::defaults::{MIN_FREE_CAP, MIN_FREE_PERCENT, REDIRECT_GRACE};

/// Files at least this large are staged when opened; smaller ones (configs,
/// tokenizers) are read from the source, where a copy would cost more than it saves.
pub const MIN_STAGE_SIZE: u64 = 1 << 20;

/// How long a source operation, or a copy that stopped making progress, may take
/// before the request fails with EIO instead of hanging on a dead share.
pub const SOURCE_TIMEOUT: Duration = Duration::from_secs(30);

/// Files a mount's prefetch copies at a time from a network source; one copy already
/// keeps [`COPY_STREAMS`] reads in flight, so more mostly splits the same link.
pub const PREFETCH_PARALLEL: usize = 1;

/// The most files a mount's prefetch copies at a time from a local disk, one per
/// core: parallel copies keep the disk's queue and the cores busier than one at a
/// time. A blob's sha256 does not hold its copy up (it follows it), and one copy at
/// a time is slower on the 2-core VM: 0.988 s against 0.806 s for a sequential
/// cold load, and no faster for MLX's pattern (docs/BENCHMARKS.md).
pub const LOCAL_PREFETCH_PARALLEL_MAX: usize = 4;

/// Files a mount's prefetch copies at a time unless configured: [`PREFETCH_PARALLEL`]
/// from a network source, one per core up to [`LOCAL_PREFETCH_PARALLEL_MAX`] from a
/// local disk.
pub fn prefetch_parallel(on_local_disk: bool) -> usize {
    if !on_local_disk {
        return PREFETCH_PARALLEL;
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    cores.clamp(1, LOCAL_PREFETCH_PARALLEL_MAX)
}

/// Files `stagefs prefetch` copies at a time: a user waiting for a whole model
/// gains from overlapping one file's tail with the next file's start.
pub const PREFETCH_COMMAND_PARALLEL: u16 = 2;

/// Staged files are served by kernel passthrough where the kernel allows it.
pub const PASSTHROUGH: bool = true;

/// Where passthrough is not in use, staged files are presented as links to their
/// local copies, so the kernel reads the copies directly.
pub const REDIRECT: bool = true;

/// Opening a file stages the snapshot's other weight files in the background.
pub const PREFETCH: bool = true;

/// Only the mounting user may enter the mount.
pub const ALLOW_OTHER: bool = false;

/// Changes through the mount pass through to the source (`--read-only` refuses them).
pub const READ_ONLY: bool = false;
