//! Supervision of the server's async tasks: none may die unseen.
//!
//! A task whose state can be rebuilt (a watch relists, the probes start
//! over, the accept loop takes its listener again) is restarted after a
//! backoff whether it panicked or returned, and its panics are counted. A
//! task that holds state nothing else has (the store's writer, the HTTP
//! server that answers the liveness probe) is fatal: its death is recorded
//! in [`Failures`], `/health` fails from then on, and the command returns an
//! error so the process exits non-zero and Kubernetes restarts the Pod.
//! A half-dead server, answering nothing while its probes say it is fine,
//! is the outcome this exists to prevent.
//!
//! | task | on panic (or, for a loop, on return) | why |
//! |---|---|---|
//! | answering one UDP query | that query gets no answer; counted | the worker's buffers are rebuilt; losing one packet is what UDP allows |
//! | a UDP worker's loop | restarted on the same socket | the socket is the state; the kernel keeps hashing that share of clients to it |
//! | one TCP connection | closed; counted | RFC 7766 clients reconnect |
//! | TCP accept loop | restarted on the same listener | the listener and the connection limits (`TcpServer`) outlive it |
//! | files, Kubernetes and member watches, liveness | restarted with backoff (100 ms doubling to 10 s) | a restart re-reads or relists: the same path as recovery from an API error |
//! | probes | restarted with backoff | probe state is a cache; endpoints start healthy again, as at start |
//! | store writer | fatal | it holds every source's objects; nothing in the process can rebuild them, and a server that can no longer change is silently stale |
//! | HTTP server | fatal | it answers the liveness probe; without it Kubernetes cannot see the process |
//!
//! A restart rather than an exit where state can be rebuilt, because an
//! exit drops every answer for the seconds a Pod takes to restart, and one
//! packet that triggers a bug would then be a denial of service; an exit
//! where it cannot, because serving forever from a frozen store is worse.
//! The panic hook ([`install_panic_hook`]) logs at most
//! [`PANIC_LOGS_PER_SECOND`]. Never build with `panic = "abort"`:
//! supervision relies on unwinding.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio::task::JoinHandle;
use tracing::{error, warn};

use crate::fault::{Failures, Task, panic_message};
use crate::pace::{Backoff, Jitter};

/// The wait before a restart: 100 ms, doubled per restart up to 10 s. No
/// jitter: a restart is this process's own, nobody else's retries to
/// spread from.
const RESTART_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(10), Jitter::None);
/// A task that ran this long before dying starts again from the first wait.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// Spawns and watches tasks, recording their failures in one [`Failures`].
#[derive(Clone)]
pub struct Supervisor {
    failures: Arc<Failures>,
}

impl Supervisor {
    /// A supervisor recording into `failures`.
    pub fn new(failures: Arc<Failures>) -> Self {
        Self { failures }
    }

    /// Where failures are recorded.
    pub fn failures(&self) -> &Arc<Failures> {
        &self.failures
    }

    /// Runs `make()` as `task`, and again after a backoff whenever it
    /// panics or returns, until the handle is aborted.
    pub fn restartable<F, Fut>(&self, task: Task, mut make: F) -> JoinHandle<()>
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let failures = self.failures.clone();
        tokio::spawn(async move {
            let mut backoff = RESTART_BACKOFF;
            loop {
                let started = Instant::now();
                // Making the future may panic too; that counts the same.
                let run = match std::panic::catch_unwind(AssertUnwindSafe(&mut make)) {
                    Ok(fut) => AssertUnwindSafe(fut).catch_unwind().await,
                    Err(payload) => Err(payload),
                };
                match run {
                    Ok(()) => warn!(task = task.name(), "task ended; restarting it"),
                    Err(payload) => {
                        failures.panicked(task);
                        error!(
                            task = task.name(),
                            panic = panic_message(&*payload),
                            "task panicked; restarting it"
                        );
                    }
                }
                if started.elapsed() >= HEALTHY_RUN {
                    backoff.reset();
                }
                tokio::time::sleep(backoff.next_wait()).await;
            }
        })
    }

    /// Runs `fut` as `task`; if it panics or returns, the server is failed:
    /// `/health` fails and the command ends with the reason.
    pub fn fatal<Fut>(&self, task: Task, fut: Fut) -> JoinHandle<()>
    where
        Fut: Future<Output = ()> + Send + 'static,
    {
        let failures = self.failures.clone();
        tokio::spawn(async move {
            let reason = match AssertUnwindSafe(fut).catch_unwind().await {
                Ok(()) => format!("task {} ended and cannot be restarted", task.name()),
                Err(payload) => {
                    failures.panicked(task);
                    format!(
                        "task {} panicked and cannot be restarted: {}",
                        task.name(),
                        panic_message(&*payload)
                    )
                }
            };
            error!(task = task.name(), "{reason}; the server fails /health and exits");
            failures.fatal(reason);
        })
    }
}

