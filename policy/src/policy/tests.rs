//! The policy's rules, driven through a fault-injecting source without a kernel.
//! Deadlines in these tests are liveness bounds far above what the rule allows
//! (an answer from memory within seconds where the source timeout is minutes),
//! never measurements.

use std::ffi::OsString;
use std::fs;
use std::time::Instant;

use sha2::{Digest, Sha256};
use stagefs_source::faulty::{Behaviour, FaultySource};
use stagefs_source::{EntryKind, SourceTree};
use stagefs_stage::StagerOptions;
use stagefs_store::{Budget, Store};
use tempfile::TempDir;

use super::*;

const MIB: usize = 1 << 20;
/// Far longer than any rule may make a request wait.
const PATIENT: Duration = Duration::from_secs(120);
/// How long a test waits for what must happen at once.
const PROMPTLY: Duration = Duration::from_secs(10);

struct Fixture {
    _dirs: (TempDir, TempDir),
    src: PathBuf,
    source: Arc<FaultySource>,
    policy: Arc<Policy>,
    blob: PathBuf,
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// A source with a small file, a large path-keyed file and an HF blob, behind a
/// fault-injecting source, with a policy over it.
fn fixture(edit: impl FnOnce(&mut FsConfig, &mut StagerOptions, &mut Budget)) -> Fixture {
    let (src_dir, cache_dir) = (TempDir::new().expect("src"), TempDir::new().expect("cache"));
    let src = src_dir.path().to_path_buf();
    fs::write(src.join("config.json"), b"{\"small\": true}").expect("write");
    fs::write(src.join("weights.bin"), bytes(2 * MIB, 1)).expect("write");
    let blob_bytes = bytes(2 * MIB, 2);
    let sha = format!("{:x}", Sha256::digest(&blob_bytes));
    let blobs = src.join("models--acme--m/blobs");
    fs::create_dir_all(&blobs).expect("mkdir");
    fs::write(blobs.join(&sha), &blob_bytes).expect("write");
    let mut config = FsConfig {
        source_timeout: PATIENT,
        // The read path's tests are of an ordinary user's read-only mount, which
        // presents links to staged copies, whoever runs them; `writable` fixtures
        // are of a mount served by root, which presents none.
        read_only: true,
        served_by_root: false,
        ..FsConfig::default()
    };
    let mut options = stager_options(PATIENT);
    let mut budget = Budget::default();
    edit(&mut config, &mut options, &mut budget);
    options.source_timeout = config.source_timeout;
    let source = FaultySource::new(&src).expect("source");
    let store = Store::open(cache_dir.path(), budget).expect("store");
    Fixture {
        _dirs: (src_dir, cache_dir),
        src,
        policy: policy_over(&source, store, config, options),
        source,
        blob: PathBuf::from("models--acme--m/blobs").join(sha),
    }
}

/// The fixtures' stager options: four source threads, `source_timeout`.
fn stager_options(source_timeout: Duration) -> StagerOptions {
    StagerOptions {
        source_timeout,
        source_threads: 4,
        ..StagerOptions::default()
    }
}

/// A policy over `source` and `store`, on the test's runtime.
fn policy_over(
    source: &Arc<FaultySource>,
    store: Store,
    config: FsConfig,
    options: StagerOptions,
) -> Arc<Policy> {
    let runtime = Handle::current();
    let stager = Stager::with_options(
        SourceTree::from_backend(source.clone()),
        store,
        Arc::default(),
        runtime.clone(),
        options,
    );
    Arc::new(Policy::new(stager, config, runtime))
}

fn healthy() -> Fixture {
    fixture(|_, _, _| {})
}

impl Fixture {
    /// Looks `rel` up component by component, as the kernel does.
    async fn lookup(&self, rel: impl AsRef<Path>) -> Result<Attr, FsError> {
        let mut parent = ROOT_INO;
        let mut attr = None;
        for name in rel.as_ref().iter() {
            let found = self.policy.lookup(parent, name).await?;
            parent = found.ino;
            attr = Some(found);
        }
        attr.ok_or(FsError::NotADirectory)
    }

