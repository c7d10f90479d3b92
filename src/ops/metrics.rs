//! The answering side's metrics, registered in the process's registry
//! ([`crate::cmd::Process`], no globals): the store's gauges and publish
//! time, and families read at scrape time ([`crate::scrape::Families`],
//! each declared with what it reads). Our own metrics follow Prometheus
//! conventions under the `clusterset_dns_` prefix; the DNS request metrics
//! keep CoreDNS's names and labels so existing dashboards work
//! (`queries.rs`).
//!
//! Nothing on `/metrics` grows with the fleet by default: endpoints and
//! answers are summed per cluster (`clusterset_dns_cluster_endpoints`,
//! `clusterset_dns_cluster_answers_total`), tens of series at any size.
//! The per-service families (`clusterset_dns_endpoints{service,…}`,
//! `clusterset_dns_answers_total{service,…}`) were 200,000 series and
//! 17.6 MB a scrape at 100,000 services × 10 clusters: far past what a
//! Prometheus target is allowed. They are off rather than cut to a bound,
//! because a bound shows an arbitrary few services and a missing series
//! would not say whether the service has none or was cut; they are in a
//! registry of their own ([`Metrics::per_service`]), served on
//! `/debug/metrics`, and on `/metrics` too with `--metrics-per-service`
//! (small fleets, dashboards per service).

mod queries;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry};

use crate::fault::{Failures, Task};
use crate::k8s::watch::WatchHealth;
use crate::model::ImportType;
use crate::scrape::{Families, Sample};
use crate::source::MembersAlive;
use crate::store::programming::kind_label;
use crate::store::{Programmed, Reader, Snapshot, Unmeasured};
use crate::wire::stats::QueryStats;

/// The answering side's metrics, registered into the process's registry
/// ([`crate::cmd::Process`]: one for every command, no globals).
pub struct Metrics {
    registry: Registry,
    /// The per-service families, alone: `/debug/metrics`.
    per_service: Registry,
    services: IntGauge,
    serial: IntGauge,
    ready: IntGauge,
    publish_seconds: Histogram,
    http_debug: IntCounterVec,
    programming: HistogramVec,
    unmeasured: IntCounterVec,
}

/// DNS programming latency (`store::programming`), named and bucketed as
/// CoreDNS's `coredns_kubernetes_dns_programming_duration_seconds`
/// (1 ms doubling to 524 s), so that one dashboard reads both.
const PROGRAMMING: &str = "clusterset_dns_programming_duration_seconds";
const PROGRAMMING_HELP: &str = "Time from an EndpointSlice change's trigger (its endpoints.kubernetes.io/last-change-trigger-time, set by kube-controller-manager in the exporting cluster and carried by sync) until this server answers it, by the service's kind (clusterset_ip, headless).";
const UNMEASURED: &str = "clusterset_dns_programming_unmeasured_total";
const UNMEASURED_HELP: &str = "EndpointSlice changes answered but not observed in clusterset_dns_programming_duration_seconds, by cause: missing (no trigger time), unparsable, future (the writing cluster's clock is ahead), stale (over an hour old), repeated (the previous version's time: a rewrite, not a change), unserved (no ServiceImport).";

/// HTTP requests under `/debug/`, answered or refused (`--allow-debug`).
const HTTP_DEBUG: &str = "clusterset_dns_http_debug_requests_total";
const HTTP_DEBUG_HELP: &str =
    "HTTP requests under /debug/ (explain): answered, or refused with 403 to peers outside --allow-debug.";

