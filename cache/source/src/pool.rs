//! A bounded executor for operations on the source, apart from local I/O.
//!
//! A NAS that stops answering leaves every thread that asked it stuck in the kernel,
//! and such a thread cannot be cancelled. So source operations run on a fixed set of
//! threads of their own:
//! - however many requests arrive while the source is dead, at most `threads` are
//!   stuck, and local reads, replies and `status` never wait behind them;
//! - a caller waits at most its deadline; an operation that has not started by then
//!   is dropped, never run late;
//! - once every thread has been stuck for longer than the timeout, new operations
//!   fail at once instead of queueing behind them.
//!
//! It also keeps the source's health as the mount sees it: whether an operation
//! timed out (the source is *unresponsive* until a probe says otherwise), and whether
//! one is overdue right now, so callers with an answer from memory need not wait.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub use crate::error::Unanswered;
use crate::locks::{lock, wait};
pub use stagefs_control::SourceHealth;

/// How long an operation may run before the source counts as suspect: a healthy
/// source answers a stat in milliseconds, and a loader must not wait on one that has
/// just died when the answer is already known.
pub const SUSPECT_AFTER: Duration = Duration::from_millis(60);

/// How long a request that cannot be answered from memory waits for a source already
/// known to be away (until a probe sees it back). A source that is back answers a
/// stat in milliseconds; one that is still away would otherwise cost every new name
/// a loader looks up the whole timeout (30 s per lookup, measured in issue 34).
pub const KNOWN_AWAY_WAIT: Duration = Duration::from_millis(500);

/// Threads a mount gives to source operations unless told otherwise.
pub const DEFAULT_SOURCE_THREADS: usize = 16;

type Job = Box<dyn FnOnce() + Send>;

/// The executor; dropping it lets its idle threads exit (stuck ones stay stuck).
#[derive(Debug)]
pub struct SourcePool {
    inner: Arc<Inner>,
}

