"""POSIX operations through a stagefs mount, each checked on the mount and on its source.

    posix_checks.py MOUNT SOURCE [--settle SECONDS] [GROUP ...]

One body for every backend: a FUSE mount, or an NFS export mounted by a kernel
client. MOUNT mirrors SOURCE (a writable mount); every check works in a fresh
directory of its own under MOUNT and compares what the mount shows with what the
source holds. Groups, by operation: create (write and read back, O_EXCL,
O_APPEND, sparse writes, a staged file overwritten in place as save_pretrained does,
two writers on one file), mmap (writes and msync), truncate (down and up), rename
(over a file a reader holds, an unlink while open, a directory), symlink, attrs
(chmod, chown as root, utimensat with exact times, UTIME_NOW and UTIME_OMIT), link
(hard links, and what a write through one name shows through the other), fifo,
socket, mknod (devices: root makes them, an ordinary user is refused with EPERM and
nothing is left). Prints a PASS or FAIL line
per check and a closing "N passed, M failed" line; exits 1 if any failed.

--settle: how long a change made through one name may take to be read through
another name of the same file (default 0: at once, as through FUSE). Through NFS
each name of a hard link is a file handle of its own, and a client reads its cached
pages of one until its attribute cache for it expires (1 s with stagefs's mount
options), as it does after a change at the source; meanwhile only the old bytes
may be read, never a mix.
"""

import ctypes
import errno
import mmap
import os
import socket
import stat
import sys
import tempfile
import threading
import time
import traceback

MIB = 1 << 20


SETTLE = 0.0


def eventually(what, read_now, old, new):
    """`read_now()` gives `new` at once, or within --settle seconds, and until then
    only `old`."""
    deadline = time.monotonic() + SETTLE
    while True:
        got = read_now()
        if got == new or time.monotonic() >= deadline:
            return expect(what, got, new)
        expect(f"{what}, before the change was seen", got, old)
        time.sleep(0.1)


class Checks:
    def __init__(self, mnt, src):
        self.mnt, self.src = mnt, src
        self.passed, self.failed = 0, 0

    def run(self, name, check):
        work = tempfile.mkdtemp(prefix=f"posix-{name.replace('/', '-')}-", dir=self.mnt)
        rel = os.path.relpath(work, self.mnt)
        try:
            check(work, os.path.join(self.src, rel))
        except Exception as e:  # a failed check, whatever it raised
            self.failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
            traceback.print_exc(limit=3, file=sys.stdout)
        else:
            self.passed += 1
            print(f"PASS {name}")
        sys.stdout.flush()


def expect(what, got, wanted):
    if got == wanted:
        return
    if isinstance(got, bytes) and isinstance(wanted, bytes):
        first = next((i for i, (a, b) in enumerate(zip(got, wanted)) if a != b), min(len(got), len(wanted)))
        raise AssertionError(f"{what}: {len(got)} bytes, wanted {len(wanted)}, first difference at {first}")
    raise AssertionError(f"{what}: got {got!r}, wanted {wanted!r}")


def expect_errno(what, wanted, action):
    try:
        action()
    except OSError as e:
        expect(f"{what} errno", errno.errorcode.get(e.errno), errno.errorcode[wanted])
        return
    raise AssertionError(f"{what}: succeeded, wanted {errno.errorcode[wanted]}")


def read(path):
    with open(path, "rb") as f:
        return f.read()


def write(path, data, mode="wb"):
    with open(path, mode) as f:
        f.write(data)


def umasked(mode):
    mask = os.umask(0)
    os.umask(mask)
    return mode & ~mask


# ------------------------------------------------------------------ create, write, read


def created_file_reads_back_and_lands_on_the_source(mnt, src):
    data = os.urandom(3 * MIB + 17)
    write(os.path.join(mnt, "f"), data)
    expect("through the mount", read(os.path.join(mnt, "f")), data)
    expect("on the source", read(os.path.join(src, "f")), data)


