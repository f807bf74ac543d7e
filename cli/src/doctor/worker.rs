//! Everything that touches the source, or a path that may lie on a dead mount, runs in
//! one worker process per run: `stagefs --no-config doctor --worker` reads its tasks
//! as JSON on stdin, runs each on its own thread and prints one JSON [`Line`] per
//! finished probe. The parent reads the lines until one deadline, reports whatever
//! arrived and kills the worker. A thread stuck in a request to a dead share cannot
//! be killed, but a process nobody waits for does not hold doctor up.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
// Why a probe has no answer: the words `mount` uses for a source that does not answer.
use stagefs_mount::bounded::Unanswered;

use super::lines::{Gathered, Line, StepError, Tx, reply};
use super::{source, space};

/// What a worker is asked to do; each task runs on its own thread.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Task {
    /// The source checks for doctor's argument, else the configured source (with the
    /// configured `model_dirs`).
    Source(Option<String>, Option<PathBuf>, Vec<PathBuf>),
    /// Where the cache directory is; then whether a daemon serves the mount point from
    /// it (its control socket lives there, so it is asked only once that answered),
    /// and if asked (`true`), the shape of that mount's source.
    Cache(PathBuf, Option<PathBuf>, bool),
    /// A path with links resolved; no line when it cannot be.
    Resolve(PathBuf),
}

/// Runs `tasks` in one worker and gathers what it answers within `deadline`.
pub(crate) fn gather(tasks: Vec<Task>, deadline: Duration) -> Gathered {
    let (answers, child) = match start(tasks) {
        Ok(started) => started,
        Err(e) => {
            let lines = Vec::new();
            let missing = Unanswered::Broken(format!("starting a worker: {e}"));
            return Gathered { lines, missing };
        }
    };
    let gathered = collect(answers, deadline);
    if let Some(mut child) = child {
        let _ = child.kill();
        // One that closed its output has ended: reap it, so that no zombie outlives this
        // call (`stagefs run` execs the user's command next). No wait for one that is
        // late: the kernel may hold it until the source answers.
        let _ = match gathered.missing {
            Unanswered::Late(_) => child.try_wait(),
            Unanswered::Broken(_) => child.wait().map(Some),
        };
    }
    gathered
}

