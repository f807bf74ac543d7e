//! A plain model load: for each file in order, `open()` it and read it sequentially
//! to the end. Through stagefs the open returns only once the whole file is staged,
//! so the open time is the staging time and the read time is the local read; on any
//! other path the open is near zero and the read carries the whole cost.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use serde_json::{Value, json};

/// Read size of the sequential pass; large enough that syscall overhead is noise.
const BUFFER: usize = 8 << 20;

/// Opens and reads each file in turn and reports per-file and total times.
pub(crate) fn run(paths: &[PathBuf]) -> anyhow::Result<Value> {
    let mut buf = vec![0x5a_u8; BUFFER];
    let mut files = Vec::with_capacity(paths.len());
    let (mut bytes, mut open_s, mut read_s) = (0u64, 0f64, 0f64);
    let started = Instant::now();
    for path in paths {
        let one = load(path, &mut buf)?;
        bytes += one.bytes;
        open_s += one.open_s;
        read_s += one.read_s;
        files.push(json!({
            "path": path,
            "bytes": one.bytes,
            "open_s": one.open_s,
            "read_s": one.read_s,
        }));
    }
    let total_s = started.elapsed().as_secs_f64();
    Ok(json!({
        "pattern": "cold-open",
        "files": files,
        "total_bytes": bytes,
        "total_open_s": open_s,
        "total_read_s": read_s,
        "total_s": total_s,
        "total_mib_per_s": bytes as f64 / (1 << 20) as f64 / total_s.max(1e-9),
    }))
}

struct Load {
    bytes: u64,
    open_s: f64,
    read_s: f64,
}

fn load(path: &Path, buf: &mut [u8]) -> anyhow::Result<Load> {
    let started = Instant::now();
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let open_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let mut bytes = 0u64;
    loop {
        match file.read(buf) {
            Ok(0) => break,
            Ok(n) => bytes += n as u64,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }
    Ok(Load {
        bytes,
        open_s,
        read_s: started.elapsed().as_secs_f64(),
    })
}
