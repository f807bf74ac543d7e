//! Redirects: a staged file presented as a symbolic link to its local copy, so that
//! the kernel opens the copy itself and no read or page fault crosses the daemon.
//!
//! This is how staged files reach local-file speed where kernel passthrough is not
//! available (macOS, and every Linux mount made by an ordinary user). The decisions:
//! - only files that are staged on open (at least `min_stage_size`) are redirected;
//!   before a file is staged it is a regular file, whose open stages it;
//! - never while kernel passthrough serves staged files: it keeps the file a regular
//!   file and sees every open, which a redirect cannot;
//! - never with `--allow-other`: copies are readable by the mounting user only, so a
//!   link into the cache would fail other users with EACCES;
//! - on a writable mount, only content-addressed files (HF blobs, named by their
//!   sha256) are: any other file may be rewritten in place (`save_pretrained` over
//!   the folder a model was loaded from opens its shards with O_TRUNC), which a link
//!   to a read-only copy would refuse with EACCES;
//! - the copy must be whole and untouched since it was hashed (the store checks);
//!   otherwise the regular file is presented, and its open re-checks or re-stages;
//! - an open of the regular file is answered with that file, served by the daemon,
//!   even once its copy could be presented: a program that saw the file before it
//!   opened it (`cp` and `tar -h` compare what they stat'ed with what they opened)
//!   would take a link in its place for a file replaced under it, and skip it. New
//!   lookups present the link once the kernel's 1 s entry timeout has passed.

use std::path::{Path, PathBuf};

use stagefs_source::Stamp;
use stagefs_stage::is_content_addressed;

use crate::FsConfig;

/// Whether a mount presents staged files as links to their copies.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RedirectPolicy {
    enabled: bool,
    min_stage_size: u64,
    /// Changes pass through: only files nothing rewrites in place may be links.
    writable: bool,
}

/// How a regular file of the source is presented to the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Presented {
    /// As itself: opens go through the mount (and stage it).
    File,
    /// As a link to its staged copy at this absolute path.
    Link(PathBuf),
}

impl RedirectPolicy {
    pub(crate) fn new(config: &FsConfig) -> Self {
        RedirectPolicy {
            enabled: config.redirects_allowed(),
            min_stage_size: config.min_stage_size,
            writable: !config.read_only,
        }
    }

    /// Whether redirects can happen at all on this mount (for the startup log).
    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// How version `version` of source file `rel` is presented. `passthrough` says
    /// whether kernel passthrough currently serves staged files; `copy` finds a whole,
    /// untouched staged copy of exactly this version, and is asked only when a link is
    /// possible.
    pub(crate) fn present(
        &self,
        rel: &Path,
        version: Stamp,
        passthrough: bool,
        copy: impl FnOnce() -> Option<PathBuf>,
    ) -> Presented {
        let rewritable = self.writable && !is_content_addressed(rel);
        if !self.enabled || passthrough || version.size < self.min_stage_size || rewritable {
            return Presented::File;
        }
        copy().map_or(Presented::File, Presented::Link)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::path::Path;

    use super::*;

    const COPY: &str = "/cache/v1/data/sha256-00";
    /// A file of a plain model folder.
    const FILE: &str = "me/model/model.safetensors";
    /// An HF blob, named by its sha256.
    const BLOB: &str =
        "models--acme--x/blobs/e46fde39aab19ef2e6d9b2f3421106cb6bf4f35b381c7f8a7fa9ab5b13c9bfe8";

    fn policy(edit: impl FnOnce(&mut FsConfig)) -> RedirectPolicy {
        let mut config = FsConfig {
            min_stage_size: 1 << 20,
            // An ordinary user's mount: one served by root presents no links.
            read_only: true,
            served_by_root: false,
            ..FsConfig::default()
        };
        edit(&mut config);
        RedirectPolicy::new(&config)
    }

    fn version(size: u64) -> Stamp {
        Stamp {
            size,
            mtime_ns: 1_700_000_000_000_000_000,
            ..Stamp::default()
        }
    }

    fn staged() -> Option<PathBuf> {
        Some(PathBuf::from(COPY))
    }

    #[test]
    fn a_staged_large_file_is_presented_as_a_link_to_its_copy() {
        let presented = policy(|_| {}).present(Path::new(FILE), version(8 << 20), false, staged);
        assert_eq!(presented, Presented::Link(Path::new(COPY).into()));
    }

    #[test]
    fn a_mount_served_by_root_presents_no_links_even_read_only() {
        // An open for writing follows a link out of the mount, past its EROFS, and
        // root's writes ignore the copy's 0400.
        let root = policy(|c| c.served_by_root = true);
        let presented = root.present(Path::new(FILE), version(8 << 20), false, staged);
        assert_eq!(presented, Presented::File);
        let blob = root.present(Path::new(BLOB), version(8 << 20), false, staged);
        assert_eq!(blob, Presented::File);
    }

    #[test]
    fn a_file_without_a_usable_copy_stays_a_file() {
        assert_eq!(
            policy(|_| {}).present(Path::new(FILE), version(8 << 20), false, || None),
            Presented::File
        );
    }

    #[test]
    fn a_file_under_the_stage_size_stays_a_file_and_the_store_is_not_asked() {
        let asked = Cell::new(false);
        let presented =
            policy(|_| {}).present(Path::new(FILE), version((1 << 20) - 1), false, || {
                asked.set(true);
                staged()
            });
        assert_eq!(presented, Presented::File);
        assert!(!asked.get());
    }

    #[test]
    fn a_file_of_exactly_the_stage_size_is_redirected() {
        let presented = policy(|_| {}).present(Path::new(FILE), version(1 << 20), false, staged);
        assert!(matches!(presented, Presented::Link(_)));
    }

    #[test]
    fn kernel_passthrough_keeps_files_regular() {
        let asked = Cell::new(false);
        let presented = policy(|_| {}).present(Path::new(FILE), version(8 << 20), true, || {
            asked.set(true);
            staged()
        });
        assert_eq!(presented, Presented::File);
        assert!(!asked.get());
    }

    #[test]
    fn a_writable_mount_presents_only_blobs_as_links() {
        // As an ordinary user's writable mount has it (root's presents no links).
        let writable = RedirectPolicy {
            writable: true,
            ..policy(|_| {})
        };
        let asked = Cell::new(false);
        let file = writable.present(Path::new(FILE), version(8 << 20), false, || {
            asked.set(true);
            staged()
        });
        assert_eq!(file, Presented::File, "a file saved over in place");
        assert!(!asked.get());
        let blob = writable.present(Path::new(BLOB), version(8 << 20), false, staged);
        assert_eq!(blob, Presented::Link(Path::new(COPY).into()));
    }

    #[test]
    fn no_redirect_turns_it_off() {
        let policy = policy(|c| c.redirect = false);
        assert!(!policy.enabled());
        assert_eq!(
            policy.present(Path::new(FILE), version(8 << 20), false, staged),
            Presented::File
        );
    }

    #[test]
    fn allow_other_turns_it_off_since_copies_are_private() {
        let policy = policy(|c| c.allow_other = true);
        assert!(!policy.enabled());
        assert_eq!(
            policy.present(Path::new(FILE), version(8 << 20), false, staged),
            Presented::File
        );
    }
}
