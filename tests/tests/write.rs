//! The mount writes through (issue #22): real clients (the `hf` CLI, huggingface_hub,
//! safetensors, filelock) writing through real mounts, as root and as an ordinary
//! user. A local Hub endpoint (`tests/py/hub_server.py`) serves a generated model, so
//! downloads run online without a network; `tests/py/hub_client.py` holds the clients.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use stagefs_tests::hub::{As, HUB_CLIENT, Hub, REPO, sha256_of, tree};
use stagefs_tests::{Mount, Scratch, Tmpfs, python, staged_files, temp_files, wait_for};

/// The mount copied nothing from its source: every file it served was staged as
/// it was written.
#[track_caller]
fn nothing_read_back(mount: &Mount) {
    let metrics = mount.metrics();
    assert_eq!(metrics.stage_copies, 0, "nothing read back: {metrics:?}");
}

/// A scratch area (as `user`, if any) with a generated model in `repo/` served by a
/// local Hub, and a direct download of it into `direct/`, a plain directory.
fn hub_and_direct_download(user: bool, mode: &str) -> (Scratch, Hub, PathBuf) {
    let s = if user {
        Scratch::for_user()
    } else {
        Scratch::new()
    };
    let repo = s.dir.path().join("repo");
    let hub = Hub::of_a_new_model(HUB_CLIENT, &repo, &[]);
    let direct = s.dir.path().join("direct");
    fs::create_dir_all(&direct).expect("mkdir");
    let who = match &s.user {
        Some(u) => {
            u.chown(&direct);
            // The mount is writable where its user can write the source.
            u.chown(&s.hub);
            As::User(u)
        }
        None => As::Root,
    };
    let endpoint = PathBuf::from(&hub.url);
    who.ok(
        HUB_CLIENT,
        mode,
        Path::new(REPO),
        &[("HF_ENDPOINT", &endpoint), ("HF_HUB_CACHE", &direct)],
    );
    (s, hub, direct)
}

/// `hf download` or `snapshot_download` through the mount (HF_HUB_CACHE at it),
/// online: the source then holds exactly what a direct download holds (blobs, links,
/// refs, locks), and an offline load through the mount gets every byte right.
fn download_through_the_mount(user: bool, mode: &str) {
    let (s, hub, direct) = hub_and_direct_download(user, mode);
    let who = s.user.as_ref().map_or(As::Root, As::User);
    let mount = s.mount(&[]);
    let endpoint = PathBuf::from(&hub.url);
    who.ok(
        HUB_CLIENT,
        mode,
        Path::new(REPO),
        &[("HF_ENDPOINT", &endpoint), ("HF_HUB_CACHE", &mount.mnt)],
    );
    // Staged as it was written: the weights' blob is in the cache without a copy.
    let weights = sha256_of(&s.dir.path().join("repo/model.safetensors"));
    wait_for("the weights staged as they were written", || {
        staged_files(&s.cache)
            .iter()
            .any(|p| p.ends_with(format!("sha256-{weights}")))
    });
    let (through, plain) = (tree(&s.hub), tree(&direct));
    assert_eq!(
        through, plain,
        "the source holds what a direct download holds"
    );
    assert!(
        through
            .keys()
            .any(|p| p.starts_with("models--acme--tiny/blobs")),
        "{through:?}"
    );
    assert!(
        temp_files(&s.cache).is_empty(),
        "nothing left in the cache's tmp"
    );

    // Offline, through the mount, with the Hub gone.
    drop(hub);
    let load = who.ok(
        HUB_CLIENT,
        "load",
        Path::new(REPO),
        &[
            ("HF_HUB_CACHE", &mount.mnt),
            ("HF_HUB_OFFLINE", Path::new("1")),
        ],
    );
    assert_eq!(load["tensors_match"], true, "{load}");
    assert_eq!(load["repos"], serde_json::json!([REPO]), "{load}");
    let metrics = mount.metrics();
    assert_eq!(
        metrics.stage_copies, 0,
        "nothing read back over the link: {metrics:?}"
    );
    // Every byte of the download went through the mount: at least the blobs' bytes.
    let blobs: u64 = fs::read_dir(s.hub.join("models--acme--tiny/blobs"))
        .expect("blobs")
        .flatten()
        .map(|e| e.metadata().expect("blob").len())
        .sum();
    assert!(
        metrics.bytes_written >= blobs && blobs > 0,
        "{} of {blobs} bytes counted as written through",
        metrics.bytes_written
    );
    let snapshot = fs::read_dir(direct.join("models--acme--tiny/snapshots"))
        .expect("snapshots")
        .flatten()
        .next()
        .expect("one snapshot")
        .path();
    for (name, file) in load["files"].as_object().expect("files") {
        let expected = sha256_of(&snapshot.join(name));
        assert_eq!(file["sha256"], expected.as_str(), "{name}: {load}");
        if name.ends_with(".safetensors") {
            assert_eq!(
                file["blob"],
                expected.as_str(),
                "an LFS blob is named by its sha256"
            );
        }
    }
    mount.unmount();
}

