#!/usr/bin/env bash
# Staging from a fast source (a Thunderbolt SSD, a USB 3 disk, a 10 GbE NAS), where
# the copy itself is the bottleneck. Run as root on Linux:
#
#   sudo bash bench/fast-source.sh                 # 1200 MiB file, 5 rounds
#   sudo SIZE=2048 ROUNDS=7 bash bench/fast-source.sh
#
# A tmpfs stands in for the fast source; the cache is on BENCH_TMPDIR (a real disk).
# Each round measures, in this order and with the page cache dropped before each:
#   - cp + sync of the file to the cache disk (the baseline);
#   - staging it with the core alone (`readbench stage`, no mount), as an HF blob
#     (checked against its sha256) and as a path-keyed file (blake3), timed until the copy
#     is committed (synced, renamed into place, journaled): the issue's staging speed;
#   - open() of each through a fresh mount: what a program waits for, which returns
#     once the copy is whole, verified and committed;
#   - a cold 4 x 256 MiB model load (readbench cold-open) straight from the tmpfs,
#     then through a fresh mount without prefetch (each shard staged on its open),
#     with prefetch one file at a time (--prefetch-parallel 1), and with the default
#     prefetch (from a local disk, one file per core, at most 4), the three mounts
#     taking turns at going first;
#   - the same load from a copy of the model on the cache's disk (BENCH_TMPDIR): a
#     fast disk read cold, as in a loader reading a local NVMe. The tmpfs load is
#     never cold (dropping the page cache does not empty a tmpfs), so it compares a
#     staged load with a memory copy; this one compares it with a disk read.
# It prints medians, ratios against the baseline of the same run, the CPU seconds
# (user + system of the measured process; the kernel's own writeback threads are not
# counted, for cp nor for stagefs) and the load average when each round started. It
# never passes or fails on a number.
#
# Environment: SIZE (MiB, default 1200), ROUNDS (default 5), BENCH_TMPDIR (default
# /var/tmp), STAGEFS and READBENCH (built binaries to use instead of building),
# CARGO_TARGET_DIR. The markdown tables go to stdout, progress to stderr.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SIZE=${SIZE:-1200}
ROUNDS=${ROUNDS:-5}
BENCH_TMPDIR=${BENCH_TMPDIR:-/var/tmp}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
((EUID == 0)) || { echo "fast-source.sh: run as root (tmpfs, drop_caches)" >&2; exit 1; }

if [[ -z ${STAGEFS:-} || -z ${READBENCH:-} ]]; then
    cargo build --release -q -p stagefs -p stagefs-bench --manifest-path "$ROOT/Cargo.toml"
    STAGEFS=$TARGET/release/stagefs
    READBENCH=$TARGET/release/readbench
fi
B=$STAGEFS

T=$(mktemp -d "$BENCH_TMPDIR/stagefs-fast.XXXXXX")
mkdir -p "$T/src" "$T/mnt"
mount -t tmpfs -o size=$((SIZE * 2 + 1400))M tmpfs "$T/src"
cleanup() {
    fusermount3 -u "$T/mnt" 2>/dev/null || true
    umount "$T/src" 2>/dev/null || true
    rm -rf "$T"
}
trap cleanup EXIT

head -c "${SIZE}M" /dev/urandom >"$T/src/weights.bin"
SHA=$(sha256sum "$T/src/weights.bin" | cut -c1-64)
BLOB=models--bench--fast/blobs/$SHA
mkdir -p "$T/src/models--bench--fast/blobs"
cp "$T/src/weights.bin" "$T/src/$BLOB"
"$B" gen-demo --repo bench/model --shards 4 --shard-size 256M "$T/src" >"$T/model.json"
SNAP=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["snapshot"])' "$T/model.json")
SHARDS=("$SNAP"/model-*.safetensors)
mkdir -p "$T/disk"
cp -a "$T/src/models--bench--model" "$T/disk/"
DISK_SHARDS=("${SHARDS[@]/#"$T/src/"/"$T/disk/"}")
# A virtual disk's host caches what was written and read: a first read of fresh data
# took 1.6 s, later ones 0.6 to 0.7 s. Read it once now, so every load sees the same.
sync
cat "${DISK_SHARDS[@]}" >/dev/null

drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
now() { date +%s.%N; }
load1() { cut -d' ' -f1 /proc/loadavg; }
open_time() { python3 -c "import os,sys,time;t=time.time();os.open(sys.argv[1],os.O_RDONLY);print(f'{time.time()-t:.3f}')" "$1"; }
# mount_fresh SOURCE [FLAGS...]: a mount of SOURCE at $T/mnt with an empty cache.
mount_fresh() {
    local source=$1
    shift
    rm -rf "$T/cache"
    "$B" mount "$source" "$T/mnt" --cache-dir "$T/cache" --min-free 1G --foreground "$@" >/dev/null 2>>"$T/log" &
    for _ in $(seq 100); do mountpoint -q "$T/mnt" && return; sleep 0.05; done
    echo "fast-source.sh: the mount did not come up" >&2
    exit 1
}
unmount() { "$B" unmount "$T/mnt"; sleep 0.3; }
load_s() { "$READBENCH" cold-open "$@" | python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["total_s"])'; }
# "wall cpu" of cp + sync.
cp_sync() {
    /usr/bin/time -f '%e %U %S' -o "$T/time" bash -c 'cp "$1" "$2" && sync' _ "$T/src/weights.bin" "$T/cp.bin"
    awk '{ printf "%.3f %.2f\n", $1, $2 + $3 }' "$T/time"
    rm "$T/cp.bin"
}
# "committed_s cpu user+sys steal" of staging $1 with the core alone; steal is the
# CPU time the hypervisor gave to others meanwhile (1/100 s), which shows as a slow round.
core_stage() {
    local before after
    rm -rf "$T/core"
    before=$(steal)
    "$READBENCH" stage "$T/src" "$T/core" "$1" >"$T/stage.json"
    after=$(steal)
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.3f %.2f %.2f+%.2f" % (d["committed_s"], d["user_s"] + d["sys_s"], d["user_s"], d["sys_s"]), end=" ")' "$T/stage.json"
    echo "$((after - before))"
    rm -rf "$T/core"
}
steal() { awk '/^cpu /{ print $9 }' /proc/stat; }

# load_each NAME SOURCE SHARDS...: a cold load of SHARDS straight from SOURCE, then
# through fresh mounts of it without prefetch (NAME_MOUNTED), with one prefetch copy
# at a time (NAME_SERIAL) and with the default (NAME_PREFETCHED), then straight again
# (NAME_DIRECT: the faster of the two). A virtual disk's host may cache what was read
# before, or still be writing what was written: a load right after heavy writes took
# twice as long as the same load a few seconds later. So the mounted loads take turns
# at going first, and the direct load is taken before and after them.
load_each() {
    local name=$1 source=$2 through=() s first last i variant
    local -n direct=$1_DIRECT
    shift 2
    for s in "$@"; do through+=("$T/mnt/${s#"$source/"}"); done
    local variants=(MOUNTED SERIAL PREFETCHED)
    local -A flags=([MOUNTED]=--no-prefetch [SERIAL]="--prefetch-parallel 1" [PREFETCHED]="")
    drop
    first=$(load_s "$@")
    for i in 0 1 2; do
        variant=${variants[(i + round) % 3]}
        drop
        # shellcheck disable=SC2086 # the flags split into words on purpose
        mount_fresh "$source" ${flags[$variant]}
        append "${name}_$variant" "$(load_s "${through[@]}")"
        unmount
    done
    drop
    last=$(load_s "$@")
    direct+=("$(printf '%s\n' "$first" "$last" | sort -n | head -1)")
    echo "  $name: direct loads $first s before and $last s after" >&2
}
# append ARRAY VALUE
append() {
    local -n array=$1
    array+=("$2")
}

