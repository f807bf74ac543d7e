"""Read a model through a stagefs mount as a user's program does, and compare every byte
with the source.

Usage: HF_HOME=<mount> HF_HUB_OFFLINE=1 python mount_read_check.py REPO SOURCE_HOME

SOURCE_HOME is the HF_HOME that is mounted, read directly (not through the mount).
- huggingface_hub, offline, resolves REPO's snapshot (refs/main) in <mount>/hub, and
  each of its files with hf_hub_download; the snapshot lists the source's files;
- each file read through the mount has the source file's sha256, and an LFS blob's
  sha256 is its name;
- each *.safetensors opens with safetensors (numpy), tensor for tensor equal to the
  source's, and each weight file mapped with mmap hashes like the source.
Prints one JSON line with what it checked. Used by scripts/mount-e2e.sh.
"""

import hashlib
import json
import mmap
import os
import sys
import time

import numpy as np
from huggingface_hub import hf_hub_download, snapshot_download
from safetensors import safe_open

WEIGHTS = (".safetensors", ".gguf", ".bin", ".npz", ".pt", ".pth")


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(8 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_mapped(path: str) -> str:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        return hashlib.sha256(mapped).hexdigest()


def same_tensors(mounted: str, source: str) -> int:
    with safe_open(mounted, framework="np") as a, safe_open(source, framework="np") as b:
        keys = sorted(a.keys())
        assert keys == sorted(b.keys()), (mounted, keys)
        for key in keys:
            assert np.array_equal(a.get_tensor(key), b.get_tensor(key)), (mounted, key)
    return len(keys)


def main() -> None:
    repo, source_home = sys.argv[1], os.path.abspath(sys.argv[2])
    home = os.path.abspath(os.environ["HF_HOME"])
    assert os.environ.get("HF_HUB_OFFLINE") == "1", "run offline: HF_HUB_OFFLINE=1"
    hub = os.path.join(home, "hub")
    started = time.monotonic()

    snapshot = snapshot_download(repo)
    assert snapshot.startswith(hub + os.sep), f"{snapshot} is not in the mount's hub {hub}"
    source_snapshot = os.path.join(source_home, os.path.relpath(snapshot, home))
    names = sorted(os.listdir(snapshot))
    assert names == sorted(os.listdir(source_snapshot)), (names, source_snapshot)
    assert any(n.endswith(".safetensors") for n in names), f"no safetensors in {snapshot}"

    checked = {"files": 0, "bytes": 0, "blobs_named_by_sha256": 0, "safetensors": 0,
               "tensors": 0, "mapped": 0}
    for name in names:
        path = hf_hub_download(repo, name)
        assert path == os.path.join(snapshot, name), (path, snapshot)
        source = os.path.join(source_snapshot, name)
        want = sha256_of(source)
        got = sha256_of(path)
        assert got == want, f"{path}: sha256 {got} through the mount, {want} at the source"
        checked["files"] += 1
        checked["bytes"] += os.path.getsize(source)
        blob = os.path.basename(os.readlink(path)) if os.path.islink(path) else ""
        if len(blob) == 64:
            assert blob == want, f"{path}: blob {blob} holds {want}"
            checked["blobs_named_by_sha256"] += 1
        if name.endswith(".safetensors"):
            checked["tensors"] += same_tensors(path, source)
            checked["safetensors"] += 1
        if name.endswith(WEIGHTS) and os.path.getsize(source) > 0:
            mapped = sha256_mapped(path)
            assert mapped == want, f"{path}: sha256 {mapped} through mmap, {want} at the source"
            checked["mapped"] += 1
    assert checked["mapped"] >= checked["safetensors"] > 0, checked
    checked["snapshot"] = snapshot
    checked["seconds"] = round(time.monotonic() - started, 2)
    print(json.dumps(checked))


if __name__ == "__main__":
    main()
