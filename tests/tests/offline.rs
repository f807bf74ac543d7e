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
use stagefs_tests::hub::{As, HUB_CLIENT, REPO, llama_in_hf_home};
use stagefs_tests::{Mount, NetFs, Scratch, TEST_RESERVE, run_stagefs, status_json, wait_for};

/// The plain model folder's place in the source.
const FOLDER: &str = "models/tiny-llama";
/// The same model in a folder nothing reads before the NAS goes away.
const NEVER_STAGED: &str = "models/never-staged";
/// The same model in a folder of which only the config is read.
const PARTLY_READ: &str = "models/partly-read";

/// The options of every mount of the NAS.
const MOUNT_OPTIONS: &[&str] = &["--source-timeout", "10s"];

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
    hf_home_with_token_on_a_nas(None)
}

/// [`hf_home_on_a_nas`], with `token` as the HF_HOME's access token if given.
fn hf_home_with_token_on_a_nas(token: Option<&[u8]>) -> Nas {
    let s = Scratch::new();
    let made = s.dir.path().join("made");
    let home = s.dir.path().join("hf-home");
    llama_in_hf_home(&made, &home, "3");
    for folder in [FOLDER, NEVER_STAGED, PARTLY_READ] {
        let folder = home.join(folder);
        fs::create_dir_all(&folder).expect("mkdir");
        for entry in fs::read_dir(&made).expect("ls").flatten() {
            fs::copy(entry.path(), folder.join(entry.file_name())).expect("copy");
        }
    }
    match token {
        Some(token) => fs::write(home.join("token"), token).expect("token"),
        None => assert!(
            !home.join("token").exists(),
            "no token: the probe of it must miss"
        ),
    }
    let remote = NetFs::up(&home, &s.dir.path().join("nas"), "200mbit");
    let mount = Mount::start(&remote.mnt, &s.mnt, &s.cache, MOUNT_OPTIONS);
    Nas {
        mount,
        remote,
        made,
        s,
    }
}

