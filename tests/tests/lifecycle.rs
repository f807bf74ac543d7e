//! The cache's lifecycle on real mounts: shared blobs, the budget, pinning, status,
//! evict and verify with and without a mount, crashes, corruption, and stopping the
//! daemon while a model is open.

use std::fs::{self, File};
use std::io::Read;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use stagefs_tests::{
    MmapHolder, Mount, NetFs, Scratch, generate, is_mounted, python, run_stagefs, staged_files,
    status_json, temp_files, wait_for,
};

fn same_bytes(a: &Path, b: &Path) -> bool {
    fs::read(a).expect("read a") == fs::read(b).expect("read b")
}

#[test]
fn a_blob_shared_by_two_repositories_is_staged_once() {
    let s = Scratch::new();
    // Same shard layout, so the generator writes identical blobs into both repos.
    let a = generate(&s.hub, "acme/base", 1, "3M");
    let b = generate(&s.hub, "other/finetune-copy", 1, "3M");
    assert_eq!(
        a.blob_of(&s.hub, "model-00001-of-00001.safetensors")
            .file_name(),
        b.blob_of(&s.hub, "model-00001-of-00001.safetensors")
            .file_name()
    );
    let mount = s.mount(&["--no-prefetch"]);
    for model in [&a, &b] {
        let shard = model.shards().remove(0);
        assert!(same_bytes(&mount.path(&shard), &s.hub.join(&shard)));
    }
    let m = mount.metrics();
    assert_eq!((m.stage_copies, m.stage_hits), (1, 1), "{m:?}");
    assert_eq!(staged_files(&s.cache).len(), 1);
}

#[test]
fn a_file_the_budget_cannot_hold_fails_with_enospc_or_is_read_from_the_source() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/big", 1, "3M");
    let shard = model.shards().remove(0);
    {
        let mount = s.mount(&["--max-size", "2M"]);
        let err = File::open(mount.path(&shard)).expect_err("must not fit");
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
        let log = mount.log_text();
        assert!(
            log.contains("cannot make room") && log.contains("raise --max-size"),
            "{log}"
        );
    }
    let mount = s.mount(&["--max-size", "2M", "--on-full", "passthrough"]);
    assert!(same_bytes(&mount.path(&shard), &s.hub.join(&shard)));
    assert!(staged_files(&s.cache).is_empty());
    assert!(
        mount
            .log_text()
            .contains("serving the file from the source")
    );
}

/// `read-source` is the name; `passthrough`, its old one, still works and warns once.
#[test]
fn on_full_read_source_and_its_old_spelling_both_read_a_file_that_does_not_fit() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/big", 1, "3M");
    let shard = model.shards().remove(0);
    let warning = "--on-full passthrough is deprecated; use --on-full read-source";
    for (spelling, warnings) in [("read-source", 0), ("passthrough", 1)] {
        let mount = s.mount(&["--max-size", "2M", "--on-full", spelling]);
        assert!(
            same_bytes(&mount.path(&shard), &s.hub.join(&shard)),
            "{spelling}"
        );
        assert!(staged_files(&s.cache).is_empty(), "{spelling}");
        let log = mount.log_text();
        assert!(log.contains("serving the file from the source"), "{log}");
        let warned = log.lines().filter(|l| l.contains(warning)).count();
        assert_eq!(warned, warnings, "{spelling}: {log}");
        mount.unmount();
    }
}

