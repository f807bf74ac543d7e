"""Checks of the NFS backend through Linux's own NFS client, run inside the qemu guest
that tests/tests/kernel_nfs.rs boots (tests/vm/). The guest is chrooted into the
host's userland (its root, read-only over 9p), so this interpreter and its packages
are the host's; the test's scratch directory, which holds the sources, is shared
writable at the same path (uncached, so what a write through NFS did to a source is
seen as it is on the host).

    guest_checks.py SPEC.json [GROUP...]

SPEC.json, written by the test, names the kernel's NFS mounts (made by guest.sh with
util-linux `mount -t nfs`, the kernel doing MOUNT itself; the slow group mounts its
second export itself) and the sources behind them. Every check compares what the kernel client gives with the same file read from
the source directly. The groups (all by default):

    mount   both exports are the kernel's NFSv3 mounts, and it logged no complaint
    read    sha256 of every shard through the snapshot links of an HF_HOME, offline
            resolution by huggingface_hub, safetensors' safe_open (mmap), random
            mmap reads, mlx's own safetensors loader, a plain model folder
    own     `stagefs mount SRC MNT --backend nfs` inside the guest: reads, status,
            doctor, then (after the hub group: the server keeps an idle NFS read
            handle 30 s, and evict waits for that) evict and unmount
    doctor  doctor with `backend = "nfs"` in its config, where there is no FUSE
    write   create, same-size rewrites (through the mount, and at the source),
            files made at the source and rewritten there in place with new
            sizes (seen within seconds, as FUSE sees them), rename over a file, unlink, O_EXCL twice, mkdir/rmdir, flock, a
            directory of thousands of entries, a listing while files are added,
            statvfs
    hub     `hf download` from a local Hub (tests/py/hub_server.py on the host) into
            the mounted HF_HOME
    mlx     mlx_lm.load and generate, AutoConfig and AutoTokenizer of a tiny Llama
            by path (only with "mlx_lm": true: importing mlx_lm and transformers
            takes about a minute under TCG, done once for this group and the
            offline one)
    save    save_pretrained over a model folder just loaded through the plain
            export (tests/py/hub_client.py save: config.json, the weights under a
            temp name renamed over the old file), then loaded again by safe_open
            and mx.load, through the mount and at the source (the test loads it
            once more on the host, from the source, after the run)
    posix   the POSIX body the FUSE tests run too (tests/py/posix_checks.py: hard
            links and a write through one name read through the other, fifos,
            sockets, devices made as root), and random writes, truncates, mmap
            writes and reopens of one file against a model (tests/py/fsx.py),
            through the plain export
    nas     a third export whose source is an sshfs NAS on the host: the model is
            read once (staged), then the host drops sshfs's connection (sshfs
            exits and unmounts), kills sshfs (ENOTCONN), and mounts it again; each
            time the staged model reads right, writes fail with EIO and land
            nowhere, a name nothing is known of fails at once with EIO, and a
            name the root's kept listing lacks is absent (ENOENT)
    offline another export of an sshfs NAS, an HF_HOME with a tiny Llama in its
            hub/ and as plain folders: the guest loads one (tests/py/hub_client.py
            `loads`: mlx_lm.load and generate, AutoConfig, AutoTokenizer, by id
            with HF_HOME at the mount and by path), the host prefetches a copy of
            it (`stagefs prefetch` through the server's control socket); then the
            host cuts the NAS's link, unmounts it, kills sshfs, and restarts the
            server with sshfs killed: each time both load as before (times in the
            details), and once the NAS is back a folder never read loads too
            (only with "mlx_lm": true)
    links   blobs as links to their local copies, all inside the guest: an ordinary
            user runs `stagefs serve --links` of a hub cache (downloaded from a
            local Hub run in the guest) with its cache on the guest's tmpfs, root
            mounts it with the kernel's client, and the user's programs
            (tests/py/links_client.py) load through it: a warm MLX-pattern load
            (mx.load of every shard, 8 threads of 32 MiB preads) and safe_open
            send no READ (counted in the client's mountstats and by the server),
            with every byte right; a new revision downloaded into the mount is
            what loads next; cp -rL, rsync -aL and tar -h copy every byte; a shard evicted under a
            reading loop (stagefs evict, and a budget of 1.5 shards) never fails
            it; hf cache delete removes the repository on the source, by paths in
            the mount; the reads through links, of the copies directly and
            through the server, timed in one process (times in the details)
    full    two exports of one model whose shard is larger than their cache's
            --max-size: with --on-full read-source the shard reads right; with
            --on-full fail its read fails with ENOSPC ("No space left on device"),
            never with wrong bytes, and the rest of both mounts still reads right
    slow    an export of a second sshfs NAS, rate-capped so that its shard's copy
            takes ~12 s: the cold shard reads right through the server's JUKEBOX
            answers, with no kernel complaint (when the copy began and ended, from
            the server's cache directory, and when the first byte came are
            recorded); then the host makes every call to that NAS wait seconds
            (tests/py/slow_sftp.py) and the guest mounts another export of it:
            the mount succeeds, lists and reads right
    fault   the host's `stagefs serve` killed with the mount up (coordinated with
            the test through files in the scratch directory): what a reader gets,
            what a signal does, a restart on the same port, `umount -f` and `-l`

Checks run in the order they are defined here. Prints `PASS name`, `FAIL name:
reason` or `SKIP name: why` per check, writes {name: {group, ok, skipped, detail,
seconds}} to SPEC's "results" file after every check, and ends with `N passed, M
failed`. A check still running after its limit (a call on a hard mount that never
returns) fails as hung, naming where the kernel holds it, and ends the run there.
Exits 0: the test judges the results.
"""

import errno
import fcntl
import hashlib
import json
import mmap
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback

SPEC = json.load(open(sys.argv[1]))
GROUPS = sys.argv[2:] or [
    "mount", "read", "own", "doctor", "write", "save", "posix", "hub", "mlx", "nas", "offline", "links", "full",
    "slow",
    "fault",
]
HF = SPEC["hf"]
# huggingface_hub reads its environment once, at import: this process is an offline
# client of the mounted HF_HOME (the `hf download` of the hub group is a process of
# its own, online).
os.environ.update(
    HF_HOME=HF["mnt"],
    HF_HUB_OFFLINE="1",
    HF_HUB_DISABLE_TELEMETRY="1",
    HF_HUB_DISABLE_PROGRESS_BARS="1",
)
os.environ.pop("HF_HUB_CACHE", None)
os.environ.pop("HF_ENDPOINT", None)

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hub_client import sha256  # noqa: E402

RESULTS = {}
T0 = time.monotonic()


class Skip(Exception):
    pass


def save():
    tmp = SPEC["results"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(RESULTS, f, indent=1)
    os.replace(tmp, SPEC["results"])


def check(group):
    def wrap(fn):
        fn.group = group
        CHECKS.append(fn)
        return fn

    return wrap


CHECKS = []


# How long one check may take before it counts as hung (a call on a hard NFS mount
# that never returns): then it fails, naming where the kernel holds it, and the run
# ends there, since this process can go no further.
LIMIT = {"hub": 240, "mlx": 300, "slow": 200, "posix": 150, "offline": 240, "links": 240}
DEFAULT_LIMIT = 120


def hung(name, entry, limit):
    try:
        frames = [line.split()[1].split("+")[0] for line in open(f"/proc/self/task/{os.getpid()}/stack")]
    except (OSError, IndexError):
        frames = []
    entry["detail"] = f"hung: still running after {limit} s" + (f", in {' < '.join(frames[:5])}" if frames else "")
    entry["seconds"] = limit
    RESULTS[name] = entry
    save()
    print(f"FAIL {name}: {entry['detail']}", flush=True)
    summary()
    os._exit(0)


def run(fn):
    name = fn.__name__
    started = time.monotonic()
    entry = {"group": fn.group, "ok": False, "skipped": False, "detail": ""}
    limit = LIMIT.get(fn.group, DEFAULT_LIMIT)
    done = threading.Event()
    threading.Thread(target=lambda: done.wait(limit) or hung(name, dict(entry), limit), daemon=True).start()
    try:
        detail = fn()
        entry.update(ok=True, detail=detail or "")
        line = f"PASS {name}" + (f" ({detail})" if detail else "")
    except Skip as e:
        entry.update(ok=True, skipped=True, detail=str(e))
        line = f"SKIP {name}: {e}"
    except AssertionError as e:
        where = traceback.extract_tb(e.__traceback__)[-1]
        entry["detail"] = str(e) or f"line {where.lineno}: {where.line}"
        line = f"FAIL {name}: {entry['detail']}"
    except Exception as e:  # noqa: BLE001 - every error is a failed check, reported
        where = traceback.extract_tb(e.__traceback__)[-1]
        entry["detail"] = f"{type(e).__name__}: {e} (line {where.lineno})"
        if isinstance(e, OSError) and e.errno:
            entry["errno"] = errno.errorcode.get(e.errno, e.errno)
        line = f"FAIL {name}: {entry['detail']}"
    done.set()
    entry["seconds"] = round(time.monotonic() - started, 2)
    RESULTS[name] = entry
    save()
    print(f"{line} [{entry['seconds']} s]", flush=True)


# --- helpers -----------------------------------------------------------------------


def read(path):
    with open(path, "rb") as f:
        return f.read()


def write(path, data, mode="wb"):
    with open(path, mode) as f:
        f.write(data)


def hf_snapshot(root, repo, commit):
    return os.path.join(root, "hub", "models--" + repo.replace("/", "--"), "snapshots", commit)


def src_of(path, mnt, src):
    return os.path.join(src, os.path.relpath(path, mnt))


def expect_errno(code, fn, *args):
    try:
        fn(*args)
    except OSError as e:
        assert e.errno == code, f"{fn.__name__}: {errno.errorcode.get(e.errno, e.errno)}, not {errno.errorcode[code]}"
        return
    raise AssertionError(f"{fn.__name__}{args} succeeded; expected {errno.errorcode[code]}")


def sh(args, timeout, env=None):
    """Runs args; (returncode or 'timeout', stdout+stderr text, seconds). A command
    still running after `timeout` is killed, and not waited for long: on a dead hard
    mount it may be past what a signal ends."""
    started = time.monotonic()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            out, _ = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            out = "(still there 5 s after SIGKILL)"
        rc = "timeout"
    return rc, out or "", round(time.monotonic() - started, 1)


def tail(text, n=600):
    text = text.strip()
    return text if len(text) <= n else "…" + text[-n:]


def mounted(mnt):
    for line in open("/proc/mounts"):
        fields = line.split()
        if fields[1] == mnt:
            return fields
    return None


HF_SNAP = hf_snapshot(HF["mnt"], HF["repo"], HF["commit"])
HF_SRC_SNAP = hf_snapshot(HF["src"], HF["repo"], HF["commit"])


# --- read ----------------------------------------------------------------------------


@check("mount")
def mounts_are_the_kernels_nfs():
    mnts = [SPEC[key]["mnt"] for key in ("hf", "plain", "nas", "offline", "slow")]
    for mnt in mnts + [SPEC["full"]["fail_mnt"], SPEC["full"]["read_mnt"]]:
        fields = mounted(mnt)
        assert fields, f"{mnt} is not mounted"
        assert fields[2] == "nfs" and "vers=3" in fields[3], fields
    return mounted(HF["mnt"])[3]


@check("mount")
def the_kernel_logged_no_rpc_complaint_mounting():
    rc, out, _ = sh(["dmesg"], 20)
    assert rc == 0, f"dmesg: {rc}: {tail(out)}"
    complaints = [
        line for line in out.splitlines() if ("RPC:" in line and "Registered" not in line) or "nfs:" in line
    ]
    # Linux pings the NFS_ACL program (100227) with AUTH_NULL when it sets up a v3
    # mount; an answer other than PROG_UNAVAIL (or a success) is logged.
    assert not complaints, "; ".join(c.split("] ", 1)[-1] for c in complaints)


@check("read")
def shards_read_right_through_the_snapshot_links():
    names = sorted(os.listdir(HF_SNAP))
    assert names == sorted(os.listdir(HF_SRC_SNAP)), (names, os.listdir(HF_SRC_SNAP))
    for name in names:
        path = os.path.join(HF_SNAP, name)
        link = os.readlink(path)
        assert link == os.readlink(os.path.join(HF_SRC_SNAP, name)), (name, link)
        assert link.startswith("../../blobs/"), link
        digest = sha256(path)
        assert digest == sha256(os.path.join(HF_SRC_SNAP, name)), f"{name} differs from the source"
        if name.endswith(".safetensors"):
            assert digest == os.path.basename(link), f"{name}: sha256 {digest} is not its blob's name {link}"
    return f"{len(names)} files"


@check("read")
def huggingface_hub_resolves_offline():
    from huggingface_hub import get_token, hf_hub_download, scan_cache_dir, snapshot_download

    repo, commit = HF["repo"], HF["commit"]
    snapshot = snapshot_download(repo)
    assert snapshot == HF_SNAP, (snapshot, HF_SNAP)
    for name in sorted(os.listdir(HF_SRC_SNAP)):
        path = hf_hub_download(repo, name)
        assert path == os.path.join(HF_SNAP, name), path
        assert os.path.realpath(path).startswith(HF["mnt"] + "/"), os.path.realpath(path)
        assert read(path) == read(os.path.join(HF_SRC_SNAP, name)), name
        assert hf_hub_download(repo, name, revision=commit) == path
    assert get_token() == read(os.path.join(HF["src"], "token")).decode().strip(), "the HF_HOME token"
    repos = {r.repo_id: r for r in scan_cache_dir().repos}
    assert repo in repos, list(repos)
    want = sum(os.path.getsize(os.path.join(HF_SRC_SNAP, n)) for n in os.listdir(HF_SRC_SNAP))
    assert repos[repo].size_on_disk == want, (repos[repo].size_on_disk, want)
    return f"snapshot {commit[:12]}"


@check("read")
def safe_open_mmaps_the_same_tensors():
    from safetensors import safe_open

    tensors = 0
    for name in HF["shards"]:
        with safe_open(os.path.join(HF_SNAP, name), "np") as m, safe_open(os.path.join(HF_SRC_SNAP, name), "np") as s:
            assert sorted(m.keys()) == sorted(s.keys()), name
            for key in m.keys():
                a, b = m.get_tensor(key), s.get_tensor(key)
                assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), f"{name}: {key}"
                tensors += 1
    return f"{tensors} tensors"


