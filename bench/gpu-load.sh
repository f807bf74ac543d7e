#!/usr/bin/env bash
# Cold loads of a model onto the GPU: straight from the source, through stagefs (as
# root and as an ordinary user), warm through stagefs, and after the workaround
# users reach for (copy the snapshot with links followed, sync, load). Run as root
# on Linux, on a machine with python3, torch and transformers:
#
#   sudo bash bench/gpu-load.sh
#
# It makes its own random-weight Llama (SIZE_GB of bf16 weights in SHARD_SIZE
# shards, laid out as a hub cache under BENCH_TMPDIR, kept for the next run), then in
# each of ROUNDS rounds, with the page cache dropped before every load:
# - transformers' from_pretrained onto the GPU (bench/py/gpu_model.py), timed from
#   the call to the weights being on the device (the CUDA context made before);
# - MLX's read pattern (`readbench pread`: open every shard, then 8 threads of 32 MiB
#   preads), opens included;
# - one shard staged by the core alone (`readbench stage`) against `dd` of it, the
#   plain sequential read of the same file.
# Every mount gets a fresh cache, but for the warm row, which remounts the cache the
# cold row filled. With OLD_STAGEFS (and OLD_READBENCH) set, an older build's cold
# rows are measured beside the new one's, in the same rounds. Every load's weights are
# checksummed, and the loads must agree. It prints, and writes to OUT as markdown,
# medians and ratios against the baselines of the same run; it never passes or fails
# on a number.
#
# LAYOUT=folder mounts a plain folder holding a copy of the model, loaded by path
# (its files hashed with blake3), instead of the hub cache (blobs checked against the
# sha256 that names them).
#
# Environment: STAGEFS, READBENCH (default: target/release), OLD_STAGEFS,
# OLD_READBENCH, SIZE_GB (6), SHARD_SIZE (5GB), ROUNDS (3), DEVICE (auto: cuda if
# torch sees one), BENCH_TMPDIR (/var/tmp), BENCH_USER (stagefs-bench, created if
# missing; /dev/fuse is made 0666 as for bench/run.sh), PYTHON (python3), OUT
# (bench/gpu-last-run.md), LOG (unset: the daemons' and loaders' log, each load
# marked with its name and start time, is removed with the run; set: copied there).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
((EUID == 0)) || { echo "gpu-load.sh: run as root (mounts, drop_caches)" >&2; exit 1; }
STAGEFS=$(realpath "${STAGEFS:-$ROOT/target/release/stagefs}")
READBENCH=$(realpath "${READBENCH:-$ROOT/target/release/readbench}")
OLD_STAGEFS=${OLD_STAGEFS:+$(realpath "$OLD_STAGEFS")}
OLD_NAME=${OLD_NAME:-${OLD_STAGEFS:+$("$OLD_STAGEFS" --version) at $OLD_STAGEFS}}
OLD_READBENCH=${OLD_READBENCH:+$(realpath "$OLD_READBENCH")}
SIZE_GB=${SIZE_GB:-6} SHARD_SIZE=${SHARD_SIZE:-5GB} ROUNDS=${ROUNDS:-3} DEVICE=${DEVICE:-auto}
BENCH_TMPDIR=${BENCH_TMPDIR:-/var/tmp} BENCH_USER=${BENCH_USER:-stagefs-bench}
PYTHON=${PYTHON:-python3} OUT=${OUT:-$ROOT/bench/gpu-last-run.md}
MODEL_PY=$ROOT/bench/py/gpu_model.py

for tool in "$STAGEFS" "$READBENCH"; do
    [[ -x $tool ]] || { echo "gpu-load.sh: $tool is missing: cargo build --release -p stagefs -p stagefs-bench" >&2; exit 1; }
done
if ! FUSERMOUNT=$(command -v fusermount3) || [[ ! -u $FUSERMOUNT ]]; then
    echo "gpu-load.sh: fusermount3 must be installed setuid root (package fuse3)" >&2
    exit 1
fi
command -v setpriv >/dev/null || { echo "gpu-load.sh: setpriv is missing (package util-linux)" >&2; exit 1; }
if [[ -z ${LOADERS:-} ]]; then
    LOADERS=mlx
    "$PYTHON" -c 'import torch, transformers' 2>/dev/null && LOADERS="tf mlx"
fi
if [[ $LOADERS == *tf* ]] && ! "$PYTHON" -c 'import torch, transformers'; then
    echo "gpu-load.sh: LOADERS=tf needs torch and transformers in $PYTHON" >&2
    exit 1
