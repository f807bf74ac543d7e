//! Startup cost of a store with many entries: replaying and compacting the index and
//! reconciling it with the data files. Baseline, measured in the same run: listing
//! and stat-ing the same data files, the least any reconciliation must do.
//!
//! Run: `cargo bench -p stagefs-cache --bench startup [-- ENTRIES]`

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use stagefs_source::Stamp;
use stagefs_store::index::{CopyId, Entry, INDEX_VERSION, Record};
use stagefs_store::{Budget, Key, Store};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let entries: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(10_000);
    let dir = tempfile::tempdir()?;
    populate(dir.path(), entries)?;
    let baseline = median(5, || list_and_stat(&dir.path().join("v1/data")))?;
    let open = median(5, || {
        Store::open(dir.path(), Budget::default())
            .map(drop)
            .map_err(Into::into)
    })?;
    let store = Store::open(dir.path(), Budget::default())?;
    assert_eq!(store.usage()?.entries, entries, "every entry survived");
    println!("store startup with {entries} entries");
    println!(
        "  list+stat data files (baseline): {:>8.1} ms",
        ms(baseline)
    );
    println!("  Store::open:                     {:>8.1} ms", ms(open));
    println!(
        "  ratio open/baseline:             {:>8.2}",
        ms(open) / ms(baseline)
    );
    Ok(())
}

fn populate(cache: &Path, entries: usize) -> Result<(), Box<dyn std::error::Error>> {
    let data = cache.join("v1/data");
    fs::create_dir_all(&data)?;
    let mut index = std::io::BufWriter::new(fs::File::create(cache.join("v1/index.jsonl"))?);
    writeln!(
        index,
        "{}",
        serde_json::to_string(&Record::Header {
            version: INDEX_VERSION
        })?
    )?;
    for i in 0..entries {
        let source = PathBuf::from(format!("models--org--m{}/blobs/file{i}", i % 50));
        let key = Key::for_source_path(&source);
        let bytes = format!("{i}");
        fs::write(data.join(key.as_str()), &bytes)?;
        let entry = Entry {
            source,
            stamp: Stamp {
                size: bytes.len() as u64,
                mtime_ns: i as i64,
                ..Stamp::default()
            },
            blake3: Some(blake3::hash(bytes.as_bytes()).to_hex().to_string()),
            last_use: i as u64,
            copy: CopyId::default(),
        };
        let put = Record::Put {
            key: key.as_str().to_string(),
            entry,
        };
        writeln!(index, "{}", serde_json::to_string(&put)?)?;
    }
    Ok(())
}

fn list_and_stat(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    for entry in fs::read_dir(dir)? {
        entry?.metadata()?;
    }
    Ok(())
}

fn median(
    runs: usize,
    mut f: impl FnMut() -> Result<(), Box<dyn std::error::Error>>,
) -> Result<Duration, Box<dyn std::error::Error>> {
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed());
    }
    times.sort();
    Ok(times[runs / 2])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
