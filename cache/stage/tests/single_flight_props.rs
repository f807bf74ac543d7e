//! Property test of the stager's single flight against a simple model: whatever
//! sequence of source changes, concurrent stages and removals happens, every caller
//! of a stage gets exactly the bytes the source holds at that moment, and callers who
//! ask together share one copy: a file is copied once per version, and again only
//! after its copy was removed.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, UNIX_EPOCH};

use proptest::prelude::*;
use stagefs_source::SourceTree;
use stagefs_stage::{Staged, Stager};
use stagefs_store::Store;
use stagefs_store::budget::Budget;

#[derive(Debug, Clone)]
enum Op {
    /// Rewrite file `file` at the source with `len` bytes (a new version).
    Write { file: u8, len: usize },
    /// `callers` stages of file `file`, all at once.
    Stage { file: u8, callers: usize },
    /// Remove file `file`'s copy from the cache.
    Remove { file: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..3, 1usize..=300_000).prop_map(|(file, len)| Op::Write { file, len }),
        (0u8..3, 1usize..=6).prop_map(|(file, callers)| Op::Stage { file, callers }),
        (0u8..3).prop_map(|file| Op::Remove { file }),
    ]
}

/// What the model knows of one file.
#[derive(Debug, Default)]
struct Model {
    /// Its bytes at the source now.
    bytes: Vec<u8>,
    /// Its version at the source now.
    version: u64,
    /// The version whose copy the cache holds, if any.
    staged: Option<u64>,
}

fn name(file: u8) -> PathBuf {
    PathBuf::from(format!("m/file{file}.bin"))
}

/// Writes version `version` of `rel`: bytes that differ from every other version's,
/// and an mtime of its own, so the source's stamp changes even at the same length.
fn write_version(root: &Path, rel: &Path, len: usize, version: u64) -> Vec<u8> {
    let bytes: Vec<u8> = (0..len)
        .map(|i| (i as u64).wrapping_mul(31).wrapping_add(version * 7) as u8)
        .collect();
    let path = root.join(rel);
    fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    fs::write(&path, &bytes).expect("write");
    let mtime = UNIX_EPOCH + Duration::from_secs(1_700_000_000 + version);
    File::options()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_modified(mtime))
        .expect("set mtime");
    bytes
}

fn contents(staged: &Staged) -> Vec<u8> {
    let mut file = staged.file.as_ref();
    let mut out = Vec::new();
    file.seek(SeekFrom::Start(0)).expect("seek");
    file.read_to_end(&mut out).expect("read");
    out
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let src = tempfile::tempdir().expect("tempdir");
    let cache = tempfile::tempdir().expect("tempdir");
    let stager = Stager::new(
        SourceTree::new(src.path()).expect("source"),
        Store::open(cache.path(), Budget::default()).expect("store"),
        Arc::default(),
        runtime.handle().clone(),
    );
    let mut model: HashMap<u8, Model> = HashMap::new();
    let mut next_version = 0;
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Write { file, len } => {
                next_version += 1;
                let bytes = write_version(src.path(), &name(file), len, next_version);
                let known = model.entry(file).or_default();
                known.bytes = bytes;
                known.version = next_version;
            }
            Op::Stage { file, callers } => {
                let Some(known) = model.get_mut(&file) else {
                    continue;
                };
                let before = stager.metrics().stage_copies.load(Ordering::SeqCst);
                let rel = name(file);
                let results = runtime.block_on(async {
                    let calls = (0..callers).map(|_| {
                        let (stager, rel) = (stager.clone(), rel.clone());
                        tokio::spawn(async move { stager.stage(&rel).await })
                    });
                    futures::future::join_all(calls).await
                });
                for result in results {
                    let staged = result.expect("the task").map_err(|e| {
                        TestCaseError::fail(format!("step {step}: staging {rel:?}: {e}"))
                    })?;
                    prop_assert!(
                        contents(&staged) == known.bytes,
                        "step {step}: a caller got bytes other than the source's"
                    );
                }
                let copies = stager.metrics().stage_copies.load(Ordering::SeqCst) - before;
                let expected = u64::from(known.staged != Some(known.version));
                prop_assert_eq!(
                    copies,
                    expected,
                    "step {}: {} callers of {:?}, staged {:?} at version {}",
                    step,
                    callers,
                    rel,
                    known.staged,
                    known.version
                );
                known.staged = Some(known.version);
            }
            Op::Remove { file } => {
                stager.remove_copy(&name(file)).map_err(|e| {
                    TestCaseError::fail(format!("step {step}: removing {file}: {e}"))
                })?;
                if let Some(known) = model.get_mut(&file) {
                    known.staged = None;
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn concurrent_stages_share_one_copy_per_version_and_serve_the_source(
        ops in prop::collection::vec(op(), 1..16)
    ) {
        run(ops)?;
    }
}
