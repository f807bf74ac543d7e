#!/usr/bin/env bash
# stagefs benchmark driver. Run as root on Linux:
#
#   sudo bash bench/run.sh                                   # 4 x 1G shards, 1gbit link
#   sudo SHARD_SIZE=64M RATE=200mbit bash bench/run.sh       # a quick run
#
# It builds stagefs and readbench, generates a synthetic sharded model, serves it as a
# real network filesystem (sshfs to an sshd in a private network namespace, capped
# with tc), and measures stagefs against baselines taken in the same run: the raw
# link, cp, rsync, and reads of the local cache files and of the network mount. The
# reads are measured on every path a loader can get: root with kernel passthrough,
# root without it (daemon or redirect), and an ordinary user's mount through
# fusermount3 (redirect, or the daemon with --no-redirect). It prints a summary and
# writes it as markdown to $OUT. bench/README.md explains every figure. Nothing here
# passes or fails on a number: it only measures and reports.
#
# Environment (all optional):
#   SHARD_SIZE  size of each of the 4 shards            (default 1G)
#   RATE        link cap, as tc spells it               (default 1gbit)
#   OUT         markdown summary file                   (default bench/last-run.md)
#   TOUCHES     random page touches per mmap run        (default 20000)
#   ROUNDS      rounds of the read measurements over every path; the report gives
#               medians and the range of the per-round ratios  (default 3)
#   SEED        seed of the page sequence               (default 42)
#   THREADS     pread threads                           (default 8)
#   CHUNK       largest pread                           (default 32M)
#   BENCH_TMPDIR  where the scratch dir goes; must be a real disk, not tmpfs, for
#               "local disk" to mean anything           (default /var/tmp)
#   NETFS_ID    netfs.sh instance id                    (default: a free one of 254-251, then 250 down)
#   BENCH_USER  the ordinary user of the unprivileged rows; created with useradd if
#               missing, and left in place                (default stagefs-bench)
#   BENCH_REV   what to call the stagefs revision when this tree is not a git
#               checkout (a `git archive` export)         (default unknown)
#   FAST_SOURCE set to 0 to skip the fast-source section (bench/fast-source.sh: a
#               tmpfs source, cp + sync vs staging, and a cold load vs a direct one)
#   FAST_SIZE   size in MiB of that section's file          (default 1200)
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
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-8}
CHUNK=${CHUNK:-32M}
BENCH_TMPDIR=${BENCH_TMPDIR:-/var/tmp}
BENCH_USER=${BENCH_USER:-stagefs-bench}
FAST_SOURCE=${FAST_SOURCE:-1}
FAST_SIZE=${FAST_SIZE:-1200}
COMMAND="SHARD_SIZE=$SHARD_SIZE RATE=$RATE TOUCHES=$TOUCHES ROUNDS=$ROUNDS SEED=$SEED THREADS=$THREADS CHUNK=$CHUNK FAST_SOURCE=$FAST_SOURCE FAST_SIZE=$FAST_SIZE OUT=$OUT bash bench/run.sh"
FAST_REPORT=""
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
    for tool in sshfs /usr/sbin/sshd ssh-keygen rsync ip tc fusermount3 mountpoint dd awk setpriv useradd; do
        command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
    if ((${#missing[@]})); then
        die "missing: ${missing[*]}. Install them with:
    apt-get install -y sshfs openssh-server rsync iproute2 fuse3 util-linux passwd"
    fi
    [[ -u $(command -v fusermount3) ]] ||
        die "$(command -v fusermount3) is not setuid root, so an ordinary user cannot mount (reinstall fuse3)"
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
# The mount the running daemon serves, its log, and whether the ordinary user made it.
CUR_MNT=""
CUR_LOG=""
CUR_USER=""
CUR_DESC=""
# Who runs readbench, first opens and `stagefs status`: nobody (root itself) or the
# ordinary user (AS_USER, set by setup_user), with the binaries that one can run.
RUNNER=()
AS_USER=()
RB=""
RUN_STAGEFS=""
# The round of the read measurements under way (1 outside them).
ROUND=1

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
    # A user's mount left behind by an interrupted start (the daemon pid not yet known).
    if [[ -n ${UMNT:-} ]] && is_mounted "$UMNT"; then
        fusermount3 -u -z "$UMNT" 2>/dev/null || umount -l "$UMNT" 2>/dev/null
    fi
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
    RB=$READBENCH
    RUN_STAGEFS=$STAGEFS
}

# The ordinary user of the unprivileged rows, set up as on a desktop: an account with
# no capabilities (created once, idempotently, and left in place), /dev/fuse 0666 as
# desktop distributions ship it (left so: integration tests running alongside may rely
# on it), and the setuid fusermount3 (checked with the prerequisites). The user mounts
# the local export (it can read neither root's sshfs mount nor root's 0700 caches) with
# its own HOME, cache and mountpoint under $T/user, and runs copies of the binaries.
setup_user() {
    log "the ordinary user of the unprivileged rows: $BENCH_USER"
    if ! id -u "$BENCH_USER" >/dev/null 2>&1; then
        useradd --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
            --user-group --comment "stagefs benchmark (bench/run.sh)" "$BENCH_USER" ||
            die "useradd $BENCH_USER failed"
        echo "run.sh: created user $BENCH_USER (it stays; remove it with userdel $BENCH_USER)" >&2
    fi
    local uid gid
    uid=$(id -u "$BENCH_USER")
    gid=$(id -g "$BENCH_USER")
    ((uid != 0)) || die "BENCH_USER=$BENCH_USER is root, not an ordinary user"
    if [[ $(stat -c %a /dev/fuse) != 666 ]]; then
        echo "run.sh: chmod 666 /dev/fuse (as desktop distributions ship it); it stays so" >&2
        chmod 666 /dev/fuse
    fi
    # $T is 0700 from mktemp: let the user through it (not list it) to the export.
    chmod 0711 "$T"
    install -d -o "$uid" -g "$gid" -m 0700 "$T/user" "$T/user/home" "$T/user/mnt"
    U_HOME="$T/user/home"
    UMNT="$T/user/mnt"
    UCACHE="$T/user/cache"
    # The build may live where the user cannot go (a home under /root).
    install -d -m 0755 "$T/bin"
    install -m 0755 "$STAGEFS" "$READBENCH" "$T/bin/"
    U_STAGEFS="$T/bin/stagefs"
    U_READBENCH="$T/bin/readbench"
    # setpriv execs (the pid stays the daemon's, for VmHWM); a uid change from root
    # clears every capability, so the user has none, as on a desktop.
    AS_USER=(setpriv "--reuid=$uid" "--regid=$gid" --init-groups --
        env -i -C "$U_HOME" "HOME=$U_HOME" "USER=$BENCH_USER" "LOGNAME=$BENCH_USER"
        PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8)
    local rel
    for rel in "${SHARD_REL[@]}"; do
        "${AS_USER[@]}" test -r "$T/export/$rel" || die "$BENCH_USER cannot read $T/export/$rel"
    done
    "${AS_USER[@]}" "$U_STAGEFS" --version >/dev/null || die "$BENCH_USER cannot run $U_STAGEFS"
}

# Subsequent readbench runs, first opens and status queries run as root.
as_root() {
    RUNNER=()
    RB=$READBENCH
    RUN_STAGEFS=$STAGEFS
}

# ... or as the ordinary user.
as_user() {
    RUNNER=("${AS_USER[@]}")
    RB=$U_READBENCH
    RUN_STAGEFS=$U_STAGEFS
}

# Whether something is mounted at $1 (from the mount table: root cannot even stat a
# user's FUSE mount made without allow_other).
is_mounted() {
    awk -v m="$1" '$2 == m { found = 1 } END { exit !found }' /proc/mounts
}

# Starts a stagefs mount of the sshfs source at $MNT, as root, in the foreground as a
# child, so its pid (for VmHWM) is $!, and waits until the mount is live.
start_stagefs() {
    local cache=$1
    shift
    CUR_MNT=$MNT CUR_LOG="$T/logs/stagefs.log" CUR_USER=""
    CUR_DESC="root's mount on ${cache#"$T/"}${*:+ with $*}"
    "$STAGEFS" mount "$SRC" "$MNT" --cache-dir "$cache" --foreground "$@" \
        >>"$CUR_LOG" 2>&1 &
    DAEMON_PID=$!
    wait_mounted
}

# The same as the ordinary user, of the local export at $UMNT: the mount goes through
# the setuid fusermount3, without passthrough (no capability), as on a desktop.
start_user_stagefs() {
    local cache=$1
    shift
    CUR_MNT=$UMNT CUR_LOG="$T/logs/stagefs-user.log" CUR_USER=1
    CUR_DESC="$BENCH_USER's mount on ${cache#"$T/"}${*:+ with $*}"
    "${AS_USER[@]}" "$U_STAGEFS" mount "$T/export" "$UMNT" --cache-dir "$cache" --foreground "$@" \
        >>"$CUR_LOG" 2>&1 &
    DAEMON_PID=$!
    wait_mounted
}

wait_mounted() {
    local i
    for i in $(seq 600); do
        is_mounted "$CUR_MNT" && return 0
        kill -0 "$DAEMON_PID" 2>/dev/null || break
        sleep 0.1
    done
    tail -n 20 "$CUR_LOG" >&2
    die "stagefs mount at $CUR_MNT did not come up (log above)"
}

# Unmounts and reaps the daemon. A daemon that outlives its mount is noted in the
# report and, after a bounded wait, killed: the benchmark must always finish.
stop_stagefs() {
    [[ -n $DAEMON_PID ]] || return 0
    if is_mounted "$CUR_MNT"; then
        if [[ -n $CUR_USER ]]; then
            # As the user would: through the setuid helper.
            "${AS_USER[@]}" fusermount3 -u "$CUR_MNT" >>"$CUR_LOG" 2>&1 ||
                fusermount3 -u -z "$CUR_MNT" >>"$CUR_LOG" 2>&1 || true
        else
            "$STAGEFS" unmount "$CUR_MNT" >>"$CUR_LOG" 2>&1 ||
                "$STAGEFS" unmount --lazy "$CUR_MNT" >>"$CUR_LOG" 2>&1 || true
        fi
    fi
    if ! wait_exit 30; then
        WARNINGS+=("the daemon of $CUR_DESC (pid $DAEMON_PID) was still running 30 s after its unmount ($(daemon_state)); sent SIGTERM")
        kill -TERM "$DAEMON_PID" 2>/dev/null || true
        if ! wait_exit 10; then
            WARNINGS+=("the daemon of $CUR_DESC (pid $DAEMON_PID) ignored SIGTERM for 10 s ($(daemon_state)); sent SIGKILL")
            kill -KILL "$DAEMON_PID" 2>/dev/null || true
        fi
    fi
    wait "$DAEMON_PID" 2>/dev/null || true
    DAEMON_PID=""
}

# What a daemon that does not exit is doing: whether its mount is still there, where
# its threads wait in the kernel, and its last log line.
daemon_state() {
    local waits last
    waits=$(for f in /proc/"$DAEMON_PID"/task/*/wchan; do cat "$f" 2>/dev/null && echo; done |
        awk '{ n[$0 == "0" || $0 == "" ? "running" : $0]++ } END { for (w in n) printf "%s%s x%d", (i++ ? ", " : ""), w, n[w] }')
    last=$(grep -v '^$' "$CUR_LOG" 2>/dev/null | tail -n 1 | cut -c1-300)
    printf 'mount %s; threads: %s; last log line: %s' \
        "$(is_mounted "$CUR_MNT" && echo "still mounted" || echo gone)" "${waits:-n/a}" "${last:-none}"
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
    counters_text "$(counters "$1")"
}

# The counters of the mount running on cache $1 as six numbers: copies, hits,
# passthrough opens, daemon opens, daemon reads, redirects (readlink answers pointing
# into the cache); nothing if the mount does not answer.
COUNTER_KEYS=(stage_copies stage_hits passthrough_opens daemon_opens daemon_reads redirects)
counters() {
    local json
    json=$("${RUNNER[@]}" "$RUN_STAGEFS" status --cache-dir "$1" --json 2>/dev/null) || return 0
    local key vals=()
    for key in "${COUNTER_KEYS[@]}"; do vals+=("$(jnum "$key" <<<"$json")"); done
    echo "${vals[*]}"
}

# What the counters $2 (after) gained over $1 (before); empty if either is missing.
counters_delta() {
    [[ -n $1 && -n $2 ]] || return 0
    awk -v a="$1" -v b="$2" 'BEGIN {
        n = split(a, x, " "); split(b, y, " ");
        for (i = 1; i <= n; i++) printf "%s%d", (i > 1 ? " " : ""), y[i] - x[i]; print "" }'
}

counters_text() {
    [[ -n $1 ]] || {
        echo "n/a"
        return
    }
    local c
    read -r -a c <<<"$1"
    printf 'copies %s, hits %s, passthrough opens %s, daemon opens %s, daemon reads %s, redirects %s' \
        "${c[0]}" "${c[1]}" "${c[2]}" "${c[3]}" "${c[4]}" "${c[5]}"
}

# Waits (up to 2 minutes) until the mount on cache $1 copies nothing more (the first
# open's prefetch of the snapshot's other files), then past the kernel's 1 s entry
# timeout, so that the next lookups see what the mount now presents.
settle() {
    local i json
    for i in $(seq 240); do
        json=$("${RUNNER[@]}" "$RUN_STAGEFS" status --cache-dir "$1" --json 2>/dev/null) || break
        grep -q '"in_flight": *\[\]' <<<"$json" && break
        sleep 0.5
    done
    sleep 1.5
}

# ---------------------------------------------------------------- measuring helpers

drop_caches() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
}

now() { date +%s.%N; }

# The share of all CPUs busy over one second, as "12%". Sampled while nothing of this
# run is running, it is what else the machine is doing; the load average is no
# measure of that, as it also counts tasks blocked in I/O (or hung on a dead mount).
cpu_busy() {
    local a b
    # /proc/stat cpu: user nice system idle iowait irq softirq steal ...
    a=$(awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6 }' /proc/stat)
    sleep 1
    b=$(awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6 }' /proc/stat)
    awk -v a="$a" -v b="$b" 'BEGIN {
        split(a, x, " "); split(b, y, " "); busy = y[1] - x[1]; all = busy + y[2] - x[2];
        printf "%.0f%%", (all > 0 ? 100 * busy / all : 0) }'
}

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

# Runs readbench (as RUNNER), keeps its JSON in $1 and echoes it to the log.
readbench_json() {
    local out=$1
    shift
    "${RUNNER[@]}" "$RB" "$@" >"$out"
    cat "$out" >&2
}

# d. The read patterns, each from a cold page cache, on one set of files, keeping
# readbench's JSON as $T/logs/<pattern>-<NAME>-<ROUND>.json for the report:
# pread (MLX-like), mmap (random page touches) and the warm whole-model load
# (`readbench cold-open` of files that are staged already).
pread_pattern() {
    local name=$1
    shift
    drop_caches
    readbench_json "$T/logs/pread-$name-$ROUND.json" pread --threads "$THREADS" --chunk "$CHUNK" "$@"
}

mmap_pattern() {
    local name=$1
    shift
    drop_caches
    readbench_json "$T/logs/mmap-$name-$ROUND.json" mmap --touches "$TOUCHES" --seed "$SEED" "$@"
}

warm_load() {
    local name=$1
    shift
    drop_caches
    readbench_json "$T/logs/warm-$name-$ROUND.json" cold-open "$@"
}

read_patterns() {
    pread_pattern "$@"
    mmap_pattern "$@"
}

# A fresh mount checks each staged copy the first time it serves it (a copy untouched
# since it was hashed is trusted; a touched one is re-hashed, which reads the whole
# file); a file not staged yet is staged by its first open. Those first opens are
# timed here, from a cold cache and as RUNNER, so that the read patterns afterwards
# (caches dropped again) measure the read path alone; sets <NAME>_FIRST_OPEN_S_<ROUND>.
first_opens() {
    local name=$1
    shift
    drop_caches
    local t0
    t0=$(now)
    "${RUNNER[@]}" sh -c 'for f do : <"$f" || exit 1; done' sh "$@"
    printf -v "${name}_FIRST_OPEN_S_$ROUND" '%s' "$(since "$t0")"
}

# d. One mounted path: mounts (WHO root: the sshfs source at $MNT; WHO user: the
# local export at $UMNT as the ordinary user) on CACHE with FLAGS, opens the shards
# once, lets the mount settle, then runs pread, mmap and the warm load as WHO. The
# counters are read around each run, so the report shows what served each one:
# <NAME>_C_{FIRST,PREAD,MMAP,WARM}_<ROUND> (six numbers, see counters).
measure_mount() {
    local name=$1 who=$2 cache=$3
    shift 3
    if [[ $who == user ]]; then
        as_user
        start_user_stagefs "$cache" "$@"
    else
        as_root
        start_stagefs "$cache" "$@"
    fi
    local files=() rel
    for rel in "${SHARD_REL[@]}"; do files+=("$CUR_MNT/$rel"); done
    local c0 c1 c2 c3 c4
    c0=$(counters "$cache")
    first_opens "$name" "${files[@]}"
    settle "$cache"
    c1=$(counters "$cache")
    pread_pattern "$name" "${files[@]}"
    c2=$(counters "$cache")
    mmap_pattern "$name" "${files[@]}"
    c3=$(counters "$cache")
    warm_load "$name" "${files[@]}"
    c4=$(counters "$cache")
    stop_stagefs
    as_root
    printf -v "${name}_C_FIRST_$ROUND" '%s' "$(counters_delta "$c0" "$c1")"
    printf -v "${name}_C_PREAD_$ROUND" '%s' "$(counters_delta "$c1" "$c2")"
    printf -v "${name}_C_MMAP_$ROUND" '%s' "$(counters_delta "$c2" "$c3")"
    printf -v "${name}_C_WARM_$ROUND" '%s' "$(counters_delta "$c3" "$c4")"
}

# Checks that the pread, mmap and warm-load runs of mount row $1 in this round took
# path $2 (passthrough, daemon or redirect) by the counters, and warns if one did not.
check_path() {
    local name=$1 path=$2 label=$3 phase var c
    for phase in PREAD MMAP WARM; do
        var="${name}_C_${phase}_$ROUND"
        c=${!var}
        if [[ -z $c ]]; then
            WARNINGS+=("$label, round $ROUND: no counters for the ${phase,,} run (the mount did not answer status)")
            continue
        fi
        local -a num
        read -r -a num <<<"$c"
        # num: copies hits passthrough_opens daemon_opens daemon_reads redirects
        local ok=1
        case $path in
            passthrough) ((num[2] > 0 && num[4] == 0 && num[5] == 0)) || ok="" ;;
            daemon) ((num[4] > 0 && num[2] == 0 && num[5] == 0)) || ok="" ;;
            redirect) ((num[5] > 0 && num[2] == 0 && num[3] == 0 && num[4] == 0)) || ok="" ;;
        esac
        ((num[0] == 0)) || ok=""
        [[ -n $ok ]] || WARNINGS+=("$label, round $ROUND: the ${phase,,} run did not take the $path path only ($(counters_text "$c"))")
    done
}

# Sets COPIES to the copies of the shards in cache $1, in shard order. The store names
# an LFS blob's copy by the blob's sha256, which is the name the snapshot link points
# at; listing them in shard order makes the mmap run touch the same pages of the same
# shards as on the other paths.
staged_copies() {
    local cache=$1 rel blob f
    COPIES=()
    for rel in "${SHARD_REL[@]}"; do
        blob=$(readlink "$T/export/$rel")
        f="$cache/v1/data/sha256-${blob##*/}"
        [[ -f $f ]] || die "no staged copy of $rel at $f (has the store's naming changed?)"
        COPIES+=("$f")
    done
}

# The number of extents of each file (filefrag), "n/a" without filefrag: the two sets of
# local copies are different files, and a fragmented copy reads slower from disk.
extents() {
    if ! command -v filefrag >/dev/null 2>&1; then
        echo "n/a"
        return
    fi
    local f out=""
    for f in "$@"; do
        out+="${out:+, }$(filefrag "$f" 2>/dev/null | awk '{ print $(NF - 2) }')"
    done
    echo "$out"
}

# d. Every path, ROUNDS times over, interleaved (each round measures every path once,
# its local baselines included), so that a slow spell of this machine or its disk
# lands on all paths alike and every path is compared with baselines measured minutes
# apart at most. sshfs is measured once, at the end: its pread alone takes a minute.
measure_reads() {
    local rel sshfs=() cached=() ucached=()
    for rel in "${SHARD_REL[@]}"; do sshfs+=("$SRC/$rel"); done
    staged_copies "$MODEL_CACHE"
    cached=("${COPIES[@]}")
    local r
    for r in $(seq "$ROUNDS"); do
        ROUND=$r
        printf -v "ROUND_BUSY_$r" '%s' "$(cpu_busy)"

        log "d. round $r/$ROUNDS: reads as root through stagefs with passthrough"
        measure_mount PT root "$MODEL_CACHE"
        check_path PT passthrough "root, passthrough"

        log "d. round $r/$ROUNDS: reads as root through stagefs --no-passthrough --no-redirect (the daemon)"
        measure_mount DAEMON root "$MODEL_CACHE" --no-passthrough --no-redirect
        check_path DAEMON daemon "root, daemon"

        log "d. round $r/$ROUNDS: reads as root through stagefs --no-passthrough (redirect)"
        measure_mount RDR root "$MODEL_CACHE" --no-passthrough
        check_path RDR redirect "root, redirect"

        log "d. round $r/$ROUNDS: reads of root's local cache files"
        as_root
        read_patterns LOCAL "${cached[@]}"
        warm_load LOCAL "${cached[@]}"

        # In the first round the user's first opens stage the shards from the local
        # export into the user's own cache; the read patterns then read those copies.
        log "d. round $r/$ROUNDS: reads as $BENCH_USER through a fusermount3 mount (redirect, the default)"
        measure_mount UR user "$UCACHE"
        check_path UR redirect "$BENCH_USER, redirect"

        log "d. round $r/$ROUNDS: reads as $BENCH_USER through a fusermount3 mount with --no-redirect (the daemon)"
        measure_mount UNR user "$UCACHE" --no-redirect
        check_path UNR daemon "$BENCH_USER, daemon"

        log "d. round $r/$ROUNDS: reads of $BENCH_USER's local cache files, as $BENCH_USER"
        staged_copies "$UCACHE"
        ucached=("${COPIES[@]}")
        if ((r == 1)); then
            EXTENTS_ROOT=$(extents "${cached[@]}")
            EXTENTS_USER=$(extents "${ucached[@]}")
        fi
        as_user
        read_patterns ULOCAL "${ucached[@]}"
        warm_load ULOCAL "${ucached[@]}"
        as_root
    done

    ROUND=1
    log "d. reads straight from sshfs"
    read_patterns SSHFS "${sshfs[@]}"
}

# One figure of path NAME in round R, from readbench's JSON: SPEC is PATTERN:KEY
# (pread:mbps is computed from bytes and seconds); nothing if it was not measured.
figure() {
    local name=$1 r=$2 spec=$3
    local f="$T/logs/${spec%%:*}-$name-$r.json" key=${spec#*:}
    [[ -f $f ]] || return 0
    if [[ $key == mbps ]]; then
        mbps "$(jnum total_bytes <"$f")" "$(jnum seconds <"$f")"
    else
        jnum "$key" <"$f"
    fi
}

# The median of the numbers given; nothing if none.
median() {
    (($#)) || return 0
    printf '%s\n' "$@" | sort -g |
        awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# The median over the rounds of figure SPEC of path NAME.
med() {
    local name=$1 spec=$2 r v vals=()
    for r in $(seq "$ROUNDS"); do
        v=$(figure "$name" "$r" "$spec")
        if [[ -n $v ]]; then vals+=("$v"); fi
    done
    median "${vals[@]}"
}

# NAME's figure SPEC over BASE's, one ratio per round in which both were measured.
round_ratios() {
    local name=$1 base=$2 spec=$3 r a b
    for r in $(seq "$ROUNDS"); do
        a=$(figure "$name" "$r" "$spec")
        b=$(figure "$base" "$r" "$spec")
        if [[ -n $a && -n $b ]]; then
            awk -v a="$a" -v b="$b" 'BEGIN { if (b + 0 != 0) printf "%.4f\n", a / b }'
        fi
    done
}

# The median of the per-round ratios, with their range when there are several:
# "0.98 (0.91-1.03)"; "n/a" when there are none.
ratio_cell() {
    local vals=()
    mapfile -t vals < <(round_ratios "$@")
    if ((${#vals[@]} == 0)); then
        echo "n/a"
        return
    fi
    local m
    m=$(median "${vals[@]}")
    if ((${#vals[@]} == 1)); then
        printf '%.2f\n' "$m"
        return
    fi
    printf '%.2f (%s)\n' "$m" "$(printf '%s\n' "${vals[@]}" | sort -g |
        awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.2f–%.2f", lo, hi }')"
}

# ---------------------------------------------------------------- the report

report() {
    local mem cpu rev
    mem=$(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)
    cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
    rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "${BENCH_REV:-unknown}")
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
| other activity | CPU busy (both cores, 1 s sample while nothing of this run ran) $BUSY_AT_START before the build, $BUSY_AT_END at the end; load average at the end $(cut -d' ' -f1-3 /proc/loadavg) |

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
warm load: \`readbench cold-open\` of the $SHARDS shards, already staged: open and read each in order.
The page cache is dropped before each of them.

Root mounts the sshfs source and reads as root. $BENCH_USER (uid $(id -u "$BENCH_USER"), no capabilities) mounts
the same tree from the local export through fusermount3, with its own cache, and reads as itself (it can
read neither root's sshfs mount nor root's caches); its first opens stage the shards into its cache.

Every path but sshfs was measured in $ROUNDS interleaved round(s), each round measuring every path once;
figures are medians over the rounds. CPU busy at the start of each round, while nothing of this run ran: $(round_busy).
sshfs was measured once, after the rounds.

| path | pread MB/s | worst pread ms | p99 pread ms | touches/s | worst fault ms | p99 fault ms | warm load s | warm load MB/s |
| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |
$(read_row PT "root, passthrough")
$(read_row DAEMON "root, daemon (\`--no-passthrough --no-redirect\`)")
$(read_row RDR "root, redirect (\`--no-passthrough\`)")
$(read_row LOCAL "root's local cache files")
$(read_row UR "$BENCH_USER, redirect (fusermount3 mount, the default)")
$(read_row UNR "$BENCH_USER, daemon (fusermount3 mount, \`--no-redirect\`)")
$(read_row ULOCAL "$BENCH_USER's local cache files")
$(read_row SSHFS "sshfs directly")

Extents of the shards' copies (filefrag): root's $EXTENTS_ROOT; $BENCH_USER's $EXTENTS_USER.

Ratios to the local cache files the path reads (root's for the root rows and sshfs, $BENCH_USER's for
$BENCH_USER's rows), each against the baseline of the same round: the median over the rounds, and in
brackets the lowest and highest round. Throughput: higher is better; latency and load time: lower is better.

| path | pread throughput | p99 pread | worst pread | touches/s | p99 fault | worst fault | warm load time |
| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |
$(ratio_row PT LOCAL "root, passthrough")
$(ratio_row DAEMON LOCAL "root, daemon (\`--no-passthrough --no-redirect\`)")
$(ratio_row RDR LOCAL "root, redirect (\`--no-passthrough\`)")
$(ratio_row UR ULOCAL "$BENCH_USER, redirect (fusermount3 mount)")
$(ratio_row UNR ULOCAL "$BENCH_USER, daemon (fusermount3 mount, \`--no-redirect\`)")
$(ratio_row ULOCAL LOCAL "$BENCH_USER's local cache files / root's")
$(ratio_row SSHFS LOCAL "sshfs directly (against round 1)")

First open of the $SHARDS shards after a fresh mount, cold page cache, round 1 (a copy untouched since it was
hashed is trusted; a shard not staged yet is staged): root, passthrough ${PT_FIRST_OPEN_S_1} s; root, daemon
${DAEMON_FIRST_OPEN_S_1} s; root, redirect ${RDR_FIRST_OPEN_S_1} s; $BENCH_USER, redirect ${UR_FIRST_OPEN_S_1} s
(this one stages the shards from the local export: $(mbps "$MODEL_BYTES" "$UR_FIRST_OPEN_S_1") MB/s$(later_first_opens UR)); $BENCH_USER, daemon
${UNR_FIRST_OPEN_S_1} s. The reads come after those first opens and another cache drop; opening the
$SHARDS shards again before the preads took $(pread_opens PT) s, $(pread_opens DAEMON) s, $(pread_opens RDR) s, $(pread_opens UR) s and
$(pread_opens UNR) s (medians), in the same order.

What served each run, from the mount's counters (\`stagefs status --json\`) read before and after it, in
round 1: passthrough opens and no daemon reads for passthrough; daemon reads for the daemon; redirects
(readlinks answered with a link into the cache) and no daemon open or read for a redirect. Every round
is checked the same way; a run that took another path is listed under Warnings.

| path | run | copies | hits | passthrough opens | daemon opens | daemon reads | redirects |
| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |
$(counter_rows PT "root, passthrough")
$(counter_rows DAEMON "root, daemon")
$(counter_rows RDR "root, redirect")
$(counter_rows UR "$BENCH_USER, redirect")
$(counter_rows UNR "$BENCH_USER, daemon")

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

# | $1 | $2 | ... |
table_row() {
    local row="| $1 |" cell
    shift
    for cell in "$@"; do row+=" $cell |"; done
    echo "$row"
}

# A row of the reads table for path NAME: medians over the rounds.
read_row() {
    local n=$1 label=$2 warm
    warm=$(med "$n" warm:total_s)
    local cells=(
        "$(fmt1 "$(med "$n" pread:mbps)")"
        "$(fmt1 "$(med "$n" pread:worst_pread_ms)")"
        "$(fmt1 "$(med "$n" pread:p99_pread_ms)")"
        "$(fmt1 "$(med "$n" mmap:touches_per_s)")"
        "$(fmt3 "$(med "$n" mmap:worst_fault_ms)")"
        "$(fmt3 "$(med "$n" mmap:p99_fault_ms)")"
    )
    if [[ -n $warm ]]; then
        cells+=("$(fmt3 "$warm")" "$(mbps "$MODEL_BYTES" "$warm")")
    else
        cells+=("–" "–")
    fi
    table_row "$label" "${cells[@]}"
}

# A row of the ratio table: path NAME against baseline BASE, round by round.
ratio_row() {
    local n=$1 b=$2 label=$3 warm="–"
    if [[ -n $(med "$n" warm:total_s) ]]; then warm=$(ratio_cell "$n" "$b" warm:total_s); fi
    table_row "$label" \
        "$(ratio_cell "$n" "$b" pread:mbps)" \
        "$(ratio_cell "$n" "$b" pread:p99_pread_ms)" \
        "$(ratio_cell "$n" "$b" pread:worst_pread_ms)" \
        "$(ratio_cell "$n" "$b" mmap:touches_per_s)" \
        "$(ratio_cell "$n" "$b" mmap:p99_fault_ms)" \
        "$(ratio_cell "$n" "$b" mmap:worst_fault_ms)" \
        "$warm"
}

# The counter rows of mount path NAME in round 1: first opens, pread, mmap, warm load.
counter_rows() {
    local n=$1 label=$2 phase v c
    for phase in FIRST:"first opens" PREAD:pread MMAP:mmap WARM:"warm load"; do
        v="${n}_C_${phase%%:*}_1"
        c=${!v:-}
        if [[ -z $c ]]; then
            echo "| $label | ${phase#*:} | n/a | n/a | n/a | n/a | n/a | n/a |"
        else
            echo "| $label | ${phase#*:} | ${c// / | } |"
        fi
    done
}

# The median time of the opens before the preads of path NAME.
pread_opens() {
    fmt3 "$(med "$1" pread:open_seconds)"
}

# ", remounted in later rounds: X s" for path NAME when there were later rounds.
later_first_opens() {
    local r v vals=()
    for r in $(seq 2 "$ROUNDS"); do
        v="${1}_FIRST_OPEN_S_$r"
        vals+=("${!v}")
    done
    ((${#vals[@]})) || return 0
    printf '; after a remount in the later rounds: %s s, median' "$(fmt3 "$(median "${vals[@]}")")"
}

# The CPU busy share sampled at the start of each round.
round_busy() {
    local r v out=""
    for r in $(seq "$ROUNDS"); do
        v="ROUND_BUSY_$r"
        out+="${out:+, }${!v}"
    done
    echo "$out"
}

# A warning when other work kept the CPUs busy (20% or more in a sample taken while
# nothing of this run ran): the figures are then not those of a quiet machine.
busy_warning() {
    local samples=("$BUSY_AT_START") r v
    for r in $(seq "$ROUNDS"); do
        v="ROUND_BUSY_$r"
        samples+=("${!v:-0%}")
    done
    samples+=("$BUSY_AT_END")
    local high
    high=$(printf '%s\n' "${samples[@]}" | tr -d % | awk '$1 >= 20 { n++ } END { print n + 0 }')
    if ((high > 0)); then
        WARNINGS+=("the machine was not quiet: other work kept the CPUs busy in $high of ${#samples[@]} samples taken while nothing of this run ran (${samples[*]}); the figures carry that noise")
    fi
}

warnings_section() {
    ((${#WARNINGS[@]})) || return 0
    printf '\n## Warnings\n\n'
    printf -- '- %s\n' "${WARNINGS[@]}"
}

# A tmpfs as the source, where the copy itself is the bottleneck: the same rounds as
# `bash bench/fast-source.sh`, with the binaries built above.
measure_fast_source() {
    [[ $FAST_SOURCE != 0 ]] || return 0
    log "fast source: cp + sync vs staging, and a cold load, from a tmpfs ($FAST_SIZE MiB, $ROUNDS rounds)"
    FAST_REPORT=$(SIZE=$FAST_SIZE ROUNDS=$ROUNDS BENCH_TMPDIR=$BENCH_TMPDIR STAGEFS=$STAGEFS \
        READBENCH=$READBENCH bash "$ROOT/bench/fast-source.sh")
}

main() {
    check_prerequisites
    [[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive number, not '$ROUNDS'"
    BUSY_AT_START=$(cpu_busy)
    build
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    setup_scratch
    generate_model
    setup_user
    start_netfs
    measure_raw_link
    measure_cp
    measure_stage
    measure_model_load
    measure_reads
    measure_fast_source
    BUSY_AT_END=$(cpu_busy)
    busy_warning
    mkdir -p "$(dirname "$OUT")"
    report >"$OUT"
    if [[ -n $FAST_REPORT ]]; then
        printf '\n## Staging from a fast source\n%s\n' "$FAST_REPORT" >>"$OUT"
    fi
    if [[ -n ${SUDO_USER:-} ]]; then chown "$SUDO_USER:" "$OUT" 2>/dev/null || true; fi
    echo
    cat "$OUT"
    echo
    echo "written to $OUT"
}

main "$@"
