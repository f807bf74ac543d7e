//! A running `stagefs serve`, as the NFS tests (user-space clients and the kernel
//! client of the guest) drive it: started, its libnfs URL read from its first line,
//! stopped with SIGTERM when dropped.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::stagefs_bin;

/// A running `stagefs serve`, stopped (SIGTERM) when dropped.
#[derive(Debug)]
pub struct Served {
    child: Child,
    /// The export's libnfs URL, as its first line said.
    pub url: String,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl Served {
    /// `stagefs serve SOURCE --cache-dir CACHE FLAGS`, once it has printed its URL.
    pub fn start(source: &Path, cache: &Path, flags: &[&str]) -> Served {
        Served::start_with(Command::new(stagefs_bin()), source, cache, flags)
    }

    /// [`Served::start`] with `command` (`stagefs`, run as whoever it says).
    pub fn start_with(command: Command, source: &Path, cache: &Path, flags: &[&str]) -> Served {
        Served::try_start_with(command, source, cache, flags).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Served::start`], saying why it did not start instead of panicking.
    pub fn try_start(source: &Path, cache: &Path, flags: &[&str]) -> Result<Served, String> {
        Served::try_start_with(Command::new(stagefs_bin()), source, cache, flags)
    }

    fn try_start_with(
        mut command: Command,
        source: &Path,
        cache: &Path,
        flags: &[&str],
    ) -> Result<Served, String> {
        let mut child = command
            .args(["--no-config", "serve"])
            .arg(source)
            .arg("--cache-dir")
            .arg(cache)
            .args(flags)
            // The tests' own reserve, not a tenth of whatever disk the machine has.
            .args(crate::test_reserve(flags))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting stagefs serve: {e}"))?;
        let mut first = String::new();
        let stdout = child.stdout.take().expect("stdout");
        let _ = BufReader::new(stdout).read_line(&mut first);
        let url = first.trim().to_string();
        let port: Option<u16> = url
            .split("nfsport=")
            .nth(1)
            .and_then(|rest| rest.split('&').next())
            .and_then(|p| p.parse().ok());
        match port {
            Some(port) => Ok(Served {
                child,
                url,
                addr: SocketAddr::from(([127, 0, 0, 1], port)),
            }),
            None => {
                let _ = child.kill();
                let out = child.wait_with_output().map_err(|e| e.to_string())?;
                Err(format!(
                    "stagefs serve printed no URL ({first:?}): {}",
                    String::from_utf8_lossy(&out.stderr)
                ))
            }
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The libnfs URL of `rel` in the export (libnfs mounts the URL's directory).
    pub fn url_of(&self, rel: impl AsRef<Path>) -> String {
        let port = self.port();
        format!(
            "nfs://127.0.0.1/{}?nfsport={port}&mountport={port}&version=3",
            rel.as_ref().display()
        )
    }

    /// `nfs-cat` of `rel` in the export as root (libnfs binds a reserved port as
    /// root), bounded in time.
    pub fn cat(&self, rel: impl AsRef<Path>) -> Output {
        Command::new("timeout")
            .args(["20", "nfs-cat", &self.url_of(rel)])
            .output()
            .expect("running nfs-cat (libnfs-utils)")
    }

    /// The bytes of `rel` read through the export with libnfs. libnfs passes a
    /// JUKEBOX answer on as an error rather than retrying, so a read of a file still
    /// staging is retried, as the kernel client does.
    pub fn read(&self, rel: impl AsRef<Path>) -> Vec<u8> {
        let rel = rel.as_ref();
        for _ in 0..60 {
            let out = self.cat(rel);
            if out.status.success() {
                return out.stdout;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let out = self.cat(rel);
        panic!(
            "nfs-cat {} failed: {}",
            self.url_of(rel),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Sends SIGTERM and waits for the process to end.
    pub fn stop(mut self) {
        self.terminate();
    }

    /// [`Served::stop`], then what the server logged (its stderr).
    pub fn stop_with_log(mut self) -> String {
        self.terminate();
        let mut log = String::new();
        if let Some(mut stderr) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut stderr, &mut log);
        }
        log
    }

    /// Kills the process at once, as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn terminate(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.terminate();
        }
    }
}
