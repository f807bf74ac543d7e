//! Serving the export on a loopback port, to this machine's kernel NFS client alone.
//!
//! A loopback port is open to every local process, and AUTH_UNIX credentials are
//! whatever the caller writes in them. So the export is served only:
//! - over calls whose AUTH_UNIX uid is the serving user's or root's
//!   ([`StageNfs`]'s `authorize`; others get an RPC auth error);
//! - on Linux, over connections from a reserved port (below 1024), which only the
//!   kernel or root can bind, so a forged credential from an ordinary process never
//!   reaches the server.
//!
//! Clients connect to the connection front (`crate::front`), which relays what it
//! does not answer itself to the library's listener on a second loopback port. The
//! front closes a connection from an unreserved port as it accepts it, before reading
//! a byte, and logs who made it (a warning with the port and, from `/proc/net/tcp`,
//! the uid); the library's listener carries a socket filter that drops anything
//! else at connect ([`reserved_ports_only`], in `crate::access`), and the front
//! reaches it from a reserved port when root serves. The front also answers only
//! READs whose credentials the library would serve.
//!
//! Limits: root can always get in. On macOS, since 10.14 any user may bind a low
//! port, so no port check could tell the kernel apart there, and none is made: any
//! local process that writes the serving user's uid into its credentials is served.
//! The same holds for a server an ordinary user runs on Linux: the kernel lets only
//! a privileged process put a filter on a listening TCP socket (EPERM otherwise), and
//! an ordinary user cannot mount NFS there anyway, so such a server (`stagefs serve`
//! for user-space clients) checks credentials alone.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use nfs3_server::tcp::{NFSTcp, NFSTcpListener};
use stagefs_policy::Policy;
use tokio::task::JoinHandle;
use tracing::info;

use crate::access::reserved_ports_only;
use crate::front::{self, Front};
use crate::reads::{IDLE, Reads};
use crate::server::StageNfs;
use crate::writes::{self, Writes};

/// How often handles nobody reads are looked for.
const IDLE_SWEEP: Duration = Duration::from_secs(5);

/// An export being served.
#[derive(Debug)]
pub struct Serving {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Where the library's listener behind the connection front listens, for
    /// measuring what the front costs and saves.
    pub library_addr: SocketAddr,
    policy: Arc<Policy>,
    reads: Arc<Reads>,
    writes: Arc<Writes>,
    tasks: Vec<JoinHandle<()>>,
}

impl Serving {
    /// The export's libnfs URL (`nfs-ls`, `nfs-cat`: append a path after the `/`).
    pub fn url(&self) -> String {
        let port = self.addr.port();
        format!(
            "nfs://{}/?nfsport={port}&mountport={port}&version=3",
            self.addr.ip()
        )
    }

    /// Stops listening and closes every handle (a write handle's close commits the
    /// copy it staged); connections already made end with the process or when their
    /// client closes them.
    pub fn stop(self) {
        for task in &self.tasks {
            task.abort();
        }
        self.writes.close_idle(&self.policy, Duration::ZERO);
        self.reads.close_idle(&self.policy, Duration::ZERO);
    }

    /// Closes the write handles nobody wrote through for `idle` now, as the sweep
    /// does every [`writes::SWEEP`] for [`writes::IDLE`]; how many.
    pub fn close_idle_writes(&self, idle: Duration) -> usize {
        self.writes.close_idle(&self.policy, idle)
    }
}

/// Serves `policy`'s mount over NFSv3 at `listen` (port 0: any free one) to `owner`
/// and root, on the current tokio runtime. File handles carry the policy's inode
/// generation, so they stay valid across restarts with the same cache directory.
pub async fn serve(policy: Arc<Policy>, listen: SocketAddr, owner: u32) -> io::Result<Serving> {
    if !listen.ip().is_loopback() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{listen} is not a loopback address; the export is for this machine only"),
        ));
    }
    // Bound first: a busy port is the user's error, reported as such.
    let front_listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = front_listener.local_addr()?;
    let export = StageNfs::new(Arc::clone(&policy), owner);
    let reads = Arc::clone(export.reads());
    let writes = Arc::clone(export.writes());
    let intents = Arc::clone(export.intents());
    let generation = policy.inode_generation();
    // The library's own listener, behind the front, on a port of its own.
    let library = NFSTcpListener::bind_with_generation(
        &SocketAddr::new(addr.ip(), 0).to_string(),
        export,
        generation,
    )
    .await?;
    let library_addr = SocketAddr::new(library.get_listen_ip(), library.get_listen_port());
    // Only the front connects to the library: its listener drops any other
    // connection. The front's own refuses one from an unreserved port at accept, with
    // a log line (dropped at connect, a client only timed out and nobody knew why).
    let reserved_only = match reserved_ports_only(library_addr) {
        Ok(()) => cfg!(target_os = "linux"),
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            info!(%addr, "serving connections from any port: this kernel lets only a privileged process filter a listening socket, so credentials alone decide");
            false
        }
        Err(e) => return Err(e),
    };
    info!(%addr, "serving NFSv3");
    let server = tokio::spawn(async move {
        if let Err(e) = library.handle_forever().await {
            tracing::error!(error = %e, "the NFS server stopped");
        }
    });
    let front = tokio::spawn(front::accept(
        front_listener,
        Front {
            policy: Arc::clone(&policy),
            reads: Arc::clone(&reads),
            intents,
            owner,
            generation,
            library: library_addr,
            retries: Arc::default(),
            reserved_only,
        },
    ));
    let janitor = {
        let (policy, reads) = (Arc::clone(&policy), Arc::clone(&reads));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(IDLE_SWEEP).await;
                reads.close_idle(&policy, IDLE);
            }
        })
    };
    let write_janitor = {
        let (policy, writes) = (Arc::clone(&policy), Arc::clone(&writes));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(writes::SWEEP).await;
                writes.close_idle(&policy, writes::IDLE);
            }
        })
    };
    Ok(Serving {
        addr,
        library_addr,
        policy,
        reads,
        writes,
        tasks: vec![front, server, janitor, write_janitor],
    })
}
