//! The connection front: what a client connects to. It answers the READs of files
//! already open from a staged copy itself, by sending the copy's bytes from the page
//! cache straight into the socket, and relays every other call, unchanged, to the
//! `nfs3_server` library's listener behind it.
//!
//! Why: the library answers a READ with a `Vec` the filesystem filled, packs it into
//! a second buffer and writes that to the socket: three passes over every byte
//! before the kernel's own copy to the client. Over loopback those passes, not the
//! disk, bounded what the server could serve (see docs/BENCHMARKS.md, "NFS server").
//! Here the bytes of a staged copy reach the socket with one `sendfile` on Linux.
//!
//! It answers JUKEBOX itself for a call that has waited at the library past 4.5 s
//! ([`LibraryCalls`]), and answers the retry of a change so answered with the
//! change's own result, never relaying it again (`retries`); it relays at most 192
//! calls a connection at a time. It answers LINK and MKNOD itself, which the
//! library lacks, through the policy ([`crate::specials`]), and answers
//! FSSTAT with the source's real figures ([`Front::answer_fsstat`]; the library's
//! are constants). And it answers the NULL procedure (a ping) of NFS and MOUNT
//! itself, whatever the call's credentials: Linux's kernel pings with AUTH_NULL
//! before it mounts (RFC 5531 lets a client), and the library refuses every call
//! but the serving user's and root's AUTH_UNIX ones, NULL included, so the kernel
//! gave up with "server requires stronger authentication". A NULL call does
//! nothing and serves nothing.
//!
//! Nothing is decided twice. A READ is taken here only when everything about it is
//! settled already: an AUTH_UNIX call of the serving user or root, a handle of this
//! server's generation, and a file open from a whole, verified copy. Everything
//! else, including the first READ of a file (which opens and stages it, and may
//! answer JUKEBOX), a stale handle, a refused credential and every other procedure,
//! goes to the library and is answered by it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Cursor};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nfs3_server::nfs3_types::mount;
use nfs3_server::nfs3_types::nfs3::{self as nfs, READ3args, nfsstat3};
use nfs3_server::nfs3_types::rpc::{
    accept_stat_data, accepted_reply, auth_flavor, auth_unix, call_body, msg_body, opaque_auth,
    reply_body, rpc_msg,
};
use nfs3_server::nfs3_types::xdr_codec::{Pack, Unpack};
use nfs3_server::vfs::FileHandle;
use stagefs_policy::Policy;
use stagefs_source::locks::lock;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, warn};

use crate::access::{client_uid, connect_from_reserved_port, serves, serving_caller};
use crate::attrs::fattr;
use crate::handle::NodeHandle;
use crate::intents::{self, Intents};
use crate::jukebox::MAX_HOLD;
use crate::reads::Reads;
use crate::retries::{Awaited, Key, Retries, UNANSWERED};
use crate::specials::Special;
use crate::status::nfsstat_logged;

/// The largest record a client may send: a call with a WRITE of the most the library
/// advertises (FSINFO's `wtmax`, 1 MiB; the mount asks `wsize=1048576`, and clients
/// send no more than `wtmax`) and its headers. Those are at most 928 bytes: the call
/// header's 24, two `opaque_auth`s of at most 408 each (RFC 5531 caps a body at 400),
/// and WRITE3args' 88 besides the data (a 64-byte handle with its length, offset,
/// count, stable, the data's length; 1 MiB needs no padding).
const MAX_RECORD: usize = (1 << 20) + 4096;
const _: () = assert!(MAX_WRITE + 24 + 2 * 408 + 88 <= MAX_RECORD);

/// The most bytes one WRITE carries, as the library's FSINFO advertises.
const MAX_WRITE: usize = 1 << 20;

/// The most bytes one READ is answered with, as the library's FSINFO advertises.
const MAX_READ: u32 = 1 << 20;

/// What the front needs to answer a READ itself.
#[derive(Debug, Clone)]
pub(crate) struct Front {
    pub(crate) policy: Arc<Policy>,
    pub(crate) reads: Arc<Reads>,
    /// Where what the library drops of a call is noted for the export.
    pub(crate) intents: Arc<Intents>,
    /// The user the export serves (besides root).
    pub(crate) owner: u32,
    /// The inode journal's generation, the first 8 bytes (little-endian) of every
    /// handle the library hands out.
    pub(crate) generation: u64,
    /// The library's listener, which answers everything else.
    pub(crate) library: SocketAddr,
    /// The changes answered JUKEBOX, kept for their retries (by every connection:
    /// a retry may come on a new one).
    pub(crate) retries: Arc<Retries>,
    /// Whether only connections from reserved ports are served (root serving on
    /// Linux; see the listen module): others are refused at accept, with a log line.
    pub(crate) reserved_only: bool,
}

/// The most calls one connection has at the library at once. The library answers
/// SYSTEM_ERR past 256 calls in flight on a connection, which a Mac turns into EIO,
/// and a Mac's one connection carries up to 128 WRITEs and 16-17 READs per reader
/// (several readers of files still staging have theirs held). Past this many the
/// front takes no more of the client's calls until one is answered: the client
/// waits, by TCP's flow control, as for a busy server.
const LIBRARY_CALLS: usize = 192;

/// How long a call may wait at the library before the front answers it
/// `NFS3ERR_JUKEBOX` itself (a change only once kept for its retry): under the 5 s
/// after which a Mac says the server is "not responding" (even with `mutejukebox`)
/// or fails a mount, and past the 4 s a READ is held ([`MAX_HOLD`]), which READ
/// answers itself.
const BOUND: Duration = Duration::from_millis(4500);