/// Makes one run of a restartable task.
pub type Maker = Arc<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// A set of restartable tasks owned by one future (the sync controller's
/// watches, probes and discoveries): dropped with it, so none keeps running
/// beside its successor. A task that panics or returns is counted and
/// started again after its backoff, as [`Supervisor::restartable`] does,
/// but only while its owner polls [`TaskSet::restart_next`].
pub struct TaskSet {
    set: tokio::task::JoinSet<()>,
    /// By the key [`TaskSet::spawn`] gave, which outlives restarts.
    tasks: std::collections::HashMap<u64, Entry>,
    /// The key of each run.
    runs: std::collections::HashMap<tokio::task::Id, u64>,
    next: u64,
    failures: Arc<Failures>,
}

struct Entry {
    task: Task,
    name: String,
    handle: tokio::task::AbortHandle,
    make: Maker,
    backoff: crate::pace::Backoff,
    started: Instant,
}

/// A handle to one task of a [`TaskSet`] (across its restarts), to end it
/// on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskId(u64);

impl TaskSet {
    /// An empty set counting into `failures`.
    pub fn new(failures: Arc<Failures>) -> Self {
        Self {
            set: tokio::task::JoinSet::new(),
            tasks: std::collections::HashMap::new(),
            runs: std::collections::HashMap::new(),
            next: 0,
            failures,
        }
    }

    /// Starts `make()` as `task` (`name` says which, in the log), and again
    /// whenever it ends.
    pub fn spawn(&mut self, task: Task, name: String, make: Maker) -> TaskId {
        let handle = self.set.spawn(make());
        let key = self.next;
        self.next += 1;
        self.runs.insert(handle.id(), key);
        let entry = Entry { task, name, handle, make, backoff: RESTART_BACKOFF, started: Instant::now() };
        self.tasks.insert(key, entry);
        TaskId(key)
    }

    /// Ends a task for good (it is not restarted).
    pub fn abort(&mut self, id: TaskId) {
        if let Some(entry) = self.tasks.remove(&id.0) {
            self.runs.remove(&entry.handle.id());
            entry.handle.abort();
        }
    }

    /// How many tasks run.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// True when none runs.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Waits for a task to end, counts it, and starts it again after its
    /// backoff. Pending while none ends (forever, when the set is empty).
    pub async fn restart_next(&mut self) {
        loop {
            let Some(ended) = self.set.join_next_with_id().await else {
                return std::future::pending().await;
            };
            let (id, panic) = match ended {
                Ok((id, ())) => (id, None),
                Err(e) if e.is_cancelled() => continue,
                Err(e) => {
                    let id = e.id();
                    let message = e.try_into_panic().map(|p| panic_message(&*p).to_owned()).ok();
                    (id, message)
                }
            };
            // Aborted on purpose: gone from the map already.
            let Some(key) = self.runs.remove(&id) else { continue };
            let Some(mut entry) = self.tasks.remove(&key) else { continue };
            match panic {
                Some(message) => {
                    self.failures.panicked(entry.task);
                    error!(task = entry.task.name(), name = %entry.name, panic = %message, "task panicked; restarting it");
                }
                None => warn!(task = entry.task.name(), name = %entry.name, "task ended; restarting it"),
            }
            if entry.started.elapsed() >= HEALTHY_RUN {
                entry.backoff.reset();
            }
            let wait = entry.backoff.next_wait();
            let run = (entry.make)();
            entry.handle = self.set.spawn(async move {
                tokio::time::sleep(wait).await;
                run.await;
            });
            entry.started = Instant::now();
            self.runs.insert(entry.handle.id(), key);
            self.tasks.insert(key, entry);
            return;
        }
    }
}

