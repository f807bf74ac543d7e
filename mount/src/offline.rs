//! Which parts of a model a loader reaches, for making it offline-complete
//! (`prefetch`) and telling whether it is (`status`). The walking and the checking
//! are the stage layer's (`stagefs_stage::offline`); this says where to walk.

use std::path::Path;

use stagefs_control::{ModelKind, ModelStatus, OfflineReadiness};
use stagefs_layout::models::ModelRef;
use stagefs_stage::Stager;
use stagefs_stage::answers::Answers;
use stagefs_stage::offline::Part;

/// What a prefetch of `model` asks the source for besides its weights: all of a
/// repository (its small blobs, refs, every snapshot's links and the `.no_exist`
/// markers of names a revision lacks) or all of a folder. A lone file: nothing.
pub fn learned_parts(model: &ModelRef) -> Vec<Part> {
    match model.kind {
        ModelKind::HfRepo | ModelKind::Folder => vec![Part::whole(&model.path)],
        ModelKind::File => Vec::new(),
    }
}

/// What a loader of revision `revision` of repository `repo` reaches: the
/// repository's listing, its refs, the snapshot's links (and the blobs they lead to)
/// and, if there are any, the markers of names it lacks.
fn revision_parts(answers: &Answers, repo: &Path, revision: &str) -> Vec<Part> {
    let mut parts = vec![
        Part::listing(repo),
        Part::whole(repo.join("refs")),
        Part::listing(repo.join("snapshots")),
        Part::whole(repo.join("snapshots").join(revision)),
    ];
    let no_exist = repo.join(".no_exist");
    if answers
        .listing(repo)
        .is_some_and(|listed| listed.iter().any(|(name, _)| name == ".no_exist"))
    {
        parts.push(Part::whole(no_exist));
    }
    parts
}

/// Fills in `model.offline` from the cache alone: per revision of a repository the
/// cache knows of, or once for a folder. `min` is the mount's smallest staged size.
pub fn fill_readiness(stager: &Stager, model: &mut ModelStatus, min: u64) {
    let answers = stager.answers();
    let readiness = |revision: Option<String>, parts: Vec<Part>| {
        let gaps = stager.offline_gaps(&parts, min);
        OfflineReadiness {
            revision,
            ready: gaps.count == 0,
            missing: gaps.examples,
            missing_count: gaps.count,
        }
    };
    model.offline = match model.kind {
        ModelKind::Folder => vec![readiness(None, vec![Part::whole(&model.path)])],
        ModelKind::File => Vec::new(),
        ModelKind::HfRepo => {
            let snapshots = model.path.join("snapshots");
            let revisions: Vec<String> = answers
                .listing(&snapshots)
                .unwrap_or_default()
                .into_iter()
                .filter(|(_, meta)| meta.is_dir())
                .filter_map(|(name, _)| name.into_string().ok())
                .collect();
            if revisions.is_empty() {
                vec![OfflineReadiness {
                    revision: None,
                    ready: false,
                    missing: vec![snapshots],
                    missing_count: 1,
                }]
            } else {
                revisions
                    .into_iter()
                    .map(|rev| {
                        let parts = revision_parts(answers, &model.path, &rev);
                        readiness(Some(rev), parts)
                    })
                    .collect()
            }
        }
    };
}
