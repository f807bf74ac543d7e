//! What the `nfs3_server` library drops of a call, kept by the front for the export.
//!
//! The library hands MKDIR to the filesystem without its attributes, so a directory
//! could not get the mode the client asked for (`mkdir(2)`'s mode with the caller's
//! umask applied), and it sends REMOVE and RMDIR to one `remove`, so the entry's kind
//! would decide whether a file or a directory goes. The front sees every call before
//! the library does: it notes here the mode a MKDIR asks for and whether a removal
//! was an RMDIR, by directory and name, and the export takes the note when the
//! library calls it. A note nobody takes (a call the library refused first) is
//! dropped after [`KEPT_FOR`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nfs3_server::nfs3_types::nfs3::{MKDIR3args, Nfs3Option, REMOVE3args, RMDIR3args};
use stagefs_source::locks::lock;

/// How long a note waits for its call to reach the export.
const KEPT_FOR: Duration = Duration::from_secs(30);

/// What one call asked for, beyond what the library passes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Intent {
    /// A MKDIR with this mode (or none given).
    Mkdir(Option<u32>),
    /// A REMOVE: the entry must not be a directory.
    Remove,
    /// An RMDIR: the entry must be a directory.
    Rmdir,
}

/// Where a call acts: the directory's inode and the entry's name.
type Place = (u64, Vec<u8>);

/// Notes by place, with when they were made.
#[derive(Debug, Default)]
pub(crate) struct Intents {
    notes: Mutex<HashMap<Place, (Intent, Instant)>>,
}

impl Intents {
    /// Notes that a call for `name` in directory `dir` asks for `intent`.
    pub(crate) fn note(&self, dir: u64, name: &[u8], intent: Intent) {
        let mut notes = lock(&self.notes);
        notes.retain(|_, (_, at)| at.elapsed() < KEPT_FOR);
        notes.insert((dir, name.to_vec()), (intent, Instant::now()));
    }

    /// Takes the note for `name` in `dir`, if one is there.
    pub(crate) fn take(&self, dir: u64, name: &[u8]) -> Option<Intent> {
        let mut notes = lock(&self.notes);
        let (intent, at) = notes.remove(&(dir, name.to_vec()))?;
        (at.elapsed() < KEPT_FOR).then_some(intent)
    }
}

/// The note a call of procedure `proc` with arguments `args` (XDR) calls for, and
/// where: for MKDIR, REMOVE and RMDIR. `ino_of` reads a handle's inode.
pub(crate) fn of_call(
    proc: u32,
    args: &[u8],
    ino_of: impl Fn(&[u8]) -> Option<u64>,
) -> Option<(u64, Vec<u8>, Intent)> {
    use nfs3_server::nfs3_types::nfs3::NFS_PROGRAM as P;
    use nfs3_server::nfs3_types::xdr_codec::Unpack;
    let mut cursor = std::io::Cursor::new(args);
    let (dirop, intent) = match proc {
        p if p == P::NFSPROC3_MKDIR as u32 => {
            let (call, _) = MKDIR3args::unpack(&mut cursor).ok()?;
            let mode = match call.attributes.mode {
                Nfs3Option::Some(mode) => Some(mode & 0o7777),
                Nfs3Option::None => None,
            };
            (call.where_, Intent::Mkdir(mode))
        }
        p if p == P::NFSPROC3_REMOVE as u32 => (
            REMOVE3args::unpack(&mut cursor).ok()?.0.object,
            Intent::Remove,
        ),
        p if p == P::NFSPROC3_RMDIR as u32 => (
            RMDIR3args::unpack(&mut cursor).ok()?.0.object,
            Intent::Rmdir,
        ),
        _ => return None,
    };
    let dir = ino_of(&dirop.dir.data)?;
    Some((dir, dirop.name.0.to_vec(), intent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_is_taken_once_and_only_for_its_place() {
        let intents = Intents::default();
        intents.note(7, b"made", Intent::Mkdir(Some(0o700)));
        intents.note(7, b"gone", Intent::Rmdir);
        assert_eq!(intents.take(8, b"made"), None);
        assert_eq!(intents.take(7, b"made"), Some(Intent::Mkdir(Some(0o700))));
        assert_eq!(intents.take(7, b"made"), None);
        assert_eq!(intents.take(7, b"gone"), Some(Intent::Rmdir));
    }
}
