//! The MLX-like pattern: `threads` workers share one queue of (file, offset) chunks of
//! at most `chunk` bytes, ordered round-robin across the files, and each `pread`s the
//! next chunk until every byte of every file has been read once. MLX reads all shards
//! of a model this way at `mx.eval` time, so a path that is fast for one sequential
//! reader but stalls under many concurrent large reads shows up here.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::latency::{Summary, merge};

/// One pread: `len` bytes of file number `file` at `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Chunk {
    file: usize,
    offset: u64,
    len: usize,
}

/// What one worker did.
#[derive(Debug, Default)]
struct Work {
    bytes: u64,
    latencies: Vec<Duration>,
}

/// Reads every file completely with `threads` workers and reports throughput and
/// per-pread latency.
pub(crate) fn run(paths: &[PathBuf], threads: usize, chunk: u64) -> anyhow::Result<Value> {
    if threads == 0 {
        bail!("--threads must be at least 1");
    }
    let chunk = usize::try_from(chunk).context("--chunk does not fit in memory")?;
    // Opens are timed apart from the reads: through stagefs an open may stage a file,
    // which is a different cost from the reads this pattern is about.
    let opened = Instant::now();
    let files = paths
        .iter()
        .map(|p| open(p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let open_seconds = opened.elapsed().as_secs_f64();
    let sizes = files.iter().map(|(_, size)| *size).collect::<Vec<_>>();
    let plan = plan(&sizes, chunk);
    let files = files.into_iter().map(|(f, _)| f).collect::<Vec<_>>();

    let started = Instant::now();
    let work = read_all(&files, &plan, threads, chunk)?;
    let seconds = started.elapsed().as_secs_f64();

    let expected: u64 = sizes.iter().sum();
    if work.bytes != expected {
        bail!("read {} bytes, expected {expected}", work.bytes);
    }
    let preads = work.latencies.len();
    let summary = Summary::of(work.latencies);
    Ok(merge(
        json!({
            "pattern": "pread",
            "files": paths.len(),
            "threads": threads,
            "chunk_bytes": chunk,
            "preads": preads,
            "open_seconds": open_seconds,
            "total_bytes": work.bytes,
            "seconds": seconds,
            "mib_per_s": work.bytes as f64 / (1 << 20) as f64 / seconds.max(1e-9),
        }),
        summary.to_json("pread"),
    ))
}

fn open(path: &Path) -> anyhow::Result<(File, u64)> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let size = file
        .metadata()
        .with_context(|| format!("stat {}", path.display()))?
        .len();
    Ok((file, size))
}

/// The queue: chunk 0 of every file, then chunk 1 of every file, and so on, so the
/// workers are spread over all files at once the way MLX spreads them over shards.
fn plan(sizes: &[u64], chunk: usize) -> Vec<Chunk> {
    let step = chunk as u64;
    let rounds = sizes.iter().map(|s| s.div_ceil(step)).max().unwrap_or(0);
    let mut plan = Vec::new();
    for round in 0..rounds {
        for (file, &size) in sizes.iter().enumerate() {
            let offset = round * step;
            if offset < size {
                let len = (size - offset).min(step) as usize;
                plan.push(Chunk { file, offset, len });
            }
        }
    }
    plan
}

fn read_all(files: &[File], plan: &[Chunk], threads: usize, chunk: usize) -> anyhow::Result<Work> {
    let next = AtomicUsize::new(0);
    let results = thread::scope(|scope| {
        let handles = (0..threads)
            .map(|_| scope.spawn(|| worker(files, plan, &next, chunk)))
            .collect::<Vec<_>>();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a reader thread panicked")))
            })
            .collect::<Vec<_>>()
    });
    let mut total = Work::default();
    for result in results {
        let work = result?;
        total.bytes += work.bytes;
        total.latencies.extend(work.latencies);
    }
    Ok(total)
}

/// Takes chunks off the shared queue until it is empty; on an error, empties the
/// queue so the other workers stop too.
fn worker(
    files: &[File],
    plan: &[Chunk],
    next: &AtomicUsize,
    chunk: usize,
) -> anyhow::Result<Work> {
    // Filled, not zeroed: a zeroed allocation is lazily mapped, and the first pread
    // into it would also time the page faults of the buffer itself.
    let mut buf = vec![0x5a_u8; chunk];
    let mut work = Work::default();
    loop {
        let index = next.fetch_add(1, Ordering::Relaxed);
        let Some(c) = plan.get(index) else {
            return Ok(work);
        };
        let Some(file) = files.get(c.file) else {
            bail!("chunk names file {} of {}", c.file, files.len());
        };
        let started = Instant::now();
        // One pread normally returns the whole chunk; read_exact_at only loops on a
        // short read, and a file that shrank fails instead of reading less.
        if let Err(e) = file.read_exact_at(&mut buf[..c.len], c.offset) {
            next.store(plan.len(), Ordering::Relaxed);
            return Err(e).with_context(|| format!("pread of file {} at {}", c.file, c.offset));
        }
        work.latencies.push(started.elapsed());
        work.bytes += c.len as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_is_round_robin_and_covers_every_byte() {
        let plan = plan(&[10, 25, 0], 10);
        let expect = [(0, 0, 10), (1, 0, 10), (1, 10, 10), (1, 20, 5)];
        let got: Vec<_> = plan.iter().map(|c| (c.file, c.offset, c.len)).collect();
        assert_eq!(got, expect);
    }
}