declare -a CP CP_CPU LFS LFS_CPU PATHKEY PATH_CPU OPEN_LFS OPEN_PATH LOADS
declare -a TMPFS_DIRECT TMPFS_MOUNTED TMPFS_SERIAL TMPFS_PREFETCHED
declare -a DISK_DIRECT DISK_MOUNTED DISK_SERIAL DISK_PREFETCHED
for round in $(seq "$ROUNDS"); do
    LOADS+=("$(load1)")
    drop
    read -r wall cpu <<<"$(cp_sync)"
    CP+=("$wall") CP_CPU+=("$cpu")
    drop
    read -r wall cpu split blob_steal <<<"$(core_stage "$BLOB")"
    LFS+=("$wall") LFS_CPU+=("$cpu")
    blob_split=$split
    drop
    read -r wall cpu split path_steal <<<"$(core_stage weights.bin)"
    PATHKEY+=("$wall") PATH_CPU+=("$cpu")
    echo "  user+sys CPU-s and steal: blob $blob_split, $blob_steal; path-keyed $split, $path_steal" >&2

    drop; mount_fresh "$T/src" --no-prefetch
    OPEN_LFS+=("$(open_time "$T/mnt/$BLOB")")
    drop
    OPEN_PATH+=("$(open_time "$T/mnt/weights.bin")")
    unmount

    load_each TMPFS "$T/src" "${SHARDS[@]}"
    load_each DISK "$T/disk" "${DISK_SHARDS[@]}"
    echo "round $round (load ${LOADS[-1]}): cp+sync ${CP[-1]} s (${CP_CPU[-1]} CPU-s)," \
        "stage blob ${LFS[-1]} s (${LFS_CPU[-1]}), path-keyed ${PATHKEY[-1]} s (${PATH_CPU[-1]})," \
        "open blob ${OPEN_LFS[-1]} s, open path-keyed ${OPEN_PATH[-1]} s," \
        "load from tmpfs ${TMPFS_DIRECT[-1]} s, through stagefs ${TMPFS_MOUNTED[-1]} s," \
        "prefetching 1 at a time ${TMPFS_SERIAL[-1]} s, by default ${TMPFS_PREFETCHED[-1]} s," \
        "from disk ${DISK_DIRECT[-1]} s, through stagefs ${DISK_MOUNTED[-1]} s," \
        "prefetching 1 at a time ${DISK_SERIAL[-1]} s, by default ${DISK_PREFETCHED[-1]} s" >&2
done

median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ratio() { python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}')" "$1" "$2"; }
# load_table NAME WHERE: the medians of load_each NAME's rounds, as a table.
load_table() {
    local -n direct=$1_DIRECT mounted=$1_MOUNTED serial=$1_SERIAL prefetched=$1_PREFETCHED
    local d m s p
    d=$(median "${direct[@]}") m=$(median "${mounted[@]}") s=$(median "${serial[@]}")
    p=$(median "${prefetched[@]}")
    cat <<TABLE
| cold 4 x 256 MiB model load, source on $2 | seconds | vs direct |
| --- | ---: | ---: |
| straight from the source (baseline) | $d | 1.00 |
| through stagefs, --no-prefetch (each shard staged on its open) | $m | $(ratio "$m" "$d") |
| through stagefs, prefetch one file at a time (--prefetch-parallel 1) | $s | $(ratio "$s" "$d") |
| through stagefs, default prefetch ($(nproc) cores: $(( $(nproc) < 4 ? $(nproc) : 4 )) at a time) | $p | $(ratio "$p" "$d") |
TABLE
}
m_cp=$(median "${CP[@]}")
m_lfs=$(median "${LFS[@]}")
m_path=$(median "${PATHKEY[@]}")
m_open_lfs=$(median "${OPEN_LFS[@]}")
m_open_path=$(median "${OPEN_PATH[@]}")
cat <<EOF

Fast source (tmpfs) -> cache on $(df --output=source,fstype "$BENCH_TMPDIR" | tail -1 | tr -s ' '), ${SIZE} MiB file, median of $ROUNDS rounds, $(nproc) cores.
Command: \`SIZE=$SIZE ROUNDS=$ROUNDS bash bench/fast-source.sh\`; load average (1 min) when each round started: ${LOADS[*]}.

| staging | seconds | CPU-s | speed vs cp + sync |
| --- | ---: | ---: | ---: |
| cp + sync (baseline) | $m_cp | $(median "${CP_CPU[@]}") | 1.00 |
| stage an HF blob (sha256), until committed | $m_lfs | $(median "${LFS_CPU[@]}") | $(ratio "$m_cp" "$m_lfs") |
| stage a path-keyed file (blake3), until committed | $m_path | $(median "${PATH_CPU[@]}") | $(ratio "$m_cp" "$m_path") |
| open() of the blob through a mount | $m_open_lfs | | $(ratio "$m_cp" "$m_open_lfs") |
| open() of the path-keyed file through a mount | $m_open_path | | $(ratio "$m_cp" "$m_open_path") |

$(load_table TMPFS "tmpfs (never cold: a memory copy)")

$(load_table DISK "the cache's disk, page cache dropped")
EOF
