//! The on-disk index format is pinned: if this test fails, the format changed, so
//! bump `INDEX_VERSION` (and the layout directory) and write a new golden file. A
//! field added with a default, which every index written before it still reads
//! as, keeps the version; the golden file from before it must then still be read.

use std::path::PathBuf;

use stagefs_source::Stamp;
use stagefs_store::index::{CopyId, Entry, INDEX_VERSION, Record};

const GOLDEN: &str = include_str!("golden/index-v1.jsonl");

/// The same records as written before a stamp had the source's inode and change
/// time: still read (as version 1, since what it holds is a subset), with both 0,
/// which no file on a source that has inodes matches, so those copies are staged
/// again rather than trusted.
const GOLDEN_BEFORE_INODES: &str = include_str!("golden/index-v1-before-inodes.jsonl");

fn records() -> Vec<Record> {
    let key = "sha256-e46fde39aab19ef2e6d9b2f3421106cb6bf4f35b381c7f8a7fa9ab5b13c9bfe8";
    vec![
        Record::Header { version: 1 },
        Record::Put {
            key: key.into(),
            entry: Entry {
                source: PathBuf::from(
                    "models--org--name/blobs/e46fde39aab19ef2e6d9b2f3421106cb6bf4f35b381c7f8a7fa9ab5b13c9bfe8",
                ),
                stamp: Stamp {
                    size: 33_551_592,
                    mtime_ns: 1_764_496_000_123_456_789,
                    ino: 2_097_153,
                    ctime_ns: 1_764_496_000_223_456_789,
                },
                blake3: Some(
                    "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262".into(),
                ),
                last_use: 1_764_496_100,
                copy: CopyId {
                    ino: 1_048_577,
                    ctime_ns: 1_764_496_001_000_000_000,
                },
            },
        },
        Record::Touch {
            key: key.into(),
            last_use: 1_764_496_200,
        },
        Record::Remove { key: key.into() },
    ]
}

#[test]
fn index_format_matches_the_golden_file() -> Result<(), serde_json::Error> {
    assert_eq!(INDEX_VERSION, 1, "a new version needs a new golden file");
    let written: String = records()
        .iter()
        .map(|r| serde_json::to_string(r).map(|line| line + "\n"))
        .collect::<Result<_, _>>()?;
    assert_eq!(written, GOLDEN);
    let read: Vec<Record> = GOLDEN
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    assert_eq!(read, records());
    Ok(())
}

#[test]
fn an_index_from_before_inodes_counted_is_read_with_none() -> Result<(), serde_json::Error> {
    let read: Vec<Record> = GOLDEN_BEFORE_INODES
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let Record::Put { entry, .. } = &read[1] else {
        panic!("a put record: {read:?}");
    };
    assert_eq!(
        (entry.stamp.size, entry.stamp.ino, entry.stamp.ctime_ns),
        (33_551_592, 0, 0)
    );
    Ok(())
}
