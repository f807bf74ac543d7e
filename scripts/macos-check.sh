#!/usr/bin/env bash
# Type-check the workspace for macOS from Linux, warnings denied, so code that would break the
# macOS build fails here too. Nothing is linked or run, so no macOS SDK or macFUSE is needed.
#   bash scripts/macos-check.sh [TARGET...]   (default: both Apple targets CI must keep building)
#   MACOS_CHECK_TARGET_DIR=DIR overrides the target dir (default target/macos-check).
#   MACOS_CHECK_FEATURES=F passes --features F (e.g. stagefs/no-macfuse, the Homebrew build).
set -euo pipefail
cd "$(dirname "$0")/.."
if (($#)); then targets=("$@"); else targets=(aarch64-apple-darwin x86_64-apple-darwin); fi
features=()
[[ -z ${MACOS_CHECK_FEATURES:-} ]] || features=(--features "$MACOS_CHECK_FEATURES")

# Debian's rust-web-src ships the std sources that -Zbuild-std needs, so no rustup
# target download is required: CI's only network is the package registries.
# shellcheck source=scripts/debian-packages.sh
source scripts/debian-packages.sh
ensure_debian_packages rustc-web cargo-web rust-web-src clang pkg-config

# fuser's build script asks pkg-config for fuse; a stand-in .pc answers it, as check never links.
pc=$(mktemp -d)
trap 'rm -rf "$pc"' EXIT
printf 'Name: fuse\nDescription: stand-in for macFUSE (type-check only)\nVersion: 2.9.7\nLibs: -lfuse\nCflags:\n' >"$pc/fuse.pc"
# ring's C (object_store's request signing, rustls) is built the way ring cross-builds
# without a sysroot (RING_CORE_NOSTDLIBINC: clang's own headers only); the
# headers it still asks for get stand-ins, as nothing compiled here is ever linked: the SDK's
# TargetConditionals.h, and on x86_64 the stdlib.h that clang's own mm_malloc.h (through
# immintrin.h, for the ADX code) includes for malloc and free.
mkdir "$pc/include"
printf '#define TARGET_OS_OSX 1\n#define TARGET_OS_MAC 1\n#define TARGET_OS_IPHONE 0\n#define TARGET_OS_IOS 0\n#define TARGET_OS_TV 0\n#define TARGET_OS_WATCH 0\n#define TARGET_OS_SIMULATOR 0\n' >"$pc/include/TargetConditionals.h"
printf '#include <stddef.h>\nvoid *malloc(size_t);\nvoid free(void *);\nint posix_memalign(void **, size_t, size_t);\n' >"$pc/include/stdlib.h"
ring_cflags="-nostdlibinc -DRING_CORE_NOSTDLIBINC=1 -isystem $pc/include"

failed=()
for t in "${targets[@]}"; do
  echo "macos-check: cargo check --target $t ${features[*]}"
  # Absolute paths keep rustup's proxies (first on PATH) out of it: they would want a downloaded
  # target. RUSTC_BOOTSTRAP unlocks -Zbuild-std on this stable compiler. CARGO_FEATURE_PURE
  # stops blake3's build script compiling C/asm against a macOS SDK we do not have; ring's C
  # is built as above. Own target
  # dir so the std built for macOS never invalidates the host build's cache.
  if ! PKG_CONFIG_ALLOW_CROSS=1 PKG_CONFIG_PATH="$pc" PKG_CONFIG_LIBDIR="$pc" CARGO_FEATURE_PURE=1 \
    CC_aarch64_apple_darwin=clang CC_x86_64_apple_darwin=clang \
    CFLAGS_aarch64_apple_darwin="$ring_cflags" \
    CFLAGS_x86_64_apple_darwin="$ring_cflags" RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 \
    RUSTFLAGS="-D warnings" CARGO_TARGET_DIR="${MACOS_CHECK_TARGET_DIR:-target/macos-check}" \
    /usr/bin/cargo check -q -Zbuild-std=std,panic_abort --target "$t" --workspace --all-targets "${features[@]}"; then
    echo "macos-check: FAILED $t" >&2
    failed+=("$t")
  fi
done
# Check every target before failing, so one run shows all that is broken.
if ((${#failed[@]})); then
  echo "macos-check: FAILED (${failed[*]})" >&2
  exit 1
fi
echo "macos-check: ok (${targets[*]})"
