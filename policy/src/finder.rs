//! Names the macOS Finder, Spotlight and AppleDouble ask for in every directory they
//! visit. They are never model files, and each lookup of one would cost a round trip
//! to a NAS (or, once it is away, a wait): on a Mac they are refused at once.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

/// Names refused without asking the source.
const FINDER_NAMES: &[&[u8]] = &[
    b".DS_Store",
    b".Spotlight-V100",
    b".metadata_never_index",
    b".metadata_never_index_unless_rootfs",
    b".metadata_direct_scope_only",
    b".Trashes",
    b".fseventsd",
    b".TemporaryItems",
    b".VolumeIcon.icns",
    b".hidden",
    b"._.",
];

/// Whether `name` is one the Finder or Spotlight probes for: an AppleDouble `._x`
/// companion, `.DS_Store`, or a volume's indexing and trash markers.
pub fn is_finder_file(name: &OsStr) -> bool {
    let name = name.as_bytes();
    name.starts_with(b"._") || FINDER_NAMES.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finder_names_are_recognised_and_model_files_are_not() {
        for name in [
            ".DS_Store",
            "._model.safetensors",
            ".Spotlight-V100",
            ".Trashes",
        ] {
            assert!(is_finder_file(OsStr::new(name)), "{name}");
        }
        for name in [
            "model.safetensors",
            ".gitattributes",
            ".locks",
            "_x",
            ".cache",
        ] {
            assert!(!is_finder_file(OsStr::new(name)), "{name}");
        }
    }
}
