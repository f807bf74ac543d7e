//! Writing through the mount under faults (issue #22): the link to the NAS cut while a
//! download or a plain writer writes through the mount, and the daemon killed mid-write
//! and restarted. Real clients (huggingface_hub through `tests/py/fault_client.py`, a
//! local Hub from `tests/py/hub_server.py`), real mounts, a real network filesystem
//! (sshfs in a network namespace, [`NetFs`]). Each test ends by checking that nothing
//! is wrong on the source (nothing half-written under a final name; after recovery
//! what a direct download holds) or in the cache (no copy of a half-written file,
//! nothing left in its tmp, every staged copy whole), and that what the mount serves
//! is exactly what the source holds.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use stagefs_tests::hub::{As, FAULT_CLIENT, Hub, REPO, sha256_hex, sha256_of, tree};
use stagefs_tests::{
    Mount, NetFs, Scratch, generate, run_stagefs, staged_files, status_json, temp_files, wait_for,
    within,
};

const REPO_DIR: &str = "models--acme--tiny";
/// The mounts' source timeout: how long a writer waits on a dead link before EIO.
const SOURCE_TIMEOUT: &str = "3s";

// ---------------------------------------------------------------------------------
// Helpers of these tests.
// ---------------------------------------------------------------------------------

/// A generated model (16 MiB of weights) in `repo/` of the scratch area, served by a
/// local Hub, and a direct download of it into `direct/`, a plain directory, by `who`.
fn hub_and_direct_download(s: &Scratch, who: As) -> (Hub, PathBuf) {
    let repo = s.dir.path().join("repo");
    let hub = Hub::of_a_new_model(FAULT_CLIENT, &repo, &[]);
    let direct = s.dir.path().join("direct");
    fs::create_dir_all(&direct).expect("mkdir");
    if let As::User(user) = who {
        user.chown(&direct);
    }
    let endpoint = PathBuf::from(&hub.url);
    who.ok(
        FAULT_CLIENT,
        "snapshot",
        Path::new(REPO),
        &[("HF_ENDPOINT", &endpoint), ("HF_HUB_CACHE", &direct)],
    );
    (hub, direct)
}

/// The sha256 of the model's weights, the name of their blob.
fn weights_sha(s: &Scratch) -> String {
    sha256_of(&s.dir.path().join("repo/model.safetensors"))
}

/// The `.incomplete` files huggingface_hub left in the model's `blobs/` under `root`,
/// relative to `root`.
fn incomplete_blobs(root: &Path) -> Vec<PathBuf> {
    let blobs = Path::new(REPO_DIR).join("blobs");
    let mut found: Vec<PathBuf> = fs::read_dir(root.join(&blobs))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name())
                .filter(|n| n.to_string_lossy().ends_with(".incomplete"))
                .map(|n| blobs.join(n))
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

/// What a failed download left on the source `root` (whose tree is `found`),
/// checked against the direct download into `direct`: every entry under a name the
/// direct download has is that entry, or missing (nothing half-written under a final
/// name); the others, which huggingface_hub could not clean up once the source was
/// gone (its `<blob>.<8 hex>.incomplete` temp files, each holding the start of its
/// blob; the directory of its symlink probe), are returned.
#[track_caller]
fn leftovers_of_a_failed_download(
    root: &Path,
    found: &BTreeMap<PathBuf, String>,
    direct: &Path,
) -> BTreeMap<PathBuf, String> {
    let expected = tree(direct);
    let mut leftovers = BTreeMap::new();
    for (path, what) in found {
        match expected.get(path) {
            Some(right) => assert_eq!(what, right, "{} is not whole", path.display()),
            None => {
                leftovers.insert(path.clone(), what.clone());
            }
        }
    }
    for leftover in incomplete_blobs(root) {
        let name = leftover.file_name().expect("name").to_string_lossy();
        let blob = name.split('.').next().expect("a blob's name");
        let whole = fs::read(direct.join(REPO_DIR).join("blobs").join(blob))
            .unwrap_or_else(|e| panic!("{name} is not a temp name of a blob: {e}"));
        let part = fs::read(root.join(&leftover)).expect("leftover");
        assert!(
            whole.starts_with(&part),
            "{name} holds {} bytes that are not the start of its blob",
            part.len()
        );
    }
    leftovers
}

