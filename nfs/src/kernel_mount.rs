//! Mounting the export with the system's own NFS client, and unmounting it.
//!
//! The options, each chosen on purpose (macOS first; Linux has equivalents):
//! - `vers=3,tcp`, `port=P,mountport=P`: NFSv3 over TCP to our one port, which
//!   answers MOUNT too; no portmapper is asked.
//! - `hard`: a call that gets no answer is retried, never failed with EIO. The
//!   server never leaves a call unanswered for long (a READ still staging answers
//!   JUKEBOX within 4 s; a dead source answers EIO within `--source-timeout`).
//! - `intr`: a signal interrupts a waiting call, so Ctrl-C works on a hard mount.
//! - `mutejukebox`: no "server not responding" dialog while the client retries a
//!   JUKEBOX (a shard still being staged).
//! - `locallocks` (Linux: `local_lock=all`): flock/fcntl locks, which
//!   huggingface_hub takes through `filelock`, are kept in the client kernel; the
//!   server has no lock manager, and `nolocks` would make them fail with ENOTSUP.
//! - `nobrowse`: the volume stays out of the Finder's sidebar and Desktop, so the
//!   Finder and Quick Look do not crawl it (a thumbnail reads, and so stages, a
//!   multi-GiB shard).
//! - `rdonly` (Linux `ro`) only with `--read-only`, where the server answers every
//!   change `NFS3ERR_ROFS` anyway: the client then fails writes with EROFS before
//!   sending anything. Otherwise the mount is read-write, as the export is.
//! - `rsize=1048576`: the server's largest READ, so a loader's 32 MiB preads become
//!   32 calls instead of hundreds.
//! - `wsize=1048576`: the server's largest WRITE (FSINFO's `wtmax`), which the
//!   connection front relays whole; the client's dirty pages go out in 1 MiB calls.
//! - `actimeo=1`: attributes and names are cached for 1 s, as the FUSE mount's
//!   kernel does, so a change at the source shows within about a second.
//! - Linux `addr=127.0.0.1`: where no `mount.nfs` helper is installed, `mount`
//!   hands the options to the kernel as they are, and the kernel needs the server's
//!   address among them (the helper would add it); with the helper it is the same
//!   address the helper resolves.

use std::io;
use std::path::Path;
use std::process::Command;

/// The `-o` options for a mount of the export on `port`, read-only or not.
pub fn options(port: u16, read_only: bool) -> String {
    #[cfg(target_os = "macos")]
    let (platform, ro) = ("hard,intr,mutejukebox,locallocks,nobrowse", ",rdonly");
    #[cfg(not(target_os = "macos"))]
    let (platform, ro) = ("hard,local_lock=all,mountproto=tcp,addr=127.0.0.1", ",ro");
    let ro = if read_only { ro } else { "" };
    format!(
        "vers=3,tcp,port={port},mountport={port},rsize=1048576,wsize=1048576,actimeo=1,{platform}{ro}"
    )
}

/// Mounts the export on `port` at `mountpoint` with the system's NFS client. On
/// macOS an ordinary user may mount on a directory they own; on Linux it needs
/// root and `mount.nfs` (nfs-common). `read_only` mounts it so.
pub fn mount(port: u16, mountpoint: &Path, read_only: bool) -> io::Result<()> {
    let program = mount_program()?;
    let output = Command::new(program)
        .args(mount_args())
        .arg("-o")
        .arg(options(port, read_only))
        .arg("127.0.0.1:/")
        .arg(mountpoint)
        .output()?;
    if output.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&output.stderr);
    let said = said.trim();
    Err(io::Error::other(format!(
        "{program} failed ({}){}{said}",
        output.status,
        if said.is_empty() { "" } else { ": " }
    )))
}

