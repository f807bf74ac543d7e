//! The cache checks: where the cache directory is, and whether its volume has room
//! for the model once the free-space reserve is kept.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use stagefs_cache::Budget;
use stagefs_cache::budget::{VolumeSpace, volume_space};

use super::fskind::{FsInfo, FsKind};
use super::model::Model;
use super::mounts;
use super::report::Check;
use super::worker::Gathered;
use crate::units::format_bytes;

/// The cache as reported in JSON: `fs` is the filesystem of the directory (or of its
/// nearest existing ancestor), `min_free_bytes` the free space the mount leaves
/// alone, `usable_bytes` what staging may use (available minus that reserve).
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

/// Where the cache directory is: resolved as far as it exists, its filesystem and
/// its volume's space.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Place(PathBuf, bool, FsInfo, VolumeSpace);

/// Resolves the directory, or its nearest existing ancestor for one not created yet
/// (in the worker).
pub(crate) fn place(dir: &Path) -> io::Result<Place> {
    let missing = || io::Error::new(io::ErrorKind::NotFound, "no part of it exists");
    let existing = dir.ancestors().find(|a| a.exists()).ok_or_else(missing)?;
    let rest = dir.strip_prefix(existing).unwrap_or(Path::new(""));
    let canonical = std::fs::canonicalize(existing)?;
    let (fs, space) = (
        mounts::filesystem_of(&canonical)?,
        volume_space(&canonical)?,
    );
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
    let report = CacheReport {
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
    let min_free = min_free.unwrap_or_else(|| Budget::default_min_free(*space));
    let usable = space.available.saturating_sub(min_free);
    let location = location_check(dir, resolved, *exists, fs, roots);
    let need = model.map(|m| (m.id.as_str(), m.size_bytes));
    let checks = vec![location, space_check(*space, min_free, max_size, need)];
    let report = CacheReport {
        exists: *exists,
        fs: Some(fs.clone()),
        total_bytes: Some(space.total),
        available_bytes: Some(space.available),
        min_free_bytes: Some(min_free),
        usable_bytes: Some(usable),
        ..report
    };
    (checks, report)
}

fn location_check(
    dir: &Path,
    resolved: &Path,
    exists: bool,
    fs: &FsInfo,
    roots: &[PathBuf],
) -> Check {
    let shown = dir.display();
    let created = if exists { "" } else { ", not created yet" };
    let summary = format!("{shown}: {}{created}", fs.describe());
    if let Some(root) = roots.iter().find(|r| resolved.starts_with(r)) {
        return Check::fail("cache", format!("{shown} is inside {}", root.display())).advise(
            "put the cache on a local disk outside the source and the mount (--cache-dir or `cache_dir`)",
        );
    }
    let (check, advice) = match fs.kind {
        FsKind::Network => (
            Check::warn("cache", summary),
            "put the cache on a local SSD: staging onto a network disk gains nothing",
        ),
        FsKind::Stagefs => (
            Check::fail("cache", summary),
            "a stagefs mount is read-only; put the cache on a local disk",
        ),
        FsKind::Usb | FsKind::Removable => (
            Check::warn("cache", summary),
            "an internal SSD serves staged weights (and mmap) faster",
        ),
        FsKind::Local | FsKind::Fuse | FsKind::Unknown => return Check::ok("cache", summary),
    };
    check.advise(advice)
}

/// The `space` check for a model of `need` = (id, bytes), if any.
fn space_check(
    space: VolumeSpace,
    min_free: u64,
    max_size: Option<u64>,
    need: Option<(&str, u64)>,
) -> Check {
    let usable = space.available.saturating_sub(min_free);
    let (available, reserve) = (format_bytes(space.available), format_bytes(min_free));
    let free = format!(
        "{available} free on the cache volume, {} usable after the {reserve} reserve",
        format_bytes(usable)
    );
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
    use crate::doctor::report::Verdict;
    use crate::doctor::worker::{Line, StepError, Unanswered};

    const GIB: u64 = 1 << 30;

    #[test]
    fn space_verdicts_keep_the_reserve() {
        let space = VolumeSpace {
            total: 100 * GIB,
            available: 30 * GIB,
        };
        let reserve = Budget::default_min_free(space);
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
        let full = VolumeSpace {
            total: 100 * GIB,
            available: 5 * GIB,
        };
        assert_eq!(
            space_check(full, reserve, None, None).verdict,
            Verdict::Warn
        );
    }

    #[test]
    fn a_cache_inside_the_source_fails() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let cache = dir.path().join("hub/cache");
        let inspect = |dir: &Path, roots: &[PathBuf]| {
            let lines = vec![Line::Cache(place(dir).map_err(StepError::of))];
            let gathered = Gathered::new(lines, Unanswered::Broken("none".into()));
            inspect(&gathered, dir, (None, None), roots, None)
        };
        let (checks, report) = inspect(&cache, &[std::fs::canonicalize(dir.path())?]);
        assert_eq!(checks[0].verdict, Verdict::Fail, "{checks:?}");
        assert!(!report.exists);
        let (checks, report) = inspect(dir.path(), &[]);
        assert_ne!(checks[0].verdict, Verdict::Fail, "{checks:?}");
        assert!(report.exists && report.usable_bytes.is_some());
        Ok(())
    }
}
