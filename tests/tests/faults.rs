//! Faults users of caching filesystems have actually hit: sources that change or
//! vanish mid-copy, a full cache disk, crashes, races with eviction, stale mounts.
//! Each asserts what the user sees, and that no wrong byte is ever served.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::sleep;
use std::time::{Duration, SystemTime};

use stagefs_tests::{
    Model, Mount, NetFs, Scratch, TEST_RESERVE, Tmpfs, generate, load_with_real_clients,
    run_stagefs, staged_files, stagefs_bin, temp_files, wait_for, within,
};

#[test]
fn a_source_file_changing_mid_copy_is_never_cached() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/shifting", 3, "16M");
    // sshfs would otherwise cache attributes for 20 s and hide a deletion (NFS does the
    // same within actimeo); an in-place rewrite is caught by the blob's sha256 anyway.
    let remote = NetFs::up_with(&s.hub, &s.dir.path().join("nas"), "40mbit", "cache=no");
    let mount = Mount::start(&remote.mnt, &s.mnt, &s.cache, &["--no-prefetch"]);
    type Change = (&'static str, fn(&Path));
    let changes: [Change; 3] = [
        ("truncated", |p| {
            OpenOptions::new()
                .write(true)
                .open(p)
                .and_then(|f| f.set_len(1 << 20))
                .expect("truncate")
        }),
        ("rewritten", |p| {
            let mut f = OpenOptions::new().write(true).open(p).expect("open");
            f.write_all(&vec![0x5A; 4 << 20]).expect("rewrite in place");
        }),
        ("deleted", |p| fs::remove_file(p).expect("delete")),
    ];
    for (i, (how, change)) in changes.into_iter().enumerate() {
        let name = &model.files[2 + i].name;
        let blob = model.blob_of(&s.hub, name);
        let path = mount.path(model.snapshot_rel.join(name));
        let opener = std::thread::spawn(move || File::open(path).map(drop));
        wait_for("the copy to start", || mount.copying(&blob));
        change(&s.hub.join(&blob));
        let result = opener.join().expect("opener");
        let Err(err) = result else {
            panic!(
                "an open of a file {how} mid-copy must fail:\n{}",
                mount.log_text()
            );
        };
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{how}: {err}");
        assert!(
            temp_files(&s.cache).is_empty(),
            "{how}: the partial copy was removed"
        );
        let log = mount.log_text();
        assert!(
            log.lines()
                .any(|l| l.contains("staging failed") && l.contains(blob.to_str().expect("utf8"))),
            "{how}: no log line names the file:\n{log}"
        );
    }
    assert!(staged_files(&s.cache).is_empty(), "nothing was cached");
    drop(mount);
    drop(remote);
}

#[test]
fn an_unreachable_source_fails_fast_and_staged_models_keep_working() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/away", 1, "4M");
    let remote = NetFs::up(&s.hub, &s.dir.path().join("nas"), "200mbit");
    let mount = Mount::start(
        &remote.mnt,
        &s.mnt,
        &s.cache,
        &["--no-prefetch", "--source-timeout", "2s"],
    );
    let shard = model.shards().remove(0);
    let expected = fs::read(s.hub.join(&shard)).expect("source");
    assert!(fs::read(mount.path(&shard)).expect("stage") == expected);

    remote.cut();
    sleep(Duration::from_millis(1500)); // let the kernel's 1 s attribute cache expire
    let unknown = mount.path(model.snapshot_rel.join("never-seen.json"));
    let err = within(Duration::from_secs(30), move || fs::metadata(unknown))
        .expect_err("nothing can be said about an unseen name");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let shard_path = mount.path(&shard);
    let served =
        within(Duration::from_secs(30), move || fs::read(shard_path)).expect("read a staged shard");
    assert!(
        served == expected,
        "the staged copy is served while the source is away"
    );
    let cache = s.cache.clone();
    let (ok, _, err) = within(Duration::from_secs(30), move || {
        run_stagefs(&[&"status", &"--cache-dir", &cache])
    });
    assert!(ok, "the mount stays responsive: {err}");
    assert!(mount.log_text().contains("did not respond"));
    restore_and_unmount(remote, mount, &model);
}

