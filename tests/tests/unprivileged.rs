//! A mount made by an ordinary user, as on a desktop: no capabilities, so no kernel
//! passthrough; the mount goes through the setuid fusermount3, and only that user can
//! use it. Staged files are then presented as links to their local copies in the cache
//! ("redirect"), so opens, reads and mmap of staged weights never cross the daemon.
//! Every client here (sha256sum, readlink, python) runs as that user: the copies are
//! readable by the mounting user only, and the kernel refuses anyone else, root
//! included, on a mount without `--allow-other`.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;
use stagefs_store::Key;
use stagefs_tests::{
    MmapHolder, Model, Mount, Scratch, TestUser, generate, hf_offline_env, is_mounted, python,
    staged_files, staged_files_of_at_least, stagefs_bin, wait_for_within,
};

/// Longer than the mount's 1 s attribute and entry TTL, so the kernel asks again.
const PAST_TTL: Duration = Duration::from_millis(2000);

/// The sha256 an LFS blob must have: its file name.
fn blob_sha256(model: &Model, hub: &Path, name: &str) -> String {
    model
        .blob_of(hub, name)
        .file_name()
        .and_then(|n| n.to_str())
        .expect("blob name")
        .to_string()
}

fn file_name(rel: &Path) -> &str {
    rel.file_name().and_then(|n| n.to_str()).expect("file name")
}

/// Where the mount's link for a staged file with `key` must point.
fn copy_path(cache: &Path, key: &str) -> PathBuf {
    fs::canonicalize(cache)
        .expect("cache dir")
        .join("v1/data")
        .join(key)
}

/// Waits (bounded) until the user's lookup of `path` in the mount presents a link,
/// and returns its target.
fn wait_for_link(user: &TestUser, path: &Path) -> PathBuf {
    let mut target = None;
    wait_for_within(
        &format!("{} to be presented as a link", path.display()),
        Duration::from_secs(15),
        Duration::from_millis(100),
        || {
            target = user.readlink(path);
            target.is_some()
        },
    );
    target.expect("link target")
}

