//! Model-aware prefetch, the prefetch command, and bounded memory while staging.

use std::fs::{self, File};
use std::io::Read;
use std::path::PathBuf;
use std::thread::sleep;
use std::time::Duration;

use stagefs_tests::{
    Mount, NetFs, Scratch, generate, run_stagefs, staged_files, staged_files_of_at_least,
    status_json, wait_for,
};

/// Source paths in the order the daemon logged starting to copy them.
/// The LFS blobs (the weights; sha256 names) in the order their copies started. The
/// copies kept of small files (git sha1 names) are left out.
fn staging_order(log: &str) -> Vec<PathBuf> {
    log.lines()
        .filter(|l| l.contains(" staging "))
        .filter_map(|l| l.split("path=").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(PathBuf::from)
        .filter(|p| p.file_name().is_some_and(|n| n.len() == 64))
        .collect()
}

fn shard_blobs(s: &Scratch, model: &stagefs_tests::Model) -> Vec<PathBuf> {
    model
        .files
        .iter()
        .filter(|f| f.name.ends_with(".safetensors"))
        .map(|f| model.blob_of(&s.hub, &f.name))
        .collect()
}

#[test]
fn opening_config_json_prefetches_shards_in_index_order() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/prefetch", 4, "2M");
    let mount = s.mount(&["--prefetch-parallel", "1"]);
    fs::read(mount.path(model.snapshot_rel.join("config.json"))).expect("read config");
    wait_for("four shards staged", || mount.metrics().stage_copies == 4);
    assert_eq!(staging_order(&mount.log_text()), shard_blobs(&s, &model));
    // The loader's opens now find every shard ready.
    let before = mount.metrics();
    for shard in model.shards() {
        fs::read(mount.path(&shard)).expect("read shard");
    }
    assert_eq!(
        mount.metrics().stage_copies,
        before.stage_copies,
        "no open had to copy"
    );
}

#[test]
fn prefetch_stops_at_the_budget_and_never_evicts() {
    let s = Scratch::new();
    // A different shard size, so the older model shares no blob with the newer one.
    let other = generate(&s.hub, "acme/older", 1, "3M");
    let model = generate(&s.hub, "acme/newer", 4, "2M");
    let mount = s.mount(&["--max-size", "8M", "--prefetch-parallel", "1"]);
    fs::read(mount.path(other.shards().remove(0))).expect("stage the older model");
    wait_for("older model staged", || staged_files(&s.cache).len() == 1);
    fs::read(mount.path(model.snapshot_rel.join("config.json"))).expect("read config");
    // 3 MiB already used of 8 MiB: two of the newer shards fit, the third would need an eviction.
    wait_for("two shards staged", || mount.metrics().stage_copies == 3);
    sleep(Duration::from_millis(500));
    let log = mount.log_text();
    assert_eq!(
        staged_files_of_at_least(&s.cache, 1 << 20).len(),
        3,
        "{log}"
    );
    assert!(
        !log.contains("evicted"),
        "prefetch evicted something: {log}"
    );
    assert_eq!(staging_order(&log)[1..], shard_blobs(&s, &model)[..2]);
    // An open may evict: the fourth shard is staged when the loader asks for it.
    let fourth = &model.shards()[3];
    assert!(
        fs::read(mount.path(fourth)).expect("read") == fs::read(s.hub.join(fourth)).expect("src")
    );
    assert!(mount.log_text().contains("to make room"));
}

#[test]
fn an_open_joins_an_in_flight_prefetch_and_gets_the_whole_file() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/join", 2, "24M");
    let remote = NetFs::up(&s.hub, &s.dir.path().join("nas"), "40mbit");
    let mount = Mount::start(&remote.mnt, &s.mnt, &s.cache, &["--prefetch-parallel", "1"]);
    fs::read(mount.path(model.snapshot_rel.join("config.json"))).expect("read config");
    let first = shard_blobs(&s, &model).remove(0);
    wait_for("the prefetch copying shard 1", || {
        let status = status_json(&s.cache);
        status["in_flight"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f["path"].as_str() == first.to_str()))
    });
    let shard = model.shards().remove(0);
    let mut bytes = Vec::new();
    File::open(mount.path(&shard))
        .expect("open")
        .read_to_end(&mut bytes)
        .expect("read");
    assert!(bytes == fs::read(s.hub.join(&shard)).expect("src"));
    wait_for("both shards staged", || {
        staged_files_of_at_least(&s.cache, 1 << 20).len() == 2
    });
    let m = mount.metrics();
    assert_eq!(
        m.stage_copies, 2,
        "the open joined the prefetch's copy: {m:?}"
    );
    assert_eq!(
        m.bytes_copied,
        model
            .files
            .iter()
            .filter(|f| f.name.ends_with(".safetensors"))
            .map(|f| f.size)
            .sum::<u64>(),
        "{m:?}"
    );
    drop(mount);
    drop(remote);
}

