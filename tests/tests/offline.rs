//! Issue 44: a model loaded once loads again with the NAS away, through the loaders
//! users run, as users point them at the mount. The source is a whole HF_HOME on an
//! sshfs NAS (tests/scripts/netfs.sh), with the model downloaded into its `hub/` from
//! a local Hub and a copy of it as a plain model folder; `HF_HOME` is the mount, as
//! `stagefs mount` tells users to export. mlx_lm.load (and generate) and
//! transformers' AutoConfig and AutoTokenizer, by repository id and by path, probe
//! names the model lacks (`token`, `stored_tokens`, `generation_config.json`,
//! `hf_quant_config.json`, ...): while the NAS answers they hear "no such file",
//! and while it is away they must hear the same, not EIO. The NAS goes away three
//! ways: its link cut (calls hang), sshfs killed (ENOTCONN), and the share unmounted
//! underneath. Load times are printed for docs/BENCHMARKS.md, never asserted.

use std::fs;
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use serde_json::Value;
use stagefs_tests::hub::{As, HUB_CLIENT, Hub, REPO};
use stagefs_tests::{Mount, NetFs, Scratch, wait_for};

/// The plain model folder's place in the source.
const FOLDER: &str = "models/tiny-llama";

/// An HF_HOME on a NAS, with the model in its hub/ and as a plain folder, mounted.
struct Nas {
    // Dropped in this order: the mount, then the NAS under it, then the scratch area.
    mount: Mount,
    remote: NetFs,
    /// The model as made, whose weights every load is compared with.
    made: PathBuf,
    s: Scratch,
}

fn hf_home_on_a_nas() -> Nas {
    let s = Scratch::new();
    let made = s.dir.path().join("made");
    As::Root.ok(
        HUB_CLIENT,
        "make-llama",
        &made,
        &[("MODEL_SEED", Path::new("3"))],
    );
    let home = s.dir.path().join("hf-home");
    fs::create_dir_all(home.join("hub")).expect("mkdir");
    {
        let hub = Hub::serve(&made);
        As::Root.ok(
            HUB_CLIENT,
            "snapshot",
            Path::new(REPO),
            &[("HF_ENDPOINT", &hub.endpoint()), ("HF_HOME", &home)],
        );
    }
    let folder = home.join(FOLDER);
    fs::create_dir_all(&folder).expect("mkdir");
    for entry in fs::read_dir(&made).expect("ls").flatten() {
        fs::copy(entry.path(), folder.join(entry.file_name())).expect("copy");
    }
    assert!(
        !home.join("token").exists(),
        "no token: the probe of it must miss"
    );
    let remote = NetFs::up(&home, &s.dir.path().join("nas"), "200mbit");
    let mount = Mount::start(&remote.mnt, &s.mnt, &s.cache, &["--source-timeout", "10s"]);
    Nas {
        mount,
        remote,
        made,
        s,
    }
}

impl Nas {
    /// The loads, offline with HF_HOME at the mount: what they loaded, and how long
    /// they took; the failure, with the mount's log, if they failed.
    fn load(&self, when: &str) -> (Value, Duration) {
        let expect = self.made.join("model.safetensors");
        let started = Instant::now();
        let loaded = As::Root.client(
            HUB_CLIENT,
            "loads",
            &self.mount.path(FOLDER),
            &[
                ("HF_HOME", &self.mount.mnt),
                ("HF_HUB_OFFLINE", Path::new("1")),
                ("REPO", Path::new(REPO)),
                ("EXPECT_WEIGHTS", &expect),
            ],
        );
        let took = started.elapsed();
        let loaded =
            loaded.unwrap_or_else(|e| panic!("loads {when}: {e}\n{}", self.mount.log_text()));
        for by in ["repo", "folder"] {
            assert_eq!(
                loaded[by]["weights_match"], true,
                "{when}, by {by}: {loaded}"
            );
            assert_eq!(loaded[by]["seed"], 3, "{when}, by {by}: the config");
        }
        (loaded, took)
    }

    /// Waits until the NAS serves the mount again: a file added to it is read.
    fn served_again(&self, name: &str) {
        let source = self.s.dir.path().join("hf-home").join(name);
        fs::write(&source, b"back").expect("write");
        let through = self.mount.path(name);
        wait_for("the mount to serve the NAS again", || {
            fs::read(&through).is_ok_and(|b| b == b"back")
        });
    }
}

#[test]
fn a_model_loaded_before_the_nas_went_away_loads_the_same_while_it_is_away() {
    let nas = hf_home_on_a_nas();
    let (first, _) = nas.load("the first time");
    let (_, up) = nas.load("again, with the NAS up");
    wait_for("the copies the loads started", || {
        nas.mount.in_flight().is_empty()
    });
    let mut took = vec![("up", up)];
    for (how, away, back) in [
        (
            "link cut",
            NetFs::cut as fn(&NetFs),
            NetFs::restore as fn(&NetFs),
        ),
        ("sshfs killed", NetFs::kill_sshfs, NetFs::mount_again),
        ("unmounted", NetFs::drop_connection, NetFs::mount_again),
    ] {
        away(&nas.remote);
        // Past the kernel's 1 s caches: every name is asked of the mount again.
        sleep(Duration::from_millis(1500));
        let (loaded, t) = nas.load(how);
        assert_eq!(loaded, first, "{how}: what the loads read and generated");
        took.push((how, t));
        back(&nas.remote);
        nas.served_again(&format!("back-after-{}.txt", how.replace(' ', "-")));
    }
    println!(
        "loads (mlx_lm.load + generate, AutoConfig, AutoTokenizer; by id with HF_HOME at the mount and by path), --source-timeout 10s: {}",
        took.iter()
            .map(|(how, t)| format!("{how} {:.1} s", t.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    );
}