/// Replaces the default panic hook, which writes every panic to stderr,
/// with one that logs through `tracing` at most [`PANIC_LOGS_PER_SECOND`]
/// a second: a query of death repeated by an attacker must not become a
/// flood of log lines. The panic is still caught and counted where it
/// happened; this only decides what is written.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        static WINDOW: AtomicU64 = AtomicU64::new(0);
        static LOGGED: AtomicU64 = AtomicU64::new(0);
        static SUPPRESSED: AtomicU64 = AtomicU64::new(0);
        let second = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        if WINDOW.swap(second, Ordering::Relaxed) != second {
            LOGGED.store(0, Ordering::Relaxed);
        }
        if LOGGED.fetch_add(1, Ordering::Relaxed) >= PANIC_LOGS_PER_SECOND {
            SUPPRESSED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let thread = std::thread::current();
        let location = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
        error!(
            thread = thread.name().unwrap_or("?"),
            %location,
            suppressed_before = SUPPRESSED.swap(0, Ordering::Relaxed),
            "panic: {}",
            panic_message(info.payload())
        );
    }));
}

/// Panic log lines written per second at most (the rest are counted in the
/// next line's `suppressed_before`).
pub const PANIC_LOGS_PER_SECOND: u64 = 5;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    // The clock paused: the restarts' backoffs and the 5 s below pass as
    // soon as every task waits, in the same order as in real time.
    #[tokio::test(start_paused = true)]
    async fn a_restartable_task_comes_back_after_panics_and_returns() {
        let sup = Supervisor::new(Failures::new());
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let handle = sup.restartable(Task::Probe, move || {
            let n = counted.fetch_add(1, Ordering::Relaxed);
            async move {
                match n {
                    0 => panic!("first run dies"),
                    1 => {} // second run returns
                    _ => std::future::pending().await,
                }
            }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(runs.load(Ordering::Relaxed), 3, "started three times");
        assert_eq!(sup.failures().panics(Task::Probe), 1);
        assert_eq!(sup.failures().fatal_reason(), None);
        handle.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_set_restarts_its_tasks_counts_panics_and_ends_only_aborted_ones() {
        let failures = Failures::new();
        let mut set = TaskSet::new(failures.clone());
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let flaky: Maker = Arc::new(move || {
            let n = counted.fetch_add(1, Ordering::Relaxed);
            Box::pin(async move {
                match n {
                    0 => panic!("first run dies"),
                    1 => {}
                    _ => std::future::pending().await,
                }
            })
        });
        set.spawn(Task::Watch, "flaky".into(), flaky);
        let stopped = Arc::new(AtomicUsize::new(0));
        let started = stopped.clone();
        let idle: Maker = Arc::new(move || {
            started.fetch_add(1, Ordering::Relaxed);
            Box::pin(std::future::pending())
        });
        let id = set.spawn(Task::Probe, "idle".into(), idle);
        assert_eq!(set.len(), 2);
        set.abort(id);
        assert_eq!(set.len(), 1);
        for _ in 0..2 {
            tokio::time::timeout(Duration::from_secs(5), set.restart_next()).await.expect("restarted");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(runs.load(Ordering::Relaxed), 3, "started three times");
        assert_eq!(failures.panics(Task::Watch), 1);
        assert_eq!(stopped.load(Ordering::Relaxed), 1, "the aborted one not restarted");
        assert!(tokio::time::timeout(Duration::from_secs(60), set.restart_next()).await.is_err());
    }

    #[tokio::test]
    async fn a_fatal_task_that_panics_fails_the_server_with_its_reason() {
        let sup = Supervisor::new(Failures::new());
        sup.fatal(Task::Writer, async { panic!("boom") });
        let reason = tokio::time::timeout(Duration::from_secs(5), sup.failures().wait_fatal())
            .await
            .expect("recorded");
        assert!(reason.contains("writer") && reason.contains("boom"), "{reason}");
        assert_eq!(sup.failures().panics(Task::Writer), 1);
    }

    #[tokio::test]
    async fn a_fatal_task_that_returns_fails_the_server_too() {
        let sup = Supervisor::new(Failures::new());
        sup.fatal(Task::Http, async {});
        let reason = tokio::time::timeout(Duration::from_secs(5), sup.failures().wait_fatal())
            .await
            .expect("recorded");
        assert!(reason.contains("http") && reason.contains("ended"), "{reason}");
        assert_eq!(sup.failures().panics(Task::Http), 0);
    }
}
