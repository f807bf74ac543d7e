//! How programs will find the models: the source's shape (an HF_HOME, a hub cache,
//! plain model folders) and what it holds, whether their HuggingFace hub cache is
//! where that shape puts it in the mount, and whether the configured mount is up.
//! `mount` and `run` use the same words.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::Serialize;
use stagefs_control as control;
use stagefs_layout::models::{Catalog, ModelKind, SEARCH_DEPTH, Shape, Survey};
use stagefs_source::fskind::{FsInfo, FsKind, filesystem_of};

use super::Check;
use super::lines::{Gathered, Line, StepError, Tx, reply};

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

/// The `shape` check for the directory at `path`. With `advise_mounting`, the
/// directory is not mounted yet, so the advice says how to use it once it is.
pub(crate) fn shape_check(path: &Path, survey: &Survey, advise_mounting: bool) -> Check {
    let shown = path.display();
    let stopped = match survey.catalog.complete {
        true => "",
        false => "; the search stopped early, the source is large",
    };
    // A repository's own directory (or one inside it) is one model, not a source
    // of the three shapes, although its snapshot looks like a plain folder.
    if let Some(repo) = stagefs_layout::hf::repo_of(path) {
        let id = repo
            .file_name()
            .and_then(|n| stagefs_layout::hf::id_of_repo_dir(&n.to_string_lossy()))
            .unwrap_or_default();
        let hub = repo.parent().unwrap_or(&repo).display().to_string();
        return Check::ok(
            "shape",
            format!("{shown}: the HF repository {id}, inside the hub cache {hub}"),
        )
        .advise(format!(
            "mount the hub cache, not the repository (`stagefs mount {hub} MOUNTPOINT`), and load {id} by its id"
        ));
    }
    if survey.shape == Shape::Unknown {
        return Check::note("shape", format!(
            "{shown}: no model found (no models--org--name, no folder of weight files with a config.json or index, no .gguf file within {SEARCH_DEPTH} levels{stopped})"
        ))
        .advise("models deeper down need `model_dirs` in the config file (or --model-dir); check the path");
    }
    let (what, holding) = (survey.shape.describe(), contents(&survey.catalog));
    // Plain folders are named once: "2 plain model folders", not "plain model folders
    // holding 2 plain model folders".
    let found = match survey.shape {
        Shape::ModelFolders => format!("{holding}, loaded by path"),
        _ => format!("{what} holding {holding}"),
    };
    let check = Check::ok("shape", format!("{shown}: {found}{stopped}"));
    let loose = loose_models(&survey.catalog);
    match advise_mounting {
        true => check.advise(format!(
            "once mounted (`stagefs mount {shown} MOUNTPOINT`): {}",
            usage(survey.shape, loose, Path::new("MOUNTPOINT"), None)
        )),
        false => check,
    }
}

/// Whether the source holds plain model folders or GGUF files (beside repositories).
fn loose_models(catalog: &Catalog) -> bool {
    catalog.count(ModelKind::Folder) + catalog.count(ModelKind::File) > 0
}

/// `2 HF repositories, 1 plain model folder`.
fn contents(catalog: &Catalog) -> String {
    let kinds = [ModelKind::HfRepo, ModelKind::Folder, ModelKind::File];
    let parts: Vec<String> = kinds
        .into_iter()
        .filter_map(|kind| match (kind, catalog.count(kind)) {
            (_, 0) => None,
            (ModelKind::HfRepo, n @ 2..) => Some(format!("{n} HF repositories")),
            (kind, 1) => Some(format!("1 {}", kind.describe())),
            (kind, n) => Some(format!("{n} {}s", kind.describe())),
        })
        .collect();
    match parts.is_empty() {
        true => "no model yet".to_string(),
        false => parts.join(", "),
    }
}