def o_excl_creates_once(mnt, src):
    path = os.path.join(mnt, "x")
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    expect_errno("a second O_EXCL create", errno.EEXIST,
                 lambda: os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    expect("its mode on the source", stat.S_IMODE(os.stat(os.path.join(src, "x")).st_mode), umasked(0o600))


def o_append_writes_at_the_end(mnt, src):
    path = os.path.join(mnt, "log")
    write(path, b"one\n")
    with open(path, "r+b") as other:
        other.seek(0, os.SEEK_END)
        other.write(b"two\n")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"three\n")
    os.close(fd)
    expect("through the mount", read(path), b"one\ntwo\nthree\n")
    expect("on the source", read(os.path.join(src, "log")), b"one\ntwo\nthree\n")


def sparse_writes_read_zeros_between(mnt, src):
    path = os.path.join(mnt, "sparse")
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    os.pwrite(fd, b"end", 3 * MIB)
    os.pwrite(fd, b"start", 0)
    os.close(fd)
    want = b"start" + bytes(3 * MIB - 5) + b"end"
    expect("through the mount", read(path), want)
    expect("on the source", read(os.path.join(src, "sparse")), want)


def a_staged_file_overwritten_in_place_reads_new(mnt, src):
    # save_pretrained over the folder a model was loaded from: O_TRUNC on a staged file.
    path = os.path.join(mnt, "model.safetensors")
    old, new = os.urandom(2 * MIB), os.urandom(2 * MIB + 3)
    write(path, old)
    expect("staged by a read", read(path), old)
    write(path, new)
    eventually("after the overwrite", lambda: read(path), old, new)
    expect("on the source", read(os.path.join(src, "model.safetensors")), new)


def concurrent_writers_on_one_file_both_land(mnt, src):
    path = os.path.join(mnt, "shared")
    write(path, bytes(2 * MIB))
    a, b = os.urandom(MIB), os.urandom(MIB)

    def writer(data, offset):
        fd = os.open(path, os.O_WRONLY)
        for at in range(0, len(data), 64 << 10):
            os.pwrite(fd, data[at : at + (64 << 10)], offset + at)
        os.close(fd)

    threads = [threading.Thread(target=writer, args=(a, 0)), threading.Thread(target=writer, args=(b, MIB))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expect("through the mount", read(path), a + b)
    expect("on the source", read(os.path.join(src, "shared")), a + b)


# ------------------------------------------------------------------ mmap


def mmap_writes_and_msync_reach_the_source(mnt, src):
    path = os.path.join(mnt, "mapped")
    write(path, bytes(2 * MIB))
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 2 * MIB) as m:
        m[MIB : MIB + 6] = b"mapped"
        m.flush()
    want = bytes(MIB) + b"mapped" + bytes(MIB - 6)
    expect("on the source after msync", read(os.path.join(src, "mapped")), want)
    expect("through the mount", read(path), want)


# ------------------------------------------------------------------ truncate


def truncate_down_and_up(mnt, src):
    path = os.path.join(mnt, "t")
    data = os.urandom(2 * MIB)
    write(path, data)
    os.truncate(path, MIB)
    expect("down, on the source", os.stat(os.path.join(src, "t")).st_size, MIB)
    os.truncate(path, 3 * MIB)
    want = data[:MIB] + bytes(2 * MIB)
    expect("up: zeros after the old end", read(path), want)
    expect("on the source", read(os.path.join(src, "t")), want)


# ------------------------------------------------------------------ rename, unlink


