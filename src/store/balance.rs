//! What the answer policies need, built when a service is published: the
//! global answer settings, who the clients are (CIDR → cluster), and per
//! service a [`Balance`]: its policy, its clusters, and for every endpoint of
//! its A/AAAA answer the cluster, zone, health and the records it owns.
//!
//! The records themselves stay in the service's RRsets, encoded once and in
//! endpoint order; a [`Balance`] only points into them by index. So marking
//! an endpoint or a cluster down (`Update::EndpointHealth`,
//! `Update::ClusterLiveness`) builds a new `Balance` and re-encodes nothing.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::model::{ClusterId, ClusterWeight, PolicyKind, ServiceKey};

/// A client network: queries from (or with an EDNS Client Subnet inside)
/// `addr/prefix` come from `cluster`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientNet {
    /// The network address (host bits zero).
    pub addr: IpAddr,
    /// The prefix length.
    pub prefix: u8,
    /// The cluster its clients run in.
    pub cluster: ClusterId,
    /// Their zone, when known (`CIDR=CLUSTER/ZONE`), for the topology ladder.
    pub zone: Option<String>,
}

/// The global answer settings (`--answer-policy`, `--max-answers`, …);
/// a ServiceImport's annotations override them per service.
#[derive(Debug, Clone)]
pub struct AnswerConfig {
    /// Policy of headless services (and ClusterSetIP services answered with
    /// their endpoints).
    pub policy: PolicyKind,
    /// Most endpoints in one answer; 0 answers all.
    pub max_answers: u16,
    /// Healthy endpoints the preferred locality needs before answers stop
    /// spilling to the next one.
    pub local_min_healthy: u16,
    /// When every endpoint is unhealthy, answer them all rather than none.
    pub fail_open: bool,
    /// Answer every ClusterSetIP service with its endpoints, not its VIP.
    pub endpoint_answers: bool,
    /// Client networks, the most specific match wins.
    pub clients: Vec<ClientNet>,
    /// Region of each cluster, for the topology ladder.
    pub regions: Vec<(ClusterId, String)>,
    /// The cluster of clients no network matches (`--cluster-id`).
    pub default_cluster: Option<ClusterId>,
}

impl AnswerConfig {
    /// The specification's behaviour: rotation over every ready endpoint of
    /// a headless service, VIPs for ClusterSetIP, no client networks.
    pub fn standard() -> Self {
        Self {
            policy: PolicyKind::Rotation,
            max_answers: 0,
            local_min_healthy: 1,
            fail_open: true,
            endpoint_answers: false,
            clients: Vec::new(),
            regions: Vec::new(),
            default_cluster: None,
        }
    }
}

/// Client networks and localities, interned once: the read path compares
/// small integers, never strings.
#[derive(Debug)]
pub struct Localities {
    /// Interned clusters: the index is the id. Those of the configuration
    /// come first; the writer adds the clusters its slices name.
    pub(crate) clusters: Vec<ClusterId>,
    /// Interned zones, the same way.
    pub(crate) zones: Vec<String>,
    /// Region id of each configured cluster.
    pub(crate) regions: Vec<(u16, u16)>,
    /// Names of the regions.
    pub(crate) region_names: Vec<String>,
    nets: Vec<Net>,
    default_cluster: Option<u16>,
}

#[derive(Debug)]
struct Net {
    addr: [u8; 16],
    v6: bool,
    prefix: u8,
    cluster: u16,
    zone: Option<u16>,
}

/// Who asks, as far as the policies care.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Client {
    /// Interned cluster id.
    pub cluster: Option<u16>,
    /// Interned zone id.
    pub zone: Option<u16>,
    /// Region id.
    pub region: Option<u16>,
    /// Prefix length of the network that identified the client (the ECS
    /// scope of an answer that depends on it); 0 when none did.
    pub prefix: u8,
}

