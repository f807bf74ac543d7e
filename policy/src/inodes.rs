//! Inode numbers for source paths.
//!
//! A regular file gets one inode per version (path, size, mtime): when the source file
//! changes, the next lookup hands out a new inode, so the kernel's page cache and any
//! passthrough backing file of the old version can never be mixed with the new one,
//! while handles already open on the old version keep reading what they opened.
//! Directories and symlinks are identified by path alone. A staged file presented as
//! a link to its local copy (a redirect) gets an inode of its own per version, apart
//! from the regular file's, so the kernel sees the change of type as a new inode.
//!
//! Entries are never forgotten: an HF cache holds thousands of paths, not millions.
//! Nor is what the source last said about them (attributes, link targets, directory
//! listings), which answers for the source while it does not respond.
//!
//! An NFS client keeps file handles (inode numbers) across a restart of the server,
//! so a table made [`Inodes::with_journal`] records every number it hands out in a
//! journal and reads it back at startup: the same path and version gets the same
//! number again, and a handle from before the restart still names its file. The
//! journal's generation, chosen when it is created, goes into every handle, so a
//! handle from a lost journal is told apart (stale) instead of naming another file.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use stagefs_source::locks::lock;
use stagefs_source::{SourceMeta, Stamp};
use tracing::debug;

use crate::attr::Attr;
use crate::handles::DirEntry;

/// The root directory's inode, as the kernel expects (and the NFS export root's fileid).
pub const ROOT_INO: u64 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum NodeKey {
    Path(PathBuf),
    Version(PathBuf, Stamp),
    Redirect(PathBuf, Stamp),
}

/// What the source last said of a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Known {
    /// The entry, with these attributes.
    Entry(Attr),
    /// No such entry.
    Absent,
}

/// What an inode stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Node {
    /// Path relative to the source root ("" for the root).
    pub(crate) path: PathBuf,
    /// For regular files, the version this inode was handed out for.
    pub(crate) stamp: Option<Stamp>,
    /// Whether this inode presents that version as a link to its staged copy.
    pub(crate) redirect: bool,
}

#[derive(Debug)]
struct Table {
    by_key: HashMap<NodeKey, u64>,
    nodes: HashMap<u64, Node>,
    next: u64,
    /// The newest inode handed out for each path.
    latest: HashMap<PathBuf, u64>,
    /// Last attributes and link targets the source gave, to answer from while the
    /// source does not respond, with when the source gave them.
    attrs: HashMap<u64, (Attr, Instant)>,
    links: HashMap<u64, Vec<u8>>,
    listings: HashMap<u64, Vec<DirEntry>>,
    /// Paths the source said do not exist when last asked: loaders probe names a
    /// model lacks (`token`, `generation_config.json`, `.no_exist/` markers) and
    /// must hear "no such file" again while the source does not respond, not EIO.
    absent: HashSet<PathBuf>,
    /// File inodes written through the mount: each follows its file from version to
    /// version, as the kernel's inode does, instead of standing for one version.
    live: HashSet<u64>,
    /// Every file inode follows its file, as if written through the mount
    /// ([`Inodes::follow_files`]).
    follow: bool,
    /// Inodes whose entry was removed or replaced through the mount: no path leads to
    /// them any more, only handles already open.
    gone: HashSet<u64>,
    /// Where new numbers are recorded, for a table that outlives the process.
    journal: Option<File>,
}

/// Thread-safe map between inode numbers and source nodes.
#[derive(Debug)]
pub(crate) struct Inodes {
    table: Mutex<Table>,
    generation: u64,
}

/// One line of the journal: the first names its generation, each other one number.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum JournalLine {
    Generation {
        generation: u64,
    },
    Node {
        ino: u64,
        path: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stamp: Option<Stamp>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        redirect: bool,
    },
}

