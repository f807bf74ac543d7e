#!/usr/bin/env bash
# What a user does, end to end, as the user running it: generate a model with stagefs's
# own generator, mount it, read it through the mount with huggingface_hub offline
# (HF_HOME = the mount), safetensors and an mmap of every shard (tests/py/
# mount_read_check.py compares each with the source), then status, evict, a second read
# (the evicted copies are staged again), and unmount. Any failure exits non-zero after
# printing the end of the daemon's log.
#   bash scripts/mount-e2e.sh [--backend nfs|fuse] [--stagefs BIN] [--python PY] WORKDIR
# WORKDIR (created, must be empty) gets source/ (an HF_HOME), mnt/ and cache/ (with
# stagefs.log). The macOS CI job runs it with --backend nfs; here it runs with fuse.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
backend="" stagefs="$root/target/debug/stagefs" python="$root/.venv/bin/python"
while (($#)); do
  case $1 in
    --backend) backend=$2; shift 2 ;;
    --stagefs) stagefs=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    -*) echo "mount-e2e: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
(($# == 1)) || { sed -n '2,10p' "$0" >&2; exit 2; }
work=$1
mkdir -p "$work"
work=$(cd "$work" && pwd -P)
[[ -z $(ls -A "$work") ]] || { echo "mount-e2e: $work is not empty" >&2; exit 2; }
source="$work/source" mnt="$work/mnt" cache="$work/cache"
repo=stagefs/e2e-model
mkdir -p "$source" "$mnt"
sf() { "$stagefs" --no-config "$@"; }
step() { printf '\n== %s\n' "$*"; }

mounted() { mount | grep -qF " $mnt "; }
cleanup() {
  local rc=$?
  if ((rc)); then
    echo "mount-e2e: FAILED (exit $rc); the end of $cache/stagefs.log:" >&2
    tail -n 60 "$cache/stagefs.log" >&2 2>/dev/null || echo "(no log)" >&2
  fi
  if mounted; then sf unmount --lazy "$mnt" >&2 || true; fi
  exit "$rc"
}
trap cleanup EXIT

step "stagefs --version; doctor --json on an empty directory"
sf --version
mkdir "$work/empty"
sf doctor --json --cache-dir "$cache" "$work/empty" >"$work/doctor.json"
"$python" - "$work/doctor.json" <<'EOF'
import json, sys
for check in json.load(open(sys.argv[1]))["checks"]:
    print(f"{check['verdict']:6}{check['name']:13}{check['summary']}")
EOF

step "generate $repo (3 shards of 24 MiB) in $source/hub"
sf gen-demo "$source/hub" --repo "$repo" --shards 3 --shard-size 24M

step "mount at $mnt, backend: ${backend:-the default}"
said=$(sf mount ${backend:+--backend "$backend"} --cache-dir "$cache" "$source" "$mnt")
echo "$said"
mounted || { echo "mount-e2e: $mnt is not a mount point after stagefs mount" >&2; exit 1; }
[[ $said == *"export HF_HOME=$mnt"* ]] || { echo "mount-e2e: mount did not say export HF_HOME=$mnt" >&2; exit 1; }

read_through() {
  HF_HOME="$mnt" HF_HUB_OFFLINE=1 HF_HUB_CACHE="$mnt/hub" HF_HUB_DISABLE_TELEMETRY=1 \
    "$python" "$root/tests/py/mount_read_check.py" "$repo" "$source"
}
step "read through the mount: huggingface_hub offline, safetensors, mmap; sha256 against the source"
read_through

step "status"
sf status --cache-dir "$cache"
sf status --cache-dir "$cache" --json >"$work/status.json"
"$python" - "$work/status.json" "$backend" <<'EOF'
import json, sys
(status,) = json.load(open(sys.argv[1]))["mounts"]
assert sys.argv[2] in ("", status["backend"]), (status["backend"], sys.argv[2])
(model,) = [m for m in status["models"] if m["model"] == "stagefs/e2e-model"]
(rev,) = model["revisions"]
assert rev["staged_bytes"] == rev["total_bytes"] > 0, rev
print(f"status --json: backend {status['backend']}; {model['model']} staged, {rev['staged_bytes']} bytes")
EOF

step "evict --all (a copy read in the last 30 s, through a link or an NFS handle, counts as in use: retry)"
for attempt in $(seq 1 20); do
  if sf evict --cache-dir "$cache" --all; then break; fi
  ((attempt < 20)) || { echo "mount-e2e: evict kept copies in use after $attempt tries" >&2; exit 1; }
  sleep 5
done
sf status --cache-dir "$cache"

step "read again: the evicted copies are staged again, byte for byte"
read_through

step "unmount"
sf unmount "$mnt"
for _ in $(seq 1 50); do mounted || break; sleep 0.2; done
if mounted; then echo "mount-e2e: $mnt is still mounted after stagefs unmount" >&2; exit 1; fi
echo "mount-e2e: ok (${backend:-default} backend)"
