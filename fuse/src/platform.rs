//! Mount options that differ per platform.

use fuser::{KernelConfig, MountOption};

/// Options added to every stagefs mount on this platform.
#[cfg(target_os = "macos")]
pub(crate) fn mount_options() -> Vec<MountOption> {
    vec![
        // macFUSE unmounts a volume whose single request outlives daemon_timeout;
        // a cold open of a large shard can legitimately take minutes. 600 s is the maximum.
        MountOption::CUSTOM("daemon_timeout=600".into()),
        // Fewer, larger reads for multi-GiB weight files.
        MountOption::CUSTOM("iosize=1048576".into()),
        // The mirror is read-only; never try to create ._ files.
        MountOption::CUSTOM("noappledouble".into()),
    ]
}

/// Options added to every stagefs mount on this platform.
#[cfg(not(target_os = "macos"))]
pub(crate) fn mount_options() -> Vec<MountOption> {
    // On Linux fuser negotiates the largest max_pages the kernel allows in `init`.
    Vec::new()
}

/// Asks the kernel for the largest reads it allows, so a loader's 32 MiB preads reach
/// the daemon as few large requests (fuser already negotiates the most pages per
/// request), and for enough background requests to keep several readers busy.
pub(crate) fn tune_kernel(config: &mut KernelConfig) {
    if let Err(max) = config.set_max_readahead(u32::MAX) {
        let _ = config.set_max_readahead(max);
    }
    if let Err(max) = config.set_max_background(64) {
        let _ = config.set_max_background(max);
    }
}