/// filelock makes a lock file it creates group-writable with an fchmod, and only one
/// it creates: a lock that a download which then failed created just before the link
/// was cut keeps the mode it was created with (0644, with the umask) when that
/// fchmod was lost with the link. Such a lock is counted as the direct download's.
fn forgive_lost_lock_chmods(found: &mut BTreeMap<PathBuf, String>) {
    let empty = sha256_hex(b"");
    for (path, what) in found.iter_mut() {
        let lock = path.starts_with(".locks") && path.extension() == Some("lock".as_ref());
        if lock && *what == format!("file 644 {empty}") {
            *what = format!("file 664 {empty}");
        }
    }
}

/// Whether `root` holds the model's weights, or a link to them, under a final name.
fn weights_under_a_final_name(root: &Path, weights: &str) -> bool {
    let repo = root.join(REPO_DIR);
    let links = fs::read_dir(repo.join("snapshots"))
        .map(|rd| {
            rd.flatten()
                .any(|snap| fs::symlink_metadata(snap.path().join("model.safetensors")).is_ok())
        })
        .unwrap_or(false);
    links || fs::symlink_metadata(repo.join("blobs").join(weights)).is_ok()
}

/// The sha256 of every staged copy in `cache`.
fn staged_shas(cache: &Path) -> Vec<String> {
    staged_files(cache).iter().map(|f| sha256_of(f)).collect()
}

/// Checks that every staged copy in `cache` is whole: its bytes are those of one of
/// the files in `whole` (a directory of complete files, walked).
#[track_caller]
fn every_staged_copy_is_whole(cache: &Path, whole: &[&Path]) {
    let known: Vec<String> = whole
        .iter()
        .flat_map(|root| tree(root).into_values())
        .filter_map(|v| v.rsplit(' ').next().map(str::to_owned))
        .collect();
    for (file, sha) in staged_files(cache).iter().zip(staged_shas(cache)) {
        assert!(
            known.contains(&sha),
            "{} is a copy of no whole file",
            file.display()
        );
    }
}

/// Waits until every operation `mount` sent to the source has come back and a probe
/// has seen the source answer (a lookup of a name never seen sets one off): after a
/// cut link is restored, the requests that were stuck on it are delivered first, so
/// the source then holds all that will ever land of what was written before the cut.
fn wait_for_the_source_to_settle(mount: &Mount) {
    let mut asked = 0;
    let every = Duration::from_millis(200);
    let what = "the source to answer again, nothing stuck on it";
    stagefs_tests::wait_for_within(what, Duration::from_secs(60), every, || {
        asked += 1;
        let _ = fs::symlink_metadata(mount.path(format!("never-seen-{asked}")));
        let health = &status_json(&mount.cache)["source_health"];
        health["unresponsive"] == false && health["running"] == 0
    });
}

/// `stagefs verify` of the mount's cache: every staged copy matches its hash.
#[track_caller]
fn verify_clean(cache: &Path) {
    let (ok, out, err) = run_stagefs(&[&"verify", &"--cache-dir", &cache]);
    assert!(ok && out.contains(" 0 mismatches"), "{out}{err}");
}

/// An offline load of the model through `mount` by `who`: every file is
/// the direct download's, and safetensors reads the right tensors.
#[track_caller]
fn offline_load_matches(who: As, mount: &Mount, direct: &Path) {
    let env = [
        ("HF_HUB_CACHE", mount.mnt.as_path()),
        ("HF_HUB_OFFLINE", Path::new("1")),
    ];
    let load = who
        .client(FAULT_CLIENT, "load", Path::new(REPO), &env)
        .unwrap_or_else(|e| panic!("the offline load: {e}\n{}", mount.log_text()));
    assert_eq!(load["tensors_match"], true, "{load}");
    let snapshots = direct.join(REPO_DIR).join("snapshots");
    let snapshot = fs::read_dir(snapshots)
        .expect("snapshots")
        .flatten()
        .next()
        .expect("one snapshot")
        .path();
    let files = load["files"].as_object().expect("files");
    assert_eq!(files.len(), 3, "{load}");
    for (name, file) in files {
        let expected = sha256_of(&snapshot.join(name));
        assert_eq!(file["sha256"], expected.as_str(), "{name}: {load}");
    }
}

