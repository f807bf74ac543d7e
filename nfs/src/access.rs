//! Who may reach the export: connections from reserved ports (on Linux, where only
//! the kernel or root can bind one) and AUTH_UNIX credentials of the serving user or
//! root. The listen module's doc says why both, and where they fall short.

use std::io;
use std::net::SocketAddr;

use nfs3_server::nfs3_types::rpc::auth_unix;
use stagefs_policy::Caller;

/// Who the policy is told makes a change: the serving user `owner`, with the
/// daemon's group. The library passes a call's credentials no further, and the
/// front's own changes (LINK, MKNOD) are made as the library's are.
pub(crate) fn serving_caller(owner: u32) -> Caller {
    // SAFETY: getegid has no preconditions and cannot fail.
    let gid = unsafe { libc::getegid() };
    Caller { uid: owner, gid }
}

/// Whether the export serves AUTH_UNIX credentials `auth`: the serving user's or
/// root's (the library's `authorize` asks the same).
pub(crate) fn serves(owner: u32, auth: &auth_unix) -> bool {
    auth.uid == 0 || auth.uid == owner
}

/// The uid owning the TCP socket at `addr` on this machine (a loopback client's end
/// of a connection), as `/proc/net/tcp` lists it; None where there is no such table
/// (macOS) or the socket is gone.
pub(crate) async fn client_uid(addr: SocketAddr) -> Option<u32> {
    let SocketAddr::V4(v4) = addr else {
        return None;
    };
    // The table writes an address as its 32 bits in host order, then the port.
    let local = format!(
        "{:08X}:{:04X}",
        u32::from_ne_bytes(v4.ip().octets()),
        v4.port()
    );
    let table = tokio::fs::read_to_string("/proc/net/tcp").await.ok()?;
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            [_, at, _, _, _, _, _, uid, ..] if *at == local => uid.parse().ok(),
            _ => None,
        }
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
