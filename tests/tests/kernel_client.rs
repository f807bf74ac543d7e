//! The NFS backend mounted by a real kernel: Debian's stock Linux kernel, booted under
//! qemu (`tests/vm/`: TCG, this machine's userland read-only over 9p, a network that
//! reaches only the server under test), mounts `stagefs serve` with its own NFS
//! client, as a Mac's kernel will. This machine's kernel has no NFS client, and the
//! user-space clients (libnfs, `nfs3_client`) never caught that the server refused
//! the kernel's AUTH_NULL ping.
//!
//! One guest boot runs everything (booting costs seconds, python over 9p more), in
//! phases that `guest.sh` prints as `PASS name` / `FAIL name: why`:
//! - `tests/py/kernel_checks.py` through the kernel mount, each check compared with
//!   the source read directly: HF_HOME and a plain folder, writes, listings, df,
//!   links (`hf download` through qemu's forward failed with a connection reset:
//!   qemu spawns its `socat` per connection and huggingface_hub opens several; the
//!   FUSE tests download through the mount);
//! - `stagefs mount --backend nfs` inside the guest: the daemon, its kernel mount,
//!   status, a read, unmount;
//! - the host's server killed with the mount up: what a reader gets, and that
//!   `umount -f -l` clears it.
//!
//! Each test asserts one phase's lines. Run as root (qemu's forward binds a reserved
//! port; the guest is booted by `tests/vm/run-guest.sh`), after
//! `bash scripts/setup-tests.sh`, which builds the guest.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use stagefs_tests::{generate, stagefs_bin, workspace_root};

const REPO: &str = "acme/kernel-read";

/// What the guest printed, and where to look when it went wrong.
struct GuestRun {
    lines: Vec<String>,
    /// The tail of the guest's console, its kernel log and the run's own error.
    evidence: String,
}

static GUEST: LazyLock<GuestRun> = LazyLock::new(boot_and_check);

