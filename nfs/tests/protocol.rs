//! The NFS adapter at the protocol level, with the `nfs3_client` crate's client over
//! loopback against an in-process server whose source injects faults: JUKEBOX while
//! a file stages and its bytes after, listings and attributes that stage nothing,
//! links served verbatim, EIO from a dead source, and who is let in; and the write
//! procedures: what they leave on the source, what is read back after them (also
//! from a copy the connection front was serving), and how a failing source or a
//! read-only export answers.
//!
//! Run as root: the server serves only connections from reserved ports, which the
//! client binds.

use std::fs;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nfs3_client::Nfs3ConnectionBuilder;
use nfs3_client::tokio::TokioConnector;
use nfs3_server::nfs3_types::nfs3::{
    COMMIT3args, CREATE3args, FSSTAT3args, GETATTR3args, LINK3args, MKDIR3args, MKNOD3args,
    Nfs3Option, Nfs3Result, READ3args, READDIRPLUS3args, READLINK3args, REMOVE3args, RENAME3args,
    RMDIR3args, SETATTR3args, SYMLINK3args, WRITE3args, cookieverf3, createhow3, createverf3,
    diropargs3, fattr3, filename3, ftype3, mknoddata3, nfs_fh3, nfspath3, nfsstat3, post_op_fh3,
    sattr3, sattrguard3, stable_how, symlinkdata3,
};
use nfs3_server::nfs3_types::rpc::{
    accept_stat_data, accepted_reply, call_body, msg_body, opaque_auth, reply_body, rpc_msg,
};
use nfs3_server::nfs3_types::xdr_codec::{Opaque, Pack, Unpack};
use sha2::{Digest, Sha256};
use stagefs_nfs::Serving;
use stagefs_nfs::client::{self, Client, read, read_all, read_waiting};
use stagefs_nfs::jukebox::Backoff;
use stagefs_policy::{FsConfig, Policy};
use stagefs_source::SourceTree;
use stagefs_source::faulty::{Behaviour, FaultySource};
use stagefs_stage::{Stager, StagerOptions};
use stagefs_store::{Budget, Store};
use tempfile::TempDir;

const MIB: usize = 1 << 20;
/// Far longer than anything here may take.
const PATIENT: Duration = Duration::from_secs(60);

struct Fixture {
    _dirs: (TempDir, TempDir),
    src: PathBuf,
    source: Arc<FaultySource>,
    serving: Serving,
    stager: Stager,
    blob_sha: String,
}

/// `len` bytes that repeat nowhere within a file, so a READ answered from the wrong
/// offset never passes for the right one.
fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8 ^ seed)
        .collect()
}

/// A hub-cache repository (a blob, its snapshot link, refs), a large plain file and
/// a small one, behind a fault-injecting source, served over NFS.
async fn fixture(source_timeout: Duration) -> Fixture {
    fixture_with(source_timeout, false).await
}

/// [`fixture`], read-only if asked.
async fn fixture_with(source_timeout: Duration, read_only: bool) -> Fixture {
    assert_eq!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
        0,
        "the NFS protocol tests bind reserved ports: run them as root"
    );
    let (src_dir, cache_dir) = (TempDir::new().expect("src"), TempDir::new().expect("cache"));
    let src = src_dir.path().to_path_buf();
    let blob = bytes(3 * MIB, 7);
    let sha = format!("{:x}", Sha256::digest(&blob));
    let repo = src.join("models--acme--tiny");
    fs::create_dir_all(repo.join("blobs")).expect("mkdir");
    fs::create_dir_all(repo.join("snapshots/abc")).expect("mkdir");
    fs::create_dir_all(repo.join("refs")).expect("mkdir");
    fs::write(repo.join("blobs").join(&sha), &blob).expect("write");
    std::os::unix::fs::symlink(
        format!("../../blobs/{sha}"),
        repo.join("snapshots/abc/model.safetensors"),
    )
    .expect("link");
    fs::write(repo.join("refs/main"), b"abc").expect("write");
    fs::write(src.join("weights.bin"), bytes(4 * MIB, 1)).expect("write");
    fs::write(src.join("config.json"), b"{}").expect("write");
    let source = FaultySource::new(&src).expect("source");
    let config = FsConfig {
        source_timeout,
        min_stage_size: MIB as u64,
        prefetch: false,
        redirect: false,
        read_only,
        ..FsConfig::default()
    };
    let options = StagerOptions {
        source_timeout,
        source_threads: 4,
        ..StagerOptions::default()
    };
    let store = Store::open(cache_dir.path(), Budget::default()).expect("store");
    let runtime = tokio::runtime::Handle::current();
    let stager = Stager::with_options(
        SourceTree::from_backend(source.clone()),
        store,
        Arc::default(),
        runtime.clone(),
        options,
    );
    let policy = Policy::with_inode_journal(
        stager.clone(),
        config,
        runtime,
        &cache_dir.path().join("inodes.jsonl"),
    )
    .expect("policy");
    let serving = stagefs_nfs::serve(Arc::new(policy), SocketAddr::from(([127, 0, 0, 1], 0)), 0)
        .await
        .expect("serve");
    Fixture {
        _dirs: (src_dir, cache_dir),
        src,
        source,
        serving,
        stager,
        blob_sha: sha,
    }
}

async fn connect(addr: SocketAddr, uid: u32, path: &str) -> Result<Client, String> {
    client::connect(addr, uid, path)
        .await
        .map_err(|e| e.to_string())
}

impl Fixture {
    async fn client(&self) -> Client {
        connect(self.serving.addr, 0, "/")
            .await
            .expect("mount as root")
    }

    fn copies(&self) -> u64 {
        self.stager.metrics().snapshot().stage_copies
    }

    fn source_bytes(&self, rel: impl AsRef<Path>) -> Vec<u8> {
        fs::read(self.src.join(rel)).expect("source file")
    }
}

