//! The environment checks: whether programs will read through the mount (their
//! HuggingFace hub cache is where the source's shape puts it in the mount), and
//! whether the configured mount is up.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;

use serde::Serialize;
use stagefs_cache::control;
use stagefs_cache::models::Shape;

use super::fskind::FsKind;
use super::mounts;
use super::report::Check;
use super::worker::{Gathered, Line, reply};

const RUN: &str = "start programs with `stagefs run -- COMMAND`, which sets it for that command";

/// The hub cache huggingface_hub will use; `from` is the setting that chose it
/// (`HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`, `HF_HOME`, `XDG_CACHE_HOME` or
/// `default`), `shape` that of the mount's source when known, `points_at_mount`
/// whether `path` is the hub cache in the configured mount (null without a mount point
/// or for plain model folders).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct HubCache {
    pub(crate) path: PathBuf,
    pub(crate) from: &'static str,
    pub(crate) mountpoint: Option<PathBuf>,
    pub(crate) shape: Option<Shape>,
    pub(crate) points_at_mount: Option<bool>,
}

/// The configured mount as reported in JSON: `up` when a stagefs daemon answered
/// for it, and what it mirrors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct MountState {
    pub(crate) mountpoint: PathBuf,
    pub(crate) up: bool,
    pub(crate) source: Option<PathBuf>,
}

/// The hub cache as huggingface_hub resolves it: `HF_HUB_CACHE`, the legacy
/// `HUGGINGFACE_HUB_CACHE`, `$HF_HOME/hub`, `$XDG_CACHE_HOME/huggingface/hub`, then
/// `~/.cache/huggingface/hub`.
fn effective_hub_cache(var: impl Fn(&str) -> Option<OsString>) -> Option<(PathBuf, &'static str)> {
    let places = [
        ("HF_HUB_CACHE", None),
        ("HUGGINGFACE_HUB_CACHE", None),
        ("HF_HOME", Some("hub")),
        ("XDG_CACHE_HOME", Some("huggingface/hub")),
        ("HOME", Some(".cache/huggingface/hub")),
    ];
    let found = places
        .into_iter()
        .find_map(|(name, rest)| Some((set(&var, name)?, name, rest)));
    let (path, name, rest) = found?;
    let from = if name == "HOME" { "default" } else { name };
    Some((
        rest.map_or_else(|| path.clone(), |rest| path.join(rest)),
        from,
    ))
}

/// Variable `name` if it is set and not empty, with `~` expanded to `HOME` as
/// huggingface_hub does.
fn set(var: &impl Fn(&str) -> Option<OsString>, name: &str) -> Option<PathBuf> {
    let value = PathBuf::from(var(name).filter(|v| !v.is_empty())?);
    let home = var("HOME").filter(|v| !v.is_empty()).map(PathBuf::from);
    match (value.strip_prefix("~"), home) {
        (Ok(rest), Some(home)) => Some(home.join(rest)),
        _ => Some(value),
    }
}

