//! Query counters behind the CoreDNS-compatible metrics
//! (`coredns_dns_requests_total`, `…_responses_total`,
//! `…_request_duration_seconds`, `…_request_size_bytes`,
//! `…_response_size_bytes`, `…_do_requests_total`), so existing dashboards
//! work unchanged.
//!
//! Counting must not cost the UDP path: each worker counts into plain
//! arrays ([`LocalStats`]) and adds them to the shared atomics
//! ([`QueryStats`]) at most about once a second; the metrics endpoint reads
//! the atomics at scrape time. Flat arrays indexed by small enums, no labels
//! built and no map looked up per query.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tracing::warn;

use crate::answer::{Pick, Rcode};
use crate::store::{AnswerStats, Balance, BalanceCluster};

/// Query types CoreDNS reports by name; every other type is `other`.
pub const TYPES: [(u16, &str); 19] = [
    (1, "A"),
    (28, "AAAA"),
    (5, "CNAME"),
    (48, "DNSKEY"),
    (43, "DS"),
    (15, "MX"),
    (50, "NSEC3"),
    (47, "NSEC"),
    (2, "NS"),
    (12, "PTR"),
    (46, "RRSIG"),
    (6, "SOA"),
    (33, "SRV"),
    (16, "TXT"),
    (65, "HTTPS"),
    (64, "SVCB"),
    (251, "IXFR"),
    (252, "AXFR"),
    (255, "ANY"),
];
/// Type slots: the named ones and `other`.
pub const TYPE_SLOTS: usize = TYPES.len() + 1;
/// Response codes as CoreDNS writes them.
pub const RCODES: [&str; 8] =
    ["NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED", "BADVERS", "BADCOOKIE"];
/// `coredns_dns_request_duration_seconds` buckets: 0.25 ms doubling to 8 s.
pub const DURATION_BUCKETS: [f64; 16] = [
    0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048,
    4.096, 8.192,
];
/// `coredns_dns_request_size_bytes` / `…_response_size_bytes` buckets.
pub const SIZE_BUCKETS: [f64; 14] =
    [0.0, 100.0, 200.0, 300.0, 400.0, 511.0, 1023.0, 2047.0, 4095.0, 8291.0, 16e3, 32e3, 48e3, 64e3];

/// Zone label slots: the zone, or `dropped` (outside every zone, malformed).
pub const ZONES: usize = 2;
/// Protocol slots: `udp`, `tcp`.
pub const PROTOS: usize = 2;
/// Family slots: `1` (IPv4), `2` (IPv6).
pub const FAMILIES: usize = 2;

const REQUESTS: usize = ZONES * PROTOS * FAMILIES * TYPE_SLOTS;
const RESPONSES: usize = ZONES * RCODES.len();
const DUR: usize = DURATION_BUCKETS.len() + 1;
const SIZE: usize = SIZE_BUCKETS.len() + 1;

/// What answering one query produced, for counting.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// The response code sent.
    pub rcode: Rcode,
    /// False when the query was outside the zone or unreadable (`dropped`).
    pub in_zone: bool,
    /// QTYPE (0 when no question was read).
    pub qtype: u16,
    /// The query's EDNS DO bit.
    pub dnssec_ok: bool,
    /// What rate limiting did to the response.
    pub limited: Limited,
    /// A debug query (`dig CH TXT <name>`): answered (`Some(true)`) or
    /// refused to a client not allowed (`Some(false)`).
    pub debug: Option<bool>,
    /// A zone transfer request (AXFR or IXFR of the apex), and what it got.
    pub transfer: Option<TransferAsk>,
    /// The query carried an EDNS Client Subnet, and whether it was believed.
    pub ecs: Option<EcsUse>,
}

/// What became of a query's EDNS Client Subnet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EcsUse {
    /// From a sender in `--trust-ecs-from` (or asked in process): it says
    /// who asks.
    Believed,
    /// From any other sender: the packet's source address says who asks.
    Ignored,
}

impl EcsUse {
    /// Its slot in the counters and its `result` label.
    pub(crate) const LABELS: [&'static str; 2] = ["believed", "ignored"];

    fn slot(self) -> usize {
        match self {
            Self::Believed => 0,
            Self::Ignored => 1,
        }
    }
}

/// What a zone transfer request got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferAsk {
    /// Over TCP from an allowed client: the connection streams the zone.
    Stream,
    /// Over UDP from an allowed client: IXFR got the SOA alone (ask again
    /// over TCP), AXFR a FORMERR.
    Udp,
    /// From a client outside `--allow-transfer`: REFUSED.
    Refused,
}