#[test]
fn a_model_loaded_once_loads_again_with_real_clients_while_the_source_is_away() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/offline", 2, "2M");
    let remote = NetFs::up(&s.hub, &s.dir.path().join("nas"), "200mbit");
    let mount = Mount::start(&remote.mnt, &s.mnt, &s.cache, &["--source-timeout", "2s"]);
    let (ok, out) = load_with_real_clients(&mount, &model, &s.hub);
    assert!(ok, "first load: {out}");
    // Every file of the snapshot, and refs/main, gets a local copy; the small ones in
    // the background.
    wait_for("copies of every file the load read", || {
        mount.in_flight().is_empty() && staged_files(&s.cache).len() == model.files.len() + 1
    });

    let before_cut = mount.log_text().len();
    remote.cut();
    sleep(Duration::from_millis(1500)); // let the kernel's 1 s caches expire
    let (ok, out) = load_with_real_clients(&mount, &model, &s.hub);
    assert!(
        ok,
        "second load with the source away: {out}\n{}",
        mount.log_text()
    );
    let while_away = mount.log_text()[before_cut..].to_string();
    assert!(
        while_away.contains("serving the stored copy"),
        "{while_away}"
    );
    // sshfs answers some stats from its own cache; that must not pass for the NAS.
    assert!(
        !while_away.contains("the source responds again"),
        "{while_away}"
    );
    restore_and_unmount(remote, mount, &model);
}

/// Brings a cut link back and waits until the mount sees the source again before
/// unmounting: requests the daemon sent to the dead link end only once it is back.
fn restore_and_unmount(remote: NetFs, mount: Mount, model: &Model) {
    remote.restore();
    let config = mount.path(model.snapshot_rel.join("config.json"));
    wait_for("the source to answer again", || {
        fs::metadata(&config).is_ok()
    });
    drop(mount);
    drop(remote);
}

#[test]
fn mounting_an_unreachable_source_fails_with_a_clear_error_instead_of_hanging() {
    let s = Scratch::new();
    generate(&s.hub, "acme/dead", 1, "2M");
    let remote = NetFs::up(&s.hub, &s.dir.path().join("nas"), "200mbit");
    remote.cut();
    let (source, mnt, cache) = (remote.mnt.clone(), s.mnt.clone(), s.cache.clone());
    let (ok, _, err) = within(Duration::from_secs(60), move || {
        run_stagefs(&[
            &"mount",
            &source,
            &mnt,
            &"--cache-dir",
            &cache,
            &"--source-timeout",
            &"2s",
        ])
    });
    assert!(!ok);
    assert!(
        err.contains("did not answer within 2s") && err.contains("stagefs doctor"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    drop(remote);
}

#[test]
fn a_cache_disk_filling_up_mid_copy_gives_enospc_and_keeps_what_was_staged() {
    let s = Scratch::new();
    let small = generate(&s.hub, "acme/first", 1, "6M");
    let big = generate(&s.hub, "acme/second", 1, "24M");
    let disk = Tmpfs::mount(&s.dir.path().join("small-disk"), "size=40m,mode=0700");
    let cache = disk.0.join("cache");
    let remote = NetFs::up(&s.hub, &s.dir.path().join("nas"), "40mbit");
    let mount = Mount::start(
        &remote.mnt,
        &s.mnt,
        &cache,
        &["--no-prefetch", "--min-free", "0"],
    );
    let kept = small.shards().remove(0);
    assert!(
        fs::read(mount.path(&kept)).expect("stage") == fs::read(s.hub.join(&kept)).expect("src")
    );

    let shard = big.shards().remove(0);
    let blob = big.blob_of(&s.hub, "model-00001-of-00001.safetensors");
    let path = mount.path(&shard);
    let opener = std::thread::spawn(move || File::open(path).map(drop));
    wait_for("the copy to start", || mount.copying(&blob));
    // Something else fills the disk while the copy runs.
    let mut filler = File::create(disk.0.join("filler")).expect("filler");
    let _ = filler.write_all(&vec![1u8; 22 << 20]);
    drop(filler);
    let err = opener
        .join()
        .expect("opener")
        .expect_err("the disk is full");
    assert_eq!(
        err.raw_os_error(),
        Some(libc::ENOSPC),
        "{err}\n{}",
        mount.log_text()
    );
    let log = mount.log_text();
    assert!(log.contains("cache disk is full"), "{log}");
    assert!(
        temp_files(&cache).is_empty(),
        "the partial copy was removed"
    );
    let (ok, out, err) = run_stagefs(&[&"verify", &"--cache-dir", &cache]);
    assert!(
        ok && out.contains("checked 1 staged file ") && out.contains("0 mismatches"),
        "{out}{err}"
    );
    fs::remove_file(disk.0.join("filler")).expect("free the disk");
    assert!(
        fs::read(mount.path(&shard)).expect("now it fits")
            == fs::read(s.hub.join(&shard)).expect("src")
    );
    drop(mount);
    drop(remote);
}

#[test]
fn kill_9_at_random_points_twenty_times_never_serves_a_partial_file() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/crashy", 1, "96M");
    let shard = model.shards().remove(0);
    let expected = Arc::new(fs::read(s.hub.join(&shard)).expect("source"));
    let mut seed = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    println!("seed {seed}");
    for round in 0..20 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let mut mount = s.mount(&["--no-prefetch", "--copy-streams", "2"]);
        let path = mount.path(&shard);
        let reader = std::thread::spawn(move || {
            File::open(path).and_then(|mut f| f.read_to_end(&mut Vec::new()))
        });
        sleep(Duration::from_millis(seed % 250));
        mount.kill_daemon();
        let _ = reader.join();
        drop(mount); // `stagefs unmount` clears the dead mount

        let mount = s.mount(&["--no-prefetch"]);
        assert!(
            temp_files(&s.cache).is_empty(),
            "round {round}: partial copies removed at startup"
        );
        let served = fs::read(mount.path(&shard)).expect("read after remount");
        assert!(served == *expected, "round {round}: wrong bytes served");
        mount.unmount();
        if round % 2 == 1 {
            // Start some rounds cold, so the kill lands mid-copy again.
            let (ok, _, err) = run_stagefs(&[&"evict", &"--all", &"--cache-dir", &s.cache]);
            assert!(ok, "{err}");
        }
    }
}

