//! Is FUSE (Linux) or macFUSE (macOS) installed and usable, and which way will
//! stagefs serve reads. Facts are gathered per platform; judging them is pure and
//! compiled everywhere so both are unit-tested here.

// Each platform uses half of this module; the tests use all of it.
#![allow(dead_code)]

use serde::Deserialize;

use super::report::Check;

const NAME: &str = "fuse";

/// The FUSE check for this platform.
pub(crate) fn check() -> Check {
    #[cfg(target_os = "linux")]
    {
        judge_linux(&linux::facts())
    }
    #[cfg(target_os = "macos")]
    {
        judge_macos(&macos::facts())
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        Check::fail(NAME, "stagefs runs on Linux and macOS only")
    }
}

/// What Linux offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LinuxFuse {
    /// Opening /dev/fuse read-write: `None` if it worked, else why not.
    pub(crate) device_error: Option<std::io::ErrorKind>,
    pub(crate) root: bool,
    /// `fusermount3` or `fusermount`, whichever is on PATH.
    pub(crate) fusermount: Option<&'static str>,
    /// `(major, minor)` from uname.
    pub(crate) kernel: Option<(u32, u32)>,
    pub(crate) cap_sys_admin: bool,
}

/// Passthrough (reads of staged files served by the kernel) needs 6.9.
const PASSTHROUGH_KERNEL: (u32, u32) = (6, 9);

pub(crate) fn judge_linux(facts: &LinuxFuse) -> Check {
    match facts.device_error {
        Some(std::io::ErrorKind::NotFound) => {
            return Check::fail(NAME, "/dev/fuse does not exist")
                .advise("install fuse3 (`apt-get install fuse3`) and load the module (`modprobe fuse`); in a container, pass --device /dev/fuse");
        }
        Some(kind) => {
            return Check::fail(NAME, format!("/dev/fuse cannot be opened read-write: {kind}"))
                .advise("check its permissions (usually crw-rw-rw-); in a container, pass --device /dev/fuse");
        }
        None => {}
    }
    if !facts.root && facts.fusermount.is_none() {
        return Check::fail(NAME, "/dev/fuse is usable but fusermount3 is not on PATH")
            .advise("install fuse3 (`apt-get install fuse3`): mounting without root goes through fusermount3");
    }
    let kernel = facts
        .kernel
        .map_or_else(|| "unknown".to_string(), |(a, b)| format!("{a}.{b}"));
    let new_enough = facts.kernel.is_some_and(|k| k >= PASSTHROUGH_KERNEL);
    if new_enough && facts.cap_sys_admin {
        return Check::ok(
            NAME,
            format!("/dev/fuse is usable; passthrough available (kernel {kernel}, CAP_SYS_ADMIN)"),
        );
    }
    let missing = match (new_enough, facts.cap_sys_admin) {
        (false, false) => format!("kernel {kernel} < 6.9, not root"),
        (false, true) => format!("kernel {kernel} < 6.9"),
        _ => "no CAP_SYS_ADMIN".to_string(),
    };
    Check::ok(NAME, format!("/dev/fuse is usable; no passthrough ({missing})"))
        .advise("staged files are served by the daemon; kernel 6.9+ and root let the kernel serve them directly")
}

/// `6.18.44-fc-v657` -> (6, 18).
pub(crate) fn parse_kernel(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// CAP_SYS_ADMIN (bit 21) in the `CapEff:` line of /proc/self/status.
pub(crate) fn has_cap_sys_admin(status: &str) -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}

/// What macOS offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MacFuse {
    /// macFUSE's version, `None` when it is not installed; `Some("")` when installed
    /// but its version could not be read.
    pub(crate) version: Option<String>,
    /// macOS's version, e.g. `15.4.1`.
    pub(crate) macos: Option<String>,
}

/// The `Info.plist` key holding a bundle's version.
#[derive(Debug, Deserialize)]
pub(crate) struct BundleInfo {
    #[serde(rename = "CFBundleShortVersionString")]
    pub(crate) version: Option<String>,
    #[serde(rename = "ProductVersion")]
    pub(crate) product_version: Option<String>,
}

pub(crate) fn judge_macos(facts: &MacFuse) -> Check {
    let Some(version) = &facts.version else {
        return Check::fail(NAME, "macFUSE is not installed (no /Library/Filesystems/macfuse.fs)")
            .advise("install it (`brew install --cask macfuse`) and allow its system extension; see docs/MACOS.md");
    };
    let shown = if version.is_empty() {
        "(version unknown)"
    } else {
        version.as_str()
    };
    let mut summary = format!("macFUSE {shown}; stagefs mounts with its kext backend");
    let fskit = major(version).is_some_and(|m| m >= 5)
        && facts
            .macos
            .as_deref()
            .and_then(parse_kernel)
            .is_some_and(|v| v >= (15, 4));
    if fskit {
        summary.push_str("; its FSKit backend (macOS 15.4+) is not used");
    }
    Check::ok(NAME, summary).advise(
        "if mounting fails, allow the macFUSE system extension in System Settings > Privacy & Security (docs/MACOS.md)",
    )
}