/// What `stat` (no -L) says `path` is, as the user sees it.
fn file_type(user: &TestUser, path: &Path) -> String {
    let out = user.output(user.command("stat").args(["-c", "%F", "--"]).arg(path));
    assert!(
        out.status.success(),
        "stat {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Runs a Python snippet as the user and parses the one JSON line it prints.
fn run_py_json(user: &TestUser, mut command: Command, mount: &Mount) -> Value {
    mount.client_report(&user.output(&mut command))
}

/// A helper process the test talks to by lines: it answers each line sent with one
/// JSON line.
struct Conversation {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Conversation {
    fn start(mut command: Command) -> Conversation {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn helper");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        Conversation { child, out }
    }

    fn next(&mut self) -> Value {
        let mut line = String::new();
        self.out.read_line(&mut line).expect("helper output");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("helper said {line:?}: {e}"))
    }

    fn say(&mut self) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin.write_all(b"go\n").expect("write to helper");
        stdin.flush().expect("flush");
    }
}

impl Drop for Conversation {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Tries to open `argv[1]` for writing (without truncating) and prints the errno name
/// it got, or "opened".
const WRITE_OPEN: &str = r#"
import errno, json, os, sys
try:
    os.close(os.open(sys.argv[1], os.O_WRONLY))
    print(json.dumps("opened"))
except OSError as e:
    print(json.dumps(errno.errorcode.get(e.errno, str(e.errno))))
"#;

/// Reads `argv[1]` opened with O_NOFOLLOW, as tar opens what it archives, and prints
/// its sha256, or the errno name it got.
const NOFOLLOW_SHA256: &str = r#"
import errno, hashlib, json, os, sys
try:
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NOFOLLOW)
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    print(json.dumps(h.hexdigest()))
except OSError as e:
    print(json.dumps(errno.errorcode.get(e.errno, str(e.errno))))
"#;

#[test]
fn an_open_that_follows_no_link_reads_a_cold_blob_through_the_daemon() {
    let s = Scratch::for_user();
    let user = s.user();
    let model = generate(&s.hub, "acme/nofollow", 1, "6M");
    let shard = model.shards().remove(0);
    let sha = blob_sha256(&model, &s.hub, file_name(&shard));
    let blob = model.blob_of(&s.hub, file_name(&shard));
    let mount = s.mount(&["--no-prefetch"]);
    // An open that refuses links (tar's O_NOFOLLOW) of a cold blob stages it and
    // reads the regular file it opened, through the daemon.
    let mut read = user.python();
    read.args(["-c", NOFOLLOW_SHA256]).arg(mount.path(&blob));
    assert_eq!(run_py_json(user, read, &mount), sha.as_str());
    let m = mount.metrics();
    assert_eq!((m.stage_copies, m.redirects), (1, 0), "{m:?}");
    assert!(m.daemon_reads > 0, "read through the daemon: {m:?}");
}

#[test]
fn a_staged_shard_reads_right_and_then_resolves_into_the_cache() {
    let s = Scratch::for_user();
    let user = s.user();
    let model = generate(&s.hub, "acme/redirected", 2, "6M");
    let shard = model.shards().remove(0);
    let sha = blob_sha256(&model, &s.hub, file_name(&shard));
    let blob = model.blob_of(&s.hub, file_name(&shard));
    let mount = s.mount(&["--no-prefetch"]);

    // Not staged yet: the blob is a regular file, and looking at it staged nothing.
    assert_eq!(file_type(user, &mount.path(&blob)), "regular file");
    assert_eq!(user.readlink(&mount.path(&blob)), None);
    assert_eq!(mount.metrics().stage_copies, 0);

    assert_eq!(user.sha256(&mount.path(&shard)), Ok(sha.clone()));
    let m = mount.metrics();
    assert_eq!((m.stage_copies, m.passthrough_opens), (1, 0), "{m:?}");
    assert!(
        m.daemon_reads > 0 && m.redirects == 0,
        "the first open, of the regular file, stages it and is served as that file (cp \
         compares what it stat'ed with what it opened): {m:?}"
    );

    // Staged: within the TTL the blob becomes a link to its copy; the snapshot's
    // relative link into blobs/ is unchanged.
    let target = wait_for_link(user, &mount.path(&blob));
    let copy = copy_path(&s.cache, &format!("sha256-{sha}"));
    assert_eq!(target, copy, "the link names the staged copy");
    assert_eq!(
        user.readlink(&mount.path(&shard)),
        Some(Path::new("../../blobs").join(&sha))
    );
    // The copy is private to the mounting user, and not writable: the link leads out
    // of the read-only mount, so the copy's own mode is what refuses writes.
    let meta = fs::metadata(&copy).expect("copy");
    let mode = meta.permissions().mode() & 0o7777;
    assert_eq!(
        mode & 0o077,
        0,
        "copies are the mounting user's only: {mode:o}"
    );
    assert_eq!(mode & 0o222, 0, "copies are read-only: {mode:o}");
    assert_eq!(
        (meta.uid(), meta.gid()),
        (user.uid, user.gid),
        "copies are the mounting user's"
    );
    let mut write = user.python();
    write.args(["-c", WRITE_OPEN]).arg(mount.path(&shard));
    let refused = run_py_json(user, write, &mount);
    assert!(
        refused == "EACCES" || refused == "EROFS",
        "opening a staged shard for writing through the mount: {refused}"
    );
    assert_eq!(user.sha256(&copy), Ok(sha.clone()), "the copy is intact");

    // Reading it again goes to the copy itself: no open or read reaches the daemon.
    let before = mount.metrics();
    assert_eq!(user.sha256(&mount.path(&shard)), Ok(sha.clone()));
    assert_eq!(user.sha256(&mount.path(&blob)), Ok(sha));
    let after = mount.metrics();
    assert_eq!(after.daemon_reads, before.daemon_reads, "{after:?}");
    assert_eq!(
        (after.daemon_opens, after.stage_hits, after.stage_copies),
        (before.daemon_opens, before.stage_hits, before.stage_copies),
        "{after:?}"
    );
    assert!(
        after.redirects >= 1,
        "readlink answers are counted: {after:?}"
    );

    // A small file is never presented as a link, even once its copy is kept.
    let config = model.snapshot_rel.join("config.json");
    let expected = fs::read(s.hub.join(&config)).expect("source config");
    let out = user.output(user.command("cat").arg(mount.path(&config)));
    assert!(out.status.success() && out.stdout == expected);
    wait_for_within(
        "the kept copy of config.json",
        Duration::from_secs(15),
        Duration::from_millis(50),
        || mount.metrics().kept_copies == 1,
    );
    sleep(PAST_TTL);
    let config_blob = model.blob_of(&s.hub, "config.json");
    for path in [mount.path(&config), mount.path(&config_blob)] {
        let resolved = user.output(user.command("realpath").arg(&path));
        assert!(
            String::from_utf8_lossy(&resolved.stdout).starts_with(s.mnt.to_str().expect("utf8")),
            "{} resolves inside the mount: {}",
            path.display(),
            String::from_utf8_lossy(&resolved.stdout)
        );
    }
    assert_eq!(file_type(user, &mount.path(&config_blob)), "regular file");
}

/// Maps `argv[1]` (read-only, whole) and prints its sha256, realpath and size.
const MMAP_HASH: &str = r#"
import hashlib, json, mmap, os, sys
path = sys.argv[1]
real = os.path.realpath(path)
with open(path, "rb") as f:
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        digest = hashlib.sha256(m).hexdigest()
        size = len(m)
print(json.dumps({"sha256": digest, "realpath": real, "size": size}))
"#;

#[test]
fn mmap_of_a_shard_through_the_mount_sees_the_right_bytes_before_and_after_staging() {
    let s = Scratch::for_user();
    let user = s.user();
    let model = generate(&s.hub, "acme/mapped", 2, "8M");
    let mount = s.mount(&["--no-prefetch"]);
    let shard = model.shards().remove(1);
    let sha = blob_sha256(&model, &s.hub, file_name(&shard));
    let blob = model.blob_of(&s.hub, file_name(&shard));
    let mmap_hash = || {
        let mut command = user.python();
        command.args(["-c", MMAP_HASH]).arg(mount.path(&shard));
        run_py_json(user, command, &mount)
    };

    // Cold: the open stages it, page faults are served by the daemon.
    let cold = mmap_hash();
    assert_eq!(cold["sha256"], sha.as_str(), "{cold}");
    assert_eq!(
        cold["realpath"],
        mount.path(&blob).to_str().expect("utf8"),
        "{cold}"
    );
    assert_eq!(mount.metrics().stage_copies, 1);

    // Staged: the mapping is of the local copy, and no read crosses the daemon.
    let copy = wait_for_link(user, &mount.path(&blob));
    let before = mount.metrics();
    let warm = mmap_hash();
    assert_eq!(warm["sha256"], sha.as_str(), "{warm}");
    assert_eq!(warm["realpath"], copy.to_str().expect("utf8"), "{warm}");
    let size = model
        .files
        .iter()
        .find(|f| f.name == file_name(&shard))
        .expect("shard")
        .size;
    assert_eq!(warm["size"], size);
    let after = mount.metrics();
    assert_eq!(after.daemon_reads, before.daemon_reads, "{after:?}");
    assert_eq!(after.stage_copies, 1, "{after:?}");
}

#[test]
fn huggingface_hub_and_safe_open_as_the_user_before_and_after_staging() {
    let s = Scratch::for_user();
    let user = s.user();
    let model = generate(&s.hub, "acme/userclient", 3, "4M");
    let mount = s.mount(&[]);
    let hf_home = user.home.join("hf-home");
    // tests/py/hf_offline_check.py as the user: huggingface_hub resolves the model
    // offline, safe_open (mmap) reads every tensor; a staged shard may resolve on into
    // the cache's copies.
    let check = || {
        let out = user.output(
            user.hf_offline_check(&mount.mnt, &model, &s.hub, &hf_home)
                .env("STAGEFS_CACHE_DIR", &mount.cache),
        );
        let report = mount.client_report(&out);
        assert_eq!(
            (report["shards"].as_u64(), report["tensors"].as_u64()),
            (Some(3), Some(6))
        );
    };

    // First run: nothing staged yet; its opens stage the shards (and a prefetch).
    check();
    let m = mount.metrics();
    assert_eq!(m.stage_copies, 3, "each shard staged once: {m:?}");

    // Second run, once the shards are links: it opens no shard through the daemon.
    for shard in model.shards() {
        let copy = wait_for_link(user, &mount.path(model.blob_of(&s.hub, file_name(&shard))));
        assert!(
            copy.starts_with(copy_path(&s.cache, "")),
            "{}",
            copy.display()
        );
    }
    let before = mount.metrics();
    check();
    let after = mount.metrics();
    assert_eq!(
        (after.stage_copies, after.stage_hits, after.daemon_opens),
        (before.stage_copies, before.stage_hits, before.daemon_opens),
        "the second run opened no shard through the daemon: {after:?}"
    );
    assert!(
        after.redirects >= before.redirects + 3,
        "it followed each shard's link: {after:?}"
    );
}

/// scan_cache_dir() over `HF_HUB_CACHE`, plus stat and lstat of every path below it;
/// prints what the scan found, relative to the hub, and the sizes `stat` gave.
const SCAN_AND_STAT: &str = r#"
import json, os
from huggingface_hub import scan_cache_dir
hub = os.environ["HF_HUB_CACHE"]
info = scan_cache_dir(hub)
assert not info.warnings, info.warnings
repos = {}
for repo in info.repos:
    repos[repo.repo_id] = {
        "size_on_disk": repo.size_on_disk,
        "nb_files": repo.nb_files,
        "revisions": sorted(
            [r.commit_hash, sorted([f.file_name, f.size_on_disk] for f in r.files)]
            for r in repo.revisions
        ),
        "refs": sorted(repo.refs),
    }
sizes = {}
for root, dirs, files in os.walk(hub):
    for name in dirs + files:
        path = os.path.join(root, name)
        os.lstat(path)
        sizes[os.path.relpath(path, hub)] = os.stat(path).st_size
print(json.dumps({"repos": repos, "sizes": sizes}, sort_keys=True))
"#;

#[test]
fn scan_cache_dir_stat_and_ls_stage_nothing() {
    let s = Scratch::for_user();
    let user = s.user();
    generate(&s.hub, "acme/listed", 2, "4M");
    generate(&s.hub, "other/listed-too", 3, "2M");
    // Default flags: not even a prefetch may start.
    let mount = s.mount(&[]);
    let hf_home = user.home.join("hf-home");

    let mut command = user.python();
    command.args(["-c", SCAN_AND_STAT]);
    hf_offline_env(&mut command, &mount.mnt, &hf_home);
    let through_mount = run_py_json(user, command, &mount);

    let out = user.output(user.command("ls").arg("-lLR").arg(&mount.mnt));
    assert!(
        out.status.success(),
        "ls -lLR: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The same scan of the source (as root, who can read it directly).
    let mut command = Command::new(python());
    command.args(["-c", SCAN_AND_STAT]);
    hf_offline_env(&mut command, &s.hub, &s.dir.path().join("hf-home-root"));
    let out = command.output().expect("python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let of_source: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(through_mount, of_source, "the mount mirrors the source");

    let m = mount.metrics();
    assert_eq!((m.stage_copies, m.bytes_copied), (0, 0), "{m:?}");
    assert!(mount.in_flight().is_empty());
    assert_eq!(
        staged_files_of_at_least(&s.cache, 1 << 20),
        Vec::<PathBuf>::new(),
        "no weight was staged"
    );
    // scan_cache_dir reads refs/main, a small file: at most copies of those are kept.
    for kept in staged_files(&s.cache) {
        let size = fs::metadata(&kept).expect("copy").len();
        assert!(size <= 64, "{} ({size} bytes) is no ref", kept.display());
    }
}

/// Reads `argv[1]` whole, again and again, for `argv[4]` seconds (at most `argv[5]`
/// reads), and prints when (seconds since start) each read happened and what it got:
/// "old" (sha256 `argv[2]`), "new" (`argv[3]`), "wrong", or an errno name.
const REREAD: &str = r#"
import errno, hashlib, json, sys, time
path, old, new, seconds, limit = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
start, reads = time.monotonic(), []
while len(reads) < limit and time.monotonic() - start < seconds:
    t = time.monotonic() - start
    try:
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        what = "old" if digest == old else "new" if digest == new else "wrong"
    except OSError as e:
        what = errno.errorcode.get(e.errno, str(e.errno))
    reads.append([round(t, 3), what])
    time.sleep(0.05)
print(json.dumps(reads))
"#;

/// Opens and maps `argv[1]` and prints where it resolved to; on a line from stdin,
/// prints the sha256 of what the descriptor and the mapping read.
const HOLD_OPEN: &str = r#"
import hashlib, json, mmap, os, sys
f = open(sys.argv[1], "rb")
m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
print(json.dumps(os.path.realpath(sys.argv[1])), flush=True)
sys.stdin.readline()
print(json.dumps({"read": hashlib.sha256(os.pread(f.fileno(), 1 << 30, 0)).hexdigest(),
                  "mmap": hashlib.sha256(m).hexdigest()}), flush=True)
"#;

fn sha256_hex(bytes: &[u8]) -> String {
    let out = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            child.stdin.take().expect("stdin").write_all(bytes)?;
            child.wait_with_output()
        })
        .expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("digest")
        .to_string()
}

#[test]
fn a_source_change_after_staging_serves_the_new_bytes_never_the_old() {
    let s = Scratch::for_user();
    let user = s.user();
    // A plain file keyed by its path, not an LFS blob: only size and mtime tell
    // its versions apart, and both versions have the same copy name.
    let rel = PathBuf::from("exports/weights.bin");
    fs::create_dir_all(s.hub.join("exports")).expect("mkdir");
    let original: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    let replacement: Vec<u8> = original.iter().map(|b| b ^ 0x5A).collect();
    let (old_sha, new_sha) = (sha256_hex(&original), sha256_hex(&replacement));
    fs::write(s.hub.join(&rel), &original).expect("write");
    // Read-only: a writable mount presents only sha256-named blobs as links (a plain
    // file may be saved over in place), and this is about a path-keyed link.
    let mount = s.mount(&["--read-only"]);
    let path = mount.path(&rel);

    assert_eq!(user.sha256(&path), Ok(old_sha.clone()));
    let key = Key::for_source_path(&rel);
    assert!(key.as_str().starts_with("path-"), "{key}");
    assert_eq!(
        wait_for_link(user, &path),
        copy_path(&s.cache, key.as_str())
    );

    // A reader holding the old copy open (fd and mapping) through the link.
    let mut holder = {
        let mut command = user.python();
        command.args(["-c", HOLD_OPEN]).arg(&path);
        Conversation::start(command)
    };
    assert_eq!(
        holder.next(),
        copy_path(&s.cache, key.as_str()).to_str().expect("utf8"),
        "the holder opened the copy through the link"
    );

    // New bytes, same size, and an mtime clearly different from the old one.
    let file = fs::OpenOptions::new()
        .write(true)
        .open(s.hub.join(&rel))
        .expect("open source");
    let old_mtime = file.metadata().expect("stat").modified().expect("mtime");
    (&file).write_all(&replacement).expect("rewrite");
    file.set_modified(old_mtime + Duration::from_secs(7))
        .expect("set mtime");
    file.sync_all().expect("sync");
    drop(file);
    let changed_at = SystemTime::now();

    // Readers right after the change may still get the old version (the kernel keeps
    // the link for its TTL), whole; never an error or a mix; once past the TTL, only
    // the new one.
    let mut reread = user.python();
    reread
        .args(["-c", REREAD])
        .arg(&path)
        .args([&old_sha, &new_sha, "4", "200"]);
    let reads = run_py_json(user, reread, &mount);
    let reads = reads.as_array().expect("reads");
    eprintln!("reads after the change (seconds, version): {reads:?}");
    assert!(!reads.is_empty());
    for read in reads {
        let (t, what) = (
            read[0].as_f64().expect("t"),
            read[1].as_str().expect("what"),
        );
        assert!(
            what == "new" || (what == "old" && t < PAST_TTL.as_secs_f64()),
            "read at {t:.3}s after the change got {what}: {reads:?}\ndaemon log:\n{}",
            mount.log_text()
        );
    }
    assert!(changed_at.elapsed().expect("clock") > PAST_TTL);
    assert_eq!(user.sha256(&path), Ok(new_sha.clone()));
    let m = mount.metrics();
    assert_eq!(m.stage_copies, 2, "the new version was staged: {m:?}");

    // The new version is staged under the same key; the holder still has the old one.
    let target = wait_for_link(user, &path);
    assert_eq!(target, copy_path(&s.cache, key.as_str()));
    assert!(fs::read(&target).expect("copy") == replacement);
    holder.say();
    let held = holder.next();
    assert_eq!(
        held["read"],
        old_sha.as_str(),
        "the open fd keeps its version"
    );
    assert_eq!(
        held["mmap"],
        old_sha.as_str(),
        "the mapping keeps its version"
    );
}

/// Resolves each path in `argv[1:]` in user space (`realpath`) and prints the
/// results; on a line from stdin, opens each resolved path and hashes it (an errno
/// name if that fails), keeps the first one open and mapped, and prints the results;
/// on a second line, prints the sha256 of what that descriptor and mapping read and
/// whether the resolved path still exists.
const RESOLVE_THEN_OPEN: &str = r#"
import errno, hashlib, json, mmap, os, sys
resolved = [os.path.realpath(p) for p in sys.argv[1:]]
print(json.dumps(resolved), flush=True)
sys.stdin.readline()
def digest(path):
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
opened = [digest(r) for r in resolved]
print(json.dumps(opened), flush=True)
f = open(resolved[0], "rb")
m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
print(json.dumps("held"), flush=True)
sys.stdin.readline()
print(json.dumps({"read": hashlib.sha256(os.pread(f.fileno(), 1 << 30, 0)).hexdigest(),
                  "mmap": hashlib.sha256(m).hexdigest(),
                  "exists": os.path.exists(resolved[0])}), flush=True)
"#;

/// Runs `stagefs evict ARGS... --cache-dir CACHE` as the user: (success, output).
fn evict_as(user: &TestUser, cache: &Path, args: &[&dyn AsRef<std::ffi::OsStr>]) -> (bool, String) {
    let mut command = user.command(stagefs_bin());
    command
        .arg("evict")
        .args(args.iter().map(|a| a.as_ref()))
        .arg("--cache-dir")
        .arg(cache);
    let out = user.output(&mut command);
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn a_path_resolved_within_the_grace_is_kept_and_open_copies_survive_eviction() {
    let s = Scratch::for_user();
    let user = s.user();
    // A (16M) and B (14M) do not both fit in 20M; their blobs differ (shard sizes).
    let a = generate(&s.hub, "acme/kept-a", 2, "8M");
    let b = generate(&s.hub, "acme/kept-b", 2, "7M");
    let grace = Duration::from_secs(2);
    let mount = s.mount(&[
        "--max-size",
        "20M",
        "--redirect-grace",
        "2s",
        "--no-prefetch",
    ]);
    let sha_of = |model: &Model, shard: &Path| blob_sha256(model, &s.hub, file_name(shard));
    for shard in a.shards() {
        assert_eq!(user.sha256(&mount.path(&shard)), Ok(sha_of(&a, &shard)));
        wait_for_link(user, &mount.path(a.blob_of(&s.hub, file_name(&shard))));
    }
    // Let the links resolved so far age out of the grace: from here only the
    // helper's realpath makes A's copies in use.
    sleep(grace + Duration::from_millis(500));

    let started = Instant::now();
    let mut helper = {
        let mut command = user.python();
        command
            .args(["-c", RESOLVE_THEN_OPEN])
            .args(a.shards().iter().map(|shard| mount.path(shard)));
        Conversation::start(command)
    };
    let resolved = helper.next();
    for (i, shard) in a.shards().iter().enumerate() {
        let copy = copy_path(&s.cache, &format!("sha256-{}", sha_of(&a, shard)));
        assert_eq!(resolved[i], copy.to_str().expect("utf8"), "{resolved}");
    }
    // Within the grace, both of A's copies count as in use: B's shard cannot make room
    // (ENOSPC, --on-full fail) and `stagefs evict` refuses them.
    let b0 = b.shards().remove(0);
    let b_open = user.sha256(&mount.path(&b0));
    let by_model = evict_as(user, &s.cache, &[&a.repo]);
    if started.elapsed() < grace - Duration::from_millis(300) {
        let err = b_open
            .clone()
            .expect_err("B must not evict copies resolved a moment ago");
        assert!(err.contains("No space left on device"), "{err}");
        let (ok, out) = &by_model;
        assert!(!ok && out.contains("in use"), "evict must refuse: {out}");
    } else {
        eprintln!(
            "inconclusive: the machine took {:?} to try B and evict, longer than the grace",
            started.elapsed()
        );
    }
    // So the paths resolved a moment ago open, with the right bytes.
    helper.say();
    let opened = helper.next();
    if b_open.is_err() && !by_model.0 {
        for (i, shard) in a.shards().iter().enumerate() {
            assert_eq!(opened[i], sha_of(&a, shard).as_str(), "{opened}");
        }
    }
    assert_eq!(helper.next(), "held");

    // Once the grace has passed, B is staged, evicting A, even though the helper still
    // holds (fd and mapping) one of A's copies: the mount cannot see that open.
    wait_for_within(
        "B to be staged",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            b.shards()
                .iter()
                .all(|shard| user.sha256(&mount.path(shard)) == Ok(sha_of(&b, shard)))
        },
    );
    let staged: Vec<String> = staged_files(&s.cache)
        .iter()
        .map(|f| file_name(f).to_string())
        .collect();
    for shard in a.shards() {
        assert!(
            !staged.contains(&format!("sha256-{}", sha_of(&a, &shard))),
            "A was evicted: {staged:?}"
        );
    }
    // The open copy was unlinked, and still reads right through its fd and mapping.
    helper.say();
    let held = helper.next();
    let a0 = sha_of(&a, &a.shards()[0]);
    assert_eq!(held["exists"], false, "{held}");
    assert_eq!(held["read"], a0.as_str(), "{held}");
    assert_eq!(held["mmap"], a0.as_str(), "{held}");

    let m = mount.metrics();
    assert!(m.redirects > 0, "{m:?}");
}

#[test]
fn stagefs_evict_by_a_path_in_the_mount_handles_a_redirected_file() {
    let s = Scratch::for_user();
    let user = s.user();
    let model = generate(&s.hub, "acme/evicted", 1, "4M");
    let grace = Duration::from_secs(2);
    let mount = s.mount(&["--redirect-grace", "2s"]);
    let shard = model.shards().remove(0);
    let sha = blob_sha256(&model, &s.hub, file_name(&shard));
    assert_eq!(user.sha256(&mount.path(&shard)), Ok(sha.clone()));
    let copy = wait_for_link(user, &mount.path(model.blob_of(&s.hub, file_name(&shard))));

    // Just resolved (by wait_for_link): in use, so refused and named.
    let started = Instant::now();
    let (ok, out) = evict_as(user, &s.cache, &[&mount.path(&shard)]);
    if started.elapsed() < grace - Duration::from_millis(300) {
        assert!(!ok && out.contains("in use"), "evict must refuse: {out}");
        assert!(copy.exists());
    }

    // Past the grace it is evicted, although naming it by its path in the mount
    // follows the snapshot link to the blob, which is now a link into the cache.
    sleep(grace + Duration::from_millis(500));
    let (ok, out) = evict_as(user, &s.cache, &[&mount.path(&shard)]);
    assert!(ok && out.contains("evicted 1"), "{out}");
    assert!(!copy.exists(), "the copy is gone");

    // The path then works as before staging: a regular file, staged again on open.
    sleep(grace);
    assert_eq!(user.sha256(&mount.path(&shard)), Ok(sha));
    assert_eq!(mount.metrics().stage_copies, 2);
}

/// Reads the files named `path=sha256` in `argv[5:]` through the mount for `argv[1]`
/// seconds (at most `argv[2]` reads, random seed `argv[3]`) and tallies what each read
/// got: "ok", "wrong" or an errno name. With `UNTIL_PASS=1`, it reads every file in
/// turn until one whole pass is all "ok", 0.2 s apart. Otherwise it picks files at
/// random and pauses up to `argv[4]` seconds between reads; half of the reads first
/// resolve the path in user space (`realpath`, as some loaders do) and open what it
/// resolved to up to 0.5 s later.
const READERS: &str = r#"
import errno, hashlib, json, os, random, sys, time
seconds, limit, seed, pause = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
files = [a.split("=", 1) for a in sys.argv[5:]]
until_pass = os.environ.get("UNTIL_PASS") == "1"
rng = random.Random(seed)
start, reads, tally, passed = time.monotonic(), 0, {}, False

def read(path, sha, resolve_first):
    try:
        if resolve_first:
            path = os.path.realpath(path)
            time.sleep(rng.uniform(0, 0.5))
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        return "ok" if h.hexdigest() == sha else "wrong"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))

