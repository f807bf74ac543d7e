//! NFS links: how an NFS mount lets the kernel read a staged blob from its local copy
//! without a change of type under a name the client has cached.
//!
//! On FUSE a staged file turns into a link to its copy (`redirect.rs`); an NFS client
//! keeps names and attributes, so a name that changed from a file to a link would
//! give programs ESTALE. Instead, on an NFS mount with links on, every HF blob that
//! is staged on open (content-addressed, at least `min_stage_size`) is a link from
//! its first lookup, and only its text changes:
//! - while no whole, trusted copy can be named, the text is the blob's *alias*,
//!   `.stagefs-<sha256>` beside it, a name the mount answers with the blob's regular
//!   file (which stages on first read, as before) and no listing shows;
//! - once a copy can be named, the text is the copy's absolute path, and the
//!   client's own VFS reads the copy: no READ reaches the server.
//!
//! The clients re-read a link's text only when its attributes change, macOS when
//! the mtime does and Linux when the ctime does (`../shared/nfs-symlink-caching.md`),
//! so every change of text moves both, to a time no earlier text of this link had.
//! A reply's attributes and text come from the one record here, and the text is
//! recorded before any attributes carrying its time are handed out. Copies named
//! here are held by the store until no client can follow a link to them
//! (`stagefs_store::Handout::Link`).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Mutex;

use stagefs_source::locks::lock;
use stagefs_stage::is_content_addressed;

use crate::FsConfig;

/// What a blob's alias name starts with: the blob's name follows.
pub const ALIAS_PREFIX: &str = ".stagefs-";

/// The mount's NFS links and the text each one shows.
#[derive(Debug)]
pub(crate) struct NfsLinks {
    enabled: bool,
    min_stage_size: u64,
    /// By inode: the text each link showed last, and when it last changed.
    shown: Mutex<HashMap<u64, Shown>>,
}

#[derive(Debug, Clone)]
struct Shown {
    text: Vec<u8>,
    changed_ns: i64,
}

impl NfsLinks {
    pub(crate) fn new(config: &FsConfig) -> Self {
        NfsLinks {
            enabled: config.nfs_links_allowed(),
            min_stage_size: config.min_stage_size,
            shown: Mutex::default(),
        }
    }

    /// Whether this mount presents blobs as NFS links at all.
    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether source file `path` of `size` bytes is presented as a link.
    pub(crate) fn presents(&self, path: &Path, size: u64) -> bool {
        self.enabled && size >= self.min_stage_size && is_content_addressed(path)
    }

    /// The blob name that `name`, an alias, stands for.
    pub(crate) fn aliased(&self, name: &OsStr) -> Option<OsString> {
        if !self.enabled {
            return None;
        }
        let blob = name.as_bytes().strip_prefix(ALIAS_PREFIX.as_bytes())?;
        (!blob.is_empty()).then(|| OsStr::from_bytes(blob).to_os_string())
    }

    /// Records `text` as what link `ino` says now; the time its text last changed,
    /// strictly later than any time this link showed before.
    pub(crate) fn show(&self, ino: u64, text: &[u8]) -> i64 {
        let mut shown = lock(&self.shown);
        if let Some(was) = shown.get(&ino)
            && was.text == text
        {
            return was.changed_ns;
        }
        let earliest = shown.get(&ino).map_or(i64::MIN, |was| was.changed_ns + 1);
        let changed_ns = now_ns().max(earliest);
        shown.insert(
            ino,
            Shown {
                text: text.to_vec(),
                changed_ns,
            },
        );
        changed_ns
    }
}

/// The text of a link to a blob with no copy to name: its alias, beside it.
pub(crate) fn alias_text(path: &Path) -> Vec<u8> {
    let name = path.file_name().unwrap_or_default().as_bytes();
    [ALIAS_PREFIX.as_bytes(), name].concat()
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOB: &str =
        "models--acme--x/blobs/e46fde39aab19ef2e6d9b2f3421106cb6bf4f35b381c7f8a7fa9ab5b13c9bfe8";

    fn links(edit: impl FnOnce(&mut FsConfig)) -> NfsLinks {
        let mut config = FsConfig {
            min_stage_size: 1 << 20,
            nfs_links: true,
            served_by_root: false,
            ..FsConfig::default()
        };
        edit(&mut config);
        NfsLinks::new(&config)
    }

    #[test]
    fn only_blobs_staged_on_open_are_links() {
        let links = links(|_| {});
        assert!(links.presents(Path::new(BLOB), 1 << 20));
        assert!(!links.presents(Path::new(BLOB), (1 << 20) - 1), "small");
        assert!(!links.presents(Path::new("me/model/model.safetensors"), 8 << 20));
    }

    #[test]
    fn a_root_or_shared_mount_presents_no_links() {
        // Copies are the serving user's, 0400: another user could not read them, and
        // root's writes through a link would land in them.
        assert!(!links(|c| c.served_by_root = true).enabled());
        assert!(!links(|c| c.allow_other = true).enabled());
        assert!(!links(|c| c.nfs_links = false).presents(Path::new(BLOB), 8 << 20));
    }

    #[test]
    fn an_alias_names_its_blob_beside_it() {
        let links = links(|_| {});
        let alias = alias_text(Path::new(BLOB));
        let name = Path::new(BLOB).file_name().expect("a name");
        assert_eq!(
            links.aliased(OsStr::from_bytes(&alias)),
            Some(name.to_os_string())
        );
        assert_eq!(links.aliased(OsStr::new(ALIAS_PREFIX)), None);
        assert_eq!(links.aliased(OsStr::new("config.json")), None);
    }

    #[test]
    fn every_change_of_text_moves_the_time_forward_and_none_is_reused() {
        let links = links(|_| {});
        let first = links.show(7, b".stagefs-x");
        assert_eq!(
            links.show(7, b".stagefs-x"),
            first,
            "unchanged text, same time"
        );
        let copied = links.show(7, b"/cache/v1/data/x");
        assert!(copied > first);
        let back = links.show(7, b".stagefs-x");
        assert!(back > copied, "back to an earlier text, at a new time");
        assert_ne!(back, first);
    }
}
