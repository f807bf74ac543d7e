//! The environment checks: whether programs will read through the mount (their
//! HuggingFace hub cache is where the source's shape puts it in the mount), and
//! whether the configured mount is up.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use stagefs_cache::control;
use stagefs_cache::models::Shape;

use super::bounded::bounded;
use super::fskind::FsKind;
use super::report::Check;
use super::worker;

/// How long the mount's control socket may take to answer.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(5);
/// How long resolving a path (which may be on a dead mount) may take.
const PATH_TIMEOUT: Duration = Duration::from_secs(5);

/// The hub cache huggingface_hub will use, and which setting chose it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct HubCache {
    pub(crate) path: PathBuf,
    /// `HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`, `HF_HOME`, `XDG_CACHE_HOME` or `default`.
    pub(crate) from: &'static str,
    /// The configured mount point, if any.
    pub(crate) mountpoint: Option<PathBuf>,
    /// The shape of the mount's source, when known.
    pub(crate) shape: Option<Shape>,
    /// Whether `path` is the hub cache in the mount (the mount point, or its `hub/`
    /// for an HF_HOME); null without a mount point or for plain model folders.
    pub(crate) points_at_mount: Option<bool>,
}

/// The configured mount as reported in JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct MountState {
    pub(crate) mountpoint: PathBuf,
    /// Whether a stagefs daemon answered for this mount point.
    pub(crate) up: bool,
    /// What the running mount mirrors.
    pub(crate) source: Option<PathBuf>,
}

/// The hub cache as huggingface_hub resolves it: `HF_HUB_CACHE`, the legacy
/// `HUGGINGFACE_HUB_CACHE`, `$HF_HOME/hub`, `$XDG_CACHE_HOME/huggingface/hub`, then
/// `~/.cache/huggingface/hub`. `~` is expanded as huggingface_hub does.
pub(crate) fn effective_hub_cache(
    var: impl Fn(&str) -> Option<OsString>,
) -> Option<(PathBuf, &'static str)> {
    let set = |name: &str| var(name).filter(|v| !v.is_empty());
    let expand = |value: OsString| expand_home(value, &var);
    for name in ["HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"] {
        if let Some(value) = set(name) {
            return Some((expand(value), name));
        }
    }
    if let Some(value) = set("HF_HOME") {
        return Some((expand(value).join("hub"), "HF_HOME"));
    }
    if let Some(value) = set("XDG_CACHE_HOME") {
        return Some((expand(value).join("huggingface/hub"), "XDG_CACHE_HOME"));
    }
    let home = set("HOME").map(PathBuf::from);
    Some((home?.join(".cache/huggingface/hub"), "default"))
}

/// `~/x` with `~` as `HOME`, as huggingface_hub expands it.
fn expand_home(value: OsString, var: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    let path = PathBuf::from(value);
    let home = var("HOME").filter(|v| !v.is_empty()).map(PathBuf::from);
    match (path.strip_prefix("~"), home) {
        (Ok(rest), Some(home)) => home.join(rest),
        _ => path,
    }
}

/// `HF_HOME` as set, expanded.
fn hf_home(var: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let value = var("HF_HOME").filter(|v| !v.is_empty())?;
    Some(expand_home(value, var))
}

