//! Failures of the server's own tasks: the names of the tasks, the count of
//! panics caught in each (`clusterset_dns_panics_total{task}`), the reason
//! the process is going down when a task that cannot be restarted died,
//! and test-only fault injection.
//!
//! A leaf module: the wire layer, the supervisor and the metrics all use it,
//! and it uses nothing of theirs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// A task of the server, as named in metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// A UDP worker thread (restarted on its socket; a panic while
    /// answering loses only that query).
    Udp,
    /// One TCP connection (closed; the others go on).
    Tcp,
    /// The TCP accept loop (restarted on its listener).
    TcpAccept,
    /// The store's single writer (cannot be restarted: fatal).
    Writer,
    /// The objects-files watch (restarted: re-reads every file).
    Files,
    /// A Kubernetes watch (restarted: relists).
    Watch,
    /// The centralized mode's member watches (restarted: relists).
    Members,
    /// Member liveness checks (restarted).
    Liveness,
    /// Active endpoint probes (restarted).
    Probe,
    /// The HTTP endpoints: a panicking request gets 500; the server
    /// itself ending is fatal (`/health` is the liveness probe).
    Http,
    /// The sync controller while leading (fatal: a new process, or the
    /// standby, takes over from complete lists).
    Controller,
    /// API discovery of a sync member (restarted).
    Discovery,
    /// The sync controller's election, on its own thread (fatal: the
    /// shards' fences close on their own, another replica takes them).
    Election,
}

impl Task {
    /// Every task, in metric order.
    pub const ALL: [Self; 13] = [
        Self::Udp,
        Self::Tcp,
        Self::TcpAccept,
        Self::Writer,
        Self::Files,
        Self::Watch,
        Self::Members,
        Self::Liveness,
        Self::Probe,
        Self::Http,
        Self::Controller,
        Self::Discovery,
        Self::Election,
    ];

    /// The `task` label.
    pub fn name(self) -> &'static str {
        match self {
            Self::Udp => "udp",
            Self::Tcp => "tcp",
            Self::TcpAccept => "tcp-accept",
            Self::Writer => "writer",
            Self::Files => "files",
            Self::Watch => "watch",
            Self::Members => "members",
            Self::Liveness => "liveness",
            Self::Probe => "probe",
            Self::Http => "http",
            Self::Controller => "controller",
            Self::Discovery => "discovery",
            Self::Election => "election",
        }
    }

    fn index(self) -> usize {
        Self::ALL.iter().position(|&t| t == self).unwrap_or(0)
    }
}

/// Panics caught per task, and the fatal failure if there was one. Shared
/// by every task of one server and read by `/health` and `/metrics`.
#[derive(Debug, Default)]
pub struct Failures {
    panics: [AtomicU64; Task::ALL.len()],
    fatal: OnceLock<String>,
    fatal_signal: tokio::sync::Notify,
}

impl Failures {
    /// A new, empty set.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Counts a panic caught in `task`.
    pub fn panicked(&self, task: Task) {
        self.panics[task.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Panics caught in `task` so far.
    pub fn panics(&self, task: Task) -> u64 {
        self.panics[task.index()].load(Ordering::Relaxed)
    }

    /// Records that a task that cannot be restarted died: `/health` fails
    /// from now on and the command returns this reason (the first one
    /// recorded wins).
    pub fn fatal(&self, reason: String) {
        let _ = self.fatal.set(reason);
        self.fatal_signal.notify_waiters();
        self.fatal_signal.notify_one();
    }

    /// Why the server is going down, once it is.
    pub fn fatal_reason(&self) -> Option<&str> {
        self.fatal.get().map(String::as_str)
    }

    /// Waits until a fatal failure is recorded.
    pub async fn wait_fatal(&self) -> &str {
        loop {
            let notified = self.fatal_signal.notified();
            if let Some(reason) = self.fatal_reason() {
                return reason;
            }
            notified.await;
        }
    }
}

/// The text of a caught panic's payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// Places in the code where a test can make the server panic, to prove it
/// survives (or fails loudly). Armed only in debug builds, from the
/// environment variable `CLUSTERSET_DNS_FAULT` (comma-separated point
/// names); a release build has no way to arm them.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    armed: Option<Arc<Armed>>,
}

/// A point where a fault can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// Answering a query whose first label is `panic`, over UDP or TCP;
    /// fires on every such query (a query of death).
    Query,
    /// A UDP worker's loop, outside answering; fires once.
    UdpLoop,
    /// The TCP accept loop; fires once.
    TcpAccept,
    /// The store writer, at the first update after start; fires once.
    Writer,
    /// The probe task, at its start; fires once.
    Probe,
    /// The first HTTP request; fires once.
    Http,
    /// The sync controller, when it starts leading; fires once.
    Controller,
}