impl Metrics {
    /// Registers the store's metrics and the health of `watches` (read at
    /// each scrape) into `registry`.
    pub fn new(registry: &Registry, watches: Vec<Arc<WatchHealth>>) -> Result<Self, prometheus::Error> {
        let services = IntGauge::new("clusterset_dns_services", "Services with names in the zone.")?;
        let serial =
            IntGauge::new("clusterset_dns_snapshot_serial", "SOA serial of the snapshot being served.")?;
        let ready = IntGauge::new(
            "clusterset_dns_ready",
            "1 once every source has delivered its first complete state, else 0.",
        )?;
        let publish_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "clusterset_dns_snapshot_publish_seconds",
                "Time to apply a batch of source updates and publish the next snapshot.",
            )
            .buckets(prometheus::exponential_buckets(0.0001, 2.0, 16)?),
        )?;
        registry.register(Box::new(services.clone()))?;
        registry.register(Box::new(serial.clone()))?;
        registry.register(Box::new(ready.clone()))?;
        registry.register(Box::new(publish_seconds.clone()))?;
        // Its own family beside the DNS one (`clusterset_dns_debug_queries_total`,
        // per DNS listener): a label added there would change the series
        // that dashboards already read.
        let http_debug = IntCounterVec::new(Opts::new(HTTP_DEBUG, HTTP_DEBUG_HELP), &["result"])?;
        // Both results from 0, so that a rate() starts from a value.
        for result in ["answered", "refused"] {
            http_debug.with_label_values(&[result]);
        }
        registry.register(Box::new(http_debug.clone()))?;
        let programming = HistogramVec::new(
            HistogramOpts::new(PROGRAMMING, PROGRAMMING_HELP)
                .buckets(prometheus::exponential_buckets(0.001, 2.0, 20)?),
            &["service_kind"],
        )?;
        let unmeasured = IntCounterVec::new(Opts::new(UNMEASURED, UNMEASURED_HELP), &["cause"])?;
        // Every series from 0, so that a rate() starts from a value.
        for kind in [ImportType::ClusterSetIp, ImportType::Headless] {
            programming.with_label_values(&[kind_label(kind)]);
        }
        for cause in Unmeasured::ALL {
            unmeasured.with_label_values(&[cause.as_str()]);
        }
        registry.register(Box::new(programming.clone()))?;
        registry.register(Box::new(unmeasured.clone()))?;
        if !watches.is_empty() {
            watch_families(watches).register(registry)?;
        }
        Ok(Self {
            registry: registry.clone(),
            per_service: Registry::new(),
            services,
            serial,
            ready,
            publish_seconds,
            http_debug,
            programming,
            unmeasured,
        })
    }

    /// Records what the publishes measured of slice changes.
    pub fn programmed(&self, programmed: Programmed) {
        for (kind, took) in programmed.observed {
            self.programming.with_label_values(&[kind_label(kind)]).observe(took.as_secs_f64());
        }
        for cause in programmed.unmeasured {
            self.unmeasured.with_label_values(&[cause.as_str()]).inc();
        }
    }

    /// The per-service families alone (`/debug/metrics`): registered by
    /// [`Metrics::register_health`], rendered only when asked for.
    pub fn per_service(&self) -> &Registry {
        &self.per_service
    }

    /// Counts one HTTP `/debug/` request, answered or refused (`--allow-debug`).
    pub fn http_debug(&self, answered: bool) {
        self.http_debug.with_label_values(&[if answered { "answered" } else { "refused" }]).inc();
    }

    /// Exposes the query counters of each listener (`server` label, e.g.
    /// `dns://:53`) under CoreDNS's metric names, for the zone `zone`.
    pub fn register_queries(
        &self,
        zone: String,
        servers: Vec<(String, Arc<QueryStats>)>,
    ) -> Result<(), prometheus::Error> {
        queries::families(zone, servers).register(&self.registry)
    }

    /// Exposes `clusterset_dns_udp_workers{server}`: the UDP worker threads
    /// of each listener that are running (0: that address answers no UDP).
    pub fn register_udp_workers(
        &self,
        servers: Vec<(String, Arc<AtomicUsize>)>,
    ) -> Result<(), prometheus::Error> {
        let mut f = Families::new();
        f.gauge(
            "clusterset_dns_udp_workers",
            "UDP worker threads running per listener (--udp-workers when healthy; 0: no UDP answers there).",
            &["server"],
            move || {
                servers
                    .iter()
                    .map(|(server, alive)| {
                        Sample::new(&[("server", server)], alive.load(Ordering::Relaxed) as f64)
                    })
                    .collect()
            },
        );
        f.register(&self.registry)
    }

    /// Exposes `clusterset_dns_memory_over_budget` from `guard` (0 without one).
    pub fn register_memory(
        &self,
        guard: Option<Arc<crate::ops::memory::Guard>>,
    ) -> Result<(), prometheus::Error> {
        let mut f = Families::new();
        f.gauge(
            "clusterset_dns_memory_over_budget",
            "1 while the memory budget refuses updates: the resident size is over 90 % of --memory-limit, or a source whose update was refused has not been listed back in yet (it is listed again once it fits; the last good state is served meanwhile). 0 without a limit.",
            &[],
            move || {
                let over = guard.as_ref().is_some_and(|g| g.is_over());
                vec![Sample::new(&[], f64::from(u8::from(over)))]
            },
        );
        f.register(&self.registry)
    }

    /// Exposes the health overlay, read from the current snapshot at scrape
    /// time: per cluster `clusterset_dns_cluster_endpoints{cluster,state}`,
    /// `clusterset_dns_cluster_answers_total{cluster}` and, with members,
    /// `clusterset_dns_cluster_alive{cluster}`; per service
    /// `clusterset_dns_endpoints{service,cluster,state}` and
    /// `clusterset_dns_answers_total{service,cluster}` into
    /// [`Metrics::per_service`], and into the registry too when
    /// `per_service` (`--metrics-per-service`). Never per address.
    pub fn register_health(
        &self,
        reader: Reader,
        liveness: Option<Arc<dyn MembersAlive>>,
        per_service: bool,
    ) -> Result<(), prometheus::Error> {
        health_families(reader.clone(), liveness).register(&self.registry)?;
        service_families(reader.clone()).register(&self.per_service)?;
        if per_service {
            service_families(reader).register(&self.registry)?;
        }
        Ok(())
    }

    /// Records a published snapshot and how long the batch took.
    pub fn published(&self, snap: &Snapshot, took: Duration) {
        self.services.set(snap.service_count() as i64);
        self.serial.set(i64::from(snap.serial()));
        self.ready.set(i64::from(snap.is_ready()));
        self.publish_seconds.observe(took.as_secs_f64());
    }
}

