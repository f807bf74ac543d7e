//! Offline-complete models: everything a loader needs of a model, known without the
//! source. A loader lists the model's directories, follows its snapshot links, reads
//! its small files (config, tokenizer, index, `refs/`) and probes names it lacks, and
//! an HF client reads the HF_HOME's `token`. A model is ready offline when every
//! directory on that way has a kept listing (a name a listing lacks is "no such
//! file"), every link its text, and every file a copy of the version the listing
//! gives: its weights staged, its small files kept.
//!
//! [`Stager::learn_tree`] asks the source for all of it (what `stagefs prefetch`
//! does after staging the weights); [`Stager::offline_gaps`] says, from the cache
//! alone, what is still missing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use stagefs_layout::hf::normalize;
use stagefs_source::{SourceError, Stamp};
use stagefs_store::index::Entry;
use stagefs_store::key::Key;

use crate::answers::Remembered;
use crate::{Stager, reusable};

/// Files read from a model's ancestors: huggingface_hub reads the access tokens at
/// an HF_HOME's root (`token` on every load, `stored_tokens` where tokens are
/// listed or switched). Kept like the model's own small files, with the cache's
/// owner-only permissions.
pub const ANCESTOR_FILES: [&str; 2] = ["token", "stored_tokens"];

/// Of [`ANCESTOR_FILES`], the one every load reads: a model is not ready offline
/// until its answer is known.
pub const TOKEN_FILE: &str = "token";

/// Entries walked at most in one model, so a mistaken root cannot walk a whole NAS.
const MOST_ENTRIES: usize = 200_000;

/// Where a walk starts, and whether it goes down into subdirectories.
#[derive(Debug, Clone)]
pub struct Part {
    /// A directory relative to the source root.
    pub dir: PathBuf,
    /// Its subdirectories too.
    pub whole: bool,
}

impl Part {
    /// `dir` and everything under it.
    pub fn whole(dir: impl Into<PathBuf>) -> Part {
        Part {
            dir: dir.into(),
            whole: true,
        }
    }

    /// `dir`'s own entries.
    pub fn listing(dir: impl Into<PathBuf>) -> Part {
        Part {
            dir: dir.into(),
            whole: false,
        }
    }
}

/// What a model lacks to load without its source: names whose answer is unknown,
/// and files with no copy of their version.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Gaps {
    /// The first few, relative to the source root.
    pub examples: Vec<PathBuf>,
    /// How many in all.
    pub count: usize,
}

/// Gaps named in full; the rest are counted.
const EXAMPLES: usize = 5;

impl Gaps {
    fn add(&mut self, path: &Path) {
        if self.examples.len() < EXAMPLES {
            self.examples.push(path.to_path_buf());
        }
        self.count += 1;
    }
}

impl Stager {
    /// Asks the source for every listing, link and attribute under `parts` and the
    /// listings of their ancestors, which [`Stager::answers`] keeps; returns the
    /// small files (under `min` bytes) found there to keep copies of (the ancestors' [`ANCESTOR_FILES`]
    /// among them). Blocks on the source: run it on the source pool.
    pub fn learn_tree(&self, parts: &[Part], min: u64) -> Result<Vec<PathBuf>, SourceError> {
        let (source, answers) = (self.source(), self.answers());
        let mut small = Vec::new();
        let mut walked = 0;
        for part in parts {
            for ancestor in ancestors(&part.dir) {
                if let Ok(meta) = source.stat(&ancestor) {
                    answers.saw(&ancestor, &meta);
                }
                let listed = source.read_dir(&ancestor)?;
                answers.saw_listing(&ancestor, &listed);
                for (name, meta) in &listed {
                    if meta.is_file()
                        && meta.size < min
                        && ANCESTOR_FILES.iter().any(|a| name == *a)
                    {
                        small.push(ancestor.join(name));
                    }
                }
            }
            let mut dirs = vec![part.dir.clone()];
            while let Some(dir) = dirs.pop() {
                answers.saw(&dir, &source.stat(&dir)?);
                let listed = source.read_dir(&dir)?;
                answers.saw_listing(&dir, &listed);
                for (name, meta) in listed {
                    walked += 1;
                    if walked > MOST_ENTRIES {
                        return Ok(small);
                    }
                    let path = dir.join(&name);
                    if meta.is_symlink() {
                        let text = source.read_link(&path)?;
                        answers.saw_link(&path, text.as_os_str().as_encoded_bytes());
                    } else if meta.is_dir() && part.whole {
                        dirs.push(path);
                    } else if meta.is_file() && meta.size < min {
                        small.push(path);
                    }
                }
            }
        }
        Ok(small)
    }

