//! Which stored copies a write through the mount has made untrustworthy.
//!
//! The store tells a stale copy by its stamp (size and mtime), which catches changes
//! made behind the mount's back. A write through the mount may leave the same stamp
//! (a rewrite of the same length within the filesystem's mtime resolution, or
//! `cp -p`/`rsync -t` setting the old mtime back), so every path written, truncated,
//! renamed (from or over) or removed through the mount is *tainted*: until its stored
//! copy has been removed after the change, no stored copy of it is served, presented
//! as a link or recalled while the source is away. While a handle writes to it, or a
//! copy of it is in progress, it stays tainted whatever the store holds.
//!
//! Each taint has a generation; clearing records the generation it cleared, so a
//! later write taints the path again. A renamed directory taints everything under it.
//! Content-addressed blobs (`blobs/<sha256>`) are never tainted: a stored copy of one
//! is verified against its name, so it is right whatever was written there.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use stagefs_source::locks::lock;

#[derive(Debug, Default)]
pub(crate) struct Taints {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    generation: u64,
    /// Paths (and, for renamed directories, everything under them) tainted, with the
    /// generation of their latest taint.
    tainted: HashMap<PathBuf, u64>,
    /// The generation up to which a path's stored copy was removed.
    cleared: HashMap<PathBuf, u64>,
    /// Handles open for writing on each path now.
    writers: HashMap<PathBuf, Writers>,
}

/// The handles open for writing on one path.
#[derive(Debug, Default, Clone, Copy)]
struct Writers {
    open: usize,
    /// Those of them that sent a write.
    wrote: usize,
}

/// Whether a path's stored copy may be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trust {
    /// Nothing written through the mount stands between the store and the source.
    Trusted,
    /// Taints since its copy was last removed: remove the copy (then
    /// [`Taints::cleared`] with this generation) before using the store for it.
    RemoveFirst(u64),
    /// Being written now: read it from the source.
    Untrusted,
}

fn content_addressed(path: &Path) -> bool {
    stagefs_stage::named_by_sha256(path)
}

impl Taints {
    /// `path` (and anything under it) was changed through the mount; the taint's
    /// generation.
    pub(crate) fn taint(&self, path: &Path) -> u64 {
        self.taint_after(path, 0).0
    }

    /// Taints `path` and says whether `expected` was its latest taint until then
    /// (nothing else changed it since), in one step.
    pub(crate) fn taint_after(&self, path: &Path, expected: u64) -> (u64, bool) {
        let mut state = lock(&self.state);
        let unchanged = state.tainted.get(path).copied().unwrap_or(0) == expected;
        state.generation += 1;
        let generation = state.generation;
        state.tainted.insert(path.to_path_buf(), generation);
        (generation, unchanged)
    }

    /// Handles open for writing on `path` now.
    pub(crate) fn writers_of(&self, path: &Path) -> usize {
        lock(&self.state).writers.get(path).map_or(0, |w| w.open)
    }

    /// Handles open for writing on `path` now that sent a write.
    pub(crate) fn writers_that_wrote(&self, path: &Path) -> usize {
        lock(&self.state).writers.get(path).map_or(0, |w| w.wrote)
    }

    /// A handle open for writing on `path` sent its first write.
    pub(crate) fn first_write(&self, path: &Path) {
        if let Some(w) = lock(&self.state).writers.get_mut(path) {
            w.wrote += 1;
        }
    }

    /// The generation of `path`'s own latest taint, 0 for none.
    pub(crate) fn latest(&self, path: &Path) -> u64 {
        lock(&self.state).tainted.get(path).copied().unwrap_or(0)
    }

    /// A handle opened `path` for writing; `changed`: the open itself changed it (a
    /// create, a truncation). While it is open the path is not trusted; an open that
    /// changed nothing taints nothing, so a writer that reopens a file it just wrote
    /// (to fsync it, say) leaves that file's written copy standing. The path's
    /// latest taint once opened.
    pub(crate) fn writer_opened(&self, path: &Path, changed: bool) -> u64 {
        let generation = if changed {
            self.taint(path)
        } else {
            self.latest(path)
        };
        lock(&self.state)
            .writers
            .entry(path.to_path_buf())
            .or_default()
            .open += 1;
        generation
    }

