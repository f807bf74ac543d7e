//! Questions about paths that may lie on a dead share, each asked by a child process
//! under a deadline.
//!
//! A thread stuck in a request that the FUSE server of a share (sshfs, a NAS client)
//! has already taken cannot be killed, and it keeps its process from exiting and from
//! `exec`: `stagefs mount` must report a dead source and exit, `stagefs run` must
//! become its command. So each question forks: the child asks and writes the answer
//! to a pipe; a late child is killed (it dies once the kernel lets go of it) and
//! abandoned. The child runs only the question and exits; it never returns into the
//! caller's code. It keeps none of the caller's descriptors: a stuck child must not
//! hold a pipe the caller's own caller reads to its end (`stagefs mount`'s stderr),
//! a lock or another mount's `/dev/fuse` open.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use stagefs_layout::models::{self, Shape};
use stagefs_source::SourceTree;

/// Why a question has no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unanswered {
    /// It did not finish in time.
    #[error("did not answer within {}s", .0.as_secs())]
    Late(Duration),
    /// It could not be asked (no pipe, no child process, the child died).
    #[error("could not be examined ({0})")]
    Broken(String),
}

/// What a path is, as far as a mount cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A directory (links followed).
    Directory,
    /// Anything else.
    Other,
}

/// Stats `path` (following links) and asks its filesystem for its free space, which
/// a network filesystem always forwards to the server: a share whose attributes the
/// kernel still caches but whose server is gone does not pass. A directory must also
/// be one this process can list: a source its user cannot read would mount as an
/// empty tree. Errors are the stat's or the listing's.
pub fn stat(path: &Path, deadline: Duration) -> Result<io::Result<Kind>, Unanswered> {
    let path = path.to_path_buf();
    let answer = in_child(deadline, move || {
        encode(std::fs::metadata(&path).and_then(|meta| {
            if meta.is_dir() {
                listable(&path)?;
            }
            statvfs_answered(&path);
            Ok(vec![u8::from(meta.is_dir())])
        }))
    })?;
    Ok(decode(&answer).map(|bytes| match bytes {
        [1] => Kind::Directory,
        _ => Kind::Other,
    }))
}

/// Lists the first entry of directory `path`: where one without read or search
/// permission fails.
fn listable(path: &Path) -> io::Result<()> {
    match std::fs::read_dir(path)?.next() {
        Some(Err(e)) => Err(e),
        _ => Ok(()),
    }
}

/// Whether the source at `root` holds the model `id` as `stagefs prefetch` finds it
/// ([`models::find`]: a repository id, a folder's path, or a short name one found
/// model ends with), answered within `deadline`: the walk may meet a dead share. A
/// short name several of its models end with is held too: the command then refuses
/// it as ambiguous, naming them, rather than looking elsewhere.
pub fn holds_model(
    root: &Path,
    id: &str,
    model_dirs: &[PathBuf],
    deadline: Duration,
) -> Result<bool, Unanswered> {
    if crate::SourcePlace::is_bucket(root) {
        // Asked here: an object store's client gives up by itself after the deadline.
        let tree = crate::open_source(root, deadline);
        return Ok(tree.is_ok_and(|tree| held(&tree, id, model_dirs)));
    }
    let (root, id, dirs) = (root.to_path_buf(), id.to_string(), model_dirs.to_vec());
    let answer = in_child(deadline, move || {
        let found = SourceTree::new(&root).is_ok_and(|tree| held(&tree, &id, &dirs));
        vec![u8::from(found)]
    })?;
    Ok(answer == [1])
}

/// `path` with every link resolved, as [`std::fs::canonicalize`].
pub fn canonicalize(path: &Path, deadline: Duration) -> Result<io::Result<PathBuf>, Unanswered> {
    let path = path.to_path_buf();
    let answer = in_child(deadline, move || {
        encode(std::fs::canonicalize(&path).map(|real| real.as_os_str().as_bytes().to_vec()))
    })?;
    Ok(decode(&answer).map(|bytes| PathBuf::from(std::ffi::OsStr::from_bytes(bytes))))
}

