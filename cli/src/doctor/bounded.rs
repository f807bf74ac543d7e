//! Deadlines. Work that can block only in killable waits (a socket, a pipe) runs on
//! a thread here; work that touches the source goes to a child process instead (see
//! `worker`), because a thread stuck in a FUSE request the daemon already took can
//! never be killed, and would keep doctor from exiting.

use std::fmt;
use std::sync::mpsc;
use std::time::Duration;

/// How long one step against the source may take.
pub(crate) const SOURCE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a step has no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unanswered {
    /// It did not finish in time.
    Late(Duration),
    /// The step could not be run at all (no thread, no child process).
    Broken(String),
}

impl fmt::Display for Unanswered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unanswered::Late(after) => write!(f, "did not answer within {}s", after.as_secs()),
            Unanswered::Broken(why) => write!(f, "could not be examined ({why})"),
        }
    }
}

/// Runs `work` on a thread and waits at most `timeout` for its result. Only for work
/// whose waits a signal can end: the thread is abandoned when it is late.
pub(crate) fn bounded<T: Send + 'static>(
    timeout: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Unanswered> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("doctor-io".into())
        .spawn(move || {
            // The receiver is gone only when the caller gave up waiting.
            let _ = tx.send(work());
        })
        .map_err(|e| Unanswered::Broken(format!("starting a thread: {e}")))?;
    rx.recv_timeout(timeout)
        .map_err(|_| Unanswered::Late(timeout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_result_or_gives_up() {
        assert_eq!(bounded(Duration::from_secs(5), || 7), Ok(7));
        let stuck = bounded(Duration::from_millis(20), || {
            std::thread::sleep(Duration::from_secs(2));
        });
        assert_eq!(stuck, Err(Unanswered::Late(Duration::from_millis(20))));
        assert_eq!(
            Unanswered::Late(SOURCE_TIMEOUT).to_string(),
            "did not answer within 10s"
        );
    }
}
