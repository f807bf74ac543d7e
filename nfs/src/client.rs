//! A user-space NFSv3 client of the export, for tests and benchmarks (feature
//! `client`): the `nfs3_client` crate, connecting from a reserved port (so as root)
//! with AUTH_UNIX credentials. A broken RPC connection panics: a test or benchmark of
//! a server it started has nothing better to do with one.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use nfs3_client::tokio::{TokioConnector, TokioIo};
use nfs3_client::{ConnectError, Nfs3Connection, Nfs3ConnectionBuilder};
use nfs3_server::nfs3_types::nfs3::{
    LOOKUP3args, Nfs3Result, READ3args, diropargs3, filename3, nfs_fh3, nfsstat3,
};
use nfs3_server::nfs3_types::rpc::{auth_unix, opaque_auth};
use nfs3_server::nfs3_types::xdr_codec::Opaque;
use tokio::net::TcpStream;

/// A mounted connection to the export.
pub type Client = Nfs3Connection<TokioIo<TcpStream>>;

/// How long a read retries JUKEBOX answers before giving up with that status.
pub const JUKEBOX_PATIENCE: Duration = Duration::from_secs(60);

/// The largest READ the server answers.
const READ_SIZE: u32 = 1 << 20;

/// AUTH_UNIX credentials of `uid` (group `uid` too).
pub fn credential(uid: u32) -> opaque_auth<'static> {
    opaque_auth::auth_unix(&auth_unix {
        stamp: 1,
        machinename: Opaque::owned(b"stagefs-client".to_vec()),
        uid,
        gid: uid,
        gids: Vec::new(),
    })
}

/// Mounts directory `path` of the export at `addr` (whose port serves MOUNT and
/// NFS) as `uid`.
pub async fn connect(addr: SocketAddr, uid: u32, path: &str) -> Result<Client, ConnectError> {
    Nfs3ConnectionBuilder::new(TokioConnector, addr.ip().to_string(), path)
        .mount_port(addr.port())
        .nfs3_port(addr.port())
        .credential(credential(uid))
        .mount()
        .await
}

/// The handle of `rel`, looked up one component at a time from the mounted root.
pub async fn lookup(client: &mut Client, rel: &Path) -> Result<nfs_fh3, nfsstat3> {
    let mut fh = client.root_nfs_fh3();
    for name in rel.iter() {
        let args = LOOKUP3args {
            what: diropargs3 {
                dir: fh.clone(),
                name: filename3::from(name.as_encoded_bytes().to_vec()),
            },
        };
        match client.nfs3_client.lookup(&args).await.expect("LOOKUP RPC") {
            Nfs3Result::Ok(ok) => fh = ok.object,
            Nfs3Result::Err((stat, _)) => return Err(stat),
        }
    }
    Ok(fh)
}

/// One READ of `count` bytes at `offset`: the bytes and whether they end the file.
pub async fn read(
    client: &mut Client,
    fh: &nfs_fh3,
    offset: u64,
    count: u32,
) -> Result<(Vec<u8>, bool), nfsstat3> {
    let args = READ3args {
        file: fh.clone(),
        offset,
        count,
    };
    match client.nfs3_client.read(&args).await.expect("READ RPC") {
        Nfs3Result::Ok(ok) => Ok((ok.data.0.into_owned(), ok.eof)),
        Nfs3Result::Err((stat, _)) => Err(stat),
    }
}

/// [`read`], asked again every 100 ms while the server answers JUKEBOX (the file is
/// still being staged), as a kernel client does, for at most `patience` (a patience
/// too long to add to now waits for ever).
pub async fn read_waiting(
    client: &mut Client,
    fh: &nfs_fh3,
    offset: u64,
    count: u32,
    patience: Duration,
) -> Result<(Vec<u8>, bool), nfsstat3> {
    let deadline = Instant::now().checked_add(patience);
    loop {
        match read(client, fh, offset, count).await {
            Err(nfsstat3::NFS3ERR_JUKEBOX) if deadline.is_none_or(|d| Instant::now() < d) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            answer => return answer,
        }
    }
}

/// The whole file, in READs of the server's largest size, waiting out JUKEBOX for at
/// most [`JUKEBOX_PATIENCE`] at a time.
pub async fn read_all(client: &mut Client, fh: &nfs_fh3) -> Result<Vec<u8>, nfsstat3> {
    let mut out = Vec::new();
    loop {
        let offset = out.len() as u64;
        let (data, eof) = read_waiting(client, fh, offset, READ_SIZE, JUKEBOX_PATIENCE).await?;
        out.extend_from_slice(&data);
        if eof {
            return Ok(out);
        }
    }
}