#[test]
fn hf_download_through_the_mount_writes_what_a_direct_download_writes() {
    download_through_the_mount(false, "hf-download");
}

#[test]
fn snapshot_download_through_a_users_mount_writes_what_a_direct_download_writes() {
    download_through_the_mount(true, "snapshot");
}

#[test]
fn hf_hub_download_through_the_mount_writes_what_a_direct_download_writes() {
    download_through_the_mount(false, "hub-download");
}

/// `hf download` with `HF_HOME` at a mount of an HF_HOME (the third shape): the
/// download lands under the source's `hub/`, with what a direct download into an
/// HF_HOME holds there, and an offline load through the mount copies nothing.
#[test]
fn hf_download_into_an_hf_home_mount_writes_what_a_direct_download_writes() {
    let s = Scratch::new();
    let repo = s.dir.path().join("repo");
    let hub = Hub::of_a_new_model(HUB_CLIENT, &repo, &[]);
    let endpoint = hub.endpoint();
    let direct = s.dir.path().join("direct-home");
    fs::create_dir_all(direct.join("hub")).expect("mkdir");
    fs::create_dir_all(s.hub.join("hub")).expect("mkdir");
    fs::write(s.hub.join("token"), "hf_test").expect("a token, as an HF_HOME has");
    let mount = s.mount(&[]);
    for home in [&direct, &mount.mnt] {
        As::Root.ok(
            HUB_CLIENT,
            "hf-download",
            Path::new(REPO),
            &[("HF_ENDPOINT", &endpoint), ("HF_HOME", home)],
        );
    }
    assert_eq!(
        tree(&s.hub.join("hub")),
        tree(&direct.join("hub")),
        "the source's hub/ holds what a direct download holds"
    );
    drop(hub);
    let load = As::Root.ok(
        HUB_CLIENT,
        "load",
        Path::new(REPO),
        &[("HF_HOME", &mount.mnt), ("HF_HUB_OFFLINE", Path::new("1"))],
    );
    assert_eq!(load["tensors_match"], true, "{load}");
    nothing_read_back(&mount);
    mount.unmount();
}

/// `hf download --local-dir` into a plain folder on the mount (huggingface_hub
/// writes each file under `.cache/huggingface/download/` and moves it into place),
/// then a load by path: the files are the repo's, and the load copies nothing.
#[test]
fn hf_download_into_a_local_dir_on_the_mount_is_staged_as_it_is_written() {
    let s = Scratch::new();
    let repo = s.dir.path().join("repo");
    let hub = Hub::of_a_new_model(HUB_CLIENT, &repo, &[]);
    let mount = s.mount(&[]);
    let folder = mount.path("models/acme/tiny");
    let endpoint = PathBuf::from(&hub.url);
    let got = As::Root.ok(
        HUB_CLIENT,
        "local-dir",
        &folder,
        &[("HF_ENDPOINT", &endpoint), ("REPO", Path::new(REPO))],
    );
    for name in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert_eq!(
            got[name],
            sha256_of(&repo.join(name)).as_str(),
            "{name}: {got}"
        );
        assert_eq!(
            sha256_of(&s.hub.join("models/acme/tiny").join(name)),
            sha256_of(&repo.join(name)),
            "{name} on the source"
        );
    }
    drop(hub);
    let loaded = As::Root.ok(HUB_CLIENT, "load-folder", &folder, &[]);
    assert_eq!(loaded["tensors_match"], true, "{loaded}");
    nothing_read_back(&mount);
    assert!(temp_files(&s.cache).is_empty(), "nothing left in tmp");
    mount.unmount();
}