fn intern<T: PartialEq + Clone>(list: &mut Vec<T>, v: &T) -> u16 {
    if let Some(i) = list.iter().position(|x| x == v) {
        return i as u16;
    }
    list.push(v.clone());
    (list.len() - 1) as u16
}

fn bytes(addr: IpAddr) -> ([u8; 16], bool) {
    match addr {
        IpAddr::V4(a) => {
            let mut b = [0; 16];
            b[..4].copy_from_slice(&a.octets());
            (b, false)
        }
        IpAddr::V6(a) => (a.octets(), true),
    }
}

/// True when the first `prefix` bits of `a` and `b` are equal.
fn prefix_eq(a: &[u8; 16], b: &[u8], prefix: u8) -> bool {
    let full = usize::from(prefix / 8);
    if a[..full] != b[..full] {
        return false;
    }
    let rest = prefix % 8;
    rest == 0 || (a[full] ^ b[full]) & (0xFFu8 << (8 - rest)) == 0
}

impl Localities {
    pub(crate) fn new(cfg: &AnswerConfig) -> Self {
        let mut l = Self {
            clusters: Vec::new(),
            zones: Vec::new(),
            regions: Vec::new(),
            region_names: Vec::new(),
            nets: Vec::new(),
            default_cluster: None,
        };
        for n in &cfg.clients {
            let cluster = intern(&mut l.clusters, &n.cluster);
            let zone = n.zone.as_ref().map(|z| intern(&mut l.zones, z));
            let (addr, v6) = bytes(n.addr);
            l.nets.push(Net { addr, v6, prefix: n.prefix, cluster, zone });
        }
        // Most specific first: the first match is the longest prefix.
        l.nets.sort_by_key(|n| std::cmp::Reverse(n.prefix));
        for (cluster, region) in &cfg.regions {
            let c = intern(&mut l.clusters, cluster);
            let r = intern(&mut l.region_names, region);
            l.regions.push((c, r));
        }
        l.default_cluster = cfg.default_cluster.as_ref().map(|c| intern(&mut l.clusters, c));
        l
    }

    /// The id of a cluster, when it is known here.
    pub fn cluster_id(&self, name: &str) -> Option<u16> {
        self.clusters.iter().position(|c| c.as_str() == name).map(|i| i as u16)
    }

    /// The name of an interned cluster.
    pub fn cluster_name(&self, id: u16) -> Option<&ClusterId> {
        self.clusters.get(usize::from(id))
    }

    /// The name of an interned zone.
    pub fn zone_name(&self, id: u16) -> Option<&str> {
        self.zones.get(usize::from(id)).map(String::as_str)
    }

    pub(crate) fn region_of(&self, cluster: u16) -> Option<u16> {
        self.regions.iter().find(|(c, _)| *c == cluster).map(|(_, r)| *r)
    }

    /// The client a cluster name stands for (`explain --from-cluster`).
    pub fn client_in(&self, cluster: u16) -> Client {
        Client { cluster: Some(cluster), zone: None, region: self.region_of(cluster), prefix: 0 }
    }

    /// Who sent a query: the most specific client network holding `addr`
    /// (the first `bits` bits of it: an EDNS Client Subnet's source prefix),
    /// else `--cluster-id`, else unknown. `addr` holds 4 bytes for IPv4.
    pub fn client(&self, addr: &[u8], v6: bool, bits: u8) -> Client {
        for n in &self.nets {
            // A network longer than what the client revealed cannot be matched.
            if n.v6 == v6 && n.prefix <= bits && prefix_eq(&n.addr, addr, n.prefix) {
                return Client {
                    cluster: Some(n.cluster),
                    zone: n.zone,
                    region: self.region_of(n.cluster),
                    prefix: n.prefix,
                };
            }
        }
        match self.default_cluster {
            Some(c) => Client { cluster: Some(c), zone: None, region: self.region_of(c), prefix: 0 },
            None => Client::default(),
        }
    }

