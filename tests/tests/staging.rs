//! Opening a large file stages it completely before the open returns, once, and
//! the staged copy is what every read and mmap page then sees. Most mounts here are
//! served by the test process through the library; one needs the daemon's log.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::process::Command;
use std::thread::sleep;
use std::time::Duration;

use stagefs_mount::MountSpec;
use stagefs_tests::{Scratch, generate, staged_files, wait_for};

fn read_all(file: &mut File) -> Vec<u8> {
    let mut out = Vec::new();
    file.seek(SeekFrom::Start(0)).expect("seek");
    file.read_to_end(&mut out).expect("read");
    out
}

/// After an open, the copy is complete in the cache, and reads through that handle keep
/// returning the staged bytes even when the source is overwritten in place.
fn open_handle_reads_only_the_staged_copy(
    adjust: impl FnOnce(&mut MountSpec),
) -> stagefs_stage::MetricsSnapshot {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/staged", 1, "6M");
    let shard = model.shards().remove(0);
    let original = fs::read(s.hub.join(&shard)).expect("source");
    let mount = s.mount_in_process(adjust);

    let mut handle = File::open(mount.path(&shard)).expect("open through mount");
    let staged = staged_files(&s.cache);
    assert_eq!(staged.len(), 1, "exactly the opened shard is staged");
    assert!(fs::read(&staged[0]).expect("staged copy") == original);

    let mut source = OpenOptions::new()
        .write(true)
        .open(s.hub.join(&shard))
        .expect("open source for writing");
    source
        .write_all(&vec![0xA5; original.len()])
        .expect("overwrite source");
    source.sync_all().expect("sync");

    assert!(
        read_all(&mut handle) == original,
        "read() sees the staged bytes"
    );
    // SAFETY: read-only mapping of a file nobody truncates during the test.
    let map = unsafe { memmap2::Mmap::map(&handle) }.expect("mmap");
    assert!(map[..] == original[..], "mmap sees the staged bytes");
    drop(map);
    drop(handle);
    mount.metrics()
}

#[test]
fn passthrough_handle_never_touches_the_source_after_open() {
    let m = open_handle_reads_only_the_staged_copy(|_| {});
    assert_eq!(m.passthrough_opens, 1, "{m:?}");
    assert_eq!(
        m.daemon_reads, 0,
        "passthrough reads bypass the daemon: {m:?}"
    );
}

#[test]
fn daemon_read_path_never_touches_the_source_after_open() {
    // --no-passthrough --no-redirect
    let m = open_handle_reads_only_the_staged_copy(|spec| {
        spec.fs.passthrough = false;
        spec.fs.redirect = false;
    });
    assert_eq!(m.passthrough_opens, 0, "{m:?}");
    assert_eq!(m.daemon_opens, 1, "{m:?}");
    assert!(m.daemon_reads > 0, "{m:?}");
}

#[test]
fn eight_processes_opening_one_cold_file_cause_one_copy() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/crowd", 1, "48M");
    let shard = model.shards().remove(0);
    let blob = model.blob_of(
        &s.hub,
        shard.file_name().and_then(|n| n.to_str()).expect("name"),
    );
    let sha256 = blob
        .file_name()
        .and_then(|n| n.to_str())
        .expect("blob name")
        .to_string();
    let mount = s.mount_in_process(|_| {});
    // Start all eight before waiting on any.
    let children: Vec<_> = (0..8)
        .map(|_| {
            Command::new("sha256sum")
                .arg(mount.path(&shard))
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn sha256sum")
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().expect("wait");
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).starts_with(&sha256));
    }
    let m = mount.metrics();
    assert_eq!(m.stage_copies, 1, "{m:?}");
    assert_eq!(
        m.bytes_copied,
        model.files.last().expect("shard").size,
        "{m:?}"
    );
}