#[test]
fn open_files_are_never_evicted_and_the_least_recent_closed_one_goes() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/lru", 3, "2M");
    let shards = model.shards();
    let mount = s.mount(&["--max-size", "5M", "--no-prefetch"]);
    let first = File::open(mount.path(&shards[0])).expect("open first");
    fs::read(mount.path(&shards[1])).expect("read second");
    // Room for a third copy only by evicting one: the older one is open, so the second goes.
    fs::read(mount.path(&shards[2])).expect("read third");
    let status = status_json(&s.cache);
    assert_eq!(status["usage"]["entries"], 2, "{status}");
    let (ok, _, err) = run_stagefs(&[&"evict", &mount.path(&shards[0]), &"--cache-dir", &s.cache]);
    assert!(
        !ok && err.contains("in use"),
        "evicting an open file must be refused: {err}"
    );
    // What `evict --dry-run` says of the first shard.
    let dry_run = || {
        run_stagefs(&[
            &"evict",
            &mount.path(&shards[0]),
            &"--cache-dir",
            &s.cache,
            &"--dry-run",
        ])
        .1
    };
    let out = dry_run();
    assert!(out.contains("in use, kept"), "{out}");
    drop(first);
    // close() does not wait for FUSE's release: the daemon unpins a moment later.
    wait_for("the daemon to see the handle closed", || {
        !dry_run().contains("in use, kept")
    });
    let (ok, out, err) =
        run_stagefs(&[&"evict", &mount.path(&shards[0]), &"--cache-dir", &s.cache]);
    assert!(ok, "{err}");
    assert!(out.contains("evicted 1 file,"), "{out}");
    assert_eq!(status_json(&s.cache)["usage"]["entries"], 1);
    let log = mount.log_text();
    assert!(
        log.contains("evicted") && log.contains("to make room"),
        "{log}"
    );
}

#[test]
fn status_evict_and_verify_work_with_and_without_a_mount() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/admin", 2, "2M");
    let cache: &dyn AsRef<std::ffi::OsStr> = &s.cache;
    {
        let mount = s.mount(&["--no-prefetch"]);
        for shard in model.shards() {
            fs::read(mount.path(&shard)).expect("read");
        }
        let live = status_json(&s.cache);
        assert_eq!(
            live["mountpoint"].as_str(),
            Some(s.mnt.to_str().expect("utf8"))
        );
        assert_eq!(live["usage"]["entries"], 2);
        assert_eq!(live["metrics"]["stage_copies"], 2);
        let revision = &live["models"][0]["revisions"][0];
        assert_eq!(live["models"][0]["model"], "acme/admin");
        assert_eq!(revision["revision"], model.commit.as_str());
        assert_eq!(revision["refs"][0], "main");
        assert_eq!(
            (
                revision["staged_files"].as_u64(),
                revision["total_files"].as_u64()
            ),
            (Some(2), Some(4))
        );
        let (ok, out, err) = run_stagefs(&[&"verify", &"--cache-dir", cache]);
        assert!(ok && out.contains("0 mismatches"), "{out}{err}");
    }
    let offline = status_json(&s.cache);
    assert!(offline["mountpoint"].is_null(), "{offline}");
    assert_eq!(offline["usage"]["entries"], 2);
    assert_eq!(offline["models"][0]["revisions"][0]["staged_files"], 2);

    let victim = &staged_files(&s.cache)[0];
    let mut bytes = fs::read(victim).expect("read copy");
    bytes[4096] ^= 0x01;
    fs::write(victim, bytes).expect("corrupt copy");
    let (ok, out, _) = run_stagefs(&[&"verify", &"--cache-dir", cache]);
    assert!(!ok && out.contains("MISMATCH"), "{out}");
    let (ok, out, err) = run_stagefs(&[&"verify", &"--repair", &"--cache-dir", cache]);
    assert!(ok && out.contains("dropped"), "{out}{err}");
    assert_eq!(staged_files(&s.cache).len(), 1);

    let (ok, out, err) = run_stagefs(&[&"evict", &"acme/admin", &"--cache-dir", cache]);
    assert!(ok && out.contains("evicted 1 file,"), "{out}{err}");
    assert!(staged_files(&s.cache).is_empty());
    let (ok, _, err) = run_stagefs(&[&"evict", &"--all", &"--older-than", &"1d"]);
    assert!(!ok && err.contains("cannot be used with"), "{err}");

    let mount = s.mount(&[]);
    for shard in model.shards() {
        assert!(same_bytes(&mount.path(&shard), &s.hub.join(&shard)));
    }
    assert_eq!(mount.metrics().stage_copies, 2);
}

