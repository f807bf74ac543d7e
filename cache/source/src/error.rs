//! How reaching the source fails, and the helpers every layer's errors use to
//! show the system's words.
//!
//! Every error is `Clone` (I/O sources sit behind an `Arc`) because one staging
//! failure is handed to every caller that waited on that copy.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use thiserror::Error;

/// A shared I/O error, so errors stay cloneable.
pub type SharedIo = Arc<io::Error>;

/// Why an operation produced no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Unanswered {
    /// It did not finish within the caller's deadline (it may still be running).
    #[error("the source did not answer in time")]
    TimedOut,
    /// Every source thread is stuck on an operation older than the timeout.
    #[error("every source thread is stuck waiting for the source")]
    Saturated,
}

/// Failures reading the source tree (the slow, mirrored directory).
#[derive(Debug, Clone, Error)]
pub enum SourceError {
    /// The path does not exist in the source.
    #[error("{path}: not found in the source")]
    NotFound {
        /// Path relative to the source root.
        path: PathBuf,
    },
    /// The path escapes the source root or is otherwise not a valid relative path.
    #[error("{path}: not a path inside the source")]
    OutsideRoot {
        /// The offending path.
        path: PathBuf,
    },
    /// The source did not answer (it is slow, or gone).
    #[error("{path}: {why}")]
    Unanswered {
        /// Path relative to the source root.
        path: PathBuf,
        /// Timed out, or every source thread is stuck.
        why: Unanswered,
    },
    /// The source failed in a way that says it is away, not that this path is
    /// wrong: a dead FUSE or network mount (ENOTCONN), a lost server (EIO, ESTALE,
    /// EHOSTDOWN, ENETUNREACH, ...). Treated like no answer: what the source said
    /// last is served where it can be.
    #[error("{}: the source is not reachable: {}", path.display(), io_text(source))]
    Away {
        /// Path relative to the source root.
        path: PathBuf,
        /// The underlying error.
        source: SharedIo,
    },
    /// The source's root is no longer the directory that was mounted: the NAS was
    /// unmounted underneath and the path now leads to the directory below its mount
    /// point, on another disk. Nothing is read from or written there.
    #[error("{}: the source is no longer mounted there (the directory now belongs to another filesystem)", root.display())]
    Unmounted {
        /// The source root.
        root: PathBuf,
    },
    /// Any other I/O failure on the source.
    #[error("{}: reading the source failed: {}", path.display(), io_text(source))]
    Io {
        /// Path relative to the source root.
        path: PathBuf,
        /// The underlying error.
        source: SharedIo,
    },
    /// The source has no room (or the writer no quota) for what was written.
    #[error("{path}: the source is full")]
    NoSpace {
        /// Path relative to the source root.
        path: PathBuf,
    },
    /// The source cannot be written at all (a read-only filesystem or backend).
    #[error("{path}: the source is read-only")]
    ReadOnly {
        /// Path relative to the source root.
        path: PathBuf,
    },
    /// Any other failure writing to the source (its errno, such as EACCES or EEXIST,
    /// is passed on).
    #[error("{}: writing to the source failed: {}", path.display(), io_text(source))]
    Write {
        /// Path relative to the source root.
        path: PathBuf,
        /// The underlying error.
        source: SharedIo,
    },
}

/// Errnos that say the source (its mount, its server, the network to it) is away,
/// rather than anything about the path asked for. EIO is among them: it is what NFS
/// and SMB clients return for a server that went away mid-operation, and what is
/// served instead (what the source said last, stored copies of exactly the version
/// seen) is right either way.
const AWAY_ERRNOS: &[i32] = &[
    libc::ENOTCONN,
    libc::EIO,
    libc::ESTALE,
    libc::EHOSTDOWN,
    libc::EHOSTUNREACH,
    libc::ENETDOWN,
    libc::ENETUNREACH,
    libc::ENETRESET,
    libc::ECONNABORTED,
    libc::ECONNRESET,
    libc::ECONNREFUSED,
    libc::ETIMEDOUT,
];

