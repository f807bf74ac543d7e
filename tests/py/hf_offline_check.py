"""Resolve a model offline through huggingface_hub and compare every tensor.

Usage: HF_HUB_CACHE=<mount> HF_HUB_OFFLINE=1 python hf_offline_check.py REPO COMMIT SOURCE_HUB

Checks that snapshot_download and hf_hub_download resolve inside the mount (a staged
shard may resolve on into the stagefs cache named by STAGEFS_CACHE_DIR, when the mount
presents it as a link to its local copy), that
the small files are byte-identical to the source, and that safetensors' safe_open
(which mmaps) reads every tensor identical to the same file read from the source.
Prints one JSON line with what it checked.
"""

import json
import os
import sys

import numpy as np
from huggingface_hub import hf_hub_download, snapshot_download
from safetensors import safe_open


def resolves_inside(path: str, mount: str) -> bool:
    """Whether `path` resolves inside the mount, or on into the mount's local copies."""
    real = os.path.realpath(path)
    if real.startswith(mount + os.sep):
        return True
    cache = os.environ.get("STAGEFS_CACHE_DIR")
    return bool(cache) and real.startswith(os.path.join(os.path.realpath(cache), "v1", "data") + os.sep)


def main() -> None:
    repo, commit, source_hub = sys.argv[1], sys.argv[2], sys.argv[3]
    mount = os.path.realpath(os.environ["HF_HUB_CACHE"])
    assert os.environ.get("HF_HUB_OFFLINE") == "1", "run offline"

    snapshot = snapshot_download(repo)
    assert os.path.realpath(snapshot).startswith(mount), snapshot
    assert os.path.basename(snapshot) == commit, (snapshot, commit)
    source_snapshot = os.path.join(source_hub, os.path.relpath(snapshot, os.environ["HF_HUB_CACHE"]))

    for small in ("config.json", "model.safetensors.index.json"):
        path = hf_hub_download(repo, small)
        with open(path, "rb") as a, open(os.path.join(source_snapshot, small), "rb") as b:
            assert a.read() == b.read(), small

    index_path = hf_hub_download(repo, "model.safetensors.index.json", revision=commit)
    with open(index_path) as f:
        weight_map = json.load(f)["weight_map"]
    tensors = 0
    for shard in sorted(set(weight_map.values())):
        path = hf_hub_download(repo, shard)
        assert resolves_inside(path, mount), (path, os.path.realpath(path))
        with safe_open(path, "np") as mounted, safe_open(os.path.join(source_snapshot, shard), "np") as source:
            assert sorted(mounted.keys()) == sorted(source.keys()), shard
            for name in mounted.keys():
                a, b = mounted.get_tensor(name), source.get_tensor(name)
                assert a.dtype == b.dtype and a.shape == b.shape, name
                assert np.array_equal(a, b), name
                tensors += 1
    assert tensors == len(weight_map), (tensors, len(weight_map))
    print(json.dumps({"snapshot": snapshot, "shards": len(set(weight_map.values())), "tensors": tensors}))


if __name__ == "__main__":
    main()