    /// [`Localities::client`] for a socket's peer address.
    pub fn client_at(&self, addr: IpAddr) -> Client {
        match addr {
            IpAddr::V4(a) => self.client(&a.octets(), false, 32),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => self.client(&v4.octets(), false, 32),
                None => self.client(&a.octets(), true, 128),
            },
        }
    }
}

/// The writer's interned clusters and zones: those of the configuration
/// first (so their ids agree with [`Localities`]), then every one a slice
/// names. Ids are never reused.
#[derive(Debug, Clone, Default)]
pub(crate) struct Interner {
    pub(crate) clusters: Vec<ClusterId>,
    pub(crate) zones: Vec<String>,
}

impl Interner {
    pub(crate) fn new(l: &Localities) -> Self {
        Self { clusters: l.clusters.clone(), zones: l.zones.clone() }
    }

    pub(crate) fn cluster(&mut self, c: &ClusterId) -> u16 {
        intern(&mut self.clusters, c)
    }

    pub(crate) fn zone(&mut self, z: &str) -> u16 {
        match self.zones.iter().position(|x| x == z) {
            Some(i) => i as u16,
            None => intern(&mut self.zones, &z.to_owned()),
        }
    }
}

/// One cluster of a balanced service.
#[derive(Debug, Clone)]
pub struct BalanceCluster {
    /// Interned id (compared with [`Client::cluster`]).
    pub id: u16,
    /// Its name.
    pub name: ClusterId,
    /// Region id, when configured.
    pub region: Option<u16>,
    /// Weight for the weighted policy.
    pub weight: u32,
    /// Its slot in [`AnswerStats`] (`u32::MAX`: not counted).
    pub stat: u32,
    /// Its records per family (0 = A, 1 = AAAA): first index, end. A
    /// cluster's endpoints are neighbours, so this is one range.
    pub records: [(u32, u32); 2],
}

/// One endpoint of a balanced service's A/AAAA answer.
#[derive(Debug, Clone)]
pub struct EndpointMeta {
    /// Index into [`Balance::clusters`].
    pub cluster: u16,
    /// Interned zone id.
    pub zone: Option<u16>,
    /// Its records per family (0 = A, 1 = AAAA): first index, count.
    pub records: [(u32, u16); 2],
    /// What identifies it (targetRef, hostname or address), for explain.
    pub name: Box<str>,
    /// Its zone's name, for explain.
    pub zone_name: Option<Box<str>>,
    /// Its addresses, for health and explain.
    pub addresses: Box<[IpAddr]>,
}

/// A service's answer policy and the metadata of its endpoints; see the
/// module docs.
#[derive(Debug)]
pub struct Balance {
    /// The policy.
    pub policy: PolicyKind,
    /// Most endpoints per answer, 0 for all.
    pub max_answers: u16,
    /// Healthy endpoints a locality needs before answers stop spilling over.
    pub min_healthy: u16,
    /// Answer every endpoint when none is healthy.
    pub fail_open: bool,
    /// The service's clusters.
    pub clusters: Box<[BalanceCluster]>,
    /// The endpoints, in the order of their records.
    pub endpoints: Box<[EndpointMeta]>,
    /// Health overlay, one per endpoint.
    pub healthy: Box<[bool]>,
    /// Healthy endpoints with records of each family.
    pub healthy_count: [u32; 2],
    /// Endpoints with records of each family.
    pub present: [u32; 2],
    /// Per-family query counters: the n-th A and the n-th AAAA query pick
    /// the same endpoints, and each family rotates evenly on its own.
    seq: [AtomicU32; 2],
    /// Varies the random policy between services.
    pub salt: u32,
    /// The service, for active probes' verdicts.
    pub service: ServiceKey,
    /// The TCP port active probes connect to; none: not probed.
    pub probe_port: Option<u16>,
}

