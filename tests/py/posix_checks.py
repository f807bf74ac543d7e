"""POSIX operations through a stagefs mount, each checked on the mount and on its source.

    posix_checks.py MOUNT SOURCE [--settle SECONDS] [GROUP ...]

One body for every backend: a FUSE mount, or an NFS export mounted by a kernel
client. MOUNT mirrors SOURCE (a writable mount); every check works in a fresh
directory of its own under MOUNT and compares what the mount shows with what the
source holds. Groups, by operation: link (hard links, and what a write through one
name shows through the other), fifo, socket, mknod (devices: root makes them, an
ordinary user is refused with EPERM and nothing is left). Prints a PASS or FAIL line
per check and a closing "N passed, M failed" line; exits 1 if any failed.

--settle: how long a change made through one name may take to be read through
another name of the same file (default 0: at once, as through FUSE). Through NFS
each name of a hard link is a file handle of its own, and a client reads its cached
pages of one until its attribute cache for it expires (1 s with stagefs's mount
options), as it does after a change at the source; meanwhile only the old bytes
may be read, never a mix.
"""

import errno
import os
import socket
import stat
import sys
import tempfile
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