/// Checks that two trees hold the same, naming only the entries that differ.
#[track_caller]
fn same_tree(found: &BTreeMap<PathBuf, String>, expected: &BTreeMap<PathBuf, String>, what: &str) {
    let differ: Vec<_> = found
        .keys()
        .chain(expected.keys())
        .filter(|k| found.get(*k) != expected.get(*k))
        .map(|k| {
            format!(
                "{}: {:?} instead of {:?}",
                k.display(),
                found.get(k),
                expected.get(k)
            )
        })
        .collect();
    assert!(differ.is_empty(), "{what}:\n{}", differ.join("\n"));
}

/// Closes `file`, saying how the close went (dropping a `File` does not).
fn close(file: File) -> std::io::Result<()> {
    let fd = std::os::fd::IntoRawFd::into_raw_fd(file);
    // SAFETY: `fd` is an open descriptor this function owns, closed once.
    match unsafe { libc::close(fd) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// `s.hub` over a writable sshfs link of 40 mbit (NetFs mounts read-only unless
/// told), mounted at `s.mnt` by the binary with the short source timeout.
fn mounted_over_a_slow_link(s: &Scratch) -> (NetFs, Mount) {
    let remote = NetFs::up_with(&s.hub, &s.dir.path().join("nas"), "40mbit", "rw");
    let mount = Mount::start(
        &remote.mnt,
        &s.mnt,
        &s.cache,
        &["--no-prefetch", "--source-timeout", SOURCE_TIMEOUT],
    );
    (remote, mount)
}

/// Restores a cut link when dropped: declared after the mount, it runs before the
/// mount's unmount when a test fails, so nothing is left waiting on the dead link.
struct RestoreOnDrop<'a>(&'a NetFs);

impl Drop for RestoreOnDrop<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.restore();
        }
    }
}

// ---------------------------------------------------------------------------------
// The tests.
// ---------------------------------------------------------------------------------

