//! Answer policies on the read path: which of a balanced service's
//! endpoints answer one query, in which order.
//!
//! Every policy is the same three steps over the service's [`Balance`]:
//! 1. each eligible endpoint (records of the queried family; inside the
//!    service's boundary from the client, when local-first or topology has
//!    one; healthy, or every one of those when none is and fail-open is on)
//!    gets a *tier*: 0 is most preferred (the client's cluster, its zone,
//!    the weighted draw's cluster);
//! 2. the policy decides how many tiers answer: one, or (local-first,
//!    topology) as many as it takes to reach `min_healthy` endpoints
//!    (spill-over), or (weighted) all of them, preferred first;
//! 3. each tier is emitted rotated (or permuted, for random) by the query's
//!    sequence number, up to `max_answers` endpoints.
//!
//! The outcome is a list of record indices in a fixed-size buffer the
//! caller owns: no allocation, no lock, one relaxed atomic increment. The
//! sequence number is per service and family, so the n-th A and the n-th
//! AAAA query choose the same endpoints and each family rotates evenly.

use crate::model::{Boundary, PolicyKind};
use crate::store::{Balance, Client};

/// Most records a chosen answer lists. Larger answers than this are only
/// possible over TCP; a policy answers at most this many records.
pub const MAX_PICKS: usize = 1024;
/// Tiers of the topology ladder: zone, region (or cluster), any.
const TIERS: usize = 3;
/// Tiers bigger than this are rotated from a random start instead of shuffled.
const MAX_PERMUTED: usize = 256;

/// Record indices chosen for one answer, reused across queries.
pub struct Picks {
    pub(crate) idx: [u32; MAX_PICKS],
    pub(crate) len: usize,
}

impl Default for Picks {
    fn default() -> Self {
        Self { idx: [0; MAX_PICKS], len: 0 }
    }
}

impl Picks {
    /// The chosen record indices, in answer order.
    pub fn as_slice(&self) -> &[u32] {
        &self.idx[..self.len]
    }
}

/// Which records of the RRset an answer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// Every record in stored order.
    All,
    /// Every record, starting at this index and wrapping around.
    Rotate(u32),
    /// The records listed in the [`Picks`] buffer.
    Listed,
}

/// What a policy decided, for `explain`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Decision {
    /// The query's sequence number within its service and family.
    pub seq: u32,
    /// Eligible endpoints per tier.
    pub tiers: [u32; TIERS],
    /// Tiers answered (1 = only the preferred one).
    pub answered_tiers: u8,
    /// Index into `Balance::clusters` of the weighted draw.
    pub drawn: Option<u16>,
    /// No endpoint was healthy and every one was answered (fail-open);
    /// with a boundary, every one inside it.
    pub failed_open: bool,
    /// The boundary the answer kept (none when the policy has none).
    pub boundary: Boundary,
    /// Endpoints with records of the family that the boundary left out.
    pub outside: u32,
    /// Endpoints answered.
    pub endpoints: u32,
}