/// The `hub-cache` check against the mount at `mountpoint` of a source of `shape`
/// (when known): an HF_HOME wants `HF_HOME` to be the mount, a hub cache wants
/// `HF_HUB_CACHE` to be it, plain folders want neither.
pub(crate) fn hub_cache_check(
    mountpoint: Option<&Path>,
    shape: Option<Shape>,
) -> (Check, Option<HubCache>) {
    let var = |name: &str| std::env::var_os(name);
    let Some((path, from)) = effective_hub_cache(var) else {
        return (
            Check::note("hub-cache", "neither HF_HUB_CACHE, HF_HOME nor HOME is set"),
            None,
        );
    };
    let shown = format!("{} ({})", path.display(), origin(from));
    let mut hub = HubCache {
        path,
        from,
        mountpoint: mountpoint.map(Path::to_path_buf),
        shape,
        points_at_mount: None,
    };
    let Some(mountpoint) = mountpoint else {
        let check = Check::note("hub-cache", format!("no mount point configured; the hub cache is {shown}"))
            .advise("`stagefs run --source SRC --mountpoint DIR -- COMMAND` mounts and sets the HF variables for that one command; set `source` and `mountpoint` in the config file to drop the flags");
        return (check, Some(hub));
    };
    let resolved = resolve(&hub.path);
    // With no model recognised, the source may yet become either kind of HF cache.
    let known = shape.filter(|s| *s != Shape::Unknown);
    let check = match known.map(|s| (s, s.hub_cache(mountpoint))) {
        Some((Shape::ModelFolders, _)) | Some((_, None)) => Check::note(
            "hub-cache",
            format!(
                "the source holds plain model folders, loaded by path under {}; the hub cache ({shown}) does not matter to them",
                mountpoint.display()
            ),
        ),
        Some((shape, Some(expected))) => {
            let points = resolved == resolve(&expected);
            hub.points_at_mount = Some(points);
            judge(shape, points, &shown, mountpoint, from)
        }
        None => {
            // The source's shape is not known: either place in the mount will do.
            let mount = resolve(mountpoint);
            let points = resolved == mount || resolved == mount.join("hub");
            hub.points_at_mount = Some(points);
            if points {
                Check::ok("hub-cache", format!("the hub cache is the mount: {shown}"))
            } else {
                Check::warn("hub-cache", format!("the hub cache is {shown}, not the mount {}", mountpoint.display()))
                    .advise(format!(
                        "export HF_HUB_CACHE={} (its hub/ if the source is a whole HF_HOME), or start programs with `stagefs run -- COMMAND`, which sets it for that command",
                        mountpoint.display()
                    ))
            }
        }
    };
    (check, Some(hub))
}

/// Whether the environment matches a mount of an HF_HOME or a hub cache.
fn judge(shape: Shape, points: bool, shown: &str, mountpoint: &Path, from: &str) -> Check {
    let export = super::shape::usage(shape, mountpoint);
    let run = "or start programs with `stagefs run -- COMMAND`, which sets it for that command";
    if !points {
        let unset = if shape == Shape::HfHome && from.ends_with("HUB_CACHE") {
            format!(" and unset {from}, which wins over HF_HOME")
        } else {
            String::new()
        };
        return Check::warn(
            "hub-cache",
            format!(
                "the hub cache is {shown}, not the one in the mount ({} is {})",
                mountpoint.display(),
                shape.describe()
            ),
        )
        .advise(format!("{export}{unset}, {run}"));
    }
    let check = Check::ok(
        "hub-cache",
        format!("the hub cache is the mount's: {shown}"),
    );
    let home_elsewhere = hf_home(|name| std::env::var_os(name))
        .is_none_or(|home| resolve(&home) != resolve(mountpoint));
    if shape == Shape::HfHome && home_elsewhere {
        check.advise(format!(
            "{export} as well, so the token and xet/ in the mount are used"
        ))
    } else {
        check
    }
}

fn origin(from: &str) -> String {
    match from {
        "default" => "the default".to_string(),
        "XDG_CACHE_HOME" => "from XDG_CACHE_HOME".to_string(),
        name => format!("from {name}"),
    }
}

/// `path` with links resolved where it answers (a dead mount point does not), else
/// as written.
fn resolve(path: &Path) -> PathBuf {
    match worker::canonicalize(path, PATH_TIMEOUT) {
        Ok(Ok(resolved)) => resolved,
        _ => std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
    }
}

/// Whether two paths name the same directory, resolving each in a worker, so a dead
/// mount among them cannot hang the caller.
pub(crate) fn same_place(a: &Path, b: &Path) -> bool {
    a == b || resolve(a) == resolve(b)
}

