//! Fencing: a leader writes only while its Lease is surely its own. Every
//! write checks the fence just before it is sent; the fence is held open
//! until the Lease's last renewal as this replica saw it, plus the lease
//! duration, less a margin, on the wall clock the other replicas judge
//! expiry by (the election compares `renewTime + leaseDurationSeconds` with
//! its own clock). A replica frozen past its Lease (a SIGSTOP, a VM paused,
//! a long GC-like stall) wakes up behind a closed fence: it writes nothing
//! until it has read the Lease again, and by then it knows it lost it.
//!
//! The Kubernetes API has no fencing token to refuse a write already sent
//! (kube-apiserver takes any writer's request), so a write in flight at
//! the instant of the freeze may still land: the new leader sees it as
//! someone else's edit and writes its own again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The fence.
#[derive(Debug)]
pub struct Fence {
    /// Writes are allowed before this many milliseconds since the epoch.
    until_ms: AtomicU64,
}

/// Lead time kept between the fence and the Lease's expiry: a write checked
/// just before the fence closes still reaches its API server before another
/// replica may take over.
pub const MARGIN: Duration = Duration::from_millis(500);

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Fence {
    /// Always open: no leader election (one replica by configuration).
    pub fn open() -> Self {
        Self { until_ms: AtomicU64::new(u64::MAX) }
    }

    /// Closed until a Lease held by this replica is seen.
    pub fn closed() -> Self {
        Self { until_ms: AtomicU64::new(0) }
    }

    /// True while a write may be sent.
    pub fn may_write(&self) -> bool {
        ms(SystemTime::now()) < self.until_ms.load(Ordering::Acquire)
    }

    /// The Lease was seen held by this replica, renewed at `renewed` for
    /// `duration`.
    pub fn held(&self, renewed: SystemTime, duration: Duration) {
        let until = renewed.checked_add(duration.saturating_sub(MARGIN)).map_or(0, ms);
        self.until_ms.store(until, Ordering::Release);
    }

    /// The Lease was seen held by another replica, or by none.
    pub fn close(&self) {
        self.until_ms.store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_stop_a_margin_before_the_lease_runs_out() {
        let f = Fence::closed();
        assert!(!f.may_write(), "closed until the Lease is seen");
        f.held(SystemTime::now(), Duration::from_secs(15));
        assert!(f.may_write());
        // Renewed long ago: frozen past the Lease, then woken.
        f.held(SystemTime::now() - Duration::from_secs(20), Duration::from_secs(15));
        assert!(!f.may_write());
        // Inside the margin of its expiry: closed too.
        f.held(SystemTime::now() - Duration::from_millis(14_700), Duration::from_secs(15));
        assert!(!f.may_write());
        f.held(SystemTime::now(), Duration::from_secs(15));
        f.close();
        assert!(!f.may_write(), "another holder");
        assert!(Fence::open().may_write());
    }
}
