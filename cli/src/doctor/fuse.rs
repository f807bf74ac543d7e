//! Is FUSE (Linux) or macFUSE (macOS) installed and usable, and which way will
//! stagefs serve reads. Both platforms' facts and judgements are compiled everywhere
//! (so both are unit-tested here, and neither rots); `check` asks this platform's.

use std::io::ErrorKind;

use serde::Deserialize;

use stagefs_control::Backend;

use super::Check;

const NAME: &str = "fuse";
/// Where macOS names its version.
const SYSTEM_VERSION: &str = "/System/Library/CoreServices/SystemVersion.plist";
/// Passthrough (reads of staged files served by the kernel) needs 6.9.
const PASSTHROUGH_KERNEL: (u32, u32) = (6, 9);

/// Whether this build can mount with macFUSE: not one built with `no-macfuse`
/// (Homebrew's, the release binaries), which runs without macFUSE, NFS only.
const MACFUSE_BUILT: bool = cfg!(not(feature = "no-macfuse"));

/// The FUSE check for this platform, for mounts with `backend`.
pub(crate) fn check(backend: Backend) -> Check {
    match (cfg!(target_os = "macos"), backend) {
        (true, _) => judge_macos(&macos_facts(), backend, MACFUSE_BUILT),
        (false, Backend::Nfs) => judge_linux_nfs(&linux_nfs_facts()),
        (false, Backend::Fuse) => judge_linux(&linux_facts()),
    }
}

/// What Linux offers a mount of the NFS backend, which needs no FUSE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LinuxNfs {
    /// `nfs` is in /proc/filesystems (the client is loaded or built in).
    loaded: bool,
    /// The running kernel has an `nfs` module to load.
    module: bool,
    root: bool,
}

fn linux_nfs_facts() -> LinuxNfs {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let release = read("/proc/sys/kernel/osrelease");
    let modules = read(&format!("/lib/modules/{}/modules.dep", release.trim()));
    LinuxNfs {
        loaded: read("/proc/filesystems")
            .lines()
            .any(|line| line.split_whitespace().last() == Some("nfs")),
        module: modules.lines().any(|line| {
            line.split(':')
                .next()
                .is_some_and(|m| m.ends_with("/nfs.ko") || m.contains("/nfs.ko."))
        }),
        // SAFETY: geteuid has no preconditions and cannot fail.
        root: unsafe { libc::geteuid() } == 0,
    }
}

fn judge_linux_nfs(facts: &LinuxNfs) -> Check {
    if !facts.loaded && !facts.module {
        return Check::fail(NAME, "the config file asks for backend nfs, but this kernel has no NFS client (no nfs in /proc/filesystems or among its modules)")
            .advise("use the FUSE backend (backend = \"fuse\", the default on Linux), or a kernel built with NFS (CONFIG_NFS_FS)");
    }
    if !facts.root {
        return Check::fail(NAME, "the config file asks for backend nfs, which on Linux only root can mount")
            .advise("run stagefs as root, or use the FUSE backend (backend = \"fuse\", the default on Linux)");
    }
    Check::ok(
        NAME,
        "mounts use the NFS backend (this kernel's NFS client); FUSE is not needed",
    )
}

/// What Linux offers.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LinuxFuse {
    /// Opening /dev/fuse read-write: `None` if it worked, else why not.
    device_error: Option<ErrorKind>,
    root: bool,
    /// Whether `fusermount3` or `fusermount` is on PATH.
    fusermount: bool,
    /// `(major, minor)` from uname.
    kernel: Option<(u32, u32)>,
    cap_sys_admin: bool,
}

fn linux_facts() -> LinuxFuse {
    let mut options = std::fs::File::options();
    let opened = options.read(true).write(true).open("/dev/fuse");
    let read = |path| std::fs::read_to_string(path).unwrap_or_default();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let on_path = |p: &str| std::env::split_paths(&path).any(|dir| dir.join(p).is_file());
    LinuxFuse {
        device_error: opened.err().map(|e| e.kind()),
        // SAFETY: geteuid has no preconditions and cannot fail.
        root: unsafe { libc::geteuid() } == 0,
        fusermount: on_path("fusermount3") || on_path("fusermount"),
        kernel: parse_kernel(read("/proc/sys/kernel/osrelease").trim()),
        cap_sys_admin: has_cap_sys_admin(&read("/proc/self/status")),
    }
}