#[test]
fn prefetch_command_through_the_mount_and_without_one() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/cmd", 3, "2M");
    let cache: &dyn AsRef<std::ffi::OsStr> = &s.cache;
    {
        let _mount = s.mount(&["--no-prefetch"]);
        let (ok, out, err) = run_stagefs(&[&"prefetch", &"acme/cmd", &"--cache-dir", cache]);
        assert!(ok, "{out}{err}");
        assert!(
            out.contains("3 staged, 0 already staged, 0 failed"),
            "{out}"
        );
        // Each file staged is a result: on stdout, named by its snapshot's name.
        assert_eq!(
            out.lines()
                .filter(|l| l.starts_with("staged acme/cmd: model-"))
                .count(),
            3,
            "{out}"
        );
        assert!(err.is_empty(), "{err}");
        let (ok, out, _) = run_stagefs(&[&"prefetch", &"acme/cmd", &"--cache-dir", cache]);
        assert!(ok && out.contains("0 staged, 3 already staged"), "{out}");
        let (ok, _, err) = run_stagefs(&[&"prefetch", &"acme/absent", &"--cache-dir", cache]);
        assert!(
            !ok && err.contains("acme/absent: no such model in the source"),
            "{err}"
        );
    }
    let (ok, _, err) = run_stagefs(&[&"evict", &"--all", &"--cache-dir", cache]);
    assert!(ok, "{err}");
    assert!(staged_files(&s.cache).is_empty());
    let snapshot = s.hub.join(&model.snapshot_rel);
    let (ok, out, err) = run_stagefs(&[&"prefetch", &snapshot, &"--cache-dir", cache]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("3 staged"), "{out}");
    assert_eq!(staged_files(&s.cache).len(), 3);
    let (ok, _, err) = run_stagefs(&[
        &"prefetch",
        &"acme/cmd",
        &"--revision",
        &"v9",
        &"--cache-dir",
        cache,
    ]);
    assert!(
        !ok && err.contains("no snapshot for revision 'v9'"),
        "{err}"
    );
}

#[test]
fn prefetch_dry_run_lists_what_would_be_copied_and_copies_nothing() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/plan", 3, "2M");
    let cache: &dyn AsRef<std::ffi::OsStr> = &s.cache;
    let dry_run = |target: &dyn AsRef<std::ffi::OsStr>| {
        let (ok, out, err) =
            run_stagefs(&[&"prefetch", target, &"--dry-run", &"--cache-dir", cache]);
        assert!(ok, "{out}{err}");
        out
    };
    {
        let mount = s.mount(&["--no-prefetch"]);
        let out = dry_run(&"acme/plan");
        assert_eq!(
            out.lines()
                .filter(|l| l.starts_with("would stage "))
                .count(),
            3,
            "{out}"
        );
        assert!(
            out.contains("dry run: 3 to stage (6.0 MiB), 0 already staged"),
            "{out}"
        );
        assert!(
            staged_files(&s.cache).is_empty(),
            "a dry run copied something"
        );
        assert_eq!(mount.metrics().stage_copies, 0);
        let first = model.shards().remove(0);
        fs::read(mount.path(&first)).expect("stage one shard");
        let name = first.file_name().expect("shard name").to_string_lossy();
        let blob = model.blob_of(&s.hub, &name);
        wait_for("the copy committed", || {
            dry_run(&"acme/plan").contains("1 already staged")
        });
        let out = dry_run(&"acme/plan");
        // Named as users know it (issue 19), the blob's path only with -v.
        assert!(
            out.contains(&format!("already staged acme/plan: {name}\n")),
            "{out}"
        );
        assert!(!out.contains("blobs/"), "{out}");
        let verbose = run_stagefs(&[
            &"-v",
            &"prefetch",
            &"acme/plan",
            &"--dry-run",
            &"--cache-dir",
            &s.cache,
        ])
        .1;
        assert!(
            verbose.contains(&format!(
                "already staged acme/plan: {name} [{}]",
                blob.display()
            )),
            "{verbose}"
        );
        assert!(
            out.contains("dry run: 2 to stage (4.0 MiB), 1 already staged (2.0 MiB)"),
            "{out}"
        );
    }
    // Without a mount, the cache directory and its recorded source answer the same.
    let out = dry_run(&s.hub.join(&model.snapshot_rel));
    assert!(
        out.contains("dry run: 2 to stage (4.0 MiB), 1 already staged (2.0 MiB)"),
        "{out}"
    );
    assert_eq!(
        staged_files(&s.cache).len(),
        1,
        "a dry run copied something"
    );
}