/// A 32-bit mix (the lowbias32 finalizer): the random policy's and the
/// weighted draw's randomness, a pure function of the sequence number so
/// that A and AAAA queries with the same number agree.
fn mix(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// Chooses the records of family `fam` (0 = A, 1 = AAAA) for one query with
/// sequence number `seq`. `None`: nothing may be answered (every endpoint
/// unhealthy and fail-open off).
pub fn choose(
    b: &Balance,
    fam: usize,
    client: &Client,
    seq: u32,
    records: usize,
    picks: &mut Picks,
) -> Option<(Pick, Decision)> {
    let boundary = b.applied_boundary();
    let mut d = Decision { seq, answered_tiers: 1, boundary, ..Decision::default() };
    let has = |i: usize| b.endpoints[i].records[fam].1 > 0;
    // Fail-open is decided inside the boundary: an unhealthy endpoint
    // inside is answered before a healthy one outside would be (never).
    let (present, healthy) = if boundary == Boundary::None {
        (b.present[fam], b.healthy_count[fam])
    } else {
        let (mut present, mut healthy) = (0, 0);
        for i in (0..b.endpoints.len()).filter(|&i| has(i)) {
            if inside(b, i, client) {
                present += 1;
                healthy += u32::from(b.healthy[i]);
            }
        }
        d.outside = b.present[fam] - present;
        (present, healthy)
    };
    if present == 0 || (healthy == 0 && !b.fail_open) {
        return None;
    }
    d.failed_open = healthy == 0;
    let open = d.failed_open;
    let every = healthy == present || d.failed_open;
    let cap = if b.max_answers == 0 { u32::MAX } else { u32::from(b.max_answers) };
    // Only policies that ignore the client take this path: they have no
    // boundary, so `present` is every endpoint of the family.
    if every && cap >= present && records > 0 {
        // The common case needs no list: the whole RRset, maybe rotated.
        match b.policy {
            PolicyKind::All => {
                d.tiers[0] = b.present[fam];
                d.endpoints = b.present[fam];
                return Some((Pick::All, d));
            }
            PolicyKind::Rotation => {
                d.tiers[0] = b.present[fam];
                d.endpoints = b.present[fam];
                return Some((Pick::Rotate(seq % records as u32), d));
            }
            _ => {}
        }
    }
    // Endpoints are ordered over both families, so that an A and an AAAA
    // query with the same sequence number put a dual-stack Pod in the same
    // place; each answer then keeps those with records of its family.
    let candidate = |i: usize| {
        let r = &b.endpoints[i].records;
        (r[0].1 > 0 || r[1].1 > 0)
            && (open || b.healthy[i])
            && (boundary == Boundary::None || inside(b, i, client))
    };
    if b.policy == PolicyKind::Weighted {
        d.drawn = draw(b, mix(seq ^ b.salt));
    }
    let drawn = d.drawn;
    let tier = |i: usize| tier(b, i, client, drawn);
    let mut union = [0usize; TIERS];
    for i in (0..b.endpoints.len()).filter(|&i| candidate(i)) {
        let t = tier(i);
        union[t] += 1;
        d.tiers[t] += u32::from(has(i));
    }
    let last = match b.policy {
        PolicyKind::LocalFirst | PolicyKind::Topology => {
            // Spill over to the next locality until enough are healthy.
            let mut sum = 0;
            let mut last = TIERS - 1;
            for (t, n) in d.tiers.iter().enumerate() {
                sum += n;
                if sum >= u32::from(b.min_healthy) {
                    last = t;
                    break;
                }
            }
            last
        }
        PolicyKind::Weighted => TIERS - 1,
        _ => 0,
    };
    d.answered_tiers = last as u8 + 1;
    picks.len = 0;
    for (t, &c) in union.iter().enumerate().take(last + 1) {
        if d.tiers[t] == 0 {
            continue;
        }
        let member = |i: usize| candidate(i) && tier(i) == t;
        let done = if b.policy == PolicyKind::Random && c <= MAX_PERMUTED {
            // A partial Fisher-Yates shuffle: only as many places as answered.
            let mut members = [0u16; MAX_PERMUTED];
            let mut n = 0;
            for i in (0..b.endpoints.len()).filter(|&i| member(i)) {
                members[n] = i as u16;
                n += 1;
            }
            let mut state = mix(seq ^ b.salt ^ ((t as u32) << 24)) | 1;
            let mut done = false;
            for j in 0..n {
                // xorshift32: cheap, and a pure function of the sequence number.
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                let k = j + state as usize % (n - j);
                members.swap(j, k);
                let i = usize::from(members[j]);
                if has(i) && push(b, i, fam, picks, &mut d, cap) {
                    done = true;
                    break;
                }
            }
            done
        } else {
            // Rotation: members from rank `start` on, then those before it.
            let start = match b.policy {
                PolicyKind::All => 0,
                PolicyKind::Random => mix(seq ^ b.salt) as usize % c,
                _ => seq as usize % c,
            };
            let mut done = false;
            'passes: for pass in 0..2 {
                for (rank, i) in (0..b.endpoints.len()).filter(|&i| member(i)).enumerate() {
                    let take = if pass == 0 { rank >= start } else { rank < start };
                    if take && has(i) && push(b, i, fam, picks, &mut d, cap) {
                        done = true;
                        break 'passes;
                    }
                }
            }
            done
        };
        if done {
            break;
        }
    }
    if picks.len == 0 {
        return None;
    }
    Some((Pick::Listed, d))
}