fi
id "$BENCH_USER" >/dev/null 2>&1 || useradd --no-create-home --shell /usr/sbin/nologin "$BENCH_USER"
chmod 0666 /dev/fuse

# The model, made once per size and kept: making it takes longer than a round.
HUB=$BENCH_TMPDIR/stagefs-gpu-model-$SIZE_GB-$SHARD_SIZE
if [[ ! -s $HUB/models--bench--gpu/refs/main ]]; then
    rm -rf "$HUB" && mkdir -p "$HUB"
    echo "making a $SIZE_GB GiB random-weight model in $HUB" >&2
    if [[ $LOADERS == *tf* ]]; then
        "$PYTHON" "$MODEL_PY" make --hub "$HUB" --gb "$SIZE_GB" --shard-size "$SHARD_SIZE" >/dev/null
    else
        # Only read, never loaded by a framework: the demo model's shards will do.
        shard_mib=$(awk "BEGIN { s = \"$SHARD_SIZE\"; sub(/GB$/, \"\", s); printf \"%d\", s * 1000 }")
        shards=$(awk "BEGIN { n = $SIZE_GB * 1024 / $shard_mib; printf \"%d\", (n == int(n)) ? n : int(n) + 1 }")
        "$STAGEFS" gen-demo --repo bench/gpu --shards "$shards" --shard-size "$(awk "BEGIN { printf \"%d\", $SIZE_GB * 1024 / $shards }")M" "$HUB" >/dev/null
    fi
fi
chmod -R a+rX "$HUB"
SNAPSHOT=$HUB/models--bench--gpu/snapshots/$(cat "$HUB/models--bench--gpu/refs/main")
# What is mounted (SRC) and where the model's files are in it (MODEL_REL): the hub
# cache, loaded by repo id; or a plain folder holding a copy, loaded by path.
case ${LAYOUT:=hub} in
hub) SRC=$HUB MODEL_REL=${SNAPSHOT#"$HUB/"} ;;
folder)
    SRC=$HUB-folder MODEL_REL=model
    [[ -d $SRC/model ]] || { mkdir -p "$SRC" && cp -rL "$SNAPSHOT" "$SRC/model.tmp" && mv "$SRC/model.tmp" "$SRC/model"; }
    chmod -R a+rX "$SRC"
    ;;
