//! The listeners' query counters ([`QueryStats`]) read at scrape time into
//! CoreDNS's metric families (names, help and labels of CoreDNS 1.14,
//! `plugin/metrics/vars`), and our own beside them: rate limiting, debug
//! queries, zone transfers and TCP connections shed at the cap.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::scrape::{Families, HistogramSample, Sample};
use crate::wire::stats::{
    self, DURATION_BUCKETS, EcsUse, FAMILIES, PROTOS, QueryStats, RCODES, SIZE_BUCKETS, TYPE_SLOTS, TYPES,
    TransferAsk, ZONES,
};

/// The `plugin` label of responses: what wrote them.
const PLUGIN: &str = "clusterset";

/// The `proto` label of each protocol slot.
const PROTO_LABELS: [&str; PROTOS] = ["udp", "tcp"];

/// The `family` label of each address family slot (IPv4, IPv6).
const FAMILY_LABELS: [&str; FAMILIES] = ["1", "2"];

/// The listeners' counters and the zone they answer.
struct Listeners {
    zone: String,
    servers: Vec<(String, Arc<QueryStats>)>,
}

impl Listeners {
    /// The `zone` label of a zone slot: ours, or `dropped` (CoreDNS's name
    /// for queries outside every zone it serves).
    fn zone_label(&self, slot: usize) -> &str {
        if slot == 0 { &self.zone } else { "dropped" }
    }

    /// Every (server label, its counters, zone slot, zone label).
    fn zones(&self) -> impl Iterator<Item = (&str, &QueryStats, usize, &str)> {
        self.servers.iter().flat_map(move |(server, s)| {
            (0..ZONES).map(move |zone| (server.as_str(), &**s, zone, self.zone_label(zone)))
        })
    }

    /// `coredns_dns_requests_total`: per server, zone, protocol, address
    /// family and query type, those counted.
    fn requests(&self) -> Vec<Sample> {
        let mut out = Vec::new();
        for (server, s, zone, z) in self.zones() {
            for (proto, p) in PROTO_LABELS.into_iter().enumerate() {
                for (fam, family) in FAMILY_LABELS.into_iter().enumerate() {
                    for ty in 0..TYPE_SLOTS {
                        let n = load(&s.requests[stats::request_slot(zone, proto, fam, ty)]);
                        if n > 0 {
                            let t = TYPES.get(ty).map_or("other", |(_, name)| name);
                            let pairs = [
                                ("server", server),
                                ("zone", z),
                                ("view", ""),
                                ("proto", p),
                                ("family", family),
                                ("type", t),
                            ];
                            out.push(Sample::count(&pairs, n));
                        }
                    }
                }
            }
        }
        out
    }

    /// `coredns_dns_do_requests_total`: per server and zone, those counted.
    fn do_requests(&self) -> Vec<Sample> {
        self.zones()
            .filter(|(_, s, zone, _)| load(&s.do_requests[*zone]) > 0)
            .map(|(server, s, zone, z)| {
                Sample::count(&[("server", server), ("zone", z), ("view", "")], load(&s.do_requests[zone]))
            })
            .collect()
    }

    /// `coredns_dns_responses_total`: per server, zone and rcode, those
    /// counted.
    fn responses(&self) -> Vec<Sample> {
        let mut out = Vec::new();
        for (server, s, zone, z) in self.zones() {
            for (r, rcode) in RCODES.iter().enumerate() {
                let n = load(&s.responses[zone * RCODES.len() + r]);
                if n > 0 {
                    let pairs = [
                        ("server", server),
                        ("zone", z),
                        ("view", ""),
                        ("rcode", *rcode),
                        ("plugin", PLUGIN),
                    ];
                    out.push(Sample::count(&pairs, n));
                }
            }
        }
        out
    }

    /// `coredns_dns_request_duration_seconds`: per server and zone, those
    /// with a request timed.
    fn durations(&self) -> Vec<HistogramSample> {
        self.zones()
            .filter(|(_, s, zone, _)| s.duration[*zone].iter().any(|c| load(c) > 0))
            .map(|(server, s, zone, z)| {
                let sum = load(&s.duration_nanos[zone]) as f64 / 1e9;
                let pairs = [("server", server), ("zone", z), ("view", "")];
                HistogramSample::new(&pairs, &DURATION_BUCKETS, &s.duration[zone], sum)
            })
            .collect()
    }

    /// The size histograms of (zone, proto) slot `zp`, both written once a
    /// request was sized there.
    fn sizes(&self, which: fn(&QueryStats, usize) -> (&[AtomicU64], &AtomicU64)) -> Vec<HistogramSample> {
        let mut out = Vec::new();
        for (server, s, zone, z) in self.zones() {
            for (proto, p) in PROTO_LABELS.into_iter().enumerate() {
                let zp = zone * PROTOS + proto;
                if load(&s.request_bytes[zp]) > 0 || s.request_size[zp].iter().any(|c| load(c) > 0) {
                    let pairs = [("server", server), ("zone", z), ("view", ""), ("proto", p)];
                    let (counts, bytes) = which(s, zp);
                    out.push(HistogramSample::new(&pairs, &SIZE_BUCKETS, counts, load(bytes) as f64));
                }
            }
        }
        out
    }

