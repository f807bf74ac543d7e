//! A short measurement of how the source reads: latency of a few small reads spread
//! over one large file, then sequential throughput. The page cache is dropped for the
//! file first, so the numbers are the source's, not memory's. Callers run this under
//! a deadline (`bounded`): every read may hang on a dead source.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Small reads for the latency figure.
const LATENCY_READS: u64 = 5;
const SMALL_READ: usize = 4 << 10;
/// The sequential read stops after this many bytes or this long, whichever is first.
const THROUGHPUT_BYTES: u64 = 64 << 20;
const THROUGHPUT_TIME: Duration = Duration::from_secs(3);
const CHUNK: usize = 1 << 20;

/// What was measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Probe {
    pub(crate) file: PathBuf,
    pub(crate) file_size: u64,
    /// Median time of one small read at a spread-out offset.
    pub(crate) latency_ms: f64,
    pub(crate) throughput_bytes_per_sec: f64,
    pub(crate) bytes_read: u64,
    pub(crate) seconds: f64,
}

/// Measures `file`.
pub(crate) fn measure(path: &Path) -> io::Result<Probe> {
    let file = File::open(path)?;
    let size = file.metadata()?.len();
    if size == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the file is empty",
        ));
    }
    forget_cached(&file, Access::Random);
    let latency = median(small_reads(&file, size)?);
    forget_cached(&file, Access::Sequential);
    let (bytes_read, elapsed) = read_ahead(&file)?;
    // A tiny local file can read in less than a clock tick; never divide by zero.
    let seconds = elapsed.as_secs_f64().max(1e-6);
    Ok(Probe {
        file: path.to_path_buf(),
        file_size: size,
        latency_ms: latency.as_secs_f64() * 1000.0,
        throughput_bytes_per_sec: bytes_read as f64 / seconds,
        bytes_read,
        seconds,
    })
}

fn small_reads(file: &File, size: u64) -> io::Result<Vec<Duration>> {
    let mut buf = vec![0u8; SMALL_READ];
    (0..LATENCY_READS)
        .map(|i| {
            // Page-aligned offsets at the middle of each fifth of the file.
            let offset = (size * (2 * i + 1) / (2 * LATENCY_READS)) & !(SMALL_READ as u64 - 1);
            let start = Instant::now();
            file.read_at(&mut buf, offset)?;
            Ok(start.elapsed())
        })
        .collect()
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times.get(times.len() / 2).copied().unwrap_or_default()
}

/// Reads from the start until the byte or time limit or the end of the file.
fn read_ahead(mut file: &File) -> io::Result<(u64, Duration)> {
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    let start = Instant::now();
    while total < THROUGHPUT_BYTES && start.elapsed() < THROUGHPUT_TIME {
        match file.read(&mut buf)? {
            0 => break,
            n => total += n as u64,
        }
    }
    Ok((total, start.elapsed()))
}

/// How the file is about to be read.
#[derive(Clone, Copy)]
enum Access {
    Random,
    Sequential,
}

/// Drops the file's cached pages (clean ones; a just-written file may stay cached)
/// and says how it will be read, so small reads do not trigger readahead.
#[cfg(target_os = "linux")]
fn forget_cached(file: &File, access: Access) {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let pattern = match access {
        Access::Random => libc::POSIX_FADV_RANDOM,
        Access::Sequential => libc::POSIX_FADV_SEQUENTIAL,
    };
    // SAFETY: fd is open for the life of `file`; fadvise only gives hints.
    unsafe {
        libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED);
        libc::posix_fadvise(fd, 0, 0, pattern);
    }
}

/// macOS has no per-file cache drop; F_NOCACHE makes this descriptor's reads bypass
/// the cache instead.
#[cfg(target_os = "macos")]
fn forget_cached(file: &File, _access: Access) {
    use std::os::fd::AsRawFd;
    // SAFETY: fd is open for the life of `file`; F_NOCACHE takes an int flag.
    unsafe {
        libc::fcntl(file.as_raw_fd(), libc::F_NOCACHE, 1);
    }
}

/// `12 µs`, `1.5 ms`, `42 ms`, `2.3 s`.
pub(crate) fn format_latency(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.1} s", ms / 1000.0)
    } else if ms >= 10.0 {
        format!("{ms:.0} ms")
    } else if ms >= 1.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{:.0} µs", ms * 1000.0)
    }
}

/// `850 MiB/s`, `2.4 MiB/s`.
pub(crate) fn format_rate(bytes_per_sec: f64) -> String {
    let mib = bytes_per_sec / f64::from(1u32 << 20);
    if mib >= 10.0 {
        format!("{mib:.0} MiB/s")
    } else {
        format!("{mib:.1} MiB/s")
    }
}

/// `45 s`, `12 min`, `3.5 h`.
pub(crate) fn format_duration(seconds: f64) -> String {
    if seconds < 90.0 {
        format!("{:.0} s", seconds.max(1.0))
    } else if seconds < 90.0 * 60.0 {
        format!("{:.0} min", seconds / 60.0)
    } else {
        format!("{:.1} h", seconds / 3600.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_a_file() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("blob");
        std::fs::write(&path, vec![7u8; 3 << 20])?;
        let probe = measure(&path)?;
        assert_eq!(probe.bytes_read, 3 << 20);
        assert!(probe.latency_ms >= 0.0);
        assert!(probe.throughput_bytes_per_sec > 0.0);
        std::fs::write(&path, b"")?;
        assert!(measure(&path).is_err());
        Ok(())
    }

    #[test]
    fn formats() {
        assert_eq!(format_latency(0.084), "84 µs");
        assert_eq!(format_latency(1.54), "1.5 ms");
        assert_eq!(format_latency(42.4), "42 ms");
        assert_eq!(format_latency(2300.0), "2.3 s");
        assert_eq!(format_rate(850.0 * 1048576.0), "850 MiB/s");
        assert_eq!(format_rate(2.4 * 1048576.0), "2.4 MiB/s");
        assert_eq!(format_duration(0.2), "1 s");
        assert_eq!(format_duration(600.0), "10 min");
        assert_eq!(format_duration(3.5 * 3600.0), "3.5 h");
    }
}