#[test]
fn staging_a_file_much_larger_than_any_buffer_keeps_memory_bounded() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/huge", 1, "512M");
    let mount = s.mount(&[]);
    let shard = model.shards().remove(0);
    File::open(mount.path(&shard)).expect("stage 512 MiB");
    let pid = fs::read_to_string(s.cache.join("lock")).expect("lock holds the daemon pid");
    let status = fs::read_to_string(format!("/proc/{}/status", pid.trim())).expect("daemon status");
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmHWM");
    // A copy holds the chunks being read or written, (streams + 2) x 2 MiB = 12 MiB by
    // default, and what the hasher has yet to hash: at most 32 MiB, in buffers or (from
    // a local disk, as here) in mapped windows of the copy.
    assert!(
        peak_kib < 96 * 1024,
        "daemon peak RSS {peak_kib} KiB while staging 512 MiB"
    );
}

/// Issue 36: a stock sshfs (`contain_symlinks`) refuses to read every snapshot link
/// (`../../blobs/...`), so the model looked empty: "0 staged, 0 already staged,
/// 0 failed (0 B)", exit 0. Each link is now a failed file that says why.
#[test]
fn a_prefetch_through_sshfs_that_refuses_links_names_them_and_fails() {
    let s = Scratch::new();
    generate(&s.hub, "acme/big-llm", 1, "1M");
    let nas = s.dir.path().join("nas");
    let remote = NetFs::up_with(&s.hub, &nas, "1gbit", "contain_symlinks");
    let mount = Mount::start(&remote.mnt, &s.mnt, &s.cache, &["--no-prefetch"]);
    let cache: &dyn AsRef<std::ffi::OsStr> = &s.cache;
    let (ok, out, err) = run_stagefs(&[&"prefetch", &"acme/big-llm", &"--cache-dir", cache]);
    assert!(!ok, "{out}{err}");
    let refused = "the source refuses to read the link (sshfs does unless mounted with `-o no_contain_symlinks`)";
    let line = format!("FAILED acme/big-llm: model-00001-of-00001.safetensors: {refused}");
    assert!(err.lines().any(|l| l == line), "{err}");
    let summary =
        "stagefs: 0 staged, 0 already staged, 3 failed (0 B): 3 files could not be staged";
    assert!(err.lines().any(|l| l == summary), "{err}");
    drop(mount);
    drop(remote);
}

/// Issue 36: a link that loops, or leaves the source, was left out silently.
#[test]
fn a_prefetch_names_links_that_loop_or_leave_the_source() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/links", 1, "2M");
    let snapshot = s.hub.join(&model.snapshot_rel);
    let blob_rel = model.blob_of(&s.hub, "config.json");
    let blob = s.hub.join(&blob_rel);
    // The blob links back to the snapshot's link: a loop.
    fs::remove_file(&blob).expect("remove blob");
    std::os::unix::fs::symlink(snapshot.join("config.json"), &blob).expect("loop");
    let outside = snapshot.join("model.safetensors.index.json");
    fs::remove_file(&outside).ok();
    std::os::unix::fs::symlink("/etc/hostname", &outside).expect("outside link");
    let mut mount = Some(s.mount(&["--no-prefetch"]));
    let cache: &dyn AsRef<std::ffi::OsStr> = &s.cache;
    let (ok, out, err) = run_stagefs(&[&"prefetch", &"acme/links", &"--cache-dir", cache]);
    assert!(!ok, "{out}{err}");
    let blob_rel = blob_rel.display();
    let lines = [
        format!("FAILED acme/links: config.json: it links to {blob_rel}, which is a link again (a loop or a chain of links)"),
        "FAILED acme/links: model.safetensors.index.json: it links to /etc/hostname, outside the source".into(),
        "stagefs: 1 staged, 0 already staged, 2 failed (2.0 MiB): 2 files could not be staged".into(),
    ];
    for line in &lines {
        assert!(err.lines().any(|l| l == line), "{line}\n{out}{err}");
    }
    // status counts the files a load can read, and lists the two links apart.
    let status = stagefs_tests::status_json(&s.cache);
    let revision = &status["models"][0]["revisions"][0];
    assert_eq!(
        revision["total_files"].as_u64(),
        Some(model.files.len() as u64 - 2),
        "{status}"
    );
    assert_eq!(
        revision["unfollowable"].as_array().map(Vec::len),
        Some(2),
        "{status}"
    );
    // Its dry run names the same links, and fails as the prefetch does, with and
    // without a mount to ask.
    for mounted in [true, false] {
        if !mounted && let Some(mount) = mount.take() {
            mount.unmount();
        }
        let (ok, out, err) = run_stagefs(&[
            &"prefetch",
            &"--dry-run",
            &"acme/links",
            &"--cache-dir",
            cache,
        ]);
        assert!(!ok, "mounted {mounted}: {out}{err}");
        for line in &lines[..2] {
            assert!(
                out.lines().any(|l| l == line),
                "mounted {mounted}: {line}\n{out}{err}"
            );
        }
        assert!(
            err.ends_with("; 2 files could not be staged\n"),
            "mounted {mounted}: {out}{err}"
        );
    }
}