fn env(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

/// The paths the `hub-cache` check compares, for the worker to resolve: the hub
/// cache, `HF_HOME`, and the places in the mount it may be.
pub(crate) fn paths_to_resolve(mountpoint: Option<&Path>) -> Vec<PathBuf> {
    let hub_cache = effective_hub_cache(env).map(|(path, _)| path);
    let in_mount = mountpoint
        .into_iter()
        .flat_map(|m| [m.to_path_buf(), m.join("hub")]);
    hub_cache
        .into_iter()
        .chain(set(&env, "HF_HOME"))
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
    let Some((path, from)) = effective_hub_cache(env) else {
        let note = "neither HF_HUB_CACHE, HF_HOME nor HOME is set";
        return (Check::note("hub-cache", note), None);
    };
    let origin = match from {
        "default" => "the default".to_string(),
        "XDG_CACHE_HOME" => "from XDG_CACHE_HOME".to_string(),
        name => format!("from {name}"),
    };
    let shown = format!("{} ({origin})", path.display());
    let resolved = gathered.resolved(&path);
    let mount = mountpoint.map(Path::to_path_buf);
    let mut hub = HubCache {
        path,
        from,
        mountpoint: mount,
        shape,
        points_at_mount: None,
    };
    let Some(mountpoint) = mountpoint else {
        let check = Check::note("hub-cache", format!("no mount point configured; the hub cache is {shown}"))
            .advise("`stagefs run --source SRC --mountpoint DIR -- COMMAND` mounts and sets the HF variables for that one command; set `source` and `mountpoint` in the config file to drop the flags");
        return (check, Some(hub));
    };
    let mount = gathered.resolved(mountpoint);
    // With no model recognised, the source may yet become either kind of HF cache.
    let check = match shape.filter(|s| *s != Shape::Unknown) {
        Some(Shape::ModelFolders) => Check::note(
            "hub-cache",
            format!(
                "the source holds plain model folders, loaded by path under {}; the hub cache ({shown}) does not matter to them",
                mountpoint.display()
            ),
        ),
        Some(shape) => {
            let expected = shape.hub_cache(mountpoint).unwrap_or_default();
            let points = resolved == gathered.resolved(&expected);
            hub.points_at_mount = Some(points);
            judge(
                shape,
                points,
                &shown,
                mountpoint,
                from,
                set(&env, "HF_HOME").map(|h| gathered.resolved(&h)) != Some(mount),
            )
        }
        None => {
            // The source's shape is not known: either place in the mount will do.
            let points = resolved == mount || resolved == mount.join("hub");
            hub.points_at_mount = Some(points);
            match points {
                true => Check::ok("hub-cache", format!("the hub cache is the mount: {shown}")),
                false => Check::warn(
                    "hub-cache",
                    format!(
                        "the hub cache is {shown}, not the mount {}",
                        mountpoint.display()
                    ),
                )
                .advise(format!(
                    "export HF_HUB_CACHE={} (its hub/ if the source is a whole HF_HOME), or {RUN}",
                    mountpoint.display()
                )),
            }
        }
    };
    (check, Some(hub))
}

/// Whether the environment matches a mount of an HF_HOME or a hub cache;
/// `home_elsewhere` when `HF_HOME` is not the mount.
fn judge(
    shape: Shape,
    points: bool,
    shown: &str,
    mountpoint: &Path,
    from: &str,
    home_elsewhere: bool,
) -> Check {
    let export = super::shape::usage(shape, mountpoint);
    if !points {
        let unset = match shape == Shape::HfHome && from.ends_with("HUB_CACHE") {
            true => format!(" and unset {from}, which wins over HF_HOME"),
            false => String::new(),
        };
        let (mount, what) = (mountpoint.display(), shape.describe());
        let summary =
            format!("the hub cache is {shown}, not the one in the mount ({mount} is {what})");
        return Check::warn("hub-cache", summary).advise(format!("{export}{unset}, or {RUN}"));
    }
    let check = Check::ok(
        "hub-cache",
        format!("the hub cache is the mount's: {shown}"),
    );
    match shape == Shape::HfHome && home_elsewhere {
        true => check.advise(format!(
            "{export} as well, so the token and xet/ in the mount are used"
        )),
        false => check,
    }
}

/// The worker's side of the `mount` check, once the cache directory answered: what
/// its daemon serves, or what the mount point is when none answers.
pub(crate) fn probe_mount(cache_dir: &Path, mountpoint: &Path, tx: &Sender<Line>) {
    let live = stagefs_mount::live_mount(cache_dir).map_err(|e| e.to_string());
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
    let (socket, shown) = (control::socket_path(cache_dir), mountpoint.display());
    let check = match got!(gathered, Daemon) {
        Some(Ok(Some((source, serving)))) => {
            let same = serving == mountpoint
                || gathered.resolved(serving) == gathered.resolved(mountpoint);
            let (cache, mirrored, serving) =
                (cache_dir.display(), source.display(), serving.display());
            if !same {
                let summary = format!("{cache} serves another mount: {mirrored} at {serving}");
                let check = Check::warn("mount", summary);
                return (
                    check.advise("unmount it, or give this mount its own --cache-dir"),
                    state,
                );
            }
            (state.up, state.source) = (true, Some(source.clone()));
            Check::ok("mount", format!("{shown} is mounted, mirroring {mirrored}"))
        }
        Some(Ok(None)) => {
            let mounted = got!(gathered, MountFs)
                .is_some_and(|fs| fs.kind == FsKind::Stagefs && fs.mount_point == mountpoint);
            match mounted {
                true => Check::warn("mount", format!("{shown} is a stagefs mount, but nothing answers on {}", socket.display()))
                    .advise(format!("it uses another --cache-dir, or its daemon died: then `stagefs unmount --lazy {shown}` and mount again")),
                false => Check::note("mount", format!("{shown} is not mounted"))
                    .advise("`stagefs mount` mounts it, `stagefs run -- COMMAND` mounts it when needed, `stagefs service install` at login"),
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

    #[test]
    fn hub_cache_precedence() {
        let resolve = |vars: &[(&str, &str)]| {
            let vars: HashMap<&str, OsString> = vars.iter().map(|(k, v)| (*k, v.into())).collect();
            effective_hub_cache(|name| vars.get(name).cloned())
                .map(|(p, from)| (p.display().to_string(), from))
        };
        let home = ("HOME", "/home/u");
        let default = Some(("/home/u/.cache/huggingface/hub".into(), "default"));
        assert_eq!(resolve(&[home]), default);
        let xdg = resolve(&[home, ("XDG_CACHE_HOME", "/x")]);
        assert_eq!(xdg, Some(("/x/huggingface/hub".into(), "XDG_CACHE_HOME")));
        let hf_home = resolve(&[home, ("HF_HOME", "~/hf")]);
        assert_eq!(hf_home, Some(("/home/u/hf/hub".into(), "HF_HOME")));
        let both = resolve(&[home, ("HF_HOME", "/hf"), ("HF_HUB_CACHE", "/m")]);
        assert_eq!(both, Some(("/m".into(), "HF_HUB_CACHE")));
        let legacy = resolve(&[("HUGGINGFACE_HUB_CACHE", "/legacy"), ("HF_HUB_CACHE", "")]);
        assert_eq!(legacy, Some(("/legacy".into(), "HUGGINGFACE_HUB_CACHE")));
        assert_eq!(resolve(&[]), None);
    }

    #[test]
    fn the_mount_check_reads_the_daemons_answer() {
        let check = |lines| {
            let gathered =
                Gathered::new(lines, Unanswered::Late(std::time::Duration::from_secs(15)));
            mount_check(&gathered, Path::new("/m"), Path::new("/c"))
        };
        let served = |at: &str| vec![Line::Daemon(Ok(Some(("/src".into(), at.into()))))];
        let (up, state) = check(served("/m"));
        assert_eq!(
            (up.summary.as_str(), state.up),
            ("/m is mounted, mirroring /src", true)
        );
        let (elsewhere, _) = check(served("/other"));
        assert_eq!(elsewhere.summary, "/c serves another mount: /src at /other");
        let (late, _) = check(Vec::new());
        assert_eq!(late.summary, "the mount's daemon did not answer within 15s");
        assert_eq!(
            check(vec![Line::Daemon(Ok(None))]).0.summary,
            "/m is not mounted"
        );
    }
}