while reads < limit and time.monotonic() - start < seconds:
    if until_pass:
        results = [read(p, s, False) for p, s in files]
        time.sleep(0.2)
    else:
        path, sha = rng.choice(files)
        results = [read(path, sha, rng.random() < 0.5)]
        time.sleep(rng.uniform(0, pause))
    reads += len(results)
    for r in results:
        tally[r] = tally.get(r, 0) + 1
    if until_pass and all(r == "ok" for r in results):
        passed = True
        break
print(json.dumps({"tally": tally, "passed": passed, "reads": reads}))
"#;

#[test]
fn eviction_racing_opens_never_gives_enoent_or_wrong_bytes() {
    let s = Scratch::for_user();
    let user = s.user();
    // Different shard sizes, so A's and B's blobs differ. A is 16M, B 14M: the 20M
    // budget holds one model but not both, so staging a shard of one evicts the
    // other's (only those out of the 2 s grace and not open).
    let a = generate(&s.hub, "acme/model-a", 2, "8M");
    let b = generate(&s.hub, "acme/model-b", 2, "7M");
    let mount = s.mount(&[
        "--max-size",
        "20M",
        "--redirect-grace",
        "2s",
        "--no-prefetch",
    ]);
    let files_of = |model: &Model| -> Vec<String> {
        model
            .shards()
            .iter()
            .map(|shard| {
                let sha = blob_sha256(model, &s.hub, file_name(shard));
                format!("{}={sha}", mount.path(shard).display())
            })
            .collect()
    };
    let spawn = |model: &Model, seconds: &str, seed: u32, until_pass: bool| -> Child {
        let mut command = user.python();
        command
            .args(["-c", READERS, seconds, "1000", &seed.to_string(), "2.6"])
            .args(files_of(model))
            .env("UNTIL_PASS", if until_pass { "1" } else { "0" })
            .stdout(Stdio::piped());
        command.spawn().expect("python")
    };
    let finish =
        |child: Child| -> Value { mount.client_report(&child.wait_with_output().expect("python")) };

    // A is staged first.
    assert_eq!(finish(spawn(&a, "30", 0, true))["passed"], true);

    // Then, for 8 s, two readers of A and two of B, by path through the mount. Their
    // pauses (up to 2.6 s) sometimes outlast the grace, so each model's copies keep
    // being evicted to stage the other's while that other's readers are still at it.
    let readers: Vec<Child> = (0..4)
        .map(|i| spawn(if i % 2 == 0 { &a } else { &b }, "8", i, false))
        .collect();
    let reports: Vec<Value> = readers.into_iter().map(finish).collect();
    // A copy runs on detached from the reader that started it: on a loaded machine one
    // of A's may still be finishing, and would evict B's copies after B's stager.
    wait_for_within(
        "the readers' copies to settle",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || mount.in_flight().is_empty(),
    );
    // A's copies stay in their 2 s redirect grace after the readers' last link
    // resolution: "once A's readers are gone" includes their grace.
    sleep(Duration::from_millis(2500));
    // Once A's readers are gone, B gets staged: a pass over B succeeds within 30 s.
    let b_stager = finish(spawn(&b, "30", 9, true));
    let evictions = mount.log_text().matches("evicted").count();
    eprintln!("readers (A, B, A, B): {reports:?}\nstager of B: {b_stager}\n{evictions} evictions");

    // ENOSPC is the one refusal the spec allows (--on-full fail): an open that must
    // stage a shard (never staged, or evicted) while the other model's copies are in
    // use (open, or their link resolved within the grace) cannot make room. ENOENT (a
    // path resolved a moment ago whose copy is gone), EIO, ESTALE or wrong bytes are
    // never allowed.
    for report in reports.iter().chain([&b_stager]) {
        for (what, count) in report["tally"].as_object().expect("tally") {
            assert!(
                what == "ok" || what == "ENOSPC",
                "{count} reads got {what}: readers {reports:?}, stager of B {b_stager}\ndaemon log:\n{}",
                mount.log_text()
            );
        }
    }
    // The race was run for both models: each was read whole while the other's
    // readers were at it. (Not each reader: every open of a copy, the cold one that
    // staged it included, is a link resolution that holds the copy for the grace, so
    // one model's readers can keep the other's out of the budget for a whole run;
    // with these seeds one of B's two readers is, and gets ENOSPC, as allowed.)
    for (model, pair) in ["A", "B"].iter().zip([[0, 2], [1, 3]]) {
        let ok: u64 = pair
            .iter()
            .map(|&i| reports[i]["tally"]["ok"].as_u64().unwrap_or(0))
            .sum();
        assert!(ok > 0, "{model} was read at least once: {reports:?}");
    }
    assert_eq!(
        b_stager["passed"],
        true,
        "B was staged once A's readers stopped: {b_stager}\ndaemon log:\n{}",
        mount.log_text()
    );

    // B is staged and A was evicted for it.
    let staged: BTreeMap<String, u64> = staged_files(&s.cache)
        .iter()
        .map(|f| {
            (
                file_name(f).to_string(),
                fs::metadata(f).expect("copy").len(),
            )
        })
        .collect();
    for (model, present) in [(&b, true), (&a, false)] {
        for shard in model.shards() {
            let sha = blob_sha256(model, &s.hub, file_name(&shard));
            assert_eq!(
                staged.contains_key(&format!("sha256-{sha}")),
                present,
                "{} staged: {staged:?}",
                model.repo
            );
        }
    }
    assert!(staged.values().sum::<u64>() <= 20 << 20, "{staged:?}");
}