/// Issue 36: on a terminal the bars cut each name to 24 characters,
/// "model-00001-of-00002.saf", so that shards could not be told apart. Run under
/// `script` for a terminal of 80 columns; each bar now starts with the whole name.
#[test]
fn progress_bars_on_a_terminal_show_whole_file_names() {
    let s = Scratch::new();
    generate(&s.hub, "acme/big-llm", 2, "2M");
    let _mount = s.mount(&["--no-prefetch"]);
    let command = format!(
        "stty cols 80; {} prefetch acme/big-llm --cache-dir {}",
        stagefs_tests::stagefs_bin().display(),
        s.cache.display()
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .output()
        .expect("running script");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    for name in [
        "model-00001-of-00002.safetensors [",
        "model-00002-of-00002.safetensors [",
    ] {
        assert!(text.contains(name), "{name}\n{text}");
    }
    let summary = "2 staged, 0 already staged, 0 failed (4.0 MiB)";
    // The bars' lines fill the 80 columns and end without a newline: the summary
    // follows the last bar, on the terminal's next line.
    assert!(text.trim_end().ends_with(summary), "{text}");
}

/// Issue 36: a FAILED line named the file, then repeated its blob path
/// (`models--…/blobs/<sha256>: needs …`); the name is enough, `-v` adds the path.
#[test]
fn a_failed_file_is_named_once_as_users_know_it() {
    let s = Scratch::new();
    generate(&s.hub, "acme/too-big", 1, "4M");
    let mount = Mount::start(
        &s.hub,
        &s.mnt,
        &s.cache,
        &["--no-prefetch", "--max-size", "3M"],
    );
    let cache: &dyn AsRef<std::ffi::OsStr> = &s.cache;
    let (ok, out, err) = run_stagefs(&[&"prefetch", &"acme/too-big", &"--cache-dir", cache]);
    assert!(!ok, "{out}{err}");
    let failed: Vec<&str> = err.lines().filter(|l| l.starts_with("FAILED ")).collect();
    assert_eq!(failed.len(), 1, "{err}");
    assert!(
        failed[0]
            .starts_with("FAILED acme/too-big: model-00001-of-00001.safetensors: needs 4.0 MiB"),
        "{err}"
    );
    assert!(!failed[0].contains("blobs/"), "{err}");
    drop(mount);
}

/// Ctrl-C of `stagefs prefetch` through a mount stops it: the mount starts no more of
/// its files, and finishes only the copy under way (an open may wait on it). Over a
/// NAS at 8 Mbit/s each 2 MiB shard takes about 2 s; the model has 6.
#[test]
fn an_interrupted_prefetch_through_the_mount_starts_no_more_files() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/interrupted", 6, "2M");
    let remote = NetFs::up(&s.hub, &s.dir.path().join("nas"), "8mbit");
    let mount = Mount::start(&remote.mnt, &s.mnt, &s.cache, &["--no-prefetch"]);
    let mut prefetch = std::process::Command::new(stagefs_tests::stagefs_bin())
        .args(["prefetch", &model.repo, "--parallel", "1", "--cache-dir"])
        .arg(&s.cache)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("stagefs prefetch");
    wait_for("the prefetch's first copy", || {
        !mount.in_flight().is_empty()
    });
    // SAFETY: kill has no preconditions; the pid is our child's, not yet reaped.
    unsafe { libc::kill(prefetch.id() as libc::pid_t, libc::SIGINT) };
    let status = prefetch.wait().expect("wait");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGINT)
    );
    wait_for("the copy under way to end", || mount.in_flight().is_empty());
    let staged = staged_files_of_at_least(&s.cache, 1 << 20).len();
    // Longer than a shard's copy: a job still going would have started the next.
    sleep(Duration::from_secs(3));
    assert!(mount.in_flight().is_empty(), "{:?}", mount.in_flight());
    assert_eq!(staged_files_of_at_least(&s.cache, 1 << 20).len(), staged);
    assert!(
        staged <= 2,
        "{staged} of 6 shards staged after the interrupt"
    );
    drop(mount);
    drop(remote);
}
