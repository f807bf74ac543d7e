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

/// The budget as the config file sets it; unset keys take the mount's defaults.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Limits {
    pub(crate) min_free: Option<u64>,
    pub(crate) max_size: Option<u64>,
}

/// The cache as reported in JSON.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CacheReport {
    pub(crate) dir: PathBuf,
    pub(crate) exists: bool,
    /// The filesystem of the directory (or of its nearest existing ancestor).
    pub(crate) fs: Option<FsInfo>,
    pub(crate) total_bytes: Option<u64>,
    pub(crate) available_bytes: Option<u64>,
    /// Free space the mount leaves alone.
    pub(crate) min_free_bytes: Option<u64>,
    /// What staging may use: available minus the reserve.
    pub(crate) usable_bytes: Option<u64>,
    pub(crate) max_size_bytes: Option<u64>,
}

/// Where the cache directory is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Place {
    /// The directory with links resolved, as far as it exists.
    resolved: PathBuf,
    exists: bool,
    fs: FsInfo,
    space: VolumeSpace,
}

/// The `cache` and `space` checks from what the worker found. `roots` are the
/// directories the cache must not be inside (the source; the mount point).
pub(crate) fn inspect(
    gathered: &Gathered,
    dir: &Path,
    limits: Limits,
    roots: &[PathBuf],
    model: Option<&Model>,
) -> (Vec<Check>, CacheReport) {
    let mut report = CacheReport {
        dir: dir.to_path_buf(),
        exists: false,
        fs: None,
        total_bytes: None,
        available_bytes: None,
        min_free_bytes: None,
        usable_bytes: None,
        max_size_bytes: limits.max_size,
    };
    let place = match got!(gathered, Cache) {
        Some(Ok(place)) => place,
        Some(Err(e)) => {
            let check = Check::fail("cache", format!("{}: {e}", dir.display())).advise(
                "choose a writable --cache-dir (or `cache_dir` in the config file) on a local disk",
            );
            return (vec![check], report);
        }
        None => {
            let check = Check::fail("cache", format!("{} {}", dir.display(), gathered.missing))
                .advise("put the cache on a local disk");
            return (vec![check], report);
        }
    };
    let min_free = limits
        .min_free
        .unwrap_or_else(|| Budget::default_min_free(place.space));
    let usable = place.space.available.saturating_sub(min_free);
    report.exists = place.exists;
    report.fs = Some(place.fs.clone());
    report.total_bytes = Some(place.space.total);
    report.available_bytes = Some(place.space.available);
    report.min_free_bytes = Some(min_free);
    report.usable_bytes = Some(usable);
    let checks = vec![
        location_check(dir, place, roots),
        space_check(place.space, min_free, limits.max_size, model),
    ];
    (checks, report)
}

/// Resolves the directory, or its nearest existing ancestor for one not created yet.
pub(crate) fn place(dir: &Path) -> io::Result<Place> {
    let existing = dir
        .ancestors()
        .find(|a| a.exists())
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no part of it exists"))?;
    let rest = dir.strip_prefix(existing).unwrap_or(Path::new(""));
    let canonical = std::fs::canonicalize(existing)?;
    Ok(Place {
        resolved: canonical.join(rest),
        exists: existing == dir,
        fs: mounts::filesystem_of(&canonical)?,
        space: volume_space(&canonical)?,
    })
}

fn location_check(dir: &Path, place: &Place, roots: &[PathBuf]) -> Check {
    let shown = dir.display();
    let created = if place.exists {
        ""
    } else {
        ", not created yet"
    };
    let summary = format!("{shown}: {}{created}", place.fs.describe());
    if let Some(root) = roots.iter().find(|r| place.resolved.starts_with(r)) {
        return Check::fail("cache", format!("{shown} is inside {}", root.display())).advise(
            "put the cache on a local disk outside the source and the mount (--cache-dir or `cache_dir`)",
        );
    }
    match place.fs.kind {
        FsKind::Network => Check::warn("cache", summary)
            .advise("put the cache on a local SSD: staging onto a network disk gains nothing"),
        FsKind::Stagefs => Check::fail("cache", summary)
            .advise("a stagefs mount is read-only; put the cache on a local disk"),
        FsKind::Usb | FsKind::Removable => Check::warn("cache", summary)
            .advise("an internal SSD serves staged weights (and mmap) faster"),
        FsKind::Local | FsKind::Fuse | FsKind::Unknown => Check::ok("cache", summary),
    }
}

