//! The controller's work queue: which service is reconciled next. Live
//! changes overtake the startup backlog, each first in first out (a
//! service changed first is reconciled first, whatever its name); a
//! service is never reconciled twice at once (touched while running, it
//! runs again when it ends); a failed service waits out its own
//! exponential backoff in a delay queue (tokio-util's `DelayQueue`, as
//! kube-runtime's scheduler) while the others go on. Every operation costs
//! the same whatever the number of services queued or waiting.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use tokio_util::time::{DelayQueue, delay_queue};

use crate::model::ServiceKey;
use crate::pace::{Backoff, Jitter};

/// Wait before the first retry of a service whose reconcile failed; each
/// further failure in a row doubles it, up to [`RETRY_MAX`].
pub const RETRY: Duration = Duration::from_secs(1);
/// The longest wait between retries of one service.
pub const RETRY_MAX: Duration = Duration::from_secs(300);

/// Why a service is reconciled: what queued it (kube-runtime's
/// `ReconcileReason`, in our terms). Counted in
/// `clusterset_dns_sync_reconciles_total{reason}` and named on each
/// reconcile's span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// A member's ServiceExport, Service or EndpointSlice of it changed,
    /// or a namespace appeared in a member.
    Event,
    /// Its last reconcile failed and its backoff is over.
    Retry,
    /// An object of ours was changed or deleted by someone else.
    Drift,
    /// The periodic read of every member's objects (`--resync-interval`).
    Resync,
    /// A shard was taken: its services are reconciled once read.
    Takeover,
    /// A member became unreachable or reachable, was lost or came back, or
    /// its MCS API was discovered: every service it takes part in.
    Member,
    /// The controller started: every service, once the members listed.
    Start,
}

impl Reason {
    /// Every reason, in the order `/metrics` shows them.
    pub const ALL: [Self; 7] =
        [Self::Event, Self::Retry, Self::Drift, Self::Resync, Self::Takeover, Self::Member, Self::Start];

    /// The `reason` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Event => "event",
            Self::Retry => "retry",
            Self::Drift => "drift",
            Self::Resync => "resync",
            Self::Takeover => "takeover",
            Self::Member => "member",
            Self::Start => "start",
        }
    }
}

/// Which lane a queued service waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    Live,
    Backlog,
}

/// The queue.
#[derive(Debug, Default)]
pub struct WorkQueue {
    /// Changed since last reconciled, in the order they changed. An entry
    /// whose service moved or left (`queued` says otherwise) is skipped.
    live: VecDeque<ServiceKey>,
    /// Startup work (every exported service, objects of ours found), in
    /// the order it was queued, behind every live change.
    backlog: VecDeque<ServiceKey>,
    /// Where each queued service waits (one place each), and why it was
    /// queued: the first reason while it waits, a live change's over the
    /// backlog's.
    queued: HashMap<ServiceKey, (Lane, Reason)>,
    /// Services waiting out a backoff, due in order.
    retry: DelayQueue<ServiceKey>,
    /// Their entries in `retry`.
    retrying: HashMap<ServiceKey, delay_queue::Key>,
    /// Failures in a row per service.
    failures: HashMap<ServiceKey, u32>,
    /// Being reconciled now.
    running: HashSet<ServiceKey>,
    /// Touched while being reconciled (the first reason since it began):
    /// queued again when that ends.
    dirty: HashMap<ServiceKey, Reason>,
}

impl WorkQueue {
    /// Queues `key` as a live change, for `reason`.
    pub fn touch(&mut self, key: ServiceKey, reason: Reason) {
        if self.running.contains(&key) {
            self.dirty.entry(key).or_insert(reason);
            return;
        }
        // A change makes a pending retry moot: the reconcile runs now.
        if let Some(entry) = self.retrying.remove(&key) {
            self.retry.remove(&entry);
        }
        match self.queued.get(&key) {
            Some((Lane::Live, _)) => {}
            _ => {
                self.queued.insert(key.clone(), (Lane::Live, reason));
                self.live.push_back(key);
            }
        }
    }

    /// Queues `key` behind every live change, for `reason`.
    pub fn backlog(&mut self, key: ServiceKey, reason: Reason) {
        if self.running.contains(&key) {
            self.dirty.entry(key).or_insert(reason);
        } else if !self.queued.contains_key(&key) {
            self.queued.insert(key.clone(), (Lane::Backlog, reason));
            self.backlog.push_back(key);
        }
    }