fn judge_linux(facts: &LinuxFuse) -> Check {
    let install = "install fuse3 (`apt-get install fuse3`)";
    let container = "in a container, pass --device /dev/fuse";
    let failed = match facts.device_error {
        Some(ErrorKind::NotFound) => Some((
            "/dev/fuse does not exist".to_string(),
            format!("{install} and load the module (`modprobe fuse`); {container}"),
        )),
        Some(kind) => Some((
            format!("/dev/fuse cannot be opened read-write: {kind}"),
            format!("check its permissions (usually crw-rw-rw-); {container}"),
        )),
        None if !facts.root && !facts.fusermount => Some((
            "/dev/fuse is usable but fusermount3 is not on PATH".to_string(),
            format!("{install}: mounting without root goes through fusermount3"),
        )),
        None => None,
    };
    if let Some((summary, advice)) = failed {
        return Check::fail(NAME, summary).advise(advice);
    }
    let kernel = facts
        .kernel
        .map_or("unknown".into(), |(a, b)| format!("{a}.{b}"));
    let new_enough = facts.kernel.is_some_and(|k| k >= PASSTHROUGH_KERNEL);
    let missing = match (new_enough, facts.cap_sys_admin) {
        (true, true) => {
            let how = format!("passthrough available (kernel {kernel}, CAP_SYS_ADMIN)");
            return Check::ok(NAME, format!("/dev/fuse is usable; {how}"));
        }
        (false, false) => format!("kernel {kernel} < 6.9, not root"),
        (false, true) => format!("kernel {kernel} < 6.9"),
        (true, false) => "no CAP_SYS_ADMIN".to_string(),
    };
    Check::ok(NAME, format!("/dev/fuse is usable; no passthrough ({missing})"))
        .advise(format!(
            "staged files are {} (with --no-redirect or --allow-other, {}); kernel 6.9+ and root let the kernel read them directly",
            stagefs_policy::ReadPath::Links.describe(),
            stagefs_policy::ReadPath::Daemon.describe()
        ))
}

/// `6.18.44-fc-v657` -> (6, 18).
fn parse_kernel(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// CAP_SYS_ADMIN (bit 21) in the `CapEff:` line of /proc/self/status.
fn has_cap_sys_admin(status: &str) -> bool {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"));
    let caps = hex.and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok());
    caps.is_some_and(|caps| caps & (1 << 21) != 0)
}

/// What macOS offers: macFUSE's version (`None` when it is not installed, `Some("")`
/// when its version could not be read), and macOS's, e.g. `15.4.1`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MacFuse(Option<String>, Option<String>);

/// The `Info.plist` keys holding a bundle's or the system's version.
#[derive(Debug, Deserialize)]
struct BundleInfo {
    #[serde(rename = "CFBundleShortVersionString")]
    version: Option<String>,
    #[serde(rename = "ProductVersion")]
    product_version: Option<String>,
}

fn macos_facts() -> MacFuse {
    use std::path::Path;
    let read = |path: &Path| {
        let info = plist::from_file::<_, BundleInfo>(path);
        info.map_err(|e| tracing::debug!("reading {}: {e}", path.display()))
            .ok()
    };
    let bundle = Path::new("/Library/Filesystems/macfuse.fs");
    let version = bundle.exists().then(|| {
        let info = read(&bundle.join("Contents/Info.plist"));
        info.and_then(|info| info.version).unwrap_or_default()
    });
    let system = read(Path::new(SYSTEM_VERSION)).and_then(|info| info.product_version);
    MacFuse(version, system)
}

