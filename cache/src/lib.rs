//! The core of stagefs, independent of FUSE.
//!
//! A [`source::SourceTree`] is the slow directory being mirrored; a [`store::Store`] is
//! the local cache directory; a [`stage::Stager`] copies whole files from one to the
//! other, one copy per file however many callers ask at once. Nothing here knows about
//! inodes, replies or errno: the `fs` crate adapts these types to the kernel.

pub mod admin;
pub mod budget;
pub mod copy;
pub mod defaults;
pub mod error;
#[cfg(any(test, feature = "fault-injection"))]
pub mod faulty;
pub mod fskind;
pub mod hf;
pub mod index;
pub mod key;
pub mod metrics;
pub mod models;
pub mod prefetch;
pub mod source;
pub mod source_pool;
pub mod stage;
pub mod store;
pub mod sys;
pub mod units;

pub use budget::Budget;
pub use error::{Remedy, SourceError, StageError, StoreError};
pub use index::Entry;
pub use key::Key;
pub use metrics::{Metrics, MetricsSnapshot};
pub use source::{EntryKind, LocalDir, ReadAt, Source, SourceFile, SourceMeta, SourceTree, Stamp};
pub use source_pool::{SUSPECT_AFTER, SourceHealth, SourcePool, Unanswered};
pub use stage::{InFlight, Staged, Stager, StagerOptions};
pub use store::Store;