impl Drop for Nas {
    /// A test that fails while the link is cut must not hang: the daemon's threads
    /// stuck on the share cannot exit, and the mount is dropped first.
    fn drop(&mut self) {
        self.remote.restore();
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

    /// The plain model folder at `folder` loaded by path: mlx_lm.load + generate,
    /// AutoConfig, AutoTokenizer; the weights must be the model's.
    fn load_folder(&self, folder: &str, when: &str) -> (Value, Duration) {
        let started = Instant::now();
        let loaded = As::Root.client(
            HUB_CLIENT,
            "mlx-load-folder",
            &self.mount.path(folder),
            &[
                ("HF_HOME", &self.mount.mnt),
                ("HF_HUB_OFFLINE", Path::new("1")),
                ("EXPECT_WEIGHTS", &self.made.join("model.safetensors")),
            ],
        );
        let took = started.elapsed();
        let loaded = loaded
            .unwrap_or_else(|e| panic!("load of {folder} {when}: {e}\n{}", self.mount.log_text()));
        assert_eq!(loaded["weights_match"], true, "{when}: {loaded}");
        assert_eq!(loaded["seed"], 3, "{when}: the config");
        (loaded, took)
    }

    /// `stagefs prefetch TARGET` for this mount's cache.
    fn prefetch(&self, target: &dyn AsRef<std::ffi::OsStr>) {
        let (ok, out, err) = run_stagefs(&[&"prefetch", target, &"--cache-dir", &self.s.cache]);
        assert!(ok, "prefetch failed: {out}{err}");
    }

    /// What status says of `model` being ready offline: (ready, missing names) per
    /// revision or folder.
    fn offline(&self, model: &str) -> Vec<(bool, u64)> {
        let report = status_json(&self.s.cache);
        let models = report["models"].as_array().cloned().unwrap_or_default();
        let found = models
            .iter()
            .find(|m| m["model"] == model)
            .unwrap_or_else(|| panic!("status names no {model}: {report}"));
        found["offline"]
            .as_array()
            .unwrap_or_else(|| panic!("no offline readiness for {model}: {found}"))
            .iter()
            .map(|r| (r["ready"] == true, r["missing_count"].as_u64().unwrap_or(0)))
            .collect()
    }

    /// Stops the mount and mounts the cache again over the NAS as it is now.
    fn remount(&mut self) {
        self.mount.remount(&self.remote.mnt, MOUNT_OPTIONS);
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
    // Loaded once by id and by path: ready offline by that alone (once the copies
    // the loads started are kept).
    for model in [REPO, FOLDER] {
        let ready = || {
            let offline = nas.offline(model);
            !offline.is_empty() && offline.iter().all(|(ready, _)| *ready)
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready() {
            if Instant::now() > deadline {
                let (_, text, _) = run_stagefs(&[&"status", &"--cache-dir", &nas.s.cache]);
                panic!("{model} is not ready offline after two loads:\n{text}");
            }
            sleep(Duration::from_millis(100));
        }
    }
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

/// A way a NAS goes away: its name, what takes it away, what brings it back.
type Outage = (&'static str, fn(&NetFs), fn(&NetFs));

/// The three ways a NAS goes away, and how each comes back.
fn outages() -> [Outage; 3] {
    [
        ("link cut", NetFs::cut, NetFs::restore),
        ("sshfs killed", NetFs::kill_sshfs, NetFs::mount_again),
        ("unmounted", NetFs::drop_connection, NetFs::mount_again),
    ]
}

#[test]
fn a_model_only_prefetched_loads_while_the_nas_is_away_and_status_says_it_is_ready_offline() {
    let nas = hf_home_on_a_nas();
    nas.prefetch(&REPO);
    nas.prefetch(&nas.mount.path(FOLDER));
    // A model of which a loader read the config alone is not ready, and status says
    // what it lacks.
    fs::read(nas.mount.path(PARTLY_READ).join("config.json")).expect("read the config");
    wait_for("the config's copy", || {
        status_json(&nas.s.cache)["models"]
            .as_array()
            .is_some_and(|ms| ms.iter().any(|m| m["model"] == PARTLY_READ))
    });
    for model in [REPO, FOLDER] {
        let offline = nas.offline(model);
        assert!(
            !offline.is_empty() && offline.iter().all(|(ready, _)| *ready),
            "{model} is ready offline after a prefetch: {offline:?}"
        );
    }
    let partly = nas.offline(PARTLY_READ);
    assert!(
        matches!(partly.as_slice(), [(false, missing)] if *missing > 0),
        "{partly:?}"
    );
    let (ok, text, err) = run_stagefs(&[&"status", &"--cache-dir", &nas.s.cache]);
    assert!(ok, "{err}");
    assert!(text.contains("ready offline"), "{text}");
    assert!(
        text.contains("not ready offline:")
            && text.contains(&format!("stagefs prefetch {PARTLY_READ}")),
        "{text}"
    );

    let mut took = Vec::new();
    for (how, away, back) in outages() {
        away(&nas.remote);
        sleep(Duration::from_millis(1500));
        let (_, t) = nas.load(how);
        took.push((how, t));
        back(&nas.remote);
        nas.served_again(&format!(
            "prefetched-back-after-{}.txt",
            how.replace(' ', "-")
        ));
    }
    let (_, up) = nas.load("with the NAS up");
    println!(
        "loads of a model only prefetched, --source-timeout 10s: up {:.1} s, {}",
        up.as_secs_f64(),
        took.iter()
            .map(|(how, t)| format!("{how} {:.1} s", t.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

#[test]
fn a_mount_started_with_the_nas_away_serves_what_the_cache_remembers_and_takes_the_nas_back() {
    let mut nas = hf_home_on_a_nas();
    nas.prefetch(&REPO);
    nas.prefetch(&nas.mount.path(FOLDER));
    let (first, _) = nas.load("before the restarts");
    for (how, away, back) in outages() {
        away(&nas.remote);
        nas.remount();
        assert!(
            nas.mount.ready.contains("away"),
            "{how}: the mount says it serves the source away: {}",
            nas.mount.ready
        );
        let (loaded, t) = nas.load(&format!("mounted with the NAS away ({how})"));
        assert_eq!(loaded, first, "{how}: what the loads read and generated");
        println!(
            "mounted with the NAS away ({how}): loads {:.1} s",
            t.as_secs_f64()
        );
        for model in [REPO, FOLDER] {
            assert!(
                nas.offline(model).iter().all(|(ready, _)| *ready),
                "{how}: status while away"
            );
        }
        // Read-only while the source is away: a write is refused at once.
        let written = fs::write(nas.mount.path("made-while-away.txt"), b"x");
        let refused = written.expect_err("a write while away").raw_os_error();
        assert_eq!(refused, Some(libc::EROFS), "{how}: a write while away");
        back(&nas.remote);
        // Back by itself, without a remount: a model never staged loads from it.
        nas.served_again(&format!(
            "remounted-back-after-{}.txt",
            how.replace(' ', "-")
        ));
        nas.load_folder(NEVER_STAGED, &format!("after the NAS came back ({how})"));
        nas.remount();
        assert_eq!(
            nas.mount.ready, "ready",
            "{how}: the NAS is up at the next mount"
        );
    }

    // As a user starts it: `stagefs mount` in the background says so in one line.
    nas.remote.kill_sshfs();
    let (ok, out, err) = run_stagefs(&[&"unmount", &nas.s.mnt]);
    assert!(ok, "unmount: {out}{err}");
    let reserve = TEST_RESERVE.to_string();
    let (ok, out, err) = run_stagefs(&[
        &"mount",
        &nas.remote.mnt,
        &nas.s.mnt,
        &"--cache-dir",
        &nas.s.cache,
        &"--min-free",
        &reserve,
        &"--source-timeout",
        &"10s",
    ]);
    assert!(ok, "mount with sshfs dead: {out}{err}");
    let said: Vec<&str> = out.lines().collect();
    assert!(
        matches!(said.as_slice(), [line] if line.contains("is away") && line.contains("read-only")),
        "one line says the source is away: {out}"
    );
    let (loaded, _) = nas.load("mounted in the background with sshfs dead");
    assert_eq!(loaded, first);
    nas.remote.mount_again();
}

/// Files under `dir` whose bytes are `bytes`.
fn files_holding(dir: &Path, bytes: &[u8]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => dirs.push(path),
                Ok(t) if t.is_file() && fs::read(&path).is_ok_and(|b| b == bytes) => {
                    found.push(path);
                }
                _ => {}
            }
        }
    }
    found
}

#[test]
fn the_access_token_is_kept_private_served_while_the_nas_is_away_and_dropped_by_evict_all() {
    use std::os::unix::fs::PermissionsExt;
    let secret = b"hf_testsecretthatmustnotleak";
    let nas = hf_home_with_token_on_a_nas(Some(secret));
    nas.prefetch(&REPO);
    let kept = files_holding(&nas.s.cache, secret);
    assert_eq!(kept.len(), 1, "one copy of the token is kept: {kept:?}");
    let mode = |p: &Path| fs::metadata(p).expect("stat").permissions().mode();
    assert_eq!(mode(&kept[0]) & 0o077, 0, "the copy is its owner's alone");
    for dir in kept[0].ancestors().skip(1) {
        if !dir.starts_with(&nas.s.cache) {
            break;
        }
        assert_eq!(
            mode(dir) & 0o077,
            0,
            "{} is its owner's alone",
            dir.display()
        );
    }

    nas.remote.cut();
    sleep(Duration::from_millis(1500));
    assert_eq!(
        fs::read(nas.mount.path("token")).expect("the token while away"),
        secret
    );
    let log = nas.mount.log_text();
    let journal = fs::read_to_string(nas.s.cache.join("answers.jsonl")).unwrap_or_default();
    for (what, text) in [("the log", &log), ("the answers journal", &journal)] {
        assert!(
            !text.contains(std::str::from_utf8(secret).expect("text")),
            "the token is in {what}"
        );
    }
    nas.remote.restore();
    nas.served_again("back-after-the-token.txt");

    let (ok, out, err) = run_stagefs(&[&"evict", &"--all", &"--cache-dir", &nas.s.cache]);
    assert!(ok, "evict --all: {out}{err}");
    assert_eq!(
        files_holding(&nas.s.cache, secret),
        Vec::<PathBuf>::new(),
        "evict --all drops the token's copy"
    );
}