def rename_over_while_a_reader_holds_the_old(mnt, src):
    old, new = os.urandom(2 * MIB), os.urandom(2 * MIB)
    write(os.path.join(mnt, "target"), old)
    write(os.path.join(mnt, "incoming"), new)
    with open(os.path.join(mnt, "target"), "rb") as reader:
        first = reader.read(MIB)
        os.rename(os.path.join(mnt, "incoming"), os.path.join(mnt, "target"))
        rest = reader.read()
    expect("the reader keeps the old file", first + rest, old)
    expect("the name reads the new", read(os.path.join(mnt, "target")), new)
    expect("on the source", read(os.path.join(src, "target")), new)
    expect("the old name is gone", os.path.exists(os.path.join(src, "incoming")), False)


def unlink_while_open_keeps_the_reader(mnt, src):
    data = os.urandom(2 * MIB)
    path = os.path.join(mnt, "doomed")
    write(path, data)
    with open(path, "rb") as reader:
        first = reader.read(MIB)
        os.unlink(path)
        expect("gone through the mount", os.path.exists(path), False)
        rest = reader.read()
    expect("the reader keeps its bytes", first + rest, data)
    expect("gone on the source", os.path.exists(os.path.join(src, "doomed")), False)


def a_directory_renames_with_its_files(mnt, src):
    os.makedirs(os.path.join(mnt, "d1", "sub"))
    write(os.path.join(mnt, "d1", "sub", "f"), b"inside")
    os.rename(os.path.join(mnt, "d1"), os.path.join(mnt, "d2"))
    expect("through the new name", read(os.path.join(mnt, "d2", "sub", "f")), b"inside")
    expect("on the source", read(os.path.join(src, "d2", "sub", "f")), b"inside")
    expect_errno("rmdir of a full directory", errno.ENOTEMPTY, lambda: os.rmdir(os.path.join(mnt, "d2")))


# ------------------------------------------------------------------ symlink


def symlink_is_made_verbatim(mnt, src):
    os.symlink("../somewhere/else", os.path.join(mnt, "s"))
    expect("readlink through the mount", os.readlink(os.path.join(mnt, "s")), "../somewhere/else")
    expect("on the source", os.readlink(os.path.join(src, "s")), "../somewhere/else")
    expect("a link", stat.S_ISLNK(os.lstat(os.path.join(mnt, "s")).st_mode), True)


# ------------------------------------------------------------------ chmod, chown, utimes


def chmod_sets_exactly_the_mode(mnt, src):
    write(os.path.join(mnt, "m"), b"x")
    for mode in (0o600, 0o751, 0o4755 if os.geteuid() == 0 else 0o755):
        os.chmod(os.path.join(mnt, "m"), mode)
        expect(f"chmod {mode:o} on the source", stat.S_IMODE(os.stat(os.path.join(src, "m")).st_mode), mode)


def chown_as_root_and_refused_otherwise(mnt, src):
    write(os.path.join(mnt, "o"), b"x")
    if os.geteuid() != 0:
        expect_errno("chown to another user", errno.EPERM, lambda: os.chown(os.path.join(mnt, "o"), 65534, -1))
        return
    os.chown(os.path.join(mnt, "o"), 65534, 65533)
    meta = os.stat(os.path.join(src, "o"))
    expect("owner on the source", (meta.st_uid, meta.st_gid), (65534, 65533))


UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2


def utimensat(path, atime, mtime):
    """utimensat(2) with each time as (seconds, nanoseconds), UTIME_NOW or UTIME_OMIT."""

    class Timespec(ctypes.Structure):
        _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

    def spec(t):
        return Timespec(0, t) if isinstance(t, int) else Timespec(*t)

    libc = ctypes.CDLL(None, use_errno=True)
    times = (Timespec * 2)(spec(atime), spec(mtime))
    if libc.utimensat(-100, os.fsencode(path), times, 0) != 0:  # AT_FDCWD
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)