    /// Looks `rel` up within a deadline no rule may come near.
    async fn lookup_promptly(&self, rel: impl AsRef<Path>) -> Result<Attr, FsError> {
        tokio::time::timeout(PROMPTLY, self.lookup(rel))
            .await
            .expect("answered promptly, not after the source timeout")
    }

    async fn open(&self, rel: impl AsRef<Path>) -> Result<Opened, FsError> {
        let attr = self.lookup(rel).await?;
        self.policy.open(attr.ino).await
    }

    /// Opens `rel` and reads it whole through a handle, then waits for a copy the
    /// open started in the background (a small file's kept copy) to settle.
    async fn read_all(&self, rel: impl AsRef<Path>) -> Result<Vec<u8>, FsError> {
        let data = self.read_through(rel.as_ref()).await;
        self.committed(rel).await;
        data
    }

    /// Opens `rel` and reads it whole through a handle, as a loader does: what it
    /// waits for, and nothing the open started in the background.
    async fn read_through(&self, rel: impl AsRef<Path>) -> Result<Vec<u8>, FsError> {
        let opened = self.open(rel.as_ref()).await?;
        let size = opened.stamp.size;
        let fh = self.policy.register(opened, None);
        let data = self.policy.read(fh, 0, size as u32).await;
        self.policy.release(fh);
        data
    }

    /// Waits until no copy of `rel` is being staged or committed.
    async fn committed(&self, rel: impl AsRef<Path>) {
        let settled = self.policy.stager.settled(rel.as_ref());
        let _ = tokio::time::timeout(PROMPTLY, settled)
            .await
            .expect("the copy settles promptly");
    }

    fn source_bytes(&self, rel: impl AsRef<Path>) -> Vec<u8> {
        fs::read(self.src.join(rel)).expect("source file")
    }

    fn metrics(&self) -> stagefs_stage::MetricsSnapshot {
        self.policy.stager.metrics().snapshot()
    }

    fn stored(&self, rel: impl AsRef<Path>) -> bool {
        self.policy.stager.has_copy(rel.as_ref())
    }