/// How often a connection's calls are looked at for [`BOUND`].
const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// A call relayed to the library and not answered yet.
#[derive(Debug)]
struct Waiting {
    relayed: Instant,
    /// Its room at the library, held until the library answers.
    _room: OwnedSemaphorePermit,
    /// For a call bounded in time ([`bounded_failure_falses`]), the XDR FALSEs its
    /// failure reply carries after the status.
    bound: Option<usize>,
    /// For a change, its key: once answered JUKEBOX, the library's late reply is
    /// kept for the retry ([`Retries`]).
    change: Option<Key>,
    /// Answered JUKEBOX by the front: the library's late reply is not sent.
    jukeboxed: bool,
}

/// What becomes of the library's reply to a call.
#[derive(Debug, PartialEq)]
enum Late {
    /// Sent to the client: the front did not answer the call.
    Send,
    /// Dropped: the front answered JUKEBOX to a call that changes nothing, and the
    /// policy keeps what the source said for the retry.
    Drop,
    /// Kept for the retry of a change the front answered JUKEBOX.
    Keep(Key),
}

/// The calls of one connection relayed to the library and not answered yet.
///
/// Calls that wait past [`BOUND`] are answered JUKEBOX here while the library goes
/// on, and the client sends them again (a new xid, 4 s later on a Mac, 5 s on
/// Linux). For a call that changes nothing (GETATTR, LOOKUP, ACCESS, READLINK,
/// READDIR(PLUS), FSINFO, PATHCONF) the library's late reply is dropped: the policy
/// keeps what the source said when it answers late, so the retry is answered from
/// memory. A change (WRITE, CREATE, MKDIR, SYMLINK, REMOVE, RMDIR, RENAME, SETATTR,
/// COMMIT) relayed again would find its own work done and fail, so it is answered
/// JUKEBOX only once kept in [`Retries`], which answers its retry with the
/// library's late reply; when no more can be kept, it waits for the library.
#[derive(Debug)]
struct LibraryCalls {
    room: Arc<Semaphore>,
    waiting: std::sync::Mutex<HashMap<u32, Waiting>>,
    retries: Arc<Retries>,
}

impl LibraryCalls {
    fn new(retries: Arc<Retries>) -> LibraryCalls {
        LibraryCalls {
            room: Arc::new(Semaphore::new(LIBRARY_CALLS)),
            waiting: std::sync::Mutex::default(),
            retries,
        }
    }

    /// Waits for room for call `xid` at the library. A call resent with the same
    /// xid while it waits there takes none: the library answers it once.
    async fn relaying(&self, xid: u32, bound: Option<usize>, change: Option<Key>) {
        if self.waiting().contains_key(&xid) {
            return;
        }
        if self.room.available_permits() == 0 {
            self.waiting()
                .retain(|_, waiting| waiting.relayed.elapsed() < UNANSWERED);
        }
        // The semaphore is never closed.
        if let Ok(room) = Arc::clone(&self.room).acquire_owned().await {
            let waiting = Waiting {
                relayed: Instant::now(),
                _room: room,
                bound,
                change,
                jukeboxed: false,
            };
            self.waiting().insert(xid, waiting);
        }
    }

    /// The library answered call `xid`: its room is free. What becomes of its
    /// reply depends on whether the front answered the call already.
    fn answered(&self, xid: u32) -> Late {
        match self.waiting().remove(&xid) {
            Some(Waiting {
                jukeboxed: true,
                change: Some(key),
                ..
            }) => Late::Keep(key),
            Some(Waiting {
                jukeboxed: true, ..
            }) => Late::Drop,
            _ => Late::Send,
        }
    }

    /// The JUKEBOX replies due now, for the bounded calls past [`BOUND`]; each call
    /// is marked, so that exactly one of this and the library's reply is sent.
    fn overdue(&self) -> Vec<Vec<u8>> {
        let mut due = Vec::new();
        for (xid, waiting) in self.waiting().iter_mut() {
            if let Some(falses) = waiting.bound
                && !waiting.jukeboxed
                && waiting.relayed.elapsed() >= BOUND
            {
                if !self.kept_for_retry(waiting) {
                    // Nowhere to keep its result: it waits for the library.
                    waiting.bound = None;
                    continue;
                }
                waiting.jukeboxed = true;
                due.push(failure_reply(*xid, nfsstat3::NFS3ERR_JUKEBOX, falses));
            }
        }
        due
    }

    /// Waits until the library has answered every change answered JUKEBOX here,
    /// whose replies are kept for their retries; at most [`UNANSWERED`].
    async fn until_kept_answered(&self) {
        let since = Instant::now();
        while self.keeps_any() && since.elapsed() < UNANSWERED {
            tokio::time::sleep(SWEEP_EVERY).await;
        }
    }

    /// Whether a change answered JUKEBOX here waits at the library.
    fn keeps_any(&self) -> bool {
        let waiting = self.waiting();
        waiting.values().any(|w| w.jukeboxed && w.change.is_some())
    }

    /// Whether `waiting` may be answered JUKEBOX as far as its retry goes: a call
    /// that changes nothing always may, a change once it is kept for its retry.
    fn kept_for_retry(&self, waiting: &Waiting) -> bool {
        waiting.change.is_none_or(|key| self.retries.keep(key))
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Waiting>> {
        lock(&self.waiting)
    }
}

/// Answers the calls of `at_library` that wait past [`BOUND`], for as long as the
/// task lives.
async fn sweep_overdue(at_library: Arc<LibraryCalls>, to_client: ToClient, policy: Arc<Policy>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let due = at_library.overdue();
        if !due.is_empty() {
            crate::jukebox::answered(&policy);
        }
        for reply in due {
            if !send(&to_client, Reply::Record(reply)).await {
                return;
            }
        }
    }
}

