//! What the controller did, for `/metrics` and the benchmarks: API calls,
//! reconciles, errors by reason, repaired drift by kind, the queue's depth,
//! and how long reconciles and each member's writes take; and the
//! `clusterset_dns_sync_*` families that show them, each declared with
//! what it reads (also the shards led and each member's staleness and
//! rate limiting).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use prometheus::{Histogram, HistogramOpts, HistogramVec, Registry};

use super::api::{ErrorReason, Kind};
use super::election::{Anomaly, ElectionStatus};
use super::queue::Reason;
use super::shard::Shards;
use crate::fleet::member::Member;
use crate::k8s::throttle::ThrottleStats;
use crate::k8s::watch::WatchHealth;
use crate::scrape::{Families, Sample};

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
    /// Reconciles started, by [`Reason`] (in [`Reason::ALL`] order).
    pub reconciles: [AtomicU64; 7],
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
    /// The members now, as `/metrics` reads them ([`SyncStats::set_members`]).
    members: ArcSwap<Vec<MemberView>>,
    /// Every watch, probe and API discovery of the controller now
    /// ([`SyncStats::set_watches`]).
    watches: ArcSwap<Vec<Arc<WatchHealth>>>,
}

/// What `/metrics` reads of one member.
#[derive(Debug)]
struct MemberView {
    name: String,
    /// Its watches, its probe and its ClusterProfile's mark: the member is
    /// as stale as the stalest (as [`Member::stale_seconds`] counts).
    health: Vec<Arc<WatchHealth>>,
    throttle: Arc<ThrottleStats>,
}

impl MemberView {
    fn of(m: &Member) -> Self {
        let mut health = m.health.clone();
        health.push(m.probe.clone());
        health.push(m.inventory.clone());
        Self { name: m.name.clone(), health, throttle: m.throttle.clone() }
    }

    fn stale_seconds(&self) -> f64 {
        self.health.iter().map(|h| h.stale_seconds()).fold(0.0, f64::max)
    }
}

impl SyncStats {
    /// Zeroed counters and empty histograms (registered by the caller).
    pub fn new() -> Result<Self, prometheus::Error> {
        Ok(Self {
            writes: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            unchanged: AtomicU64::new(0),
            reconciles: Default::default(),
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
            members: ArcSwap::from_pointee(Vec::new()),
            watches: ArcSwap::from_pointee(Vec::new()),
        })
    }

    /// The members `/metrics` shows from now on: each one's write latency
    /// series exists from the start (zero counts), not from its first
    /// write, and a member gone takes its series with it.
    pub fn set_members(&self, members: &[Member]) {
        let now: Vec<MemberView> = members.iter().map(MemberView::of).collect();
        for gone in self.members.load().iter().filter(|old| !now.iter().any(|m| m.name == old.name)) {
            let _ = self.write_seconds.remove_label_values(&[gone.name.as_str()]);
        }
        for m in &now {
            self.write_seconds.with_label_values(&[m.name.as_str()]);
        }
        self.members.store(Arc::new(now));
    }

