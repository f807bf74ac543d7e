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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use fuser::FileAttr;
use stagefs_cache::{SourceMeta, Stamp};

use crate::handles::DirEntry;

/// The root directory's inode, as the kernel expects.
pub(crate) const ROOT_INO: u64 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum NodeKey {
    Path(PathBuf),
    Version(PathBuf, Stamp),
    Redirect(PathBuf, Stamp),
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
    /// source does not respond.
    attrs: HashMap<u64, FileAttr>,
    links: HashMap<u64, Vec<u8>>,
    listings: HashMap<u64, Vec<DirEntry>>,
}

/// Thread-safe map between inode numbers and source nodes.
#[derive(Debug)]
pub(crate) struct Inodes {
    table: Mutex<Table>,
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
        };
        Inodes {
            table: Mutex::new(table),
        }
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
        if let Some(&ino) = table.by_key.get(&key) {
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
    pub(crate) fn remember_attr(&self, attr: FileAttr) {
        self.lock().attrs.insert(attr.ino.0, attr);
    }

    /// Records the target of symlink `ino`.
    pub(crate) fn remember_link(&self, ino: u64, target: &[u8]) {
        self.lock().links.insert(ino, target.to_vec());
    }

    /// The last known attributes of `ino`.
    pub(crate) fn known_attr(&self, ino: u64) -> Option<FileAttr> {
        self.lock().attrs.get(&ino).copied()
    }

    /// The last known attributes of the newest inode for `path`.
    pub(crate) fn known_attr_of_path(&self, path: &Path) -> Option<FileAttr> {
        let table = self.lock();
        let ino = table.latest.get(path)?;
        table.attrs.get(ino).copied()
    }

    /// Records the listing of directory `ino`.
    pub(crate) fn remember_listing(&self, ino: u64, entries: &[DirEntry]) {
        self.lock().listings.insert(ino, entries.to_vec());
    }

    /// The last known listing of directory `ino`.
    pub(crate) fn known_listing(&self, ino: u64) -> Option<Vec<DirEntry>> {
        self.lock().listings.get(&ino).cloned()
    }

    /// The last known target of symlink `ino`.
    pub(crate) fn known_link(&self, ino: u64) -> Option<Vec<u8>> {
        self.lock().links.get(&ino).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
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

    fn meta_of(path: &Path) -> std::io::Result<SourceMeta> {
        Ok(SourceMeta::from(&fs::metadata(path)?))
    }

    fn tempfile_dir() -> std::io::Result<PathBuf> {
        let dir = std::env::temp_dir().join(format!("stagefs-inodes-{}", std::process::id()));
        fs::create_dir_all(&dir)?;
        Ok(dir)
    }
}
