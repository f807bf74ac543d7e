//! A new user's first hour (issue 19), on real mounts and the real binary:
//! `unmount` acts only on mounts of ours and returns once the daemon let go of its
//! cache; every command finds a running mount with a custom cache directory without
//! flags; a crashed daemon's dead mount is named with the command that clears it.
//!
//! Each test gives its commands a HOME of its own (and no XDG variables), as a fresh
//! account has: no config file, and a registry of running mounts that only this
//! test's mounts write to, so tests running at once never see each other's mounts.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use stagefs_mount::registry;
use stagefs_tests::hub::{HUB_CLIENT, Hub, REPO};
use stagefs_tests::{Scratch, TEST_RESERVE, Tmpfs, generate, is_mounted, stagefs_bin, wait_for};

/// A user with a fresh HOME, running the `stagefs` binary.
struct Newcomer {
    home: PathBuf,
}

impl Newcomer {
    fn new(s: &Scratch) -> Newcomer {
        let home = s.dir.path().join("home");
        fs::create_dir_all(&home).expect("mkdir home");
        Newcomer { home }
    }

    fn command(&self, args: &[&dyn AsRef<std::ffi::OsStr>]) -> Command {
        let mut command = stagefs_tests::stagefs_at_home(&self.home);
        command.args(args.iter().map(|a| a.as_ref()));
        command
    }

    /// Runs `stagefs ARGS`: (success, stdout, stderr).
    fn run(&self, args: &[&dyn AsRef<std::ffi::OsStr>]) -> (bool, String, String) {
        let out: Output = self.command(args).output().expect("running stagefs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `stagefs mount` in the background, as a user types it.
    fn mount(&self, s: &Scratch) -> (String, String) {
        let reserve = TEST_RESERVE.to_string();
        let (ok, out, err) = self.run(&[
            &"mount",
            &s.hub,
            &s.mnt,
            &"--cache-dir",
            &s.cache,
            &"--min-free",
            &reserve,
        ]);
        assert!(ok, "mount failed: {err}");
        (out, err)
    }
}

/// Unmounts whatever stagefs left at the mount point when a test fails midway.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// A bind mount for one test, unmounted even if the test fails.
struct Bind(PathBuf);

impl Drop for Bind {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn one_line(text: &str) -> bool {
    text.trim_end().lines().count() == 1
}

#[test]
fn unmount_leaves_a_tmpfs_and_a_bind_mount_alone() {
    let s = Scratch::new();
    let user = Newcomer::new(&s);
    let tmp = s.dir.path().join("t");
    let _tmpfs = Tmpfs::mount(&tmp, "size=1m");
    fs::write(tmp.join("mine"), "the user's own file").expect("write");
    let bound = s.dir.path().join("b");
    fs::create_dir_all(&bound).expect("mkdir");
    fs::write(s.hub.join("theirs"), "x").expect("write");
    let ok = Command::new("mount")
        .arg("--bind")
        .arg(&s.hub)
        .arg(&bound)
        .status()
        .is_ok_and(|st| st.success());
    assert!(ok, "a bind mount needs root");
    let _bind = Bind(bound.clone());
    for (dir, kind, kept) in [(&tmp, "tmpfs", "mine"), (&bound, "", "theirs")] {
        for flags in [&[][..], &["--lazy"][..], &["--force"][..]] {
            let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"unmount"];
            args.extend(flags.iter().map(|f| f as &dyn AsRef<std::ffi::OsStr>));
            args.push(dir);
            let (ok, out, err) = user.run(&args);
            assert!(!ok, "{} {flags:?} was unmounted: {out}{err}", dir.display());
            assert!(one_line(&err), "{err}");
            assert!(
                err.contains("is not a stagefs mount") && err.contains(kind),
                "{err}"
            );
            assert!(is_mounted(dir), "{} is gone after {flags:?}", dir.display());
            assert!(dir.join(kept).exists(), "{}", dir.display());
        }
    }
}

#[test]
fn unmount_returns_once_the_daemon_has_released_the_cache() {
    let s = Scratch::new();
    let user = Newcomer::new(&s);
    let model = generate(&s.hub, "acme/bye", 1, "2M");
    let _cleanup = Cleanup(s.mnt.clone());
    user.mount(&s);
    let shard = model.shards().remove(0);
    fs::read(s.mnt.join(&shard)).expect("read through the mount");
    assert!(registry::locked(&s.cache), "the daemon holds its cache");
    let (ok, _, err) = user.run(&[&"unmount", &s.mnt]);
    assert!(ok, "{err}");
    assert!(
        !registry::locked(&s.cache),
        "unmount returned while the daemon still held the cache"
    );
    let (ok, out, err) = user.run(&[&"status", &"--cache-dir", &s.cache]);
    assert!(ok && out.contains("mount     not running"), "{out}{err}");
    // Forced, the same: gone, and the daemon has let go when it returns.
    user.mount(&s);
    let (ok, _, err) = user.run(&[&"unmount", &"--force", &s.mnt]);
    assert!(ok, "{err}");
    assert!(!is_mounted(&s.mnt) && !registry::locked(&s.cache));
}

#[test]
fn every_command_finds_a_running_mount_with_a_custom_cache_dir() {
    let s = Scratch::new();
    let user = Newcomer::new(&s);
    let model = generate(&s.hub, "acme/found", 2, "2M");
    let _cleanup = Cleanup(s.mnt.clone());
    user.mount(&s);
    let cache = s.cache.display().to_string();
    let mnt = s.mnt.display().to_string();

    let (ok, out, err) = user.run(&[&"status"]);
    assert!(ok, "{err}");
    assert!(out.contains(&format!("cache     {cache}")), "{out}");
    assert!(
        out.contains(&format!("mount     {mnt} (running, fuse)")),
        "{out}"
    );

    let (_, out, err) = user.run(&[&"doctor", &model.repo]);
    let model_line = out
        .lines()
        .find(|l| l.contains(" model ") || l.starts_with("ok    model"));
    assert!(
        model_line.is_some_and(|l| l.starts_with("ok") && l.contains(&model.repo)),
        "{out}{err}"
    );
    assert!(!out.contains("no source is configured"), "{out}");

    let (ok, out, err) = user.run(&[&"prefetch", &model.repo]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = user.run(&[&"verify", &model.repo]);
    assert!(ok && out.contains("0 mismatches"), "{out}{err}");
    let (ok, out, err) = user.run(&[&"evict", &model.repo]);
    assert!(ok && out.contains("evicted"), "{out}{err}");

    let (ok, _, err) = user.run(&[&"unmount", &s.mnt]);
    assert!(ok, "{err}");
    // After the unmount, the cache still knows what it mirrored.
    let (ok, _, err) = user.run(&[&"run", &"--cache-dir", &s.cache, &"--", &"true"]);
    assert!(ok, "{err}");
    let (ok, out, err) = user.run(&[&"status"]);
    assert!(
        ok && out.contains(&format!("mount     {mnt} (running, fuse)")),
        "{out}{err}"
    );
    // The one running mount is the one to unmount.
    let (ok, _, err) = user.run(&[&"unmount"]);
    assert!(ok, "{err}");
    assert!(!is_mounted(&s.mnt));
}

#[test]
fn a_dead_mount_is_named_with_the_command_that_clears_it() {
    let s = Scratch::new();
    let user = Newcomer::new(&s);
    let model = generate(&s.hub, "acme/crash", 1, "2M");
    let _cleanup = Cleanup(s.mnt.clone());
    user.mount(&s);
    let pid = fs::read_to_string(s.cache.join("lock")).expect("pid");
    let killed = Command::new("kill").args(["-9", pid.trim()]).status();
    assert!(killed.is_ok_and(|st| st.success()));
    wait_for("the daemon to die", || !registry::locked(&s.cache));
    let err = fs::metadata(&s.mnt).expect_err("a dead mount");
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN));

    let clear = format!("stagefs unmount --lazy {}", s.mnt.display());
    let (_, out, err) = user.run(&[&"status"]);
    let mount_line = out
        .lines()
        .find(|l| l.starts_with("mount"))
        .unwrap_or_default();
    assert!(
        mount_line.contains(&format!("{} is a dead mount", s.mnt.display()))
            && mount_line.contains(&clear),
        "{out}{err}"
    );
    let (ok, out, err) = user.run(&[&"doctor"]);
    assert!(!ok, "a dead mount fails doctor: {out}{err}");
    let check = out.lines().find(|l| l.starts_with("fail  mount"));
    assert!(check.is_some_and(|l| l.contains(&clear)), "{out}{err}");

    let (_, err) = user.mount(&s);
    assert!(err.contains("cleared a stale mount"), "{err}");
    assert!(!err.contains("WARN") && !err.contains("INFO"), "{err}");
    let log = fs::read_to_string(s.cache.join("stagefs.log")).expect("log");
    assert!(log.contains("cleared a stale mount"), "{log}");
    let shard = model.shards().remove(0);
    assert!(
        fs::read(s.mnt.join(&shard)).expect("read") == fs::read(s.hub.join(&shard)).expect("src")
    );
    let (ok, _, err) = user.run(&[&"unmount", &s.mnt]);
    assert!(ok, "{err}");
    assert!(
        !is_mounted(Path::new(&s.mnt)),
        "{}",
        fs::read_to_string("/proc/self/mountinfo").unwrap_or_default()
    );
}

#[test]
fn output_names_models_and_files_as_users_know_them() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/named", 2, "2M");
    let cache: &dyn AsRef<std::ffi::OsStr> = &s.cache;
    let mount = s.mount(&["--no-prefetch"]);
    let first = "model-00001-of-00002.safetensors";