    /// A handle writing to `path` was closed; `wrote`: it sent writes, which taint
    /// the path anew. The path's latest taint once closed.
    pub(crate) fn writer_closed(&self, path: &Path, wrote: bool) -> u64 {
        {
            let mut state = lock(&self.state);
            if let Some(w) = state.writers.get_mut(path) {
                w.open -= 1;
                if wrote {
                    w.wrote = w.wrote.saturating_sub(1);
                }
                if w.open == 0 {
                    state.writers.remove(path);
                }
            }
        }
        if wrote {
            self.taint(path)
        } else {
            self.latest(path)
        }
    }

    /// A writer's path moved with a rename.
    pub(crate) fn writers_renamed(&self, from: &Path, to: &Path) {
        let mut state = lock(&self.state);
        let moved: Vec<(PathBuf, Writers)> = state
            .writers
            .iter()
            .filter(|(p, _)| p.starts_with(from))
            .map(|(p, w)| (p.clone(), *w))
            .collect();
        for (path, w) in moved {
            state.writers.remove(&path);
            let rest = path.strip_prefix(from).unwrap_or(Path::new(""));
            let new = if rest.as_os_str().is_empty() {
                to.to_path_buf()
            } else {
                to.join(rest)
            };
            let there = state.writers.entry(new).or_default();
            there.open += w.open;
            there.wrote += w.wrote;
        }
    }

    /// Whether the store's copy of `path` may be used; `copying`: a copy of it is in
    /// progress (which may have read a mix of old and new bytes).
    pub(crate) fn trust(&self, path: &Path, copying: bool) -> Trust {
        if content_addressed(path) {
            return Trust::Trusted;
        }
        let state = lock(&self.state);
        if state.writers.contains_key(path) {
            return Trust::Untrusted;
        }
        if state.tainted.is_empty() {
            return Trust::Trusted;
        }
        let needed = path
            .ancestors()
            .filter(|p| !p.as_os_str().is_empty())
            .filter_map(|p| state.tainted.get(p))
            .max()
            .copied();
        let Some(needed) = needed else {
            return Trust::Trusted;
        };
        if state.cleared.get(path).is_some_and(|&done| done >= needed) {
            return Trust::Trusted;
        }
        if copying {
            Trust::Untrusted
        } else {
            Trust::RemoveFirst(needed)
        }
    }

    /// The stored copy of `path` was removed after taint `generation`.
    pub(crate) fn cleared(&self, path: &Path, generation: u64) {
        let mut state = lock(&self.state);
        let done = state.cleared.entry(path.to_path_buf()).or_default();
        *done = (*done).max(generation);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taint_holds_until_the_copy_is_removed_and_returns_with_the_next_write() {
        let w = Taints::default();
        let p = Path::new("m/weights.bin");
        assert_eq!(w.trust(p, false), Trust::Trusted);
        w.writer_opened(p, false);
        assert_eq!(w.trust(p, false), Trust::Untrusted);
        w.writer_closed(p, true);
        let Trust::RemoveFirst(generation) = w.trust(p, false) else {
            panic!("tainted");
        };
        assert_eq!(w.trust(p, true), Trust::Untrusted, "a copy in progress");
        w.cleared(p, generation);
        assert_eq!(w.trust(p, false), Trust::Trusted);
        w.taint(p);
        assert!(matches!(w.trust(p, false), Trust::RemoveFirst(_)));
    }

    #[test]
    fn a_writer_that_changes_nothing_taints_nothing_but_is_never_trusted_while_open() {
        let w = Taints::default();
        let p = Path::new("m/weights.bin");
        let opened = w.writer_opened(p, false);
        assert_eq!(w.trust(p, false), Trust::Untrusted);
        assert_eq!(w.writer_closed(p, false), opened);
        assert_eq!(w.trust(p, false), Trust::Trusted);
        // A create or a truncation at the open is a change.
        let created = w.writer_opened(p, true);
        assert!(created > opened);
        w.writer_closed(p, false);
        assert!(matches!(w.trust(p, false), Trust::RemoveFirst(_)));
    }

    #[test]
    fn a_renamed_directory_taints_what_is_under_it_but_never_a_blob() {
        let w = Taints::default();
        w.taint(Path::new("a"));
        assert!(matches!(
            w.trust(Path::new("a/b/c"), false),
            Trust::RemoveFirst(_)
        ));
        assert_eq!(w.trust(Path::new("ab"), false), Trust::Trusted);
        let blob = format!("a/blobs/{}", "e".repeat(64));
        assert_eq!(w.trust(Path::new(&blob), false), Trust::Trusted);
    }
}
