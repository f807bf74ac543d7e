//! `stagefs doctor` against real sources: a local directory, a path inside a live
//! stagefs mount, a capped sshfs share, a share whose link was cut, one unmounted
//! underneath, one whose sshfs was killed, and a source the user may not read.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;
use stagefs_source::fskind::filesystem_of;
use stagefs_tests::{Mount, NetFs, Scratch, generate, stagefs_bin};

/// Far above doctor's own 15 s deadline: only a doctor that hangs hits it.
const HARNESS_TIMEOUT: Duration = Duration::from_secs(120);

/// What one doctor run printed.
struct Run {
    success: bool,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "doctor --json printed no JSON ({e}): {}\n{}",
                self.stdout, self.stderr
            )
        })
    }
}

/// Runs `stagefs ARGS` with `env` added to a clean HuggingFace environment, killing
/// it if it outlives the harness timeout.
fn stagefs(args: &[&dyn AsRef<OsStr>], env: &[(&str, &dyn AsRef<OsStr>)]) -> Run {
    let mut command = Command::new(stagefs_bin());
    command
        .args(args.iter().map(|a| a.as_ref()))
        .env_remove("STAGEFS_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for name in ["HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME"] {
        command.env_remove(name);
    }
    for (name, value) in env {
        command.env(name, value.as_ref());
    }
    let child = command.spawn().expect("starting stagefs");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let Ok(output) = rx.recv_timeout(HARNESS_TIMEOUT) else {
        // SAFETY: kill(2) on the child we started; at worst it already exited.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        panic!("stagefs {} hung", display_args(args));
    };
    let output = output.expect("waiting for stagefs");
    Run {
        success: output.status.success(),
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn display_args(args: &[&dyn AsRef<OsStr>]) -> String {
    args.iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `stagefs --no-config doctor TARGET --json --cache-dir CACHE`.
fn doctor_json(target: &dyn AsRef<OsStr>, cache: &Path) -> Run {
    stagefs(
        &[
            &"--no-config",
            &"doctor",
            target,
            &"--json",
            &"--cache-dir",
            &cache,
        ],
        &[],
    )
}

/// The check called `name`.
fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no `{name}` check in {report:#}"))
}

fn positive(value: &Value) -> bool {
    value.as_f64().is_some_and(|v| v > 0.0)
}

/// A config file naming the scratch area's source, mount point and cache.
fn config_file(s: &Scratch) -> PathBuf {
    let path = s.dir.path().join("config.toml");
    let text = format!(
        "source = {:?}\nmountpoint = {:?}\ncache_dir = {:?}\n",
        s.hub.display().to_string(),
        s.mnt.display().to_string(),
        s.cache.display().to_string()
    );
    fs::write(&path, text).expect("writing the config file");
    path
}

#[test]
fn a_local_directory_is_local_and_measured() {
    let s = Scratch::new();
    generate(&s.hub, "acme/local", 2, "8M");
    let run = doctor_json(&s.hub, &s.cache);
    assert!(run.success, "{}\n{}", run.stdout, run.stderr);
    let report = run.json();
    let source = &report["source"];
    assert_eq!(source["kind"], "local", "{report:#}");
    assert_eq!(source["network"], false);
    assert!(positive(&source["probe"]["latency_ms"]), "{report:#}");
    assert!(
        positive(&source["probe"]["throughput_bytes_per_sec"]),
        "{report:#}"
    );
    assert_eq!(check(&report, "source")["verdict"], "ok");
    assert_eq!(report["failed"], false);

    let human = stagefs(
        &[&"--no-config", &"doctor", &s.hub, &"--cache-dir", &s.cache],
        &[],
    );
    let first = human.stdout.lines().next().unwrap_or_default();
    assert!(first.starts_with("ok    fuse "), "{}", human.stdout);
}

#[test]
fn a_path_in_a_stagefs_mount_names_its_source_and_stages_nothing() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/mounted", 2, "4M");
    let mount = s.mount(&[]);
    let inside = mount.path(&model.snapshot_rel);
    let elsewhere = s.dir.path().join("doctor-cache");
    let run = doctor_json(&inside, &elsewhere);
    assert!(run.success, "{}\n{}", run.stdout, run.stderr);
    let report = run.json();
    let source = &report["source"];
    let hub = fs::canonicalize(&s.hub).expect("hub");
    assert_eq!(source["kind"], "stagefs", "{report:#}");
    assert_eq!(source["stagefs_source"], hub.display().to_string());
    assert_eq!(
        source["mount_point"],
        fs::canonicalize(&s.mnt).expect("mnt").display().to_string()
    );
    let summary = check(&report, "source")["summary"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        summary.contains("stagefs mount") && summary.contains(&hub.display().to_string()),
        "{summary}"
    );
    // The measurement reads the mount's source, not the mount, so nothing is staged.
    let probed = source["probe"]["file"].as_str().unwrap_or_default();
    assert!(Path::new(probed).starts_with(&hub), "{probed}");
    assert_eq!(report["model"]["id"], "acme/mounted");
    assert_eq!(mount.metrics().stage_copies, 0);
    drop(mount);
}

#[test]
fn an_sshfs_source_is_network_and_measured() {
    let s = Scratch::new();
    generate(&s.hub, "acme/remote", 1, "24M");
    let remote = NetFs::up(&s.hub, &s.dir.path().join("nas"), "200mbit");
    let run = doctor_json(&remote.mnt, &s.cache);
    assert!(run.success, "{}\n{}", run.stdout, run.stderr);
    let report = run.json();
    let source = &report["source"];
    assert_eq!(source["kind"], "network", "{report:#}");
    assert_eq!(source["network"], true);
    assert_eq!(source["fstype"], "fuse.sshfs");
    // Issue 46: the options that survive a dropped connection are advised before one.
    let advice = check(&report, "source")["advice"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(
        advice,
        "unless the sshfs command has them, add `-o reconnect,ServerAliveInterval=15` so that it survives dropped connections",
        "{report:#}"
    );
    let rate = &source["probe"]["throughput_bytes_per_sec"];
    assert!(positive(rate), "{report:#}");
    // 200 Mbit/s is 25 MB/s: well below ten times that, or the page cache was measured.
    assert!(rate.as_f64().unwrap_or_default() < 250e6, "{report:#}");
    drop(remote);
}

#[test]
fn a_cut_source_fails_instead_of_hanging() {
    let s = Scratch::new();
    generate(&s.hub, "acme/gone", 1, "4M");
    let remote = NetFs::up(&s.hub, &s.dir.path().join("nas"), "200mbit");
    remote.cut();
    let run = doctor_json(&remote.mnt, &s.cache);
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    let report = run.json();
    assert_eq!(report["failed"], true);
    let failed: Vec<&Value> = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["verdict"] == "fail")
        .collect();
    assert!(
        failed.iter().any(|c| c["summary"]
            .as_str()
            .is_some_and(|t| t.contains("did not answer within"))),
        "{report:#}"
    );
    // A hung link is told from a dead or unmounted share: its server does not answer.
    let advice = check(&report, "source")["advice"]
        .as_str()
        .unwrap_or_default();
    let expected = "its server or the network to it does not answer: check that the NAS is on and reachable; if it stays hung, `umount -l ";
    assert!(advice.starts_with(expected), "{advice}");
    drop(remote);
}

/// `stagefs --no-config doctor [TARGET] --cache-dir CACHE`, as a user reads it.
fn doctor_human(target: Option<&Path>, cache: &Path) -> Run {
    match target {
        Some(t) => stagefs(
            &[&"--no-config", &"doctor", &t, &"--cache-dir", &cache],
            &[],
        ),
        None => stagefs(&[&"--no-config", &"doctor", &"--cache-dir", &cache], &[]),
    }
}

/// A report line as `doctor` renders it: the verdict and the name in their columns.
fn line(verdict: &str, name: &str, summary: &str) -> String {
    format!("{verdict:<6}{name:<13}{summary}")
}

/// An advice line, indented under its check.
fn advice(text: &str) -> String {
    format!("{:19}{text}", "")
}

/// Asserts that `run` failed with exit status 1 and printed `expected` lines in a
/// row.
fn fails_with(run: &Run, expected: &[String]) {
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    let found = lines
        .windows(expected.len())
        .any(|w| w.iter().zip(expected).all(|(a, b)| a == b));
    assert!(
        found,
        "expected\n{}\nin\n{}",
        expected.join("\n"),
        run.stdout
    );
}

const SSHFS_HINT: &str = "add `-o reconnect,ServerAliveInterval=15` to the sshfs command so that it survives dropped connections";

#[test]
fn a_nas_unmounted_underneath_fails_and_says_to_mount_it_again() {
    let s = Scratch::new();
    generate(&s.hub, "acme/dropped", 1, "2M");
    let remote = NetFs::up(&s.hub, &s.dir.path().join("nas"), "200mbit");
    // The mount records in the cache which filesystem its source is on.
    let mount = Mount::start(&remote.mnt, &s.mnt, &s.cache, &[]);
    let nas = fs::canonicalize(&remote.mnt).expect("nas");
    remote.drop_connection();
    let below = filesystem_of(&nas).expect("the filesystem under the mount point");
    let expected = [
        line(
            "fail",
            "source",
            &format!(
                "{0}: the share is not mounted any more: it was fuse.sshfs at {0} when this cache was last mounted, and the path is now a directory of {1} ({2})",
                nas.display(),
                below.mount_point.display(),
                below.fstype
            ),
        ),
        advice(&format!(
            "mount the share at {} again; {SSHFS_HINT}",
            nas.display()
        )),
    ];
    // With the mount running, doctor examines the source it serves.
    fails_with(&doctor_human(None, &s.cache), &expected);
    mount.unmount();
    fails_with(&doctor_human(Some(&remote.mnt), &s.cache), &expected);
}

#[test]
fn a_killed_sshfs_fails_and_names_the_unmount() {
    let s = Scratch::new();
    generate(&s.hub, "acme/killed", 1, "2M");
    let remote = NetFs::up(&s.hub, &s.dir.path().join("nas"), "200mbit");
    let mount = Mount::start(&remote.mnt, &s.mnt, &s.cache, &[]);
    let nas = fs::canonicalize(&remote.mnt).expect("nas");
    remote.kill_sshfs();
    let shown = nas.display();
    let expected = [
        line(
            "fail",
            "source",
            &format!(
                "{shown}: the fuse.sshfs mount at {shown} is dead: Transport endpoint is not connected"
            ),
        ),
        advice(&format!(
            "unmount it with `fusermount3 -u {shown}` (as root: `umount -l {shown}`), then mount the share again; {SSHFS_HINT}"
        )),
    ];
    fails_with(&doctor_human(None, &s.cache), &expected);
    drop(mount);
    fails_with(&doctor_human(Some(&nas), &s.cache), &expected);
}

#[test]
fn a_source_the_user_may_not_read_fails_as_refused_not_as_empty() {
    let s = Scratch::for_user();
    generate(&s.hub, "acme/private", 1, "1M");
    fs::set_permissions(&s.hub, fs::Permissions::from_mode(0o700)).expect("chmod");
    let user = s.user();
    let mut command = user.command(stagefs_bin());
    command.args(["--no-config", "doctor"]).arg(&s.hub);
    command.arg("--cache-dir").arg(&s.cache);
    let out = user.output(&mut command);
    let run = Run {
        success: out.status.success(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    let hub = fs::canonicalize(&s.hub).expect("hub").display().to_string();
    let expected = [
        line(
            "fail",
            "shape",
            &format!("cannot list {hub}: Permission denied"),
        ),
        advice(&format!(
            "give the user who runs stagefs read and search (x) permission on it and the directories above (`ls -ld {hub}` shows who has them)"
        )),
    ];
    fails_with(&run, &expected);
    assert!(!run.success && !run.stdout.contains("no model found"));
}

#[test]
fn hf_hub_cache_is_judged_against_the_mount_point() {
    let s = Scratch::new();
    generate(&s.hub, "acme/env", 1, "2M");
    let config = config_file(&s);
    let doctor = |hub_cache: &Path| {
        let run = stagefs(
            &[&"--config", &config, &"doctor", &"--json"],
            &[("HF_HUB_CACHE", &hub_cache)],
        );
        assert!(run.code.is_some(), "{}", run.stderr);
        run.json()
    };
    let pointed = doctor(&s.mnt);
    assert_eq!(check(&pointed, "hub-cache")["verdict"], "ok", "{pointed:#}");
    assert_eq!(pointed["hub_cache"]["points_at_mount"], true);
    assert_eq!(
        check(&pointed, "mount")["verdict"],
        "note",
        "not mounted yet"
    );

    let elsewhere = doctor(&s.dir.path().join("somewhere-else"));
    let hub_check = check(&elsewhere, "hub-cache");
    assert_eq!(hub_check["verdict"], "warn", "{elsewhere:#}");
    assert!(
        hub_check["advice"]
            .as_str()
            .is_some_and(|a| a.contains("HF_HUB_CACHE"))
    );

    let mount = s.mount(&[]);
    let up = doctor(&s.mnt);
    assert_eq!(check(&up, "mount")["verdict"], "ok", "{up:#}");
    assert_eq!(up["mount"]["up"], true);
    drop(mount);
}

#[test]
fn a_model_id_is_resolved_in_the_configured_source() {
    let s = Scratch::new();
    let model = generate(&s.hub, "stagefs/demo-model", 2, "4M");
    let config = config_file(&s);
    let run = stagefs(
        &[
            &"--config",
            &config,
            &"doctor",
            &"stagefs/demo-model",
            &"--json",
        ],
        &[],
    );
    assert!(run.code.is_some(), "{}", run.stderr);
    let report = run.json();
    let size: u64 = model.files.iter().map(|f| f.size).sum();
    assert_eq!(report["model"]["id"], "stagefs/demo-model", "{report:#}");
    assert_eq!(report["model"]["size_bytes"], size, "{report:#}");
    assert!(positive(&report["model"]["staging_seconds"]), "{report:#}");
    assert!(
        report["cache"]["available_bytes"]
            .as_u64()
            .is_some_and(|b| b > 0)
    );
    assert!(report["cache"]["usable_bytes"].as_u64().is_some());
    let space = check(&report, "space")["summary"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(space.contains("stagefs/demo-model needs"), "{space}");

    let missing = stagefs(&[&"--config", &config, &"doctor", &"stagefs/absent"], &[]);
    assert!(!missing.success);
    assert!(
        missing.stderr.contains("stagefs/absent is not in"),
        "{}",
        missing.stderr
    );
    // A fresh account: no running mount of its own, no cache recording a source.
    let fresh = s.dir.path().join("fresh-home");
    let unconfigured = stagefs(
        &[&"--no-config", &"doctor", &"stagefs/demo-model"],
        &[
            ("HOME", &fresh),
            ("XDG_STATE_HOME", &fresh.join("state")),
            ("XDG_CACHE_HOME", &fresh.join("cache")),
        ],
    );
    assert!(!unconfigured.success);
    assert!(
        unconfigured.stderr.contains("no source is configured"),
        "{}",
        unconfigured.stderr
    );
}

/// Issue 36: under a stock sshfs (`contain_symlinks`) every snapshot link is refused,
/// and doctor said "ok model acme/big-llm: 0 files, 0 B" and exited 0.
#[test]
fn a_share_that_refuses_snapshot_links_fails_the_model_and_names_the_option() {
    let s = Scratch::new();
    generate(&s.hub, "acme/big-llm", 1, "2M");
    let nas = s.dir.path().join("nas");
    let remote = NetFs::up_with(&s.hub, &nas, "1gbit", "contain_symlinks");
    let repo = remote.mnt.join("models--acme--big-llm");
    let run = stagefs(
        &[&"--no-config", &"doctor", &repo, &"--cache-dir", &s.cache],
        &[],
    );
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    let lines = [
        "fail  model        acme/big-llm: 3 links cannot be followed (0 of its files can be read); config.json: the source refuses to read the link (sshfs does unless mounted with `-o no_contain_symlinks`)",
        "                   mount the share again with `-o no_contain_symlinks`: sshfs refuses links with `..` by default, and every snapshot file links to ../../blobs/",
    ];
    for line in lines {
        assert!(
            run.stdout.lines().any(|l| l == line),
            "{line}\n{}",
            run.stdout
        );
    }
    drop(remote);
}

/// Issue 36: `doctor SRC` of a whole stock-sshfs share named no model, so it was all
/// ok while every snapshot link was refused: a few of its models' links are read.
#[test]
fn a_whole_share_that_refuses_snapshot_links_fails_and_names_the_option() {
    let s = Scratch::new();
    generate(&s.hub, "acme/big-llm", 1, "2M");
    let nas = s.dir.path().join("nas");
    let remote = NetFs::up_with(&s.hub, &nas, "1gbit", "contain_symlinks");
    let run = stagefs(
        &[
            &"--no-config",
            &"doctor",
            &remote.mnt,
            &"--cache-dir",
            &s.cache,
        ],
        &[],
    );
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    let lines = [
        "fail  model        acme/big-llm: 3 links cannot be followed (0 of its files can be read); config.json: the source refuses to read the link (sshfs does unless mounted with `-o no_contain_symlinks`)",
        "                   mount the share again with `-o no_contain_symlinks`: sshfs refuses links with `..` by default, and every snapshot file links to ../../blobs/",
    ];
    for line in lines {
        assert!(
            run.stdout.lines().any(|l| l == line),
            "{line}\n{}",
            run.stdout
        );
    }
    drop(remote);
    // The same source read directly, whose links lead to their blobs: no such line.
    let direct = stagefs(
        &[&"--no-config", &"doctor", &s.hub, &"--cache-dir", &s.cache],
        &[],
    );
    assert!(
        !direct.stdout.contains("cannot be followed"),
        "{}",
        direct.stdout
    );
}

/// Issue 36: a model folder examined with no source known to hold it is judged as a
/// source of its own; doctor says so, and how to have it judged as part of one.
#[test]
fn a_folder_no_source_is_known_to_hold_is_said_to_be_judged_alone() {
    let s = Scratch::new();
    let models = s.dir.path().join("models");
    let folder = plain_folder(&models.join("acme"));
    let alone = stagefs(
        &[&"--no-config", &"doctor", &folder, &"--cache-dir", &s.cache],
        &[],
    );
    let note = format!(
        "note  source       no mount or config file names a source holding {}, so it is judged as a source of its own",
        folder.display()
    );
    let lines = [
        note.as_str(),
        "                   if it lies in a larger source you mount, set `source` in the config file (or mount that source) and run doctor again to judge it as part of that source",
        "ok    model        Llama-Fake-4bit: 2 files, 1.9 MiB (plain model folder ",
    ];
    for line in lines {
        assert!(
            alone.stdout.lines().any(|l| l.starts_with(line)),
            "{line}\n{}",
            alone.stdout
        );
    }
    let config = s.dir.path().join("config.toml");
    fs::write(&config, format!("source = \"{}\"\n", models.display())).expect("config");
    let within = stagefs(
        &[
            &"--config",
            &config,
            &"doctor",
            &folder,
            &"--cache-dir",
            &s.cache,
        ],
        &[],
    );
    assert!(!within.stdout.contains("note  source"), "{}", within.stdout);
    assert!(
        within
            .stdout
            .contains("ok    model        acme/Llama-Fake-4bit: 2 files, 1.9 MiB"),
        "{}",
        within.stdout
    );
}

/// Issue 36: a link to a missing blob was counted among the files that can be read
/// ("5 of its files" for 4).
#[test]
fn a_link_to_a_missing_blob_is_not_counted_as_a_readable_file() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/holed", 2, "1M");
    let snapshot = s.hub.join(&model.shards()[0]);
    let snapshot = snapshot.parent().expect("snapshot dir");
    let readable = fs::read_dir(snapshot).expect("list").count();
    let missing = format!("../../blobs/{}", "0".repeat(64));
    std::os::unix::fs::symlink(&missing, snapshot.join("extra.safetensors")).expect("link");
    let repo = s.hub.join("models--acme--holed");
    let run = stagefs(
        &[&"--no-config", &"doctor", &repo, &"--cache-dir", &s.cache],
        &[],
    );
    let line = format!(
        "fail  model        acme/holed: 1 link cannot be followed ({readable} of its files can be read); extra.safetensors: it links to models--acme--holed/blobs/{}, which does not exist",
        "0".repeat(64)
    );
    assert!(
        run.stdout.lines().any(|l| l == line),
        "{line}\n{}",
        run.stdout
    );
    // With every blob gone there is nothing to stage: no estimate of it, and the
    // speed is not read from a missing file.
    for blob in fs::read_dir(repo.join("blobs")).expect("blobs") {
        fs::remove_file(blob.expect("entry").path()).expect("rm");
    }
    let run = stagefs(
        &[&"--no-config", &"doctor", &repo, &"--cache-dir", &s.cache],
        &[],
    );
    assert!(
        run.stdout.contains("(0 of its files can be read)"),
        "{}",
        run.stdout
    );
    for wrong in ["staging acme/holed", "acme/holed needs", "fail  speed"] {
        assert!(!run.stdout.contains(wrong), "{wrong}: {}", run.stdout);
    }
}

/// A plain model folder `Llama-Fake-4bit` in `dir` (2 files, 1.9 MiB).
fn plain_folder(dir: &Path) -> PathBuf {
    let folder = dir.join("Llama-Fake-4bit");
    fs::create_dir_all(&folder).expect("model folder");
    fs::write(folder.join("config.json"), "{}\n").expect("config");
    fs::write(folder.join("model.safetensors"), vec![7u8; 2_000_000]).expect("weights");
    folder
}

/// Issue 36: with plain folders mounted, doctor advised `export HF_HUB_CACHE=…`,
/// ignored the mount's `--max-size`, and took a short name prefetch accepts for a
/// path under the current directory ("CWD/Llama-Fake-4bit does not exist").
#[test]
fn a_mount_of_plain_folders_gets_their_advice_its_size_limit_and_short_names() {
    let s = Scratch::new();
    let folder = plain_folder(&s.hub);
    let mount = Mount::start(&s.hub, &s.mnt, &s.cache, &["--max-size", "1M"]);
    let run = stagefs(
        &[&"--no-config", &"doctor", &s.hub, &"--cache-dir", &s.cache],
        &[],
    );
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let folders = format!(
        "note  hub-cache    the source holds plain model folders, loaded by path under {}; ",
        s.mnt.display()
    );
    assert!(
        run.stdout.lines().any(|l| l.starts_with(&folders)),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("HF_HUB_CACHE="), "{}", run.stdout);
    let space = run
        .stdout
        .lines()
        .find(|l| l.starts_with("ok    space "))
        .unwrap_or_default();
    let limited = "; staged copies are limited to 1.0 MiB (max_size)";
    assert!(space.ends_with(limited), "{}", run.stdout);

    let run = stagefs(
        &[
            &"--no-config",
            &"doctor",
            &"Llama-Fake-4bit",
            &"--cache-dir",
            &s.cache,
        ],
        &[],
    );
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    let lines = [
        format!(
            "ok    model        Llama-Fake-4bit: 2 files, 1.9 MiB (plain model folder {})",
            folder.display()
        ),
        "fail  space        Llama-Fake-4bit needs 1.9 MiB, more than max_size (1.0 MiB)".into(),
    ];
    for line in lines {
        assert!(
            run.stdout.lines().any(|l| l == line),
            "{line}\n{}",
            run.stdout
        );
    }
    drop(mount);
}

/// Issue 36: doctor of a model folder inside a source of plain folders (through the
/// mount, or in the source) judged the folder as a source of its own ("plain model
/// folders holding 1 plain model folder"), named the model by its last part, and,
/// for a path in the mount, advised `export HF_HUB_CACHE=…`.
#[test]
fn a_folder_inside_a_source_of_plain_folders_is_judged_as_part_of_it() {
    let s = Scratch::new();
    let nested = s.hub.join("me/other");
    fs::create_dir_all(&nested).expect("mkdir");
    fs::write(nested.join("config.json"), "{}\n").expect("config");
    fs::write(nested.join("model.safetensors"), vec![7u8; 2_000_000]).expect("weights");
    plain_folder(&s.hub);
    let mount = Mount::start(&s.hub, &s.mnt, &s.cache, &[]);
    for examined in [s.mnt.join("me/other"), nested.clone()] {
        let run = stagefs(
            &[
                &"--no-config",
                &"doctor",
                &examined,
                &"--cache-dir",
                &s.cache,
            ],
            &[],
        );
        let out = &run.stdout;
        assert_eq!(
            run.code,
            Some(0),
            "{}: {out}\n{}",
            examined.display(),
            run.stderr
        );
        let lines = [
            format!(
                "ok    shape        {}: 2 plain model folders, loaded by path",
                s.hub.display()
            ),
            format!(
                "ok    model        me/other: 2 files, 1.9 MiB (plain model folder {})",
                nested.display()
            ),
        ];
        for line in lines {
            assert!(
                out.lines().any(|l| l == line),
                "{}: {line}\n{out}",
                examined.display()
            );
        }
        assert!(
            out.lines()
                .any(|l| l.starts_with("note  hub-cache    the source holds plain model folders")),
            "{}: {out}",
            examined.display()
        );
        assert!(
            !out.contains("HF_HUB_CACHE="),
            "{}: {out}",
            examined.display()
        );
        assert!(!out.contains("once mounted"), "mounted already: {out}");
    }
    drop(mount);
}

/// Issue 36: a source whose only file is empty gave "fail speed … the file is empty".
#[test]
fn an_empty_file_is_nothing_to_measure_not_a_failure() {
    let s = Scratch::new();
    fs::write(s.hub.join("empty.bin"), b"").expect("empty file");
    let run = stagefs(
        &[&"--no-config", &"doctor", &s.hub, &"--cache-dir", &s.cache],
        &[],
    );
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let line = format!(
        "note  speed        no non-empty file to measure in {}",
        s.hub.display()
    );
    assert!(
        run.stdout.lines().any(|l| l == line),
        "{line}\n{}",
        run.stdout
    );
}

/// Issue 36: a configured mount point that `stagefs mount` would refuse (missing, not
/// empty) or that lies inside the source was reported as merely "not mounted".
#[test]
fn a_mount_point_no_mount_can_use_fails_the_mount_check() {
    let s = Scratch::new();
    generate(&s.hub, "acme/mp", 1, "2M");
    let hub = fs::canonicalize(&s.hub).expect("hub");
    let (missing, full, inside) = (
        s.dir.path().join("gone"),
        s.dir.path().join("full"),
        hub.join("m"),
    );
    fs::create_dir_all(&full).expect("full mount point");
    fs::write(full.join("notes.txt"), "x").expect("an entry");
    let cases = [
        (
            &missing,
            format!(
                "fail  mount        the mount point {} does not exist",
                missing.display()
            ),
        ),
        (
            &full,
            format!(
                "fail  mount        the mount point {} is not empty",
                full.display()
            ),
        ),
        (
            &inside,
            format!(
                "fail  mount        the mount point {} is inside the source {}",
                inside.display(),
                hub.display()
            ),
        ),
    ];
    for (mountpoint, line) in cases {
        let config = s.dir.path().join("config.toml");
        let text = format!(
            "source = {:?}\nmountpoint = {:?}\ncache_dir = {:?}\n",
            s.hub.display().to_string(),
            mountpoint.display().to_string(),
            s.cache.display().to_string()
        );
        fs::write(&config, text).expect("config file");
        let run = stagefs(&[&"--config", &config, &"doctor"], &[]);
        assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
        assert!(
            run.stdout.lines().any(|l| l == line),
            "{line}\n{}",
            run.stdout
        );
    }
}

/// Issue 36: a blob whose bytes on the source are not the sha256 in its name is
/// refused by the mount, which only its log said: doctor passed every check and
/// exited 0, status named nothing. Both now name the file and how to repair it, until
/// the source holds other bytes.
#[test]
fn a_blob_refused_for_its_sha256_fails_doctor_and_is_named_in_status() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/changing", 1, "3M");
    let shard = model.shards().remove(0);
    let mount = Mount::start(&s.hub, &s.mnt, &s.cache, &[]);
    let before = fs::read(mount.path(&shard)).expect("first read");
    std::thread::sleep(Duration::from_millis(20));
    let rewritten: Vec<u8> = before.iter().map(|b| b ^ 0xFF).collect();
    fs::write(s.hub.join(&shard), &rewritten).expect("rewrite source");
    std::thread::sleep(Duration::from_millis(1500));
    fs::read(mount.path(&shard)).expect("served once, as the source holds it");
    stagefs_tests::wait_for("the check's verdict", || {
        mount.log_text().contains("do not match the sha256")
    });
    let name = "acme/changing: model-00001-of-00001.safetensors";
    let why = "its bytes on the source do not match the sha256 in its name, so opening it fails";
    let fix = "download it again (`hf download acme/changing --force-download`), or delete the blob on the source";
    let status = || stagefs(&[&"status", &"--cache-dir", &s.cache], &[]);
    let shown = status();
    assert_eq!(shown.code, Some(0), "{}", shown.stderr);
    let line = format!("refused   {name}: {why}; {fix}");
    assert!(
        shown.stdout.lines().any(|l| l == line),
        "{line}\n{}",
        shown.stdout
    );

    let run = stagefs(
        &[&"--no-config", &"doctor", &s.hub, &"--cache-dir", &s.cache],
        &[],
    );
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    let lines = [
        format!("fail  blobs        the mount refuses {name}: {why}"),
        format!("                   {fix}"),
    ];
    for line in lines {
        assert!(
            run.stdout.lines().any(|l| l == line),
            "{line}\n{}",
            run.stdout
        );
    }

    // Repaired on the source: refused no more.
    fs::write(s.hub.join(&shard), &before).expect("restore source");
    let shown = status();
    assert!(!shown.stdout.contains("refused"), "{}", shown.stdout);
    drop(mount);
}
