//! Checking a blob's copy against the sha256 its name carries, after the copy and
//! once the machine can spare a core for it, never holding up the copy or the load.
//!
//! From a fast local disk sha256 is the slowest part of a blob's copy: it runs on one
//! core (1.2 GB/s on the H200 machine's CPU, 1.7 GB/s on the 2-core VM's) and cannot
//! be split within a file, while the disk reads 1.5 GB/s or more. Waiting for it put
//! a 4.7 GB shard's open 1.3 to 1.6 s behind `dd`'s read of it (docs/BENCHMARKS.md).
//! So from a local disk a blob's open is answered once its copy is whole and the
//! source unchanged, as any other file's is, and this check decides afterwards
//! whether the copy is committed (trusted by a restart) or dropped.
//!
//! Hashing behind the copy, as it was written, still took a core from a loader that
//! needs both of a 2-core machine's: its cold loads took 1.32x a direct one, and 0.87
//! of that without the hash. So the check waits until its caller says it may start
//! (when no copy has run for a moment, or someone waits for the verdict), and pauses
//! between steps whenever it is told to wait again.
//!
//! It hashes what was written to the copy, mapped a step at a time, so the bytes it
//! checks are exactly the ones served, and nothing is copied into this process.

use std::fs::File;
use std::io;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::time::Duration;

use memmap2::MmapOptions;
use sha2::{Digest as _, Sha256};

/// Bytes mapped and hashed at once: also how often the check asks whether to go on.
const STEP: u64 = 8 << 20;

/// How often a check told to wait asks again.
const WAIT: Duration = Duration::from_millis(50);

/// What the check found.
#[derive(Debug)]
pub enum Verdict {
    /// The copy's sha256 is the one its name carries.
    Matches,
    /// It is not.
    Differs,
    /// The copy could not be read back.
    Unreadable(io::Error),
}

/// Whether the check may hash now; asked before each step.
type MayRun = Box<dyn Fn() -> bool + Send>;

/// What is done with the verdict, on the check's thread.
type Settle = Box<dyn FnOnce(Verdict) + Send>;

/// What the check is told once the copy is whole.
struct Whole {
    total: u64,
    may_run: MayRun,
    settle: Settle,
}

/// A check of a copy being written against the sha256 in its name, on a thread of its
/// own, started before the copy so that a machine that cannot start a thread fails
/// the copy rather than leaving it unchecked. Dropping it before
/// [`NameCheck::settle`] (a copy that failed) stops its thread.
#[derive(Debug)]
pub struct NameCheck {
    whole: SyncSender<Whole>,
}

impl NameCheck {
    /// Starts the check of `copy` (a descriptor of the copy being written) against
    /// `expected`, a lowercase hex sha256: it waits for [`NameCheck::settle`].
    pub fn start(copy: File, expected: String) -> io::Result<NameCheck> {
        let (whole, told) = sync_channel(1);
        std::thread::Builder::new()
            .name("stagefs-check".into())
            .spawn(move || run(&copy, &expected, &told))?;
        Ok(NameCheck { whole })
    }

    /// The copy is whole at `total` bytes: its bytes are hashed while `may_run` says
    /// so, and `settle` gets the verdict, on the check's thread.
    pub fn settle(
        self,
        total: u64,
        may_run: impl Fn() -> bool + Send + 'static,
        settle: impl FnOnce(Verdict) + Send + 'static,
    ) {
        // The thread ends only once it has this, or once this is dropped.
        let _ = self.whole.send(Whole {
            total,
            may_run: Box::new(may_run),
            settle: Box::new(settle),
        });
    }
}

fn run(copy: &File, expected: &str, told: &Receiver<Whole>) {
    let Ok(Whole {
        total,
        may_run,
        settle,
    }) = told.recv()
    else {
        return; // the copy failed
    };
    let mut sha256 = Sha256::new();
    let mut hashed = 0u64;
    while hashed < total {
        if !may_run() {
            std::thread::sleep(WAIT);
            continue;
        }
        let step = STEP.min(total - hashed);
        if let Err(e) = hash_range(copy, hashed, step, &mut sha256) {
            settle(Verdict::Unreadable(e));
            return;
        }
        hashed += step;
    }
    let found = format!("{:x}", sha256.finalize());
    settle(if found == expected {
        Verdict::Matches
    } else {
        Verdict::Differs
    });
}

