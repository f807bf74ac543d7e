//! A short measurement of how the source reads: latency of a few small reads spread
//! over one large file, then sequential throughput. The page cache is dropped for the
//! file first, so the numbers are the source's, not memory's. Every read may hang on
//! a dead source: only the worker runs this.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Small reads for the latency figure.
const LATENCY_READS: u64 = 5;
const SMALL_READ: u64 = 4 << 10;
/// The sequential read stops after this many bytes or this long, whichever is first.
const THROUGHPUT_BYTES: u64 = 64 << 20;
const THROUGHPUT_TIME: Duration = Duration::from_secs(3);

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
    let mut file = File::open(path)?;
    let file_size = file.metadata()?.len();
    if file_size == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the file is empty",
        ));
    }
    forget_cached(&file, Access::Random);
    let mut buf = vec![0u8; 1 << 20];
    let mut times = Vec::new();
    for i in 0..LATENCY_READS {
        // Page-aligned offsets at the middle of each fifth of the file.
        let offset = (file_size * (2 * i + 1) / (2 * LATENCY_READS)) & !(SMALL_READ - 1);
        let start = Instant::now();
        file.read_at(&mut buf[..SMALL_READ as usize], offset)?;
        times.push(start.elapsed());
    }
    times.sort();
    forget_cached(&file, Access::Sequential);
    let (mut bytes_read, start) = (0u64, Instant::now());
    while bytes_read < THROUGHPUT_BYTES && start.elapsed() < THROUGHPUT_TIME {
        match file.read(&mut buf)? {
            0 => break,
            n => bytes_read += n as u64,
        }
    }
    // A tiny local file can read in less than a clock tick; never divide by zero.
    let seconds = start.elapsed().as_secs_f64().max(1e-6);
    let latency_ms = times[times.len() / 2].as_secs_f64() * 1000.0;
    let throughput_bytes_per_sec = bytes_read as f64 / seconds;
    let file = path.to_path_buf();
    Ok(Probe {
        file,
        file_size,
        latency_ms,
        throughput_bytes_per_sec,
        bytes_read,
        seconds,
    })
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
    let pattern = match access {
        Access::Random => libc::POSIX_FADV_RANDOM,
        Access::Sequential => libc::POSIX_FADV_SEQUENTIAL,
    };
    // SAFETY: the descriptor is open for the life of `file`; fadvise only gives hints.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, pattern);
    }
}

/// macOS has no per-file cache drop; F_NOCACHE makes this descriptor's reads bypass
/// the cache instead.
#[cfg(target_os = "macos")]
fn forget_cached(file: &File, _access: Access) {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open for the life of `file`; F_NOCACHE takes an int.
    unsafe {
        libc::fcntl(file.as_raw_fd(), libc::F_NOCACHE, 1);
    }
}

/// `12 µs`, `1.5 ms`, `42 ms`, `2.3 s`.
pub(crate) fn format_latency(ms: f64) -> String {
    match ms {
        ..1.0 => format!("{:.0} µs", ms * 1000.0),
        ..10.0 => format!("{ms:.1} ms"),
        ..1000.0 => format!("{ms:.0} ms"),
        _ => format!("{:.1} s", ms / 1000.0),
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
    match seconds {
        ..90.0 => format!("{:.0} s", seconds.max(1.0)),
        ..5400.0 => format!("{:.0} min", seconds / 60.0),
        _ => format!("{:.1} h", seconds / 3600.0),
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
        assert!(probe.latency_ms >= 0.0 && probe.throughput_bytes_per_sec > 0.0);
        std::fs::write(&path, b"")?;
        assert!(measure(&path).is_err());
        Ok(())
    }

    #[test]
    fn formats() {
        let latencies = [0.084, 1.54, 42.4, 2300.0].map(format_latency);
        assert_eq!(latencies, ["84 µs", "1.5 ms", "42 ms", "2.3 s"]);
        let rates = [850.0, 2.4].map(|mib| format_rate(mib * 1048576.0));
        assert_eq!(rates, ["850 MiB/s", "2.4 MiB/s"]);
        let durations = [0.2, 600.0, 3.5 * 3600.0].map(format_duration);
        assert_eq!(durations, ["1 s", "10 min", "3.5 h"]);
    }
}