fn space_check(
    space: VolumeSpace,
    min_free: u64,
    max_size: Option<u64>,
    model: Option<&Model>,
) -> Check {
    let usable = space.available.saturating_sub(min_free);
    let free = format!(
        "{} free on the cache volume, {} usable after the {} reserve",
        format_bytes(space.available),
        format_bytes(usable),
        format_bytes(min_free)
    );
    let Some(model) = model else {
        return if usable == 0 {
            Check::warn("space", free)
                .advise("free space on the cache volume: nothing new can be staged")
        } else {
            Check::ok("space", free)
        };
    };
    let need = model.size_bytes;
    let needs = format!("{} needs {}", model.id, format_bytes(need));
    if let Some(max) = max_size.filter(|&max| need > max) {
        return Check::fail(
            "space",
            format!("{needs}, more than max_size ({})", format_bytes(max)),
        )
        .advise("raise max_size (--max-size) or use a smaller model");
    }
    if need > space.total.saturating_sub(min_free) {
        return Check::fail(
            "space",
            format!("{needs}; the cache volume cannot hold it even when empty ({free})"),
        )
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

    fn model(size: u64) -> Model {
        Model {
            id: "o/m".into(),
            kind: stagefs_cache::models::ModelKind::HfRepo,
            path: "/s/models--o--m".into(),
            snapshot: Some("/s/models--o--m/snapshots/c".into()),
            files: 1,
            size_bytes: size,
            largest_weight: None,
        }
    }

    #[test]
    fn space_verdicts_keep_the_reserve() {
        let space = VolumeSpace {
            total: 100 * GIB,
            available: 30 * GIB,
        };
        let reserve = Budget::default_min_free(space);
        assert_eq!(reserve, 10 * GIB);
        let fits = space_check(space, reserve, None, Some(&model(15 * GIB)));
        assert_eq!(fits.verdict, Verdict::Ok, "{}", fits.summary);
        assert!(
            fits.summary
                .contains("20.0 GiB usable after the 10.0 GiB reserve"),
            "{}",
            fits.summary
        );
        let tight = space_check(space, reserve, None, Some(&model(25 * GIB)));
        assert_eq!(tight.verdict, Verdict::Warn);
        let never = space_check(space, reserve, None, Some(&model(95 * GIB)));
        assert_eq!(never.verdict, Verdict::Fail);
        let capped = space_check(space, reserve, Some(GIB), Some(&model(2 * GIB)));
        assert_eq!(capped.verdict, Verdict::Fail);
        assert!(capped.summary.contains("max_size"));
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
        let placed = |dir: &Path| {
            let lines = vec![Line::Cache(place(dir).map_err(StepError::of))];
            Gathered {
                lines,
                missing: Unanswered::Broken("none".into()),
            }
        };
        let roots = [std::fs::canonicalize(dir.path())?];
        let (checks, report) = inspect(&placed(&cache), &cache, Limits::default(), &roots, None);
        assert_eq!(checks[0].verdict, Verdict::Fail, "{checks:?}");
        assert!(!report.exists);
        let (checks, report) = inspect(
            &placed(dir.path()),
            dir.path(),
            Limits::default(),
            &[],
            None,
        );
        assert_ne!(checks[0].verdict, Verdict::Fail, "{checks:?}");
        assert!(report.exists && report.usable_bytes.is_some());
        Ok(())
    }
}