@check("read")
def random_mmap_reads_match_the_source():
    rng = random.Random(7)
    reads = 0
    for name in HF["shards"]:
        path = os.path.join(HF_SNAP, name)
        source = read(os.path.join(HF_SRC_SNAP, name))
        size = os.path.getsize(path)
        assert size == len(source), (name, size, len(source))
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            m.madvise(mmap.MADV_RANDOM)
            spots = [(size - 1, 1), (0, 1), (4095, 2), (size - 5000, 5000)]
            spots += [(o, rng.randrange(1, 200_000)) for o in (rng.randrange(size) for _ in range(200))]
            for offset, length in spots:
                assert m[offset:offset + length] == source[offset:offset + length], f"{name} at {offset}+{length}"
                reads += 1
            # and pread, beside the mapping
            for offset in (rng.randrange(size) for _ in range(50)):
                assert os.pread(f.fileno(), 65536, offset) == source[offset:offset + 65536], f"pread {name} at {offset}"
    return f"{reads} mapped reads"


@check("read")
def mlx_loads_the_same_tensors():
    try:
        import mlx.core as mx
    except ImportError as e:
        raise Skip(f"no mlx: {e}")
    tensors = 0
    for name in HF["shards"]:
        a, b = mx.load(os.path.join(HF_SNAP, name)), mx.load(os.path.join(HF_SRC_SNAP, name))
        assert sorted(a) == sorted(b), name
        for key in a:
            assert mx.array_equal(a[key], b[key]).item(), f"{name}: {key}"
            tensors += 1
    return f"{tensors} tensors by mx.load"


@check("read")
def a_plain_model_folder_reads_right():
    from safetensors.numpy import load_file

    plain = SPEC["plain"]
    mnt, src = os.path.join(plain["mnt"], plain["dir"]), os.path.join(plain["src"], plain["dir"])
    names = sorted(os.listdir(mnt))
    assert names == sorted(os.listdir(src)), (names, os.listdir(src))
    for name in names:
        path = os.path.join(mnt, name)
        assert not os.path.islink(path), f"{name} is a link"
        assert sha256(path) == sha256(os.path.join(src, name)), f"{name} differs"
        if name.endswith(".safetensors"):
            a, b = load_file(path), load_file(os.path.join(src, name))
            assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), name
    return f"{len(names)} files"


# --- own: stagefs mount inside the guest -----------------------------------------------
# Mounted here, before the write group, and evicted and unmounted after the hub group:
# the server keeps an NFS read handle until it has been idle 30 s, and evict waits
# for that; the groups between wait it out.

OWN = SPEC["own"]


def stagefs(*args, timeout=60):
    return sh([SPEC["stagefs"], "--no-config", *args], timeout)


def own_snap(root=None):
    repo = "models--" + OWN["repo"].replace("/", "--")
    return os.path.join(root or OWN["mnt"], repo, "snapshots", OWN["commit"])


OWN_SRC_SNAP = own_snap(OWN["src"])


def staged(cache):
    rc, out, _ = stagefs("status", "--json", "--cache-dir", cache, timeout=30)
    assert rc == 0, f"status: {rc}: {tail(out)}"
    (report,) = json.loads(out)["mounts"]
    return report


def own_daemons():
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"stagefs") and OWN["mnt"].encode() in cmd:
            found.append(int(pid))
    return found


@check("own")
def stagefs_mounts_with_the_nfs_backend():
    os.makedirs(OWN["mnt"], exist_ok=True)
    rc, out, took = stagefs("mount", OWN["src"], OWN["mnt"], "--backend", "nfs", "--cache-dir", OWN["cache"])
    assert rc == 0, f"stagefs mount: {rc}: {tail(out)}"
    fields = mounted(OWN["mnt"])
    assert fields and fields[2] == "nfs", f"not an NFS mount: {fields}"
    for option in ("vers=3", "hard", "local_lock=all", "addr=127.0.0.1"):
        assert option in fields[3].split(","), f"{option} not in {fields[3]}"
    assert own_daemons(), "no daemon runs"
    return f"{took} s: {fields[3]}"


@check("own")
def reads_through_stagefs_mount_match_the_source():
    assert mounted(OWN["mnt"]), "not mounted"
    for name in os.listdir(OWN_SRC_SNAP):
        path = os.path.join(own_snap(), name)
        assert sha256(path) == sha256(os.path.join(OWN_SRC_SNAP, name)), f"{name} differs"
    status = staged(OWN["cache"])
    assert status.get("backend") == "nfs", status.get("backend")
    assert status.get("mountpoint") == OWN["mnt"], status.get("mountpoint")
    models = {m["model"]: m for m in status["models"]}
    assert models.get(OWN["repo"], {}).get("staged_files", 0) >= len(OWN["shards"]), status["models"]
    return f"stage_copies {status['metrics']['stage_copies']}"


@check("own")
def doctor_reports_the_nfs_mount():
    rc, out, _ = stagefs("doctor", "--json", OWN["src"], "--cache-dir", OWN["cache"], timeout=90)
    assert rc in (0, 1), f"doctor: {rc}: {tail(out)}"
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks.get("mount", {}).get("verdict") == "ok", checks.get("mount")
    bad = {n: c["summary"] for n, c in checks.items() if c["verdict"] == "fail" and n != "fuse"}
    assert not bad, bad
    return f"fuse: {checks['fuse']['verdict']}"


@check("doctor")
def doctor_with_backend_nfs_does_not_require_fuse():
    config = os.path.join("/tmp", "stagefs-nfs.toml")
    with open(config, "w") as f:
        f.write(f'source = "{OWN["src"]}"\nmountpoint = "{OWN["mnt"]}"\ncache_dir = "{OWN["cache"]}"\nbackend = "nfs"\n')
    rc, out, _ = sh([SPEC["stagefs"], "--config", config, "doctor", "--json"], 90)
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    fuse = checks.get("fuse", {})
    assert fuse.get("verdict") != "fail", (
        f"with backend = \"nfs\" and a working NFS mount, doctor still fails on FUSE (exit {rc}): {fuse.get('summary')}"
    )
    return f"exit {rc}"


# --- write ---------------------------------------------------------------------------

W_MNT = os.path.join(HF["mnt"], "writes")
W_SRC = os.path.join(HF["src"], "writes")


@check("write")
def a_created_file_reads_back_and_lands_on_the_source():
    os.makedirs(W_MNT, exist_ok=True)
    data = random.Random(1).randbytes(300_000)
    path = os.path.join(W_MNT, "created.bin")
    write(path, data)
    assert os.path.getsize(path) == len(data)
    assert read(path) == data, "read back through the mount"
    assert read(os.path.join(W_SRC, "created.bin")) == data, "the source holds other bytes"


@check("write")
def a_same_size_rewrite_reads_back_new():
    path = os.path.join(W_MNT, "rewrite.bin")
    old, new = b"A" * 1_500_000, b"B" * 1_500_000
    write(path, old)
    assert read(path) == old
    with open(path, "r+b") as f:
        f.write(new)
    assert read(path) == new, "the rewrite reads back old bytes through the mount"
    assert read(os.path.join(W_SRC, "rewrite.bin")) == new, "the source kept old bytes"
    # in place, in the middle, without a truncate
    with open(path, "r+b") as f:
        f.seek(700_000)
        f.write(b"C" * 4096)
    want = new[:700_000] + b"C" * 4096 + new[704_096:]
    assert read(path) == want, "a mid-file overwrite reads back wrong"
    assert read(os.path.join(W_SRC, "rewrite.bin")) == want


@check("write")
def a_same_size_rewrite_at_the_source_is_seen():
    # A file staged by the server (above --min-stage-size), then rewritten at the
    # source with the same size, as another machine on the NAS would.
    path = os.path.join(W_MNT, "changed-at-source.bin")
    old, new = b"o" * (2 << 20), b"n" * (2 << 20)
    write(path, old)
    assert read(path) == old
    time.sleep(1.1)
    write(os.path.join(W_SRC, "changed-at-source.bin"), new, "r+b")
    return reads_new_within(path, old, new, 10, "a same-size rewrite at the source")


