#!/usr/bin/env bash
# Boots the NFS test guest (tests/vm/build-guest.sh's kernel and initramfs) under
# qemu, with TCG: no KVM, which hangs at boot on some hosts and is not needed.
#
#     run-guest.sh SCRATCH [-- EXTRA QEMU ARGS...]
#
# The guest sees the host's root read-only over 9p (at the same paths, once its
# /init has chrooted into it) and SCRATCH writable at the same path; it runs
# SCRATCH/guest.sh, which the caller writes, as root and powers off. The guest's
# console goes to SCRATCH/console.log; /init leaves guest.sh's exit status in
# SCRATCH/guest-exit and the kernel's log in SCRATCH/dmesg.txt.
#
# The guest's network is qemu's user-mode one, restricted (no way out), with these
# forwards, each connection a `socat` run on the host:
#   10.0.2.100:2049 -> 127.0.0.1:$NFS_PORT  from a reserved port (the server takes
#                                           Linux clients only from one): `lowport`
#   10.0.2.10N:2049 -> 127.0.0.1:$NFS_PORTN for N in 2..9 (more exports), also from
#                      a reserved port
#   10.0.2.101:80   -> 127.0.0.1:$HUB_PORT  (a local Hub)
# each only when its variable is set.
# GUEST_TIMEOUT (seconds, default 420) bounds the whole run (the guest itself gives
# up on guest.sh 20 s before, saving its kernel log); GUEST_DIR names the
# kernel's directory (default target/nfs-guest). Exits with guest.sh's status, or
# 124 when the guest ran out of time, or 125 when it died without an exit status.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
scratch="${1:?usage: run-guest.sh SCRATCH [-- QEMU ARGS...]}"
shift
[ "${1:-}" = "--" ] && shift
scratch="$(cd "$scratch" && pwd)"
guest="${GUEST_DIR:-$root/target/nfs-guest}"
for file in vmlinuz initrd.cpio.gz; do
    [ -s "$guest/$file" ] || {
        echo "run-guest: $guest/$file is missing: run \`bash scripts/setup-tests.sh\` (or tests/vm/build-guest.sh) as root" >&2
        exit 2
    }
done
[ -f "$scratch/guest.sh" ] || { echo "run-guest: no $scratch/guest.sh" >&2; exit 2; }
# Both go on the kernel's command line and into qemu's options.
for path in "$scratch" "$root"; do
    case "$path" in
    *[[:space:],]*) echo "run-guest: $path: no spaces or commas, please" >&2; exit 2 ;;
    esac
done
rm -f "$scratch/guest-exit" "$scratch/dmesg.txt" "$scratch/console.log"

# In qemu's option syntax a comma inside a value is doubled.
net="user,id=n0,restrict=on"
if [ -n "${NFS_PORT:-}" ]; then
    net+=",guestfwd=tcp:10.0.2.100:2049-cmd:socat STDIO TCP:127.0.0.1:${NFS_PORT},,lowport"
fi
for n in 2 3 4 5 6 7 8 9; do
    var="NFS_PORT$n"
    if [ -n "${!var:-}" ]; then
        net+=",guestfwd=tcp:10.0.2.10$n:2049-cmd:socat STDIO TCP:127.0.0.1:${!var},,lowport"
    fi
done
if [ -n "${HUB_PORT:-}" ]; then
    net+=",guestfwd=tcp:10.0.2.101:80-cmd:socat STDIO TCP:127.0.0.1:${HUB_PORT}"
fi

limit="${GUEST_TIMEOUT:-420}"
# The guest gives up on guest.sh a little earlier, to save the kernel's log.
deadline=$((limit > 40 ? limit - 20 : limit / 2))
status=0
timeout --kill-after=10 "$limit" \
    qemu-system-x86_64 \
    -accel tcg,thread=multi -cpu max -smp 2 -m 2048 \
    -nographic -no-reboot -nodefaults -serial stdio -monitor none \
    -kernel "$guest/vmlinuz" -initrd "$guest/initrd.cpio.gz" \
    -append "console=ttyS0 panic=-1 quiet stagefs_scratch=$scratch stagefs_workspace=$root stagefs_deadline=$deadline" \
    -virtfs local,path=/,mount_tag=host,readonly=on,multidevs=remap,security_model=none \
    -virtfs "local,path=$scratch,mount_tag=scratch,security_model=none,multidevs=remap" \
    -netdev "$net" -device virtio-net-pci,netdev=n0,romfile= \
    "$@" \
    </dev/null >"$scratch/console.log" 2>&1 || status=$?
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    echo "run-guest: the guest ran out of its $limit s" >&2
    exit 124
fi
if [ "$(cat "$scratch/guest-exit" 2>/dev/null)" = timeout ]; then
    echo "run-guest: guest.sh ran past the guest's deadline ($deadline s); see $scratch/dmesg.txt" >&2
    exit 124
fi
if [ -s "$scratch/guest-exit" ]; then
    exit "$(cat "$scratch/guest-exit")"
fi
echo "run-guest: the guest left no exit status (qemu exited $status); see $scratch/console.log" >&2
exit 125