/// The `mount` check: does a daemon serve the configured mount point from this cache
/// directory.
pub(crate) fn mount_check(mountpoint: &Path, cache_dir: &Path) -> (Check, MountState) {
    let mut state = MountState {
        mountpoint: mountpoint.to_path_buf(),
        up: false,
        source: None,
    };
    let socket = control::socket_path(cache_dir);
    let answer = bounded(SOCKET_TIMEOUT, {
        let cache_dir = cache_dir.to_path_buf();
        move || stagefs_mount::live_mount(&cache_dir)
    });
    let check = match answer {
        Ok(Ok(Some((source, serving)))) => serving_check(&mut state, &serving, source, cache_dir),
        Ok(Ok(None)) => not_serving(mountpoint, &socket),
        Ok(Err(e)) => Check::warn("mount", format!("cannot ask {}: {e:#}", socket.display())),
        Err(late) => {
            let shown = mountpoint.display();
            Check::warn("mount", format!("the mount's daemon {late}")).advise(format!(
                "if {shown} hangs too, `stagefs unmount --lazy {shown}` and mount again"
            ))
        }
    };
    (check, state)
}

/// A daemon answered for the cache directory: is it this mount point's?
fn serving_check(
    state: &mut MountState,
    serving: &Path,
    source: PathBuf,
    cache_dir: &Path,
) -> Check {
    if !same_place(serving, &state.mountpoint) {
        let summary = format!(
            "{} serves another mount: {} at {}",
            cache_dir.display(),
            source.display(),
            serving.display()
        );
        return Check::warn("mount", summary)
            .advise("unmount it, or give this mount its own --cache-dir");
    }
    let summary = format!(
        "{} is mounted, mirroring {}",
        state.mountpoint.display(),
        source.display()
    );
    state.up = true;
    state.source = Some(source);
    Check::ok("mount", summary)
}

/// No daemon answered: either nothing is mounted, or a mount with another cache
/// directory, or one whose daemon died.
fn not_serving(mountpoint: &Path, socket: &Path) -> Check {
    let shown = mountpoint.display();
    if is_stagefs_mount(mountpoint) {
        return Check::warn("mount", format!("{shown} is a stagefs mount, but nothing answers on {}", socket.display()))
            .advise(format!("it uses another --cache-dir, or its daemon died: then `stagefs unmount --lazy {shown}` and mount again"));
    }
    Check::note("mount", format!("{shown} is not mounted"))
        .advise("`stagefs mount` mounts it, `stagefs run -- COMMAND` mounts it when needed, `stagefs service install` at login")
}

fn is_stagefs_mount(mountpoint: &Path) -> bool {
    matches!(
        worker::filesystem_of(mountpoint, false, PATH_TIMEOUT),
        Ok(Ok(fs)) if fs.kind == FsKind::Stagefs && fs.mount_point == mountpoint
    )
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn resolve(vars: &[(&str, &str)]) -> Option<(PathBuf, &'static str)> {
        let vars: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        effective_hub_cache(|name| vars.get(name).cloned())
    }

    #[test]
    fn hub_cache_precedence() {
        let home = ("HOME", "/home/u");
        assert_eq!(
            resolve(&[home]),
            Some(("/home/u/.cache/huggingface/hub".into(), "default"))
        );
        assert_eq!(
            resolve(&[home, ("XDG_CACHE_HOME", "/x")]),
            Some(("/x/huggingface/hub".into(), "XDG_CACHE_HOME"))
        );
        assert_eq!(
            resolve(&[home, ("HF_HOME", "~/hf")]),
            Some(("/home/u/hf/hub".into(), "HF_HOME"))
        );
        assert_eq!(
            resolve(&[home, ("HF_HOME", "/hf"), ("HF_HUB_CACHE", "/m")]),
            Some(("/m".into(), "HF_HUB_CACHE"))
        );
        assert_eq!(
            resolve(&[("HUGGINGFACE_HUB_CACHE", "/legacy"), ("HF_HUB_CACHE", "")]),
            Some(("/legacy".into(), "HUGGINGFACE_HUB_CACHE"))
        );
        assert_eq!(resolve(&[]), None);
    }

    #[test]
    fn same_place_resolves_links() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        std::os::unix::fs::symlink(dir.path(), dir.path().join("link"))?;
        assert!(same_place(&dir.path().join("link"), dir.path()));
        assert!(!same_place(&dir.path().join("nope"), dir.path()));
        Ok(())
    }
}
