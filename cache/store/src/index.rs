//! The persistent index of staged files: an append-only journal of JSON lines
//! (`v1/index.jsonl`) replayed into memory at startup and compacted then.
//!
//! The `Index` is memory only: its changes queue records, which the owner writes to
//! the `Journal` after letting go of the lock that guards the index, so nothing that
//! only reads the index waits for a disk.
//!
//! Durability: a copy enters the index *uncommitted* (`Index::put_uncommitted`) as
//! soon as it is whole and verified, before its bytes are known to be on disk. Its
//! journal line then records no file identity ([`CopyId::UNVERIFIED`]), which no file
//! matches, so a restart re-hashes the copy against its recorded digest before it
//! serves it, and drops it if the digest differs (power lost before the data reached
//! the disk). Once the data and its name are synced, `Index::commit` journals the
//! entry again with its identity. So the journal never vouches for bytes that may not
//! be on disk, and a copy the journal names but that is gone is dropped at startup.
//! `touch` records (recency) are written without a sync: losing the last few on power
//! loss only makes the LRU order slightly older. A torn last line (kill -9
//! mid-append) is skipped.
//! Recency lives in memory in an LRU list and is persisted in the journal; it is never
//! read from atime.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use lru::LruCache;
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::key::Key;
use stagefs_source::Stamp;

/// Version of the index format; the golden test pins its serialization.
pub const INDEX_VERSION: u32 = 1;

/// What the index records about one staged file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Source path it was first staged from, relative to the source root.
    pub source: PathBuf,
    /// The source version that was copied.
    pub stamp: Stamp,
    /// blake3 of the copied bytes, hex. None for an LFS blob: the sha256 that names it
    /// is what identifies its copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blake3: Option<String>,
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
    /// No file's identity (no file has inode 0): recorded for a copy whose bytes may
    /// not be on disk yet, so it is re-hashed before it is served after a restart.
    pub const UNVERIFIED: CopyId = CopyId {
        ino: 0,
        ctime_ns: 0,
    };

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

/// The in-memory index, in recency order. Every change queues the journal record
/// that replays it, to be taken with [`Index::take_pending`].
#[derive(Debug)]
pub(crate) struct Index {
    entries: LruCache<Key, Entry>,
    bytes: u64,
    pending: Vec<Record>,
    /// Entries whose copies are not yet known to be on disk ([`Index::put_uncommitted`]).
    uncommitted: HashSet<Key>,
}

/// The journal file, appended to in the order the index changed.
#[derive(Debug)]
pub(crate) struct Journal {
    path: PathBuf,
    file: File,
    records_since_compaction: usize,
}

impl Index {
    /// Replays the journal at `path` (missing: empty) and rewrites it compacted.
    pub(crate) fn load(path: &Path) -> io::Result<(Index, Journal)> {
        let mut ordered: Vec<(Key, Entry)> = replay(path)?.into_iter().collect();
        ordered.sort_by_key(|(_, e)| e.last_use);
        let mut entries = LruCache::unbounded();
        let mut bytes = 0;
        for (key, entry) in ordered {
            bytes += entry.stamp.size;
            entries.push(key, entry);
        }
        let file = write_compacted(path, &entries)?;
        let index = Index {
            entries,
            bytes,
            pending: Vec::new(),
            uncommitted: HashSet::new(),
        };
        let journal = Journal {
            path: path.to_path_buf(),
            file,
            records_since_compaction: 0,
        };
        Ok((index, journal))
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

    /// Makes `entry` the entry for `key`, its copy durable (synced, and so is its name).
    pub(crate) fn put(&mut self, key: Key, entry: Entry) {
        self.uncommitted.remove(&key);
        self.pending.push(Record::Put {
            key: key.as_str().to_string(),
            entry: entry.clone(),
        });
        self.insert(key, entry);
    }

    /// Makes `entry` the entry for `key` while its copy may not be on disk yet: the
    /// journal records it without its identity until [`Index::commit`].
    pub(crate) fn put_uncommitted(&mut self, key: Key, entry: Entry) {
        self.pending.push(Record::Put {
            key: key.as_str().to_string(),
            entry: unverified(&entry),
        });
        self.uncommitted.insert(key.clone());
        self.insert(key, entry);
    }

    /// Records that the uncommitted copy for `key` whose identity is `copy` is now on
    /// disk. False (nothing recorded) if the entry is no longer that copy.
    pub(crate) fn commit(&mut self, key: &Key, copy: CopyId) -> bool {
        let Some(entry) = self.entries.peek(key).filter(|e| e.copy == copy).cloned() else {
            return false;
        };
        if !self.uncommitted.remove(key) {
            return false;
        }
        self.pending.push(Record::Put {
            key: key.as_str().to_string(),
            entry,
        });
        true
    }

    fn insert(&mut self, key: Key, entry: Entry) {
        self.bytes += entry.stamp.size;
        if let Some(old) = self.entries.push(key, entry) {
            self.bytes -= old.1.stamp.size;
        }
    }

    pub(crate) fn remove(&mut self, key: &Key) -> Option<Entry> {
        let old = self.entries.pop(key)?;
        self.uncommitted.remove(key);
        self.pending.push(Record::Remove {
            key: key.as_str().to_string(),
        });
        self.bytes -= old.stamp.size;
        Some(old)
    }

    /// Marks `key` most recently used at `now`.
    pub(crate) fn touch(&mut self, key: &Key, now: u64) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        entry.last_use = now;
        self.pending.push(Record::Touch {
            key: key.as_str().to_string(),
            last_use: now,
        });
    }

