//! The NFSv3 adapter of stagefs: a loopback NFSv3 server (the `nfs3_server` crate)
//! over the backend-neutral [`stagefs_policy::Policy`], which the system's own NFS
//! client mounts. This is how stagefs reaches a Mac without a kernel extension:
//! `mount_nfs` mounts a server on 127.0.0.1 as an ordinary user.
//!
//! The adapter only translates: NFS procedures to the policy's calls
//! ([`server::StageNfs`]), its errors to `nfsstat3` ([`status`]), its attributes
//! to `fattr3` ([`attrs`]). What NFS adds, and this crate owns:
//! - NFSv3 has no OPEN: a file's first READ opens it in the policy, which stages it;
//!   a READ that would wait past a hold planned against the client's back-off
//!   answers `NFS3ERR_JUKEBOX` and the client retries, so it never marks the server
//!   "not responding" and a retry is waiting when the copy ends ([`reads`],
//!   [`jukebox`]); any other call that waits on a slow source past 4.5 s is
//!   answered JUKEBOX by the connection front, the library going on so that the
//!   retry is answered from memory, and a change's retry with the change's own
//!   result, never done twice (`front`, `retries`);
//! - file handles outlive the server: they carry the inode journal's generation and
//!   the policy's journaled inode number ([`handle`]);
//! - a loopback port is open to every local process: only AUTH_UNIX calls of the
//!   serving user or root, and (on Linux) only connections from reserved ports, are
//!   served ([`access`], [`listen`]); a NULL ping, which does nothing, is answered for any
//!   credentials, as Linux's kernel pings with AUTH_NULL (`front`);
//! - NFSv3 has no CLOSE either: a file's first WRITE (or its CREATE) opens it for
//!   writing in the policy, and the handle is closed once idle, which commits the
//!   copy staged as it was written ([`writes`]);
//! - mounting with the system's NFS client, with deliberate options ([`kernel_mount`]);
//! - the READs of files open from a staged copy are answered by a connection front
//!   straight from the page cache (`sendfile` on Linux), and every other call is
//!   relayed to the library's listener behind it (`front`, `send_file`).

pub mod access;
pub mod attrs;
#[cfg(feature = "client")]
pub mod client;
mod exclusive;
mod front;
pub mod handle;
mod intents;
pub mod jukebox;
pub mod kernel_mount;
pub mod listen;
pub mod reads;
mod retries;
mod send_file;
pub mod server;
mod specials;
pub mod status;
pub mod writes;

pub use listen::{Serving, serve};
pub use server::StageNfs;
