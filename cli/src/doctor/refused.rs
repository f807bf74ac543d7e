//! The `blobs` check: files the running mount refuses because their bytes on the
//! source are not the sha256 their names give. Only the mount knows (it found out
//! while copying), so doctor asks it; every other check passes on such a source.

use std::path::{Path, PathBuf};

use stagefs_control::{self as control, Request, Response};

use super::Check;
use super::lines::{Gathered, Line, Tx, reply};
use crate::manage::{REFUSED, download_again, escaped};
use crate::units::count;

/// The worker's side, once a daemon answered on `cache_dir`: the blobs it refuses,
/// each with the name users know it by. Nothing when it refuses none, or cannot say.
pub(crate) fn probe(cache_dir: &Path, tx: &Tx) {
    let socket = control::socket_path(cache_dir);
    let refused = match control::query(&socket, &Request::Status) {
        Ok(Response::Status { report }) if !report.refused.is_empty() => report.refused,
        _ => return,
    };
    let asked = Request::Names {
        paths: refused.clone(),
    };
    let names = match control::query(&socket, &asked) {
        Ok(Response::Names { names }) if names.len() == refused.len() => names,
        _ => refused.iter().map(|p| p.display().to_string()).collect(),
    };
    reply(tx, Line::Refused(refused.into_iter().zip(names).collect()));
}

/// The failed `blobs` check naming the refused files and how to repair them; None
/// when the mount refuses none.
pub(crate) fn check(gathered: &Gathered) -> Option<Check> {
    let refused: &Vec<(PathBuf, String)> = got!(gathered, Refused)?;
    let ((path, name), more) = refused.split_first()?;
    let check = match more.is_empty() {
        true => Check::fail(
            "blobs",
            escaped(&format!("the mount refuses {name}: {REFUSED}")),
        )
        .advise(download_again(path)),
        false => {
            let names: Vec<&str> = refused.iter().map(|(_, name)| name.as_str()).collect();
            let summary = format!(
                "the mount refuses {}, whose bytes on the source do not match the sha256 in their names: {}",
                count(refused.len(), "file", "files"),
                names.join(", ")
            );
            let mut advice: Vec<String> = refused.iter().map(|(p, _)| download_again(p)).collect();
            advice.dedup();
            Check::fail("blobs", escaped(&summary)).advise(advice.join("; "))
        }
    };
    Some(check)
}
