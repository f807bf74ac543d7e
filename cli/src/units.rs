//! What users write on the command line and in the config file: sizes and durations
//! (parsed and shown by `stagefs_control::units`, which `bench/` uses too) and
//! directories inside the source.

pub(crate) use stagefs_control::units::{format_bytes, parse_duration, parse_size};

/// `1 file`, `2 files`: a count with its noun in the right number.
pub(crate) fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Parses `--listen`: an address, or a host name and a port (`localhost:0`), resolved
/// here. Where a name has both, an IPv4 address is taken: the URL `serve` prints names
/// it, and libnfs clients are written against 127.0.0.1.
pub(crate) fn parse_listen(text: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs as _;
    let addrs: Vec<std::net::SocketAddr> = text
        .to_socket_addrs()
        .map_err(|e| format!("'{text}' is not HOST:PORT (127.0.0.1:0, localhost:2049): {e}"))?
        .collect();
    let first = addrs.iter().find(|a| a.is_ipv4()).or(addrs.first());
    first
        .copied()
        .ok_or_else(|| format!("{text}: the name has no address"))
}

/// Parses a path inside the source (`model_dirs`): relative, without `..`.
pub(crate) fn parse_source_dir(text: &str) -> Result<std::path::PathBuf, String> {
    let path = std::path::Path::new(text.trim_end_matches('/'));
    // "/" trims to nothing: the root, which is searched anyway, and not relative.
    if stagefs_source::is_plain_relative(path) && !path.as_os_str().is_empty() {
        Ok(path.to_path_buf())
    } else {
        Err(format!(
            "'{text}' must be a directory inside the source, relative to it (e.g. teams/nlp/hf/hub)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_agree_with_their_nouns() {
        assert_eq!(count(1, "link", "links"), "1 link");
        assert_eq!(count(0, "mismatch", "mismatches"), "0 mismatches");
        assert_eq!(count(2, "file", "files"), "2 files");
    }

    #[test]
    fn listen_takes_addresses_and_host_names() {
        let local = parse_listen("localhost:0").expect("localhost resolves");
        assert!(local.ip().is_loopback() && local.port() == 0, "{local}");
        assert_eq!(
            parse_listen("127.0.0.1:2049").map(|a| a.to_string()),
            Ok("127.0.0.1:2049".into())
        );
        let bad = parse_listen("localhost").expect_err("no port");
        assert!(bad.starts_with("'localhost' is not HOST:PORT"), "{bad}");
    }

    #[test]
    fn source_dirs_are_relative_and_inside() {
        assert_eq!(
            parse_source_dir("teams/hf/hub/"),
            Ok(std::path::PathBuf::from("teams/hf/hub"))
        );
        for bad in ["", "/", "/abs/hub", "../up", "a/../../b", "./a"] {
            assert!(parse_source_dir(bad).is_err(), "{bad}");
        }
    }
}
