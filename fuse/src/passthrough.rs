//! FUSE passthrough (Linux >= 6.9, CAP_SYS_ADMIN): the kernel reads a staged file's
//! local copy directly, so reads and mmap faults never reach the daemon.
//!
//! The kernel requires every concurrent open of one inode to use the same backing
//! file, so backing ids are shared per inode while any handle holds them.
//! Elsewhere (macOS) this module compiles to a stand-in that never offers passthrough.

#[cfg(target_os = "linux")]
pub(crate) use linux::{Passthrough, unavailable};
#[cfg(not(target_os = "linux"))]
pub(crate) use other::{Passthrough, unavailable};

/// The backing file reference a passthrough handle keeps alive.
pub(crate) type Backing = std::sync::Arc<fuser::BackingId>;

#[cfg(target_os = "linux")]
mod linux {
    use std::collections::HashMap;
    use std::fs::File;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex, Weak};

    use fuser::{BackingId, InitFlags, KernelConfig, ReplyOpen};
    use stagefs_source::locks::lock;
    use tracing::warn;

    use super::Backing;

    /// Backing ids shared per inode, and whether the kernel accepted passthrough.
    #[derive(Debug)]
    pub(crate) struct Passthrough {
        /// Shared with the policy, which keeps files regular while it is set.
        active: Arc<AtomicBool>,
        by_inode: Mutex<HashMap<u64, Weak<BackingId>>>,
    }

    // The cache dir may itself sit on a stacked filesystem (overlayfs in containers).
    const MAX_STACK_DEPTH: u32 = 2;

    /// Why this process cannot use passthrough, probed before mounting so that the
    /// mount serves one way from its first open: the kernel must be 6.9 or newer and
    /// registering backing files needs CAP_SYS_ADMIN. None: it can.
    pub(crate) fn unavailable() -> Option<&'static str> {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
        let mut number = || parts.next().and_then(|p| p.parse::<u32>().ok());
        if (number(), number()) < (Some(6), Some(9)) {
            return Some("the kernel is older than 6.9");
        }
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let caps = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .unwrap_or(0);
        const CAP_SYS_ADMIN: u32 = 21;
        if caps & (1 << CAP_SYS_ADMIN) == 0 {
            return Some("it needs CAP_SYS_ADMIN (root)");
        }
        None
    }

    impl Passthrough {
        /// Passthrough state kept in `active`, the policy's flag.
        pub(crate) fn new(active: Arc<AtomicBool>) -> Self {
            active.store(false, Ordering::Relaxed);
            Passthrough {
                active,
                by_inode: Mutex::default(),
            }
        }

        /// Asks the kernel for passthrough during `init`, if `wanted`.
        pub(crate) fn negotiate(&self, wanted: bool, config: &mut KernelConfig) {
            // The mount said before mounting which way it serves (`FsConfig::read_path`).
            if !wanted {
                return;
            }
            let accepted = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                && config.set_max_stack_depth(MAX_STACK_DEPTH).is_ok();
            if !accepted {
                warn!(
                    "this kernel refused FUSE passthrough at init; staged files are served without it"
                );
            }
            self.active.store(accepted, Ordering::Relaxed);
        }

        /// The backing id for `ino`'s staged copy `file`, or None to serve reads from the daemon.
        pub(crate) fn backing(&self, ino: u64, file: &File, reply: &ReplyOpen) -> Option<Backing> {
            let mut by_inode = lock(&self.by_inode);
            // An inode with live passthrough handles must keep using the same backing file.
            if let Some(id) = by_inode.get(&ino).and_then(Weak::upgrade) {
                return Some(id);
            }
            if !self.active.load(Ordering::Relaxed) {
                return None;
            }
            match reply.open_backing(file) {
                Ok(id) => {
                    let id = Arc::new(id);
                    by_inode.retain(|_, weak| weak.strong_count() > 0);
                    by_inode.insert(ino, Arc::downgrade(&id));
                    Some(id)
                }
                Err(e) => {
                    warn!(error = %e, "registering a passthrough file failed (needs CAP_SYS_ADMIN); kernel passthrough is off from now on");
                    self.active.store(false, Ordering::Relaxed);
                    None
                }
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod other {
    use std::fs::File;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use fuser::{KernelConfig, ReplyOpen};

    use super::Backing;

    /// Stand-in for platforms without FUSE passthrough.
    #[derive(Debug)]
    pub(crate) struct Passthrough;

    /// Passthrough is Linux's.
    pub(crate) fn unavailable() -> Option<&'static str> {
        Some("it is Linux-only")
    }

    impl Passthrough {
        /// The policy's flag stays unset: the kernel never reads copies itself here.
        pub(crate) fn new(_active: Arc<AtomicBool>) -> Self {
            Passthrough
        }

        pub(crate) fn negotiate(&self, _wanted: bool, _config: &mut KernelConfig) {}

        pub(crate) fn backing(
            &self,
            _ino: u64,
            _file: &File,
            _reply: &ReplyOpen,
        ) -> Option<Backing> {
            None
        }
    }
}
