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
    /// Where each queued service waits: one place each.
    queued: HashMap<ServiceKey, Lane>,
    /// Services waiting out a backoff, due in order.
    retry: DelayQueue<ServiceKey>,
    /// Their entries in `retry`.
    retrying: HashMap<ServiceKey, delay_queue::Key>,
    /// Failures in a row per service.
    failures: HashMap<ServiceKey, u32>,
    /// Being reconciled now.
    running: HashSet<ServiceKey>,
    /// Touched while being reconciled: queued again when that ends.
    dirty: HashSet<ServiceKey>,
}

impl WorkQueue {
    /// Queues `key` as a live change.
    pub fn touch(&mut self, key: ServiceKey) {
        if self.running.contains(&key) {
            self.dirty.insert(key);
            return;
        }
        // A change makes a pending retry moot: the reconcile runs now.
        if let Some(entry) = self.retrying.remove(&key) {
            self.retry.remove(&entry);
        }
        if self.queued.insert(key.clone(), Lane::Live) != Some(Lane::Live) {
            self.live.push_back(key);
        }
    }

    /// Queues `key` behind every live change.
    pub fn backlog(&mut self, key: ServiceKey) {
        if self.running.contains(&key) {
            self.dirty.insert(key);
        } else if !self.queued.contains_key(&key) {
            self.queued.insert(key.clone(), Lane::Backlog);
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
                self.touch(key);
            }
            None => std::future::pending().await,
        }
    }

    /// The next service to reconcile, marked running: live changes first,
    /// each lane first in first out.
    pub fn pop(&mut self) -> Option<ServiceKey> {
        let key = Self::next(&mut self.live, &self.queued, Lane::Live)
            .or_else(|| Self::next(&mut self.backlog, &self.queued, Lane::Backlog))?;
        self.queued.remove(&key);
        self.running.insert(key.clone());
        Some(key)
    }

    /// The first key of `lane` still queued there.
    fn next(
        lane: &mut VecDeque<ServiceKey>,
        queued: &HashMap<ServiceKey, Lane>,
        which: Lane,
    ) -> Option<ServiceKey> {
        while let Some(key) = lane.pop_front() {
            if queued.get(&key) == Some(&which) {
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
        if self.dirty.remove(key) {
            self.touch(key.clone());
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
        q.backlog(key("a"));
        q.backlog(key("b"));
        q.touch(key("z"));
        assert_eq!(q.pop(), Some(key("z")));
        assert_eq!(q.pop(), Some(key("a")));
        assert_eq!(q.depth(), 1);
    }

    #[test]
    fn a_service_touched_while_running_runs_once_more_after_it_ends() {
        let mut q = WorkQueue::default();
        q.touch(key("a"));
        assert_eq!(q.pop(), Some(key("a")));
        q.touch(key("a"));
        q.backlog(key("a"));
        // Not handed out twice at once.
        assert_eq!(q.pop(), None);
        assert!(q.is_running(&key("a")));
        q.done(&key("a"));
        assert_eq!(q.pop(), Some(key("a")));
        q.done(&key("a"));
        assert_eq!(q.pop(), None);
        assert_eq!(q.depth(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_service_waits_its_backoff_while_the_others_go_on() {
        let mut q = WorkQueue::default();
        q.touch(key("a"));
        q.touch(key("b"));
        let a = q.pop().unwrap();
        let start = Instant::now();
        let (wait, n) = q.failed(&a, Duration::ZERO);
        assert_eq!(n, 1);
        assert!(wait >= RETRY);
        assert_eq!(q.pop(), Some(key("b")));
        q.done(&key("b"));
        assert_eq!(q.pop(), None, "not before its backoff");
        q.due().await;
        // At its backoff (the delay queue counts whole milliseconds).
        let waited = start.elapsed();
        assert!(waited >= wait && waited <= wait + Duration::from_millis(2), "{waited:?} for {wait:?}");
        assert_eq!(q.pop(), Some(key("a")));
        // A second failure in a row waits longer; Retry-After wins when longer.
        let (wait2, n) = q.failed(&a, Duration::from_secs(60));
        assert_eq!(n, 2);
        assert_eq!(wait2, Duration::from_secs(60));
        // A live change makes the retry moot.
        q.touch(key("a"));
        assert_eq!(q.retrying(), 0);
        assert_eq!(q.pop(), Some(key("a")));
        q.done(&a);
        assert_eq!(q.pop(), None);
        assert!(tokio::time::timeout(Duration::from_secs(600), q.due()).await.is_err(), "nothing due");
    }

    /// Under churn, the last name in order is not starved: services are
    /// handed out in the order they changed.
    #[test]
    fn services_are_handed_out_in_the_order_they_changed() {
        let mut q = WorkQueue::default();
        q.touch(key("zz"));
        for round in 0..100 {
            // A stream of changes to names that sort first keeps coming.
            q.touch(key(&format!("a{round}")));
            let next = q.pop().unwrap();
            if next == key("zz") {
                assert_eq!(round, 0, "zz, changed first, went first");
                return;
            }
            q.done(&next);
        }
        panic!("zz never handed out");
    }

    #[test]
    fn a_backlog_entry_touched_moves_to_the_live_lane_once() {
        let mut q = WorkQueue::default();
        q.backlog(key("a"));
        q.backlog(key("b"));
        q.touch(key("b"));
        q.touch(key("b"));
        assert_eq!(q.depth(), 2);
        assert_eq!(q.pop(), Some(key("b")));
        assert_eq!(q.pop(), Some(key("a")));
        assert_eq!(q.pop(), None, "b handed out once");
    }
}