    /// Copies of the small files `learn_tree` found, kept as a loader's reads keep
    /// them; the first failure, if any. The answers are synced once they are kept.
    pub async fn keep_small_files(&self, files: &[PathBuf]) -> Result<(), String> {
        let mut failed = None;
        for file in files {
            if let Err(e) = self.keep(file).await {
                failed.get_or_insert_with(|| format!("{}: {e}", file.display()));
            }
        }
        // Committed before the prefetch reports: "ready offline" then survives a power
        // cut, and a copy waiting for its commit (pinned) is not shown as in use.
        self.commit_off_thread().await;
        self.answers().sync();
        failed.map_or(Ok(()), Err)
    }

    /// What a model whose loaders need `needs` lacks to load with the source away,
    /// from the cache alone (never asks the source): every file needs a copy of the
    /// version known (staged or kept).
    pub fn offline_gaps(&self, needs: &[Need]) -> Gaps {
        let check = Check {
            answers: self.answers(),
            copies: Copies::of(self),
        };
        let mut gaps = Gaps::default();
        for need in needs {
            match need {
                Need::Name { path, whole } => check.name(path, *whole, &mut gaps),
                Need::Listing { dir, whole } => check.listing(dir, *whole, &mut gaps),
            }
        }
        gaps
    }
}

/// What a loader needs known of a model, for [`Stager::offline_gaps`].
#[derive(Debug, Clone)]
pub enum Need {
    /// The answer for a name (an entry, or "no such file"): a file's copy, a link's
    /// text and what it leads to, and a directory's listing if `whole`.
    Name {
        /// Relative to the source root.
        path: PathBuf,
        /// For a directory: its listing, and everything under it.
        whole: bool,
    },
    /// A directory's listing, and what each entry needs (subdirectories' too if
    /// `whole`).
    Listing {
        /// Relative to the source root.
        dir: PathBuf,
        /// Subdirectories too.
        whole: bool,
    },
}

/// Checks needs against the kept answers and the store's copies.
struct Check<'a> {
    answers: &'a crate::answers::Answers,
    copies: Copies,
}

impl Check<'_> {
    fn name(&self, path: &Path, whole: bool, gaps: &mut Gaps) {
        match self.answers.entry(path) {
            None => gaps.add(path),
            Some(Remembered::Absent) => {}
            Some(Remembered::Entry(meta)) => self.entry(path, &meta, whole, gaps),
        }
    }

    fn listing(&self, dir: &Path, whole: bool, gaps: &mut Gaps) {
        let Some(listed) = self.answers.listing(dir) else {
            gaps.add(dir);
            return;
        };
        for (name, meta) in listed {
            self.entry(&dir.join(&name), &meta, whole, gaps);
        }
    }

    /// What entry `path`, known as `meta`, needs.
    fn entry(&self, path: &Path, meta: &stagefs_source::SourceMeta, whole: bool, gaps: &mut Gaps) {
        if meta.is_symlink() {
            let Some(text) = self.answers.link(path) else {
                gaps.add(path);
                return;
            };
            let dir = path.parent().unwrap_or(Path::new(""));
            let target = normalize(&dir.join(String::from_utf8_lossy(&text).as_ref()));
            match self.answers.entry(&target) {
                Some(Remembered::Entry(meta)) if meta.is_file() => {
                    if !self.copies.has(&target, Stamp::of(&meta)) {
                        gaps.add(path);
                    }
                }
                Some(Remembered::Entry(_)) => {}
                _ => gaps.add(path),
            }
        } else if meta.is_dir() {
            if whole {
                self.listing(path, whole, gaps);
            }
        } else if meta.is_file() && !self.copies.has(path, Stamp::of(meta)) {
            gaps.add(path);
        }
    }
}

/// The store's copies, by key, looked up without opening any.
struct Copies {
    by_key: HashMap<String, Vec<Entry>>,
}

impl Copies {
    fn of(stager: &Stager) -> Copies {
        let mut by_key: HashMap<String, Vec<Entry>> = HashMap::new();
        for info in stager.store().entries() {
            by_key.entry(info.key).or_default().push(info.entry);
        }
        Copies { by_key }
    }

    fn has(&self, rel: &Path, stamp: Stamp) -> bool {
        let key = Key::for_source_path(rel);
        self.by_key
            .get(key.as_str())
            .is_some_and(|entries| entries.iter().any(|e| reusable(e, &key, rel, stamp)))
    }
}

/// The directories above `dir`, from the root down ("" first), `dir` left out.
fn ancestors(dir: &Path) -> Vec<PathBuf> {
    let mut above: Vec<PathBuf> = dir.ancestors().skip(1).map(Path::to_path_buf).collect();
    above.reverse();
    above
}
