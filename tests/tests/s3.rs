//! An object store as the source: `stagefs mount s3://BUCKET[/PREFIX]` against a real
//! S3 API server (moto's, tests/py/s3_server.py, on a loopback port, filled with
//! boto3), through the real binary and a real FUSE mount (and the NFS backend once).
//! The shapes S3 holds (plain model folders, GGUF files, HF caches uploaded as
//! `aws s3 sync` does), loads by path with safetensors, `mx.load` and `mlx_lm.load`,
//! objects replaced and deleted, the server killed mid-copy and after staging,
//! refused credentials, a missing bucket and a prefix of ten thousand keys.

use std::collections::BTreeSet;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use stagefs_tests::{
    Mount, Scratch, Served, generate, pseudo_random, python, staged_files_of_at_least, stagefs_bin,
    temp_files, wait_for, within, workspace_root,
};

const MIB: usize = 1 << 20;
/// The part size of the S3 source's ranged GETs (stagefs_s3::PART).
const PART: usize = 8 << 20;
/// The source timeout of the mounts whose server goes away.
const TIMEOUT: &str = "3s";

/// A moto S3 server in a process of its own, so a test can kill it.
struct S3Server {
    child: Child,
    commands: ChildStdin,
    answers: BufReader<ChildStdout>,
    url: String,
}

impl S3Server {
    fn start() -> S3Server {
        S3Server::start_with(&[])
    }

    /// A server with `env` added to its environment (moto's own switches).
    fn start_with(env: &[(&str, &str)]) -> S3Server {
        let mut child = Command::new(python())
            .arg(workspace_root().join("tests/py/s3_server.py"))
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting tests/py/s3_server.py (moto[server], boto3)");
        let commands = child.stdin.take().expect("stdin");
        let mut answers = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        answers.read_line(&mut line).expect("server readiness");
        let url = line
            .trim()
            .strip_prefix("ready ")
            .unwrap_or_else(|| panic!("the S3 server did not start: {line}"))
            .to_string();
        S3Server {
            child,
            commands,
            answers,
            url,
        }
    }

    #[track_caller]
    fn send(&mut self, command: Value) -> Value {
        writeln!(self.commands, "{command}").expect("command to the S3 server");
        let mut line = String::new();
        self.answers.read_line(&mut line).expect("S3 server answer");
        let answer: Value = serde_json::from_str(&line).expect("JSON answer");
        assert!(answer["ok"] == true, "{command} failed: {answer}");
        answer
    }

    fn bucket(&mut self, bucket: &str) {
        self.send(json!({"op": "bucket", "bucket": bucket}));
    }

    fn put(&mut self, bucket: &str, key: &str, bytes: &[u8]) {
        let file = tempfile::NamedTempFile::new().expect("temp");
        fs::write(file.path(), bytes).expect("write");
        self.send(json!({"op": "put", "bucket": bucket, "key": key, "file": file.path()}));
    }

    /// Uploads every file under `dir` to `prefix`, links followed (`aws s3 sync`).
    fn sync(&mut self, bucket: &str, prefix: &str, dir: &Path) {
        self.send(json!({"op": "sync", "bucket": bucket, "prefix": prefix, "dir": dir}));
    }

    fn delete(&mut self, bucket: &str, key: &str) {
        self.send(json!({"op": "delete", "bucket": bucket, "key": key}));
    }

    /// Ranged GETs from byte `from` on wait: a transfer stuck after its first part.
    fn hold_from(&mut self, from: usize) {
        self.send(json!({"op": "hold", "from": from}));
    }

    /// Kills the server, as a crash or a pulled cable would take it away.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// `command` with this server as its endpoint and credentials moto takes.
    fn command(&self, mut command: Command) -> Command {
        command
            .env("AWS_ENDPOINT_URL", &self.url)
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_REGION", "us-east-1");
        command
    }

    /// Mounts `url` at `s.mnt` with `extra` flags.
    fn mount(&self, s: &Scratch, url: &str, extra: &[&str]) -> Mount {
        let command = self.command(Command::new(stagefs_bin()));
        Mount::start_with(command, Path::new(url), &s.mnt, &s.cache, extra)
    }

