//! The on-disk cache store.
//!
//! Layout under the cache directory:
//! - `lock`: held (flock) by the one process that owns the store;
//! - `v1/data/<key>`: complete staged copies, only ever created by rename;
//! - `v1/meta/<key>.json`: the [`Entry`] describing a data file;
//! - `v1/tmp/`: copies in progress, removed at startup.
//!
//! Invariant: a meta file exists only while its data file is complete and matches it.
//! Commit removes the old meta, renames the data into place, then writes the new
//! meta, so a crash at any point leaves at worst a data file without meta (a miss).

use std::fs::{self, DirBuilder, File, TryLockError};
use std::io::{self, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tempfile::NamedTempFile;
use tracing::{debug, warn};

use crate::error::StoreError;
use crate::source::Stamp;

/// Version of the on-disk layout; bumped whenever [`Entry`] or the layout changes.
pub const LAYOUT_VERSION: u32 = 1;

/// Identifies one staged file in the store.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key(String);

impl Key {
    /// The key of a source file, derived from its path relative to the source root.
    pub fn for_source_path(rel: &Path) -> Key {
        Key(blake3::hash(rel.as_os_str().as_encoded_bytes())
            .to_hex()
            .to_string())
    }

    /// The key as it appears in file names.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What the store records about one staged file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Layout version that wrote this entry.
    pub version: u32,
    /// Source path, relative to the source root.
    pub source: PathBuf,
    /// The source version that was copied.
    pub stamp: Stamp,
    /// blake3 of the copied bytes, hex.
    pub blake3: String,
}

/// The cache directory, locked for the lifetime of this value.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    layout: PathBuf,
    _lock: File,
}

impl Store {
    /// Opens (creating if needed) the store in `dir`, takes its lock and removes copies
    /// left over by a crash.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Store, StoreError> {
        let dir = dir.into();
        let layout = dir.join(format!("v{LAYOUT_VERSION}"));
        for sub in ["data", "meta", "tmp"] {
            let path = layout.join(sub);
            private_dir_builder()
                .create(&path)
                .map_err(|e| StoreError::io(&path, e))?;
        }
        let lock = take_lock(&dir.join("lock"))?;
        let store = Store {
            dir,
            layout,
            _lock: lock,
        };
        store.remove_leftover_temps()?;
        Ok(store)
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the complete copy for `key` lives.
    pub fn data_path(&self, key: &Key) -> PathBuf {
        self.layout.join("data").join(key.as_str())
    }

    fn meta_path(&self, key: &Key) -> PathBuf {
        self.layout
            .join("meta")
            .join(format!("{}.json", key.as_str()))
    }

    /// The entry for `key` if its data file is present and has the recorded size.
    /// Anything unreadable is a miss, never an error: the file will simply be staged again.
    pub fn lookup(&self, key: &Key) -> Option<Entry> {
        let meta_path = self.meta_path(key);
        let bytes = fs::read(&meta_path).ok()?;
        let entry: Entry = match serde_json::from_slice(&bytes) {
            Ok(entry) => entry,
            Err(e) => {
                warn!(path = %meta_path.display(), error = %e, "unreadable cache entry, treating as a miss");
                return None;
            }
        };
        if entry.version != LAYOUT_VERSION {
            return None;
        }
        match fs::metadata(self.data_path(key)) {
            Ok(meta) if meta.len() == entry.stamp.size => Some(entry),
            Ok(_) | Err(_) => {
                debug!(
                    key = key.as_str(),
                    "cache data missing or wrong size, treating as a miss"
                );
                None
            }
        }
    }

    /// A new private temp file for a copy in progress. It is deleted if dropped
    /// without [`Store::commit`].
    pub fn create_temp(&self) -> Result<NamedTempFile, StoreError> {
        let tmp_dir = self.layout.join("tmp");
        NamedTempFile::new_in(&tmp_dir).map_err(|e| StoreError::io(&tmp_dir, e))
    }

    /// Makes a fully written and synced temp file the copy for `key`, described by `entry`.
    pub fn commit(
        &self,
        key: &Key,
        tmp: NamedTempFile,
        entry: &Entry,
    ) -> Result<PathBuf, StoreError> {
        let meta_path = self.meta_path(key);
        remove_if_present(&meta_path)?;
        let data_path = self.data_path(key);
        tmp.persist(&data_path)
            .map_err(|e| StoreError::io(&data_path, e.error))?;
        sync_dir(&self.layout.join("data"))?;
        self.write_meta(&meta_path, entry)?;
        Ok(data_path)
    }

    fn write_meta(&self, meta_path: &Path, entry: &Entry) -> Result<(), StoreError> {
        let mut tmp = self.create_temp()?;
        let json = serde_json::to_vec(entry).map_err(|e| StoreError::io(meta_path, e.into()))?;
        tmp.write_all(&json)
            .and_then(|()| tmp.as_file().sync_all())
            .map_err(|e| StoreError::io(meta_path, e))?;
        tmp.persist(meta_path)
            .map_err(|e| StoreError::io(meta_path, e.error))?;
        sync_dir(&self.layout.join("meta"))
    }

    fn remove_leftover_temps(&self) -> Result<(), StoreError> {
        let tmp_dir = self.layout.join("tmp");
        let entries = fs::read_dir(&tmp_dir).map_err(|e| StoreError::io(&tmp_dir, e))?;
        for entry in entries.flatten() {
            debug!(path = %entry.path().display(), "removing an interrupted copy");
            remove_if_present(&entry.path())?;
        }
        Ok(())
    }
}

fn private_dir_builder() -> DirBuilder {
    let mut builder = DirBuilder::new();
    builder.recursive(true).mode(0o700);
    builder
}

fn take_lock(path: &Path) -> Result<File, StoreError> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| StoreError::io(path, e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(TryLockError::WouldBlock) => Err(StoreError::Locked {
            path: path.to_path_buf(),
        }),
        Err(TryLockError::Error(e)) => Err(StoreError::io(path, e)),
    }
}

fn remove_if_present(path: &Path) -> Result<(), StoreError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(StoreError::io(path, e)),
        _ => Ok(()),
    }
}

// A rename is durable only once its directory is synced.
fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io(dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(size: u64) -> Entry {
        Entry {
            version: LAYOUT_VERSION,
            source: PathBuf::from("a/b"),
            stamp: Stamp { size, mtime_ns: 7 },
            blake3: "00".into(),
        }
    }

    #[test]
    fn commit_then_lookup() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path())?;
        let key = Key::for_source_path(Path::new("a/b"));
        assert_eq!(store.lookup(&key), None);
        let mut tmp = store.create_temp()?;
        tmp.write_all(b"hello")?;
        let path = store.commit(&key, tmp, &entry(5))?;
        assert_eq!(fs::read(path)?, b"hello");
        assert_eq!(store.lookup(&key), Some(entry(5)));
        Ok(())
    }

    #[test]
    fn wrong_size_data_is_a_miss() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path())?;
        let key = Key::for_source_path(Path::new("a/b"));
        let mut tmp = store.create_temp()?;
        tmp.write_all(b"hello")?;
        let path = store.commit(&key, tmp, &entry(5))?;
        fs::write(path, b"hell")?;
        assert_eq!(store.lookup(&key), None);
        Ok(())
    }

    #[test]
    fn second_open_is_refused_and_temps_are_cleared() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Store::open(dir.path())?;
        assert!(matches!(
            Store::open(dir.path()),
            Err(StoreError::Locked { .. })
        ));
        let leftover = store.create_temp()?.keep()?.1;
        drop(store);
        Store::open(dir.path())?;
        assert!(!leftover.exists());
        Ok(())
    }
}