/// Whether two paths name the same place: equal as written, or once links are
/// resolved where they answer within `deadline` (a dead mount point does not, and is
/// then compared as written, made absolute).
pub fn same_place(a: &Path, b: &Path, deadline: Duration) -> bool {
    let resolve = |path: &Path| match canonicalize(path, deadline) {
        Ok(Ok(real)) => real,
        _ => std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
    };
    a == b || resolve(a) == resolve(b)
}

/// The layout of the source at `path` (see [`models::shape`]); None if it did not
/// answer within `deadline` or cannot be read.
pub fn shape(path: &Path, deadline: Duration) -> Option<Shape> {
    layout(path, None, deadline).map(|(shape, _)| shape)
}

/// The layout of the source at `path` and whether, beside an HF_HOME's or a hub
/// cache's repositories, a search (with `model_dirs`) finds plain model folders or
/// GGUF files too, which load by path whatever is exported: what `mount`'s line says.
/// None if it did not answer within `deadline` or cannot be read.
pub fn shape_and_loose_models(
    path: &Path,
    model_dirs: &[PathBuf],
    deadline: Duration,
) -> Option<(Shape, bool)> {
    layout(path, Some(model_dirs), deadline)
}

/// The shape of `tree` and, with `model_dirs`, whether plain models (folders,
/// files) lie beside its repositories.
fn shape_and_loose(tree: &SourceTree, model_dirs: Option<&[PathBuf]>) -> (Shape, bool) {
    let Some(dirs) = model_dirs else {
        return (models::shape(tree), false);
    };
    let survey = models::survey(tree, dirs);
    let loose = survey
        .catalog
        .models
        .iter()
        .any(|m| m.kind != models::ModelKind::HfRepo);
    (survey.shape, loose)
}

/// Whether `tree` holds the model `id` (or several whose short name it is).
fn held(tree: &SourceTree, id: &str, model_dirs: &[PathBuf]) -> bool {
    matches!(
        models::find(tree, id, model_dirs),
        Ok(_) | Err(models::ModelError::Ambiguous { .. })
    )
}

/// [`shape`], and with `model_dirs` the search for plain models beside it.
fn layout(
    path: &Path,
    model_dirs: Option<&[PathBuf]>,
    deadline: Duration,
) -> Option<(Shape, bool)> {
    const SHAPES: [Shape; 4] = [
        Shape::HfHome,
        Shape::HubCache,
        Shape::ModelFolders,
        Shape::Unknown,
    ];
    if crate::SourcePlace::is_bucket(path) {
        // Asked here: an object store's client gives up by itself after the deadline.
        let tree = crate::open_source(path, deadline).ok()?;
        return Some(shape_and_loose(&tree, model_dirs));
    }
    let (path, dirs) = (path.to_path_buf(), model_dirs.map(<[PathBuf]>::to_vec));
    let answer = in_child(deadline, move || {
        encode(
            SourceTree::new(&path)
                .map_err(io::Error::other)
                .map(|tree| {
                    let (shape, loose) = shape_and_loose(&tree, dirs.as_deref());
                    let index = SHAPES.iter().position(|s| *s == shape).unwrap_or(3);
                    vec![u8::try_from(index).unwrap_or(3), u8::from(loose)]
                }),
        )
    })
    .ok()?;
    match decode(&answer) {
        Ok([index, loose]) => Some((*SHAPES.get(usize::from(*index))?, *loose == 1)),
        _ => None,
    }
}

/// Waits for the filesystem's server; its answer does not matter.
fn statvfs_answered(path: &Path) {
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: c_path is NUL-terminated and `out` is a valid statvfs to fill.
    unsafe {
        let mut out: libc::statvfs = std::mem::zeroed();
        libc::statvfs(c_path.as_ptr(), &mut out);
    }
}

/// `[0, bytes..]` for an answer, `[1, errno..]` for an error.
fn encode(result: io::Result<Vec<u8>>) -> Vec<u8> {
    match result {
        Ok(bytes) => [vec![0], bytes].concat(),
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(libc::EIO);
            [vec![1], errno.to_le_bytes().to_vec()].concat()
        }
    }
}

fn decode(answer: &[u8]) -> io::Result<&[u8]> {
    match answer.split_first() {
        Some((0, bytes)) => Ok(bytes),
        Some((1, errno)) => {
            let errno = errno
                .try_into()
                .map(i32::from_le_bytes)
                .unwrap_or(libc::EIO);
            Err(io::Error::from_raw_os_error(errno))
        }
        _ => Err(io::Error::other("a garbled answer")),
    }
}

