//! The ways a NAS fails under a mount, each through a real sshfs source (a network
//! namespace's sshd, tests/scripts/netfs.sh) and the real binary's FUSE mount:
//! the share unmounted underneath (sshfs exits when its connection drops), sshfs
//! killed (ENOTCONN to everything), and a link that hangs once the mount knows the
//! source is away. Each asserts that a staged model still loads with real clients
//! (huggingface_hub offline and safetensors' mmap), that a write fails with EIO and
//! lands nowhere, and that nothing waits past the source timeout; the waits are
//! printed for docs/BENCHMARKS.md, never asserted but as hang bounds.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use stagefs_tests::{
    Model, Mount, NetFs, Scratch, generate, load_with_real_clients, pseudo_random, run_stagefs,
    staged_files, wait_for, within, write_with_mtime,
};

/// A model on an sshfs NAS, loaded once through a mount of it with real clients, and
/// every file it read staged.
struct Loaded {
    // Dropped in this order: the mount, then the NAS under it, then the scratch area.
    mount: Mount,
    remote: NetFs,
    model: Model,
    s: Scratch,
}

fn loaded(repo: &str, extra: &[&str]) -> Loaded {
    let s = Scratch::new();
    let model = generate(&s.hub, repo, 2, "2M");
    let remote = NetFs::up(&s.hub, &s.dir.path().join("nas"), "200mbit");
    let mount = Mount::start(&remote.mnt, &s.mnt, &s.cache, extra);
    let (ok, out) = load_with_real_clients(&mount, &model, &s.hub);
    assert!(ok, "first load: {out}");
    // Every file of the snapshot, and refs/main; the small ones in the background.
    wait_for("copies of every file the load read", || {
        mount.in_flight().is_empty() && staged_files(&s.cache).len() == model.files.len() + 1
    });
    // The user had looked: a directory never listed cannot be listed while the NAS
    // is away (EIO), as nothing knows what it holds.
    for dir in [mount.mnt.clone(), mount.path(&model.snapshot_rel)] {
        assert!(fs::read_dir(&dir).expect("ls").count() > 0);
    }
    Loaded {
        mount,
        remote,
        model,
        s,
    }
}

impl Loaded {
    /// Loads the model again, past the kernel's 1 s caches; how long it took.
    fn load_again(&self, when: &str) -> Duration {
        sleep(Duration::from_millis(1500));
        let started = Instant::now();
        let (ok, out) = load_with_real_clients(&self.mount, &self.model, &self.s.hub);
        let took = started.elapsed();
        assert!(ok, "load {when}: {out}\n{}", self.mount.log_text());
        took
    }

    /// The names at the mount's root, as `ls` shows them.
    fn root_listing(&self) -> Vec<String> {
        let root = self.mount.mnt.clone();
        within(Duration::from_secs(30), move || fs::read_dir(root))
            .expect("ls of the mount")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect()
    }

    /// Asserts that creating a file and a directory through the mount fails with
    /// EIO, and that nothing was created under the NAS's mount point.
    fn writes_fail_and_land_nowhere(&self) {
        let file = self.mount.path("written-while-nas-gone.txt");
        let wrote = within(Duration::from_secs(30), move || fs::write(file, b"oops"));
        assert_eq!(errno(wrote), libc::EIO, "a write while the NAS is gone");
        let dir = self.mount.path("runs");
        let made = within(Duration::from_secs(30), move || fs::create_dir(dir));
        assert_eq!(errno(made), libc::EIO, "a mkdir while the NAS is gone");
        for place in [&self.s.hub, &self.remote.mnt] {
            for name in ["written-while-nas-gone.txt", "runs"] {
                assert!(
                    fs::symlink_metadata(place.join(name)).is_err(),
                    "{name} was created in {}",
                    place.display()
                );
            }
        }
    }

    /// Adds a file to the export and waits until the mount serves it: the NAS is
    /// back and asked again.
    fn served_again(&self) -> Duration {
        let back = Instant::now();
        fs::write(self.s.hub.join("added-later.txt"), b"new on the nas").expect("write");
        let added = self.mount.path("added-later.txt");
        wait_for("the mount to serve the NAS again", || {
            fs::read(&added).is_ok_and(|b| b == b"new on the nas")
        });
        back.elapsed()
    }
}

