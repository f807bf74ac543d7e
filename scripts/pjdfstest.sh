#!/usr/bin/env bash
# Runs the pjdfstest POSIX conformance suite (github.com/pjd/pjdfstest, built with
# `autoreconf -ifs && ./configure && make pjdfstest`) as root, once in a directory of
# the source filesystem itself and once through a writable stagefs FUSE mount of it,
# and prints, for each, the test files and subtests that failed.
#
#   scripts/pjdfstest.sh PJDFSTEST_DIR [STAGEFS_MOUNT_FLAGS...]
#
# STAGEFS (default target/debug/stagefs) is the binary; extra arguments go to
# `stagefs mount` (default: --allow-other, so the suite's other-uid cases reach the
# mount). WORK (default a new directory under /tmp) holds the source, the mount
# point, the cache and the two prove logs, which are kept.
set -euo pipefail
pjd=$(realpath "${1:?usage: $0 PJDFSTEST_DIR [mount flags...]}")
shift
flags=("$@")
[ ${#flags[@]} -gt 0 ] || flags=(--allow-other)
root=$(cd "$(dirname "$0")/.." && pwd)
stagefs=$(realpath "${STAGEFS:-$root/target/debug/stagefs}")
work=${WORK:-$(mktemp -d /tmp/pjdfstest-XXXXXX)}
mkdir -p "$work/direct" "$work/src" "$work/mnt"
chmod 755 "$work" "$work/direct" "$work/src"

summary() { # LOG: failed files and subtests, from prove's summary
    local files subtests
    # A file listed with no failed subtest only passed a TODO: not a failure.
    files=$(grep -E '^/.*\.t +\(' "$1" | grep -cvE 'Wstat: 0 Tests: [0-9]+ Failed: 0\)' || true)
    subtests=$(grep -oE 'Failed: [0-9]+' "$1" | awk '{n += $2} END {print n + 0}')
    echo "$files test files failing, $subtests subtests failing"
}

run_in() { # DIR LOG
    (cd "$1" && prove -r "$pjd/tests" >"$2" 2>&1) || true
    echo "$(basename "$2" .log): $(summary "$2") ($(grep -E '^Files=' "$2" || echo 'no summary'))"
}

run_in "$work/direct" "$work/direct.log"
"$stagefs" --no-config mount "$work/src" "$work/mnt" --cache-dir "$work/cache" --min-free 64M "${flags[@]}" >/dev/null
trap '"$stagefs" unmount "$work/mnt" >/dev/null 2>&1 || "$stagefs" unmount --lazy "$work/mnt" >/dev/null 2>&1 || true' EXIT
run_in "$work/mnt" "$work/stagefs.log"
echo "logs: $work/direct.log $work/stagefs.log"