/// How programs find the models of a mount at `mountpoint` of a source of `shape`:
/// `export HF_HOME=/m`, or loading by path; both for an HF cache with plain folders or
/// GGUF files beside it (`loose`). With the mount's cache directory known, an
/// HF_HOME's xet cache is pointed beside it (see [`Shape::xet_cache`]).
pub(crate) fn usage(
    shape: Shape,
    loose: bool,
    mountpoint: &Path,
    cache_dir: Option<&Path>,
) -> String {
    let xet = cache_dir
        .and_then(|c| shape.xet_cache(c))
        .map(|xet| format!(" HF_XET_CACHE={}", xet.display()))
        .unwrap_or_default();
    match (shape, shape.export(mountpoint)) {
        (_, Some((var, value))) if loose => format!(
            "export {var}={}{xet} for its HF repositories; load its plain model folders by path under {}",
            value.display(),
            mountpoint.display()
        ),
        (_, Some((var, value))) => format!("export {var}={}{xet}", value.display()),
        (Shape::ModelFolders, None) => format!(
            "load models by path under {} (plain folders need no HF variable)",
            mountpoint.display()
        ),
        (_, None) => {
            "no model recognised in the source yet (`stagefs doctor SOURCE` says what it holds)"
                .to_string()
        }
    }
}