impl Balance {
    pub(crate) fn new(
        policy: PolicyKind,
        (max_answers, min_healthy, fail_open): (u16, u16, bool),
        clusters: Box<[BalanceCluster]>,
        endpoints: Box<[EndpointMeta]>,
        healthy: Box<[bool]>,
        salt: u32,
        (service, probe_port): (ServiceKey, Option<u16>),
    ) -> Self {
        let mut b = Self {
            policy,
            max_answers,
            min_healthy: min_healthy.max(1),
            fail_open,
            clusters,
            endpoints,
            healthy,
            healthy_count: [0; 2],
            present: [0; 2],
            seq: [AtomicU32::new(0), AtomicU32::new(0)],
            salt,
            service,
            probe_port,
        };
        b.count();
        b
    }

    fn count(&mut self) {
        for (i, c) in self.clusters.iter_mut().enumerate() {
            for f in 0..2 {
                let mut range = (u32::MAX, 0);
                for e in self.endpoints.iter().filter(|e| usize::from(e.cluster) == i && e.records[f].1 > 0) {
                    range.0 = range.0.min(e.records[f].0);
                    range.1 = range.1.max(e.records[f].0 + u32::from(e.records[f].1));
                }
                c.records[f] = if range.1 == 0 { (0, 0) } else { range };
            }
        }
        for f in 0..2 {
            self.present[f] = self.endpoints.iter().filter(|e| e.records[f].1 > 0).count() as u32;
            self.healthy_count[f] = self
                .endpoints
                .iter()
                .zip(&self.healthy[..])
                .filter(|(e, h)| **h && e.records[f].1 > 0)
                .count() as u32;
        }
    }

    /// The same service with another health overlay; records untouched.
    pub(crate) fn with_health(&self, healthy: Box<[bool]>, weights: Option<&[ClusterWeight]>) -> Self {
        let mut clusters = self.clusters.clone();
        set_weights(&mut clusters, &self.endpoints, &healthy, weights);
        Self::new(
            self.policy,
            (self.max_answers, self.min_healthy, self.fail_open),
            clusters,
            self.endpoints.clone(),
            healthy,
            self.salt,
            (self.service.clone(), self.probe_port),
        )
    }

    /// Takes the next sequence number of a family (0 = A, 1 = AAAA).
    pub fn next_seq(&self, family: usize) -> u32 {
        self.seq[family].fetch_add(1, Ordering::Relaxed)
    }

    /// The sequence number the next query of a family will take.
    pub fn peek_seq(&self, family: usize) -> u32 {
        self.seq[family].load(Ordering::Relaxed)
    }
}

