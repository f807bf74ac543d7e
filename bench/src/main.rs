//! `readbench`: replays the read patterns of model loaders against any set of files,
//! so one binary can time the same workload through a stagefs mount, on the local
//! cache files, and on the network source, and the numbers are comparable.
//!
//! - `pread`: MLX-like. Several threads issue large `pread`s interleaved across all
//!   shards until every byte is read once (MLX reads weights this way at `mx.eval`).
//! - `mmap`: safetensors-like random access. Touches random 4 KiB pages of read-only
//!   mappings and times each page fault.
//! - `cold-open`: a plain model load. Times `open()` (through stagefs this is where
//!   the whole file is staged) and then a sequential read, per file.
//! - `stage`: one file staged by the core alone (no mount), timed to the moment its
//!   copy is committed, with the CPU time it took.
//! - `nfs`: one staged file read over loopback NFS by several connections at once,
//!   against the same reads of its copy (what the NFS server alone can serve).
//!
//! Each prints one JSON object on stdout. Nothing here judges the numbers; the driver
//! (`bench/run.sh`) compares them with baselines measured in the same run.

mod cold_open;
mod latency;
mod lean_nfs;
mod mmap;
mod nfs;
mod pread;
mod stage;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Replays model-loader read patterns and prints timings as JSON.
#[derive(Debug, Parser)]
#[command(name = "readbench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Parallel large preads interleaved round-robin across FILEs (MLX-like).
    Pread {
        /// Threads issuing preads.
        #[arg(long, default_value_t = 8)]
        threads: usize,
        /// Largest single pread (4096, 512K, 32M), spelled as for `stagefs`.
        #[arg(long, default_value = "32M", value_parser = chunk_size)]
        chunk: u64,
        /// Files to read completely.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Random 4 KiB page touches on read-only mappings of FILEs (safetensors-like).
    Mmap {
        /// Number of pages to touch.
        #[arg(long, default_value_t = 10_000)]
        touches: u64,
        /// Seed of the page sequence; the same seed touches the same pages.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Files to map.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Time open() and a full sequential read of each FILE, in order.
    ColdOpen {
        /// Files to load.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Stage FILE (relative to SOURCE) into a new store in CACHE, without a mount.
    Stage {
        /// Reads in flight [default: the stager's].
        #[arg(long)]
        streams: Option<usize>,
        /// Bytes per read (2M, 8M) [default: the stager's].
        #[arg(long, value_parser = chunk_size)]
        chunk: Option<u64>,
        /// The source root.
        source: PathBuf,
        /// The cache directory (new or empty).
        cache: PathBuf,
        /// The file to stage, relative to SOURCE.
        file: PathBuf,
    },
    /// Serve SOURCE over loopback NFS (cache in CACHE), stage FILE, and read it with
    /// READERS connections at once against as many preads of its copy. As root.
    Nfs {
        /// NFS connections (and pread threads) reading at once.
        #[arg(long, default_value_t = 8)]
        readers: usize,
        /// Bytes per READ (the server's largest is 1M).
        #[arg(long, default_value_t = 1 << 20)]
        chunk: u32,
        /// Rounds of each, alternating.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// The source root.
        source: PathBuf,
        /// The cache directory.
        cache: PathBuf,
        /// The file to read, relative to SOURCE.
        file: PathBuf,
    },
    /// Over loopback NFS, time a cold FILE's first byte, with a client that backs off
    /// after JUKEBOX as macOS's or Linux's does, against the time its copy took.
    Jukebox {
        /// Delay before every read of the source file, in milliseconds (sets the copy's length).
        #[arg(long, default_value_t = 200)]
        delay_ms: u64,
        /// Whose retry schedule the client follows.
        #[arg(long, value_enum, default_value = "macos")]
        client: nfs::Backoff,
        /// The source root.
        source: PathBuf,
        /// The cache directory (new or empty).
        cache: PathBuf,
        /// The file to read, relative to SOURCE.
        file: PathBuf,
    },
}

/// A read size: any size `stagefs` accepts, except zero, which would never finish.
fn chunk_size(text: &str) -> Result<u64, String> {
    match stagefs_control::units::parse_size(text)? {
        0 => Err(format!("'{text}': a read must be at least 1 byte")),
        bytes => Ok(bytes),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Logs only where RUST_LOG asks for them, on stderr: the report is stdout.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let report = match cli.command {
        Command::Pread {
            threads,
            chunk,
            files,
        } => pread::run(&files, threads, chunk),
        Command::Mmap {
            touches,
            seed,
            files,
        } => mmap::run(&files, touches, seed),
        Command::ColdOpen { files } => cold_open::run(&files),
        Command::Stage {
            streams,
            chunk,
            source,
            cache,
            file,
        } => {
            let defaults = stagefs_source::copy::CopyOptions::default();
            let copy = stagefs_source::copy::CopyOptions {
                streams: streams.unwrap_or(defaults.streams),
                chunk: chunk.map(|c| c as usize),
            };
            stage::run(&source, &cache, &file, copy)
        }
        Command::Nfs {
            readers,
            chunk,
            rounds,
            source,
            cache,
            file,
        } => nfs::run(&source, &cache, &file, readers, chunk, rounds),
        Command::Jukebox {
            delay_ms,
            client,
            source,
            cache,
            file,
        } => nfs::jukebox(
            &source,
            &cache,
            &file,
            std::time::Duration::from_millis(delay_ms),
            client,
        ),
    };
    match report {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("readbench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::chunk_size;

    #[test]
    fn chunks_are_spelled_as_for_stagefs() {
        assert_eq!(chunk_size("4096"), Ok(4096));
        assert_eq!(chunk_size("32M"), Ok(32 << 20));
        assert_eq!(chunk_size("1g"), Ok(1 << 30));
        // Refused before the shared parser: a fraction and the MB and KiB spellings.
        assert_eq!(chunk_size("1.5M"), Ok(3 << 19));
        assert_eq!(chunk_size("64MB"), Ok(64 << 20));
        assert_eq!(chunk_size("512 KiB"), Ok(512 << 10));
        assert!(chunk_size("0").is_err_and(|e| e.contains("at least 1 byte")));
        assert!(chunk_size("12X").is_err_and(|e| e.contains("unknown size suffix")));
    }
}