/// For a procedure that may be answered JUKEBOX for the library, how many XDR
/// FALSEs (absent attributes) its failure reply carries after the status; `None`
/// for every other procedure. A change is bounded only with its key (`change`):
/// its retry must be told from a new call.
fn bounded_failure_falses(proc: u32, change: Option<Key>) -> Option<usize> {
    match change {
        Some(_) => change_failure_falses(proc),
        None => query_failure_falses(proc),
    }
}

/// For a procedure that changes something, how many XDR FALSEs its failure reply
/// carries after the status (each `wcc_data` is two absent attributes); `None` for
/// every other procedure. LINK and MKNOD, which the library lacks, are answered by
/// the front itself (`specials.rs`).
fn change_failure_falses(proc: u32) -> Option<usize> {
    use nfs::NFS_PROGRAM as P;
    match proc {
        p if p == P::NFSPROC3_RENAME as u32 => Some(4),
        p if [
            P::NFSPROC3_SETATTR as u32,
            P::NFSPROC3_WRITE as u32,
            P::NFSPROC3_CREATE as u32,
            P::NFSPROC3_MKDIR as u32,
            P::NFSPROC3_SYMLINK as u32,
            P::NFSPROC3_REMOVE as u32,
            P::NFSPROC3_RMDIR as u32,
            P::NFSPROC3_COMMIT as u32,
        ]
        .contains(&p) =>
        {
            Some(2)
        }
        _ => None,
    }
}

/// For a procedure that changes nothing, how many XDR FALSEs its failure reply
/// carries after the status; `None` for every other procedure.
fn query_failure_falses(proc: u32) -> Option<usize> {
    use nfs::NFS_PROGRAM as P;
    match proc {
        p if p == P::NFSPROC3_GETATTR as u32 => Some(0),
        p if [
            P::NFSPROC3_LOOKUP as u32,
            P::NFSPROC3_ACCESS as u32,
            P::NFSPROC3_READLINK as u32,
            P::NFSPROC3_READDIR as u32,
            P::NFSPROC3_READDIRPLUS as u32,
            P::NFSPROC3_FSINFO as u32,
            P::NFSPROC3_PATHCONF as u32,
        ]
        .contains(&p) =>
        {
            Some(1)
        }
        _ => None,
    }
}

/// The client's side of a connection, shared by everything that answers on it.
type ToClient = Arc<Mutex<OwnedWriteHalf>>;

/// One reply on its way to the client.
enum Reply {
    /// A whole record from the library, record marks included.
    Record(Vec<u8>),
    /// A READ answered here: its record mark and headers, then `len` bytes of
    /// `file` at `offset`, then their XDR padding.
    Range {
        head: Vec<u8>,
        file: Arc<File>,
        offset: u64,
        len: usize,
    },
}

/// Accepts connections on `listener` for as long as the task lives.
pub(crate) async fn accept(listener: TcpListener, front: Front) {
    loop {
        let (client, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                debug!(error = %e, "accept failed");
                continue;
            }
        };
        if front.reserved_only && peer.port() >= 1024 {
            tokio::spawn(refuse(client, peer));
            continue;
        }
        let front = front.clone();
        tokio::spawn(async move {
            debug!(%peer, "NFS connection");
            if let Err(e) = front.serve(client).await {
                debug!(%peer, error = %e, "NFS connection closed");
            }
        });
    }
}

/// Closes a connection from an unreserved port, saying who made it: only the kernel
/// and root can bind a reserved port, and a forged credential must not reach the
/// server. Refused here rather than dropped at connect, so that the client fails at
/// once and whoever runs the server reads why.
async fn refuse(client: TcpStream, peer: SocketAddr) {
    // Asked while the client's socket is still open.
    let who = match client_uid(peer).await {
        Some(uid) => format!(" (a process of uid {uid})"),
        None => String::new(),
    };
    drop(client);
    warn!(
        "refused an NFS connection from {peer}{who}: not from a reserved port (below 1024), which only the kernel's NFS client and root can use; a root server serves no ordinary user's client (run `stagefs serve` as that user for one)"
    );
}

impl Front {
    /// Serves one client connection until either side closes it.
    async fn serve(self, client: TcpStream) -> io::Result<()> {
        let _ = client.set_nodelay(true);
        let library = connect_from_reserved_port(self.library).await?;
        let _ = library.set_nodelay(true);
        let (from_client, to_client) = client.into_split();
        let (from_library, mut to_library) = library.into_split();
        let to_client: ToClient = Arc::new(Mutex::new(to_client));
        let at_library = Arc::new(LibraryCalls::new(Arc::clone(&self.retries)));
        let relay = tokio::spawn(relay_replies(
            from_library,
            Arc::clone(&to_client),
            Arc::clone(&at_library),
        ));
        let sweep = tokio::spawn(sweep_overdue(
            Arc::clone(&at_library),
            Arc::clone(&to_client),
            Arc::clone(&self.policy),
        ));
        let calls = self
            .take_calls(from_client, &mut to_library, &to_client, &at_library)
            .await;
        sweep.abort();
        // The library drops its replies once its connection closes, and the
        // retries of the changes answered JUKEBOX here come on a new connection.
        at_library.until_kept_answered().await;
        relay.abort();
        calls
    }

