//! What a prefetch is asked to stage, and how each of its files stands: the
//! request and the stream of progress lines of `stagefs prefetch`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::values::Remedy;

/// What to prefetch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Target {
    /// A model: an HF repository (`org/name`) at a revision (a ref or a commit;
    /// default `main`), or a model folder or GGUF file by its path or the end of it.
    Model {
        /// Repository id, or a folder's or file's path.
        id: String,
        /// Ref or commit (repositories only).
        revision: Option<String>,
    },
    /// A model, snapshot or other directory, or a file, relative to the source root.
    Path {
        /// The path.
        path: PathBuf,
    },
}

/// Where one file of a prefetch stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum FileState {
    /// Not started.
    Waiting,
    /// Being copied.
    Copying,
    /// Copied now.
    Staged,
    /// Was staged already.
    AlreadyStaged,
    /// Could not be staged.
    Failed {
        /// Why.
        error: String,
        /// What would let it be staged, for the front end to name.
        #[serde(default)]
        remedy: Option<Remedy>,
    },
}

/// Progress of one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileProgress {
    /// Source path.
    pub path: PathBuf,
    /// Its size.
    pub total: u64,
    /// Bytes copied so far.
    pub copied: u64,
    /// Where it stands.
    #[serde(flatten)]
    pub state: FileState,
}

impl FileProgress {
    /// Whether nothing more will happen to this file.
    pub fn is_settled(&self) -> bool {
        matches!(
            self.state,
            FileState::Staged | FileState::AlreadyStaged | FileState::Failed { .. }
        )
    }
}
