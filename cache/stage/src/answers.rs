//! What the source answered, kept with the cache: attributes of names, "no such
//! file" for names looked up and absent, directory listings and link texts, by path.
//!
//! Loaders do more than read weights: they list directories, follow snapshot links
//! and probe names a model lacks (`token`, `generation_config.json`, `.no_exist/`
//! markers). While the source is away, the mount answers them from here, so a model
//! loaded or prefetched once loads exactly as it did; the bytes of its files are the
//! store's copies. While the source answers, every answer replaces what is kept.
//!
//! Kept in a journal in the cache directory (owner-only, as the cache is): one JSON
//! line per change, appended, so it outlives the daemon. A torn last line (a crash
//! mid-write) is skipped; opening rewrites the journal from what it replayed, through
//! a temporary file renamed over it, so it never holds more than one line per name
//! and kind for long. Paths that are not UTF-8 are not kept (they fail while the
//! source is away, as before).

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use stagefs_source::locks::lock;
use stagefs_source::{Source, SourceError, SourceFile, SourceMeta};
use tracing::{debug, warn};

/// The journal's name in the cache directory.
pub const JOURNAL: &str = "answers.jsonl";

/// What is known of one name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remembered {
    /// It exists, with these attributes.
    Entry(SourceMeta),
    /// The source said it does not exist.
    Absent,
}

/// The source's answers, by path relative to its root ("" is the root).
#[derive(Debug)]
pub struct Answers {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    names: HashMap<PathBuf, Name>,
    journal: Option<File>,
}

/// What was said of one path. A listing of its directory may say more (see
/// [`Answers::entry`]).
#[derive(Debug, Default, Clone, PartialEq)]
struct Name {
    meta: Option<SourceMeta>,
    absent: bool,
    link: Option<Vec<u8>>,
    listing: Option<Vec<(OsString, SourceMeta)>>,
}

/// One line of the journal.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum Line {
    Meta {
        p: String,
        meta: SourceMeta,
    },
    Absent {
        p: String,
        absent: bool,
    },
    Link {
        p: String,
        link: String,
    },
    Listing {
        p: String,
        list: Vec<(String, SourceMeta)>,
    },
    /// The listing of `unlisted` is out of date (an entry made or removed in it).
    Unlisted {
        unlisted: String,
    },
    /// Everything under `forget` is forgotten (nothing is known of it).
    Forget {
        forget: String,
    },
}

impl Answers {
    /// Answers kept in memory only (tests, a cache that cannot hold a journal).
    pub fn in_memory() -> Answers {
        Answers {
            state: Mutex::default(),
        }
    }

    /// The answers kept in `journal`, read back and rewritten compactly; appended to
    /// from now on. A journal that cannot be written leaves them in memory only.
    pub fn open(journal: &Path) -> Answers {
        let answers = Answers::in_memory();
        if let Ok(file) = File::open(journal) {
            answers.replay(BufReader::new(file));
        }
        match answers.rewrite(journal) {
            Ok(file) => answers.lock().journal = Some(file),
            Err(e) => warn!(
                journal = %journal.display(),
                error = %e,
                "cannot keep the source's answers in the cache directory; they last until the mount stops"
            ),
        }
        answers
    }

    fn replay(&self, journal: impl BufRead) {
        let mut state = self.lock();
        for line in journal.lines().map_while(Result::ok) {
            match serde_json::from_str::<Line>(&line) {
                Ok(line) => state.apply(line),
                Err(_) => debug!("skipping an unreadable line of the answers journal"),
            }
        }
    }

    /// Writes what is known to a new journal renamed over `journal`, synced.
    fn rewrite(&self, journal: &Path) -> io::Result<File> {
        let dir = journal.parent().unwrap_or(Path::new("."));
        let tmp = tempfile::Builder::new()
            .prefix(".answers")
            .permissions(<std::fs::Permissions as PermissionsExt>::from_mode(0o600))
            .tempfile_in(dir)?;
        {
            let state = self.lock();
            let mut out = BufWriter::new(tmp.as_file());
            let mut paths: Vec<&PathBuf> = state.names.keys().collect();
            paths.sort();
            for path in paths {
                for line in state.names[path].lines(path) {
                    serde_json::to_writer(&mut out, &line)?;
                    out.write_all(b"\n")?;
                }
            }
            out.flush()?;
        }
        tmp.as_file().sync_all()?;
        tmp.persist(journal).map_err(|e| e.error)?;
        OpenOptions::new().append(true).mode(0o600).open(journal)
    }