    /// Reads the client's calls: READs this front can answer are answered on their
    /// own task, the rest are passed to the library as they came.
    async fn take_calls(
        &self,
        mut from_client: OwnedReadHalf,
        to_library: &mut OwnedWriteHalf,
        to_client: &ToClient,
        at_library: &LibraryCalls,
    ) -> io::Result<()> {
        loop {
            let Some(record) = read_record(&mut from_client).await? else {
                return Ok(());
            };
            let body = record.body();
            let call = NfsCall::parse(&body);
            if let Some(ping) = call.as_ref().filter(|call| call.is_null_ping()) {
                send(to_client, Reply::Record(null_reply(ping.xid))).await;
                continue;
            }
            if let Some(other) = call.as_ref().filter(|call| !call.is_served_program()) {
                send(to_client, Reply::Record(no_such_program(other.xid))).await;
                continue;
            }
            let call = call.filter(NfsCall::is_nfs3);
            if let Some(special) = call.as_ref().and_then(|call| self.special_call(call)) {
                self.answer_special(special, to_client).await;
                continue;
            }
            if let Some(fsstat) = call.as_ref().and_then(|call| self.fsstat_call(call)) {
                let (this, to_client) = (self.clone(), Arc::clone(to_client));
                tokio::spawn(async move {
                    let reply = this.answer_fsstat(fsstat).await;
                    send(&to_client, Reply::Record(reply)).await;
                });
                continue;
            }
            let change = call.as_ref().and_then(|call| self.change_key(call));
            if let Some(retry) = call.as_ref().and_then(|call| self.retry_of(call, change)) {
                self.answer_retry(retry, to_client);
                continue;
            }
            match call.as_ref().and_then(|call| self.servable_read(call)) {
                Some(read) => {
                    let (this, to_client) = (self.clone(), Arc::clone(to_client));
                    tokio::spawn(async move {
                        let reply = this.answer(read).await;
                        send(&to_client, reply).await;
                    });
                }
                None => {
                    if let Some(call) = &call {
                        self.note_intent(call);
                    }
                    if let Some(xid) = xid_of(&body) {
                        let bound = call
                            .as_ref()
                            .and_then(|c| bounded_failure_falses(c.body.proc, change));
                        at_library.relaying(xid, bound, change).await;
                    }
                    to_library.write_all(&record.0).await?
                }
            }
        }
    }

    /// `call` if it is a LINK or MKNOD, which the library lacks, from a caller the
    /// export serves (anyone else gets the library's refusal of their credentials).
    fn special_call(&self, call: &NfsCall<'_>) -> Option<SpecialCall> {
        let proc = call.body.proc;
        let falses = Special::failure_falses(proc)?;
        let caller = self.served_caller(call)?;
        let generation = self.generation;
        let special = Special::parse(proc, call.args, |fh| ino_of(&fh.data, generation));
        Some(SpecialCall {
            xid: call.xid,
            falses,
            key: Key::of(proc, &caller, call.args),
            special,
        })
    }

    /// Answers a LINK or MKNOD ([`crate::specials`]) on its own task, as the library
    /// answers a change: JUKEBOX past [`BOUND`], its result kept for the retry.
    async fn answer_special(&self, call: SpecialCall, to_client: &ToClient) {
        let SpecialCall {
            xid,
            falses,
            key,
            special,
        } = call;
        if let Some(awaited) = self.retries.retry(key) {
            let retry = Retry {
                xid,
                falses,
                awaited,
            };
            return self.answer_retry(retry, to_client);
        }
        let Some(special) = special else {
            let reply = failure_reply(xid, nfsstat3::NFS3ERR_STALE, falses);
            send(to_client, Reply::Record(reply)).await;
            return;
        };
        let (this, to_client) = (self.clone(), Arc::clone(to_client));
        tokio::spawn(async move {
            let generation = this.generation;
            let (policy, caller) = (Arc::clone(&this.policy), serving_caller(this.owner));
            let mut work = tokio::spawn(async move {
                let handle = |ino| handle_bytes(generation, ino);
                match special.answer(&policy, caller, handle).await {
                    Ok(results) => accepted_reply_record(xid, &results),
                    Err(stat) => failure_reply(xid, stat, falses),
                }
            });
            let reply = match tokio::time::timeout(BOUND, &mut work).await {
                Ok(done) => {
                    done.unwrap_or_else(|_| failure_reply(xid, nfsstat3::NFS3ERR_IO, falses))
                }
                Err(_) if this.retries.keep(key) => {
                    let jukebox = failure_reply(xid, nfsstat3::NFS3ERR_JUKEBOX, falses);
                    send(&to_client, Reply::Record(jukebox)).await;
                    if let Ok(reply) = work.await {
                        // Kept as the library's replies are: the message, no record mark.
                        this.retries.answered(key, reply[4..].to_vec());
                    }
                    return;
                }
                Err(_) => work
                    .await
                    .unwrap_or_else(|_| failure_reply(xid, nfsstat3::NFS3ERR_IO, falses)),
            };
            send(&to_client, Reply::Record(reply)).await;
        });
    }

    /// The xid of `call` if it is an FSSTAT of this export that the front answers:
    /// the library's answer is a constant 1 TiB, free.
    fn fsstat_call(&self, call: &NfsCall<'_>) -> Option<u32> {
        if call.body.proc != nfs::NFS_PROGRAM::NFSPROC3_FSSTAT as u32 {
            return None;
        }
        self.served_caller(call)?;
        let (args, _) = nfs::FSSTAT3args::unpack(&mut Cursor::new(call.args)).ok()?;
        ino_of(&args.fsroot.data, self.generation)?;
        Some(call.xid)
    }

