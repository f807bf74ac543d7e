//! Sending a range of a staged copy into a client's socket, off the async threads:
//! the copy's pages may have left the page cache, and reading them back blocks.
//!
//! Linux sends the range with `sendfile`, so its bytes go from the page cache into
//! the socket without passing through this process. Elsewhere (macOS) it is read
//! into a buffer and written: still one pass fewer than the library's READ.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::tcp::OwnedWriteHalf;

/// How long a client may leave a reply unread before its connection is given up.
const STALLED_CLIENT: Duration = Duration::from_secs(60);

/// Writes `len` bytes of `file` at `offset` to the socket `to`. An error leaves the
/// reply cut short: the caller must end the connection.
pub(crate) async fn send(
    to: &mut OwnedWriteHalf,
    file: &Arc<File>,
    offset: u64,
    len: usize,
) -> io::Result<()> {
    // The blocking thread gets its own descriptor of the socket: if this task is
    // dropped mid-reply, the socket's number may be reused, but not this one.
    let socket = to.as_ref().as_fd().try_clone_to_owned()?;
    let file = Arc::clone(file);
    tokio::task::spawn_blocking(move || send_blocking(&socket, &file, offset, len))
        .await
        .map_err(io::Error::other)?
}

fn send_blocking(socket: &OwnedFd, file: &File, offset: u64, len: usize) -> io::Result<()> {
    let (mut at, mut left) = (offset, len);
    while left > 0 {
        match send_some(socket.as_fd(), file, at, left) {
            // The copy is shorter than the size it was opened with: never pad it.
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            Ok(sent) => {
                at += sent as u64;
                left -= sent;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                wait_writable(socket.as_fd(), STALLED_CLIENT)?;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Waits until `socket` takes more bytes, at most `limit`.
fn wait_writable(socket: BorrowedFd<'_>, limit: Duration) -> io::Result<()> {
    let mut poll = libc::pollfd {
        fd: socket.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    let ms = libc::c_int::try_from(limit.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `poll` is one valid pollfd for the duration of the call.
    match unsafe { libc::poll(&mut poll, 1, ms) } {
        0 => Err(io::Error::from(io::ErrorKind::TimedOut)),
        n if n > 0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Sends some of `left` bytes of `file` at `at`: the count sent.
#[cfg(target_os = "linux")]
fn send_some(socket: BorrowedFd<'_>, file: &File, at: u64, left: usize) -> io::Result<usize> {
    let mut offset =
        libc::off_t::try_from(at).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: both descriptors are open for the call; `offset` is a valid off_t.
    let sent = unsafe { libc::sendfile(socket.as_raw_fd(), file.as_raw_fd(), &mut offset, left) };
    usize::try_from(sent).map_err(|_| io::Error::last_os_error())
}

/// Sends some of `left` bytes of `file` at `at`: the count sent. The piece read is
/// written whole before returning, so nothing read is lost to a short write.
#[cfg(not(target_os = "linux"))]
fn send_some(socket: BorrowedFd<'_>, file: &File, at: u64, left: usize) -> io::Result<usize> {
    let piece = stagefs_source::sys::pread_new(file, at, left.min(1 << 20))?;
    let mut written = 0;
    while written < piece.len() {
        let rest = &piece[written..];
        // SAFETY: the socket is open; `rest` is valid for reads of its length.
        let n = unsafe { libc::write(socket.as_raw_fd(), rest.as_ptr().cast(), rest.len()) };
        match usize::try_from(n) {
            Ok(n) => written += n,
            Err(_) => {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => wait_writable(socket, STALLED_CLIENT)?,
                    io::ErrorKind::Interrupted => {}
                    _ => return Err(e),
                }
            }
        }
    }
    Ok(piece.len())
}