/// Unmounts `mountpoint`; `force` (macOS `umount -f`, Linux a lazy detach) even
/// while something has files open in it. A plain unmount refused because files are
/// open there fails with [`io::ErrorKind::ResourceBusy`].
pub fn unmount(mountpoint: &Path, force: bool) -> io::Result<()> {
    let mut command = Command::new("umount");
    if force {
        command.arg(if cfg!(target_os = "macos") {
            "-f"
        } else {
            "-l"
        });
    }
    let output = command.arg(mountpoint).output()?;
    if output.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&output.stderr);
    // umount says so in words only: Linux "target is busy", macOS "Resource busy".
    let kind = match said.contains("busy") {
        true => io::ErrorKind::ResourceBusy,
        false => io::ErrorKind::Other,
    };
    Err(io::Error::new(
        kind,
        format!("umount {} failed: {}", mountpoint.display(), said.trim()),
    ))
}

/// Where Linux lists every NFS superblock of this network namespace, one a line,
/// a lazily detached one included until its last open file is closed.
const NFS_VOLUMES: &str = "/proc/fs/nfsfs/volumes";

/// Whether the kernel's NFS client still holds a mount of the export on `port`
/// (Linux), such as one detached with `umount -l` while files are open in it: the
/// server must keep answering those files until this turns false. False where the
/// list cannot be read (macOS, no NFS client loaded).
pub fn client_holds(port: u16) -> bool {
    std::fs::read_to_string(NFS_VOLUMES).is_ok_and(|list| volumes_name_port(&list, port))
}

/// Whether a `/proc/fs/nfsfs/volumes` text lists a volume served on `port`. Its
/// lines read `v3 7f000001  d431 0:53 0:0 no`: version, server address and port in
/// hex, device, fsid, fscache. Only our loopback server is mounted on our port.
fn volumes_name_port(list: &str, port: u16) -> bool {
    let port = format!("{port:x}");
    list.lines()
        .skip(1)
        .any(|line| line.split_whitespace().nth(2) == Some(port.as_str()))
}

#[cfg(target_os = "macos")]
fn mount_program() -> io::Result<&'static str> {
    Ok("/sbin/mount_nfs")
}

#[cfg(target_os = "macos")]
fn mount_args() -> [&'static str; 0] {
    []
}

/// `mount -t nfs`, where this kernel has an NFS client.
#[cfg(not(target_os = "macos"))]
fn mount_program() -> io::Result<&'static str> {
    let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    let has_client = filesystems
        .lines()
        .any(|line| line.split_whitespace().last() == Some("nfs"));
    let has_helper = ["/sbin/mount.nfs", "/usr/sbin/mount.nfs"]
        .iter()
        .any(|p| Path::new(p).exists());
    if !has_client && !has_helper {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this kernel has no NFS client (no nfs in /proc/filesystems, no mount.nfs): \
             use --backend fuse, or `stagefs serve` with a user-space NFS client",
        ));
    }
    Ok("mount")
}

#[cfg(not(target_os = "macos"))]
fn mount_args() -> [&'static str; 2] {
    ["-t", "nfs"]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_name_the_port_for_both_protocols_and_are_read_only_only_when_asked() {
        let options = options(4711, true);
        assert!(options.contains("port=4711,mountport=4711"), "{options}");
        assert!(options.starts_with("vers=3,tcp,"), "{options}");
        assert!(options.contains(",hard"), "{options}");
        assert!(options.contains("wsize=1048576"), "{options}");
        assert!(
            options.ends_with(",rdonly") || options.ends_with(",ro"),
            "{options}"
        );
        let writable = options_of(4711, false);
        assert!(
            !writable.contains("rdonly") && !writable.split(',').any(|o| o == "ro"),
            "{writable}"
        );
    }

    #[test]
    fn a_volume_on_our_port_is_found_in_the_kernels_list_and_others_are_not() {
        let list = "NV SERVER   PORT DEV          FSID                              FSC\n\
                    v3 7f000001  d431 0:53         0:0                               no\n\
                    v4 c0a80001  801 0:60         1234:5678                         no\n";
        assert!(volumes_name_port(list, 0xd431));
        assert!(volumes_name_port(list, 2049));
        assert!(!volumes_name_port(list, 0x801 + 1));
        assert!(!volumes_name_port(
            "NV SERVER   PORT DEV FSID FSC\n",
            0xd431
        ));
    }

    fn options_of(port: u16, read_only: bool) -> String {
        options(port, read_only)
    }
}