/// The link to the NAS cut while `snapshot_download` writes the weights through the
/// mount: the download fails with EIO within a bounded time, nothing is left under a
/// final name on the source or staged in the cache, and a model staged before keeps
/// being served. Once the link is back, the download run again writes what a direct
/// download writes, and an offline load gets every byte right.
#[test]
fn a_link_cut_mid_download_fails_it_with_eio_and_a_rerun_completes_it() {
    let s = Scratch::new();
    let (hub, direct) = hub_and_direct_download(&s, As::Root);
    let weights = weights_sha(&s);
    let staged = generate(&s.hub, "acme/staged", 1, "4M");
    let untouched = tree(&s.hub);
    // 40 mbit: 16 MiB of weights take about 3.5 s to reach the NAS.
    let (remote, mount) = mounted_over_a_slow_link(&s);
    let _restore = RestoreOnDrop(&remote);
    let shard = staged.shards().remove(0);
    let shard_bytes = fs::read(s.hub.join(&shard)).expect("source");
    assert!(fs::read(mount.path(&shard)).expect("stage") == shard_bytes);
    wait_for("the staging to settle", || mount.in_flight().is_empty());
    let staged_before = staged_files(&s.cache);

    let endpoint = PathBuf::from(&hub.url);
    let download = As::Root.spawn(
        FAULT_CLIENT,
        "snapshot",
        Path::new(REPO),
        &[("HF_ENDPOINT", &endpoint), ("HF_HUB_CACHE", &mount.mnt)],
    );
    wait_for("the weights' .incomplete to grow on the NAS", || {
        incomplete_blobs(&s.hub).iter().any(|p| {
            p.to_string_lossy().contains(&weights)
                && fs::metadata(s.hub.join(p)).is_ok_and(|m| m.len() > 0)
        })
    });
    remote.cut();
    let cut_at = Instant::now();
    // Each call the client makes after the cut (a write, the close that flushes it,
    // the rename, lookups, the cleanup's unlink: some ten) gives up within the
    // source timeout.
    let failed = within(Duration::from_secs(90), move || download.finish());
    let took = cut_at.elapsed();
    let why = failed.expect_err("the download cannot complete over a cut link");
    assert!(
        why.contains("\"errno\": 5"),
        "the download fails with EIO: {why}\n{}",
        mount.log_text()
    );
    println!(
        "the download failed {:.1} s after the cut",
        took.as_secs_f64()
    );

    // Meanwhile a model staged before is served, every byte of it.
    let path = mount.path(&shard);
    let served = within(Duration::from_secs(30), move || fs::read(path)).expect("staged shard");
    assert!(
        served == shard_bytes,
        "the staged model is served while the link is cut"
    );
    assert!(
        !weights_under_a_final_name(&s.hub, &weights),
        "nothing under a final name: {:?}",
        tree(&s.hub.join(REPO_DIR))
    );
    wait_for("nothing left in the cache's tmp", || {
        temp_files(&s.cache).is_empty()
    });
    assert_eq!(
        staged_files(&s.cache),
        staged_before,
        "no copy of the partial download staged"
    );

    remote.restore();
    wait_for_the_source_to_settle(&mount);
    // Nor once what was stuck on the link has landed.
    assert!(!weights_under_a_final_name(&s.hub, &weights));
    // The source holds the staged model as it was, and of the download what the
    // failed attempt wrote whole, and what it could not clean up with the link cut.
    let download_tree = |root: &Path| {
        let mut found = tree(root);
        for (path, what) in &untouched {
            let kept = found.remove(path);
            assert_eq!(kept.as_ref(), Some(what), "{}", path.display());
        }
        forgive_lost_lock_chmods(&mut found);
        found
    };
    let leftovers = leftovers_of_a_failed_download(&s.hub, &download_tree(&s.hub), &direct);
    println!("left by the failed attempt: {:?}", leftovers.keys());
    if let Err(why) = As::Root.client(
        FAULT_CLIENT,
        "snapshot",
        Path::new(REPO),
        &[("HF_ENDPOINT", &endpoint), ("HF_HUB_CACHE", &mount.mnt)],
    ) {
        panic!("the rerun: {why}\n{}", mount.log_text());
    }
    // The rerun wrote what a direct download writes, and left the leftovers be.
    let mut through = download_tree(&s.hub);
    for (path, what) in &leftovers {
        assert_eq!(
            through.remove(path).as_ref(),
            Some(what),
            "{}",
            path.display()
        );
    }
    same_tree(
        &through,
        &tree(&direct),
        "the source holds what a direct download holds",
    );
    // They go through the mount as any file does.
    for path in leftovers.keys() {
        if path.parent().is_some_and(|p| leftovers.contains_key(p)) {
            continue;
        }
        let removed = match fs::symlink_metadata(s.hub.join(path)) {
            Ok(m) if m.is_dir() => fs::remove_dir_all(mount.path(path)),
            _ => fs::remove_file(mount.path(path)),
        };
        removed.unwrap_or_else(|e| panic!("removing {}: {e}", path.display()));
    }
    same_tree(
        &download_tree(&s.hub),
        &tree(&direct),
        "the source holds what a direct download holds",
    );
    assert!(temp_files(&s.cache).is_empty());

    drop(hub);
    offline_load_matches(As::Root, &mount, &direct);
    every_staged_copy_is_whole(&s.cache, &[&direct, &s.hub]);
    assert!(
        staged_shas(&s.cache).contains(&weights),
        "the weights are staged (as written by the rerun, or by the load)"
    );
    verify_clean(&s.cache);
    mount.unmount();
}