    /// Syncs the journal, so what was recorded survives a crash of the machine.
    pub fn sync(&self) {
        if let Some(file) = self.lock().journal.as_ref()
            && let Err(e) = file.sync_data()
        {
            debug!(error = %e, "syncing the answers journal failed");
        }
    }

    /// Whether nothing is known.
    pub fn is_empty(&self) -> bool {
        self.lock().names.is_empty()
    }

    // ------------------------------------------------------------ what the source said

    /// The source gave `meta` for `path`.
    pub fn saw(&self, path: &Path, meta: &SourceMeta) {
        let mut state = self.lock();
        if state.entry(path).is_some_and(|known| same(known, meta)) {
            return;
        }
        let Some(p) = text(path) else { return };
        state.record(Line::Meta { p, meta: *meta });
    }

    /// The source said `path` does not exist.
    pub fn saw_absent(&self, path: &Path) {
        let mut state = self.lock();
        if state.entry(path) == Some(Remembered::Absent) {
            return;
        }
        let Some(p) = text(path) else { return };
        state.record(Line::Absent { p, absent: true });
    }

    /// The source gave `target` as the text of link `path`.
    pub fn saw_link(&self, path: &Path, target: &[u8]) {
        let mut state = self.lock();
        if state.names.get(path).and_then(|n| n.link.as_deref()) == Some(target) {
            return;
        }
        let (Some(p), Ok(link)) = (text(path), std::str::from_utf8(target)) else {
            return;
        };
        state.record(Line::Link {
            p,
            link: link.to_owned(),
        });
    }

    /// The source listed directory `path` as `entries`.
    pub fn saw_listing(&self, path: &Path, entries: &[(OsString, SourceMeta)]) {
        let mut state = self.lock();
        let unchanged = state
            .names
            .get(path)
            .and_then(|n| n.listing.as_ref())
            .is_some_and(|known| same_listing(known, entries));
        if unchanged {
            return;
        }
        let Some(p) = text(path) else { return };
        let list: Option<Vec<(String, SourceMeta)>> = entries
            .iter()
            .map(|(name, meta)| name.to_str().map(|n| (n.to_owned(), *meta)))
            .collect();
        match list {
            Some(list) => state.record(Line::Listing { p, list }),
            // A name that is not UTF-8: the listing is not kept, rather than kept short.
            None => state.record(Line::Unlisted { unlisted: p }),
        }
    }

    // ------------------------------------------------------------ changes through the mount

    /// An entry was made at `path` through the mount: its directory's listing is out
    /// of date, and it is no longer absent.
    pub fn made(&self, path: &Path) {
        let parent = parent_of(path);
        let mut state = self.lock();
        let listed = state.names.get(parent).is_some_and(|n| n.listing.is_some());
        if listed && let Some(unlisted) = text(parent) {
            state.record(Line::Unlisted { unlisted });
        }
        if state.names.get(path).is_some_and(|n| n.absent)
            && let Some(forget) = text(path)
        {
            state.record(Line::Forget { forget });
        }
    }

    /// The entry at `path` was removed (or renamed away) through the mount.
    pub fn removed(&self, path: &Path) {
        self.made(path);
        self.saw_absent(path);
    }

    /// Forgets everything under `path` (`path` included).
    pub fn forget(&self, path: &Path) {
        let Some(forget) = text(path) else { return };
        self.lock().record(Line::Forget { forget });
    }

    // ------------------------------------------------------------ recalling

    /// What is known of `path`: what was said of it, else what its directory's
    /// listing says (a name missing from it is absent); None if nothing.
    pub fn entry(&self, path: &Path) -> Option<Remembered> {
        self.lock().entry(path)
    }

