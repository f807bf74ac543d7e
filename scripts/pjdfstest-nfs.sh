#!/usr/bin/env bash
# Runs the pjdfstest POSIX conformance suite (see scripts/pjdfstest.sh) through the NFS
# backend as a Linux kernel client mounts it: `stagefs serve` of a scratch source on
# this machine, mounted by the test guest (tests/vm/, built by scripts/setup-tests.sh)
# with the options stagefs's own Linux NFS mounts use, and the suite run there as
# root. Prints the failed test files and subtests.
#
#   scripts/pjdfstest-nfs.sh PJDFSTEST_DIR
#
# STAGEFS (default target/debug/stagefs) is the binary. WORK (default a new directory
# under target/, which the guest sees; its own /tmp is a tmpfs) keeps the source, the
# cache, the guest's console and the prove log. GUEST_TIMEOUT bounds the run (default
# 3600 s: the suite starts some 9,000 processes, slow under TCG).
set -euo pipefail
pjd=$(realpath "${1:?usage: $0 PJDFSTEST_DIR}")
root=$(cd "$(dirname "$0")/.." && pwd)
stagefs=$(realpath "${STAGEFS:-$root/target/debug/stagefs}")
mkdir -p "$root/target"
work=${WORK:-$(mktemp -d "$root/target/pjdfstest-nfs-XXXXXX")}
mkdir -p "$work/src" "$work/scratch"
chmod 755 "$work" "$work/src"

"$stagefs" --no-config serve "$work/src" --cache-dir "$work/cache" --min-free 64M \
    >"$work/serve.out" 2>"$work/serve.log" &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
    grep -q nfsport "$work/serve.out" 2>/dev/null && break
    sleep 0.1
done
port=$(grep -o 'nfsport=[0-9]*' "$work/serve.out" | head -1 | cut -d= -f2)
[ -n "$port" ] || { echo "pjdfstest-nfs: stagefs serve did not start:" >&2; cat "$work/serve.log" >&2; exit 1; }

cat >"$work/scratch/guest.sh" <<EOF
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
mkdir -p /tmp/nfs
opts=vers=3,tcp,port=2049,mountport=2049,rsize=1048576,wsize=1048576,actimeo=1,hard,local_lock=all,mountproto=tcp,addr=10.0.2.100
mount -i -t nfs -o "\$opts" 10.0.2.100:/ /tmp/nfs || exit 3
mkdir /tmp/nfs/run && cd /tmp/nfs/run || exit 4
prove -r "$pjd/tests" >"$work/scratch/prove.log" 2>&1
echo "prove exited \$?"
EOF
NFS_PORT=$port GUEST_TIMEOUT=${GUEST_TIMEOUT:-3600} bash "$root/tests/vm/run-guest.sh" "$work/scratch" || true

log=$work/scratch/prove.log
# A file listed with no failed subtest only passed a TODO: not a failure.
files=$(grep -E '^/.*\.t +\(' "$log" | grep -cvE 'Wstat: 0 Tests: [0-9]+ Failed: 0\)' || true)
subtests=$(grep -oE 'Failed: [0-9]+' "$log" | awk '{n += $2} END {print n + 0}')
echo "stagefs NFS, Linux kernel client: $files test files failing, $subtests subtests failing ($(grep -E '^Files=' "$log" || echo 'no summary: see the console log'))"
echo "logs: $log $work/scratch/console.log $work/serve.log"