impl Inodes {
    pub(crate) fn new() -> Self {
        let root = Node {
            path: PathBuf::new(),
            stamp: None,
            redirect: false,
        };
        let table = Table {
            by_key: HashMap::from([(NodeKey::Path(PathBuf::new()), ROOT_INO)]),
            nodes: HashMap::from([(ROOT_INO, root)]),
            next: ROOT_INO + 1,
            latest: HashMap::new(),
            attrs: HashMap::new(),
            links: HashMap::new(),
            listings: HashMap::new(),
            absent: HashSet::new(),
            live: HashSet::new(),
            follow: false,
            gone: HashSet::new(),
            journal: None,
        };
        Inodes {
            table: Mutex::new(table),
            generation: 0,
        }
    }

    /// A table that keeps its numbers in `journal` across restarts, reading back the
    /// numbers a previous process handed out. A journal that is missing or unreadable
    /// starts afresh with a new generation.
    pub(crate) fn with_journal(journal: &Path) -> io::Result<Self> {
        let mut inodes = Inodes::new();
        let replayed = fs::File::open(journal)
            .ok()
            .and_then(|file| inodes.replay(BufReader::new(file)));
        let file = match replayed {
            Some(generation) => {
                inodes.generation = generation;
                OpenOptions::new().append(true).open(journal)?
            }
            None => {
                // Nothing was replayed: the table is as new.
                inodes.generation = fresh_generation();
                let mut file = File::create(journal)?;
                let first = JournalLine::Generation {
                    generation: inodes.generation,
                };
                writeln!(
                    file,
                    "{}",
                    serde_json::to_string(&first).map_err(io::Error::other)?
                )?;
                file.sync_all()?;
                file
            }
        };
        inodes.lock().journal = Some(file);
        Ok(inodes)
    }

    /// The generation of this table's numbers: 0 without a journal.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Reads a journal back into this table; its generation, or None if it has none.
    /// A torn last line (a crash mid-write) is skipped: that number is simply new.
    fn replay(&mut self, journal: impl BufRead) -> Option<u64> {
        let mut lines = journal.lines();
        let first = lines.next()?.ok()?;
        let Ok(JournalLine::Generation { generation }) = serde_json::from_str(&first) else {
            return None;
        };
        let table = self.table.get_mut().unwrap_or_else(PoisonError::into_inner);
        for line in lines.map_while(Result::ok) {
            let Ok(JournalLine::Node {
                ino,
                path,
                stamp,
                redirect,
            }) = serde_json::from_str(&line)
            else {
                debug!(line, "skipping an unreadable line of the inode journal");
                continue;
            };
            let path = PathBuf::from(path);
            let key = match (stamp, redirect) {
                (Some(stamp), true) => NodeKey::Redirect(path.clone(), stamp),
                (Some(stamp), false) => NodeKey::Version(path.clone(), stamp),
                (None, _) => NodeKey::Path(path.clone()),
            };
            table.by_key.insert(key, ino);
            table.nodes.insert(
                ino,
                Node {
                    path,
                    stamp,
                    redirect,
                },
            );
            table.next = table.next.max(ino + 1);
        }
        Some(generation)
    }

    /// The inode for `path` as described by `meta`, allocating one if needed.
    pub(crate) fn intern(&self, path: &Path, meta: &SourceMeta) -> u64 {
        let stamp = meta.is_file().then(|| Stamp::of(meta));
        let key = match stamp {
            Some(stamp) => NodeKey::Version(path.to_path_buf(), stamp),
            None => NodeKey::Path(path.to_path_buf()),
        };
        self.intern_key(path, key, stamp, false)
    }

    /// The inode presenting version `stamp` of file `path` as a link to its staged copy.
    pub(crate) fn intern_redirect(&self, path: &Path, stamp: Stamp) -> u64 {
        let key = NodeKey::Redirect(path.to_path_buf(), stamp);
        self.intern_key(path, key, Some(stamp), true)
    }