#[test]
fn a_changed_source_file_is_staged_again_and_new_bytes_served() {
    let s = Scratch::new();
    // A large file keyed by its path (not an LFS blob, whose name is its content).
    let rel = std::path::PathBuf::from("exports/weights.bin");
    fs::create_dir_all(s.hub.join("exports")).expect("mkdir");
    let original: Vec<u8> = (0..3u32 << 20).map(|i| (i % 249) as u8).collect();
    fs::write(s.hub.join(&rel), &original).expect("write");
    let mount = s.mount_in_process(|_| {});
    assert!(fs::read(mount.path(&rel)).expect("first read") == original);

    // Same size, new bytes, new mtime: only the mtime tells the versions apart.
    let replacement: Vec<u8> = original.iter().map(|b| b ^ 0xFF).collect();
    sleep(Duration::from_millis(20));
    fs::write(s.hub.join(&rel), &replacement).expect("rewrite source");
    // Let the kernel's 1 s attribute cache expire so it asks the daemon again.
    sleep(Duration::from_millis(1500));

    let after = fs::read(mount.path(&rel)).expect("second read");
    assert!(after == replacement, "the new version is served");
    let m = mount.metrics();
    assert_eq!(m.stage_copies, 2, "{m:?}");
    assert_eq!(staged_files(&s.cache).len(), 1, "the old copy was replaced");
}

#[test]
fn an_lfs_blob_rewritten_with_other_bytes_is_dropped_and_refused_once_checked() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/changing", 1, "3M");
    let shard = model.shards().remove(0);
    let mount = s.mount(&[]);
    let before = fs::read(mount.path(&shard)).expect("first read");
    sleep(Duration::from_millis(20));
    let rewritten: Vec<u8> = before.iter().map(|b| b ^ 0xFF).collect();
    fs::write(s.hub.join(&shard), &rewritten).expect("rewrite source");
    sleep(Duration::from_millis(1500));
    // From a local disk a blob is served once copied whole with its source unchanged,
    // as any file is, and checked against its name after the copy: the read gets
    // what the source holds, as a direct read would, never a mix or the old bytes.
    assert!(
        fs::read(mount.path(&shard)).unwrap_or_else(|e| panic!("{e}: {}", mount.log_text()))
            == rewritten,
        "the source's bytes"
    );
    // The blob's name is the sha256 of what it must contain: these bytes are not it.
    wait_for("the check's verdict", || {
        mount.log_text().contains("do not match the sha256")
    });
    let err = fs::read(mount.path(&shard)).expect_err("a corrupt blob is not served again");
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert_eq!(staged_files(&s.cache).len(), 0, "its copy was dropped");
}

#[test]
fn a_remount_reuses_staged_copies_after_a_stat() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/again", 2, "2M");
    let shards = model.shards();
    // --no-prefetch
    let first = s.mount_in_process(|spec| spec.fs.prefetch = false);
    for shard in &shards {
        fs::read(first.path(shard)).expect("read");
    }
    assert_eq!(first.metrics().stage_copies, 2);
    first.stop().expect("stopping the first mount");

    let second = s.mount_in_process(|spec| spec.fs.prefetch = false);
    for shard in &shards {
        assert!(
            fs::read(second.path(shard)).expect("read")
                == fs::read(s.hub.join(shard)).expect("src")
        );
    }
    let m = second.metrics();
    assert_eq!(
        (m.stage_copies, m.stage_hits, m.bytes_copied),
        (0, 2, 0),
        "{m:?}"
    );
}

#[test]
fn small_files_are_read_from_the_source_and_a_copy_is_kept_in_the_background() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/small", 1, "2M");
    // --no-prefetch
    let mount = s.mount_in_process(|spec| spec.fs.prefetch = false);
    let config = model.snapshot_rel.join("config.json");
    let expected = fs::read(s.hub.join(&config)).expect("src");
    assert!(fs::read(mount.path(&config)).expect("read") == expected);
    let m = mount.metrics();
    assert_eq!((m.source_opens, m.stage_copies), (1, 0), "{m:?}");
    wait_for("the kept copy", || staged_files(&s.cache).len() == 1);
    let kept = staged_files(&s.cache);
    assert!(fs::read(&kept[0]).expect("kept copy") == expected);
    // Opening it again reads the source again and copies nothing more.
    assert!(fs::read(mount.path(&config)).expect("read") == expected);
    sleep(Duration::from_millis(300));
    let m = mount.metrics();
    assert_eq!((m.source_opens, m.kept_copies), (2, 1), "{m:?}");
}
