//! Metrics, registered in a [`Registry`] owned by [`Metrics`] (no globals).
//! Our own metrics follow Prometheus conventions under the
//! `clusterset_dns_` prefix; the DNS request metrics keep CoreDNS's names
//! and labels so existing dashboards work.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Bucket, Counter, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{Encoder, Histogram, HistogramOpts, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};

use crate::wire::stats::{
    self, DURATION_BUCKETS, FAMILIES, PROTOS, QueryStats, RCODES, SIZE_BUCKETS, TYPE_SLOTS, TYPES,
    TransferAsk, ZONES,
};

use crate::fault::{Failures, Task};
use crate::k8s::watch::WatchHealth;
use crate::source::centralized::Liveness;
use crate::store::{Reader, Snapshot};

/// The answering side's metrics, registered into the process's registry
/// ([`crate::cmd::Process`]: one for every command, no globals).
pub struct Metrics {
    registry: Registry,
    services: IntGauge,
    serial: IntGauge,
    ready: IntGauge,
    publish_seconds: Histogram,
    http_debug: IntCounterVec,
}

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
        if !watches.is_empty() {
            registry.register(Box::new(watch_collector(watches)?))?;
        }
        Ok(Self { registry: registry.clone(), services, serial, ready, publish_seconds, http_debug })
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
        self.registry.register(Box::new(QueryCollector::new(zone, servers)?))
    }

    /// Exposes `clusterset_dns_udp_workers{server}`: the UDP worker threads
    /// of each listener that are running (0: that address answers no UDP).
    pub fn register_udp_workers(
        &self,
        servers: Vec<(String, Arc<std::sync::atomic::AtomicUsize>)>,
    ) -> Result<(), prometheus::Error> {
        let collector = ScrapeCollector::new(UDP_WORKERS, move || {
            vec![
                servers
                    .iter()
                    .map(|(server, alive)| gauge(&[("server", server)], alive.load(Ordering::Relaxed) as f64))
                    .collect(),
            ]
        })?;
        self.registry.register(Box::new(collector))
    }

    /// Exposes `clusterset_dns_memory_over_budget` from `guard` (0 without one).
    pub fn register_memory(
        &self,
        guard: Option<Arc<crate::ops::memory::Guard>>,
    ) -> Result<(), prometheus::Error> {
        let collector = ScrapeCollector::new(MEMORY_OVER_BUDGET, move || {
            let over = guard.as_ref().is_some_and(|g| g.is_over());
            vec![vec![gauge(&[], f64::from(u8::from(over)))]]
        })?;
        self.registry.register(Box::new(collector))
    }

    /// Exposes the health overlay, read from the current snapshot at scrape
    /// time: `clusterset_dns_endpoints{service,cluster,state}` and, with
    /// members, `clusterset_dns_cluster_alive{cluster}`. Never per address.
    pub fn register_health(
        &self,
        reader: Reader,
        liveness: Option<Arc<Liveness>>,
    ) -> Result<(), prometheus::Error> {
        self.registry.register(Box::new(HealthCollector::new(reader, liveness)?))
    }

    /// Records a published snapshot and how long the batch took.
    pub fn published(&self, snap: &Snapshot, took: Duration) {
        self.services.set(snap.service_count() as i64);
        self.serial.set(i64::from(snap.serial()));
        self.ready.set(i64::from(snap.is_ready()));
        self.publish_seconds.observe(took.as_secs_f64());
    }

    /// The text exposition of the whole registry.
    pub fn render(&self) -> String {
        render(&self.registry)
    }
}