/// The blob path (relative to the source root) a snapshot file of `hub` links to.
fn blob_of(hub: &Path, snapshot_file: &Path) -> PathBuf {
    let blob = fs::canonicalize(hub.join(snapshot_file)).expect("resolve");
    let root = fs::canonicalize(hub).expect("resolve");
    blob.strip_prefix(root).expect("inside").to_path_buf()
}

/// The identities the journal in `cache` records for the copy of `blob`, in order:
/// an inode of 0 is a copy not yet known to be on disk.
fn journaled_inodes(cache: &Path, blob: &Path) -> Vec<u64> {
    let key = stagefs_store::Key::for_source_path(blob);
    fs::read_to_string(cache.join("v1/index.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| match serde_json::from_str(line) {
            Ok(stagefs_store::index::Record::Put { key: k, entry }) if k == key.as_str() => {
                Some(entry.copy.ino)
            }
            _ => None,
        })
        .collect()
}

fn data_file(cache: &Path, blob: &Path) -> PathBuf {
    cache
        .join("v1/data")
        .join(stagefs_store::Key::for_source_path(blob).as_str())
}

#[test]
fn a_kill_9_between_the_answer_and_the_commit_serves_no_torn_copy_and_keeps_good_ones() {
    let s = Scratch::new();
    // Sizes differ so the blobs do: gen-demo's bytes depend on the size alone.
    let committed = generate(&s.hub, "acme/committed", 1, "2M");
    let torn = generate(&s.hub, "acme/torn", 1, "3M");
    let whole = generate(&s.hub, "acme/whole", 1, "4M");
    let slow = generate(&s.hub, "acme/slow", 1, "48M");
    // Over a slow link the big copy runs for seconds, and commits wait for it.
    let remote = NetFs::up(&s.hub, &s.dir.path().join("nas"), "40mbit");
    let mut mount = Mount::start(
        &remote.mnt,
        &s.mnt,
        &s.cache,
        &["--no-prefetch", "--source-timeout", "60s"],
    );
    let shard = |m: &Model| m.shards().remove(0);
    let blob = |m: &Model| blob_of(&s.hub, &shard(m));
    let expected = |m: &Model| fs::read(s.hub.join(shard(m))).expect("source");

    assert!(fs::read(mount.path(shard(&committed))).expect("read") == expected(&committed));
    wait_for("the first copy committed", || {
        journaled_inodes(&s.cache, &blob(&committed)).last() > Some(&0)
    });
    let committed_inode = fs::metadata(data_file(&s.cache, &blob(&committed))).map(|m| m.ino());
    let slow_path = mount.path(shard(&slow));
    let slow_reader = std::thread::spawn(move || fs::read(slow_path).map(|b| b.len()));
    wait_for("the slow copy started", || !temp_files(&s.cache).is_empty());
    for m in [&torn, &whole] {
        assert!(fs::read(mount.path(shard(m))).expect("read") == expected(m));
    }
    // Answered, and killed before the commits (they wait up to 5 s for the slow copy).
    mount.kill_daemon();
    let _ = slow_reader.join();
    for m in [&torn, &whole] {
        assert_eq!(
            journaled_inodes(&s.cache, &blob(m)),
            [0],
            "the kill landed between the answer and the commit"
        );
    }
    // A stand-in for power lost before the torn copy's tail reached the disk.
    let torn_file = data_file(&s.cache, &blob(&torn));
    fs::set_permissions(&torn_file, fs::Permissions::from_mode(0o600)).expect("chmod");
    let mut bytes = fs::read(&torn_file).expect("copy");
    let tail = bytes.len() - 4096;
    bytes[tail..].fill(0);
    fs::write(&torn_file, bytes).expect("garble");
    let whole_inode = fs::metadata(data_file(&s.cache, &blob(&whole))).map(|m| m.ino());
    drop(mount); // `stagefs unmount` clears the dead mount

    let mount = Mount::start(&remote.mnt, &s.mnt, &s.cache, &["--no-prefetch"]);
    for m in [&committed, &torn, &whole] {
        let served = fs::read(mount.path(shard(m))).expect("read after the restart");
        assert!(
            served == expected(m),
            "{}: right bytes after the restart",
            m.repo
        );
    }
    // The good copies were kept (re-hashed, not copied again); the torn one replaced.
    let inode = |m: &Model| fs::metadata(data_file(&s.cache, &blob(m))).map(|m| m.ino());
    assert_eq!(inode(&committed).ok(), committed_inode.ok());
    assert_eq!(inode(&whole).ok(), whole_inode.ok());
    assert!(mount.log_text().contains("dropping a damaged staged copy"));
    assert!(temp_files(&s.cache).is_empty());
    mount.unmount();
    // An unmount commits what it answered: every copy is vouched for again.
    for m in [&committed, &torn, &whole] {
        let last = journaled_inodes(&s.cache, &blob(m)).last().copied();
        assert!(last > Some(0), "{}: committed by the unmount", m.repo);
    }
    drop(remote);
}