    fn intern_key(&self, path: &Path, key: NodeKey, stamp: Option<Stamp>, redirect: bool) -> u64 {
        let mut table = self.lock();
        // A file written through the mount keeps its inode from version to version.
        if let (NodeKey::Version(..), Some(stamp)) = (&key, stamp)
            && let Some(&ino) = table.latest.get(path)
            && (table.follow || table.live.contains(&ino))
            && !table.gone.contains(&ino)
            && table
                .nodes
                .get(&ino)
                .is_some_and(|n| !n.redirect && n.stamp.is_some())
        {
            drop(table);
            self.restamp(ino, stamp);
            return ino;
        }
        // (A number journaled before a rename may still be keyed by its old path.)
        if let Some(&ino) = table.by_key.get(&key)
            && table.nodes.get(&ino).is_some_and(|n| n.path == path)
            && !table.gone.contains(&ino)
        {
            table.latest.insert(path.to_path_buf(), ino);
            return ino;
        }
        let ino = table.next;
        table.next += 1;
        table.by_key.insert(key, ino);
        table.latest.insert(path.to_path_buf(), ino);
        let node = Node {
            path: path.to_path_buf(),
            stamp,
            redirect,
        };
        if let Some(journal) = table.journal.as_mut() {
            record(journal, ino, &node);
        }
        table.nodes.insert(ino, node);
        ino
    }

    /// What `ino` stands for, if this mount handed it out.
    pub(crate) fn get(&self, ino: u64) -> Option<Node> {
        self.lock().nodes.get(&ino).cloned()
    }

    /// The inode of directory `path` if it was handed out (used for "..").
    pub(crate) fn dir_ino(&self, path: &Path) -> Option<u64> {
        self.lock()
            .by_key
            .get(&NodeKey::Path(path.to_path_buf()))
            .copied()
    }

    /// Records what the source last said about `attr.ino`.
    pub(crate) fn remember_attr(&self, attr: Attr) {
        let mut table = self.lock();
        if let Some(node) = table.nodes.get(&attr.ino) {
            let path = node.path.clone();
            table.absent.remove(&path);
        }
        table.attrs.insert(attr.ino, (attr, Instant::now()));
    }

    /// Records that the source said `path` does not exist.
    pub(crate) fn remember_absent(&self, path: &Path) {
        self.lock().absent.insert(path.to_path_buf());
    }

    /// What the source last said of the name `path` when asked for it: its entry's
    /// attributes, or that it does not exist; None if it was never asked. (The
    /// answers kept with the cache, `stagefs_stage::answers`, answer next, where a
    /// name a kept listing lacks is absent.)
    pub(crate) fn known_entry(&self, path: &Path) -> Option<Known> {
        let table = self.lock();
        if table.absent.contains(path) {
            return Some(Known::Absent);
        }
        let ino = table.latest.get(path)?;
        table.attrs.get(ino).map(|(attr, _)| Known::Entry(*attr))
    }

    /// Records the target of symlink `ino`.
    pub(crate) fn remember_link(&self, ino: u64, target: &[u8]) {
        self.lock().links.insert(ino, target.to_vec());
    }

    /// The last known attributes of `ino`.
    pub(crate) fn known_attr(&self, ino: u64) -> Option<Attr> {
        self.lock().attrs.get(&ino).map(|(attr, _)| *attr)
    }

    /// The attributes of `ino` if the source gave them less than `age` ago.
    pub(crate) fn recent_attr(&self, ino: u64, age: Duration) -> Option<Attr> {
        let table = self.lock();
        let (attr, when) = table.attrs.get(&ino)?;
        (when.elapsed() < age).then_some(*attr)
    }

    /// Records the listing of directory `ino`.
    pub(crate) fn remember_listing(&self, ino: u64, entries: &[DirEntry]) {
        let mut table = self.lock();
        if let Some(dir) = table.nodes.get(&ino).map(|node| node.path.clone()) {
            for entry in entries {
                table.absent.remove(&dir.join(&entry.name));
            }
        }
        table.listings.insert(ino, entries.to_vec());
    }