/// Runs `work` in a child process and returns what it produced, or gives up after
/// `deadline`.
fn in_child(deadline: Duration, work: impl FnOnce() -> Vec<u8>) -> Result<Vec<u8>, Unanswered> {
    let (read, write) = pipe().map_err(|e| Unanswered::Broken(format!("no pipe: {e}")))?;
    let null = File::options()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| Unanswered::Broken(format!("no /dev/null: {e}")))?;
    // SAFETY: fork has no preconditions. The child only runs `work`, writes to the
    // pipe and `_exit`s, never returning into code that expects the parent's threads.
    match unsafe { libc::fork() } {
        -1 => Err(Unanswered::Broken(format!(
            "no child process: {}",
            io::Error::last_os_error()
        ))),
        0 => {
            drop(read);
            keep_only(&write, &null);
            answer_and_exit(write, work)
        }
        pid => {
            drop(write);
            let answer = read_answer(&read, deadline);
            reap(pid, answer.is_ok());
            answer
        }
    }
}

/// In the child: points stdin, stdout and stderr at `null` and closes every other
/// descriptor but `write`.
fn keep_only(write: &OwnedFd, null: &File) {
    let keep = write.as_raw_fd();
    for std_fd in 0..3 {
        // SAFETY: both descriptors are open; dup2 replaces the standard one.
        unsafe { libc::dup2(null.as_raw_fd(), std_fd) };
    }
    let max = match keep.checked_add(1) {
        Some(above) => close_from(above),
        None => keep,
    };
    for fd in (3..keep).chain(keep + 1..max) {
        // SAFETY: closing a descriptor this process may or may not have open.
        unsafe { libc::close(fd) };
    }
}

/// Closes every descriptor from `first` up where the system can do it at once,
/// returning where a loop must stop (`first` then, the descriptor limit otherwise).
#[cfg(target_os = "linux")]
fn close_from(first: i32) -> i32 {
    // SAFETY: close_range only closes descriptors; the bounds are valid.
    let closed = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first.unsigned_abs(),
            libc::c_uint::MAX,
            0 as libc::c_uint,
        )
    };
    if closed == 0 { first } else { open_max() }
}

/// Elsewhere a loop closes them, up to the descriptor limit.
#[cfg(not(target_os = "linux"))]
fn close_from(_first: i32) -> i32 {
    open_max()
}

fn open_max() -> i32 {
    // SAFETY: sysconf has no preconditions.
    let limit = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) };
    i32::try_from(limit.clamp(0, 65_536)).unwrap_or(65_536)
}

fn answer_and_exit(write: OwnedFd, work: impl FnOnce() -> Vec<u8>) -> ! {
    let code = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
        Ok(bytes) => {
            let length = u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_le_bytes();
            let sent = File::from(write).write_all(&[&length[..], &bytes].concat());
            i32::from(sent.is_err())
        }
        Err(_) => 1,
    };
    // SAFETY: _exit ends the child at once, without running the parent's exit
    // handlers or flushing buffers it shares with the parent.
    unsafe { libc::_exit(code) }
}