    let out = Command::new(stagefs_bin())
        .args(["prefetch", &model.repo, "--cache-dir"])
        .arg(&s.cache)
        .output()
        .expect("prefetch");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    // Results, per file and in sum, on stdout; nothing on stderr.
    assert!(
        stdout.contains(&format!("staged {}: {first} (2.0 MiB)\n", model.repo)),
        "{stdout}"
    );
    assert!(
        stdout.contains("staged, 0 already staged, 0 failed"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("blobs/") && stderr.is_empty(),
        "{stdout}{stderr}"
    );

    // verify names the corrupt copy by its file, and blames the copy, not the source.
    let victim = model.blob_of(&s.hub, first);
    let key = victim.file_name().expect("blob name").to_string_lossy();
    let copy = s.cache.join(format!("v1/data/sha256-{key}"));
    let mut bytes = fs::read(&copy).expect("copy");
    bytes[4096] ^= 1;
    fs::write(&copy, bytes).expect("corrupt");
    let out = Command::new(stagefs_bin())
        .args(["verify", "--cache-dir"])
        .arg(&s.cache)
        .output()
        .expect("verify");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!out.status.success());
    let mismatch = format!("MISMATCH {}: {first}: sha256 differs", model.repo);
    assert!(stdout.contains(&mismatch), "{stdout}");
    assert!(stdout.contains("the cached copy changed"), "{stdout}");
    assert!(!stdout.contains("source blob"), "{stdout}");
    assert!(stdout.contains("): 1 mismatch\n"), "{stdout}");
    assert!(
        one_line(&stderr) && stderr.contains("1 staged copy does not match"),
        "{stderr}"
    );
    let (ok, out, err) =
        stagefs_tests::run_stagefs(&[&"evict", &model.repo, &"--cache-dir", cache]);
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("evicted {}: {first} (2.0 MiB)", model.repo)),
        "{out}"
    );
    // The prefetch kept the model's small files too (what it needs offline), and
    // they go with it.
    assert!(
        out.contains(&format!("evicted {}: config.json (", model.repo)),
        "{out}"
    );
    assert!(out.contains("evicted 4 files, 4.0 MiB"), "{out}");
    drop(mount);
}

#[test]
fn durations_accept_what_the_help_says_and_a_bad_one_lists_only_that() {
    let s = Scratch::new();
    let user = Newcomer::new(&s);
    let (ok, _, err) = user.run(&[&"mount", &s.hub, &s.mnt, &"--source-timeout", &"5x"]);
    assert!(!ok && one_line(&err), "{err}");
    assert!(
        err.contains("unknown unit 'x'") && err.contains("s, m, h, d or w"),
        "{err}"
    );
    assert!(!err.contains("months") && !err.contains("µs"), "{err}");
    let (ok, _, err) = user.run(&[&"mount", &s.hub, &s.mnt, &"--source-timeout", &"1month"]);
    assert!(!ok && err.contains("unknown unit 'month'"), "{err}");
    let (_, out, _) = user.run(&[&"mount", &"--help"]);
    assert!(
        out.contains("s, m, h, d or w: 45s, 2m"),
        "the help names the forms: {out}"
    );
}

