//! The persistent index of staged files: an append-only journal of JSON lines
//! (`v1/index.jsonl`) replayed into memory at startup and compacted then.
//!
//! Durability: `put` and `remove` records are fdatasync'ed before the caller goes on,
//! so the journal never names a copy that is not complete on disk. `touch` records
//! (recency) are written without a sync: losing the last few on power loss only makes
//! the LRU order slightly older. A torn last line (kill -9 mid-append) is skipped.
//! Recency lives in memory in an LRU list and is persisted in the journal; it is never
//! read from atime.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use lru::LruCache;
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::key::Key;
use crate::source::Stamp;

/// Version of the index format; the golden test pins its serialization.
pub const INDEX_VERSION: u32 = 1;

/// What the index records about one staged file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Source path it was first staged from, relative to the source root.
    pub source: PathBuf,
    /// The source version that was copied.
    pub stamp: Stamp,
    /// blake3 of the copied bytes, hex.
    pub blake3: String,
    /// Last time the copy was used, in seconds since the Unix epoch.
    pub last_use: u64,
    /// Which file on disk was hashed: while the copy keeps this inode and change
    /// time, nothing has written to it since, and it need not be hashed again.
    pub copy: CopyId,
}

/// Identifies one state of a file on disk: any write (or chmod, or replacement)
/// changes the change time, which no user can set back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyId {
    /// Inode number.
    pub ino: u64,
    /// Change time in nanoseconds since the Unix epoch.
    pub ctime_ns: i64,
}

impl CopyId {
    /// The identity of the file `meta` describes.
    pub fn of(meta: &std::fs::Metadata) -> CopyId {
        use std::os::unix::fs::MetadataExt;
        CopyId {
            ino: meta.ino(),
            ctime_ns: meta
                .ctime()
                .saturating_mul(1_000_000_000)
                .saturating_add(meta.ctime_nsec()),
        }
    }
}

/// One journal line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Record {
    /// First line of every journal.
    Header {
        /// [`INDEX_VERSION`] of the writer.
        version: u32,
    },
    /// A complete copy now exists for `key`.
    Put {
        /// The store key.
        key: String,
        /// Its description.
        entry: Entry,
    },
    /// The copy for `key` is gone (or about to be).
    Remove {
        /// The store key.
        key: String,
    },
    /// The copy for `key` was used at `last_use`.
    Touch {
        /// The store key.
        key: String,
        /// Seconds since the Unix epoch.
        last_use: u64,
    },
}

/// The in-memory index, in recency order, backed by the journal.
#[derive(Debug)]
pub(crate) struct Index {
    path: PathBuf,
    journal: File,
    entries: LruCache<Key, Entry>,
    bytes: u64,
    records_since_compaction: usize,
}

impl Index {
    /// Replays the journal at `path` (missing: empty) and rewrites it compacted.
    pub(crate) fn load(path: &Path) -> io::Result<Index> {
        let mut ordered: Vec<(Key, Entry)> = replay(path)?.into_iter().collect();
        ordered.sort_by_key(|(_, e)| e.last_use);
        let mut entries = LruCache::unbounded();
        let mut bytes = 0;
        for (key, entry) in ordered {
            bytes += entry.stamp.size;
            entries.push(key, entry);
        }
        let journal = write_compacted(path, &entries)?;
        Ok(Index {
            path: path.to_path_buf(),
            journal,
            entries,
            bytes,
            records_since_compaction: 0,
        })
    }

    pub(crate) fn get(&self, key: &Key) -> Option<&Entry> {
        self.entries.peek(key)
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Bytes of all indexed copies.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Entries from least to most recently used.
    pub(crate) fn iter_lru(&self) -> impl Iterator<Item = (&Key, &Entry)> {
        self.entries.iter().rev()
    }

    pub(crate) fn put(&mut self, key: Key, entry: Entry) -> io::Result<()> {
        self.append(
            &Record::Put {
                key: key.as_str().to_string(),
                entry: entry.clone(),
            },
            true,
        )?;
        self.bytes += entry.stamp.size;
        if let Some(old) = self.entries.push(key, entry) {
            self.bytes -= old.1.stamp.size;
        }
        Ok(())
    }

    pub(crate) fn remove(&mut self, key: &Key) -> io::Result<Option<Entry>> {
        if !self.entries.contains(key) {
            return Ok(None);
        }
        self.append(
            &Record::Remove {
                key: key.as_str().to_string(),
            },
            true,
        )?;
        let old = self.entries.pop(key);
        if let Some(old) = &old {
            self.bytes -= old.stamp.size;
        }
        Ok(old)
    }

    /// Marks `key` most recently used at `now`.
    pub(crate) fn touch(&mut self, key: &Key, now: u64) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        entry.last_use = now;
        let record = Record::Touch {
            key: key.as_str().to_string(),
            last_use: now,
        };
        if let Err(e) = self.append(&record, false) {
            warn!(error = %e, path = %self.path.display(), "could not record recency");
        }
    }

