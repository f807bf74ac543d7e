//! The NFS backend through Linux's own NFS client. This machine's kernel may have no
//! NFS client (or may not let us load one), so the client is Debian's stock kernel in
//! a qemu guest (tests/vm/: `build-guest.sh` makes it, `bash scripts/setup-tests.sh`
//! runs that; `run-guest.sh` boots it, TCG, no KVM). The guest's root is this
//! machine's, read-only over 9p, so it runs this workspace's `stagefs` and `.venv`.
//!
//! One boot serves every test here (a [`LazyLock`]): the host runs `stagefs serve`
//! for an HF_HOME, for a folder of plain model folders, for an sshfs NAS, for an
//! HF_HOME on another sshfs NAS (the offline group's), twice for a model whose shard
//! is larger than the cache (`--max-size`, `--on-full fail` and `read-source`), twice
//! for a slow sshfs NAS, and a local Hub (tests/py/hub_server.py); the guest mounts the exports with `mount -t nfs` (the
//! kernel does MOUNT itself, no mount.nfs) through qemu's user network, whose
//! forwards are `socat` runs that connect from a reserved port, as the server wants
//! of a Linux client. There tests/py/guest_checks.py runs every check once, in groups
//! (mount, read, own, doctor, write, save, posix, hub, mlx, nas, offline, links, full, slow,
//! fault; see its docstring), and each test below asserts that its group passed. The
//! fault, nas, offline and slow groups are dialogues with this process through files
//! in the scratch directory: the guest asks, the host kills the server (SIGKILL),
//! restarts it on the same port, kills it again; cuts, drops and kills a NAS;
//! prefetches a model and restarts the offline export's server with its NAS away;
//! makes every call to the slow NAS wait (tests/py/slow_sftp.py) while the guest
//! mounts it. After the run the host loads the model the save group wrote from the
//! source itself.
//!
//! The run includes `mlx_lm.load`s (the mlx and offline groups: importing mlx_lm
//! takes ~25 s under TCG); `STAGEFS_GUEST_MLX_LM=0` leaves them out for a quicker
//! run, and their tests then fail, saying so;
//! `STAGEFS_KEEP_GUEST=1` keeps the scratch directory (console.log, dmesg.txt,
//! checks.log, results.json); `STAGEFS_GUEST_GROUPS="full slow"` runs only those
//! groups, while iterating (the other groups' tests then fail: none ran);
//! `STAGEFS_LINKS_COLD_ROUNDS=N` times N pairs of cold loads with and without NFS
//! links (the links group's benchmark; one pair by default).
//!
//! The whole boot is bounded ([`GUEST_LIMIT`]); a missing guest image is a failure
//! that names `bash scripts/setup-tests.sh`, not a skip.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use stagefs_tests::hub::{As, HUB_CLIENT, Hub, REPO, llama_in_hf_home, sha256_of};
use stagefs_tests::{
    Layout, NetFs, Scratch, Served, ShapedSource, generate, run_stagefs, stagefs_bin,
    workspace_root,
};

const ID: &str = "acme/served";
const PLAIN_ID: &str = "acme/plain";
const OWN_ID: &str = "acme/own";
const SHARDS: usize = 3;
const SHARD_SIZE: &str = "2M";
/// Entries of the big directory the guest lists.
const BIG_DIR: usize = 3000;
/// Files of the directory the guest lists while adding to it.
const GROW_DIR: usize = 500;
/// The guest's whole run, boot to power-off (run-guest.sh's GUEST_TIMEOUT).
const GUEST_LIMIT: Duration = Duration::from_secs(780);
/// The guest's mount points (in its own /tmp, a tmpfs).
const HF_MNT: &str = "/tmp/nfs-hf";
const PLAIN_MNT: &str = "/tmp/nfs-plain";
const NAS_MNT: &str = "/tmp/nfs-nas";
const NAS_ID: &str = "acme/on-a-nas";
/// The NAS export's `--source-timeout`: an unseen name must fail well before it.
const NAS_TIMEOUT: Duration = Duration::from_secs(20);
/// Programs reading never-staged files from the NAS while its link is cut.
const NAS_WAITING: usize = 8;
/// The two exports whose cache is too small for their shard (`--max-size`), one
/// `--on-full fail`, one `--on-full read-source`.
const FULL_FAIL_MNT: &str = "/tmp/nfs-full-fail";
const FULL_READ_MNT: &str = "/tmp/nfs-full-read";
const FULL_ID: &str = "acme/too-big";
const FULL_MAX: &str = "1M";
const FULL_SHARD: &str = "3M";
/// The export of a slow NAS (sshfs capped at [`SLOW_RATE`]): its shard's copy takes
/// ~12 s, so the guest's READs wait through JUKEBOX answers.
const SLOW_MNT: &str = "/tmp/nfs-slow";
const SLOW_ID: &str = "acme/slow-copy";
const SLOW_RATE: &str = "8mbit";
const SLOW_SHARD: &str = "12M";
/// A second export of the same NAS, mounted by the guest while every sftp call to
/// the NAS is held [`SLOW_CALL`] (tests/py/slow_sftp.py).
const SLOW_ROOT_MNT: &str = "/tmp/nfs-slow-root";
const SLOW_CALL: Duration = Duration::from_secs(5);
/// The offline group's export: an HF_HOME on an sshfs NAS, with a tiny Llama in its
/// hub/ as [`REPO`] (the guest loads it) and as [`OFFLINE_PREFETCHED`] (only the
/// host prefetches it), and as plain folders of each kind, and one never read
/// before the NAS comes back after the restart.
const OFFLINE_MNT: &str = "/tmp/nfs-offline";
const OFFLINE_PREFETCHED: &str = "acme/prefetched";
const OFFLINE_FOLDER: &str = "models/loaded";
const OFFLINE_PREFETCHED_FOLDER: &str = "models/prefetched";
const OFFLINE_NEVER_FOLDER: &str = "models/never-read";
const OFFLINE_SEED: u64 = 5;
/// The seed of the plain export's tiny Llama (the mlx group's), in its config.
const LLAMA_SEED: u64 = 7;
const OFFLINE_TIMEOUT: &str = "10s";