/// A config file that is not there is a wrong path, not a wrong line: doctor says
/// where to look, without the system's error number.
#[test]
fn doctor_of_a_missing_config_file_names_the_path_to_check() {
    let s = Scratch::new();
    let user = Newcomer::new(&s);
    let missing = s.dir.path().join("missing.toml");
    let (ok, out, err) = user.run(&[&"--config", &missing, &"doctor"]);
    assert!(!ok, "a missing config fails doctor: {out}{err}");
    let mut lines = out.lines();
    assert_eq!(
        lines.next().unwrap_or_default(),
        format!(
            "fail  config       reading config file {}: No such file or directory",
            missing.display()
        ),
        "{out}"
    );
    assert_eq!(
        lines.next().unwrap_or_default().trim(),
        "check the path given to --config or STAGEFS_CONFIG; the checks below ran without the file"
    );
    assert!(err.is_empty(), "{err}");
}

#[test]
fn doctor_reports_a_broken_config_file_and_a_repository_by_its_id() {
    let s = Scratch::new();
    let user = Newcomer::new(&s);
    let model = generate(&s.hub, "acme/doctored", 1, "2M");
    let config = user.home.join(".config/stagefs/config.toml");
    fs::create_dir_all(config.parent().expect("config dir")).expect("mkdir");
    fs::write(&config, "max_size = \"20X\"\n").expect("write config");
    let repo = s.hub.join("models--acme--doctored");
    let (ok, out, err) = user.run(&[&"doctor", &repo]);
    assert!(!ok, "a broken config fails doctor: {out}{err}");
    let first = out.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("fail  config") && first.contains("line 1, key `max_size`"),
        "{out}{err}"
    );
    // The other checks still ran, and the repository is named as one.
    let shape = out
        .lines()
        .find(|l| l.contains(" shape "))
        .unwrap_or_default();
    assert!(
        shape.contains(&format!("the HF repository {}", model.repo))
            && !shape.contains("plain model folder"),
        "{out}"
    );
    assert!(err.is_empty(), "{err}");
}

#[test]
fn with_two_mounts_a_path_or_a_model_picks_one_and_nothing_asks_for_one() {
    let s = Scratch::new();
    let user = Newcomer::new(&s);
    let a = generate(&s.hub, "acme/first", 1, "2M");
    let (hub2, mnt2, cache2) = (
        s.dir.path().join("hub2"),
        s.dir.path().join("mnt2"),
        s.dir.path().join("cache2"),
    );
    fs::create_dir_all(&hub2).expect("mkdir");
    fs::create_dir_all(&mnt2).expect("mkdir");
    let b = generate(&hub2, "acme/second", 1, "2M");
    // A plain folder beside it, named by a short name (issue 36).
    let tiny = hub2.join("models/Tiny-Fake");
    fs::create_dir_all(&tiny).expect("mkdir");
    fs::write(tiny.join("config.json"), "{}\n").expect("config");
    fs::write(tiny.join("model.safetensors"), vec![3u8; 2_000_000]).expect("weights");
    let (_c1, _c2) = (Cleanup(s.mnt.clone()), Cleanup(mnt2.clone()));
    user.mount(&s);
    let reserve = TEST_RESERVE.to_string();
    let (ok, _, err) = user.run(&[
        &"mount",
        &hub2,
        &mnt2,
        &"--cache-dir",
        &cache2,
        &"--min-free",
        &reserve,
    ]);
    assert!(ok, "{err}");

    // status lists every running mount (issue 36).
    let (ok, out, err) = user.run(&[&"status"]);
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("mount     {} (running, fuse)\n", mnt2.display())),
        "{out}"
    );
    // A model only the second source holds picks the second mount, and says so.
    let (ok, out, err) = user.run(&[&"prefetch", &b.repo]);
    assert!(ok, "{out}{err}");
    assert!(
        err.contains(&format!("using the mount at {}", mnt2.display())),
        "{err}"
    );
    assert!(out.contains(&format!("staged {}: ", b.repo)), "{out}");
    // A path inside the first mount picks the first (nothing opens it: a closed
    // file's handle is released a moment after close returns).
    let shard = a.shards().remove(0);
    let (ok, out, err) = user.run(&[&"prefetch", &s.mnt.join(&shard)]);
    assert!(ok, "{out}{err}");
    assert!(out.contains(&format!("staged {}: ", a.repo)), "{out}");
    let (ok, out, err) = user.run(&[&"evict", &b.repo]);
    assert!(ok, "{out}{err}");
    assert!(out.contains(&format!("evicted {}: ", b.repo)), "{out}");
    // A short name that only the second source holds picks it too, for doctor as
    // for prefetch; a model neither holds is named as such.
    let (ok, out, err) = user.run(&[&"prefetch", &"Tiny-Fake"]);
    assert!(ok, "{out}{err}");
    assert!(
        err.contains(&format!("using the mount at {}", mnt2.display())),
        "{err}"
    );
    let repo_dir = format!("models--{}", b.repo.replace('/', "--"));
    let (ok, out, err) = user.run(&[&"verify", &repo_dir]);
    assert!(ok, "{out}{err}");
    assert!(
        err.contains(&format!("using the mount at {}", mnt2.display())),
        "{err}"
    );
    let (_, out, err) = user.run(&[&"doctor", &"Tiny-Fake"]);
    assert!(
        out.lines()
            .any(|l| l.starts_with("ok    model        models/Tiny-Fake: 2 files")),
        "{out}{err}"
    );
    for command in ["verify", "evict", "prefetch", "doctor"] {
        let (ok, out, err) = user.run(&[&command, &"acme/nonexistent"]);
        assert!(!ok, "{command}: {out}{err}");
        assert!(
            err.starts_with("stagefs: no running mount's source holds acme/nonexistent ("),
            "{command}: {err}"
        );
    }
    let (ok, _, err) = user.run(&[&"unmount"]);
    assert!(!ok && err.contains("name the one to unmount"), "{err}");
    for mnt in [&s.mnt, &mnt2] {
        let (ok, _, err) = user.run(&[&"unmount", mnt]);
        assert!(ok, "{err}");
    }
}

// A newcomer's second hour (issue 36).