@check("write")
def a_file_rewritten_in_place_at_the_source_is_seen():
    # Files the mount never wrote, read through it (a small one read from the
    # source, one large enough to be staged), then truncated and rewritten at the
    # source with new sizes, as another machine's save_pretrained does: the same
    # inode, and a directory whose mtime does not move. The client holds the name
    # and has no reason to look it up again; only its handle's attributes can tell.
    seen = []
    for name, old, new in (
        ("config-at-source.json", b'{"layers": 2}', b'{"layers": 2, "heads": 4}'),
        ("shard-at-source.bin", b"o" * (2 << 20), b"n" * (3 << 20)),
    ):
        src, mnt = os.path.join(W_SRC, name), os.path.join(W_MNT, name)
        write(src, old)
        reads_new_within(mnt, None, old, 10, f"{name} was made at the source")
        # The directory changed when the file was made; once the client has looked
        # at it again, it trusts the name for as long as the directory is unchanged.
        for _ in range(2):
            time.sleep(1.1)
            assert read(mnt) == old
        inode = os.stat(src).st_ino
        write(src, new)
        assert os.stat(src).st_ino == inode, "the rewrite made a new file at the source"
        # Stat first, with no open: the handle's own attributes must move. macOS
        # compares only the mtime (and Linux the ctime) to drop what it cached.
        took = stat_matches_within(mnt, src, 10)
        seen.append(f"{name}: attributes after {took} s, bytes " + reads_new_within(mnt, old, new, 10, f"{name} was rewritten at the source"))
    return "; ".join(seen)


def stat_matches_within(path, source, seconds):
    """Polls stat of `path` until its size and mtime are those of `source`."""
    want = os.stat(source)
    start = time.monotonic()
    while True:
        got = os.stat(path)
        if (got.st_size, got.st_mtime_ns) == (want.st_size, want.st_mtime_ns):
            return round(time.monotonic() - start, 1)
        assert time.monotonic() - start < seconds, (
            f"{seconds} s after a change at the source, {path} has size {got.st_size} and mtime "
            f"{got.st_mtime_ns}, the source {want.st_size} and {want.st_mtime_ns}"
        )
        time.sleep(0.1)


def reads_new_within(path, old, new, seconds, change):
    """Polls `path` until it reads `new` (never anything but `old` before; `old`
    None: the name did not exist before)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            got = read(path)
        except FileNotFoundError:
            # `old` None: the name is new, and the client may still hold its absence.
            if old is not None:
                raise
            got = None
        if got == new:
            return f"seen after {round(seconds - (deadline - time.monotonic()), 1)} s"
        assert got == old, "neither the old bytes nor the new"
        assert time.monotonic() < deadline, f"{seconds} s after {change}, the mount still reads the old bytes"
        time.sleep(0.5)


@check("write")
def a_file_replaced_at_the_source_with_its_size_and_mtime_is_seen():
    # `cp -p`, `rsync -t`, a temp file renamed over the old one at the NAS: a new
    # inode and change time, the old size and mtime. The server's stamp has both.
    path = os.path.join(W_MNT, "replaced-at-source.bin")
    src = os.path.join(W_SRC, "replaced-at-source.bin")
    old, new = b"o" * (2 << 20), b"r" * (2 << 20)
    write(src, old)
    assert read(path) == old
    mtime = os.stat(src).st_mtime_ns
    tmp = os.path.join(W_SRC, ".replaced-at-source.bin.tmp")
    write(tmp, new)
    os.utime(tmp, ns=(mtime, mtime))
    os.rename(tmp, src)
    return reads_new_within(path, old, new, 10, "the replacement")


@check("write")
def rename_over_an_existing_file():
    a, b = os.path.join(W_MNT, "new.txt"), os.path.join(W_MNT, "old.txt")
    write(b, b"old contents")
    write(a, b"new")
    assert read(b) == b"old contents"
    os.rename(a, b)
    assert read(b) == b"new", "the target reads its old bytes"
    assert not os.path.exists(a), "the renamed name is still there"
    assert "new.txt" not in os.listdir(W_MNT)
    assert read(os.path.join(W_SRC, "old.txt")) == b"new"
    assert not os.path.exists(os.path.join(W_SRC, "new.txt"))
    # os.replace of an open file: the reader keeps the old bytes (silly rename)
    write(a, b"newest")
    with open(b, "rb") as held:
        os.replace(a, b)
        assert held.read() == b"new", "an open file's bytes changed under its reader"
    assert read(b) == b"newest"


@check("write")
def unlink_removes_it_everywhere():
    path = os.path.join(W_MNT, "doomed.txt")
    write(path, b"x")
    assert os.path.exists(os.path.join(W_SRC, "doomed.txt"))
    os.unlink(path)
    expect_errno(errno.ENOENT, os.stat, path)
    assert "doomed.txt" not in os.listdir(W_MNT)
    assert not os.path.exists(os.path.join(W_SRC, "doomed.txt")), "still at the source"
    expect_errno(errno.ENOENT, os.unlink, path)


@check("write")
def o_excl_create_twice_gets_eexist():
    path = os.path.join(W_MNT, "exclusive")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    os.write(fd, b"first")
    os.close(fd)
    expect_errno(errno.EEXIST, os.open, path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    assert read(path) == b"first", "the second create touched the file"
    assert read(os.path.join(W_SRC, "exclusive")) == b"first"


@check("write")
def mkdir_and_rmdir():
    d = os.path.join(W_MNT, "dir")
    os.mkdir(d)
    assert os.path.isdir(os.path.join(W_SRC, "dir"))
    expect_errno(errno.EEXIST, os.mkdir, d)
    write(os.path.join(d, "f"), b"f")
    expect_errno(errno.ENOTEMPTY, os.rmdir, d)
    os.unlink(os.path.join(d, "f"))
    os.rmdir(d)
    assert not os.path.exists(d) and not os.path.exists(os.path.join(W_SRC, "dir"))
    os.makedirs(os.path.join(W_MNT, "deep/er/still"))
    assert os.path.isdir(os.path.join(W_SRC, "deep/er/still"))


@check("write")
def flock_and_fcntl_locks_work():
    # huggingface_hub's filelock: local_lock=all keeps locks in the client kernel.
    path = os.path.join(W_MNT, "lockfile")
    with open(path, "w") as a, open(path, "w") as b:
        fcntl.flock(a, fcntl.LOCK_EX | fcntl.LOCK_NB)
        expect_errno(errno.EWOULDBLOCK, fcntl.flock, b, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(a, fcntl.LOCK_UN)
        fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(a, fcntl.LOCK_EX | fcntl.LOCK_NB)


@check("write")
def a_directory_of_thousands_lists_completely():
    big = SPEC["bigdir"]
    mnt, src = os.path.join(HF["mnt"], big["rel"]), os.path.join(HF["src"], big["rel"])
    started = time.monotonic()
    listed = os.listdir(mnt)
    took = round(time.monotonic() - started, 2)
    assert len(listed) == len(set(listed)), f"{len(listed) - len(set(listed))} names listed twice"
    want = set(os.listdir(src))
    assert len(want) == big["count"], (len(want), big["count"])
    missing, extra = want - set(listed), set(listed) - want
    assert not missing and not extra, f"{len(missing)} missing (e.g. {sorted(missing)[:3]}), {len(extra)} extra"
    # every entry's attributes, as `ls -l` wants them (READDIRPLUS brings them)
    started = time.monotonic()
    sizes = {e.name: e.stat(follow_symlinks=False).st_size for e in os.scandir(mnt)}
    stat_took = round(time.monotonic() - started, 2)
    # the generator wrote each file's number as its contents
    wrong = [n for n in want if sizes.get(n) != len(str(int(n.rsplit("-", 1)[1])))]
    assert not wrong, f"{len(wrong)} sizes wrong, e.g. {wrong[:3]}"
    return f"{len(listed)} entries: listed in {took} s, with attributes in {stat_took} s"


@check("write")
def a_listing_while_files_are_added_misses_and_repeats_nothing():
    grow = SPEC["grow"]
    d = os.path.join(HF["mnt"], grow["rel"])
    before = set(os.listdir(os.path.join(HF["src"], grow["rel"])))
    assert len(before) == grow["count"], len(before)
    seen, added = [], []
    with os.scandir(d) as it:
        for i, entry in enumerate(it):
            seen.append(entry.name)
            if i == 50:
                for n in range(200):
                    name = f"added-{n:04}"
                    write(os.path.join(d, name), b"+")
                    added.append(name)
    dupes = len(seen) - len(set(seen))
    assert not dupes, f"{dupes} names listed twice while files were added"
    missing = before - set(seen)
    assert not missing, f"{len(missing)} of the files there before were not listed, e.g. {sorted(missing)[:3]}"
    unknown = set(seen) - before - set(added)
    assert not unknown, f"unknown names {sorted(unknown)[:3]}"
    after = os.listdir(d)
    assert sorted(after) == sorted(before | set(added)), "a listing after the adds is not complete"
    return f"{len(seen)} listed during, {len(after)} after"


@check("write")
def statvfs_gives_sane_figures():
    m, s = os.statvfs(HF["mnt"]), os.statvfs(HF["src"])
    assert m.f_bsize > 0 and m.f_frsize > 0 and m.f_blocks > 0, m
    assert m.f_bavail <= m.f_bfree <= m.f_blocks, m
    assert m.f_ffree <= m.f_files, m
    assert m.f_namemax >= 255, m
    total, stotal = m.f_blocks * m.f_frsize, s.f_blocks * s.f_frsize
    assert abs(total - stotal) <= stotal * 0.02, f"total {total} here, {stotal} at the source"
    free, sfree = m.f_bavail * m.f_frsize, s.f_bavail * s.f_frsize
    assert abs(free - sfree) <= max(stotal * 0.02, 64 << 20), f"available {free} here, {sfree} at the source"
    return f"{total >> 30} GiB, {free >> 30} GiB available"


# --- save: save_pretrained over a model folder just loaded through the mount ----------

SAVE_MNT = os.path.join(SPEC["plain"]["mnt"], SPEC["save"]["dir"])
SAVE_SRC = os.path.join(SPEC["plain"]["src"], SPEC["save"]["dir"])


def saved_tensors(old):
    """hub_client.py's tensors() (what `save` writes), or the model there before it:
    the same names, shapes and sizes, other values."""
    from hub_client import tensors

    t = tensors()
    return {k: (-v - 1 if old else v) for k, v in t.items()}


def same_tensors(path, want, how):
    """Every tensor of the safetensors file at `path`, by safe_open (mmap) and by
    mlx's own loader, equals `want`'s."""
    from safetensors import safe_open

    with safe_open(path, "np") as f:
        assert sorted(f.keys()) == sorted(want), f"{how}: safe_open names {sorted(f.keys())}"
        for k in f.keys():
            assert np.array_equal(f.get_tensor(k), want[k]), f"{how}: safe_open's {k} differs"
    import mlx.core as mx

    got = mx.load(path)
    assert sorted(got) == sorted(want), f"{how}: mx.load names {sorted(got)}"
    for k, v in got.items():
        assert np.array_equal(np.array(v), want[k]), f"{how}: mx.load's {k} differs"


@check("save")
def save_pretrained_over_a_loaded_model_reads_back_new():
    from safetensors.numpy import save_file

    # A model downloaded earlier: at the source, loaded (and staged) through the mount.
    os.makedirs(SAVE_SRC, exist_ok=True)
    old = saved_tensors(old=True)
    save_file(old, os.path.join(SAVE_SRC, "model.safetensors"))
    write(os.path.join(SAVE_SRC, "config.json"), b'{"model_type": "tiny", "hidden_size": 1}')
    same_tensors(os.path.join(SAVE_MNT, "model.safetensors"), old, "the old model through the mount")
    # save_pretrained over it, through the mount (hub_client.py's save, in this
    # process, which has numpy and safetensors loaded already: makedirs,
    # config.json, the weights under a temp name renamed over the old file).
    from hub_client import save as save_like_save_pretrained

    started = time.monotonic()
    said = save_like_save_pretrained(SAVE_MNT)
    took = round(time.monotonic() - started, 1)
    new = saved_tensors(old=False)
    names = sorted(os.listdir(SAVE_MNT))
    assert names == ["config.json", "model.safetensors"], f"through the mount: {names}"
    assert sorted(os.listdir(SAVE_SRC)) == names, f"at the source: {sorted(os.listdir(SAVE_SRC))}"
    for name in names:
        digest = sha256(os.path.join(SAVE_MNT, name))
        assert digest == said[name], f"{name} reads back other bytes than save wrote"
        assert sha256(os.path.join(SAVE_SRC, name)) == digest, f"{name} at the source differs"
    assert json.load(open(os.path.join(SAVE_MNT, "config.json")))["hidden_size"] == 1024, "the old config"
    same_tensors(os.path.join(SAVE_MNT, "model.safetensors"), new, "the saved model through the mount")
    same_tensors(os.path.join(SAVE_SRC, "model.safetensors"), new, "the saved model at the source")
    return f"saved in {took} s; safe_open and mx.load read the new tensors, through the mount and at the source"


# --- posix ---------------------------------------------------------------------------

HERE = os.path.dirname(os.path.abspath(__file__))


@check("posix")
def posix_operations_through_the_kernel_client_as_through_fuse():
    plain = SPEC["plain"]
    # Each name of a hard link is a handle of its own: a write through one is read
    # through the other once the client's 1 s attribute cache of it expires.
    args = [sys.executable, os.path.join(HERE, "posix_checks.py"), plain["mnt"], plain["src"], "--settle", "3"]
    rc, out, took = sh(args, 120)
    last = out.strip().splitlines()[-1] if out.strip() else ""
    assert rc == 0 and last.endswith(" passed, 0 failed"), f"posix_checks.py: {rc}: {tail(out, 1500)}"
    return f"{last} in {took} s"


@check("posix")
def random_operations_on_one_file_match_a_model():
    path = os.path.join(SPEC["plain"]["mnt"], "fsx.bin")
    args = [sys.executable, os.path.join(HERE, "fsx.py"), path, "--ops", "600", "--seconds", "40", "--seed", "7"]
    rc, out, took = sh(args, 90)
    assert rc == 0 and '"ok": true' in out, f"fsx.py: {rc}: {tail(out, 1500)}"
    os.unlink(path)
    return f"{json.loads(out.strip().splitlines()[-1])['ops']} operations in {took} s"


# --- hub -----------------------------------------------------------------------------


@check("hub")
def hf_download_into_the_mounted_hf_home():
    hub = SPEC.get("hub")
    if not hub:
        raise Skip("no local Hub in the spec")
    env = dict(os.environ, HF_ENDPOINT=hub["endpoint"])
    env.pop("HF_HUB_OFFLINE")
    hf = os.path.join(os.path.dirname(sys.executable), "hf")
    rc, out, took = sh([hf, "download", hub["repo"]], 150, env=env)
    assert rc == 0, f"hf download: {rc}: {tail(out)}"
    # `hf download` ends with the snapshot's path (alone, or as `path: ...`)
    paths = [w for w in out.split() if w.startswith(HF["mnt"] + "/hub/")]
    assert paths, f"no snapshot path in: {tail(out)}"
    snapshot = paths[-1]
    files = {}
    for dirpath, _, names in os.walk(hub["dir"]):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), hub["dir"])
            files[rel] = sha256(os.path.join(dirpath, name))
    for rel, digest in files.items():
        path = os.path.join(snapshot, rel)
        assert sha256(path) == digest, f"{rel} differs from the Hub's"
        source = os.path.realpath(src_of(path, HF["mnt"], HF["src"]))
        assert sha256(source) == digest, f"{rel} at the source differs"
        if rel.endswith(".safetensors"):
            assert os.path.basename(os.readlink(path)) == digest, "an LFS blob is named by its sha256"
    # and this (offline) process resolves it like any other cached model
    from huggingface_hub import hf_hub_download

    for rel in files:
        assert hf_hub_download(hub["repo"], rel) == os.path.join(snapshot, rel)
    return f"{len(files)} files in {took} s"


# One process of the loaders users run (tests/py/hub_client.py's `loads` and
# `mlx-load-folder`), offline, with HF_HOME at the offline group's export: it imports
# mlx_lm and transformers once (about a minute under TCG), for the mlx and offline
# groups, then loads what it is asked, a JSON line each way.
LOADER_CODE = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
import hub_client
for line in sys.stdin:
    ask = json.loads(line)
    os.environ.update(REPO=ask["repo"], EXPECT_WEIGHTS=ask["expect"])
    try:
        said = hub_client.MODES[ask["mode"]](ask["target"])
    except Exception as e:
        said = {"error": f"{type(e).__name__}: {e}", "errno": getattr(e, "errno", None)}
    print(json.dumps(said), flush=True)
"""