/// macFUSE matters only to `--backend fuse`; the NFS backend (the default) needs
/// nothing installed.
fn judge_macos(MacFuse(version, macos): &MacFuse, backend: Backend, built: bool) -> Check {
    let nfs = "mounts use the NFS backend (the system's mount_nfs, no kernel extension)";
    let shown = version
        .as_deref()
        .map(|v| if v.is_empty() { "(version unknown)" } else { v });
    if backend == Backend::Nfs {
        return match shown {
            None => Check::ok(
                NAME,
                format!("{nfs}; macFUSE is not installed, and only --backend fuse needs it"),
            ),
            Some(shown) => Check::ok(
                NAME,
                format!("{nfs}; macFUSE {shown} is installed, for --backend fuse"),
            ),
        };
    }
    if !built {
        return Check::fail(NAME, "the config file asks for backend fuse, but this stagefs was built without macFUSE (as Homebrew's and the release binaries are)")
            .advise("set backend = \"nfs\" (the default), or build stagefs on this Mac with macFUSE installed (docs/MACOS.md)");
    }
    let (Some(version), Some(shown)) = (version, shown) else {
        return Check::fail(NAME, "macFUSE is not installed (no /Library/Filesystems/macfuse.fs)")
            .advise("install it (`brew install --cask macfuse`) and allow its system extension, or use the NFS backend (backend = \"nfs\", the default); see docs/MACOS.md");
    };
    let mut summary = format!("macFUSE {shown}; stagefs mounts with its kext backend");
    let major: Option<u32> = version.split('.').next().and_then(|m| m.parse().ok());
    let os = macos.as_deref().and_then(parse_kernel);
    let fskit_os = os.is_some_and(|v| v >= (15, 4));
    if major.is_some_and(|m| m >= 5) && fskit_os {
        summary.push_str("; its FSKit backend (macOS 15.4+) is not used");
    }
    Check::ok(NAME, summary).advise(
        "if mounting fails, allow the macFUSE system extension in System Settings > Privacy & Security (docs/MACOS.md)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Verdict;

    #[test]
    fn the_nfs_backend_on_linux_needs_an_nfs_client_and_root_not_fuse() {
        let ready = LinuxNfs {
            loaded: true,
            module: false,
            root: true,
        };
        assert_eq!(judge_linux_nfs(&ready).verdict, Verdict::Ok);
        let loadable = LinuxNfs {
            loaded: false,
            module: true,
            ..ready
        };
        assert_eq!(judge_linux_nfs(&loadable).verdict, Verdict::Ok);
        let none = LinuxNfs {
            loaded: false,
            module: false,
            ..ready
        };
        let check = judge_linux_nfs(&none);
        assert_eq!(check.verdict, Verdict::Fail);
        assert!(check.summary.contains("no NFS client"), "{}", check.summary);
        let user = LinuxNfs {
            root: false,
            ..ready
        };
        assert_eq!(judge_linux_nfs(&user).verdict, Verdict::Fail);
    }

    #[test]
    fn linux_verdicts() {
        let facts = |device_error, root: bool, kernel: (u32, u32), caps: bool| {
            let (fusermount, kernel) = (root, Some(kernel));
            judge_linux(&LinuxFuse {
                device_error,
                root,
                fusermount,
                kernel,
                cap_sys_admin: caps,
            })
        };
        let ok = facts(None, true, (6, 18), true);
        assert_eq!(ok.advice, None);
        assert!(ok.summary.contains("passthrough available (kernel 6.18"));
        let old = facts(None, true, (6, 1), true);
        assert_eq!(old.verdict, Verdict::Ok);
        assert!(old.summary.contains("no passthrough (kernel 6.1 < 6.9)"));
        let missing = facts(Some(ErrorKind::NotFound), true, (6, 18), true);
        assert_eq!(missing.summary, "/dev/fuse does not exist");
        assert_eq!(facts(None, false, (6, 18), false).verdict, Verdict::Fail);
        assert_eq!(parse_kernel("5.15.0-91-generic"), Some((5, 15)));
        assert_eq!(parse_kernel("garbage"), None);
        assert!(has_cap_sys_admin("Name:\tx\nCapEff:\t000001ffffffffff\n"));
        assert!(!has_cap_sys_admin("CapEff:\t0000000000000000\n"));
    }

    #[test]
    fn macos_verdicts() -> Result<(), plist::Error> {
        let judge = |version: Option<&str>, macos: &str| {
            let facts = MacFuse(version.map(Into::into), Some(macos.into()));
            judge_macos(&facts, Backend::Fuse, true)
        };
        assert_eq!(judge(None, "15.5").verdict, Verdict::Fail);
        let five = judge(Some("5.0.6"), "15.5");
        let expected = "macFUSE 5.0.6; stagefs mounts with its kext backend; its FSKit";
        assert!(five.summary.starts_with(expected), "{}", five.summary);
        assert!(!judge(Some("4.8.0"), "15.5").summary.contains("FSKit"));
        assert!(!judge(Some("5.0.0"), "14.6").summary.contains("FSKit"));
        let nfs = |version: Option<&str>, built| {
            let facts = MacFuse(version.map(Into::into), Some("15.5".into()));
            judge_macos(&facts, Backend::Nfs, built)
        };
        // The default backend needs no macFUSE, in a build with it or without.
        for built in [true, false] {
            let none = nfs(None, built);
            assert_eq!(none.verdict, Verdict::Ok, "{}", none.summary);
            assert!(
                none.summary.contains("only --backend fuse needs it"),
                "{}",
                none.summary
            );
        }
        assert!(
            nfs(Some("5.0.6"), true)
                .summary
                .contains("macFUSE 5.0.6 is installed")
        );
        let unbuilt = judge_macos(&MacFuse(Some("5.0.6".into()), None), Backend::Fuse, false);
        assert_eq!(unbuilt.verdict, Verdict::Fail);
        assert!(
            unbuilt.summary.contains("built without macFUSE"),
            "{}",
            unbuilt.summary
        );
        let xml = br#"<?xml version="1.0" encoding="UTF-8"?>
<plist version="1.0"><dict><key>CFBundleShortVersionString</key><string>5.0.6</string><key>Other</key><integer>1</integer></dict></plist>"#;
        let info: BundleInfo = plist::from_bytes(xml)?;
        assert_eq!(info.version.as_deref(), Some("5.0.6"));
        Ok(())
    }
}
