//! The write path through the policy: changes passing through to the source, and
//! copies staged as they are written.

use super::*;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

// ------------------------------------------------------------ writing through the mount

/// A fixture whose mount writes through.
fn writable(edit: impl FnOnce(&mut FsConfig, &mut StagerOptions, &mut Budget)) -> Fixture {
    fixture(|c, o, b| {
        c.read_only = false;
        c.served_by_root = true;
        edit(c, o, b);
    })
}

fn me() -> Caller {
    // SAFETY: no preconditions.
    unsafe {
        Caller {
            uid: libc::geteuid(),
            gid: libc::getegid(),
        }
    }
}

/// The fifo type bits of a mode (`libc::S_IFIFO` is a u16 on macOS).
const S_IFIFO: u32 = 0o010_000;

const NEW: stagefs_source::CreateFile = stagefs_source::CreateFile {
    mode: 0o644,
    exclusive: true,
    open: stagefs_source::WriteOpen {
        read: true,
        truncate: false,
    },
};

impl Fixture {
    /// Creates `name` at the root, writes `data` and closes it.
    async fn write_new(&self, name: &str, data: &[u8]) -> Result<Attr, FsError> {
        let (attr, fh) = self
            .policy
            .create(ROOT_INO, OsStr::new(name), NEW, me())
            .await?;
        for (i, chunk) in data.chunks(128 << 10).enumerate() {
            let offset = (i * (128 << 10)) as u64;
            self.policy.write(fh, offset, chunk.to_vec()).await?;
        }
        self.policy.release(fh);
        Ok(attr)
    }

    /// Opens the version of `rel` now looked up and holds it, as a reader would.
    async fn hold(&self, rel: &str) -> u64 {
        let opened = self.open(rel).await.expect("open");
        self.policy.register(opened, None)
    }

    /// Writes `new` over `rel` from its start through the mount, then sets its
    /// mtime back to what it was, as `cp -p` or `rsync -t` would, and closes it.
    async fn rewrite_keeping_mtime(&self, rel: &str, new: &[u8]) {
        let attr = self.lookup(rel).await.expect("lookup");
        let fh = self
            .policy
            .open_write(attr.ino, stagefs_source::WriteOpen::default())
            .await
            .expect("open for writing");
        self.policy.write(fh, 0, new.to_vec()).await.expect("write");
        let back = SetAttr {
            mtime: Some(stagefs_source::SetTime::At(attr.mtime_ns)),
            ..SetAttr::default()
        };
        self.policy
            .setattr(attr.ino, Some(fh), back)
            .await
            .expect("utimes");
        self.policy.release(fh);
    }