class Loader:
    proc = None

    @classmethod
    def ask(cls, mode, target, repo="", expect=None, seed=None):
        """What the loaders of `mode` gave for the model folder `target` (and for
        `repo`); fails on an error, or on weights or a config that are not the
        model's (`expect`, a safetensors file, and `seed`: by default the offline
        group's)."""
        if cls.proc is None:
            env = dict(os.environ, HF_HOME=SPEC["offline"]["mnt"], HF_HUB_OFFLINE="1")
            env.pop("HF_HUB_CACHE", None)
            cls.proc = subprocess.Popen(
                [sys.executable, "-c", LOADER_CODE, os.path.dirname(os.path.abspath(__file__))],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
            )
        expect = expect or SPEC["offline"]["weights"]
        seed = SPEC["offline"]["seed"] if seed is None else seed
        ask = {"mode": mode, "target": target, "repo": repo, "expect": expect}
        cls.proc.stdin.write(json.dumps(ask) + "\n")
        cls.proc.stdin.flush()
        line = cls.proc.stdout.readline()
        assert line, f"the loader process ended ({cls.proc.poll()})"
        said = json.loads(line)
        assert "error" not in said, f"{mode} {repo or target}: {said}"
        for one in (said[by] for by in ("repo", "folder")) if mode == "loads" else [said]:
            assert one["weights_match"] is True, f"{mode} {repo or target}: weights differ: {said}"
            assert one["seed"] == seed, f"{mode} {repo or target}: the config: {said}"
        return said


# --- mlx -----------------------------------------------------------------------------


@check("mlx")
def mlx_lm_loads_a_model_from_the_mount():
    llama = SPEC.get("llama")
    if not SPEC.get("mlx_lm") or not llama:
        raise Skip("mlx_lm.load is off: importing mlx_lm alone takes ~25 s under TCG (STAGEFS_GUEST_MLX_LM=0 turned it off)")
    path = os.path.join(SPEC["plain"]["mnt"], llama)
    want = os.path.join(SPEC["plain"]["src"], llama, "model.safetensors")
    started = time.monotonic()
    said = Loader.ask("mlx-load-folder", path, expect=want, seed=SPEC["llama_seed"])
    return f"{time.monotonic() - started:.1f} s (the loader's imports included): generated {said['generated']!r}"


@check("own")
def evict_drops_copies_once_nfs_handles_go_idle():
    assert mounted(OWN["mnt"]), "not mounted"
    # NFS never says a reader is done: the server keeps a read handle (and its copy's
    # pin) until it has been idle 30 s (nfs/src/reads.rs IDLE, swept every 5 s).
    # The doctor checks above took some of that; the rest is waited out here.
    started = time.monotonic()
    first = None
    while True:
        rc, out, _ = stagefs("evict", "--all", "--cache-dir", OWN["cache"], timeout=30)
        first = first or (rc, out)
        if rc == 0:
            break
        assert "in use" in out, f"evict --all: {rc}: {tail(out)}"
        assert time.monotonic() - started < 50, f"evict --all still refused after 50 s: {tail(out)}"
        time.sleep(2)
    waited = round(time.monotonic() - started, 1)
    left = {m["model"]: m["staged_files"] for m in staged(OWN["cache"])["models"]}
    assert not left.get(OWN["repo"]), f"still staged: {left}"
    name = OWN["shards"][0]
    assert sha256(os.path.join(own_snap(), name)) == sha256(os.path.join(OWN_SRC_SNAP, name)), "a re-read after evict"
    said = out.strip().splitlines()[-1] if out.strip() else ""
    return f"{said}, after {waited} s more" + ("" if first[0] == 0 else " (refused as in use before)")


@check("own")
def unmount_ends_the_mount_and_the_daemon():
    rc, out, _ = stagefs("unmount", OWN["mnt"], timeout=60)
    assert rc == 0, f"unmount: {rc}: {tail(out)}"
    assert not mounted(OWN["mnt"]), "still mounted"
    deadline = time.monotonic() + 15
    while own_daemons():
        assert time.monotonic() < deadline, f"the daemon still runs: {own_daemons()}"
        time.sleep(0.3)


