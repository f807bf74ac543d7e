//! Counters of a running mount, in one place so their names stay consistent in logs,
//! the control socket and tests.

use std::sync::atomic::{AtomicU64, Ordering};

pub use stagefs_control::MetricsSnapshot;

/// Live counters, shared by the stager and the filesystem adapter.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Opens served by an existing, current staged copy.
    pub stage_hits: AtomicU64,
    /// Copies started because no current staged copy existed.
    pub stage_copies: AtomicU64,
    /// Bytes copied from the source into the cache by those copies.
    pub bytes_copied: AtomicU64,
    /// Copies of small files kept for when the source does not respond.
    pub kept_copies: AtomicU64,
    /// Opens answered with kernel passthrough to the staged copy.
    pub passthrough_opens: AtomicU64,
    /// Opens of staged files whose reads the daemon serves.
    pub daemon_opens: AtomicU64,
    /// Opens of small files read straight from the source.
    pub source_opens: AtomicU64,
    /// Read requests the daemon answered (passthrough reads never arrive here).
    pub daemon_reads: AtomicU64,
    /// Staged files handed out as a link to their local copy (readlink answers):
    /// the kernel opens and reads the copy itself, so those reads never arrive here.
    pub redirects: AtomicU64,
    /// Bytes written through the mount to the source.
    pub bytes_written: AtomicU64,
}

impl Metrics {
    /// Adds one to `counter`.
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads every counter.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MetricsSnapshot {
            stage_hits: get(&self.stage_hits),
            stage_copies: get(&self.stage_copies),
            bytes_copied: get(&self.bytes_copied),
            kept_copies: get(&self.kept_copies),
            passthrough_opens: get(&self.passthrough_opens),
            daemon_opens: get(&self.daemon_opens),
            source_opens: get(&self.source_opens),
            daemon_reads: get(&self.daemon_reads),
            redirects: get(&self.redirects),
            bytes_written: get(&self.bytes_written),
        }
    }
}
