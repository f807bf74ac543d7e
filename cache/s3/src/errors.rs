//! What an object store's failures mean to stagefs: the one place that turns
//! `object_store`'s errors into the system's words (an errno the source layer
//! understands, see [`stagefs_source::is_away_errno`]) and into the lines a user
//! reads when a bucket cannot be mounted.

use std::error::Error as _;
use std::io;

use object_store::client::{HttpError, HttpErrorKind};
use thiserror::Error;

/// Why a bucket cannot be mirrored, found by [`crate::S3Source::probe`]: each one
/// line that says what to fix.
#[derive(Debug, Clone, Error)]
pub enum ProbeError {
    /// The endpoint did not answer, refused, timed out or failed (5xx).
    #[error("{url}: the object store at {endpoint} is not reachable: {why}")]
    Unreachable {
        /// The source's URL.
        url: String,
        /// The endpoint asked.
        endpoint: String,
        /// The system's or the server's words.
        why: String,
    },
    /// The server refused the credentials (or they may not list the bucket).
    #[error(
        "{url}: the object store refused the credentials ({code}): check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, and that they may list the bucket"
    )]
    Credentials {
        /// The source's URL.
        url: String,
        /// The server's code for it (InvalidAccessKeyId, SignatureDoesNotMatch, AccessDenied).
        code: String,
    },
    /// The bucket does not exist at that endpoint.
    #[error("{url}: bucket {bucket} does not exist at {endpoint}")]
    NoBucket {
        /// The source's URL.
        url: String,
        /// The bucket's name.
        bucket: String,
        /// The endpoint asked.
        endpoint: String,
    },
    /// The prefix holds no object.
    #[error("{url}: no object under this prefix")]
    EmptyPrefix {
        /// The source's URL.
        url: String,
    },
    /// The client could not be set up (a malformed endpoint or region).
    #[error("{url}: cannot set up the S3 client: {why}")]
    Setup {
        /// The source's URL.
        url: String,
        /// The client's words.
        why: String,
    },
    /// Anything else the server answered.
    #[error("{url}: the object store answered: {why}")]
    Other {
        /// The source's URL.
        url: String,
        /// The server's words.
        why: String,
    },
}

/// The error's whole chain of causes on one line: object_store's messages carry
/// the server's XML, which may hold newlines. They name the request's URL, which
/// holds no secret (requests are signed in headers, never presigned here).
pub(crate) fn one_line(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(e) = cause {
        let more = e.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = e.source();
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The HTTP status the server answered, where the error says it.
fn status(text: &str) -> Option<u16> {
    let at = text.find("status code: ")? + "status code: ".len();
    text.get(at..at + 3)?.parse().ok()
}

/// The S3 error code in the server's answer (`<Code>NoSuchBucket</Code>`).
fn s3_code(text: &str) -> Option<&str> {
    let start = text.find("<Code>")? + "<Code>".len();
    let len = text[start..].find("</Code>")?;
    Some(&text[start..start + len])
}

/// The errno that says the object store is away, if `err` says so: it did not
/// answer (refused, reset, timed out) or it failed (5xx, 503 SlowDown after the
/// client's retries). None for an answer about the request itself.
fn away_errno(err: &object_store::Error) -> Option<i32> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cause {
        if let Some(code) = e
            .downcast_ref::<io::Error>()
            .and_then(io::Error::raw_os_error)
            .filter(|&code| stagefs_source::is_away_errno(&io::Error::from_raw_os_error(code)))
        {
            return Some(code);
        }
        if let Some(http) = e.downcast_ref::<HttpError>() {
            return Some(match http.kind() {
                HttpErrorKind::Connect => libc::ECONNREFUSED,
                HttpErrorKind::Timeout => libc::ETIMEDOUT,
                _ => libc::ECONNRESET,
            });
        }
        cause = e.source();
    }
    let text = one_line(err);
    if status(&text).is_some_and(|s| s >= 500) {
        return Some(libc::EIO);
    }
    if text.contains("timed out") {
        return Some(libc::ETIMEDOUT);
    }
    // A request that never got an answer: the connection failed in a way the
    // client did not name (reqwest's "error sending request").
    if text.contains("error sending request") || text.contains("connection") {
        return Some(libc::ECONNRESET);
    }
    None
}

/// `err` as the source layer takes it: NotFound for a missing key, an away errno for
/// an endpoint that is down or failing, EACCES for refused credentials.
pub(crate) fn to_io(err: &object_store::Error) -> io::Error {
    use object_store::Error as E;
    match err {
        E::NotFound { .. } => io::Error::new(io::ErrorKind::NotFound, one_line(err)),
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => {
            io::Error::from_raw_os_error(libc::EACCES)
        }
        E::Precondition { .. } => io::Error::other("the object was replaced while it was read"),
        _ => match away_errno(err) {
            Some(code) => io::Error::from_raw_os_error(code),
            None if status(&one_line(err)) == Some(403) => {
                io::Error::from_raw_os_error(libc::EACCES)
            }
            None if status(&one_line(err)) == Some(404) => {
                io::Error::new(io::ErrorKind::NotFound, one_line(err))
            }
            None => io::Error::other(one_line(err)),
        },
    }
}

/// A copy of a shared error, keeping its errno (which the source layer reads).
pub(crate) fn copied(err: &io::Error) -> io::Error {
    match err.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(err.kind(), err.to_string()),
    }
}

