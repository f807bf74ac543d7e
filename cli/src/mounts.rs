//! Which mount and cache a command is about when no flag says: the flag, else the
//! config file's `cache_dir`, else the running mounts this user's stagefs made (the
//! mount table and the caches' records, `stagefs_mount::registry`), picked by a path
//! the command names, by a model only one of their sources holds, or as the only
//! one, else the default cache directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::bail;
use stagefs_control::MountRecord;
use stagefs_mount::bounded;
use stagefs_mount::registry::{self, KnownMount};
use stagefs_mount::table;
use stagefs_s3::ObjectUrl;

use crate::config::Config;

/// The cache directory a command works on. `targets` are what the command names
/// (model ids or paths): when several mounts run, a path inside one's mount point or
/// source picks it, else a model id that only one's source holds. With several and
/// nothing to pick by, asks for one.
pub(crate) fn cache_dir(
    config: &Config,
    flag: Option<&Path>,
    targets: &[&str],
) -> anyhow::Result<PathBuf> {
    if names_cache_dir(config, flag) {
        return config.cache_dir(flag);
    }
    let known = registry::known();
    match pick(&known, targets) {
        Picked::One(mount) => {
            if known.len() > 1 {
                eprintln!(
                    "stagefs: using the mount at {} (cache {})",
                    mount.mountpoint.display(),
                    mount.cache_dir.display()
                );
            }
            Ok(mount.cache_dir.clone())
        }
        Picked::None => config.cache_dir(None),
        Picked::Several => Err(Several::unpicked(&known)),
        Picked::HeldBy(mounts, ids) => Err(Several::held_by(&mounts, &ids)),
        Picked::Unheld(ids, silent) => Err(Several::unheld(&known, &ids, &silent)),
    }
}

/// [`cache_dir`] for `doctor`, which checks a source whether or not it is mounted:
/// with several mounts running and none picked, the default cache directory (the one
/// `stagefs mount SRC MNT` would use) rather than a refusal, so that doctor still
/// runs, and reports a broken config file.
pub(crate) fn cache_dir_or_default(
    config: &Config,
    flag: Option<&Path>,
    targets: &[&str],
) -> anyhow::Result<PathBuf> {
    match cache_dir(config, flag, targets) {
        Ok(dir) => Ok(dir),
        // A model no running mount's source holds is the argument's fault, and one
        // that several hold needs one named: said so.
        Err(e) if e.downcast_ref::<Several>().is_some_and(|s| s.unpicked) => config.cache_dir(None),
        Err(e) => Err(e),
    }
}

/// The cache directories `status` reports on: the one named (flag, config file),
/// else every running mount's, else the default one.
pub(crate) fn cache_dirs(config: &Config, flag: Option<&Path>) -> anyhow::Result<Vec<PathBuf>> {
    if names_cache_dir(config, flag) {
        return Ok(vec![config.cache_dir(flag)?]);
    }
    let known = registry::known();
    match known.is_empty() {
        true => Ok(vec![config.cache_dir(None)?]),
        false => Ok(known.into_iter().map(|m| m.cache_dir).collect()),
    }
}

/// Whether the user named the cache directory (the flag, the config file's
/// `cache_dir`) rather than leaving it to the running mounts or the default.
fn names_cache_dir(config: &Config, flag: Option<&Path>) -> bool {
    flag.is_some() || config.configured_cache_dir().is_some()
}

/// Several mounts run and what the command names picks none of them, or more than one.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
struct Several {
    message: String,
    /// Nothing the command names was looked for (no target, or paths outside every
    /// mount): not the argument's fault.
    unpicked: bool,
}

impl Several {
    /// Nothing the command names picks one.
    fn unpicked(known: &[KnownMount]) -> anyhow::Error {
        let message = format!(
            "{} stagefs mounts are running ({}); name one with --cache-dir",
            known.len(),
            with_caches(known.iter())
        );
        Several {
            message,
            unpicked: true,
        }
        .into()
    }

    /// The model ids named are in the sources of several running mounts.
    fn held_by(mounts: &[&KnownMount], ids: &[&str]) -> anyhow::Error {
        let message = format!(
            "{} is in the sources of {} running mounts ({}); name one with --cache-dir",
            ids.join(", "),
            mounts.len(),
            with_caches(mounts.iter().copied())
        );
        Several {
            message,
            unpicked: false,
        }
        .into()
    }