fn errno(result: io::Result<()>) -> i32 {
    result.expect_err("must fail").raw_os_error().unwrap_or(0)
}

fn nothing_under(dir: &Path) -> bool {
    fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none())
}

#[test]
fn a_nas_unmounted_underneath_serves_staged_models_and_takes_no_write() {
    let l = loaded("acme/dropped", &["--source-timeout", "5s"]);
    // sshfs's connection dies: sshfs exits and unmounts, and its mount point is an
    // empty directory of this machine's disk.
    l.remote.drop_connection();
    assert!(nothing_under(&l.remote.mnt), "sshfs is gone");
    let load = l.load_again("with the NAS unmounted");
    let listing = l.root_listing();
    assert!(
        listing.iter().any(|n| n == "models--acme--dropped"),
        "the mount lists the source, not the empty directory: {listing:?}"
    );
    l.writes_fail_and_land_nowhere();
    assert!(
        nothing_under(&l.remote.mnt),
        "written under the mount point"
    );
    l.remote.mount_again();
    let back = l.served_again();
    println!(
        "NAS unmounted underneath: a staged model loaded in {:.2} s; served again {:.2} s after the share was mounted again",
        load.as_secs_f64(),
        back.as_secs_f64()
    );
}

#[test]
fn a_killed_sshfs_serves_staged_models_and_fails_the_rest_at_once() {
    let l = loaded("acme/killed", &["--source-timeout", "5s"]);
    l.remote.kill_sshfs();
    let dead = l.remote.mnt.clone();
    let direct = fs::read_dir(&dead).expect_err("a dead FUSE mount");
    assert_eq!(direct.raw_os_error(), Some(libc::ENOTCONN), "{direct}");
    let load = l.load_again("with sshfs dead");
    assert!(l.root_listing().iter().any(|n| n == "models--acme--killed"));
    let unseen = l.mount.path(never_listed(&l.model.snapshot_rel));
    let started = Instant::now();
    let err = within(Duration::from_secs(30), move || fs::metadata(unseen)).expect_err("unseen");
    let unseen_took = started.elapsed();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(
        unseen_took < Duration::from_secs(5),
        "waited the timeout: {unseen_took:?}"
    );
    l.writes_fail_and_land_nowhere();
    let cache = l.s.cache.clone();
    let (ok, out, err) = within(Duration::from_secs(30), move || {
        run_stagefs(&[&"status", &"--cache-dir", &cache])
    });
    assert!(ok && out.contains("not answering"), "{out}{err}");
    l.remote.mount_again();
    let back = l.served_again();
    println!(
        "sshfs killed (ENOTCONN): a staged model loaded in {:.2} s; an unseen name failed in {:.3} s; served again {:.2} s after the share was mounted again",
        load.as_secs_f64(),
        unseen_took.as_secs_f64(),
        back.as_secs_f64()
    );
}

#[test]
fn once_the_nas_is_known_away_a_staged_model_loads_without_waiting_the_timeout() {
    let timeout = Duration::from_secs(10);
    let l = loaded("acme/hanging", &["--source-timeout", "10s"]);
    l.remote.cut();
    sleep(Duration::from_millis(1500));
    // The first name nobody has seen waits the whole timeout: that is how the mount
    // learns the NAS is away.
    let unseen = l.mount.path(never_listed(&l.model.snapshot_rel));
    let err = within(timeout * 3, move || fs::metadata(unseen)).expect_err("unseen");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    // huggingface_hub's offline load looks up names stagefs has never seen: each
    // must not wait the timeout again.
    let loads: Vec<Duration> = (0..2).map(|_| l.load_again("with the link cut")).collect();
    let snapshot = l.mount.path(&l.model.snapshot_rel);
    let started = Instant::now();
    let listed = within(timeout * 3, move || {
        // What `ls -la` does: lstat every entry, readlink the links.
        fs::read_dir(&snapshot).map(|d| {
            d.flatten()
                .map(|e| {
                    let meta = fs::symlink_metadata(e.path())?;
                    match meta.is_symlink() {
                        true => fs::read_link(e.path()).map(drop),
                        false => Ok(()),
                    }
                })
                .filter(Result::is_ok)
                .count()
        })
    });
    let ls_took = started.elapsed();
    assert!(listed.is_ok_and(|n| n > 0), "ls -la of the snapshot");
    for (i, took) in loads.iter().enumerate() {
        assert!(*took < timeout, "load {i} waited the timeout: {took:?}");
    }
    assert!(ls_took < timeout, "ls -la waited the timeout: {ls_took:?}");
    l.remote.restore();
    let back = l.served_again();
    println!(
        "link cut, source known away (--source-timeout 10s): staged model loads {:.2} s and {:.2} s; ls -la of the snapshot {:.3} s; served again {:.2} s after the link returned",
        loads[0].as_secs_f64(),
        loads[1].as_secs_f64(),
        ls_took.as_secs_f64(),
        back.as_secs_f64()
    );
}