/// Registers `clusterset_dns_panics_total{task}` into `registry`, every
/// task listed (0 included, so that a rate() starts from a value).
pub fn register_panics(registry: &Registry, failures: Arc<Failures>) -> Result<(), prometheus::Error> {
    let mut f = Families::new();
    f.counter(
        "clusterset_dns_panics_total",
        "Panics caught per task; the task was restarted, or the connection or query lost, unless /health fails.",
        &["task"],
        move || Task::ALL.iter().map(|t| Sample::count(&[("task", t.name())], failures.panics(*t))).collect(),
    );
    f.register(registry)
}

/// Each watch's staleness, errors and JSON answers.
fn watch_families(watches: Vec<Arc<WatchHealth>>) -> Families {
    let watches = Arc::new(watches);
    let each = move |value: fn(&WatchHealth) -> f64| {
        let watches = watches.clone();
        move || watches.iter().map(|w| Sample::new(&[("watch", &w.name)], value(w))).collect()
    };
    let mut f = Families::new();
    f.gauge(
        "clusterset_dns_watch_stale_seconds",
        "Seconds since a Kubernetes watch started failing (0 while healthy): the served data is at least this old.",
        &["watch"],
        each(WatchHealth::stale_seconds),
    )
    .counter(
        "clusterset_dns_watch_errors_total",
        "Errors seen by a Kubernetes watch.",
        &["watch"],
        each(|w| w.errors() as f64),
    )
    .counter(
        "clusterset_dns_watch_json_answers_total",
        "Responses in JSON to a Kubernetes watch's requests for protobuf (--kube-encoding auto): a server or proxy that does not serve protobuf.",
        &["watch"],
        each(|w| w.json_answers() as f64),
    );
    f
}

