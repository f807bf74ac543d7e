"""Clients of a writable mount, as users run them. Each mode prints one JSON line.

    hub_client.py make-model DIR      write a small model (config, tokenizer, safetensors)
    hub_client.py hf-download REPO    `hf download REPO` (the CLI's own main), online
    hub_client.py snapshot REPO       snapshot_download(REPO), online
    hub_client.py load REPO           offline: every file of the snapshot by hf_hub_download,
                                      with the sha256 of its bytes and the blob its link names
    hub_client.py save DIR            save_pretrained-like: config.json and model.safetensors
                                      written into DIR, the shard first as a temp name
    hub_client.py save-in-place DIR   as transformers' save_pretrained: each file written
                                      straight over its name (O_TRUNC), no temp name
    hub_client.py load-folder DIR     load DIR's model by path
    hub_client.py mlx-load-folder DIR mlx_lm.load + generate, AutoConfig, AutoTokenizer of DIR
    hub_client.py hub-download REPO   each file of the model by hf_hub_download, online
    hub_client.py local-dir DIR       `hf download $REPO --local-dir DIR`, online
    hub_client.py make-llama DIR      write a tiny Llama (weights drawn from $MODEL_SEED) that
                                      mlx_lm and transformers load
    hub_client.py mlx-load REPO       mlx_lm.load(REPO), online: the revision it loaded and
                                      whether its weights equal $EXPECT_WEIGHTS (a plain file)
    hub_client.py from-pretrained REPO
                                      transformers' AutoConfig and AutoTokenizer
                                      .from_pretrained(REPO), online
    hub_client.py loads FOLDER        mlx_lm.load and generate, AutoConfig and
                                      AutoTokenizer, of $REPO and of the model folder
                                      FOLDER by path; weights against $EXPECT_WEIGHTS

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
    """The model's weights: 3 MiB, or $MODEL_MIB (bench/download-load.sh, fault_client.py);
    $TENSORS_OFFSET (default 0) is added to them, to tell one save from another."""
    mib = int(os.environ.get("MODEL_MIB", "3"))
    offset = float(os.environ.get("TENSORS_OFFSET", "0"))
    return {
        "embed": np.arange(mib * 2**18, dtype=np.float32).reshape(-1, 1024) + offset,
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


def save_in_place(d):
    """As transformers' save_pretrained does: the config and the shard each written
    straight over the file of that name (open with O_TRUNC), no temp name."""
    from safetensors.numpy import save_file

    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model_type": "tiny", "hidden_size": 1024}, f, indent=2)
    save_file(tensors(), os.path.join(d, "model.safetensors"))
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


def local_dir(d):
    from huggingface_hub.cli.hf import main

    sys.argv = ["hf", "download", os.environ["REPO"], "--local-dir", d]
    try:
        main()
    except SystemExit as e:
        if e.code:
            raise
    return {name: sha256(os.path.join(d, name)) for name in sorted(os.listdir(d)) if name != ".cache"}


def hub_download(repo):
    from huggingface_hub import hf_hub_download

    names = ["config.json", "tokenizer.json", "model.safetensors"]
    return {name: sha256(hf_hub_download(repo, name)) for name in names}


def make_llama(d):
    """A Llama small enough to load on a CPU in a second, its weights (4.6 MiB) above
    the mount's default staging threshold; a word-level tokenizer transformers loads."""
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    seed = int(os.environ["MODEL_SEED"])
    os.makedirs(d, exist_ok=True)
    vocab = {f"w{i}": i for i in range(64)} | {"<unk>": 64, "<s>": 65, "</s>": 66}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(os.path.join(d, "tokenizer.json"))
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast"} | special, f)
    hidden, inner, layers, words = 256, 512, 2, len(vocab)
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "intermediate_size": inner,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": words,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 128,
        "tie_word_embeddings": False,
        "seed": seed,
    }
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    rng = np.random.default_rng(seed)

    def weight(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    t = {
        "model.embed_tokens.weight": weight(words, hidden),
        "model.norm.weight": np.ones(hidden, np.float32),
        "lm_head.weight": weight(words, hidden),
    }
    shapes = {
        "self_attn.q_proj": (hidden, hidden),
        "self_attn.k_proj": (hidden, hidden),
        "self_attn.v_proj": (hidden, hidden),
        "self_attn.o_proj": (hidden, hidden),
        "mlp.gate_proj": (inner, hidden),
        "mlp.up_proj": (inner, hidden),
        "mlp.down_proj": (hidden, inner),
    }
    for layer in range(layers):
        prefix = f"model.layers.{layer}."
        for name, shape in shapes.items():
            t[f"{prefix}{name}.weight"] = weight(*shape)
        for norm in ["input_layernorm", "post_attention_layernorm"]:
            t[f"{prefix}{norm}.weight"] = np.ones(hidden, np.float32)
    save_file(t, os.path.join(d, "model.safetensors"), metadata={"format": "mlx"})
    return {"files": sorted(os.listdir(d))}


def mlx_load(repo):
    """mlx_lm.load as a user calls it: online, it asks the Hub for the newest revision
    and downloads what the cache lacks (snapshot_download), then loads the weights."""
    import mlx.core as mx
    import mlx_lm
    from huggingface_hub import snapshot_download
    from mlx.utils import tree_flatten
    from safetensors.numpy import load_file

    model, tokenizer = mlx_lm.load(repo)
    loaded = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    expected = load_file(os.environ["EXPECT_WEIGHTS"])
    mx.eval(model.parameters())
    path = snapshot_download(repo, local_files_only=True)
    return {
        "revision": os.path.basename(path),
        "weights_match": loaded.keys() == expected.keys()
        and all(np.array_equal(loaded[k], v) for k, v in expected.items()),
        "tokens": tokenizer.encode("w1 w2"),
    }


def loads(folder):
    """What a user's loaders do with a model they loaded before, by repository id
    ($REPO, through HF_HOME or HF_HUB_CACHE) and by the path of a plain model folder:
    mlx_lm.load and a few generated tokens, and transformers' AutoConfig and
    AutoTokenizer. Weights are compared with $EXPECT_WEIGHTS."""
    import mlx.core as mx
    import mlx_lm
    from mlx.utils import tree_flatten
    from safetensors.numpy import load_file
    from transformers import AutoConfig, AutoTokenizer

    expected = load_file(os.environ["EXPECT_WEIGHTS"])
    result = {}
    for name, model_id in (("repo", os.environ["REPO"]), ("folder", folder)):
        model, tokenizer = mlx_lm.load(model_id)
        mx.eval(model.parameters())
        loaded = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
        text = mlx_lm.generate(model, tokenizer, prompt="w1 w2", max_tokens=4)
        config = AutoConfig.from_pretrained(model_id)
        fast = AutoTokenizer.from_pretrained(model_id)
        result[name] = {
            "weights_match": loaded.keys() == expected.keys()
            and all(np.array_equal(loaded[k], v) for k, v in expected.items()),
            "generated": text,
            "seed": config.to_dict().get("seed"),
            "tokens": fast("w1 w2")["input_ids"],
        }
    return result


def mlx_load_folder(folder):
    """mlx_lm.load and a few generated tokens, AutoConfig and AutoTokenizer of the
    plain model folder at FOLDER; weights compared with $EXPECT_WEIGHTS."""
    import mlx.core as mx
    import mlx_lm
    from mlx.utils import tree_flatten
    from safetensors.numpy import load_file
    from transformers import AutoConfig, AutoTokenizer

    expected = load_file(os.environ["EXPECT_WEIGHTS"])
    model, tokenizer = mlx_lm.load(folder)
    mx.eval(model.parameters())
    loaded = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    return {
        "weights_match": loaded.keys() == expected.keys()
        and all(np.array_equal(loaded[k], v) for k, v in expected.items()),
        "generated": mlx_lm.generate(model, tokenizer, prompt="w1 w2", max_tokens=4),
        "seed": AutoConfig.from_pretrained(folder).to_dict().get("seed"),
        "tokens": AutoTokenizer.from_pretrained(folder)("w1 w2")["input_ids"],
    }


def from_pretrained(repo):
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(repo)
    tokenizer = AutoTokenizer.from_pretrained(repo)
    return {"seed": config.to_dict().get("seed"), "tokens": tokenizer("w1 w2")["input_ids"]}


MODES = {
    "make-model": make_model,
    "hf-download": hf_download,
    "snapshot": snapshot,
    "load": load,
    "save": save,
    "save-in-place": save_in_place,
    "load-folder": load_folder,
    "hub-download": hub_download,
    "local-dir": local_dir,
    "make-llama": make_llama,
    "mlx-load": mlx_load,
    "from-pretrained": from_pretrained,
    "loads": loads,
    "mlx-load-folder": mlx_load_folder,
}

def main(modes):
    """Runs mode argv[1] on argv[2]; its JSON line, or an OSError's as one, exit 3."""
    try:
        result = modes[sys.argv[1]](sys.argv[2])
    except OSError as e:
        result = {"error": os.strerror(e.errno) if e.errno else str(e), "errno": e.errno}
        print(json.dumps(result))
        sys.exit(3)
    print(json.dumps(result))


if __name__ == "__main__":
    main(MODES)
