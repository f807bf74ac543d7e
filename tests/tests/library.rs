//! The mount lifecycle as a library (`stagefs_mount`), with no `stagefs` process in
//! between: start, read, stop and start again; a stale mount left by a crashed daemon
//! is cleared; a mount point in use is refused with a clear error.

use std::fs;

use stagefs_mount::{MountError, live_mount};
use stagefs_tests::{LibMount, Scratch, Tmpfs, chain, generate, is_mounted};

#[test]
fn a_library_mount_serves_the_source_and_stopping_frees_the_mount_point() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/library", 1, "2M");
    let shard = model.shards().remove(0);
    let mount = s.mount_in_process(|_| {});
    assert!(is_mounted(&s.mnt));
    assert!(
        fs::read(mount.path(&shard)).expect("read through the mount")
            == fs::read(s.hub.join(&shard)).expect("source")
    );
    assert_eq!(mount.metrics().stage_copies, 1);
    assert_eq!(
        live_mount(&s.cache).expect("control socket"),
        Some((s.hub.clone(), s.mnt.clone())),
        "the control socket names the mount"
    );

    mount.stop().expect("stop");
    assert!(!is_mounted(&s.mnt), "unmounted");
    assert!(
        fs::read_dir(&s.mnt)
            .expect("a plain directory again")
            .next()
            .is_none(),
        "the mount point is empty again"
    );
    assert_eq!(
        live_mount(&s.cache).expect("no socket is no mount"),
        None,
        "the control socket is gone"
    );

    // The mount point and the cache are free: a new mount takes them and finds the
    // staged copy.
    let again = s.mount_in_process(|_| {});
    assert!(
        fs::read(again.path(&shard)).expect("read again")
            == fs::read(s.hub.join(&shard)).expect("source")
    );
    let m = again.metrics();
    assert_eq!((m.stage_copies, m.bytes_copied), (0, 0), "{m:?}");
    assert!(m.stage_hits > 0, "{m:?}");
}

#[test]
fn the_library_clears_a_stale_mount_left_by_a_crashed_daemon() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/stale-lib", 1, "2M");
    let mut crashed = s.mount(&[]);
    crashed.kill_daemon();
    let dead = fs::metadata(&s.mnt).expect_err("a dead mount");
    assert_eq!(dead.raw_os_error(), Some(libc::ENOTCONN));

    let checked = s.spec().check().expect("check");
    assert!(checked.cleared_stale_mount, "{checked:?}");
    assert!(!is_mounted(&s.mnt), "the dead mount is gone");

    let mount = s.mount_in_process(|_| {});
    let shard = model.shards().remove(0);
    assert!(
        fs::read(mount.path(&shard)).expect("read")
            == fs::read(s.hub.join(&shard)).expect("source")
    );
    drop(mount);
    drop(crashed);
}

#[test]
fn the_library_refuses_a_mount_point_in_use_with_a_clear_error() {
    let s = Scratch::new();
    generate(&s.hub, "acme/busy-lib", 1, "2M");
    let _first = s.mount_in_process(|_| {});
    let mut second = s.spec();
    second.cache_dir = s.dir.path().join("cache2");
    let refused = LibMount::try_start(&second)
        .err()
        .expect("a second mount is refused");
    assert!(
        matches!(refused, MountError::AlreadyMounted { .. }),
        "{refused:?}"
    );
    assert_eq!(
        chain(&refused),
        format!("mount point {} is already a mount point", s.mnt.display())
    );
    assert!(
        !second.cache_dir.exists(),
        "nothing was created for the refused mount"
    );

    let busy = s.dir.path().join("tmpfs");
    fs::create_dir(&busy).expect("mkdir");
    let _tmpfs = Tmpfs::mount(&busy, "size=1m");
    second.mountpoint = busy.clone();
    let refused = LibMount::try_start(&second)
        .err()
        .expect("a tmpfs is refused");
    assert!(
        matches!(refused, MountError::AlreadyMounted { .. }),
        "{refused:?}"
    );
}
