//! A local Hub endpoint and the Python clients that use it, for the write-through
//! tests: `tests/py/hub_server.py` serves a generated model with the routes
//! huggingface_hub's download path uses, `tests/py/hub_client.py` (and
//! `fault_client.py`, built on it) run the clients as users run them.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::{TestUser, python, workspace_root};

/// The repository the local Hub serves.
pub const REPO: &str = "acme/tiny";
/// The clients, as users run them.
pub const HUB_CLIENT: &str = "hub_client.py";
/// `hub_client.py`'s clients with a bigger model and a download that can pause,
/// for the fault tests.
pub const FAULT_CLIENT: &str = "fault_client.py";

/// A script in `tests/py/`.
pub fn script(name: &str) -> PathBuf {
    workspace_root().join("tests/py").join(name)
}

/// The sha256 of a file's bytes, in hex.
pub fn sha256_of(path: &Path) -> String {
    sha256_hex(&fs::read(path).expect("read"))
}

/// The sha256 of `bytes`, in hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// The local Hub endpoint, serving the model in one directory as [`REPO`]; killed
/// when dropped.
pub struct Hub {
    child: Child,
    _stdin: ChildStdin,
    /// Where it listens, for `HF_ENDPOINT`.
    pub url: String,
}

impl Hub {
    /// Serves the files in `dir`.
    pub fn serve(dir: &Path) -> Hub {
        Self::serve_with(dir, &[])
    }

    /// With `hub_server.py`'s options, e.g. `["--rate", "4000000"]`.
    pub fn serve_with(dir: &Path, options: &[&str]) -> Hub {
        let mut child = Command::new(python())
            .arg(script("hub_server.py"))
            .arg(dir)
            .arg(REPO)
            .args(options)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the hub server");
        let stdin = child.stdin.take().expect("stdin");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the server's first line");
        let port = line.split_whitespace().next().expect("a port");
        Hub {
            child,
            _stdin: stdin,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Makes `client`'s model (its `make-model`) in `dir`, as root, and serves it
    /// with `options`.
    pub fn of_a_new_model(client: &str, dir: &Path, options: &[&str]) -> Hub {
        As::Root.ok(client, "make-model", dir, &[]);
        Self::serve_with(dir, options)
    }

    /// `HF_ENDPOINT`'s value for it.
    pub fn endpoint(&self) -> PathBuf {
        PathBuf::from(&self.url)
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tiny Llama (`hub_client.py make-llama`, weights seeded by `seed`) made in folder
/// `made`, then downloaded as [`REPO`] into the HF_HOME `home` from a local Hub, as
/// `hf download` does.
pub fn llama_in_hf_home(made: &Path, home: &Path, seed: &str) {
    As::Root.ok(
        HUB_CLIENT,
        "make-llama",
        made,
        &[("MODEL_SEED", Path::new(seed))],
    );
    fs::create_dir_all(home.join("hub")).expect("mkdir HF_HOME/hub");
    let hub = Hub::serve(made);
    As::Root.ok(
        HUB_CLIENT,
        "snapshot",
        Path::new(REPO),
        &[("HF_ENDPOINT", &hub.endpoint()), ("HF_HOME", home)],
    );
}

/// Who runs the clients: root (the test process) or the mount's ordinary user.
#[derive(Clone, Copy)]
pub enum As<'a> {
    /// Root, the test process.
    Root,
    /// The ordinary user, through [`TestUser::python`].
    User(&'a TestUser),
}

impl As<'_> {
    /// `SCRIPT MODE ARG` with `env`, started with its stdin and stdout piped.
    pub fn spawn(self, script_name: &str, mode: &str, arg: &Path, env: &[(&str, &Path)]) -> Client {
        let mut command = match self {
            As::Root => Command::new(python()),
            As::User(user) => user.python(),
        };
        command
            .arg(script(script_name))
            .arg(mode)
            .arg(arg)
            .env("HF_HUB_DISABLE_TELEMETRY", "1")
            .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().expect("start the client");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Client {
            child,
            stdin,
            stdout,
        }
    }

    /// `SCRIPT MODE ARG` with `env`, run to completion: its last JSON line, or the
    /// exit status and output when it failed.
    pub fn client(
        self,
        script_name: &str,
        mode: &str,
        arg: &Path,
        env: &[(&str, &Path)],
    ) -> Result<Value, String> {
        self.spawn(script_name, mode, arg, env).finish()
    }

    /// [`As::client`], which must succeed.
    #[track_caller]
    pub fn ok(self, script_name: &str, mode: &str, arg: &Path, env: &[(&str, &Path)]) -> Value {
        self.client(script_name, mode, arg, env)
            .unwrap_or_else(|e| panic!("{script_name} {mode} {}: {e}", arg.display()))
    }
}

/// A running client.
pub struct Client {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Client {
    /// The next line the client printed, as JSON.
    pub fn line(&mut self) -> Value {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read the client");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }

    /// Waits for the client to exit (its stdin closed): its last JSON line if it
    /// succeeded, else its exit status and output (the last line then says why,
    /// e.g. `"errno": 5`).
    pub fn finish(mut self) -> Result<Value, String> {
        drop(self.stdin.take());
        let mut stdout = String::new();
        self.stdout.read_to_string(&mut stdout).expect("stdout");
        let mut stderr = String::new();
        if let Some(mut err) = self.child.stderr.take() {
            let _ = err.read_to_string(&mut stderr);
        }
        let status = self.child.wait().expect("wait for the client");
        let last = stdout.lines().last().unwrap_or_default();
        match (status.success(), serde_json::from_str(last)) {
            (true, Ok(value)) => Ok(value),
            _ => Err(format!("{status}\n{stdout}\n{stderr}")),
        }
    }
}

/// What a tree holds, by relative path: directories and files with their modes
/// (which the writer's umask decides), files by their sha256, links by their target.
pub fn tree(root: &Path) -> BTreeMap<PathBuf, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, String>) {
        let mut entries: Vec<_> = fs::read_dir(dir).expect("list").flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let path = entry.path();
            let rel = path.strip_prefix(root).expect("under root").to_path_buf();
            let kind = entry.file_type().expect("type");
            if kind.is_symlink() {
                let target = fs::read_link(&path).expect("readlink");
                out.insert(rel, format!("link -> {}", target.display()));
            } else {
                let mode = entry.metadata().expect("stat").permissions().mode() & 0o7777;
                if kind.is_dir() {
                    out.insert(rel, format!("dir {mode:o}"));
                    walk(root, &path, out);
                } else {
                    out.insert(rel, format!("file {mode:o} {}", sha256_of(&path)));
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}
