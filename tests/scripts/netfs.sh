#!/usr/bin/env bash
# A real, bandwidth-capped network filesystem for tests and benchmarks:
# an sshd inside a private network namespace, reached over a veth pair and mounted
# on the host with sshfs. tbf caps each direction (netem is not available here).
#
#   netfs.sh up   ID EXPORT_DIR MOUNTPOINT RATE   # RATE as tc understands it: 200mbit, 1gbit
#                                                 # SSHFS_EXTRA_OPTS=cache=no adds sshfs options;
#                                                 # =contain_symlinks keeps sshfs's default
#   netfs.sh down ID MOUNTPOINT
#   netfs.sh cut ID        # the link goes dead: requests hang, as with a NAS gone away
#   netfs.sh restore ID
#   netfs.sh drop ID       # sshfs's ssh connection dies: sshfs exits and unmounts, and
#                          # the mount point is an empty directory of this disk again
#   netfs.sh kill ID       # sshfs is killed: the mount stays, answering ENOTCONN
#
# ID is a small number (1-250) that keeps concurrent instances apart; the namespace
# is sfs-ID and its addresses are 10.231.ID.1 (host) and 10.231.ID.2 (server), which
# exist only on the veth pair this script creates.
set -euo pipefail

cmd=${1:?usage: netfs.sh up|down ID ...}
id=${2:?missing ID}
ns="sfs-$id"
host_if="sfs${id}h"
peer_if="sfs${id}p"
host_ip="10.231.$id.1"
peer_ip="10.231.$id.2"
state="/tmp/stagefs-netfs-$id"

down() {
    local mnt
    mnt=$(realpath -m "$1")
    # A cut link would make anything that stats the mount hang: restore it, and find
    # the mount in the mount table instead of stat-ing it.
    ip link set "$host_if" up 2>/dev/null || true
    if grep -qs " $mnt fuse.sshfs " /proc/mounts; then
        fusermount3 -u -z "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
    fi
    # A lazily unmounted sshfs can linger; it is ours if it uses this state dir's key.
    pkill -f "IdentityFile=$state/client_key" 2>/dev/null || true
    if [[ -f $state/sshd.pid ]]; then
        kill "$(cat "$state/sshd.pid")" 2>/dev/null || true
    fi
    # sshd's session processes for a cut connection outlive sshd itself.
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip link del "$host_if" 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "$state"
}

up() {
    local export_dir mnt rate
    export_dir=$(realpath "$1")
    mnt=$2
    rate=$3
    down "$mnt"
    mkdir -p "$state" /run/sshd
    chmod 700 "$state"

    ip netns add "$ns"
    ip link add "$host_if" type veth peer name "$peer_if"
    ip link set "$peer_if" netns "$ns"
    ip addr add "$host_ip/30" dev "$host_if"
    ip link set "$host_if" up
    ip netns exec "$ns" ip addr add "$peer_ip/30" dev "$peer_if"
    ip netns exec "$ns" ip link set "$peer_if" up
    ip netns exec "$ns" ip link set lo up
    # Cap both directions: data flows server -> host, requests host -> server.
    local burst=256kb
    tc qdisc add dev "$host_if" root tbf rate "$rate" burst "$burst" latency 100ms
    ip netns exec "$ns" tc qdisc add dev "$peer_if" root tbf rate "$rate" burst "$burst" latency 100ms

    ssh-keygen -q -t ed25519 -N '' -f "$state/host_key"
    ssh-keygen -q -t ed25519 -N '' -f "$state/client_key"
    cp "$state/client_key.pub" "$state/authorized_keys"
    cat >"$state/sshd_config" <<CFG
ListenAddress $peer_ip
HostKey $state/host_key
AuthorizedKeysFile $state/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile $state/sshd.pid
Subsystem sftp internal-sftp
CFG
    # `ip netns exec` gives sshd a copy of this machine's mounts, made now: a
    # stagefs mount up at this moment (the NAS mounted again under a running mount)
    # would be held by that copy, so unmounting it would wait for sshd to exit.
    # The copy drops the FUSE and NFS mounts the export does not lie under; the
    # machine's own mounts are untouched.
    ip netns exec "$ns" sh -c '
        awk -v export="$1" "\$3 ~ /^(fuse|nfs)/ && index(export \"/\", \$2 \"/\") != 1 {print \$2}" /proc/self/mounts |
            while read -r held; do umount -l "$held" 2>/dev/null || true; done
        exec /usr/sbin/sshd -f "$2"' sh "$export_dir" "$state/sshd_config"

    mkdir -p "$mnt"
    # HF snapshots link to ../../blobs; newer sshfs refuses '..' links by default
    # (contain_symlinks). The server here is our own, so keep links verbatim.
    local links=""
    # (Not `sshfs -h | grep -q`: under pipefail, grep exiting early kills sshfs with
    # SIGPIPE and the test fails now and then.) SSHFS_EXTRA_OPTS=contain_symlinks
    # keeps sshfs's default, to test what users of a stock sshfs see.
    if grep -q contain_symlinks <<<"$(sshfs -h 2>&1)" &&
        [[ ,${SSHFS_EXTRA_OPTS:-}, != *,contain_symlinks,* ]]; then
        links=",no_contain_symlinks"
    fi
    local tries=0
    until sshfs "root@$peer_ip:$export_dir" "$mnt" \
        -o "ro$links${SSHFS_EXTRA_OPTS:+,$SSHFS_EXTRA_OPTS},IdentityFile=$state/client_key" \
        -o StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,LogLevel=ERROR \
        -o ConnectTimeout=5; do
        tries=$((tries + 1))
        if ((tries >= 10)); then
            echo "netfs: sshfs could not reach $peer_ip" >&2
            down "$mnt"
            exit 1
        fi
        sleep 0.3
    done
}

# Waits up to 5 s for this instance's sshfs to be gone, so that the caller's next
# step finds the mount unmounted (drop) or dead (kill).
sshfs_gone() {
    for _ in $(seq 100); do
        pgrep -f "^sshfs .*IdentityFile=$state/client_key" >/dev/null || return 0
        sleep 0.05
    done
    echo "netfs: sshfs is still there" >&2
    exit 1
}

case "$cmd" in
up) up "${3:?missing EXPORT_DIR}" "${4:?missing MOUNTPOINT}" "${5:?missing RATE}" ;;
down) down "${3:?missing MOUNTPOINT}" ;;
cut) ip link set "$host_if" down ;;
drop)
    pkill -f "^ssh .*IdentityFile=$state/client_key" || { echo "netfs: no ssh to drop" >&2; exit 1; }
    # sshfs unmounts as it exits.
    sshfs_gone
    ;;
kill)
    pkill -9 -f "^sshfs .*IdentityFile=$state/client_key" || { echo "netfs: no sshfs to kill" >&2; exit 1; }
    # Its mount answers ENOTCONN once the process is gone.
    sshfs_gone
    ;;
restore) ip link set "$host_if" up ;;
*) echo "usage: netfs.sh up|down|cut|restore|drop|kill ID ..." >&2; exit 2 ;;
esac
