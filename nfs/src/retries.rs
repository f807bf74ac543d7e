//! The results of changes the connection front answered JUKEBOX, kept for the
//! client's retry.
//!
//! A call that changes something (WRITE, CREATE, MKDIR, SYMLINK, REMOVE, RMDIR,
//! RENAME, SETATTR, COMMIT) and waits at the library past 4.5 s is answered JUKEBOX
//! by the front, as a Mac says the server is "not responding" once a call waits 5 s
//! (even with `mutejukebox`), and the library goes on with it. The client sends the
//! call again after its back-off (Apple: 4, 8, 16, 30 s; Linux: 5 s), with a new
//! xid. Relayed, that retry would find its own work done and fail: a GUARDED CREATE
//! with EXIST, a REMOVE or a RENAME with NOENT, a guarded SETATTR with NOT_SYNC. So
//! the call is kept here by its [`Key`] and, once the library answers it, with its
//! reply; a retry is answered with that reply (its xid rewritten), and one that
//! comes before it waits for it, bounded as the first was (JUKEBOX again past it).
//!
//! Invariant: a change answered JUKEBOX by the front is done by the library once.
//! Every call with its key that comes while it is kept is a retry of it: never
//! relayed, answered with its result. A result answers one retry and is then
//! forgotten, and one nobody comes for is dropped [`KEPT_FOR`] after it came, so a
//! later identical call (a program that creates, removes and creates one name
//! again) is relayed as a new call. A call still at the library is kept for as
//! long as the front waits for the library to answer it ([`UNANSWERED`], far past
//! the source's timeout): forgetting it first would let its retry be done twice.
//!
//! Kept per server, not per connection: a client whose connection closed sends
//! the retry on a new one, and the front holds the closed connection's way to the
//! library open until the library has answered the calls kept (the library drops
//! the replies of a connection closed). When [`MOST_KEPT`] calls are kept, a new
//! change is not answered JUKEBOX at all: it waits for the library, as every change
//! did before, late but never done twice.
//!
//! What is not told apart: two identical calls from one user, both sent while the
//! first waits at the library (two `rm x` at once), are taken for a call and its
//! retry and both answered with the first's result, as a server's duplicate request
//! cache would answer them. Nor is a retry from a new identical call after a call
//! whose retry never came (its process interrupted on an `intr` mount): for
//! [`KEPT_FOR`] after its result came, the same call by the same user (`rm x` of a
//! file made again since) is answered with that result and not done. A client
//! that goes on retrying comes back within its longest back-off (30 s), so a
//! shorter [`KEPT_FOR`] would narrow this, at the cost of a slow client's retry.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nfs3_server::nfs3_types::rpc::auth_unix;
use stagefs_source::locks::lock;
use tokio::sync::watch;

/// How long a call's room at the library is kept with no answer (by the front, and
/// here): far longer than any call waits there (bounded by the source's timeout),
/// so only a call the library dropped unanswered (a resent xid it had answered) is
/// let go.
pub(crate) const UNANSWERED: Duration = Duration::from_secs(300);

/// How long a result waits for the retry of its call: past the longest an Apple
/// client sleeps between tries (30 s) with room to spare.
pub(crate) const KEPT_FOR: Duration = Duration::from_secs(120);

/// The most calls kept at once. A result is an RPC reply of under 1 KiB (the
/// largest, CREATE's, carries a handle and three sets of attributes), and a key 32
/// bytes: at most about a MiB in all.
pub(crate) const MOST_KEPT: usize = 1024;

/// What makes a retry the same call: a BLAKE3 digest of the procedure, the caller's
/// AUTH_UNIX identity (uid, gid, groups and machine name, not the stamp), and the
/// arguments' XDR bytes, everything after the call's credentials and verifier. Not
/// the xid, which a retry changes. The identity is in it so that one user's retry
/// is never answered with another's result. A digest, not the bytes: a WRITE's
/// arguments are up to 1 MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key([u8; 32]);

impl Key {
    /// The key of a call of `proc` by `caller` with arguments `args`.
    pub(crate) fn of(proc: u32, caller: &auth_unix, args: &[u8]) -> Key {
        let mut hasher = blake3::Hasher::new();
        hasher.update(&proc.to_be_bytes());
        hasher.update(&caller.uid.to_be_bytes());
        hasher.update(&caller.gid.to_be_bytes());
        // Lengths before variable parts, so that no two callers hash alike.
        hasher.update(&(caller.gids.len() as u32).to_be_bytes());
        for gid in &caller.gids {
            hasher.update(&gid.to_be_bytes());
        }
        let machine: &[u8] = caller.machinename.as_ref();
        hasher.update(&(machine.len() as u32).to_be_bytes());
        hasher.update(machine);
        hasher.update(args);
        Key(*hasher.finalize().as_bytes())
    }
}

/// A library reply's RPC message (the record's body, without its mark).
pub(crate) type Answer = Arc<[u8]>;

/// One call kept.
#[derive(Debug)]
struct Kept {
    /// Tells this keeping of a key from a later one.
    id: u64,
    /// The library's reply once it came; retries wait on it.
    result: watch::Sender<Option<Answer>>,
    /// When the call was kept, then when its result came.
    since: Instant,
}

impl Kept {
    fn expired(&self) -> bool {
        let kept_for = if self.result.borrow().is_some() {
            KEPT_FOR
        } else {
            UNANSWERED
        };
        self.since.elapsed() >= kept_for
    }
}