    /// Waits for the next retry to come due and queues it as a live change;
    /// pending while none waits.
    pub async fn due(&mut self) {
        let expired = std::future::poll_fn(|cx| self.retry.poll_expired(cx)).await;
        match expired {
            Some(expired) => {
                let key = expired.into_inner();
                self.retrying.remove(&key);
                self.touch(key, Reason::Retry);
            }
            None => std::future::pending().await,
        }
    }

    /// The next service to reconcile, marked running, and why: live
    /// changes first, each lane first in first out.
    pub fn pop(&mut self) -> Option<(ServiceKey, Reason)> {
        let key = Self::next(&mut self.live, &self.queued, Lane::Live)
            .or_else(|| Self::next(&mut self.backlog, &self.queued, Lane::Backlog))?;
        let (_, reason) = self.queued.remove(&key)?;
        self.running.insert(key.clone());
        Some((key, reason))
    }

    /// The first key of `lane` still queued there.
    fn next(
        lane: &mut VecDeque<ServiceKey>,
        queued: &HashMap<ServiceKey, (Lane, Reason)>,
        which: Lane,
    ) -> Option<ServiceKey> {
        while let Some(key) = lane.pop_front() {
            if queued.get(&key).is_some_and(|(l, _)| *l == which) {
                return Some(key);
            }
        }
        None
    }

    /// The services being reconciled.
    pub fn running(&self) -> Vec<ServiceKey> {
        self.running.iter().cloned().collect()
    }

    /// True while `key` is being reconciled.
    pub fn is_running(&self, key: &ServiceKey) -> bool {
        self.running.contains(key)
    }

    /// `key`'s reconcile ended well.
    pub fn done(&mut self, key: &ServiceKey) {
        self.failures.remove(key);
        self.finish(key);
    }

    /// `key`'s reconcile failed: it is retried after its backoff, or after
    /// `at_least` if that is longer (an API server's Retry-After). Returns
    /// the wait and the failures in a row.
    pub fn failed(&mut self, key: &ServiceKey, at_least: Duration) -> (Duration, u32) {
        let n = self.failures.entry(key.clone()).or_insert(0);
        *n += 1;
        let n = *n;
        let wait = backoff(n).max(at_least);
        self.finish(key);
        // A change while it ran is worth trying now, not after the wait.
        if !self.queued.contains_key(key) {
            let entry = self.retry.insert(key.clone(), wait);
            if let Some(old) = self.retrying.insert(key.clone(), entry) {
                self.retry.remove(&old);
            }
        }
        (wait, n)
    }

    fn finish(&mut self, key: &ServiceKey) {
        self.running.remove(key);
        if let Some(reason) = self.dirty.remove(key) {
            self.touch(key.clone(), reason);
        }
    }

    /// Services waiting to be reconciled (live, backlog and dirty), for
    /// `clusterset_dns_sync_queue_depth`.
    pub fn depth(&self) -> usize {
        self.queued.len() + self.dirty.len()
    }

    /// Services waiting out a backoff.
    pub fn retrying(&self) -> usize {
        self.retrying.len()
    }
}

