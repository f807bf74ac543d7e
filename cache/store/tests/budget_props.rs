//! Property test against a simple model: whatever sequence of stages, opens and
//! closes happens, the cache never exceeds its budget, never evicts a copy that is
//! open, and refuses a copy only when the open copies leave no room for it.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use stagefs_source::Stamp;
use stagefs_store::OpenCopy;
use stagefs_store::index::CopyId;
use stagefs_store::{Budget, Entry, Key, Store, StoreError};

const MAX: u64 = 1000;

#[derive(Debug, Clone)]
enum Op {
    /// Stage file `file` at `size` bytes and keep it open.
    StageAndOpen { file: u8, size: u64 },
    /// Open file `file` if it is staged.
    Open { file: u8 },
    /// Close the `n`-th open handle.
    Close { n: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..8, 1u64..=400).prop_map(|(file, size)| Op::StageAndOpen { file, size }),
        (0u8..8).prop_map(|file| Op::Open { file }),
        (0usize..8).prop_map(|n| Op::Close { n }),
    ]
}

fn name(file: u8) -> PathBuf {
    PathBuf::from(format!("models--o--m/blobs/file{file}"))
}

fn stage(store: &Store, rel: &Path, size: u64, version: i64) -> Result<OpenCopy, StoreError> {
    let key = Key::for_source_path(rel);
    let reservation = store.reserve(&key, size, rel, true)?;
    let mut tmp = store.create_temp()?;
    let bytes = vec![version as u8; size as usize];
    tmp.write_all(&bytes).expect("write temp");
    let entry = Entry {
        source: rel.to_path_buf(),
        stamp: Stamp {
            size,
            mtime_ns: version,
            ..Stamp::default()
        },
        blake3: Some(blake3::hash(&bytes).to_hex().to_string()),
        last_use: 0,
        copy: CopyId::default(),
    };
    store.commit(&key, tmp, entry, reservation)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn budget_holds_and_open_copies_stay(ops in proptest::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().expect("tempdir");
        let budget = Budget { max_size: Some(MAX), min_free: None };
        let store = Store::open(dir.path(), budget).expect("store");
        let mut open: Vec<(u8, OpenCopy)> = Vec::new();
        // The model: the size of each file's current copy. Open handles pin a file's
        // current copy, whichever version they opened.
        let mut current: HashMap<u8, u64> = HashMap::new();
        for (version, op) in ops.into_iter().enumerate() {
            match op {
                Op::StageAndOpen { file, size } => {
                    let pinned_bytes: u64 = current
                        .iter()
                        .filter(|(f, _)| **f != file && open.iter().any(|(o, _)| o == *f))
                        .map(|(_, size)| size)
                        .sum();
                    match stage(&store, &name(file), size, version as i64) {
                        Ok(hit) => {
                            current.insert(file, size);
                            open.push((file, hit));
                        }
                        Err(StoreError::NoRoom { .. }) => {
                            prop_assert!(pinned_bytes + size > MAX,
                                "refused although {pinned_bytes} pinned + {size} fits");
                        }
                        Err(StoreError::InUse { .. }) => {}
                        Err(e) => prop_assert!(false, "unexpected error {e}"),
                    }
                }
                Op::Open { file } => {
                    let key = Key::for_source_path(&name(file));
                    if let Some(hit) = store.lookup(&key, |_| true) {
                        open.push((file, hit));
                    }
                }
                Op::Close { n } => {
                    if !open.is_empty() {
                        open.remove(n % open.len());
                    }
                }
            }
            current.retain(|f, _| store.contains(&Key::for_source_path(&name(*f))));
            let usage = store.usage().expect("usage");
            prop_assert!(usage.used <= MAX, "over budget: {usage:?}");
            let listed: u64 = store.entries().iter().map(|e| e.entry.stamp.size).sum();
            prop_assert_eq!(listed, usage.used);
            for (file, hit) in &open {
                let key = Key::for_source_path(&name(*file));
                prop_assert!(store.contains(&key), "open file{file} ({} bytes) was evicted",
                    hit.entry.stamp.size);
            }
        }
    }
}