    /// The records of changes not yet written, oldest first.
    pub(crate) fn take_pending(&mut self) -> Vec<Record> {
        std::mem::take(&mut self.pending)
    }

    /// Whether any change waits to be written.
    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// A copy of every entry, least recently used first, for a compaction: an
    /// uncommitted one without its identity, as its journal line has it.
    pub(crate) fn snapshot(&self) -> LruCache<Key, Entry> {
        let mut copy = LruCache::unbounded();
        for (key, entry) in self.entries.iter().rev() {
            let entry = match self.uncommitted.contains(key) {
                true => unverified(entry),
                false => entry.clone(),
            };
            copy.push(key.clone(), entry);
        }
        copy
    }
}

/// `entry` as the journal records it before its copy is on disk.
fn unverified(entry: &Entry) -> Entry {
    Entry {
        copy: CopyId::UNVERIFIED,
        ..entry.clone()
    }
}

impl Journal {
    /// Whether writing `records` more would make the journal worth compacting for an
    /// index of `entries` entries.
    pub(crate) fn due_for_compaction(&self, records: usize, entries: usize) -> bool {
        self.records_since_compaction + records > 4 * entries + 1024
    }

    /// Appends `records`, with an fdatasync if `durable`.
    pub(crate) fn append(&mut self, records: &[Record], durable: bool) -> io::Result<()> {
        if !records.is_empty() {
            let mut lines = Vec::new();
            for record in records {
                serde_json::to_writer(&mut lines, record)?;
                lines.push(b'\n');
            }
            self.file.write_all(&lines)?;
            self.records_since_compaction += records.len();
        }
        if durable {
            self.file.sync_data()?;
        }
        Ok(())
    }

    /// Rewrites the journal as a header plus one `put` per entry of `entries`,
    /// atomically (the new file is synced and renamed into place).
    pub(crate) fn compact(&mut self, entries: &LruCache<Key, Entry>) -> io::Result<()> {
        self.file = write_compacted(&self.path, entries)?;
        self.records_since_compaction = 0;
        Ok(())
    }

    /// Where the journal lives.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// Writes a header and one `put` per entry (least recent first) to `path` by
/// rename, and returns the journal opened for appending.
fn write_compacted(path: &Path, entries: &LruCache<Key, Entry>) -> io::Result<File> {
    let tmp = path.with_extension("jsonl.tmp");
    let mut out = io::BufWriter::new(stagefs_source::sys::create_private(&tmp)?);
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
                warn!(path = %stagefs_source::logged(path), line = number + 1, error = %e, "skipping an unreadable index line")
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
                ..Stamp::default()
            },
            blake3: Some("ab".repeat(32)),
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
        let (mut index, mut journal) = Index::load(&path)?;
        index.put(key(1), entry(10, 1));
        index.put(key(2), entry(20, 2));
        index.put(key(3), entry(30, 3));
        index.touch(&key(1), 4);
        index.remove(&key(2));
        journal.append(&index.take_pending(), true)?;
        drop((index, journal));
        let (index, _) = Index::load(&path)?;
        let order: Vec<Key> = index.iter_lru().map(|(k, _)| k.clone()).collect();
        assert_eq!(order, vec![key(3), key(1)]);
        assert_eq!(index.bytes(), 40);
        Ok(())
    }

    #[test]
    fn a_torn_last_line_is_skipped() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("index.jsonl");
        let (mut index, mut journal) = Index::load(&path)?;
        index.put(key(1), entry(10, 1));
        journal.append(&index.take_pending(), true)?;
        drop((index, journal));
        let mut file = OpenOptions::new().append(true).open(&path)?;
        file.write_all(br#"{"op":"put","key":"path-00"#)?;
        let (index, _) = Index::load(&path)?;
        assert_eq!(index.len(), 1);
        Ok(())
    }

    #[test]
    fn a_compaction_keeps_exactly_the_entries() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("index.jsonl");
        let (mut index, mut journal) = Index::load(&path)?;
        index.put(key(1), entry(10, 1));
        index.put(key(2), entry(20, 2));
        index.remove(&key(1));
        index.take_pending();
        journal.compact(&index.snapshot())?;
        let (index, _) = Index::load(&path)?;
        let keys: Vec<Key> = index.iter_lru().map(|(k, _)| k.clone()).collect();
        assert_eq!(keys, vec![key(2)]);
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