#[test]
fn evicting_a_snapshot_directory_drops_the_blobs_it_links_to() {
    let s = Scratch::new();
    let kept = generate(&s.hub, "acme/kept", 2, "2M");
    let dropped = generate(&s.hub, "acme/dropped", 3, "3M"); // other bytes, other blobs
    let cache: &dyn AsRef<std::ffi::OsStr> = &s.cache;
    let mount = s.mount(&["--no-prefetch"]);
    for shard in kept.shards().iter().chain(&dropped.shards()) {
        fs::read(mount.path(shard)).expect("stage");
    }
    assert_eq!(staged_files(&s.cache).len(), 5);
    let snapshot = mount.path(&dropped.snapshot_rel);
    let (ok, out, err) = run_stagefs(&[&"evict", &snapshot, &"--cache-dir", cache]);
    assert!(ok && out.contains("evicted 3 files"), "{out}{err}");
    assert_eq!(staged_files(&s.cache).len(), 2, "the other model stays");
    drop(mount);

    // Without a mount, a directory of the source works the same way.
    let mount = s.mount(&["--no-prefetch"]);
    fs::read(mount.path(&dropped.shards()[0])).expect("stage again");
    drop(mount);
    let in_source = s.hub.join(&dropped.snapshot_rel);
    let (ok, out, err) = run_stagefs(&[&"evict", &in_source, &"--cache-dir", cache]);
    assert!(ok && out.contains("evicted 1 file,"), "{out}{err}");
    assert_eq!(staged_files(&s.cache).len(), 2);
}

#[test]
fn a_corrupted_copy_is_staged_again_on_open_never_served() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/rot", 1, "2M");
    let shard = model.shards().remove(0);
    s.mount(&[]).unmount_after(|m| {
        fs::read(m.path(&shard)).expect("stage");
    });
    let copy = &staged_files(&s.cache)[0];
    let mut bytes = fs::read(copy).expect("copy");
    bytes[100_000] ^= 0x80;
    fs::write(copy, bytes).expect("flip a byte");

    let mount = s.mount(&[]);
    assert!(
        same_bytes(&mount.path(&shard), &s.hub.join(&shard)),
        "the corrupt copy was served"
    );
    assert_eq!(mount.metrics().stage_copies, 1, "{}", mount.log_text());
    assert!(mount.log_text().contains("damaged staged copy"));
}

