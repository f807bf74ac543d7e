//! What a cache directory remembers of the source it serves, from the record its
//! last mount left ([`MountRecord`]), and the two mistakes it prevents:
//! - serving the directory under a NAS's mount point: sshfs exits when its
//!   connection drops, an automounter or a reboot leaves the share unmounted, and
//!   the path then leads to an empty directory of this machine's disk, where
//!   writes through the mount would land. A mount whose source's filesystem is no
//!   longer mounted where it was is refused;
//! - serving one source's copies for another's files: copies of files kept by path
//!   (plain folders, small files) are of the source they came from, so a cache
//!   mounted over a different source drops them. HF blobs are named by the sha256
//!   of their content and stay.

use std::fs;
use std::path::{Path, PathBuf};

use stagefs_control::{MountRecord, SourceFs};
use stagefs_source::fskind::filesystem_of;
use stagefs_store::{Key, Store};
use tracing::{info, warn};

use crate::MountError;

/// The filesystem `source` is on now, as a record keeps it; None where it cannot
/// be told (nothing is refused then).
pub(crate) fn source_fs(source: &Path) -> Option<SourceFs> {
    let info = filesystem_of(source).ok()?;
    Some(SourceFs {
        fstype: info.fstype,
        network: info.network,
        mount_point: info.mount_point,
    })
}

/// Refuses `source` if the filesystem it was on when `previous` was recorded is no
/// longer mounted where it was: the path now leads to the directory under that
/// mount point, on the filesystem mounted above it.
pub(crate) fn refuse_an_unmounted_source(
    previous: Option<&MountRecord>,
    source: &Path,
    now: Option<&SourceFs>,
) -> Result<(), MountError> {
    let (Some(previous), Some(now)) = (previous, now) else {
        return Ok(());
    };
    let Some(was) = previous.source_fs.as_ref() else {
        return Ok(());
    };
    if !same_dir(&previous.source, source) {
        return Ok(());
    }
    if was.unmounted_given(&now.mount_point) {
        return Err(MountError::SourceNotMounted {
            source_dir: source.to_path_buf(),
            was: Box::new(was.clone()),
            now: Box::new(now.clone()),
        });
    }
    Ok(())
}

/// Drops the copies of files kept by path when `previous` recorded another source
/// than `source`; returns how many.
pub(crate) fn forget_another_sources_copies(
    store: &Store,
    previous: Option<&MountRecord>,
    source: &Path,
) -> usize {
    let Some(previous) = previous else {
        return 0;
    };
    if same_dir(&previous.source, source) {
        return 0;
    }
    let mut dropped = 0;
    for info in store.entries() {
        let Some(key) = Key::parse(&info.key) else {
            continue;
        };
        if key.content_sha256().is_some() {
            continue;
        }
        match store.remove(&key) {
            Ok(Some(_)) => dropped += 1,
            Ok(None) => {}
            Err(e) => warn!(error = %e, "dropping a copy of the previous source's file failed"),
        }
    }
    if dropped > 0 {
        info!(
            previous = %previous.source.display(),
            source = %source.display(),
            dropped,
            "the cache held another source's copies: those of files kept by path are dropped (HF blobs, named by their content, are kept)"
        );
    }
    dropped
}

/// Whether `a` and `b` name one directory: equal once resolved, or as given where
/// one cannot be resolved (a recorded source that is gone).
pub(crate) fn same_dir(a: &Path, b: &Path) -> bool {
    let resolved = |p: &Path| fs::canonicalize(p).unwrap_or_else(|_| PathBuf::from(p));
    a == b || resolved(a) == resolved(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use stagefs_control::{Backend, Budget};

    fn fs_at(mount_point: &str, fstype: &str, network: bool) -> SourceFs {
        SourceFs {
            fstype: fstype.into(),
            network,
            mount_point: mount_point.into(),
        }
    }

    fn record(source: &str, fs: SourceFs) -> MountRecord {
        MountRecord {
            source: source.into(),
            mountpoint: "/tmp/m".into(),
            budget: Budget::default(),
            min_stage_size: 0,
            model_dirs: Vec::new(),
            backend: Backend::Fuse,
            source_fs: Some(fs),
        }
    }

    #[test]
    fn a_source_whose_nas_is_no_longer_mounted_is_refused() {
        let was = record("/mnt/nas/hub", fs_at("/mnt/nas", "fuse.sshfs", true));
        let root_disk = fs_at("/", "ext4", false);
        let refused =
            refuse_an_unmounted_source(Some(&was), Path::new("/mnt/nas/hub"), Some(&root_disk));
        let message = refused.expect_err("refused").to_string();
        assert!(message.contains("fuse.sshfs"), "{message}");
        assert!(message.contains("/mnt/nas"), "{message}");
    }

    #[test]
    fn the_same_nas_again_or_another_source_is_accepted() {
        let was = record("/mnt/nas/hub", fs_at("/mnt/nas", "fuse.sshfs", true));
        let again = fs_at("/mnt/nas", "fuse.sshfs", true);
        assert!(
            refuse_an_unmounted_source(Some(&was), Path::new("/mnt/nas/hub"), Some(&again)).is_ok()
        );
        // Mounted deeper, or another share mounted there: not under the old one.
        let deeper = fs_at("/mnt/nas/hub", "nfs", true);
        assert!(
            refuse_an_unmounted_source(Some(&was), Path::new("/mnt/nas/hub"), Some(&deeper))
                .is_ok()
        );
        let other = fs_at("/", "ext4", false);
        assert!(
            refuse_an_unmounted_source(Some(&was), Path::new("/srv/models"), Some(&other)).is_ok()
        );
        assert!(refuse_an_unmounted_source(None, Path::new("/mnt/nas/hub"), Some(&other)).is_ok());
    }
}
