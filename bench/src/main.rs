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
//!
//! Each prints one JSON object on stdout. Nothing here judges the numbers; the driver
//! (`bench/run.sh`) compares them with baselines measured in the same run.

mod cold_open;
mod latency;
mod mmap;
mod pread;
mod size;

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
        /// Largest single pread (4096, 512K, 32M).
        #[arg(long, default_value = "32M", value_parser = size::parse_size)]
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