struct Inner {
    queue: Mutex<VecDeque<Job>>,
    work: Condvar,
    closed: AtomicBool,
    threads: usize,
    timeout: Duration,
    /// Start times of the operations running now, by id.
    running: Mutex<HashMap<u64, Instant>>,
    next_id: AtomicU64,
    unresponsive: AtomicBool,
    probing: AtomicBool,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourcePool")
            .field("threads", &self.threads)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl SourcePool {
    /// A pool of `threads` threads whose operations time out after `timeout`.
    pub fn new(threads: usize, timeout: Duration) -> SourcePool {
        let inner = Arc::new(Inner {
            queue: Mutex::default(),
            work: Condvar::new(),
            closed: AtomicBool::new(false),
            threads: threads.max(1),
            timeout,
            running: Mutex::default(),
            next_id: AtomicU64::new(0),
            unresponsive: AtomicBool::new(false),
            probing: AtomicBool::new(false),
        });
        for n in 0..inner.threads {
            let worker = Arc::clone(&inner);
            // A thread that cannot be started leaves the pool smaller, not broken.
            let _ = std::thread::Builder::new()
                .name(format!("stagefs-source-{n}"))
                .spawn(move || worker.serve());
        }
        SourcePool { inner }
    }

    /// How long an operation may take before it counts as timed out.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// Runs `op` on a source thread and waits for it up to the pool's timeout. The
    /// operation is queued at once; the future only waits, so it may be moved
    /// elsewhere (to keep listening for a late answer) or dropped.
    pub fn run<T: Send + 'static>(
        &self,
        op: impl FnOnce() -> T + Send + 'static,
    ) -> impl Future<Output = Result<T, Unanswered>> + Send + 'static {
        self.run_for(self.inner.timeout, op)
    }

    /// Runs `op` on a source thread and waits for it up to `deadline`. A timed-out
    /// operation that has started goes on (nothing can stop it) and its result is
    /// dropped; one that has not started never runs.
    pub fn run_for<T: Send + 'static>(
        &self,
        deadline: Duration,
        op: impl FnOnce() -> T + Send + 'static,
    ) -> impl Future<Output = Result<T, Unanswered>> + Send + 'static {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let submitted = self.submit(op, move |result| {
            let _ = tx.send(result);
        });
        async move {
            let cancelled = submitted?;
            match tokio::time::timeout(deadline, rx).await {
                Ok(Ok(result)) => Ok(result),
                // The worker dropped the job (the pool closed): nothing will answer.
                Ok(Err(_)) => Err(Unanswered::TimedOut),
                Err(_) => {
                    cancelled.store(true, Ordering::Relaxed);
                    Err(Unanswered::TimedOut)
                }
            }
        }
    }

    /// Like [`SourcePool::run`], for callers on a thread of their own.
    pub fn run_blocking<T: Send + 'static>(
        &self,
        op: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Unanswered> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let cancelled = self.submit(op, move |result| {
            let _ = tx.send(result);
        })?;
        rx.recv_timeout(self.inner.timeout).map_err(|_| {
            cancelled.store(true, Ordering::Relaxed);
            Unanswered::TimedOut
        })
    }

    fn submit<T: Send + 'static>(
        &self,
        op: impl FnOnce() -> T + Send + 'static,
        answer: impl FnOnce(T) + Send + 'static,
    ) -> Result<Arc<AtomicBool>, Unanswered> {
        if self.saturated() {
            return Err(Unanswered::Saturated);
        }
        let cancelled = Arc::new(AtomicBool::new(false));
        let skip = Arc::clone(&cancelled);
        let inner = Arc::clone(&self.inner);
        let job: Job = Box::new(move || {
            if skip.load(Ordering::Relaxed) {
                return;
            }
            let id = inner.started();
            let result = op();
            lock(&inner.running).remove(&id);
            answer(result);
        });
        lock(&self.inner.queue).push_back(job);
        self.inner.work.notify_one();
        Ok(cancelled)
    }

    /// Whether every source thread is stuck: a new operation would be refused.
    pub fn saturated(&self) -> bool {
        self.health().stuck >= self.inner.threads
    }

    /// Operations running now, how many are stuck, and whether the source answers.
    pub fn health(&self) -> SourceHealth {
        let running = lock(&self.inner.running);
        SourceHealth {
            unresponsive: self.is_unresponsive(),
            running: running.len(),
            stuck: running
                .values()
                .filter(|t| t.elapsed() >= self.inner.timeout)
                .count(),
            threads: self.inner.threads,
        }
    }

    /// Whether some operation has been running for at least `after`: the source is
    /// slow or gone right now, so a request that can be answered from memory should be.
    pub fn overdue(&self, after: Duration) -> bool {
        lock(&self.inner.running)
            .values()
            .any(|t| t.elapsed() >= after)
    }

    /// Whether the source is unresponsive, or an operation on it is overdue
    /// ([`SUSPECT_AFTER`]): what can be answered from memory should be, now.
    pub fn suspect(&self) -> bool {
        self.is_unresponsive() || self.overdue(SUSPECT_AFTER)
    }

    /// How long a request should wait for the source now: the timeout, or
    /// [`KNOWN_AWAY_WAIT`] while the source is known to be away.
    pub fn patience(&self) -> Duration {
        if self.is_unresponsive() {
            KNOWN_AWAY_WAIT.min(self.inner.timeout)
        } else {
            self.inner.timeout
        }
    }

    /// Returns once the source is [`SourcePool::suspect`].
    pub async fn until_suspect(&self) {
        while !self.suspect() {
            tokio::time::sleep(SUSPECT_AFTER / 5).await;
        }
    }

    /// Whether an operation timed out and no probe has seen the source since.
    pub fn is_unresponsive(&self) -> bool {
        self.inner.unresponsive.load(Ordering::Relaxed)
    }

    /// Records that an operation timed out; true if the source was thought fine.
    pub fn mark_unresponsive(&self) -> bool {
        !self.inner.unresponsive.swap(true, Ordering::Relaxed)
    }

    /// Records that the source answered a probe; true if it was thought unresponsive.
    pub fn mark_answered(&self) -> bool {
        self.inner.unresponsive.swap(false, Ordering::Relaxed)
    }

    /// Takes the right to probe the source; None while another probe runs.
    pub fn start_probe(&self) -> Option<ProbeGuard> {
        let taken = !self.inner.probing.swap(true, Ordering::Relaxed);
        taken.then(|| ProbeGuard {
            inner: Arc::clone(&self.inner),
        })
    }
}

/// Held while a probe runs; dropping it lets the next one start.
#[derive(Debug)]
pub struct ProbeGuard {
    inner: Arc<Inner>,
}

impl Drop for ProbeGuard {
    fn drop(&mut self) {
        self.inner.probing.store(false, Ordering::Relaxed);
    }
}

impl Drop for SourcePool {
    fn drop(&mut self) {
        self.inner.closed.store(true, Ordering::Relaxed);
        self.inner.work.notify_all();
    }
}

