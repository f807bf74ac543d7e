//! Harness for the integration tests: generates HuggingFace caches, runs real
//! `stagefs mount` processes (unmounted when dropped), talks to their control socket,
//! and brings up a bandwidth-capped sshfs source in a private network namespace.
//!
//! The tests need the `stagefs` binary built first (`cargo build -p stagefs`), root
//! (for FUSE and network namespaces), and for the Python client tests a venv at
//! `.venv` with huggingface_hub, safetensors and numpy (`.ci/run` sets all of it up).

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use stagefs_cache::MetricsSnapshot;
use stagefs_cache::control::{self, Request, Response};
use tempfile::TempDir;

/// Root of the workspace.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The `stagefs` binary: `$STAGEFS_BIN`, or the one built next to this test binary.
pub fn stagefs_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("STAGEFS_BIN") {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().expect("current test executable");
    // target/<profile>/deps/<test> -> target/<profile>/stagefs
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("stagefs"))
        .expect("target directory");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p stagefs` before the tests",
        bin.display()
    );
    bin
}

/// The Python interpreter with huggingface_hub, safetensors and numpy.
pub fn python() -> PathBuf {
    let python = std::env::var_os("STAGEFS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin/python"));
    assert!(
        python.exists(),
        "{} is missing: create it with `python3 -m venv .venv && .venv/bin/pip install -r tests/requirements.txt`",
        python.display()
    );
    python
}

/// One file of a generated snapshot.
#[derive(Debug, Clone)]
pub struct ModelFile {
    /// Name inside the snapshot.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
}

/// A generated model in a hub directory.
#[derive(Debug, Clone)]
pub struct Model {
    /// Repository id, `org/name`.
    pub repo: String,
    /// Commit that `refs/main` names.
    pub commit: String,
    /// Snapshot directory relative to the hub directory.
    pub snapshot_rel: PathBuf,
    /// The snapshot's files.
    pub files: Vec<ModelFile>,
}

impl Model {
    /// Relative paths of the weight shards.
    pub fn shards(&self) -> Vec<PathBuf> {
        self.files
            .iter()
            .filter(|f| f.name.ends_with(".safetensors"))
            .map(|f| self.snapshot_rel.join(&f.name))
            .collect()
    }

    /// Relative path of the blob a snapshot file links to.
    pub fn blob_of(&self, hub: &Path, name: &str) -> PathBuf {
        let link = fs::read_link(hub.join(&self.snapshot_rel).join(name)).expect("snapshot link");
        let blob = link.file_name().expect("blob name");
        let repo_dir = self
            .snapshot_rel
            .parent()
            .and_then(Path::parent)
            .expect("repo dir");
        repo_dir.join("blobs").join(blob)
    }
}

/// Writes a synthetic HF cache with `shards` shards of `shard_size` bytes into `hub`.
pub fn generate(hub: &Path, repo: &str, shards: usize, shard_size: &str) -> Model {
    let out = Command::new(stagefs_bin())
        .args(["gen-demo", "--repo", repo, "--shards", &shards.to_string()])
        .args(["--shard-size", shard_size])
        .arg(hub)
        .output()
        .expect("running stagefs gen-demo");
    assert!(
        out.status.success(),
        "gen-demo failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("gen-demo prints JSON");
    let snapshot = PathBuf::from(v["snapshot"].as_str().expect("snapshot"));
    Model {
        repo: repo.to_string(),
        commit: v["commit"].as_str().expect("commit").to_string(),
        snapshot_rel: snapshot
            .strip_prefix(hub)
            .expect("snapshot in hub")
            .to_path_buf(),
        files: v["files"]
            .as_array()
            .expect("files")
            .iter()
            .map(|f| ModelFile {
                name: f["name"].as_str().expect("name").to_string(),
                size: f["size"].as_u64().expect("size"),
            })
            .collect(),
    }
}

/// A scratch area with `hub/` (the source), `mnt/` and `cache/`.
pub struct Scratch {
    /// Keeps the directory alive.
    pub dir: TempDir,
    /// The source hub directory.
    pub hub: PathBuf,
    /// The mount point.
    pub mnt: PathBuf,
    /// The cache directory.
    pub cache: PathBuf,
}

impl Scratch {
    /// Creates the directories; `hub/` starts empty.
    pub fn new() -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix("stagefs-it-")
            .tempdir()
            .expect("tempdir");
        let hub = dir.path().join("hub");
        let mnt = dir.path().join("mnt");
        let cache = dir.path().join("cache");
        for d in [&hub, &mnt] {
            fs::create_dir_all(d).expect("mkdir");
        }
        Scratch {
            dir,
            hub,
            mnt,
            cache,
        }
    }

    /// Mounts `hub` at `mnt` with `extra` flags.
    pub fn mount(&self, extra: &[&str]) -> Mount {
        Mount::start(&self.hub, &self.mnt, &self.cache, extra)
    }
}

impl Default for Scratch {
    fn default() -> Self {
        Self::new()
    }
}

/// A running `stagefs mount --foreground`, unmounted and reaped when dropped.
pub struct Mount {
    child: Option<Child>,
    /// The mount point.
    pub mnt: PathBuf,
    /// The cache directory.
    pub cache: PathBuf,
    /// The daemon's stderr (its log).
    pub log: PathBuf,
}

static LOG_SEQ: AtomicU32 = AtomicU32::new(0);

impl Mount {
    /// Starts the daemon and waits until the mount is live.
    pub fn start(source: &Path, mnt: &Path, cache: &Path, extra: &[&str]) -> Mount {
        let log = cache.with_file_name(format!(
            "daemon-{}.log",
            LOG_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let mut child = Command::new(stagefs_bin())
            .arg("mount")
            .arg(source)
            .arg(mnt)
            .arg("--cache-dir")
            .arg(cache)
            .args(["--foreground", "--notify-ready"])
            .args(extra)
            .env("RUST_LOG", "info,fuser=error")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("starting stagefs mount");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("reading readiness");
        if line.trim() != "ready" {
            let _ = child.wait();
            panic!(
                "mount did not come up: {line}\n{}",
                fs::read_to_string(&log).unwrap_or_default()
            );
        }
        Mount {
            child: Some(child),
            mnt: mnt.to_path_buf(),
            cache: cache.to_path_buf(),
            log,
        }
    }

    /// The daemon's counters, from its control socket.
    pub fn metrics(&self) -> MetricsSnapshot {
        let socket = control::socket_path(&self.cache);
        match control::query(&socket, &Request::Stats).expect("control socket") {
            Response::Stats { metrics, .. } => metrics,
            other => panic!("unexpected control answer {other:?}"),
        }
    }

    /// Copies in progress, from the control socket.
    pub fn in_flight(&self) -> Vec<stagefs_cache::InFlight> {
        let socket = control::socket_path(&self.cache);
        match control::query(&socket, &Request::Stats).expect("control socket") {
            Response::Stats { in_flight, .. } => in_flight,
            other => panic!("unexpected control answer {other:?}"),
        }
    }

    /// Whether source file `rel` is being copied and bytes have started to arrive.
    pub fn copying(&self, rel: &Path) -> bool {
        self.in_flight().iter().any(|f| f.path == rel && f.read > 0)
    }

    /// Everything the daemon logged so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Path of `rel` inside the mount.
    pub fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Runs `f` against the mount, then unmounts.
    pub fn unmount_after(self, f: impl FnOnce(&Mount)) {
        f(&self);
        self.unmount();
    }

    /// Unmounts with `stagefs unmount` and waits for the daemon to exit.
    pub fn unmount(mut self) {
        self.shutdown();
    }

    /// Kills the daemon with SIGKILL, as a crash would, leaving a dead mount behind.
    pub fn kill_daemon(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn shutdown(&mut self) {
        let status = Command::new(stagefs_bin())
            .arg("unmount")
            .arg(&self.mnt)
            .stderr(Stdio::null())
            .status();
        if !status.is_ok_and(|s| s.success()) {
            let _ = Command::new(stagefs_bin())
                .args(["unmount", "--lazy"])
                .arg(&self.mnt)
                .stderr(Stdio::null())
                .status();
        }
        let Some(mut child) = self.child.take() else {
            return;
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Whether `path` is a mount point in this process's mount table.
pub fn is_mounted(path: &Path) -> bool {
    let mounts = fs::read_to_string("/proc/self/mounts").expect("mounts");
    let path = path.to_string_lossy();
    mounts
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(path.as_ref()))
}

/// Runs tests/py/hf_offline_check.py with the hub cache at `mnt`: huggingface_hub
/// resolves `model` offline and safetensors reads every tensor, compared with the
/// same files under `source_hub`. `hf_home` keeps the client away from the real home.
pub fn hf_offline_check(mnt: &Path, model: &Model, source_hub: &Path, hf_home: &Path) -> Command {
    let mut command = Command::new(python());
    command
        .arg(workspace_root().join("tests/py/hf_offline_check.py"))
        .args([&model.repo, &model.commit])
        .arg(source_hub)
        .env("HF_HUB_CACHE", mnt)
        .env("HF_HOME", hf_home)
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HUB_DISABLE_TELEMETRY", "1");
    command
}

/// Runs `stagefs ARGS...`, returning (success, stdout, stderr).
pub fn run_stagefs(args: &[&dyn AsRef<std::ffi::OsStr>]) -> (bool, String, String) {
    let out = Command::new(stagefs_bin())
        .args(args.iter().map(|a| a.as_ref()))
        .output()
        .expect("running stagefs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `stagefs status --json` for `cache`.
pub fn status_json(cache: &Path) -> Value {
    let (ok, out, err) = run_stagefs(&[&"status", &"--json", &"--cache-dir", &cache]);
    assert!(ok, "status failed: {err}");
    serde_json::from_str(&out).expect("status JSON")
}

/// Polls `done` until it holds; a minute without it fails the test rather than hang.
pub fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The temp files of copies in progress in a cache directory.
pub fn temp_files(cache: &Path) -> Vec<PathBuf> {
    fs::read_dir(cache.join("v1/tmp"))
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// The staged data files of at least `bytes` in a cache directory: the weight
/// copies, without the copies of small files kept for when the source is away.
pub fn staged_files_of_at_least(cache: &Path, bytes: u64) -> Vec<PathBuf> {
    staged_files(cache)
        .into_iter()
        .filter(|f| fs::metadata(f).is_ok_and(|m| m.len() >= bytes))
        .collect()
}

/// The staged data files in a cache directory.
pub fn staged_files(cache: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(cache.join("v1/data"))
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files
}

static NETFS_SEQ: AtomicU32 = AtomicU32::new(0);

/// A directory served over sshfs from a private network namespace, capped at `rate`.
pub struct NetFs {
    id: u32,
    /// Where the network filesystem is mounted on the host.
    pub mnt: PathBuf,
}

impl NetFs {
    /// Exports `dir` over sshfs at `mnt`, capped at `rate` (e.g. "40mbit").
    pub fn up(dir: &Path, mnt: &Path, rate: &str) -> NetFs {
        Self::up_with(dir, mnt, rate, "")
    }

    /// Like [`NetFs::up`], with extra sshfs options (e.g. "cache=no").
    pub fn up_with(dir: &Path, mnt: &Path, rate: &str, sshfs_options: &str) -> NetFs {
        // Unique per process and per call, within 1..=250.
        let id = (std::process::id() * 7 + NETFS_SEQ.fetch_add(1, Ordering::Relaxed)) % 250 + 1;
        let script = workspace_root().join("tests/scripts/netfs.sh");
        let out = Command::new("bash")
            .arg(&script)
            .args(["up", &id.to_string()])
            .arg(dir)
            .arg(mnt)
            .arg(rate)
            .env("SSHFS_EXTRA_OPTS", sshfs_options)
            .output()
            .expect("running netfs.sh");
        assert!(
            out.status.success(),
            "netfs.sh up failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        NetFs {
            id,
            mnt: mnt.to_path_buf(),
        }
    }
}

impl NetFs {
    /// Takes the link down: requests to the server hang, as when a NAS goes away.
    pub fn cut(&self) {
        self.script(&["cut"]);
    }

    /// Brings the link back.
    pub fn restore(&self) {
        self.script(&["restore"]);
    }

    fn script(&self, args: &[&str]) {
        let status = Command::new("bash")
            .arg(workspace_root().join("tests/scripts/netfs.sh"))
            .arg(args[0])
            .arg(self.id.to_string())
            .args(&args[1..])
            .status()
            .expect("running netfs.sh");
        assert!(status.success(), "netfs.sh {args:?} failed");
    }
}

impl Drop for NetFs {
    fn drop(&mut self) {
        // Unstick anything waiting on a cut link before tearing down.
        let _ = Command::new("bash")
            .arg(workspace_root().join("tests/scripts/netfs.sh"))
            .args(["restore", &self.id.to_string()])
            .status();
        let script = workspace_root().join("tests/scripts/netfs.sh");
        let _ = Command::new("bash")
            .arg(&script)
            .args(["down", &self.id.to_string()])
            .arg(&self.mnt)
            .status();
    }
}

/// A tmpfs mounted for one test, unmounted (lazily) even if the test fails.
pub struct Tmpfs(pub PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs with `options` (e.g. "size=40m,ro") on `dir`, creating it.
    pub fn mount(dir: &Path, options: &str) -> Tmpfs {
        fs::create_dir_all(dir).expect("mkdir");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|st| st.success());
        assert!(ok, "mounting a tmpfs needs root");
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

// ---------------------------------------------------------------------------------
// Source shapes (issue #10): the same model laid out as an HF_HOME, as a hub cache,
// or as a plain model folder, for the tests in tests/shapes.rs.
// ---------------------------------------------------------------------------------

/// How a source keeps its models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// An `HF_HOME`: `hub/models--org--name`, a `token` and `xet/` beside it.
    HfHome,
    /// A hub cache: `models--org--name` at the root.
    HubCache,
    /// A folder of plain model folders: `models/org/name/{config.json, *.safetensors}`.
    PlainFolder,
}

/// The token written into a generated HF_HOME.
pub const HF_HOME_TOKEN: &str = "hf_stagefs_test_token";

/// A generated source holding one sharded model in a given layout.
#[derive(Debug, Clone)]
pub struct ShapedSource {
    /// How it is laid out.
    pub layout: Layout,
    /// The source directory to mount.
    pub root: PathBuf,
    /// The model, as generated (for the HF layouts, as it sits in the hub directory).
    pub model: Model,
    /// The directory holding the model's files as loaders see them, relative to the
    /// root: the snapshot for the HF layouts, the folder for a plain folder.
    pub model_dir: PathBuf,
}

impl ShapedSource {
    /// Writes `repo` with `shards` shards of `shard_size` into a new directory `name`
    /// in the scratch area, laid out as `layout`.
    pub fn generate(
        s: &Scratch,
        layout: Layout,
        repo: &str,
        shards: usize,
        shard_size: &str,
    ) -> ShapedSource {
        let root = s.dir.path().join(match layout {
            Layout::HfHome => "hf-home",
            Layout::HubCache => "hub-cache",
            Layout::PlainFolder => "model-folders",
        });
        let (model, model_dir) = match layout {
            Layout::HfHome => {
                let model = generate(&root.join("hub"), repo, shards, shard_size);
                fs::write(root.join("token"), HF_HOME_TOKEN).expect("token");
                fs::create_dir_all(root.join("xet/chunk-cache")).expect("xet");
                let dir = Path::new("hub").join(&model.snapshot_rel);
                (model, dir)
            }
            Layout::HubCache => {
                let model = generate(&root, repo, shards, shard_size);
                let dir = model.snapshot_rel.clone();
                (model, dir)
            }
            Layout::PlainFolder => {
                // The bytes of an HF snapshot, as regular files in models/org/name.
                let staging = s.dir.path().join("folder-staging");
                let model = generate(&staging, repo, shards, shard_size);
                let dir = Path::new("models").join(repo);
                fs::create_dir_all(root.join(&dir)).expect("mkdir");
                for file in &model.files {
                    fs::copy(
                        staging.join(&model.snapshot_rel).join(&file.name),
                        root.join(&dir).join(&file.name),
                    )
                    .expect("copy into the folder");
                }
                (model, dir)
            }
        };
        ShapedSource {
            layout,
            root,
            model,
            model_dir,
        }
    }

    /// The path of model file `name` relative to the source root, as a loader opens it.
    pub fn file(&self, name: &str) -> PathBuf {
        self.model_dir.join(name)
    }

    /// The shard file names, in shard order.
    pub fn shard_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .model
            .files
            .iter()
            .filter(|f| f.name.ends_with(".safetensors"))
            .map(|f| f.name.clone())
            .collect();
        names.sort();
        names
    }

    /// Where shard `name` is stored in the source, relative to the root: its blob for
    /// the HF layouts, the file itself for a folder. Copies are logged under this path.
    pub fn stored_path(&self, name: &str) -> PathBuf {
        match self.layout {
            Layout::HfHome => {
                Path::new("hub").join(self.model.blob_of(&self.root.join("hub"), name))
            }
            Layout::HubCache => self.model.blob_of(&self.root, name),
            Layout::PlainFolder => self.file(name),
        }
    }

    /// The bytes of model file `name` in the source.
    pub fn bytes(&self, name: &str) -> Vec<u8> {
        fs::read(self.root.join(self.file(name))).expect("source file")
    }

    /// The total size of the shards.
    pub fn shard_bytes(&self) -> u64 {
        self.model
            .files
            .iter()
            .filter(|f| f.name.ends_with(".safetensors"))
            .map(|f| f.size)
            .sum()
    }
}

/// The source paths the daemon logged starting to copy, in order.
pub fn staging_order(log: &str) -> Vec<PathBuf> {
    log.lines()
        .filter(|l| l.contains(" staging "))
        .filter_map(|l| l.split("path=").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(PathBuf::from)
        .collect()
}
