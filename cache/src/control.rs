//! The control protocol spoken over a mount's Unix socket: one JSON request per line,
//! answered by one JSON response line.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::metrics::MetricsSnapshot;

/// File name of the control socket inside the cache directory.
pub const SOCKET_NAME: &str = "control.sock";

/// Where a mount using `cache_dir` listens.
pub fn socket_path(cache_dir: &Path) -> PathBuf {
    cache_dir.join(SOCKET_NAME)
}

/// A request to a running mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// The mount's counters.
    Stats,
}

/// A running mount's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Response {
    /// Answer to [`Request::Stats`].
    Stats {
        /// The counters.
        metrics: MetricsSnapshot,
        /// Where the mount is.
        mountpoint: PathBuf,
        /// What it mirrors.
        source: PathBuf,
    },
    /// The request could not be served.
    Error {
        /// Why.
        message: String,
    },
}

/// Sends one request to the mount listening on `socket` and waits for its answer.
pub fn query(socket: &Path, request: &Request) -> io::Result<Response> {
    let mut stream = UnixStream::connect(socket)?;
    let mut line = serde_json::to_vec(request)?;
    line.push(b'\n');
    stream.write_all(&line)?;
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer)?;
    Ok(serde_json::from_str(&answer)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_format_is_stable() -> Result<(), serde_json::Error> {
        assert_eq!(serde_json::to_string(&Request::Stats)?, r#"{"op":"stats"}"#);
        let err = Response::Error {
            message: "x".into(),
        };
        assert_eq!(
            serde_json::to_string(&err)?,
            r#"{"kind":"error","message":"x"}"#
        );
        assert!(serde_json::from_str::<Request>(r#"{"op":"rm -rf"}"#).is_err());
        Ok(())
    }
}