/// Weights from the annotation (clusters it does not list get 0), else
/// proportional to each cluster's healthy endpoints.
pub(crate) fn set_weights(
    clusters: &mut [BalanceCluster],
    endpoints: &[EndpointMeta],
    healthy: &[bool],
    weights: Option<&[ClusterWeight]>,
) {
    for (i, c) in clusters.iter_mut().enumerate() {
        c.weight = match weights {
            Some(w) => w.iter().find(|w| w.cluster == c.name).map_or(0, |w| w.weight),
            None => endpoints.iter().zip(healthy).filter(|(e, h)| **h && usize::from(e.cluster) == i).count()
                as u32,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(nets: &[(&str, u8, &str)]) -> AnswerConfig {
        let mut c = AnswerConfig::standard();
        c.clients = nets
            .iter()
            .map(|(a, p, cl)| ClientNet {
                addr: a.parse().unwrap(),
                prefix: *p,
                cluster: ClusterId::parse(cl).unwrap(),
                zone: None,
            })
            .collect();
        c
    }

    #[test]
    fn the_most_specific_client_network_wins() {
        let l = Localities::new(&cfg(&[
            ("10.0.0.0", 8, "wide"),
            ("10.1.0.0", 16, "narrow"),
            ("fd00::", 16, "six"),
        ]));
        let name = |c: Client| c.cluster.and_then(|i| l.cluster_name(i)).map(|c| c.to_string());
        assert_eq!(name(l.client_at("10.1.2.3".parse().unwrap())).as_deref(), Some("narrow"));
        assert_eq!(l.client_at("10.1.2.3".parse().unwrap()).prefix, 16);
        assert_eq!(name(l.client_at("10.2.2.3".parse().unwrap())).as_deref(), Some("wide"));
        assert_eq!(name(l.client_at("fd00:1::1".parse().unwrap())).as_deref(), Some("six"));
        assert_eq!(name(l.client_at("::ffff:10.1.0.1".parse().unwrap())).as_deref(), Some("narrow"));
        assert_eq!(l.client_at("192.0.2.1".parse().unwrap()), Client::default());
        // An ECS /12 does not reveal enough to match the /16.
        assert_eq!(name(l.client(&[10, 1, 0, 0], false, 12)).as_deref(), Some("wide"));
    }

    #[test]
    fn prefixes_compare_partial_bytes() {
        let a = [10, 0b1010_0000, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        assert!(prefix_eq(&a, &[10, 0b1010_1111, 9, 9], 12));
        assert!(!prefix_eq(&a, &[10, 0b1011_0000, 9, 9], 12));
        assert!(prefix_eq(&a, &[99, 0, 0, 0], 0));
    }
}

/// Most (service, cluster) pairs `clusterset_dns_answers_total` counts;
/// pairs beyond it are not counted (logged once).
pub const ANSWER_SLOTS: usize = 16384;

/// `clusterset_dns_answers_total{service,cluster}`: how often a cluster's
/// endpoints were in a service's answer. The writer gives each (service,
/// cluster) a slot at publish time (the mutex is never taken on the
/// answer path); answering threads add their local counts to the atomics
/// now and then (`wire::stats::AnswerHits`); `/metrics` reads them.
#[derive(Debug)]
pub struct AnswerStats {
    counts: Box<[std::sync::atomic::AtomicU64]>,
    slots: std::sync::Mutex<Slots>,
}

#[derive(Debug, Default)]
struct Slots {
    index: std::collections::HashMap<(ServiceKey, ClusterId), u32>,
    labels: Vec<(String, String)>,
    full_logged: bool,
}

impl Default for AnswerStats {
    fn default() -> Self {
        Self {
            counts: (0..ANSWER_SLOTS).map(|_| std::sync::atomic::AtomicU64::new(0)).collect(),
            slots: std::sync::Mutex::default(),
        }
    }
}

impl AnswerStats {
    /// The slot of a (service, cluster), assigned on first use; slots are
    /// never reused, so a counter never changes labels.
    pub(crate) fn slot(&self, service: &ServiceKey, cluster: &ClusterId) -> u32 {
        let Ok(mut s) = self.slots.lock() else { return u32::MAX };
        if let Some(&i) = s.index.get(&(service.clone(), cluster.clone())) {
            return i;
        }
        if s.labels.len() >= ANSWER_SLOTS {
            if !s.full_logged {
                s.full_logged = true;
                tracing::warn!(
                    "more than {ANSWER_SLOTS} (service, cluster) pairs: the rest are not counted in clusterset_dns_answers_total"
                );
            }
            return u32::MAX;
        }
        let i = s.labels.len() as u32;
        s.labels.push((service.to_string(), cluster.to_string()));
        s.index.insert((service.clone(), cluster.clone()), i);
        i
    }

    /// Adds `n` to a slot.
    pub fn add(&self, slot: u32, n: u64) {
        if let Some(c) = self.counts.get(slot as usize) {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Every counted (service, cluster) and its count, for `/metrics`.
    pub fn read(&self) -> Vec<(String, String, u64)> {
        let Ok(s) = self.slots.lock() else { return Vec::new() };
        s.labels
            .iter()
            .zip(self.counts.iter())
            .map(|((svc, c), n)| (svc.clone(), c.clone(), n.load(Ordering::Relaxed)))
            .filter(|(_, _, n)| *n > 0)
            .collect()
    }
}