/// The text exposition of `registry`; every value computed at scrape time
/// is read now.
pub fn render(registry: &Registry) -> String {
    let mut out = Vec::new();
    // Encoding into a Vec cannot fail for the text format.
    let _ = TextEncoder::new().encode(&registry.gather(), &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// What a family is: name, help, type, label names.
pub type FamilyDecl = (&'static str, &'static str, MetricType, &'static [&'static str]);

/// A collector whose families are computed by a closure at every scrape,
/// from state the process keeps anyway (atomics, health records): nothing
/// to keep in step.
pub struct ScrapeCollector {
    descs: Vec<Desc>,
    collect: Box<dyn Fn() -> Vec<MetricFamily> + Send + Sync>,
}

impl ScrapeCollector {
    /// A collector of the families `decls`; `collect` returns their
    /// metrics, one `Vec` per family in the same order.
    pub fn new(
        decls: &'static [FamilyDecl],
        collect: impl Fn() -> Vec<Vec<Metric>> + Send + Sync + 'static,
    ) -> Result<Self, prometheus::Error> {
        let descs = decls
            .iter()
            .map(|(name, help, _, labels)| {
                Desc::new(
                    (*name).into(),
                    (*help).into(),
                    labels.iter().map(|l| (*l).to_owned()).collect(),
                    Default::default(),
                )
            })
            .collect::<Result<_, _>>()?;
        let collect = Box::new(move || {
            decls
                .iter()
                .zip(collect())
                .map(|((name, help, kind, _), metrics)| family(name, help, *kind, metrics))
                .filter(|f| !f.get_metric().is_empty())
                .collect()
        });
        Ok(Self { descs, collect })
    }
}

impl Collector for ScrapeCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        (self.collect)()
    }
}

const UDP_WORKERS: &[FamilyDecl] = &[(
    "clusterset_dns_udp_workers",
    "UDP worker threads running per listener (--udp-workers when healthy; 0: no UDP answers there).",
    MetricType::GAUGE,
    &["server"],
)];

const MEMORY_OVER_BUDGET: &[FamilyDecl] = &[(
    "clusterset_dns_memory_over_budget",
    "1 while an update is refused because it would take the server past 90 % of --memory-limit (the last good state is served); 0 once an update fits again, and without a limit.",
    MetricType::GAUGE,
    &[],
)];

const PANICS: &[FamilyDecl] = &[(
    "clusterset_dns_panics_total",
    "Panics caught per task; the task was restarted, or the connection or query lost, unless /health fails.",
    MetricType::COUNTER,
    &["task"],
)];

/// `clusterset_dns_panics_total{task}`, every task listed (0 included, so
/// that a rate() starts from a value).
pub fn panics_collector(failures: Arc<Failures>) -> Result<ScrapeCollector, prometheus::Error> {
    ScrapeCollector::new(PANICS, move || {
        vec![Task::ALL.iter().map(|t| counter(&[("task", t.name())], failures.panics(*t))).collect()]
    })
}

const WATCHES: &[FamilyDecl] = &[
    (
        "clusterset_dns_watch_stale_seconds",
        "Seconds since a Kubernetes watch started failing (0 while healthy): the served data is at least this old.",
        MetricType::GAUGE,
        &["watch"],
    ),
    (
        "clusterset_dns_watch_errors_total",
        "Errors seen by a Kubernetes watch.",
        MetricType::COUNTER,
        &["watch"],
    ),
    (
        "clusterset_dns_watch_json_answers_total",
        "Responses in JSON to a Kubernetes watch's requests for protobuf (--kube-encoding auto): a server or proxy that does not serve protobuf.",
        MetricType::COUNTER,
        &["watch"],
    ),
];

fn watch_collector(watches: Vec<Arc<WatchHealth>>) -> Result<ScrapeCollector, prometheus::Error> {
    ScrapeCollector::new(WATCHES, move || {
        vec![
            watches.iter().map(|w| gauge(&[("watch", &w.name)], w.stale_seconds())).collect(),
            watches.iter().map(|w| counter(&[("watch", &w.name)], w.errors())).collect(),
            watches.iter().map(|w| counter(&[("watch", &w.name)], w.json_answers())).collect(),
        ]
    })
}

/// Reads [`QueryStats`] at scrape time into CoreDNS's metric families
/// (names and labels of CoreDNS 1.14, `plugin/metrics/vars`).
struct QueryCollector {
    zone: String,
    servers: Vec<(String, Arc<QueryStats>)>,
    descs: Vec<Desc>,
}

const REQUESTS: &str = "coredns_dns_requests_total";
const DO_REQUESTS: &str = "coredns_dns_do_requests_total";
const RESPONSES: &str = "coredns_dns_responses_total";
const DURATION: &str = "coredns_dns_request_duration_seconds";
const REQUEST_SIZE: &str = "coredns_dns_request_size_bytes";
const RESPONSE_SIZE: &str = "coredns_dns_response_size_bytes";