    /// The last known listing of directory `ino`.
    pub(crate) fn known_listing(&self, ino: u64) -> Option<Vec<DirEntry>> {
        self.lock().listings.get(&ino).cloned()
    }

    /// The last known target of symlink `ino`.
    pub(crate) fn known_link(&self, ino: u64) -> Option<Vec<u8>> {
        self.lock().links.get(&ino).cloned()
    }

    // ------------------------------------------------------------ changes made through the mount

    /// Marks file inode `ino` as written through the mount: from now on it follows
    /// its file ([`Inodes::restamp`]) instead of standing for one version.
    pub(crate) fn set_live(&self, ino: u64) {
        self.lock().live.insert(ino);
    }

    /// The newest inode handed out for `path`, if any.
    pub(crate) fn latest_ino(&self, path: &Path) -> Option<u64> {
        self.lock().latest.get(path).copied()
    }

    /// Whether file inode `ino` follows its file: it was written through the mount,
    /// or every file inode does.
    pub(crate) fn is_live(&self, ino: u64) -> bool {
        let table = self.lock();
        table.live.contains(&ino)
            || table.follow
                && table
                    .nodes
                    .get(&ino)
                    .is_some_and(|n| n.stamp.is_some() && !n.redirect)
    }

    /// Makes every file inode follow its file from version to version, as an NFS
    /// server's file handle follows its file: an NFS client has no entry timeout, so
    /// it learns that a file changed at the source (another machine's
    /// `save_pretrained` truncating and rewriting it in place) only from new
    /// attributes of the handle it holds. Were that handle one version, its
    /// attributes would never change and the client would go on reading the old
    /// bytes from its cache while the directory is unchanged.
    pub(crate) fn follow_files(&self) {
        self.lock().follow = true;
    }

    /// Whether `ino`'s entry was removed or replaced through the mount.
    pub(crate) fn is_gone(&self, ino: u64) -> bool {
        self.lock().gone.contains(&ino)
    }

    /// Makes file inode `ino` stand for version `stamp` of its file.
    pub(crate) fn restamp(&self, ino: u64, stamp: Stamp) {
        let mut table = self.lock();
        let Some(node) = table.nodes.get(&ino).cloned() else {
            return;
        };
        if node.stamp == Some(stamp) || node.redirect || node.stamp.is_none() {
            return;
        }
        if let Some(old) = node.stamp {
            table
                .by_key
                .remove(&NodeKey::Version(node.path.clone(), old));
        }
        table
            .by_key
            .insert(NodeKey::Version(node.path.clone(), stamp), ino);
        table.latest.insert(node.path.clone(), ino);
        let node = Node {
            stamp: Some(stamp),
            ..node
        };
        if let Some(journal) = table.journal.as_mut() {
            record(journal, ino, &node);
        }
        table.nodes.insert(ino, node);
    }

    /// `from`, and everything under it, is now at `to`; what was at `to` is gone.
    pub(crate) fn rename(&self, from: &Path, to: &Path) {
        let mut table = self.lock();
        let under = |path: &Path, top: &Path| path.starts_with(top);
        let moved: Vec<u64> = table
            .nodes
            .iter()
            .filter(|(ino, n)| under(&n.path, from) && !table.gone.contains(ino))
            .map(|(ino, _)| *ino)
            .collect();
        let replaced: Vec<u64> = table
            .nodes
            .iter()
            .filter(|(ino, n)| under(&n.path, to) && !moved.contains(ino))
            .map(|(ino, _)| *ino)
            .collect();
        for ino in replaced {
            table.detach(ino);
        }
        for ino in moved {
            let Some(node) = table.nodes.get(&ino).cloned() else {
                continue;
            };
            let Ok(rest) = node.path.strip_prefix(from) else {
                continue;
            };
            let path = if rest.as_os_str().is_empty() {
                to.to_path_buf()
            } else {
                to.join(rest)
            };
            table.by_key.remove(&node.key());
            if table.latest.get(&node.path) == Some(&ino) {
                table.latest.remove(&node.path);
            }
            let node = Node { path, ..node };
            table.by_key.insert(node.key(), ino);
            table.latest.insert(node.path.clone(), ino);
            if let Some(journal) = table.journal.as_mut() {
                record(journal, ino, &node);
            }
            table.nodes.insert(ino, node);
        }
        table.dir_changed(from);
        table.dir_changed(to);
        table.absent.retain(|path| !path.starts_with(to));
        table.absent.insert(from.to_path_buf());
    }