/// Reads the length-prefixed answer; it may be all that ever arrives, as another
/// forked child may hold the pipe's write end open.
fn read_answer(read: &OwnedFd, deadline: Duration) -> Result<Vec<u8>, Unanswered> {
    let until = Instant::now() + deadline;
    let mut got = Vec::new();
    loop {
        if let Some(length) = got
            .first_chunk::<4>()
            .map(|l| u32::from_le_bytes(*l) as usize)
            && got.len() >= 4 + length
        {
            return Ok(got[4..4 + length].to_vec());
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || !readable_within(read, left) {
            return Err(Unanswered::Late(deadline));
        }
        let mut buf = [0u8; 4096];
        // SAFETY: buf is valid for writes of its length.
        let n = unsafe { libc::read(read.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        match n {
            0 => {
                return Err(Unanswered::Broken(
                    "the child ended without answering".into(),
                ));
            }
            n if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            n if n < 0 => {
                return Err(Unanswered::Broken(io::Error::last_os_error().to_string()));
            }
            n => got.extend_from_slice(&buf[..n.unsigned_abs()]),
        }
    }
}

fn readable_within(fd: &OwnedFd, timeout: Duration) -> bool {
    let mut poll = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let millis = libc::c_int::try_from(timeout.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
    // SAFETY: poll reads and writes one valid pollfd.
    let ready = unsafe { libc::poll(&mut poll, 1, millis) };
    // Interrupted: the caller's loop asks again with what is left of the deadline.
    ready > 0 || (ready < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted)
}

/// Collects the child: at once if it answered (it exits right after), else kills it
/// and leaves a thread to collect it whenever the kernel lets it die.
fn reap(pid: libc::pid_t, answered: bool) {
    let wait = move || {
        // SAFETY: waits for our own child; a null status pointer is allowed.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    };
    if answered {
        wait();
        return;
    }
    // SAFETY: kill has no memory preconditions; pid is our unreaped child.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = std::thread::Builder::new()
        .name("stagefs-reaper".into())
        .spawn(wait);
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for the two descriptors pipe writes.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe just opened both descriptors and nothing else owns them.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    for fd in [&read, &write] {
        // Programs other threads start must not keep the pipe open.
        // SAFETY: fd is open; FD_CLOEXEC is a valid descriptor flag.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok((read, write))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEADLINE: Duration = Duration::from_secs(10);

    #[test]
    fn stat_tells_directories_files_and_missing_paths_apart() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("file");
        std::fs::write(&file, "x")?;
        assert_eq!(
            stat(dir.path(), DEADLINE).ok().map(Result::ok),
            Some(Some(Kind::Directory))
        );
        assert_eq!(
            stat(&file, DEADLINE).ok().map(Result::ok),
            Some(Some(Kind::Other))
        );
        let missing = stat(&dir.path().join("missing"), DEADLINE).expect("answered");
        assert_eq!(missing.map_err(|e| e.kind()), Err(io::ErrorKind::NotFound));
        Ok(())
    }

    #[test]
    fn a_child_that_does_not_answer_in_time_is_abandoned() {
        let late = in_child(Duration::from_millis(100), || {
            std::thread::sleep(Duration::from_secs(30));
            Vec::new()
        });
        assert_eq!(late, Err(Unanswered::Late(Duration::from_millis(100))));
        assert_eq!(
            Unanswered::Late(Duration::from_secs(2)).to_string(),
            "did not answer within 2s"
        );
    }

    #[test]
    fn the_child_holds_none_of_the_callers_descriptors() -> io::Result<()> {
        // A child stuck in the kernel cannot be killed: whatever it holds stays open.
        let (read, write) = pipe()?;
        let (read_fd, write_fd) = (read.as_raw_fd(), write.as_raw_fd());
        let open_in_child = in_child(DEADLINE, move || {
            [read_fd, write_fd]
                .iter()
                // SAFETY: F_GETFD only asks whether the descriptor is open.
                .map(|fd| u8::from(unsafe { libc::fcntl(*fd, libc::F_GETFD) } != -1))
                .collect()
        });
        assert_eq!(open_in_child, Ok(vec![0, 0]));
        Ok(())
    }

    #[test]
    fn a_child_that_panics_is_no_answer() {
        let broken = in_child(DEADLINE, || panic!("on purpose"));
        assert!(matches!(broken, Err(Unanswered::Broken(_))), "{broken:?}");
    }

    #[test]
    fn large_answers_arrive_whole() {
        let big: Vec<u8> = (0..200_000u32).map(|n| n as u8).collect();
        let expected = big.clone();
        assert_eq!(in_child(DEADLINE, move || big), Ok(expected));
    }

    #[test]
    fn same_place_resolves_links() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        std::os::unix::fs::symlink(dir.path(), dir.path().join("link"))?;
        assert!(same_place(&dir.path().join("link"), dir.path(), DEADLINE));
        assert!(!same_place(&dir.path().join("nope"), dir.path(), DEADLINE));
        Ok(())
    }

    #[test]
    fn shape_of_a_hub_cache() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir_all(dir.path().join("models--org--name/snapshots/abc"))?;
        assert_eq!(shape(dir.path(), DEADLINE), Some(Shape::HubCache));
        assert_eq!(shape(&dir.path().join("missing"), DEADLINE), None);
        Ok(())
    }
}