#[test]
fn usage_errors_say_what_is_missing_the_similar_flag_and_the_values() {
    let s = Scratch::new();
    let user = Newcomer::new(&s);
    let more = "For more information, try '--help'.\n";
    let cases: [(&[&str], String); 5] = [
        (
            &["run"],
            format!(
                "stagefs: the following required arguments were not provided:\n  <COMMAND>...\nUsage: stagefs run -- <COMMAND>...\n{more}"
            ),
        ),
        (
            &["evict"],
            format!(
                "stagefs: the following required arguments were not provided:\n  <TARGET|--all|--older-than <OLDER_THAN>|--to-size <TO_SIZE>>\nUsage: stagefs evict <TARGET|--all|--older-than <OLDER_THAN>|--to-size <TO_SIZE>>\n{more}"
            ),
        ),
        (
            &["prefetch"],
            format!(
                "stagefs: the following required arguments were not provided:\n  <TARGETS>...\nUsage: stagefs prefetch <TARGETS>...\n{more}"
            ),
        ),
        (
            &["mount", "/s", "/m", "--max-siz", "1G"],
            format!(
                "stagefs: unexpected argument '--max-siz' found\n  tip: a similar argument exists: '--max-size'\nUsage: stagefs mount --max-size <MAX_SIZE> <SOURCE> <MOUNTPOINT>\n{more}"
            ),
        ),
        (
            &["mount", "/s", "/m", "--on-full", "foo"],
            format!(
                "stagefs: invalid value 'foo' for '--on-full <ON_FULL>'\n  [possible values: fail, read-source]\n{more}"
            ),
        ),
    ];
    for (words, expected) in cases {
        let args: Vec<&dyn AsRef<std::ffi::OsStr>> = words
            .iter()
            .map(|a| a as &dyn AsRef<std::ffi::OsStr>)
            .collect();
        let out = user.command(&args).output().expect("running stagefs");
        assert_eq!(out.status.code(), Some(2), "{words:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), expected);
    }
}

#[test]
fn evict_and_verify_refuse_a_model_named_nowhere_and_take_the_same_paths() {
    let s = Scratch::new();
    let user = Newcomer::new(&s);
    let model = generate(&s.hub, "acme/real", 1, "2M");
    let _cleanup = Cleanup(s.mnt.clone());
    user.mount(&s);
    let no_such = "stagefs: acme/nonexistent: no such model in the source (no HF repository acme/nonexistent, and no model folder or GGUF file whose path ends with acme/nonexistent, within 4 levels of the root, hub/ and model_dirs)\n";
    for command in ["prefetch", "evict", "verify"] {
        let out = user
            .command(&[&command, &"acme/nonexistent"])
            .output()
            .expect("running stagefs");
        assert_eq!(out.status.code(), Some(1), "{command}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), no_such, "{command}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "", "{command}");
    }
    // A model in the source with nothing staged is no typo.
    let (ok, out, err) = user.run(&[&"evict", &model.repo]);
    assert!(ok && out == "evicted 0 files, 0 B\n", "{out}{err}");
    let (ok, out, err) = user.run(&[&"prefetch", &model.repo]);
    assert!(ok, "{out}{err}");
    let shard = model.shards().remove(0);
    for path in [s.mnt.join(&shard), s.hub.join(&shard)] {
        let (ok, out, err) = user.run(&[&"verify", &path]);
        assert!(ok, "{}: {err}", path.display());
        assert_eq!(out, "checked 1 staged file (2.0 MiB): 0 mismatches\n");
    }
    let (ok, _, err) = user.run(&[&"unmount", &s.mnt]);
    assert!(ok, "{err}");
}

#[test]
fn help_and_readme_say_what_the_commands_do() {
    let s = Scratch::new();
    let user = Newcomer::new(&s);
    let (_, top, _) = user.run(&[&"--help"]);
    let run = top
        .lines()
        .find(|l| l.trim_start().starts_with("run "))
        .unwrap_or_default();
    assert!(!run.contains("then run it offline"), "{run}");
    assert!(
        run.ends_with("; --offline (and a --read-only mount) also sets HF_HUB_OFFLINE=1"),
        "{run}"
    );
    let (_, serve, _) = user.run(&[&"serve", &"--help"]);
    assert!(!serve.contains("--backend"), "{serve}");
    let out = user
        .command(&[&"serve", &s.hub, &"--backend", &"fuse"])
        .output()
        .expect("running stagefs");
    assert_eq!(out.status.code(), Some(2));
    let (_, mount, _) = user.run(&[&"mount", &"--help"]);
    assert!(mount.contains("0 counts as 1s, the shortest"), "{mount}");
    let readme =
        fs::read_to_string(stagefs_tests::workspace_root().join("README.md")).expect("README.md");
    for said in [
        "cargo install --locked --path cli",
        "a child process with a 15 s deadline",
        "a file at the export's root needs `//`",
        "`0` counts as `1s`, the shortest",
        "Every option\nof `mount` applies but `--backend`",
    ] {
        assert!(readme.contains(said), "README: {said}");
    }
    assert!(!readme.contains("a file at any depth"));
    // Without --locked, cargo install re-resolves the dependencies past Cargo.lock.
    assert!(!readme.contains("cargo install --path"));
}

#[test]
fn serve_listens_on_a_host_name() {
    let s = Scratch::new();
    generate(&s.hub, "acme/served", 1, "2M");
    let served = stagefs_tests::Served::try_start(&s.hub, &s.cache, &["--listen", "localhost:0"])
        .expect("serve --listen localhost:0");
    assert!(
        served.url.starts_with("nfs://127.0.0.1/?nfsport="),
        "{}",
        served.url
    );
    served.stop();
}

#[test]
fn a_fresh_status_a_read_only_mount_and_an_unmount_each_say_so() {
    let s = Scratch::new();
    let user = Newcomer::new(&s);
    let (ok, out, err) = user.run(&[&"status"]);
    assert!(ok, "{err}");
    assert_eq!(
        out,
        format!(
            "nothing mounted yet (no cache at {}); start with `stagefs mount SOURCE MOUNTPOINT`\n",
            user.home.join(".cache/stagefs").display()
        )
    );
    // For a script, no cache is an empty list of reports, in the object every
    // status --json prints.
    let (ok, out, err) = user.run(&[&"status", &"--json"]);
    assert!(ok && err.is_empty(), "{err}");
    assert_eq!(out, "{\n  \"mounts\": []\n}\n");
    // Nothing to unmount is said so, not as a missing argument.
    let (ok, _, err) = user.run(&[&"unmount"]);
    assert!(!ok);
    assert_eq!(
        err,
        "stagefs: no stagefs mount is running; to unmount one left behind, name its mount point (`stagefs unmount MOUNTPOINT`)\n"
    );
    // The commands that need a cache say the same of a fresh account.
    let fresh = format!(
        "stagefs: nothing mounted yet (no cache at {}); start with `stagefs mount SOURCE MOUNTPOINT`\n",
        user.home.join(".cache/stagefs").display()
    );
    for args in [
        &[&"verify" as &dyn AsRef<std::ffi::OsStr>][..],
        &[&"evict", &"--all"],
        &[&"prefetch", &"acme/counted"],
    ] {
        let (ok, out, err) = user.run(args);
        assert!(!ok && out.is_empty(), "{out}");
        assert_eq!(err, fresh);
    }
    let model = generate(&s.hub, "acme/counted", 2, "2M");
    let _cleanup = Cleanup(s.mnt.clone());
    let reserve = TEST_RESERVE.to_string();
    let (ok, out, err) = user.run(&[
        &"mount",
        &s.hub,
        &s.mnt,
        &"--cache-dir",
        &s.cache,
        &"--min-free",
        &reserve,
        &"--min-stage-size",
        &"0",
        &"--read-only",
        &"--on-full",
        &"read-source",
    ]);
    assert!(ok, "{err}");
    let modes = "(read-only; --on-full read-source: a file the cache cannot hold is read from the source, at its speed; cache ";
    assert!(
        out.starts_with(&format!(
            "mounted {} at {} {modes}",
            s.hub.display(),
            s.mnt.display()
        )),
        "{out}"
    );
    // refs/main is read too, and (with --min-stage-size 0) kept, as a loader does.
    let repo_dir = model.snapshot_rel.parent().and_then(Path::parent);
    let refs_main = repo_dir.expect("repo dir").join("refs/main");
    fs::read(s.mnt.join(refs_main)).expect("read refs/main");
    for file in &model.files {
        fs::read(s.mnt.join(&model.snapshot_rel).join(&file.name)).expect("read");
    }
    let entries = || stagefs_tests::status_json(&s.cache)["usage"]["entries"].as_u64();
    wait_for("refs/main and the 4 files kept", || entries() == Some(5));
    let (ok, out, err) = user.run(&[&"status"]);
    assert!(ok, "{err}");
    for line in [
        format!("mount     {} (running, fuse, read-only)\n", s.mnt.display()),
        "on full   a file the cache cannot hold is read from the source, at its speed (--on-full read-source)\n".into(),
        "model     acme/counted: 4 staged files, 4.0 MiB\n".into(),
        ": 4/4 files, 4.0 MiB of 4.0 MiB\n".into(),
    ] {
        assert!(out.contains(&line), "{line} in {out}");
    }
    let (ok, out, err) = user.run(&[&"unmount", &s.mnt]);
    assert!(ok, "{err}");
    assert_eq!(out, format!("unmounted {}\n", s.mnt.display()));
}

#[test]
fn a_mount_point_inside_the_source_is_refused() {
    let s = Scratch::new();
    let user = Newcomer::new(&s);
    generate(&s.hub, "acme/nested", 1, "2M");
    let inner = s.hub.join("inner");
    fs::create_dir(&inner).expect("mkdir");
    let _cleanup = Cleanup(inner.clone());
    let out = user
        .command(&[&"mount", &s.hub, &inner, &"--cache-dir", &s.cache])
        .output()
        .expect("running stagefs");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "stagefs: mount point {} must not be inside the source {}: the mount would contain itself without end\n",
            inner.display(),
            s.hub.display()
        )
    );
    assert!(!is_mounted(&inner));
}

