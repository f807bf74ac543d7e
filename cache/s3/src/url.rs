//! `s3://BUCKET[/PREFIX]`: how a user names a bucket (and a folder in it) as a source.

use std::fmt;
use std::path::Path;

use thiserror::Error;

/// The scheme that names an S3 bucket.
pub const SCHEME: &str = "s3://";

/// A bucket and a prefix in it: what a mount of an object store mirrors.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectUrl {
    /// The bucket's name.
    pub bucket: String,
    /// The key prefix that is the mirror's root, without slashes at either end;
    /// empty for the whole bucket.
    pub prefix: String,
}

/// Why a text is not an `s3://` URL stagefs can mirror.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UrlError {
    /// No bucket after the scheme.
    #[error("{url}: no bucket named (write s3://BUCKET or s3://BUCKET/PREFIX)")]
    NoBucket {
        /// The text given.
        url: String,
    },
    /// A prefix with an empty, `.` or `..` segment, which no directory can mirror.
    #[error("{url}: the prefix must be plain names separated by single slashes")]
    BadPrefix {
        /// The text given.
        url: String,
    },
}

impl ObjectUrl {
    /// Whether `text` names an object store rather than a directory.
    pub fn is_url(text: &str) -> bool {
        text.starts_with(SCHEME)
    }

    /// Whether `path` (as a source path is given on a command line) names an object
    /// store.
    pub fn is_url_path(path: &Path) -> bool {
        path.to_str().is_some_and(Self::is_url)
    }

    /// Parses `s3://BUCKET[/PREFIX][/]`; None if `text` is not an `s3://` URL.
    pub fn parse(text: &str) -> Option<Result<ObjectUrl, UrlError>> {
        let rest = text.strip_prefix(SCHEME)?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Some(Err(UrlError::NoBucket { url: text.into() }));
        }
        let prefix = prefix.trim_end_matches('/');
        let plain = prefix.is_empty()
            || prefix
                .split('/')
                .all(|segment| !matches!(segment, "" | "." | ".."));
        if !plain {
            return Some(Err(UrlError::BadPrefix { url: text.into() }));
        }
        Some(Ok(ObjectUrl {
            bucket: bucket.into(),
            prefix: prefix.into(),
        }))
    }

    /// The key of `rel` (a plain relative path under the root).
    pub fn key(&self, rel: &Path) -> String {
        let rel = rel.to_string_lossy();
        let rel = rel.trim_end_matches('/');
        match (self.prefix.is_empty(), rel.is_empty()) {
            (true, _) => rel.to_string(),
            (false, true) => self.prefix.clone(),
            (false, false) => format!("{}/{rel}", self.prefix),
        }
    }
}

impl fmt::Display for ObjectUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.prefix.is_empty() {
            true => write!(f, "{SCHEME}{}", self.bucket),
            false => write!(f, "{SCHEME}{}/{}", self.bucket, self.prefix),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Option<Result<ObjectUrl, UrlError>> {
        ObjectUrl::parse(text)
    }

    #[test]
    fn a_bucket_and_a_prefix_are_parsed_and_shown_back() {
        let url = parsed("s3://models/team/llama/").and_then(Result::ok);
        let url = url.expect("parses");
        assert_eq!(
            (url.bucket.as_str(), url.prefix.as_str()),
            ("models", "team/llama")
        );
        assert_eq!(url.to_string(), "s3://models/team/llama");
        assert_eq!(url.key(Path::new("a/b.gguf")), "team/llama/a/b.gguf");
        assert_eq!(url.key(Path::new("")), "team/llama");
        let whole = parsed("s3://models").and_then(Result::ok).expect("parses");
        assert_eq!(whole.key(Path::new("a")), "a");
        assert_eq!(whole.to_string(), "s3://models");
    }

    #[test]
    fn a_url_without_bucket_or_with_odd_segments_is_refused_and_a_path_is_no_url() {
        assert!(matches!(
            parsed("s3://"),
            Some(Err(UrlError::NoBucket { .. }))
        ));
        assert!(matches!(
            parsed("s3:///x"),
            Some(Err(UrlError::NoBucket { .. }))
        ));
        for bad in ["s3://b/a//c", "s3://b/../c", "s3://b/./c"] {
            assert!(
                matches!(parsed(bad), Some(Err(UrlError::BadPrefix { .. }))),
                "{bad}"
            );
        }
        assert!(parsed("/mnt/nas").is_none());
        assert!(!ObjectUrl::is_url_path(Path::new("./s3:/x")));
    }
}
