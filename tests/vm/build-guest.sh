#!/usr/bin/env bash
# Builds the Linux guest that tests/tests/kernel_nfs.rs boots under qemu: the host's
# kernel may lack an NFS client (or we may not be allowed to load one), so the kernel
# NFS client under test is Debian's stock one, run in a VM.
#
# Output, in target/nfs-guest/ (or $1): vmlinuz, initrd.cpio.gz and `version` (the
# kernel, and a hash of the /init and of this script it was built with). Skips everything when those are there for
# the kernel that `linux-image-amd64` depends on now and the same tests/vm/init. Needs apt (for the download, not an install),
# dpkg-deb, depmod and modprobe (kmod), cpio and busybox-static; run as root by
# scripts/setup-tests.sh.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-$root/target/nfs-guest}"

# The current stock kernel: the package the linux-image-amd64 metapackage names.
pkg="$(apt-cache depends linux-image-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -n1)"
[ -n "$pkg" ] || { echo "build-guest: no linux-image-amd64 in apt's lists (apt-get update?)" >&2; exit 1; }
ver="${pkg#linux-image-}"
# A new kernel, a changed /init or a change here rebuilds the image.
stamp="$ver $(cat "$root/tests/vm/init" "$root/tests/vm/build-guest.sh" | sha256sum | cut -c1-16)"
if [ -s "$out/vmlinuz" ] && [ -s "$out/initrd.cpio.gz" ] && [ "$(cat "$out/version" 2>/dev/null)" = "$stamp" ]; then
    exit 0
fi

work="$out/work"
rm -rf "$work" && mkdir -p "$work/deb" "$work/initrd"
(cd "$work/deb" && apt-get download -qq "$pkg" >/dev/null 2>&1) \
    || { echo "build-guest: apt-get download $pkg failed" >&2; exit 1; }
dpkg-deb -x "$work"/deb/*.deb "$work/kernel"
depmod -b "$work/kernel" "$ver"

# The modules /init loads, each after what it needs (modprobe's own order): the NFSv3
# client, the virtio PCI transport and NIC (modules in Debian's config; one built
# in is a `builtin NAME` line, nothing to load), and 9p for the host's root and the
# test's scratch directory. A compressed module is unpacked: busybox's insmod may
# not read the format.
init="$work/initrd"
mkdir -p "$init"/{bin,dev,proc,sys,host,lib/modules}
: >"$init/modules"
for module in virtio_pci virtio_net 9p 9pnet_virtio nfsv3; do
    modprobe -d "$work/kernel" -S "$ver" --show-depends "$module" >"$work/deps" \
        || { echo "build-guest: $ver has no module $module" >&2; exit 1; }
    awk '$1 == "insmod" { print $2 }' "$work/deps"
done | awk '!seen[$0]++' >"$work/order"
while read -r ko; do
    name="$(basename "$ko")"
    case "$ko" in
    *.ko.xz) name="${name%.xz}"; xz -dc "$ko" >"$init/lib/modules/$name" ;;
    *.ko.zst) name="${name%.zst}"; zstd -qdc "$ko" >"$init/lib/modules/$name" ;;
    *.ko.gz) name="${name%.gz}"; gzip -dc "$ko" >"$init/lib/modules/$name" ;;
    *) cp "$ko" "$init/lib/modules/$name" ;;
    esac
    echo "$name" >>"$init/modules"
done <"$work/order"
[ -s "$init/modules" ] || echo "build-guest: every module is built into $ver" >&2

# busybox-static: the initramfs has no libc, so everything before the chroot is busybox.
cp "$(command -v busybox)" "$init/bin/busybox"
ln -s busybox "$init/bin/sh"
cp "$root/tests/vm/init" "$init/init"
chmod 755 "$init/init"
(cd "$init" && find . | cpio -o -H newc --quiet | gzip -1) >"$work/initrd.cpio.gz"

cp "$work/kernel/boot/vmlinuz-$ver" "$out/vmlinuz"
mv "$work/initrd.cpio.gz" "$out/initrd.cpio.gz"
echo "$stamp" >"$out/version"
rm -rf "$work"
echo "build-guest: $out for $ver"