/// `text` as a user reads it: the system's words, without the " (os error N)" that
/// Rust's I/O errors add to them.
pub fn without_os_error(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(" (os error ") {
        let tail = &rest[at + " (os error ".len()..];
        let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
        out.push_str(&rest[..at]);
        if digits > 0 && tail[digits..].starts_with(')') {
            rest = &tail[digits + 1..];
        } else {
            out.push_str(" (os error ");
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

/// An I/O error as a user reads it ([`without_os_error`]).
pub fn io_text(err: &io::Error) -> String {
    without_os_error(&err.to_string())
}

/// Whether `err` says the source is away rather than anything about one path.
pub fn is_away_errno(err: &io::Error) -> bool {
    err.raw_os_error().is_some_and(|e| AWAY_ERRNOS.contains(&e))
}

/// A path as a log line shows it: control characters (a newline in a file name)
/// escaped, so that one event stays one line of the log.
pub fn logged(path: &Path) -> String {
    let text = path.to_string_lossy();
    match text.contains(char::is_control) {
        false => text.into_owned(),
        true => text.chars().flat_map(char::escape_default).collect(),
    }
}

/// A path relative to the source root as messages show it: the root itself is ".",
/// not an empty string before the colon.
fn shown(path: PathBuf) -> PathBuf {
    if path.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        path
    }
}

impl SourceError {
    /// A failed read (or stat) of `path` on the source.
    pub fn io(path: impl Into<PathBuf>, err: io::Error) -> Self {
        let path = shown(path.into());
        if err.kind() == io::ErrorKind::NotFound {
            SourceError::NotFound { path }
        } else if is_away_errno(&err) {
            SourceError::Away {
                path,
                source: Arc::new(err),
            }
        } else {
            SourceError::Io {
                path,
                source: Arc::new(err),
            }
        }
    }

    /// Whether this says the source is away (it did not answer, its mount is dead
    /// or gone) rather than anything about the path: requests are then answered
    /// from what the source said last, where they can be.
    pub fn is_away(&self) -> bool {
        matches!(
            self,
            SourceError::Unanswered { .. }
                | SourceError::Away { .. }
                | SourceError::Unmounted { .. }
        )
    }

    /// A failed write (or create, rename, removal...) of `path` on the source.
    pub fn write(path: impl Into<PathBuf>, err: io::Error) -> Self {
        let path = shown(path.into());
        match err.raw_os_error() {
            Some(libc::ENOSPC | libc::EDQUOT) => SourceError::NoSpace { path },
            Some(libc::EROFS) => SourceError::ReadOnly { path },
            _ if err.kind() == io::ErrorKind::StorageFull => SourceError::NoSpace { path },
            _ if err.kind() == io::ErrorKind::NotFound => SourceError::NotFound { path },
            _ if is_away_errno(&err) => SourceError::Away {
                path,
                source: Arc::new(err),
            },
            _ => SourceError::Write {
                path,
                source: Arc::new(err),
            },
        }
    }

    /// A backend that cannot write was asked to.
    pub fn read_only(path: impl Into<PathBuf>) -> Self {
        SourceError::ReadOnly { path: path.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_logged_path_keeps_one_line() {
        assert_eq!(
            logged(Path::new("org/we\nird.safetensors")),
            "org/we\\nird.safetensors"
        );
        assert_eq!(logged(Path::new("org/plain")), "org/plain");
    }

    #[test]
    fn messages_say_the_systems_words_and_name_the_root() {
        let dead = io::Error::from_raw_os_error(libc::ENOTCONN);
        assert_eq!(io_text(&dead), "Transport endpoint is not connected");
        assert_eq!(
            SourceError::io("", dead).to_string(),
            ".: the source is not reachable: Transport endpoint is not connected"
        );
        assert_eq!(
            without_os_error("a (os error 13): b (os error x)"),
            "a: b (os error x)"
        );
    }
}