*) echo "gpu-load.sh: LAYOUT is hub or folder, not $LAYOUT" >&2; exit 2 ;;
esac
MODEL_DIR=$SRC/$MODEL_REL
SHARDS=("$MODEL_DIR"/*.safetensors)
BIGGEST=$(realpath "$(du -L "${SHARDS[@]}" | sort -n | tail -1 | cut -f2)")
BIGGEST_REL=${BIGGEST#"$(realpath "$SRC")/"}

T=$(mktemp -d "$BENCH_TMPDIR/stagefs-gpu.XXXXXX")
chmod 0755 "$T"
mkdir -p "$T/mnt" "$T/user-mnt" "$T/user-home" "$T/bin"
chown "$BENCH_USER:" "$T/user-mnt" "$T/user-home"
# The user runs the tools from here: the checkout may be in a home it cannot enter.
for tool in STAGEFS READBENCH OLD_STAGEFS OLD_READBENCH MODEL_PY; do
    [[ -n ${!tool} ]] || continue
    install -m 0755 "${!tool}" "$T/bin/$tool"
    printf -v "$tool" %s "$T/bin/$tool"
done
cleanup() {
    if [[ -n ${LOG:-} && -f $T/log ]]; then cp "$T/log" "$LOG"; fi
    setpriv --reuid "$BENCH_USER" --regid "$BENCH_USER" --clear-groups fusermount3 -u "$T/user-mnt" 2>/dev/null || true
    umount "$T/mnt" 2>/dev/null || umount -l "$T/mnt" 2>/dev/null || true
    rm -rf "$T"
}
trap cleanup EXIT

as_user() { setpriv --reuid "$BENCH_USER" --regid "$BENCH_USER" --clear-groups env HOME="$T/user-home" "$@"; }
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
json() { "$PYTHON" -c 'import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(eval(sys.argv[1], {"d": d}, d))' "$1"; }
calc() { awk "BEGIN { printf \"%.3f\", $1 }"; }

# load LOADER NAME ROOT [as_user]: one cold load of the model in ROOT (the source or
# a mount of it) by LOADER, printed as "NAME seconds [checksum]": transformers (tf)
# or MLX's pattern (mlx).
load() {
    local loader=$1 name=$2 root=$3 out files=() model=bench/gpu
    shift 3
    [[ $LAYOUT == folder ]] && model=$root/$MODEL_REL
    drop
    echo "== $name $(date -u +%T.%N)" >>"$T/log"
    case $loader in
    tf)
        out=$("$@" env HF_HUB_OFFLINE=1 HF_HUB_CACHE="$root" HF_HOME="$T/user-home/hf" \
            "$PYTHON" "$MODEL_PY" load "$model" --device "$DEVICE" 2>>"$T/log")
        echo "$name $(json 'round(load_s, 3)' <<<"$out") $(json checksum <<<"$out")"
        ;;
    mlx)
        for shard in "${SHARDS[@]}"; do files+=("$root/$MODEL_REL/${shard##*/}"); done
        out=$("$@" "$READBENCH" pread --threads 8 --chunk 32M "${files[@]}")
        echo "$name $(json 'round(open_seconds + seconds, 3)' <<<"$out")"
        ;;
    esac
}
# up BINARY MNT CACHE [as_user]: a fresh foreground mount of the model's hub cache.
up() {
    local bin=$1 mnt=$2 cache=$3
    shift 3
    "$@" "$bin" --no-config mount "$SRC" "$mnt" --cache-dir "$cache" --min-free 1G --foreground 2>>"$T/log" &
    DAEMON=$!
    # As the mount's owner: nobody else may look into a FUSE mount, root included.
    for _ in $(seq 200); do "$@" mountpoint -q "$mnt" && return; sleep 0.05; done
    echo "gpu-load.sh: the mount at $mnt did not come up; see $T/log" >&2
    tail -5 "$T/log" >&2
    exit 1
}
down() {
    local bin=$1 mnt=$2
    shift 2
    "$@" "$bin" --no-config unmount "$mnt" >/dev/null
    wait "$DAEMON" 2>/dev/null || true
}
peak_rss() { awk '/VmHWM/ { print $2 }' "/proc/$DAEMON/status"; }
# cold BINARY NAME: each loader's cold load through a fresh mount by BINARY, as root;
# for the new build also a warm one (the cache the cold load filled, remounted).
cold() {
    local bin=$1 name=$2 loader
    for loader in $LOADERS; do
        up "$bin" "$T/mnt" "$T/cache"
        load "$loader" "$name-$loader-cold" "$T/mnt"
        echo "$name-rss-kib $(peak_rss)"
        down "$bin" "$T/mnt"
        if [[ $name == new ]]; then
            up "$bin" "$T/mnt" "$T/cache"
            load "$loader" "$name-$loader-warm" "$T/mnt"
            down "$bin" "$T/mnt"
        fi
        rm -rf "$T/cache"
    done
}
# user: each loader's cold load through an ordinary user's own mount (fusermount3).
user() {
    local mnt=$T/user-mnt cache=$T/user-home/cache loader
    for loader in $LOADERS; do
        up "$STAGEFS" "$mnt" "$cache" as_user
        load "$loader" "user-$loader-cold" "$mnt" as_user
        down "$STAGEFS" "$mnt" as_user
        rm -rf "$cache"
    done
}
# workaround: cp -rL of the snapshot and a sync, then each loader's load of the copy
# (its pages still cached, as they are for a user who loads right after copying).
workaround() {
    local started copied out loader files=()
    for loader in $LOADERS; do
        drop
        started=$(date +%s.%N)
        cp -rL "$MODEL_DIR" "$T/copy"
        sync
        copied=$(date +%s.%N)
        case $loader in
        tf)
            out=$("$PYTHON" "$MODEL_PY" load "$T/copy" --device "$DEVICE" 2>>"$T/log")
            echo "workaround-tf $(json "round(load_s + $copied - $started, 3)" <<<"$out") $(json checksum <<<"$out")"
            ;;
        mlx)
            files=("$T/copy"/*.safetensors)
            out=$("$READBENCH" pread --threads 8 --chunk 32M "${files[@]}")
            echo "workaround-mlx $(json "round(open_seconds + seconds + $copied - $started, 3)" <<<"$out")"
            ;;
        esac
        rm -rf "$T/copy"
    done
}
# stage NAME READBENCH: one shard staged by the core alone, as "NAME answered durable".
stage() {
    drop
    "$2" stage "$SRC" "$T/stage-cache" "$BIGGEST_REL" >"$T/stage.json"
    echo "$1 $(json 'round(d.get("answered_s", committed_s), 3)' <"$T/stage.json") $(json 'round(committed_s, 3)' <"$T/stage.json")"
    rm -rf "$T/stage-cache"
}
sequential() {
    drop
    local started ended
    started=$(date +%s.%N)
    dd if="$BIGGEST" of=/dev/null bs=1M status=none
    ended=$(date +%s.%N)
    echo "dd-sequential $(calc "$ended - $started")"
}

echo "# $(uname -r), $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 2^20 }' /proc/meminfo), $(du -shL "$MODEL_DIR" | cut -f1) in ${#SHARDS[@]} shards, $LAYOUT layout, device $DEVICE" >&2
for round in $(seq "$ROUNDS"); do
    echo "# round $round" >&2
    for loader in $LOADERS; do load "$loader" "direct-$loader" "$SRC"; done
    cold "$STAGEFS" new
    if [[ -n $OLD_STAGEFS ]]; then cold "$OLD_STAGEFS" old; fi
    user
    workaround
    sequential
    stage stage-new "$READBENCH"
    if [[ -n $OLD_READBENCH ]]; then stage stage-old "$OLD_READBENCH"; fi
done | tee "$T/loads" >&2

median() { sort -n | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
col() { awk -v n="$1" -v c="${2:-2}" '$1 == n { print $c }' "$T/loads"; }
med() { col "$1" "${2:-2}" | median; }
ratio() { if [[ -n $1 && -n $2 ]]; then awk "BEGIN { printf \"%.2f\", $1 / $2 }"; else echo "-"; fi; }
range() { local r; r=$(col "$1" | sort -n | sed -n '1p;$p' | xargs printf '%.2f '); echo "${r% }"; }
sums=$(awk 'NF == 3 && $1 ~ /-tf/ { print $3 }' "$T/loads" | sort -u)
{
    echo "## Cold loads onto the GPU: \`bench/gpu-load.sh\`"
    echo
    echo "$(uname -r), $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 2^20 }' /proc/meminfo); model $(du -shL "$MODEL_DIR" | cut -f1) in ${#SHARDS[@]} shards, $LAYOUT layout; $ROUNDS rounds, medians (range); new: $("$STAGEFS" --version)${OLD_NAME:+, old: $OLD_NAME}"
    echo
    echo "| load | seconds | vs direct | vs workaround |"
    echo "| --- | ---: | ---: | ---: |"
    for loader in $LOADERS; do
        direct=$(med "direct-$loader") around=$(med "workaround-$loader")
        for row in "direct-$loader" "workaround-$loader" "new-$loader-cold" "new-$loader-warm" \
            "user-$loader-cold" "old-$loader-cold"; do
            m=$(med "$row")
            if [[ -n $m ]]; then echo "| $row | $m ($(range "$row")) | $(ratio "$m" "$direct") | $(ratio "$m" "$around") |"; fi
        done
    done
    echo
    seq_s=$(med dd-sequential)
    echo "| one shard ($(du -hL "$BIGGEST" | cut -f1)) | seconds | rate vs dd |"
    echo "| --- | ---: | ---: |"
    echo "| dd (plain sequential read) | $seq_s | 1.00 |"
    for row in stage-new stage-old; do
        a=$(med "$row") d=$(med "$row" 3)
        if [[ -n $a ]]; then
            echo "| $row: answered | $a | $(ratio "$seq_s" "$a") |"
            echo "| $row: durable | $d | $(ratio "$seq_s" "$d") |"
        fi
    done
    echo
    echo "Daemon peak RSS (VmHWM) over the cold loads through root's mounts: new $(col new-rss-kib | sort -n | tail -1) KiB${OLD_STAGEFS:+, old $(col old-rss-kib | sort -n | tail -1) KiB}."
    if [[ -n $sums ]]; then
        echo "Weight checksums: $(awk 'NF == 3 && $1 ~ /-tf/' "$T/loads" | wc -l) transformers loads, $(wc -l <<<"$sums") distinct value(s): $sums."
    fi
} | tee "$OUT"
[[ -z $sums || $(wc -l <<<"$sums") == 1 ]] || { echo "gpu-load.sh: the loads read different weights" >&2; exit 1; }