/// The wait before retry number `failures` (1 = the first) of a service:
/// exponential from [`RETRY`], capped at [`RETRY_MAX`], and up to a fifth
/// more so that services failing together (a member's API gone) do not
/// retry in lockstep.
pub fn backoff(failures: u32) -> Duration {
    const RETRIES: Backoff = Backoff::new(RETRY, RETRY_MAX, Jitter::Add);
    RETRIES.after(failures)
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;
    use crate::model::DnsLabel;

    fn key(name: &str) -> ServiceKey {
        ServiceKey { namespace: DnsLabel::parse("shop").unwrap(), name: DnsLabel::parse(name).unwrap() }
    }

    #[test]
    fn retries_back_off_exponentially_with_a_spread_and_a_cap() {
        for (failures, base) in [(1, 1), (2, 2), (3, 4), (6, 32), (9, 256), (10, 300), (40, 300)] {
            let wait = backoff(failures);
            let base = Duration::from_secs(base);
            assert!(wait >= base && wait <= base + base / 5, "failure {failures}: {wait:?} for {base:?}");
        }
    }

    #[test]
    fn live_changes_overtake_the_backlog() {
        let mut q = WorkQueue::default();
        q.backlog(key("a"), Reason::Start);
        q.backlog(key("b"), Reason::Start);
        q.touch(key("z"), Reason::Event);
        assert_eq!(q.pop().map(|(k, _)| k), Some(key("z")));
        assert_eq!(q.pop().map(|(k, _)| k), Some(key("a")));
        assert_eq!(q.depth(), 1);
    }

    #[test]
    fn a_service_touched_while_running_runs_once_more_after_it_ends() {
        let mut q = WorkQueue::default();
        q.touch(key("a"), Reason::Event);
        assert_eq!(q.pop().map(|(k, _)| k), Some(key("a")));
        q.touch(key("a"), Reason::Event);
        q.backlog(key("a"), Reason::Start);
        // Not handed out twice at once.
        assert_eq!(q.pop().map(|(k, _)| k), None);
        assert!(q.is_running(&key("a")));
        q.done(&key("a"));
        assert_eq!(q.pop().map(|(k, _)| k), Some(key("a")));
        q.done(&key("a"));
        assert_eq!(q.pop().map(|(k, _)| k), None);
        assert_eq!(q.depth(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_service_waits_its_backoff_while_the_others_go_on() {
        let mut q = WorkQueue::default();
        q.touch(key("a"), Reason::Event);
        q.touch(key("b"), Reason::Event);
        let a = q.pop().unwrap().0;
        let start = Instant::now();
        let (wait, n) = q.failed(&a, Duration::ZERO);
        assert_eq!(n, 1);
        assert!(wait >= RETRY);
        assert_eq!(q.pop().map(|(k, _)| k), Some(key("b")));
        q.done(&key("b"));
        assert_eq!(q.pop().map(|(k, _)| k), None, "not before its backoff");
        q.due().await;
        // At its backoff (the delay queue counts whole milliseconds).
        let waited = start.elapsed();
        assert!(waited >= wait && waited <= wait + Duration::from_millis(2), "{waited:?} for {wait:?}");
        assert_eq!(q.pop().map(|(k, _)| k), Some(key("a")));
        // A second failure in a row waits longer; Retry-After wins when longer.
        let (wait2, n) = q.failed(&a, Duration::from_secs(60));
        assert_eq!(n, 2);
        assert_eq!(wait2, Duration::from_secs(60));
        // A live change makes the retry moot.
        q.touch(key("a"), Reason::Event);
        assert_eq!(q.retrying(), 0);
        assert_eq!(q.pop().map(|(k, _)| k), Some(key("a")));
        q.done(&a);
        assert_eq!(q.pop().map(|(k, _)| k), None);
        assert!(tokio::time::timeout(Duration::from_secs(600), q.due()).await.is_err(), "nothing due");
    }

    /// Under churn, the last name in order is not starved: services are
    /// handed out in the order they changed.
    #[test]
    fn services_are_handed_out_in_the_order_they_changed() {
        let mut q = WorkQueue::default();
        q.touch(key("zz"), Reason::Event);
        for round in 0..100 {
            // A stream of changes to names that sort first keeps coming.
            q.touch(key(&format!("a{round}")), Reason::Event);
            let next = q.pop().unwrap().0;
            if next == key("zz") {
                assert_eq!(round, 0, "zz, changed first, went first");
                return;
            }
            q.done(&next);
        }
        panic!("zz never handed out");
    }

    #[tokio::test(start_paused = true)]
    async fn each_service_is_handed_out_with_why_it_was_queued() {
        let mut q = WorkQueue::default();
        // Queued for the start, then changed: the change is why it runs now.
        q.backlog(key("a"), Reason::Start);
        q.touch(key("a"), Reason::Drift);
        // The first of two live reasons.
        q.touch(key("b"), Reason::Event);
        q.touch(key("b"), Reason::Drift);
        q.backlog(key("b"), Reason::Resync);
        assert_eq!(q.pop(), Some((key("a"), Reason::Drift)));
        assert_eq!(q.pop(), Some((key("b"), Reason::Event)));
        // Touched while running: again, for what touched it.
        q.touch(key("b"), Reason::Member);
        q.done(&key("b"));
        assert_eq!(q.pop(), Some((key("b"), Reason::Member)));
        // Failed: retried, as a retry.
        q.failed(&key("b"), Duration::ZERO);
        q.done(&key("a"));
        q.due().await;
        assert_eq!(q.pop(), Some((key("b"), Reason::Retry)));
        let labels: HashSet<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels.len(), Reason::ALL.len());
    }

    #[test]
    fn a_backlog_entry_touched_moves_to_the_live_lane_once() {
        let mut q = WorkQueue::default();
        q.backlog(key("a"), Reason::Start);
        q.backlog(key("b"), Reason::Start);
        q.touch(key("b"), Reason::Event);
        q.touch(key("b"), Reason::Event);
        assert_eq!(q.depth(), 2);
        assert_eq!(q.pop().map(|(k, _)| k), Some(key("b")));
        assert_eq!(q.pop().map(|(k, _)| k), Some(key("a")));
        assert_eq!(q.pop().map(|(k, _)| k), None, "b handed out once");
    }
}