/// Two `snapshot_download`s of one repo at once through the mount, the Hub paced so
/// that they overlap (huggingface_hub serializes them per blob with filelock): both
/// succeed, and the source holds what one direct download holds.
#[test]
fn two_concurrent_downloads_of_one_repo_write_what_one_direct_download_writes() {
    let s = Scratch::new();
    let repo = s.dir.path().join("repo");
    let hub = Hub::of_a_new_model(HUB_CLIENT, &repo, &["--rate", "4000000"]);
    let endpoint = PathBuf::from(&hub.url);
    let direct = s.dir.path().join("direct");
    As::Root.ok(
        HUB_CLIENT,
        "snapshot",
        Path::new(REPO),
        &[("HF_ENDPOINT", &endpoint), ("HF_HUB_CACHE", &direct)],
    );
    let mount = s.mount(&[]);
    let env = [("HF_ENDPOINT", &*endpoint), ("HF_HUB_CACHE", &*mount.mnt)];
    let results: Vec<Result<Value, String>> = std::thread::scope(|scope| {
        let downloads: Vec<_> = (0..2)
            .map(|_| scope.spawn(|| As::Root.client(HUB_CLIENT, "snapshot", Path::new(REPO), &env)))
            .collect();
        downloads
            .into_iter()
            .map(|d| d.join().expect("a download thread"))
            .collect()
    });
    for result in &results {
        assert!(result.is_ok(), "{result:?}");
    }
    assert_eq!(
        tree(&s.hub),
        tree(&direct),
        "the source holds what a direct download holds"
    );
    let weights = sha256_of(&repo.join("model.safetensors"));
    wait_for("the weights staged as they were written", || {
        staged_files(&s.cache)
            .iter()
            .any(|p| p.ends_with(format!("sha256-{weights}")))
    });
    drop(hub);
    let load = As::Root.ok(
        HUB_CLIENT,
        "load",
        Path::new(REPO),
        &[
            ("HF_HUB_CACHE", &mount.mnt),
            ("HF_HUB_OFFLINE", Path::new("1")),
        ],
    );
    assert_eq!(load["tensors_match"], true, "{load}");
    nothing_read_back(&mount);
    assert!(temp_files(&s.cache).is_empty(), "nothing left in tmp");
    mount.unmount();
}