/// The snapshot's health overlay and answer counters summed per cluster,
/// and the members' liveness, read at scrape time.
fn health_families(reader: Reader, liveness: Option<Arc<dyn MembersAlive>>) -> Families {
    let mut f = Families::new();
    let r = reader.clone();
    f.gauge(
        "clusterset_dns_cluster_endpoints",
        "Ready endpoints of the services answered by endpoints, summed per cluster and health (probes, cluster liveness).",
        &["cluster", "state"],
        move || cluster_endpoints(&r),
    )
    .counter(
        "clusterset_dns_cluster_answers_total",
        "Answers that held endpoints of a cluster, over every service (answer policies' choices).",
        &["cluster"],
        move || {
            let stats = reader.load().zone().answer_stats.clone();
            stats
                .read_clusters()
                .into_iter()
                .map(|(cluster, n)| Sample::count(&[("cluster", &cluster)], n))
                .collect()
        },
    )
    .gauge(
        "clusterset_dns_cluster_alive",
        "1 while a member cluster answers, 0 once it has not for --cluster-dead-after (its endpoints are demoted).",
        &["cluster"],
        move || {
            liveness
                .iter()
                .flat_map(|l| l.alive())
                .map(|(c, alive)| Sample::new(&[("cluster", c.as_str())], f64::from(u8::from(alive))))
                .collect()
        },
    );
    f
}

/// The per-service families: a series per service and cluster, read at
/// scrape time.
fn service_families(reader: Reader) -> Families {
    let mut f = Families::new();
    let r = reader.clone();
    f.gauge(
        "clusterset_dns_endpoints",
        "Ready endpoints of a service answered by endpoints, per cluster and health (probes, cluster liveness).",
        &["service", "cluster", "state"],
        move || endpoints(&r),
    )
    .counter(
        "clusterset_dns_answers_total",
        "Answers of a service that held endpoints of a cluster (answer policies' choices; the first 16,384 pairs).",
        &["service", "cluster"],
        move || {
            reader
                .load()
                .zone()
                .answer_stats
                .read()
                .into_iter()
                .map(|(service, cluster, n)| {
                    Sample::count(&[("service", &service), ("cluster", &cluster)], n)
                })
                .collect()
        },
    );
    f
}

/// Healthy and unhealthy endpoints of a service, per cluster of its
/// [`Balance`](crate::store::Balance), indexed as its clusters are.
fn counts(b: &crate::store::Balance) -> Vec<[u32; 2]> {
    let mut counts = vec![[0u32; 2]; b.clusters.len()];
    for (e, healthy) in b.endpoints.iter().zip(b.healthy.iter()) {
        if let Some(c) = counts.get_mut(usize::from(e.cluster)) {
            c[usize::from(!*healthy)] += 1;
        }
    }
    counts
}

/// `clusterset_dns_cluster_endpoints`: every service's healthy and
/// unhealthy endpoints, summed per cluster (by interned id, named by the
/// first service that holds it).
fn cluster_endpoints(reader: &Reader) -> Vec<Sample> {
    let snap = reader.load();
    let mut sums: Vec<Option<(&str, [u64; 2])>> = Vec::new();
    for b in snap.services.values().filter_map(|names| names.balance()) {
        for (cluster, [up, down]) in b.clusters.iter().zip(counts(b)) {
            let id = usize::from(cluster.id);
            if sums.len() <= id {
                sums.resize(id + 1, None);
            }
            let sum = sums[id].get_or_insert((cluster.name.as_str(), [0, 0]));
            sum.1[0] += u64::from(up);
            sum.1[1] += u64::from(down);
        }
    }
    let mut out = Vec::new();
    for (cluster, [up, down]) in sums.into_iter().flatten() {
        for (state, n) in [("healthy", up), ("unhealthy", down)] {
            out.push(Sample::new(&[("cluster", cluster), ("state", state)], n as f64));
        }
    }
    out
}

/// `clusterset_dns_endpoints`: per service answered by endpoints, per
/// cluster, its healthy and unhealthy endpoints.
fn endpoints(reader: &Reader) -> Vec<Sample> {
    let snap = reader.load();
    let mut out = Vec::new();
    for names in snap.services.values() {
        let Some(b) = names.balance() else { continue };
        let service = b.service.to_string();
        for (cluster, [up, down]) in b.clusters.iter().zip(counts(b)) {
            for (state, n) in [("healthy", up), ("unhealthy", down)] {
                let pairs =
                    [("service", service.as_str()), ("cluster", cluster.name.as_str()), ("state", state)];
                out.push(Sample::new(&pairs, f64::from(n)));
            }
        }
    }
    out
}
