"""Clients of a writable mount, as users run them. Each mode prints one JSON line.

    hub_client.py make-model DIR      write a small model (config, tokenizer, safetensors)
    hub_client.py hf-download REPO    `hf download REPO` (the CLI's own main), online
    hub_client.py snapshot REPO       snapshot_download(REPO), online
    hub_client.py load REPO           offline: every file of the snapshot by hf_hub_download,
                                      with the sha256 of its bytes and the blob its link names
    hub_client.py save DIR            save_pretrained-like: config.json and model.safetensors
                                      written into DIR, the shard first as a temp name
    hub_client.py load-folder DIR     load DIR's model by path

The hub modes read HF_ENDPOINT and HF_HUB_CACHE (or HF_HOME) from the environment.
"""

import hashlib
import json
import os
import sys

import numpy as np


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tensors():
    return {
        "embed": np.arange(3 * 2**18, dtype=np.float32).reshape(-1, 1024),
        "head": np.linspace(0, 1, 4096, dtype=np.float32),
    }


def make_model(d):
    from safetensors.numpy import save_file

    os.makedirs(d, exist_ok=True)
    save_file(tensors(), os.path.join(d, "model.safetensors"))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model_type": "tiny", "hidden_size": 1024}, f)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump({"version": "1.0", "vocab": {"a": 0}}, f)
    return {"files": sorted(os.listdir(d))}


def hf_download(repo):
    from huggingface_hub.cli.hf import main

    sys.argv = ["hf", "download", repo]
    try:
        main()
    except SystemExit as e:
        if e.code:
            raise
    return {"ok": True}


def snapshot(repo):
    from huggingface_hub import snapshot_download

    return {"path": snapshot_download(repo)}


def load(repo):
    from huggingface_hub import hf_hub_download, scan_cache_dir
    from safetensors.numpy import load_file

    files = {}
    for name in ["config.json", "tokenizer.json", "model.safetensors"]:
        path = hf_hub_download(repo, name, local_files_only=True)
        files[name] = {"sha256": sha256(path), "blob": os.path.basename(os.readlink(path))}
    weights = load_file(hf_hub_download(repo, "model.safetensors", local_files_only=True))
    expected = tensors()
    return {
        "files": files,
        "tensors_match": all(np.array_equal(weights[k], v) for k, v in expected.items()),
        "repos": [r.repo_id for r in scan_cache_dir().repos],
    }


def save(d):
    """As transformers' save_pretrained and safetensors do: makedirs, the config,
    then the weights (written to a temp name and renamed, as careful writers do)."""
    from safetensors.numpy import save_file

    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model_type": "tiny", "hidden_size": 1024}, f, indent=2)
    tmp = os.path.join(d, "model.safetensors.tmp")
    save_file(tensors(), tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(d, "model.safetensors"))
    return {name: sha256(os.path.join(d, name)) for name in sorted(os.listdir(d))}


def load_folder(d):
    from safetensors.numpy import load_file

    weights = load_file(os.path.join(d, "model.safetensors"))
    config = json.load(open(os.path.join(d, "config.json")))
    expected = tensors()
    return {
        "config": config,
        "sha256": sha256(os.path.join(d, "model.safetensors")),
        "tensors_match": all(np.array_equal(weights[k], v) for k, v in expected.items()),
    }


MODES = {
    "make-model": make_model,
    "hf-download": hf_download,
    "snapshot": snapshot,
    "load": load,
    "save": save,
    "load-folder": load_folder,
}

if __name__ == "__main__":
    try:
        result = MODES[sys.argv[1]](sys.argv[2])
    except OSError as e:
        result = {"error": os.strerror(e.errno) if e.errno else str(e), "errno": e.errno}
        print(json.dumps(result))
        sys.exit(3)
    print(json.dumps(result))