    /// The reply to FSSTAT call `xid`: the source's figures, which is where what is
    /// written through the export goes (as `df` of a FUSE mount shows). Answered
    /// within [`MAX_HOLD`], else JUKEBOX, as a Mac fails a mount whose FSSTAT waits
    /// 5 s; the client asks again.
    async fn answer_fsstat(&self, xid: u32) -> Vec<u8> {
        let stat = match tokio::time::timeout(MAX_HOLD, self.policy.statfs()).await {
            Ok(Ok(st)) => {
                let mut results = Vec::with_capacity(64);
                let packed = nfsstat3::NFS3_OK
                    .pack(&mut results)
                    .and_then(|_| fsstat_of(&st).pack(&mut results));
                debug_assert!(packed.is_ok(), "packing into a Vec cannot fail");
                return accepted_reply_record(xid, &results);
            }
            Ok(Err(e)) => nfsstat_logged("fsstat", &e),
            Err(_) => nfsstat3::NFS3ERR_JUKEBOX,
        };
        // FSSTAT3resfail: no attributes.
        failure_reply(xid, stat, 1)
    }

    /// The key of `call` if it is a change by a caller the export serves, which
    /// may be answered JUKEBOX and kept for its retry (`retries`).
    fn change_key(&self, call: &NfsCall<'_>) -> Option<Key> {
        change_failure_falses(call.body.proc)?;
        let caller = self.served_caller(call)?;
        Some(Key::of(call.body.proc, &caller, call.args))
    }

    /// `call` as the retry of a change the front answered JUKEBOX and keeps.
    fn retry_of(&self, call: &NfsCall<'_>, change: Option<Key>) -> Option<Retry> {
        let awaited = self.retries.retry(change?)?;
        Some(Retry {
            xid: call.xid,
            falses: change_failure_falses(call.body.proc)?,
            awaited,
        })
    }

    /// Answers `retry`, on its own task, with the result of the call it repeats,
    /// once that comes; JUKEBOX again if it has not come within [`BOUND`].
    fn answer_retry(&self, retry: Retry, to_client: &ToClient) {
        let (retries, to_client) = (Arc::clone(&self.retries), Arc::clone(to_client));
        tokio::spawn(async move {
            let reply = match retries.result_within(retry.awaited, BOUND).await {
                Some(answer) => record_with_xid(retry.xid, &answer),
                None => failure_reply(retry.xid, nfsstat3::NFS3ERR_JUKEBOX, retry.falses),
            };
            send(&to_client, Reply::Record(reply)).await;
        });
    }

    /// The caller's AUTH_UNIX credentials, if the export serves them.
    fn served_caller(&self, call: &NfsCall<'_>) -> Option<auth_unix> {
        let cred = &call.body.cred;
        if cred.flavor != auth_flavor::AUTH_UNIX {
            return None;
        }
        let (auth, _) = auth_unix::unpack(&mut Cursor::new(&cred.body.0)).ok()?;
        serves(self.owner, &auth).then_some(auth)
    }

    /// The READ in `call` if this front may answer it: see the module docs.
    fn servable_read(&self, call: &NfsCall<'_>) -> Option<ServableRead> {
        let body = &call.body;
        if body.proc != nfs::NFS_PROGRAM::NFSPROC3_READ as u32 {
            return None;
        }
        self.served_caller(call)?;
        let mut cursor = Cursor::new(call.args);
        let (args, _) = READ3args::unpack(&mut cursor).ok()?;
        if cursor.position() != call.args.len() as u64 {
            return None;
        }
        let ino = ino_of(&args.file.data, self.generation)?;
        let open = self.reads.open_now(&self.policy, ino)?;
        let file = self.policy.staged_file(open.fh).ok()??;
        let offset = args.offset;
        let count = u64::from(args.count.min(MAX_READ));
        let len = open.size.saturating_sub(offset).min(count);
        // A copy shorter than the size it was opened with is damaged: the library's
        // path deals with it, and a reply here never promises bytes it cannot send.
        if file.metadata().ok()?.len() < offset.saturating_add(len) {
            return None;
        }
        Some(ServableRead {
            xid: call.xid,
            ino,
            file,
            offset,
            len: usize::try_from(len).ok()?,
            eof: offset.saturating_add(len) >= open.size,
        })
    }

    /// Notes what the library will drop of `call`, if it is a MKDIR, REMOVE or
    /// RMDIR (`intents.rs`).
    fn note_intent(&self, call: &NfsCall<'_>) {
        if let Some((dir, name, intent)) =
            intents::of_call(call.body.proc, call.args, |fh| ino_of(fh, self.generation))
        {
            self.intents.note(dir, &name, intent);
        }
    }

    /// The reply to `read`: its headers, then the range of the copy.
    async fn answer(&self, read: ServableRead) -> Reply {
        // The library sends the file's attributes with every READ; so does this.
        let attrs = self
            .policy
            .getattr_within(read.ino, self.policy.config().attr_ttl)
            .await
            .ok()
            .map(|attr| fattr(&attr));
        Reply::Range {
            head: read_reply_head(read.xid, attrs, read.len, read.eof),
            file: read.file,
            offset: read.offset,
            len: read.len,
        }
    }
}

/// An RPC call, its header read once for everything the front asks of it.
struct NfsCall<'a> {
    xid: u32,
    body: call_body<'a>,
    /// The procedure's arguments (XDR), after the header.
    args: &'a [u8],
}