/// Issue 19: an ordinary user's mount decides before the first read that staged
/// files are links to their copies (no CAP_SYS_ADMIN, so no passthrough is tried),
/// and says so the same way in the log, `status` and `doctor`.
#[test]
fn the_read_path_is_decided_at_mount_time_and_told_the_same_everywhere() {
    let s = Scratch::for_user();
    let user = s.user();
    let model = generate(&s.hub, "acme/graced", 1, "3M");
    let shard = model.shards().remove(0);
    let mount = s.mount(&["--no-prefetch"]);
    let links = "staged files are presented as links to their local copies";
    let log = mount.log_text();
    assert!(
        log.contains(&format!(
            "{links} (kernel passthrough: it needs CAP_SYS_ADMIN"
        )),
        "{log}"
    );
    for never in [
        "passthrough enabled",
        "registering a passthrough file failed",
    ] {
        assert!(!log.contains(never), "{log}");
    }
    let sha = blob_sha256(&model, &s.hub, file_name(&shard));
    assert_eq!(user.sha256(&mount.path(&shard)), Ok(sha));
    wait_for_link(user, &mount.path(model.blob_of(&s.hub, file_name(&shard))));
    let log = mount.log_text();
    assert!(!log.contains("WARN"), "{log}");

    let mut status = user.command(stagefs_bin());
    status.arg("status").arg("--cache-dir").arg(&s.cache);
    let out = user.output(&mut status);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("serving   {links}")), "{text}");
    let mut doctor = user.command(stagefs_bin());
    doctor.arg("doctor").arg(&s.hub);
    let out = user.output(&mut doctor);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(links) && !text.contains("served by the daemon"),
        "{text}"
    );
}

