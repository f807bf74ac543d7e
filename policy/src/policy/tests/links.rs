//! NFS links: a blob is a link from its first lookup, and only its text and times
//! change as its copy comes and goes.

use std::os::unix::ffi::OsStrExt;

use super::*;

/// An NFS mount's policy with links, as an ordinary user serves it.
fn nfs_links() -> Fixture {
    fixture(|c, _, _| {
        c.redirect = false;
        c.passthrough = false;
        c.nfs_links = true;
        c.prefetch = false;
    })
}

impl Fixture {
    /// The blob's alias, as a link's text names it.
    fn alias(&self) -> PathBuf {
        let name = self.blob.file_name().expect("a blob name").as_bytes();
        let alias = [crate::links::ALIAS_PREFIX.as_bytes(), name].concat();
        self.blob.with_file_name(OsStr::from_bytes(&alias))
    }

    async fn text(&self, ino: u64) -> Vec<u8> {
        self.policy.readlink(ino).await.expect("readlink")
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_blob_is_a_link_from_its_first_lookup_and_its_alias_stages_it() {
    let f = nfs_links();
    let cold = f.lookup(&f.blob).await.expect("lookup");
    assert_eq!(cold.kind, EntryKind::Symlink);
    let alias = f.alias();
    assert_eq!(
        f.text(cold.ino).await,
        alias.file_name().expect("name").as_bytes()
    );
    assert_eq!(
        f.metrics().stage_copies,
        0,
        "a lookup and a readlink stage nothing"
    );
    // The alias is the blob's regular file: its first read stages it, as before.
    let file = f.lookup(&alias).await.expect("alias");
    assert_eq!(file.kind, EntryKind::File);
    assert_eq!(
        f.read_all(&alias).await.expect("read"),
        f.source_bytes(&f.blob)
    );
    assert_eq!(f.metrics().stage_copies, 1);
    // The same link, now naming the copy, with both times moved.
    let warm = f.lookup(&f.blob).await.expect("lookup");
    assert_eq!(warm.ino, cold.ino, "the name keeps its link");
    assert_eq!(warm.kind, EntryKind::Symlink);
    assert!(warm.mtime_ns > cold.mtime_ns && warm.ctime_ns > cold.ctime_ns);
    let copy = PathBuf::from(OsString::from_vec(f.text(warm.ino).await));
    assert!(copy.is_absolute(), "{}", copy.display());
    assert_eq!(warm.size, copy.as_os_str().len() as u64);
    assert_eq!(fs::read(&copy).expect("copy"), f.source_bytes(&f.blob));
    assert_eq!(f.metrics().redirects, 1, "one READLINK named the copy");
    assert_eq!(f.policy.getattr(warm.ino).await.expect("getattr"), warm);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_listing_shows_blobs_as_links_and_no_alias() {
    let f = nfs_links();
    let dir = f
        .lookup(f.blob.parent().expect("blobs"))
        .await
        .expect("dir");
    let fh = f.policy.opendir(dir.ino).await.expect("opendir");
    let listing = f.policy.listing(fh).expect("listing");
    let names: Vec<_> = listing.entries.iter().map(|e| e.name.clone()).collect();
    assert_eq!(names, [f.blob.file_name().expect("name").to_os_string()]);
    assert_eq!(listing.entries[0].attr.kind, EntryKind::Symlink);
    // Files that are not blobs are themselves.
    assert_eq!(
        f.lookup("weights.bin").await.expect("file").kind,
        EntryKind::File
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_copy_removed_is_taken_back_first_and_the_link_leads_to_the_alias_again() {
    let f = nfs_links();
    f.read_all(f.alias()).await.expect("stage");
    let warm = f.lookup(&f.blob).await.expect("lookup");
    let copy = PathBuf::from(OsString::from_vec(f.text(warm.ino).await));
    let remover = {
        let policy = Arc::clone(&f.policy);
        let blob = f.blob.clone();
        tokio::task::spawn_blocking(move || policy.stager.remove_copy(&blob))
    };
    // While the removal waits, the link shows its alias at a new time, and the
    // copy is still there for a client that has not looked again yet.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let retracted = f.policy.getattr(warm.ino).await.expect("getattr");
    assert!(retracted.mtime_ns > warm.mtime_ns && retracted.ctime_ns > warm.ctime_ns);
    assert_eq!(
        retracted.size,
        f.alias().file_name().expect("name").len() as u64
    );
    assert!(
        copy.exists(),
        "removed before the clients could see the link move"
    );
    // A reader that follows the alias meanwhile reads the copy without holding it
    // there: its descriptor keeps the bytes once the copy is removed.
    let opened = f.open(f.alias()).await.expect("open");
    assert!(opened.pin.is_none(), "the copy is not held");
    let fh = f.policy.register(opened, None);
    let asked = Instant::now();
    remover.await.expect("joined").expect("removed");
    assert!(
        asked.elapsed() > Duration::from_millis(500),
        "waited out the link hold"
    );
    assert!(!copy.exists());
    let size = f.source_bytes(&f.blob).len() as u32;
    let read = f.policy.read(fh, 0, size).await.expect("read");
    assert_eq!(read, f.source_bytes(&f.blob), "read from the removed copy");
    f.policy.release(fh);
    assert_eq!(
        f.text(warm.ino).await,
        f.alias().file_name().expect("name").as_bytes()
    );
    assert_eq!(
        f.policy.getattr(warm.ino).await.expect("getattr"),
        retracted
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mount_served_by_root_presents_no_nfs_links() {
    let f = fixture(|c, _, _| {
        c.redirect = false;
        c.nfs_links = true;
        c.served_by_root = true;
    });
    f.read_all(&f.blob).await.expect("read");
    assert_eq!(
        f.lookup(&f.blob).await.expect("lookup").kind,
        EntryKind::File
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_link_read_before_any_attributes_were_asked_shows_its_text() {
    // As a client's handle kept across a restart (the inode journal gives the number
    // back) whose first call is a READLINK: nothing about the link is remembered.
    let f = nfs_links();
    let file = f.lookup(f.alias()).await.expect("alias");
    let version = f.policy.version_of(file.ino).expect("a version");
    let link = f.policy.inodes.intern_redirect(&f.blob, version);
    let alias = f.alias().file_name().expect("name").as_bytes().to_vec();
    assert_eq!(f.text(link).await, alias);
}