impl<'a> NfsCall<'a> {
    /// The call in record body `record`, if it is one.
    fn parse(record: &'a [u8]) -> Option<NfsCall<'a>> {
        let mut cursor = Cursor::new(record);
        let (msg, _) = rpc_msg::unpack(&mut cursor).ok()?;
        let msg_body::CALL(body) = msg.body else {
            return None;
        };
        let args = record.get(usize::try_from(cursor.position()).ok()?..)?;
        Some(NfsCall {
            xid: msg.xid,
            body,
            args,
        })
    }

    /// Whether this is a call of NFS version 3, the only one the front looks into.
    fn is_nfs3(&self) -> bool {
        self.body.prog == nfs::PROGRAM && self.body.vers == nfs::VERSION
    }

    /// Whether the call is to a program the library serves: NFS, MOUNT or the
    /// portmapper. Linux's kernel also pings NFS_ACL (100227) with AUTH_NULL at
    /// every mount; the library refused that for its credentials before it would
    /// say it has no such program, and the kernel logged "server requires stronger
    /// authentication". Any other program is answered PROG_UNAVAIL here, for any
    /// credentials, as the library would answer the serving user.
    fn is_served_program(&self) -> bool {
        matches!(
            self.body.prog,
            nfs::PROGRAM | mount::PROGRAM | PORTMAP_PROGRAM
        )
    }

    /// Whether this is the NULL procedure of NFS or MOUNT version 3, in RPC version
    /// 2: a ping, answered here for any credentials (see the module docs).
    fn is_null_ping(&self) -> bool {
        let pinged = matches!(
            (self.body.prog, self.body.vers),
            (nfs::PROGRAM, nfs::VERSION) | (mount::PROGRAM, mount::VERSION)
        );
        pinged && self.body.rpcvers == RPC_VERSION && self.body.proc == NULL_PROCEDURE
    }
}

/// The portmapper's RPC program number (RFC 1833).
const PORTMAP_PROGRAM: u32 = 100_000;

/// The procedure number of NULL in every RPC program.
const NULL_PROCEDURE: u32 = 0;
/// The RPC protocol version (RFC 5531).
const RPC_VERSION: u32 = 2;

/// The whole record (mark included) answering NULL call `xid`: accepted, no results.
fn null_reply(xid: u32) -> Vec<u8> {
    accepted_reply_record(xid, &[])
}

/// The whole record answering call `xid` as accepted, with `results` (XDR).
fn accepted_reply_record(xid: u32, results: &[u8]) -> Vec<u8> {
    reply_record(xid, accept_stat_data::SUCCESS, results)
}

/// The whole record answering call `xid`: no such program here.
fn no_such_program(xid: u32) -> Vec<u8> {
    reply_record(xid, accept_stat_data::PROG_UNAVAIL, &[])
}

/// The whole record answering call `xid` as accepted with `stat`, then `results`.
fn reply_record(xid: u32, stat: accept_stat_data, results: &[u8]) -> Vec<u8> {
    let rpc = rpc_msg {
        xid,
        body: msg_body::REPLY(reply_body::MSG_ACCEPTED(accepted_reply {
            verf: opaque_auth::default(),
            reply_data: stat,
        })),
    };
    let mut record = vec![0; 4];
    let packed = rpc.pack(&mut record);
    debug_assert!(packed.is_ok(), "packing into a Vec cannot fail");
    record.extend_from_slice(results);
    let len = (record.len() - 4) as u32;
    record[..4].copy_from_slice(&(len | LAST_FRAGMENT).to_be_bytes());
    record
}

/// A LINK or MKNOD call the front answers ([`crate::specials`]).
struct SpecialCall {
    xid: u32,
    /// The XDR FALSEs of its failure reply.
    falses: usize,
    key: Key,
    /// None: a handle that is not this export's.
    special: Option<Special>,
}

/// The handle of inode `ino` as the library hands it out: the journal's generation
/// (little-endian), then the inode (`handle.rs`).
fn handle_bytes(generation: u64, ino: u64) -> Vec<u8> {
    let mut handle = generation.to_le_bytes().to_vec();
    handle.extend_from_slice(NodeHandle::of(ino).as_bytes());
    handle
}

/// The reply to call `xid` failing with `stat`, followed by `falses` XDR FALSEs:
/// the absent attributes every NFSv3 failure result is made of.
fn failure_reply(xid: u32, stat: nfsstat3, falses: usize) -> Vec<u8> {
    let mut results = Vec::with_capacity(4 + 4 * falses);
    results.extend_from_slice(&(stat as u32).to_be_bytes());
    for _ in 0..falses {
        results.extend_from_slice(&0u32.to_be_bytes());
    }
    accepted_reply_record(xid, &results)
}

/// FSSTAT's answer from a `statvfs`.
// The statvfs field types differ per platform (u32 block counts on macOS).
#[allow(clippy::unnecessary_cast)]
fn fsstat_of(st: &libc::statvfs) -> nfs::FSSTAT3resok {
    let unit = (st.f_frsize as u64).max(1);
    nfs::FSSTAT3resok {
        obj_attributes: nfs::post_op_attr::None,
        tbytes: st.f_blocks as u64 * unit,
        fbytes: st.f_bfree as u64 * unit,
        abytes: st.f_bavail as u64 * unit,
        tfiles: st.f_files as u64,
        ffiles: st.f_ffree as u64,
        afiles: st.f_favail as u64,
        // The figures change all the time.
        invarsec: 0,
    }
}

/// The retry of a change the front answered JUKEBOX (`retries`).
struct Retry {
    xid: u32,
    /// The XDR FALSEs of its failure reply, for a JUKEBOX.
    falses: usize,
    awaited: Awaited,
}

/// The whole record of RPC message `message` (a reply to another call) as the
/// reply to call `xid`: the same message, its xid rewritten.
fn record_with_xid(xid: u32, message: &[u8]) -> Vec<u8> {
    let mut record = Vec::with_capacity(4 + message.len());
    record.extend_from_slice(&(message.len() as u32 | LAST_FRAGMENT).to_be_bytes());
    record.extend_from_slice(&xid.to_be_bytes());
    record.extend_from_slice(message.get(4..).unwrap_or_default());
    record
}

/// A READ this front answers.
struct ServableRead {
    xid: u32,
    ino: u64,
    file: Arc<File>,
    offset: u64,
    len: usize,
    eof: bool,
}

/// The inode in handle bytes `fh` if the handle is of generation `generation`.
fn ino_of(fh: &[u8], generation: u64) -> Option<u64> {
    let (head, ino) = fh.split_first_chunk::<8>()?;
    let ino: [u8; 8] = ino.try_into().ok()?;
    (u64::from_le_bytes(*head) == generation).then(|| u64::from_be_bytes(ino))
}

/// The zero bytes XDR puts after `len` bytes of opaque data.
fn xdr_pad(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// The record mark, RPC reply header and READ3resok fields before the data, for a
/// reply carrying `len` bytes (and their padding).
fn read_reply_head(xid: u32, attrs: Option<nfs::fattr3>, len: usize, eof: bool) -> Vec<u8> {
    let rpc = rpc_msg {
        xid,
        body: msg_body::REPLY(reply_body::MSG_ACCEPTED(accepted_reply {
            verf: opaque_auth::default(),
            reply_data: accept_stat_data::SUCCESS,
        })),
    };
    let attrs = match attrs {
        Some(attrs) => nfs::post_op_attr::Some(attrs),
        None => nfs::post_op_attr::None,
    };
    // Every field is a u32 or a fixed-size XDR struct, and `len` is at most MAX_READ.
    let count = u32::try_from(len).unwrap_or(MAX_READ);
    let mut head = Vec::with_capacity(256);
    head.extend_from_slice(&[0; 4]);
    let packed = rpc.pack(&mut head).and_then(|_| {
        Ok(nfsstat3::NFS3_OK.pack(&mut head)?
            + attrs.pack(&mut head)?
            + count.pack(&mut head)?
            + eof.pack(&mut head)?
            + count.pack(&mut head)?)
    });
    debug_assert!(packed.is_ok(), "packing into a Vec cannot fail");
    let record = (head.len() - 4 + len + xdr_pad(len)) as u32;
    head[..4].copy_from_slice(&(record | LAST_FRAGMENT).to_be_bytes());
    head
}

/// The flag of a record mark that says its fragment ends the record.
const LAST_FRAGMENT: u32 = 0x8000_0000;

/// One whole record, as it came: record marks included, so that it is relayed
/// without being put together again.
struct Record(Vec<u8>);

impl Record {
    /// The record's body, its fragments joined. Kernel clients send a record in one
    /// fragment, whose body is borrowed; only a record in pieces is copied.
    fn body(&self) -> Cow<'_, [u8]> {
        let bytes = &self.0;
        let (last, len) = fragment(bytes[..4].try_into().unwrap_or_default());
        if last && len + 4 == bytes.len() {
            return Cow::Borrowed(&bytes[4..]);
        }
        let (mut joined, mut at) = (Vec::new(), 0);
        while at + 4 <= bytes.len() {
            let (_, len) = fragment(bytes[at..at + 4].try_into().unwrap_or_default());
            let end = (at + 4 + len).min(bytes.len());
            joined.extend_from_slice(&bytes[at + 4..end]);
            at = end;
        }
        Cow::Owned(joined)
    }
}

/// The xid an RPC message (a record's body) starts with.
fn xid_of(body: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(*body.first_chunk::<4>()?))
}

