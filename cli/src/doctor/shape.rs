//! The `shape` check: which of the layouts people keep models in a source has (an
//! HF_HOME, a hub cache, plain model folders), what it holds, and how programs are
//! pointed at a mount of it. `mount` and `run` use the same words.

use std::path::Path;
use std::time::Duration;

use stagefs_cache::models::{Catalog, ModelKind, SEARCH_DEPTH, Shape, Survey};

use super::report::Check;
use super::worker;

/// The `shape` check for the directory at `path`. With `advise_mounting`, the
/// directory is not mounted yet, so the advice says how to use it once it is.
pub(crate) fn shape_check(path: &Path, survey: &Survey, advise_mounting: bool) -> Check {
    let shown = path.display();
    if survey.shape == Shape::Unknown {
        return Check::note(
            "shape",
            format!(
                "{shown}: no model found (no models--org--name, no folder of weight files with a config.json or index, no .gguf file within {SEARCH_DEPTH} levels{})",
                stopped(&survey.catalog)
            ),
        )
        .advise("models deeper down need `model_dirs` in the config file (or --model-dir); check the path");
    }
    let summary = format!(
        "{shown}: {} holding {}{}",
        survey.shape.describe(),
        contents(&survey.catalog),
        stopped(&survey.catalog)
    );
    let check = Check::ok("shape", summary);
    if advise_mounting {
        check.advise(format!(
            "once mounted (`stagefs mount {shown} MOUNTPOINT`): {}",
            usage(survey.shape, Path::new("MOUNTPOINT"))
        ))
    } else {
        check
    }
}

/// `2 HF repositories, 1 plain model folder`.
fn contents(catalog: &Catalog) -> String {
    let parts: Vec<String> = [ModelKind::HfRepo, ModelKind::Folder, ModelKind::File]
        .into_iter()
        .filter_map(|kind| {
            let n = catalog.count(kind);
            let plural = if n == 1 { "" } else { "s" };
            let name = match kind {
                ModelKind::HfRepo => "HF repositor",
                ModelKind::Folder => "plain model folder",
                ModelKind::File => "GGUF file",
            };
            let ending = match (kind, n) {
                (ModelKind::HfRepo, 1) => "y",
                (ModelKind::HfRepo, _) => "ies",
                _ => plural,
            };
            (n > 0).then(|| format!("{n} {name}{ending}"))
        })
        .collect();
    if parts.is_empty() {
        "no model yet".to_string()
    } else {
        parts.join(", ")
    }
}

fn stopped(catalog: &Catalog) -> &'static str {
    if catalog.complete {
        ""
    } else {
        "; the search stopped early, the source is large"
    }
}

/// How programs find the models of a mount at `mountpoint` of a source of `shape`:
/// `export HF_HOME=/m`, or loading by path.
pub(crate) fn usage(shape: Shape, mountpoint: &Path) -> String {
    match (shape, shape.export(mountpoint)) {
        (_, Some((var, value))) => format!("export {var}={}", value.display()),
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

/// The shape of the source at `path`, asked of a worker so that a dead share cannot
/// hang the caller; None if it did not answer within `timeout`.
pub(crate) fn shape_of(path: &Path, timeout: Duration) -> Option<Shape> {
    let gathered = worker::gather(vec![worker::Task::Shape(path.to_path_buf())], timeout);
    got!(gathered, Shape)?.clone().ok()
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use stagefs_cache::models::ModelRef;

    use super::*;
    use crate::doctor::report::Verdict;

    fn survey(shape: Shape, kinds: &[ModelKind]) -> Survey {
        let models = kinds
            .iter()
            .enumerate()
            .map(|(i, kind)| ModelRef {
                id: format!("m{i}"),
                kind: *kind,
                path: PathBuf::from(format!("m{i}")),
            })
            .collect();
        Survey {
            shape,
            catalog: Catalog {
                models,
                complete: true,
            },
        }
    }

    #[test]
    fn each_shape_is_named_with_what_it_holds_and_how_to_use_it() {
        let home = survey(Shape::HfHome, &[ModelKind::HfRepo, ModelKind::HfRepo]);
        let check = shape_check(Path::new("/nas/hf"), &home, true);
        assert_eq!(check.verdict, Verdict::Ok);
        assert_eq!(
            check.summary,
            "/nas/hf: an HF_HOME holding 2 HF repositories"
        );
        assert_eq!(
            check.advice.as_deref(),
            Some("once mounted (`stagefs mount /nas/hf MOUNTPOINT`): export HF_HOME=MOUNTPOINT")
        );
        let hub = survey(Shape::HubCache, &[ModelKind::HfRepo]);
        assert!(shape_check(Path::new("/h"), &hub, false).advice.is_none());
        assert_eq!(
            usage(Shape::HubCache, Path::new("/m")),
            "export HF_HUB_CACHE=/m"
        );
        let folders = survey(Shape::ModelFolders, &[ModelKind::Folder, ModelKind::File]);
        let check = shape_check(Path::new("/models"), &folders, false);
        assert_eq!(
            check.summary,
            "/models: plain model folders holding 1 plain model folder, 1 GGUF file"
        );
        assert!(
            usage(Shape::ModelFolders, Path::new("/m")).starts_with("load models by path under /m")
        );
        let nothing = shape_check(Path::new("/x"), &survey(Shape::Unknown, &[]), true);
        assert_eq!(nothing.verdict, Verdict::Note);
        assert!(nothing.advice.unwrap_or_default().contains("model_dirs"));
    }
}