/// Adds endpoint `i`'s records; true when the answer is complete (the
/// endpoint cap or the buffer reached).
fn push(b: &Balance, i: usize, fam: usize, picks: &mut Picks, d: &mut Decision, cap: u32) -> bool {
    let (first, count) = b.endpoints[i].records[fam];
    for r in first..first + u32::from(count) {
        if picks.len == MAX_PICKS {
            return true;
        }
        picks.idx[picks.len] = r;
        picks.len += 1;
    }
    d.endpoints += 1;
    d.endpoints >= cap
}

/// The weighted draw: a cluster with probability weight / total.
fn draw(b: &Balance, r: u32) -> Option<u16> {
    let total: u64 = b.clusters.iter().map(|c| u64::from(c.weight)).sum();
    if total == 0 {
        return None;
    }
    let mut x = u64::from(r) % total;
    for (i, c) in b.clusters.iter().enumerate() {
        if x < u64::from(c.weight) {
            return Some(i as u16);
        }
        x -= u64::from(c.weight);
    }
    None
}

/// True when endpoint `i` is within the service's boundary from `client`.
/// What is not known is outside: an endpoint without a zone, or a client
/// without one, is in no client's zone; a cluster without a region is in
/// no client's region, and a client's own cluster is always in its region
/// (a cluster does not span regions), so a client whose cluster has no
/// region is bounded by that cluster. A client of no known cluster has
/// nothing inside any boundary: answers never leave a scope nobody knows.
pub fn inside(b: &Balance, i: usize, client: &Client) -> bool {
    let e = &b.endpoints[i];
    let cluster = &b.clusters[usize::from(e.cluster)];
    let own_cluster = client.cluster == Some(cluster.id);
    match b.applied_boundary() {
        Boundary::None => true,
        Boundary::Zone => client.zone.is_some() && e.zone == client.zone,
        Boundary::Cluster => own_cluster,
        Boundary::Region => own_cluster || (client.region.is_some() && cluster.region == client.region),
    }
}

/// Endpoint `i`'s tier under the service's policy for this client.
pub fn tier(b: &Balance, i: usize, client: &Client, drawn: Option<u16>) -> usize {
    let e = &b.endpoints[i];
    let cluster = &b.clusters[usize::from(e.cluster)];
    match b.policy {
        PolicyKind::All | PolicyKind::Rotation | PolicyKind::Random => 0,
        PolicyKind::Weighted => usize::from(drawn.is_some_and(|c| c != e.cluster)),
        PolicyKind::LocalFirst => match client.cluster {
            Some(c) if c != cluster.id => 1,
            _ => 0, // the client's cluster, or nobody is local to an unknown client
        },
        PolicyKind::Topology => {
            let unknown = client.cluster.is_none() && client.zone.is_none();
            // An unknown client is near everyone; else its zone comes first.
            if unknown || (client.zone.is_some() && e.zone == client.zone) {
                0
            } else if client.cluster == Some(cluster.id)
                || (client.region.is_some() && cluster.region == client.region)
            {
                1
            } else {
                2
            }
        }
    }
}