/// A second source, mount point and cache beside a [`Scratch`]'s.
fn second_mount(s: &Scratch, user: &Newcomer, repo: &str) -> (PathBuf, PathBuf, PathBuf) {
    let (hub, mnt, cache) = (
        s.dir.path().join("hub2"),
        s.dir.path().join("mnt2"),
        s.dir.path().join("cache2"),
    );
    fs::create_dir_all(&mnt).expect("mkdir");
    generate(&hub, repo, 1, "2M");
    let reserve = TEST_RESERVE.to_string();
    let (ok, _, err) = user.run(&[
        &"mount",
        &hub,
        &mnt,
        &"--cache-dir",
        &cache,
        &"--min-free",
        &reserve,
    ]);
    assert!(ok, "second mount: {err}");
    (hub, mnt, cache)
}

#[test]
fn with_two_mounts_run_status_and_doctor_pick_as_the_others_do() {
    let s = Scratch::new();
    let user = Newcomer::new(&s);
    generate(&s.hub, "acme/first", 1, "2M");
    let _cleanup = Cleanup(s.mnt.clone());
    user.mount(&s);
    let (_, mnt2, cache2) = second_mount(&s, &user, "acme/second");
    let _cleanup2 = Cleanup(mnt2.clone());
    let hub_cache = |args: &[&dyn AsRef<std::ffi::OsStr>]| {
        let out = user.command(args).output().expect("running stagefs");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let echo: [&dyn AsRef<std::ffi::OsStr>; 4] = [&"--", &"sh", &"-c", &"echo $HF_HUB_CACHE"];
    // Issue 46: with nothing to pick by, every way run picks one is named, not only
    // --cache-dir.
    let mut bare: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"run"];
    bare.extend(echo);
    let (ok, _, err) = user.run(&bare);
    assert!(!ok);
    for said in [
        "stagefs: 2 stagefs mounts are running: ",
        &format!(
            "{} (of {})",
            mnt2.display(),
            s.dir.path().join("hub2").display()
        ),
        "; pick one with --mountpoint (`stagefs run --mountpoint ",
        "--source, --cache-dir, or --model naming a model only one holds\n",
    ] {
        assert!(err.contains(said), "{said} in {err}");
    }
    let using = format!(
        "stagefs: using the mount at {} (cache {})\n",
        mnt2.display(),
        cache2.display()
    );
    let mut by_model: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"run", &"--model", &"acme/second"];
    by_model.extend(echo);
    let (out, err) = hub_cache(&by_model);
    assert_eq!(out, format!("{}\n", mnt2.display()));
    assert!(err.starts_with(&using), "{err}");
    let mut by_mountpoint: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"run", &"--mountpoint", &mnt2];
    by_mountpoint.extend(echo);
    let (out, err) = hub_cache(&by_mountpoint);
    assert_eq!(out, format!("{}\n", mnt2.display()));
    assert!(err.starts_with(&using), "{err}");
    // Both flags, for a mount made with its own --cache-dir: found by its mount
    // point, not mounted over ("already a mount point").
    let hub2 = s.dir.path().join("hub2");
    let mut by_both: Vec<&dyn AsRef<std::ffi::OsStr>> =
        vec![&"run", &"--source", &hub2, &"--mountpoint", &mnt2];
    by_both.extend(echo);
    let (out, _) = hub_cache(&by_both);
    assert_eq!(out, format!("{}\n", mnt2.display()));

    // status lists both, one block each.
    let (out, _) = hub_cache(&[&"status"]);
    for line in [
        format!("cache     {}\n", s.cache.display()),
        format!("mount     {} (running, fuse)\n", s.mnt.display()),
        format!("cache     {}\n", cache2.display()),
        format!("mount     {} (running, fuse)\n", mnt2.display()),
    ] {
        assert!(out.contains(&line), "{line} in {out}");
    }

    // doctor with nothing to examine names the mounts it could.
    let out = user.command(&[&"doctor"]).output().expect("doctor");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mounts = format!(
        "note  mounts       2 stagefs mounts are running: {} (of {}), {} (of {})\n                   name one to examine it: `stagefs doctor MOUNTPOINT`\n",
        s.mnt.display(),
        s.hub.display(),
        mnt2.display(),
        s.dir.path().join("hub2").display()
    );
    assert!(stdout.contains(&mounts), "{mounts}\n{stdout}");

    // doctor of a source not mounted, and of a broken config file, runs.
    let elsewhere = s.dir.path().join("hub3");
    generate(&elsewhere, "acme/third", 1, "2M");
    let out = user
        .command(&[&"doctor", &elsewhere])
        .output()
        .expect("doctor");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("stagefs mounts are running"), "{err}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("ok    source       {}", elsewhere.display())),
        "{stdout}{err}"
    );
    let typo = s.dir.path().join("typo.toml");
    fs::write(&typo, "mountpiont = \"/m\"\n").expect("write");
    let out = user
        .command(&[&"--config", &typo, &"doctor"])
        .output()
        .expect("doctor");
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("fail  config       "), "{stdout}");

    for mnt in [&s.mnt, &mnt2] {
        let (ok, _, err) = user.run(&[&"unmount", mnt]);
        assert!(ok, "{err}");
    }
}