/// A user's online loads, as on a Mac with HF_HUB_CACHE at the mount: `mlx_lm.load`
/// downloads a model; the Hub then gets a newer revision, and transformers'
/// `from_pretrained` and `mlx_lm.load`, still online, find it and download it through
/// the mount. The source then holds what the same loads into a plain directory
/// write (both snapshots, refs/main at the newer one), and the newer weights load
/// offline with nothing read back over the link.
fn online_loads_find_a_newer_revision(user: bool) {
    let s = if user {
        Scratch::for_user()
    } else {
        Scratch::new()
    };
    let (old, new) = (s.dir.path().join("old"), s.dir.path().join("new"));
    for (dir, seed) in [(&old, "0"), (&new, "1")] {
        As::Root.ok(
            HUB_CLIENT,
            "make-llama",
            dir,
            &[("MODEL_SEED", Path::new(seed))],
        );
        // The clients compare what they load with these, as whoever runs them.
        let weights = dir.join("model.safetensors");
        fs::set_permissions(&weights, fs::Permissions::from_mode(0o644)).expect("chmod");
    }
    let direct = s.dir.path().join("direct");
    fs::create_dir_all(&direct).expect("mkdir");
    let who = match &s.user {
        Some(u) => {
            u.chown(&direct);
            u.chown(&s.hub);
            As::User(u)
        }
        None => As::Root,
    };
    // The same loads, in the same order, into `cache`; the revisions they loaded.
    let online_loads = |cache: &Path| -> [String; 2] {
        let mlx_load = |hub: &Hub, model: &Path| {
            let endpoint = PathBuf::from(&hub.url);
            let expect = model.join("model.safetensors");
            let loaded = who.ok(
                HUB_CLIENT,
                "mlx-load",
                Path::new(REPO),
                &[
                    ("HF_ENDPOINT", &endpoint),
                    ("HF_HUB_CACHE", cache),
                    ("EXPECT_WEIGHTS", &expect),
                ],
            );
            assert_eq!(loaded["weights_match"], true, "{loaded}");
            loaded["revision"].as_str().expect("a revision").to_string()
        };
        let first = mlx_load(&Hub::serve(&old), &old);
        let hub = Hub::serve(&new);
        let endpoint = PathBuf::from(&hub.url);
        let pretrained = who.ok(
            HUB_CLIENT,
            "from-pretrained",
            Path::new(REPO),
            &[("HF_ENDPOINT", &endpoint), ("HF_HUB_CACHE", cache)],
        );
        assert_eq!(pretrained["seed"], 1, "the newer config: {pretrained}");
        let second = mlx_load(&hub, &new);
        assert_ne!(first, second, "the newer revision was found");
        [first, second]
    };
    let direct_revisions = online_loads(&direct);
    let mount = s.mount(&[]);
    assert_eq!(online_loads(&mount.mnt), direct_revisions);
    assert_eq!(
        tree(&s.hub),
        tree(&direct),
        "the source holds what the same loads write into a plain directory"
    );
    let refs = fs::read_to_string(s.hub.join("models--acme--tiny/refs/main")).expect("refs");
    assert_eq!(
        refs, direct_revisions[1],
        "refs/main names the newer revision"
    );
    let newer = sha256_of(&new.join("model.safetensors"));
    wait_for("the newer weights staged as they were written", || {
        staged_files(&s.cache)
            .iter()
            .any(|p| p.ends_with(format!("sha256-{newer}")))
    });

    // Offline, with the Hub gone: the newer weights, from the local copy.
    let expect = new.join("model.safetensors");
    let loaded = who.ok(
        HUB_CLIENT,
        "mlx-load",
        Path::new(REPO),
        &[
            ("HF_HUB_CACHE", &mount.mnt),
            ("HF_HUB_OFFLINE", Path::new("1")),
            ("EXPECT_WEIGHTS", &expect),
        ],
    );
    assert_eq!(loaded["weights_match"], true, "{loaded}");
    assert_eq!(loaded["revision"], direct_revisions[1].as_str());
    nothing_read_back(&mount);
    assert!(temp_files(&s.cache).is_empty(), "nothing left in tmp");
    mount.unmount();
}

#[test]
fn online_loads_through_the_mount_find_and_download_a_newer_revision() {
    online_loads_find_a_newer_revision(false);
}

#[test]
fn online_loads_through_a_users_mount_find_and_download_a_newer_revision() {
    online_loads_find_a_newer_revision(true);
}

/// A save into a plain model folder on the mount (config, then the weights under a
/// temp name renamed over), then a load by path, then again after a remount.
fn save_into_a_plain_folder(user: bool) {
    let s = if user {
        Scratch::for_user()
    } else {
        Scratch::new()
    };
    let who = match &s.user {
        Some(u) => {
            u.chown(&s.hub);
            As::User(u)
        }
        None => As::Root,
    };
    let mount = s.mount(&[]);
    let folder = Path::new("models/acme/saved");
    let saved = who.ok(HUB_CLIENT, "save", &mount.path(folder), &[]);
    let names: Vec<_> = saved.as_object().expect("files").keys().cloned().collect();
    assert_eq!(
        names,
        ["config.json", "model.safetensors"],
        "no temp file left"
    );
    for (name, sha) in saved.as_object().expect("files") {
        let on_source = s.hub.join(folder).join(name);
        assert_eq!(
            sha256_of(&on_source),
            sha.as_str().unwrap_or_default(),
            "{name}"
        );
    }
    let loaded = who.ok(HUB_CLIENT, "load-folder", &mount.path(folder), &[]);
    assert_eq!(loaded["tensors_match"], true, "{loaded}");
    assert_eq!(loaded["sha256"], saved["model.safetensors"], "{loaded}");
    // The weights' copy, written under the temp name, followed the rename.
    nothing_read_back(&mount);
    assert!(temp_files(&s.cache).is_empty(), "nothing left in tmp");
    mount.unmount();

    let again = s.mount(&[]);
    let loaded = who.ok(HUB_CLIENT, "load-folder", &again.path(folder), &[]);
    assert_eq!(loaded["tensors_match"], true, "{loaded}");
    again.unmount();
}