impl Inner {
    fn serve(&self) {
        loop {
            let job = {
                let mut queue = lock(&self.queue);
                loop {
                    if let Some(job) = queue.pop_front() {
                        break job;
                    }
                    if self.closed.load(Ordering::Relaxed) {
                        return;
                    }
                    queue = wait(&self.work, queue);
                }
            };
            job();
        }
    }

    fn started(&self) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.running).insert(id, Instant::now());
        id
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// Holds operations like a dead NAS does, until it is opened.
    #[derive(Clone, Default)]
    struct Gate(Arc<(Mutex<bool>, Condvar)>);

    impl Gate {
        fn hang(&self) -> impl FnOnce() + Send + 'static {
            let gate = self.clone();
            move || {
                let (open, changed) = &*gate.0;
                let mut open = lock(open);
                while !*open {
                    open = wait(changed, open);
                }
            }
        }

        fn open(&self) {
            *lock(&self.0.0) = true;
            self.0.1.notify_all();
        }
    }

    fn wait_until(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[tokio::test]
    async fn answers_come_back_from_the_source_threads() {
        let pool = SourcePool::new(2, Duration::from_secs(5));
        let name = pool
            .run(|| std::thread::current().name().map(str::to_string))
            .await;
        assert!(matches!(name, Ok(Some(n)) if n.starts_with("stagefs-source-")));
        assert_eq!(pool.run_blocking(|| 7), Ok(7));
    }

    #[tokio::test]
    async fn a_hung_operation_times_out_and_counts_as_stuck() {
        let gate = Gate::default();
        let pool = SourcePool::new(2, Duration::from_millis(50));
        assert_eq!(pool.run(gate.hang()).await, Err(Unanswered::TimedOut));
        wait_until("the hung operation to count as stuck", || {
            pool.health().stuck == 1
        });
        assert!(pool.overdue(Duration::from_millis(1)));
        // The other thread still serves.
        assert_eq!(pool.run(|| 1).await, Ok(1));
        gate.open();
        wait_until("the released operation to finish", || {
            pool.health().running == 0
        });
        assert!(!pool.overdue(Duration::ZERO));
    }

    #[tokio::test]
    async fn once_every_thread_is_stuck_new_operations_fail_at_once() {
        let gate = Gate::default();
        let pool = SourcePool::new(2, Duration::from_millis(20));
        for _ in 0..2 {
            assert_eq!(pool.run(gate.hang()).await, Err(Unanswered::TimedOut));
        }
        wait_until("both threads to be stuck", || pool.health().stuck == 2);
        let ran = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&ran);
        let started = Instant::now();
        let refused = pool.run(move || flag.store(true, Ordering::Relaxed)).await;
        assert_eq!(refused, Err(Unanswered::Saturated));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "refused, not waited"
        );
        assert_eq!(pool.health().running, 2, "the stuck count is bounded");
        gate.open();
        wait_until("the threads to come free", || pool.health().running == 0);
        assert!(!ran.load(Ordering::Relaxed));
        assert_eq!(pool.run(|| 2).await, Ok(2));
    }

    #[tokio::test]
    async fn an_operation_that_timed_out_before_it_started_never_runs() {
        let gate = Gate::default();
        let pool = SourcePool::new(1, Duration::from_secs(60));
        let short = Duration::from_millis(20);
        assert_eq!(
            pool.run_for(short, gate.hang()).await,
            Err(Unanswered::TimedOut)
        );
        let (tx, rx) = mpsc::channel();
        let queued = pool.run_for(short, move || tx.send(()).ok()).await;
        assert_eq!(queued, Err(Unanswered::TimedOut));
        gate.open();
        wait_until("the thread to come free", || pool.health().running == 0);
        assert_eq!(pool.run_blocking(|| 3), Ok(3));
        assert!(rx.try_recv().is_err(), "the dropped operation ran late");
    }

    #[test]
    fn health_flags_and_one_probe_at_a_time() {
        let pool = SourcePool::new(1, Duration::from_secs(1));
        assert!(pool.mark_unresponsive());
        assert!(!pool.mark_unresponsive());
        assert!(pool.health().unresponsive);
        let probe = pool.start_probe();
        assert!(probe.is_some());
        assert!(pool.start_probe().is_none());
        drop(probe);
        assert!(pool.start_probe().is_some());
        assert!(pool.mark_answered());
        assert!(!pool.is_unresponsive());
    }
}