    /// Per server, one counter per label value of `values`, read from
    /// `counters` (every value written, 0 included).
    fn per_server<const N: usize>(
        &self,
        label: &'static str,
        values: [&'static str; N],
        counters: fn(&QueryStats) -> &[AtomicU64; N],
    ) -> Vec<Sample> {
        let mut out = Vec::new();
        for (server, s) in &self.servers {
            for (value, n) in values.into_iter().zip(counters(s)) {
                out.push(Sample::count(&[("server", server.as_str()), (label, value)], load(n)));
            }
        }
        out
    }
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// The families of `servers`' counters for the zone `zone`.
pub(super) fn families(zone: String, servers: Vec<(String, Arc<QueryStats>)>) -> Families {
    let l = Arc::new(Listeners { zone, servers });
    let mut f = Families::new();
    coredns_families(&mut f, &l);
    our_families(&mut f, l);
    f
}

/// CoreDNS's families (names, help and labels of CoreDNS 1.14), so that its
/// dashboards and alerts read ours.
fn coredns_families(f: &mut Families, l: &Arc<Listeners>) {
    let q = l.clone();
    f.counter(
        "coredns_dns_requests_total",
        "Counter of DNS requests made per zone, protocol and family.",
        &["server", "zone", "view", "proto", "family", "type"],
        move || q.requests(),
    );
    let q = l.clone();
    f.counter(
        "coredns_dns_do_requests_total",
        "Counter of DNS requests with DO bit set per zone.",
        &["server", "zone", "view"],
        move || q.do_requests(),
    );
    let q = l.clone();
    f.counter(
        "coredns_dns_responses_total",
        "Counter of response status codes.",
        &["server", "zone", "view", "rcode", "plugin"],
        move || q.responses(),
    );
    let q = l.clone();
    f.histogram(
        "coredns_dns_request_duration_seconds",
        "Histogram of the time (in seconds) each request took.",
        &["server", "zone", "view"],
        move || q.durations(),
    );
    let q = l.clone();
    f.histogram(
        "coredns_dns_request_size_bytes",
        "Size of the EDNS0 UDP buffer in bytes (64K for TCP).",
        &["server", "zone", "view", "proto"],
        move || q.sizes(|s, zp| (&s.request_size[zp], &s.request_bytes[zp])),
    );
    let q = l.clone();
    f.histogram(
        "coredns_dns_response_size_bytes",
        "Size of the returned response in bytes.",
        &["server", "zone", "view", "proto"],
        move || q.sizes(|s, zp| (&s.response_size[zp], &s.response_bytes[zp])),
    );
}

/// Our own families: rate limiting, debug queries, ECS, zone transfers and
/// TCP connections shed at the cap.
fn our_families(f: &mut Families, l: Arc<Listeners>) {
    let q = l.clone();
    f.counter(
        "clusterset_dns_rrl_responses_total",
        "UDP responses over the rate limit (--rrl-rate): dropped, or slipped (sent truncated or as BADCOOKIE).",
        &["server", "action"],
        move || q.per_server("action", ["dropped", "slipped"], |s| &s.limited),
    );
    let q = l.clone();
    f.counter(
        "clusterset_dns_debug_queries_total",
        "CHAOS TXT debug queries (explain a name, whoami): answered, or refused to clients outside --allow-debug.",
        &["server", "result"],
        move || q.per_server("result", ["answered", "refused"], |s| &s.debug),
    );
    let q = l.clone();
    f.counter(
        "clusterset_dns_ecs_queries_total",
        "Queries with an EDNS Client Subnet: believed (from a sender in --trust-ecs-from), or ignored (any other sender; its source address says who asks).",
        &["server", "result"],
        move || q.per_server("result", EcsUse::LABELS, |s| &s.ecs),
    );
    let q = l.clone();
    f.counter(
        "clusterset_dns_transfers_total",
        "Zone transfer requests (AXFR, IXFR): streamed over TCP, answered over UDP (IXFR: the SOA; AXFR: FORMERR), or refused to clients outside --allow-transfer.",
        &["server", "result"],
        move || q.per_server("result", TransferAsk::LABELS, |s| &s.transfers),
    );
    f.counter(
        "clusterset_dns_tcp_connections_shed_total",
        "TCP connections closed to make room for a new one while every slot of --tcp-max-connections was taken (one waiting for its client, from the address holding the most).",
        &["server"],
        move || {
            let shed = |s: &QueryStats| load(&s.tcp_shed[0]);
            l.servers.iter().map(|(server, s)| Sample::count(&[("server", server.as_str())], shed(s))).collect()
        },
    );
}
