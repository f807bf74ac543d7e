//! stagefs over a real, slow network filesystem (sshfs from a network namespace,
//! capped with tbf): the mount stays responsive while a shard is being staged.

use std::fs::{self, File};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use stagefs_tests::{Mount, NetFs, Scratch, generate};

#[test]
fn stat_ls_and_small_reads_answer_while_a_large_file_stages() {
    let s = Scratch::new();
    let model = generate(&s.hub, "acme/remote", 1, "24M");
    let shard = model.shards().remove(0);
    let shard_size = model.files.last().expect("shard").size;
    // 40 Mbit/s: the 24 MiB shard takes about five seconds to stage.
    let remote = NetFs::up(&s.hub, &s.dir.path().join("nas"), "40mbit");
    let mount = Mount::start(&remote.mnt, &s.mnt, &s.cache, &[]);

    let opened = Arc::new(AtomicBool::new(false));
    let opener = {
        let (path, opened) = (mount.path(&shard), Arc::clone(&opened));
        std::thread::spawn(move || {
            let file = File::open(path);
            opened.store(true, Ordering::SeqCst);
            file.map(|f| f.metadata().map(|m| m.len()))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while mount.metrics().stage_copies == 0 {
        assert!(Instant::now() < deadline, "staging never started");
        sleep(Duration::from_millis(10));
    }

    // While the copy runs, the namespace and small files stay usable through the mount.
    let snapshot = mount.path(&model.snapshot_rel);
    let listing = fs::read_dir(&snapshot).expect("ls").count();
    assert_eq!(listing, model.files.len());
    assert_eq!(
        fs::metadata(mount.path(&shard)).expect("stat").len(),
        shard_size
    );
    let config = fs::read(snapshot.join("config.json")).expect("small read");
    assert!(config == fs::read(s.hub.join(&model.snapshot_rel).join("config.json")).expect("src"));
    let in_flight = mount.metrics();
    assert!(
        !opened.load(Ordering::SeqCst),
        "the open returned before ls/stat/read did; the request loop was blocked ({in_flight:?})"
    );
    assert!(in_flight.bytes_copied < shard_size, "{in_flight:?}");

    let len = opener
        .join()
        .expect("opener thread")
        .expect("open")
        .expect("fstat");
    assert_eq!(len, shard_size);
    assert!(
        fs::read(mount.path(&shard)).expect("read") == fs::read(s.hub.join(&shard)).expect("src")
    );
    drop(mount);
    drop(remote);
}