@check("own")
def sigterm_with_a_shard_mapped_detaches_and_serves_it_until_closed():
    """What `systemctl stop` or a logout does to a mount whose model is open: the
    mount is detached (umount -l), the open mapping keeps reading through the NFS
    client, and the daemon exits once the kernel lets go of the volume."""
    rc, out, _ = stagefs("mount", OWN["src"], OWN["mnt"], "--backend", "nfs", "--cache-dir", OWN["cache"])
    assert rc == 0, f"stagefs mount: {rc}: {tail(out)}"
    daemons = own_daemons()
    assert daemons, "no daemon runs"
    name = OWN["shards"][0]
    holder = subprocess.Popen(
        [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "mmap_holder.py"),
         os.path.join(own_snap(), name)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout.readline().strip() == "mapped", "the holder did not map the shard"
    os.sync()
    write("/proc/sys/vm/drop_caches", b"3")
    for pid in daemons:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while mounted(OWN["mnt"]):
        assert time.monotonic() < deadline, "still mounted 30 s after SIGTERM"
        time.sleep(0.2)
    assert own_daemons(), "the daemon exited while a mapping was open"
    holder.stdin.write("read\n")
    holder.stdin.flush()
    got = json.loads(holder.stdout.readline())
    want = sha256(os.path.join(OWN_SRC_SNAP, name))
    assert got.get("mapped") == want and got.get("read") == want, f"after the detach: {got}"
    holder.stdin.write("close\n")
    holder.stdin.flush()
    assert holder.wait(timeout=30) == 0, f"the holder ended with {holder.returncode}"
    deadline = time.monotonic() + 30
    while own_daemons():
        assert time.monotonic() < deadline, "the daemon still runs 30 s after the last close"
        time.sleep(0.3)
    return "detached, served the mapping, exited after the close"


# --- fault: the host's server killed with the mount up ----------------------------------

FAULT = SPEC["fault"]


def signal_host(step):
    write(os.path.join(SPEC["scratch"], f"fault-{step}"), b"")


def await_host(step, limit=30):
    path = os.path.join(SPEC["scratch"], f"fault-{step}-done")
    deadline = time.monotonic() + limit
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"the host did not answer {step} within {limit} s"
        time.sleep(0.1)


def reader(rel, out):
    return subprocess.Popen(
        ["dd", f"if={os.path.join(HF['mnt'], rel)}", f"of={out}", "bs=1M"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def state(proc):
    try:
        return open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def stack(proc):
    """Where in the kernel a process waits: its innermost frames, or its wchan."""
    try:
        frames = [line.split()[1].split("+")[0] for line in open(f"/proc/{proc.pid}/stack") if len(line.split()) > 1]
        return " < ".join(frames[:4]) or open(f"/proc/{proc.pid}/wchan").read()
    except OSError:
        return "gone"


def exited_within(proc, seconds):
    try:
        proc.wait(seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


def ended(proc):
    err = proc.stderr.read().decode(errors="replace").strip().splitlines() if proc.stderr else []
    return f"exited {proc.returncode} ({err[0] if err else 'no message'})"


def holders(mnt):
    """The processes with a file, a mapping or a directory under mnt."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            links = [os.readlink(f"/proc/{pid}/cwd")]
            links += [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            links += [line.split()[-1] for line in open(f"/proc/{pid}/maps") if "/" in line]
            if any(link == mnt or link.startswith(mnt + "/") for link in links):
                found.add(f"{pid} {open(f'/proc/{pid}/comm').read().strip()}")
        except OSError:
            continue
    return ", ".join(sorted(found))


# --- nas: the source of the third export, an sshfs NAS on the host, fails -----------

NAS = SPEC["nas"]


def nas_shards():
    """(through the mount, at the source) for each shard of the NAS's hub cache."""
    snap = os.path.join("models--" + NAS["repo"].replace("/", "--"), "snapshots", NAS["commit"])
    return [(os.path.join(NAS["mnt"], snap, name), os.path.join(NAS["src"], snap, name)) for name in NAS["shards"]]


def nas_shards_read_right(when):
    # Past the client's attribute cache (actimeo=1), so the server is asked again.
    time.sleep(1.5)
    for path, src in nas_shards():
        assert sha256(path) == sha256(src), f"{when}: {os.path.basename(path)} differs from the source"


def nas_writes_fail_with_eio(when):
    for name, make in (("written-while-nas-gone.txt", lambda p: write(p, b"oops")), ("runs", os.mkdir)):
        path = os.path.join(NAS["mnt"], name)
        try:
            make(path)
        except OSError as e:
            assert e.errno == errno.EIO, f"{when}: {name}: {errno.errorcode.get(e.errno, e.errno)}, not EIO"
        else:
            raise AssertionError(f"{when}: creating {name} succeeded")
        assert not os.path.lexists(os.path.join(NAS["src"], name)), f"{when}: {name} reached the export"


def nas_unseen(name):
    """A name nothing is known of: in the model's repository directory, which the
    group looks up but never lists (a name a kept listing lacks is "no such file")."""
    return os.path.join(NAS["mnt"], "models--" + NAS["repo"].replace("/", "--"), name)


def nas_unseen_name_fails_at_once(when):
    started = time.monotonic()
    expect_errno(errno.EIO, os.stat, nas_unseen(f"never-seen-{when}.json"))
    took = time.monotonic() - started
    assert took < NAS["timeout"], f"{when}: an unseen name waited {took:.1f} s"
    # The root was listed while the NAS answered: a name its listing lacks is
    # absent, as the NAS said, not an error.
    started = time.monotonic()
    expect_errno(errno.ENOENT, os.stat, os.path.join(NAS["mnt"], f"never-listed-{when}.json"))
    absent = time.monotonic() - started
    assert absent < NAS["timeout"], f"{when}: a name the kept listing lacks waited {absent:.1f} s"
    return f"an unseen name failed (EIO) in {took:.3f} s, a name the kept listing lacks (ENOENT) in {absent:.3f} s"


@check("nas")
def a_model_on_an_sshfs_nas_reads_right_and_is_staged():
    for path, src in nas_shards():
        assert sha256(path) == sha256(src), f"{os.path.basename(path)} differs from the source"
    listed = sorted(os.listdir(os.path.dirname(nas_shards()[0][0])))
    assert listed, "the snapshot lists"
    # The root listed (kept with the cache), the repository directory only looked up.
    os.listdir(NAS["mnt"])
    # Another model's files, seen (as a loader scanning the cache leaves them) but
    # never read: with the link cut, programs reading them wait on the server.
    for rel in NAS["never"]:
        os.stat(os.path.join(NAS["mnt"], rel))


@check("nas")
def with_the_link_cut_and_the_nas_known_away_the_staged_model_reads_at_once():
    signal_host("nas-cut")
    await_host("nas-cut")
    time.sleep(1.5)
    # The first name nobody has seen waits out the source timeout (the server
    # answers JUKEBOX meanwhile): that is how the server learns the NAS is away.
    started = time.monotonic()
    expect_errno(errno.EIO, os.stat, nas_unseen("never-seen-first.json"))
    first = time.monotonic() - started
    # Programs reading files never staged keep trying meanwhile, each in a loop.
    waiting = [
        subprocess.Popen(["sh", "-c", 'while :; do dd if="$0" of=/dev/null bs=1M 2>/dev/null; done',
                          os.path.join(NAS["mnt"], rel)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        for rel in NAS["never"]
    ]
    try:
        time.sleep(2)
        started = time.monotonic()
        nas_shards_read_right("link cut")
        staged = time.monotonic() - started - 1.5
        assert staged < NAS["timeout"], f"the staged model took {staged:.1f} s with the link cut"
        unseen = nas_unseen_name_fails_at_once("cut")
        still = sum(1 for p in waiting if p.poll() is None)
    finally:
        for p in waiting:
            os.killpg(p.pid, signal.SIGKILL)
        for p in waiting:
            p.wait(timeout=30)
    signal_host("nas-restore")
    await_host("nas-restore")
    return (f"first unseen name {first:.1f} s; then, with {still} programs reading never-staged files "
            f"in loops, the staged model {staged:.2f} s, {unseen}")


@check("nas")
def with_the_nas_unmounted_underneath_the_staged_model_reads_and_writes_land_nowhere():
    signal_host("nas-drop")
    await_host("nas-drop")
    nas_shards_read_right("unmounted underneath")
    assert os.listdir(NAS["mnt"]), "the mount lists the source, not the empty mount point"
    nas_writes_fail_with_eio("unmounted underneath")
    unseen = nas_unseen_name_fails_at_once("unmounted")
    signal_host("nas-underneath")
    await_host("nas-underneath")
    underneath = json.loads(read(os.path.join(SPEC["scratch"], "fault-nas-underneath-done")))
    assert underneath == [], f"written under the NAS's mount point on the host: {underneath}"
    return unseen


@check("nas")
def with_sshfs_killed_the_staged_model_reads_and_writes_fail():
    signal_host("nas-kill")
    await_host("nas-kill", limit=60)
    nas_shards_read_right("sshfs killed")
    nas_writes_fail_with_eio("sshfs killed")
    unseen = nas_unseen_name_fails_at_once("killed")
    return unseen


@check("nas")
def once_the_nas_is_mounted_again_it_is_served_again():
    signal_host("nas-back")
    await_host("nas-back", limit=60)
    path = os.path.join(NAS["mnt"], "added-later.txt")
    started = time.monotonic()
    while True:
        try:
            if read(path) == b"new on the nas":
                break
        except OSError:
            pass
        assert time.monotonic() - started < 60, "not served 60 s after the NAS was mounted again"
        time.sleep(0.5)
    nas_shards_read_right("mounted again")
    return f"served {time.monotonic() - started:.1f} s after it was mounted again"


# --- offline: models loaded or prefetched before load with the NAS away ---------------

OFFLINE = SPEC["offline"]

# What the model the guest loaded gave the first time: every later load (of it, and
# of the copies of it that were only prefetched) must give the same.
OFFLINE_FIRST = {}


def offline_loads(models, when):
    """`loads` (by id with HF_HOME at the mount, and by the path of a plain folder) of
    each model; seconds they took."""
    started = time.monotonic()
    for repo, folder in models:
        said = Loader.ask("loads", os.path.join(OFFLINE["mnt"], folder), repo)
        want = OFFLINE_FIRST.setdefault("loads", said)
        assert said == want, f"{when}: {repo} and {folder} loaded {said}, before {want}"
    return time.monotonic() - started


def offline_models():
    return [(OFFLINE["repo"], OFFLINE["folder"]), (OFFLINE["prefetched_repo"], OFFLINE["prefetched_folder"])]


def offline_host(step, limit=60):
    """Asks the host to do `step` (each step is done once: every step has a name of
    its own); what it answered (a failed step is this check's)."""
    signal_host(step)
    await_host(step, limit=limit)
    said = read(os.path.join(SPEC["scratch"], f"fault-{step}-done")).decode()
    assert '"error"' not in said, said
    return said


def offline_served_again(step):
    """Asks the host to bring the NAS back (`step`), and waits until the export serves
    what it added to it; seconds that took."""
    name = offline_host(step)
    started = time.monotonic()
    while True:
        try:
            if read(os.path.join(OFFLINE["mnt"], name)) == b"back":
                return time.monotonic() - started
        except OSError:
            pass
        assert time.monotonic() - started < 60, f"{name} not served 60 s after the NAS came back"
        time.sleep(0.5)


def offline_outage(away, back, when):
    if not OFFLINE_FIRST:
        raise Skip("the models were not loaded before")
    offline_host(away)
    try:
        # Past the client's attribute cache (actimeo=1): every name is asked again.
        time.sleep(1.5)
        took = offline_loads(offline_models(), when)
    finally:
        again = offline_served_again(back)
    return f"loads of both {took:.1f} s; served again {again:.1f} s after the NAS came back"


@check("offline")
def a_model_loaded_through_the_kernel_client_and_one_prefetched_on_the_host_are_ready_offline():
    if not SPEC.get("mlx_lm"):
        raise Skip("mlx_lm.load is off (STAGEFS_GUEST_MLX_LM=0)")
    first = offline_loads(offline_models()[:1], "the first time")
    again = offline_loads(offline_models()[:1], "again, with the NAS up")
    said = json.loads(offline_host("offline-prefetch", limit=120))
    assert said["ok"], f"stagefs prefetch on the host: {said}"
    # Prefetched on the host, and loaded through the kernel client: both ready.
    for model in (OFFLINE["prefetched_repo"], OFFLINE["prefetched_folder"], OFFLINE["repo"], OFFLINE["folder"]):
        ready = said["offline"].get(model)
        assert ready and all(r["ready"] for r in ready), f"{model} is not ready offline: {said['offline']}"
    return (f"loads (mlx_lm.load + generate, AutoConfig, AutoTokenizer; by id and by path) {first:.1f} s "
            f"the first time (with the loader's imports if the mlx group did not run), {again:.1f} s again; "
            f"then prefetched on the host; status: all four ready offline")


@check("offline")
def with_the_link_cut_both_load_the_same():
    return offline_outage("offline-cut", "offline-restore", "link cut")


@check("offline")
def with_the_nas_unmounted_both_load_the_same():
    return offline_outage("offline-drop", "offline-drop-back", "unmounted")


@check("offline")
def with_sshfs_killed_both_load_the_same():
    return offline_outage("offline-kill", "offline-kill-back", "sshfs killed")


@check("offline")
def a_serve_restarted_with_the_nas_away_serves_both_then_takes_the_nas_back():
    if not OFFLINE_FIRST:
        raise Skip("the models were not loaded before")
    try:
        said = json.loads(offline_host("offline-restart-away", limit=90))
        assert (said.get("source_health") or {}).get("unresponsive") is True, f"the restarted serve's status: {said}"
        time.sleep(1.5)
        took = offline_loads(offline_models(), "after a restart with the NAS away")
    finally:
        again = offline_served_again("offline-restart-back")
    started = time.monotonic()
    Loader.ask("mlx-load-folder", os.path.join(OFFLINE["mnt"], OFFLINE["never_folder"]))
    never = time.monotonic() - started
    return (f"the mount kept its handles: loads of both {took:.1f} s; NAS back: served again {again:.1f} s "
            f"after, a folder never read before loaded {never:.1f} s, no remount")


# --- links: blobs as links to their local copies (`stagefs serve --links`) ----------------
# All inside the guest, as an HF user's Mac has it: an ordinary user serves a hub cache
# with its cache on a local filesystem (the guest's tmpfs), root mounts it with the
# kernel's NFS client (a Linux user cannot), and the user's programs read through it.
# The user's Hub is a local one (tests/py/hub_server.py, in the guest).

LINKS = SPEC["links"]
LROOT = LINKS["root"]
LP = {
    n: os.path.join(LROOT, n)
    for n in ("src", "cache", "mnt", "home", "cache-full", "mnt-full")
}
LREPO = "acme/linked"
LREPO_DIR = "models--" + LREPO.replace("/", "--")
LSTATE = {"serves": []}


def as_user(args, timeout, env=None):
    base = {
        "HOME": LP["home"],
        "USER": LINKS["user"],
        "LOGNAME": LINKS["user"],
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    if LINKS.get("pythonpath"):
        base["PYTHONPATH"] = LINKS["pythonpath"]
    base.update(env or {})
    ids = [f"--reuid={LINKS['uid']}", f"--regid={LINKS['gid']}", "--init-groups", "--"]
    return sh(["setpriv", *ids, *args], timeout, env=base)


def user_popen(args, log, env=None):
    base = {"HOME": LP["home"], "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    if LINKS.get("pythonpath"):
        base["PYTHONPATH"] = LINKS["pythonpath"]
    base.update(env or {})
    ids = [f"--reuid={LINKS['uid']}", f"--regid={LINKS['gid']}", "--init-groups", "--"]
    with open(log, "w") as err:
        return subprocess.Popen(["setpriv", *ids, *args], stdout=subprocess.PIPE, stderr=err, env=base, text=True)


def client(mode, *args, env=None, timeout=150):
    rc, out, took = as_user([LINKS["python"], LINKS["client"], mode, *args], timeout, env)
    assert rc == 0, f"links_client {mode}: {rc}: {tail(out)}"
    return json.loads(out.strip().splitlines()[-1])


def offline_env(home):
    return {"HF_HOME": home, "HF_HUB_OFFLINE": "1"}


def hub_up(made):
    hub = subprocess.Popen(
        [sys.executable, LINKS["hub_server"], made, LREPO, "--lfs-min", "1048576"],
        # It serves until its stdin closes.
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    port, commit = hub.stdout.readline().split()
    return hub, f"http://127.0.0.1:{port}", commit


def serve(cache, *flags, links=True):
    log = os.path.join(SPEC["scratch"], f"links-serve-{len(LSTATE['serves'])}.log")
    args = [SPEC["stagefs"], "--no-config", "serve", *(["--links"] if links else []), LP["src"], "--cache-dir", cache,
            "--min-free", "0", *flags]
    proc = user_popen(args, log)
    first = proc.stdout.readline()
    LSTATE["serves"].append(proc)
    LSTATE.setdefault("logs", {})[proc.pid] = log
    # nfs://127.0.0.1/?nfsport=P&mountport=P&version=3
    port = first.partition("nfsport=")[2].partition("&")[0]
    assert port.isdigit(), f"stagefs serve said {first!r}: {tail(open(log).read())}"
    return proc, int(port)


def kernel_mount(port, mnt):
    opts = (f"vers=3,tcp,port={port},mountport={port},mountproto=tcp,rsize=1048576,wsize=1048576,"
            "actimeo=1,hard,local_lock=all,addr=127.0.0.1")
    rc, out, _ = sh(["mount", "-i", "-t", "nfs", "-o", opts, "127.0.0.1:/", mnt], 60)
    assert rc == 0, f"mount: {rc}: {tail(out)}"


def read_calls(mnt):
    """READ calls the kernel client sent on the mount at `mnt`, from mountstats."""
    ours = False
    for line in open("/proc/self/mountstats"):
        if line.startswith("device "):
            ours = f" mounted on {mnt} " in line
        elif ours and line.strip().startswith("READ:"):
            return int(line.split()[1])
    raise AssertionError(f"no READ line for {mnt} in mountstats")


def served_reads(cache):
    rc, out, _ = as_user([SPEC["stagefs"], "--no-config", "status", "--json", "--cache-dir", cache], 30)
    assert rc == 0, f"status: {rc}: {tail(out)}"
    (report,) = json.loads(out)["mounts"]
    return report["metrics"]


def lsnap(root, commit):
    return os.path.join(root, "hub", LREPO_DIR, "snapshots", commit)


def lblob(root, sha):
    return os.path.join(root, "hub", LREPO_DIR, "blobs", sha)


@check("links")
def an_ordinary_users_serve_with_links_is_mounted_by_the_kernel():
    shutil.rmtree(LROOT, ignore_errors=True)
    for path in [LROOT, *LP.values()]:
        os.makedirs(path, exist_ok=True)
        os.chown(path, LINKS["uid"], LINKS["gid"])
    # The models were made on the host (numpy under TCG takes a while).
    LSTATE["a"], LSTATE["b"] = LINKS["a"], LINKS["b"]
    hub, endpoint, commit = hub_up(LINKS["a"]["dir"])
    try:
        got = client("download", LREPO, env={"HF_HOME": LP["src"], "HF_ENDPOINT": endpoint})
    finally:
        hub.kill()
    assert got["commit"] == commit, got
    LSTATE["commit_a"] = commit
    _, port = serve(LP["cache"])
    kernel_mount(port, LP["mnt"])
    fields = mounted(LP["mnt"])
    assert fields and fields[2] == "nfs", fields
    return f"port {port}, commit {commit[:8]}"


def cold_load(links, name):
    """A cold MLX-pattern load of revision A through a fresh server (fresh cache) and
    mount, with or without links; the server stopped after."""
    cache, mnt = os.path.join(LROOT, f"cache-{name}"), os.path.join(LROOT, f"mnt-{name}")
    for path in (cache, mnt):
        os.makedirs(path, exist_ok=True)
        os.chown(path, LINKS["uid"], LINKS["gid"])
    proc, port = serve(cache, links=links)
    try:
        kernel_mount(port, mnt)
        try:
            got = client("mlx", lsnap(mnt, LSTATE["commit_a"]), env=offline_env(mnt))
        finally:
            sh(["umount", mnt], 30)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        LSTATE["serves"].remove(proc)
    assert not got["errors"] and got["sha256"] == LSTATE["a"]["sha256"], got
    return got["load_seconds"] + got["read_seconds"]


@check("links")
def a_cold_load_through_links_costs_what_one_through_the_server_does():
    """The same cold load through a server without links (today's path) and with
    them, each on a fresh cache, taking turns: a link costs a LOOKUP and a READLINK
    more per shard, and the preads after find it naming the copy."""
    times = {"server": [], "links": []}
    for r in range(LINKS.get("cold_rounds", 1)):
        order = ("server", "links") if r % 2 == 0 else ("links", "server")
        for way in order:
            times[way].append(round(cold_load(way == "links", f"cold-{way}-{r}"), 3))
    median = {w: sorted(t)[len(t) // 2] for w, t in times.items()}
    return f"cold loads (s): {times}; median links/server {median['links'] / median['server']:.2f}"


@check("links")
def a_warm_load_through_links_sends_no_read_and_reads_right():
    snap = lsnap(LP["mnt"], LSTATE["commit_a"])
    want = LSTATE["a"]["sha256"]
    cold = client("mlx", snap, env=offline_env(LP["mnt"]))
    assert not cold["errors"] and cold["sha256"] == want, cold
    # Of the model as made, which the source holds byte for byte.
    source_tensors = LSTATE["a"]["tensors"]
    # The client looks at a link's attributes again 1 s after it last did.
    time.sleep(2)
    calls, served = read_calls(LP["mnt"]), served_reads(LP["cache"])["daemon_reads"]
    warm = client("mlx", snap, env=offline_env(LP["mnt"]))
    mapped = client("mmap", snap, env=offline_env(LP["mnt"]))
    calls = read_calls(LP["mnt"]) - calls
    served = served_reads(LP["cache"])["daemon_reads"] - served
    assert not warm["errors"] and warm["sha256"] == want, warm
    assert mapped["tensors"] == source_tensors, "safe_open's tensors differ from the source's"
    assert calls == 0 and served == 0, f"READ calls during the warm loads: {calls} sent, {served} served"
    cache = os.path.realpath(LP["cache"]) + "/"
    for sha in want.values():
        text = os.readlink(lblob(LP["mnt"], sha))
        assert text.startswith(cache), f"blob link reads {text}"
    for name in want:
        assert os.path.realpath(os.path.join(snap, name)).startswith(cache), name
    return (f"cold: mx.load {cold['load_seconds']} s, reads {cold['read_seconds']} s; "
            f"warm {warm['read_seconds']} s, mmap {mapped['seconds']} s; "
            f"READ calls during the warm loads: {calls} sent by the client, {served} served")


def loop_in_background(path, seconds, sha, name):
    log = os.path.join(SPEC["scratch"], f"links-loop-{name}.log")
    return user_popen([LINKS["python"], LINKS["client"], "loop", path, str(seconds), sha], log)


def serve_log(proc, n=1500):
    return tail(open(LSTATE["logs"][proc.pid]).read(), n)


def evictions(proc):
    """Copies the server `proc` logged as evicted to make room."""
    return sum("to make room" in line for line in open(LSTATE["logs"][proc.pid]))


def loop_result(proc, timeout):
    out, _ = proc.communicate(timeout=timeout)
    return json.loads(out.strip().splitlines()[-1])


@check("links")
def a_new_revision_downloaded_into_the_mount_is_what_loads():
    hub, endpoint, commit = hub_up(LINKS["b"]["dir"])
    try:
        got = client("download", LREPO, env={"HF_HOME": LP["mnt"], "HF_ENDPOINT": endpoint}, timeout=200)
    finally:
        hub.kill()
    assert got["commit"] == commit != LSTATE["commit_a"], (got, commit)
    LSTATE["commit_b"] = commit
    resolved = client("download", LREPO, env=offline_env(LP["mnt"]))
    assert resolved["commit"] == commit, resolved
    loaded = client("mlx", resolved["snapshot"], env=offline_env(LP["mnt"]))
    assert not loaded["errors"] and loaded["sha256"] == LSTATE["b"]["sha256"], loaded
    return f"revision {commit[:8]} loaded by id in {loaded['read_seconds']} s"


@check("links")
def cp_rL_rsync_aL_and_tar_h_of_a_snapshot_through_links_copy_every_byte():
    snap = lsnap(LP["mnt"], LSTATE["commit_b"])
    made = LINKS["b"]["dir"]
    # Each copies the snapshot into {out}, following its links.
    copies = {
        "cp -rL": ["cp", "-rL", snap, "{out}"],
        "rsync -aL": ["rsync", "-aL", snap + "/", "{out}/"],
        "tar -h": ["sh", "-c", f"mkdir -p {{out}} && tar -chf - -C {snap} . | tar -xf - -C {{out}}"],
    }
    took = {}
    for how, args in copies.items():
        out_dir = os.path.join(LP["home"], "copied-" + how.split()[0])
        rc, out, took[how] = as_user([a.replace("{out}", out_dir) for a in args], 120)
        assert rc == 0, f"{how}: {tail(out)}"
        names = sorted(os.listdir(out_dir))
        assert names == sorted(os.listdir(made)), (how, names)
        for name in names:
            path = os.path.join(out_dir, name)
            assert not os.path.islink(path), f"{how} copied {name} as a link"
            assert sha256(path) == sha256(os.path.join(made, name)), f"{how}: {name} differs"
    return ", ".join(f"{how} {t} s" for how, t in took.items()) + f": {len(os.listdir(made))} files each"


@check("links")
def a_linked_shard_evicted_under_a_reading_loop_never_fails():
    snap = lsnap(LP["mnt"], LSTATE["commit_a"])
    name, sha = sorted(LSTATE["a"]["sha256"].items())[0]
    proc = loop_in_background(os.path.join(snap, name), 14, sha, "evict")
    time.sleep(3)
    # A server's mount has no mount point of its own: the file is named in the source.
    evicted = os.path.join(lsnap(LP["src"], LSTATE["commit_a"]), name)
    rc, out, took = as_user([SPEC["stagefs"], "--no-config", "evict", evicted, "--cache-dir", LP["cache"]], 60)
    looped = loop_result(proc, 60)
    assert rc == 0, f"evict: {rc}: {tail(out)}; the server's log: {serve_log(LSTATE['serves'][0])}"
    assert not looped["errors"] and not looped["wrong"], looped
    assert looped["opens"] >= 5, looped
    assert "evicted 1 file" in out, f"evict: {tail(out)}"
    return f"evict took {took} s ({tail(out, 160)}); loop: {looped['opens']} opens, no error"


@check("links")
def a_full_cache_evicts_a_linked_shard_under_a_reading_loop():
    shards = sorted(LSTATE["a"]["sha256"].items())
    size = os.stat(os.path.join(LINKS["a"]["dir"], shards[0][0])).st_size
    # A copy that cannot have room is read from the source: the reader of a shard
    # evicted for another's copy goes on, and sees no ENOSPC.
    _, port = serve(LP["cache-full"], "--max-size", str(size * 3 // 2), "--on-full", "read-source")
    kernel_mount(port, LP["mnt-full"])
    snap = lsnap(LP["mnt-full"], LSTATE["commit_a"])
    (first, first_sha), others = shards[0], shards[1:]
    # Staged by prefetch, not by a READ: the server keeps a read handle (which holds
    # its copy) open until idle for 30 s, and only the link is to hold this one.
    prefetched = os.path.join(lsnap(LP["src"], LSTATE["commit_a"]), first)
    rc, out, _ = as_user([SPEC["stagefs"], "--no-config", "prefetch", prefetched, "--cache-dir", LP["cache-full"]], 60)
    assert rc == 0, f"prefetch: {rc}: {tail(out)}"
    proc = loop_in_background(os.path.join(snap, first), 12, first_sha, "full")
    time.sleep(1)
    for name, sha in others:
        got = client("loop", os.path.join(snap, name), "0.1", sha)
        assert got["opens"] and not got["errors"] and not got["wrong"], (name, got)
    looped = loop_result(proc, 60)
    copies = served_reads(LP["cache-full"])["stage_copies"]
    rc, out, _ = sh(["umount", LP["mnt-full"]], 30)
    assert rc == 0, f"umount: {tail(out)}"
    assert not looped["errors"] and not looped["wrong"], looped
    assert evictions(LSTATE["serves"][-1]) >= 1, f"no copy was evicted; the server's log: {serve_log(LSTATE['serves'][-1])}"
    return f"loop: {looped['opens']} opens, no error; {copies} copies of {len(shards)} shards under a 1.5-shard budget"


@check("links")
def warm_reads_through_links_run_at_the_local_copies_speed():
    snap = lsnap(LP["mnt"], LSTATE["commit_a"])
    want = LSTATE["a"]["sha256"]
    direct, served = os.path.join(LROOT, "direct"), os.path.join(LROOT, "served")
    for d in (direct, served):
        os.makedirs(d, exist_ok=True)
    for name, sha in want.items():
        for d, target in ((direct, os.path.realpath(os.path.join(snap, name))),
                          (served, lblob(LP["mnt"], ".stagefs-" + sha))):
            link = os.path.join(d, name)
            if not os.path.lexists(link):
                os.symlink(target, link)
    calls = read_calls(LP["mnt"])
    got = client("bench", "3", f"links={snap}", f"copies={direct}", f"server={served}", env=offline_env(LP["mnt"]))
    calls = read_calls(LP["mnt"]) - calls
    assert all(digests == want for digests in got["sha256"].values()), "bytes differ"
    times = got["times"]
    median = {w: sorted(t)[1] for w, t in times.items()}
    mib = got["bytes"] / (1 << 20)
    rate = {w: round(mib / t, 1) for w, t in median.items()}
    assert calls > 0, "the server path's reads sent no READ: they measured nothing"
    return (f"{mib:.0f} MiB, median of 3 (MiB/s): links {rate['links']}, copies {rate['copies']}, "
            f"through the server {rate['server']}; links/copies {median['copies'] / median['links']:.2f}, "
            f"server/copies {median['copies'] / median['server']:.2f}; {calls} READ calls for the server's reads; "
            f"times {times}")


@check("links")
def hf_cache_delete_through_the_mount_removes_the_repo_on_the_source_and_no_copy():
    shas = [*LSTATE["a"]["sha256"].values(), *LSTATE["b"]["sha256"].values()]
    got = client("delete", os.path.join(LP["mnt"], "hub"), LREPO, env={"HF_HOME": LP["mnt"]})
    # hf deletes each blob once, at the path one readlink of its snapshot link gives:
    # that path is the mount's, so the delete reaches the source (had it been the
    # copy's, the blob would still be on the source).
    inside = os.path.join(LP["mnt"], "hub") + "/"
    assert got["blob_paths"] and all(p.startswith(inside) for p in got["blob_paths"]), got["blob_paths"]
    left = [sha for sha in shas if os.path.lexists(lblob(LP["src"], sha))]
    assert not left, f"{len(left)} blobs still on the source"
    return f"{len(got['blob_paths'])} blobs removed on the source, by their paths in the mount"


@check("links")
def links_mounts_unmount_and_their_servers_stop():
    rc, out, _ = sh(["umount", LP["mnt"]], 30)
    assert rc == 0, f"umount: {tail(out)}"
    codes = []
    for proc in LSTATE["serves"]:
        proc.terminate()
        try:
            codes.append(proc.wait(timeout=30))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append("hung")
    assert all(c == 0 for c in codes), f"serve exit codes {codes}"
    return f"{len(codes)} servers stopped"


# --- full: a shard larger than the cache may hold (--max-size) ----------------------

FULL = SPEC["full"]


def full_files(mnt):
    """(through mnt, at the source) for the full exports' shard and their small files."""
    snap = FULL["snapshot"]
    both = [(os.path.join(mnt, snap, n), os.path.join(FULL["src"], snap, n)) for n in FULL["files"]]
    shards = [b for b in both if b[0].endswith(".safetensors")]
    small = [b for b in both if not b[0].endswith(".safetensors")]
    assert len(shards) == 1 and small, FULL["files"]
    return shards[0], small


def small_files_read_right(mnt, when):
    _, small = full_files(mnt)
    for path, src in small:
        assert read(path) == read(src), f"{when}: {os.path.basename(path)} differs from the source"
    snap = os.path.join(mnt, FULL["snapshot"])
    assert sorted(os.listdir(snap)) == sorted(FULL["files"]), f"{when}: the snapshot lists {os.listdir(snap)}"
    return len(small)


@check("full")
def on_full_read_source_reads_a_shard_too_big_for_the_cache_right():
    (path, src), _ = full_files(FULL["read_mnt"])
    size = os.path.getsize(src)
    assert os.path.getsize(path) == size, (os.path.getsize(path), size)
    started = time.monotonic()
    digest = sha256(path)
    took = round(time.monotonic() - started, 1)
    assert digest == sha256(src), "the shard read from the source through the server differs"
    # again, from the start, past the client's page cache: the server reads it again
    os.sync()
    write("/proc/sys/vm/drop_caches", b"3")
    with open(path, "rb") as f:
        assert os.pread(f.fileno(), 65536, size - 65536) == read(src)[-65536:], "its tail, read again"
    n = small_files_read_right(FULL["read_mnt"], "read-source")
    return f"{size / 1e6:.1f} MB shard, cache --max-size {FULL['max_size']}: right in {took} s; {n} small files right"


@check("full")
def on_full_fail_fails_the_read_with_enospc_and_never_gives_wrong_bytes():
    (path, src), _ = full_files(FULL["fail_mnt"])
    want = read(src)
    assert os.path.getsize(path) == len(want), "stat gives the shard's size"
    got, error = b"", None
    started = time.monotonic()
    try:
        with open(path, "rb") as f:
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                got += chunk
    except OSError as e:
        error = e
    took = round(time.monotonic() - started, 1)
    assert got == want[:len(got)], f"{len(got)} bytes read before the failure, not the source's"
    assert error is not None, f"read {len(got)} bytes without an error, from a cache too small for them"
    code = errno.errorcode.get(error.errno, error.errno)
    assert error.errno == errno.ENOSPC, f"the read failed with {code}, not ENOSPC: {error}"
    # What a user sees: cat's message; and again (a second try fails the same).
    rc, out, _ = sh(["cat", path], 30)
    assert rc != 0, "cat read it"
    user_sees = out.strip().splitlines()[-1] if out.strip() else "(cat said nothing)"
    assert "No space left on device" in user_sees, user_sees
    n = small_files_read_right(FULL["fail_mnt"], "after the failed read")
    # and the other export, with its own cache, is untouched by this one's failure
    (path2, src2), _ = full_files(FULL["read_mnt"])
    assert sha256(path2) == sha256(src2), "the read-source export afterwards"
    return f"{code} after {took} s, {len(got)} bytes before it; cat says: {user_sees}; {n} small files right"


# --- slow: a copy that takes seconds, and a source slow at every call ----------------

SLOW = SPEC["slow"]


def kernel_log():
    rc, out, _ = sh(["dmesg"], 20)
    assert rc == 0, f"dmesg: {rc}: {tail(out)}"
    return out.splitlines()


def nfs_complaints(before):
    """The kernel's NFS complaints ("server ... not responding", ...) logged since
    `before` (an earlier kernel_log())."""
    return [
        line.split("] ", 1)[-1] for line in kernel_log()[len(before):]
        if "not responding" in line or "nfs:" in line or ("RPC:" in line and "Registered" not in line)
    ]


class CacheWatch:
    """Watches the server's cache directory (shared with the host) for a copy: when
    its temp file first shows (the copy began) and when a staged file of `size`
    bytes shows (the copy ended), on this guest's clock, every 50 ms."""

    def __init__(self, cache, size):
        self.cache, self.size = cache, size
        self.began = self.ended = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.watch, daemon=True)
        self.thread.start()

    @staticmethod
    def names(cache, sub):
        try:
            return os.listdir(os.path.join(cache, "v1", sub))
        except OSError:
            return []

    def watch(self):
        while not self.stop.is_set():
            now = time.monotonic()
            if self.began is None and self.names(self.cache, "tmp"):
                self.began = now
            data = os.path.join(self.cache, "v1", "data")
            for name in self.names(self.cache, "data"):
                try:
                    if os.path.getsize(os.path.join(data, name)) == self.size:
                        self.ended = now
                except OSError:
                    pass
            if self.ended is not None:
                return
            time.sleep(0.05)


@check("slow")
def a_shard_staged_by_a_long_copy_reads_right_after_jukebox_waits():
    shard = next(n for n in SLOW["files"] if n.endswith(".safetensors"))
    path = os.path.join(SLOW["mnt"], SLOW["snapshot"], shard)
    size = os.path.getsize(os.path.join(SLOW["src"], SLOW["snapshot"], shard))
    staged = [n for n in CacheWatch.names(SLOW["cache"], "data")
              if os.path.getsize(os.path.join(SLOW["cache"], "v1", "data", n)) == size]
    assert not staged, f"staged before it was read: {staged}"
    before = kernel_log()
    watch = CacheWatch(SLOW["cache"], size)
    started = time.monotonic()
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        first = f.read(1 << 20)
        first_at = time.monotonic()
        got = len(first)
        while first:
            digest.update(first)
            first = f.read(1 << 20)
            got += len(first)
    done = time.monotonic()
    watch.stop.set()
    watch.thread.join(5)
    # the source's sha256, as the host read it (SPEC), over 9p it would take seconds
    assert got == size, f"{got} bytes read through the mount, {size} at the source"
    assert digest.hexdigest() == SLOW["sha256"], "the shard read through the mount differs from the source"
    complaints = nfs_complaints(before)
    assert not complaints, f"the kernel complained: {'; '.join(complaints)}"
    assert watch.began is not None and watch.ended is not None, (
        f"no copy of {len(want)} bytes seen in {SLOW['cache']} (began {watch.began}, ended {watch.ended})")
    copy = watch.ended - watch.began
    # The setup, not the server: a copy this short would not have made a READ wait.
    assert copy > 5, f"the copy took {copy:.1f} s: too quick to make the client wait on JUKEBOX"
    return (f"{size / 1e6:.1f} MB at {SLOW['rate']}: copy {copy:.1f} s (began {watch.began - started:.1f} s "
            f"after the open); first byte {first_at - started:.1f} s after the open, "
            f"{first_at - watch.ended:+.1f} s after the copy's end; whole file {done - started:.1f} s; no kernel complaint")


@check("slow")
def a_mount_whose_source_answers_every_call_slowly_succeeds_and_reads_right():
    mnt = SLOW["root_mnt"]
    signal_host("slow-on")
    await_host("slow-on", limit=60)
    try:
        before = kernel_log()
        opts = ("vers=3,tcp,port=2049,mountport=2049,rsize=1048576,wsize=1048576,actimeo=1,hard,"
                f"local_lock=all,mountproto=tcp,addr={SLOW['root_addr']}")
        rc, out, took = sh(["mount", "-i", "-t", "nfs", "-o", opts, f"{SLOW['root_addr']}:/", mnt], 150)
        assert rc == 0, f"mount: {rc} after {took} s: {tail(out)}"
        fields = mounted(mnt)
        assert fields and fields[2] == "nfs", f"not an NFS mount: {fields}"
        # A listing and a read side by side (each waits on several NAS calls).
        got = {}

        def timed(key, fn):
            started = time.monotonic()
            try:
                got[key] = (fn(), round(time.monotonic() - started, 1))
            except Exception as e:  # noqa: BLE001 - reported below
                got[key] = (e, round(time.monotonic() - started, 1))

        both = [threading.Thread(target=timed, args=("list", lambda: sorted(os.listdir(mnt))))]
        both.append(threading.Thread(target=timed, args=("read", lambda: read(os.path.join(mnt, SLOW["small"])))))
        for t in both:
            t.start()
        for t in both:
            t.join()
        (listed, list_took), (small, read_took) = got["list"], got["read"]
        assert listed == sorted(os.listdir(SLOW["src"])), f"lists {listed}, the source {sorted(os.listdir(SLOW['src']))}"
        assert small == read(os.path.join(SLOW["src"], SLOW["small"])), f"{SLOW['small']}: {small!r}"
        complaints = nfs_complaints(before)
        assert not complaints, f"the kernel complained: {'; '.join(complaints)}"
        # The setup, not the server: the host's own stat on the NAS was slow.
        host = json.loads(read(os.path.join(SPEC["scratch"], "fault-slow-on-stat")))
        assert host["stat_s"] >= SLOW["call_delay"] * 0.8, f"the NAS is not slow: a stat took {host['stat_s']:.1f} s"
    finally:
        signal_host("slow-off")
        await_host("slow-off", limit=60)
        rc, out, _ = sh(["umount", mnt], 30)
    assert rc == 0, f"umount: {rc}: {tail(out)}"
    return (f"every NAS call held {SLOW['call_delay']} s (a host stat {host['stat_s']:.1f} s): "
            f"mounted in {took} s; side by side, listed in {list_took} s, {SLOW['small']} read in {read_took} s")


FAULTY = {}


@check("fault")
def a_read_blocks_while_the_server_is_down():
    os.sync()
    write("/proc/sys/vm/drop_caches", b"3")
    signal_host("kill")
    await_host("kill")
    a = FAULTY["a"] = reader(FAULT["file"], "/tmp/fault-a")
    time.sleep(6)
    assert a.poll() is None, f"the read ended at once: {ended(a)}"
    rc, out, took = sh(["stat", os.path.join(HF["mnt"], FAULT["file"])], 4)
    return f"a reader, 6 s on: state {state(a)} in {stack(a)}; a stat: {rc} after {took} s"


@check("fault")
def sigint_and_sigkill_end_a_blocked_reader():
    b = reader(FAULT["file2"], "/tmp/fault-b")
    time.sleep(2)
    assert b.poll() is None, f"ended by itself: {ended(b)}"
    b.send_signal(signal.SIGINT)
    by_int = exited_within(b, 5)
    if not by_int:
        b.kill()
        assert exited_within(b, 10), f"SIGKILL did not end a blocked reader (state {state(b)} in {stack(b)})"
    return "SIGINT ends it" if by_int else "SIGINT does not end it (a hard mount); SIGKILL does"


@check("fault")
def a_blocked_read_completes_after_a_restart_on_the_same_port():
    a = FAULTY["a"]
    assert a.poll() is None, f"the first reader ended while the server was down: {ended(a)}"
    signal_host("restart")
    await_host("restart")
    started = time.monotonic()
    done = exited_within(a, 90)
    took = round(time.monotonic() - started, 1)
    assert done, f"still blocked 90 s after the restart (state {state(a)} in {stack(a)})"
    assert a.returncode == 0, f"after the restart: {ended(a)}"
    assert read("/tmp/fault-a") == read(os.path.join(HF["src"], FAULT["file"])), "wrong bytes after the restart"
    return f"completed {took} s after the restart, the right bytes"


@check("fault")
def umount_f_l_frees_the_mount_of_a_dead_server():
    signal_host("kill2")
    await_host("kill2")
    c = reader(FAULT["file3"], "/tmp/fault-c")
    time.sleep(3)
    assert c.poll() is None, f"ended by itself: {ended(c)}"
    said = [f"a reader blocked in {stack(c)}", f"holding the mount: {holders(HF['mnt']) or 'nothing open'}"]
    # `umount -f` alone (MNT_FORCE: the client's calls are aborted) ...
    rc, out, took = sh(["umount", "-f", HF["mnt"]], 20)
    said.append(f"umount -f: {rc} in {took} s ({tail(out, 100) or 'silent'})")
    said.append("then the reader " + (ended(c) if exited_within(c, 5) else f"still {state(c)} in {stack(c)}"))
    # ... and with -l (MNT_DETACH too), what a user runs for a dead server
    if mounted(HF["mnt"]):
        rc, out, took = sh(["umount", "-f", "-l", HF["mnt"]], 20)
        said.append(f"umount -f -l: {rc} in {took} s ({tail(out, 100) or 'silent'})")
        if c.returncode is None:
            said.append("then the reader " + (ended(c) if exited_within(c, 5) else f"still {state(c)} in {stack(c)}"))
    if c.returncode is None:
        c.kill()
        said.append("SIGKILL: " + ("ended it" if exited_within(c, 10) else f"still {state(c)} in {stack(c)}"))
    detail = "; ".join(said)
    assert not mounted(HF["mnt"]), f"still mounted: {detail}"
    rc, out, took = sh(["ls", HF["mnt"]], 10)
    assert rc == 0, f"ls of the mount point afterwards: {rc} {out}; {detail}"
    assert c.returncode is not None, f"the blocked reader outlived everything: {detail}"
    return detail


def summary():
    passed = sum(1 for r in RESULTS.values() if r["ok"] and not r["skipped"])
    failed = sum(1 for r in RESULTS.values() if not r["ok"])
    skipped = sum(1 for r in RESULTS.values() if r["skipped"])
    print(
        f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else "")
        + f" in {round(time.monotonic() - T0, 1)} s",
        flush=True,
    )


def main():
    print(f"guest_checks: groups {' '.join(GROUPS)}", flush=True)
    for fn in CHECKS:
        if fn.group in GROUPS:
            run(fn)
    for proc in FAULTY.values():
        if proc.poll() is None:
            proc.kill()
    summary()


if __name__ == "__main__":
    main()
