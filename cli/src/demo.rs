//! `stagefs demo`: generate a small model, mount it, load it through the mount, report.

use std::fs::{self, File};
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use stagefs_mount::{MountSpec, Running};

use crate::args::DemoArgs;
use crate::daemon::explain;
use crate::hfgen::{self, DemoModel};
use crate::units::{count, format_bytes};

const REPO: &str = "stagefs/demo-model";

/// The free space the demo's cache leaves on its disk. The default reserve, a tenth
/// of the volume (up to 50 GiB), would refuse the demo's small model on a disk more
/// than 90% full, where a user's first command must still work; the demo's cache
/// lives for a minute in a temporary directory and is removed with it.
const DEMO_MIN_FREE: u64 = 32 << 20;

/// Runs the demo in a temporary directory that is removed afterwards.
pub(crate) fn run(args: &DemoArgs) -> anyhow::Result<()> {
    let work = tempfile::Builder::new()
        .prefix("stagefs-demo-")
        .tempdir()
        .context("creating a temporary directory")?;
    let mut spec = MountSpec::new(
        work.path().join("source-hub"),
        work.path().join("mnt"),
        work.path().join("cache"),
    );
    spec.fs.hint = Some(crate::args::flag_hint);
    spec.min_free = Some(DEMO_MIN_FREE);
    fs::create_dir_all(&spec.mountpoint)?;
    println!(
        "generating {REPO}: {} shards of {} in {}",
        args.shards,
        format_bytes(args.shard_size),
        spec.source.display()
    );
    let model = hfgen::generate(&spec.source, REPO, args.shards, args.shard_size)?;
    let running = Running::start(&spec).map_err(explain)?;
    println!(
        "mounted at {} (cache {})",
        spec.mountpoint.display(),
        spec.cache_dir.display()
    );
    let loaded = load_through_mount(&spec, &model);
    let metrics = running.metrics();
    running.stop().map_err(explain)?;
    let elapsed = loaded?;
    println!(
        "staged {} ({}) in {:.2}s; {} read from the source; every byte matched the source",
        count(to_usize(metrics.stage_copies), "file", "files"),
        format_bytes(metrics.bytes_copied),
        elapsed.as_secs_f64(),
        count(to_usize(metrics.source_opens), "small file", "small files"),
    );
    println!("unmounted and removed {}", work.path().display());
    Ok(())
}

/// Reads every snapshot file through the mount, as a loader would, and checks it
/// against the source. Returns the total time.
fn load_through_mount(spec: &MountSpec, model: &DemoModel) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let snapshot = model.snapshot_rel();
    println!(
        "  {:<42} {:>10} {:>10} {:>12}",
        "file", "size", "open", "read"
    );
    for file in &model.files {
        let rel = snapshot.join(&file.name);
        let (open, read, bytes) = timed_read(&spec.mountpoint.join(&rel))?;
        if bytes != fs::read(spec.source.join(&rel))? {
            bail!(
                "{}: bytes read through the mount differ from the source",
                file.name
            );
        }
        println!(
            "  {:<42} {:>10} {:>8.1}ms {:>12}",
            file.name,
            format_bytes(file.size),
            open.as_secs_f64() * 1e3,
            read_speed(bytes.len(), read),
        );
    }
    Ok(started.elapsed())
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// How fast a read was: MiB/s for a file of a MiB or more, else the read's time (a
/// rate of a few hundred bytes would print as 0MiB/s).
fn read_speed(bytes: usize, took: Duration) -> String {
    if bytes < 1 << 20 {
        return format!("{:.2}ms", took.as_secs_f64() * 1e3);
    }
    let rate = bytes as f64 / f64::from(1 << 20) / took.as_secs_f64().max(1e-6);
    format!("{rate:.0}MiB/s")
}

fn timed_read(path: &Path) -> anyhow::Result<(Duration, Duration, Vec<u8>)> {
    let t0 = Instant::now();
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let open = t0.elapsed();
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok((open, t0.elapsed() - open, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_files_show_their_read_time_not_a_zero_rate() {
        let speed = read_speed(512, Duration::from_micros(1500));
        assert_eq!(speed, "1.50ms");
        assert_eq!(read_speed(32 << 20, Duration::from_millis(100)), "320MiB/s");
    }
}