    /// Registers the controller's metrics into `registry`: the histograms,
    /// and the families read from these counters, the `shards` led and the
    /// members at every scrape.
    pub fn register(
        self: &Arc<Self>,
        registry: &Registry,
        shards: Arc<Shards>,
        election: Option<Arc<ElectionStatus>>,
    ) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.reconcile_seconds.clone()))?;
        registry.register(Box::new(self.write_seconds.clone()))?;
        self.families(shards, election).register(registry)
    }

    /// The families read at every scrape: from these counters, the `shards`
    /// led, the members, the watches and the `election`.
    fn families(self: &Arc<Self>, shards: Arc<Shards>, election: Option<Arc<ElectionStatus>>) -> Families {
        let mut f = Families::new();
        leadership_families(&mut f, shards);
        self.work_families(&mut f);
        self.member_families(&mut f);
        if let Some(e) = election {
            election_families(&mut f, e);
        }
        f
    }

    /// What the controller did and has left to do: writes, reads,
    /// reconciles, errors, conflicts, the queue, drift repaired.
    fn work_families(self: &Arc<Self>, f: &mut Families) {
        let total = |counter: fn(&Self) -> &AtomicU64| {
            let s = self.clone();
            move || vec![Sample::count(&[], counter(&s).load(Ordering::Relaxed))]
        };
        let level = |gauge: fn(&Self) -> &AtomicU64| {
            let s = self.clone();
            move || vec![Sample::new(&[], gauge(&s).load(Ordering::Relaxed) as f64)]
        };
        let (s, reasons, drift) = (self.clone(), self.clone(), self.clone());
        f.counter(
            "clusterset_dns_sync_writes_total",
            "API writes (apply, delete) made by the controller.",
            &[],
            total(|s| &s.writes),
        )
        .counter("clusterset_dns_sync_reads_total", "API reads (list, get).", &[], total(|s| &s.reads))
        .counter(
            "clusterset_dns_sync_unchanged_total",
            "Writes skipped because the object was already as wanted.",
            &[],
            total(|s| &s.unchanged),
        )
        .counter(
            "clusterset_dns_sync_reconciles_total",
            "Reconciles of one service started, by what queued it: event (a member's export, Service or slice changed), retry, drift (an object of ours changed by someone else), resync, takeover (a shard taken), member (a member lost, back, or discovered), start.",
            &["reason"],
            move || {
                Reason::ALL
                    .iter()
                    .zip(&reasons.reconciles)
                    .map(|(r, c)| Sample::count(&[("reason", r.as_str())], c.load(Ordering::Relaxed)))
                    .collect()
            },
        )
        .gauge(
            "clusterset_dns_sync_conflicts",
            "Services whose exports conflict now (their ServiceExports carry Conflict=True; the oldest export's spec wins).",
            &[],
            level(|s| &s.conflicts),
        )
        .counter(
            "clusterset_dns_sync_errors_total",
            "Failed reconciles of a service, by reason (throttled, forbidden, conflict, invalid, server, unreachable, fenced: not sent, the Lease may have run out); each is retried with its own exponential backoff.",
            &["reason"],
            move || {
                ErrorReason::ALL
                    .iter()
                    .zip(&s.errors)
                    .map(|(r, c)| Sample::count(&[("reason", r.as_str())], c.load(Ordering::Relaxed)))
                    .collect()
            },
        )
        .gauge(
            "clusterset_dns_sync_queue_depth",
            "Services waiting to be reconciled (changed, at startup, or touched while being reconciled); retries waiting out their backoff are not counted.",
            &[],
            level(|s| &s.queue_depth),
        )
        .counter(
            "clusterset_dns_sync_drift_repaired_total",
            "Objects of ours found changed or deleted by someone else (live, by a watch, or at start and resync) and written again, by kind.",
            &["kind"],
            move || {
                Kind::ALL
                    .iter()
                    .zip(&drift.drift_repaired)
                    .map(|(k, c)| Sample::count(&[("kind", k.as_str())], c.load(Ordering::Relaxed)))
                    .collect()
            },
        );
    }

    /// Each member's staleness and client-side throttling, and the health of
    /// the controller's watches, probes and discoveries.
    fn member_families(self: &Arc<Self>, f: &mut Families) {
        let members = |sample: fn(&MemberView) -> Sample| {
            let s = self.clone();
            move || s.members.load().iter().map(sample).collect()
        };
        let (w, errors) = (self.clone(), self.clone());
        f.gauge(
            "clusterset_dns_sync_member_stale_seconds",
            "Seconds since a member's API last answered its watches or the controller's probe (0 while healthy); its endpoints are kept meanwhile unless --on-member-lost=remove.",
            &["member"],
            members(|m| Sample::new(&[("member", &m.name)], m.stale_seconds())),
        )
        .counter(
            "clusterset_dns_sync_client_throttled_total",
            "Requests to a member's API server that waited for the client-side rate limit (--kube-qps, --kube-burst).",
            &["member"],
            members(|m| Sample::count(&[("member", &m.name)], m.throttle.throttled.load(Ordering::Relaxed))),
        )
        .counter(
            "clusterset_dns_sync_client_throttled_seconds_total",
            "Time requests to a member's API server waited for the client-side rate limit, summed.",
            &["member"],
            members(|m| Sample::new(&[("member", &m.name)], m.throttle.waited_seconds())),
        )
        .gauge(
            "clusterset_dns_sync_watch_stale_seconds",
            "Seconds a watch (of a member's objects, of our own objects), a member's API probe or its MCS API discovery has been failing; 0 while it is current.",
            &["watch"],
            move || w.watches.load().iter().map(|h| Sample::new(&[("watch", &h.name)], h.stale_seconds())).collect(),
        )
        .counter(
            "clusterset_dns_sync_watch_errors_total",
            "Errors of a watch, probe or API discovery (each retried with backoff): a member whose discovery answers garbage counts here.",
            &["watch"],
            move || errors.watches.load().iter().map(|h| Sample::count(&[("watch", &h.name)], h.errors())).collect(),
        );
    }

    /// The controller's watches, probes and discoveries, whose health
    /// `/metrics` shows (`clusterset_dns_sync_watch_*`: apart from `serve`'s
    /// `clusterset_dns_watch_*`, which `run` registers beside them).
    pub fn set_watches(&self, watches: &[Arc<WatchHealth>]) {
        self.watches.store(Arc::new(watches.to_vec()));
    }

    /// Counts a reconcile started for `reason`.
    pub fn reconciled(&self, reason: Reason) {
        let i = Reason::ALL.iter().position(|r| *r == reason).unwrap_or(0);
        self.reconciles[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Reconciles started so far, whatever their reason.
    pub fn reconciles(&self) -> u64 {
        self.reconciles.iter().map(|c| c.load(Ordering::Relaxed)).sum()
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

/// Which shards this replica leads.
fn leadership_families(f: &mut Families, shards: Arc<Shards>) {
    let led = shards.clone();
    f.gauge(
        "clusterset_dns_sync_leader",
        "1 while this replica leads a shard (with --shards 1: holds the Lease) and writes.",
        &[],
        move || vec![Sample::new(&[], f64::from(u8::from(led.led_count() > 0)))],
    )
    .gauge(
        "clusterset_dns_sync_shard_leader",
        "1 for each shard (of --shards) this replica leads.",
        &["shard"],
        move || {
            (0..shards.count() as usize)
                .map(|i| Sample::new(&[("shard", &i.to_string())], f64::from(u8::from(shards.leads(i)))))
                .collect()
        },
    );
}

/// The election's checks and what its rules did not expect.
fn election_families(f: &mut Families, e: Arc<ElectionStatus>) {
    let checks = e.clone();
    f.counter(
        "clusterset_dns_sync_lease_anomalies_total",
        "What the election's rules did not expect, each named in the log: a Lease of a shard this replica led deleted or written by someone else while it held it (it stops writing that shard at once), a live replica with another --shards, a step of the wall clock (the tenure is kept on the monotonic clock and does not move).",
        &["anomaly"],
        move || Anomaly::ALL.iter().map(|a| Sample::count(&[("anomaly", a.as_str())], e.anomalies(*a))).collect(),
    )
    .counter(
        "clusterset_dns_sync_election_checks_total",
        "Checks of the election whose list of the Leases was answered (one every fifth of the lease duration, 1-3 s, while the Leases' cluster answers).",
        &[],
        move || vec![Sample::count(&[], checks.checks())],
    );
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::k8s::watch::Reporter;
    use crate::model::ClusterId;
    use crate::scrape::{assert_series, render, series};

    fn member(name: &str, throttled: u64, waited_us: u64) -> Member {
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap())).unwrap();
        let throttle = Arc::new(ThrottleStats::default());
        throttle.throttled.store(throttled, Ordering::Relaxed);
        throttle.waited_us.store(waited_us, Ordering::Relaxed);
        let watch = |what: &str| Arc::new(WatchHealth::new(format!("{what} of {name}")));
        Member {
            name: name.into(),
            cluster: ClusterId::parse(name).unwrap(),
            client,
            health: vec![watch("ServiceExports")],
            probe: watch("probe"),
            throttle,
            inventory: watch("ClusterProfile"),
        }
    }

    /// The `clusterset_dns_sync_*` series of a scrape, histogram buckets
    /// left out.
    fn sync_series(registry: &Registry) -> BTreeMap<String, f64> {
        let mut all = series(&render(registry));
        all.retain(|k, _| k.starts_with("clusterset_dns_sync_") && !k.contains("_bucket{"));
        all
    }

    /// Each counter holds a value of its own, none 0 or 1 (what the leader
    /// gauges show): a family that read another's counter, or was declared
    /// with another's name, shows a value not its own here.
    #[tokio::test]
    async fn each_family_shows_its_own_values() {
        let s = Arc::new(SyncStats::new().unwrap());
        s.writes.store(101, Ordering::Relaxed);
        s.reads.store(102, Ordering::Relaxed);
        s.unchanged.store(103, Ordering::Relaxed);
        for (reason, n) in Reason::ALL.into_iter().zip(161..) {
            (0..n).for_each(|_| s.reconciled(reason));
        }
        s.conflicts.store(105, Ordering::Relaxed);
        s.queue_depth.store(106, Ordering::Relaxed);
        for (reason, n) in [
            (ErrorReason::Throttled, 110),
            (ErrorReason::Forbidden, 111),
            (ErrorReason::Conflict, 112),
            (ErrorReason::Invalid, 113),
            (ErrorReason::Server, 114),
            (ErrorReason::Unreachable, 115),
            (ErrorReason::Fenced, 116),
        ] {
            (0..n).for_each(|_| s.error(reason));
        }
        for (kind, n) in [
            (Kind::ServiceImport, 120),
            (Kind::ImportStatus, 121),
            (Kind::Service, 122),
            (Kind::EndpointSlice, 123),
            (Kind::ServiceExport, 124),
            (Kind::ExportStatus, 125),
        ] {
            (0..n).for_each(|_| s.drift(kind));
        }
        s.reconcile_seconds.observe(0.25);
        let (a, b) = (member("a", 131, 2_500_000), member("b", 132, 750_000));
        // b's API stopped answering its probe a moment ago.
        Reporter::new(b.probe.clone()).failed("connection refused");
        // Stale for longer than the millisecond staleness is counted in.
        std::thread::sleep(std::time::Duration::from_millis(20));
        s.set_members(&[a, b]);
        s.write_seconds.with_label_values(&["a"]).observe(0.5);
        let shards = Shards::elected(3);
        shards.set_led(1, true);
        let registry = Registry::new();
        let election = Arc::new(ElectionStatus::default());
        for (anomaly, n) in [
            (Anomaly::Deleted, 141),
            (Anomaly::Overwritten, 142),
            (Anomaly::OtherShards, 143),
            (Anomaly::ClockStep, 144),
        ] {
            (0..n).for_each(|_| election.count(anomaly));
        }
        election.set_checks(145);
        let (w1, w2) = (Arc::new(WatchHealth::new("w1".into())), Arc::new(WatchHealth::new("w2".into())));
        for _ in 0..151 {
            Reporter::new(w2.clone()).failed("refused");
        }
        Reporter::new(w2.clone()).failed("refused");
        s.set_watches(&[w1, w2]);
        s.register(&registry, shards, Some(election)).unwrap();

        let mut got = sync_series(&registry);
        let stale = got.remove(r#"clusterset_dns_sync_member_stale_seconds{member="b"}"#);
        let w2 = got.remove(r#"clusterset_dns_sync_watch_stale_seconds{watch="w2"}"#);
        assert!(w2.is_some_and(|v| v >= 0.0), "w2's staleness: {w2:?}");
        assert!(stale.is_some_and(|v| v > 0.0 && v < 60.0), "b's staleness: {stale:?}");
        let want: BTreeMap<String, f64> = [
            ("clusterset_dns_sync_leader", 1.0),
            (r#"clusterset_dns_sync_shard_leader{shard="0"}"#, 0.0),
            (r#"clusterset_dns_sync_shard_leader{shard="1"}"#, 1.0),
            (r#"clusterset_dns_sync_shard_leader{shard="2"}"#, 0.0),
            ("clusterset_dns_sync_writes_total", 101.0),
            ("clusterset_dns_sync_reads_total", 102.0),
            ("clusterset_dns_sync_unchanged_total", 103.0),
            (r#"clusterset_dns_sync_reconciles_total{reason="event"}"#, 161.0),
            (r#"clusterset_dns_sync_reconciles_total{reason="retry"}"#, 162.0),
            (r#"clusterset_dns_sync_reconciles_total{reason="drift"}"#, 163.0),
            (r#"clusterset_dns_sync_reconciles_total{reason="resync"}"#, 164.0),
            (r#"clusterset_dns_sync_reconciles_total{reason="takeover"}"#, 165.0),
            (r#"clusterset_dns_sync_reconciles_total{reason="member"}"#, 166.0),
            (r#"clusterset_dns_sync_reconciles_total{reason="start"}"#, 167.0),
            ("clusterset_dns_sync_conflicts", 105.0),
            ("clusterset_dns_sync_queue_depth", 106.0),
            (r#"clusterset_dns_sync_errors_total{reason="throttled"}"#, 110.0),
            (r#"clusterset_dns_sync_errors_total{reason="forbidden"}"#, 111.0),
            (r#"clusterset_dns_sync_errors_total{reason="conflict"}"#, 112.0),
            (r#"clusterset_dns_sync_errors_total{reason="invalid"}"#, 113.0),
            (r#"clusterset_dns_sync_errors_total{reason="server"}"#, 114.0),
            (r#"clusterset_dns_sync_errors_total{reason="unreachable"}"#, 115.0),
            (r#"clusterset_dns_sync_errors_total{reason="fenced"}"#, 116.0),
            (r#"clusterset_dns_sync_drift_repaired_total{kind="ServiceImport"}"#, 120.0),
            (r#"clusterset_dns_sync_drift_repaired_total{kind="ServiceImport/status"}"#, 121.0),
            (r#"clusterset_dns_sync_drift_repaired_total{kind="Service"}"#, 122.0),
            (r#"clusterset_dns_sync_drift_repaired_total{kind="EndpointSlice"}"#, 123.0),
            (r#"clusterset_dns_sync_drift_repaired_total{kind="ServiceExport"}"#, 124.0),
            (r#"clusterset_dns_sync_drift_repaired_total{kind="ServiceExport/status"}"#, 125.0),
            (r#"clusterset_dns_sync_member_stale_seconds{member="a"}"#, 0.0),
            (r#"clusterset_dns_sync_client_throttled_total{member="a"}"#, 131.0),
            (r#"clusterset_dns_sync_client_throttled_total{member="b"}"#, 132.0),
            (r#"clusterset_dns_sync_client_throttled_seconds_total{member="a"}"#, 2.5),
            (r#"clusterset_dns_sync_client_throttled_seconds_total{member="b"}"#, 0.75),
            (r#"clusterset_dns_sync_lease_anomalies_total{anomaly="deleted"}"#, 141.0),
            (r#"clusterset_dns_sync_lease_anomalies_total{anomaly="overwritten"}"#, 142.0),
            (r#"clusterset_dns_sync_lease_anomalies_total{anomaly="other_shards"}"#, 143.0),
            (r#"clusterset_dns_sync_lease_anomalies_total{anomaly="clock_step"}"#, 144.0),
            ("clusterset_dns_sync_election_checks_total", 145.0),
            (r#"clusterset_dns_sync_watch_stale_seconds{watch="w1"}"#, 0.0),
            (r#"clusterset_dns_sync_watch_errors_total{watch="w1"}"#, 0.0),
            (r#"clusterset_dns_sync_watch_errors_total{watch="w2"}"#, 152.0),
            ("clusterset_dns_sync_reconcile_seconds_sum", 0.25),
            ("clusterset_dns_sync_reconcile_seconds_count", 1.0),
            (r#"clusterset_dns_sync_member_write_seconds_sum{member="a"}"#, 0.5),
            (r#"clusterset_dns_sync_member_write_seconds_count{member="a"}"#, 1.0),
            (r#"clusterset_dns_sync_member_write_seconds_sum{member="b"}"#, 0.0),
            (r#"clusterset_dns_sync_member_write_seconds_count{member="b"}"#, 0.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_series(&got, &want);

        // The types dashboards and alert rules read the families as.
        let text = render(&registry);
        for (name, kind) in [
            ("clusterset_dns_sync_leader", "gauge"),
            ("clusterset_dns_sync_shard_leader", "gauge"),
            ("clusterset_dns_sync_writes_total", "counter"),
            ("clusterset_dns_sync_reads_total", "counter"),
            ("clusterset_dns_sync_unchanged_total", "counter"),
            ("clusterset_dns_sync_reconciles_total", "counter"),
            ("clusterset_dns_sync_conflicts", "gauge"),
            ("clusterset_dns_sync_errors_total", "counter"),
            ("clusterset_dns_sync_queue_depth", "gauge"),
            ("clusterset_dns_sync_drift_repaired_total", "counter"),
            ("clusterset_dns_sync_member_stale_seconds", "gauge"),
            ("clusterset_dns_sync_client_throttled_total", "counter"),
            ("clusterset_dns_sync_client_throttled_seconds_total", "counter"),
            ("clusterset_dns_sync_lease_anomalies_total", "counter"),
            ("clusterset_dns_sync_watch_stale_seconds", "gauge"),
            ("clusterset_dns_sync_watch_errors_total", "counter"),
            ("clusterset_dns_sync_election_checks_total", "counter"),
            ("clusterset_dns_sync_reconcile_seconds", "histogram"),
            ("clusterset_dns_sync_member_write_seconds", "histogram"),
        ] {
            let line = format!("# TYPE {name} {kind}");
            assert!(text.lines().any(|l| l == line), "{line:?} not in\n{text}");
        }
    }

    #[tokio::test]
    async fn a_member_gone_takes_its_series_and_one_joined_has_them_at_once() {
        let s = Arc::new(SyncStats::new().unwrap());
        let registry = Registry::new();
        s.register(&registry, Shards::alone(), None).unwrap();
        s.set_members(&[member("a", 1, 0), member("b", 2, 0)]);
        s.set_members(&[member("b", 2, 0), member("c", 3, 0)]);
        let members = |family: &str| -> Vec<String> {
            sync_series(&registry)
                .into_keys()
                .filter_map(|k| {
                    k.strip_prefix(family)?.strip_prefix("{member=\"")?.split('"').next().map(str::to_owned)
                })
                .collect()
        };
        for family in [
            "clusterset_dns_sync_member_write_seconds_count",
            "clusterset_dns_sync_member_stale_seconds",
            "clusterset_dns_sync_client_throttled_total",
            "clusterset_dns_sync_client_throttled_seconds_total",
        ] {
            assert_eq!(members(family), ["b", "c"], "{family}");
        }
    }
}
