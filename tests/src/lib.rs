//! Harness for the integration tests: generates HuggingFace caches, runs real
//! `stagefs mount` processes (unmounted when dropped) or mounts in the test process
//! through the `stagefs_mount` library ([`LibMount`], for tests that need a mount but
//! not the binary), talks to their control socket, and brings up a bandwidth-capped
//! sshfs source in a private network namespace.
//!
//! The tests need the `stagefs` binary built first (`cargo build -p stagefs`), root
//! (for FUSE and network namespaces), and for the Python client tests a venv at
//! `.venv` with huggingface_hub, safetensors and numpy (`.ci/run` sets all of it up).
//! [`Scratch::for_user`] mounts as an ordinary user instead ([`TestUser`]), which the
//! harness creates (`useradd`) and lets use `/dev/fuse` (mode 0666).

use std::ffi::OsStr;
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use stagefs_control::{self as control, Request, Response};
use stagefs_mount::{MountError, MountSpec, Running};
use stagefs_stage::MetricsSnapshot;
use tempfile::TempDir;

pub mod hub;
mod served;

pub use served::Served;

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

/// The ordinary user the unprivileged tests mount and read as.
pub const TEST_USER: &str = "stagefs-it";

/// The ordinary (non-root) user [`TEST_USER`], as on a desktop: no capabilities, mounts
/// through the setuid `fusermount3`, reads its own mount. Its commands run with a clean
/// environment and `home` as HOME (and so as the root of its XDG directories).
#[derive(Debug, Clone)]
pub struct TestUser {
    /// Login name.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// HOME for its commands, owned by it.
    pub home: PathBuf,
}

/// The user's ids, once the machine is set up for it.
static TEST_USER_IDS: OnceLock<(u32, u32)> = OnceLock::new();

/// How the user starts a Python with huggingface_hub, safetensors and numpy.
static USER_PYTHON: OnceLock<(PathBuf, Option<PathBuf>)> = OnceLock::new();

impl TestUser {
    /// The user with `home` as HOME. The first call in a process sets the machine up,
    /// idempotently: creates the user with `useradd` if missing, makes `/dev/fuse`
    /// 0666 (as desktop distributions ship it), and checks that `fusermount3` is
    /// setuid and the user can run the `stagefs` binary.
    pub fn new(home: PathBuf) -> TestUser {
        let &(uid, gid) = TEST_USER_IDS.get_or_init(set_up_test_user);
        TestUser {
            name: TEST_USER.to_string(),
            uid,
            gid,
            home,
        }
    }

    /// `program` run as this user (`setpriv --reuid --regid --init-groups`, so with no
    /// capabilities), with only HOME, USER, LOGNAME, PATH and LANG set, in HOME. Add
    /// arguments and environment as usual.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new("setpriv");
        command
            .arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid))
            .arg("--init-groups")
            .arg("--")
            .arg(program)
            .env_clear()
            .env("HOME", &self.home)
            .env("USER", &self.name)
            .env("LOGNAME", &self.name)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("LANG", "C.UTF-8")
            .current_dir(&self.home);
        command
    }

    /// A Python with huggingface_hub, safetensors and numpy, run as this user: the
    /// venv's interpreter if the user can run it, else (the venv's interpreter lives
    /// under a home the user cannot enter, as with pyenv under /root) a system python3
    /// of the same version with the venv's packages on PYTHONPATH, or
    /// The Python [`TestUser::python`] runs, and the PYTHONPATH it needs (for a
    /// process that starts it as this user by other means: the NFS guest's).
    pub fn python_parts(&self) -> (PathBuf, Option<PathBuf>) {
        USER_PYTHON.get_or_init(|| find_user_python(self)).clone()
    }

    /// `$STAGEFS_USER_PYTHON`.
    pub fn python(&self) -> Command {
        let (program, pythonpath) = USER_PYTHON.get_or_init(|| find_user_python(self));
        let mut command = self.command(program);
        if let Some(pythonpath) = pythonpath {
            command.env("PYTHONPATH", pythonpath);
        }
        command
    }

    /// [`hf_offline_check`] run by this user.
    pub fn hf_offline_check(
        &self,
        mnt: &Path,
        model: &Model,
        source_hub: &Path,
        hf_home: &Path,
    ) -> Command {
        hf_offline_check_with(self.python(), mnt, model, source_hub, hf_home)
    }

    /// Runs `command` (made by [`TestUser::command`]) to completion, capturing output.
    pub fn output(&self, command: &mut Command) -> Output {
        command
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {command:?} as {}: {e}", self.name))
    }

    /// The sha256 (hex) of `path` as this user reads it (`sha256sum`), or the error.
    pub fn sha256(&self, path: &Path) -> Result<String, String> {
        let out = self.output(self.command("sha256sum").arg("--").arg(path));
        if out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout);
            Ok(text
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// The target of symlink `path` as this user sees it, or `None` if it is not one.
    pub fn readlink(&self, path: &Path) -> Option<PathBuf> {
        let out = self.output(self.command("readlink").arg("--").arg(path));
        out.status
            .success()
            .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim_end_matches('\n')))
    }

    /// Gives `path` to this user.
    pub fn chown(&self, path: &Path) {
        std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))
            .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
    }
}

