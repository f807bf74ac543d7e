//! Asking a cache directory whether a mount is served from it right now.

use std::io;
use std::path::{Path, PathBuf};

use stagefs_control::{self as control, Request, Response};

/// The mount served from `cache_dir` right now, as (source, mountpoint), asked on its
/// control socket; None when no daemon answers there (no socket, or one left by a
/// daemon that died). An error when something answered but not as a mount does, or
/// the socket failed otherwise. A daemon that accepts but never answers blocks the
/// caller: bound the call where that matters.
pub fn live_mount(cache_dir: &Path) -> io::Result<Option<(PathBuf, PathBuf)>> {
    match control::query(&control::socket_path(cache_dir), &Request::Stats) {
        Ok(Response::Stats {
            source, mountpoint, ..
        }) => Ok(Some((source, mountpoint))),
        Ok(other) => Err(io::Error::other(format!(
            "unexpected answer from the running mount: {other:?}"
        ))),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("talking to the running mount: {e}"),
        )),
    }
}

/// [`live_mount`], while its mount point is still in the mount table as a stagefs
/// mount. A mount detached with files open (`stagefs unmount --lazy`, a stop while a
/// model was loaded) is still served by a daemon that answers, but nothing is
/// mounted there any more: it is not a mount to use or to leave alone as "up".
pub fn mounted(cache_dir: &Path) -> io::Result<Option<(PathBuf, PathBuf)>> {
    Ok(live_mount(cache_dir)?
        .filter(|(_, mountpoint)| crate::table::stagefs_mounted_at(mountpoint)))
}
