"""Load a plain model folder by path, as MLX users do (mlx_lm.load("/mnt/models/org/name")).

Usage: python folder_check.py MOUNTED_FOLDER SOURCE_FOLDER

Reads config.json and the safetensors index from the folder in the mount, opens each
shard the index names with safetensors' safe_open (which mmaps) and compares every
tensor with the same file in the source. Prints one JSON line with what it checked.
"""

import json
import os
import sys

import numpy as np
from safetensors import safe_open


def main() -> None:
    mounted, source = sys.argv[1], sys.argv[2]
    with open(os.path.join(mounted, "config.json")) as a, open(os.path.join(source, "config.json")) as b:
        assert json.load(a) == json.load(b), "config.json"
    with open(os.path.join(mounted, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    tensors = 0
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        with safe_open(os.path.join(mounted, shard), "np") as m, safe_open(os.path.join(source, shard), "np") as s:
            assert sorted(m.keys()) == sorted(s.keys()), shard
            for name in m.keys():
                a, b = m.get_tensor(name), s.get_tensor(name)
                assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), name
                tensors += 1
    assert tensors == len(weight_map), (tensors, len(weight_map))
    print(json.dumps({"shards": len(shards), "tensors": tensors}))


if __name__ == "__main__":
    main()
