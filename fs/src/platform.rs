//! Mount options that differ per platform.

use fuser::MountOption;

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
