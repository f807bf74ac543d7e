//! The mounts this user's stagefs made, so every command finds them without flags.
//!
//! Each mount, once live, leaves a small file in the user's state directory
//! (`$XDG_STATE_HOME/stagefs/mounts/`, else `~/.local/state/stagefs/mounts/`) naming
//! its mount point and cache directory; a clean stop removes it, a crash leaves it.
//! A file is only a pointer: a mount is taken for ours only when the mount table has
//! a mount of stagefs's type there *and* the cache it points to records that mount
//! point (`MountRecord`), so a stale or forged file never makes a foreign filesystem
//! ours.

use std::fs;
use std::hash::{Hash, Hasher};
use std::io::{self, BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use stagefs_control::{self as control, MountRecord, Request, Response};

use crate::table::{self, MountEntry};

/// What a mount leaves in the registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Pointer {
    mountpoint: PathBuf,
    cache_dir: PathBuf,
}

/// A mount of ours, as found in the registry and the mount table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownMount {
    /// Where it is mounted.
    pub mountpoint: PathBuf,
    /// Its cache directory.
    pub cache_dir: PathBuf,
    /// What the cache records of it.
    pub record: MountRecord,
}

/// The registry directory: `$XDG_STATE_HOME/stagefs/mounts`, else
/// `~/.local/state/stagefs/mounts`; None without either variable.
pub fn dir() -> Option<PathBuf> {
    let state = match std::env::var_os("XDG_STATE_HOME") {
        Some(dir) if Path::new(&dir).is_absolute() => PathBuf::from(dir),
        _ => match std::env::var_os("HOME") {
            Some(home) if !home.is_empty() => Path::new(&home).join(".local/state"),
            _ => return None,
        },
    };
    Some(state.join("stagefs/mounts"))
}

/// The registry file of a mount at `mountpoint`.
fn file_for(dir: &Path, mountpoint: &Path) -> PathBuf {
    // Stable within one build, which is all a running mount needs: readers list the
    // directory and never compute names.
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    mountpoint.hash(&mut hasher);
    dir.join(format!("{:016x}.json", hasher.finish()))
}

/// Records a live mount (best effort: a mount works without it, only commands
/// without flags do not find it).
pub(crate) fn add(mountpoint: &Path, cache_dir: &Path) -> io::Result<()> {
    let Some(dir) = dir() else {
        return Err(io::Error::new(
            ErrorKind::NotFound,
            "neither XDG_STATE_HOME nor HOME is set",
        ));
    };
    fs::create_dir_all(&dir)?;
    let pointer = Pointer {
        mountpoint: table::resolve(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf()),
        cache_dir: std::path::absolute(cache_dir)?,
    };
    let path = file_for(&dir, &pointer.mountpoint);
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, serde_json::to_vec_pretty(&pointer)?)?;
    fs::rename(&tmp, &path)
}

