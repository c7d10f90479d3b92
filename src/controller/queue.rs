//! The controller's work queue: which service is reconciled next. Live
//! changes overtake the startup backlog; a service is never reconciled
//! twice at once (touched while running, it runs again when it ends); a
//! failed service waits out its own exponential backoff while the others
//! go on. As controller-runtime's and kube-runtime's queues, by key.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::model::ServiceKey;
use crate::pace::{Backoff, Jitter};

/// Wait before the first retry of a service whose reconcile failed; each
/// further failure in a row doubles it, up to [`RETRY_MAX`].
pub const RETRY: Duration = Duration::from_secs(1);
/// The longest wait between retries of one service.
pub const RETRY_MAX: Duration = Duration::from_secs(300);

/// The queue.
#[derive(Debug, Default)]
pub struct WorkQueue {
    /// Changed since last reconciled.
    live: BTreeSet<ServiceKey>,
    /// Startup work: every exported service, and objects of ours found.
    backlog: BTreeSet<ServiceKey>,
    /// Services waiting out a backoff, with when they are due.
    retry: BTreeMap<ServiceKey, Instant>,
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
        } else {
            // A change makes a pending retry moot: the reconcile runs now.
            self.retry.remove(&key);
            self.live.insert(key);
        }
    }

    /// Queues `key` behind every live change.
    pub fn backlog(&mut self, key: ServiceKey) {
        if self.running.contains(&key) {
            self.dirty.insert(key);
        } else if !self.live.contains(&key) {
            self.backlog.insert(key);
        }
    }

    /// Moves retries due at `now` to the live queue.
    pub fn due(&mut self, now: Instant) {
        let due: Vec<ServiceKey> =
            self.retry.iter().filter(|(_, t)| **t <= now).map(|(k, _)| k.clone()).collect();
        for k in due {
            self.retry.remove(&k);
            self.live.insert(k);
        }
    }

    /// The next service to reconcile, marked running: live changes first.
    pub fn pop(&mut self) -> Option<ServiceKey> {
        let key = self.live.pop_first().or_else(|| self.backlog.pop_first())?;
        self.backlog.remove(&key);
        self.running.insert(key.clone());
        Some(key)
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
    pub fn failed(&mut self, key: &ServiceKey, at_least: Duration, now: Instant) -> (Duration, u32) {
        let n = self.failures.entry(key.clone()).or_insert(0);
        *n += 1;
        let n = *n;
        let wait = backoff(n).max(at_least);
        self.finish(key);
        // A change while it ran is worth trying now, not after the wait.
        if !self.live.contains(key) {
            self.retry.insert(key.clone(), now + wait);
        }
        (wait, n)
    }

    fn finish(&mut self, key: &ServiceKey) {
        self.running.remove(key);
        if self.dirty.remove(key) {
            self.touch(key.clone());
        }
    }

    /// When the next retry is due.
    pub fn next_retry(&self) -> Option<Instant> {
        self.retry.values().min().copied()
    }

    /// Services waiting to be reconciled (live, backlog and dirty), for
    /// `clusterset_dns_sync_queue_depth`.
    pub fn depth(&self) -> usize {
        self.live.len() + self.backlog.len() + self.dirty.len()
    }

    /// Services waiting out a backoff.
    pub fn retrying(&self) -> usize {
        self.retry.len()
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
        let now = Instant::now();
        let (wait, n) = q.failed(&a, Duration::ZERO, now);
        assert_eq!(n, 1);
        assert!(wait >= RETRY);
        assert_eq!(q.pop(), Some(key("b")));
        q.done(&key("b"));
        q.due(now);
        assert_eq!(q.pop(), None, "not before its backoff");
        assert_eq!(q.next_retry(), Some(now + wait));
        q.due(now + wait);
        assert_eq!(q.pop(), Some(key("a")));
        // A second failure in a row waits longer; Retry-After wins when longer.
        let (wait2, n) = q.failed(&a, Duration::from_secs(60), now);
        assert_eq!(n, 2);
        assert_eq!(wait2, Duration::from_secs(60));
        // A live change makes the retry moot.
        q.touch(key("a"));
        assert_eq!(q.retrying(), 0);
        assert_eq!(q.pop(), Some(key("a")));
        q.done(&a);
        assert_eq!(q.pop(), None);
    }
}
