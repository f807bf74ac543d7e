#!/usr/bin/env bash
# stagefs benchmark driver. Run as root on Linux:
#
#   sudo bash bench/run.sh                                   # 4 x 1G shards, 1gbit link
#   sudo SHARD_SIZE=64M RATE=200mbit bash bench/run.sh       # a quick run
#
# It builds stagefs and readbench, generates a synthetic sharded model, serves it as a
# real network filesystem (sshfs to an sshd in a private network namespace, capped
# with tc), and measures stagefs against baselines taken in the same run: the raw
# link, cp, rsync, and reads of the local cache files and of the network mount. It
# prints a summary and writes it as markdown to $OUT. bench/README.md explains every
# figure. Nothing here passes or fails on a number: it only measures and reports.
#
# Environment (all optional):
#   SHARD_SIZE  size of each of the 4 shards            (default 1G)
#   RATE        link cap, as tc spells it               (default 1gbit)
#   OUT         markdown summary file                   (default bench/last-run.md)
#   TOUCHES     random page touches per mmap run        (default 20000)
#   SEED        seed of the page sequence               (default 42)
#   THREADS     pread threads                           (default 8)
#   CHUNK       largest pread                           (default 32M)
#   BENCH_TMPDIR  where the scratch dir goes; must be a real disk, not tmpfs, for
#               "local disk" to mean anything           (default /var/tmp)
#   NETFS_ID    netfs.sh instance id                    (default: a free one of 254-251, then 250 down)
#   CARGO_TARGET_DIR  honoured for the build and for finding the binaries
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# A relative OUT is relative to where the script was started; the default is in bench/.
if [[ -n ${OUT:-} && $OUT != /* ]]; then OUT="$PWD/$OUT"; fi
OUT=${OUT:-$ROOT/bench/last-run.md}
cd "$ROOT"

SHARDS=4
SHARD_SIZE=${SHARD_SIZE:-1G}
RATE=${RATE:-1gbit}
TOUCHES=${TOUCHES:-20000}
SEED=${SEED:-42}
THREADS=${THREADS:-8}
CHUNK=${CHUNK:-32M}
BENCH_TMPDIR=${BENCH_TMPDIR:-/var/tmp}
COMMAND="SHARD_SIZE=$SHARD_SIZE RATE=$RATE TOUCHES=$TOUCHES SEED=$SEED THREADS=$THREADS CHUNK=$CHUNK OUT=$OUT bash bench/run.sh"
NETFS="$ROOT/tests/scripts/netfs.sh"

log() { printf '\n== %s\n' "$*" >&2; }
die() {
    printf 'run.sh: %s\n' "$*" >&2
    exit 1
}

# ---------------------------------------------------------------- prerequisites

check_prerequisites() {
    [[ $(uname -s) == Linux ]] || die "Linux only (network namespaces, tc, FUSE passthrough)"
    ((EUID == 0)) || die "run as root: sudo bash bench/run.sh (it mounts, creates a network namespace and drops page caches)"
    [[ -c /dev/fuse ]] || die "/dev/fuse is missing; load the fuse module (modprobe fuse)"
    local missing=()
    local tool
    for tool in sshfs /usr/sbin/sshd ssh-keygen rsync ip tc fusermount3 mountpoint dd awk; do
        command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
    if ((${#missing[@]})); then
        die "missing: ${missing[*]}. Install them with:
    apt-get install -y sshfs openssh-server rsync iproute2 fuse3"
    fi
}

find_cargo() {
    if command -v cargo >/dev/null 2>&1; then
        command -v cargo
        return
    fi
    # sudo resets PATH, so look where rustup puts cargo for root and for the caller.
    local home
    for home in "$HOME" "$(getent passwd "${SUDO_USER:-root}" | cut -d: -f6)"; do
        if [[ -x $home/.cargo/bin/cargo ]]; then
            echo "$home/.cargo/bin/cargo"
            return
        fi
    done
    die "cargo not found; install Rust (https://rustup.rs) or put cargo on PATH"
}

# Builds as the invoking user under sudo, so target/ does not become root-owned.
build() {
    local cargo
    cargo=$(find_cargo)
    local args=(build --release -p stagefs -p stagefs-bench)
    log "building: cargo ${args[*]}"
    if [[ -n ${SUDO_USER:-} && $SUDO_USER != root ]]; then
        sudo -u "$SUDO_USER" -H env "PATH=$(dirname "$cargo"):$PATH" \
            ${CARGO_TARGET_DIR:+"CARGO_TARGET_DIR=$CARGO_TARGET_DIR"} "$cargo" "${args[@]}"
    else
        "$cargo" "${args[@]}"
    fi
    local target=${CARGO_TARGET_DIR:-$ROOT/target}
    [[ $target == /* ]] || target="$ROOT/$target"
    STAGEFS="$target/release/stagefs"
    READBENCH="$target/release/readbench"
    [[ -x $STAGEFS && -x $READBENCH ]] || die "build did not produce $STAGEFS and $READBENCH"
}

# ---------------------------------------------------------------- scratch, mounts, cleanup

T=""
NETFS_UP=""
NETFS_NS=""
DAEMON_PID=""
WARNINGS=()

pick_netfs_id() {
    if [[ -n ${NETFS_ID:-} ]]; then
        echo "$NETFS_ID"
        return
    fi
    # The integration tests draw ids from 1-250 at random, and `netfs.sh up` first tears
    # down whatever has its id; 251-254 are still valid addresses and never drawn.
    local id
    for id in 254 253 252 251 $(seq 250 -1 200); do
        if ! ip netns list 2>/dev/null | grep -qw "sfs-$id" && [[ ! -e /tmp/stagefs-netfs-$id ]]; then
            echo "$id"
            return
        fi
    done
    die "no free netfs id; set NETFS_ID"
}

cleanup() {
    local status=$?
    set +e
    stop_stagefs
    if [[ -n $NETFS_UP ]]; then
        bash "$NETFS" down "$NETFS_ID" "$T/sshfs" >/dev/null 2>&1
        reap_netfs_leftovers
    fi
    if [[ -n $T && -d $T ]]; then
        # Only once nothing is mounted inside: never recurse into a live mount.
        if ! grep -q " $T/" /proc/mounts; then
            rm -rf --one-file-system "$T"
        else
            echo "run.sh: left $T in place because something is still mounted there" >&2
        fi
    fi
    exit "$status"
}

# netfs.sh down lazily unmounts sshfs and kills the sshd listener; an ssh client or
# sshd session still busy at that moment can outlive it, holding the dead namespace.
# Only processes of this run's instance are ended: those inside its namespace and
# those using its key directory.
reap_netfs_leftovers() {
    local pids=() proc
    # Never the host's own namespace, whatever went wrong before.
    [[ $NETFS_NS != "$(readlink /proc/$$/ns/net)" ]] || NETFS_NS=""
    for proc in /proc/[0-9]*; do
        if [[ -n $NETFS_NS && $(readlink "$proc/ns/net" 2>/dev/null) == "$NETFS_NS" ]]; then
            pids+=("${proc#/proc/}")
        fi
    done
    local pid
    for pid in $(pgrep -f -- "/tmp/stagefs-netfs-$NETFS_ID/client_key" || true); do
        pids+=("$pid")
    done
    ((${#pids[@]})) || return 0
    kill "${pids[@]}" 2>/dev/null || true
}

setup_scratch() {
    mkdir -p "$BENCH_TMPDIR"
    T=$(mktemp -d "$BENCH_TMPDIR/stagefs-bench.XXXXXX")
    mkdir -p "$T/export" "$T/sshfs" "$T/mnt" "$T/local" "$T/logs"
    SRC="$T/sshfs"
    MNT="$T/mnt"
}

# Starts a stagefs mount of the sshfs source at $MNT in the foreground as a child, so
# its pid (for VmHWM) is $!, and waits until the mount is live.
start_stagefs() {
    local cache=$1
    shift
    "$STAGEFS" mount "$SRC" "$MNT" --cache-dir "$cache" --foreground "$@" \
        >>"$T/logs/stagefs.log" 2>&1 &
    DAEMON_PID=$!
    local i
    for i in $(seq 600); do
        mountpoint -q "$MNT" && return 0
        kill -0 "$DAEMON_PID" 2>/dev/null || break
        sleep 0.1
    done
    tail -n 20 "$T/logs/stagefs.log" >&2
    die "stagefs mount did not come up (log above)"
}

# Unmounts and reaps the daemon. A daemon that outlives its mount is noted in the
# report and, after a bounded wait, killed: the benchmark must always finish.
stop_stagefs() {
    [[ -n $DAEMON_PID ]] || return 0
    local log="$T/logs/stagefs.log"
    if mountpoint -q "$MNT" 2>/dev/null; then
        "$STAGEFS" unmount "$MNT" >>"$log" 2>&1 ||
            "$STAGEFS" unmount --lazy "$MNT" >>"$log" 2>&1 || true
    fi
    if ! wait_exit 30; then
        WARNINGS+=("the daemon (pid $DAEMON_PID) was still running 30 s after its unmount; sent SIGTERM")
        kill -TERM "$DAEMON_PID" 2>/dev/null || true
        if ! wait_exit 10; then
            WARNINGS+=("the daemon (pid $DAEMON_PID) ignored SIGTERM for 10 s; sent SIGKILL")
            kill -KILL "$DAEMON_PID" 2>/dev/null || true
        fi
    fi
    wait "$DAEMON_PID" 2>/dev/null || true
    DAEMON_PID=""
}

# Waits up to $1 seconds for the daemon to exit.
wait_exit() {
    local i
    for i in $(seq $(($1 * 10))); do
        kill -0 "$DAEMON_PID" 2>/dev/null || return 0
        sleep 0.1
    done
    ! kill -0 "$DAEMON_PID" 2>/dev/null
}

# Peak resident set of the running daemon, in MiB.
daemon_hwm_mib() {
    awk '/^VmHWM:/ { printf "%.1f", $2 / 1024 }' "/proc/$DAEMON_PID/status"
}

# The running mount's counters, to show which path actually served the reads.
daemon_counters() {
    local json
    json=$("$STAGEFS" status --cache-dir "$1" --json 2>/dev/null) || {
        echo "n/a"
        return
    }
    printf 'copies %s, hits %s, passthrough opens %s, daemon opens %s, daemon reads %s' \
        "$(jnum stage_copies <<<"$json")" "$(jnum stage_hits <<<"$json")" \
        "$(jnum passthrough_opens <<<"$json")" "$(jnum daemon_opens <<<"$json")" \
        "$(jnum daemon_reads <<<"$json")"
}

# ---------------------------------------------------------------- measuring helpers

drop_caches() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
}

now() { date +%s.%N; }

# Seconds since $1.
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }

# The first numeric value of "KEY" in the JSON on stdin (flat enough for our output).
jnum() {
    grep -o "\"$1\": *-\?[0-9][0-9.eE+-]*" | head -n 1 | sed 's/.*: *//'
}

# Arithmetic on decimals: calc EXPR [var=value ...].
calc() {
    local expr=$1
    shift
    local vars=()
    local kv
    for kv in "$@"; do vars+=(-v "$kv"); done
    awk "${vars[@]}" "BEGIN { x = ($expr); printf \"%.3f\", x }"
}

# a/b with 2 decimals, or n/a when b is 0 or missing.
ratio() {
    awk -v a="${1:-0}" -v b="${2:-0}" 'BEGIN { if (b + 0 == 0) print "n/a"; else printf "%.2f", a / b }'
}

# Decimal megabytes per second of $1 bytes in $2 seconds.
mbps() {
    awk -v n="${1:-0}" -v s="${2:-0}" 'BEGIN { if (s + 0 == 0) print "n/a"; else printf "%.1f", n / s / 1e6 }'
}

fmt1() { awk -v x="${1:-0}" 'BEGIN { printf "%.1f", x }'; }
fmt3() { awk -v x="${1:-0}" 'BEGIN { printf "%.3f", x }'; }

file_size() { stat -L -c %s "$1"; }

# ---------------------------------------------------------------- the measurements

generate_model() {
    log "generating $SHARDS x $SHARD_SIZE shards"
    "$STAGEFS" gen-demo "$T/export" --repo bench/model --shards "$SHARDS" \
        --shard-size "$SHARD_SIZE" >"$T/logs/gen.json"
    local snaps=("$T"/export/models--bench--model/snapshots/*)
    ((${#snaps[@]} == 1)) || die "expected one snapshot, found ${#snaps[@]}"
    SNAP_REL=${snaps[0]#"$T/export/"}
    SHARD_REL=()
    local i
    for i in $(seq "$SHARDS"); do
        SHARD_REL+=("$SNAP_REL/$(printf 'model-%05d-of-%05d.safetensors' "$i" "$SHARDS")")
    done
    SHARD_BYTES=$(file_size "$T/export/${SHARD_REL[0]}")
    MODEL_BYTES=0
    local rel
    for rel in "${SHARD_REL[@]}"; do
        MODEL_BYTES=$((MODEL_BYTES + $(file_size "$T/export/$rel")))
    done
}

start_netfs() {
    NETFS_ID=$(pick_netfs_id)
    log "network filesystem: sshfs over a $RATE link (netns sfs-$NETFS_ID)"
    NETFS_UP=1
    local try
    for try in 1 2 3 4 5; do
        bash "$NETFS" up "$NETFS_ID" "$T/export" "$SRC" "$RATE"
        NETFS_NS=$(ip netns exec "sfs-$NETFS_ID" readlink /proc/self/ns/net)
        if [[ -f $SRC/${SHARD_REL[0]} ]]; then
            return 0
        fi
        # netfs.sh decides on no_contain_symlinks with `sshfs -h | grep -q` under
        # pipefail; when grep exits first, sshfs dies of SIGPIPE, the option is left
        # out, and sshfs refuses the snapshots' ../../blobs links (EPERM). Try again.
        echo "run.sh: the sshfs mount does not resolve the snapshot links (try $try); remounting" >&2
        WARNINGS+=("sshfs came up refusing the snapshot links (netfs.sh's sshfs -h | grep -q race) and was remounted")
        bash "$NETFS" down "$NETFS_ID" "$SRC" >/dev/null 2>&1
        reap_netfs_leftovers
    done
    die "the sshfs mount does not show the model at $SRC/${SHARD_REL[0]}"
}

# a. The link's own rate: one sequential reader of a cold shard, no stagefs.
measure_raw_link() {
    log "a. raw link: dd of shard 1 from sshfs"
    drop_caches
    local t0
    t0=$(now)
    dd if="$SRC/${SHARD_REL[0]}" of=/dev/null bs=4M status=none
    RAW_S=$(since "$t0")
    RAW_MBPS=$(mbps "$SHARD_BYTES" "$RAW_S")
}

# b. What a user would otherwise do: copy the shard to local disk. stagefs fsyncs its
# copy before the open returns and cp does not, so cp + sync is shown as well.
measure_cp() {
    log "b. cp of shard 2 from sshfs to local disk"
    drop_caches
    local t0
    t0=$(now)
    cp "$SRC/${SHARD_REL[1]}" "$T/local/cp-shard"
    CP_S=$(since "$t0")
    sync "$T/local/cp-shard"
    CP_SYNC_S=$(since "$t0")
    rm -f "$T/local/cp-shard"
}

# c. The open of a cold shard through stagefs returns once the whole file is staged.
# Without prefetch this is the copy engine alone, comparable with cp. With prefetch
# (the default) the first open also starts copies of the snapshot's other shards,
# which share the link with it, so it is timed too: it is what a user waits for.
measure_stage() {
    if "$STAGEFS" mount --help | grep -q -- --no-prefetch; then
        log "c. cold stage of shard 3 through stagefs --no-prefetch"
        stage_one stage "${SHARD_REL[2]}" --no-prefetch
        STAGE_S=$STAGE_OPEN_S
        STAGE_READ_S=$STAGE_READ
        HWM_STAGE=$STAGE_HWM
        log "c. cold stage of shard 4 through stagefs (default: prefetch on)"
        stage_one stage-prefetch "${SHARD_REL[3]}"
        STAGE_PF_S=$STAGE_OPEN_S
        HWM_STAGE_PF=$STAGE_HWM
    else
        log "c. cold stage of shard 3 through stagefs (this stagefs has no prefetch)"
        stage_one stage "${SHARD_REL[2]}"
        STAGE_S=$STAGE_OPEN_S
        STAGE_READ_S=$STAGE_READ
        HWM_STAGE=$STAGE_HWM
        STAGE_PF_S="" HWM_STAGE_PF=""
    fi
    STAGE_MBPS=$(mbps "$SHARD_BYTES" "$STAGE_S")
}

# Opens and reads shard $2 through a fresh mount with a fresh cache, mount flags $3...;
# sets STAGE_OPEN_S, STAGE_READ and STAGE_HWM.
stage_one() {
    local name=$1 rel=$2
    shift 2
    local cache="$T/cache-$name"
    drop_caches
    start_stagefs "$cache" "$@"
    readbench_json "$T/logs/$name.json" cold-open "$MNT/$rel"
    STAGE_OPEN_S=$(fmt3 "$(jnum total_open_s <"$T/logs/$name.json")")
    STAGE_READ=$(jnum total_read_s <"$T/logs/$name.json")
    STAGE_HWM=$(daemon_hwm_mib)
    stop_stagefs
    rm -rf "$cache"
}

# e. A cold model load through stagefs against rsync to local disk plus the same load.
measure_model_load() {
    log "e. cold $SHARDS-shard load through stagefs"
    MODEL_CACHE="$T/cache-model"
    local mounted=()
    local rel
    for rel in "${SHARD_REL[@]}"; do mounted+=("$MNT/$rel"); done
    drop_caches
    start_stagefs "$MODEL_CACHE"
    readbench_json "$T/logs/load-stagefs.json" cold-open "${mounted[@]}"
    LOAD_STAGEFS_S=$(fmt3 "$(jnum total_s <"$T/logs/load-stagefs.json")")
    LOAD_STAGEFS_OPEN_S=$(jnum total_open_s <"$T/logs/load-stagefs.json")
    LOAD_STAGEFS_READ_S=$(jnum total_read_s <"$T/logs/load-stagefs.json")
    HWM_MODEL=$(daemon_hwm_mib)
    LOAD_COUNTERS=$(daemon_counters "$MODEL_CACHE")
    stop_stagefs

    log "e. baseline: rsync -aL of the snapshot, then the same load from local disk"
    drop_caches
    local t0
    t0=$(now)
    rsync -aL "$SRC/$SNAP_REL/" "$T/local/snapshot/"
    RSYNC_S=$(since "$t0")
    local local_files=()
    for rel in "${SHARD_REL[@]}"; do local_files+=("$T/local/snapshot/${rel##*/}"); done
    readbench_json "$T/logs/load-local.json" cold-open "${local_files[@]}"
    LOAD_LOCAL_S=$(jnum total_s <"$T/logs/load-local.json")
    LOAD_RSYNC_TOTAL_S=$(calc "a + b" "a=$RSYNC_S" "b=$LOAD_LOCAL_S")
    rm -rf "$T/local/snapshot"
}

# Runs readbench, keeps its JSON in $1 and echoes it to the log.
readbench_json() {
    local out=$1
    shift
    "$READBENCH" "$@" >"$out"
    cat "$out" >&2
}

# d. The MLX-like pread pattern and random mmap touches on one set of files; sets
# <NAME>_PREAD_MBPS, _PREAD_WORST, _PREAD_P99, _MMAP_TPS, _MMAP_WORST, _MMAP_P99.
read_patterns() {
    local name=$1
    shift
    drop_caches
    readbench_json "$T/logs/pread-$name.json" pread --threads "$THREADS" --chunk "$CHUNK" "$@"
    drop_caches
    readbench_json "$T/logs/mmap-$name.json" mmap --touches "$TOUCHES" --seed "$SEED" "$@"
    local p="$T/logs/pread-$name.json" m="$T/logs/mmap-$name.json"
    printf -v "${name}_PREAD_MBPS" '%s' "$(mbps "$(jnum total_bytes <"$p")" "$(jnum seconds <"$p")")"
    printf -v "${name}_PREAD_WORST" '%s' "$(fmt1 "$(jnum worst_pread_ms <"$p")")"
    printf -v "${name}_PREAD_P99" '%s' "$(fmt1 "$(jnum p99_pread_ms <"$p")")"
    printf -v "${name}_OPEN_S" '%s' "$(fmt3 "$(jnum open_seconds <"$p")")"
    printf -v "${name}_MMAP_TPS" '%s' "$(fmt1 "$(jnum touches_per_s <"$m")")"
    printf -v "${name}_MMAP_WORST" '%s' "$(fmt3 "$(jnum worst_fault_ms <"$m")")"
    printf -v "${name}_MMAP_P99" '%s' "$(fmt3 "$(jnum p99_fault_ms <"$m")")"
}

# A fresh mount re-hashes each staged copy the first time it serves it, which reads
# the whole file and leaves it in the page cache. Those first opens are timed here,
# from a cold cache, so that the read patterns afterwards (caches dropped again)
# measure the read path and not the re-hash; sets <NAME>_FIRST_OPEN_S.
first_opens() {
    local name=$1
    shift
    drop_caches
    local t0 f
    t0=$(now)
    for f in "$@"; do
        : <"$f"
    done
    printf -v "${name}_FIRST_OPEN_S" '%s' "$(since "$t0")"
}

measure_reads() {
    local rel mounted=() sshfs=() cached=()
    for rel in "${SHARD_REL[@]}"; do
        mounted+=("$MNT/$rel")
        sshfs+=("$SRC/$rel")
    done
    # The store names an LFS blob's copy by the blob's sha256, which is the name the
    # snapshot link points at; listing them in shard order makes the mmap run touch
    # the same pages of the same shards as on the other paths.
    local blob f
    for rel in "${SHARD_REL[@]}"; do
        blob=$(readlink "$T/export/$rel")
        f="$MODEL_CACHE/v1/data/sha256-${blob##*/}"
        [[ -f $f ]] || die "no staged copy of $rel at $f (has the store's naming changed?)"
        cached+=("$f")
    done

    log "d(i). reads through stagefs with passthrough"
    start_stagefs "$MODEL_CACHE"
    first_opens PT "${mounted[@]}"
    read_patterns PT "${mounted[@]}"
    PT_COUNTERS=$(daemon_counters "$MODEL_CACHE")
    stop_stagefs

    log "d(ii). reads through stagefs with --no-passthrough"
    start_stagefs "$MODEL_CACHE" --no-passthrough
    first_opens NOPT "${mounted[@]}"
    read_patterns NOPT "${mounted[@]}"
    NOPT_COUNTERS=$(daemon_counters "$MODEL_CACHE")
    stop_stagefs

    log "d(iii). reads of the local cache files"
    read_patterns LOCAL "${cached[@]}"

    log "d(iv). reads straight from sshfs"
    read_patterns SSHFS "${sshfs[@]}"
}

# ---------------------------------------------------------------- the report

report() {
    local mem cpu rev
    mem=$(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)
    cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
    rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
    if [[ -n $(git -C "$ROOT" status --porcelain 2>/dev/null) ]]; then rev="$rev (with uncommitted changes)"; fi
    cat <<EOF
# stagefs benchmark

| | |
| --- | --- |
| date | $(date -u '+%Y-%m-%d %H:%M:%S UTC') |
| kernel | $(uname -r) |
| cpus | $(nproc)${cpu:+ ($cpu)} |
| memory | $mem |
| stagefs | $rev |
| model | $SHARDS shards x $SHARD_BYTES bytes ($SHARD_SIZE), $MODEL_BYTES bytes |
| link | sshfs over a veth pair capped at $RATE (tc tbf) |
| scratch | $BENCH_TMPDIR ($(df --output=fstype "$BENCH_TMPDIR" | tail -n 1)) |
| command | \`$COMMAND\` |

MB/s is 10^6 bytes per second. Page caches are dropped before every cold measurement.

## Cold copy of one shard ($SHARD_BYTES bytes)

| measurement | seconds | MB/s | share of raw link |
| --- | ---: | ---: | ---: |
| a. raw link: \`dd\` from sshfs to /dev/null | $RAW_S | $RAW_MBPS | 1.00 |
| b. \`cp\` from sshfs to local disk | $CP_S | $(mbps "$SHARD_BYTES" "$CP_S") | $(ratio "$RAW_S" "$CP_S") |
| b. \`cp\` + \`sync\` | $CP_SYNC_S | $(mbps "$SHARD_BYTES" "$CP_SYNC_S") | $(ratio "$RAW_S" "$CP_SYNC_S") |
| c. stagefs --no-prefetch: \`open()\` of a cold shard (stages it) | $STAGE_S | $STAGE_MBPS | $(ratio "$RAW_S" "$STAGE_S") |
$(stage_pf_row)

- stage time / cp time: **$(ratio "$STAGE_S" "$CP_S")** (/ cp + sync: $(ratio "$STAGE_S" "$CP_SYNC_S"))${STAGE_PF_S:+; with prefetch on: $(ratio "$STAGE_PF_S" "$CP_S")}
- stage throughput / raw link: **$(ratio "$STAGE_MBPS" "$RAW_MBPS")**
- sequential read of the just-staged shard through the mount: $(fmt3 "$STAGE_READ_S") s

## Reads of the $SHARDS staged shards ($MODEL_BYTES bytes), cold page cache

pread: $THREADS threads, preads of up to $CHUNK interleaved across the shards, every byte once.
mmap: $TOUCHES random 4 KiB page touches (seed $SEED) with MADV_RANDOM, one fault timed per touch.

| path | pread MB/s | worst pread ms | p99 pread ms | touches/s | worst fault ms | p99 fault ms |
| --- | ---: | ---: | ---: | ---: | ---: | ---: |
| (i) stagefs, passthrough | $PT_PREAD_MBPS | $PT_PREAD_WORST | $PT_PREAD_P99 | $PT_MMAP_TPS | $PT_MMAP_WORST | $PT_MMAP_P99 |
| (ii) stagefs, --no-passthrough | $NOPT_PREAD_MBPS | $NOPT_PREAD_WORST | $NOPT_PREAD_P99 | $NOPT_MMAP_TPS | $NOPT_MMAP_WORST | $NOPT_MMAP_P99 |
| (iii) local cache files | $LOCAL_PREAD_MBPS | $LOCAL_PREAD_WORST | $LOCAL_PREAD_P99 | $LOCAL_MMAP_TPS | $LOCAL_MMAP_WORST | $LOCAL_MMAP_P99 |
| (iv) sshfs directly | $SSHFS_PREAD_MBPS | $SSHFS_PREAD_WORST | $SSHFS_PREAD_P99 | $SSHFS_MMAP_TPS | $SSHFS_MMAP_WORST | $SSHFS_MMAP_P99 |

Ratios to the local cache files (iii):

| path | pread throughput | worst pread | touches/s | worst fault | p99 fault |
| --- | ---: | ---: | ---: | ---: | ---: |
| (i) stagefs, passthrough | $(ratio "$PT_PREAD_MBPS" "$LOCAL_PREAD_MBPS") | $(ratio "$PT_PREAD_WORST" "$LOCAL_PREAD_WORST") | $(ratio "$PT_MMAP_TPS" "$LOCAL_MMAP_TPS") | $(ratio "$PT_MMAP_WORST" "$LOCAL_MMAP_WORST") | $(ratio "$PT_MMAP_P99" "$LOCAL_MMAP_P99") |
| (ii) stagefs, --no-passthrough | $(ratio "$NOPT_PREAD_MBPS" "$LOCAL_PREAD_MBPS") | $(ratio "$NOPT_PREAD_WORST" "$LOCAL_PREAD_WORST") | $(ratio "$NOPT_MMAP_TPS" "$LOCAL_MMAP_TPS") | $(ratio "$NOPT_MMAP_WORST" "$LOCAL_MMAP_WORST") | $(ratio "$NOPT_MMAP_P99" "$LOCAL_MMAP_P99") |
| (iv) sshfs directly | $(ratio "$SSHFS_PREAD_MBPS" "$LOCAL_PREAD_MBPS") | $(ratio "$SSHFS_PREAD_WORST" "$LOCAL_PREAD_WORST") | $(ratio "$SSHFS_MMAP_TPS" "$LOCAL_MMAP_TPS") | $(ratio "$SSHFS_MMAP_WORST" "$LOCAL_MMAP_WORST") | $(ratio "$SSHFS_MMAP_P99" "$LOCAL_MMAP_P99") |

First open of the $SHARDS staged shards after a fresh mount, cold page cache (stagefs checks a copy before it first serves it): ${PT_FIRST_OPEN_S} s, $(mbps "$MODEL_BYTES" "$PT_FIRST_OPEN_S") MB/s (passthrough mount); ${NOPT_FIRST_OPEN_S} s (no passthrough).
The reads above come after those first opens and another cache drop; opening the $SHARDS shards again before the preads took ${PT_OPEN_S} s (passthrough), ${NOPT_OPEN_S} s (no passthrough).
Daemon counters: (i) $PT_COUNTERS; (ii) $NOPT_COUNTERS.

## Cold load of the whole model ($SHARDS shards, open + sequential read of each)

| measurement | seconds | MB/s |
| --- | ---: | ---: |
| stagefs: load through the mount (opens stage, then read) | $LOAD_STAGEFS_S | $(mbps "$MODEL_BYTES" "$LOAD_STAGEFS_S") |
| &nbsp;&nbsp;of which opens (staging) | $(fmt3 "$LOAD_STAGEFS_OPEN_S") | |
| &nbsp;&nbsp;of which reads | $(fmt3 "$LOAD_STAGEFS_READ_S") | |
| baseline: \`rsync -aL\` snapshot to local disk | $RSYNC_S | $(mbps "$MODEL_BYTES" "$RSYNC_S") |
| baseline: then the same load from local disk | $(fmt3 "$LOAD_LOCAL_S") | |
| baseline total | $LOAD_RSYNC_TOTAL_S | $(mbps "$MODEL_BYTES" "$LOAD_RSYNC_TOTAL_S") |

- stagefs load / (rsync + local load): **$(ratio "$LOAD_STAGEFS_S" "$LOAD_RSYNC_TOTAL_S")**
- stagefs load throughput / raw link: $(ratio "$(mbps "$MODEL_BYTES" "$LOAD_STAGEFS_S")" "$RAW_MBPS")
- daemon counters: $LOAD_COUNTERS

## Daemon memory

| while | peak RSS (VmHWM) |
| --- | ---: |
| c. staging one shard (--no-prefetch) | $HWM_STAGE MiB |
${HWM_STAGE_PF:+| c. first open with prefetch (one shard plus prefetch copies) | $HWM_STAGE_PF MiB |
}| e. loading the whole model | $HWM_MODEL MiB |
$(warnings_section)
EOF
}

stage_pf_row() {
    [[ -n $STAGE_PF_S ]] || return 0
    echo "| c. stagefs default (prefetch on): \`open()\` of a cold shard | $STAGE_PF_S | $(mbps "$SHARD_BYTES" "$STAGE_PF_S") | $(ratio "$RAW_S" "$STAGE_PF_S") |"
}

warnings_section() {
    ((${#WARNINGS[@]})) || return 0
    printf '\n## Warnings\n\n'
    printf -- '- %s\n' "${WARNINGS[@]}"
}

main() {
    check_prerequisites
    build
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    setup_scratch
    generate_model
    start_netfs
    measure_raw_link
    measure_cp
    measure_stage
    measure_model_load
    measure_reads
    mkdir -p "$(dirname "$OUT")"
    report >"$OUT"
    if [[ -n ${SUDO_USER:-} ]]; then chown "$SUDO_USER:" "$OUT" 2>/dev/null || true; fi
    echo
    cat "$OUT"
    echo
    echo "written to $OUT"
}

main "$@"
