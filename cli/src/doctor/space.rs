//! The cache checks: where the cache directory is, and whether its volume has room
//! for the model once the free-space reserve is kept.

use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;
use stagefs_source::fskind::{FsInfo, FsKind, filesystem_of};
use stagefs_store::budget::{VolumeSpace, default_min_free, volume_space};

use super::Check;
use super::lines::{Gathered, Place};
use super::model::Model;
use crate::units::format_bytes;

/// The cache as reported in JSON: `fs` is the filesystem of the directory (or of its
/// nearest existing ancestor), `min_free_bytes` the free space the mount leaves
/// alone, `usable_bytes` what staging may use (available minus that reserve, and at
/// most `max_size_bytes`).
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct CacheReport {
    pub(crate) dir: PathBuf,
    pub(crate) exists: bool,
    pub(crate) fs: Option<FsInfo>,
    pub(crate) total_bytes: Option<u64>,
    pub(crate) available_bytes: Option<u64>,
    pub(crate) min_free_bytes: Option<u64>,
    pub(crate) usable_bytes: Option<u64>,
    pub(crate) max_size_bytes: Option<u64>,
}

/// Resolves the directory, or its nearest existing ancestor for one not created yet
/// (in the worker).
pub(crate) fn place(dir: &Path) -> io::Result<Place> {
    let missing = || io::Error::new(io::ErrorKind::NotFound, "no part of it exists");
    let existing = dir.ancestors().find(|a| a.exists()).ok_or_else(missing)?;
    let rest = dir.strip_prefix(existing).unwrap_or(Path::new(""));
    let canonical = std::fs::canonicalize(existing)?;
    let (fs, space) = (filesystem_of(&canonical)?, volume_space(&canonical)?);
    Ok(Place(canonical.join(rest), existing == dir, fs, space))
}

/// The `cache` and `space` checks from what the worker found, with the config file's
/// `(max_size, min_free)` (the reserve defaults as for a mount). `roots` are the
/// directories the cache must not be inside (the source; the mount point).
pub(crate) fn inspect(
    gathered: &Gathered,
    dir: &Path,
    (max_size, min_free): (Option<u64>, Option<u64>),
    roots: &[PathBuf],
    model: Option<&Model>,
) -> (Vec<Check>, CacheReport) {
    let mut report = CacheReport {
        dir: dir.into(),
        max_size_bytes: max_size,
        ..Default::default()
    };
    let Place(resolved, exists, fs, space) = match got!(gathered, Cache) {
        Some(Ok(place)) => place,
        Some(Err(e)) => {
            let check = Check::fail("cache", format!("{}: {e}", dir.display())).advise(
                "choose a writable --cache-dir (or `cache_dir` in the config file) on a local disk",
            );
            return (vec![check], report);
        }
        None => {
            let late = format!("{} {}", dir.display(), gathered.missing);
            let check = Check::fail("cache", late).advise("put the cache on a local disk");
            return (vec![check], report);
        }
    };
    let min_free = min_free.unwrap_or_else(|| default_min_free(*space));
    let usable = usable_bytes(*space, min_free, max_size);
    (report.exists, report.fs) = (*exists, Some(fs.clone()));
    (report.total_bytes, report.available_bytes) = (Some(space.total), Some(space.available));
    (report.min_free_bytes, report.usable_bytes) = (Some(min_free), Some(usable));
    let location = location_check(dir, (resolved, *exists, fs), roots);
    let need = model
        .filter(|m| m.size_bytes > 0)
        .map(|m| (m.id.as_str(), m.size_bytes));
    let space = space_check(*space, min_free, max_size, need);
    (vec![location, space], report)
}

/// The `cache` check for `dir`, found at `(resolved, exists, fs)`.
fn location_check(
    dir: &Path,
    (resolved, exists, fs): (&Path, bool, &FsInfo),
    roots: &[PathBuf],
) -> Check {
    let (shown, created) = (dir.display(), if exists { "" } else { ", not created yet" });
    let summary = format!("{shown}: {}{created}", fs.describe());
    if let Some(root) = roots.iter().find(|r| resolved.starts_with(r)) {
        return Check::fail("cache", format!("{shown} is inside {}", root.display())).advise(
            "put the cache on a local disk outside the source and the mount (--cache-dir or `cache_dir`)",
        );
    }
    match fs.kind {
        FsKind::Network => Check::warn("cache", summary)
            .advise("put the cache on a local SSD: staging onto a network disk gains nothing"),
        FsKind::Stagefs => Check::fail("cache", summary)
            .advise("a stagefs mount is read-only; put the cache on a local disk"),
        FsKind::Usb | FsKind::Removable => Check::warn("cache", summary)
            .advise("an internal SSD serves staged weights (and mmap) faster"),
        FsKind::Local | FsKind::Fuse | FsKind::Unknown => Check::ok("cache", summary),
    }
}

