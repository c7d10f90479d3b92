//! What the controller did, for `/metrics` and the benchmarks: API calls,
//! reconciles, errors by reason, repaired drift by kind, the queue's depth,
//! and how long reconciles and each member's writes take.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus::{Histogram, HistogramOpts, HistogramVec};

use super::api::{ErrorReason, Kind};

/// Buckets for reconcile and write latencies: 1 ms to 60 s. A write to a
/// frozen member ends at its deadline (30 s).
const BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// The controller's counters.
#[derive(Debug)]
pub struct SyncStats {
    /// Writes (apply, delete).
    pub writes: AtomicU64,
    /// Reads (list).
    pub reads: AtomicU64,
    /// Writes skipped because the body equalled the last one applied.
    pub unchanged: AtomicU64,
    /// Services reconciled.
    pub reconciles: AtomicU64,
    /// Services whose exports conflict now (a Conflict condition is True).
    pub conflicts: AtomicU64,
    /// Failed reconciles, by [`ErrorReason`] (in [`ErrorReason::ALL`] order).
    pub errors: [AtomicU64; 7],
    /// Objects of ours found changed or gone by someone else, and written
    /// again, by [`Kind`] (in [`Kind::ALL`] order).
    pub drift_repaired: [AtomicU64; 6],
    /// Services waiting to be reconciled.
    pub queue_depth: AtomicU64,
    /// Seconds per reconcile of one service (every member's writes).
    pub reconcile_seconds: Histogram,
    /// Seconds per write, by member.
    pub write_seconds: HistogramVec,
}

impl SyncStats {
    /// Zeroed counters and empty histograms (registered by the caller).
    pub fn new() -> Result<Self, prometheus::Error> {
        Ok(Self {
            writes: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            unchanged: AtomicU64::new(0),
            reconciles: AtomicU64::new(0),
            conflicts: AtomicU64::new(0),
            errors: Default::default(),
            drift_repaired: Default::default(),
            queue_depth: AtomicU64::new(0),
            reconcile_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "clusterset_dns_sync_reconcile_seconds",
                    "Time to reconcile one service in every member (its writes, each member in its own lane).",
                )
                .buckets(BUCKETS.to_vec()),
            )?,
            write_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "clusterset_dns_sync_member_write_seconds",
                    "Time of one write (apply, delete) to a member's API server, deadline included.",
                )
                .buckets(BUCKETS.to_vec()),
                &["member"],
            )?,
        })
    }

    /// Counts a failed reconcile.
    pub fn error(&self, reason: ErrorReason) {
        let i = ErrorReason::ALL.iter().position(|r| *r == reason).unwrap_or(0);
        self.errors[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an object of ours repaired after someone else changed it.
    pub fn drift(&self, kind: Kind) {
        let i = Kind::ALL.iter().position(|k| *k == kind).unwrap_or(0);
        self.drift_repaired[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Repaired objects of `kind` so far.
    pub fn drift_of(&self, kind: Kind) -> u64 {
        let i = Kind::ALL.iter().position(|k| *k == kind).unwrap_or(0);
        self.drift_repaired[i].load(Ordering::Relaxed)
    }
}
