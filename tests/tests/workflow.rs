//! The everyday workflow: a config file instead of flags, `stagefs run` around a
//! loader, and the login service's files.

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use stagefs_tests::{
    Scratch, generate, is_mounted, python, staged_files, staged_files_of_at_least, stagefs_bin,
};

/// Writes `text` as a config file in the scratch area.
fn config_file(s: &Scratch, text: &str) -> PathBuf {
    let path = s.dir.path().join("config.toml");
    fs::write(&path, text).expect("writing config");
    path
}

/// A config naming the scratch source, mount point and cache.
fn daily_config(s: &Scratch) -> PathBuf {
    config_file(
        s,
        &format!(
            "# the NAS\nsource = \"{}\"\nmountpoint = \"{}\"\ncache_dir = \"{}\"\nmin_stage_size = \"64K\"\nmin_free = \"64M\"\n",
            s.hub.display(),
            s.mnt.display(),
            s.cache.display()
        ),
    )
}

fn stagefs(config: &Path, args: &[&str]) -> Output {
    Command::new(stagefs_bin())
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .expect("running stagefs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Unmounts a background mount when the test ends, even a failing one.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new(stagefs_bin())
            .args(["--no-config", "unmount", "--lazy"])
            .arg(&self.0)
            .output();
    }
}

#[test]
fn the_config_file_drives_mount_and_unmount_and_flags_override_it() {
    let s = Scratch::new();
    let model = generate(&s.hub, "org/cfg-model", 2, "256K");
    let config = daily_config(&s);
    let other_cache = s.dir.path().join("flag-cache");
    let _guard = Unmount(s.mnt.clone());

    let out = stagefs(
        &config,
        &["mount", "--cache-dir", other_cache.to_str().expect("utf-8")],
    );
    assert!(out.status.success(), "mount: {}", text(&out.stderr));
    assert!(is_mounted(&s.mnt), "the configured mount point is mounted");
    let shard = &model.shards()[0];
    fs::read(s.mnt.join(shard)).expect("read through the mount");

    // The flag's cache got the copy (and perhaps the other shard, which opening one
    // prefetches), and the file's min_stage_size (64K, not the 1M default) is what
    // made a 256K shard stage at all.
    let staged = staged_files(&other_cache).len();
    assert!(
        (1..=2).contains(&staged),
        "{staged} copies in the flag's cache"
    );
    assert!(staged_files(&s.cache).is_empty(), "config cache_dir unused");
    let record: serde_json::Value =
        serde_json::from_slice(&fs::read(other_cache.join("mount.json")).expect("mount.json"))
            .expect("json");
    assert_eq!(record["min_stage_size"], 65536);

    let out = stagefs(&config, &["unmount"]);
    assert!(out.status.success(), "unmount: {}", text(&out.stderr));
    assert!(!is_mounted(&s.mnt));
}

