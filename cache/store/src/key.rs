//! Store keys: what identifies a staged file.
//!
//! An HF LFS blob (`.../blobs/<64 hex>`) is named by the sha256 of its content, so it is
//! keyed by that hash and a blob shared by two snapshots or two repositories is staged
//! once. Any other file is keyed by its path relative to the source root.

use std::fmt;
use std::path::Path;

/// Identifies one staged file; also its file name in the store.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(String);

const CONTENT_PREFIX: &str = "sha256-";
const PATH_PREFIX: &str = "path-";

impl Key {
    /// The key of source file `rel` (relative to the source root).
    pub fn for_source_path(rel: &Path) -> Key {
        match lfs_sha256(rel) {
            Some(sha) => Key(format!("{CONTENT_PREFIX}{sha}")),
            None => Key(format!(
                "{PATH_PREFIX}{}",
                blake3::hash(rel.as_os_str().as_encoded_bytes()).to_hex()
            )),
        }
    }

    /// Parses a key as stored on disk, refusing anything that is not one (so a key can
    /// never name a file outside the store).
    pub fn parse(text: &str) -> Option<Key> {
        let hex = text
            .strip_prefix(CONTENT_PREFIX)
            .or_else(|| text.strip_prefix(PATH_PREFIX))?;
        is_lower_hex_64(hex).then(|| Key(text.to_string()))
    }

    /// The sha256 the content must have, for content-addressed (LFS blob) keys.
    pub fn content_sha256(&self) -> Option<&str> {
        self.0.strip_prefix(CONTENT_PREFIX)
    }

    /// The key as it appears in file names and the index.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether source file `rel` is content-addressed (an HF LFS blob, `<repo>/blobs/<sha256>`):
/// its bytes never change under its name, so nothing rewrites it in place.
pub fn is_content_addressed(rel: &Path) -> bool {
    lfs_sha256(rel).is_some()
}

/// The sha256 in the name of an HF LFS blob path (`<repo>/blobs/<sha256>`).
fn lfs_sha256(rel: &Path) -> Option<&str> {
    let name = rel.file_name()?.to_str()?;
    let in_blobs = rel.parent()?.file_name()? == "blobs";
    (in_blobs && is_lower_hex_64(name)).then_some(name)
}

fn is_lower_hex_64(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "e46fde39aab19ef2e6d9b2f3421106cb6bf4f35b381c7f8a7fa9ab5b13c9bfe8";

    #[test]
    fn lfs_blobs_are_keyed_by_their_hash() {
        let a = Key::for_source_path(Path::new(&format!("models--a--x/blobs/{SHA}")));
        let b = Key::for_source_path(Path::new(&format!("models--b--y/blobs/{SHA}")));
        assert_eq!(a, b);
        assert_eq!(a.content_sha256(), Some(SHA));
    }

    #[test]
    fn other_files_are_keyed_by_path() {
        let git_sha1 = "models--a--x/blobs/9064259f75e0c244335fbad002b6ccc8634291e2";
        let a = Key::for_source_path(Path::new(git_sha1));
        assert_eq!(a.content_sha256(), None);
        assert_ne!(
            a,
            Key::for_source_path(Path::new("models--a--x/blobs/other"))
        );
        let not_in_blobs = Key::for_source_path(Path::new(&format!("x/{SHA}")));
        assert_eq!(not_in_blobs.content_sha256(), None);
    }

    #[test]
    fn parse_accepts_only_real_keys() {
        let key = Key::for_source_path(Path::new("a/b"));
        assert_eq!(Key::parse(key.as_str()), Some(key));
        for bad in [
            "",
            "path-",
            "../etc/passwd",
            &format!("sha256-{}", &SHA[1..]),
            &format!("sha256-{SHA}/.."),
        ] {
            assert_eq!(Key::parse(bad), None, "{bad}");
        }
    }
}
