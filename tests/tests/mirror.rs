//! The mount mirrors the source exactly; with `--read-only` it refuses every change.

use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use stagefs_tests::{Scratch, generate};

fn assert_same_tree(source: &Path, mirror: &Path, rel: &Path) {
    let src = fs::symlink_metadata(source.join(rel)).expect("source metadata");
    let mir = fs::symlink_metadata(mirror.join(rel)).expect("mirror metadata");
    let what = rel.display();
    assert_eq!(src.file_type(), mir.file_type(), "{what}: type");
    assert_eq!(
        src.permissions().mode(),
        mir.permissions().mode(),
        "{what}: mode"
    );
    if !src.is_dir() {
        assert_eq!(src.len(), mir.len(), "{what}: size");
        assert_eq!(src.mtime(), mir.mtime(), "{what}: mtime");
        assert_eq!(src.mtime_nsec(), mir.mtime_nsec(), "{what}: mtime ns");
    }
    if src.file_type().is_symlink() {
        assert_eq!(
            fs::read_link(source.join(rel)).expect("source link"),
            fs::read_link(mirror.join(rel)).expect("mirror link"),
            "{what}: link target"
        );
    } else if src.is_dir() {
        let names = |dir: &Path| {
            let mut names: Vec<_> = fs::read_dir(dir)
                .expect("read_dir")
                .map(|e| e.expect("entry").file_name())
                .collect();
            names.sort();
            names
        };
        let entries = names(&source.join(rel));
        assert_eq!(entries, names(&mirror.join(rel)), "{what}: listing");
        for name in entries {
            assert_same_tree(source, mirror, &rel.join(name));
        }
    } else {
        let expected = fs::read(source.join(rel)).expect("source bytes");
        assert!(
            fs::read(mirror.join(rel)).expect("read") == expected,
            "{what}: read bytes"
        );
        if !expected.is_empty() {
            let file = File::open(mirror.join(rel)).expect("open");
            // SAFETY: the mapped file is read-only and nothing truncates it during the test.
            let map = unsafe { memmap2::Mmap::map(&file) }.expect("mmap");
            assert!(map[..] == expected[..], "{what}: mmap bytes");
        }
    }
}

#[test]
fn every_file_dir_and_link_matches_the_source() {
    let s = Scratch::new();
    generate(&s.hub, "acme/mirror", 3, "2M");
    fs::write(s.hub.join("version.txt"), "1").expect("write");
    fs::create_dir_all(s.hub.join("nested/deeper")).expect("mkdir");
    fs::write(s.hub.join("nested/deeper/empty"), "").expect("write");
    fs::set_permissions(s.hub.join("version.txt"), fs::Permissions::from_mode(0o640))
        .expect("chmod");
    std::os::unix::fs::symlink("../version.txt", s.hub.join("nested/link")).expect("symlink");
    std::os::unix::fs::symlink("does-not-exist", s.hub.join("nested/dangling")).expect("symlink");
    let mount = s.mount_in_process(|_| {});
    assert_same_tree(&s.hub, &mount.mnt, Path::new(""));
    // The three 2 MiB shards were staged; the small files were not.
    let metrics = mount.metrics();
    assert_eq!(metrics.stage_copies, 3, "{metrics:?}");
}

#[test]
fn a_read_only_mount_refuses_writes_with_erofs() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/ro", 1, "2M");
    // --read-only
    let mount = s.mount_in_process(|spec| spec.fs.read_only = true);
    let config = mount.path(model.snapshot_rel.join("config.json"));
    let erofs = |e: std::io::Error| e.raw_os_error() == Some(libc::EROFS);
    assert!(
        OpenOptions::new()
            .write(true)
            .open(&config)
            .is_err_and(erofs)
    );
    assert!(File::create(mount.path("new-file")).is_err_and(erofs));
    assert!(fs::create_dir(mount.path("new-dir")).is_err_and(erofs));
    assert!(fs::remove_file(&config).is_err_and(erofs));
    assert_eq!(
        fs::metadata(mount.path("missing"))
            .map_err(|e| e.kind())
            .err(),
        Some(ErrorKind::NotFound)
    );
}