/// Issue 19: `evict` right after a read names the redirect grace as the reason a copy
/// was kept, not a reader.
#[test]
fn evict_right_after_a_read_names_the_grace_not_a_reader() {
    let s = Scratch::for_user();
    let user = s.user();
    let model = generate(&s.hub, "acme/graced", 1, "3M");
    let shard = model.shards().remove(0);
    let mount = s.mount(&["--no-prefetch"]);
    let sha = blob_sha256(&model, &s.hub, file_name(&shard));
    assert_eq!(user.sha256(&mount.path(&shard)), Ok(sha));
    wait_for_link(user, &mount.path(model.blob_of(&s.hub, file_name(&shard))));

    // The link was just followed: nothing has it open, the 30 s grace keeps it.
    let mut evict = user.command(stagefs_bin());
    evict
        .args(["evict", &model.repo, "--cache-dir"])
        .arg(&s.cache);
    let out = user.output(&mut evict);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains("--redirect-grace") && !stderr.contains("close the programs"),
        "{stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stdout.contains(&format!(
            "in use, kept: {}: {} (its link was followed",
            model.repo,
            file_name(&shard)
        )),
        "{stdout}"
    );
    assert!(stdout.contains("evicted 0 files, 0 B"), "{stdout}");
}

/// Issue 19: `stagefs demo` as an ordinary user prints its table and nothing else: no
/// raw WARN about passthrough in the middle of it, and no `0MiB/s` for small files.
#[test]
fn the_demo_as_an_ordinary_user_prints_a_clean_table() {
    let s = Scratch::for_user();
    let user = s.user();
    let mut demo = user.command(stagefs_bin());
    demo.args(["demo", "--shards", "2", "--shard-size", "2M"])
        .env("TMPDIR", &user.home);
    let out = user.output(&mut demo);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    assert!(
        !stdout.contains("WARN") && !stdout.contains(" 0MiB/s"),
        "{stdout}"
    );
    assert!(stdout.contains("every byte matched the source"), "{stdout}");
}