/// Feeds bytes `at..at + len` of `copy` to `sha256`.
fn hash_range(copy: &File, at: u64, len: u64, sha256: &mut Sha256) -> io::Result<()> {
    let len = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: the copy is the store's own file, which nothing truncates or writes
    // once it is whole (committed copies are read-only), and eviction unlinks it,
    // which leaves this descriptor's inode whole. Only its first `total` bytes, all
    // written, are mapped.
    let map = unsafe { MmapOptions::new().offset(at).len(len).map(copy)? };
    sha256.update(&map[..]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    fn sha256_hex(bytes: &[u8]) -> String {
        format!("{:x}", Sha256::digest(bytes))
    }

    /// Writes `bytes` to a file, checks it against `expected` while `may_run` allows,
    /// and returns the verdict.
    fn check(
        bytes: &[u8],
        expected: String,
        may_run: impl Fn() -> bool + Send + 'static,
    ) -> Verdict {
        let mut file = tempfile::tempfile().expect("temp");
        let check = NameCheck::start(file.try_clone().expect("dup"), expected).expect("start");
        file.write_all(bytes).expect("write");
        let (tx, rx) = std::sync::mpsc::channel();
        check.settle(bytes.len() as u64, may_run, move |verdict| {
            let _ = tx.send(verdict);
        });
        rx.recv_timeout(Duration::from_secs(30)).expect("a verdict")
    }

    #[test]
    fn a_copy_is_found_to_match_its_name_only_if_every_byte_does() {
        let bytes: Vec<u8> = (0..(20u32 << 20) + 5).map(|i| (i % 251) as u8).collect();
        let named = sha256_hex(&bytes);
        let always = || true;
        assert!(matches!(
            check(&bytes, named.clone(), always),
            Verdict::Matches
        ));
        let mut garbled = bytes.clone();
        garbled[17 << 20] ^= 1;
        assert!(matches!(
            check(&garbled, named.clone(), always),
            Verdict::Differs
        ));
        // One byte short of what the name describes.
        assert!(matches!(
            check(&bytes[..bytes.len() - 1], named, always),
            Verdict::Differs
        ));
        assert!(matches!(
            check(b"", sha256_hex(b""), always),
            Verdict::Matches
        ));
    }

    #[test]
    fn a_check_hashes_nothing_while_told_to_wait_and_finishes_once_allowed() {
        let bytes: Vec<u8> = (0..(3u32 << 20) * 8 + 1).map(|i| (i % 253) as u8).collect();
        let (allowed, asked) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let mut file = tempfile::tempfile().expect("temp");
        let check =
            NameCheck::start(file.try_clone().expect("dup"), sha256_hex(&bytes)).expect("start");
        file.write_all(&bytes).expect("write");
        let (tx, rx) = std::sync::mpsc::channel();
        let may_run = {
            let (allowed, asked) = (Arc::clone(&allowed), Arc::clone(&asked));
            move || {
                asked.fetch_add(1, Ordering::SeqCst);
                allowed.load(Ordering::SeqCst)
            }
        };
        check.settle(bytes.len() as u64, may_run, move |verdict| {
            let _ = tx.send(verdict);
        });
        // Asked several times, never allowed: no verdict.
        while asked.load(Ordering::SeqCst) < 3 {
            std::thread::sleep(WAIT);
        }
        assert!(rx.try_recv().is_err(), "no verdict while told to wait");
        allowed.store(true, Ordering::SeqCst);
        let verdict = rx.recv_timeout(Duration::from_secs(30)).expect("a verdict");
        assert!(matches!(verdict, Verdict::Matches), "{verdict:?}");
    }
}
