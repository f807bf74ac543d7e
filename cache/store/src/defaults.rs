//! The store's defaults (named again in `stagefs_stage::defaults`, the table of
//! every setting's default).

use std::time::Duration;

/// How long a copy whose path was handed out stays in use. A process resolves a
/// path and opens what it resolved to within one system call; the grace also covers
/// one that resolved it in user space (`realpath`) a moment before opening it.
pub const REDIRECT_GRACE: Duration = Duration::from_secs(30);

/// The share of the cache volume kept free when no reserve is configured, so the
/// OS (swap, updates) never runs out because of model weights...
pub const MIN_FREE_PERCENT: u64 = 10;

/// ...but at most this much, so a large volume is not mostly held back.
pub const MIN_FREE_CAP: u64 = 50 << 30;