/// Whether a failed request is worth asking again: the store was away or failing,
/// not wrong about the request.
pub(crate) fn retryable(err: &io::Error) -> bool {
    stagefs_source::is_away_errno(err) || err.kind() == io::ErrorKind::UnexpectedEof
}

/// Where a probe's failure says the fault is.
pub(crate) struct Place<'a> {
    pub(crate) url: &'a str,
    pub(crate) bucket: &'a str,
    pub(crate) endpoint: &'a str,
}

/// The line a user reads for a listing that failed at mount time.
pub(crate) fn probe_error(place: &Place<'_>, err: &object_store::Error) -> ProbeError {
    let text = one_line(err);
    let url = place.url.to_string();
    let code = s3_code(&text).map(str::to_string);
    let unreachable = |why: String| ProbeError::Unreachable {
        url: url.clone(),
        endpoint: place.endpoint.to_string(),
        why,
    };
    if code.as_deref() == Some("NoSuchBucket") {
        return ProbeError::NoBucket {
            url,
            bucket: place.bucket.to_string(),
            endpoint: place.endpoint.to_string(),
        };
    }
    let refused = matches!(
        err,
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. }
    ) || matches!(status(&text), Some(401 | 403));
    if refused {
        let code = code.unwrap_or_else(|| "access denied".into());
        return ProbeError::Credentials { url, code };
    }
    if let Some(errno) = away_errno(err) {
        let why = match status(&text) {
            Some(s) => format!(
                "it answered {s}{}",
                code.map(|c| format!(" {c}")).unwrap_or_default()
            ),
            None => stagefs_source::io_text(&io::Error::from_raw_os_error(errno)),
        };
        return unreachable(why);
    }
    if let Some(e) = err.source().and_then(|e| e.downcast_ref::<io::Error>()) {
        return unreachable(stagefs_source::io_text(e));
    }
    ProbeError::Other { url, why: text }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_and_the_s3_code_are_read_from_the_servers_answer() {
        let text = "Server returned non-2xx status code: 404 Not Found: <?xml?><Error><Code>NoSuchBucket</Code></Error>";
        assert_eq!(status(text), Some(404));
        assert_eq!(s3_code(text), Some("NoSuchBucket"));
        assert_eq!(status("nothing"), None);
        assert_eq!(s3_code("<Code>unclosed"), None);
    }

    #[test]
    fn a_replaced_object_and_a_missing_key_are_not_away() {
        let gone = to_io(&object_store::Error::NotFound {
            path: "k".into(),
            source: "404".into(),
        });
        assert_eq!(gone.kind(), io::ErrorKind::NotFound);
        let replaced = to_io(&object_store::Error::Precondition {
            path: "k".into(),
            source: "412".into(),
        });
        assert!(!retryable(&replaced));
        let failing = object_store::Error::Generic {
            store: "S3",
            source: "Server returned non-2xx status code: 503 Service Unavailable: SlowDown".into(),
        };
        assert!(stagefs_source::is_away_errno(&to_io(&failing)));
    }
}
