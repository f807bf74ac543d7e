//! The environment checks: whether programs will read through the mount (their
//! HuggingFace hub cache is where the source's shape puts it in the mount), and
//! whether the configured mount is up.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::time::Duration;

use serde::Serialize;
use stagefs_cache::control;
use stagefs_cache::models::Shape;

use super::fskind::FsKind;
use super::mounts;
use super::report::Check;
use super::worker::{self, Gathered, Line, Task, reply};

/// How long resolving two paths for [`same_place`] may take.
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
    Some((
        PathBuf::from(set("HOME")?).join(".cache/huggingface/hub"),
        "default",
    ))
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

/// `HF_HOME` as set in this environment, expanded.
fn hf_home() -> Option<PathBuf> {
    let value = std::env::var_os("HF_HOME").filter(|v| !v.is_empty())?;
    Some(expand_home(value, |name| std::env::var_os(name)))
}

/// The paths the `hub-cache` check compares, for the worker to resolve: the hub
/// cache, `HF_HOME`, and the places in the mount it may be.
pub(crate) fn paths_to_resolve(mountpoint: Option<&Path>) -> Vec<PathBuf> {
    let hub_cache = effective_hub_cache(|name| std::env::var_os(name)).map(|(path, _)| path);
    let in_mount = mountpoint
        .into_iter()
        .flat_map(|m| [m.to_path_buf(), m.join("hub")]);
    hub_cache
        .into_iter()
        .chain(hf_home())
        .chain(in_mount)
        .collect()
}

