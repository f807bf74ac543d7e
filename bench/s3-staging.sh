#!/usr/bin/env bash
# Staging from an object store: a 1 GiB object on a local S3 server (moto's, from
# tests/py/s3_server.py, on a loopback port), staged by stagefs against boto3's own
# transfer manager downloading it from the same server. Run as root on Linux:
#
#   sudo bash bench/s3-staging.sh                  # 1024 MiB, 3 rounds
#   sudo SIZE=2048 ROUNDS=5 bash bench/s3-staging.sh
#
# Each round, the two taking turns at going first:
#   - boto3 `download_file` with its default settings (8 MiB parts, 10 threads) into a
#     file on BENCH_TMPDIR: the baseline, timed around the call alone (no sync);
#   - stagefs: a fresh cache and mount of s3://bench (--no-prefetch), timed around the
#     open() of the object through the mount, which returns once it is staged whole,
#     hashed and committed (synced) to the cache;
# then, with the page cache dropped before each, a read of the staged file through the
# mount (a warm load) and of the staged copy itself in the cache directory (the local
# disk's speed). It prints medians and ratios against the baselines of the same run,
# and never passes or fails on a number.
#
# Environment: MOTO_RANGES=1 (moto's own ranged GETs, each reading the whole object),
# SIZE (MiB, default 1024), ROUNDS (default 3), BENCH_TMPDIR (default
# /var/tmp), STAGEFS (a built binary to use instead of building), CARGO_TARGET_DIR,
# PYTHON (default the repository's .venv, with tests/requirements.txt installed).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SIZE=${SIZE:-1024}
ROUNDS=${ROUNDS:-3}
BENCH_TMPDIR=${BENCH_TMPDIR:-/var/tmp}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
# moto reads a whole object for every ranged GET (see tests/py/s3_server.py), which
# bounds both clients at a few MiB/s; the bench's server reads the range alone unless
# MOTO_RANGES=1.
RANGES=--fast-ranges
[[ ${MOTO_RANGES:-0} == 1 ]] && RANGES=
TIMING="$ROOT/bench/py/s3_timing.py"
((EUID == 0)) || { echo "s3-staging.sh: run as root (drop_caches)" >&2; exit 1; }

if [[ -z ${STAGEFS:-} ]]; then
    cargo build --release -q -p stagefs --manifest-path "$ROOT/Cargo.toml"
    STAGEFS=$TARGET/release/stagefs
fi

T=$(mktemp -d "$BENCH_TMPDIR/stagefs-s3.XXXXXX")
mkdir -p "$T/mnt"
exec 3> >("$PYTHON" "$ROOT/tests/py/s3_server.py" $RANGES >"$T/server.out")
SERVER=$!
cleanup() {
    "$STAGEFS" unmount "$T/mnt" >/dev/null 2>&1 || true
    exec 3>&-
    kill "$SERVER" 2>/dev/null || true
    rm -rf "$T"
}
trap cleanup EXIT

# Waits for the server's reply number $1 (its first line says where it listens).
reply() {
    until (($(wc -l <"$T/server.out") >= $1)); do sleep 0.2; done
}
reply 1
URL=$(head -1 "$T/server.out" | cut -d' ' -f2)
export AWS_ENDPOINT_URL=$URL AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1
head -c "${SIZE}M" /dev/urandom >"$T/weights.bin"
echo "{\"op\": \"bucket\", \"bucket\": \"bench\"}" >&3
echo "{\"op\": \"put\", \"bucket\": \"bench\", \"key\": \"model/weights.bin\", \"file\": \"$T/weights.bin\"}" >&3
reply 3
grep -q error "$T/server.out" && { cat "$T/server.out" >&2; exit 1; }
echo "server $URL holds a ${SIZE} MiB object" >&2

boto=() stage=() through=() copy=()
download() {
    boto+=("$("$PYTHON" "$TIMING" download "$URL" bench model/weights.bin "$T/downloaded.bin")")
    rm -f "$T/downloaded.bin"
}
staging() {
    rm -rf "$T/cache"
    # The reserve left free is the test suites' (the default, a tenth of the volume, would
    # depend on how full the shared disk is).
    "$STAGEFS" mount --no-config --no-prefetch --min-free 1G --cache-dir "$T/cache" s3://bench "$T/mnt" >/dev/null
    stage+=("$("$PYTHON" "$TIMING" open "$T/mnt/model/weights.bin")")
    sync; echo 3 >/proc/sys/vm/drop_caches
    through+=("$("$PYTHON" "$TIMING" read "$T/mnt/model/weights.bin")")
    local staged
    staged=$(find "$T/cache/v1/data" -type f -size +$((SIZE / 2))M | head -1)
    sync; echo 3 >/proc/sys/vm/drop_caches
    copy+=("$("$PYTHON" "$TIMING" read "$staged")")
    "$STAGEFS" unmount "$T/mnt" >/dev/null
}
for ((round = 1; round <= ROUNDS; round++)); do
    echo "round $round: load $(cut -d' ' -f1 /proc/loadavg)" >&2
    if ((round % 2)); then download; staging; else staging; download; fi
done

median() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
rate() { awk -v s="$1" -v mib="$SIZE" 'BEGIN {printf "%.0f", mib / s}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
B=$(median "${boto[@]}") S=$(median "${stage[@]}") R=$(median "${through[@]}") C=$(median "${copy[@]}")
echo "| measurement (${SIZE} MiB, median of $ROUNDS) | seconds | MiB/s | ratio |"
echo "| --- | ---: | ---: | ---: |"
echo "| boto3 download_file, default settings (baseline) | $B | $(rate "$B") | 1.00 |"
echo "| stagefs: open() through a fresh mount, staged whole and committed | $S | $(rate "$S") | $(ratio "$S" "$B") |"
echo "| read of the staged copy in the cache, cold (baseline) | $C | $(rate "$C") | 1.00 |"
echo "| warm load: read through the mount, cold page cache | $R | $(rate "$R") | $(ratio "$R" "$C") |"
echo "rounds: boto3 ${boto[*]}; stagefs ${stage[*]}; through the mount ${through[*]}; the copy ${copy[*]}" >&2
