# Sourced by the scripts that install what they need from Debian's registry.
# shellcheck shell=bash

# ensure_debian_packages PKG...: installs those of PKG that are not installed, quietly.
ensure_debian_packages() {
  local p missing=()
  for p in "$@"; do
    [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == *' installed' ]] || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  # A fresh machine may have no package lists, or stale ones that name versions long gone.
  compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null || apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; }
}