#[test]
fn run_with_nothing_mounted_refuses_rather_than_bring_back_an_old_mount() {
    let s = Scratch::new();
    let user = Newcomer::new(&s);
    generate(&s.hub, "acme/old", 1, "2M");
    let _cleanup = Cleanup(s.mnt.clone());
    // An earlier session's mount, in the default cache, since unmounted.
    let reserve = TEST_RESERVE.to_string();
    let (ok, _, err) = user.run(&[&"mount", &s.hub, &s.mnt, &"--min-free", &reserve]);
    assert!(ok, "{err}");
    let (ok, _, err) = user.run(&[&"unmount", &s.mnt]);
    assert!(ok, "{err}");

    let out = user
        .command(&[&"run", &"--", &"true"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "stagefs: no source given and no stagefs mount is running: mount one first (`stagefs mount SOURCE MOUNTPOINT`), pass --source and --mountpoint, or set `source` and `mountpoint` in {}\n",
            user.home.join(".config/stagefs/config.toml").display()
        )
    );
    assert!(!is_mounted(&s.mnt));
    // doctor does not advise the old mount point either.
    let out = user.command(&[&"doctor"]).output().expect("doctor");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.contains(&format!("export HF_HUB_CACHE={}", s.mnt.display())),
        "{stdout}"
    );
    assert!(
        stdout.contains("note  hub-cache    no mount point configured; the hub cache is "),
        "{stdout}"
    );
}

/// Issue 36: `prefetch` with nothing mounted staged from the source an old mount had
/// recorded in the default cache. It refuses as `run` does; naming that cache, or a
/// path in the source, still stages from it.
#[test]
fn prefetch_with_nothing_mounted_refuses_an_old_mounts_source() {
    let s = Scratch::new();
    let user = Newcomer::new(&s);
    let model = generate(&s.hub, "acme/old", 1, "2M");
    let _cleanup = Cleanup(s.mnt.clone());
    let reserve = TEST_RESERVE.to_string();
    let (ok, _, err) = user.run(&[&"mount", &s.hub, &s.mnt, &"--min-free", &reserve]);
    assert!(ok, "{err}");
    let (ok, _, err) = user.run(&[&"unmount", &s.mnt]);
    assert!(ok, "{err}");
    let cache = user.home.join(".cache/stagefs");

    let (ok, out, err) = user.run(&[&"prefetch", &"acme/old"]);
    assert!(!ok);
    assert_eq!(out, "");
    assert_eq!(
        err,
        format!(
            "stagefs: no stagefs mount is running, and the cache {} last served {}, which nothing names now: mount the source first (`stagefs mount SOURCE MOUNTPOINT`), or pass --cache-dir {} to stage from it into that cache\n",
            cache.display(),
            s.hub.display(),
            cache.display()
        )
    );
    let (ok, out, err) = user.run(&[&"prefetch", &"--dry-run", &"acme/old"]);
    assert!(!ok && out.is_empty(), "{out}");
    assert!(err.contains("which nothing names now"), "{err}");

    // Named, the same cache stages from the source it recorded.
    let (ok, out, err) = user.run(&[&"prefetch", &"--cache-dir", &cache, &"acme/old"]);
    assert!(ok, "{err}");
    assert!(out.contains("1 staged"), "{out}");
    // So does a path in that source, which names the source itself.
    let (ok, _, err) = user.run(&[&"evict", &"--all"]);
    assert!(ok, "{err}");
    let shard = s.hub.join(&model.shards()[0]);
    let (ok, out, err) = user.run(&[&"prefetch", &shard]);
    assert!(ok, "{err}");
    assert!(out.contains("1 staged"), "{out}");
}

#[test]
fn status_names_a_copy_in_progress_by_its_file_and_v_adds_its_path() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/slow", 1, "24M");
    let shard = model.shards().remove(0);
    let file = shard
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    let remote = stagefs_tests::NetFs::up(&s.hub, &s.dir.path().join("nas"), "40mbit");
    let mount = stagefs_tests::Mount::start(&remote.mnt, &s.mnt, &s.cache, &["--no-prefetch"]);
    let reader = {
        let path = mount.path(&shard);
        std::thread::spawn(move || fs::read(path).map(drop))
    };
    wait_for("the copy to start", || !mount.in_flight().is_empty());
    let blob = mount.in_flight()[0].path.display().to_string();
    let staging = |verbose: bool| {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"status", &"--cache-dir", &s.cache];
        if verbose {
            args.push(&"-v");
        }
        let (ok, out, err) = stagefs_tests::run_stagefs(&args);
        assert!(ok, "{err}");
        let line = out.lines().find(|l| l.starts_with("staging   "));
        line.map(str::to_string).unwrap_or_default()
    };
    // While a copy keeps the slow source busy, the daemon names files without
    // asking it (status answers at once): by the model and the blob's short hash;
    // by the file's name when the source answers (admin::names). Either, per call.
    let hash = blob.rsplit('/').next().expect("hash");
    let names = [
        format!("{}: {file}", model.repo),
        format!("{}: blob {}…", model.repo, &hash[..12]),
    ];
    let plain = staging(false);
    let named = |line: &str, tail: &str| {
        (names.iter()).any(|name| line.starts_with(&format!("staging   {name}{tail} ")))
    };
    assert!(named(&plain, ""), "{plain}");
    let verbose = staging(true);
    assert!(named(&verbose, &format!(" [{blob}]")), "{verbose}");
    reader
        .join()
        .expect("reader")
        .expect("read through the mount");
    drop(mount);
}