/// Whether a fragment with record mark `mark` ends its record, and its length.
fn fragment(mark: [u8; 4]) -> (bool, usize) {
    let mark = u32::from_be_bytes(mark);
    (mark & LAST_FRAGMENT != 0, (mark & !LAST_FRAGMENT) as usize)
}

/// One whole record from `from`; `None` at a clean end of the stream.
async fn read_record(from: &mut OwnedReadHalf) -> io::Result<Option<Record>> {
    let mut record = Vec::new();
    loop {
        let mut mark = [0u8; 4];
        match from.read_exact(&mut mark).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && record.is_empty() => {
                return Ok(None);
            }
            Err(e) => return Err(e),
        }
        let (last, len) = fragment(mark);
        if record.len() + len > MAX_RECORD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a call of over {MAX_RECORD} bytes"),
            ));
        }
        record.extend_from_slice(&mark);
        let start = record.len();
        record.resize(start + len, 0);
        from.read_exact(&mut record[start..]).await?;
        if last {
            return Ok(Some(Record(record)));
        }
    }
}

/// Passes the library's replies, whole records, to the client, and keeps those to
/// changes answered JUKEBOX here for their retries ([`Retries`]).
async fn relay_replies(
    mut from_library: OwnedReadHalf,
    to_client: ToClient,
    at_library: Arc<LibraryCalls>,
) {
    while let Ok(Some(record)) = read_record(&mut from_library).await {
        let late = xid_of(&record.body()).map_or(Late::Send, |xid| at_library.answered(xid));
        match late {
            Late::Send => {}
            Late::Drop => continue,
            Late::Keep(key) => {
                at_library.retries.answered(key, record.body().into_owned());
                continue;
            }
        }
        // A reply the client can no longer get is lost with its connection; the
        // library's later replies are read all the same, for the kept changes.
        send(&to_client, Reply::Record(record.0)).await;
    }
}

/// Writes one whole reply to the client; false if the connection is done for.
async fn send(to_client: &ToClient, reply: Reply) -> bool {
    // One reply at a time: replies are records, and must not interleave.
    let mut to = to_client.lock().await;
    let written = match reply {
        Reply::Record(record) => to.write_all(&record).await,
        Reply::Range {
            head,
            file,
            offset,
            len,
        } => write_range(&mut to, &head, &file, offset, len).await,
    };
    match written {
        Ok(()) => true,
        Err(e) => {
            // A reply cut short leaves the stream unframed: the connection must end,
            // and the client sends its calls again on a new one.
            debug!(error = %e, "closing an NFS connection after a failed reply");
            let _ = to.shutdown().await;
            false
        }
    }
}

