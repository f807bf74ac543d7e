//! What stagefs keeps private, and the bad input it refuses before touching anything.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use stagefs_tests::{Scratch, Tmpfs, generate, run_stagefs};

fn walk(dir: &Path, out: &mut Vec<(std::path::PathBuf, u32)>) {
    for entry in fs::read_dir(dir).expect("read_dir").flatten() {
        let meta = entry.path().symlink_metadata().expect("stat");
        out.push((entry.path(), meta.permissions().mode()));
        if meta.is_dir() {
            walk(&entry.path(), out);
        }
    }
}

#[test]
fn cache_files_and_the_control_socket_are_private() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/private", 2, "2M");
    let mount = s.mount(&[]);
    for shard in model.shards() {
        fs::read(mount.path(&shard)).expect("read");
    }
    let mut entries = Vec::new();
    walk(&s.cache, &mut entries);
    assert!(entries.len() > 5, "{entries:?}");
    for (path, mode) in entries {
        assert_eq!(mode & 0o077, 0, "{} is {:o}", path.display(), mode & 0o777);
    }
    assert_eq!(
        fs::metadata(&s.cache)
            .expect("cache dir")
            .permissions()
            .mode()
            & 0o077,
        0
    );
}

/// Reads `path` as the unprivileged user `nobody`.
fn read_as_nobody(path: &Path) -> bool {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
        .arg(path)
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn other_users_are_kept_out_unless_allow_other() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/shared", 1, "2M");
    // Let `nobody` reach the mount point itself; the mount decides the rest.
    fs::set_permissions(s.dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let config = model.snapshot_rel.join("config.json");
    {
        let mount = s.mount(&[]);
        assert!(fs::read(mount.path(&config)).is_ok());
        assert!(
            !read_as_nobody(&mount.path(&config)),
            "another user read a private mount"
        );
    }
    let mount = s.mount(&["--allow-other"]);
    assert!(
        read_as_nobody(&mount.path(&config)),
        "--allow-other lets other users read"
    );
}

#[test]
fn a_mount_point_that_is_already_a_mount_an_unwritable_cache_and_contradictions_are_refused() {
    let s = Scratch::new();
    generate(&s.hub, "acme/refuse", 1, "2M");
    let busy = s.dir.path().join("busy");
    let readonly = s.dir.path().join("ro");
    for dir in [&busy, &readonly] {
        fs::create_dir(dir).expect("mkdir");
    }
    let _busy = Tmpfs::mount(&busy, "size=1m");
    let _readonly = Tmpfs::mount(&readonly, "size=1m,ro");
    let ro_cache = readonly.join("cache");
    let (hub, mnt) = (&s.hub, &s.mnt);
    let cases: Vec<(Vec<&dyn AsRef<std::ffi::OsStr>>, &str)> = vec![
        (
            vec![&"mount", hub, &busy, &"--cache-dir", &s.cache],
            "already a mount point",
        ),
        (
            vec![&"mount", hub, mnt, &"--cache-dir", &ro_cache],
            "cannot be created",
        ),
        (
            vec![&"mount", hub, mnt, &"--cache-dir", &readonly],
            "not writable",
        ),
        (
            vec![
                &"mount",
                hub,
                mnt,
                &"--no-prefetch",
                &"--prefetch-parallel",
                &"3",
            ],
            "cannot be used with",
        ),
        (
            vec![
                &"mount",
                hub,
                mnt,
                &"--cache-dir",
                &s.cache,
                &"--max-size",
                &"1M",
                &"--min-stage-size",
                &"2M",
            ],
            "no file could ever be staged",
        ),
        (
            vec![&"mount", hub, mnt, &"--source-timeout", &"soon"],
            "not a duration",
        ),
    ];
    for (args, expected) in cases {
        let (ok, _, err) = run_stagefs(&args);
        assert!(!ok, "should fail: {expected}");
        assert!(err.contains(expected), "expected '{expected}' in: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
    assert!(
        fs::read_dir(&s.mnt).expect("mnt").next().is_none(),
        "nothing was mounted"
    );
}
