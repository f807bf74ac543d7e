"""A random-weight Llama for bench/gpu-load.sh: made once, loaded many times.

  gpu_model.py make --hub DIR --gb 6 [--shard-size 5GB]
      writes models--bench--gpu into the hub cache DIR as huggingface_hub lays one
      out (blobs named by their sha256, or git's sha1 for small files; snapshot links;
      refs/main) and prints the snapshot's path.
  gpu_model.py load MODEL [--device cuda]
      loads MODEL (a repo id, resolved offline in HF_HUB_CACHE, or a folder) with
      transformers onto the device and prints one JSON line: the seconds from the call
      to the weights being on the device, and a checksum of every weight, so loads
      through different paths can be compared byte for byte.
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time

REPO = "bench/gpu"


def llama_config(gb):
    from transformers import LlamaConfig

    # Llama 3.2 3B's shape, with as many layers as make `gb` GiB of bf16 weights.
    vocab = 128256 if gb >= 2 else 32000
    hidden, inter = 3072, 8192
    kv = 8 * (hidden // 24)  # key/value heads times the head size
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter
    embeddings = vocab * hidden
    layers = max(1, round((gb * 2**30 / 2 - embeddings) / per_layer))
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=24,
        num_key_value_heads=8,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )


def blob_name(path):
    """The name huggingface_hub gives a file's blob: sha256 for LFS files, git's
    blob sha1 for small ones."""
    size = os.path.getsize(path)
    if path.endswith(".safetensors"):
        digest = hashlib.sha256()
    else:
        digest = hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def make(args):
    import torch
    from transformers import LlamaForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(device):
        model = LlamaForCausalLM(llama_config(args.gb))
    repo = os.path.join(args.hub, "models--" + REPO.replace("/", "--"))
    revision = hashlib.sha1(b"stagefs gpu-load %f" % args.gb).hexdigest()
    snapshot = os.path.join(repo, "snapshots", revision)
    os.makedirs(os.path.join(repo, "blobs"), exist_ok=True)
    os.makedirs(snapshot, exist_ok=True)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.hub) as saved:
        model.save_pretrained(saved, max_shard_size=args.shard_size)
        for name in sorted(os.listdir(saved)):
            blob = blob_name(os.path.join(saved, name))
            shutil.move(os.path.join(saved, name), os.path.join(repo, "blobs", blob))
            os.symlink(os.path.join("..", "..", "blobs", blob), os.path.join(snapshot, name))
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(revision)
    print(snapshot)


def load(args):
    import torch
    from transformers import AutoModelForCausalLM

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.zeros(1, device=device)  # the CUDA context, which no load should pay for
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, device_map=device)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    with torch.no_grad():
        total = torch.zeros((), dtype=torch.float64, device=device)
        for i, p in enumerate(model.parameters()):
            # Weighted by position, so two swapped tensors do not cancel out.
            total += p.detach().double().sum() * (i + 1)
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"load_s": seconds, "params": params, "checksum": f"{total.item():.10e}"}))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make")
    m.add_argument("--hub", required=True)
    m.add_argument("--gb", type=float, default=6.0)
    m.add_argument("--shard-size", default="5GB")
    ld = sub.add_parser("load")
    ld.add_argument("model")
    ld.add_argument("--device", default="auto")
    args = parser.parse_args()
    {"make": make, "load": load}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