#[test]
fn a_file_name_with_a_newline_stays_on_one_line() {
    let s = Scratch::new();
    let folder = s.hub.join("models/odd");
    fs::create_dir_all(&folder).expect("mkdir");
    fs::write(folder.join("config.json"), "{}").expect("write");
    fs::write(folder.join("a\nb.safetensors"), vec![7u8; 2 << 20]).expect("write");
    let mount = s.mount(&[]);
    fs::read(mount.path("models/odd/a\nb.safetensors")).expect("read through the mount");
    let (ok, out, err) =
        stagefs_tests::run_stagefs(&[&"evict", &"models/odd", &"--cache-dir", &s.cache]);
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "evicted models/odd/a\\nb.safetensors (2.0 MiB)\nevicted 1 file, 2.0 MiB\n"
    );
    drop(mount);
}

#[test]
fn the_stopped_line_says_the_counters_in_words() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/counted-words", 1, "2M");
    let mount = s.mount(&["--no-prefetch"]);
    let shard = model.shards().remove(0);
    let size = fs::read(mount.path(&shard))
        .expect("read through the mount")
        .len();
    let log = mount.log.clone();
    mount.unmount();
    let text = fs::read_to_string(&log).expect("foreground stderr");
    let stopped = text
        .lines()
        .find(|l| l.contains(" stopped"))
        .unwrap_or_default();
    assert!(!stopped.contains("MetricsSnapshot"), "{stopped}");
    assert!(
        stopped.contains(&format!("stopped metrics=1 copy, {size} bytes copied, ")),
        "{stopped}"
    );
}

/// Issue 36: a stock sshfs (`contain_symlinks`) refuses every snapshot link, and
/// status read "0/0 files" with no cause; the snapshot's line now has one under it.
#[test]
fn status_says_why_a_snapshot_through_a_stock_sshfs_has_no_files() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/big-llm", 1, "1M");
    let nas = s.dir.path().join("nas");
    let remote = stagefs_tests::NetFs::up_with(&s.hub, &nas, "1gbit", "contain_symlinks");
    let mount = stagefs_tests::Mount::start(&remote.mnt, &s.mnt, &s.cache, &["--no-prefetch"]);
    let (ok, out, err) = stagefs_tests::run_stagefs(&[&"status", &"--cache-dir", &s.cache]);
    assert!(ok, "{err}");
    let commit = &model.commit;
    let lines = [
        format!("  {commit} (main): 0/0 files, 0 B of 0 B"),
        "    3 links cannot be followed; config.json: the source refuses to read the link (sshfs does unless mounted with `-o no_contain_symlinks`)".into(),
    ];
    for line in lines {
        assert!(out.lines().any(|l| l == line), "{line}\n{out}");
    }
    drop(mount);
    drop(remote);
}

/// Issue 36: a plain folder's link out of the source was left out of its counts
/// without a word.
#[test]
fn status_names_a_folder_s_link_that_leaves_the_source() {
    let s = Scratch::new();
    let folder = s.hub.join("models/odd");
    fs::create_dir_all(&folder).expect("mkdir");
    fs::write(folder.join("config.json"), "{}").expect("write");
    fs::write(folder.join("model.safetensors"), vec![7u8; 2 << 20]).expect("write");
    std::os::unix::fs::symlink("/etc/hostname", folder.join("extra.safetensors")).expect("link");
    let _mount = s.mount(&["--no-prefetch"]);
    let (ok, out, err) = stagefs_tests::run_stagefs(&[&"status", &"--cache-dir", &s.cache]);
    assert!(ok, "{err}");
    let line = "  1 link cannot be followed; extra.safetensors: it links to /etc/hostname, outside the source";
    assert!(out.lines().any(|l| l == line), "{line}\n{out}");
}

/// Issue 36: while the source does not answer, status named a copy in progress by
/// its blob (`acme/slow: blob 757a9a60f2c1…`), as users know no such file. The mount
/// read the snapshot link the copy was reached through, and names it by that.
#[test]
fn status_names_a_copy_by_its_snapshot_file_while_the_source_does_not_answer() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/slow", 1, "24M");
    let shard = model.shards().remove(0);
    let remote = stagefs_tests::NetFs::up(&s.hub, &s.dir.path().join("nas"), "40mbit");
    let mount = stagefs_tests::Mount::start(&remote.mnt, &s.mnt, &s.cache, &["--no-prefetch"]);
    let reader = {
        let path = mount.path(&shard);
        std::thread::spawn(move || fs::read(path).map(drop))
    };
    wait_for("the copy to start", || !mount.in_flight().is_empty());
    remote.cut();
    // A read of the copy is overdue at once: status asks the source nothing.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (ok, out, err) = stagefs_tests::run_stagefs(&[&"status", &"--cache-dir", &s.cache]);
    remote.restore();
    assert!(ok, "{err}");
    let named = "staging   acme/slow: model-00001-of-00001.safetensors ";
    assert!(out.lines().any(|l| l.starts_with(named)), "{named}\n{out}");
    let _ = reader.join().expect("reader");
    drop(mount);
}