    async fn read_handle(&self, fh: u64, len: usize) -> Vec<u8> {
        self.policy.read(fh, 0, len as u32).await.expect("read")
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_created_through_the_mount_is_written_to_the_source() {
    let f = writable(|_, _, _| {});
    let data = bytes(3 * MIB, 5);
    let attr = f.write_new("new.bin", &data).await.expect("write");
    assert_eq!(attr.kind, EntryKind::File);
    assert_eq!(f.source_bytes("new.bin"), data);
    let mode = fs::metadata(f.src.join("new.bin"))
        .expect("stat")
        .permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o644
    );
    // The kernel's inode follows the file it wrote.
    assert_eq!(
        f.policy.getattr(attr.ino).await.expect("getattr").size,
        data.len() as u64
    );
    assert_eq!(f.read_all("new.bin").await.expect("read"), data);
    assert_eq!(
        errno(
            f.policy
                .create(ROOT_INO, OsStr::new("new.bin"), NEW, me())
                .await
        ),
        libc::EEXIST
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rewrite_that_keeps_size_and_mtime_never_serves_the_old_copy() {
    let f = writable(|c, _, _| c.prefetch = false);
    let old = f.source_bytes("weights.bin");
    assert_eq!(f.read_all("weights.bin").await.expect("stage"), old);
    assert!(f.stored("weights.bin"));
    let mtime = f.lookup("weights.bin").await.expect("lookup").mtime_ns;
    // A reader holds the old version's copy.
    let reader = f.hold("weights.bin").await;
    let new = bytes(old.len(), 77);
    // The old mtime set back, as `cp -p` or `rsync -t` would: the stamp matches.
    f.rewrite_keeping_mtime("weights.bin", &new).await;
    assert_eq!(
        f.lookup("weights.bin").await.expect("lookup").mtime_ns,
        mtime
    );
    assert_eq!(
        f.read_all("weights.bin").await.expect("read"),
        new,
        "not the stale copy"
    );
    assert_eq!(
        f.read_handle(reader, old.len()).await,
        old,
        "the reader keeps its bytes"
    );
    f.policy.release(reader);
    // Once the reader is gone the stale copy goes, and the new version is staged.
    let deadline = Instant::now() + PROMPTLY;
    loop {
        assert_eq!(f.read_all("weights.bin").await.expect("read"), new);
        let meta = fs::symlink_metadata(f.src.join("weights.bin")).expect("stat");
        let stamp = Stamp::of(&SourceMeta::from(&meta));
        assert_eq!((stamp.size, stamp.mtime_ns), (new.len() as u64, mtime));
        if let Some(staged) = f.policy.stager.stored(Path::new("weights.bin"), stamp) {
            let copy = read_at_most(staged.file.as_ref(), 0, new.len(), |_| {}).expect("copy");
            if copy == new {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the new version was never staged"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rename_over_a_staged_file_moves_the_name_and_the_reader_keeps_the_old() {
    let f = writable(|c, _, _| c.prefetch = false);
    let old = f.source_bytes("weights.bin");
    let reader = f.hold("weights.bin").await;
    let mtime = f.lookup("weights.bin").await.expect("lookup").mtime_ns;
    let new = bytes(old.len(), 99);
    let tmp = f.write_new("weights.bin.tmp", &new).await.expect("write");
    let same = SetAttr {
        mtime: Some(stagefs_source::SetTime::At(mtime)),
        ..SetAttr::default()
    };
    f.policy.setattr(tmp.ino, None, same).await.expect("utimes");
    f.policy
        .rename(
            ROOT_INO,
            OsStr::new("weights.bin.tmp"),
            ROOT_INO,
            OsStr::new("weights.bin"),
            RenameHow::default(),
        )
        .await
        .expect("rename over");
    assert_eq!(f.source_bytes("weights.bin"), new);
    assert_eq!(errno(f.lookup("weights.bin.tmp").await), libc::ENOENT);
    let moved = f.lookup("weights.bin").await.expect("lookup");
    assert_eq!(moved.ino, tmp.ino, "the inode moved with its name");
    assert_eq!(f.read_all("weights.bin").await.expect("read"), new);
    assert_eq!(f.read_handle(reader, old.len()).await, old);
    f.policy.release(reader);
    let no_replace = RenameHow { no_replace: true };
    f.write_new("other", b"x").await.expect("write");
    assert_eq!(
        errno(
            f.policy
                .rename(
                    ROOT_INO,
                    OsStr::new("other"),
                    ROOT_INO,
                    OsStr::new("config.json"),
                    no_replace
                )
                .await
        ),
        libc::EEXIST
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unlink_forgets_the_name_and_drops_the_copy() {
    let f = writable(|c, _, _| {
        c.prefetch = false;
        c.redirect = false;
    });
    f.read_all("weights.bin").await.expect("stage");
    assert!(f.stored("weights.bin"));
    let attr = f.lookup("weights.bin").await.expect("lookup");
    f.policy
        .unlink(ROOT_INO, OsStr::new("weights.bin"))
        .await
        .expect("unlink");
    assert!(!f.src.join("weights.bin").exists());
    // (Once the last handle's pin is gone.)
    wait_until("the copy of a removed file to be dropped", || {
        !f.stored("weights.bin")
    })
    .await;
    assert_eq!(errno(f.lookup("weights.bin").await), libc::ENOENT);
    // Even while the source is away, the removed name is not recalled.
    f.source.set(Behaviour::Eio);
    assert!(
        f.policy
            .lookup(ROOT_INO, OsStr::new("weights.bin"))
            .await
            .is_err()
    );
    // A handle still open on it (fstat) sees it unlinked.
    assert_eq!(f.policy.getattr(attr.ino).await.expect("getattr").nlink, 0);
    f.source.set(Behaviour::Healthy);
}

#[tokio::test(flavor = "multi_thread")]
async fn directories_links_modes_and_renamed_trees() {
    let f = writable(|_, _, _| {});
    let d = f
        .policy
        .mkdir(ROOT_INO, OsStr::new("d"), 0o750, me())
        .await
        .expect("mkdir");
    assert_eq!((d.kind, d.perm), (EntryKind::Dir, 0o750));
    let (file, fh) = f
        .policy
        .create(d.ino, OsStr::new("f"), NEW, me())
        .await
        .expect("create");
    f.policy.write(fh, 0, b"abc".to_vec()).await.expect("write");
    f.policy.release(fh);
    let link = f
        .policy
        .symlink(d.ino, OsStr::new("l"), Path::new("f"), me())
        .await
        .expect("symlink");
    assert_eq!(f.policy.readlink(link.ino).await.expect("readlink"), b"f");
    let chmod = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    assert_eq!(
        f.policy
            .setattr(file.ino, None, chmod)
            .await
            .expect("chmod")
            .perm,
        0o600
    );
    let truncate = SetAttr {
        size: Some(1),
        ..SetAttr::default()
    };
    assert_eq!(
        f.policy
            .setattr(file.ino, None, truncate)
            .await
            .expect("truncate")
            .size,
        1
    );
    f.policy
        .rename(
            ROOT_INO,
            OsStr::new("d"),
            ROOT_INO,
            OsStr::new("e"),
            RenameHow::default(),
        )
        .await
        .expect("rename a directory");
    assert_eq!(
        f.policy
            .getattr(file.ino)
            .await
            .expect("moved with it")
            .size,
        1
    );
    assert_eq!(fs::read(f.src.join("e/f")).expect("read"), b"a");
    assert_eq!(
        errno(f.policy.rmdir(ROOT_INO, OsStr::new("e")).await),
        libc::ENOTEMPTY
    );
    for name in ["f", "l"] {
        f.policy
            .unlink(d.ino, OsStr::new(name))
            .await
            .expect("unlink");
    }
    f.policy
        .rmdir(ROOT_INO, OsStr::new("e"))
        .await
        .expect("rmdir");
    assert!(!f.src.join("e").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_write_through_one_hard_link_is_read_through_the_other() {
    let f = writable(|c, _, _| c.prefetch = false);
    let old = f.source_bytes("weights.bin");
    assert_eq!(f.read_all("weights.bin").await.expect("stage"), old);
    let ino = f.lookup("weights.bin").await.expect("lookup").ino;
    let linked = f
        .policy
        .link(ino, ROOT_INO, OsStr::new("other.bin"))
        .await
        .expect("link");
    assert_eq!((linked.kind, linked.nlink), (EntryKind::File, 2));
    let (a, b) = (f.src.join("weights.bin"), f.src.join("other.bin"));
    assert_eq!(
        fs::metadata(&a).expect("a").ino(),
        fs::metadata(&b).expect("b").ino(),
        "one file, two names, on the source"
    );
    assert_eq!(f.read_all("other.bin").await.expect("stage"), old);
    assert!(f.stored("weights.bin") && f.stored("other.bin"));
    // Rewritten in place through one name, with its mtime set back as `cp -p` would.
    let new = bytes(old.len(), 41);
    f.rewrite_keeping_mtime("weights.bin", &new).await;
    assert_eq!(
        f.read_all("other.bin").await.expect("read"),
        new,
        "the other name's staged copy is stale and not served"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn special_files_are_made_on_the_source_with_exactly_their_mode() {
    let f = writable(|_, _, _| {});
    let mode = S_IFIFO | 0o640;
    let fifo = f
        .policy
        .mknod(ROOT_INO, OsStr::new("pipe"), mode, 0, me())
        .await
        .expect("mkfifo");
    assert_eq!((fifo.kind, fifo.perm), (EntryKind::Fifo, 0o640));
    let meta = fs::symlink_metadata(f.src.join("pipe")).expect("stat");
    assert!(meta.file_type().is_fifo());
    assert_eq!(
        meta.permissions().mode() & 0o7777,
        0o640,
        "no umask narrowing"
    );
    let again = f
        .policy
        .mknod(ROOT_INO, OsStr::new("pipe"), mode, 0, me())
        .await;
    assert_eq!(errno(again), libc::EEXIST);
    let ino = f.lookup("pipe").await.expect("lookup").ino;
    let linked = f.policy.link(ino, ROOT_INO, OsStr::new("pipe2")).await;
    assert_eq!(linked.expect("link a fifo").kind, EntryKind::Fifo);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_mount_refuses_every_change_with_erofs() {
    let f = fixture(|c, _, _| c.read_only = true);
    assert_eq!(errno(f.write_new("x", b"x").await), libc::EROFS);
    assert_eq!(
        errno(f.policy.mkdir(ROOT_INO, OsStr::new("d"), 0o755, me()).await),
        libc::EROFS
    );
    assert_eq!(
        errno(f.policy.unlink(ROOT_INO, OsStr::new("config.json")).await),
        libc::EROFS
    );
    let attr = f.lookup("config.json").await.expect("lookup");
    assert_eq!(
        errno(
            f.policy
                .open_write(attr.ino, stagefs_source::WriteOpen::default())
                .await
        ),
        libc::EROFS
    );
    let ino = f.lookup("config.json").await.expect("lookup").ino;
    assert_eq!(
        errno(f.policy.link(ino, ROOT_INO, OsStr::new("c2")).await),
        libc::EROFS
    );
    let fifo = S_IFIFO | 0o644;
    assert_eq!(
        errno(
            f.policy
                .mknod(ROOT_INO, OsStr::new("p"), fifo, 0, me())
                .await
        ),
        libc::EROFS
    );
    assert!(f.src.join("config.json").exists());
    assert!(!f.src.join("c2").exists() && !f.src.join("p").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_source_fails_the_writer_with_enospc() {
    let f = writable(|_, _, _| {});
    let (_, fh) = f
        .policy
        .create(ROOT_INO, OsStr::new("big"), NEW, me())
        .await
        .expect("create");
    f.source.set(Behaviour::Full);
    assert_eq!(
        errno(f.policy.write(fh, 0, vec![1; 4096]).await),
        libc::ENOSPC
    );
    f.policy.release(fh);
    assert_eq!(errno(f.write_new("other", b"x").await), libc::ENOSPC);
    assert_eq!(
        errno(f.policy.mkdir(ROOT_INO, OsStr::new("d"), 0o755, me()).await),
        libc::ENOSPC
    );
    // Reads are not affected.
    assert!(f.read_all("weights.bin").await.is_ok());
    f.source.set(Behaviour::Healthy);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_source_fails_writes_with_eio_within_the_timeout_and_staged_files_stay() {
    let f = writable(|c, _, _| {
        c.source_timeout = Duration::from_millis(300);
        c.redirect = false;
    });
    let expected = f.source_bytes("weights.bin");
    f.read_all("weights.bin").await.expect("stage");
    let (_, fh) = f
        .policy
        .create(ROOT_INO, OsStr::new("w"), NEW, me())
        .await
        .expect("create");
    f.source.set(Behaviour::Hang);
    let started = Instant::now();
    assert_eq!(errno(f.policy.write(fh, 0, vec![1; 4096]).await), libc::EIO);
    assert_eq!(errno(f.policy.fsync(fh, false).await), libc::EIO);
    assert_eq!(errno(f.write_new("x", b"x").await), libc::EIO);
    assert_eq!(
        errno(f.policy.unlink(ROOT_INO, OsStr::new("config.json")).await),
        libc::EIO
    );
    assert!(started.elapsed() < PROMPTLY, "{:?}", started.elapsed());
    let read = tokio::time::timeout(PROMPTLY, f.read_all("weights.bin"))
        .await
        .expect("a staged file is served while the source is dead");
    assert_eq!(read.expect("read"), expected);
    f.policy.release(fh);
    f.source.set(Behaviour::Healthy);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_close_fails_with_eio_when_the_source_cannot_take_what_was_written() {
    let f = writable(|c, _, _| {
        c.source_timeout = Duration::from_millis(300);
        c.prefetch = false;
    });
    let data = bytes(3 * MIB, 46);
    let (_, fh) = f
        .policy
        .create(ROOT_INO, OsStr::new("saved.bin"), NEW, me())
        .await
        .expect("create");
    f.policy.write(fh, 0, data.clone()).await.expect("write");
    // Answered, and then the source goes away before the writer closes: the close
    // (a flush of what the source's client holds) must say so.
    f.source.set(Behaviour::Hang);
    let started = Instant::now();
    assert_eq!(errno(f.policy.flush(fh).await), libc::EIO);
    assert!(started.elapsed() < PROMPTLY, "{:?}", started.elapsed());
    f.policy.release(fh);
    f.source.set(Behaviour::Healthy);
    // The copy it filled is not staged: the source may not hold what it saw.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!f.stored("saved.bin"));
    assert!(f.read_all("saved.bin").await.expect("read") == f.source_bytes("saved.bin"));

    // A source that takes it: the close succeeds, and the copy is staged as written.
    let (_, fh) = f
        .policy
        .create(ROOT_INO, OsStr::new("kept.bin"), NEW, me())
        .await
        .expect("create");
    f.policy.write(fh, 0, data.clone()).await.expect("write");
    f.policy.flush(fh).await.expect("flush");
    f.policy.release(fh);
    wait_until("the written copy", || f.trusted_copy("kept.bin")).await;
    // A read handle has nothing to flush, even with the source gone.
    let reader = f.hold("kept.bin").await;
    f.source.set(Behaviour::Hang);
    f.policy.flush(reader).await.expect("nothing to flush");
    f.source.set(Behaviour::Healthy);
    f.policy.release(reader);
}

// ------------------------------------------------------------ staged as written

impl Fixture {
    /// Creates `name` in directory `dir`, writes `data` front to back and closes it.
    async fn write_into(&self, dir: u64, name: &str, data: &[u8]) -> Attr {
        let (attr, fh) = self
            .policy
            .create(dir, OsStr::new(name), NEW, me())
            .await
            .expect("create");
        for (i, chunk) in data.chunks(128 << 10).enumerate() {
            let offset = (i * (128 << 10)) as u64;
            self.policy
                .write(fh, offset, chunk.to_vec())
                .await
                .expect("write");
        }
        self.policy.release(fh);
        attr
    }
}

impl Fixture {
    /// Writes `data` as huggingface_hub does: into `blobs/<name>.incomplete`,
    /// then renamed to `blobs/<name>`.
    async fn download_blob(&self, name: &str, data: &[u8]) {
        let blobs = self.lookup("models--acme--m/blobs").await.expect("blobs");
        let incomplete = format!("{name}.incomplete");
        self.write_into(blobs.ino, &incomplete, data).await;
        self.policy
            .rename(
                blobs.ino,
                OsStr::new(&incomplete),
                blobs.ino,
                OsStr::new(name),
                RenameHow::default(),
            )
            .await
            .expect("rename");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_blob_downloaded_through_the_mount_is_staged_as_it_is_written() {
    let f = writable(|c, _, _| c.prefetch = false);
    let data = bytes(3 * MIB, 42);
    let sha = format!("{:x}", Sha256::digest(&data));
    f.download_blob(&sha, &data).await;
    let blob = PathBuf::from("models--acme--m/blobs").join(&sha);
    wait_until("the written copy", || f.stored(&blob)).await;
    assert!(f.read_all(&blob).await.expect("read") == data);
    let m = f.metrics();
    assert_eq!(
        (m.stage_copies, m.stage_hits),
        (0, 1),
        "nothing copied over the link: {m:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_written_blob_whose_bytes_do_not_match_its_name_is_not_staged() {
    let f = writable(|c, _, _| c.prefetch = false);
    let data = bytes(3 * MIB, 42);
    let wrong = format!("{:x}", Sha256::digest(b"something else"));
    f.download_blob(&wrong, &data).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!f.stored(PathBuf::from("models--acme--m/blobs").join(&wrong)));
    assert!(
        f.policy.stager.store().entries().len() <= 1,
        "nothing else either"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_written_front_to_back_is_staged_and_one_written_out_of_order_is_not() {
    let f = writable(|c, _, _| c.prefetch = false);
    let data = bytes(3 * MIB, 43);
    f.write_into(ROOT_INO, "saved.bin", &data).await;
    wait_until("the written copy", || f.trusted_copy("saved.bin")).await;
    assert!(f.read_all("saved.bin").await.expect("read") == data);
    assert_eq!(f.metrics().stage_copies, 0, "nothing copied over the link");

    let (_, fh) = f
        .policy
        .create(ROOT_INO, OsStr::new("scattered.bin"), NEW, me())
        .await
        .expect("create");
    let half = data.len() / 2;
    f.policy
        .write(fh, half as u64, data[half..].to_vec())
        .await
        .expect("write");
    f.policy
        .write(fh, 0, data[..half].to_vec())
        .await
        .expect("write");
    f.policy.release(fh);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!f.stored("scattered.bin"));
    assert!(f.read_all("scattered.bin").await.expect("read") == data);
    assert_eq!(
        f.metrics().stage_copies,
        1,
        "staged from the source instead"
    );
}

impl Fixture {
    async fn rename_in_root(&self, from: &str, to: &str) {
        self.policy
            .rename(
                ROOT_INO,
                OsStr::new(from),
                ROOT_INO,
                OsStr::new(to),
                RenameHow::default(),
            )
            .await
            .expect("rename");
    }
}

/// As safetensors' `save_file` writes (and transformers' `save_pretrained`
/// through it): a temp file, its whole length set first, written front to back,
/// renamed before its close reaches the daemon (FUSE sends RELEASE on its own
/// time); then a careful caller reopens it to fsync and renames it again. The
/// copy follows both renames, and the load reads nothing back over the link.
#[tokio::test(flavor = "multi_thread")]
async fn a_preallocated_temp_file_renamed_before_its_close_and_again_keeps_its_copy() {
    let f = writable(|c, _, _| c.prefetch = false);
    let data = bytes(3 * MIB, 45);
    let (attr, fh) = f
        .policy
        .create(ROOT_INO, OsStr::new(".tmpAbC123"), NEW, me())
        .await
        .expect("create");
    let preallocate = SetAttr {
        size: Some(data.len() as u64),
        ..SetAttr::default()
    };
    f.policy
        .setattr(attr.ino, Some(fh), preallocate)
        .await
        .expect("ftruncate");
    for (i, chunk) in data.chunks(128 << 10).enumerate() {
        let offset = (i * (128 << 10)) as u64;
        f.policy
            .write(fh, offset, chunk.to_vec())
            .await
            .expect("write");
    }
    f.rename_in_root(".tmpAbC123", "model.safetensors.tmp")
        .await;
    f.policy.release(fh);
    wait_until("the written copy", || {
        f.trusted_copy("model.safetensors.tmp")
    })
    .await;
    // Reopened to fsync: no write, so no change.
    let tmp = f.lookup("model.safetensors.tmp").await.expect("lookup");
    let fh = f
        .policy
        .open_write(tmp.ino, stagefs_source::WriteOpen::default())
        .await
        .expect("open");
    f.policy.fsync(fh, false).await.expect("fsync");
    f.policy.release(fh);
    f.rename_in_root("model.safetensors.tmp", "model.safetensors")
        .await;
    assert!(f.read_all("model.safetensors").await.expect("read") == data);
    assert_eq!(f.metrics().stage_copies, 0, "nothing copied over the link");
    assert!(
        !f.stored("model.safetensors.tmp"),
        "one copy, under the final name"
    );
}

/// The copy follows a rename only if nothing else changed the file: a second
/// handle's write in between leaves it to be staged from the source.
#[tokio::test(flavor = "multi_thread")]
async fn a_file_changed_by_another_handle_before_its_rename_is_staged_from_the_source() {
    let f = writable(|c, _, _| c.prefetch = false);
    let data = bytes(3 * MIB, 46);
    f.write_into(ROOT_INO, "w.tmp", &data).await;
    wait_until("the written copy", || f.trusted_copy("w.tmp")).await;
    let tmp = f.lookup("w.tmp").await.expect("lookup");
    let fh = f
        .policy
        .open_write(tmp.ino, stagefs_source::WriteOpen::default())
        .await
        .expect("open");
    f.policy.write(fh, 7, b"X".to_vec()).await.expect("write");
    f.policy.release(fh);
    f.rename_in_root("w.tmp", "w.bin").await;
    let mut expected = data.clone();
    expected[7] = b'X';
    assert!(f.read_all("w.bin").await.expect("read") == expected);
    assert_eq!(f.metrics().stage_copies, 1, "staged from the source");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_copy_the_budget_has_no_room_for_is_not_filled_as_written() {
    // Room is asked for 32 MiB ahead; a 16 MiB budget has none.
    let f = writable(|c, _, b| {
        c.prefetch = false;
        b.max_size = Some(16 * MIB as u64);
    });
    let data = bytes(3 * MIB, 44);
    f.write_into(ROOT_INO, "big.bin", &data).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!f.stored("big.bin"));
    assert!(f.read_all("big.bin").await.expect("read") == data);
    assert_eq!(
        f.metrics().stage_copies,
        1,
        "staged from the source, which fits"
    );
}
