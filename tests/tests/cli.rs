//! The `stagefs` command as a user runs it: background mount, unmount, clear refusals.

use std::fs;
use std::process::{Command, Output};
use std::thread::sleep;
use std::time::{Duration, Instant};

use stagefs_tests::{Scratch, TEST_RESERVE, generate, is_mounted, run_stagefs, stagefs_bin};

fn stagefs(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(stagefs_bin())
        .args(args)
        .output()
        .expect("run stagefs")
}

#[test]
fn background_mount_serves_until_unmounted() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/bg", 1, "2M");
    mount_in_background(&s);
    assert!(is_mounted(&s.mnt), "live when mount returns");
    let shard = model.shards().remove(0);
    assert!(
        fs::read(s.mnt.join(&shard)).expect("read") == fs::read(s.hub.join(&shard)).expect("src")
    );

    let out = stagefs(&["unmount".as_ref(), s.mnt.as_os_str()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!is_mounted(&s.mnt));
    // The daemon exits and removes its control socket.
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.cache.join("control.sock").exists() && Instant::now() < deadline {
        sleep(Duration::from_millis(20));
    }
    assert!(!s.cache.join("control.sock").exists(), "daemon exited");
    assert!(
        fs::read_to_string(s.cache.join("stagefs.log"))
            .expect("log")
            .contains("staged")
    );
}

