//! The verifiers of exclusive CREATEs, kept so that a retransmitted one succeeds.
//!
//! A Mac sends `open(O_CREAT|O_EXCL)` as an EXCLUSIVE CREATE, which the export makes
//! an `O_EXCL` create on the source: of two programs racing to create one name,
//! exactly one succeeds, the other gets EXIST (a lock file such as git's
//! `index.lock`). The call carries a verifier: RFC 1813 (3.3.8) has a CREATE with
//! the verifier that made the file succeed again with that file, as it is the same
//! call sent again (a reply lost, a reconnect), and one with another verifier fail
//! with EXIST. Servers usually store the verifier in the new file's times; a source
//! of any kind (SMB, sshfs) may not keep times exactly, so the verifiers are kept
//! here, in memory, by directory and name with the inode made, for [`KEPT_FOR`],
//! and a verifier answers only while its name still names that inode.
//!
//! What is given up: a retransmission after [`KEPT_FOR`], or after the server
//! restarted, gets EXIST, and the client reports that the file exists. Clients
//! resend within seconds; and a retry after a JUKEBOX is answered by the connection
//! front with the first call's own result, without reaching here (`retries`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use stagefs_source::locks::lock;

/// How long a verifier answers for the file it made: far past a client's resends.
pub(crate) const KEPT_FOR: Duration = Duration::from_secs(300);

/// The most verifiers kept; past them the oldest goes. Each is a few dozen bytes.
pub(crate) const MOST_KEPT: usize = 4096;

/// Where a file was made: its directory's inode and its name.
type Place = (u64, Vec<u8>);

/// A file an exclusive CREATE made.
#[derive(Debug, Clone, Copy)]
struct Made {
    verifier: [u8; 8],
    ino: u64,
    at: Instant,
}

/// The exclusive CREATEs made lately, by place.
#[derive(Debug, Default)]
pub(crate) struct Verifiers {
    made: Mutex<HashMap<Place, Made>>,
}

impl Verifiers {
    /// An exclusive CREATE with `verifier` made `ino` as `name` in `dir`.
    pub(crate) fn made(&self, dir: u64, name: &[u8], verifier: [u8; 8], ino: u64) {
        let mut made = lock(&self.made);
        if made.len() >= MOST_KEPT {
            made.retain(|_, made| made.at.elapsed() < KEPT_FOR);
        }
        if made.len() >= MOST_KEPT {
            let oldest = made
                .iter()
                .min_by_key(|(_, m)| m.at)
                .map(|(p, _)| p.clone());
            if let Some(oldest) = oldest {
                made.remove(&oldest);
            }
        }
        let at = Instant::now();
        made.insert((dir, name.to_vec()), Made { verifier, ino, at });
    }

    /// The inode an exclusive CREATE with `verifier` made as `name` in `dir`, if
    /// one did within [`KEPT_FOR`]. The caller checks that the name names it still.
    pub(crate) fn made_with(&self, dir: u64, name: &[u8], verifier: [u8; 8]) -> Option<u64> {
        let made = lock(&self.made);
        let made = made.get(&(dir, name.to_vec()))?;
        (made.verifier == verifier && made.at.elapsed() < KEPT_FOR).then_some(made.ino)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.made).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verifier_answers_for_its_own_file_alone() {
        let verifiers = Verifiers::default();
        verifiers.made(1, b"lock", [7; 8], 42);
        assert_eq!(verifiers.made_with(1, b"lock", [7; 8]), Some(42));
        assert_eq!(verifiers.made_with(1, b"lock", [8; 8]), None);
        assert_eq!(verifiers.made_with(1, b"other", [7; 8]), None);
        assert_eq!(verifiers.made_with(2, b"lock", [7; 8]), None);
        verifiers.made(1, b"lock", [8; 8], 43);
        assert_eq!(verifiers.made_with(1, b"lock", [7; 8]), None, "made again");
        assert_eq!(verifiers.made_with(1, b"lock", [8; 8]), Some(43));
    }

    #[test]
    fn no_more_than_most_kept_verifiers_are_kept_and_the_newest_stays() {
        let verifiers = Verifiers::default();
        for i in 0..=MOST_KEPT as u64 {
            verifiers.made(1, &i.to_be_bytes(), [1; 8], i);
        }
        assert_eq!(verifiers.len(), MOST_KEPT);
        let newest = (MOST_KEPT as u64).to_be_bytes();
        assert_eq!(
            verifiers.made_with(1, &newest, [1; 8]),
            Some(MOST_KEPT as u64)
        );
    }
}