/// (name, help, labels) of each family, as CoreDNS declares them.
const FAMILIES_DECLARED: [(&str, &str, &[&str]); 6] = [
    (
        REQUESTS,
        "Counter of DNS requests made per zone, protocol and family.",
        &["server", "zone", "view", "proto", "family", "type"],
    ),
    (DO_REQUESTS, "Counter of DNS requests with DO bit set per zone.", &["server", "zone", "view"]),
    (RESPONSES, "Counter of response status codes.", &["server", "zone", "view", "rcode", "plugin"]),
    (DURATION, "Histogram of the time (in seconds) each request took.", &["server", "zone", "view"]),
    (
        REQUEST_SIZE,
        "Size of the EDNS0 UDP buffer in bytes (64K for TCP).",
        &["server", "zone", "view", "proto"],
    ),
    (RESPONSE_SIZE, "Size of the returned response in bytes.", &["server", "zone", "view", "proto"]),
];

/// Our own family beside CoreDNS's: what Response Rate Limiting did.
const RRL: &str = "clusterset_dns_rrl_responses_total";
const RRL_HELP: &str =
    "UDP responses over the rate limit (--rrl-rate): dropped, or slipped (sent truncated or as BADCOOKIE).";

/// Debug queries over DNS, answered or refused (`--allow-debug`).
const DEBUG: &str = "clusterset_dns_debug_queries_total";
const DEBUG_HELP: &str = "CHAOS TXT debug queries (explain a name, whoami): answered, or refused to clients outside --allow-debug.";

/// HTTP requests under `/debug/`, answered or refused (`--allow-debug`).
const HTTP_DEBUG: &str = "clusterset_dns_http_debug_requests_total";
const HTTP_DEBUG_HELP: &str =
    "HTTP requests under /debug/ (explain): answered, or refused with 403 to peers outside --allow-debug.";

/// Zone transfer requests by what they got (`--allow-transfer`).
const TRANSFERS: &str = "clusterset_dns_transfers_total";
const TRANSFERS_HELP: &str = "Zone transfer requests (AXFR, IXFR): streamed over TCP, answered over UDP (IXFR: the SOA; AXFR: FORMERR), or refused to clients outside --allow-transfer.";

/// The `plugin` label of responses: what wrote them.
const PLUGIN: &str = "clusterset";