/// `stagefs mount` in the background, as a user runs it.
fn mount_in_background(s: &Scratch) {
    // The default reserve is a tenth of the volume: on a shared machine with less
    // free than that a read would fail for room, so the tests' own reserve.
    let reserve = TEST_RESERVE.to_string();
    let out = stagefs(&[
        "mount".as_ref(),
        s.hub.as_os_str(),
        s.mnt.as_os_str(),
        "--cache-dir".as_ref(),
        s.cache.as_os_str(),
        "--min-free".as_ref(),
        reserve.as_ref(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("mounted"));
}

#[test]
fn unmount_refuses_a_mount_held_open_and_waits_a_moment_for_one_just_closed() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/held", 1, "2M");
    mount_in_background(&s);
    let shard = s.mnt.join(model.shards().remove(0));
    let held = fs::File::open(&shard).expect("open");

    let out = stagefs(&["unmount".as_ref(), s.mnt.as_os_str()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("is busy") && err.contains("--lazy"), "{err}");
    assert!(is_mounted(&s.mnt), "left mounted");

    // Closed while the unmount is already trying (its first try comes within tens
    // of ms of its start): a file just closed is no reason to refuse.
    let unmount = Command::new(stagefs_bin())
        .args(["unmount".as_ref(), s.mnt.as_os_str()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run stagefs unmount");
    sleep(Duration::from_millis(300));
    drop(held);
    let out = unmount.wait_with_output().expect("unmount");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!is_mounted(&s.mnt));
}

#[test]
fn a_second_mount_on_the_same_cache_dir_is_refused() {
    let s = Scratch::new();
    generate(&s.hub, "acme/lock", 1, "2M");
    let _first = s.mount(&[]);
    let other = s.dir.path().join("mnt2");
    fs::create_dir(&other).expect("mkdir");
    let out = stagefs(&[
        "mount".as_ref(),
        s.hub.as_os_str(),
        other.as_os_str(),
        "--cache-dir".as_ref(),
        s.cache.as_os_str(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // Named by the mount that holds it (issue 19), with the command that frees it.
    let holder = format!("is in use by the mount at {}", s.mnt.display());
    assert!(err.contains(&holder), "{err}");
    assert!(
        err.contains(&format!("`stagefs unmount {}`", s.mnt.display())),
        "{err}"
    );
    assert!(!is_mounted(&other));
}

#[test]
fn bad_input_is_refused_with_one_clear_line() {
    let s = Scratch::new();
    let missing = s.dir.path().join("missing");
    let file = s.dir.path().join("a-file");
    fs::write(&file, "x").expect("write");
    let (hub, mnt, cache) = (&s.hub, &s.mnt, &s.cache);
    let cases: Vec<(Vec<&dyn AsRef<std::ffi::OsStr>>, &str)> = vec![
        (
            vec![&"mount", &missing, mnt, &"--cache-dir", cache],
            "does not exist",
        ),
        (
            vec![&"mount", &file, mnt, &"--cache-dir", cache],
            "not a directory",
        ),
        (
            vec![&"mount", hub, &missing, &"--cache-dir", cache],
            "does not exist",
        ),
        (
            vec![&"mount", hub, mnt, &"--cache-dir", hub],
            "must not be inside the source",
        ),
        (
            vec![&"mount", hub, mnt, &"--min-stage-size", &"12X"],
            "unknown size suffix",
        ),
        (
            vec![&"evict", &"--older-than", &"3 days", &"--cache-dir", cache],
            "not a duration",
        ),
        (vec![&"unmount", mnt], "not a mount point"),
        (
            vec![&"mount", hub, mnt, &"--cache-dir", &file],
            "a-file is not a directory",
        ),
        (
            vec![&"status", &"--cache-dir", &file],
            "is not a stagefs cache directory; name the cache directory of a mount with --cache-dir",
        ),
    ];
    for (args, expected) in cases {
        let (ok, _, err) = run_stagefs(&args);
        assert!(!ok, "should fail: {expected}");
        assert!(err.contains(expected), "expected '{expected}' in: {err}");
        assert!(!is_mounted(&s.mnt));
    }
    assert!(
        !s.hub.join("c").exists(),
        "nothing was created inside the source"
    );
}

/// Issue 36: `serve` took FUSE-only flags without a word, and did nothing with them;
/// so did `mount --backend nfs`. Both refuse them, in one line, and mount nothing.
#[test]
fn an_nfs_export_refuses_the_flags_only_fuse_has() {
    let s = Scratch::new();
    let (hub, mnt, cache) = (&s.hub, &s.mnt, &s.cache);
    let one = "stagefs: --allow-other is a FUSE mount's option: an NFS export (`serve`, `--backend nfs`) reads every file itself and serves only its user and root; leave it out\n";
    let two = "stagefs: --no-passthrough and --redirect-grace are FUSE mount options: an NFS export (`serve`, `--backend nfs`) reads every file itself and serves only its user and root; leave them out\n";
    let cases: Vec<(Vec<&dyn AsRef<std::ffi::OsStr>>, &str)> = vec![
        (
            vec![
                &"--no-config",
                &"serve",
                hub,
                &"--cache-dir",
                cache,
                &"--allow-other",
            ],
            one,
        ),
        (
            vec![
                &"--no-config",
                &"mount",
                &"--backend",
                &"nfs",
                hub,
                mnt,
                &"--cache-dir",
                cache,
                &"--no-passthrough",
                &"--redirect-grace",
                &"5s",
            ],
            two,
        ),
    ];
    for (args, expected) in cases {
        let out = Command::new(stagefs_bin())
            .args(args.iter().map(|a| a.as_ref()))
            .output()
            .expect("run stagefs");
        // A usage error, as clap's own are.
        assert_eq!(out.status.code(), Some(2), "{expected}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), expected);
        assert!(out.stdout.is_empty());
        assert!(!is_mounted(&s.mnt));
    }
}

/// Issue 46: a typo in the config file stopped `unmount PATH` and `status --cache-dir C`,
/// which need nothing from it; and the error listed all 18 keys instead of the one meant.
#[test]
fn a_typo_in_the_config_file_is_named_and_blocks_only_what_needs_the_file() {
    let s = Scratch::new();
    let config = s.dir.path().join("config.toml");
    fs::write(&config, "max_siz = \"2G\"\n").expect("write config");
    let said = format!(
        "config file {}, line 1: unknown key `max_siz`; did you mean `max_size`?",
        config.display()
    );
    let mount = s.mount(&[]);
    let (ok, out, err) = run_stagefs(&[&"--config", &config, &"status", &"--cache-dir", &s.cache]);
    assert!(ok, "{err}");
    assert_eq!(
        err,
        format!("stagefs: warning: {said} (went on without the file)\n")
    );
    assert!(out.contains(&s.mnt.display().to_string()), "{out}");
    let (ok, _, err) = run_stagefs(&[&"--config", &config, &"unmount", &s.mnt]);
    assert!(ok, "{err}");
    assert!(!is_mounted(&s.mnt));
    drop(mount);
    // A command that needs the file (its source, its mount point) still stops on it.
    let (ok, _, err) = run_stagefs(&[&"--config", &config, &"unmount"]);
    assert!(!ok);
    assert_eq!(err, format!("stagefs: {said}\n"));
}

/// The README's first command on a disk more than 90% full, with room for the demo's
/// model and its copy: the default reserve (a tenth of the volume) refused the copy
/// with ENOSPC and advised a flag the demo does not take.
#[test]
fn the_demo_runs_on_a_nearly_full_disk_with_room_for_its_model() {
    let s = Scratch::new();
    let disk = s.dir.path().join("disk");
    let _tmpfs = stagefs_tests::Tmpfs::mount(&disk, "size=1024m");
    // 97 MiB left: the demo's 16 MiB model, then its 16 MiB copy, leave 65 MiB,
    // above the demo's reserve and below the default one (102 MiB).
    let filler = fs::File::create(disk.join("filler")).expect("create");
    filler.set_len(927 << 20).expect("size");
    let block = vec![1u8; 1 << 20];
    for i in 0..927u64 {
        std::os::unix::fs::FileExt::write_all_at(&filler, &block, i << 20).expect("fill");
    }
    drop(filler);
    let out = Command::new(stagefs_bin())
        .args(["demo", "--shards", "2", "--shard-size", "8M"])
        .env("TMPDIR", &disk)
        .output()
        .expect("run stagefs demo");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("every byte matched the source"), "{stdout}");
}