async fn write_range(
    to: &mut OwnedWriteHalf,
    head: &[u8],
    file: &Arc<File>,
    offset: u64,
    len: usize,
) -> io::Result<()> {
    to.write_all(head).await?;
    crate::send_file::send(to, file, offset, len).await?;
    to.write_all(&[0u8; 3][..xdr_pad(len)]).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use nfs3_server::nfs3_types::nfs3::{READ3res, READ3resok};
    use nfs3_server::nfs3_types::xdr_codec::Opaque;

    #[test]
    fn a_read_reply_is_framed_as_the_library_frames_it() {
        for len in [0usize, 1, 3, 4, 1000, 4093] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let pad = xdr_pad(len);
            let attrs = nfs::fattr3 {
                type_: nfs::ftype3::NF3REG,
                mode: 0o644,
                nlink: 1,
                uid: 501,
                gid: 20,
                size: len as u64,
                used: len as u64,
                rdev: nfs::specdata3::default(),
                fsid: 9,
                fileid: 1234,
                atime: nfs::nfstime3::default(),
                mtime: nfs::nfstime3 {
                    seconds: 5,
                    nseconds: 6,
                },
                ctime: nfs::nfstime3::default(),
            };
            let mut ours = read_reply_head(7, Some(attrs.clone()), len, true);
            ours.extend_from_slice(&data);
            ours.extend(std::iter::repeat_n(0, pad));

            let rpc = rpc_msg {
                xid: 7,
                body: msg_body::REPLY(reply_body::MSG_ACCEPTED(accepted_reply {
                    verf: opaque_auth::default(),
                    reply_data: accept_stat_data::SUCCESS,
                })),
            };
            let res = READ3res::Ok(READ3resok {
                file_attributes: nfs::post_op_attr::Some(attrs),
                count: len as u32,
                eof: true,
                data: Opaque::owned(data),
            });
            let mut theirs = Vec::new();
            rpc.pack(&mut theirs).expect("pack");
            res.pack(&mut theirs).expect("pack");
            let mark = (theirs.len() as u32 | 0x8000_0000).to_be_bytes();
            assert_eq!(&ours[..4], &mark, "record mark for {len} bytes");
            assert_eq!(&ours[4..], &theirs[..], "reply for {len} bytes");
        }
    }

    #[test]
    fn a_records_body_joins_its_fragments_and_borrows_a_lone_one() {
        let lone = Record([&(3 | LAST_FRAGMENT).to_be_bytes()[..], b"abc"].concat());
        assert!(matches!(lone.body(), Cow::Borrowed(b"abc")));
        let pieces = Record(
            [
                &2u32.to_be_bytes()[..],
                b"ab",
                &(3 | LAST_FRAGMENT).to_be_bytes()[..],
                b"cde",
            ]
            .concat(),
        );
        assert_eq!(&*pieces.body(), b"abcde");
    }

    /// The reply body after the RPC header of record `record`.
    fn results(record: &[u8]) -> Cursor<&[u8]> {
        let mut cursor = Cursor::new(&record[4..]);
        rpc_msg::unpack(&mut cursor).expect("an RPC reply");
        cursor
    }

    #[test]
    fn a_changes_jukebox_is_its_procedures_whole_failure_result() {
        use nfs::NFS_PROGRAM as P;
        fn check<T: Unpack>(proc: P) {
            let falses = change_failure_falses(proc as u32).expect("a change");
            let reply = failure_reply(7, nfsstat3::NFS3ERR_JUKEBOX, falses);
            let mut cursor = results(&reply);
            T::unpack(&mut cursor).expect("unpacks");
            assert_eq!(
                cursor.position() as usize,
                reply.len() - 4,
                "{proc:?}: all of it"
            );
        }
        check::<nfs::SETATTR3res>(P::NFSPROC3_SETATTR);
        check::<nfs::WRITE3res>(P::NFSPROC3_WRITE);
        check::<nfs::CREATE3res>(P::NFSPROC3_CREATE);
        check::<nfs::MKDIR3res>(P::NFSPROC3_MKDIR);
        check::<nfs::SYMLINK3res>(P::NFSPROC3_SYMLINK);
        check::<nfs::REMOVE3res>(P::NFSPROC3_REMOVE);
        check::<nfs::RMDIR3res>(P::NFSPROC3_RMDIR);
        check::<nfs::RENAME3res>(P::NFSPROC3_RENAME);
        check::<nfs::COMMIT3res>(P::NFSPROC3_COMMIT);
    }

    #[test]
    fn a_kept_reply_answers_a_retry_with_the_retrys_xid() {
        let first = failure_reply(1, nfsstat3::NFS3ERR_NOENT, 2);
        let again = record_with_xid(2, &first[4..]);
        assert_eq!(&again[..4], &first[..4], "the same record mark");
        assert_eq!(&again[4..8], &2u32.to_be_bytes());
        assert_eq!(&again[8..], &first[8..]);
    }

    #[test]
    fn a_handle_names_an_inode_only_in_its_own_generation() {
        let mut fh = 42u64.to_le_bytes().to_vec();
        fh.extend_from_slice(&7u64.to_be_bytes());
        assert_eq!(ino_of(&fh, 42), Some(7));
        assert_eq!(ino_of(&fh, 41), None);
        assert_eq!(ino_of(&fh[..12], 42), None);
    }
}
