//! Staging one file with the core alone, no mount: the copy, both hashes, the sync
//! and the commit, timed from the call to the moment an open would be answered (the
//! copy whole, verified and in the index) and to the moment it is durable in the
//! store, with the CPU time the process spent. It isolates the copy's cost from
//! FUSE's, and is what `perf record` is pointed at to see where a copy's time goes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use serde_json::{Value, json};
use stagefs_source::SourceTree;
use stagefs_source::copy::CopyOptions;
use stagefs_stage::{Stager, StagerOptions};
use stagefs_store::{Budget, Store};

/// Stages `rel` of `source` into a store in `cache` (which must not exist or be
/// empty) and reports when the copy was committed and the CPU time it took.
pub(crate) fn run(
    source: &Path,
    cache: &Path,
    rel: &Path,
    copy: CopyOptions,
) -> anyhow::Result<Value> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting a runtime")?;
    let tree = SourceTree::new(source).context("opening the source")?;
    let store = Store::open(cache, Budget::default()).context("opening the store")?;
    let options = StagerOptions {
        copy,
        ..StagerOptions::default()
    };
    let stager = Stager::with_options(
        tree,
        store,
        Arc::default(),
        runtime.handle().clone(),
        options,
    );
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    let bytes = runtime.block_on(stager.stage(rel))?.stamp.size;
    let answered_s = started.elapsed().as_secs_f64();
    stager.store().commit_now();
    let committed_s = started.elapsed().as_secs_f64();
    let (user, sys) = cpu_seconds();
    anyhow::ensure!(
        stager
            .store()
            .contains(&stagefs_store::Key::for_source_path(rel)),
        "the copy of {} is not in the store after staging",
        rel.display()
    );
    Ok(json!({
        "pattern": "stage",
        "path": PathBuf::from(rel),
        "bytes": bytes,
        "streams": copy.streams,
        "chunk": copy.chunk.map_or_else(|| "by source".to_string(), |c| c.to_string()),
        "answered_s": answered_s,
        "committed_s": committed_s,
        "user_s": user - cpu_before.0,
        "sys_s": sys - cpu_before.1,
        "mib_per_s": bytes as f64 / (1 << 20) as f64 / committed_s.max(1e-9),
    }))
}

/// User and system CPU seconds of this process so far, all threads.
fn cpu_seconds() -> (f64, f64) {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: usage points to writable rusage storage, which getrusage fills.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(usage.ru_utime), secs(usage.ru_stime))
}
