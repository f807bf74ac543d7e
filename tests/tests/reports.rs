//! A newcomer's third hour (issue 46), on real mounts and the real binary: a short
//! name that matches several models is refused by every command that takes one; with
//! several mounts running, every one's source is asked; `verify` tells a copy the
//! source has moved past from a corrupt one; every report has one JSON shape; status
//! names what a mount cannot stage and lists a model's cached files.
//!
//! Each test gives its commands a HOME of its own, so that the registry of running
//! mounts holds only this test's mounts.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use stagefs_tests::{
    Scratch, TEST_RESERVE, generate, is_mounted, pseudo_random, status_json, wait_for,
};

/// A user with a HOME of their own, running the `stagefs` binary.
struct User {
    home: PathBuf,
}

impl User {
    fn new(s: &Scratch) -> User {
        let home = s.dir.path().join("home");
        fs::create_dir_all(&home).expect("mkdir home");
        User { home }
    }

    /// Runs `stagefs ARGS`: (success, stdout, stderr).
    fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = stagefs_tests::stagefs_at_home(&self.home)
            .args(args)
            .output()
            .expect("running stagefs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `stagefs mount SOURCE MNT --cache-dir CACHE` in the background, as a user types
    /// it; unmounted when the returned guard goes.
    fn mount(&self, source: &Path, mnt: &Path, cache: &Path, extra: &[&str]) -> Mounted {
        self.mount_saying(source, mnt, cache, extra).0
    }

    /// [`User::mount`], with what it said on stderr.
    fn mount_saying(
        &self,
        source: &Path,
        mnt: &Path,
        cache: &Path,
        extra: &[&str],
    ) -> (Mounted, String) {
        fs::create_dir_all(mnt).expect("mkdir mnt");
        let reserve = TEST_RESERVE.to_string();
        let (source, mnt_text, cache) = (text(source), text(mnt), text(cache));
        // No prefetch of a model's other files on its first open: the tests stage
        // exactly what they read.
        let mut args = vec![
            "mount",
            &source,
            &mnt_text,
            "--cache-dir",
            &cache,
            "--min-free",
            &reserve,
            "--no-prefetch",
        ];
        args.extend(extra);
        let (ok, out, err) = self.run(&args);
        assert!(ok, "mount failed: {out}{err}");
        let mounted = Mounted {
            mnt: mnt.to_path_buf(),
            home: self.home.clone(),
        };
        (mounted, err)
    }
}

/// Unmounts what stagefs left at the mount point (`stagefs unmount`, which returns
/// once the daemon let go of its cache), also when a test fails midway.
struct Mounted {
    mnt: PathBuf,
    home: PathBuf,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            let _ = stagefs_tests::stagefs_at_home(&self.home)
                .arg("unmount")
                .arg(&self.mnt)
                .stdout(std::process::Stdio::null())
                .status();
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

/// A plain model folder at `source/path`: a config and one 2 MiB weights file.
fn folder(source: &Path, path: &str, seed: u64) -> PathBuf {
    let dir = source.join(path);
    fs::create_dir_all(&dir).expect("mkdir model");
    fs::write(dir.join("config.json"), "{}").expect("config");
    fs::write(dir.join("model.safetensors"), pseudo_random(2 << 20, seed)).expect("weights");
    dir
}

/// Stages `path` (in the source) by reading it through the mount at `mnt`.
fn stage(mnt: &Path, path: &str) {
    fs::read(mnt.join(path)).expect("read through the mount");
}

fn text(path: &Path) -> String {
    path.to_str().expect("a UTF-8 test path").to_string()
}

fn json(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

#[test]
fn a_short_name_of_several_models_is_refused_by_every_command() {
    let s = Scratch::new();
    let user = User::new(&s);
    folder(&s.hub, "a/TinyLlama", 1);
    folder(&s.hub, "b/TinyLlama", 2);
    let mounted = user.mount(&s.hub, &s.mnt, &s.cache, &[]);
    stage(&s.mnt, "a/TinyLlama/model.safetensors");
    stage(&s.mnt, "b/TinyLlama/model.safetensors");
    let refusal =
        "stagefs: TinyLlama names 2 models (a/TinyLlama, b/TinyLlama); name one by its path\n";
    let commands: [&[&str]; 6] = [
        &["prefetch", "TinyLlama"],
        &["evict", "TinyLlama", "--dry-run"],
        &["evict", "TinyLlama"],
        &["verify", "TinyLlama"],
        &["verify", "TinyLlama", "--repair"],
        &["status", "TinyLlama"],
    ];
    let check = |why: &str| {
        for args in commands {
            let (ok, out, err) = user.run(args);
            assert!(!ok, "{why}: {args:?} went ahead: {out}");
            assert_eq!(err, refusal, "{why}: {args:?}");
            assert!(out.is_empty(), "{why}: {args:?}: {out}");
        }
    };
    check("through the running mount");
    // Nothing was dropped, and the full path still names one.
    let (ok, out, err) = user.run(&["evict", "a/TinyLlama", "--dry-run"]);
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "would evict a/TinyLlama/model.safetensors (2.0 MiB)\nwould evict 1 file, 2.0 MiB\n"
    );
    let (ok, out, err) = user.run(&["verify", "b/TinyLlama"]);
    assert!(ok, "{err}");
    assert_eq!(out, "checked 1 staged file (2.0 MiB): 0 mismatches\n");

    // With no mount running, the cache's recorded source refuses it the same way.
    drop(mounted);
    let cache = &text(&s.cache);
    let commands: [&[&str]; 6] = [
        &["prefetch", "TinyLlama", "--cache-dir", cache],
        &["evict", "TinyLlama", "--dry-run", "--cache-dir", cache],
        &["evict", "TinyLlama", "--cache-dir", cache],
        &["verify", "TinyLlama", "--cache-dir", cache],
        &["verify", "TinyLlama", "--repair", "--cache-dir", cache],
        &["status", "TinyLlama", "--cache-dir", cache],
    ];
    for args in commands {
        let (ok, out, err) = user.run(args);
        assert!(!ok && out.is_empty(), "{args:?} went ahead: {out}");
        assert_eq!(err, refusal, "{args:?}");
    }
    // And with the source gone, by the paths of the copies alone.
    fs::rename(&s.hub, s.dir.path().join("away")).expect("move the source away");
    let (ok, _, err) = user.run(&["evict", "TinyLlama", "--dry-run", "--cache-dir", cache]);
    assert!(!ok);
    assert_eq!(err, refusal);
}

#[test]
fn with_two_mounts_every_source_is_asked() {
    let s = Scratch::new();
    let user = User::new(&s);
    let root = s.dir.path();
    let (one, two) = (root.join("one"), root.join("two"));
    // The first source holds two models a short name matches, both hold `shared`.
    folder(&one, "a/TinyLlama", 1);
    folder(&one, "b/TinyLlama", 2);
    folder(&one, "x/shared", 3);
    folder(&two, "y/shared", 4);
    folder(&two, "z/only-two", 5);
    let _one = user.mount(&one, &root.join("m1"), &root.join("c1"), &[]);
    let _two = user.mount(&two, &root.join("m2"), &root.join("c2"), &[]);
    let both = format!(
        "{} with cache {}, {} with cache {}",
        root.join("m1").display(),
        root.join("c1").display(),
        root.join("m2").display(),
        root.join("c2").display()
    );
    for verb in ["verify", "evict", "prefetch", "status"] {
        let mut args: Vec<&str> = vec![&verb, "TinyLlama"];
        if verb == "evict" {
            args.push("--dry-run");
        }
        // The one source holding it is picked, and refuses it as ambiguous.
        let (ok, out, err) = user.run(&args);
        assert!(!ok, "{verb}: {out}");
        assert_eq!(
            err,
            format!(
                "stagefs: using the mount at {} (cache {})\nstagefs: TinyLlama names 2 models (a/TinyLlama, b/TinyLlama); name one by its path\n",
                root.join("m1").display(),
                root.join("c1").display()
            ),
            "{verb}"
        );
        args[1] = "shared";
        let (ok, out, err) = user.run(&args);
        assert!(!ok, "{verb}: {out}");
        assert_eq!(
            err,
            format!(
                "stagefs: shared is in the sources of 2 running mounts ({both}); name one with --cache-dir\n"
            ),
            "{verb}"
        );
        args[1] = "nowhere/at-all";
        let (ok, _, err) = user.run(&args);
        assert!(!ok);
        assert_eq!(
            err,
            format!(
                "stagefs: no running mount's source holds nowhere/at-all ({both}); for copies left in one of their caches, name it with --cache-dir\n"
            ),
            "{verb}"
        );
    }
    // A name only one source holds picks that mount, and says which.
    let (ok, out, err) = user.run(&["verify", "only-two"]);
    assert!(ok, "{err}");
    assert_eq!(out, "checked 0 staged files (0 B): 0 mismatches\n");
    assert!(err.contains(&format!("using the mount at {}", root.join("m2").display())));
}

#[test]
fn verify_tells_a_copy_the_source_moved_past_from_a_corrupt_one() {
    let s = Scratch::new();
    let user = User::new(&s);
    let dir = folder(&s.hub, "org/m", 1);
    fs::write(dir.join("other.safetensors"), pseudo_random(2 << 20, 9)).expect("weights");
    let _mounted = user.mount(&s.hub, &s.mnt, &s.cache, &[]);
    stage(&s.mnt, "org/m/model.safetensors");
    stage(&s.mnt, "org/m/other.safetensors");
    // Another machine saves the model again: the same name, new bytes.
    fs::write(dir.join("model.safetensors"), pseudo_random(3 << 20, 7)).expect("rewrite");
    let (ok, out, err) = user.run(&["verify", "org/m"]);
    assert!(
        ok,
        "a stale copy is never served, so no failure: {out}{err}"
    );
    assert_eq!(
        out,
        "STALE org/m/model.safetensors: stale: the source changed since it was staged\n\
         checked 2 staged files (4.0 MiB): 0 mismatches, 1 stale\n"
    );
    assert_eq!(
        err,
        "stagefs: 1 staged copy is stale (the source changed since it was staged; the next open stages it again); `stagefs verify --repair` drops it now\n"
    );
    let (ok, out, err) = user.run(&["verify", "--json"]);
    assert!(ok, "{err}");
    let report = json(&out);
    assert_eq!(
        report["stale"],
        serde_json::json!(["org/m/model.safetensors"])
    );
    assert_eq!(report["mismatches"], serde_json::json!([]));
    let (ok, out, err) = user.run(&["verify", "--repair"]);
    assert!(ok, "{err}");
    assert!(
        out.contains(
            "STALE org/m/model.safetensors: stale: the source changed since it was staged (dropped; it will be staged again)\n"
        ),
        "{out}"
    );
    let (ok, out, err) = user.run(&["verify"]);
    assert!(ok && err.is_empty(), "{err}");
    assert_eq!(out, "checked 1 staged file (2.0 MiB): 0 mismatches\n");
    // Read again, the new version is staged and current.
    assert_eq!(
        fs::read(s.mnt.join("org/m/model.safetensors")).expect("read"),
        pseudo_random(3 << 20, 7)
    );
    let (ok, out, _) = user.run(&["verify"]);
    assert!(ok);
    assert_eq!(out, "checked 2 staged files (5.0 MiB): 0 mismatches\n");
}

#[test]
fn every_report_has_one_json_shape_and_status_lists_a_models_files() {
    let s = Scratch::new();
    let user = User::new(&s);
    folder(&s.hub, "org/m", 1);
    let root = s.dir.path();
    let other = root.join("other");
    folder(&other, "org/n", 2);
    let _one = user.mount(&s.hub, &s.mnt, &s.cache, &[]);
    let reports = |user: &User| {
        let (ok, out, err) = user.run(&["status", "--json"]);
        assert!(ok, "{err}");
        let all = json(&out);
        let mounts = all["mounts"].as_array().cloned().unwrap_or_default();
        assert_eq!(all.as_object().map(|o| o.len()), Some(1), "{out}");
        mounts
    };
    assert_eq!(reports(&user).len(), 1, "one mount: one report in `mounts`");
    let _two = user.mount(&other, &root.join("m2"), &root.join("c2"), &[]);
    assert_eq!(reports(&user).len(), 2, "two mounts: two");

    let (ok, out, err) = user.run(&["prefetch", "org/m", "--json"]);
    assert!(ok, "{err}");
    let prefetched = json(&out);
    let states: Vec<(&str, &str)> = prefetched["files"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| {
            (
                f["path"].as_str().unwrap_or_default(),
                f["state"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(states, [("org/m/model.safetensors", "staged")], "{out}");
    let (ok, out, _) = user.run(&["prefetch", "org/m", "--json", "--dry-run"]);
    assert!(ok);
    assert_eq!(json(&out)["files"][0]["state"], "already_staged", "{out}");

    // status MODEL: that model, and its cached files.
    let (ok, out, err) = user.run(&["status", "org/m"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("model") || l.starts_with("  "))
        .collect();
    assert_eq!(
        lines,
        [
            // The prefetch kept the small file too, what loading it offline needs.
            "model     org/m (plain model folder): 2/2 files staged, 2.0 MiB of 2.0 MiB",
            "  ready offline",
            "  cached  org/m/model.safetensors (2.0 MiB)",
            "  cached  org/m/config.json (2 B)"
        ],
        "{out}"
    );
    let (ok, out, _) = user.run(&["status", "org/m", "--json"]);
    assert!(ok);
    let model = &json(&out)["mounts"][0]["models"][0];
    assert_eq!(
        model["files"][0]["path"], "org/m/model.safetensors",
        "{out}"
    );

    let (ok, out, err) = user.run(&["verify", "org/m", "--json"]);
    assert!(ok, "{err}");
    assert_eq!(json(&out)["checked"], 2, "{out}");
    let (ok, out, err) = user.run(&["evict", "org/m", "--json"]);
    assert!(ok, "{err}");
    let evicted = json(&out);
    let mut paths: Vec<&str> = evicted["evicted"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["path"].as_str())
        .collect();
    paths.sort_unstable();
    assert_eq!(
        paths,
        ["org/m/config.json", "org/m/model.safetensors"],
        "{out}"
    );
    assert_eq!(evicted["freed"], (2 << 20) + 2);

    // doctor --json: JSON for what it examines, and for what it cannot.
    let (_, out, _) = user.run(&["doctor", "--json", "org/m", "--cache-dir", &text(&s.cache)]);
    assert!(json(&out)["checks"].is_array(), "{out}");
    let missing = root.join("no-such-folder");
    let (ok, out, err) = user.run(&["doctor", "--json", &text(&missing)]);
    assert!(!ok, "{out}");
    let refused = json(&out);
    let said = format!("{} does not exist", missing.display());
    assert_eq!(refused["failed"], true, "{out}");
    assert_eq!(refused["checks"][0]["verdict"], "fail", "{out}");
    assert_eq!(refused["checks"][0]["summary"], said.as_str(), "{out}");
    assert_eq!(err, format!("stagefs: {said}\n"), "the line on stderr too");
}

#[test]
fn status_names_what_a_mount_cannot_stage_and_why_its_last_stagings_failed() {
    let s = Scratch::new();
    let user = User::new(&s);
    folder(&s.hub, "org/small", 1);
    let big = folder(&s.hub, "org/big", 2);
    fs::write(big.join("model.safetensors"), pseudo_random(3 << 20, 3)).expect("weights");
    let (_mounted, err) = user.mount_saying(&s.hub, &s.mnt, &s.cache, &["--max-size", "2621440"]);
    let too_large = "org/big/model.safetensors (3.0 MiB) is larger than the cache's --max-size (2.5 MiB): opening it fails; raise --max-size";
    assert_eq!(
        err,
        format!("stagefs: warning: {too_large}; `stagefs status` lists them\n")
    );
    stage(&s.mnt, "org/small/model.safetensors");
    assert!(fs::read(s.mnt.join("org/big/model.safetensors")).is_err());
    let (ok, out, err) = user.run(&["status"]);
    assert!(ok, "{err}");
    assert!(out.contains(&format!("\ntoo large {too_large}\n")), "{out}");
    let failed = out
        .lines()
        .find(|l| l.starts_with("failed    "))
        .unwrap_or_default();
    assert!(
        failed.starts_with(
            "failed    org/big/model.safetensors: needs 3.0 MiB but the cache cannot make room ("
        ) && failed.contains(
            "; raise --max-size, lower --min-free, free disk space, or close models in use ("
        ) && failed.ends_with(" ago)"),
        "{out}"
    );
    // Scripts read the same.
    let report = status_json(&s.cache);
    assert_eq!(report["failures"][0]["path"], "org/big/model.safetensors");
    assert_eq!(report["too_large"][0]["bytes"], 3 << 20);
}

#[test]
fn counts_agree_and_status_shows_a_revision_prefetch_takes() {
    let s = Scratch::new();
    let user = User::new(&s);
    let model = generate(&s.hub, "acme/a", 1, "2M");
    // A second repository holding the same blob (as a fork or a re-upload does).
    let copied = Command::new("cp")
        .arg("-a")
        .arg(s.hub.join("models--acme--a"))
        .arg(s.hub.join("models--acme--b"))
        .status();
    assert!(copied.is_ok_and(|st| st.success()));
    fs::write(s.hub.join("token"), "hf_secret").expect("token");
    let _mounted = user.mount(&s.hub, &s.mnt, &s.cache, &[]);
    let shard = model.shards().remove(0);
    stage(&s.mnt, shard.to_str().expect("utf-8"));
    // A loader reads these small files; the mount keeps copies of them.
    stage(&s.mnt, "models--acme--a/refs/main");
    stage(&s.mnt, "token");
    wait_for("the small files' copies", || {
        status_json(&s.cache)["usage"]["entries"] == 3
    });
    let (ok, out, err) = user.run(&["status"]);
    assert!(ok, "{err}");
    let used = out
        .lines()
        .find(|l| l.starts_with("used"))
        .unwrap_or_default();
    assert!(
        used.contains(" in 3 files, 2 of them no model's (")
            && used.contains("acme/a: refs/main")
            && used.contains("token"),
        "{out}"
    );
    let commit = &model.commit;
    for repo in ["acme/a", "acme/b"] {
        let block = format!(
            "model     {repo}: 1 staged file, 2.0 MiB\n  {commit} (main): 1/3 files, 2.0 MiB of 2.0 MiB\n"
        );
        assert!(out.contains(&block), "{block}in\n{out}");
    }
    // The hash status shows is one prefetch takes.
    let (ok, out, err) = user.run(&["prefetch", "acme/b", "--revision", commit]);
    assert!(ok, "{out}{err}");
}

#[test]
fn revision_main_is_a_plain_folders_own() {
    let s = Scratch::new();
    let user = User::new(&s);
    folder(&s.hub, "org/m", 1);
    let _mounted = user.mount(&s.hub, &s.mnt, &s.cache, &[]);
    let (ok, out, err) = user.run(&["prefetch", "org/m", "--revision", "main"]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("staged org/m/model.safetensors (2.0 MiB)"),
        "{out}"
    );
    let (ok, _, err) = user.run(&["prefetch", "org/m", "--revision", "v2"]);
    assert!(!ok);
    assert!(
        err.contains("org/m is a plain model folder (org/m), which has no revisions"),
        "{err}"
    );
}

#[test]
fn status_says_a_mount_asked_to_stop_with_files_open_is_detached() {
    let s = Scratch::new();
    folder(&s.hub, "org/m", 1);
    let mut mount = stagefs_tests::Mount::start(&s.hub, &s.mnt, &s.cache, &["--no-prefetch"]);
    let open = fs::File::open(s.mnt.join("org/m/model.safetensors")).expect("open");
    mount.signal(libc::SIGINT);
    let status = || {
        let (ok, out, err) = stagefs_tests::run_stagefs(&[&"status", &"--cache-dir", &s.cache]);
        assert!(ok, "{err}");
        out
    };
    wait_for("status to say the mount is detached", || {
        status().contains(&format!("mount     {} (detached, fuse): ", s.mnt.display()))
    });
    let out = status();
    assert!(
        out.contains("detached with files still open there (asked to stop, or unmounted with --lazy); new opens no longer reach it, the open files are served until they are closed, then it exits (SIGINT or SIGTERM to it once more stops it at once)\n"),
        "{out}"
    );
    assert!(!out.contains("(running"), "{out}");
    assert_eq!(status_json(&s.cache)["stopping"], "detached");
    drop(open);
    let exited = mount.wait_exit();
    // Seen once in CI and once in 15 runs on a busy machine: exit status 1, cause not
    // found yet; the daemon's log says why next time.
    let log = fs::read_to_string(&mount.log).unwrap_or_default();
    assert!(exited.success(), "{exited}\n{log}");
}

#[test]
fn prefetch_parallel_through_a_mount_is_the_number_it_copies_at_a_time() {
    let s = Scratch::new();
    folder(&s.hub, "org/m", 1);
    folder(&s.hub, "org/n", 2);
    let mount =
        stagefs_tests::Mount::start(&s.hub, &s.mnt, &s.cache, &["--prefetch-parallel", "3"]);
    let prefetch = |model: &str, extra: &[&str]| {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> =
            vec![&"prefetch", &"--cache-dir", &s.cache];
        args.push(&model);
        args.extend(extra.iter().map(|a| a as &dyn AsRef<std::ffi::OsStr>));
        let (ok, out, err) = stagefs_tests::run_stagefs(&args);
        assert!(ok, "{out}{err}");
    };
    prefetch("org/m", &["--parallel", "8"]);
    let log = mount.log_text();
    assert!(
        log.contains("prefetching on request files=1 at_a_time=8"),
        "{log}"
    );
    // Not asked, the mount copies as many as it does itself.
    prefetch("org/n", &[]);
    let log = mount.log_text();
    assert!(
        log.contains("prefetching on request files=1 at_a_time=3"),
        "{log}"
    );
}