/// Reads lines from `answers` until it ends or `deadline` passes. A line that does
/// not parse is skipped: the probe it carried counts as unanswered.
pub(crate) fn collect(answers: impl Read + Send + 'static, deadline: Duration) -> Gathered {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // Bytes, not text: a line that is not UTF-8 is one more malformed line.
        for bytes in BufReader::new(answers).split(b'\n').map_while(Result::ok) {
            let text = String::from_utf8_lossy(&bytes);
            let line = serde_json::from_slice::<Line>(&bytes).map_err(|e| format!("{e}: {text}"));
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let end = Instant::now() + deadline;
    let (mut lines, mut why) = (Vec::new(), "the worker ended early".to_string());
    let missing = loop {
        match rx.recv_timeout(end.saturating_duration_since(Instant::now())) {
            Ok(Ok(line)) => lines.push(line),
            Ok(Err(e)) => why = format!("reading the worker's answer: {e}"),
            Err(RecvTimeoutError::Timeout) => break Unanswered::Late(deadline),
            Err(RecvTimeoutError::Disconnected) => break Unanswered::Broken(why),
        }
    };
    Gathered { lines, missing }
}

/// Unit tests have no stagefs binary to start: the worker runs on a thread.
#[cfg(test)]
fn start(tasks: Vec<Task>) -> io::Result<(io::PipeReader, Option<std::process::Child>)> {
    let (reader, writer) = io::pipe()?;
    std::thread::spawn(move || work(tasks, writer));
    Ok((reader, None))
}

#[cfg(not(test))]
fn start(tasks: Vec<Task>) -> io::Result<(std::process::ChildStdout, Option<std::process::Child>)> {
    use std::process::{Command, Stdio};
    // Its own pipes, never doctor's stdout or stderr: a worker stuck in the kernel
    // would otherwise keep whoever reads doctor's output waiting.
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--no-config", "doctor", "--worker"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let pipes = child.stdin.take().zip(child.stdout.take());
    let (mut stdin, stdout) = pipes.ok_or_else(|| io::Error::other("no pipes"))?;
    // A few hundred bytes fit in the pipe whatever the worker does; closing it (as
    // this returns) ends the job.
    stdin.write_all(&serde_json::to_vec(&tasks)?)?;
    Ok((stdout, Some(child)))
}

/// The worker's side: tasks from stdin, a line on stdout for each probe as it ends.
pub(crate) fn serve() -> anyhow::Result<ExitCode> {
    let tasks: Vec<Task> = serde_json::from_reader(io::stdin())?;
    work(tasks, io::stdout())?;
    Ok(ExitCode::SUCCESS)
}

fn work(tasks: Vec<Task>, mut out: impl Write) -> io::Result<()> {
    let (tx, rx) = mpsc::channel();
    for task in tasks {
        let tx = tx.clone();
        std::thread::spawn(move || task.run(&tx));
    }
    drop(tx);
    for line in rx {
        writeln!(out, "{}", serde_json::to_string(&line)?)?;
        out.flush()?;
    }
    Ok(())
}

impl Task {
    fn run(self, tx: &Tx) {
        let send = |line| reply(tx, line);
        match self {
            Task::Source(arg, source, dirs) => {
                source::probe(arg.as_deref(), source.as_deref(), dirs, tx)
            }
            Task::Cache(dir, mountpoint, shape) => {
                let place = space::place(&dir).map_err(StepError::of);
                let answered = place.is_ok();
                send(Line::Cache(place));
                if let (true, Some(mountpoint)) = (answered, mountpoint) {
                    super::hub::probe_mount(&dir, &mountpoint, shape, tx);
                }
            }
            Task::Resolve(path) => {
                if let Ok(resolved) = std::fs::canonicalize(&path) {
                    send(Line::Resolved(path, resolved));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::lines::DEADLINE;
    use super::*;

    const SHORT: Duration = Duration::from_millis(50);

    fn resolved(text: &str) -> String {
        let line = Line::Resolved(PathBuf::from("/a"), PathBuf::from(text));
        serde_json::to_string(&line).expect("encodes") + "\n"
    }

    #[test]
    fn answers_before_a_hang_are_kept_and_the_rest_is_late() -> io::Result<()> {
        let (silent, _open) = io::pipe()?;
        let nothing = collect(silent, SHORT);
        assert!(nothing.lines.is_empty());
        assert_eq!(nothing.missing, Unanswered::Late(SHORT));
        let (reader, mut writer) = io::pipe()?;
        writer.write_all(resolved("/b").as_bytes())?;
        let gathered = collect(reader, SHORT);
        assert_eq!(gathered.resolved(Path::new("/a")), Path::new("/b"));
        assert_eq!(gathered.resolved(Path::new("/c")), Path::new("/c"));
        assert_eq!(gathered.missing.to_string(), "did not answer within 0s");
        Ok(())
    }

    #[test]
    fn malformed_lines_are_skipped_and_named() {
        // Not JSON, not UTF-8, then a good line, then JSON of the wrong shape.
        let mut bytes = b"not json\n\xff\xfe\n".to_vec();
        bytes.extend(resolved("/b").bytes().chain(*b"{\"Located\": 3}\n"));
        let gathered = collect(io::Cursor::new(bytes), DEADLINE);
        assert_eq!(gathered.lines.len(), 1);
        let why = gathered.missing.to_string();
        let expected = "could not be examined (reading the worker's answer: ";
        assert!(why.starts_with(expected), "{why}");
        let ended = collect(io::Cursor::new(""), DEADLINE).missing.to_string();
        assert_eq!(ended, "could not be examined (the worker ended early)");
    }
}
