"""Load a model folder by path the three ways MLX users do, and compare with a copy.

Usage: python path_loads.py MOUNTED_FOLDER SOURCE_FOLDER

The folder holds a tiny Llama (hub_client.py make-llama): model.safetensors with its
config and tokenizer. It is read with safetensors' safe_open (which mmaps), with
mx.load, and with mlx_lm.load(MOUNTED_FOLDER); each must give exactly the tensors of
SOURCE_FOLDER's model.safetensors. Prints one JSON line with what it checked.
"""

import json
import os
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file


def main() -> None:
    mounted, source = sys.argv[1], sys.argv[2]
    expected = load_file(os.path.join(source, "model.safetensors"))
    shard = os.path.join(mounted, "model.safetensors")

    with safe_open(shard, "np") as f:
        assert sorted(f.keys()) == sorted(expected), "safe_open keys"
        for name in f.keys():
            assert np.array_equal(f.get_tensor(name), expected[name]), name

    import mlx.core as mx

    loaded = mx.load(shard)
    assert sorted(loaded) == sorted(expected), "mx.load keys"
    for name, value in loaded.items():
        assert np.array_equal(np.array(value), expected[name]), name

    import mlx_lm
    from mlx.utils import tree_flatten

    model, _tokenizer = mlx_lm.load(mounted)
    mx.eval(model.parameters())
    params = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    assert params.keys() == expected.keys(), (sorted(params), sorted(expected))
    assert all(np.array_equal(params[k], v) for k, v in expected.items()), "mlx_lm weights"
    print(json.dumps({"tensors": len(expected), "mlx_lm": True}))


if __name__ == "__main__":
    main()
