//! The control protocol of stagefs, apart from the cache it controls.
//!
//! A running mount listens on a Unix socket in its cache directory and answers one
//! JSON request per line ([`protocol`]); the answers carry the reports of the cache's
//! administration ([`report`]) and of prefetches ([`prefetch`]), made of the values in
//! [`values`]. The mount (which serves the requests) and the
//! CLI (which sends them and prints the answers) share these types; nothing here
//! stages, stores or reads a source. [`units`] reads and writes the sizes and
//! durations users type and read.

pub mod prefetch;
pub mod protocol;
pub mod report;
pub mod units;
pub mod values;

pub use prefetch::{FileProgress, FileState, Target};
pub use protocol::{
    MountRecord, Request, Response, SOCKET_NAME, SourceFs, query, socket_path, stream,
};
pub use report::{
    EvictReport, EvictSelector, FileRef, Mismatch, ModelStatus, OfflineReadiness, RevisionStatus,
    StatusReport, TooLarge, UnfollowableLink, VerifyReport,
};
pub use values::{
    Backend, Budget, Hold, InFlight, MetricsSnapshot, ModelKind, Remedy, SourceHealth,
    StagingFailure, Stopping, Usage, VolumeSpace,
};