    /// The known text of link `path`.
    pub fn link(&self, path: &Path) -> Option<Vec<u8>> {
        self.lock().names.get(path)?.link.clone()
    }

    /// The known listing of directory `path`.
    pub fn listing(&self, path: &Path) -> Option<Vec<(OsString, SourceMeta)>> {
        self.lock().names.get(path)?.listing.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

impl State {
    fn entry(&self, path: &Path) -> Option<Remembered> {
        if path.as_os_str().is_empty() {
            return self
                .names
                .get(path)
                .and_then(|n| n.meta)
                .map(Remembered::Entry);
        }
        if let Some(name) = self.names.get(path) {
            if name.absent {
                return Some(Remembered::Absent);
            }
            if let Some(meta) = name.meta {
                return Some(Remembered::Entry(meta));
            }
        }
        let listing = self.names.get(parent_of(path))?.listing.as_ref()?;
        let wanted = path.file_name()?;
        Some(
            match listing.binary_search_by(|(name, _)| name.as_os_str().cmp(wanted)) {
                Ok(at) => Remembered::Entry(listing[at].1),
                Err(_) => Remembered::Absent,
            },
        )
    }

    /// Applies `line` and appends it to the journal.
    fn record(&mut self, line: Line) {
        if let Some(journal) = self.journal.as_mut() {
            let written = serde_json::to_vec(&line)
                .map_err(io::Error::other)
                .and_then(|mut bytes| {
                    bytes.push(b'\n');
                    journal.write_all(&bytes)
                });
            if let Err(e) = written {
                debug!(error = %e, "recording an answer of the source failed; it lasts until the mount stops");
            }
        }
        self.apply(line);
    }

    fn apply(&mut self, line: Line) {
        match line {
            Line::Meta { p, meta } => {
                let name = self.names.entry(PathBuf::from(p)).or_default();
                name.meta = Some(meta);
                name.absent = false;
                if !meta.is_symlink() {
                    name.link = None;
                }
                if !meta.is_dir() {
                    name.listing = None;
                }
            }
            Line::Absent { p, .. } => {
                let path = PathBuf::from(p);
                self.forget_under(&path);
                self.names.entry(path).or_default().absent = true;
            }
            Line::Link { p, link } => {
                self.names.entry(PathBuf::from(p)).or_default().link = Some(link.into_bytes());
            }
            Line::Listing { p, list } => {
                let dir = PathBuf::from(p);
                let mut list: Vec<(OsString, SourceMeta)> = list
                    .into_iter()
                    .map(|(name, meta)| (OsString::from(name), meta))
                    .collect();
                list.sort_by(|a, b| a.0.cmp(&b.0));
                // What the listing says of each name is newer than what was said of
                // it alone; a name it lacks and that was seen before is gone.
                let children: Vec<PathBuf> = self
                    .names
                    .keys()
                    .filter(|k| k.parent() == Some(dir.as_path()) && *k != &dir)
                    .cloned()
                    .collect();
                for child in children {
                    let Some(name) = self.names.get_mut(&child) else {
                        continue;
                    };
                    name.meta = None;
                    name.absent = false;
                    let wanted = child.file_name().unwrap_or_default();
                    let listed = list.iter().find(|(n, _)| n.as_os_str() == wanted);
                    match listed {
                        None => self.forget_under(&child),
                        Some((_, meta)) if !meta.is_symlink() => {
                            if let Some(name) = self.names.get_mut(&child) {
                                name.link = None;
                            }
                            self.drop_if_empty(&child);
                        }
                        Some(_) => self.drop_if_empty(&child),
                    }
                }
                self.names.entry(dir).or_default().listing = Some(list);
            }
            Line::Unlisted { unlisted } => {
                let dir = PathBuf::from(unlisted);
                if let Some(name) = self.names.get_mut(&dir) {
                    name.listing = None;
                }
                self.drop_if_empty(&dir);
            }
            Line::Forget { forget } => self.forget_under(Path::new(&forget)),
        }
    }

    /// Forgets `path` if nothing is known of it any more.
    fn drop_if_empty(&mut self, path: &Path) {
        if self.names.get(path).is_some_and(|n| *n == Name::default()) {
            self.names.remove(path);
        }
    }

    fn forget_under(&mut self, path: &Path) {
        if path.as_os_str().is_empty() {
            self.names.clear();
            return;
        }
        self.names.retain(|known, _| !known.starts_with(path));
    }
}

impl Name {
    /// The lines that say what this name is known as.
    fn lines(&self, path: &Path) -> Vec<Line> {
        let Some(p) = text(path) else {
            return Vec::new();
        };
        let mut lines = Vec::new();
        if self.absent {
            lines.push(Line::Absent {
                p: p.clone(),
                absent: true,
            });
        }
        if let Some(meta) = self.meta {
            lines.push(Line::Meta { p: p.clone(), meta });
        }
        if let Some(list) = &self.listing {
            let list = list
                .iter()
                .filter_map(|(name, meta)| name.to_str().map(|n| (n.to_owned(), *meta)))
                .collect();
            lines.push(Line::Listing { p: p.clone(), list });
        }
        if let Some(link) = self
            .link
            .as_deref()
            .and_then(|l| std::str::from_utf8(l).ok())
        {
            lines.push(Line::Link {
                p,
                link: link.to_owned(),
            });
        }
        lines
    }
}

/// Whether `known` says `meta`, but for the access time (reads move it; nothing a
/// loader decides by).
fn same(known: Remembered, meta: &SourceMeta) -> bool {
    match known {
        Remembered::Entry(k) => {
            SourceMeta { atime_ns: 0, ..k }
                == SourceMeta {
                    atime_ns: 0,
                    ..*meta
                }
        }
        Remembered::Absent => false,
    }
}

fn same_listing(known: &[(OsString, SourceMeta)], now: &[(OsString, SourceMeta)]) -> bool {
    known.len() == now.len()
        && known
            .iter()
            .zip(now)
            .all(|((a, am), (b, bm))| a == b && same(Remembered::Entry(*am), bm))
}

fn parent_of(path: &Path) -> &Path {
    path.parent().unwrap_or(Path::new(""))
}

fn text(path: &Path) -> Option<String> {
    path.to_str().map(str::to_owned)
}

/// The answers as a source that never asks the real one: what status and plans
/// read while the real one is away. What is not known is "not reachable", never
/// "no such file", unless the source said so.
#[derive(Debug)]
pub struct RememberedSource {
    root: PathBuf,
    answers: Arc<Answers>,
}

impl RememberedSource {
    /// The answers of the source at `root`.
    pub fn new(root: PathBuf, answers: Arc<Answers>) -> RememberedSource {
        RememberedSource { root, answers }
    }

    fn unknown(&self, rel: &Path) -> SourceError {
        SourceError::Away {
            path: rel.to_path_buf(),
            source: Arc::new(io::Error::from_raw_os_error(libc::ENOTCONN)),
        }
    }
}

impl Source for RememberedSource {
    fn root(&self) -> &Path {
        &self.root
    }

    fn stat(&self, rel: &Path) -> Result<SourceMeta, SourceError> {
        match self.answers.entry(rel) {
            Some(Remembered::Entry(meta)) => Ok(meta),
            Some(Remembered::Absent) => Err(SourceError::NotFound {
                path: rel.to_path_buf(),
            }),
            None => Err(self.unknown(rel)),
        }
    }

    fn read_dir(&self, rel: &Path) -> Result<Vec<(OsString, SourceMeta)>, SourceError> {
        self.answers.listing(rel).ok_or_else(|| self.unknown(rel))
    }

    fn read_link(&self, rel: &Path) -> Result<PathBuf, SourceError> {
        let text = self.answers.link(rel).ok_or_else(|| self.unknown(rel))?;
        Ok(PathBuf::from(OsString::from_vec(text)))
    }

    fn open(&self, rel: &Path) -> Result<Box<dyn SourceFile>, SourceError> {
        Err(self.unknown(rel))
    }

    fn statfs(&self) -> io::Result<libc::statvfs> {
        Err(io::Error::from_raw_os_error(libc::ENOTCONN))
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn meta(kind: stagefs_source::EntryKind, size: u64) -> SourceMeta {
        SourceMeta {
            kind,
            size,
            mtime_ns: 7,
            ctime_ns: 7,
            atime_ns: 7,
            mode: 0o644,
            uid: 0,
            gid: 0,
            nlink: 1,
            blocks: 0,
            blksize: 4096,
            rdev: 0,
            ino: 3,
        }
    }

    use stagefs_source::EntryKind::{Dir, File as Regular, Symlink};

    #[test]
    fn a_listing_answers_for_its_names_and_a_name_it_lacks_is_absent() {
        let answers = Answers::in_memory();
        let config = meta(Regular, 10);
        answers.saw_listing(
            Path::new("m"),
            &[
                ("config.json".into(), config),
                ("w".into(), meta(Symlink, 4)),
            ],
        );
        assert_eq!(
            answers.entry(Path::new("m/config.json")),
            Some(Remembered::Entry(config))
        );
        assert_eq!(
            answers.entry(Path::new("m/generation_config.json")),
            Some(Remembered::Absent)
        );
        assert_eq!(answers.entry(Path::new("other/x")), None);
        answers.saw_absent(Path::new("token"));
        assert_eq!(answers.entry(Path::new("token")), Some(Remembered::Absent));
    }

    #[test]
    fn answers_outlive_a_restart_and_a_torn_line() -> io::Result<()> {
        let dir = tempfile::TempDir::new()?;
        let journal = dir.path().join(JOURNAL);
        {
            let answers = Answers::open(&journal);
            answers.saw(Path::new("m"), &meta(Dir, 0));
            answers.saw_listing(Path::new("m"), &[("a".into(), meta(Regular, 1))]);
            answers.saw_link(Path::new("m/l"), b"../../blobs/abc");
            answers.saw_absent(Path::new("token"));
            // Each answer again changes nothing: one line each.
            answers.saw_absent(Path::new("token"));
            answers.saw(Path::new("m"), &meta(Dir, 0));
        }
        let written = fs::read_to_string(&journal)?;
        assert_eq!(written.lines().count(), 4, "{written}");
        fs::write(&journal, format!("{written}{{\"p\":\"torn"))?;
        let again = Answers::open(&journal);
        assert_eq!(
            again.entry(Path::new("m/a")),
            Some(Remembered::Entry(meta(Regular, 1)))
        );
        assert_eq!(
            again.link(Path::new("m/l")),
            Some(b"../../blobs/abc".to_vec())
        );
        assert_eq!(again.entry(Path::new("token")), Some(Remembered::Absent));
        assert!(!fs::read_to_string(&journal)?.contains("torn"));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(fs::metadata(&journal)?.permissions().mode() & 0o777, 0o600);
        Ok(())
    }

    #[test]
    fn a_change_through_the_mount_drops_what_it_made_untrue() {
        let answers = Answers::in_memory();
        answers.saw_listing(Path::new("m"), &[("a".into(), meta(Regular, 1))]);
        answers.saw_absent(Path::new("m/b"));
        answers.made(Path::new("m/b"));
        assert_eq!(answers.listing(Path::new("m")), None);
        assert_eq!(answers.entry(Path::new("m/b")), None, "made: not absent");
        answers.saw(Path::new("m/a"), &meta(Regular, 1));
        answers.removed(Path::new("m/a"));
        assert_eq!(answers.entry(Path::new("m/a")), Some(Remembered::Absent));
    }

    #[test]
    fn a_newer_listing_replaces_what_was_said_of_its_names() {
        let answers = Answers::in_memory();
        answers.saw(Path::new("m/a"), &meta(Regular, 1));
        answers.saw(Path::new("m/gone"), &meta(Regular, 1));
        answers.saw_listing(Path::new("m"), &[("a".into(), meta(Regular, 2))]);
        assert_eq!(
            answers.entry(Path::new("m/a")),
            Some(Remembered::Entry(meta(Regular, 2)))
        );
        assert_eq!(answers.entry(Path::new("m/gone")), Some(Remembered::Absent));
    }
}