/// A plain writer on the mount when the link to the NAS is cut: a large file being
/// streamed, whose next write fails with EIO; and a file whose every write was
/// answered before the cut, whose close fails with EIO, since the NAS never got
/// them. Nothing is staged of either; once the link is back, each reads through the
/// mount exactly as the NAS holds it, and a rewrite is staged as written.
#[test]
fn a_link_cut_under_a_plain_writer_fails_its_write_or_its_close_with_eio() {
    let s = Scratch::new();
    fs::create_dir_all(s.hub.join("models/saved")).expect("mkdir");
    // 40 mbit: the 8 MiB below take about 1.7 s to reach the NAS.
    let (remote, mount) = mounted_over_a_slow_link(&s);
    let _restore = RestoreOnDrop(&remote);
    let bytes: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();

    // A file streamed, cut mid-way: a write fails with EIO (or the close).
    let streamed = Path::new("models/saved/streamed.bin");
    let (path, data) = (mount.path(streamed), bytes.clone());
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let mut file = File::create(path)?;
        for chunk in data.chunks(1 << 20) {
            file.write_all(chunk)?;
        }
        close(file)
    });
    wait_for("the file to grow on the NAS", || {
        fs::metadata(s.hub.join(streamed)).is_ok_and(|m| m.len() >= 1 << 20)
    });
    remote.cut();
    let err = within(Duration::from_secs(60), move || {
        writer.join().expect("writer")
    })
    .expect_err("a write over a cut link");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");

    // A file whose writes are all answered (sshfs sends them, the link lost them).
    remote.restore();
    wait_for_the_source_to_settle(&mount);
    let answered = Path::new("models/saved/answered.bin");
    let file = File::create(mount.path(answered)).expect("create");
    remote.cut();
    let head = bytes[..256 << 10].to_vec();
    let closed = within(Duration::from_secs(60), move || {
        let mut file = file;
        // Answered: sshfs takes it in and sends it into the dead link.
        file.write_all(&head).expect("a write sshfs takes in");
        close(file)
    });
    let on_nas = fs::metadata(s.hub.join(answered)).map_or(0, |m| m.len());
    let err = closed.expect_err(&format!(
        "the close of a file the NAS holds {on_nas} of 256 KiB of must fail"
    ));
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");

    wait_for("nothing left in the cache's tmp", || {
        temp_files(&s.cache).is_empty()
    });
    assert!(staged_files(&s.cache).is_empty(), "nothing staged");

    remote.restore();
    wait_for_the_source_to_settle(&mount);
    for rel in [streamed, answered] {
        // What landed of what was written is a prefix of it, and is what the mount serves.
        let on_source = fs::read(s.hub.join(rel)).expect("source");
        assert!(
            bytes.starts_with(&on_source),
            "{}: not a prefix of what was written",
            rel.display()
        );
        assert!(
            fs::read(mount.path(rel)).expect("read") == on_source,
            "{}: the mount serves the NAS's bytes",
            rel.display()
        );
    }
    // Written again whole over what landed (an open with O_TRUNC, as a saver run
    // again does), the file is staged as written and reads right.
    fs::write(mount.path(streamed), &bytes).expect("write again");
    wait_for("the rewrite staged as written", || {
        staged_shas(&s.cache).contains(&sha256_hex(&bytes))
    });
    assert!(fs::read(mount.path(streamed)).expect("read") == bytes);
    assert!(fs::read(s.hub.join(streamed)).expect("source") == bytes);
    assert!(temp_files(&s.cache).is_empty());
    verify_clean(&s.cache);
    mount.unmount();
}

