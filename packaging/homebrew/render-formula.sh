#!/usr/bin/env bash
# Fills in the formula template (stagefs.rb next to this script) for one release:
#   bash packaging/homebrew/render-formula.sh OWNER/REPO VERSION SHA256 > stagefs.rb
# VERSION without the v (0.2.0); SHA256 of the release's stagefs-VERSION.tar.gz.
set -euo pipefail
(($# == 3)) || { sed -n '2,4p' "$0" >&2; exit 2; }
repo=$1 version=$2 sha256=$3
[[ $repo =~ ^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$ ]] || { echo "render-formula: bad repository '$repo'" >&2; exit 2; }
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+([.+-][0-9A-Za-z.-]+)?$ ]] || { echo "render-formula: bad version '$version'" >&2; exit 2; }
[[ $sha256 =~ ^[0-9a-f]{64}$ ]] || { echo "render-formula: bad sha256 '$sha256'" >&2; exit 2; }
template="$(dirname "$0")/stagefs.rb"
out=$(sed -e "s|@REPO@|$repo|g" -e "s|@VERSION@|$version|g" -e "s|@SHA256@|$sha256|g" "$template")
if grep -q '@[A-Z0-9]*@' <<<"$out"; then
  echo "render-formula: placeholders left: $(grep -o '@[A-Z0-9]*@' <<<"$out" | sort -u | tr '\n' ' ')" >&2
  exit 1
fi
printf '%s\n' "$out"