/// Writes the sources, starts the server and the local Hub on this host, boots the
/// guest, and kills the server when the guest asks (the last phase).
fn boot_and_check() -> GuestRun {
    let guest_dir = workspace_root().join("target/nfs-guest");
    assert!(
        guest_dir.join("vmlinuz").exists(),
        "{} has no guest kernel: run `bash scripts/setup-tests.sh` as root",
        guest_dir.display()
    );
    // Not under /tmp: the guest mounts a tmpfs there, over the host's.
    let scratch = tempfile::Builder::new()
        .prefix("stagefs-guest-")
        .tempdir_in("/var/tmp")
        .expect("scratch dir");
    let dir = scratch.path().to_path_buf();
    let src = dir.join("src");
    let model = generate(&src.join("hub"), REPO, 2, "6M");
    let folder = src.join("folders/tiny");
    fs::create_dir_all(&folder).expect("folder");
    for file in &model.files {
        let from = src.join("hub").join(&model.snapshot_rel).join(&file.name);
        fs::copy(&from, folder.join(&file.name)).expect("copy into the folder");
    }
    let lifecycle_src = dir.join("lifecycle-src");
    generate(&lifecycle_src, "acme/lifecycle", 1, "3M");

    let (mut server, nfs_port) = start_server(&src, &dir.join("cache"));
    fs::write(
        dir.join("guest.sh"),
        guest_script(&dir, &src, &lifecycle_src),
    )
    .expect("guest.sh");

    let mut guest = Command::new("bash")
        .arg(workspace_root().join("tests/vm/run-guest.sh"))
        .arg(&dir)
        .env("NFS_PORT", nfs_port.to_string())
        .env("GUEST_TIMEOUT", "480")
        .stderr(Stdio::piped())
        .spawn()
        .expect("run-guest.sh");
    // The last phase: the guest asks for the server to die while it has the mount.
    let started = Instant::now();
    let mut killed = false;
    let status = loop {
        if let Some(status) = guest.try_wait().expect("wait for the guest") {
            break status;
        }
        if !killed && dir.join("kill-server").exists() {
            let _ = server.kill();
            let _ = server.wait();
            fs::write(dir.join("server-killed"), b"").expect("note");
            killed = true;
        }
        assert!(
            started.elapsed() < Duration::from_secs(540),
            "the guest outlived its timeout"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut run_error = String::new();
    if let Some(mut stderr) = guest.stderr.take() {
        use std::io::Read;
        let _ = stderr.read_to_string(&mut run_error);
    }
    let _ = server.kill();
    let _ = server.wait();
    let lines = fs::read_to_string(dir.join("guest.out"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    let tail = |name: &str, n: usize| {
        let text = fs::read_to_string(dir.join(name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    };
    let evidence = format!(
        "run-guest.sh exited {status}: {run_error}\n--- console.log (tail) ---\n{}\n--- dmesg (tail) ---\n{}\n--- guest.out (tail) ---\n{}\n--- checks.err (tail) ---\n{}",
        tail("console.log", 30),
        tail("dmesg.txt", 30),
        tail("guest.out", 40),
        tail("checks.err", 30),
    );
    GuestRun { lines, evidence }
}

/// `stagefs serve SRC --cache-dir CACHE`, and its port, from the URL it prints.
fn start_server(src: &Path, cache: &Path) -> (Child, u16) {
    let mut server = Command::new(stagefs_bin())
        .args(["--no-config", "serve"])
        .arg(src)
        .arg("--cache-dir")
        .arg(cache)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("stagefs serve");
    let mut reader = BufReader::new(server.stdout.take().expect("stdout"));
    let mut line = String::new();
    while !line.contains("nfsport=") {
        line.clear();
        let read = reader.read_line(&mut line).expect("serve's output");
        assert!(read > 0, "stagefs serve printed no URL");
    }
    let port = line
        .split("nfsport=")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    // Whatever it prints later must not fill the pipe.
    std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
    (server, port)
}

/// What the guest runs, as root in the host's userland; every phase prints its
/// checks as `PASS name` / `FAIL name: why` into `guest.out`.
fn guest_script(dir: &Path, src: &Path, lifecycle_src: &Path) -> String {
    let root = workspace_root();
    let (dir, src, lifecycle) = (dir.display(), src.display(), lifecycle_src.display());
    let (python, checks, stagefs) = (
        root.join(".venv/bin/python"),
        root.join("tests/py/kernel_checks.py"),
        stagefs_bin(),
    );
    let (python, checks, stagefs) = (python.display(), checks.display(), stagefs.display());
    format!(
        r#"exec >{dir}/guest.out 2>&1
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp
pass() {{ echo "PASS $1"; }}
fail() {{ echo "FAIL $1: $2"; }}

# 1. The host's `stagefs serve`, mounted by this kernel (text options: mount(2)
#    does the MOUNT call itself; there is no mount.nfs here).
mkdir -p /tmp/nfs
if mount -i -t nfs -o vers=3,proto=tcp,port=2049,mountport=2049,mountproto=tcp,nolock,addr=10.0.2.100 10.0.2.100:/ /tmp/nfs; then
    pass "kernel: mount -t nfs of stagefs serve"
    {python} {checks} /tmp/nfs {src} {dir}/checks.json {REPO} 2>{dir}/checks.err
    umount /tmp/nfs && pass "kernel: umount" || fail "kernel: umount" "exit $?"
else
    fail "kernel: mount -t nfs of stagefs serve" "exit $?"
fi

# 2. `stagefs mount --backend nfs` here: its daemon, its own kernel mount, a read,
#    status, unmount.
mkdir -p /tmp/life
cache=/tmp/life-cache
if {stagefs} --no-config mount {lifecycle} /tmp/life --backend nfs --cache-dir $cache >/tmp/life.out 2>&1; then
    pass "lifecycle: stagefs mount --backend nfs"
    grep -q " /tmp/life nfs " /proc/mounts && pass "lifecycle: an nfs mount in /proc/mounts" || fail "lifecycle: an nfs mount in /proc/mounts" "$(grep /tmp/life /proc/mounts)"
    shard=$(find {lifecycle} -path '*/blobs/*' -size +1M | head -n1)
    rel=${{shard#{lifecycle}/}}
    if cmp -s "$shard" "/tmp/life/$rel"; then pass "lifecycle: a shard reads right"; else fail "lifecycle: a shard reads right" "cmp"; fi
    {stagefs} --no-config status --cache-dir $cache >/tmp/life-status.out 2>&1 && grep -q "acme/lifecycle" /tmp/life-status.out \
        && pass "lifecycle: status names the model" || fail "lifecycle: status names the model" "$(head -c 300 /tmp/life-status.out)"
    {stagefs} --no-config unmount /tmp/life >/tmp/life-unmount.out 2>&1 && ! grep -q " /tmp/life " /proc/mounts \
        && pass "lifecycle: stagefs unmount" || fail "lifecycle: stagefs unmount" "$(head -c 300 /tmp/life-unmount.out)"
else
    fail "lifecycle: stagefs mount --backend nfs" "$(tail -n 3 /tmp/life.out | tr '\n' ' ')"
fi

# 3. The host's server killed with the mount up: a hard mount waits for it, a
#    reader can be killed, and `umount -f -l` clears the mount.
if mount -i -t nfs -o vers=3,proto=tcp,port=2049,mountport=2049,mountproto=tcp,nolock,addr=10.0.2.100 10.0.2.100:/ /tmp/nfs; then
    ls /tmp/nfs >/dev/null
    touch {dir}/kill-server
    for i in $(seq 100); do [ -e {dir}/server-killed ] && break; sleep 0.1; done
    started=$(date +%s)
    timeout -s KILL 8 cat /tmp/nfs/folders/tiny/config.json >/dev/null 2>&1
    rc=$?
    echo "killed: a read through the mount ended with $rc after $(( $(date +%s) - started )) s"
    [ $rc -ne 0 ] && pass "killed: a read waits (hard mount) and SIGKILL ends it" || fail "killed: a read waits (hard mount) and SIGKILL ends it" "it returned $rc"
    if timeout -s KILL 20 umount -f -l /tmp/nfs; then
        ! grep -q " /tmp/nfs " /proc/mounts && pass "killed: umount -f -l clears the mount" || fail "killed: umount -f -l clears the mount" "still mounted"
    else
        fail "killed: umount -f -l clears the mount" "umount exit $?"
    fi
    timeout 5 ls /tmp >/dev/null && pass "killed: the guest is not wedged" || fail "killed: the guest is not wedged" "ls /tmp hung"
else
    fail "killed: remount" "exit $?"
fi
echo "guest done"
"#
    )
}

/// Asserts that the guest's lines starting `prefix` are there and all PASS.
fn assert_phase(prefix: &str, at_least: usize) {
    let run = &*GUEST;
    let mine: Vec<&String> = run
        .lines
        .iter()
        .filter(|line| {
            let name = line
                .strip_prefix("PASS ")
                .or_else(|| line.strip_prefix("FAIL "))
                .unwrap_or("");
            name.starts_with(prefix)
        })
        .collect();
    let failed: Vec<&&String> = mine.iter().filter(|l| l.starts_with("FAIL")).collect();
    assert!(
        failed.is_empty() && mine.len() >= at_least,
        "{} of {} `{prefix}` checks failed (at least {at_least} expected):\n{}\n\n{}",
        failed.len(),
        mine.len(),
        mine.iter()
            .map(|l| l.as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        run.evidence
    );
}

#[test]
fn the_guest_kernel_mounts_stagefs_serve_and_unmounts_it() {
    assert_phase("kernel:", 2);
}

#[test]
fn an_hf_home_and_a_plain_folder_read_right_through_the_kernel_client() {
    assert_phase("hub:", 4);
    assert_phase("folder:", 1);
}

#[test]
fn writes_listings_and_df_through_the_kernel_client_match_the_source() {
    assert_phase("write:", 6);
    assert_phase("dir:", 2);
    assert_phase("df:", 1);
    assert_phase("link:", 1);
}

#[test]
fn stagefs_mount_backend_nfs_runs_its_whole_lifecycle_under_a_kernel_client() {
    assert_phase("lifecycle:", 5);
}

#[test]
fn a_killed_server_hangs_reads_until_killed_and_umount_f_l_clears_the_mount() {
    assert_phase("killed:", 3);
}

#[test]
fn the_guest_closing_line_counts_every_check() {
    let run = &*GUEST;
    let closing = run
        .lines
        .iter()
        .find(|l| l.ends_with(" failed") && l.contains(" passed, "));
    assert!(
        closing.is_some_and(|l| l.ends_with(" 0 failed")),
        "closing line: {closing:?}\n\n{}",
        run.evidence
    );
}
