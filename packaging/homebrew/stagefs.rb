# Homebrew formula for stagefs, for a tap. The docs assume the tap
# github.com/stagefs/homebrew-stagefs, so that `brew install stagefs/stagefs/stagefs`
# installs it; no tap is published yet.
#
# This file is the template: the release workflow (.github/workflows/release.yml)
# fills in its placeholders (the repository, the version, the sha256 of the source
# tarball it attaches to the release) with packaging/homebrew/render-formula.sh,
# attaches the result to the release and, given a token, commits it to the tap.
# `.ci/run` checks it with `ruby -c` and runs its `test do` block against a Linux
# build (packaging/homebrew/formula-test.rb).
#
# It builds from source with cargo, without macFUSE (feature `no-macfuse`): macFUSE
# cannot come from Homebrew's formulae, and the binary then starts on a Mac that has
# none. Mounts use the NFS backend (macOS's own mount_nfs, no kernel extension).
class Stagefs < Formula
  desc "Read-through caching filesystem for ML model weights on slow disks and NAS shares"
  homepage "https://github.com/@REPO@"
  url "https://github.com/@REPO@/releases/download/v@VERSION@/stagefs-@VERSION@.tar.gz"
  sha256 "@SHA256@"
  license any_of: ["MIT", "Apache-2.0"]
  head "https://github.com/@REPO@.git", branch: "main"

  # Taps may have options (homebrew-core may not): --with-macfuse links macFUSE's
  # libfuse, so `--backend fuse` works; that binary needs macFUSE installed to start.
  option "with-macfuse", "Also build --backend fuse (needs macFUSE: brew install --cask macfuse)"

  depends_on "rust" => :build
  depends_on "pkgconf" => :build if build.with? "macfuse"

  def install
    features = []
    if build.with? "macfuse"
      # macFUSE installs its libfuse and fuse.pc under /usr/local, outside Homebrew's prefix.
      ENV.append_path "PKG_CONFIG_PATH", "/usr/local/lib/pkgconfig"
    else
      features = ["--features", "no-macfuse"]
    end
    system "cargo", "install", *std_cargo_args(path: "cli"), *features
  end

  def caveats
    <<~EOS
      stagefs mounts with the NFS backend: macOS's own NFS client, as you, with no
      kernel extension and no reboot:
        mkdir -p ~/hf-mirror
        stagefs mount SOURCE ~/hf-mirror
        export HF_HOME=~/hf-mirror

      To use macFUSE instead (`stagefs mount --backend fuse ...`), install it and allow
      its system extension (on Apple Silicon this needs Reduced Security, set in
      Recovery), then rebuild stagefs with it:
        brew install --cask macfuse
        brew uninstall #{name} && brew install #{full_name} --with-macfuse
    EOS
  end

  test do
    assert_match "stagefs #{version}", shell_output("#{bin}/stagefs --version")
    (testpath/"empty").mkpath
    output = shell_output("#{bin}/stagefs --no-config doctor --json " \
                          "--cache-dir #{testpath}/cache #{testpath}/empty")
    checks = JSON.parse(output)["checks"]
    fuse = checks.find { |check| check["name"] == "fuse" }
    # The NFS backend needs no macFUSE, so this check passes on a Mac without it.
    assert_equal "ok", fuse["verdict"], fuse["summary"]
  end
end
