"""What an ordinary user's programs do with a model through an NFS mount whose blobs
are links to their local copies (`stagefs serve --links`), for the links group of
tests/py/guest_checks.py. Each mode prints one JSON line.

    links_client.py make DIR SEED             a model of SHARDS safetensors shards
    links_client.py download REPO             snapshot_download (HF_HOME, HF_ENDPOINT)
    links_client.py mlx SNAP [fadvise]        mx.load of every shard, then 8 threads
                                              of 32 MiB preads of all of them, as
                                              mlx_lm.load does; sha256 of each shard
                                              (fadvise: drop each file's cached pages
                                              first, so an NFS file is read from its
                                              server)
    links_client.py mmap SNAP                 safe_open (mmap) of every shard, every
                                              tensor; a digest of each shard's tensors
    links_client.py bench ROUNDS NAME=DIR...  `mlx` of each DIR (fadvise for a NAME
                                              starting with "server"), in turn, ROUNDS
                                              times: each one's read seconds
    links_client.py loop PATH SECONDS SHA256  opens and reads PATH whole, again and
                                              again; every error and wrong digest
    links_client.py delete HUB REPO           scan_cache_dir + delete every revision
                                              of REPO, as `hf cache delete` does
"""

import errno
import hashlib
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hub_client import sha256  # noqa: E402

SHARDS = 4
SHARD_BYTES = 4 << 20
CHUNK = 32 << 20
THREADS = 8


def make(d, seed):
    import numpy as np
    from safetensors.numpy import save_file

    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(int(seed))
    names = [f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors" for i in range(SHARDS)]
    weight_map = {}
    for i, name in enumerate(names):
        tensors = {f"layers.{i}.{k}": rng.standard_normal(SHARD_BYTES // 8, dtype=np.float32) for k in ("a", "b")}
        save_file(tensors, os.path.join(d, name), metadata={"format": "mlx"})
        weight_map.update({t: name for t in tensors})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model_type": "linked", "seed": int(seed)}, f)
    return {"shards": names, "sha256": {n: sha256(os.path.join(d, n)) for n in names}}


def download(repo):
    from huggingface_hub import snapshot_download

    path = snapshot_download(repo)
    return {"snapshot": path, "commit": os.path.basename(path)}


def shards_of(snap):
    return sorted(n for n in os.listdir(snap) if n.endswith(".safetensors"))


def mlx(snap, fadvise=None):
    import mlx.core as mx

    names = shards_of(snap)
    paths = [os.path.join(snap, n) for n in names]
    if fadvise:
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    started = time.monotonic()
    for path in paths:
        mx.load(path)
    loaded = time.monotonic()
    sizes = [os.stat(p).st_size for p in paths]
    buffers = [bytearray(s) for s in sizes]
    jobs = [(i, off) for i, s in enumerate(sizes) for off in range(0, s, CHUNK)]
    lock = threading.Lock()
    errors = []

    def worker():
        fds = {}
        while True:
            with lock:
                if not jobs:
                    break
                i, off = jobs.pop(0)
            try:
                fd = fds.get(i) or fds.setdefault(i, os.open(paths[i], os.O_RDONLY))
                data = os.pread(fd, min(CHUNK, sizes[i] - off), off)
                buffers[i][off : off + len(data)] = data
            except OSError as e:
                errors.append(f"{names[i]}: {errno.errorcode.get(e.errno, e.errno)}")
        for fd in fds.values():
            os.close(fd)

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    read = time.monotonic()
    return {
        "load_seconds": round(loaded - started, 3),
        "read_seconds": round(read - loaded, 3),
        "bytes": sum(sizes),
        "errors": errors,
        "sha256": {n: hashlib.sha256(b).hexdigest() for n, b in zip(names, buffers)},
    }


def bench(rounds, *ways):
    """The same reads (`mlx`) of each way in turn, `rounds` times, in one process:
    the ways share its warm-up, and each round sees the others' effect alike."""
    named = [way.split("=", 1) for way in ways]
    times = {name: [] for name, _ in named}
    digests = {}
    for _ in range(int(rounds)):
        for name, snap in named:
            got = mlx(snap, "fadvise" if name.startswith("server") else None)
            if got["errors"]:
                raise AssertionError(f"{name}: {got['errors']}")
            digests.setdefault(name, got["sha256"])
            if got["sha256"] != digests[name]:
                raise AssertionError(f"{name}: the bytes changed between rounds")
            times[name].append(got["read_seconds"])
    return {"times": times, "sha256": digests, "bytes": got["bytes"]}


def mmap_load(snap):
    from safetensors import safe_open

    digests = {}
    started = time.monotonic()
    for name in shards_of(snap):
        h = hashlib.sha256()
        with safe_open(os.path.join(snap, name), framework="numpy") as f:
            for key in sorted(f.keys()):
                h.update(key.encode())
                h.update(f.get_tensor(key).tobytes())
        digests[name] = h.hexdigest()
    return {"seconds": round(time.monotonic() - started, 3), "tensors": digests}


def loop(path, seconds, want):
    deadline = time.monotonic() + float(seconds)
    opens, errors, wrong = 0, [], 0
    while time.monotonic() < deadline:
        try:
            with open(path, "rb") as f:
                got = hashlib.sha256(f.read()).hexdigest()
            opens += 1
            if got != want:
                wrong += 1
        except OSError as e:
            errors.append(errno.errorcode.get(e.errno, str(e.errno)))
            time.sleep(0.05)
    return {"opens": opens, "errors": errors, "wrong": wrong}


def delete(hub, repo):
    from huggingface_hub import scan_cache_dir

    info = scan_cache_dir(hub)
    (found,) = [r for r in info.repos if r.repo_id == repo]
    blobs = sorted({str(f.blob_path) for rev in found.revisions for f in rev.files})
    strategy = info.delete_revisions(*[rev.commit_hash for rev in found.revisions])
    strategy.execute()
    return {"blob_paths": blobs, "freed": strategy.expected_freed_size}


MODES = {
    "make": make,
    "download": download,
    "mlx": mlx,
    "mmap": mmap_load,
    "bench": bench,
    "loop": loop,
    "delete": delete,
}

if __name__ == "__main__":
    try:
        result = MODES[sys.argv[1]](*sys.argv[2:])
    except OSError as e:
        result = {"oserror": errno.errorcode.get(e.errno, str(e.errno)), "detail": str(e)}
        print(json.dumps(result), flush=True)
        sys.exit(3)
    print(json.dumps(result), flush=True)