/// Issue 34 (case 5), for a mount made through fusermount3: SIGTERM while a shard is
/// mapped detaches the mount (fuser runs `fusermount3 -u -z` itself) and the daemon
/// serves the mapping until it is closed, then exits and frees the cache.
#[test]
fn sigterm_while_the_users_shard_is_mapped_serves_it_until_closed() {
    let s = Scratch::for_user();
    let user = s.user();
    let model = generate(&s.hub, "acme/held", 1, "8M");
    let shard = model.shards().remove(0);
    let sha = blob_sha256(&model, &s.hub, file_name(&shard));
    // No link to the copy: every page the mapping faults on is served by the daemon.
    let mut mount = s.mount(&["--no-prefetch", "--no-redirect"]);
    let mut holder = MmapHolder::start(user.python(), &mount.path(&shard));

    mount.signal(libc::SIGTERM);
    wait_for_within(
        "the busy mount to be detached",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || !is_mounted(&s.mnt),
    );
    let read = holder.read_all();
    assert_eq!(read["mapped"], sha.as_str(), "{read}\n{}", mount.log_text());
    assert_eq!(read["read"], sha.as_str(), "{read}\n{}", mount.log_text());
    assert!(
        !mount.exited(),
        "the daemon serves until the file is closed"
    );
    let log = mount.log_text();
    assert!(
        log.contains("mount busy (files open): detached; serving open files until they are closed"),
        "{log}"
    );

    let closed = holder.close();
    assert!(
        closed.success(),
        "the holder exited cleanly (no SIGBUS): {closed}"
    );
    let status = mount.wait_exit();
    assert!(status.success(), "{status}\n{}", mount.log_text());
    drop(mount);

    let again = s.mount(&[]);
    assert_eq!(user.sha256(&again.path(&shard)), Ok(sha));
}

