//! POSIX operations through a writable FUSE mount, grouped by operation (create,
//! O_EXCL, O_APPEND, sparse and concurrent writes, an overwrite in place, mmap and
//! msync, truncate, rename over a held file, unlink while open, symlinks, chmod,
//! chown, utimensat, hard links, fifos, sockets, devices), each checked on the mount
//! and on the source: tests/py/posix_checks.py is the one body, which the NFS
//! backend's kernel-client guest runs too (tests/py/guest_checks.py, posix group). As root (who makes
//! devices) and as an ordinary user through fusermount3 (who is refused them). And
//! random operations on one file against a model (tests/py/fsx.py), on every read
//! path: root's kernel passthrough, root without it, an ordinary user.

use std::path::Path;
use std::process::{Command, Output};

use stagefs_tests::{Mount, Scratch, python, workspace_root};

/// The checks the body runs when given no group.
const CHECKS: usize = 22;

fn posix_checks(mut python: Command, mount: &Mount, source: &Path) -> Output {
    python
        .arg(workspace_root().join("tests/py/posix_checks.py"))
        .arg(&mount.mnt)
        .arg(source)
        .output()
        .expect("running posix_checks.py")
}

#[track_caller]
fn all_passed(out: &Output) {
    let text = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && text.ends_with(&format!("{CHECKS} passed, 0 failed\n")),
        "{text}{stderr}"
    );
}

#[test]
fn every_operation_reaches_the_source_as_root_who_makes_devices() {
    let s = Scratch::new();
    let mount = s.mount(&[]);
    all_passed(&posix_checks(Command::new(python()), &mount, &s.hub));
}

#[test]
fn every_operation_reaches_the_source_as_an_ordinary_user_refused_devices() {
    let s = Scratch::for_user();
    let user = s.user();
    // The mount is writable where its user can write the source.
    user.chown(&s.hub);
    let mount = s.mount(&[]);
    all_passed(&posix_checks(user.python(), &mount, &s.hub));
}

/// Random writes, truncates, mmap writes, reads and reopens of one file, each checked
/// against a model (tests/py/fsx.py), bounded in count and time; a failure names its
/// seed and the operations that led to it.
fn fsx(python: Command, mount: &Mount, seed: u64) {
    let mut python = python;
    let out = python
        .arg(workspace_root().join("tests/py/fsx.py"))
        .arg(mount.path(format!("fsx-{seed}.bin")))
        .args([
            "--ops",
            "1500",
            "--seconds",
            "60",
            "--seed",
            &seed.to_string(),
        ])
        .output()
        .expect("running fsx.py");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("\"ok\": true"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn random_operations_on_one_file_match_a_model_as_root() {
    let s = Scratch::new();
    let mount = s.mount(&[]);
    fsx(Command::new(python()), &mount, 1);
}

#[test]
fn random_operations_on_one_file_match_a_model_without_passthrough() {
    let s = Scratch::new();
    let mount = s.mount(&["--no-passthrough"]);
    fsx(Command::new(python()), &mount, 2);
}

#[test]
fn random_operations_on_one_file_match_a_model_as_an_ordinary_user() {
    let s = Scratch::for_user();
    let user = s.user();
    user.chown(&s.hub);
    let mount = s.mount(&[]);
    fsx(user.python(), &mount, 3);
}

/// A file written and fsynced through the mount, then the daemon killed (SIGKILL)
/// with the file still open: the source holds every byte, a new mount on the same
/// cache reads them, and no half-made copy is left in the cache.
#[test]
fn fsynced_writes_survive_a_killed_daemon() {
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    let s = Scratch::new();
    let mut mount = s.mount(&[]);
    let data = stagefs_tests::pseudo_random(3 << 20, 35);
    let mut file = std::fs::File::create(mount.path("saved.bin")).expect("create");
    file.write_all(&data).expect("write");
    file.sync_all().expect("fsync");
    mount.kill_daemon();
    // The open file is on a dead mount now: a write fails, it does not hang.
    assert!(file.write_at(b"late", 0).is_err() || file.sync_all().is_err());
    drop(file);
    drop(mount);
    assert!(
        std::fs::read(s.hub.join("saved.bin")).expect("source") == data,
        "every fsynced byte is on the source"
    );
    let again = s.mount(&[]);
    assert!(
        std::fs::read(again.path("saved.bin")).expect("read") == data,
        "a new mount reads them"
    );
    assert!(
        stagefs_tests::temp_files(&s.cache).is_empty(),
        "no half-made copy left"
    );
}