#[test]
fn thirty_two_readers_racing_evictions_always_get_the_right_bytes() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/busy", 8, "2M");
    let shards = model.shards();
    let expected: Arc<Vec<Vec<u8>>> = Arc::new(
        shards
            .iter()
            .map(|p| fs::read(s.hub.join(p)).expect("src"))
            .collect(),
    );
    let mount = s.mount(&["--no-prefetch", "--max-size", "9M"]);
    let paths: Arc<Vec<PathBuf>> = Arc::new(shards.iter().map(|p| mount.path(p)).collect());
    let (ok_reads, full) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let readers: Vec<_> = (0..32)
        .map(|t| {
            let (paths, expected) = (Arc::clone(&paths), Arc::clone(&expected));
            let (ok_reads, full) = (Arc::clone(&ok_reads), Arc::clone(&full));
            std::thread::spawn(move || {
                for i in 0..6 {
                    let n = (t * 7 + i * 3) % paths.len();
                    match fs::read(&paths[n]) {
                        Ok(bytes) => {
                            assert!(bytes == expected[n], "wrong bytes for shard {n}");
                            ok_reads.fetch_add(1, Ordering::Relaxed);
                        }
                        // Every copy pinned by other readers: a legitimate refusal.
                        Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                            full.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("shard {n}: {e}"),
                    }
                }
            })
        })
        .collect();
    let evictor = {
        let cache = s.cache.clone();
        std::thread::spawn(move || {
            for _ in 0..10 {
                // Refusals of copies in use are expected; anything else is a failure.
                let (_, _, err) =
                    run_stagefs(&[&"evict", &"--to-size", &"2M", &"--cache-dir", &cache]);
                assert!(err.is_empty() || err.contains("in use"), "{err}");
                sleep(Duration::from_millis(30));
            }
        })
    };
    for r in readers {
        r.join().expect("reader");
    }
    evictor.join().expect("evictor");
    println!(
        "{} reads, {} refused for room",
        ok_reads.load(Ordering::Relaxed),
        full.load(Ordering::Relaxed)
    );
    // How many racing reads find room depends on how many shards other readers hold
    // open at that instant (a scheduling accident: 78 to 164 of 192 were seen), so
    // the count is not asserted. What the cache promises is asserted instead: above,
    // never a wrong byte and no refusal but ENOSPC; here, that the refusals were only
    // ever for room held by open handles: with no reader left, every shard opens and
    // reads right, evicting whatever the budget needs.
    for (n, path) in paths.iter().enumerate() {
        let bytes = fs::read(path).unwrap_or_else(|e| panic!("shard {n} alone: {e}"));
        assert!(bytes == expected[n], "wrong bytes for shard {n} read alone");
    }
    assert!(mount.log_text().contains("evicted"));
}