impl QueryCollector {
    fn new(zone: String, servers: Vec<(String, Arc<QueryStats>)>) -> Result<Self, prometheus::Error> {
        let descs = FAMILIES_DECLARED
            .iter()
            .map(|(name, help, labels)| {
                Desc::new(
                    (*name).into(),
                    (*help).into(),
                    labels.iter().map(|l| (*l).to_owned()).collect(),
                    Default::default(),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut descs = descs;
        descs.push(Desc::new(
            DEBUG.into(),
            DEBUG_HELP.into(),
            vec!["server".into(), "result".into()],
            Default::default(),
        )?);
        descs.push(Desc::new(
            TRANSFERS.into(),
            TRANSFERS_HELP.into(),
            vec!["server".into(), "result".into()],
            Default::default(),
        )?);
        descs.push(Desc::new(
            RRL.into(),
            RRL_HELP.into(),
            vec!["server".into(), "action".into()],
            Default::default(),
        )?);
        Ok(Self { zone, servers, descs })
    }

    fn zone_label(&self, slot: usize) -> &str {
        if slot == 0 { &self.zone } else { "dropped" }
    }
}

/// Label pairs sorted by name, as Go's client (and so CoreDNS) writes them.
fn labels(pairs: &[(&str, &str)]) -> Vec<LabelPair> {
    let mut pairs = pairs.to_vec();
    pairs.sort_unstable_by_key(|(name, _)| *name);
    pairs
        .iter()
        .map(|(n, v)| {
            let mut l = LabelPair::default();
            l.set_name((*n).to_owned());
            l.set_value((*v).to_owned());
            l
        })
        .collect()
}

fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_owned());
    f.set_help(help.to_owned());
    f.set_field_type(kind);
    f.set_metric(metrics);
    f
}

/// A counter sample with `pairs` as labels.
pub fn counter(pairs: &[(&str, &str)], value: u64) -> Metric {
    counter_f64(pairs, value as f64)
}

/// A counter of a quantity that is not a count (seconds).
pub fn counter_f64(pairs: &[(&str, &str)], value: f64) -> Metric {
    let mut c = Counter::default();
    c.set_value(value);
    let mut m = Metric::default();
    m.set_label(labels(pairs));
    m.set_counter(c);
    m
}

fn histogram(pairs: &[(&str, &str)], bounds: &[f64], counts: &[AtomicU64], sum: f64) -> Metric {
    let mut cumulative = 0;
    let buckets = bounds
        .iter()
        .zip(counts)
        .map(|(bound, count)| {
            cumulative += count.load(Ordering::Relaxed);
            let mut b = Bucket::default();
            b.set_upper_bound(*bound);
            b.set_cumulative_count(cumulative);
            b
        })
        .collect();
    let total = cumulative + counts.last().map_or(0, |c| c.load(Ordering::Relaxed));
    let mut h = prometheus::proto::Histogram::default();
    h.set_bucket(buckets);
    h.set_sample_count(total);
    h.set_sample_sum(sum);
    let mut m = Metric::default();
    m.set_label(labels(pairs));
    m.set_histogram(h);
    m
}

impl Collector for QueryCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let (mut requests, mut dos, mut responses, mut durations, mut req_sizes, mut resp_sizes) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for (server, s) in &self.servers {
            for zone in 0..ZONES {
                let z = self.zone_label(zone);
                for proto in 0..PROTOS {
                    let p = ["udp", "tcp"][proto];
                    for fam in 0..FAMILIES {
                        for ty in 0..TYPE_SLOTS {
                            let n = load(&s.requests[stats::request_slot(zone, proto, fam, ty)]);
                            if n > 0 {
                                let t = TYPES.get(ty).map_or("other", |(_, name)| name);
                                let f = ["1", "2"][fam];
                                let pairs = [
                                    ("server", server.as_str()),
                                    ("zone", z),
                                    ("view", ""),
                                    ("proto", p),
                                    ("family", f),
                                    ("type", t),
                                ];
                                requests.push(counter(&pairs, n));
                            }
                        }
                    }
                    let zp = zone * PROTOS + proto;
                    if load(&s.request_bytes[zp]) > 0 || s.request_size[zp].iter().any(|c| load(c) > 0) {
                        let pairs = [("server", server.as_str()), ("zone", z), ("view", ""), ("proto", p)];
                        req_sizes.push(histogram(
                            &pairs,
                            &SIZE_BUCKETS,
                            &s.request_size[zp],
                            load(&s.request_bytes[zp]) as f64,
                        ));
                        resp_sizes.push(histogram(
                            &pairs,
                            &SIZE_BUCKETS,
                            &s.response_size[zp],
                            load(&s.response_bytes[zp]) as f64,
                        ));
                    }
                }
                let do_count = load(&s.do_requests[zone]);
                if do_count > 0 {
                    dos.push(counter(&[("server", server.as_str()), ("zone", z), ("view", "")], do_count));
                }
                for (r, rcode) in RCODES.iter().enumerate() {
                    let n = load(&s.responses[zone * RCODES.len() + r]);
                    if n > 0 {
                        let pairs = [
                            ("server", server.as_str()),
                            ("zone", z),
                            ("view", ""),
                            ("rcode", *rcode),
                            ("plugin", PLUGIN),
                        ];
                        responses.push(counter(&pairs, n));
                    }
                }
                if s.duration[zone].iter().any(|c| load(c) > 0) {
                    let sum = load(&s.duration_nanos[zone]) as f64 / 1e9;
                    let pairs = [("server", server.as_str()), ("zone", z), ("view", "")];
                    durations.push(histogram(&pairs, &DURATION_BUCKETS, &s.duration[zone], sum));
                }
            }
        }
        let (mut limited, mut debug, mut transfers) = (Vec::new(), Vec::new(), Vec::new());
        for (server, s) in &self.servers {
            for (i, action) in ["dropped", "slipped"].into_iter().enumerate() {
                limited
                    .push(counter(&[("server", server.as_str()), ("action", action)], load(&s.limited[i])));
            }
            for (i, result) in ["answered", "refused"].into_iter().enumerate() {
                debug.push(counter(&[("server", server.as_str()), ("result", result)], load(&s.debug[i])));
            }
            for (i, result) in TransferAsk::LABELS.into_iter().enumerate() {
                let n = load(&s.transfers[i]);
                transfers.push(counter(&[("server", server.as_str()), ("result", result)], n));
            }
        }
        let [r, d, rs, du, rq, rp] = FAMILIES_DECLARED.map(|(name, help, _)| (name, help));
        [
            family(RRL, RRL_HELP, MetricType::COUNTER, limited),
            family(DEBUG, DEBUG_HELP, MetricType::COUNTER, debug),
            family(TRANSFERS, TRANSFERS_HELP, MetricType::COUNTER, transfers),
            family(r.0, r.1, MetricType::COUNTER, requests),
            family(d.0, d.1, MetricType::COUNTER, dos),
            family(rs.0, rs.1, MetricType::COUNTER, responses),
            family(du.0, du.1, MetricType::HISTOGRAM, durations),
            family(rq.0, rq.1, MetricType::HISTOGRAM, req_sizes),
            family(rp.0, rp.1, MetricType::HISTOGRAM, resp_sizes),
        ]
        .into_iter()
        .filter(|f| !f.get_metric().is_empty())
        .collect()
    }
}

