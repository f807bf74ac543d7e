#!/usr/bin/env bash
# A download through the mount, then a load right away, over a slow link: how much
# each build reads back over the link that the download has just written. Run as
# root on Linux:
#
#   sudo bash bench/download-load.sh OLD_STAGEFS NEW_STAGEFS
#
# Each round, for each build in turn (which goes first alternates): a fresh hub
# directory served over sshfs from a network namespace capped at RATE
# (tests/scripts/netfs.sh), mounted by the build, a fresh cache. Then, with
# HF_HUB_CACHE at the mount, as a user's online load does:
#   - each file of a MODEL_MIB model downloaded from a local Hub
#     (tests/py/hub_server.py) by hf_hub_download and read at once, in one process,
#     as transformers' from_pretrained and mlx_lm.load do, timed;
#   - a second load, offline (every file by hf_hub_download, the weights by
#     safetensors, each checked), timed;
#   - the bytes the mount copied from the source, from `stagefs status --json`.
# One line per load, then the medians. It never passes or fails on a number.
#
# Environment: ROUNDS (default 3), RATE (default 200mbit), MODEL_MIB (default 256),
# PYTHON (default .venv/bin/python, which scripts/setup-tests.sh makes).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
((EUID == 0)) || { echo "download-load.sh: run as root (network namespace)" >&2; exit 1; }
(($# == 2)) || { echo "usage: download-load.sh OLD_STAGEFS NEW_STAGEFS" >&2; exit 2; }
OLD=$(realpath "$1") NEW=$(realpath "$2")
ROUNDS=${ROUNDS:-3}
RATE=${RATE:-200mbit}
export MODEL_MIB=${MODEL_MIB:-256}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
CLIENT=$ROOT/tests/py/hub_client.py
NETFS_ID=$(($$ % 200 + 20))
export HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_DISABLE_PROGRESS_BARS=1

T=$(mktemp -d /var/tmp/stagefs-dl.XXXXXX)
chmod 755 "$T"
HUB_PID=""
cleanup() {
    umount -l "$T/mnt" 2>/dev/null || true
    bash "$ROOT/tests/scripts/netfs.sh" down "$NETFS_ID" "$T/nas" >/dev/null 2>&1 || true
    [[ -n $HUB_PID ]] && kill "$HUB_PID" 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT

"$PYTHON" "$CLIENT" make-model "$T/repo" >/dev/null
# The server serves until its stdin closes: a pipe from a FIFO held open here.
mkfifo "$T/hold"
"$PYTHON" "$ROOT/tests/py/hub_server.py" "$T/repo" acme/tiny <"$T/hold" >"$T/hub.out" 2>/dev/null &
HUB_PID=$!
exec 3>"$T/hold"
until [[ -s $T/hub.out ]]; do sleep 0.1; done
export HF_ENDPOINT=http://127.0.0.1:$(cut -d' ' -f1 "$T/hub.out")

seconds() { python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.2f}")' "$@"; }

# run BINARY NAME: one download and load through a fresh mount by BINARY.
run() {
    local bin=$1 name=$2 t0 t1 t2 copied
    rm -rf "$T/hub" "$T/cache" && mkdir -p "$T/hub" "$T/nas" "$T/mnt"
    SSHFS_EXTRA_OPTS=rw bash "$ROOT/tests/scripts/netfs.sh" up "$NETFS_ID" "$T/hub" "$T/nas" "$RATE" >/dev/null
    "$bin" --no-config mount "$T/nas" "$T/mnt" --cache-dir "$T/cache" >/dev/null
    t0=$(date +%s.%N)
    HF_HUB_CACHE=$T/mnt "$PYTHON" "$CLIENT" hub-download acme/tiny >/dev/null
    t1=$(date +%s.%N)
    HF_HUB_CACHE=$T/mnt HF_HUB_OFFLINE=1 "$PYTHON" "$CLIENT" load acme/tiny >"$T/load.json"
    t2=$(date +%s.%N)
    grep -q '"tensors_match": true' "$T/load.json" || { echo "$name: wrong bytes" >&2; exit 1; }
    copied=$("$bin" --no-config status --json --cache-dir "$T/cache" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["mounts"][0]["metrics"]["bytes_copied"] >> 20)')
    "$bin" --no-config unmount "$T/mnt" >/dev/null
    bash "$ROOT/tests/scripts/netfs.sh" down "$NETFS_ID" "$T/nas" >/dev/null
    echo "$name download_and_read_s $(seconds "$t0" "$t1") load_s $(seconds "$t1" "$t2") copied_mib $copied"
}

echo "# $MODEL_MIB MiB model over a $RATE sshfs link, $ROUNDS rounds"
for ((round = 0; round < ROUNDS; round++)); do
    if ((round % 2 == 0)); then
        run "$OLD" old
        run "$NEW" new
    else
        run "$NEW" new
        run "$OLD" old
    fi
done | tee "$T/lines"
python3 - "$T/lines" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, *kv = line.split()
    fields = dict(zip(kv[::2], map(float, kv[1::2])))
    rows.setdefault(name, []).append(fields)
for name in ("old", "new"):
    runs = rows[name]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"median {name}: download and read {med['download_and_read_s']:.2f} s, load {med['load_s']:.2f} s, "
          f"copied back {med['copied_mib']:.0f} MiB")
PY