const WEIGHTS: &str = "models/plain/model.safetensors";

#[test]
fn a_source_file_replaced_by_one_of_the_same_size_and_mtime_is_staged_again() {
    // What `cp -p`, `rsync -t` or a tool writing a temp file and renaming it over
    // the old one leaves: another inode, the old size and mtime. (Over sshfs this
    // cannot be seen: it reports an inode of its own per path and its mtime as the
    // change time. So the source here is a local directory.)
    let s = Scratch::new();
    let path = s.hub.join(WEIGHTS);
    let mtime = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    write_with_mtime(&path, &pseudo_random(4 << 20, 1), mtime);
    let mount = Mount::start(&s.hub, &s.mnt, &s.cache, &["--no-prefetch"]);
    assert!(fs::read(mount.path(WEIGHTS)).expect("read") == fs::read(&path).expect("source"));
    wait_for("the copy", || staged_files(&s.cache).len() == 1);
    let replacement = s.hub.join("models/plain/.model.safetensors.tmp");
    write_with_mtime(&replacement, &pseudo_random(4 << 20, 2), mtime);
    fs::rename(&replacement, &path).expect("rename over");
    sleep(Duration::from_millis(1500)); // past the kernel's 1 s caches
    let served = fs::read(mount.path(WEIGHTS)).expect("read again");
    assert!(
        served == fs::read(&path).expect("source"),
        "the copy of the replaced file was served"
    );
}

#[test]
fn another_nas_mounted_on_the_same_cache_never_gets_the_first_ones_copies() {
    // Two sshfs NASes with a file at the same path, of the same size and mtime:
    // sshfs numbers inodes by lookup order and reports the mtime as the change
    // time, so nothing in the file's stamp tells them apart; the cache's record of
    // its source does.
    let s = Scratch::new();
    let mtime = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let exports = [s.dir.path().join("export-a"), s.dir.path().join("export-b")];
    for (seed, export) in exports.iter().enumerate() {
        write_with_mtime(
            &export.join(WEIGHTS),
            &pseudo_random(4 << 20, seed as u64),
            mtime,
        );
    }
    for (n, export) in exports.iter().enumerate() {
        let remote = NetFs::up(export, &s.dir.path().join(format!("nas-{n}")), "1gbit");
        let mount = Mount::start(&remote.mnt, &s.mnt, &s.cache, &["--no-prefetch"]);
        let served = fs::read(mount.path(WEIGHTS)).expect("read");
        assert!(
            served == fs::read(export.join(WEIGHTS)).expect("source"),
            "NAS {n}: another source's copy was served"
        );
        wait_for("the copy", || {
            mount.in_flight().is_empty() && staged_files(&s.cache).len() == 1
        });
        drop(mount);
        drop(remote);
    }
}

/// A name in a directory loaders look names up in but never list (the repository's
/// `blobs/`): nothing is known of it. (A name a kept listing lacks is "no such
/// file" while the NAS is away, as the NAS said.)
fn never_listed(snapshot: &Path) -> PathBuf {
    let repo = snapshot
        .parent()
        .and_then(Path::parent)
        .expect("a snapshot of a repository");
    repo.join("blobs").join("never-seen")
}
