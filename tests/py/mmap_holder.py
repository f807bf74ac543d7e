"""Holds a file open and mapped, as a loader holds a model's shard, and reads it on cue.

Usage: mmap_holder.py PATH. Prints "mapped" once PATH is open and mapped (no page
touched yet). On a first line from stdin it reads every byte through the mapping and
through read(), and prints one JSON line {"mapped": sha256, "read": sha256}, or
{"error": "..."} if either fails. On a second line it unmaps, closes and exits 0. A
fault the mount cannot serve kills it with SIGBUS, which the caller sees.
"""

import hashlib
import json
import mmap
import os
import sys


def main() -> None:
    with open(sys.argv[1], "rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        print("mapped", flush=True)
        sys.stdin.readline()
        try:
            mapped = hashlib.sha256(mapping).hexdigest()
            read = hashlib.sha256(os.pread(f.fileno(), os.fstat(f.fileno()).st_size, 0)).hexdigest()
            print(json.dumps({"mapped": mapped, "read": read}), flush=True)
        except OSError as e:
            print(json.dumps({"error": f"{e.strerror} ({e.errno})"}), flush=True)
        sys.stdin.readline()
        mapping.close()


if __name__ == "__main__":
    main()