/// Issue 46: an HF_HOME that has downloaded nothing yet (`hub/` empty) was taken for
/// an empty hub cache: `mount` found no model, `run` set HF_HUB_CACHE to the mount,
/// and `hf download` wrote `models--…`, `.locks` and `CACHEDIR.TAG` beside `hub/` on
/// the source. Its `hub/` makes it an HF_HOME for mount, doctor and run alike.
#[test]
fn an_empty_hf_home_is_one_and_hf_download_through_run_lands_in_its_hub() {
    let s = Scratch::new();
    let user = Newcomer::new(&s);
    fs::create_dir(s.hub.join("hub")).expect("mkdir hub");
    let _cleanup = Cleanup(s.mnt.clone());
    let (mnt, cache) = (s.mnt.display(), s.cache.display());
    let (out, _) = user.mount(&s);
    assert!(
        out.ends_with(&format!(
            "; export HF_HOME={mnt} HF_XET_CACHE={cache}/xet\n"
        )),
        "{out}"
    );
    let (_, out, _) = user.run(&[&"doctor", &s.hub]);
    let shape = format!("{}: an HF_HOME holding no model yet", s.hub.display());
    assert!(out.contains(&shape), "{out}");

    let hub = Hub::of_a_new_model(HUB_CLIENT, &s.dir.path().join("repo"), &[]);
    let hf = stagefs_tests::python().with_file_name("hf");
    let out = user
        .command(&[
            &"run",
            &"--source",
            &s.hub,
            &"--mountpoint",
            &s.mnt,
            &"--cache-dir",
            &s.cache,
            &"--",
            &hf,
            &"download",
            &REPO,
        ])
        .env("HF_ENDPOINT", &hub.url)
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .output()
        .expect("running stagefs run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // The mount is up already: run says it uses it, then what COMMAND gets.
    let said = format!(
        "stagefs: using the mount already running at {mnt}; its own options stand (unmount it first to change them)\nstagefs: running with HF_HOME={mnt} HF_HUB_CACHE={mnt}/hub HF_XET_CACHE={cache}/xet (the source is an HF_HOME)\n"
    );
    assert!(err.starts_with(&said), "{err}");
    let repo_dir = "models--acme--tiny";
    assert!(s.hub.join("hub").join(repo_dir).join("snapshots").is_dir());
    for stray in [repo_dir, ".locks", "CACHEDIR.TAG"] {
        assert!(!s.hub.join(stray).exists(), "{stray} beside hub/");
    }
    let (ok, _, err) = user.run(&[&"unmount", &s.mnt]);
    assert!(ok, "{err}");
}

/// Issue 46, finding 3: doctor of a path no mount has to do with advised
/// `export HF_HUB_CACHE=<mount> (its hub/ if …)` for an HF_HOME mount and added an
/// `ok mount` line about that mount; with two mounts holding a model it examined one
/// without a word. Its advice names the variable the running mount's source wants,
/// and it says which of the two mounts its report is about.
#[test]
fn doctor_names_the_variable_of_the_mount_it_is_about_and_which_of_two_it_examines() {
    let s = Scratch::new();
    let user = Newcomer::new(&s);
    generate(&s.hub.join("hub"), "acme/shared", 1, "1M");
    let elsewhere = s.dir.path().join("elsewhere");
    fs::create_dir_all(elsewhere.join("Llama")).expect("mkdir");
    fs::write(elsewhere.join("Llama/config.json"), "{}").expect("config");
    fs::write(elsewhere.join("Llama/model.safetensors"), [7u8; 4096]).expect("weights");
    // A mount of plain folders: loaded by path, no variable to export.
    let [plain, mnt3, cache3] = ["plain", "mnt3", "cache3"].map(|d| s.dir.path().join(d));
    fs::create_dir_all(plain.join("Other")).expect("mkdir");
    fs::write(plain.join("Other/config.json"), "{}").expect("config");
    fs::write(plain.join("Other/model.safetensors"), [7u8; 4096]).expect("weights");
    fs::create_dir(&mnt3).expect("mkdir");
    let _cleanup3 = Cleanup(mnt3.clone());
    let reserve = TEST_RESERVE.to_string();
    let mount_plain: [&dyn AsRef<std::ffi::OsStr>; 7] = [
        &"mount",
        &plain,
        &mnt3,
        &"--cache-dir",
        &cache3,
        &"--min-free",
        &reserve,
    ];
    let (ok, _, err) = user.run(&mount_plain);
    assert!(ok, "{err}");
    let (_, out, _) = user.run(&[&"doctor", &elsewhere]);
    let by_path = format!(
        "\nnote  hub-cache    the source holds plain model folders, loaded by path under {};",
        mnt3.display()
    );
    assert!(out.contains(&by_path), "{out}");
    assert!(!out.contains("export "), "{out}");
    let (ok, _, err) = user.run(&[&"unmount", &mnt3]);
    assert!(ok, "{err}");

    let _cleanup = Cleanup(s.mnt.clone());
    user.mount(&s);
    let mnt = s.mnt.display();
    let (_, out, _) = user.run(&[&"doctor", &elsewhere]);
    assert!(
        out.contains(&format!("\n{:19}export HF_HOME={mnt}, or", "")),
        "{out}"
    );
    assert!(!out.contains("HF_HUB_CACHE="), "{out}");
    assert!(!out.contains("\nok    mount "), "{out}");

    let [hub2, mnt2, cache2] = ["hub2", "mnt2", "cache2"].map(|d| s.dir.path().join(d));
    generate(&hub2, "acme/shared", 1, "1M");
    fs::create_dir(&mnt2).expect("mkdir");
    let _cleanup2 = Cleanup(mnt2.clone());
    let (ok, _, err) = user.run(&[
        &"mount",
        &hub2,
        &mnt2,
        &"--cache-dir",
        &cache2,
        &"--min-free",
        &reserve,
    ]);
    assert!(ok, "{err}");
    let (_, out, _) = user.run(&[&"doctor", &elsewhere, &"--cache-dir", &cache2]);
    let hub_cache = format!("\n{:19}export HF_HUB_CACHE={}, or", "", mnt2.display());
    assert!(out.contains(&hub_cache), "{out}");

    let (_, out, _) = user.run(&[&"doctor", &"acme/shared"]);
    let note = out
        .lines()
        .find(|l| l.starts_with("note  mounts       2 running mounts hold acme/shared: "))
        .unwrap_or_else(|| panic!("{out}"));
    for (m, src) in [(&s.mnt, &s.hub), (&mnt2, &hub2)] {
        assert!(
            note.contains(&format!("{} (of {})", m.display(), src.display())),
            "{note}"
        );
    }
    let examined = out
        .lines()
        .find_map(|l| l.strip_prefix("ok    mount        "))
        .and_then(|l| l.split_once(" is mounted"))
        .map(|(m, _)| m)
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        note.ends_with(&format!("; this report is about the one at {examined}")),
        "{note}"
    );
    for m in [&s.mnt, &mnt2] {
        let (ok, _, err) = user.run(&[&"unmount", m]);
        assert!(ok, "{err}");
    }
}