async fn lookup(client: &mut Client, path: &str) -> Result<nfs_fh3, nfsstat3> {
    client::lookup(client, Path::new(path)).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_of_a_file_still_staging_answers_jukebox_then_the_whole_file() {
    let f = fixture(PATIENT).await;
    let mut client = f.client().await;
    let fh = lookup(&mut client, "weights.bin").await.expect("lookup");
    // The copy cannot finish while the source hangs: the READ is held, then told to
    // come back later, and the copy goes on without it.
    f.source.set(Behaviour::Hang);
    assert_eq!(
        read(&mut client, &fh, 0, 4096).await,
        Err(nfsstat3::NFS3ERR_JUKEBOX)
    );
    assert_eq!(f.copies(), 0, "nothing served before the copy is whole");
    f.source.set(Behaviour::Healthy);
    let data = read_all(&mut client, &fh).await.expect("read");
    assert!(
        data == f.source_bytes("weights.bin"),
        "the bytes are the source's"
    );
    assert_eq!(f.copies(), 1, "one copy for every READ");
}

/// A client that backs off after a JUKEBOX as Apple's does (4 s, 8, 16, then 30 s)
/// reads a file whose copy takes about 10 s: it is answered soon after the copy
/// ends, not a whole back-off later, and no call of it is held past the 5 s after
/// which a Mac says "server not responding".
#[tokio::test(flavor = "multi_thread")]
async fn a_macos_client_is_answered_within_2_s_of_a_10_s_copy_and_no_call_waits_5_s() {
    let f = fixture(PATIENT).await;
    let file = Path::new("slow.bin");
    fs::write(f.src.join(file), bytes(64 * MIB, 3)).expect("write");
    let mut client = f.client().await;
    let fh = lookup(&mut client, "slow.bin").await.expect("lookup");
    // 625 ms per read of the file (4 at once, of 1 MiB): a 64 MiB copy of about 10 s.
    f.source
        .set(Behaviour::SlowReads(Duration::from_millis(625)));
    let started = Instant::now();
    let (mut copied, mut jukeboxes, mut longest_call) = (None, 0u32, Duration::ZERO);
    let data = loop {
        let sent = Instant::now();
        let answer = read(&mut client, &fh, 0, MIB as u32).await;
        longest_call = longest_call.max(sent.elapsed());
        match answer {
            Ok((data, _)) => break data,
            Err(nfsstat3::NFS3ERR_JUKEBOX) => {
                let stager = f.stager.clone();
                copied.get_or_insert_with(|| {
                    tokio::spawn(async move {
                        stager.settled(file).await.expect("the copy");
                        Instant::now()
                    })
                });
                tokio::time::sleep(Backoff::Apple.delay(jukeboxes)).await;
                jukeboxes += 1;
            }
            Err(stat) => panic!("read: {stat}"),
        }
    };
    let answered = Instant::now();
    let copy_ended = copied.expect("a JUKEBOX").await.expect("the copy's end");
    assert!(
        data == f.source_bytes(file)[..MIB],
        "the bytes are the source's"
    );
    let copy = copy_ended - started;
    assert!(
        (6..=20).contains(&copy.as_secs()),
        "the copy took {copy:?}: this test needs one of about 10 s (recalibrate the delay)"
    );
    let late = answered.saturating_duration_since(copy_ended);
    assert!(
        late <= Duration::from_secs(2),
        "answered {late:?} after a {copy:?} copy ended, after {jukeboxes} JUKEBOXes"
    );
    assert!(
        jukeboxes >= 1,
        "a copy longer than any hold answered no JUKEBOX"
    );
    eprintln!(
        "{copy:?} copy: answered {late:?} after it, {jukeboxes} JUKEBOXes, longest call {longest_call:?}"
    );
    assert!(
        longest_call < Duration::from_secs(5),
        "a call waited {longest_call:?}"
    );
}

/// A source that takes 6 s per operation: a LOOKUP of a name never seen, and a
/// READDIRPLUS, are each answered within 5 s (a Mac says "not responding" past
/// that): JUKEBOX while the source works, and the retry a client sends after its
/// back-off gets the answer, from what the source said meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn calls_waiting_on_a_slow_source_answer_jukebox_in_time_and_retries_get_the_answer() {
    let f = fixture(PATIENT).await;
    fs::write(f.src.join("late.txt"), b"late").expect("write");
    let mut client = f.client().await;
    f.source.set(Behaviour::Slow(Duration::from_secs(6)));
    let (mut longest, mut jukeboxes) = (Duration::ZERO, 0);
    for call in ["lookup", "readdirplus"] {
        let mut tries = 0;
        loop {
            let sent = Instant::now();
            let answer = unhurried_call(&mut client, call).await;
            longest = longest.max(sent.elapsed());
            match answer {
                Ok(()) => break,
                Err(nfsstat3::NFS3ERR_JUKEBOX) => {
                    jukeboxes += 1;
                    tries += 1;
                    assert!(tries < 6, "{call}: still JUKEBOX after {tries} retries");
                    tokio::time::sleep(Backoff::Apple.delay(0)).await;
                }
                Err(stat) => panic!("{call}: {stat}"),
            }
        }
    }
    assert!(jukeboxes >= 1, "the slow source made no call wait");
    assert!(
        longest < Duration::from_secs(5),
        "a call waited {longest:?}"
    );
    f.source.set(Behaviour::Healthy);
}

/// Makes the call `$call` (an `async` expression answering `Result<_, nfsstat3>`)
/// until it is answered other than JUKEBOX, sleeping between tries as Apple's client
/// does (4 s, then 8); gives its answer, the longest any one try waited, and how
/// many JUKEBOXes came first.
macro_rules! until_answered {
    ($call:expr) => {{
        let (mut longest, mut jukeboxes) = (Duration::ZERO, 0u32);
        loop {
            let sent = Instant::now();
            let answer = $call.await;
            longest = longest.max(sent.elapsed());
            match answer {
                Err(nfsstat3::NFS3ERR_JUKEBOX) => {
                    assert!(jukeboxes < 5, "still JUKEBOX after {jukeboxes} retries");
                    tokio::time::sleep(Backoff::Apple.delay(jukeboxes)).await;
                    jukeboxes += 1;
                }
                answer => break (answer, longest, jukeboxes),
            }
        }
    }};
}

/// A source that takes 10 s to make any change: a CREATE, a REMOVE, a RENAME, a
/// WRITE, a SETATTR and a MKDIR are each answered within 5 s (a Mac says "not
/// responding" past that), JUKEBOX while the source works, and the retry the client
/// sends after its back-off, with a new xid, gets the first call's own result
/// (which may still be coming: the retry at 8.5 s waits for it): the file the
/// CREATE made, not EXIST; OK for the REMOVE and the RENAME, not NOENT; the MKDIR's
/// directory, though its retry came on a new connection. The source made each
/// change once.
#[tokio::test(flavor = "multi_thread")]
async fn changes_waiting_on_a_slow_source_answer_jukebox_in_time_and_retries_get_their_result() {
    let f = fixture(PATIENT).await;
    for name in ["doomed.txt", "moving.txt", "written.bin", "linked.txt"] {
        fs::write(f.src.join(name), b"x").expect("write");
    }
    fs::write(f.src.join("cut.bin"), bytes(4096, 3)).expect("write");
    let mut client = f.client().await;
    let root = client.root_nfs_fh3();
    let linked = lookup(&mut client, "linked.txt").await.expect("lookup");
    let written = lookup(&mut client, "written.bin").await.expect("lookup");
    let cut = lookup(&mut client, "cut.bin").await.expect("lookup");
    let made_before = f.source.changes().len();
    f.source
        .set(Behaviour::SlowChanges(Duration::from_secs(10)));

    let (mut c1, mut c2, mut c3, mut c4, mut c5) = (
        f.client().await,
        f.client().await,
        f.client().await,
        f.client().await,
        f.client().await,
    );
    let (mut c6, mut c7) = (f.client().await, f.client().await);
    let data = bytes(1000, 5);
    // LINK and MKNOD are the front's own (the library lacks them), bounded the same.
    let own_changes = async {
        tokio::join!(
            async { until_answered!(hard_link(&mut c6, &linked, &root, "hard.txt")) },
            async { until_answered!(mkfifo(&mut c7, &root, "pipe")) },
        )
    };
    let library_changes = async {
        tokio::join!(
            async { until_answered!(create_guarded(&mut c1, &root, "new.txt")) },
            async { until_answered!(remove(&mut c2, &root, "doomed.txt")) },
            async { until_answered!(rename(&mut c3, (&root, "moving.txt"), (&root, "moved.txt"))) },
            async { until_answered!(write(&mut c4, &written, 0, &data)) },
            async { until_answered!(truncate(&mut c5, &cut, 100)) },
            async {
                // A client whose connection closes after the JUKEBOX retries on a new one.
                let mut first = f.client().await;
                let sent = Instant::now();
                let answer = mkdir(&mut first, &root, "made").await;
                let waited = sent.elapsed();
                drop(first);
                assert_eq!(answer, Err(nfsstat3::NFS3ERR_JUKEBOX), "MKDIR");
                tokio::time::sleep(Backoff::Apple.delay(0)).await;
                let mut second = f.client().await;
                let (made, longest, _) = until_answered!(mkdir(&mut second, &root, "made"));
                (made, waited.max(longest), 1)
            },
        )
    };
    let ((hard, fifo), (created, removed, renamed, wrote, truncated, made)) =
        tokio::join!(own_changes, library_changes);
    f.source.set(Behaviour::Healthy);

    let longest = [
        created.1,
        removed.1,
        renamed.1,
        wrote.1,
        truncated.1,
        made.1,
        hard.1,
        fifo.1,
    ]
    .into_iter()
    .max()
    .expect("eight calls");
    eprintln!("the longest a change waited for an answer: {longest:?}");
    assert!(
        longest < Duration::from_secs(5),
        "a change waited {longest:?}"
    );
    for (call, jukeboxes) in [
        ("CREATE", created.2),
        ("REMOVE", removed.2),
        ("RENAME", renamed.2),
        ("WRITE", wrote.2),
        ("SETATTR", truncated.2),
        ("LINK", hard.2),
        ("MKNOD", fifo.2),
    ] {
        assert!(jukeboxes >= 1, "{call} never waited on the slow source");
    }
    let new = created
        .0
        .expect("the retried CREATE gets the first one's result");
    assert_eq!(
        lookup(&mut client, "new.txt").await.expect("lookup"),
        new,
        "the handle of the file the CREATE made"
    );
    removed
        .0
        .expect("the retried REMOVE gets the first one's result");
    renamed
        .0
        .expect("the retried RENAME gets the first one's result");
    // Their attributes may be from before the change: a source this slow is
    // suspect, and the policy answers GETATTR from memory. The source tells.
    wrote
        .0
        .expect("the retried WRITE gets the first one's result");
    truncated
        .0
        .expect("the retried SETATTR gets the first one's result");
    let made = made
        .0
        .expect("the MKDIR retried on a new connection gets its result");
    assert_eq!(lookup(&mut client, "made").await, Ok(made));
    hard.0
        .expect("the retried LINK gets the first one's result");
    fifo.0
        .expect("the retried MKNOD gets the first one's result");
    assert!(fs::symlink_metadata(f.src.join("pipe")).is_ok_and(|m| m.file_type().is_fifo()));
    assert_eq!(
        fs::metadata(f.src.join("hard.txt")).expect("link").nlink(),
        2
    );

    assert!(!f.src.join("doomed.txt").exists());
    assert!(!f.src.join("moving.txt").exists());
    assert!(f.source_bytes("moved.txt") == b"x");
    assert!(f.source_bytes("written.bin") == data);
    assert_eq!(f.source_bytes("cut.bin").len(), 100);
    let made = f.source.changes().split_off(made_before);
    for change in [
        ("create", "new.txt"),
        ("unlink", "doomed.txt"),
        ("rename", "moving.txt"),
        ("write", "written.bin"),
        ("truncate", "cut.bin"),
        ("mkdir", "made"),
        ("link", "hard.txt"),
        ("mknod", "pipe"),
    ] {
        let times = made
            .iter()
            .filter(|(what, at)| (*what, Path::new(change.1)) == (change.0, at.as_path()))
            .count();
        assert_eq!(times, 1, "{change:?} made {times} times: {made:?}");
    }
}

