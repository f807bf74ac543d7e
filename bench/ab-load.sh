#!/usr/bin/env bash
# Two stagefs builds on the same cold model load, taking turns: which is faster on
# this machine now, and by how much. Run as root on Linux:
#
#   sudo bash bench/ab-load.sh OLD_STAGEFS NEW_STAGEFS [SOURCE_DIR]
#
# SOURCE_DIR (default: a new directory under BENCH_TMPDIR, so on the cache's disk,
# removed afterwards) gets a 4 x 256 MiB demo model unless it has one. Each round loads the model straight from
# the source, then through a fresh mount of each build (which one goes first
# alternates), each with the page cache dropped. PATTERN=cold-open (the default) opens
# and reads each shard in turn (`readbench cold-open`); PATTERN=mlx opens every shard,
# then reads them all with 8 threads of 32 MiB preads, as MLX does (`readbench pread`).
# LAYOUT=folder (default hub) loads a plain folder holding a copy of the shards instead
# (path-keyed copies, hashed with blake3 rather than checked against a blob's name).
# It prints every load: its time, the time spent in open() (the first open for
# cold-open, all of them for mlx), and the whole machine's busy and idle CPU-s
# meanwhile (/proc/stat); then the medians. It never passes or fails on a number.
#
# Environment: ROUNDS (default 7), PATTERN, LAYOUT, BENCH_TMPDIR (default /var/tmp),
# READBENCH (a built readbench; default: build it), CARGO_TARGET_DIR.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
((EUID == 0)) || { echo "ab-load.sh: run as root (drop_caches)" >&2; exit 1; }
(($# >= 2)) || { echo "usage: ab-load.sh OLD_STAGEFS NEW_STAGEFS [SOURCE_DIR]" >&2; exit 2; }
OLD=$(realpath "$1") NEW=$(realpath "$2")
ROUNDS=${ROUNDS:-7}
PATTERN=${PATTERN:-cold-open}
case $PATTERN in
cold-open) READ=(cold-open) ;;
mlx) READ=(pread --threads 8 --chunk 32M) ;;
*) echo "ab-load.sh: PATTERN is cold-open or mlx, not $PATTERN" >&2; exit 2 ;;
esac
BENCH_TMPDIR=${BENCH_TMPDIR:-/var/tmp}
if [[ -z ${READBENCH:-} ]]; then
    cargo build --release -q -p stagefs-bench --manifest-path "$ROOT/Cargo.toml"
    READBENCH=${CARGO_TARGET_DIR:-$ROOT/target}/release/readbench
fi

T=$(mktemp -d "$BENCH_TMPDIR/stagefs-ab.XXXXXX")
mkdir -p "$T/mnt"
cleanup() {
    fusermount3 -u "$T/mnt" 2>/dev/null || true
    rm -rf "$T"
}
trap cleanup EXIT
SOURCE=${3:-$T/src}

mkdir -p "$SOURCE"
if ! compgen -G "$SOURCE/models--bench--ab/snapshots/*/model-*.safetensors" >/dev/null; then
    "$NEW" gen-demo --repo bench/ab --shards 4 --shard-size 256M "$SOURCE" >/dev/null
fi
SHARDS=("$SOURCE"/models--bench--ab/snapshots/*/model-*.safetensors)
case ${LAYOUT:=hub} in
hub) ;;
folder)
    mkdir -p "$SOURCE/plain/bench-ab"
    for shard in "${SHARDS[@]}"; do
        [[ -f $SOURCE/plain/bench-ab/${shard##*/} ]] || cp -L "$shard" "$SOURCE/plain/bench-ab/"
    done
    SHARDS=("$SOURCE"/plain/bench-ab/model-*.safetensors)
    ;;
*) echo "ab-load.sh: LAYOUT is hub or folder, not $LAYOUT" >&2; exit 2 ;;
esac
THROUGH=("${SHARDS[@]/#"$SOURCE/"/"$T/mnt/"}")

drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
cpu() { head -1 /proc/stat; }
# load NAME FILES...: one cold load, printed as "NAME seconds opens busy idle".
load() {
    local name=$1 before after
    shift
    drop
    before=$(cpu)
    "$READBENCH" "${READ[@]}" "$@" >"$T/load.json"
    after=$(cpu)
    python3 - "$name" "$T/load.json" "$before" "$after" <<'PY'
import json, sys
name, path, before, after = sys.argv[1:]
load = json.load(open(path))
if load["pattern"] == "cold-open":
    seconds, opens = load["total_s"], load["files"][0]["open_s"]
else:  # pread: all the opens, then the reads
    seconds, opens = load["open_seconds"] + load["seconds"], load["open_seconds"]
ticks = [int(b) - int(a) for a, b in zip(before.split()[1:], after.split()[1:])]
idle = (ticks[3] + ticks[4]) / 100  # idle + iowait
busy = sum(ticks) / 100 - idle
print(f"{name} {seconds:.3f} {opens:.3f} {busy:.2f} {idle:.2f}")
PY
}
# through BINARY NAME: the load through a fresh mount of SOURCE by BINARY.
through() {
    rm -rf "$T/cache"
    "$1" mount "$SOURCE" "$T/mnt" --cache-dir "$T/cache" --min-free 1G --foreground >/dev/null 2>>"$T/log" &
    for _ in $(seq 100); do mountpoint -q "$T/mnt" && break; sleep 0.05; done
    mountpoint -q "$T/mnt" || { echo "ab-load.sh: the mount did not come up" >&2; exit 1; }
    load "$2" "${THROUGH[@]}"
    "$1" unmount "$T/mnt"
    sleep 0.3
}

echo "# $PATTERN, $LAYOUT layout: load seconds open_s busy_cpu_s idle_cpu_s; old=$OLD new=$NEW" >&2
for round in $(seq "$ROUNDS"); do
    load direct "${SHARDS[@]}"
    if ((round % 2)); then
        through "$OLD" old
        through "$NEW" new
    else
        through "$NEW" new
        through "$OLD" old
    fi
done | tee "$T/loads" >&2

median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for name in direct old new; do
    m=$(awk -v n="$name" '$1 == n { print $2 }' "$T/loads" | median)
    o=$(awk -v n="$name" '$1 == n { print $3 }' "$T/loads" | median)
    i=$(awk -v n="$name" '$1 == n { print $5 }' "$T/loads" | median)
    echo "$name: median $m s, in open() $o s, idle $i CPU-s ($PATTERN, $LAYOUT layout, $ROUNDS rounds, $(nproc) cores)"
done