#[test]
fn a_stale_mount_after_a_crash_is_cleared_by_mount_and_by_unmount() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/stale", 1, "2M");
    let mut first = s.mount(&[]);
    first.kill_daemon();
    let err = fs::metadata(&s.mnt).expect_err("a dead mount");
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN));
    // The tests' own reserve: the default, a tenth of the volume, would fail the read
    // below for room on a machine whose shared disk is fuller than that.
    let out = Command::new(stagefs_bin())
        .arg("mount")
        .args([&s.hub, &s.mnt])
        .arg("--cache-dir")
        .arg(&s.cache)
        .args(["--min-free", &TEST_RESERVE.to_string()])
        .output()
        .expect("mount");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("cleared a stale mount"), "{stderr}");
    let shard = model.shards().remove(0);
    assert!(
        fs::read(s.mnt.join(&shard)).expect("read") == fs::read(s.hub.join(&shard)).expect("src")
    );
    // Kill the background daemon too: `stagefs unmount` clears that stale mount.
    let pid = fs::read_to_string(s.cache.join("lock")).expect("pid");
    Command::new("kill")
        .args(["-9", pid.trim()])
        .status()
        .expect("kill");
    wait_for("the daemon to die", || fs::metadata(&s.mnt).is_err());
    let (ok, _, err) = run_stagefs(&[&"unmount", &s.mnt]);
    assert!(ok, "{err}");
    assert!(
        fs::read_dir(&s.mnt)
            .expect("plain dir again")
            .next()
            .is_none()
    );
    drop(first);
}

