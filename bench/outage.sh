#!/usr/bin/env bash
# What a NAS outage costs a staged model (issue 23). Run as root on Linux:
#
#   sudo bash bench/outage.sh                       # 5 runs, 24 programs, --source-timeout 5s
#   sudo PROGRAMS=200 TIMEOUT=default bash bench/outage.sh
#   sudo AS_USER=1 bash bench/outage.sh             # an ordinary user's mount (links to copies)
#
# Each run: a 2 x 64 MiB model and PROGRAMS never-staged 1 MiB files on an sshfs
# source capped at RATE (tests/scripts/netfs.sh); the model is read once through the
# mount (staged). Then its files are re-read (cat to /dev/null, through the path a
# loader walks) ROUNDS times, GAP seconds apart (past the kernel's 1 s caches), twice:
#   - link up, while PROGRAMS loops cat names the source does not have: the baseline,
#     the same load on these cores without an outage;
#   - link cut, while PROGRAMS loops each cat a different never-staged file.
# Every re-read is compared with the source afterwards. Then the link comes back and
# the time until a never-staged file reads right through the mount is set beside the
# time until sshfs itself answers a direct read. One line per run, then the ranges.
# Nothing here passes or fails on a number.
#
# Environment: RUNS (5), PROGRAMS (24), TIMEOUT (5s, as --source-timeout; "default"
# for the mount's default), RATE (1gbit), ROUNDS (5), GAP (1.2), AS_USER (unset: root
# with passthrough), NETFS_ID (223), BIN (target/release/stagefs, built if missing),
# SLOW_LOG (set: name every re-read over 100 ms on stderr), LISTED (set: the
# never-staged files are listed before the cut).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUNS=${RUNS:-5}
PROGRAMS=${PROGRAMS:-24}
TIMEOUT=${TIMEOUT:-5s}
RATE=${RATE:-1gbit}
ROUNDS=${ROUNDS:-5}
GAP=${GAP:-1.2}
NETFS_ID=${NETFS_ID:-223}
USER_NAME=stagefs-it
BIN=${BIN:-$ROOT/target/release/stagefs}
[[ -x $BIN ]] || (cd "$ROOT" && cargo build --release -q -p stagefs)

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# Runs "$@" as the mounting user: root, or the ordinary test user.
as_mounter() {
    if [[ -n ${AS_USER:-} ]]; then
        setpriv --reuid="$(id -u $USER_NAME)" --regid="$(id -g $USER_NAME)" --init-groups -- "$@"
    else
        "$@"
    fi
}

# PROGRAMS background loops, each cat-ing its own path from the arguments, forever.
PIDS=()
spin() {
    PIDS=()
    local path
    for path in "$@"; do
        (while :; do as_mounter cat "$path" >/dev/null 2>&1 || true; done) &
        PIDS+=($!)
    done
}