/// What the guest's run left.
struct Run {
    /// guest_checks.py's results, by check name.
    results: BTreeMap<String, Value>,
    /// guest_checks.py's output (PASS/FAIL lines).
    checks_log: String,
    console: String,
    dmesg: String,
    /// How the run ended, and what the host did for the fault group.
    ended: String,
    took: Duration,
}

/// The one guest run; a panic while setting it up is every test's failure message.
static RUN: LazyLock<Result<Run, String>> = LazyLock::new(|| {
    std::panic::catch_unwind(boot).unwrap_or_else(|panic| {
        let said = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Err(format!("setting up the guest run failed: {said}"))
    })
});

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Boots the guest once and runs every check in it.
fn boot() -> Result<Run, String> {
    let guest = workspace_root().join("target/nfs-guest");
    for file in ["vmlinuz", "initrd.cpio.gz"] {
        if !guest.join(file).is_file() {
            return Err(format!(
                "{} is missing: the guest kernel and initramfs are built by `bash scripts/setup-tests.sh` (as root; it runs tests/vm/build-guest.sh)",
                guest.join(file).display()
            ));
        }
    }
    for tool in ["qemu-system-x86_64", "socat"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Err(format!(
                "{tool} is not installed: run `bash scripts/setup-tests.sh` (as root)"
            ));
        }
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("the kernel NFS tests need root: the guest's forwards connect to the \
                    server from reserved ports (socat's lowport), as the server wants of a Linux client"
            .to_string());
    }
    let started = Instant::now();
    let s = Scratch::new();
    let scratch = s.dir.path().to_path_buf();
    // The links group's user (its home on the host is only for finding its Python).
    let links_area = Scratch::for_user();
    let hf = ShapedSource::generate(&s, Layout::HfHome, ID, SHARDS, SHARD_SIZE);
    let plain = ShapedSource::generate(&s, Layout::PlainFolder, PLAIN_ID, 2, SHARD_SIZE);
    // The guest's own `stagefs mount` mirrors a hub cache of its own, small: doctor
    // walks the source, and over 9p under TCG a walk of thousands of files is slow.
    let own = ShapedSource::generate(&s, Layout::HubCache, OWN_ID, 2, SHARD_SIZE);
    fill_dir(
        &hf.root.join("bigdir"),
        BIG_DIR,
        "an-entry-with-a-long-name-to-fill-readdir-replies",
    );
    fill_dir(&hf.root.join("grow"), GROW_DIR, "there-before");
    let fault_dir = hf.root.join("fault");
    fs::create_dir_all(&fault_dir).expect("mkdir fault");
    for (n, name) in ["a.bin", "b.bin", "c.bin"].iter().enumerate() {
        let bytes: Vec<u8> = (0..(3u64 << 20))
            .map(|i| (i.wrapping_mul(2654435761) >> (8 + n)) as u8)
            .collect();
        fs::write(fault_dir.join(name), bytes).expect("a fault file");
    }
    let mlx_lm = std::env::var("STAGEFS_GUEST_MLX_LM").map_or(true, |v| v != "0");
    let llama = Path::new("models/acme/llama");
    if mlx_lm {
        As::Root.ok(
            HUB_CLIENT,
            "make-llama",
            &plain.root.join(llama),
            &[("MODEL_SEED", Path::new(&LLAMA_SEED.to_string()))],
        );
    }
    let hub_dir = scratch.join("hub-repo");
    let hub = Hub::of_a_new_model(HUB_CLIENT, &hub_dir, &[]);
    let hub_port = hub.url.rsplit(':').next().unwrap_or_default().to_string();

    let mut served = Served::try_start(&hf.root, &s.cache, &[])?;
    let port = served.port();
    let plain_served = Served::try_start(&plain.root, &scratch.join("cache-plain"), &[])?;
    // The nas group's export: a hub cache on an sshfs NAS (its mount point outside
    // the scratch directory, which the guest sees over 9p: a dead FUSE mount must
    // not stand in its way), that the host drops, kills and mounts again.
    let nas_export = scratch.join("nas-export");
    let nas_model = generate(&nas_export, NAS_ID, 2, SHARD_SIZE);
    let never = generate(&nas_export, "acme/never-read-on-a-nas", NAS_WAITING, "1M");
    let nas_place = tempfile::Builder::new()
        .prefix("stagefs-nas-")
        .tempdir()
        .map_err(|e| format!("a tempdir for the NAS: {e}"))?;
    let nas = NetFs::up(&nas_export, &nas_place.path().join("nas"), "200mbit");
    let nas_served = Served::try_start(
        &nas.mnt,
        &scratch.join("cache-nas"),
        &["--source-timeout", &format!("{}s", NAS_TIMEOUT.as_secs())],
    )?;
    // The full group's exports: one model whose shard is larger than the cache may
    // hold, served twice, each with its own cache and --on-full.
    let full_src = scratch.join("full-src");
    let full_model = generate(&full_src, FULL_ID, 1, FULL_SHARD);
    let full = |mode: &str| {
        Served::try_start(
            &full_src,
            &scratch.join(format!("cache-full-{mode}")),
            &["--max-size", FULL_MAX, "--min-free", "0", "--on-full", mode],
        )
    };
    let full_fail = full("fail")?;
    let full_read = full("read-source")?;
    // The slow group's NAS: a rate-capped sshfs whose sftp server holds every call
    // for as long as `slow-delay` says (nothing while it is absent).
    let slow_export = scratch.join("slow-export");
    let slow_model = generate(&slow_export, SLOW_ID, 1, SLOW_SHARD);
    fs::write(slow_export.join("hello.txt"), b"hello from a slow NAS\n").expect("write");
    let slow_delay = scratch.join("slow-delay");
    let slow_nas = NetFs::up_with(
        &slow_export,
        &nas_place.path().join("slow-nas"),
        SLOW_RATE,
        &format!(
            "cache=no,sftp_server={} {}",
            workspace_root().join("tests/py/slow_sftp.py").display(),
            slow_delay.display()
        ),
    );
    let slow_served = Served::try_start(&slow_nas.mnt, &scratch.join("cache-slow"), &[])?;
    // Its source timeout is past what the listing and read take: through sshfs the
    // slow calls queue, and with the default 30 s one of them (an FSSTAT's statvfs)
    // timed out and the server took the NAS for away, racing the read of a name it
    // had not seen.
    let slow_root_served = Served::try_start(
        &slow_nas.mnt,
        &scratch.join("cache-slow-root"),
        &["--source-timeout", "120s"],
    )?;
    let mut offline = Offline::start(&scratch, nas_place.path())?;

    let spec = json!({
        "scratch": scratch,
        "results": scratch.join("results.json"),
        "stagefs": stagefs_bin(),
        "hf": {
            "mnt": HF_MNT,
            "src": hf.root,
            "repo": ID,
            "commit": hf.model.commit,
            "shards": hf.shard_names(),
        },
        "plain": {"mnt": PLAIN_MNT, "src": plain.root, "dir": plain.model_dir},
        "bigdir": {"rel": "bigdir", "count": BIG_DIR},
        "grow": {"rel": "grow", "count": GROW_DIR},
        "hub": {"endpoint": "http://10.0.2.101", "repo": REPO, "dir": hub_dir},
        "mlx_lm": mlx_lm,
        "llama": if mlx_lm { json!(llama) } else { Value::Null },
        "llama_seed": LLAMA_SEED,
        "own": {
            "mnt": "/tmp/own-mnt",
            "cache": "/tmp/own-cache",
            "src": own.root,
            "repo": OWN_ID,
            "commit": own.model.commit,
            "shards": own.shard_names(),
        },
        "fault": {"file": "fault/a.bin", "file2": "fault/b.bin", "file3": "fault/c.bin"},
        "nas": {
            "mnt": NAS_MNT,
            "src": nas_export,
            "repo": NAS_ID,
            "commit": nas_model.commit,
            "shards": nas_model.files.iter().map(|f| f.name.clone()).collect::<Vec<_>>(),
            "timeout": NAS_TIMEOUT.as_secs(),
            "never": never.shards(),
        },
        "full": {
            "fail_mnt": FULL_FAIL_MNT,
            "read_mnt": FULL_READ_MNT,
            "src": full_src,
            "snapshot": full_model.snapshot_rel,
            "files": full_model.files.iter().map(|f| f.name.clone()).collect::<Vec<_>>(),
            "max_size": FULL_MAX,
        },
        "slow": {
            "mnt": SLOW_MNT,
            "root_mnt": SLOW_ROOT_MNT,
            "root_addr": "10.0.2.107",
            "src": slow_export,
            "cache": scratch.join("cache-slow"),
            "snapshot": slow_model.snapshot_rel,
            "files": slow_model.files.iter().map(|f| f.name.clone()).collect::<Vec<_>>(),
            // The shard's sha256, of the source read here: over 9p under TCG the
            // guest would take seconds to read it.
            "sha256": sha256_of(&slow_export.join(&slow_model.shards()[0])),
            "small": "hello.txt",
            "rate": SLOW_RATE,
            "call_delay": SLOW_CALL.as_secs(),
        },
        "save": {"dir": "models/acme/saved"},
        "links": links_spec(&links_area, &scratch),
        "offline": {
            "mnt": OFFLINE_MNT,
            "weights": offline.made.join("model.safetensors"),
            "seed": OFFLINE_SEED,
            "repo": REPO,
            "prefetched_repo": OFFLINE_PREFETCHED,
            "folder": OFFLINE_FOLDER,
            "prefetched_folder": OFFLINE_PREFETCHED_FOLDER,
            "never_folder": OFFLINE_NEVER_FOLDER,
        },
    });
    fs::write(
        scratch.join("spec.json"),
        serde_json::to_string_pretty(&spec).expect("spec"),
    )
    .expect("write the spec");
    fs::write(scratch.join("guest.sh"), guest_script(&scratch)).expect("write guest.sh");

    let mut qemu = Command::new("bash")
        .arg(workspace_root().join("tests/vm/run-guest.sh"))
        .arg(&scratch)
        .env("NFS_PORT", port.to_string())
        .env("NFS_PORT2", plain_served.port().to_string())
        .env("NFS_PORT3", nas_served.port().to_string())
        .env("NFS_PORT4", full_fail.port().to_string())
        .env("NFS_PORT5", full_read.port().to_string())
        .env("NFS_PORT6", slow_served.port().to_string())
        .env("NFS_PORT7", slow_root_served.port().to_string())
        .env("NFS_PORT8", offline.port.to_string())
        .env("HUB_PORT", &hub_port)
        .env("GUEST_TIMEOUT", GUEST_LIMIT.as_secs().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("starting tests/vm/run-guest.sh: {e}"))?;

    // The fault group's dialogue, until the guest powers off.
    let mut host_did = Vec::new();
    let deadline = Instant::now() + GUEST_LIMIT + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = qemu.try_wait().expect("wait for qemu") {
            break Some(status);
        }
        if Instant::now() > deadline {
            // run-guest.sh, its timeout and qemu: the process group it leads.
            // SAFETY: kill(2) on the group of our own child.
            unsafe { libc::kill(-(qemu.id() as i32), libc::SIGKILL) };
            let _ = qemu.wait();
            break None;
        }
        for step in ["kill", "restart", "kill2"] {
            let asked = scratch.join(format!("fault-{step}"));
            let done = scratch.join(format!("fault-{step}-done"));
            if !asked.exists() || done.exists() {
                continue;
            }
            let what = match step {
                "restart" => {
                    let listen = format!("127.0.0.1:{port}");
                    match Served::try_start(&hf.root, &s.cache, &["--listen", &listen]) {
                        Ok(again) => {
                            served = again;
                            format!("restarted on {listen}")
                        }
                        Err(e) => format!("could not restart on {listen}: {e}"),
                    }
                }
                _ => {
                    served.kill();
                    "killed the server (SIGKILL)".to_string()
                }
            };
            host_did.push(format!(
                "{:.1} s: {step}: {what}",
                started.elapsed().as_secs_f64()
            ));
            fs::write(&done, &what).expect("answer the guest");
        }
        for step in [
            "nas-cut",
            "nas-restore",
            "nas-drop",
            "nas-underneath",
            "nas-kill",
            "nas-back",
        ] {
            let asked = scratch.join(format!("fault-{step}"));
            let done = scratch.join(format!("fault-{step}-done"));
            if !asked.exists() || done.exists() {
                continue;
            }
            let answer = nas_step(step, &nas, &nas_export);
            host_did.push(format!("{:.1} s: {step}", started.elapsed().as_secs_f64()));
            fs::write(&done, answer).expect("answer the guest");
        }
        for step in [
            "offline-prefetch",
            "offline-cut",
            "offline-restore",
            "offline-kill",
            "offline-drop",
            "offline-drop-back",
            "offline-kill-back",
            "offline-restart-away",
            "offline-restart-back",
        ] {
            let asked = scratch.join(format!("fault-{step}"));
            let done = scratch.join(format!("fault-{step}-done"));
            if !asked.exists() || done.exists() {
                continue;
            }
            // A step that failed (a netfs.sh step panics) is the guest's to report.
            let answer =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| offline.step(step)))
                    .unwrap_or_else(|_| {
                        json!({"error": format!("the host's {step} failed")}).to_string()
                    });
            host_did.push(format!("{:.1} s: {step}", started.elapsed().as_secs_f64()));
            fs::write(&done, answer).expect("answer the guest");
        }
        for step in ["slow-on", "slow-off"] {
            let asked = scratch.join(format!("fault-{step}"));
            let done = scratch.join(format!("fault-{step}-done"));
            if !asked.exists() || done.exists() {
                continue;
            }
            let answer = slow_step(step, &slow_delay, &slow_nas.mnt);
            host_did.push(format!(
                "{:.1} s: {step}: {answer}",
                started.elapsed().as_secs_f64()
            ));
            fs::write(&done, answer).expect("answer the guest");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut qemu_err = String::new();
    if let Some(mut err) = qemu.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut err, &mut qemu_err);
    }
    drop(served);
    drop(plain_served);
    drop(nas_served);
    drop(nas);
    drop(full_fail);
    drop(full_read);
    drop(slow_served);
    drop(slow_root_served);
    drop(slow_nas);
    drop(offline);
    drop(hub);

    let read = |name: &str| fs::read_to_string(scratch.join(name)).unwrap_or_default();
    let mut results: BTreeMap<String, Value> =
        serde_json::from_str(&read("results.json")).unwrap_or_default();
    // The save group's model, written through the guest's mount: loaded here, on the
    // host, from the source itself.
    if results.contains_key("save_pretrained_over_a_loaded_model_reads_back_new") {
        let saved = plain.root.join("models/acme/saved");
        let loaded = As::Root.client(HUB_CLIENT, "load-folder", &saved, &[]);
        let ok = loaded.as_ref().is_ok_and(|v| v["tensors_match"] == true);
        results.insert(
            "the_saved_model_loads_on_the_host_from_the_source".to_string(),
            json!({
                "group": "save",
                "ok": ok,
                "skipped": false,
                "seconds": 0,
                "detail": match loaded {
                    Ok(v) => format!("load-folder {}: {v}", saved.display()),
                    Err(e) => format!("load-folder {}: {e}", saved.display()),
                },
            }),
        );
    }
    let ended = format!(
        "run-guest.sh: {}{}; guest.sh exit: {}; host: [{}]",
        status.map_or("killed past the limit".to_string(), |s| s.to_string()),
        if qemu_err.trim().is_empty() {
            String::new()
        } else {
            format!(" ({})", qemu_err.trim())
        },
        read("guest-exit").trim(),
        host_did.join("; ")
    );
    let run = Run {
        results,
        checks_log: read("checks.log"),
        console: read("console.log"),
        dmesg: read("dmesg.txt"),
        ended,
        took: started.elapsed(),
    };
    println!(
        "kernel NFS guest: {:.1} s in all; {}\n{}",
        run.took.as_secs_f64(),
        run.ended,
        run.checks_log.trim()
    );
    if std::env::var_os("STAGEFS_KEEP_GUEST").is_some() {
        println!("kept {}", s.dir.keep().display());
    }
    Ok(run)
}