/// Forgets the mount at `mountpoint`, if it still points at `cache_dir`.
pub(crate) fn remove(mountpoint: &Path, cache_dir: &Path) {
    let Some(dir) = dir() else { return };
    let mountpoint = table::resolve(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    let path = file_for(&dir, &mountpoint);
    if read(&path).is_some_and(|p| same_dir(&p.cache_dir, cache_dir)) {
        let _ = fs::remove_file(path);
    }
}

fn read(path: &Path) -> Option<Pointer> {
    serde_json::from_slice(&fs::read(path).ok()?).ok()
}

fn same_dir(a: &Path, b: &Path) -> bool {
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    absolute(a) == absolute(b)
}

/// Whether the cache at `cache_dir` records a mount at `mountpoint`. The part of
/// "is this mount ours" that holds for any backend: the record names the mount point.
fn records(cache_dir: &Path, mountpoint: &Path) -> Option<MountRecord> {
    let record = MountRecord::read(cache_dir)?;
    let recorded = table::resolve(&record.mountpoint).unwrap_or(record.mountpoint.clone());
    (recorded == mountpoint).then_some(record)
}

/// The mounts of ours that the mount table lists now: each registry file whose
/// mount point holds a stagefs mount and whose cache records it. Files of mounts
/// that are gone (a reboot, an unmount from outside) are removed once their cache
/// is no longer locked by a daemon.
pub fn known() -> Vec<KnownMount> {
    let (Some(dir), Ok(table)) = (dir(), table::entries()) else {
        return Vec::new();
    };
    let Ok(listing) = fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for file in listing.flatten().map(|e| e.path()) {
        if file.extension().is_none_or(|ext| ext != "json") {
            continue;
        }
        let Some(pointer) = read(&file) else { continue };
        let mounted = table
            .iter()
            .rev()
            .find(|e| e.mountpoint == pointer.mountpoint)
            .filter(|e| e.looks_like_stagefs());
        let record = records(&pointer.cache_dir, &pointer.mountpoint);
        match (mounted, record) {
            (Some(_), Some(record)) => found.push(KnownMount {
                mountpoint: pointer.mountpoint,
                cache_dir: pointer.cache_dir,
                record,
            }),
            _ if !locked(&pointer.cache_dir) => {
                let _ = fs::remove_file(&file);
            }
            _ => {}
        }
    }
    found.sort_by(|a, b| a.mountpoint.cmp(&b.mountpoint));
    found
}

/// The mount of ours at `mountpoint`, if the registry and the table agree on one.
pub fn known_at(mountpoint: &Path) -> Option<KnownMount> {
    let mountpoint = table::resolve(mountpoint).ok()?;
    known().into_iter().find(|m| m.mountpoint == mountpoint)
}

/// The mount of ours served from `cache_dir`, if one is in the mount table (live
/// or dead).
pub fn known_for_cache(cache_dir: &Path) -> Option<KnownMount> {
    known()
        .into_iter()
        .find(|m| same_dir(&m.cache_dir, cache_dir))
}

/// The mount the cache at `cache_dir` records, if the mount table still has a
/// stagefs mount there but no daemon answers for it: a dead mount left by a crash.
/// Found from the cache alone, so it works whoever's registry it was in.
pub fn dead_mount_of(cache_dir: &Path) -> Option<PathBuf> {
    let record = MountRecord::read(cache_dir)?;
    let mountpoint = table::resolve(&record.mountpoint).ok()?;
    let entry: MountEntry = table::mounted_at(&mountpoint).ok()??;
    if !entry.looks_like_stagefs() || locked(cache_dir) || answers(cache_dir) {
        return None;
    }
    // A live mount of another cache may have taken the mount point since.
    let taken = known()
        .iter()
        .any(|m| m.mountpoint == mountpoint && !same_dir(&m.cache_dir, cache_dir));
    (!taken).then_some(mountpoint)
}

/// How long a daemon may take to answer `Stats` before it counts as not answering
/// (a stuck daemon must not hang `status` or `doctor`).
const ANSWER_WAIT: Duration = Duration::from_secs(2);

/// Whether a daemon answers on the cache's control socket, within [`ANSWER_WAIT`].
fn answers(cache_dir: &Path) -> bool {
    let Ok(mut stream) = UnixStream::connect(control::socket_path(cache_dir)) else {
        return false;
    };
    let Ok(mut line) = serde_json::to_vec(&Request::Stats) else {
        return false;
    };
    line.push(b'\n');
    if stream.set_read_timeout(Some(ANSWER_WAIT)).is_err() || stream.write_all(&line).is_err() {
        return false;
    }
    let mut answer = String::new();
    if BufReader::new(stream).read_line(&mut answer).is_err() {
        return false;
    }
    matches!(
        serde_json::from_str::<Response>(&answer),
        Ok(Response::Stats { .. })
    )
}

/// Whether a process holds the cache's lock (a daemon, or a command working on it).
pub fn locked(cache_dir: &Path) -> bool {
    let Ok(file) = fs::File::open(cache_dir.join("lock")) else {
        return false;
    };
    match file.try_lock_shared() {
        Ok(()) => {
            let _ = file.unlock();
            false
        }
        Err(fs::TryLockError::WouldBlock) => true,
        Err(fs::TryLockError::Error(_)) => false,
    }
}

/// The pid the cache's lock holder recorded, if it did.
pub fn lock_holder(cache_dir: &Path) -> Option<u32> {
    fs::read_to_string(cache_dir.join("lock"))
        .ok()?
        .trim()
        .parse()
        .ok()
}