    fn append(&mut self, record: &Record, durable: bool) -> io::Result<()> {
        let mut line = serde_json::to_vec(record)?;
        line.push(b'\n');
        self.journal.write_all(&line)?;
        if durable {
            self.journal.sync_data()?;
        }
        self.records_since_compaction += 1;
        if self.records_since_compaction > 4 * self.entries.len() + 1024 {
            self.compact()?;
        }
        Ok(())
    }

    /// Rewrites the journal as a header plus one `put` per entry, atomically.
    pub(crate) fn compact(&mut self) -> io::Result<()> {
        self.journal = write_compacted(&self.path, &self.entries)?;
        self.records_since_compaction = 0;
        Ok(())
    }
}

/// Writes a header and one `put` per entry (least recent first) to `path` by
/// rename, and returns the journal opened for appending.
fn write_compacted(path: &Path, entries: &LruCache<Key, Entry>) -> io::Result<File> {
    let tmp = path.with_extension("jsonl.tmp");
    let mut out = io::BufWriter::new(crate::sys::create_private(&tmp)?);
    let header = Record::Header {
        version: INDEX_VERSION,
    };
    writeln!(out, "{}", serde_json::to_string(&header)?)?;
    for (key, entry) in entries.iter().rev() {
        let put = Record::Put {
            key: key.as_str().to_string(),
            entry: entry.clone(),
        };
        writeln!(out, "{}", serde_json::to_string(&put)?)?;
    }
    out.into_inner()
        .map_err(io::IntoInnerError::into_error)?
        .sync_all()?;
    fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    OpenOptions::new().append(true).open(path)
}

/// Applies every readable record of the journal at `path`.
fn replay(path: &Path) -> io::Result<std::collections::HashMap<Key, Entry>> {
    let mut entries = std::collections::HashMap::new();
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(entries),
        Err(e) => return Err(e),
    };
    for (number, line) in BufReader::new(file).lines().enumerate() {
        let line = line?;
        match serde_json::from_str::<Record>(&line) {
            Ok(record) => apply(&mut entries, record, path)?,
            Err(e) => {
                warn!(path = %path.display(), line = number + 1, error = %e, "skipping an unreadable index line")
            }
        }
    }
    Ok(entries)
}

fn apply(
    entries: &mut std::collections::HashMap<Key, Entry>,
    record: Record,
    path: &Path,
) -> io::Result<()> {
    match record {
        Record::Header { version } if version != INDEX_VERSION => {
            return Err(io::Error::other(format!(
                "{}: index version {version}, this stagefs reads version {INDEX_VERSION}",
                path.display()
            )));
        }
        Record::Header { .. } => {}
        Record::Put { key, entry } => {
            if let Some(key) = Key::parse(&key) {
                entries.insert(key, entry);
            }
        }
        Record::Remove { key } => {
            if let Some(key) = Key::parse(&key) {
                entries.remove(&key);
            }
        }
        Record::Touch { key, last_use } => {
            if let Some(entry) = Key::parse(&key).and_then(|k| entries.get_mut(&k)) {
                entry.last_use = last_use;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(size: u64, last_use: u64) -> Entry {
        Entry {
            source: PathBuf::from("models--a--b/blobs/x"),
            stamp: Stamp {
                size,
                mtime_ns: 1_700_000_000_000_000_000,
            },
            blake3: "ab".repeat(32),
            last_use,
            copy: CopyId::default(),
        }
    }

    fn key(n: u8) -> Key {
        Key::for_source_path(Path::new(&format!("f{n}")))
    }

    #[test]
    fn survives_reload_with_recency() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("index.jsonl");
        let mut index = Index::load(&path)?;
        index.put(key(1), entry(10, 1))?;
        index.put(key(2), entry(20, 2))?;
        index.put(key(3), entry(30, 3))?;
        index.touch(&key(1), 4);
        index.remove(&key(2))?;
        drop(index);
        let index = Index::load(&path)?;
        let order: Vec<Key> = index.iter_lru().map(|(k, _)| k.clone()).collect();
        assert_eq!(order, vec![key(3), key(1)]);
        assert_eq!(index.bytes(), 40);
        Ok(())
    }

    #[test]
    fn a_torn_last_line_is_skipped() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("index.jsonl");
        let mut index = Index::load(&path)?;
        index.put(key(1), entry(10, 1))?;
        drop(index);
        let mut file = OpenOptions::new().append(true).open(&path)?;
        file.write_all(br#"{"op":"put","key":"path-00"#)?;
        let index = Index::load(&path)?;
        assert_eq!(index.len(), 1);
        Ok(())
    }

    #[test]
    fn a_newer_version_is_refused() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("index.jsonl");
        fs::write(&path, "{\"op\":\"header\",\"version\":99}\n")?;
        assert!(Index::load(&path).is_err());
        Ok(())
    }
}