/// What staging may use: the volume's free space less the reserve, and no more than
/// the size limit (copies already staged count against it too, but doctor does not
/// weigh them: the mount evicts them to make room).
fn usable_bytes(space: VolumeSpace, min_free: u64, max_size: Option<u64>) -> u64 {
    let free = space.available.saturating_sub(min_free);
    max_size.map_or(free, |max| free.min(max))
}

/// The `space` check for a model of `need` = (id, bytes), if any.
fn space_check(
    space: VolumeSpace,
    min_free: u64,
    max_size: Option<u64>,
    need: Option<(&str, u64)>,
) -> Check {
    let usable = usable_bytes(space, min_free, max_size);
    let (available, reserve) = (format_bytes(space.available), format_bytes(min_free));
    let after_reserve = format_bytes(space.available.saturating_sub(min_free));
    let mut free = format!(
        "{available} free on the cache volume, {after_reserve} usable after the {reserve} reserve"
    );
    if let Some(max) = max_size {
        let limit = format!(
            "; staged copies are limited to {} (max_size)",
            format_bytes(max)
        );
        free.push_str(&limit);
    }
    let Some((id, need)) = need else {
        return match usable {
            0 => Check::warn("space", free)
                .advise("free space on the cache volume: nothing new can be staged"),
            _ => Check::ok("space", free),
        };
    };
    let needs = format!("{id} needs {}", format_bytes(need));
    if let Some(max) = max_size.filter(|&max| need > max) {
        let summary = format!("{needs}, more than max_size ({})", format_bytes(max));
        return Check::fail("space", summary)
            .advise("raise max_size (--max-size) or use a smaller model");
    }
    if need > space.total.saturating_sub(min_free) {
        let summary = format!("{needs}; the cache volume cannot hold it even when empty ({free})");
        return Check::fail("space", summary)
            .advise("use a larger cache volume (--cache-dir) or a smaller min_free");
    }
    if need > usable {
        return Check::warn("space", format!("{needs}; {free}")).advise(
            "stagefs evicts least recently used copies to make room; if other files fill the volume, free space or run `stagefs evict --older-than 30d`",
        );
    }
    Check::ok("space", format!("{free}; {needs}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Verdict;

    const GIB: u64 = 1 << 30;

    #[test]
    fn space_verdicts_keep_the_reserve() {
        let volume = |total, available| VolumeSpace { total, available };
        let space = volume(100 * GIB, 30 * GIB);
        let reserve = default_min_free(space);
        assert_eq!(reserve, 10 * GIB);
        let check = |space, max, size| space_check(space, reserve, max, Some(("o/m", size)));
        let fits = check(space, None, 15 * GIB);
        assert_eq!(fits.verdict, Verdict::Ok, "{}", fits.summary);
        let reserved = "20.0 GiB usable after the 10.0 GiB reserve";
        assert!(fits.summary.contains(reserved), "{}", fits.summary);
        assert_eq!(check(space, None, 25 * GIB).verdict, Verdict::Warn);
        assert_eq!(check(space, None, 95 * GIB).verdict, Verdict::Fail);
        let capped = check(space, Some(GIB), 2 * GIB);
        assert!(capped.verdict == Verdict::Fail && capped.summary.contains("max_size"));
        let limited = space_check(space, reserve, Some(GIB), None).summary;
        let expected = "30.0 GiB free on the cache volume, 20.0 GiB usable after the 10.0 GiB reserve; staged copies are limited to 1.0 GiB (max_size)";
        assert_eq!(limited, expected);
        assert_eq!(usable_bytes(space, reserve, Some(GIB)), GIB);
        let full = space_check(volume(100 * GIB, 5 * GIB), reserve, None, None);
        assert_eq!(full.verdict, Verdict::Warn);
        let (dir, fs) = (Path::new("/s/c"), FsInfo::default());
        let inside = location_check(dir, (dir, false, &fs), &["/s".into()]);
        assert_eq!(inside.verdict, Verdict::Fail);
        assert_eq!(inside.summary, "/s/c is inside /s");
        let outside = location_check(dir, (dir, false, &fs), &[]).summary;
        assert_eq!(outside, "/s/c: unknown on  (unknown kind), not created yet");
    }
}