/// What the host does for a step of the nas group; the answer the guest reads.
fn nas_step(step: &str, nas: &NetFs, export: &Path) -> String {
    match step {
        "nas-cut" => nas.cut(),
        "nas-restore" => nas.restore(),
        "nas-drop" => nas.drop_connection(),
        // What is under the NAS's mount point, as JSON: nothing may have been written.
        "nas-underneath" => {
            let names: Vec<String> = fs::read_dir(&nas.mnt)
                .map(|d| {
                    d.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_else(|e| vec![format!("(could not list: {e})")]);
            return serde_json::to_string(&names).expect("json");
        }
        "nas-kill" => {
            nas.mount_again();
            nas.kill_sshfs();
        }
        _ => {
            nas.mount_again();
            fs::write(export.join("added-later.txt"), b"new on the nas").expect("write");
        }
    }
    step.to_string()
}

/// The offline group's NAS and the `stagefs serve` of it, which the host restarts
/// with the NAS away.
struct Offline {
    // Dropped in this order: the server, then the NAS under it.
    served: Option<Served>,
    nas: NetFs,
    /// The NAS's export directory (the HF_HOME).
    home: PathBuf,
    /// The model as made, whose weights every load is compared with.
    made: PathBuf,
    cache: PathBuf,
    port: u16,
    /// Files added to the NAS each time it comes back, to see it served again.
    backs: usize,
}

impl Offline {
    fn start(scratch: &Path, nas_place: &Path) -> Result<Offline, String> {
        let made = scratch.join("offline-made");
        let home = scratch.join("offline-home");
        llama_in_hf_home(&made, &home, &OFFLINE_SEED.to_string());
        // The same model under another id: its links are relative.
        let repo_dir = |id: &str| {
            home.join("hub")
                .join(format!("models--{}", id.replace('/', "--")))
        };
        let copied = Command::new("cp")
            .arg("-a")
            .arg(repo_dir(REPO))
            .arg(repo_dir(OFFLINE_PREFETCHED))
            .status()
            .map_err(|e| format!("cp: {e}"))?;
        if !copied.success() {
            return Err(format!("cp -a of {REPO}'s cache failed"));
        }
        for folder in [
            OFFLINE_FOLDER,
            OFFLINE_PREFETCHED_FOLDER,
            OFFLINE_NEVER_FOLDER,
        ] {
            let folder = home.join(folder);
            fs::create_dir_all(&folder).map_err(|e| format!("mkdir: {e}"))?;
            for entry in fs::read_dir(&made).expect("ls").flatten() {
                fs::copy(entry.path(), folder.join(entry.file_name())).expect("copy");
            }
        }
        let nas = NetFs::up(&home, &nas_place.join("offline-nas"), "200mbit");
        let cache = scratch.join("cache-offline");
        let served = Served::try_start(&nas.mnt, &cache, &["--source-timeout", OFFLINE_TIMEOUT])?;
        Ok(Offline {
            port: served.port(),
            served: Some(served),
            nas,
            home,
            made,
            cache,
            backs: 0,
        })
    }

    /// What the host does for a step of the offline group; the answer the guest reads.
    fn step(&mut self, step: &str) -> String {
        match step {
            "offline-prefetch" => self.prefetch(),
            "offline-cut" => {
                self.nas.cut();
                step.to_string()
            }
            "offline-kill" => {
                self.nas.kill_sshfs();
                step.to_string()
            }
            "offline-drop" => {
                self.nas.drop_connection();
                step.to_string()
            }
            "offline-restore" => {
                self.nas.restore();
                self.add_a_file()
            }
            "offline-restart-away" => self.restart_away(),
            // offline-drop-back, offline-kill-back, offline-restart-back
            _ => {
                self.nas.mount_again();
                self.add_a_file()
            }
        }
    }

    /// `stagefs prefetch` of the model and folder the guest never read, through the
    /// server's control socket, and what status says of every model being ready
    /// offline, as JSON. The folder is named by its id (its path in the source):
    /// a path in the source directory is refused through `stagefs serve`.
    fn prefetch(&self) -> String {
        let (ok, out, err) = run_stagefs(&[
            &"prefetch",
            &OFFLINE_PREFETCHED,
            &OFFLINE_PREFETCHED_FOLDER,
            &"--cache-dir",
            &self.cache,
        ]);
        let (_, status, _) = run_stagefs(&[&"status", &"--json", &"--cache-dir", &self.cache]);
        let status: Value = serde_json::from_str(&status).unwrap_or_default();
        let offline: BTreeMap<String, Value> = status["mounts"][0]["models"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                (
                    m["model"].as_str().unwrap_or_default().to_string(),
                    m["offline"].clone(),
                )
            })
            .collect();
        json!({"ok": ok, "said": format!("{out}{err}"), "offline": offline}).to_string()
    }

    /// A file added to the NAS, whose name the guest reads through the export once
    /// the server serves the NAS again.
    fn add_a_file(&mut self) -> String {
        self.backs += 1;
        let name = format!("back-{}.txt", self.backs);
        fs::write(self.home.join(&name), b"back").expect("write");
        name
    }

    /// The NAS away (sshfs killed), the server stopped and started again on its port
    /// with the same cache, as a laptop restarted away from its NAS; what status
    /// says of the source then, as JSON.
    fn restart_away(&mut self) -> String {
        self.nas.kill_sshfs();
        if let Some(served) = self.served.take() {
            served.stop();
        }
        let listen = format!("127.0.0.1:{}", self.port);
        let flags = ["--source-timeout", OFFLINE_TIMEOUT, "--listen", &listen];
        match Served::try_start(&self.nas.mnt, &self.cache, &flags) {
            Ok(again) => {
                self.served = Some(again);
                let (_, status, _) =
                    run_stagefs(&[&"status", &"--json", &"--cache-dir", &self.cache]);
                let status: Value = serde_json::from_str(&status).unwrap_or_default();
                json!({"restarted": listen, "source_health": status["mounts"][0]["source_health"]})
                    .to_string()
            }
            Err(e) => json!({"error": e}).to_string(),
        }
    }
}

/// What the host does for a step of the slow group: every sftp call to the slow NAS
/// held [`SLOW_CALL`] from now on ("slow-on"), or no longer. After slow-on a thread
/// times a stat of a name never asked before on the host's sshfs mount and leaves
/// it, as JSON, in `fault-slow-on-stat` (the guest checks that the NAS is slow
/// indeed, without waiting for it first).
fn slow_step(step: &str, delay_file: &Path, mnt: &Path) -> String {
    if step != "slow-on" {
        let _ = fs::remove_file(delay_file);
        return step.to_string();
    }
    fs::write(delay_file, SLOW_CALL.as_secs().to_string()).expect("write the delay");
    let (mnt, out) = (
        mnt.to_path_buf(),
        delay_file.with_file_name("fault-slow-on-stat"),
    );
    std::thread::spawn(move || {
        let started = Instant::now();
        let _ = fs::metadata(mnt.join("never-there"));
        let took = json!({"stat_s": started.elapsed().as_secs_f64()});
        let _ = fs::write(out, took.to_string());
    });
    step.to_string()
}

/// `count` small files in `dir`, named `prefix-NNNNN`.
fn fill_dir(dir: &Path, count: usize, prefix: &str) {
    fs::create_dir_all(dir).expect("mkdir");
    for n in 0..count {
        fs::write(dir.join(format!("{prefix}-{n:05}")), n.to_string()).expect("write");
    }
}

/// The guest's script: mounts both exports as `mount -t nfs` does without a helper
/// (`-i`: never a mount.nfs; the kernel gets the text options, `addr=` among them),
/// with stagefs's own Linux options, and runs the checks.
/// The links group's part of the spec: the ordinary user who serves and reads (its
/// ids, and how it starts Python) and the guest-local directory it all happens in.
fn links_spec(area: &Scratch, scratch: &Path) -> Value {
    let user = area.user();
    let (python, pythonpath) = user.python_parts();
    json!({
        // Two revisions of one model, made here: numpy under TCG takes a while.
        "a": links_model(&scratch.join("links-made-a"), 1),
        "b": links_model(&scratch.join("links-made-b"), 2),
        "root": "/tmp/links",
        "user": user.name,
        "uid": user.uid,
        "gid": user.gid,
        "python": python,
        "pythonpath": pythonpath,
        "client": workspace_root().join("tests/py/links_client.py"),
        "hub_server": workspace_root().join("tests/py/hub_server.py"),
        // Rounds of cold loads with and without links (`STAGEFS_LINKS_COLD_ROUNDS`,
        // for the benchmark; one pair otherwise).
        "cold_rounds": std::env::var("STAGEFS_LINKS_COLD_ROUNDS")
            .ok()
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(1),
    })
}

/// A model of four shards made by tests/py/links_client.py in `dir`: its files'
/// sha256s and its tensors' digests, as that script's `make` and `mmap` give them.
fn links_model(dir: &Path, seed: u32) -> Value {
    let client = workspace_root().join("tests/py/links_client.py");
    let run = |args: &[&str]| -> Value {
        let out = Command::new(stagefs_tests::python())
            .arg(&client)
            .args(args)
            .output()
            .expect("running links_client.py");
        assert!(out.status.success(), "links_client.py {args:?}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(text.lines().last().unwrap_or_default()).expect("its JSON line")
    };
    let dir_text = dir.to_str().expect("a UTF-8 scratch path");
    let mut made = run(&["make", dir_text, &seed.to_string()]);
    made["tensors"] = run(&["mmap", dir_text])["tensors"].clone();
    made["dir"] = json!(dir);
    made
}

fn guest_script(scratch: &Path) -> String {
    let python = workspace_root().join(".venv/bin/python");
    let checks = workspace_root().join("tests/py/guest_checks.py");
    let scratch = scratch.display();
    format!(
        r#"set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp/home LANG=C.UTF-8
mkdir -p "$HOME" {HF_MNT} {PLAIN_MNT} {NAS_MNT} {FULL_FAIL_MNT} {FULL_READ_MNT} {SLOW_MNT} {SLOW_ROOT_MNT} {OFFLINE_MNT}
cd /tmp
opts=vers=3,tcp,port=2049,mountport=2049,rsize=1048576,wsize=1048576,actimeo=1,hard,local_lock=all,mountproto=tcp
for m in "10.0.2.100 {HF_MNT}" "10.0.2.102 {PLAIN_MNT}" "10.0.2.103 {NAS_MNT}" \
    "10.0.2.104 {FULL_FAIL_MNT}" "10.0.2.105 {FULL_READ_MNT}" "10.0.2.106 {SLOW_MNT}" \
    "10.0.2.108 {OFFLINE_MNT}"; do
    set -- $m
    t0=$(date +%s%N)
    timeout -k 5 60 mount -i -t nfs -o "$opts,addr=$1" "$1:/" "$2" || echo "guest: mount $1:/ $2 failed: $?"
    echo "guest: mounted $1:/ at $2 in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
done
timeout -k 10 {limit} {python} -u {checks} {scratch}/spec.json {groups} 2>&1 | tee {scratch}/checks.log
echo "guest: guest_checks.py exited ${{PIPESTATUS[0]}}"
"#,
        limit = GUEST_LIMIT.as_secs() - 40,
        python = python.display(),
        checks = checks.display(),
        groups = std::env::var("STAGEFS_GUEST_GROUPS")
            .unwrap_or_default()
            .split(|c: char| !c.is_ascii_lowercase())
            .filter(|g| !g.is_empty())
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// Asserts that the guest ran to the end and every check of `group` passed.
#[track_caller]
fn assert_group(group: &str) {
    let run = match &*RUN {
        Ok(run) => run,
        Err(e) => panic!("{e}"),
    };
    let mine: Vec<(&String, &Value)> = run
        .results
        .iter()
        .filter(|(_, r)| r["group"] == group)
        .collect();
    let finished = run.checks_log.lines().any(|l| l.contains(" passed, "));
    let failed: Vec<String> = mine
        .iter()
        // A check skipped did not pass: it says why (no mlx, no Hub, turned off).
        .filter(|(_, r)| r["ok"] != true || r["skipped"] == true)
        .map(|(name, r)| {
            format!(
                "FAIL {name}: {}{}",
                r["detail"].as_str().unwrap_or_default(),
                r.get("errno")
                    .map(|e| format!(" [{e}]"))
                    .unwrap_or_default()
            )
        })
        .collect();
    for (name, r) in &mine {
        let verdict = match (r["ok"] == true, r["skipped"] == true) {
            (true, true) => "SKIP",
            (true, false) => "PASS",
            _ => "FAIL",
        };
        println!(
            "{verdict} {name} ({} s): {}",
            r["seconds"],
            r["detail"].as_str().unwrap_or_default()
        );
    }
    if finished && !mine.is_empty() && failed.is_empty() {
        return;
    }
    panic!(
        "the guest's {group} checks: {}\n{}\n\n{}\nguest run {:.1} s\n--- checks.log (tail)\n{}\n--- console.log (tail)\n{}\n--- dmesg (tail)\n{}",
        if mine.is_empty() {
            "none ran".to_string()
        } else {
            format!("{} failed of {}", failed.len(), mine.len())
        },
        if finished {
            ""
        } else {
            "guest_checks.py did not run to the end"
        },
        failed.join("\n"),
        run.took.as_secs_f64(),
        tail(&run.checks_log, 30),
        tail(&run.console, 40),
        tail(&run.dmesg, 30),
    );
}

#[test]
fn the_kernel_mounts_both_exports_without_complaint() {
    assert_group("mount");
}

#[test]
fn shards_read_through_the_kernel_nfs_client_are_the_sources() {
    assert_group("read");
}

#[test]
fn writes_through_the_kernel_nfs_client_are_coherent() {
    assert_group("write");
}

#[test]
fn posix_operations_and_random_io_through_the_kernel_nfs_client() {
    assert_group("posix");
}

#[test]
fn hf_download_into_a_kernel_mounted_hf_home() {
    assert_group("hub");
}

#[test]
fn mlx_lm_loads_through_the_kernel_nfs_client() {
    assert_group("mlx");
}

#[test]
fn stagefs_mount_with_the_nfs_backend_in_the_guest() {
    assert_group("own");
}

#[test]
fn doctor_with_the_nfs_backend_does_not_require_fuse() {
    assert_group("doctor");
}

#[test]
fn a_nas_unmounted_underneath_or_killed_keeps_serving_staged_models_over_nfs() {
    assert_group("nas");
}

#[test]
fn models_loaded_or_prefetched_load_through_the_kernel_nfs_client_with_the_nas_away() {
    assert_group("offline");
}

#[test]
fn warm_loads_through_nfs_links_send_no_read_and_evictions_never_fail_a_reader() {
    assert_group("links");
}

#[test]
fn a_shard_larger_than_the_cache_fails_with_enospc_or_reads_from_the_source() {
    assert_group("full");
}

#[test]
fn a_long_copy_and_a_slow_source_root_are_waited_out_through_jukebox() {
    assert_group("slow");
}

#[test]
fn a_model_saved_over_a_loaded_one_through_the_mount_loads_new() {
    assert_group("save");
}

#[test]
fn a_killed_server_blocks_reads_until_it_returns_and_umount_f_frees_them() {
    assert_group("fault");
}

#[test]
fn the_guest_run_stays_within_its_bound() {
    let run = match &*RUN {
        Ok(run) => run,
        Err(e) => panic!("{e}"),
    };
    println!("{}", run.ended);
    assert!(
        run.took < GUEST_LIMIT + Duration::from_secs(60),
        "the guest run took {:.1} s",
        run.took.as_secs_f64()
    );
    assert!(
        run.ended.contains("guest.sh exit: 0"),
        "{}\n{}",
        run.ended,
        tail(&run.console, 40)
    );
}
