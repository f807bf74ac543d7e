//! The `shape` check: which of the layouts people keep models in a source has (an
//! HF_HOME, a hub cache, plain model folders), what it holds, and how programs are
//! pointed at a mount of it. `mount` and `run` use the same words.

use std::path::Path;
use std::time::Duration;

use stagefs_cache::models::{Catalog, ModelKind, SEARCH_DEPTH, Shape, Survey};

use super::report::Check;
use super::worker::{self, Task};

/// The `shape` check for the directory at `path`. With `advise_mounting`, the
/// directory is not mounted yet, so the advice says how to use it once it is.
pub(crate) fn shape_check(path: &Path, survey: &Survey, advise_mounting: bool) -> Check {
    let shown = path.display();
    let stopped = match survey.catalog.complete {
        true => "",
        false => "; the search stopped early, the source is large",
    };
    if survey.shape == Shape::Unknown {
        return Check::note("shape", format!(
            "{shown}: no model found (no models--org--name, no folder of weight files with a config.json or index, no .gguf file within {SEARCH_DEPTH} levels{stopped})"
        ))
        .advise("models deeper down need `model_dirs` in the config file (or --model-dir); check the path");
    }
    let (what, holding) = (survey.shape.describe(), contents(&survey.catalog));
    let check = Check::ok(
        "shape",
        format!("{shown}: {what} holding {holding}{stopped}"),
    );
    if !advise_mounting {
        return check;
    }
    let usage = usage(survey.shape, Path::new("MOUNTPOINT"));
    check.advise(format!(
        "once mounted (`stagefs mount {shown} MOUNTPOINT`): {usage}"
    ))
}

/// `2 HF repositories, 1 plain model folder`.
fn contents(catalog: &Catalog) -> String {
    let kinds = [ModelKind::HfRepo, ModelKind::Folder, ModelKind::File];
    let counted = kinds.map(|kind| (kind, catalog.count(kind)));
    let parts: Vec<String> = counted
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(kind, n)| match (kind, n) {
            (ModelKind::HfRepo, 1) => "1 HF repository".to_string(),
            (ModelKind::HfRepo, n) => format!("{n} HF repositories"),
            (kind, 1) => format!("1 {}", kind.describe()),
            (kind, n) => format!("{n} {}s", kind.describe()),
        })
        .collect();
    if parts.is_empty() {
        "no model yet".to_string()
    } else {
        parts.join(", ")
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
    let gathered = worker::gather(vec![Task::Shape(path.to_path_buf())], timeout);
    got!(gathered, Shape)?.clone().ok()
}

#[cfg(test)]
mod tests {
    use stagefs_cache::models::ModelRef;

    use super::*;
    use crate::doctor::report::Verdict;

    fn check(shape: Shape, kinds: &[ModelKind], advise: bool) -> Check {
        let model = |(i, kind): (usize, &ModelKind)| {
            let (id, path) = (format!("m{i}"), format!("m{i}").into());
            ModelRef {
                id,
                kind: *kind,
                path,
            }
        };
        let models = kinds.iter().enumerate().map(model).collect();
        let catalog = Catalog {
            models,
            complete: true,
        };
        shape_check(Path::new("/nas/hf"), &Survey { shape, catalog }, advise)
    }

    #[test]
    fn each_shape_is_named_with_what_it_holds_and_how_to_use_it() {
        let home = check(Shape::HfHome, &[ModelKind::HfRepo, ModelKind::HfRepo], true);
        assert_eq!(
            home.summary,
            "/nas/hf: an HF_HOME holding 2 HF repositories"
        );
        let advice = "once mounted (`stagefs mount /nas/hf MOUNTPOINT`): export HF_HOME=MOUNTPOINT";
        assert_eq!(home.advice.as_deref(), Some(advice));
        assert!(
            check(Shape::HubCache, &[ModelKind::HfRepo], false)
                .advice
                .is_none()
        );
        assert_eq!(
            usage(Shape::HubCache, Path::new("/m")),
            "export HF_HUB_CACHE=/m"
        );
        let folders = check(
            Shape::ModelFolders,
            &[ModelKind::Folder, ModelKind::File],
            false,
        );
        let expected = "/nas/hf: plain model folders holding 1 plain model folder, 1 GGUF file";
        assert_eq!(folders.summary, expected);
        let by_path = usage(Shape::ModelFolders, Path::new("/m"));
        assert!(by_path.starts_with("load models by path under /m"));
        let nothing = check(Shape::Unknown, &[], true);
        assert_eq!(nothing.verdict, Verdict::Note);
        assert!(nothing.advice.unwrap_or_default().contains("model_dirs"));
    }
}
