# Runs the formula's `test do` block outside Homebrew, against a stagefs built here,
# with stand-ins for the few Homebrew methods the formula uses, so that a test block
# that could never pass is caught before a Mac runs `brew test`.
#   ruby packaging/homebrew/formula-test.rb FORMULA.rb BIN_DIR VERSION
# FORMULA.rb: a rendered formula (render-formula.sh); BIN_DIR holds the stagefs to test.
# Also checks what the block must do: run `stagefs --version`, and `stagefs doctor
# --json` on an empty directory.
require "json"
require "open3"
require "pathname"
require "tmpdir"

formula_path, bin_dir, expected_version = ARGV
abort "usage: ruby #{$PROGRAM_NAME} FORMULA.rb BIN_DIR VERSION" unless expected_version

# Homebrew's Formula DSL, as far as the formula uses it.
class Formula
  class Build
    def with?(_option) = false
  end

  class << self
    attr_reader :test_block, :url_value, :options

    def build = Build.new
    def desc(_text) = nil
    def homepage(_url) = nil
    def sha256(_sum) = nil
    def license(_license) = nil
    def head(_url, **_options) = nil
    def depends_on(_spec) = nil
    def option(name, _text) = (@options ||= []) << name
    def url(value) = @url_value = value
    def test(&block) = @test_block = block
  end

  attr_reader :bin, :testpath

  def initialize(bin, testpath)
    @bin = Pathname(bin)
    @testpath = Pathname(testpath)
  end

  # Homebrew derives the version from the URL's file name.
  def version = self.class.url_value[/stagefs-(\d[^\/]*?)\.tar\.gz\z/, 1]
  def name = "stagefs"
  def full_name = "stagefs/stagefs/stagefs"

  def shell_output(cmd, result = 0)
    out, status = Open3.capture2(cmd)
    unless result.nil? || status.exitstatus == result
      raise "`#{cmd}` exited #{status.exitstatus}, not #{result}:\n#{out}"
    end
    out
  end

  def assert_match(pattern, text)
    pattern = Regexp.new(Regexp.escape(pattern)) if pattern.is_a?(String)
    raise "expected #{pattern.inspect} in #{text.inspect}" unless pattern.match?(text)
  end

  def assert_equal(expected, actual, message = nil)
    raise "expected #{expected.inspect}, got #{actual.inspect}: #{message}" unless expected == actual
  end
end

source = File.read(formula_path)
load formula_path
klass = Object.const_get(:Stagefs)

test_text = source[/^  test do\n(.*?)^  end\n/m, 1] or abort "#{formula_path}: no `test do` block"
abort "the test block must run `stagefs --version`" unless test_text.include?('stagefs --version')
abort "the test block must run `stagefs ... doctor --json`" unless test_text =~ /stagefs .*doctor --json/
abort "the test block must run doctor on an empty directory" unless test_text.include?('testpath}/empty')
abort "the formula must offer --with-macfuse" unless klass.options&.include?("with-macfuse")
version = klass.new(bin_dir, Dir.tmpdir).version
abort "the formula's URL gives version #{version.inspect}, not #{expected_version}" unless version == expected_version

Dir.mktmpdir("formula-test") do |testpath|
  klass.new(bin_dir, testpath).instance_eval(&klass.test_block)
end
puts "formula-test: the test block of #{formula_path} passed against #{bin_dir}/stagefs"
