#!/usr/bin/env bash
# Staging from a fast source (a Thunderbolt SSD, a USB 3 disk, a 10 GbE NAS), where
# the copy itself is the bottleneck. Run as root on Linux:
#
#   sudo bash bench/fast-source.sh                 # 1200 MiB file, 5 rounds
#   sudo SIZE=2048 ROUNDS=7 bash bench/fast-source.sh
#
# A tmpfs stands in for the fast source; the cache is on BENCH_TMPDIR (a real disk).
# Each round, with the page cache dropped before each measurement:
#   - cp + sync of the file to the cache disk (the baseline);
#   - open() through a fresh stagefs mount of an HF blob (blake3 and sha256) and of a
#     path-keyed file (blake3 only): the open returns once the copy is whole and synced;
#   - a cold 4-shard model load (readbench cold-open) straight from the tmpfs and
#     through a fresh mount.
# It prints medians and ratios against the baseline of the same run; it never passes
# or fails on a number.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SIZE=${SIZE:-1200}
ROUNDS=${ROUNDS:-5}
BENCH_TMPDIR=${BENCH_TMPDIR:-/var/tmp}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
((EUID == 0)) || { echo "fast-source.sh: run as root (tmpfs, drop_caches)" >&2; exit 1; }

cargo build --release -q -p stagefs -p stagefs-bench --manifest-path "$ROOT/Cargo.toml"
B=$TARGET/release/stagefs
READBENCH=$TARGET/release/readbench

T=$(mktemp -d "$BENCH_TMPDIR/stagefs-fast.XXXXXX")
mkdir -p "$T/src" "$T/mnt"
mount -t tmpfs -o size=$((SIZE * 2 + 1200))M tmpfs "$T/src"
cleanup() {
    fusermount3 -u "$T/mnt" 2>/dev/null || true
    umount "$T/src" 2>/dev/null || true
    rm -rf "$T"
}
trap cleanup EXIT

head -c "${SIZE}M" /dev/urandom >"$T/src/weights.bin"
SHA=$(sha256sum "$T/src/weights.bin" | cut -c1-64)
mkdir -p "$T/src/models--bench--fast/blobs"
cp "$T/src/weights.bin" "$T/src/models--bench--fast/blobs/$SHA"
"$B" gen-demo --repo bench/model --shards 4 --shard-size 256M "$T/src" >"$T/model.json"
SNAP=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["snapshot"])' "$T/model.json")
SHARDS=("$SNAP"/model-*.safetensors)

drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.3f}')" "$1" "$(now)"; }
open_time() { python3 -c "import os,sys,time;t=time.time();os.open(sys.argv[1],os.O_RDONLY);print(f'{time.time()-t:.3f}')" "$1"; }
mount_fresh() {
    rm -rf "$T/cache"
    "$B" mount "$T/src" "$T/mnt" --cache-dir "$T/cache" --no-prefetch --foreground \
        --notify-ready >/dev/null 2>>"$T/log" &
    for _ in $(seq 100); do mountpoint -q "$T/mnt" && return; sleep 0.05; done
    echo "fast-source.sh: the mount did not come up" >&2
    exit 1
}
unmount() { "$B" unmount "$T/mnt"; sleep 0.3; }
load_s() { "$READBENCH" cold-open "$@" | python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["total_s"])'; }

declare -a CP LFS PATHKEY DIRECT MOUNTED
for round in $(seq "$ROUNDS"); do
    drop
    t0=$(now)
    cp "$T/src/weights.bin" "$T/cp.bin"
    sync
    CP+=("$(since "$t0")")
    rm "$T/cp.bin"

    drop; mount_fresh
    LFS+=("$(open_time "$T/mnt/models--bench--fast/blobs/$SHA")")
    drop
    PATHKEY+=("$(open_time "$T/mnt/weights.bin")")
    unmount

    drop
    DIRECT+=("$(load_s "${SHARDS[@]}")")
    drop; mount_fresh
    mounted=()
    for s in "${SHARDS[@]}"; do mounted+=("$T/mnt/${s#"$T/src/"}"); done
    MOUNTED+=("$(load_s "${mounted[@]}")")
    unmount
    echo "round $round: cp+sync ${CP[-1]} s, stage blob ${LFS[-1]} s, stage path-keyed ${PATHKEY[-1]} s, load direct ${DIRECT[-1]} s, load through stagefs ${MOUNTED[-1]} s" >&2
done

median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
m_cp=$(median "${CP[@]}"); m_lfs=$(median "${LFS[@]}"); m_path=$(median "${PATHKEY[@]}")
m_direct=$(median "${DIRECT[@]}"); m_mounted=$(median "${MOUNTED[@]}")
ratio() { python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}')" "$1" "$2"; }
cat <<EOF

fast source (tmpfs) -> cache on $(df --output=source "$BENCH_TMPDIR" | tail -1), ${SIZE} MiB, median of $ROUNDS rounds, $(nproc) cores
| what | seconds | speed vs cp + sync |
| --- | ---: | ---: |
| cp + sync | $m_cp | 1.00 |
| stage an HF blob (blake3 + sha256) | $m_lfs | $(ratio "$m_cp" "$m_lfs") |
| stage a path-keyed file (blake3) | $m_path | $(ratio "$m_cp" "$m_path") |

| cold 4 x 256 MiB model load | seconds | vs direct |
| --- | ---: | ---: |
| straight from the fast source | $m_direct | 1.00 |
| through stagefs (staged on open) | $m_mounted | $(ratio "$m_mounted" "$m_direct") |
EOF