fn set_up_test_user() -> (u32, u32) {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "setting up the test user {TEST_USER} needs root"
    );
    let ids = || {
        let id = |flag: &str| -> Option<u32> {
            let out = Command::new("id").arg(flag).arg(TEST_USER).output().ok()?;
            String::from_utf8_lossy(&out.stdout).trim().parse().ok()
        };
        Some((id("-u")?, id("-g")?))
    };
    let ids = ids().unwrap_or_else(|| {
        let out = Command::new("useradd")
            .args(["--system", "--user-group", "--no-create-home"])
            .args(["--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin"])
            .arg(TEST_USER)
            .output()
            .expect("running useradd");
        // Another test process may have created it meanwhile: look again either way.
        ids().unwrap_or_else(|| {
            panic!(
                "useradd {TEST_USER} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    });
    fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(0o666))
        .expect("chmod 666 /dev/fuse");
    let fusermount = ["/usr/bin/fusermount3", "/bin/fusermount3"]
        .iter()
        .find_map(|p| fs::metadata(p).ok())
        .expect("fusermount3 is missing: apt-get install fuse3");
    assert!(
        fusermount.permissions().mode() & 0o4000 != 0,
        "fusermount3 must be setuid root for ordinary users to mount"
    );
    let probe = TestUser {
        name: TEST_USER.to_string(),
        uid: ids.0,
        gid: ids.1,
        home: PathBuf::from("/"),
    };
    let out = probe.output(probe.command(stagefs_bin()).arg("--version"));
    assert!(
        out.status.success(),
        "{TEST_USER} cannot run {} (every directory above it must be searchable by others): {}",
        stagefs_bin().display(),
        String::from_utf8_lossy(&out.stderr)
    );
    ids
}

fn find_user_python(user: &TestUser) -> (PathBuf, Option<PathBuf>) {
    const IMPORTS: &str = "import huggingface_hub, safetensors, numpy";
    let works = |program: &Path, pythonpath: Option<&Path>| {
        let mut command = user.command(program);
        command.args(["-c", IMPORTS]);
        if let Some(pythonpath) = pythonpath {
            command.env("PYTHONPATH", pythonpath);
        }
        user.output(&mut command).status.success()
    };
    if let Some(program) = std::env::var_os("STAGEFS_USER_PYTHON") {
        let program = PathBuf::from(program);
        assert!(
            works(&program, None),
            "$STAGEFS_USER_PYTHON ({}) cannot import huggingface_hub, safetensors and numpy as {TEST_USER}",
            program.display()
        );
        return (program, None);
    }
    let venv = python();
    if works(&venv, None) {
        return (venv, None);
    }
    // The venv's packages, and its version, asked of the venv as root.
    let out = Command::new(&venv)
        .args([
            "-c",
            "import sys, sysconfig; print(sysconfig.get_paths()['purelib']); print(sys.version_info[:2])",
        ])
        .output()
        .expect("running the venv's python");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines();
    let (site, version) = (
        PathBuf::from(lines.next().unwrap_or_default()),
        lines.next().unwrap_or_default().to_string(),
    );
    for candidate in ["/usr/bin/python3", "/usr/local/bin/python3"] {
        let candidate = Path::new(candidate);
        let same_version = Command::new(candidate)
            .args(["-c", "import sys; print(sys.version_info[:2])"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == version);
        if same_version && works(candidate, Some(&site)) {
            return (candidate.to_path_buf(), Some(site));
        }
    }
    panic!(
        "{TEST_USER} cannot run {} (is it under a home only root can enter?) and no system python3 {version} can use its packages; set STAGEFS_USER_PYTHON",
        venv.display()
    );
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
    /// The ordinary user that mounts and reads, for [`Scratch::for_user`]; `None`: root.
    pub user: Option<TestUser>,
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
            user: None,
        }
    }

    /// A scratch area for a mount made by the ordinary user [`TEST_USER`] (created if
    /// missing, see [`TestUser`]): the scratch directory, `mnt/` and a fresh `home/`
    /// are the user's; `hub/` stays root's, as a shared source would, and is readable.
    /// [`Scratch::mount`] then mounts as that user, through fusermount3.
    pub fn for_user() -> Scratch {
        let mut scratch = Scratch::new();
        let home = scratch.dir.path().join("home");
        fs::create_dir_all(&home).expect("mkdir home");
        let user = TestUser::new(home);
        for dir in [scratch.dir.path(), &scratch.mnt, &user.home] {
            user.chown(dir);
        }
        scratch.user = Some(user);
        scratch
    }

    /// The ordinary user of a [`Scratch::for_user`] area.
    pub fn user(&self) -> &TestUser {
        self.user
            .as_ref()
            .expect("a scratch area made by Scratch::for_user")
    }

    /// Mounts `hub` at `mnt` with `extra` flags (as [`Scratch::user`] if there is one).
    pub fn mount(&self, extra: &[&str]) -> Mount {
        match &self.user {
            Some(user) => Mount::start_as(user, &self.hub, &self.mnt, &self.cache, extra),
            None => Mount::start(&self.hub, &self.mnt, &self.cache, extra),
        }
    }

    /// A mount of `hub` at `mnt` with the cache in `cache`, every other setting at the
    /// library's defaults (those of `stagefs mount` without flags).
    pub fn spec(&self) -> MountSpec {
        let mut spec = MountSpec::new(&self.hub, &self.mnt, &self.cache);
        spec.min_free = Some(TEST_RESERVE);
        spec
    }

    /// Mounts `hub` at `mnt` in this process through the library, with `adjust`
    /// applied to [`Scratch::spec`] (e.g. `|s| s.fs.prefetch = false` for
    /// `--no-prefetch`).
    pub fn mount_in_process(&self, adjust: impl FnOnce(&mut MountSpec)) -> LibMount {
        let mut spec = self.spec();
        adjust(&mut spec);
        LibMount::start(&spec)
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
    /// Who mounted it: `None` for root, else an ordinary user, who also unmounts.
    user: Option<TestUser>,
    /// The mount point.
    pub mnt: PathBuf,
    /// The cache directory.
    pub cache: PathBuf,
    /// The daemon's stderr (its log).
    pub log: PathBuf,
    /// What the daemon said once it served ("ready", or why it serves from memory).
    pub ready: String,
}

static LOG_SEQ: AtomicU32 = AtomicU32::new(0);

/// The free space test mounts keep on the cache volume. The default, a share of the
/// volume (10% of a 252 GB disk is 25 GB), would make every test that stages depend on
/// how full the machine's shared disk happens to be; the tests' caches hold megabytes.
pub const TEST_RESERVE: u64 = 64 << 20;

/// `--min-free` [`TEST_RESERVE`], unless the test sets its own.
pub(crate) fn test_reserve(extra: &[&str]) -> Vec<String> {
    match extra.contains(&"--min-free") {
        true => Vec::new(),
        false => vec!["--min-free".into(), TEST_RESERVE.to_string()],
    }
}

impl Mount {
    /// Starts the daemon and waits until the mount is live.
    pub fn start(source: &Path, mnt: &Path, cache: &Path, extra: &[&str]) -> Mount {
        Self::launch(Command::new(stagefs_bin()), None, source, mnt, cache, extra)
    }

    /// Starts the daemon from `command` (the `stagefs` binary with an environment
    /// of its own, such as an object store's endpoint and credentials) and waits
    /// until the mount is live.
    pub fn start_with(
        command: Command,
        source: &Path,
        mnt: &Path,
        cache: &Path,
        extra: &[&str],
    ) -> Mount {
        Self::launch(command, None, source, mnt, cache, extra)
    }

    /// Starts the daemon as the ordinary `user` (who mounts through the setuid
    /// fusermount3, as on a desktop) and waits until the mount is live. Checks that the
    /// daemon runs as that user without capabilities and that the kernel records the
    /// mount as the user's (`user_id=` in the mount table). Only that user can use the
    /// mount: without `--allow-other` the kernel refuses even root (EACCES), so go
    /// through [`TestUser::command`]; the control socket ([`Mount::metrics`]) works.
    pub fn start_as(
        user: &TestUser,
        source: &Path,
        mnt: &Path,
        cache: &Path,
        extra: &[&str],
    ) -> Mount {
        let mount = Self::launch(
            user.command(stagefs_bin()),
            Some(user.clone()),
            source,
            mnt,
            cache,
            extra,
        );
        let pid = mount.pid().expect("daemon pid");
        let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("daemon status");
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.split_whitespace().collect::<Vec<_>>())
                .unwrap_or_default()
        };
        let uid = user.uid.to_string();
        assert!(
            field("Uid:").iter().all(|u| *u == uid),
            "the daemon runs as {}: {status}",
            user.name
        );
        assert_eq!(
            field("CapEff:"),
            ["0000000000000000"],
            "the daemon has no capabilities"
        );
        assert_eq!(
            mount_owner(mnt),
            Some(user.uid),
            "the mount table records the mount as {}'s",
            user.name
        );
        mount
    }

    fn launch(
        mut command: Command,
        user: Option<TestUser>,
        source: &Path,
        mnt: &Path,
        cache: &Path,
        extra: &[&str],
    ) -> Mount {
        let log = cache.with_file_name(format!(
            "daemon-{}.log",
            LOG_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let mut child = command
            .arg("mount")
            .arg(source)
            .arg(mnt)
            .arg("--cache-dir")
            .arg(cache)
            .args(["--foreground", "--notify-ready"])
            .args(test_reserve(extra))
            .args(extra)
            // STAGEFS_TEST_LOG sets the daemon's filter, to debug a test.
            .env(
                "RUST_LOG",
                std::env::var("STAGEFS_TEST_LOG").unwrap_or("info,fuser=error".into()),
            )
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
        // "ready", or "ready: the source is away" for a mount of a source away.
        if !line.trim().starts_with("ready") {
            let _ = child.wait();
            panic!(
                "mount did not come up: {line}\n{}",
                fs::read_to_string(&log).unwrap_or_default()
            );
        }
        Mount {
            child: Some(child),
            user,
            mnt: mnt.to_path_buf(),
            cache: cache.to_path_buf(),
            log,
            ready: line.trim().to_string(),
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
    pub fn in_flight(&self) -> Vec<stagefs_stage::InFlight> {
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

    /// The daemon's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Everything the daemon logged so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The one JSON line a client program (a tests/py script) printed about this
    /// mount; a failed program fails the test with its output and the daemon's log.
    #[track_caller]
    pub fn client_report(&self, out: &Output) -> Value {
        client_report(out, &format!("daemon log:\n{}", self.log_text()))
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

    /// Unmounts (as [`Mount::unmount`]) and mounts `source` again at the same place
    /// with the same cache, as root, with `extra` options.
    pub fn remount(&mut self, source: &Path, extra: &[&str]) {
        self.shutdown();
        let again = Self::launch(
            Command::new(stagefs_bin()),
            None,
            source,
            &self.mnt,
            &self.cache,
            extra,
        );
        let old = std::mem::replace(self, again);
        // Shut down already: its drop would unmount the new mount at the same place.
        std::mem::forget(old);
    }

    /// Unmounts with `stagefs unmount` and waits for the daemon to exit.
    pub fn unmount(mut self) {
        self.shutdown();
    }

    /// Sends `signal` (e.g. `libc::SIGTERM`, as `systemctl stop` does) to the daemon.
    pub fn signal(&self, signal: i32) {
        let pid = self.pid().expect("the daemon runs");
        let pid = libc::pid_t::try_from(pid).expect("pid");
        // SAFETY: kill has no memory-safety preconditions; pid is our own child.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "kill {pid}");
    }

    /// Whether the daemon has exited (it is then reaped).
    pub fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|child| matches!(child.try_wait(), Ok(Some(_))))
    }

    /// Waits for the daemon to exit by itself (a minute at most) and returns how it
    /// ended; the mount is then left to the test.
    #[track_caller]
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("the daemon was running");
        let mut status = None;
        wait_for("the daemon to exit", || {
            status = child.try_wait().expect("waiting for the daemon");
            status.is_some()
        });
        status.expect("exit status")
    }

    /// Kills the daemon with SIGKILL, as a crash would, leaving a dead mount behind.
    pub fn kill_daemon(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `stagefs unmount [--lazy] MNT`, run by whoever mounted (an ordinary user's
    /// unmount goes through `fusermount3 -u`).
    fn unmount_command(&self, lazy: bool) -> Command {
        let mut command = match &self.user {
            Some(user) => user.command(stagefs_bin()),
            None => Command::new(stagefs_bin()),
        };
        command.arg("unmount");
        if lazy {
            command.arg("--lazy");
        }
        command.arg(&self.mnt).stderr(Stdio::null());
        command
    }

    fn shutdown(&mut self) {
        let status = self.unmount_command(false).status();
        if !status.is_ok_and(|s| s.success()) {
            let _ = self.unmount_command(true).status();
        }
        let Some(mut child) = self.child.take() else {
            return;
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        let exited = loop {
            if let Ok(Some(_)) = child.try_wait() {
                break true;
            }
            if Instant::now() >= deadline {
                break false;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if !exited {
            let _ = child.kill();
            let _ = child.wait();
        }
        if self.user.is_some() && is_mounted(&self.mnt) {
            // The user's unmount failed: never leave a dead mount behind a test.
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A process holding a file open and mapped (tests/py/mmap_holder.py), as a loader
/// holds a shard while it runs; killed when dropped.
pub struct MmapHolder {
    child: Child,
    lines: BufReader<std::process::ChildStdout>,
}

impl MmapHolder {
    /// Starts `python` (e.g. [`python`] or [`TestUser::python`]) on `path` and waits
    /// until the file is open and mapped, no page touched yet.
    pub fn start(mut python: Command, path: &Path) -> MmapHolder {
        let mut child = python
            .arg(workspace_root().join("tests/py/mmap_holder.py"))
            .arg(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the holder");
        let lines = BufReader::new(child.stdout.take().expect("stdout"));
        let mut holder = MmapHolder { child, lines };
        let line = holder.next_line();
        assert_eq!(
            line.trim(),
            "mapped",
            "the holder could not map {}",
            path.display()
        );
        holder
    }

    /// Reads every byte through the mapping and through read(): the JSON line
    /// `{"mapped": sha256, "read": sha256}`, or `{"error": ...}`.
    pub fn read_all(&mut self) -> Value {
        self.cue();
        let line = self.next_line();
        serde_json::from_str(&line).unwrap_or_else(|_| {
            let status = self.child.wait().expect("holder status");
            panic!("the holder died reading ({status}): {line:?}")
        })
    }

    /// Unmaps, closes and waits for the holder's exit.
    pub fn close(mut self) -> std::process::ExitStatus {
        self.cue();
        self.child.wait().expect("holder status")
    }

    fn cue(&mut self) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin.write_all(b"go\n").expect("cueing the holder");
        stdin.flush().expect("cueing the holder");
    }

    fn next_line(&mut self) -> String {
        let mut line = String::new();
        self.lines.read_line(&mut line).expect("reading the holder");
        line
    }
}

impl Drop for MmapHolder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A mount served by this test process through [`stagefs_mount::Running`], stopped
/// when dropped. The FUSE session serves on threads of its own, so the test may read
/// through it directly; Python clients run as child processes. There is no daemon
/// log, process id or command line: tests of those use [`Mount`].
pub struct LibMount {
    running: Option<Running>,
    /// The mount point.
    pub mnt: PathBuf,
    /// The cache directory.
    pub cache: PathBuf,
}

impl LibMount {
    /// Starts the mount; a mount that does not come up fails the test with the
    /// library's error and its causes.
    #[track_caller]
    pub fn start(spec: &MountSpec) -> LibMount {
        LibMount::try_start(spec).unwrap_or_else(|e| panic!("mount did not come up: {}", chain(&e)))
    }

    /// Starts the mount, or says why it could not.
    pub fn try_start(spec: &MountSpec) -> Result<LibMount, MountError> {
        Ok(LibMount {
            running: Some(Running::start(spec)?),
            mnt: spec.mountpoint.clone(),
            cache: spec.cache_dir.clone(),
        })
    }

    /// The mount's counters, straight from the library.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.running.as_ref().expect("running").metrics()
    }

    /// Path of `rel` inside the mount.
    pub fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.mnt.join(rel)
    }

    /// The one JSON line a client program (a tests/py script) printed about this
    /// mount; a failed program fails the test with its output.
    #[track_caller]
    pub fn client_report(&self, out: &Output) -> Value {
        client_report(out, "")
    }

    /// Stops the mount (unmount, wait for the request loop) and returns how that went.
    pub fn stop(mut self) -> Result<(), MountError> {
        self.running.take().map_or(Ok(()), Running::stop)
    }
}

impl Drop for LibMount {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            let _ = running.stop();
        }
        if is_mounted(&self.mnt) {
            // A reader still inside kept it mounted: never leave a mount behind a test.
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

/// An error with its causes, as the CLI prints it.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(e) = cause {
        out += &format!(": {e}");
        cause = e.source();
    }
    out
}

/// The one JSON line a client program printed; `context` (a daemon's log) is shown
/// if it failed.
#[track_caller]
fn client_report(out: &Output, context: &str) -> Value {
    assert!(
        out.status.success(),
        "client failed:\n{}\n{}\n{context}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the client printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Whether `path` is a mount point in this process's mount table.
pub fn is_mounted(path: &Path) -> bool {
    let mounts = fs::read_to_string("/proc/self/mounts").expect("mounts");
    let path = path.to_string_lossy();
    mounts
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(path.as_ref()))
}

/// Whose mount `path` is: the `user_id=` the kernel records for a FUSE mount there.
pub fn mount_owner(path: &Path) -> Option<u32> {
    let mounts = fs::read_to_string("/proc/self/mounts").expect("mounts");
    let path = path.to_string_lossy();
    mounts
        .lines()
        .filter(|l| l.split(' ').nth(1) == Some(path.as_ref()))
        .filter_map(|l| l.split(' ').nth(3))
        .flat_map(|options| options.split(','))
        .find_map(|o| o.strip_prefix("user_id=")?.parse().ok())
}

/// Runs tests/py/hf_offline_check.py with the hub cache at `mnt`: huggingface_hub
/// resolves `model` offline and safetensors reads every tensor, compared with the
/// same files under `source_hub`. `hf_home` keeps the client away from the real home.
pub fn hf_offline_check(mnt: &Path, model: &Model, source_hub: &Path, hf_home: &Path) -> Command {
    hf_offline_check_with(Command::new(python()), mnt, model, source_hub, hf_home)
}

/// [`hf_offline_check`] run by `python`, a command that starts the interpreter.
fn hf_offline_check_with(
    mut python: Command,
    mnt: &Path,
    model: &Model,
    source_hub: &Path,
    hf_home: &Path,
) -> Command {
    python
        .arg(workspace_root().join("tests/py/hf_offline_check.py"))
        .args([&model.repo, &model.commit])
        .arg(source_hub);
    hf_offline_env(&mut python, mnt, hf_home);
    python
}

/// Runs tests/py/hf_offline_check.py against `mount`: huggingface_hub resolves the
/// model offline and safetensors reads every tensor, compared with `source_hub`.
/// Returns whether it passed and what it printed; two minutes without an answer
/// fail the test.
pub fn load_with_real_clients(mount: &Mount, model: &Model, source_hub: &Path) -> (bool, String) {
    let hf_home = mount.cache.with_file_name("hf-home");
    let mut command = hf_offline_check(&mount.mnt, model, source_hub, &hf_home);
    let out = within(Duration::from_secs(120), move || command.output()).expect("python");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Sets up `command`'s environment as a huggingface_hub client of the hub cache at
/// `mnt`, offline, with `hf_home` as its HF_HOME.
pub fn hf_offline_env(command: &mut Command, mnt: &Path, hf_home: &Path) {
    command
        .env("HF_HUB_CACHE", mnt)
        .env("HF_HOME", hf_home)
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HUB_DISABLE_TELEMETRY", "1");
}

/// `stagefs` as a fresh account with HOME `home` runs it: no config file, no XDG
/// variables, HF_HOME inside that HOME, and a registry of running mounts of its own
/// (so that tests running at once never see each other's mounts).
pub fn stagefs_at_home(home: &Path) -> Command {
    let mut command = Command::new(stagefs_bin());
    command.env("HOME", home).env("HF_HOME", home.join("hf"));
    for var in [
        "XDG_CONFIG_HOME",
        "XDG_CACHE_HOME",
        "XDG_STATE_HOME",
        "STAGEFS_CONFIG",
        "HF_HUB_CACHE",
        "RUST_LOG",
    ] {
        command.env_remove(var);
    }
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

/// `stagefs status --json` for `cache`: its one report.
pub fn status_json(cache: &Path) -> Value {
    let (ok, out, err) = run_stagefs(&[&"status", &"--json", &"--cache-dir", &cache]);
    assert!(ok, "status failed: {err}");
    let all: Value = serde_json::from_str(&out).expect("status JSON");
    match all["mounts"].as_array().map(Vec::as_slice) {
        Some([one]) => one.clone(),
        _ => panic!("status --json of one cache is not one report in `mounts`: {out}"),
    }
}

/// Runs `f` on a thread and waits at most `limit` for it: a hang is a failure, not a
/// stuck test.
#[track_caller]
pub fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).expect("the operation hung")
}

/// Polls `done` until it holds; a minute without it fails the test rather than hang.
#[track_caller]
pub fn wait_for(what: &str, done: impl FnMut() -> bool) {
    wait_for_within(
        what,
        Duration::from_secs(60),
        Duration::from_millis(20),
        done,
    );
}

/// Polls `done` every `every` until it holds; `limit` without it fails the test.
#[track_caller]
pub fn wait_for_within(
    what: &str,
    limit: Duration,
    every: Duration,
    mut done: impl FnMut() -> bool,
) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(every);
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

/// `bytes` of pseudo-random content from `seed`.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed * 97) >> 7) as u8)
        .collect()
}

/// Writes `bytes` to `path` with modification time `mtime`.
pub fn write_with_mtime(path: &Path, bytes: &[u8], mtime: std::time::SystemTime) {
    fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    fs::write(path, bytes).expect("write");
    fs::File::options()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(mtime))
        .expect("set the mtime");
}

static NETFS_SEQ: AtomicU32 = AtomicU32::new(0);

/// A directory served over sshfs from a private network namespace, capped at `rate`.
pub struct NetFs {
    id: u32,
    /// Where the network filesystem is mounted on the host.
    pub mnt: PathBuf,
    /// What `up` was given, to mount it again.
    up_args: (PathBuf, String, String),
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
        let netfs = NetFs {
            id,
            mnt: mnt.to_path_buf(),
            up_args: (dir.to_path_buf(), rate.into(), sshfs_options.into()),
        };
        netfs.mount_again();
        netfs
    }

    /// Mounts the export again at the same place (after [`NetFs::drop_connection`]
    /// or [`NetFs::kill_sshfs`]), as a user remounting the share would.
    pub fn mount_again(&self) {
        let (dir, rate, sshfs_options) = &self.up_args;
        let (id, mnt) = (self.id, &self.mnt);
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

    /// Kills sshfs's ssh connection: sshfs exits and unmounts, and the mount point
    /// is an empty directory of this machine's disk again.
    pub fn drop_connection(&self) {
        self.script(&["drop"]);
    }

    /// Kills sshfs: the mount stays, answering ENOTCONN to everything.
    pub fn kill_sshfs(&self) {
        self.script(&["kill"]);
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