/// True when the answer a policy gives depends on who asks.
pub fn depends_on_client(b: &Balance) -> bool {
    b.policy.depends_on_client()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::net::IpAddr;

    use hickory_proto::rr::Name;

    use super::*;
    use crate::answer::{Question, lookup_for};
    use crate::model::{
        AddressFamily, AnswerOverrides, ClusterId, DnsLabel, Endpoint, EndpointSet, ImportType,
        ServiceImport, ServiceKey, SliceKey,
    };
    use crate::store::{self, AnswerConfig, ClientNet, Object, Reader, SourceId, Update, Writer, ZoneConfig};

    const NAME: &[u8] = b"\x02hl\x02ns\x03svc\x0aclusterset\x05local\x00";

    fn key() -> ServiceKey {
        ServiceKey { namespace: DnsLabel::parse("ns").unwrap(), name: DnsLabel::parse("hl").unwrap() }
    }

    /// Clients in 10.<n>.0.0/16 are in cluster `c<n>`, zone `z<n>`.
    fn answers(policy: PolicyKind) -> AnswerConfig {
        let mut a = AnswerConfig::standard();
        a.policy = policy;
        a.clients = (1..=3)
            .map(|n| ClientNet {
                net: format!("10.{n}.0.0/16").parse().unwrap(),
                cluster: ClusterId::parse(&format!("c{n}")).unwrap(),
                zone: Some(format!("z{n}")),
            })
            .collect();
        a
    }

    /// A headless service with `per` endpoints in each of clusters c1..c3
    /// (addresses 10.<c>.1.<e>, zone z<c>), dual-stack for c1 (pods paired
    /// by targetRef).
    fn service(answers: AnswerConfig, per: usize, overrides: AnswerOverrides) -> (Reader, Writer) {
        let (reader, mut w) =
            store::new(ZoneConfig::with_defaults(Name::from_ascii("clusterset.local.").unwrap(), answers));
        let mut objects = vec![Object::Import(ServiceImport {
            key: key(),
            kind: ImportType::Headless,
            ips: Default::default(),
            ports: Default::default(),
            answers: overrides.into(),
        })];
        for c in 1..=3 {
            let families: &[AddressFamily] =
                if c == 1 { &[AddressFamily::V4, AddressFamily::V6] } else { &[AddressFamily::V4] };
            for &family in families {
                let endpoints = (1..=per)
                    .map(|e| {
                        let ip: std::net::IpAddr = match family {
                            AddressFamily::V4 => format!("10.{c}.1.{e}").parse().unwrap(),
                            AddressFamily::V6 => format!("fd00:{c}::{e}").parse().unwrap(),
                        };
                        Endpoint::new(vec![ip].into(), true).with_names(
                            None,
                            Some(&format!("z{c}")),
                            Some(&format!("Pod/ns/p{c}-{e}")),
                        )
                    })
                    .collect();
                objects.push(Object::Slice(EndpointSet {
                    slice: SliceKey { namespace: "ns".into(), name: format!("hl-c{c}-{family:?}") },
                    service: key(),
                    cluster: ClusterId::parse(&format!("c{c}")).unwrap(),
                    family,
                    ports: vec![],
                    endpoints,
                    origin: crate::model::SliceOrigin::Mcs,
                    trigger: Default::default(),
                }));
            }
        }
        w.apply(Update::Replace { source: SourceId::Watch(1), objects });
        w.publish();
        (reader, w)
    }

    /// The addresses one query answers, in order.
    fn ask(reader: &Reader, qtype: u16, from: Option<&str>) -> Vec<IpAddr> {
        let snap = reader.load();
        let client = match from {
            Some(ip) => snap.zone().localities.client_at(ip.parse().unwrap()),
            None => Client::default(),
        };
        let mut picks = Picks::default();
        let a = lookup_for(&snap, &Question { name: NAME, qtype, qclass: 1 }, &client, &mut picks);
        let Some(records) = a.answer else { return vec![] };
        let indices: Vec<usize> = match a.pick {
            Pick::All => (0..records.len()).collect(),
            Pick::Rotate(f) => (0..records.len()).map(|j| (f as usize + j) % records.len()).collect(),
            Pick::Listed => picks.as_slice().iter().map(|&i| i as usize).collect(),
        };
        indices
            .into_iter()
            .map(|i| {
                let r = records.get(i);
                let data = &r[12..];
                match data.len() {
                    4 => IpAddr::from(<[u8; 4]>::try_from(data).unwrap()),
                    _ => IpAddr::from(<[u8; 16]>::try_from(data).unwrap()),
                }
            })
            .collect()
    }

    fn cluster_of(ip: &IpAddr) -> u8 {
        match ip {
            IpAddr::V4(a) => a.octets()[1],
            IpAddr::V6(a) => a.octets()[3],
        }
    }

    fn down(w: &mut Writer, ip: &str) {
        w.apply(Update::EndpointHealth { service: key(), address: ip.parse().unwrap(), healthy: false });
        w.publish();
    }

    #[test]
    fn rotation_answers_every_endpoint_and_spreads_the_first_evenly() {
        let (reader, _w) = service(answers(PolicyKind::Rotation), 4, AnswerOverrides::default());
        let mut first: BTreeMap<IpAddr, u32> = BTreeMap::new();
        for _ in 0..1200 {
            let got = ask(&reader, 1, None);
            assert_eq!(got.len(), 12, "every ready endpoint, only the order changes");
            *first.entry(got[0]).or_default() += 1;
        }
        assert_eq!(first.len(), 12);
        assert!(first.values().all(|&n| (95..=105).contains(&n)), "{first:?}");
    }

    #[test]
    fn max_answers_cuts_each_answer_and_rotation_still_covers_everyone() {
        let mut a = answers(PolicyKind::Rotation);
        a.max_answers = 2;
        let (reader, _w) = service(a, 4, AnswerOverrides::default());
        let mut seen: BTreeMap<IpAddr, u32> = BTreeMap::new();
        for _ in 0..1200 {
            let got = ask(&reader, 1, None);
            assert_eq!(got.len(), 2);
            for ip in got {
                *seen.entry(ip).or_default() += 1;
            }
        }
        assert_eq!(seen.len(), 12);
        assert!(seen.values().all(|&n| (190..=210).contains(&n)), "{seen:?}");
    }

    #[test]
    fn random_answers_every_endpoint_in_varying_orders() {
        let (reader, _w) = service(answers(PolicyKind::Random), 4, AnswerOverrides::default());
        let mut orders = std::collections::BTreeSet::new();
        let mut first: BTreeMap<IpAddr, u32> = BTreeMap::new();
        for _ in 0..2400 {
            let got = ask(&reader, 1, None);
            let mut sorted = got.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), 12);
            *first.entry(got[0]).or_default() += 1;
            orders.insert(got);
        }
        assert!(orders.len() > 50, "only {} orders", orders.len());
        assert!(first.values().all(|&n| (120..=280).contains(&n)), "{first:?}");
    }

    #[test]
    fn local_first_never_leaves_the_client_cluster_while_enough_are_healthy() {
        let (reader, mut w) = service(answers(PolicyKind::LocalFirst), 3, AnswerOverrides::default());
        for _ in 0..300 {
            let got = ask(&reader, 1, Some("10.2.7.7"));
            assert_eq!(got.len(), 3);
            assert!(got.iter().all(|ip| cluster_of(ip) == 2), "{got:?}");
        }
        // Unknown clients get everyone.
        assert_eq!(ask(&reader, 1, Some("192.0.2.1")).len(), 9);
        // Two of c2's three down: one still healthy (K = 1) keeps it local.
        down(&mut w, "10.2.1.1");
        down(&mut w, "10.2.1.2");
        for _ in 0..50 {
            assert_eq!(ask(&reader, 1, Some("10.2.7.7")), vec!["10.2.1.3".parse::<IpAddr>().unwrap()]);
        }
        // All down: spill over to the other clusters, never the dead ones.
        down(&mut w, "10.2.1.3");
        for _ in 0..50 {
            let got = ask(&reader, 1, Some("10.2.7.7"));
            assert_eq!(got.len(), 6);
            assert!(got.iter().all(|ip| cluster_of(ip) != 2), "{got:?}");
        }
    }

    #[test]
    fn local_first_spills_over_below_the_minimum_and_keeps_local_first() {
        let o = AnswerOverrides { local_min_healthy: Some(3), ..Default::default() };
        let (reader, mut w) = service(answers(PolicyKind::LocalFirst), 3, o);
        assert!(ask(&reader, 1, Some("10.3.0.1")).iter().all(|ip| cluster_of(ip) == 3));
        down(&mut w, "10.3.1.1");
        for _ in 0..50 {
            let got = ask(&reader, 1, Some("10.3.0.1"));
            assert_eq!(got.len(), 8);
            assert!(got[..2].iter().all(|ip| cluster_of(ip) == 3), "local ones first: {got:?}");
        }
    }

    #[test]
    fn weights_decide_which_cluster_comes_first() {
        let o = AnswerOverrides {
            policy: Some(PolicyKind::Weighted),
            weights: Some(crate::model::parse_weights("c1=6,c2=3,c3=1").unwrap()),
            ..Default::default()
        };
        let (reader, _w) = service(answers(PolicyKind::Rotation), 2, o);
        let mut first = [0u32; 4];
        for _ in 0..5000 {
            let got = ask(&reader, 1, None);
            assert_eq!(got.len(), 6, "weighted orders, it does not drop");
            first[usize::from(cluster_of(&got[0]))] += 1;
        }
        let share = |c: usize| f64::from(first[c]) / 5000.0;
        assert!(
            (share(1) - 0.6).abs() < 0.04 && (share(2) - 0.3).abs() < 0.04 && (share(3) - 0.1).abs() < 0.03,
            "{first:?}"
        );
    }

    #[test]
    fn weights_default_to_ready_endpoints() {
        let mut a = answers(PolicyKind::Weighted);
        a.max_answers = 1;
        let (reader, mut w) = service(a, 2, AnswerOverrides::default());
        down(&mut w, "10.3.1.1");
        down(&mut w, "10.3.1.2");
        let mut first = [0u32; 4];
        for _ in 0..3000 {
            first[usize::from(cluster_of(&ask(&reader, 1, None)[0]))] += 1;
        }
        assert_eq!(first[3], 0, "no healthy endpoint, no weight");
        assert!((1300..1700).contains(&first[1]), "{first:?}");
    }

    #[test]
    fn topology_prefers_zone_then_region_then_anything() {
        let mut a = answers(PolicyKind::Topology);
        a.regions = vec![
            (ClusterId::parse("c1").unwrap(), "eu".into()),
            (ClusterId::parse("c2").unwrap(), "eu".into()),
            (ClusterId::parse("c3").unwrap(), "us".into()),
        ];
        let (reader, mut w) = service(a, 2, AnswerOverrides::default());
        assert!(ask(&reader, 1, Some("10.1.0.1")).iter().all(|ip| cluster_of(ip) == 1));
        down(&mut w, "10.1.1.1");
        down(&mut w, "10.1.1.2");
        // c1's zone is down (its IPv6 addresses too: the pods are down).
        let got = ask(&reader, 1, Some("10.1.0.1"));
        assert!(got.iter().all(|ip| cluster_of(ip) == 2), "same region next: {got:?}");
        down(&mut w, "10.2.1.1");
        down(&mut w, "10.2.1.2");
        assert!(ask(&reader, 1, Some("10.1.0.1")).iter().all(|ip| cluster_of(ip) == 3));
    }

    /// Regions eu (c1, c2) and us (c3); clients of c4 (10.4.0.0/16, zone
    /// z4, no endpoints) are in eu too, and those of c5 (10.5.0.0/16, no
    /// zone) in no region.
    fn bounded(policy: PolicyKind, boundary: Option<crate::model::Boundary>) -> AnswerConfig {
        let mut a = answers(policy);
        for (n, zone) in [(4, Some("z4".to_owned())), (5, None)] {
            a.clients.push(ClientNet {
                net: format!("10.{n}.0.0/16").parse().unwrap(),
                cluster: ClusterId::parse(&format!("c{n}")).unwrap(),
                zone,
            });
        }
        a.regions = [("c1", "eu"), ("c2", "eu"), ("c3", "us"), ("c4", "eu")]
            .iter()
            .map(|(c, r)| (ClusterId::parse(c).unwrap(), (*r).to_owned()))
            .collect();
        if let Some(b) = boundary {
            a.fallback_boundary = b;
        }
        a
    }

    fn clusters_of(got: &[IpAddr]) -> std::collections::BTreeSet<u8> {
        got.iter().map(cluster_of).collect()
    }

    #[test]
    fn a_region_boundary_fails_open_inside_and_never_answers_outside() {
        use crate::model::Boundary;
        let (reader, mut w) =
            service(bounded(PolicyKind::Topology, Some(Boundary::Region)), 2, Default::default());
        assert_eq!(clusters_of(&ask(&reader, 1, Some("10.1.0.1"))), [1].into());
        for ip in ["10.1.1.1", "10.1.1.2"] {
            down(&mut w, ip);
        }
        assert_eq!(clusters_of(&ask(&reader, 1, Some("10.1.0.1"))), [2].into(), "same region next");
        for ip in ["10.2.1.1", "10.2.1.2"] {
            down(&mut w, ip);
        }
        // Every endpoint of eu is down, us's are healthy: eu's are answered,
        // the ladder still first (the client's zone is c1's).
        for _ in 0..20 {
            let got = ask(&reader, 1, Some("10.1.0.1"));
            assert_eq!(got.len(), 2, "{got:?}");
            assert_eq!(clusters_of(&got), [1].into(), "failed open inside eu: {got:?}");
        }
        // A client of us is answered us's, eu's never.
        assert_eq!(clusters_of(&ask(&reader, 1, Some("10.3.0.1"))), [3].into());
        // The same service without the boundary leaves eu (the ladder's last tier).
        let (reader, mut w) = service(bounded(PolicyKind::Topology, None), 2, Default::default());
        for ip in ["10.1.1.1", "10.1.1.2", "10.2.1.1", "10.2.1.2"] {
            down(&mut w, ip);
        }
        assert_eq!(clusters_of(&ask(&reader, 1, Some("10.1.0.1"))), [3].into());
    }

    #[test]
    fn a_cluster_boundary_keeps_local_first_in_the_clients_cluster_when_it_is_down() {
        use crate::model::Boundary;
        let o = AnswerOverrides { boundary: Some(Boundary::Cluster), ..Default::default() };
        // The annotation wins over the flag (none here).
        let (reader, mut w) = service(bounded(PolicyKind::LocalFirst, None), 2, o);
        for ip in ["10.2.1.1", "10.2.1.2"] {
            down(&mut w, ip);
        }
        for _ in 0..20 {
            assert_eq!(clusters_of(&ask(&reader, 1, Some("10.2.0.1"))), [2].into());
        }
        // Fail-open off: nothing unhealthy is answered, and nothing outside either.
        let mut a = bounded(PolicyKind::LocalFirst, Some(Boundary::Cluster));
        a.fail_open = false;
        let (reader, mut w) = service(a, 2, Default::default());
        for ip in ["10.2.1.1", "10.2.1.2"] {
            down(&mut w, ip);
        }
        assert!(ask(&reader, 1, Some("10.2.0.1")).is_empty());
        assert_eq!(clusters_of(&ask(&reader, 1, Some("10.1.0.1"))), [1].into());
    }

    #[test]
    fn no_ready_endpoint_inside_the_boundary_is_nodata() {
        use crate::model::Boundary;
        for boundary in [Boundary::Zone, Boundary::Cluster] {
            let (reader, _w) = service(bounded(PolicyKind::Topology, Some(boundary)), 2, Default::default());
            // c4 has no endpoint; its zone z4 none either.
            assert!(ask(&reader, 1, Some("10.4.0.1")).is_empty(), "{boundary}");
            let snap = reader.load();
            let client = snap.zone().localities.client_at("10.4.0.1".parse().unwrap());
            let mut picks = Picks::default();
            let a = lookup_for(&snap, &Question { name: NAME, qtype: 1, qclass: 1 }, &client, &mut picks);
            assert_eq!(a.rcode, crate::answer::Rcode::NoError);
            assert!(a.answer.is_none() && a.soa_owner.is_some(), "NODATA with the SOA: {a:?}");
        }
        // c4 is in eu: the region boundary reaches c1 and c2.
        let (reader, _w) =
            service(bounded(PolicyKind::Topology, Some(Boundary::Region)), 2, Default::default());
        assert_eq!(clusters_of(&ask(&reader, 1, Some("10.4.0.1"))), [1, 2].into());
    }

    #[test]
    fn what_is_not_known_is_outside_the_boundary() {
        use crate::model::Boundary;
        let answer = |boundary: Boundary, from: &str| {
            let (reader, _w) = service(bounded(PolicyKind::Topology, Some(boundary)), 2, Default::default());
            clusters_of(&ask(&reader, 1, Some(from)))
        };
        for boundary in [Boundary::Zone, Boundary::Cluster, Boundary::Region] {
            // An unknown client: no cluster, no zone, no region.
            assert_eq!(answer(boundary, "192.0.2.1"), [].into(), "{boundary}");
        }
        // c5's clients have no zone: nothing is in their zone. Their cluster
        // has no region: the region boundary is their cluster (no endpoint).
        assert_eq!(answer(Boundary::Zone, "10.5.0.1"), [].into());
        assert_eq!(answer(Boundary::Region, "10.5.0.1"), [].into());
        assert_eq!(answer(Boundary::Zone, "10.1.0.1"), [1].into());
    }

    #[test]
    fn policies_that_ignore_the_client_ignore_the_boundary() {
        use crate::model::Boundary;
        let (reader, _w) =
            service(bounded(PolicyKind::Rotation, Some(Boundary::Cluster)), 2, Default::default());
        assert_eq!(ask(&reader, 1, Some("10.4.0.1")).len(), 6);
        assert_eq!(ask(&reader, 1, None).len(), 6);
    }

    #[test]
    fn a_and_aaaa_of_the_same_sequence_number_come_from_the_same_endpoints() {
        let mut a = answers(PolicyKind::Random);
        a.max_answers = 2;
        let (reader, _w) = service(a, 4, AnswerOverrides::default());
        for _ in 0..100 {
            let v4 = ask(&reader, 1, Some("10.1.0.9"));
            let v6 = ask(&reader, 28, Some("10.1.0.9"));
            assert_eq!(v6.len(), 2);
            // Only c1 is dual-stack: the AAAA answer's pods are among the A answer's when the A
            // answer is in c1, and the pods pair by targetRef (p1-<e> has 10.1.1.<e> and fd00:1::<e>).
            for ip6 in &v6 {
                let IpAddr::V6(a6) = ip6 else { panic!() };
                let e = a6.octets()[15];
                let twin: IpAddr = format!("10.1.1.{e}").parse().unwrap();
                if v4.iter().all(|ip| cluster_of(ip) == 1) {
                    assert!(v4.contains(&twin), "A {v4:?} AAAA {v6:?}");
                }
            }
        }
    }

    #[test]
    fn fail_open_answers_everyone_when_all_are_down_and_fail_closed_nobody() {
        for fail_open in [true, false] {
            let mut a = answers(PolicyKind::Rotation);
            a.fail_open = fail_open;
            let (reader, mut w) = service(a, 1, AnswerOverrides::default());
            for c in 1..=3 {
                w.apply(Update::ClusterLiveness {
                    cluster: ClusterId::parse(&format!("c{c}")).unwrap(),
                    alive: false,
                });
            }
            w.publish();
            assert_eq!(ask(&reader, 1, None).len(), if fail_open { 3 } else { 0 });
            w.apply(Update::ClusterLiveness { cluster: ClusterId::parse("c2").unwrap(), alive: true });
            w.publish();
            assert_eq!(ask(&reader, 1, None), vec!["10.2.1.1".parse::<IpAddr>().unwrap()]);
        }
    }

    #[test]
    fn unreachable_clusters_of_an_import_are_demoted_for_that_service_without_re_encoding() {
        let (reader, mut w) = service(answers(PolicyKind::Rotation), 2, AnswerOverrides::default());
        let wire = crate::store::names_key("ns", "hl");
        let before = reader.load_full();
        let import = |unreachable: &[&str]| {
            Object::Import(ServiceImport {
                key: key(),
                kind: ImportType::Headless,
                ips: Default::default(),
                ports: Default::default(),
                answers: AnswerOverrides {
                    unreachable: unreachable.iter().map(|c| ClusterId::parse(c).unwrap()).collect(),
                    ..Default::default()
                }
                .into(),
            })
        };
        w.apply(Update::Upsert { source: SourceId::Watch(1), object: import(&["c2", "c3"]) });
        assert_eq!(w.publish(), 0, "nothing re-encoded");
        let after = reader.load_full();
        let (b, a) = (before.service(&wire).unwrap(), after.service(&wire).unwrap());
        assert!(b.names.shares(&a.names), "records shared");
        for _ in 0..20 {
            let got = ask(&reader, 1, None);
            assert_eq!(got.len(), 2, "{got:?}");
            assert!(got.iter().all(|ip| cluster_of(ip) == 1), "{got:?}");
        }
        // Every cluster unreachable: fail-open answers them all.
        w.apply(Update::Upsert { source: SourceId::Watch(1), object: import(&["c1", "c2", "c3"]) });
        w.publish();
        assert_eq!(ask(&reader, 1, None).len(), 6);
        // The annotation removed: everyone is back.
        w.apply(Update::Upsert { source: SourceId::Watch(1), object: import(&[]) });
        w.publish();
        let got = ask(&reader, 1, None);
        assert_eq!(got.len(), 6);
        assert!((1..=3).all(|c| got.iter().any(|ip| cluster_of(ip) == c)), "{got:?}");
    }

    #[test]
    fn health_updates_share_the_encoded_records() {
        let (reader, mut w) = service(answers(PolicyKind::Rotation), 2, AnswerOverrides::default());
        let wire = crate::store::names_key("ns", "hl");
        let before = reader.load_full();
        down(&mut w, "10.1.1.1");
        let after = reader.load_full();
        let (b, a) = (before.service(&wire).unwrap(), after.service(&wire).unwrap());
        assert!(b.names.shares(&a.names), "records are not re-encoded");
        assert_eq!(a.balance().unwrap().healthy_count[0], 5);
        assert!(!ask(&reader, 1, None).contains(&"10.1.1.1".parse().unwrap()));
        // Marking it up again restores it.
        w.apply(Update::EndpointHealth {
            service: key(),
            address: "10.1.1.1".parse().unwrap(),
            healthy: true,
        });
        w.publish();
        assert_eq!(ask(&reader, 1, None).len(), 6);
    }
}
