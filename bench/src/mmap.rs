//! The safetensors-like pattern: map every file read-only, tell the kernel access is
//! random (so it does not read ahead and each touch pays its own fault), then touch
//! `touches` pseudo-random 4 KiB pages across all files and time each touch. A page
//! that has to come from the network shows up as a slow fault, which is what stalls
//! a loader that mmaps weights from a remote mount.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use memmap2::{Advice, Mmap};
use serde_json::{Value, json};

use crate::latency::{Summary, merge};

/// The unit of a touch; the x86-64 and most arm64 Linux page size.
const PAGE: u64 = 4096;

/// Touches `touches` random pages of the files' mappings and reports fault latency.
pub(crate) fn run(paths: &[PathBuf], touches: u64, seed: u64) -> anyhow::Result<Value> {
    let maps = paths
        .iter()
        .map(|p| map(p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let pages = Pages::new(&maps);
    if pages.total == 0 {
        bail!("the files are empty; nothing to touch");
    }
    let mut rng = SplitMix64(seed);
    let mut latencies = Vec::with_capacity(usize::try_from(touches).unwrap_or(0));
    let mut distinct = HashSet::new();
    // Folding the bytes read keeps them observable, on top of the volatile reads.
    let mut fold = 0u8;
    let started = Instant::now();
    for _ in 0..touches {
        let page = rng.next() % pages.total;
        distinct.insert(page);
        let (map, offset) = pages.locate(&maps, page)?;
        let (byte, took) = touch(map, offset);
        fold ^= byte;
        latencies.push(took);
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(merge(
        json!({
            "pattern": "mmap",
            "files": paths.len(),
            "seed": seed,
            "touches": touches,
            "distinct_pages": distinct.len(),
            "mapped_bytes": maps.iter().map(|m| m.len() as u64).sum::<u64>(),
            "seconds": seconds,
            "touches_per_s": touches as f64 / seconds.max(1e-9),
            "fold": fold,
        }),
        Summary::of(latencies).to_json("fault"),
    ))
}

fn map(path: &Path) -> anyhow::Result<Mmap> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    if file.metadata()?.len() == 0 {
        bail!("{} is empty and cannot be mapped", path.display());
    }
    // SAFETY: the mapping is read-only and nothing in this process writes the file;
    // a file truncated underneath us would fault with SIGBUS, which the benchmark
    // accepts as a crash rather than a silently wrong figure.
    let map = unsafe { Mmap::map(&file) }.with_context(|| format!("mapping {}", path.display()))?;
    map.advise(Advice::Random)
        .with_context(|| format!("madvise(MADV_RANDOM) on {}", path.display()))?;
    Ok(map)
}

/// Reads the byte at `offset` the way a loader's first access to a page would, and
/// times it. The volatile read cannot be elided or hoisted out of the timed region.
fn touch(map: &Mmap, offset: usize) -> (u8, Duration) {
    let started = Instant::now();
    // SAFETY: `offset` < map.len(), checked by Pages::locate.
    let byte = unsafe { std::ptr::read_volatile(map.as_ptr().add(offset)) };
    (byte, started.elapsed())
}

/// Page numbers over all files end to end, so every page is equally likely.
struct Pages {
    /// The first global page number of each file.
    starts: Vec<u64>,
    total: u64,
}

impl Pages {
    fn new(maps: &[Mmap]) -> Pages {
        let mut starts = Vec::with_capacity(maps.len());
        let mut total = 0;
        for map in maps {
            starts.push(total);
            total += (map.len() as u64).div_ceil(PAGE);
        }
        Pages { starts, total }
    }

    /// The mapping holding global page `page`, and the byte offset of that page in it.
    fn locate<'m>(&self, maps: &'m [Mmap], page: u64) -> anyhow::Result<(&'m Mmap, usize)> {
        let file = self
            .starts
            .partition_point(|&s| s <= page)
            .saturating_sub(1);
        let (Some(map), Some(start)) = (maps.get(file), self.starts.get(file)) else {
            bail!("page {page} is outside the files");
        };
        let offset = usize::try_from((page - start) * PAGE)?;
        if offset >= map.len() {
            bail!("page {page} is past the end of file {file}");
        }
        Ok((map, offset))
    }
}

/// SplitMix64: tiny, fast, and the same sequence for the same seed everywhere, so a
/// run can be repeated page for page on another path or machine.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_is_deterministic() {
        let a: Vec<u64> = {
            let mut r = SplitMix64(7);
            (0..4).map(|_| r.next()).collect()
        };
        let mut r = SplitMix64(7);
        assert!(a.iter().all(|&x| x == r.next()));
        // Reference value of SplitMix64 seeded with 0.
        assert_eq!(SplitMix64(0).next(), 0xE220_A839_7B1D_CDAF);
    }
}
