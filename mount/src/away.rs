//! Mounting a source that is away: a laptop started away from its NAS, a share not
//! mounted yet. A cache directory that served this very source and remembers what
//! it answered (`stagefs_stage::answers`) mounts it anyway: it serves what it knows,
//! read-only, and takes the share back by itself once the filesystem it was on is
//! mounted at the same place again and answers (`stagefs_source::reconnecting`). A
//! source this cache never served is refused, as before.

use std::fs;
use std::sync::{Arc, OnceLock};

use stagefs_control::{MountRecord, SourceFs};
use stagefs_source::SourceTree;
use stagefs_source::reconnecting::Reconnecting;
use stagefs_stage::answers::JOURNAL;

use crate::MountSpec;
use crate::source_record::same_dir;

/// Whether a spec's source was found away by its check; clones of the spec share it,
/// so the mount started after the check serves what the check found.
#[derive(Debug, Clone, Default)]
pub struct SourceVerdict(Arc<OnceLock<bool>>);

impl SourceVerdict {
    pub(crate) fn set_away(&self) {
        let _ = self.0.set(true);
    }

    /// Whether the check found the source away.
    pub fn is_away(&self) -> bool {
        self.0.get().copied().unwrap_or(false)
    }
}

/// The filesystem `spec`'s source was on when this cache last served it, if the cache
/// may mount it while it is away: it served this source and remembers its answers.
pub(crate) fn remembered(spec: &MountSpec) -> Option<SourceFs> {
    let record = MountRecord::read(&spec.cache_dir)?;
    if !same_dir(&record.source, &spec.source) {
        return None;
    }
    let journal = spec.cache_dir.join(JOURNAL);
    let remembers = fs::metadata(journal).is_ok_and(|meta| meta.len() > 0);
    remembers.then_some(record.source_fs).flatten()
}

/// The source of a mount made while it is away: every call answered "not reachable"
/// and every change refused as read-only until the share is back where it was.
pub(crate) fn waiting_source(spec: &MountSpec, was: &SourceFs) -> SourceTree {
    SourceTree::from_backend(Arc::new(Reconnecting::new(
        spec.source.clone(),
        was.fstype.clone(),
        was.mount_point.clone(),
    )))
}