/// The hub cache as huggingface_hub resolves it: `HF_HUB_CACHE`, the legacy
/// `HUGGINGFACE_HUB_CACHE`, `$HF_HOME/hub`, `$XDG_CACHE_HOME/huggingface/hub`, then
/// `~/.cache/huggingface/hub` (named `default`).
fn effective_hub_cache(var: impl Fn(&str) -> Option<OsString>) -> Option<(PathBuf, &'static str)> {
    let places: [(&str, &[&str]); 5] = [
        ("HF_HUB_CACHE", &[]),
        ("HUGGINGFACE_HUB_CACHE", &[]),
        ("HF_HOME", &["hub"]),
        ("XDG_CACHE_HOME", &["huggingface", "hub"]),
        ("HOME", &[".cache", "huggingface", "hub"]),
    ];
    places.into_iter().find_map(|(name, rest)| {
        // Joined part by part: joining "" would add a trailing slash.
        let base = set(&var, name)?;
        let path = rest.iter().fold(base, |path, part| path.join(part));
        Some((path, if name == "HOME" { "default" } else { name }))
    })
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
pub(crate) fn paths_to_resolve(mountpoint: Option<&Path>) -> impl Iterator<Item = PathBuf> {
    let hub_cache = effective_hub_cache(env).map(|(path, _)| path);
    let in_mount = mountpoint.map(|m| [m.to_path_buf(), m.join("hub")]);
    let paths = [hub_cache, set(&env, "HF_HOME")].into_iter().flatten();
    paths.chain(in_mount.into_iter().flatten())
}

/// The `hub-cache` check against the mount at `mountpoint` of a source of `shape`
/// (when known): an HF_HOME wants `HF_HOME` to be the mount (and `HF_HUB_CACHE`, if
/// set, its `hub/`), a hub cache wants `HF_HUB_CACHE` to be it, plain folders want
/// neither.
pub(crate) fn hub_cache_check(
    gathered: &Gathered,
    mountpoint: Option<&Path>,
    shape: Option<Shape>,
) -> (Check, Option<HubCache>) {
    const NAME: &str = "hub-cache";
    let Some((path, from)) = effective_hub_cache(env) else {
        let note = "neither HF_HUB_CACHE, HF_HOME nor HOME is set";
        return (Check::note(NAME, note), None);
    };
    let origin = match from {
        "default" => "the default".to_string(),
        name => format!("from {name}"),
    };
    let shown = format!("{} ({origin})", path.display());
    let resolved = gathered.resolved(&path);
    let mut hub = HubCache {
        path,
        from,
        mountpoint: mountpoint.map(Into::into),
        shape,
        points_at_mount: None,
    };
    let Some(mountpoint) = mountpoint else {
        let check = Check::note(NAME, format!("no mount point configured; the hub cache is {shown}"))
            .advise("`stagefs run --source SRC --mountpoint DIR -- COMMAND` mounts and sets the HF variables for that one command; set `source` and `mountpoint` in the config file to drop the flags");
        return (check, Some(hub));
    };
    let (mount, m) = (gathered.resolved(mountpoint), mountpoint.display());
    // With no model recognised, the source may yet become either kind of HF cache,
    // and either place in the mount will do.
    let shape = shape.filter(|s| *s != Shape::Unknown);
    hub.points_at_mount = match shape {
        Some(Shape::ModelFolders) => None,
        Some(shape) => {
            let expected = shape.hub_cache(mountpoint).unwrap_or_default();
            Some(resolved == gathered.resolved(&expected))
        }
        None => Some(resolved == mount || resolved == mount.join("hub")),
    };
    let export = shape
        .map(|s| usage(s, false, mountpoint, None))
        .unwrap_or_default();
    let is_home = shape == Some(Shape::HfHome);
    let home_elsewhere = set(&env, "HF_HOME").map(|h| gathered.resolved(&h)) != Some(mount);
    let check = match (shape, hub.points_at_mount) {
        (_, None) => Check::note(
            NAME,
            format!(
                "the source holds plain model folders, loaded by path under {m}; the hub cache, {shown}, does not matter to them"
            ),
        ),
        (None, Some(true)) => Check::ok(NAME, format!("the hub cache is the mount: {shown}")),
        (None, Some(false)) => {
            Check::warn(NAME, format!("the hub cache is {shown}, not the mount {m}")).advise(
                format!(
                    "export HF_HUB_CACHE={m} (its hub/ if the source is a whole HF_HOME), or {RUN}"
                ),
            )
        }
        (Some(shape), Some(false)) => {
            let unset = match is_home && from.ends_with("HUB_CACHE") {
                true => format!(" and unset {from}, which wins over HF_HOME"),
                false => String::new(),
            };
            let what = shape.describe();
            Check::warn(
                NAME,
                format!("the hub cache is {shown}, not the one in the mount ({m} is {what})"),
            )
            .advise(format!("{export}{unset}, or {RUN}"))
        }
        (Some(_), Some(true)) => {
            let check = Check::ok(NAME, format!("the hub cache is the mount's: {shown}"));
            match is_home && home_elsewhere {
                true => check.advise(format!(
                    "{export} as well, so the token and xet/ in the mount are used"
                )),
                false => check,
            }
        }
    };
    (check, Some(hub))
}

/// The worker's side of the `mount` check, once the cache directory answered: what
/// its daemon serves, or what the mount point is when none answers; with `shape`, the
/// shape of the served mount's source.
pub(crate) fn probe_mount(cache_dir: &Path, mountpoint: &Path, shape: bool, tx: &Tx) {
    let live = stagefs_mount::live_mount(cache_dir).map_err(|e| e.to_string());
    reply(tx, Line::Daemon(live.clone()));
    let served = matches!(live, Ok(Some(_)));
    let line = match &live {
        Ok(Some((_, serving))) => {
            let resolved = std::fs::canonicalize(serving).ok();
            resolved.map(|resolved| Line::Resolved(serving.clone(), resolved))
        }
        Ok(None) => {
            // `stagefs mount` refuses anything but an empty directory.
            let listed = std::fs::read_dir(mountpoint).map(|mut e| e.next().is_none());
            reply(tx, Line::MountEmpty(listed.map_err(StepError::of)));
            filesystem_of(mountpoint).ok().map(Line::MountFs)
        }
        Err(_) => None,
    };
    if let Some(line) = line {
        reply(tx, line);
    }
    // The shape of the mount's source, for the advice about a mount doctor was not
    // asked about (the argument is some other path): which variable that mount wants.
    if let Ok(Some((source, serving))) = &live
        && shape
        && serving == mountpoint
        && let Ok(tree) = stagefs_mount::place::open_recorded_source(source)
    {
        reply(tx, Line::MountShape(stagefs_layout::models::shape(&tree)));
    }
    // Last: the mount's status walks the source, and the lines above need none of it.
    if served {
        super::refused::probe(cache_dir, tx);
    }
}

/// The failed `mount` check for a mount point no mount can use, if it is one: inside
/// the source (the mount would hold itself, endlessly), missing, not a directory,
/// or not empty (`stagefs mount` refuses the last three).
fn unusable_mountpoint(gathered: &Gathered, mount: &Path, sources: &[PathBuf]) -> Option<Check> {
    let shown = mount.display();
    let resolved = gathered.resolved(mount);
    if let Some(source) = sources.iter().find(|s| resolved.starts_with(s)) {
        let summary = format!(
            "the mount point {shown} is inside the source {}",
            source.display()
        );
        let advice = "choose a mount point outside the source: a mount inside it would show itself inside itself, endlessly";
        return Some(Check::fail("mount", summary).advise(advice));
    }
    let check = match got!(gathered, MountEmpty)? {
        Ok(true) => return None,
        Ok(false) => Check::fail("mount", format!("the mount point {shown} is not empty")).advise(
            "mount on an empty directory: a mount would hide what is there, so stagefs refuses",
        ),
        // A dead mount there is the dead-mount check's to name.
        Err(e) if e.dead_mount() => return None,
        Err(e) if e.not_found => {
            Check::fail("mount", format!("the mount point {shown} does not exist")).advise(format!(
                "create it (`mkdir -p {shown}`) or fix `mountpoint` in the config file"
            ))
        }
        Err(e) => Check::fail(
            "mount",
            format!("the mount point {shown} cannot be used: {e}"),
        ),
    };
    Some(check)
}

/// The `mount` check: does a daemon serve the configured mount point from this cache
/// directory, and if none does, could one (`sources`: the source, resolved and as
/// configured).
pub(crate) fn mount_check(
    gathered: &Gathered,
    mount: &Path,
    cache: &Path,
    sources: &[PathBuf],
) -> (Check, MountState) {
    let (socket, shown) = (control::socket_path(cache), mount.display());
    let same = |serving| serving == mount || gathered.resolved(serving) == gathered.resolved(mount);
    let stagefs = |fs: &FsInfo| fs.kind == FsKind::Stagefs && fs.mount_point == mount;
    let mut source = None;
    let unusable = || unusable_mountpoint(gathered, mount, sources);
    let check = match got!(gathered, Daemon) {
        Some(Ok(Some((mirrored, serving)))) if same(serving) => {
            source = Some(mirrored.clone());
            Check::ok("mount", format!("{shown} is mounted, mirroring {}", mirrored.display()))
        }
        Some(Ok(Some((mirrored, serving)))) => {
            let (cache, mirrored, serving) = (cache.display(), mirrored.display(), serving.display());
            Check::warn("mount", format!("{cache} serves another mount: {mirrored} at {serving}"))
                .advise("unmount it, or give this mount its own --cache-dir")
        }
        Some(Ok(None)) if stagefs_mount::registry::dead_mount_of(cache).is_some() => {
            Check::fail("mount", crate::mounts::dead_line(mount))
        }
        Some(Ok(None)) if got!(gathered, MountFs).is_some_and(stagefs) => Check::warn("mount", format!("{shown} is a stagefs mount, but nothing answers on {}", socket.display()))
            .advise(format!("it uses another --cache-dir, or its daemon died: then `stagefs unmount --lazy {shown}` and mount again")),
        Some(Ok(None)) if let Some(check) = unusable() => check,
        Some(Ok(None)) => Check::note("mount", format!("{shown} is not mounted"))
            .advise("`stagefs mount` mounts it, `stagefs run -- COMMAND` mounts it when needed, `stagefs service install` at login"),
        Some(Err(e)) => Check::warn("mount", format!("cannot ask {}: {e}", socket.display())),
        None => Check::warn("mount", format!("the mount's daemon {}", gathered.missing)).advise(
            format!("if {shown} hangs too, `stagefs unmount --lazy {shown}` and mount again"),
        ),
    };
    let (mountpoint, up) = (mount.to_path_buf(), source.is_some());
    let state = MountState {
        mountpoint,
        up,
        source,
    };
    (check, state)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use stagefs_layout::models::ModelRef;

    use super::*;
    use crate::doctor::Verdict;

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
        let sources = [PathBuf::from("/src")];
        let check = |lines| {
            let gathered = Gathered::late(lines);
            mount_check(&gathered, Path::new("/m"), Path::new("/c"), &sources)
        };
        let served = |at: &str| vec![Line::Daemon(Ok(Some(("/src".into(), at.into()))))];
        let (elsewhere, _) = check(served("/other"));
        assert_eq!(elsewhere.summary, "/c serves another mount: /src at /other");
        let (late, _) = check(Vec::new());
        assert_eq!(late.summary, "the mount's daemon did not answer within 15s");
        let (absent, _) = check(vec![Line::Daemon(Ok(None))]);
        assert_eq!(absent.summary, "/m is not mounted");
        let listed = |empty| vec![Line::Daemon(Ok(None)), Line::MountEmpty(empty)];
        let (full, _) = check(listed(Ok(false)));
        assert_eq!(full.summary, "the mount point /m is not empty");
        let gone = StepError::of(std::io::Error::from(std::io::ErrorKind::NotFound));
        let (missing, _) = check(listed(Err(gone)));
        assert_eq!(missing.summary, "the mount point /m does not exist");
        let dead = StepError::of(std::io::Error::from_raw_os_error(libc::ENOTCONN));
        let (dead, _) = check(listed(Err(dead)));
        assert_eq!(
            dead.summary, "/m is not mounted",
            "the dead-mount check's to name"
        );
        let inside = mount_check(
            &Gathered::late(listed(Ok(true))),
            Path::new("/src/m"),
            Path::new("/c"),
            &sources,
        );
        assert_eq!(
            inside.0.summary,
            "the mount point /src/m is inside the source /src"
        );
    }

    /// Each shape's summary in a mount is checked through the binary (shapes.rs);
    /// these are the counts, the advice before mounting, and no model at all.
    #[test]
    fn a_shape_is_named_with_what_it_holds_and_how_to_use_it() {
        use ModelKind::{File, Folder, HfRepo};
        let check = |shape, kinds: &[ModelKind]| {
            let model = |&kind| ModelRef {
                id: String::new(),
                kind,
                path: PathBuf::new(),
            };
            let catalog = Catalog {
                models: kinds.iter().map(model).collect(),
                complete: true,
            };
            shape_check(Path::new("/nas/hf"), &Survey { shape, catalog }, true)
        };
        let home = check(Shape::HfHome, &[HfRepo, HfRepo, Folder, File]);
        let expected =
            "/nas/hf: an HF_HOME holding 2 HF repositories, 1 plain model folder, 1 GGUF file";
        assert_eq!(home.summary, expected);
        let advice = "once mounted (`stagefs mount /nas/hf MOUNTPOINT`): export HF_HOME=MOUNTPOINT for its HF repositories; load its plain model folders by path under MOUNTPOINT";
        assert_eq!(home.advice.as_deref(), Some(advice));
        let folders = check(Shape::ModelFolders, &[Folder, Folder, File]);
        let expected = "/nas/hf: 2 plain model folders, 1 GGUF file, loaded by path";
        assert_eq!(folders.summary, expected);
        let nothing = check(Shape::Unknown, &[]);
        assert_eq!(nothing.verdict, Verdict::Note);
        assert!(nothing.advice.unwrap_or_default().contains("model_dirs"));
        // A repository given by its own path (its snapshot looks like a folder).
        let catalog = Catalog {
            models: vec![ModelRef {
                id: String::new(),
                kind: Folder,
                path: PathBuf::new(),
            }],
            complete: true,
        };
        let survey = Survey {
            shape: Shape::ModelFolders,
            catalog,
        };
        for path in [
            "/nas/hub/models--org--name",
            "/nas/hub/models--org--name/snapshots/abc",
        ] {
            let repo = shape_check(Path::new(path), &survey, true);
            assert_eq!(
                repo.summary,
                format!("{path}: the HF repository org/name, inside the hub cache /nas/hub")
            );
            assert!(!repo.summary.contains("plain model folder"));
            let advice = repo.advice.unwrap_or_default();
            assert!(
                advice.contains("`stagefs mount /nas/hub MOUNTPOINT`"),
                "{advice}"
            );
        }
    }
}