/// A retry's wait for the result of the call it repeats.
#[derive(Debug)]
pub(crate) struct Awaited {
    key: Key,
    id: u64,
    result: watch::Receiver<Option<Answer>>,
}

/// The changes answered JUKEBOX, by key: shared by every connection of a server,
/// as a client may send its retry on a new connection.
#[derive(Debug, Default)]
pub(crate) struct Retries {
    kept: Mutex<HashMap<Key, Kept>>,
    next_id: AtomicU64,
}

impl Retries {
    /// Keeps the call with `key`, about to be answered JUKEBOX. False when no more
    /// calls may be kept (or the key is kept already): the call must then wait for
    /// the library instead.
    pub(crate) fn keep(&self, key: Key) -> bool {
        let mut kept = lock(&self.kept);
        if kept.len() >= MOST_KEPT {
            kept.retain(|_, kept| !kept.expired());
        }
        if kept.len() >= MOST_KEPT || kept.contains_key(&key) {
            return false;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (result, _) = watch::channel(None);
        let since = Instant::now();
        kept.insert(key, Kept { id, result, since });
        true
    }

    /// The library answered the kept call with `key`: `reply` (an RPC message) is
    /// what its retry gets.
    pub(crate) fn answered(&self, key: Key, reply: Vec<u8>) {
        if let Some(kept) = lock(&self.kept).get_mut(&key) {
            kept.since = Instant::now();
            kept.result.send_replace(Some(reply.into()));
        }
    }

    /// The wait of a call with `key` for the result of the kept call it repeats;
    /// `None` if no such call is kept (it is a new call).
    pub(crate) fn retry(&self, key: Key) -> Option<Awaited> {
        let mut kept = lock(&self.kept);
        if kept.get(&key).is_some_and(Kept::expired) {
            kept.remove(&key);
        }
        kept.get(&key).map(|kept| Awaited {
            key,
            id: kept.id,
            result: kept.result.subscribe(),
        })
    }

    /// The result `awaited` waits for, if it comes within `bound`. It answers this
    /// retry and is forgotten.
    pub(crate) async fn result_within(&self, awaited: Awaited, bound: Duration) -> Option<Answer> {
        let Awaited {
            key,
            id,
            mut result,
        } = awaited;
        let came = tokio::time::timeout(bound, result.wait_for(Option::is_some)).await;
        let reply = came.ok()?.ok()?.clone()?;
        let mut kept = lock(&self.kept);
        if kept.get(&key).is_some_and(|kept| kept.id == id) {
            kept.remove(&key);
        }
        Some(reply)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.kept).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nfs3_server::nfs3_types::xdr_codec::Opaque;

    fn caller(uid: u32) -> auth_unix {
        auth_unix {
            stamp: 0,
            machinename: Opaque::borrowed(b"mac"),
            uid,
            gid: 20,
            gids: vec![20],
        }
    }

    #[test]
    fn a_key_tells_procedures_callers_and_arguments_apart_but_not_stamps() {
        let key = Key::of(8, &caller(501), b"args");
        assert_eq!(key, Key::of(8, &caller(501), b"args"));
        let mut stamped = caller(501);
        stamped.stamp = 99;
        assert_eq!(key, Key::of(8, &stamped, b"args"));
        assert_ne!(key, Key::of(12, &caller(501), b"args"));
        assert_ne!(key, Key::of(8, &caller(502), b"args"));
        assert_ne!(key, Key::of(8, &caller(501), b"argz"));
        let mut grouped = caller(501);
        grouped.gids.push(12);
        assert_ne!(key, Key::of(8, &grouped, b"args"));
    }

    #[tokio::test]
    async fn a_retry_gets_the_result_once_and_a_later_call_is_new() {
        let retries = Retries::default();
        let key = Key::of(8, &caller(501), b"create");
        assert!(retries.retry(key).is_none(), "nothing kept yet");
        assert!(retries.keep(key));
        assert!(!retries.keep(key), "kept once");
        let early = retries.retry(key).expect("kept");
        let bound = Duration::from_millis(50);
        assert!(retries.result_within(early, bound).await.is_none());
        retries.answered(key, b"reply".to_vec());
        let retry = retries.retry(key).expect("kept");
        let reply = retries.result_within(retry, bound).await.expect("result");
        assert_eq!(&*reply, b"reply");
        assert!(retries.retry(key).is_none(), "a result answers one retry");
    }

    #[tokio::test]
    async fn a_retry_waiting_gets_the_result_when_it_comes() {
        let retries = Arc::new(Retries::default());
        let key = Key::of(12, &caller(501), b"remove");
        assert!(retries.keep(key));
        let retry = retries.retry(key).expect("kept");
        let answer = {
            let retries = Arc::clone(&retries);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                retries.answered(key, b"ok".to_vec());
            })
        };
        let reply = retries.result_within(retry, Duration::from_secs(5)).await;
        assert_eq!(reply.as_deref(), Some(&b"ok"[..]));
        answer.await.expect("answered");
    }

    #[test]
    fn no_more_than_most_kept_calls_are_kept() {
        let retries = Retries::default();
        for i in 0..MOST_KEPT as u32 {
            assert!(retries.keep(Key::of(7, &caller(501), &i.to_be_bytes())));
        }
        assert!(!retries.keep(Key::of(7, &caller(501), b"one more")));
        assert_eq!(retries.len(), MOST_KEPT);
    }
}