    /// The entry at `path` (and anything under it) was removed through the mount.
    pub(crate) fn forget(&self, path: &Path) {
        let mut table = self.lock();
        let gone: Vec<u64> = table
            .nodes
            .iter()
            .filter(|(_, n)| n.path.starts_with(path))
            .map(|(ino, _)| *ino)
            .collect();
        for ino in gone {
            table.detach(ino);
        }
        table.dir_changed(path);
        table.absent.insert(path.to_path_buf());
    }

    /// An entry was created at `path` through the mount: its directory's listing
    /// is out of date.
    pub(crate) fn created(&self, path: &Path) {
        let mut table = self.lock();
        table.dir_changed(path);
        table.absent.remove(path);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        lock(&self.table)
    }
}

impl Node {
    fn key(&self) -> NodeKey {
        match (self.stamp, self.redirect) {
            (Some(stamp), true) => NodeKey::Redirect(self.path.clone(), stamp),
            (Some(stamp), false) => NodeKey::Version(self.path.clone(), stamp),
            (None, _) => NodeKey::Path(self.path.clone()),
        }
    }
}

impl Table {
    /// No path leads to `ino` any more; handles open on it keep working.
    fn detach(&mut self, ino: u64) {
        let Some(node) = self.nodes.get(&ino) else {
            return;
        };
        let (key, path) = (node.key(), node.path.clone());
        if self.by_key.get(&key) == Some(&ino) {
            self.by_key.remove(&key);
        }
        if self.latest.get(&path) == Some(&ino) {
            self.latest.remove(&path);
        }
        self.listings.remove(&ino);
        self.links.remove(&ino);
        self.gone.insert(ino);
    }

    /// The directory holding `path` changed: its remembered listing is dropped, so
    /// it is never recalled while the source is away.
    fn dir_changed(&mut self, path: &Path) {
        let parent = path.parent().unwrap_or(Path::new("")).to_path_buf();
        if let Some(&dir) = self.by_key.get(&NodeKey::Path(parent)) {
            self.listings.remove(&dir);
        }
    }
}

/// Appends `node`'s number to the journal. Not synced: a number lost in a crash is
/// handed out anew after it, and the client's handle for it answers stale.
fn record(journal: &mut File, ino: u64, node: &Node) {
    let Some(path) = node.path.to_str() else {
        // Not valid UTF-8: its handle does not survive a restart (it answers stale).
        return;
    };
    let line = JournalLine::Node {
        ino,
        path: path.to_owned(),
        stamp: node.stamp,
        redirect: node.redirect,
    };
    let written = serde_json::to_string(&line)
        .map_err(io::Error::other)
        .and_then(|line| writeln!(journal, "{line}"));
    if let Err(e) = written {
        debug!(error = %e, "recording an inode number failed; its handle will not survive a restart");
    }
}