#[test]
fn a_model_saved_into_a_plain_folder_on_the_mount_loads_by_path() {
    save_into_a_plain_folder(false);
}

#[test]
fn a_model_saved_into_a_plain_folder_on_a_users_mount_loads_by_path() {
    save_into_a_plain_folder(true);
}

/// Issue 35: a model loaded from a plain folder on the mount, then saved over in
/// place as transformers' `save_pretrained` does (O_TRUNC on the shard it just
/// loaded), then loaded again: the new tensors, on every read path. On an ordinary
/// user's mount staged files were links to read-only copies, and the save failed
/// with EACCES.
fn save_over_the_loaded_model(user: bool, flags: &[&str]) {
    let s = if user {
        Scratch::for_user()
    } else {
        Scratch::new()
    };
    let who = match &s.user {
        Some(u) => {
            u.chown(&s.hub);
            As::User(u)
        }
        None => As::Root,
    };
    let folder = s.hub.join("models/acme/tuned");
    who.ok(HUB_CLIENT, "save", &folder, &[]);
    let mount = s.mount(flags);
    let dir = mount.path("models/acme/tuned");
    // Loaded twice: staged by the first load, served from the copy to the second.
    for _ in 0..2 {
        let loaded = who.ok(HUB_CLIENT, "load-folder", &dir, &[]);
        assert_eq!(loaded["tensors_match"], true, "{loaded}");
    }
    // Past the kernel's 1 s entry timeout a new lookup is asked, which is where a
    // staged file would be presented as a link to its copy.
    std::thread::sleep(Duration::from_millis(1500));
    if let Some(u) = &s.user {
        let shard = dir.join("model.safetensors");
        assert_eq!(u.readlink(&shard), None, "presented as the file itself");
    }
    let offset = Path::new("7");
    let saved = who.ok(
        HUB_CLIENT,
        "save-in-place",
        &dir,
        &[("TENSORS_OFFSET", offset)],
    );
    let shard = folder.join("model.safetensors");
    assert_eq!(
        saved["model.safetensors"],
        sha256_of(&shard).as_str(),
        "{saved}"
    );
    let loaded = who.ok(
        HUB_CLIENT,
        "load-folder",
        &dir,
        &[("TENSORS_OFFSET", offset)],
    );
    assert_eq!(loaded["tensors_match"], true, "the new tensors: {loaded}");
    assert_eq!(loaded["sha256"], saved["model.safetensors"], "{loaded}");
    mount.unmount();
}

#[test]
fn saving_over_the_loaded_model_in_place_then_loading_it_as_root() {
    save_over_the_loaded_model(false, &[]);
}

#[test]
fn saving_over_the_loaded_model_in_place_then_loading_it_without_passthrough() {
    save_over_the_loaded_model(false, &["--no-passthrough"]);
}

#[test]
fn saving_over_the_loaded_model_in_place_then_loading_it_as_an_ordinary_user() {
    save_over_the_loaded_model(true, &[]);
}

/// A source too small for the model: the writer gets ENOSPC, and no file is left
/// under a final name (the download's blob and snapshot link are not created; the
/// mount itself creates nothing); nothing is left in the cache's tmp.
#[test]
fn a_full_source_fails_the_writer_with_enospc_and_leaves_no_final_name() {
    let s = Scratch::new();
    let repo = s.dir.path().join("repo");
    let hub = Hub::of_a_new_model(HUB_CLIENT, &repo, &[]);
    let small = s.dir.path().join("small");
    let _tmpfs = Tmpfs::mount(&small, "size=2m");
    let mount = Mount::start(&small, &s.mnt, &s.cache, &[]);

    // A plain write.
    let mut file = File::create(mount.path("big")).expect("create");
    let written = file
        .write_all(&vec![7u8; 4 << 20])
        .and_then(|()| file.sync_all());
    let err = written.expect_err("a 4 MiB write into a 2 MiB source");
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    drop(file);
    fs::remove_file(mount.path("big")).expect("remove");

    // A download: huggingface_hub writes blobs/<hash>.incomplete and renames it only
    // once it is whole.
    let endpoint = PathBuf::from(&hub.url);
    let failed = As::Root.client(
        HUB_CLIENT,
        "snapshot",
        Path::new(REPO),
        &[("HF_ENDPOINT", &endpoint), ("HF_HUB_CACHE", &mount.mnt)],
    );
    let why = failed.expect_err("the download fails");
    assert!(why.contains("No space left"), "{why}");
    let weights = sha256_of(&repo.join("model.safetensors"));
    let on_source = tree(&small);
    assert!(
        !on_source
            .keys()
            .any(|p| p.ends_with(&weights) || p.ends_with("model.safetensors")),
        "no blob or link under a final name: {on_source:?}"
    );
    // (The writer's local copy goes once its handle is released, just after.)
    wait_for("no temp file left in the cache", || {
        temp_files(&s.cache).is_empty()
    });
    mount.unmount();
}