#[test]
fn config_errors_name_the_file_line_and_key() {
    let s = Scratch::new();
    let cases = [
        (
            "source = \"/srv/hub\"\n\nmax_size = \"20X\"\n",
            "line 3, key `max_size`: '20X': unknown size suffix",
        ),
        (
            "mount_point = \"/x\"\n",
            "line 1: unknown key `mount_point`; did you mean `mountpoint`?",
        ),
        (
            "cache_dir = \"relative\"\n",
            "line 1, key `cache_dir`: 'relative' must be an absolute path",
        ),
        (
            "prefetch = \"yes\"\n",
            "line 1, key `prefetch`: invalid type",
        ),
    ];
    for (body, expected) in cases {
        let config = config_file(&s, body);
        let out = stagefs(&config, &["status"]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{body}: {err}");
        assert!(
            err.contains(&format!("config file {}, {expected}", config.display())),
            "{body}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "one line: {err}");
    }
    let missing = s.dir.path().join("missing.toml");
    let out = stagefs(&missing, &["status"]);
    assert!(text(&out.stderr).contains("reading config file"));
    let empty = config_file(&s, "");
    let out = stagefs(&empty, &["mount"]);
    assert!(
        text(&out.stderr)
            .contains("no source given: pass it on the command line or set `source` in"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn run_mounts_stages_and_hands_over_environment_exit_code_and_signals() {
    let s = Scratch::new();
    let model = generate(&s.hub, "org/run-model", 3, "256K");
    let config = daily_config(&s);
    let _guard = Unmount(s.mnt.clone());
    let show_env =
        "echo \"$HF_HUB_CACHE|$HF_HUB_OFFLINE|${AGX_RELAX_CDM_CTXSTORE_TIMEOUT-unset}\"; exit 7";

    let out = stagefs(
        &config,
        &[
            "run",
            "--offline",
            "--model",
            &model.repo,
            "--",
            "sh",
            "-c",
            show_env,
        ],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "exit code passed on: {err}");
    assert_eq!(
        text(&out.stdout).trim(),
        format!("{}|1|unset", s.mnt.display())
    );
    assert!(err.contains("mounted"), "says it mounted: {err}");
    assert!(is_mounted(&s.mnt), "the mount stays up");
    // The shards (about 256K); the small files the prefetch kept are under 1K.
    assert_eq!(
        staged_files_of_at_least(&s.cache, 64 << 10).len(),
        model.shards().len(),
        "every shard staged before the command started"
    );
    // Issue 46: what stagefs says is told from COMMAND's output by its prefix, the
    // per-file lines too.
    let out = stagefs(&config, &["run", "--model", &model.repo, "--", "true"]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("\nstagefs: already staged "), "{err}");
    assert!(err.lines().all(|l| l.starts_with("stagefs: ")), "{err}");

    let out = stagefs(
        &config,
        &["run", "--relax-gpu-watchdog", "--", "sh", "-c", show_env],
    );
    let err = text(&out.stderr);
    // The mount is writable: online, unless asked.
    assert_eq!(text(&out.stdout).trim(), format!("{}||1", s.mnt.display()));
    assert!(!err.contains("mounted"), "reuses the live mount: {err}");
    assert!(
        err.contains("AGX_RELAX_CDM_CTXSTORE_TIMEOUT=1"),
        "never silent: {err}"
    );

    let resolve = format!(
        "from huggingface_hub import hf_hub_download; print(hf_hub_download({:?}, 'model-00001-of-00003.safetensors'))",
        model.repo
    );
    let out = Command::new(stagefs_bin())
        .arg("--config")
        .arg(&config)
        .args(["run", "--offline", "--"])
        .arg(python())
        .args(["-c", &resolve])
        .env("HF_HUB_CACHE", "/nonexistent/elsewhere")
        .output()
        .expect("run python");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let resolved = PathBuf::from(text(&out.stdout).trim());
    assert!(resolved.starts_with(&s.mnt), "{}", resolved.display());
    assert_eq!(
        fs::read(&resolved).expect("resolved file"),
        fs::read(s.hub.join(&model.shards()[0])).expect("source file")
    );

    let out = stagefs(&config, &["run", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(out.status.signal(), Some(libc::SIGTERM), "signal passed on");
    // Issue 36: a command that cannot run is said alone, not after "running with".
    let out = stagefs(&config, &["run", "--", "/nonexistent/program"]);
    assert_eq!(out.status.code(), Some(127));
    assert_eq!(
        text(&out.stderr),
        "stagefs: cannot run /nonexistent/program: No such file or directory\n"
    );
    let out = stagefs(&config, &["run", "--", "no-such-program-anywhere"]);
    assert_eq!(out.status.code(), Some(127));
    assert_eq!(
        text(&out.stderr),
        "stagefs: cannot run no-such-program-anywhere: No such file or directory\n"
    );
    let script = s.dir.path().join("not-executable.sh");
    fs::write(&script, "#!/bin/sh\n").expect("script");
    let out = stagefs(&config, &["run", "--", script.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(126));
    assert_eq!(
        text(&out.stderr),
        format!(
            "stagefs: cannot run {}: Permission denied\n",
            script.display()
        )
    );
}

#[test]
fn run_without_a_config_uses_the_mount_its_cache_serves() {
    let s = Scratch::new();
    let _live = s.mount(&[]);
    let out = Command::new(stagefs_bin())
        .args(["--no-config", "run", "--cache-dir"])
        .arg(&s.cache)
        .args(["--", "sh", "-c", "echo $HF_HUB_CACHE"])
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), s.mnt.display().to_string());
    let out = Command::new(stagefs_bin())
        .args(["--no-config", "run", "--cache-dir"])
        .arg(s.dir.path().join("unused-cache"))
        .args(["--", "true"])
        .output()
        .expect("run");
    assert!(
        text(&out.stderr).contains("no source given"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn run_refuses_a_cache_that_serves_another_mount() {
    let s = Scratch::new();
    let _live = s.mount(&[]);
    let elsewhere = s.dir.path().join("mnt2");
    fs::create_dir(&elsewhere).expect("mkdir");
    let config = daily_config(&s);
    let out = stagefs(
        &config,
        &[
            "run",
            "--mountpoint",
            elsewhere.to_str().expect("utf-8"),
            "--",
            "true",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("already serves"),
        "{}",
        text(&out.stderr)
    );
    assert!(!is_mounted(&elsewhere));
}

/// Issue 46: with the configured mount up, `service install` warned that the mount
/// point was not empty, and a second `mount` of the same config exited 1, so a unit
/// restarted on failure would fail every 30 s. The same mount up is success; another
/// source on that mount point is refused as before, and a mount refused the cache
/// leaves the running mount's log alone.
#[test]
fn the_configured_mount_already_up_is_success() {
    let s = Scratch::new();
    generate(&s.hub, "org/up", 1, "256K");
    let config = daily_config(&s);
    let _guard = Unmount(s.mnt.clone());
    let out = stagefs(&config, &["mount"]);
    assert!(out.status.success(), "mount: {}", text(&out.stderr));
    let already = format!(
        "already mounted: {} at {} (cache {}); unmount it first to change its options\n",
        s.hub.display(),
        s.mnt.display(),
        s.cache.display()
    );
    for args in [&["mount"][..], &["mount", "--foreground"]] {
        let out = stagefs(&config, args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout), already, "{args:?}");
        assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    }
    let xdg = s.dir.path().join("xdg");
    let out = Command::new(stagefs_bin())
        .arg("--config")
        .arg(&config)
        .args(["service", "install", "--dry-run"])
        .env("XDG_CONFIG_HOME", &xdg)
        .output()
        .expect("running stagefs service");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "", "no warning about our own mount");

    let log = fs::read_to_string(s.cache.join("stagefs.log")).expect("log");
    let other_source = s.dir.path().join("other-hub");
    fs::create_dir(&other_source).expect("mkdir");
    let source = other_source.to_str().expect("utf-8");
    let out = stagefs(&config, &["mount", source]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("is already a mount point; unmount it first"),
        "{}",
        text(&out.stderr)
    );
    let elsewhere = s.dir.path().join("mnt2");
    fs::create_dir(&elsewhere).expect("mkdir");
    let out = stagefs(
        &config,
        &["mount", source, elsewhere.to_str().expect("utf-8")],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains(&format!("is in use by the mount at {}", s.mnt.display())),
        "{}",
        text(&out.stderr)
    );
    assert!(!is_mounted(&elsewhere));
    let after = fs::read_to_string(s.cache.join("stagefs.log")).expect("log");
    assert_eq!(
        after, log,
        "the refused mount wrote nothing into the running one's log"
    );
}

/// A mount detached with a file still open there (`unmount --lazy`) is served by a
/// daemon that still answers, but nothing is mounted: `mount` must not call it up
/// (a unit restarted on failure would then leave no mount, with no error), and
/// `run` must not hand COMMAND the empty mount point. Both say the cache is in use.
#[test]
fn a_mount_detached_with_files_open_is_not_taken_for_one_that_is_up() {
    let s = Scratch::new();
    let model = generate(&s.hub, "org/held", 1, "256K");
    let config = daily_config(&s);
    let _guard = Unmount(s.mnt.clone());
    let out = stagefs(&config, &["mount"]);
    assert!(out.status.success(), "mount: {}", text(&out.stderr));
    let shard = s.mnt.join(&model.snapshot_rel).join(&model.files[1].name);
    let mut holder = Command::new(python())
        .args([
            "-c",
            "import sys; f = open(sys.argv[1], 'rb'); print('open', flush=True); sys.stdin.read()",
        ])
        .arg(&shard)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("read");
    assert_eq!(line, "open\n");
    let out = stagefs(&config, &["unmount", "--lazy"]);
    assert!(out.status.success(), "unmount: {}", text(&out.stderr));
    assert!(!is_mounted(&s.mnt));
    let status = stagefs(&config, &["status"]);
    let detached = format!(
        "mount     {} (detached, fuse): detached with files still open there",
        s.mnt.display()
    );
    assert!(
        text(&status.stdout).contains(&detached),
        "{}{}",
        text(&status.stdout),
        text(&status.stderr)
    );
    for args in [&["mount"][..], &["run", "--", "true"]] {
        let out = stagefs(&config, args);
        let err = text(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{args:?}: {}{err}",
            text(&out.stdout)
        );
        assert!(!text(&out.stdout).contains("already mounted"), "{args:?}");
        assert!(err.contains("is in use"), "{args:?}: {err}");
    }
    assert!(!is_mounted(&s.mnt));
    // The last file closed, the daemon ends, and the mount can be made again.
    drop(holder.stdin.take());
    holder.wait().expect("wait");
    let mut again = stagefs(&config, &["mount"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !again.status.success() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
        again = stagefs(&config, &["mount"]);
    }
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(is_mounted(&s.mnt));
}

/// `run --read-only` over a writable mount already running would let COMMAND
/// write to the source: refused, and COMMAND is not run. Without it, `run` uses the
/// running mount and says that its options stand.
#[test]
fn run_read_only_over_a_running_writable_mount_is_refused() {
    let s = Scratch::new();
    generate(&s.hub, "org/rw", 1, "256K");
    let config = daily_config(&s);
    let _guard = Unmount(s.mnt.clone());
    let out = stagefs(&config, &["mount"]);
    assert!(out.status.success(), "mount: {}", text(&out.stderr));
    let marker = s.dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let out = stagefs(&config, &["run", "--read-only", "--", "sh", "-c", &touch]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(
        err,
        format!(
            "stagefs: the mount at {m} is already running and writable, so --read-only would not hold for COMMAND; unmount it first (`stagefs unmount {m}`) and run again\n",
            m = s.mnt.display()
        )
    );
    assert!(!marker.exists(), "COMMAND ran");
    let out = stagefs(
        &config,
        &["run", "--max-size", "1G", "--", "sh", "-c", &touch],
    );
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(marker.exists(), "COMMAND did not run");
    let using = format!(
        "stagefs: using the mount already running at {}; its own options stand (unmount it first to change them)\n",
        s.mnt.display()
    );
    assert!(err.starts_with(&using), "{err}");
}

#[test]
fn service_files_start_the_configured_mount() {
    let s = Scratch::new();
    // Spaces and `%` need quoting and escaping in a unit file.
    let awkward = s.dir.path().join("my conf 100%");
    fs::create_dir(&awkward).expect("mkdir");
    let config = awkward.join("config.toml");
    fs::rename(daily_config(&s), &config).expect("move config");
    let xdg = s.dir.path().join("xdg");
    let service = |args: &[&str]| {
        Command::new(stagefs_bin())
            .arg("--config")
            .arg(&config)
            .arg("service")
            .args(args)
            .env("XDG_CONFIG_HOME", &xdg)
            .output()
            .expect("running stagefs service")
    };
    let out = service(&["install", "--dry-run"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    let unit = xdg.join("systemd/user/stagefs.service");
    assert!(
        shown.starts_with(&format!("would write {}:\n", unit.display())),
        "{shown}"
    );
    let exe = fs::canonicalize(stagefs_bin()).expect("exe");
    let exec = format!(
        "ExecStart=\"{}\" \"--config\" \"{}\" \"mount\" \"--foreground\"\n",
        exe.display(),
        config.display().to_string().replace('%', "%%")
    );
    assert!(shown.contains(&exec), "{shown}");
    assert!(shown.contains(&format!(
        "Description=stagefs: stage {} at {}\n",
        s.hub.display(),
        s.mnt.display()
    )));
    assert!(shown.contains("Restart=on-failure\n"));
    // Issue 46: a stop lets the daemon serve a model still open until it is closed.
    assert!(shown.contains("\nTimeoutStopSec=infinity\n"), "{shown}");
    assert!(shown.contains("WantedBy=default.target\n"));
    assert!(shown.contains("would run: systemctl --user enable --now stagefs.service"));
    assert!(!unit.exists(), "a dry run writes nothing");
    assert!(text(&out.stderr).is_empty(), "{}", text(&out.stderr));
    verify_unit(&s, &shown);
    // A mount point that is not there now: the service would fail at every start.
    fs::remove_dir(&s.mnt).expect("rmdir");
    let out = service(&["install", "--dry-run"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stderr),
        format!(
            "stagefs: warning: the mount point {0} does not exist; create it (mkdir -p {0}), or the service fails at every start\n",
            s.mnt.display()
        )
    );
    fs::create_dir(&s.mnt).expect("mkdir");
    fs::write(s.mnt.join("left-over"), "x").expect("write");
    let out = service(&["install", "--dry-run"]);
    assert_eq!(
        text(&out.stderr),
        format!(
            "stagefs: warning: the mount point {} is not empty; empty it or pick another, or the service fails at every start\n",
            s.mnt.display()
        )
    );
    fs::remove_file(s.mnt.join("left-over")).expect("rm");
    // Issue 36: a source that is not there now is said too (a share may come later).
    let away = s.dir.path().join("hub-away");
    fs::rename(&s.hub, &away).expect("move the source away");
    let out = service(&["install", "--dry-run"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stderr),
        format!(
            "stagefs: warning: the source {}: No such file or directory; the service's mount fails until it is there (mount the share, or fix `source` in the config file)\n",
            s.hub.display()
        )
    );
    fs::rename(&away, &s.hub).expect("move the source back");
    // A mount point inside the source could never start: refused, nothing written.
    let inner = s.hub.join("inner");
    fs::create_dir(&inner).expect("mkdir");
    let inside = awkward.join("inside.toml");
    fs::write(
        &inside,
        format!(
            "source = \"{}\"\nmountpoint = \"{}\"\ncache_dir = \"{}\"\n",
            s.hub.display(),
            inner.display(),
            s.cache.display()
        ),
    )
    .expect("config");
    let out = Command::new(stagefs_bin())
        .arg("--config")
        .arg(&inside)
        .args(["service", "install"])
        .env("XDG_CONFIG_HOME", &xdg)
        .output()
        .expect("running stagefs service");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        format!(
            "stagefs: mount point {} must not be inside the source {}: the mount would contain itself without end\n",
            inner.display(),
            s.hub.display()
        )
    );
    assert!(!unit.exists(), "nothing written");
    fs::remove_dir(&inner).expect("rmdir");

    let out = service(&["uninstall", "--dry-run"]);
    assert!(
        text(&out.stdout).contains("would run: systemctl --user disable --now stagefs.service")
    );
    let out = service(&["status"]);
    assert!(text(&out.stdout).contains("service: not installed"));

    let out = Command::new(stagefs_bin())
        .args(["--no-config", "service", "install", "--dry-run"])
        .output()
        .expect("running stagefs service");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("no config file"));
}

/// systemd's own parser accepts the unit: quoting, escaping, keys, an executable
/// ExecStart.
fn verify_unit(s: &Scratch, dry_run: &str) {
    let body: String = dry_run
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with("would run"))
        .map(|l| format!("{l}\n"))
        .collect();
    let dir = s.dir.path().join("unit");
    fs::create_dir(&dir).expect("mkdir");
    let file = dir.join("stagefs.service");
    fs::write(&file, body.trim_end()).expect("write unit");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&file)
        .output()
        .expect("systemd-analyze (apt-get install systemd)");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify: {}",
        text(&out.stderr)
    );
}