/// A generation no earlier journal had: the time in milliseconds.
fn fresh_generation() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    #[test]
    fn new_file_version_gets_new_inode() -> std::io::Result<()> {
        let dir = tempfile_dir()?;
        let file = dir.join("f");
        fs::write(&file, b"one")?;
        let inodes = Inodes::new();
        let a = inodes.intern(Path::new("f"), &meta_of(&file)?);
        assert_eq!(a, inodes.intern(Path::new("f"), &meta_of(&file)?));
        fs::write(&file, b"three")?;
        let b = inodes.intern(Path::new("f"), &meta_of(&file)?);
        assert_ne!(a, b);
        assert_eq!(inodes.get(a).map(|n| n.path), Some(PathBuf::from("f")));
        let d = inodes.intern(Path::new("d"), &meta_of(&dir)?);
        assert_eq!(inodes.dir_ino(Path::new("d")), Some(d));
        fs::remove_dir_all(dir)
    }

    #[test]
    fn a_redirect_is_its_own_inode_per_version() -> std::io::Result<()> {
        let dir =
            std::env::temp_dir().join(format!("stagefs-inodes-redirect-{}", std::process::id()));
        fs::create_dir_all(&dir)?;
        let file = dir.join("w");
        fs::write(&file, b"weights")?;
        let meta = meta_of(&file)?;
        let inodes = Inodes::new();
        let regular = inodes.intern(Path::new("w"), &meta);
        let link = inodes.intern_redirect(Path::new("w"), Stamp::of(&meta));
        assert_ne!(regular, link);
        assert_eq!(
            link,
            inodes.intern_redirect(Path::new("w"), Stamp::of(&meta))
        );
        let node = inodes.get(link).expect("handed out");
        assert!(node.redirect);
        assert_eq!(node.stamp, Some(Stamp::of(&meta)));
        assert!(!inodes.get(regular).expect("handed out").redirect);
        fs::remove_dir_all(dir)
    }

    #[test]
    fn a_journal_gives_the_same_numbers_after_a_restart() -> std::io::Result<()> {
        let dir = tempfile::TempDir::new()?;
        let (journal, file) = (dir.path().join("inodes.jsonl"), dir.path().join("w"));
        fs::write(&file, b"weights")?;
        let meta = meta_of(&file)?;
        let first = Inodes::with_journal(&journal)?;
        let sub = first.intern(Path::new("d"), &meta_of(dir.path())?);
        let w = first.intern(Path::new("d/w"), &meta);
        let link = first.intern_redirect(Path::new("d/w"), Stamp::of(&meta));
        let generation = first.generation();
        assert_ne!(generation, 0);
        drop(first);

        let again = Inodes::with_journal(&journal)?;
        assert_eq!(again.generation(), generation);
        assert_eq!(again.get(w).map(|n| n.path), Some(PathBuf::from("d/w")));
        assert!(again.get(link).is_some_and(|n| n.redirect));
        assert_eq!(again.intern(Path::new("d/w"), &meta), w);
        assert_eq!(again.dir_ino(Path::new("d")), Some(sub));
        let new = again.intern(Path::new("d/other"), &meta);
        assert!(new > link, "new numbers never reuse old ones");
        Ok(())
    }

    #[test]
    fn an_unreadable_journal_starts_a_new_generation() -> std::io::Result<()> {
        let dir = tempfile::TempDir::new()?;
        let journal = dir.path().join("inodes.jsonl");
        fs::write(&journal, b"not json\n")?;
        let inodes = Inodes::with_journal(&journal)?;
        assert_ne!(inodes.generation(), 0);
        assert!(inodes.get(ROOT_INO + 1).is_none());
        let written = fs::read_to_string(&journal)?;
        assert!(written.starts_with("{\"generation\":"), "{written}");
        Ok(())
    }

    fn meta_of(path: &Path) -> std::io::Result<SourceMeta> {
        Ok(SourceMeta::from(&fs::metadata(path)?))
    }

    fn tempfile_dir() -> std::io::Result<PathBuf> {
        let dir = std::env::temp_dir().join(format!("stagefs-inodes-{}", std::process::id()));
        fs::create_dir_all(&dir)?;
        Ok(dir)
    }
}