/// huggingface_hub serializes downloads with filelock (flock): a lock held through
/// the mount by one process excludes another until it is released.
#[test]
fn locks_taken_through_the_mount_exclude_other_processes() {
    let s = Scratch::new();
    let mount = s.mount_in_process(|_| {});
    let lock = mount.path("x.lock");
    let holder_code = "import sys, filelock\n\
        l = filelock.FileLock(sys.argv[1]); l.acquire(); print('held', flush=True)\n\
        sys.stdin.read(); l.release()";
    let mut holder = Command::new(python())
        .args(["-c", holder_code])
        .arg(&lock)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("holder");
    let mut line = String::new();
    BufReader::new(holder.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("held");
    assert_eq!(line.trim(), "held");
    let try_code = "import sys, filelock\n\
        try:\n    filelock.FileLock(sys.argv[1]).acquire(timeout=0.5); print('acquired')\n\
        except filelock.Timeout:\n    print('timeout')";
    let attempt = || {
        let out = Command::new(python())
            .args(["-c", try_code])
            .arg(&lock)
            .output()
            .expect("attempt");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(attempt(), "timeout", "the lock excluded the other process");
    drop(holder.stdin.take());
    holder.wait().expect("holder exits");
    assert_eq!(attempt(), "acquired");
    assert!(
        s.hub.join("x.lock").exists(),
        "the lock file is on the source"
    );
    mount.stop().expect("unmount");
}

/// `os.replace` of a new version over a staged file that a reader has open: the
/// reader reads the old bytes to the end, a new open gets the new ones (same size,
/// same mtime: a stamp that cannot tell them apart).
#[test]
fn a_rename_over_a_file_being_read_keeps_the_readers_bytes() {
    let s = Scratch::new();
    let old: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8).collect();
    fs::write(s.hub.join("weights.bin"), &old).expect("write");
    let mount = s.mount_in_process(|_| {});
    let path = mount.path("weights.bin");
    let mut reader = File::open(&path).expect("open");
    let mut head = vec![0; 1 << 20];
    reader.read_exact(&mut head).expect("read");
    let mtime = fs::metadata(&path)
        .and_then(|m| m.modified())
        .expect("mtime");

    let new: Vec<u8> = old.iter().map(|b| b ^ 0x5a).collect();
    let tmp = mount.path("weights.bin.tmp");
    let mut writer = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&tmp)
        .expect("create");
    writer.write_all(&new).expect("write");
    writer.set_modified(mtime).expect("utimes");
    drop(writer);
    fs::rename(&tmp, &path).expect("rename over");

    let mut rest = Vec::new();
    reader.read_to_end(&mut rest).expect("read on");
    head.extend(rest);
    assert!(head == old, "the reader read a mix or the new version");
    assert_eq!(
        fs::metadata(&path).and_then(|m| m.modified()).ok(),
        Some(mtime)
    );
    assert!(
        fs::read(&path).expect("read") == new,
        "a new open reads the new version"
    );
    assert!(fs::read(s.hub.join("weights.bin")).expect("source") == new);
    assert!(!s.hub.join("weights.bin.tmp").exists());
    // Rewritten in place, same length, mtime set back: still never the old copy.
    std::thread::sleep(Duration::from_millis(1100));
    let file = OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open for writing");
    file.write_all_at(&old, 0).expect("rewrite");
    file.set_modified(mtime).expect("utimes");
    drop(file);
    std::thread::sleep(Duration::from_millis(1100));
    assert!(
        fs::read(&path).expect("read") == old,
        "the stale copy was served"
    );
    mount.stop().expect("unmount");
}