/// The outage report: a model re-read while 24 programs open files never staged from
/// a NAS whose link was cut. Every re-read serves the right bytes and every never-staged
/// open fails with EIO, status answers (and says the source is not answering), and
/// after the link returns a never-staged file reads right. The times are printed for
/// docs/BENCHMARKS.md; nothing here asserts a duration but the hang bounds.
#[test]
fn a_staged_model_is_served_while_others_hammer_a_dead_source_and_the_source_comes_back() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/reread", 2, "4M");
    let never = generate(&s.hub, "acme/never-staged", 4, "2M");
    let remote = NetFs::up(&s.hub, &s.dir.path().join("nas"), "200mbit");
    let mount = Mount::start(
        &remote.mnt,
        &s.mnt,
        &s.cache,
        &["--no-prefetch", "--source-timeout", "5s"],
    );
    let files: Vec<(PathBuf, Vec<u8>)> = model
        .files
        .iter()
        .map(|f| {
            let rel = model.snapshot_rel.join(&f.name);
            (
                mount.path(&rel),
                fs::read(s.hub.join(&rel)).expect("source"),
            )
        })
        .collect();
    for (path, expected) in &files {
        assert!(fs::read(path).expect("first read") == *expected);
    }
    wait_for("copies of the small files", || {
        mount.in_flight().is_empty() && staged_files(&s.cache).len() == model.files.len()
    });

    // The programs had seen the other model's snapshot, as a loader listing it would.
    assert_eq!(
        fs::read_dir(mount.path(&never.snapshot_rel))
            .expect("list")
            .count(),
        never.files.len()
    );

    remote.cut();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (refused, served_wrong) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let hammering: Vec<_> = (0..24)
        .map(|i| {
            let shards = never.shards();
            let rel = &shards[i % shards.len()];
            let path = mount.path(rel);
            let expected = fs::read(s.hub.join(rel)).expect("source");
            let (stop, refused, served_wrong) = (
                Arc::clone(&stop),
                Arc::clone(&refused),
                Arc::clone(&served_wrong),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match fs::read(&path) {
                        Err(e) if e.raw_os_error() == Some(libc::EIO) => {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        // A read still waiting when the link returned, served right.
                        Ok(bytes) if bytes == expected => {}
                        Ok(bytes) => {
                            served_wrong.fetch_add(1, Ordering::Relaxed);
                            eprintln!("wrong bytes for a never-staged file: {} bytes", bytes.len());
                        }
                        Err(e) => {
                            served_wrong.fetch_add(1, Ordering::Relaxed);
                            eprintln!("a never-staged file while the source is away: {e}");
                        }
                    }
                }
            })
        })
        .collect();
    // Past the kernel's 1 s caches, so every re-read asks the mount again.
    let mut slowest_reread = Duration::ZERO;
    for _ in 0..5 {
        sleep(Duration::from_millis(1200));
        for (path, expected) in &files {
            let (path, expected) = (path.clone(), expected.clone());
            let started = std::time::Instant::now();
            let right = within(Duration::from_secs(60), move || {
                fs::read(&path).is_ok_and(|bytes| bytes == expected)
            });
            slowest_reread = slowest_reread.max(started.elapsed());
            assert!(right, "a staged file re-read while the source is away");
        }
    }
    // The commands on staged data answer from the cache alone.
    let ask = |args: &[&str]| {
        let asked = args.join(" ");
        let mut args: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
        args.extend(["--cache-dir".into(), s.cache.clone().into_os_string()]);
        let started = std::time::Instant::now();
        let (ok, out, err) = within(Duration::from_secs(60), move || {
            let args: Vec<&dyn AsRef<std::ffi::OsStr>> = args
                .iter()
                .map(|a| a as &dyn AsRef<std::ffi::OsStr>)
                .collect();
            run_stagefs(&args)
        });
        assert!(ok, "{asked}: {err}");
        (out, err, started.elapsed())
    };
    let (status, _, status_took) = ask(&["status"]);
    assert!(status.contains("not answering"), "{status}");
    let (planned, note, plan_took) = ask(&["prefetch", "--dry-run", "acme/reread"]);
    assert!(note.contains("not answering"), "{note}");
    // The two 4 MiB shards; small files' copies are not what a prefetch stages.
    assert!(
        planned.contains("0 to stage (0 B), 2 already staged (8.0 MiB)"),
        "{planned}"
    );
    let (evictable, _, evict_took) = ask(&["evict", "--dry-run", "acme/reread"]);
    assert!(evictable.contains("would evict"), "{evictable}");
    // Exit status 0: every copy of the model matches its hash.
    let (_, _, verify_took) = ask(&["verify", "acme/reread"]);
    stop.store(true, Ordering::Relaxed);

    remote.restore();
    let back = std::time::Instant::now();
    // How long the network client itself takes to answer again (TCP's retransmission
    // backoff grows with the length of the cut), to tell its share from the mount's.
    let direct = remote.mnt.join(&never.shards()[1]);
    let client_back = std::thread::spawn(move || {
        while fs::read(&direct).is_err() {
            sleep(Duration::from_millis(50));
        }
        back.elapsed()
    });
    let fresh = never.shards()[0].clone();
    let (fresh_path, fresh_bytes) = (
        mount.path(&fresh),
        fs::read(s.hub.join(&fresh)).expect("src"),
    );
    wait_for(
        "a never-staged file to read right once the link is back",
        || fs::read(&fresh_path).is_ok_and(|b| b == fresh_bytes),
    );
    let recovered_after = back.elapsed();
    let client_recovered_after =
        within(Duration::from_secs(120), move || client_back.join()).expect("direct read");
    for h in hammering {
        within(Duration::from_secs(60), move || h.join()).expect("hammering thread");
    }
    println!(
        "outage: slowest re-read of a staged file {:.3} s; status {:.3} s; \
         prefetch --dry-run {:.3} s; evict --dry-run {:.3} s; verify {:.3} s; \
         {} never-staged opens refused with EIO; a never-staged file read right {:.1} s after the link returned \
         (sshfs itself answered a direct read after {:.1} s)",
        slowest_reread.as_secs_f64(),
        status_took.as_secs_f64(),
        plan_took.as_secs_f64(),
        evict_took.as_secs_f64(),
        verify_took.as_secs_f64(),
        refused.load(Ordering::Relaxed),
        recovered_after.as_secs_f64(),
        client_recovered_after.as_secs_f64()
    );
    assert_eq!(served_wrong.load(Ordering::Relaxed), 0);
    assert!(refused.load(Ordering::Relaxed) > 0);
    drop(mount);
    drop(remote);
}