/// The daemon killed (SIGKILL) while huggingface_hub, run by an ordinary user, is
/// half-way through writing the weights through the user's mount; then mounted again
/// on the same cache. The cache holds no copy of the half-written file and nothing in
/// its tmp; the partial file reads through the new mount exactly as the source holds
/// it; the download then completes, the source holds what a direct download holds
/// (once the killed client's leftover is removed), and an offline load gets every
/// byte right.
#[test]
fn a_daemon_killed_mid_download_leaves_no_copy_and_the_download_completes_after_a_restart() {
    let s = Scratch::for_user();
    let user = s.user().clone();
    let who = As::User(&user);
    let (hub, direct) = hub_and_direct_download(&s, who);
    // The mount is writable where its user can write the source.
    user.chown(&s.hub);
    let weights = weights_sha(&s);
    let mut mount = s.mount(&[]);
    let endpoint = PathBuf::from(&hub.url);
    let half = PathBuf::from((8u64 << 20).to_string());
    let mut download = who.spawn(
        FAULT_CLIENT,
        "paused",
        Path::new(REPO),
        &[
            ("HF_ENDPOINT", &endpoint),
            ("HF_HUB_CACHE", &mount.mnt),
            ("PAUSE_AT", &half),
        ],
    );
    let paused = download.line();
    let written = paused["bytes"].as_u64().expect("bytes");
    let partial = Path::new(paused["paused"].as_str().expect("path"))
        .strip_prefix(&mount.mnt)
        .expect("written through the mount")
        .to_path_buf();
    let on_source = s.hub.join(&partial);
    assert_eq!(
        fs::metadata(&on_source).map(|m| m.len()).ok(),
        Some(written)
    );
    // The small files go on downloading meanwhile: the kill lands on the weights alone.
    let blobs = Path::new(REPO_DIR).join("blobs");
    wait_for("the small files downloaded", || {
        incomplete_blobs(&s.hub) == [partial.clone()]
            && tree(&direct.join(&blobs))
                .keys()
                .filter(|b| b.as_os_str() != weights.as_str())
                .all(|b| s.hub.join(&blobs).join(b).exists())
    });
    assert!(
        !temp_files(&s.cache).is_empty(),
        "the weights are being staged as they are written"
    );
    let staged_before = staged_files(&s.cache);

    mount.kill_daemon();
    // The client goes on, and fails: the mount is dead.
    let failed = within(Duration::from_secs(60), move || download.finish());
    assert!(failed.is_err(), "{failed:?}");
    drop(mount); // `stagefs unmount` clears the dead mount
    let mount = s.mount(&[]);
    assert!(
        temp_files(&s.cache).is_empty(),
        "the half-written copy was removed at startup"
    );
    assert_eq!(
        staged_files(&s.cache),
        staged_before,
        "nothing of the half-written file was committed"
    );
    let partial_bytes = fs::read(&on_source).expect("source");
    assert_eq!(partial_bytes.len() as u64, written);
    let expected = sha256_hex(&partial_bytes);
    for _ in 0..2 {
        // Read from the source, then from the copy that read staged.
        assert_eq!(
            user.sha256(&mount.path(&partial)).as_deref(),
            Ok(expected.as_str()),
            "the partial file reads as the source holds it"
        );
    }
    let whole = fs::read(s.dir.path().join("repo/model.safetensors")).expect("weights");
    assert!(
        whole.starts_with(&partial_bytes),
        "the source holds a prefix of the weights"
    );

    who.ok(
        FAULT_CLIENT,
        "snapshot",
        Path::new(REPO),
        &[("HF_ENDPOINT", &endpoint), ("HF_HUB_CACHE", &mount.mnt)],
    );
    // The killed client could not remove its temp file; the user does, through the
    // mount, and its copy goes with it.
    let leftovers = leftovers_of_a_failed_download(&s.hub, &tree(&s.hub), &direct);
    assert_eq!(
        leftovers.keys().collect::<Vec<_>>(),
        [&partial],
        "the killed download's temp file, and nothing else"
    );
    let out = user.output(user.command("rm").arg(mount.path(&partial)));
    assert!(out.status.success(), "{out:?}");
    same_tree(
        &tree(&s.hub),
        &tree(&direct),
        "the source holds what a direct download holds",
    );
    let partial_key = stagefs_store::Key::for_source_path(&partial);
    wait_for("the partial file's copy removed with it", || {
        !s.cache.join("v1/data").join(partial_key.as_str()).exists()
    });

    drop(hub);
    offline_load_matches(who, &mount, &direct);
    every_staged_copy_is_whole(&s.cache, &[&direct]);
    assert!(staged_shas(&s.cache).contains(&weights));
    assert!(temp_files(&s.cache).is_empty());
    verify_clean(&s.cache);
    mount.unmount();
}