/// CREATE GUARDED (as Linux's `open(O_CREAT|O_EXCL)` falls back to) of `name` in
/// `dir`: EXIST if the name is taken.
async fn create_guarded(
    client: &mut Client,
    dir: &nfs_fh3,
    name: &str,
) -> Result<nfs_fh3, nfsstat3> {
    let args = CREATE3args {
        where_: dirop(dir, name),
        how: createhow3::GUARDED(mode(0o644)),
    };
    match client.nfs3_client.create(&args).await.expect("CREATE RPC") {
        Nfs3Result::Ok(ok) => match ok.obj {
            post_op_fh3::Some(fh) => Ok(fh),
            post_op_fh3::None => panic!("CREATE returned no handle"),
        },
        Nfs3Result::Err((stat, _)) => Err(stat),
    }
}

/// A LOOKUP of `late.txt`, or a READDIRPLUS of the root.
async fn unhurried_call(client: &mut Client, call: &str) -> Result<(), nfsstat3> {
    if call == "lookup" {
        return lookup(client, "late.txt").await.map(drop);
    }
    let args = READDIRPLUS3args {
        dir: client.root_nfs_fh3(),
        cookie: 0,
        cookieverf: cookieverf3::default(),
        dircount: 64 * 1024,
        maxcount: 64 * 1024,
    };
    match client.nfs3_client.readdirplus(&args).await.expect("rpc") {
        Nfs3Result::Ok(_) => Ok(()),
        Nfs3Result::Err((stat, _)) => Err(stat),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn lookups_attributes_and_listings_stage_nothing() {
    let f = fixture(PATIENT).await;
    let mut client = f.client().await;
    let args = READDIRPLUS3args {
        dir: client.root_nfs_fh3(),
        cookie: 0,
        cookieverf: cookieverf3::default(),
        dircount: 64 * 1024,
        maxcount: 64 * 1024,
    };
    let listed = match client.nfs3_client.readdirplus(&args).await.expect("rpc") {
        Nfs3Result::Ok(ok) => ok.reply.entries.0,
        Nfs3Result::Err((stat, _)) => panic!("readdirplus: {stat}"),
    };
    let mut names: Vec<_> = listed
        .iter()
        .map(|e| String::from_utf8_lossy(&e.name.0).into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["config.json", "models--acme--tiny", "weights.bin"]);
    for path in [
        "weights.bin",
        "models--acme--tiny/snapshots/abc/model.safetensors",
    ] {
        let fh = lookup(&mut client, path).await.expect("lookup");
        let attr = client
            .nfs3_client
            .getattr(&GETATTR3args { object: fh })
            .await
            .expect("rpc");
        assert!(matches!(attr, Nfs3Result::Ok(_)), "{path}");
    }
    let weights = lookup(&mut client, "weights.bin").await.expect("lookup");
    let attr = match client
        .nfs3_client
        .getattr(&GETATTR3args { object: weights })
        .await
        .expect("rpc")
    {
        Nfs3Result::Ok(ok) => ok.obj_attributes,
        Nfs3Result::Err((stat, _)) => panic!("getattr: {stat}"),
    };
    assert_eq!(attr.size, 4 * MIB as u64);
    assert_eq!(attr.type_, ftype3::NF3REG);
    assert_eq!(f.copies(), 0, "no lookup, getattr or listing stages a file");
    assert!(f.stager.store().entries().is_empty(), "nothing stored");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_link_is_served_verbatim_and_its_blob_matches_its_name() {
    let f = fixture(PATIENT).await;
    let mut client = f.client().await;
    let link = lookup(
        &mut client,
        "models--acme--tiny/snapshots/abc/model.safetensors",
    )
    .await
    .expect("lookup");
    let target = match client
        .nfs3_client
        .readlink(&READLINK3args { symlink: link })
        .await
        .expect("rpc")
    {
        Nfs3Result::Ok(ok) => String::from_utf8_lossy(&ok.data.0).into_owned(),
        Nfs3Result::Err((stat, _)) => panic!("readlink: {stat}"),
    };
    assert_eq!(target, format!("../../blobs/{}", f.blob_sha));
    // The client resolves the link itself, as the kernel does.
    let blob = lookup(
        &mut client,
        &format!("models--acme--tiny/blobs/{}", f.blob_sha),
    )
    .await
    .expect("lookup");
    let data = read_all(&mut client, &blob).await.expect("read");
    assert_eq!(format!("{:x}", Sha256::digest(&data)), f.blob_sha);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_source_fails_a_never_staged_file_with_eio_and_a_staged_one_still_reads() {
    let f = fixture(Duration::from_secs(1)).await;
    let mut client = f.client().await;
    let staged = lookup(&mut client, "weights.bin").await.expect("lookup");
    let before = read_all(&mut client, &staged).await.expect("stage");
    let blob = lookup(
        &mut client,
        &format!("models--acme--tiny/blobs/{}", f.blob_sha),
    )
    .await
    .expect("lookup");
    f.source.set(Behaviour::Hang);
    assert_eq!(
        read_all(&mut client, &blob).await.map(|_| ()),
        Err(nfsstat3::NFS3ERR_IO),
        "never staged: EIO once the source times out"
    );
    let again = read_all(&mut client, &staged).await.expect("staged copy");
    assert!(
        again == before,
        "the staged copy answers while the source is away"
    );
    f.source.set(Behaviour::Healthy);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_directory_inside_the_export_can_be_mounted() {
    let f = fixture(PATIENT).await;
    let mut client = connect(f.serving.addr, 0, "/models--acme--tiny/snapshots/abc")
        .await
        .expect("mount a subdirectory");
    let fh = lookup(&mut client, "model.safetensors")
        .await
        .expect("lookup");
    let attr = client
        .nfs3_client
        .getattr(&GETATTR3args { object: fh })
        .await
        .expect("rpc");
    match attr {
        Nfs3Result::Ok(ok) => assert_eq!(ok.obj_attributes.type_, ftype3::NF3LNK),
        Nfs3Result::Err((stat, _)) => panic!("getattr: {stat}"),
    }
    assert!(connect(f.serving.addr, 0, "/no/such/dir").await.is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_serving_user_and_root_get_in() {
    let f = fixture(PATIENT).await;
    // The fixture serves uid 0; anyone else is refused at MNT with an auth error.
    let refused = connect(f.serving.addr, 4242, "/")
        .await
        .map(|_| ())
        .expect_err("another uid");
    assert!(refused.to_lowercase().contains("auth"), "{refused}");
    let null = Nfs3ConnectionBuilder::new(TokioConnector, "127.0.0.1", "/")
        .mount_port(f.serving.addr.port())
        .nfs3_port(f.serving.addr.port())
        .mount()
        .await
        .map(|_| ())
        .expect_err("AUTH_NULL");
    assert!(null.to_string().to_lowercase().contains("auth"), "{null}");
    assert!(
        connect(f.serving.addr, 0, "/").await.is_ok(),
        "root gets in"
    );
}

/// One whole record (mark included) of RPC call `xid` of `proc` in `prog` version
/// `vers`, with credentials `cred` and the XDR arguments `args`.
fn call_record(
    xid: u32,
    (prog, vers, proc): (u32, u32, u32),
    cred: opaque_auth<'static>,
    args: &[u8],
) -> Vec<u8> {
    let call = rpc_msg {
        xid,
        body: msg_body::CALL(call_body {
            rpcvers: 2,
            prog,
            vers,
            proc,
            cred,
            verf: opaque_auth::default(),
        }),
    };
    let mut record = vec![0; 4];
    call.pack(&mut record).expect("pack");
    record.extend_from_slice(args);
    let len = (record.len() - 4) as u32 | 0x8000_0000;
    record[..4].copy_from_slice(&len.to_be_bytes());
    record
}

/// The reply to one RPC call of `proc` in `prog` version `vers` with credentials
/// `cred` and no arguments, sent on a new connection from a reserved port.
async fn rpc_reply(
    addr: SocketAddr,
    (prog, vers, proc): (u32, u32, u32),
    cred: opaque_auth<'static>,
) -> Answer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let record = call_record(77, (prog, vers, proc), cred, &[]);
    let mut stream = stagefs_nfs::access::connect_from_reserved_port(addr)
        .await
        .expect("connect");
    stream.write_all(&record).await.expect("send");
    let mut mark = [0; 4];
    stream.read_exact(&mut mark).await.expect("reply mark");
    let mut reply = vec![0; (u32::from_be_bytes(mark) & 0x7fff_ffff) as usize];
    stream.read_exact(&mut reply).await.expect("reply");
    let (msg, _) = rpc_msg::unpack(&mut std::io::Cursor::new(&reply[..])).expect("unpack");
    assert_eq!(msg.xid, 77);
    match msg.body {
        msg_body::REPLY(reply_body::MSG_ACCEPTED(accepted_reply {
            reply_data: accept_stat_data::SUCCESS,
            ..
        })) => Answer::Accepted,
        msg_body::REPLY(reply_body::MSG_ACCEPTED(accepted_reply {
            reply_data: accept_stat_data::PROG_UNAVAIL,
            ..
        })) => Answer::NoSuchProgram,
        msg_body::REPLY(reply_body::MSG_DENIED(_)) => Answer::Denied,
        other => panic!("neither accepted nor denied: {other:?}"),
    }
}

/// More calls in flight on one connection than the library takes (256, past which
/// it answers SYSTEM_ERR, which a Mac turns into EIO): 400 READs of a file whose
/// copy cannot finish, sent at once. Every one is answered, JUKEBOX, none refused.
#[tokio::test(flavor = "multi_thread")]
async fn four_hundred_reads_in_flight_on_one_connection_are_all_answered() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let f = fixture(PATIENT).await;
    let mut client = f.client().await;
    let fh = lookup(&mut client, "weights.bin").await.expect("lookup");
    f.source.set(Behaviour::Hang);
    const CALLS: u32 = 400;
    let mut calls = Vec::new();
    for xid in 0..CALLS {
        let mut args = Vec::new();
        let read = READ3args {
            file: fh.clone(),
            offset: u64::from(xid) * 4096,
            count: 4096,
        };
        read.pack(&mut args).expect("pack");
        let call = (100_003, 3, 6); // READ of NFS version 3
        calls.extend(call_record(xid, call, client::credential(0), &args));
    }
    let stream = stagefs_nfs::access::connect_from_reserved_port(f.serving.addr)
        .await
        .expect("connect");
    let (mut from_server, mut to_server) = stream.into_split();
    let sending = tokio::spawn(async move { to_server.write_all(&calls).await.map(|_| to_server) });
    let mut answered = std::collections::BTreeSet::new();
    while answered.len() < CALLS as usize {
        let mut mark = [0; 4];
        tokio::time::timeout(PATIENT, from_server.read_exact(&mut mark))
            .await
            .expect("a reply within a minute")
            .expect("reply mark");
        let mut reply = vec![0; (u32::from_be_bytes(mark) & 0x7fff_ffff) as usize];
        from_server.read_exact(&mut reply).await.expect("reply");
        let mut cursor = std::io::Cursor::new(&reply[..]);
        let (msg, _) = rpc_msg::unpack(&mut cursor).expect("unpack");
        match msg.body {
            msg_body::REPLY(reply_body::MSG_ACCEPTED(accepted_reply {
                reply_data: accept_stat_data::SUCCESS,
                ..
            })) => {}
            other => panic!("call {} answered {other:?}", msg.xid),
        }
        let (stat, _) = nfsstat3::unpack(&mut cursor).expect("status");
        assert_eq!(stat, nfsstat3::NFS3ERR_JUKEBOX, "call {}", msg.xid);
        assert!(answered.insert(msg.xid), "call {} answered twice", msg.xid);
    }
    sending.await.expect("sender").expect("sent");
    f.source.set(Behaviour::Healthy);
}

/// How an RPC call was answered.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Accepted,
    NoSuchProgram,
    Denied,
}

#[tokio::test(flavor = "multi_thread")]
async fn a_ping_is_answered_for_any_credentials_and_nothing_else_is() {
    let f = fixture(PATIENT).await;
    const NFS: (u32, u32) = (100_003, 3);
    const MOUNT: (u32, u32) = (100_005, 3);
    // Linux's kernel pings with AUTH_NULL before it mounts; refusing that failed
    // every kernel mount with "server requires stronger authentication".
    for (prog, vers) in [NFS, MOUNT] {
        for cred in [opaque_auth::default(), client::credential(4242)] {
            let reply = rpc_reply(f.serving.addr, (prog, vers, 0), cred).await;
            assert_eq!(reply, Answer::Accepted, "NULL of {prog}");
        }
    }
    // Linux's kernel also pings NFS_ACL at every mount: a program the server does
    // not have is said to be unavailable, whatever the credentials, not refused
    // for them (the kernel logged "server requires stronger authentication").
    for cred in [opaque_auth::default(), client::credential(0)] {
        let reply = rpc_reply(f.serving.addr, (100_227, 3, 0), cred).await;
        assert_eq!(reply, Answer::NoSuchProgram, "NULL of NFS_ACL");
    }
    // Nothing but the ping is let through with those credentials: GETATTR (1) of
    // NFS and EXPORT (5) of MOUNT are still refused.
    for (prog, vers, proc) in [(NFS.0, NFS.1, 1), (MOUNT.0, MOUNT.1, 5)] {
        for cred in [opaque_auth::default(), client::credential(4242)] {
            let reply = rpc_reply(f.serving.addr, (prog, vers, proc), cred).await;
            assert_eq!(reply, Answer::Denied, "procedure {proc} of {prog}");
        }
    }
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread")]
async fn a_connection_from_an_unreserved_port_is_never_served() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let f = fixture(PATIENT).await;
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("bind");
    let port = socket.local_addr().expect("addr").port();
    assert!(port >= 1024, "an ephemeral port is unreserved");
    // The front closes it as it accepts it, before reading a byte (and logs who
    // it was): a call sent on it gets no reply, only the end of the connection.
    let served = tokio::time::timeout(PATIENT, async {
        let mut stream = socket.connect(f.serving.addr).await?;
        // A NULL call of the NFS program, AUTH_NONE, in one record.
        let mut call = vec![0x80, 0, 0, 40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2];
        call.extend_from_slice(&[0, 1, 0x86, 0xa3, 0, 0, 0, 3]);
        call.extend_from_slice(&[0; 20]);
        let _ = stream.write_all(&call).await;
        let mut reply = [0u8; 64];
        stream.read(&mut reply).await
    })
    .await
    .expect("the connection is closed, not left hanging");
    assert!(
        !matches!(served, Ok(n) if n > 0),
        "a call from port {port} was answered"
    );
    // The same server accepts a reserved port's connection.
    assert!(self::connect(f.serving.addr, 0, "/").await.is_ok());
}

#[tokio::test(flavor = "multi_thread")]
async fn reads_of_an_open_copy_at_any_offset_and_length_get_exactly_its_bytes() {
    let f = fixture(PATIENT).await;
    let mut client = f.client().await;
    let fh = lookup(&mut client, "weights.bin").await.expect("lookup");
    let want = f.source_bytes("weights.bin");
    // The first READ opens (and stages) the file; the ones after it are answered
    // from the open copy by the connection front, including those below.
    let (first, _) = read_waiting(&mut client, &fh, 0, 16, PATIENT)
        .await
        .expect("read");
    assert!(first == want[..16]);
    let end = want.len() as u64;
    for (offset, count, len, eof) in [
        // An odd length needs XDR padding.
        (12_345, 4_097, 4_097, false),
        (1, 3, 3, false),
        // Past the end: what is left, and the end of the file.
        (end - 5, 1_000, 5, true),
        (end, 10, 0, true),
        (end + 7, 10, 0, true),
        // More than the server's largest READ: that much, and more to come.
        (0, 2 << 20, 1 << 20, false),
    ] {
        let (data, at_end) = read(&mut client, &fh, offset, count).await.expect("read");
        assert_eq!((data.len(), at_end), (len, eof), "READ {count} at {offset}");
        let from = offset.min(end) as usize;
        assert!(
            data == want[from..from + len],
            "bytes of READ {count} at {offset}"
        );
    }
    assert_eq!(f.copies(), 1, "one copy for every READ");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_rewritten_in_place_at_the_source_is_seen_through_the_handle_a_client_holds() {
    // Another machine's save_pretrained truncates and rewrites the file in place: the
    // same inode, and its directory unchanged. A client that holds the name asks only
    // for its handle's attributes (macOS compares their mtime, Linux their ctime), so
    // that handle must answer the new version, and READ it, even with the old
    // version's copy open.
    let f = fixture(PATIENT).await;
    let mut client = f.client().await;
    let fh = lookup(&mut client, "weights.bin").await.expect("lookup");
    let old = read_all(&mut client, &fh).await.expect("stage");
    let before = getattr(&mut client, &fh).await;
    let new = bytes(5 * MIB, 99);
    let path = f.src.join("weights.bin");
    let inode = fs::metadata(&path).expect("stat").ino();
    fs::write(&path, &new).expect("rewrite in place");
    assert_eq!(fs::metadata(&path).expect("stat").ino(), inode);
    let deadline = Instant::now() + Duration::from_secs(10);
    let after = loop {
        let attr = getattr(&mut client, &fh).await;
        if attr.size != before.size {
            break attr;
        }
        assert!(
            Instant::now() < deadline,
            "10 s after the rewrite, the handle still answers {} bytes",
            attr.size
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        after.fileid, before.fileid,
        "the handle keeps its file's number"
    );
    assert_eq!(after.size, new.len() as u64);
    let mtime = fs::metadata(&path).expect("stat").mtime_nsec();
    assert_eq!(
        u64::from(after.mtime.nseconds),
        mtime as u64,
        "the source's mtime"
    );
    // The first READ after the change goes through the connection front, which
    // served the old copy's open handle before.
    let (head, _) = read(&mut client, &fh, 0, 16).await.expect("read");
    assert!(
        head == new[..16],
        "the first bytes after the change are the old ones"
    );
    let now = read_all(&mut client, &fh).await.expect("read");
    assert!(now == new, "the handle reads the new version");
    assert!(now != old);
    assert_eq!(f.copies(), 2, "each version copied once");
}

// The write procedures.

fn dirop(dir: &nfs_fh3, name: &str) -> diropargs3<'static> {
    diropargs3 {
        dir: dir.clone(),
        name: filename3::from(name.as_bytes().to_vec()),
    }
}

fn mode(mode: u32) -> sattr3 {
    sattr3 {
        mode: Nfs3Option::Some(mode),
        ..sattr3::default()
    }
}

/// CREATE (UNCHECKED, as a kernel's `open(O_CREAT)`) of `name` in `dir`.
async fn create(client: &mut Client, dir: &nfs_fh3, name: &str) -> Result<nfs_fh3, nfsstat3> {
    let args = CREATE3args {
        where_: dirop(dir, name),
        how: createhow3::UNCHECKED(mode(0o644)),
    };
    match client.nfs3_client.create(&args).await.expect("CREATE RPC") {
        Nfs3Result::Ok(ok) => match ok.obj {
            post_op_fh3::Some(fh) => Ok(fh),
            post_op_fh3::None => panic!("CREATE returned no handle"),
        },
        Nfs3Result::Err((stat, _)) => Err(stat),
    }
}

/// `data` written at `offset` in WRITEs of at most 1 MiB; the attributes after the last.
async fn write(
    client: &mut Client,
    fh: &nfs_fh3,
    offset: u64,
    data: &[u8],
) -> Result<fattr3, nfsstat3> {
    let mut after = None;
    for (i, chunk) in data.chunks(MIB).enumerate() {
        let args = WRITE3args {
            file: fh.clone(),
            offset: offset + (i * MIB) as u64,
            count: chunk.len() as u32,
            stable: stable_how::UNSTABLE,
            data: Opaque::borrowed(chunk),
        };
        match client.nfs3_client.write(&args).await.expect("WRITE RPC") {
            Nfs3Result::Ok(ok) => {
                assert_eq!(ok.count, chunk.len() as u32);
                after = match ok.file_wcc.after {
                    Nfs3Option::Some(attr) => Some(attr),
                    Nfs3Option::None => panic!("WRITE returned no attributes"),
                };
            }
            Nfs3Result::Err((stat, _)) => return Err(stat),
        }
    }
    Ok(after.expect("something written"))
}

async fn commit(client: &mut Client, fh: &nfs_fh3) -> Result<(), nfsstat3> {
    let args = COMMIT3args {
        file: fh.clone(),
        offset: 0,
        count: 0,
    };
    match client.nfs3_client.commit(&args).await.expect("COMMIT RPC") {
        Nfs3Result::Ok(_) => Ok(()),
        Nfs3Result::Err((stat, _)) => Err(stat),
    }
}

async fn getattr(client: &mut Client, fh: &nfs_fh3) -> fattr3 {
    let args = GETATTR3args { object: fh.clone() };
    match client
        .nfs3_client
        .getattr(&args)
        .await
        .expect("GETATTR RPC")
    {
        Nfs3Result::Ok(ok) => ok.obj_attributes,
        Nfs3Result::Err((stat, _)) => panic!("getattr: {stat}"),
    }
}

async fn truncate(client: &mut Client, fh: &nfs_fh3, size: u64) -> Result<fattr3, nfsstat3> {
    let args = SETATTR3args {
        object: fh.clone(),
        new_attributes: sattr3 {
            size: Nfs3Option::Some(size),
            ..sattr3::default()
        },
        guard: sattrguard3::None,
    };
    match client
        .nfs3_client
        .setattr(&args)
        .await
        .expect("SETATTR RPC")
    {
        Nfs3Result::Ok(ok) => match ok.obj_wcc.after {
            Nfs3Option::Some(attr) => Ok(attr),
            Nfs3Option::None => panic!("SETATTR returned no attributes"),
        },
        Nfs3Result::Err((stat, _)) => Err(stat),
    }
}

async fn remove(client: &mut Client, dir: &nfs_fh3, name: &str) -> Result<(), nfsstat3> {
    let args = REMOVE3args {
        object: dirop(dir, name),
    };
    match client.nfs3_client.remove(&args).await.expect("REMOVE RPC") {
        Nfs3Result::Ok(_) => Ok(()),
        Nfs3Result::Err((stat, _)) => Err(stat),
    }
}

async fn hard_link(
    client: &mut Client,
    file: &nfs_fh3,
    dir: &nfs_fh3,
    name: &str,
) -> Result<(), nfsstat3> {
    let args = LINK3args {
        file: file.clone(),
        link: dirop(dir, name),
    };
    match client.nfs3_client.link(&args).await.expect("LINK RPC") {
        Nfs3Result::Ok(_) => Ok(()),
        Nfs3Result::Err((stat, _)) => Err(stat),
    }
}

async fn mkfifo(client: &mut Client, dir: &nfs_fh3, name: &str) -> Result<(), nfsstat3> {
    let args = MKNOD3args {
        where_: dirop(dir, name),
        what: mknoddata3::NF3FIFO(sattr3::default()),
    };
    match client.nfs3_client.mknod(&args).await.expect("MKNOD RPC") {
        Nfs3Result::Ok(_) => Ok(()),
        Nfs3Result::Err((stat, _)) => Err(stat),
    }
}

async fn rmdir(client: &mut Client, dir: &nfs_fh3, name: &str) -> Result<(), nfsstat3> {
    let args = RMDIR3args {
        object: dirop(dir, name),
    };
    match client.nfs3_client.rmdir(&args).await.expect("RMDIR RPC") {
        Nfs3Result::Ok(_) => Ok(()),
        Nfs3Result::Err((stat, _)) => Err(stat),
    }
}

async fn mkdir(client: &mut Client, dir: &nfs_fh3, name: &str) -> Result<nfs_fh3, nfsstat3> {
    mkdir_with(client, dir, name, 0o755).await
}

async fn mkdir_with(
    client: &mut Client,
    dir: &nfs_fh3,
    name: &str,
    with: u32,
) -> Result<nfs_fh3, nfsstat3> {
    let args = MKDIR3args {
        where_: dirop(dir, name),
        attributes: mode(with),
    };
    match client.nfs3_client.mkdir(&args).await.expect("MKDIR RPC") {
        Nfs3Result::Ok(ok) => match ok.obj {
            post_op_fh3::Some(fh) => Ok(fh),
            post_op_fh3::None => panic!("MKDIR returned no handle"),
        },
        Nfs3Result::Err((stat, _)) => Err(stat),
    }
}

async fn rename(
    client: &mut Client,
    from: (&nfs_fh3, &str),
    to: (&nfs_fh3, &str),
) -> Result<(), nfsstat3> {
    let args = RENAME3args {
        from: dirop(from.0, from.1),
        to: dirop(to.0, to.1),
    };
    match client.nfs3_client.rename(&args).await.expect("RENAME RPC") {
        Nfs3Result::Ok(_) => Ok(()),
        Nfs3Result::Err((stat, _)) => Err(stat),
    }
}

async fn symlink(
    client: &mut Client,
    dir: &nfs_fh3,
    name: &str,
    target: &str,
) -> Result<nfs_fh3, nfsstat3> {
    let args = SYMLINK3args {
        where_: dirop(dir, name),
        symlink: symlinkdata3 {
            symlink_attributes: sattr3::default(),
            symlink_data: nfspath3::from(target.as_bytes().to_vec()),
        },
    };
    match client
        .nfs3_client
        .symlink(&args)
        .await
        .expect("SYMLINK RPC")
    {
        Nfs3Result::Ok(ok) => match ok.obj {
            post_op_fh3::Some(fh) => Ok(fh),
            post_op_fh3::None => panic!("SYMLINK returned no handle"),
        },
        Nfs3Result::Err((stat, _)) => Err(stat),
    }
}

/// CREATE EXCLUSIVE (a Mac's `open(O_CREAT|O_EXCL)`) of `name` in `dir` with
/// `verifier`.
async fn create_exclusive(
    client: &mut Client,
    dir: &nfs_fh3,
    name: &str,
    verifier: [u8; 8],
) -> Result<nfs_fh3, nfsstat3> {
    let args = CREATE3args {
        where_: dirop(dir, name),
        how: createhow3::EXCLUSIVE(createverf3(verifier)),
    };
    match client.nfs3_client.create(&args).await.expect("CREATE RPC") {
        Nfs3Result::Ok(ok) => match ok.obj {
            post_op_fh3::Some(fh) => Ok(fh),
            post_op_fh3::None => panic!("CREATE returned no handle"),
        },
        Nfs3Result::Err((stat, _)) => Err(stat),
    }
}

/// An exclusive CREATE makes the file on the source (0644: the client sends the
/// mode next); the same CREATE sent again (its verifier) gets the same file, another
/// verifier EXIST, as does a name the source had; and of eight clients racing to
/// create one name exclusively, exactly one succeeds.
#[tokio::test(flavor = "multi_thread")]
async fn an_exclusive_create_is_atomic_and_the_same_one_sent_again_gets_its_file() {
    let f = fixture(PATIENT).await;
    let mut client = f.client().await;
    let root = client.root_nfs_fh3();
    let fh = create_exclusive(&mut client, &root, "index.lock", [1; 8])
        .await
        .expect("an exclusive create");
    let made = fs::metadata(f.src.join("index.lock")).expect("made on the source");
    assert!(made.is_file());
    assert_eq!(made.permissions().mode() & 0o7777, 0o644);
    assert_eq!(
        create_exclusive(&mut client, &root, "index.lock", [1; 8]).await,
        Ok(fh.clone()),
        "the same verifier: the same CREATE sent again"
    );
    assert_eq!(
        create_exclusive(&mut client, &root, "index.lock", [2; 8]).await,
        Err(nfsstat3::NFS3ERR_EXIST),
        "another verifier: another creator"
    );
    assert_eq!(
        create_exclusive(&mut client, &root, "config.json", [1; 8]).await,
        Err(nfsstat3::NFS3ERR_EXIST),
        "a name the source had"
    );
    assert_eq!(lookup(&mut client, "index.lock").await, Ok(fh));

    // Every racer connected first, then all sent at once.
    let mut races = Vec::new();
    for i in 0..8u8 {
        let (mut racer, root) = (f.client().await, root.clone());
        races.push(async move { create_exclusive(&mut racer, &root, "race.lock", [i; 8]).await });
    }
    let races: Vec<_> = races.into_iter().map(tokio::spawn).collect();
    let mut won = Vec::new();
    for race in races {
        won.push(race.await.expect("racer"));
    }
    let winners = won.iter().filter(|won| won.is_ok()).count();
    assert_eq!(winners, 1, "exactly one creator wins: {won:?}");
    assert!(
        won.iter()
            .all(|won| won.is_ok() || *won == Err(nfsstat3::NFS3ERR_EXIST)),
        "the others find it exists: {won:?}"
    );
    assert!(f.src.join("race.lock").is_file());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_created_written_and_committed_reads_back_and_the_source_holds_it() {
    let f = fixture(PATIENT).await;
    let mut client = f.client().await;
    let root = client.root_nfs_fh3();
    let want = bytes(3 * MIB + 1234, 9);
    let fh = create(&mut client, &root, "new.bin").await.expect("create");
    let after = write(&mut client, &fh, 0, &want).await.expect("write");
    assert_eq!(
        after.size,
        want.len() as u64,
        "WRITE's attributes are fresh"
    );
    commit(&mut client, &fh).await.expect("commit");
    assert_eq!(getattr(&mut client, &fh).await.size, want.len() as u64);
    // While its write handle is open, and after it closed.
    let read_back = read_all(&mut client, &fh).await.expect("read");
    assert!(read_back == want, "the bytes written, read back");
    assert!(f.source_bytes("new.bin") == want, "the source holds them");
    assert_eq!(f.serving.close_idle_writes(Duration::ZERO), 1);
    let read_back = read_all(&mut client, &fh).await.expect("read");
    assert!(
        read_back == want,
        "the bytes written, read back after the close"
    );
    // COMMIT after the handle closed still syncs (it opens the file again).
    commit(&mut client, &fh).await.expect("commit after close");
    assert!(f.source_bytes("new.bin") == want);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_write_over_a_file_the_front_serves_from_its_copy_is_read_back_at_once() {
    let f = fixture(PATIENT).await;
    let mut client = f.client().await;
    let fh = lookup(&mut client, "weights.bin").await.expect("lookup");
    let old = read_all(&mut client, &fh).await.expect("stage");
    // Its copy is open for reads now: the front answers the READs below itself.
    let (again, _) = read(&mut client, &fh, 4096, 4096).await.expect("read");
    assert!(again == old[4096..8192]);
    // A rewrite in place that keeps the size (and may keep the mtime).
    let new = bytes(old.len(), 200);
    assert_ne!(new[..4096], old[..4096]);
    let after = write(&mut client, &fh, 0, &new).await.expect("write");
    assert_eq!(after.size, old.len() as u64);
    let (head, _) = read(&mut client, &fh, 4096, 4096).await.expect("read");
    assert!(
        head == new[4096..8192],
        "READ after WRITE: the new bytes, not the copy's"
    );
    commit(&mut client, &fh).await.expect("commit");
    assert_eq!(f.serving.close_idle_writes(Duration::ZERO), 1);
    let whole = read_all(&mut client, &fh).await.expect("read");
    assert!(
        whole == new,
        "after the write handle closed: still the new bytes"
    );
    assert!(f.source_bytes("weights.bin") == new);
    // A truncate of a file open for reads is seen at once too.
    let cut = truncate(&mut client, &fh, 1000).await.expect("truncate");
    assert_eq!(cut.size, 1000, "SETATTR's attributes are fresh");
    assert_eq!(getattr(&mut client, &fh).await.size, 1000);
    let short = read_all(&mut client, &fh).await.expect("read");
    assert!(short == new[..1000], "the truncated file's bytes");
    assert_eq!(
        fs::metadata(f.src.join("weights.bin")).expect("stat").len(),
        1000
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rename_over_a_file_being_read_serves_the_new_file_under_its_name() {
    let f = fixture(PATIENT).await;
    let mut client = f.client().await;
    let root = client.root_nfs_fh3();
    let old_fh = lookup(&mut client, "weights.bin").await.expect("lookup");
    let old = read_all(&mut client, &old_fh).await.expect("stage");
    let new = bytes(2 * MIB, 77);
    let tmp = create(&mut client, &root, "weights.bin.tmp")
        .await
        .expect("create");
    write(&mut client, &tmp, 0, &new).await.expect("write");
    commit(&mut client, &tmp).await.expect("commit");
    rename(
        &mut client,
        (&root, "weights.bin.tmp"),
        (&root, "weights.bin"),
    )
    .await
    .expect("rename over");
    assert!(f.source_bytes("weights.bin") == new);
    assert!(!f.src.join("weights.bin.tmp").exists());
    let fh = lookup(&mut client, "weights.bin").await.expect("lookup");
    let now = read_all(&mut client, &fh).await.expect("read");
    assert!(now == new, "the name leads to the new file");
    assert!(now != old);
    assert_eq!(
        lookup(&mut client, "weights.bin.tmp").await,
        Err(nfsstat3::NFS3ERR_NOENT)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn remove_mkdir_rmdir_and_symlink_pass_through() {
    let f = fixture(PATIENT).await;
    let mut client = f.client().await;
    let root = client.root_nfs_fh3();
    // A staged file, removed: gone from the source and from the export.
    let fh = lookup(&mut client, "weights.bin").await.expect("lookup");
    read_all(&mut client, &fh).await.expect("stage");
    remove(&mut client, &root, "weights.bin")
        .await
        .expect("remove");
    assert!(!f.src.join("weights.bin").exists());
    assert_eq!(
        lookup(&mut client, "weights.bin").await,
        Err(nfsstat3::NFS3ERR_NOENT)
    );
    assert_eq!(
        remove(&mut client, &root, "weights.bin").await,
        Err(nfsstat3::NFS3ERR_NOENT)
    );
    // A directory, made, filled, refused while full, then removed.
    let dir = mkdir(&mut client, &root, "made").await.expect("mkdir");
    assert!(f.src.join("made").is_dir());
    assert_eq!(
        write(&mut client, &dir, 0, b"x").await.err(),
        Some(nfsstat3::NFS3ERR_ISDIR),
        "a WRITE to a directory"
    );
    assert_eq!(getattr(&mut client, &dir).await.type_, ftype3::NF3DIR);
    assert_eq!(
        mkdir(&mut client, &root, "made").await,
        Err(nfsstat3::NFS3ERR_EXIST)
    );
    let inner = create(&mut client, &dir, "f").await.expect("create");
    write(&mut client, &inner, 0, b"x").await.expect("write");
    assert_eq!(
        rmdir(&mut client, &root, "made").await,
        Err(nfsstat3::NFS3ERR_NOTEMPTY)
    );
    // REMOVE and RMDIR reach one library call: the call still decides, not the
    // entry's kind, so neither takes the other's kind.
    assert_eq!(
        rmdir(&mut client, &dir, "f").await,
        Err(nfsstat3::NFS3ERR_NOTDIR)
    );
    assert!(f.src.join("made/f").is_file());
    assert_eq!(
        remove(&mut client, &root, "made").await,
        Err(nfsstat3::NFS3ERR_ISDIR)
    );
    assert!(f.src.join("made").is_dir());
    remove(&mut client, &dir, "f").await.expect("remove");
    rmdir(&mut client, &root, "made").await.expect("rmdir");
    assert!(!f.src.join("made").exists());
    // MKDIR's mode is the client's (mkdir(2)'s with its umask applied).
    mkdir_with(&mut client, &root, "private", 0o700)
        .await
        .expect("mkdir 0700");
    let made = fs::metadata(f.src.join("private")).expect("made");
    assert_eq!(made.permissions().mode() & 0o7777, 0o700);
    rmdir(&mut client, &root, "private").await.expect("rmdir");
    // A link, verbatim.
    let link = symlink(&mut client, &root, "cfg", "config.json")
        .await
        .expect("symlink");
    assert_eq!(getattr(&mut client, &link).await.type_, ftype3::NF3LNK);
    assert_eq!(
        fs::read_link(f.src.join("cfg")).expect("readlink"),
        Path::new("config.json")
    );
    remove(&mut client, &root, "cfg")
        .await
        .expect("remove link");
    assert!(fs::symlink_metadata(f.src.join("cfg")).is_err());
    assert!(
        f.src.join("config.json").exists(),
        "the link's target stays"
    );
}

/// LINK and MKNOD, which the library lacks (it answered PROC_UNAVAIL, "Bad procedure
/// for program" on a Mac), are made on the source by the front, with the new
/// entry's attributes and handle; a second of the same name answers EXIST.
#[tokio::test(flavor = "multi_thread")]
async fn a_hard_link_and_a_fifo_are_made_on_the_source() {
    let f = fixture(PATIENT).await;
    let mut client = f.client().await;
    let root = client.root_nfs_fh3();
    let file = lookup(&mut client, "config.json").await.expect("lookup");
    let link = LINK3args {
        file: file.clone(),
        link: dirop(&root, "hard"),
    };
    match client.nfs3_client.link(&link).await.expect("LINK RPC") {
        Nfs3Result::Ok(ok) => match ok.file_attributes {
            Nfs3Option::Some(attrs) => assert_eq!((attrs.type_, attrs.nlink), (ftype3::NF3REG, 2)),
            Nfs3Option::None => panic!("LINK gave no attributes"),
        },
        Nfs3Result::Err((stat, _)) => panic!("LINK: {stat:?}"),
    }
    let (a, b) = (
        fs::metadata(f.src.join("config.json")).expect("stat"),
        fs::metadata(f.src.join("hard")).expect("stat"),
    );
    assert_eq!((a.ino(), b.nlink()), (b.ino(), 2), "one file, two names");
    let hard = lookup(&mut client, "hard")
        .await
        .expect("the new name looks up");
    let want = fs::read(f.src.join("config.json")).expect("read");
    let (got, _) = read(&mut client, &hard, 0, 1 << 16).await.expect("READ");
    assert_eq!(got, want, "the file's bytes through its new name");
    // A staged file: a WRITE through its first name is read through the second,
    // whose copy the front holds open, never the old version's bytes.
    let weights = lookup(&mut client, "weights.bin").await.expect("lookup");
    let hard_link_of_weights = LINK3args {
        file: weights.clone(),
        link: dirop(&root, "weights-too.bin"),
    };
    let linked = client
        .nfs3_client
        .link(&hard_link_of_weights)
        .await
        .expect("LINK RPC");
    assert!(matches!(linked, Nfs3Result::Ok(_)), "LINK of a staged file");
    let too = lookup(&mut client, "weights-too.bin")
        .await
        .expect("lookup");
    let old = f.source_bytes("weights.bin");
    let (got, _) = read_waiting(&mut client, &too, 0, 4096, PATIENT)
        .await
        .expect("READ");
    assert!(
        got == old[..4096],
        "the staged file through its second name"
    );
    let new = bytes(4096, 9);
    write(&mut client, &weights, 0, &new).await.expect("WRITE");
    let (got, _) = read_waiting(&mut client, &too, 0, 4096, PATIENT)
        .await
        .expect("READ");
    assert!(
        got == new,
        "the second name reads the write through the first"
    );
    match client.nfs3_client.link(&link).await.expect("LINK RPC") {
        Nfs3Result::Err((stat, _)) => assert_eq!(stat, nfsstat3::NFS3ERR_EXIST),
        Nfs3Result::Ok(_) => panic!("LINK over an existing name"),
    }
    let fifo = MKNOD3args {
        where_: dirop(&root, "fifo"),
        what: mknoddata3::NF3FIFO(sattr3 {
            mode: Nfs3Option::Some(0o640),
            ..sattr3::default()
        }),
    };
    let made = match client.nfs3_client.mknod(&fifo).await.expect("MKNOD RPC") {
        Nfs3Result::Ok(ok) => ok,
        Nfs3Result::Err((stat, _)) => panic!("MKNOD: {stat:?}"),
    };
    let handle = match made.obj {
        post_op_fh3::Some(handle) => handle,
        post_op_fh3::None => panic!("MKNOD returned no handle"),
    };
    assert_eq!(getattr(&mut client, &handle).await.type_, ftype3::NF3FIFO);
    let meta = fs::symlink_metadata(f.src.join("fifo")).expect("made");
    assert!(meta.file_type().is_fifo());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
}

/// FSSTAT gives the source's filesystem figures (where writes go), not a constant.
#[tokio::test(flavor = "multi_thread")]
async fn fsstat_gives_the_source_filesystems_figures() {
    let f = fixture(PATIENT).await;
    let mut client = f.client().await;
    let args = FSSTAT3args {
        fsroot: client.root_nfs_fh3(),
    };
    let got = match client.nfs3_client.fsstat(&args).await.expect("FSSTAT RPC") {
        Nfs3Result::Ok(ok) => ok,
        Nfs3Result::Err((stat, _)) => panic!("fsstat: {stat}"),
    };
    let want = statvfs_of(&f.src);
    assert_eq!(got.tbytes, want.0, "total bytes");
    assert_eq!(got.tfiles, want.2, "total inodes");
    // Free space moves as other tests write: within 1 GiB.
    assert!(
        got.abytes.abs_diff(want.1) < 1 << 30,
        "available {} against the source's {}",
        got.abytes,
        want.1
    );
}

/// The source's total and available bytes and total inodes, by statvfs(3).
// The statvfs field types differ per platform (u32 block counts on macOS).
#[allow(clippy::unnecessary_cast)]
fn statvfs_of(path: &Path) -> (u64, u64, u64) {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a zeroed statvfs is a valid out-parameter; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(
        unsafe { libc::statvfs(c_path.as_ptr(), &mut st) },
        0,
        "statvfs"
    );
    let unit = st.f_frsize as u64;
    (
        st.f_blocks as u64 * unit,
        st.f_bavail as u64 * unit,
        st.f_files as u64,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_source_answers_nospc_and_a_dead_one_io_while_a_staged_file_still_reads() {
    let f = fixture(Duration::from_secs(1)).await;
    let mut client = f.client().await;
    let root = client.root_nfs_fh3();
    let staged = lookup(&mut client, "weights.bin").await.expect("lookup");
    let before = read_all(&mut client, &staged).await.expect("stage");
    let fh = create(&mut client, &root, "out.bin").await.expect("create");
    f.source.set(Behaviour::Full);
    assert_eq!(
        write(&mut client, &fh, 0, &bytes(MIB, 3)).await.map(|_| ()),
        Err(nfsstat3::NFS3ERR_NOSPC)
    );
    assert_eq!(
        create(&mut client, &root, "other.bin").await.map(|_| ()),
        Err(nfsstat3::NFS3ERR_NOSPC)
    );
    f.source.set(Behaviour::Hang);
    let started = std::time::Instant::now();
    assert_eq!(
        write(&mut client, &fh, 0, b"late").await.map(|_| ()),
        Err(nfsstat3::NFS3ERR_IO)
    );
    assert_eq!(
        mkdir(&mut client, &root, "d").await.map(|_| ()),
        Err(nfsstat3::NFS3ERR_IO)
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "within the source timeout: {:?}",
        started.elapsed()
    );
    let again = read_all(&mut client, &staged).await.expect("staged copy");
    assert!(again == before, "the staged copy answers meanwhile");
    f.source.set(Behaviour::Healthy);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_export_answers_rofs_to_every_change() {
    let f = fixture_with(PATIENT, true).await;
    let mut client = f.client().await;
    let root = client.root_nfs_fh3();
    let fh = lookup(&mut client, "weights.bin").await.expect("lookup");
    let rofs = Err(nfsstat3::NFS3ERR_ROFS);
    assert_eq!(create(&mut client, &root, "n").await.map(|_| ()), rofs);
    assert_eq!(write(&mut client, &fh, 0, b"x").await.map(|_| ()), rofs);
    assert_eq!(truncate(&mut client, &fh, 0).await.map(|_| ()), rofs);
    assert_eq!(commit(&mut client, &fh).await, rofs);
    assert_eq!(mkdir(&mut client, &root, "d").await.map(|_| ()), rofs);
    assert_eq!(remove(&mut client, &root, "config.json").await, rofs);
    assert_eq!(rmdir(&mut client, &root, "models--acme--tiny").await, rofs);
    assert_eq!(
        rename(&mut client, (&root, "config.json"), (&root, "c")).await,
        rofs
    );
    assert_eq!(
        symlink(&mut client, &root, "l", "x").await.map(|_| ()),
        rofs
    );
    assert_eq!(
        fs::read(f.src.join("weights.bin")).expect("read").len(),
        4 * MIB
    );
    assert!(f.src.join("config.json").exists());
    let data = read_all(&mut client, &fh).await.expect("reads still work");
    assert_eq!(data.len(), 4 * MIB);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_change_with_another_uids_credentials_is_refused() {
    let f = fixture(PATIENT).await;
    let client = f.client().await;
    let root = client.root_nfs_fh3();
    let stream = stagefs_nfs::access::connect_from_reserved_port(f.serving.addr)
        .await
        .expect("connect");
    let mut other = nfs3_client::Nfs3Client::new_with_auth(
        nfs3_client::tokio::TokioIo::new(stream),
        client::credential(4242),
        nfs3_server::nfs3_types::rpc::opaque_auth::default(),
    );
    let args = CREATE3args {
        where_: dirop(&root, "intruder"),
        how: createhow3::UNCHECKED(mode(0o644)),
    };
    let refused = other.create(&args).await.map(|_| ()).expect_err("refused");
    assert!(
        format!("{refused:?}").to_lowercase().contains("auth"),
        "{refused:?}"
    );
    assert!(!f.src.join("intruder").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_blob_written_as_incomplete_and_renamed_is_staged_as_written() {
    let f = fixture(PATIENT).await;
    let mut client = f.client().await;
    let blobs = lookup(&mut client, "models--acme--tiny/blobs")
        .await
        .expect("lookup");
    let blob = bytes(2 * MIB, 55);
    let sha = format!("{:x}", Sha256::digest(&blob));
    let incomplete = format!("{sha}.incomplete");
    let fh = create(&mut client, &blobs, &incomplete)
        .await
        .expect("create");
    write(&mut client, &fh, 0, &blob).await.expect("write");
    commit(&mut client, &fh).await.expect("commit");
    // huggingface_hub renames it at once, before any idle close.
    rename(&mut client, (&blobs, &incomplete), (&blobs, &sha))
        .await
        .expect("rename");
    let staged = async {
        while !f
            .stager
            .store()
            .entries()
            .iter()
            .any(|e| e.key.contains(&sha))
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), staged)
        .await
        .expect("the blob's copy is committed");
    let fh = lookup(&mut client, &format!("models--acme--tiny/blobs/{sha}"))
        .await
        .expect("lookup");
    let data = read_all(&mut client, &fh).await.expect("read");
    assert!(data == blob);
    assert_eq!(f.copies(), 0, "read from the copy staged as written");
}
