//! The NFS adapter at the protocol level, with the `nfs3_client` crate's client over
//! loopback against an in-process server whose source injects faults: JUKEBOX while
//! a file stages and its bytes after, listings and attributes that stage nothing,
//! links served verbatim, EIO from a dead source, and who is let in.
//!
//! Run as root: the server serves only connections from reserved ports, which the
//! client binds.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nfs3_client::Nfs3ConnectionBuilder;
use nfs3_client::tokio::TokioConnector;
use nfs3_server::nfs3_types::nfs3::{
    GETATTR3args, Nfs3Result, READDIRPLUS3args, READLINK3args, cookieverf3, ftype3, nfs_fh3,
    nfsstat3,
};
use sha2::{Digest, Sha256};
use stagefs_cache::source::faulty::{Behaviour, FaultySource};
use stagefs_cache::{Budget, SourceTree, Stager, StagerOptions, Store};
use stagefs_nfs::Serving;
use stagefs_nfs::client::{self, Client, read, read_all, read_waiting};
use stagefs_policy::{FsConfig, Policy};
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

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread")]
async fn a_connection_from_an_unreserved_port_is_never_accepted() {
    let f = fixture(PATIENT).await;
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("bind");
    let port = socket.local_addr().expect("addr").port();
    assert!(port >= 1024, "an ephemeral port is unreserved");
    let connect =
        tokio::time::timeout(Duration::from_secs(3), socket.connect(f.serving.addr)).await;
    assert!(
        !matches!(connect, Ok(Ok(_))),
        "a connection from port {port} was accepted"
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