const ENDPOINTS: &str = "clusterset_dns_endpoints";
const ENDPOINTS_HELP: &str =
    "Ready endpoints of a service answered by endpoints, per cluster and health (probes, cluster liveness).";
const ANSWERS: &str = "clusterset_dns_answers_total";
const ANSWERS_HELP: &str =
    "Answers of a service that held endpoints of a cluster (answer policies' choices).";
const CLUSTER_ALIVE: &str = "clusterset_dns_cluster_alive";
const CLUSTER_ALIVE_HELP: &str = "1 while a member cluster answers, 0 once it has not for --cluster-dead-after (its endpoints are demoted).";

/// Reads the snapshot's health overlay and the members' liveness at scrape
/// time; nothing is counted on the answer path for these.
struct HealthCollector {
    reader: Reader,
    liveness: Option<Arc<Liveness>>,
    descs: Vec<Desc>,
}

impl HealthCollector {
    fn new(reader: Reader, liveness: Option<Arc<Liveness>>) -> Result<Self, prometheus::Error> {
        let desc = |name: &str, help: &str, labels: &[&str]| {
            Desc::new(
                name.into(),
                help.into(),
                labels.iter().map(|l| (*l).to_owned()).collect(),
                Default::default(),
            )
        };
        let descs = vec![
            desc(ENDPOINTS, ENDPOINTS_HELP, &["service", "cluster", "state"])?,
            desc(CLUSTER_ALIVE, CLUSTER_ALIVE_HELP, &["cluster"])?,
            desc(ANSWERS, ANSWERS_HELP, &["service", "cluster"])?,
        ];
        Ok(Self { reader, liveness, descs })
    }
}

/// A gauge sample with `pairs` as labels.
pub fn gauge(pairs: &[(&str, &str)], value: f64) -> Metric {
    let mut g = prometheus::proto::Gauge::default();
    g.set_value(value);
    let mut m = Metric::default();
    m.set_label(labels(pairs));
    m.set_gauge(g);
    m
}

impl Collector for HealthCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let snap = self.reader.load();
        let mut endpoints = Vec::new();
        for names in snap.services.values() {
            let Some(b) = names.balance() else { continue };
            let service = b.service.to_string();
            let mut counts = vec![[0u32; 2]; b.clusters.len()];
            for (e, healthy) in b.endpoints.iter().zip(b.healthy.iter()) {
                if let Some(c) = counts.get_mut(usize::from(e.cluster)) {
                    c[usize::from(!*healthy)] += 1;
                }
            }
            for (cluster, [up, down]) in b.clusters.iter().zip(counts) {
                for (state, n) in [("healthy", up), ("unhealthy", down)] {
                    let pairs =
                        [("service", service.as_str()), ("cluster", cluster.name.as_str()), ("state", state)];
                    endpoints.push(gauge(&pairs, f64::from(n)));
                }
            }
        }
        let alive = self
            .liveness
            .iter()
            .flat_map(|l| l.clusters.iter())
            .map(|(c, a)| {
                gauge(&[("cluster", c.load().as_str())], f64::from(u8::from(a.load(Ordering::Relaxed))))
            })
            .collect();
        let answers = snap
            .zone()
            .answer_stats
            .read()
            .into_iter()
            .map(|(service, cluster, n)| counter(&[("service", &service), ("cluster", &cluster)], n))
            .collect();
        [
            family(ANSWERS, ANSWERS_HELP, MetricType::COUNTER, answers),
            family(ENDPOINTS, ENDPOINTS_HELP, MetricType::GAUGE, endpoints),
            family(CLUSTER_ALIVE, CLUSTER_ALIVE_HELP, MetricType::GAUGE, alive),
        ]
        .into_iter()
        .filter(|f| !f.get_metric().is_empty())
        .collect()
    }
}