impl TransferAsk {
    /// Its slot in the counters and its `result` label.
    pub(crate) const LABELS: [&'static str; 3] = ["streamed", "udp", "refused"];

    fn slot(self) -> usize {
        match self {
            Self::Stream => 0,
            Self::Udp => 1,
            Self::Refused => 2,
        }
    }
}

/// What Response Rate Limiting did to a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limited {
    /// Nothing: sent as answered.
    No,
    /// Not sent.
    Dropped,
    /// Sent truncated, or as BADCOOKIE, instead of the answer.
    Slipped,
}

/// How a query arrived, for counting.
#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    /// 0 = UDP, 1 = TCP.
    pub proto: usize,
    /// 0 = IPv4, 1 = IPv6.
    pub family: usize,
}

macro_rules! layout {
    ($name:ident, $t:ty) => {
        /// Counters in one flat layout (see module docs).
        pub struct $name {
            pub(crate) requests: [$t; REQUESTS],
            pub(crate) do_requests: [$t; ZONES],
            pub(crate) responses: [$t; RESPONSES],
            /// Per zone: non-cumulative bucket counts, the last for `+Inf`.
            pub(crate) duration: [[$t; DUR]; ZONES],
            pub(crate) duration_nanos: [$t; ZONES],
            pub(crate) request_size: [[$t; SIZE]; ZONES * PROTOS],
            pub(crate) request_bytes: [$t; ZONES * PROTOS],
            pub(crate) response_size: [[$t; SIZE]; ZONES * PROTOS],
            pub(crate) response_bytes: [$t; ZONES * PROTOS],
            /// Responses rate limiting dropped (0) and slipped (1).
            pub(crate) limited: [$t; 2],
            /// Debug queries answered (0) and refused (1).
            pub(crate) debug: [$t; 2],
            /// Zone transfer requests by [`TransferAsk`] slot.
            pub(crate) transfers: [$t; 3],
            /// Queries with an EDNS Client Subnet by [`EcsUse`] slot.
            pub(crate) ecs: [$t; 2],
            /// TCP connections closed at `--tcp-max-connections` to make
            /// room for a new one (counted by the accept loop, straight
            /// into the shared atomics: once per connection, not per query).
            pub(crate) tcp_shed: [$t; 1],
        }
    };
}

layout!(LocalStats, u64);
layout!(QueryStats, AtomicU64);

impl Default for LocalStats {
    fn default() -> Self {
        Self {
            requests: [0; REQUESTS],
            do_requests: [0; ZONES],
            responses: [0; RESPONSES],
            duration: [[0; DUR]; ZONES],
            duration_nanos: [0; ZONES],
            request_size: [[0; SIZE]; ZONES * PROTOS],
            request_bytes: [0; ZONES * PROTOS],
            response_size: [[0; SIZE]; ZONES * PROTOS],
            response_bytes: [0; ZONES * PROTOS],
            limited: [0; 2],
            debug: [0; 2],
            transfers: [0; 3],
            ecs: [0; 2],
            tcp_shed: [0; 1],
        }
    }
}