def utimes_now_omit_and_exact(mnt, src):
    path, on_src = os.path.join(mnt, "u"), os.path.join(src, "u")
    write(path, b"x")
    utimensat(path, (1_000_000_000, 5), (1_100_000_000, 7))
    meta = os.stat(on_src)
    expect("exact times on the source", (meta.st_atime_ns, meta.st_mtime_ns), (1_000_000_000_000_000_005, 1_100_000_000_000_000_007))
    utimensat(path, UTIME_OMIT, (1_200_000_000, 0))
    meta = os.stat(on_src)
    expect("UTIME_OMIT keeps the atime", meta.st_atime_ns, 1_000_000_000_000_000_005)
    expect("the new mtime", meta.st_mtime_ns, 1_200_000_000_000_000_000)
    before = time.time_ns()
    utimensat(path, UTIME_NOW, UTIME_OMIT)
    meta = os.stat(on_src)
    expect("UTIME_NOW sets the atime to now", meta.st_atime_ns >= before - 2_000_000_000, True)
    expect("UTIME_OMIT keeps the mtime", meta.st_mtime_ns, 1_200_000_000_000_000_000)


# ------------------------------------------------------------------ link


def link_names_one_file(mnt, src):
    data = os.urandom(2 * MIB)
    write(os.path.join(mnt, "a"), data)
    expect("read through the first name (stages it)", read(os.path.join(mnt, "a")), data)
    os.link(os.path.join(mnt, "a"), os.path.join(mnt, "b"))
    a, b = os.stat(os.path.join(src, "a")), os.stat(os.path.join(src, "b"))
    expect("one inode on the source", b.st_ino, a.st_ino)
    expect("link count on the source", b.st_nlink, 2)
    expect("link count through the new name", os.lstat(os.path.join(mnt, "b")).st_nlink, 2)
    expect("read through the new name", read(os.path.join(mnt, "b")), data)


def write_through_one_link_reads_through_the_other(mnt, src):
    old = os.urandom(2 * MIB)
    write(os.path.join(mnt, "a"), old)
    os.link(os.path.join(mnt, "a"), os.path.join(mnt, "b"))
    # Both names staged before the write.
    expect("a before", read(os.path.join(mnt, "a")), old)
    expect("b before", read(os.path.join(mnt, "b")), old)
    new = bytearray(old)
    new[MIB : MIB + 5] = b"HELLO"
    with open(os.path.join(mnt, "a"), "r+b") as f:
        f.seek(MIB)
        f.write(b"HELLO")
    eventually("b after a write through a", lambda: read(os.path.join(mnt, "b")), old, bytes(new))
    expect("the source", read(os.path.join(src, "b")), bytes(new))
    os.unlink(os.path.join(mnt, "a"))
    expect("b after a's unlink", read(os.path.join(mnt, "b")), bytes(new))
    expect("a gone on the source", os.path.exists(os.path.join(src, "a")), False)
    expect("link count left on the source", os.stat(os.path.join(src, "b")).st_nlink, 1)


def link_refusals(mnt, src):
    write(os.path.join(mnt, "f"), b"x")
    os.mkdir(os.path.join(mnt, "d"))
    expect_errno("link onto an existing name", errno.EEXIST,
                 lambda: os.link(os.path.join(mnt, "f"), os.path.join(mnt, "d")))
    expect_errno("link of a missing file", errno.ENOENT,
                 lambda: os.link(os.path.join(mnt, "nothing"), os.path.join(mnt, "g")))
    expect_errno("link of a directory", errno.EPERM,
                 lambda: os.link(os.path.join(mnt, "d"), os.path.join(mnt, "d2")))
    expect("nothing made on the source", sorted(os.listdir(src)), ["d", "f"])


def link_of_a_symlink_names_the_symlink(mnt, src):
    os.symlink("target-that-is-not-there", os.path.join(mnt, "l"))
    os.link(os.path.join(mnt, "l"), os.path.join(mnt, "l2"), follow_symlinks=False)
    expect("a symlink on the source", os.path.islink(os.path.join(src, "l2")), True)
    expect("its target", os.readlink(os.path.join(mnt, "l2")), "target-that-is-not-there")


# ------------------------------------------------------------------ special files


