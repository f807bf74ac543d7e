//! Serving the export on a loopback port, to this machine's kernel NFS client alone.
//!
//! A loopback port is open to every local process, and AUTH_UNIX credentials are
//! whatever the caller writes in them. So the export is served only:
//! - over calls whose AUTH_UNIX uid is the serving user's or root's
//!   ([`StageNfs`]'s `authorize`; others get an RPC auth error);
//! - on Linux, over connections from a reserved port (below 1024), which only the
//!   kernel or root can bind: the listening socket carries a socket filter that drops
//!   anything else at connect, so a forged credential from an ordinary process never
//!   reaches the server ([`reserved_ports_only`]).
//!
//! Clients connect to the connection front (`crate::front`), which relays what it
//! does not answer itself to the library's listener on a second loopback port. Both
//! listeners carry the port filter, and the front reaches the library from a
//! reserved port when root serves; the front also answers only READs whose
//! credentials the library would serve.
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
    for listening in [addr, library_addr] {
        match reserved_ports_only(listening) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                info!(addr = %listening, "serving connections from any port: this kernel lets only a privileged process filter a listening socket, so credentials alone decide");
            }
            Err(e) => return Err(e),
        }
    }
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

/// A connection to `addr`, made from a reserved port when this process is root, as
/// listeners under [`reserved_ports_only`] require.
pub async fn connect_from_reserved_port(addr: SocketAddr) -> io::Result<tokio::net::TcpStream> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return tokio::net::TcpStream::connect(addr).await;
    }
    for port in (600..1024).rev() {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.set_reuseaddr(true)?;
        if socket
            .bind(SocketAddr::from(([127, 0, 0, 1], port)))
            .is_err()
        {
            continue;
        }
        match socket.connect(addr).await {
            Ok(stream) => return Ok(stream),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {}
            Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable => {}
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        "no reserved port is free to connect from",
    ))
}

#[cfg(target_os = "linux")]
pub use linux::reserved_ports_only;
#[cfg(not(target_os = "linux"))]
pub use other::reserved_ports_only;

#[cfg(target_os = "linux")]
mod linux {
    use std::io;
    use std::net::SocketAddr;
    use std::os::fd::RawFd;

    /// Makes the listening socket at `addr` in this process drop connection attempts
    /// from unreserved ports (a classic BPF socket filter: the kernel runs it on the
    /// listener's SYNs, and accepted sockets inherit it).
    pub fn reserved_ports_only(addr: SocketAddr) -> io::Result<()> {
        let fd = listening_fd(addr)?;
        // A TCP socket filter sees the segment from its TCP header on: the source
        // port is its first 16 bits.
        let mut program = [
            insn(libc::BPF_LD | libc::BPF_H | libc::BPF_ABS, 0, 0, 0),
            insn(libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K, 0, 1, 1024),
            insn(libc::BPF_RET | libc::BPF_K, 0, 0, 0),
            insn(libc::BPF_RET | libc::BPF_K, 0, 0, u32::MAX),
        ];
        let prog = libc::sock_fprog {
            len: program.len() as u16,
            filter: program.as_mut_ptr(),
        };
        // SAFETY: `prog` points at `program`, alive for the call; the kernel copies it.
        let set = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_ATTACH_FILTER,
                std::ptr::from_ref(&prog).cast(),
                std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
            )
        };
        if set != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn insn(code: u32, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
        libc::sock_filter {
            code: code as u16,
            jt,
            jf,
            k,
        }
    }

    /// This process's listening TCP socket bound to `addr`: the server library keeps
    /// its listener to itself, so it is found among the open descriptors.
    fn listening_fd(addr: SocketAddr) -> io::Result<RawFd> {
        for entry in std::fs::read_dir("/proc/self/fd")? {
            let Some(fd) = entry?.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            if bound_to(fd) == Some(addr) && listening(fd) {
                return Ok(fd);
            }
        }
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no listening socket at {addr} in this process"),
        ))
    }

    fn bound_to(fd: RawFd) -> Option<SocketAddr> {
        // SAFETY: an all-zero sockaddr_storage is valid; getsockname writes at most len.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: storage and len are valid for writes; a non-socket fd fails (ENOTSOCK).
        let got =
            unsafe { libc::getsockname(fd, std::ptr::from_mut(&mut storage).cast(), &mut len) };
        if got != 0 || i32::from(storage.ss_family) != libc::AF_INET {
            return None;
        }
        // SAFETY: the family says the storage holds a sockaddr_in.
        let sin: libc::sockaddr_in = unsafe {
            std::ptr::from_ref(&storage)
                .cast::<libc::sockaddr_in>()
                .read()
        };
        let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        Some(SocketAddr::from((ip, u16::from_be(sin.sin_port))))
    }

    fn listening(fd: RawFd) -> bool {
        let mut on: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `on` and `len` are valid for writes of their sizes.
        let got = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_ACCEPTCONN,
                std::ptr::from_mut(&mut on).cast(),
                &mut len,
            )
        };
        got == 0 && on == 1
    }
}

#[cfg(not(target_os = "linux"))]
mod other {
    use std::io;
    use std::net::SocketAddr;

    /// No port check here: any user may bind a low port on macOS (see the module
    /// docs), so credentials alone decide.
    pub fn reserved_ports_only(_addr: SocketAddr) -> io::Result<()> {
        Ok(())
    }
}