impl Default for QueryStats {
    fn default() -> Self {
        Self {
            requests: std::array::from_fn(|_| AtomicU64::new(0)),
            do_requests: std::array::from_fn(|_| AtomicU64::new(0)),
            responses: std::array::from_fn(|_| AtomicU64::new(0)),
            duration: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            duration_nanos: std::array::from_fn(|_| AtomicU64::new(0)),
            request_size: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            request_bytes: std::array::from_fn(|_| AtomicU64::new(0)),
            response_size: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            response_bytes: std::array::from_fn(|_| AtomicU64::new(0)),
            limited: std::array::from_fn(|_| AtomicU64::new(0)),
            debug: std::array::from_fn(|_| AtomicU64::new(0)),
            transfers: std::array::from_fn(|_| AtomicU64::new(0)),
            ecs: std::array::from_fn(|_| AtomicU64::new(0)),
            tcp_shed: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// The slot of a query type.
pub fn type_slot(qtype: u16) -> usize {
    TYPES.iter().position(|(t, _)| *t == qtype).unwrap_or(TYPES.len())
}

/// The slot of a response code.
pub fn rcode_slot(rcode: Rcode) -> usize {
    match rcode {
        Rcode::NoError => 0,
        Rcode::FormErr => 1,
        Rcode::ServFail => 2,
        Rcode::NxDomain => 3,
        Rcode::NotImp => 4,
        Rcode::Refused => 5,
        Rcode::BadVers => 6,
        Rcode::BadCookie => 7,
    }
}

/// Index into `requests`.
pub fn request_slot(zone: usize, proto: usize, family: usize, ty: usize) -> usize {
    ((zone * PROTOS + proto) * FAMILIES + family) * TYPE_SLOTS + ty
}

fn bucket(buckets: &[f64], value: f64) -> usize {
    buckets.iter().position(|b| value <= *b).unwrap_or(buckets.len())
}

impl LocalStats {
    /// Counts one answered query.
    pub fn record(&mut self, o: &Outcome, a: Arrival, request_len: usize, response_len: usize) {
        let zone = usize::from(!o.in_zone);
        self.requests[request_slot(zone, a.proto, a.family, type_slot(o.qtype))] += 1;
        if o.dnssec_ok {
            self.do_requests[zone] += 1;
        }
        if let Some(answered) = o.debug {
            self.debug[usize::from(!answered)] += 1;
        }
        if let Some(t) = o.transfer {
            self.transfers[t.slot()] += 1;
        }
        if let Some(e) = o.ecs {
            self.ecs[e.slot()] += 1;
        }
        let zp = zone * PROTOS + a.proto;
        self.request_size[zp][bucket(&SIZE_BUCKETS, request_len as f64)] += 1;
        self.request_bytes[zp] += request_len as u64;
        match o.limited {
            Limited::No => {}
            Limited::Dropped => {
                // Nothing was sent: no response to count.
                self.limited[0] += 1;
                return;
            }
            Limited::Slipped => self.limited[1] += 1,
        }
        self.responses[zone * RCODES.len() + rcode_slot(o.rcode)] += 1;
        self.response_size[zp][bucket(&SIZE_BUCKETS, response_len as f64)] += 1;
        self.response_bytes[zp] += response_len as u64;
    }

    /// Counts `n` queries of a zone slot that took `took` each (UDP workers
    /// time a whole batch: every query in it waited that long).
    pub fn record_duration(&mut self, in_zone: bool, n: u64, took: Duration) {
        if n == 0 {
            return;
        }
        let zone = usize::from(!in_zone);
        self.duration[zone][bucket(&DURATION_BUCKETS, took.as_secs_f64())] += n;
        self.duration_nanos[zone] += n * took.as_nanos() as u64;
    }

    /// Adds everything counted to `shared` and starts again from zero.
    pub fn flush(&mut self, shared: &QueryStats) {
        fn add<const N: usize>(local: &mut [u64; N], shared: &[AtomicU64; N]) {
            for (l, s) in local.iter_mut().zip(shared) {
                if *l != 0 {
                    s.fetch_add(*l, Ordering::Relaxed);
                    *l = 0;
                }
            }
        }
        add(&mut self.requests, &shared.requests);
        add(&mut self.do_requests, &shared.do_requests);
        add(&mut self.responses, &shared.responses);
        add(&mut self.duration_nanos, &shared.duration_nanos);
        add(&mut self.request_bytes, &shared.request_bytes);
        add(&mut self.response_bytes, &shared.response_bytes);
        add(&mut self.limited, &shared.limited);
        add(&mut self.debug, &shared.debug);
        add(&mut self.transfers, &shared.transfers);
        let ignored = std::mem::take(&mut self.ecs[EcsUse::Ignored.slot()]);
        if ignored > 0 && shared.ecs[EcsUse::Ignored.slot()].fetch_add(ignored, Ordering::Relaxed) == 0 {
            // Once per listener (the flush that brings the first), so that
            // an upgrade which stops believing a resolver says so in the
            // log; the counter says how often after that.
            warn!(
                "an EDNS Client Subnet from a sender outside --trust-ecs-from was ignored: such queries \
                 are answered for their source address, counted in clusterset_dns_ecs_queries_total \
                 with result=ignored (docs/answers.md, Who asks)"
            );
        }
        add(&mut self.ecs, &shared.ecs);
        add(&mut self.tcp_shed, &shared.tcp_shed);
        for (l, s) in self.duration.iter_mut().zip(&shared.duration) {
            add(l, s);
        }
        for (l, s) in self.request_size.iter_mut().zip(&shared.request_size) {
            add(l, s);
        }
        for (l, s) in self.response_size.iter_mut().zip(&shared.response_size) {
            add(l, s);
        }
    }
}

/// Distinct slots (a (service, cluster) or a cluster) one thread counts
/// between flushes.
const HIT_SLOTS: usize = 64;

/// One thread's `clusterset_dns_answers_total` and
/// `clusterset_dns_cluster_answers_total` counts: a small open-
/// addressed table of (slot, count), inline (no allocation), flushed to
/// [`AnswerStats`] when full and whenever the thread flushes its query
/// counters.
pub struct AnswerHits {
    table: [(u32, u64); HIT_SLOTS],
    used: usize,
}

impl Default for AnswerHits {
    fn default() -> Self {
        Self { table: [(u32::MAX, 0); HIT_SLOTS], used: 0 }
    }
}

impl AnswerHits {
    /// Counts the clusters whose endpoints are in one answer of family
    /// `fam` (0 = A, 1 = AAAA): every cluster with records of the family
    /// for a whole-RRset pick, else those holding a listed record.
    pub fn count(&mut self, shared: &AnswerStats, b: &Balance, fam: usize, pick: Pick, picks: &[u32]) {
        match pick {
            Pick::All | Pick::Rotate(_) => {
                for c in b.clusters.iter().filter(|c| c.records[fam].1 > c.records[fam].0) {
                    self.hit_cluster(shared, c);
                }
            }
            Pick::Listed => {
                // Each cluster once per answer (exactly for the first 64
                // clusters of a service; beyond, per listed record).
                let mut seen = [false; 64];
                for &i in picks {
                    let Some(ci) =
                        b.clusters.iter().position(|c| (c.records[fam].0..c.records[fam].1).contains(&i))
                    else {
                        continue;
                    };
                    if let Some(s) = seen.get_mut(ci) {
                        if *s {
                            continue;
                        }
                        *s = true;
                    }
                    self.hit_cluster(shared, &b.clusters[ci]);
                }
            }
        }
    }

    /// One answer held cluster `c`'s endpoints: counted for the service
    /// and for the cluster.
    fn hit_cluster(&mut self, shared: &AnswerStats, c: &BalanceCluster) {
        self.hit(shared, c.stat);
        self.hit(shared, AnswerStats::cluster_slot(c.id));
    }

    fn hit(&mut self, shared: &AnswerStats, slot: u32) {
        if slot == u32::MAX {
            return;
        }
        let mut i = slot as usize % HIT_SLOTS;
        for _ in 0..HIT_SLOTS {
            let e = &mut self.table[i];
            if e.0 == slot {
                e.1 += 1;
                return;
            }
            if e.0 == u32::MAX {
                *e = (slot, 1);
                self.used += 1;
                return;
            }
            i = (i + 1) % HIT_SLOTS;
        }
        // Full: more distinct services than fit between flushes.
        self.flush(shared);
        self.table[slot as usize % HIT_SLOTS] = (slot, 1);
        self.used = 1;
    }

    /// Adds everything counted to `shared` and starts again from zero.
    pub fn flush(&mut self, shared: &AnswerStats) {
        if self.used == 0 {
            return;
        }
        for e in self.table.iter_mut().filter(|e| e.0 != u32::MAX) {
            shared.add(e.0, e.1);
            *e = (u32::MAX, 0);
        }
        self.used = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_land_in_their_label_slots_after_a_flush() {
        let shared = QueryStats::default();
        let mut local = LocalStats::default();
        let o = Outcome {
            rcode: Rcode::NxDomain,
            in_zone: true,
            qtype: 33,
            dnssec_ok: true,
            limited: Limited::No,
            debug: None,
            transfer: None,
            ecs: Some(EcsUse::Ignored),
        };
        local.record(&o, Arrival { proto: 0, family: 1 }, 60, 512);
        local.record_duration(true, 1, Duration::from_micros(300));
        assert_eq!(
            shared.requests[request_slot(0, 0, 1, type_slot(33))].load(Ordering::Relaxed),
            0,
            "not before a flush"
        );
        local.flush(&shared);
        assert_eq!(shared.requests[request_slot(0, 0, 1, 12)].load(Ordering::Relaxed), 1, "SRV is slot 12");
        assert_eq!(shared.responses[3].load(Ordering::Relaxed), 1);
        assert_eq!(shared.do_requests[0].load(Ordering::Relaxed), 1);
        assert_eq!(shared.duration[0][1].load(Ordering::Relaxed), 1, "0.3 ms falls in the 0.5 ms bucket");
        assert_eq!(shared.request_size[0][1].load(Ordering::Relaxed), 1, "60 bytes: the 100 bucket");
        assert_eq!(shared.response_size[0][6].load(Ordering::Relaxed), 1, "512 bytes: the 1023 bucket");
        assert_eq!(shared.ecs.each_ref().map(|e| e.load(Ordering::Relaxed)), [0, 1], "an ignored ECS");
        assert_eq!(local.requests.iter().sum::<u64>(), 0);
        assert_eq!(type_slot(99), TYPES.len());
    }
}