const POINTS: [(Point, &str); 7] = [
    (Point::Query, "query"),
    (Point::UdpLoop, "udp-loop"),
    (Point::TcpAccept, "tcp-accept"),
    (Point::Writer, "writer"),
    (Point::Probe, "probe"),
    (Point::Http, "http"),
    (Point::Controller, "controller"),
];

#[derive(Debug, Default)]
struct Armed {
    points: [AtomicBool; POINTS.len()],
}

/// The environment variable that arms fault points in debug builds.
pub const FAULT_ENV: &str = "CLUSTERSET_DNS_FAULT";

impl Faults {
    /// The points named in `CLUSTERSET_DNS_FAULT`, in a debug build; none
    /// in a release build. An unknown name is an error naming it.
    pub fn from_env() -> Result<Self, String> {
        if !cfg!(debug_assertions) {
            return Ok(Self::default());
        }
        match std::env::var(FAULT_ENV) {
            Ok(list) => Self::parse(&list),
            Err(_) => Ok(Self::default()),
        }
    }

    /// Arms the points named in `list` (comma-separated).
    pub fn parse(list: &str) -> Result<Self, String> {
        let armed = Armed::default();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let i = POINTS.iter().position(|(_, n)| *n == name).ok_or_else(|| {
                let known: Vec<&str> = POINTS.iter().map(|(_, n)| *n).collect();
                format!("unknown fault point {name:?} (known: {})", known.join(", "))
            })?;
            armed.points[i].store(true, Ordering::Relaxed);
        }
        Ok(Self { armed: Some(Arc::new(armed)) })
    }

    /// True when `point` is armed; a point other than [`Point::Query`] is
    /// disarmed by the call that sees it armed.
    fn fires(&self, point: Point) -> bool {
        let Some(armed) = &self.armed else {
            return false;
        };
        let i = POINTS.iter().position(|(p, _)| *p == point).unwrap_or(0);
        if point == Point::Query {
            armed.points[i].load(Ordering::Relaxed)
        } else {
            armed.points[i].swap(false, Ordering::Relaxed)
        }
    }

    /// Panics when `point` is armed (and, for [`Point::Query`], `qname`'s
    /// first label is `panic`).
    pub fn point(&self, point: Point, qname: &[u8]) {
        if self.armed.is_none() {
            return;
        }
        if point == Point::Query && !qname.starts_with(b"\x05panic") {
            return;
        }
        if self.fires(point) {
            panic!("fault injected at {point:?} ({FAULT_ENV})");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_fire_once_except_the_query_of_death() {
        let f = Faults::parse("writer,query").expect("known points");
        assert!(f.fires(Point::Writer));
        assert!(!f.fires(Point::Writer), "once");
        assert!(f.fires(Point::Query) && f.fires(Point::Query), "every time");
        assert!(!f.fires(Point::Http));
        assert!(Faults::parse("writer,nope").expect_err("unknown").contains("\"nope\""));
    }

    #[test]
    fn panics_are_counted_per_task_and_the_first_fatal_reason_stays() {
        let f = Failures::new();
        f.panicked(Task::Udp);
        f.panicked(Task::Udp);
        f.panicked(Task::Probe);
        assert_eq!((f.panics(Task::Udp), f.panics(Task::Probe), f.panics(Task::Tcp)), (2, 1, 0));
        assert_eq!(f.fatal_reason(), None);
        f.fatal("writer panicked".into());
        f.fatal("later".into());
        assert_eq!(f.fatal_reason(), Some("writer panicked"));
    }
}
