#!/usr/bin/env bash
# Installs what the tests need on a fresh Debian machine, as root: FUSE, sshfs and an
# sshd (the network source), iproute2 (its network namespace), systemd (systemd-analyze
# checks the login unit), libnfs-utils (user-space NFS clients for the NFS backend),
# qemu, busybox-static, socat, kmod and cpio (the Linux guest whose kernel NFS client
# mounts the NFS backend: tests/vm/), rsync (a copy out of the guest's mount), and a .venv with huggingface_hub, safetensors,
# numpy and mlx-lm. The tests themselves create their unprivileged test user. Safe to
# run again.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq fuse3 sshfs openssh-server openssh-client iproute2 systemd libnfs-utils \
    qemu-system-x86 busybox-static socat kmod cpio rsync >/dev/null
python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r tests/requirements.txt
# The guest's kernel and initramfs, from Debian's stock kernel package (skipped when
# they are already built for that kernel).
bash tests/vm/build-guest.sh