stop_spinning() {
    ((${#PIDS[@]})) || return 0
    kill "${PIDS[@]}" 2>/dev/null || true
    wait "${PIDS[@]}" 2>/dev/null || true
}

# The slowest of ROUNDS re-reads of every staged file, in ms; counts wrong ones.
WRONG=0
reread_slowest() {
    local slowest=0 round i t0 ms
    for ((round = 0; round < ROUNDS; round++)); do
        sleep "$GAP"
        for i in "${!STAGED[@]}"; do
            t0=$(now_ms)
            as_mounter cat "${STAGED[$i]}" >/dev/null || WRONG=$((WRONG + 1))
            ms=$(($(now_ms) - t0))
            ((ms > slowest)) && slowest=$ms
            if [[ -n ${SLOW_LOG:-} ]] && ((ms > 100)); then
                echo "slow re-read: round $round ${STAGED[$i]##*/} $ms ms" >&2
            fi
            as_mounter cmp -s "${STAGED[$i]}" "${SOURCES[$i]}" || WRONG=$((WRONG + 1))
        done
    done
    SLOWEST=$slowest
}

one_run() {
    local w hub nas mnt cache
    w=$(mktemp -d /var/tmp/stagefs-outage.XXXX)
    chmod 755 "$w"
    hub=$w/hub nas=$w/nas mnt=$w/mnt cache=$w/cache
    mkdir -p "$hub" "$nas" "$mnt"
    "$BIN" --no-config gen-demo "$hub" --repo acme/staged --shards 2 --shard-size 64M >/dev/null
    "$BIN" --no-config gen-demo "$hub" --repo acme/never --shards "$((PROGRAMS > 0 ? PROGRAMS : 1))" --shard-size 1M >/dev/null
    local sshfs_opts=""
    if [[ -n ${AS_USER:-} ]]; then
        id $USER_NAME >/dev/null 2>&1 || useradd -M $USER_NAME
        chmod 666 /dev/fuse
        chown "$USER_NAME" "$mnt" "$w"
        sshfs_opts=allow_other
    fi
    SSHFS_EXTRA_OPTS=$sshfs_opts bash "$ROOT/tests/scripts/netfs.sh" up "$NETFS_ID" "$hub" "$nas" "$RATE" >/dev/null
    local timeout_flag=(--source-timeout "$TIMEOUT")
    [[ $TIMEOUT == default ]] && timeout_flag=()
    as_mounter "$BIN" --no-config mount "$nas" "$mnt" --cache-dir "$cache" --no-prefetch "${timeout_flag[@]}" >/dev/null
    # Paths in the mount, named from the source: root cannot list an ordinary
    # user's mount.
    SOURCES=("$hub"/models--acme--staged/snapshots/*/*)
    STAGED=("${SOURCES[@]/#"$hub"/"$mnt"}")
    local never=("$hub"/models--acme--never/snapshots/*/model-*.safetensors) missing=() i
    never=("${never[@]/#"$hub"/"$mnt"}")
    for f in "${STAGED[@]}"; do as_mounter cat "$f" >/dev/null; done
    # LISTED=1: the never-staged files were listed before the cut (their names and
    # attributes are in memory), as a loader that scanned the cache would leave them.
    [[ -n ${LISTED:-} ]] && as_mounter ls -lL "${never[@]}" >/dev/null
    for ((i = 0; i < PROGRAMS; i++)); do missing+=("$mnt/no-such-file-$i"); done
    WRONG=0
    spin "${missing[@]}"
    reread_slowest
    stop_spinning
    local up=$SLOWEST
    bash "$ROOT/tests/scripts/netfs.sh" cut "$NETFS_ID"
    spin "${never[@]:0:PROGRAMS}"
    reread_slowest
    stop_spinning
    local down=$SLOWEST
    bash "$ROOT/tests/scripts/netfs.sh" restore "$NETFS_ID"
    local t0 fresh=${never[0]} sshfs_ms="" stagefs_ms=""
    local direct=$nas/${never[0]#"$mnt"/}
    t0=$(now_ms)
    while [[ -z $sshfs_ms || -z $stagefs_ms ]]; do
        [[ -z $sshfs_ms ]] && timeout 2 cat "$direct" >/dev/null 2>&1 && sshfs_ms=$(($(now_ms) - t0))
        [[ -z $stagefs_ms ]] && as_mounter timeout 2 cat "$fresh" >/dev/null 2>&1 && stagefs_ms=$(($(now_ms) - t0))
        (($(now_ms) - t0 > 120000)) && break
        sleep 0.05
    done
    as_mounter "$BIN" unmount "$mnt" >/dev/null 2>&1 || umount -l "$mnt"
    bash "$ROOT/tests/scripts/netfs.sh" down "$NETFS_ID" "$nas"
    rm -rf "$w"
    echo "$up $down $WRONG ${stagefs_ms:-none} ${sshfs_ms:-none}"
}

echo "outage: $RUNS runs; $PROGRAMS programs; --source-timeout $TIMEOUT; mounted by $(if [[ -n ${AS_USER:-} ]]; then echo $USER_NAME; else echo root; fi); $ROUNDS re-reads of a 2 x 64 MiB staged model, $GAP s apart"
ups=() downs=()
for ((run = 1; run <= RUNS; run++)); do
    read -r up down wrong stagefs_ms sshfs_ms < <(one_run)
    echo "run $run: slowest staged re-read ${up} ms with the link up, ${down} ms with it cut; wrong re-reads $wrong; once the link returned, a never-staged file read right after ${stagefs_ms} ms (sshfs itself: ${sshfs_ms} ms)"
    ups+=("$up") downs+=("$down")
done
range() { local s; s=$(printf '%s\n' "$@" | sort -n); echo "$(head -1 <<<"$s")-$(tail -1 <<<"$s")"; }
echo "slowest staged re-read over $RUNS runs: link up $(range "${ups[@]}") ms, link cut $(range "${downs[@]}") ms"
