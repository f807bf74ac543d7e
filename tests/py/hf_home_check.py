"""Resolve a model offline with HF_HOME pointing at a mount of a whole HF_HOME.

Usage: HF_HOME=<mount> HF_HUB_OFFLINE=1 python hf_home_check.py REPO COMMIT SHARD SOURCE_HOME

With HF_HOME alone (HF_HUB_CACHE unset, or set to HF_HOME/hub as `stagefs run` sets
it), huggingface_hub must find the hub cache in the mount's hub/: snapshot_download
resolves the snapshot at refs/main, hf_hub_download resolves SHARD byte-identical to
the source, and the token stored in the HF_HOME is the one it uses.
Prints one JSON line with what it checked.
"""

import json
import os
import sys

from huggingface_hub import get_token, hf_hub_download, snapshot_download


def main() -> None:
    repo, commit, shard, source_home = sys.argv[1:5]
    home = os.environ["HF_HOME"]
    assert os.environ.get("HF_HUB_OFFLINE") == "1", "run offline"
    hub = os.path.join(home, "hub")
    assert os.environ.get("HF_HUB_CACHE", hub) == hub, os.environ.get("HF_HUB_CACHE")

    snapshot = snapshot_download(repo)
    assert snapshot.startswith(hub + os.sep), snapshot
    assert os.path.basename(snapshot) == commit, (snapshot, commit)

    path = hf_hub_download(repo, shard)
    assert path.startswith(hub + os.sep), path
    with open(path, "rb") as mounted, open(os.path.join(source_home, os.path.relpath(path, home)), "rb") as source:
        assert mounted.read() == source.read(), shard

    with open(os.path.join(source_home, "token")) as f:
        assert get_token() == f.read().strip(), "the token in the mounted HF_HOME"
    print(json.dumps({"snapshot": snapshot, "file": path, "token": True}))


if __name__ == "__main__":
    main()