/// `cp -rL` of a cold model out of the mount, as a user backing a model up does: cp
/// compares each file's identity from its `stat` with the one of the file it opened
/// and skips any that differ ("replaced while being copied"), so a file must not turn
/// from the regular file it was seen as into a link to its copy between the two.
#[test]
fn cp_of_a_cold_model_copies_every_file() {
    let s = Scratch::for_user();
    let user = s.user();
    let model = generate(&s.hub, "acme/backup", 4, "6M");
    let mount = s.mount(&[]);
    let dest = user.home.join("backup");
    let out = user.output(
        user.command("cp")
            .arg("-rL")
            .arg(mount.path(&model.snapshot_rel))
            .arg(&dest),
    );
    assert!(
        out.status.success(),
        "cp -rL: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for file in &model.files {
        let want = fs::read(s.hub.join(&model.snapshot_rel).join(&file.name)).expect("source");
        let got = fs::read(dest.join(&file.name))
            .unwrap_or_else(|e| panic!("{} not copied: {e}", file.name));
        assert!(got == want, "{} differs from the source", file.name);
    }
}

/// A source the mounting user cannot list would mount as an empty tree that looks
/// like a mount of nothing: the mount is refused, in one line, and nothing is mounted.
#[test]
fn a_source_the_user_cannot_read_is_refused() {
    let s = Scratch::for_user();
    let user = s.user();
    generate(&s.hub, "acme/private", 1, "2M");
    fs::set_permissions(&s.hub, fs::Permissions::from_mode(0o700)).expect("chmod");
    let out = user.output(
        user.command(stagefs_bin())
            .arg("--no-config")
            .arg("mount")
            .arg(&s.hub)
            .arg(&s.mnt)
            .arg("--cache-dir")
            .arg(&s.cache),
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("stagefs: source {}: Permission denied\n", s.hub.display())
    );
    assert!(!is_mounted(&s.mnt));
}
