//! The core of stagefs, independent of FUSE and NFS.
//!
//! A [`SourceTree`] is the slow directory being mirrored; a [`Store`] is the local
//! cache directory; a [`Stager`] copies whole files from one to the other, one copy
//! per file however many callers ask at once. Nothing here knows about inodes,
//! replies or errno: the `policy` crate decides what a mount answers, and the `fuse`
//! and `nfs` crates adapt it to the kernel.
//!
//! The modules are rooms by job:
//! - [`source`]: the source and its backends, the bounded threads every source
//!   operation runs on ([`source::pool`]), what kind of filesystem it is
//!   ([`source::fskind`]), and the fault-injecting source for tests (feature
//!   `fault-injection`);
//! - [`stage`]: staging a file ([`Stager`]), the copy itself ([`stage::copy`]) and
//!   prefetch ([`stage::prefetch`]);
//! - [`store`]: the cache directory, its index, keys and budget;
//! - [`layout`]: how a source's files form models (the HF hub layout, model folders,
//!   GGUF files);
//! - [`admin`]: status, evict and verify, and the server side of the control protocol
//!   (whose requests and reports are the `stagefs-control` crate);
//! - shared by all: [`error`], [`metrics`], [`defaults`], [`units`], [`sys`].

pub mod admin;
pub mod defaults;
pub mod error;
pub mod layout;
pub mod metrics;
pub mod source;
pub mod stage;
pub mod store;
pub mod sys;
pub mod units;

pub use error::{
    Remedy, SourceError, StageError, StoreError, io_text, is_away_errno, without_os_error,
};
pub use metrics::{Metrics, MetricsSnapshot};
pub use source::pool::{KNOWN_AWAY_WAIT, SUSPECT_AFTER, SourceHealth, SourcePool, Unanswered};
pub use source::{
    CreateFile, EntryKind, LocalDir, ReadAt, SetTime, Source, SourceFile, SourceMeta, SourceTree,
    Stamp, WritableFile, WriteOpen,
};
pub use stage::{InFlight, Staged, Stager, StagerOptions};
pub use store::Store;
pub use store::budget::Budget;
pub use store::index::Entry;
pub use store::key::Key;
