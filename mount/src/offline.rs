//! Which parts of a model a loader reaches, for making it offline-complete
//! (`prefetch`) and telling whether it is (`status`). The walking and the checking
//! are the stage layer's (`stagefs_stage::offline`); this says where to walk.

use std::path::{Path, PathBuf};

use stagefs_control::{ModelKind, ModelStatus, OfflineReadiness};
use stagefs_layout::models::ModelRef;
use stagefs_stage::Stager;
use stagefs_stage::answers::Answers;
use stagefs_stage::answers::Remembered;
use stagefs_stage::offline::{Need, Part, TOKEN_FILE};

/// What a prefetch of `model` asks the source for besides its weights: all of a
/// repository (its small blobs, refs, every snapshot's links and the `.no_exist`
/// markers of names a revision lacks) or all of a folder. A lone file: nothing.
pub fn learned_parts(model: &ModelRef) -> Vec<Part> {
    match model.kind {
        ModelKind::HfRepo | ModelKind::Folder => vec![Part::whole(&model.path)],
        ModelKind::File => Vec::new(),
    }
}

/// What a loader of revision `revision` of repository `repo` needs known: the
/// names on its way (`refs/main`, `snapshots`, `blobs`, the `.no_exist` markers of
/// names the revision lacks, if there are any), the snapshot's listing, its links
/// and the blobs they lead to.
fn revision_needs(answers: &Answers, repo: &Path, revision: &str) -> Vec<Need> {
    let name = |path: PathBuf| Need::Name { path, whole: false };
    let mut needs: Vec<Need> = ["refs", "refs/main", "snapshots", "blobs", ".no_exist"]
        .into_iter()
        .map(|n| name(repo.join(n)))
        .collect();
    needs.push(Need::Listing {
        dir: repo.join("snapshots").join(revision),
        whole: true,
    });
    let markers = repo.join(".no_exist");
    if remembered_dir(answers, &markers) {
        needs.push(Need::Name {
            path: markers.join(revision),
            whole: true,
        });
    }
    needs
}

/// What a loader reaching `model_path` needs known on the way: each directory
/// above it, and, in an HF_HOME, the access token huggingface_hub reads first.
fn way_needs(answers: &Answers, model_path: &Path) -> Vec<Need> {
    let mut needs: Vec<Need> = model_path
        .ancestors()
        .skip(1)
        .filter(|a| !a.as_os_str().is_empty())
        .map(|a| Need::Name {
            path: a.to_path_buf(),
            whole: false,
        })
        .collect();
    // A whole HF_HOME: its hub/ lies beside the token.
    if remembered_dir(answers, Path::new("hub")) {
        needs.push(Need::Name {
            path: PathBuf::from(TOKEN_FILE),
            whole: false,
        });
    }
    needs
}

/// Whether the source answered that `path` is a directory.
fn remembered_dir(answers: &Answers, path: &Path) -> bool {
    matches!(answers.entry(path), Some(Remembered::Entry(meta)) if meta.is_dir())
}

/// Fills in `model.offline` from the cache alone: per revision of a repository the
/// cache knows of, or once for a folder.
pub fn fill_readiness(stager: &Stager, model: &mut ModelStatus) {
    let answers = stager.answers();
    let way = way_needs(answers, &model.path);
    let readiness = |revision: Option<String>, mut needs: Vec<Need>| {
        needs.extend(way.iter().cloned());
        let gaps = stager.offline_gaps(&needs);
        OfflineReadiness {
            revision,
            ready: gaps.count == 0,
            missing: gaps.examples,
            missing_count: gaps.count,
        }
    };
    model.offline = match model.kind {
        ModelKind::Folder => vec![readiness(
            None,
            vec![Need::Listing {
                dir: model.path.clone(),
                whole: true,
            }],
        )],
        ModelKind::File => Vec::new(),
        ModelKind::HfRepo => {
            let snapshots = model.path.join("snapshots");
            let mut revisions: Vec<String> = answers
                .listing(&snapshots)
                .unwrap_or_default()
                .into_iter()
                .filter(|(_, meta)| meta.is_dir())
                .filter_map(|(name, _)| name.into_string().ok())
                .collect();
            // Without the listing of snapshots/, the revisions a loader went into.
            if revisions.is_empty() {
                revisions = model
                    .revisions
                    .iter()
                    .map(|r| r.revision.clone())
                    .filter(|r| answers.listing(&snapshots.join(r)).is_some())
                    .collect();
            }
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
                        let needs = revision_needs(answers, &model.path, &rev);
                        readiness(Some(rev), needs)
                    })
                    .collect()
            }
        }
    };
}
