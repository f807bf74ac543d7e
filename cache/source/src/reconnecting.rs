//! A directory source that was away when its mount started: a NAS share whose
//! link is down or whose client (sshfs) died, or that is not mounted at all, on a
//! laptop started away from it. The mount then serves what its cache remembers
//! (the policy's rules while the source is away); this backend answers every call
//! as "not reachable" and every change as read-only until the share is back:
//! the filesystem mounted where it was is of the same type again and its root
//! answers. Another filesystem mounted there is not taken for it, and the empty
//! directory under an unmounted share is never read or written. Every call runs on
//! the source pool, so a hung share holds source threads only, as any source does.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::fskind::filesystem_of;
use crate::{
    CreateFile, LocalDir, SetTime, Source, SourceError, SourceFile, SourceMeta, WritableFile,
    WriteOpen,
};

/// A share to wait for at `root`: its filesystem's type and mount point as recorded
/// when it last served.
#[derive(Debug)]
pub struct Reconnecting {
    root: PathBuf,
    fstype: String,
    mount_point: PathBuf,
    live: OnceLock<LocalDir>,
    /// A reconnect is under way: on a hung share it hangs, so the calls meanwhile
    /// fail at once instead of each taking a source thread with it.
    trying: AtomicBool,
}

impl Reconnecting {
    /// Waits for a filesystem of type `fstype` mounted at `mount_point` to hold `root`.
    pub fn new(root: PathBuf, fstype: String, mount_point: PathBuf) -> Reconnecting {
        Reconnecting {
            root,
            fstype,
            mount_point,
            live: OnceLock::new(),
            trying: AtomicBool::new(false),
        }
    }

    /// Whether the share is back (it answered a probe since).
    pub fn is_back(&self) -> bool {
        self.live.get().is_some()
    }

    /// The share, if it is back: any call may be the one that finds it back (a
    /// name never seen is asked of it, as of any source).
    fn live(&self) -> Result<&LocalDir, SourceError> {
        self.reconnect().map_err(|_| SourceError::Unmounted {
            root: self.root.clone(),
        })
    }

    /// The share for a change: refused as read-only at once while away (a change
    /// never waits on a share that may hang; reads and the probe find it back).
    fn writable(&self, rel: &Path) -> Result<&LocalDir, SourceError> {
        self.live.get().ok_or_else(|| SourceError::read_only(rel))
    }

    /// Takes the share back if the right filesystem holds the root again and the
    /// root answers. Blocks while a hung share does not answer.
    fn reconnect(&self) -> io::Result<&LocalDir> {
        if let Some(live) = self.live.get() {
            return Ok(live);
        }
        if self.trying.swap(true, Ordering::AcqRel) {
            return Err(io::Error::from_raw_os_error(libc::ENOTCONN));
        }
        let tried = self.try_reconnect();
        self.trying.store(false, Ordering::Release);
        tried
    }

    fn try_reconnect(&self) -> io::Result<&LocalDir> {
        let now = filesystem_of(&self.root)?;
        if now.fstype != self.fstype || now.mount_point != self.mount_point {
            return Err(io::Error::from_raw_os_error(libc::ENOTCONN));
        }
        let dir = LocalDir::new(&self.root).map_err(|e| io::Error::other(e.to_string()))?;
        // Asked of the server itself: a client's cache cannot make it look back.
        dir.statfs()?;
        tracing::info!(source = %self.root.display(), "the source is mounted and answers again: serving it live");
        Ok(self.live.get_or_init(|| dir))
    }
}

impl Source for Reconnecting {
    fn root(&self) -> &Path {
        &self.root
    }

    fn stat(&self, rel: &Path) -> Result<SourceMeta, SourceError> {
        self.live()?.stat(rel)
    }

    fn read_dir(&self, rel: &Path) -> Result<Vec<(OsString, SourceMeta)>, SourceError> {
        self.live()?.read_dir(rel)
    }

    fn read_link(&self, rel: &Path) -> Result<PathBuf, SourceError> {
        self.live()?.read_link(rel)
    }

    fn open(&self, rel: &Path) -> Result<Box<dyn SourceFile>, SourceError> {
        self.live()?.open(rel)
    }

    fn statfs(&self) -> io::Result<libc::statvfs> {
        self.reconnect()?.statfs()
    }

    fn on_local_disk(&self) -> bool {
        self.live.get().is_some_and(Source::on_local_disk)
    }

    fn create(&self, rel: &Path, how: CreateFile) -> Result<Box<dyn WritableFile>, SourceError> {
        self.writable(rel)?.create(rel, how)
    }

    fn open_write(&self, rel: &Path, how: WriteOpen) -> Result<Box<dyn WritableFile>, SourceError> {
        self.writable(rel)?.open_write(rel, how)
    }

    fn set_len(&self, rel: &Path, len: u64) -> Result<(), SourceError> {
        self.writable(rel)?.set_len(rel, len)
    }

    fn rename(&self, from: &Path, to: &Path, no_replace: bool) -> Result<(), SourceError> {
        self.writable(from)?.rename(from, to, no_replace)
    }

    fn unlink(&self, rel: &Path) -> Result<(), SourceError> {
        self.writable(rel)?.unlink(rel)
    }

    fn mkdir(&self, rel: &Path, mode: u32) -> Result<(), SourceError> {
        self.writable(rel)?.mkdir(rel, mode)
    }

    fn rmdir(&self, rel: &Path) -> Result<(), SourceError> {
        self.writable(rel)?.rmdir(rel)
    }

    fn symlink(&self, target: &Path, rel: &Path) -> Result<(), SourceError> {
        self.writable(rel)?.symlink(target, rel)
    }

    fn link(&self, existing: &Path, rel: &Path) -> Result<(), SourceError> {
        self.writable(rel)?.link(existing, rel)
    }

    fn mknod(&self, rel: &Path, mode: u32, rdev: u64) -> Result<(), SourceError> {
        self.writable(rel)?.mknod(rel, mode, rdev)
    }

    fn set_mode(&self, rel: &Path, mode: u32) -> Result<(), SourceError> {
        self.writable(rel)?.set_mode(rel, mode)
    }

    fn set_owner(&self, rel: &Path, uid: Option<u32>, gid: Option<u32>) -> Result<(), SourceError> {
        self.writable(rel)?.set_owner(rel, uid, gid)
    }

    fn set_times(
        &self,
        rel: &Path,
        atime: Option<SetTime>,
        mtime: Option<SetTime>,
    ) -> Result<(), SourceError> {
        self.writable(rel)?.set_times(rel, atime, mtime)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_filesystem_at_the_place_is_not_taken_for_the_share() -> io::Result<()> {
        let dir = tempfile::TempDir::new()?;
        let here = filesystem_of(dir.path())?;
        let elsewhere = Reconnecting::new(
            dir.path().to_path_buf(),
            format!("not-{}", here.fstype),
            here.mount_point.clone(),
        );
        assert!(elsewhere.statfs().is_err());
        assert!(matches!(
            elsewhere.stat(Path::new("x")),
            Err(SourceError::Unmounted { .. })
        ));
        assert!(matches!(
            elsewhere.unlink(Path::new("x")),
            Err(SourceError::ReadOnly { .. })
        ));
        assert!(!elsewhere.is_back());

        let same = Reconnecting::new(dir.path().to_path_buf(), here.fstype, here.mount_point);
        std::fs::write(dir.path().join("x"), b"x")?;
        assert!(same.statfs().is_ok());
        assert!(same.is_back());
        assert_eq!(same.stat(Path::new("x")).map(|m| m.size).ok(), Some(1));
        Ok(())
    }
}
