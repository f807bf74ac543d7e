"""Checks run inside the Linux test guest against an NFS mount made by the guest's
kernel client (tests/tests/kernel_client.rs boots it; tests/vm/ builds and runs it).
Every check reads through the mount and compares with the same client reading the
source directly (the source lies in the writable share, at the same path in the
guest and on the host).

    python kernel_checks.py MOUNT SOURCE RESULTS.json REPO [--hub URL --hub-repo ID]

MOUNT is the export's root mounted; SOURCE the directory served. The source holds an
HF_HOME (`hub/`, with REPO in it) and a plain model folder (`folders/tiny`). Prints
`PASS name` or `FAIL name: why` per check, writes every result to RESULTS.json and
ends with `N passed, M failed`; exits 1 if any failed.
"""

import argparse
import errno
import hashlib
import json
import mmap
import os
import random
import subprocess
import sys
import threading
import time
import traceback

results = []


def check(name):
    def wrap(fn):
        started = time.monotonic()
        try:
            fn()
            results.append({"name": name, "ok": True, "seconds": time.monotonic() - started})
            print(f"PASS {name}", flush=True)
        except Exception as e:  # noqa: BLE001 - every failure is reported, not raised
            why = f"{type(e).__name__}: {e}".replace("\n", " ")
            results.append({"name": name, "ok": False, "why": why})
            print(f"FAIL {name}: {why}", flush=True)
            traceback.print_exc(file=sys.stderr)
        return fn

    return wrap


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mount")
    ap.add_argument("source")
    ap.add_argument("results")
    ap.add_argument("repo")
    ap.add_argument("--hub")
    ap.add_argument("--hub-repo")
    a = ap.parse_args()
    mnt, src = a.mount, a.source
    org, name = a.repo.split("/")
    repo_dir = f"hub/models--{org}--{name}"

    @check("hub: every shard's sha256 through the snapshot links matches its blob's name")
    def _():
        with open(os.path.join(mnt, repo_dir, "refs/main")) as f:
            commit = f.read().strip()
        snap = os.path.join(mnt, repo_dir, "snapshots", commit)
        shards = [n for n in os.listdir(snap) if n.endswith(".safetensors")]
        expect(shards, "no shards listed")
        for n in shards:
            link = os.readlink(os.path.join(snap, n))
            expect(link.startswith("../../blobs/"), f"{n} links to {link}")
            expect(sha256(os.path.join(snap, n)) == os.path.basename(link), f"{n}: wrong bytes")

    @check("hub: huggingface_hub offline resolves the model through the mount")
    def _():
        env = dict(os.environ, HF_HOME=mnt, HF_HUB_OFFLINE="1")
        code = (
            "import sys, huggingface_hub as h\n"
            f"p = h.snapshot_download({a.repo!r})\n"
            "print(p)\n"
        )
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        expect(out.returncode == 0, out.stderr.strip().splitlines()[-1:] or out.returncode)
        expect(out.stdout.strip().startswith(os.path.join(mnt, "hub")), out.stdout)

    @check("hub: safetensors (mmap) loads every tensor equal to the source's")
    def _():
        from safetensors.numpy import load_file

        with open(os.path.join(src, repo_dir, "refs/main")) as f:
            commit = f.read().strip()
        rel = os.path.join(repo_dir, "snapshots", commit)
        for n in sorted(os.listdir(os.path.join(src, rel))):
            if not n.endswith(".safetensors"):
                continue
            mine, theirs = load_file(os.path.join(mnt, rel, n)), load_file(os.path.join(src, rel, n))
            expect(mine.keys() == theirs.keys(), f"{n}: tensor names differ")
            for k in mine:
                expect((mine[k] == theirs[k]).all(), f"{n}: tensor {k} differs")

    @check("hub: 2000 random mmap reads of a shard equal the source's")
    def _():
        blobs = os.path.join(repo_dir, "blobs")
        big = max(os.listdir(os.path.join(src, blobs)), key=lambda b: os.path.getsize(os.path.join(src, blobs, b)))
        with open(os.path.join(mnt, blobs, big), "rb") as f, open(os.path.join(src, blobs, big), "rb") as g:
            m, n = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ), mmap.mmap(g.fileno(), 0, prot=mmap.PROT_READ)
            expect(len(m) == len(n), "sizes differ")
            rng = random.Random(7)
            for _ in range(2000):
                at = rng.randrange(len(m))
                span = rng.randrange(1, 65536)
                expect(m[at : at + span] == n[at : at + span], f"bytes at {at} differ")

    @check("folder: a plain model folder reads the same as the source")
    def _():
        folder = "folders/tiny"
        names = sorted(os.listdir(os.path.join(src, folder)))
        expect(sorted(os.listdir(os.path.join(mnt, folder))) == names, "listings differ")
        for n in names:
            expect(sha256(os.path.join(mnt, folder, n)) == sha256(os.path.join(src, folder, n)), f"{n} differs")

    work = os.path.join(mnt, "written")
    os.makedirs(work, exist_ok=True)

    def both(rel):
        return os.path.join(work, rel), os.path.join(src, "written", rel)

    @check("write: a created file reads back and lands on the source")
    def _():
        m, s = both("new.txt")
        with open(m, "wb") as f:
            f.write(b"hello from the guest\n")
        with open(m, "rb") as f:
            expect(f.read() == b"hello from the guest\n", "read back differs")
        with open(s, "rb") as f:
            expect(f.read() == b"hello from the guest\n", "the source differs")

    @check("write: a same-size rewrite is read back new, through the mount and on the source")
    def _():
        m, s = both("same.bin")
        with open(m, "wb") as f:
            f.write(b"a" * 5_000_000)
        with open(m, "rb") as f:
            expect(f.read(10) == b"a" * 10, "first version")
        with open(m, "r+b") as f:
            f.write(b"b" * 5_000_000)
        with open(m, "rb") as f:
            expect(f.read() == b"b" * 5_000_000, "stale bytes through the mount")
        expect(sha256(s) == hashlib.sha256(b"b" * 5_000_000).hexdigest(), "the source differs")

    @check("write: a rename over a file serves the new one")
    def _():
        m_old, _ = both("target.txt")
        m_new, s_old = both("incoming.txt")[0], both("target.txt")[1]
        with open(m_old, "w") as f:
            f.write("old")
        with open(m_old) as f:
            expect(f.read() == "old", "old")
        with open(m_new, "w") as f:
            f.write("newer")
        os.rename(m_new, m_old)
        with open(m_old) as f:
            expect(f.read() == "newer", "the renamed-over name serves the old file")
        with open(s_old) as f:
            expect(f.read() == "newer", "the source differs")

    @check("write: unlink removes the file from the mount and the source")
    def _():
        m, s = both("gone.txt")
        with open(m, "w") as f:
            f.write("x")
        os.unlink(m)
        expect(not os.path.exists(m), "still through the mount")
        expect(not os.path.exists(s), "still on the source")

    @check("write: O_EXCL creates once, then EEXIST")
    def _():
        m, _ = both("excl.lock")
        fd = os.open(m, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.close(fd)
        try:
            os.open(m, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            raise AssertionError("a second O_EXCL create succeeded")
        except FileExistsError:
            pass

    @check("write: mkdir and rmdir pass through")
    def _():
        m, s = both("sub")
        os.mkdir(m)
        expect(os.path.isdir(s), "not on the source")
        os.rmdir(m)
        expect(not os.path.exists(s), "still on the source")

    @check("dir: 3000 entries made through the mount are all listed")
    def _():
        m, s = both("many")
        os.mkdir(m)
        for i in range(3000):
            with open(os.path.join(m, f"f{i:05}"), "w") as f:
                f.write(str(i))
        listed = sorted(os.listdir(m))
        expect(listed == [f"f{i:05}" for i in range(3000)], f"{len(listed)} listed")
        expect(len(os.listdir(s)) == 3000, "the source differs")

    @check("dir: listing while files are added never errs and ends complete")
    def _():
        m, _ = both("growing")
        os.mkdir(m)
        errors = []

        def lister():
            while not done.is_set():
                try:
                    os.listdir(m)
                except OSError as e:
                    errors.append(e)

        done = threading.Event()
        t = threading.Thread(target=lister)
        t.start()
        for i in range(300):
            with open(os.path.join(m, f"g{i}"), "w"):
                pass
        done.set()
        t.join()
        expect(not errors, f"listing failed: {errors[:1]}")
        expect(len(os.listdir(m)) == 300, "not all listed")

    @check("df: statvfs through the mount gives the source's filesystem size")
    def _():
        mine, theirs = os.statvfs(mnt), os.statvfs(src)
        total = lambda st: st.f_blocks * st.f_frsize  # noqa: E731
        # The client counts in its own block unit (the mount's f_frsize): the sizes
        # agree to within one of those, where the server's old constant was 1 TiB.
        off = abs(total(mine) - total(theirs))
        expect(off < mine.f_frsize, f"{total(mine)} against the source's {total(theirs)}")

    @check("link: a hard link fails with EXDEV, a fifo with EPERM, nothing made")
    def _():
        m, s = both("new.txt")
        try:
            os.link(m, m + ".hard")
            raise AssertionError("link succeeded")
        except OSError as e:
            expect(e.errno == errno.EXDEV, f"link: {e}")
        try:
            os.mkfifo(os.path.join(work, "fifo"))
            raise AssertionError("mkfifo succeeded")
        except OSError as e:
            expect(e.errno == errno.EPERM, f"mkfifo: {e}")
        expect(not os.path.exists(s + ".hard"), "a link on the source")

    if a.hub:

        @check("hub: `hf download` from a local Hub into the mounted HF_HOME, then read back right")
        def _():
            env = dict(os.environ, HF_HOME=mnt, HF_ENDPOINT=a.hub, HF_HUB_DISABLE_TELEMETRY="1")
            env.pop("HF_HUB_OFFLINE", None)
            hf = os.path.join(os.path.dirname(sys.executable), "hf")
            out = subprocess.run([hf, "download", a.hub_repo], env=env, capture_output=True, text=True, timeout=300)
            expect(out.returncode == 0, (out.stderr.strip().splitlines() or ["?"])[-1])
            snap = out.stdout.strip().splitlines()[-1]
            expect(snap.startswith(mnt), snap)
            for n in os.listdir(snap):
                p = os.path.join(snap, n)
                link = os.readlink(p)
                blob = os.path.basename(link)
                if len(blob) == 64:
                    expect(sha256(p) == blob, f"{n}: wrong bytes")
            org2, name2 = a.hub_repo.split("/")
            expect(os.path.isdir(os.path.join(src, "hub", f"models--{org2}--{name2}", "blobs")), "not on the source")

    with open(a.results, "w") as f:
        json.dump(results, f, indent=1)
    failed = sum(not r["ok"] for r in results)
    print(f"{len(results) - failed} passed, {failed} failed", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
