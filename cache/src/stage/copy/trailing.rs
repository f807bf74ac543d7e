//! Checking a blob's copy against the sha256 its name carries, trailing behind the
//! copy on a thread of its own, and never holding it up.
//!
//! From a fast local disk sha256 is the slowest part of a blob's copy: it runs on one
//! core (1.2 GB/s on the H200 machine's CPU, 1.7 GB/s on the 2-core VM's) and cannot
//! be split within a file, while the disk reads 1.5 GB/s or more. Waiting for it put
//! a 4.7 GB shard's open 1.3 to 1.6 s behind `dd`'s read of it (docs/BENCHMARKS.md).
//! So from a local disk a blob's open is answered once its copy is whole and the
//! source unchanged, as any other file's is, and this check decides afterwards
//! whether the copy is committed (trusted by a restart) or dropped.
//!
//! It hashes what was written to the copy, mapped a step at a time, so the bytes it
//! checks are exactly the ones served, and nothing is copied into this process.

use std::fs::File;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, sync_channel};
use std::thread::Thread;
use std::time::Duration;

use memmap2::MmapOptions;
use sha2::{Digest as _, Sha256};

/// Bytes mapped and hashed at once.
const STEP: u64 = 8 << 20;

/// The longest the check sleeps when it has caught up with the copy: the copy wakes
/// it as it writes; this only bounds a missed wake-up.
const IDLE: Duration = Duration::from_millis(50);

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

/// What is done with the verdict, on the check's thread.
type Settle = Box<dyn FnOnce(Verdict) + Send>;

/// The sha256 of a copy being written, computed as the copy goes. Dropping it
/// before [`TrailingCheck::settle`] (a copy that failed) stops its thread.
#[derive(Debug)]
pub struct TrailingCheck {
    written: Arc<AtomicU64>,
    thread: Thread,
    finish: SyncSender<(u64, Settle)>,
}

impl TrailingCheck {
    /// Starts checking `copy` (a descriptor of the copy being written, from its
    /// start) against `expected`, a lowercase hex sha256.
    pub fn start(copy: File, expected: String) -> io::Result<TrailingCheck> {
        let written = Arc::new(AtomicU64::new(0));
        let (finish, finished) = sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("stagefs-check".into())
            .spawn({
                let written = Arc::clone(&written);
                move || run(&copy, &expected, &written, &finished)
            })?;
        Ok(TrailingCheck {
            written,
            thread: thread.thread().clone(),
            finish,
        })
    }

    /// The copy now holds its first `bytes` bytes.
    pub fn advance(&self, bytes: u64) {
        self.written.store(bytes, Ordering::Release);
        self.thread.unpark();
    }

    /// The copy is whole at `total` bytes: once they are hashed, `settle` gets the
    /// verdict, on the check's thread.
    pub fn settle(self, total: u64, settle: impl FnOnce(Verdict) + Send + 'static) {
        self.written.store(total, Ordering::Release);
        // The thread ends only once it has this, or once this is dropped.
        let _ = self.finish.send((total, Box::new(settle)));
        self.thread.unpark();
    }
}

fn run(copy: &File, expected: &str, written: &AtomicU64, finished: &Receiver<(u64, Settle)>) {
    let mut sha256 = Sha256::new();
    let mut hashed = 0u64;
    let mut end: Option<(u64, Settle)> = None;
    loop {
        let limit = match &end {
            Some((total, _)) => *total,
            None => written.load(Ordering::Acquire),
        };
        if hashed < limit {
            let step = STEP.min(limit - hashed);
            if let Err(e) = hash_range(copy, hashed, step, &mut sha256) {
                // Told once the copy is done, or never if it failed.
                if let Some((_, settle)) = end.or_else(|| finished.recv().ok()) {
                    settle(Verdict::Unreadable(e));
                }
                return;
            }
            hashed += step;
            continue;
        }
        if let Some((_, settle)) = end.take() {
            let found = format!("{:x}", sha256.finalize());
            settle(if found == expected {
                Verdict::Matches
            } else {
                Verdict::Differs
            });
            return;
        }
        match finished.try_recv() {
            Ok(told) => end = Some(told),
            Err(TryRecvError::Empty) => std::thread::park_timeout(IDLE),
            Err(TryRecvError::Disconnected) => return,
        }
    }
}

/// Feeds bytes `at..at + len` of `copy` to `sha256`.
fn hash_range(copy: &File, at: u64, len: u64, sha256: &mut Sha256) -> io::Result<()> {
    let len = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: the copy is the store's own file, which nothing truncates: the copy
    // only appends to it, and eviction unlinks it, which leaves this descriptor's
    // inode whole. Only bytes already written (below `written`) are mapped.
    let map = unsafe { MmapOptions::new().offset(at).len(len).map(copy)? };
    sha256.update(&map[..]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn sha256_hex(bytes: &[u8]) -> String {
        format!("{:x}", Sha256::digest(bytes))
    }

    /// Writes `bytes` to a file in pieces, advancing a check as it goes, and returns
    /// the verdict.
    fn check_while_writing(bytes: &[u8], expected: String) -> Verdict {
        let mut file = tempfile::tempfile().expect("temp");
        let check = TrailingCheck::start(file.try_clone().expect("dup"), expected).expect("start");
        let mut at = 0;
        for piece in bytes.chunks(3 << 20 | 17) {
            file.write_all(piece).expect("write");
            at += piece.len() as u64;
            check.advance(at);
        }
        let (tx, rx) = std::sync::mpsc::channel();
        check.settle(at, move |verdict| {
            let _ = tx.send(verdict);
        });
        rx.recv_timeout(Duration::from_secs(30)).expect("a verdict")
    }

    #[test]
    fn a_copy_is_found_to_match_its_name_only_if_every_byte_does() {
        let bytes: Vec<u8> = (0..(20u32 << 20) + 5).map(|i| (i % 251) as u8).collect();
        let named = sha256_hex(&bytes);
        assert!(matches!(
            check_while_writing(&bytes, named.clone()),
            Verdict::Matches
        ));
        let mut garbled = bytes.clone();
        garbled[17 << 20] ^= 1;
        assert!(matches!(
            check_while_writing(&garbled, named.clone()),
            Verdict::Differs
        ));
        // One byte short of what the name describes.
        assert!(matches!(
            check_while_writing(&bytes[..bytes.len() - 1], named),
            Verdict::Differs
        ));
        assert!(matches!(
            check_while_writing(b"", sha256_hex(b"")),
            Verdict::Matches
        ));
    }
}