    /// `stagefs mount URL` that must fail: its stderr.
    fn failed_mount(&self, s: &Scratch, url: &str, env: &[(&str, &str)]) -> String {
        let mut command = self.command(Command::new(stagefs_bin()));
        let out = command
            .envs(env.iter().copied())
            .args(["--no-config", "mount", url])
            .arg(&s.mnt)
            .arg("--cache-dir")
            .arg(&s.cache)
            .output()
            .expect("stagefs mount");
        assert!(!out.status.success(), "mounted {url}");
        String::from_utf8_lossy(&out.stderr).trim().to_string()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A scratch area and a server holding an empty bucket `models`.
fn scratch_and_bucket() -> (Scratch, S3Server) {
    let mut server = S3Server::start();
    server.bucket("models");
    (Scratch::new(), server)
}

/// A tiny Llama folder (hub_client.py make-llama: config, tokenizer and a 4.6 MiB
/// model.safetensors) under `dir`.
fn make_llama(dir: &Path) -> PathBuf {
    let folder = dir.join("tiny-llama");
    let out = Command::new(python())
        .arg(workspace_root().join("tests/py/hub_client.py"))
        .arg("make-llama")
        .arg(&folder)
        .env("MODEL_SEED", "7")
        .output()
        .expect("make-llama");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    folder
}

/// Loads `mounted` by path with safe_open, `mx.load` and `mlx_lm.load`, comparing
/// with `source`.
fn path_loads(mounted: &Path, source: &Path) -> Output {
    Command::new(python())
        .arg(workspace_root().join("tests/py/path_loads.py"))
        .arg(mounted)
        .arg(source)
        .output()
        .expect("path_loads.py")
}

#[track_caller]
fn assert_loads(mount: &Mount, mounted: &Path, source: &Path) {
    let report = mount.client_report(&path_loads(mounted, source));
    assert_eq!(report["mlx_lm"], true, "{report}");
}

fn names(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

fn errno_of_read(path: &Path) -> Option<i32> {
    fs::read(path).err().and_then(|e| e.raw_os_error())
}

#[test]
fn a_bucket_mirrors_folders_gguf_files_and_an_hf_cache_and_models_load_by_path() {
    let (s, mut server) = scratch_and_bucket();
    let llama = make_llama(s.dir.path());
    server.sync("models", "team/folders/tiny-llama", &llama);
    let gguf = [b"GGUF".as_slice(), &pseudo_random(3 * MIB, 1)].concat();
    server.put("models", "team/gguf/tiny.Q4_K_M.gguf", &gguf);
    let model = generate(&s.hub, "acme/synced", 2, "2M");
    server.sync("models", "team/hub", &s.hub);
    let mount = server.mount(&s, "s3://models/team", &[]);
    // Read-only to the kernel too (writing to a bucket is not implemented), so
    // `stagefs run` keeps huggingface_hub offline there.
    let at = std::ffi::CString::new(s.mnt.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: statvfs fills the zeroed struct it is given; the path is a C string.
    let flags = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        assert_eq!(libc::statvfs(at.as_ptr(), &mut st), 0);
        st.f_flag
    };
    assert_ne!(flags & libc::ST_RDONLY, 0, "the mount is not read-only");

    assert_eq!(
        names(&s.mnt),
        BTreeSet::from(["folders", "gguf", "hub"].map(String::from))
    );
    assert!(fs::metadata(mount.path("folders")).expect("stat").is_dir());
    assert_eq!(
        names(&mount.path("gguf")),
        BTreeSet::from(["tiny.Q4_K_M.gguf".to_string()])
    );
    assert!(fs::read(mount.path("gguf/tiny.Q4_K_M.gguf")).expect("gguf") == gguf);
    // The HF cache as `aws s3 sync` leaves it: its snapshot holds real files.
    for name in model.shards() {
        let through = fs::read(mount.path("hub").join(&name)).expect("snapshot file");
        assert!(
            through == fs::read(s.hub.join(&name)).expect("source"),
            "{}",
            name.display()
        );
    }
    assert_loads(&mount, &mount.path("folders/tiny-llama"), &llama);
    assert!(
        !staged_files_of_at_least(&s.cache, 4 * MIB as u64).is_empty(),
        "the weights were staged"
    );
    mount.unmount();
}

#[test]
fn a_replaced_object_is_served_anew_and_a_deleted_one_is_gone() {
    let (s, mut server) = scratch_and_bucket();
    let (old, new) = (pseudo_random(3 * MIB, 1), pseudo_random(3 * MIB, 2));
    server.put("models", "m/weights.bin", &old);
    server.put("models", "m/extra.bin", b"extra");
    let mount = server.mount(&s, "s3://models", &["--no-prefetch"]);
    let weights = mount.path("m/weights.bin");
    assert!(fs::read(&weights).expect("first read") == old);

    // Same size, and maybe the same second: only the ETag tells the new object.
    server.put("models", "m/weights.bin", &new);
    wait_for("the replaced object's bytes", || {
        fs::read(&weights).is_ok_and(|bytes| bytes == new)
    });
    server.delete("models", "m/extra.bin");
    wait_for("the deleted object to be gone", || {
        errno_of_read(&mount.path("m/extra.bin")) == Some(libc::ENOENT)
    });
    assert_eq!(
        names(&mount.path("m")),
        BTreeSet::from(["weights.bin".to_string()])
    );
    mount.unmount();
}

#[test]
fn a_throttling_store_is_asked_again_and_the_whole_file_arrives() {
    let (s, mut server) = scratch_and_bucket();
    let bytes = pseudo_random(3 * PART, 6);
    server.put("models", "m/model.safetensors", &bytes);
    let mount = server.mount(&s, "s3://models", &["--no-prefetch"]);
    server.send(json!({"op": "slow_down", "requests": 6}));
    assert!(fs::read(mount.path("m/model.safetensors")).expect("read") == bytes);
    let left = server.send(json!({"op": "slowed_left"}));
    assert_eq!(
        left["left"], 0,
        "every 503 SlowDown was answered with a retry"
    );
    mount.unmount();
}

#[test]
fn a_server_killed_mid_copy_fails_the_open_cleanly_and_leaves_no_partial_copy() {
    let (s, mut server) = scratch_and_bucket();
    let big = "m/model.safetensors";
    server.put("models", big, &pseudo_random(3 * PART, 3));
    let mount = server.mount(
        &s,
        "s3://models",
        &["--no-prefetch", "--source-timeout", TIMEOUT],
    );
    server.hold_from(PART);
    let path = mount.path(big);
    let reader = std::thread::spawn(move || errno_of_read(&path));
    wait_for("the copy to be under way", || mount.copying(Path::new(big)));
    server.kill();

    let errno = within(Duration::from_secs(30), move || {
        reader.join().expect("reader")
    });
    assert_eq!(
        errno,
        Some(libc::EIO),
        "the open fails with EIO, no partial bytes"
    );
    wait_for("the copy's temp file to be removed", || {
        temp_files(&s.cache).is_empty()
    });
    assert!(
        staged_files_of_at_least(&s.cache, PART as u64).is_empty(),
        "nothing partial was kept"
    );
    mount.unmount();
}

#[test]
fn a_staged_model_loads_with_the_server_gone_and_an_unstaged_file_fails_with_eio() {
    let (s, mut server) = scratch_and_bucket();
    let llama = make_llama(s.dir.path());
    server.sync("models", "tiny-llama", &llama);
    server.put("models", "other/weights.bin", &pseudo_random(2 * MIB, 4));
    let mount = server.mount(
        &s,
        "s3://models",
        &["--no-prefetch", "--source-timeout", TIMEOUT],
    );
    let mounted = mount.path("tiny-llama");
    assert_loads(&mount, &mounted, &llama);
    // Listed while the server was up, never staged.
    assert!(fs::metadata(mount.path("other/weights.bin")).is_ok());
    server.kill();

    assert_loads(&mount, &mounted, &llama);
    let unstaged = mount.path("other/weights.bin");
    let errno = within(Duration::from_secs(20), move || errno_of_read(&unstaged));
    assert_eq!(errno, Some(libc::EIO));
    mount.unmount();
}

#[test]
fn refused_credentials_and_a_missing_bucket_are_one_line_each() {
    let s = Scratch::new();
    let server = S3Server::start();
    let missing = server.failed_mount(&s, "s3://no-such-bucket/models", &[]);
    assert_eq!(missing.lines().count(), 1, "{missing}");
    assert!(
        missing.contains("bucket no-such-bucket does not exist"),
        "{missing}"
    );

    // moto checks credentials once told to.
    let checking = S3Server::start_with(&[("INITIAL_NO_AUTH_ACTION_COUNT", "0")]);
    let refused = checking.failed_mount(&s, "s3://models", &[("AWS_SECRET_ACCESS_KEY", "wrong")]);
    assert_eq!(refused.lines().count(), 1, "{refused}");
    assert!(refused.contains("refused the credentials"), "{refused}");
    assert!(
        !refused.contains("wrong"),
        "the secret is never shown: {refused}"
    );
}

#[test]
fn a_prefix_of_ten_thousand_keys_lists_whole() {
    let (s, mut server) = scratch_and_bucket();
    server.send(json!({"op": "many", "bucket": "models", "prefix": "many", "count": 10_000}));
    let mount = server.mount(&s, "s3://models", &["--no-prefetch"]);
    let dir = mount.path("many");
    let listed = within(Duration::from_secs(120), move || names(&dir));
    assert_eq!(listed.len(), 10_000);
    assert!(listed.contains("key-00000") && listed.contains("key-09999"));
    mount.unmount();
}

#[test]
fn the_nfs_backend_serves_a_bucket_unchanged() {
    let (s, mut server) = scratch_and_bucket();
    let bytes = pseudo_random(3 * MIB, 5);
    server.put("models", "m/model.safetensors", &bytes);
    let command = server.command(Command::new(stagefs_bin()));
    let served = Served::start_with(command, Path::new("s3://models"), &s.cache, &[]);
    let read = served.read("m/model.safetensors");
    assert!(read == bytes, "the bytes read over NFS are the object's");
    assert_eq!(staged_files_of_at_least(&s.cache, MIB as u64).len(), 1);
}

#[test]
fn doctor_checks_the_endpoint_the_bucket_and_the_rate() {
    let (s, mut server) = scratch_and_bucket();
    server.put("models", "team/llama/config.json", b"{}");
    server.put(
        "models",
        "team/llama/model.safetensors",
        &pseudo_random(4 * MIB, 7),
    );
    let doctor = |url: &str| {
        let out = server
            .command(Command::new(stagefs_bin()))
            .args(["--no-config", "doctor", url])
            .output()
            .expect("stagefs doctor");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (ok, report) = doctor("s3://models/team");
    assert!(ok, "{report}");
    let source = line_of(&report, "source");
    assert!(
        source.starts_with("ok") && source.contains("holds the bucket and the prefix"),
        "{report}"
    );
    let speed = line_of(&report, "speed");
    assert!(
        speed.contains("MiB/s") && speed.contains("model.safetensors"),
        "{report}"
    );
    assert!(
        line_of(&report, "shape").contains("plain model folder"),
        "{report}"
    );

    let (ok, report) = doctor("s3://no-such-bucket");
    assert!(!ok, "{report}");
    let source = line_of(&report, "source");
    assert!(
        source.starts_with("fail") && source.contains("does not exist"),
        "{report}"
    );
    let (ok, report) = doctor("s3:/models/team");
    assert!(!ok && report.is_empty(), "{report}");

    // A model, or a path in the mount, of a bucket mounted: examined with its
    // bucket, never read as a directory named like the URL.
    let mount = server.mount(&s, "s3://models/team", &[]);
    let in_mount = mount.path("llama");
    for target in ["llama", in_mount.to_str().expect("utf-8")] {
        let out = server
            .command(Command::new(stagefs_bin()))
            .args(["--no-config", "doctor", target, "--cache-dir"])
            .arg(&s.cache)
            .output()
            .expect("stagefs doctor");
        let report = String::from_utf8_lossy(&out.stdout);
        let source = line_of(&report, "source");
        assert!(source.starts_with("ok"), "doctor {target}: {report}");
        assert!(
            !report.contains("No such file"),
            "doctor {target}: {report}"
        );
    }
    mount.unmount();
}

/// A store that accepts connections and never answers (its server stopped): doctor
/// says it is not reachable within its own 15 s deadline, not after its client's
/// retries (35 s before). The bound is a hang bound, not a timing.
#[test]
fn doctor_of_a_store_that_never_answers_ends_within_its_deadline() {
    let (_s, mut server) = scratch_and_bucket();
    // A prefix no other test mounts: a running mount of the same URL (another test's,
    // on another server) would be taken for this one and examined too, asking this
    // stopped server once more (30 s in all).
    server.put("models", "stopped/llama/config.json", b"{}");
    let pid = server.child.id() as libc::pid_t;
    // SAFETY: kill has no preconditions; the pid is the server's, not yet reaped.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let started = std::time::Instant::now();
    let out = server
        .command(Command::new(stagefs_bin()))
        .args(["--no-config", "doctor", "s3://models/stopped"])
        .output()
        .expect("stagefs doctor");
    let took = started.elapsed();
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{report}");
    let source = line_of(&report, "source");
    assert!(source.contains("is not reachable"), "{report}");
    assert!(
        took < std::time::Duration::from_secs(25),
        "doctor took {took:?}"
    );
}

/// The line of check `name` in doctor's report.
fn line_of<'a>(report: &'a str, name: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(name))
        .unwrap_or_else(|| panic!("no {name} line: {report}"))
}