    /// Whether the copy a writer's close staged for `rel` is in the store and
    /// trusted: the tee records the copy first and clears the writer's taint
    /// after, and an open between the two would take the copy for a stale one.
    fn trusted_copy(&self, rel: impl AsRef<Path>) -> bool {
        let rel = rel.as_ref();
        self.stored(rel) && self.policy.taints.trust(rel, false) == crate::taint::Trust::Trusted
    }
}

/// Asks for `rel` until a probe has seen the source back: a probe starts only
/// with a request, and one started while the source was still away may be the
/// one in flight when the first request after its return arrives.
async fn until_back(f: &Fixture, rel: &str) {
    let deadline = Instant::now() + PROMPTLY;
    while f.policy.pool().is_unresponsive() {
        assert!(Instant::now() < deadline, "timed out waiting for the probe");
        let _ = f.lookup(rel).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + PROMPTLY;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn errno(result: Result<impl std::fmt::Debug, FsError>) -> i32 {
    result.expect_err("an error").errno()
}

// ------------------------------------------------------------ a healthy source

#[tokio::test(flavor = "multi_thread")]
async fn a_lookup_mirrors_the_source() {
    let f = healthy();
    let attr = f.lookup("weights.bin").await.expect("lookup");
    assert_eq!(attr.kind, EntryKind::File);
    assert_eq!(attr.size, 2 * MIB as u64);
    let dir = f.lookup("models--acme--m").await.expect("lookup");
    assert_eq!(dir.kind, EntryKind::Dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_name_is_enoent() {
    let f = healthy();
    assert_eq!(errno(f.lookup("absent").await), libc::ENOENT);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_small_file_is_read_from_the_source_and_a_copy_kept() {
    // (Opening config.json next to weights.bin would prefetch that plain folder.)
    let f = fixture(|c, _, _| c.prefetch = false);
    let opened = f.open("config.json").await.expect("open");
    assert!(matches!(opened.reader, Reader::Source(_)));
    assert!(opened.pin.is_none());
    drop(opened);
    assert_eq!(
        f.read_all("config.json").await.expect("read"),
        f.source_bytes("config.json")
    );
    wait_until("the kept copy", || f.stored("config.json")).await;
    assert_eq!(f.metrics().stage_copies, 0, "kept copies are not staging");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_large_file_is_whole_in_the_cache_when_its_open_returns() {
    let f = fixture(|c, _, _| c.prefetch = false);
    let opened = f.open("weights.bin").await.expect("open");
    assert!(matches!(opened.reader, Reader::Copy(_)));
    assert!(opened.pin.is_some());
    assert!(f.stored("weights.bin"));
    drop(opened);
    assert_eq!(
        f.read_all("weights.bin").await.expect("read"),
        f.source_bytes("weights.bin")
    );
    let m = f.metrics();
    assert_eq!((m.stage_copies, m.stage_hits), (1, 1), "{m:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_staged_file_is_then_presented_as_a_link_to_its_copy() {
    let f = healthy();
    f.read_all("weights.bin").await.expect("stage");
    let attr = f.lookup("weights.bin").await.expect("lookup");
    assert_eq!(attr.kind, EntryKind::Symlink);
    let target = f.policy.readlink(attr.ino).await.expect("readlink");
    let target = PathBuf::from(OsString::from_vec(target));
    assert!(target.is_absolute(), "{}", target.display());
    assert_eq!(
        fs::read(&target).expect("copy"),
        f.source_bytes("weights.bin")
    );
    assert_eq!(f.metrics().redirects, 1);
    // Attributes of the link need nothing from the source.
    f.source.set(Behaviour::Eio);
    assert_eq!(
        f.policy.getattr(attr.ino).await.expect("getattr").kind,
        EntryKind::Symlink
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_listing_shows_staged_files_as_links_and_stages_nothing() {
    let f = healthy();
    let root = f.policy.opendir(ROOT_INO).await.expect("opendir");
    let kinds: Vec<_> = f
        .policy
        .listing(root)
        .expect("listing")
        .entries
        .iter()
        .map(|e| e.attr.kind)
        .collect();
    assert!(!kinds.contains(&EntryKind::Symlink));
    assert_eq!(f.metrics().stage_copies, 0, "listing stages nothing");
    f.read_all("weights.bin").await.expect("stage");
    let again = f.policy.opendir(ROOT_INO).await.expect("opendir");
    let listing = f.policy.listing(again).expect("listing");
    let weights = listing
        .entries
        .iter()
        .find(|e| e.name == "weights.bin")
        .expect("listed");
    assert_eq!(weights.attr.kind, EntryKind::Symlink);
    f.policy.releasedir(again);
    assert!(f.policy.listing(again).is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn with_redirects_off_a_staged_file_stays_a_file() {
    let f = fixture(|c, _, _| c.redirect = false);
    f.read_all("weights.bin").await.expect("stage");
    assert_eq!(
        f.lookup("weights.bin").await.expect("lookup").kind,
        EntryKind::File
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_link_whose_copy_was_evicted_answers_estale() {
    let f = healthy();
    f.read_all("weights.bin").await.expect("stage");
    let link = f.lookup("weights.bin").await.expect("lookup");
    // Evicted past its grace (nobody followed it yet, so nothing holds it).
    wait_until("the handle's pin to go", || {
        f.policy
            .stager
            .remove_copy(Path::new("weights.bin"))
            .is_ok()
    })
    .await;
    assert_eq!(errno(f.policy.readlink(link.ino).await), libc::ESTALE);
    // Looked up again, it is the file, whose open stages it anew.
    assert_eq!(
        f.lookup("weights.bin").await.expect("lookup").kind,
        EntryKind::File
    );
    assert_eq!(
        f.read_all("weights.bin").await.expect("read"),
        f.source_bytes("weights.bin")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_open_of_a_version_the_source_replaced_is_estale() {
    let f = fixture(|c, _, _| c.redirect = false);
    let old = f.lookup("weights.bin").await.expect("lookup");
    std::thread::sleep(Duration::from_millis(10));
    fs::write(f.src.join("weights.bin"), bytes(3 * MIB, 9)).expect("rewrite");
    assert_eq!(errno(f.policy.open(old.ino).await), libc::ESTALE);
    assert_eq!(
        f.read_all("weights.bin").await.expect("read"),
        f.source_bytes("weights.bin")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_replaced_by_one_of_the_same_size_and_mtime_is_staged_again() {
    let f = fixture(|c, _, _| {
        c.redirect = false;
        c.prefetch = false;
    });
    let old = f.read_all("weights.bin").await.expect("stage");
    // `cp -p`, `rsync -t` or a download renamed over it: a new inode, with the
    // old file's size and mtime.
    let path = f.src.join("weights.bin");
    let mtime = fs::metadata(&path)
        .expect("stat")
        .modified()
        .expect("mtime");
    let replacement = f.src.join(".weights.bin.part");
    fs::write(&replacement, bytes(old.len(), 99)).expect("write");
    fs::File::options()
        .write(true)
        .open(&replacement)
        .and_then(|file| file.set_modified(mtime))
        .expect("set the mtime back");
    fs::rename(&replacement, &path).expect("rename over");
    let read = f.read_all("weights.bin").await.expect("read");
    assert!(
        read == f.source_bytes("weights.bin"),
        "the old copy was served"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_changing_mid_copy_is_refused_and_never_stored() {
    let f = fixture(|c, _, _| c.prefetch = false);
    f.source
        .rewrite_after("weights.bin", MIB as u64, bytes(2 * MIB, 7));
    assert_eq!(errno(f.open("weights.bin").await), libc::EIO);
    assert!(!f.stored("weights.bin"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_blob_named_by_its_sha256_is_served_without_asking_the_source() {
    // (A prefetch scan on open would ask the source about the snapshot.)
    let f = fixture(|c, _, _| {
        c.redirect = false;
        c.prefetch = false;
    });
    let blob = f.lookup(&f.blob).await.expect("lookup");
    drop(f.policy.open(blob.ino).await.expect("stage"));
    let before = f.source.calls();
    let opened = f.policy.open(blob.ino).await.expect("open");
    assert_eq!(f.source.calls(), before, "the source was asked");
    assert!(matches!(opened.reader, Reader::Copy(_)));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_source_passes_its_errno_on() {
    let f = healthy();
    f.source.set(Behaviour::Eio);
    assert_eq!(errno(f.lookup("weights.bin").await), libc::EIO);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_the_budget_cannot_hold_fails_with_enospc() {
    let f = fixture(|_, _, b| b.max_size = Some(MIB as u64));
    assert_eq!(errno(f.open("weights.bin").await), libc::ENOSPC);
}

#[tokio::test(flavor = "multi_thread")]
async fn with_on_full_read_source_it_is_read_from_the_source() {
    let f = fixture(|c, _, b| {
        c.on_full = OnFull::ReadSource;
        b.max_size = Some(MIB as u64);
    });
    let opened = f.open("weights.bin").await.expect("open");
    assert!(matches!(opened.reader, Reader::Source(_)));
    drop(opened);
    assert_eq!(
        f.read_all("weights.bin").await.expect("read"),
        f.source_bytes("weights.bin")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_open_handle_keeps_its_copy_until_released() {
    let f = fixture(|c, _, _| c.redirect = false);
    let weights = Path::new("weights.bin");
    let fh = f
        .policy
        .register(f.open("weights.bin").await.expect("open"), None);
    assert!(f.policy.stager.remove_copy(weights).is_err(), "in use");
    f.policy.release(fh);
    wait_until("the release", || {
        f.policy.stager.remove_copy(weights).is_ok()
    })
    .await;
    assert_eq!(errno(f.policy.read(fh, 0, 1).await), libc::ESTALE);
}

#[tokio::test(flavor = "multi_thread")]
async fn directory_operations_on_files_and_file_operations_on_directories_fail() {
    let f = healthy();
    let file = f.lookup("config.json").await.expect("lookup");
    assert_eq!(errno(f.policy.opendir(file.ino).await), libc::ENOTDIR);
    let dir = f.lookup("models--acme--m").await.expect("lookup");
    assert_eq!(errno(f.policy.open(dir.ino).await), libc::EISDIR);
    assert_eq!(errno(f.policy.getattr(9_999).await), libc::ESTALE);
}

// ------------------------------------------------------------ a source that stops answering

#[tokio::test(flavor = "multi_thread")]
async fn while_the_source_hangs_a_staged_model_is_served_from_what_it_said_last() {
    let f = fixture(|c, _, _| c.redirect = false);
    let expected = f.source_bytes("weights.bin");
    f.read_all("weights.bin").await.expect("stage");
    f.read_all("config.json").await.expect("read");
    wait_until("the kept copy", || f.stored("config.json")).await;
    f.source.set(Behaviour::Hang);
    // Not `read_all`: an open made before the hung lookup's call has run 60 ms on a
    // source thread (a busy machine) starts a copy that waits out the source timeout,
    // though the open itself is served from the stored copy once the source is suspect.
    let read = tokio::time::timeout(PROMPTLY, async {
        (
            f.read_through("weights.bin").await,
            f.read_through("config.json").await,
        )
    })
    .await
    .expect("served promptly, not after the source timeout");
    assert_eq!(read.0.expect("weights"), expected);
    assert_eq!(read.1.expect("config"), f.source_bytes("config.json"));
    f.source.set(Behaviour::Healthy);
}

#[tokio::test(flavor = "multi_thread")]
async fn while_the_source_hangs_links_to_staged_copies_keep_resolving() {
    let f = healthy();
    f.read_all("weights.bin").await.expect("stage");
    f.lookup("weights.bin").await.expect("lookup");
    f.source.set(Behaviour::Hang);
    let link = f.lookup_promptly("weights.bin").await.expect("from memory");
    assert_eq!(link.kind, EntryKind::Symlink);
    let target = tokio::time::timeout(PROMPTLY, f.policy.readlink(link.ino))
        .await
        .expect("readlink needs no source");
    assert!(target.is_ok());
    f.source.set(Behaviour::Healthy);
}

// ------------------------------------------------------------ a source that fails fast or vanishes

/// A model read once, then a source that fails every call at once with `errno`.
async fn staged_then_failing(errno: i32) -> (Fixture, Vec<u8>) {
    let f = fixture(|c, _, _| c.redirect = false);
    let expected = f.source_bytes("weights.bin");
    f.read_all("weights.bin").await.expect("stage");
    f.read_all("config.json").await.expect("read");
    wait_until("the kept copy", || f.stored("config.json")).await;
    f.policy.list(ROOT_INO).await.expect("listed");
    f.source.set(Behaviour::Fails(errno));
    (f, expected)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_fuse_source_serves_the_staged_model_and_fails_the_rest_with_eio() {
    // ENOTCONN is what a killed sshfs answers, at once, to everything.
    let (f, expected) = staged_then_failing(libc::ENOTCONN).await;
    assert_eq!(f.read_all("weights.bin").await.expect("staged"), expected);
    let config = f.read_all("config.json").await.expect("kept copy");
    assert_eq!(config, f.source_bytes("config.json"));
    let listed = f.policy.list(ROOT_INO).await.expect("listing from memory");
    assert!(listed.iter().any(|e| e.name == "weights.bin"));
    assert!(f.policy.pool().is_unresponsive(), "counted as away");
    // A name the kept listing lacks is absent, as the source said; a name in a
    // directory never listed is unknown.
    assert_eq!(errno(f.lookup_promptly("never-seen").await), libc::ENOENT);
    let unknown = "models--acme--m/never-seen";
    assert_eq!(errno(f.lookup_promptly(unknown).await), libc::EIO);
    f.source.set(Behaviour::Healthy);
    until_back(&f, "config.json").await;
    assert_eq!(errno(f.lookup("never-seen").await), libc::ENOENT, "back");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_name_the_source_said_was_absent_is_absent_while_the_source_hangs() {
    // What loaders probe: an HF_HOME's token, a model's generation_config.json.
    let f = healthy();
    for name in ["token", "models--acme--m/generation_config.json"] {
        assert_eq!(errno(f.lookup(name).await), libc::ENOENT, "{name}");
    }
    f.source.set(Behaviour::Hang);
    for name in ["token", "models--acme--m/generation_config.json"] {
        assert_eq!(
            errno(f.lookup_promptly(name).await),
            libc::ENOENT,
            "{name} while the source hangs"
        );
    }
    f.source.set(Behaviour::Healthy);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_remembered_absence_answers_while_the_source_is_away_and_gives_way_once_it_is_back() {
    let f = fixture(|c, _, _| c.redirect = false);
    assert_eq!(errno(f.lookup("token").await), libc::ENOENT);
    f.source.set(Behaviour::Fails(libc::ENOTCONN));
    assert_eq!(
        errno(f.lookup_promptly("token").await),
        libc::ENOENT,
        "remembered"
    );
    assert_eq!(
        errno(f.lookup_promptly("never-asked").await),
        libc::EIO,
        "unknown"
    );
    // Made at the source meanwhile: once the source is back, it is there.
    fs::write(f.src.join("token"), b"hf_secret").expect("write");
    f.source.set(Behaviour::Healthy);
    until_back(&f, "config.json").await;
    let attr = f
        .lookup("token")
        .await
        .expect("there once the source is back");
    assert_eq!(attr.size, 9);
    f.source.set(Behaviour::Fails(libc::ENOTCONN));
    let known = f.lookup_promptly("token").await.expect("what it said last");
    assert_eq!(
        known.size, 9,
        "the absence was forgotten when the name was found"
    );
    f.source.set(Behaviour::Healthy);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_errno_of_a_lost_server_counts_as_the_source_away() {
    for errno_away in [libc::EIO, libc::ESTALE, libc::EHOSTDOWN, libc::ENETUNREACH] {
        let (f, expected) = staged_then_failing(errno_away).await;
        assert_eq!(
            f.read_all("weights.bin").await.expect("staged"),
            expected,
            "{errno_away}"
        );
        assert!(f.policy.pool().is_unresponsive(), "{errno_away}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_errno_about_the_file_is_passed_on_and_is_no_outage() {
    let (f, _) = staged_then_failing(libc::EACCES).await;
    assert_eq!(errno(f.lookup("weights.bin").await), libc::EACCES);
    assert!(!f.policy.pool().is_unresponsive());
}

#[tokio::test(flavor = "multi_thread")]
async fn once_the_source_is_known_away_a_name_never_seen_is_not_waited_for() {
    // The timeout is PATIENT (120 s); the source is known away from a fast error,
    // then hangs: a lookup of a name no one has seen fails well before it.
    let (f, _) = staged_then_failing(libc::EHOSTDOWN).await;
    // In a directory never listed: nothing is known of them.
    assert_eq!(errno(f.lookup("models--acme--m/first").await), libc::EIO);
    f.source.set(Behaviour::Hang);
    for name in ["models--acme--m/trees", "models--acme--m/refs-unseen"] {
        assert_eq!(errno(f.lookup_promptly(name).await), libc::EIO, "{name}");
    }
    f.source.set(Behaviour::Healthy);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_name_never_seen_fails_with_eio_within_the_source_timeout() {
    let f = fixture(|c, _, _| c.source_timeout = Duration::from_millis(300));
    f.source.set(Behaviour::Hang);
    let started = Instant::now();
    assert_eq!(errno(f.lookup("weights.bin").await), libc::EIO);
    assert!(started.elapsed() < PROMPTLY);
    assert!(f.policy.pool().is_unresponsive());
    f.source.set(Behaviour::Healthy);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_never_staged_fails_with_eio_while_the_source_hangs() {
    let f = fixture(|c, _, _| {
        c.source_timeout = Duration::from_millis(300);
        c.prefetch = false;
    });
    let attr = f.lookup("weights.bin").await.expect("lookup");
    f.source.set(Behaviour::Hang);
    assert_eq!(errno(f.policy.open(attr.ino).await), libc::EIO);
    f.source.set(Behaviour::Healthy);
}

#[tokio::test(flavor = "multi_thread")]
async fn once_every_source_thread_is_stuck_a_lookup_fails_at_once() {
    let f = fixture(|c, o, _| {
        c.source_timeout = Duration::from_millis(200);
        o.source_threads = 2;
    });
    f.source.set(Behaviour::Hang);
    for name in ["a", "b"] {
        assert_eq!(errno(f.lookup(name).await), libc::EIO);
    }
    wait_until("both threads to be stuck", || f.policy.pool().saturated()).await;
    assert_eq!(errno(f.lookup("c").await), libc::EIO);
    assert_eq!(
        f.policy.pool().health().running,
        2,
        "no third thread was taken"
    );
    f.source.set(Behaviour::Healthy);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_open_waiting_for_a_stuck_pool_stages_once_a_thread_comes_free() {
    let f = fixture(|c, o, _| {
        c.source_timeout = Duration::from_millis(400);
        c.prefetch = false;
        o.source_threads = 1;
    });
    let attr = f.lookup("weights.bin").await.expect("lookup");
    f.source.set(Behaviour::Hang);
    assert_eq!(errno(f.lookup("a").await), libc::EIO);
    wait_until("the thread to be stuck", || f.policy.pool().saturated()).await;
    let policy = Arc::clone(&f.policy);
    let opening = tokio::spawn(async move { policy.open(attr.ino).await.map(|o| o.stamp) });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!opening.is_finished(), "it did not fail at once");
    f.source.set(Behaviour::Healthy);
    let stamp = tokio::time::timeout(PROMPTLY, opening)
        .await
        .expect("answered")
        .expect("task")
        .expect("staged once the thread came free");
    assert_eq!(stamp.size, 2 * MIB as u64);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_source_is_declared_back_by_a_probe_and_serves_at_once() {
    let f = fixture(|c, _, _| c.source_timeout = Duration::from_millis(300));
    f.lookup("config.json").await.expect("lookup");
    f.source.set(Behaviour::Hang);
    assert_eq!(errno(f.lookup("weights.bin").await), libc::EIO);
    assert!(f.policy.pool().is_unresponsive());
    f.source.set(Behaviour::Healthy);
    // A name never seen goes to the source even while it is marked down.
    assert!(f.lookup("weights.bin").await.is_ok());
    // A remembered one is answered from memory and sends the probe.
    f.lookup("config.json").await.expect("lookup");
    wait_until("the probe", || !f.policy.pool().is_unresponsive()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_source_is_waited_for_when_there_is_nothing_to_recall() {
    let f = healthy();
    f.source.set(Behaviour::Slow(SUSPECT_AFTER * 2));
    let attr = f.lookup("weights.bin").await.expect("slow but there");
    assert_eq!(attr.size, 2 * MIB as u64);
    assert!(!f.policy.pool().is_unresponsive(), "slow is not gone");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_listing_is_recalled_while_the_source_hangs() {
    let f = healthy();
    let fh = f.policy.opendir(ROOT_INO).await.expect("opendir");
    let names = f.policy.listing(fh).expect("listing").entries.len();
    f.source.set(Behaviour::Hang);
    let again = tokio::time::timeout(PROMPTLY, f.policy.opendir(ROOT_INO))
        .await
        .expect("from memory")
        .expect("listing");
    assert_eq!(
        f.policy.listing(again).expect("listing").entries.len(),
        names
    );
    f.source.set(Behaviour::Healthy);
}

#[tokio::test(flavor = "multi_thread")]
async fn statfs_asks_the_source_and_fails_with_eio_when_it_hangs() {
    let f = fixture(|c, _, _| c.source_timeout = Duration::from_millis(200));
    assert!(f.policy.statfs().await.is_ok());
    f.source.set(Behaviour::Hang);
    assert_eq!(errno(f.policy.statfs().await), libc::EIO);
    f.source.set(Behaviour::Healthy);
}

// The write path's tests share the fixture above.
mod writes;

// NFS links to blobs (`links.rs`).
mod links;

// ------------------------------------------------------------ answers kept with the cache

impl Fixture {
    /// The daemon restarted: a new store, stager and policy over the same cache
    /// directory and source, remembering nothing but what the cache kept.
    async fn restarted(self) -> Fixture {
        let Fixture {
            _dirs,
            src,
            source,
            policy,
            blob,
        } = self;
        let config = policy.config().clone();
        drop(policy);
        let cache = _dirs.1.path().to_path_buf();
        // Copies kept in the background hold the store until they settle.
        let store = loop {
            match Store::open(&cache, Budget::default()) {
                Ok(store) => break store,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        let options = stager_options(config.source_timeout);
        Fixture {
            _dirs,
            src,
            policy: policy_over(&source, store, config, options),
            source,
            blob,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn what_the_source_answered_is_answered_after_a_restart_with_it_away() {
    let f = fixture(|c, _, _| c.redirect = false);
    let weights = f.source_bytes("weights.bin");
    f.read_all("weights.bin").await.expect("stage");
    f.read_all("config.json").await.expect("read");
    wait_until("the kept copy", || f.stored("config.json")).await;
    f.policy.list(ROOT_INO).await.expect("listed");
    assert_eq!(errno(f.lookup("token").await), libc::ENOENT);
    let f = f.restarted().await;
    f.source.set(Behaviour::Fails(libc::ENOTCONN));

    assert_eq!(f.read_all("weights.bin").await.expect("staged"), weights);
    let config = f.read_all("config.json").await.expect("kept copy");
    assert_eq!(config, f.source_bytes("config.json"));
    let listed = f.policy.list(ROOT_INO).await.expect("the kept listing");
    assert!(listed.iter().any(|e| e.name == "models--acme--m"));
    assert_eq!(
        errno(f.lookup_promptly("token").await),
        libc::ENOENT,
        "as the source said"
    );
    assert_eq!(
        errno(f.lookup_promptly("generation_config.json").await),
        libc::ENOENT,
        "the kept listing lacks it"
    );
    let unknown = "models--acme--m/never-listed";
    assert_eq!(errno(f.lookup_promptly(unknown).await), libc::EIO);
    f.source.set(Behaviour::Healthy);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_name_found_after_it_was_absent_is_kept_as_found() {
    let f = fixture(|c, _, _| {
        c.redirect = false;
        c.read_only = false;
        c.served_by_root = true;
    });
    f.policy.list(ROOT_INO).await.expect("listed");
    assert_eq!(errno(f.lookup("made.txt").await), libc::ENOENT);
    fs::write(f.src.join("made.txt"), b"made").expect("write at the source");
    // Seen by a lookup while the source answers: the kept answer is replaced.
    f.lookup("made.txt").await.expect("found now");
    let f = f.restarted().await;
    f.source.set(Behaviour::Fails(libc::ENOTCONN));
    f.lookup_promptly("made.txt")
        .await
        .expect("kept as found, not as absent");
    f.source.set(Behaviour::Healthy);
}