#[test]
fn kill_9_mid_stage_leaves_nothing_partial_and_a_remount_recovers() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/crash", 1, "24M");
    let shard = model.shards().remove(0);
    let size = model.files.last().expect("shard").size;
    let remote = NetFs::up(&s.hub, &s.dir.path().join("nas"), "40mbit");
    let mut mount = Mount::start(&remote.mnt, &s.mnt, &s.cache, &[]);

    let done = Arc::new(AtomicBool::new(false));
    let opener = {
        let (path, done) = (mount.path(&shard), Arc::clone(&done));
        std::thread::spawn(move || {
            let result = File::open(path).and_then(|mut f| f.read_to_end(&mut Vec::new()));
            done.store(true, Ordering::SeqCst);
            result.map(|_| ())
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while mount.metrics().bytes_copied < (4 << 20) {
        assert!(Instant::now() < deadline, "staging never got going");
        sleep(Duration::from_millis(20));
    }
    let status = status_json(&s.cache);
    let flight = &status["in_flight"][0];
    assert_eq!(flight["total"].as_u64(), Some(size), "{status}");
    assert!(
        flight["copied"].as_u64().is_some_and(|c| c > 0 && c < size),
        "{status}"
    );

    mount.kill_daemon();
    assert!(
        opener.join().expect("opener").is_err(),
        "the open cannot succeed once the daemon is gone"
    );
    assert!(
        !temp_files(&s.cache).is_empty(),
        "the interrupted copy is still on disk"
    );
    assert!(staged_files(&s.cache).is_empty(), "nothing was committed");
    drop(mount); // cleans up the dead mount with `stagefs unmount`
    drop(remote);

    let mount = Mount::start(&s.hub, &s.mnt, &s.cache, &[]);
    assert!(
        temp_files(&s.cache).is_empty(),
        "startup removed the partial copy"
    );
    assert!(same_bytes(&mount.path(&shard), &s.hub.join(&shard)));
    assert_eq!(mount.metrics().stage_copies, 1);
}

/// The sha256 (hex) of a file's bytes.
fn sha256_of(path: &Path) -> String {
    let digest = Sha256::digest(fs::read(path).expect("read the source"));
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A daemon serving every page itself (no link to the copy, no kernel passthrough):
/// what a mapping faults on is answered by this process, so stopping it cannot go
/// unnoticed by a holder.
const SERVED_BY_THE_DAEMON: &[&str] = &["--no-prefetch", "--no-redirect", "--no-passthrough"];

/// Waits until the mount has left the mount table and its mount point is a plain,
/// empty directory again to a new lookup.
#[track_caller]
fn wait_detached(mount: &Mount) {
    wait_for("the busy mount to be detached", || !is_mounted(&mount.mnt));
    let entries: Vec<_> = fs::read_dir(&mount.mnt)
        .expect("a new lookup finds a plain directory, not a dead mount")
        .collect();
    assert!(
        entries.is_empty(),
        "the mount point shows nothing: {entries:?}"
    );
}

#[test]
fn sigterm_while_a_shard_is_mapped_detaches_and_serves_it_until_closed() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/held", 1, "8M");
    let shard = model.shards().remove(0);
    let source_sha = sha256_of(&s.hub.join(&shard));
    let mut mount = Mount::start(&s.hub, &s.mnt, &s.cache, SERVED_BY_THE_DAEMON);
    let mut holder = MmapHolder::start(Command::new(python()), &mount.path(&shard));

    // What `systemctl stop`, a logout or launchd does.
    mount.signal(libc::SIGTERM);
    wait_detached(&mount);
    assert!(!mount.exited(), "the daemon still serves the open file");

    // Every page is faulted in only now, after the stop was asked for.
    let read = holder.read_all();
    assert_eq!(
        read["mapped"],
        source_sha.as_str(),
        "{read}\n{}",
        mount.log_text()
    );
    assert_eq!(
        read["read"],
        source_sha.as_str(),
        "{read}\n{}",
        mount.log_text()
    );
    assert!(
        !mount.exited(),
        "the daemon serves until the file is closed"
    );

    let closed = holder.close();
    assert!(
        closed.success(),
        "the holder exited cleanly (no SIGBUS): {closed}"
    );
    let status = mount.wait_exit();
    let log = mount.log_text();
    assert!(
        status.success(),
        "the daemon exits 0 once the file is closed: {status}\n{log}"
    );
    assert!(
        log.contains("mount busy (files open): detached; serving open files until they are closed"),
        "{log}"
    );
    assert!(!log.contains("unmount failed"), "{log}");
    drop(mount);

    // The cache's lock went with the daemon: a new mount on it starts at once.
    let again = Mount::start(&s.hub, &s.mnt, &s.cache, &[]);
    assert_eq!(sha256_of(&again.path(&shard)), source_sha);
}

#[test]
fn a_second_sigterm_while_detached_stops_at_once_and_frees_the_cache() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/held-twice", 1, "4M");
    let shard = model.shards().remove(0);
    let mut mount = Mount::start(&s.hub, &s.mnt, &s.cache, SERVED_BY_THE_DAEMON);
    let holder = MmapHolder::start(Command::new(python()), &mount.path(&shard));

    mount.signal(libc::SIGTERM);
    wait_detached(&mount);
    mount.signal(libc::SIGTERM);
    let status = mount.wait_exit();
    assert!(status.success(), "{status}\n{}", mount.log_text());
    assert!(
        !is_mounted(&s.mnt),
        "no dead mount is left at the mount point"
    );
    drop(holder);
    drop(mount);

    let again = Mount::start(&s.hub, &s.mnt, &s.cache, &[]);
    assert_eq!(
        sha256_of(&again.path(&shard)),
        sha256_of(&s.hub.join(&shard))
    );
}