fn major(version: &str) -> Option<u32> {
    version.split('.').next()?.parse().ok()
}

#[cfg(target_os = "linux")]
mod linux {
    use std::fs::OpenOptions;

    use super::{LinuxFuse, has_cap_sys_admin, parse_kernel};

    pub(super) fn facts() -> LinuxFuse {
        let device_error = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .err()
            .map(|e| e.kind());
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        LinuxFuse {
            device_error,
            // SAFETY: geteuid has no preconditions and cannot fail.
            root: unsafe { libc::geteuid() } == 0,
            fusermount: ["fusermount3", "fusermount"]
                .into_iter()
                .find(|p| on_path(p)),
            kernel: parse_kernel(release.trim()),
            cap_sys_admin: has_cap_sys_admin(&status),
        }
    }

    fn on_path(program: &str) -> bool {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
    }
}

#[cfg(target_os = "macos")]
mod macos {
    use std::path::Path;

    use super::{BundleInfo, MacFuse};

    const BUNDLE: &str = "/Library/Filesystems/macfuse.fs";
    const SYSTEM_VERSION: &str = "/System/Library/CoreServices/SystemVersion.plist";

    pub(super) fn facts() -> MacFuse {
        let bundle = Path::new(BUNDLE);
        let version = bundle.exists().then(|| {
            read(&bundle.join("Contents/Info.plist"))
                .and_then(|info| info.version)
                .unwrap_or_default()
        });
        let macos = read(Path::new(SYSTEM_VERSION)).and_then(|info| info.product_version);
        MacFuse { version, macos }
    }

    fn read(path: &Path) -> Option<BundleInfo> {
        plist::from_file(path)
            .map_err(|e| tracing::debug!("reading {}: {e}", path.display()))
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use std::io::ErrorKind;

    use super::*;
    use crate::doctor::report::Verdict;

    fn linux() -> LinuxFuse {
        LinuxFuse {
            device_error: None,
            root: true,
            fusermount: Some("fusermount3"),
            kernel: Some((6, 18)),
            cap_sys_admin: true,
        }
    }

    #[test]
    fn linux_verdicts() {
        let ok = judge_linux(&linux());
        assert_eq!(ok.verdict, Verdict::Ok);
        assert!(
            ok.summary.contains("passthrough available (kernel 6.18"),
            "{}",
            ok.summary
        );
        assert!(ok.advice.is_none());

        let old = judge_linux(&LinuxFuse {
            kernel: Some((6, 1)),
            ..linux()
        });
        assert_eq!(old.verdict, Verdict::Ok);
        assert!(
            old.summary.contains("no passthrough (kernel 6.1 < 6.9)"),
            "{}",
            old.summary
        );

        let missing = judge_linux(&LinuxFuse {
            device_error: Some(ErrorKind::NotFound),
            ..linux()
        });
        assert_eq!(missing.verdict, Verdict::Fail);
        let user = LinuxFuse {
            root: false,
            fusermount: None,
            cap_sys_admin: false,
            ..linux()
        };
        assert_eq!(judge_linux(&user).verdict, Verdict::Fail);
    }

    #[test]
    fn parses_kernel_and_capabilities() {
        assert_eq!(parse_kernel("6.18.44-fc-v657"), Some((6, 18)));
        assert_eq!(parse_kernel("5.15.0-91-generic"), Some((5, 15)));
        assert_eq!(parse_kernel("15.4"), Some((15, 4)));
        assert_eq!(parse_kernel("garbage"), None);
        assert!(has_cap_sys_admin("Name:\tx\nCapEff:\t000001ffffffffff\n"));
        assert!(!has_cap_sys_admin("CapEff:\t0000000000000000\n"));
    }

    #[test]
    fn macos_verdicts() {
        let none = judge_macos(&MacFuse {
            version: None,
            macos: Some("15.5".into()),
        });
        assert_eq!(none.verdict, Verdict::Fail);
        let five = judge_macos(&MacFuse {
            version: Some("5.0.6".into()),
            macos: Some("15.5".into()),
        });
        assert_eq!(five.verdict, Verdict::Ok);
        assert!(
            five.summary
                .contains("macFUSE 5.0.6; stagefs mounts with its kext backend; its FSKit"),
            "{}",
            five.summary
        );
        let four = judge_macos(&MacFuse {
            version: Some("4.8.0".into()),
            macos: Some("15.5".into()),
        });
        assert!(!four.summary.contains("FSKit"));
        let old_os = judge_macos(&MacFuse {
            version: Some("5.0.0".into()),
            macos: Some("14.6".into()),
        });
        assert!(!old_os.summary.contains("FSKit"));
    }

    #[test]
    fn reads_bundle_versions_from_plists() -> Result<(), plist::Error> {
        let xml = br#"<?xml version="1.0" encoding="UTF-8"?>
<plist version="1.0"><dict><key>CFBundleShortVersionString</key><string>5.0.6</string><key>Other</key><integer>1</integer></dict></plist>"#;
        let info: BundleInfo = plist::from_bytes(xml)?;
        assert_eq!(info.version.as_deref(), Some("5.0.6"));
        Ok(())
    }
}