    /// No running mount's source holds the model ids named (a typo, or a model since
    /// deleted whose copies one of the caches may still hold); `silent`: the mounts
    /// whose sources did not answer, which may hold them.
    fn unheld(known: &[KnownMount], ids: &[&str], silent: &[&KnownMount]) -> anyhow::Error {
        let ids = ids.join(", ");
        let held = match silent {
            [] => format!("no running mount's source holds {ids}"),
            silent => format!(
                "no running mount's source that answered holds {ids} (the source of {} did not answer within {}s)",
                silent
                    .iter()
                    .map(|m| m.mountpoint.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                MODEL_LOOKUP_WAIT.as_secs()
            ),
        };
        let message = format!(
            "{held} ({}); for copies left in one of their caches, name it with --cache-dir",
            with_caches(known.iter())
        );
        Several {
            message,
            unpicked: false,
        }
        .into()
    }
}

/// `MOUNTPOINT with cache DIR, …`: what `--cache-dir` picks among them.
fn with_caches<'a>(mounts: impl Iterator<Item = &'a KnownMount>) -> String {
    mounts
        .map(|m| {
            format!(
                "{} with cache {}",
                m.mountpoint.display(),
                m.cache_dir.display()
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

enum Picked<'a> {
    One(&'a KnownMount),
    None,
    Several,
    /// Several run, and the targets are model ids more than one's source holds.
    HeldBy(Vec<&'a KnownMount>, Vec<&'a str>),
    /// Several run, and the targets are model ids none of their sources holds; with
    /// the mounts whose sources did not answer.
    Unheld(Vec<&'a str>, Vec<&'a KnownMount>),
}

fn pick<'a>(known: &'a [KnownMount], targets: &[&'a str]) -> Picked<'a> {
    let inside = |mount: &KnownMount, target: &str| {
        if ObjectUrl::is_url(target) {
            return url_within(target, &mount.record.source);
        }
        let Ok(path) = table::resolve(Path::new(target)) else {
            return false;
        };
        [&mount.mountpoint, &mount.record.source]
            .iter()
            .any(|root| path.starts_with(table::resolve(root).unwrap_or((*root).clone())))
    };
    let by_path: Vec<&KnownMount> = known
        .iter()
        .filter(|m| targets.iter().any(|t| inside(m, t)))
        .collect();
    let ids: Vec<&str> = targets
        .iter()
        .copied()
        .filter(|t| !names_a_path(t) && stagefs_layout::models::is_model_id(t))
        .collect();
    // An object store's URL that no running mount mirrors names another source: the
    // one mount running is not what it asks about (doctor would examine that mount,
    // and ask the store named for its source too).
    let another_store = targets
        .iter()
        .any(|t| ObjectUrl::is_url(t) && !known.iter().any(|m| url_within(t, &m.record.source)));
    match (by_path.as_slice(), known) {
        ([one], _) => Picked::One(one),
        (_, []) => Picked::None,
        ([], _) if another_store => Picked::None,
        (_, [one]) => Picked::One(one),
        ([], _) if !ids.is_empty() => by_model(known, ids, targets.len()),
        _ => Picked::Several,
    }
}

/// Whether object-store URL `url` is the source `source` mirrors or lies within it.
fn url_within(url: &str, source: &Path) -> bool {
    let (url, Some(source)) = (url.trim_end_matches('/'), source.to_str()) else {
        return false;
    };
    let source = source.trim_end_matches('/');
    url.strip_prefix(source)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Among several running mounts, the one whose source holds the model ids named:
/// every mount's source is asked, so that a model two of them hold is refused by
/// name rather than taken from the first.
fn by_model<'a>(known: &'a [KnownMount], ids: Vec<&'a str>, targets: usize) -> Picked<'a> {
    let mut held = Vec::new();
    let mut silent = Vec::new();
    for mount in known {
        let answers: Vec<Result<bool, bounded::Unanswered>> =
            ids.iter().map(|id| holds_model(mount, id)).collect();
        if answers.iter().any(|a| matches!(a, Ok(true))) {
            held.push(mount);
        } else if answers.iter().any(Result::is_err) {
            silent.push(mount);
        }
    }
    match held.as_slice() {
        [one] => Picked::One(one),
        [] if ids.len() == targets => Picked::Unheld(ids, silent),
        [] => Picked::Several,
        _ => Picked::HeldBy(held, ids),
    }
}

/// Whether `text` names something on disk. The name itself is not followed: in a
/// mount without kernel passthrough a staged file is a link to its copy, and
/// following it would count as a use of that copy.
pub(crate) fn names_a_path(text: &str) -> bool {
    std::fs::symlink_metadata(text).is_ok()
}

/// How long asking a mount's source whether it holds a model may take.
const MODEL_LOOKUP_WAIT: Duration = Duration::from_secs(2);

/// Whether `mount`'s source holds the model `id` as prefetch finds it (a repository
/// id, a folder's path, a short name, also one several of its models end with): asked in a child process under a deadline,
/// since the source may be a dead share.
fn holds_model(mount: &KnownMount, id: &str) -> Result<bool, bounded::Unanswered> {
    bounded::holds_model(
        &mount.record.source,
        id,
        &mount.record.model_dirs,
        MODEL_LOOKUP_WAIT,
    )
}

/// Running mounts as messages list them: `/m1 (of /nas/a), /m2 (of /nas/b)`.
pub(crate) fn listed(mounts: &[KnownMount]) -> String {
    let each = |m: &KnownMount| {
        let (at, of) = (m.mountpoint.display(), m.record.source.display());
        format!("{at} (of {of})")
    };
    mounts.iter().map(each).collect::<Vec<_>>().join(", ")
}

/// The mount point `unmount` acts on: the argument, the config file's, else the one
/// mount of ours that runs (several: asks for one).
pub(crate) fn mountpoint(config: &Config, arg: Option<&Path>) -> anyhow::Result<PathBuf> {
    if arg.is_some() || config.configured_mountpoint().is_some() {
        return config.mountpoint(arg);
    }
    match registry::known().as_slice() {
        [one] => Ok(one.mountpoint.clone()),
        [] => bail!(
            "no stagefs mount is running; to unmount one left behind, name its mount point (`stagefs unmount MOUNTPOINT`)"
        ),
        several => bail!(
            "{} stagefs mounts are running ({}); name the one to unmount",
            several.len(),
            several
                .iter()
                .map(|m| m.mountpoint.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// What the cache at `cache_dir` knows of its mount: the one serving from it now, or
/// else the last one it recorded.
pub(crate) fn recorded(cache_dir: &Path) -> Option<MountRecord> {
    MountRecord::read(cache_dir)
}

/// The mount a command takes for the configured one when the config file sets none:
/// the one serving from `cache_dir` now (or left dead in the mount table by its
/// daemon), or the last one it recorded if the user named that cache directory
/// (`flag`, the config file). A record left in the
/// default cache by an old mount is history, not a choice: `run` does not bring it
/// back, and `doctor` does not advise its mount point (issue 36).
pub(crate) fn standing(
    config: &Config,
    flag: Option<&Path>,
    cache_dir: &Path,
) -> Option<MountRecord> {
    let serving = matches!(stagefs_mount::live_mount(cache_dir), Ok(Some(_)))
        || registry::dead_mount_of(cache_dir).is_some();
    match serving || names_cache_dir(config, flag) {
        true => recorded(cache_dir),
        false => None,
    }
}

/// What `status` and `doctor` say of the dead mount at `mountpoint` (its daemon died
/// and left it in the mount table), with the command that clears it.
pub(crate) fn dead_line(mountpoint: &Path) -> String {
    format!(
        "{} is a dead mount: its daemon is gone (crashed or killed); clear it with `stagefs unmount --lazy {}`",
        mountpoint.display(),
        mountpoint.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_within_the_store_prefix_a_mount_mirrors_and_no_other() {
        let source = Path::new("s3://models/team");
        assert!(url_within("s3://models/team", source));
        assert!(url_within("s3://models/team/", source));
        assert!(url_within("s3://models/team/llama", source));
        assert!(!url_within("s3://models/teamwork", source));
        assert!(!url_within("s3://models/stopped", source));
        assert!(!url_within("s3://models", source));
        assert!(url_within("s3://models/x", Path::new("s3://models/")));
    }
}