def fifo_is_made_and_carries_bytes(mnt, src):
    path = os.path.join(mnt, "p")
    os.mkfifo(path, 0o640)
    meta = os.lstat(os.path.join(src, "p"))
    expect("a fifo on the source", stat.S_ISFIFO(meta.st_mode), True)
    expect("its mode", stat.S_IMODE(meta.st_mode), umasked(0o640))
    expect("a fifo through the mount", stat.S_ISFIFO(os.lstat(path).st_mode), True)
    # The kernel's own pipe, whatever filesystem holds the name.
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    writer = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    os.write(writer, b"through the pipe")
    expect("bytes through it", os.read(reader, 100), b"through the pipe")
    os.close(writer)
    os.close(reader)
    expect_errno("mkfifo over an existing name", errno.EEXIST, lambda: os.mkfifo(path))


def socket_is_made_by_bind(mnt, src):
    path = os.path.join(mnt, "s")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        expect("a socket on the source", stat.S_ISSOCK(os.lstat(os.path.join(src, "s")).st_mode), True)
    os.unlink(path)
    expect("gone from the source", os.path.exists(os.path.join(src, "s")), False)


def devices_are_made_by_root_only(mnt, src):
    path = os.path.join(mnt, "c")
    mode = stat.S_IFCHR | 0o600
    if os.geteuid() != 0:
        expect_errno("mknod of a device by an ordinary user", errno.EPERM,
                     lambda: os.mknod(path, mode, os.makedev(1, 3)))
        expect("nothing left on the source", os.listdir(src), [])
        return
    os.mknod(path, mode, os.makedev(1, 3))
    meta = os.lstat(os.path.join(src, "c"))
    expect("a character device on the source", stat.S_ISCHR(meta.st_mode), True)
    expect("its device", (os.major(meta.st_rdev), os.minor(meta.st_rdev)), (1, 3))
    through = os.lstat(path)
    expect("its device through the mount", (os.major(through.st_rdev), os.minor(through.st_rdev)), (1, 3))
    os.mknod(os.path.join(mnt, "b"), stat.S_IFBLK | 0o600, os.makedev(7, 0))
    expect("a block device on the source", stat.S_ISBLK(os.lstat(os.path.join(src, "b")).st_mode), True)


GROUPS = {
    "create": [
        created_file_reads_back_and_lands_on_the_source,
        o_excl_creates_once,
        o_append_writes_at_the_end,
        sparse_writes_read_zeros_between,
        a_staged_file_overwritten_in_place_reads_new,
        concurrent_writers_on_one_file_both_land,
    ],
    "mmap": [mmap_writes_and_msync_reach_the_source],
    "truncate": [truncate_down_and_up],
    "rename": [
        rename_over_while_a_reader_holds_the_old,
        unlink_while_open_keeps_the_reader,
        a_directory_renames_with_its_files,
    ],
    "symlink": [symlink_is_made_verbatim],
    "attrs": [chmod_sets_exactly_the_mode, chown_as_root_and_refused_otherwise, utimes_now_omit_and_exact],
    "link": [
        link_names_one_file,
        write_through_one_link_reads_through_the_other,
        link_refusals,
        link_of_a_symlink_names_the_symlink,
    ],
    "fifo": [fifo_is_made_and_carries_bytes],
    "socket": [socket_is_made_by_bind],
    "mknod": [devices_are_made_by_root_only],
}


def main():
    global SETTLE
    mnt, src, *groups = sys.argv[1:]
    if groups[:1] == ["--settle"]:
        SETTLE, groups = float(groups[1]), groups[2:]
    checks = Checks(mnt, src)
    for group in groups or GROUPS:
        for check in GROUPS[group]:
            checks.run(f"{group}/{check.__name__}", check)
    print(f"{checks.passed} passed, {checks.failed} failed")
    sys.exit(1 if checks.failed else 0)


if __name__ == "__main__":
    main()