/// The `hub-cache` check against the mount at `mountpoint` of a source of `shape`
/// (when known): an HF_HOME wants `HF_HOME` to be the mount, a hub cache wants
/// `HF_HUB_CACHE` to be it, plain folders want neither.
pub(crate) fn hub_cache_check(
    gathered: &Gathered,
    mountpoint: Option<&Path>,
    shape: Option<Shape>,
) -> (Check, Option<HubCache>) {
    let Some((path, from)) = effective_hub_cache(|name| std::env::var_os(name)) else {
        let note = "neither HF_HUB_CACHE, HF_HOME nor HOME is set";
        return (Check::note("hub-cache", note), None);
    };
    let shown = format!("{} ({})", path.display(), origin(from));
    let resolved = gathered.resolved(&path);
    let mountpoint_path = mountpoint.map(Path::to_path_buf);
    let mut hub = HubCache {
        path,
        from,
        mountpoint: mountpoint_path,
        shape,
        points_at_mount: None,
    };
    let Some(mountpoint) = mountpoint else {
        let check = Check::note("hub-cache", format!("no mount point configured; the hub cache is {shown}"))
            .advise("`stagefs run --source SRC --mountpoint DIR -- COMMAND` mounts and sets the HF variables for that one command; set `source` and `mountpoint` in the config file to drop the flags");
        return (check, Some(hub));
    };
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
            let points = resolved == gathered.resolved(&expected);
            hub.points_at_mount = Some(points);
            judge(gathered, shape, points, &shown, mountpoint, from)
        }
        None => {
            // The source's shape is not known: either place in the mount will do.
            let mount = gathered.resolved(mountpoint);
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
fn judge(
    gathered: &Gathered,
    shape: Shape,
    points: bool,
    shown: &str,
    mountpoint: &Path,
    from: &str,
) -> Check {
    let export = super::shape::usage(shape, mountpoint);
    let run = "or start programs with `stagefs run -- COMMAND`, which sets it for that command";
    if !points {
        let unset = if shape == Shape::HfHome && from.ends_with("HUB_CACHE") {
            format!(" and unset {from}, which wins over HF_HOME")
        } else {
            String::new()
        };
        let (mount, what) = (mountpoint.display(), shape.describe());
        let summary =
            format!("the hub cache is {shown}, not the one in the mount ({mount} is {what})");
        return Check::warn("hub-cache", summary).advise(format!("{export}{unset}, {run}"));
    }
    let check = Check::ok(
        "hub-cache",
        format!("the hub cache is the mount's: {shown}"),
    );
    let mount = gathered.resolved(mountpoint);
    let home_elsewhere = hf_home().is_none_or(|home| gathered.resolved(&home) != mount);
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

/// Whether two paths name the same directory, resolving them in a worker, so a dead
/// mount among them cannot hang the caller.
pub(crate) fn same_place(a: &Path, b: &Path) -> bool {
    let tasks = || {
        vec![
            Task::Resolve(a.to_path_buf()),
            Task::Resolve(b.to_path_buf()),
        ]
    };
    a == b || {
        let gathered = worker::gather(tasks(), PATH_TIMEOUT);
        gathered.resolved(a) == gathered.resolved(b)
    }
}

/// The worker's side of the `mount` check, once the cache directory answered: what
/// its daemon serves, or what the mount point is when none answers.
pub(crate) fn probe_mount(cache_dir: &Path, mountpoint: &Path, tx: &Sender<Line>) {
    let live = crate::daemon::live_mount(cache_dir).map_err(|e| format!("{e:#}"));
    reply(tx, Line::Daemon(live.clone()));
    match live {
        Ok(Some((_, serving))) => {
            if let Ok(resolved) = std::fs::canonicalize(&serving) {
                reply(tx, Line::Resolved(serving, resolved));
            }
        }
        Ok(None) => {
            if let Ok(fs) = mounts::filesystem_of(mountpoint) {
                reply(tx, Line::MountFs(fs));
            }
        }
        Err(_) => {}
    }
}

/// The `mount` check: does a daemon serve the configured mount point from this cache
/// directory.
pub(crate) fn mount_check(
    gathered: &Gathered,
    mountpoint: &Path,
    cache_dir: &Path,
) -> (Check, MountState) {
    let mut state = MountState {
        mountpoint: mountpoint.to_path_buf(),
        up: false,
        source: None,
    };
    let socket = control::socket_path(cache_dir);
    let shown = mountpoint.display();
    let check = match got!(gathered, Daemon) {
        Some(Ok(Some((source, serving)))) => {
            if serving != mountpoint && gathered.resolved(serving) != gathered.resolved(mountpoint)
            {
                let (cache, source, serving) =
                    (cache_dir.display(), source.display(), serving.display());
                return (
                    Check::warn(
                        "mount",
                        format!("{cache} serves another mount: {source} at {serving}"),
                    )
                    .advise("unmount it, or give this mount its own --cache-dir"),
                    state,
                );
            }
            state.up = true;
            state.source = Some(source.clone());
            Check::ok(
                "mount",
                format!("{shown} is mounted, mirroring {}", source.display()),
            )
        }
        Some(Ok(None)) => {
            let mounted = got!(gathered, MountFs)
                .is_some_and(|fs| fs.kind == FsKind::Stagefs && fs.mount_point == mountpoint);
            if mounted {
                Check::warn("mount", format!("{shown} is a stagefs mount, but nothing answers on {}", socket.display()))
                    .advise(format!("it uses another --cache-dir, or its daemon died: then `stagefs unmount --lazy {shown}` and mount again"))
            } else {
                Check::note("mount", format!("{shown} is not mounted"))
                    .advise("`stagefs mount` mounts it, `stagefs run -- COMMAND` mounts it when needed, `stagefs service install` at login")
            }
        }
        Some(Err(e)) => Check::warn("mount", format!("cannot ask {}: {e}", socket.display())),
        None => Check::warn("mount", format!("the mount's daemon {}", gathered.missing)).advise(
            format!("if {shown} hangs too, `stagefs unmount --lazy {shown}` and mount again"),
        ),
    };
    (check, state)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::doctor::worker::Unanswered;

    fn resolve(vars: &[(&str, &str)]) -> Option<(PathBuf, &'static str)> {
        let vars: HashMap<&str, OsString> =
            vars.iter().map(|(k, v)| (*k, OsString::from(v))).collect();
        effective_hub_cache(|name| vars.get(name).cloned())
    }

    #[test]
    fn hub_cache_precedence() {
        let home = ("HOME", "/home/u");
        assert_eq!(
            resolve(&[home]),
            Some(("/home/u/.cache/huggingface/hub".into(), "default"))
        );
        let xdg = resolve(&[home, ("XDG_CACHE_HOME", "/x")]);
        assert_eq!(xdg, Some(("/x/huggingface/hub".into(), "XDG_CACHE_HOME")));
        assert_eq!(
            resolve(&[home, ("HF_HOME", "~/hf")]),
            Some(("/home/u/hf/hub".into(), "HF_HOME"))
        );
        let both = resolve(&[home, ("HF_HOME", "/hf"), ("HF_HUB_CACHE", "/m")]);
        assert_eq!(both, Some(("/m".into(), "HF_HUB_CACHE")));
        let legacy = resolve(&[("HUGGINGFACE_HUB_CACHE", "/legacy"), ("HF_HUB_CACHE", "")]);
        assert_eq!(legacy, Some(("/legacy".into(), "HUGGINGFACE_HUB_CACHE")));
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

    #[test]
    fn the_mount_check_reads_the_daemons_answer() {
        let gathered = |lines| Gathered {
            lines,
            missing: Unanswered::Late(Duration::from_secs(15)),
        };
        let (mnt, cache) = (Path::new("/m"), Path::new("/c"));
        let served = Line::Daemon(Ok(Some(("/src".into(), "/m".into()))));
        let (up, state) = mount_check(&gathered(vec![served]), mnt, cache);
        assert_eq!(
            (up.summary.as_str(), state.up),
            ("/m is mounted, mirroring /src", true)
        );
        let other = Line::Daemon(Ok(Some(("/src".into(), "/other".into()))));
        let (elsewhere, _) = mount_check(&gathered(vec![other]), mnt, cache);
        assert!(
            elsewhere.summary.contains("serves another mount"),
            "{}",
            elsewhere.summary
        );
        let (late, _) = mount_check(&gathered(Vec::new()), mnt, cache);
        assert_eq!(late.summary, "the mount's daemon did not answer within 15s");
        let (down, _) = mount_check(&gathered(vec![Line::Daemon(Ok(None))]), mnt, cache);
        assert_eq!(down.summary, "/m is not mounted");
    }
}
