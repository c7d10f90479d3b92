//! What a replica knows of the election, for `/ready`, `/metrics` and
//! the log: whether the Leases can be read, and the anomalies seen.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Something seen in the election that its rules did not expect: named in
/// the log and counted (`clusterset_dns_sync_lease_anomalies_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anomaly {
    /// A Lease of a shard this replica led was deleted (by hand?).
    Deleted,
    /// A Lease of a shard this replica led was written by someone else
    /// while its tenure ran (by hand, or a replica with the same identity).
    Overwritten,
    /// A live replica runs with another `--shards`.
    OtherShards,
    /// The wall clock stepped between two checks.
    ClockStep,
}

impl Anomaly {
    /// Every anomaly, in metric order.
    pub const ALL: [Self; 4] = [Self::Deleted, Self::Overwritten, Self::OtherShards, Self::ClockStep];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deleted => "deleted",
            Self::Overwritten => "overwritten",
            Self::OtherShards => "other_shards",
            Self::ClockStep => "clock_step",
        }
    }

    fn index(self) -> usize {
        Self::ALL.iter().position(|a| *a == self).unwrap_or(0)
    }
}

/// What this replica knows of the election, for `/ready`, `/metrics` and
/// the log.
#[derive(Debug, Default)]
pub struct ElectionStatus {
    /// Why the last check failed, while the Leases cannot be read (a
    /// replica that cannot reach them leads nothing).
    unreachable: Mutex<Option<String>>,
    anomalies: [AtomicU64; Anomaly::ALL.len()],
    /// Checks made (every list of the Leases that answered).
    checks: AtomicU64,
}

impl ElectionStatus {
    /// `None` while the Leases' cluster answers; else why not.
    pub fn unreachable(&self) -> Option<String> {
        self.unreachable.lock().map(|u| u.clone()).unwrap_or(None)
    }

    pub(super) fn set(&self, why: Option<String>) {
        if let Ok(mut u) = self.unreachable.lock() {
            *u = why;
        }
    }

    /// How many times `a` was seen.
    pub fn anomalies(&self, a: Anomaly) -> u64 {
        self.anomalies[a.index()].load(Ordering::Relaxed)
    }

    /// Counts one anomaly (the elector's call).
    pub fn count(&self, a: Anomaly) {
        self.anomalies[a.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn checked(&self) {
        self.checks.fetch_add(1, Ordering::Relaxed);
    }

    /// Checks whose list of the Leases was answered.
    pub fn checks(&self) -> u64 {
        self.checks.load(Ordering::Relaxed)
    }

    #[cfg(test)]
    pub(crate) fn set_checks(&self, n: u64) {
        self.checks.store(n, Ordering::Relaxed);
    }
}
