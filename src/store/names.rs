//! Which names exist and what they answer: the MCS DNS specification's
//! records (`docs/answers.md` is the contract), built from
//! model values and encoded once per change.

use std::borrow::Cow;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::Arc;

use hickory_proto::rr::rdata::{A, AAAA, HINFO, NS, SOA, SRV, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use rustc_hash::FxHashMap;
use tracing::warn;

use super::answer_config::AnswerConfig;
use super::balance::{Balance, BalanceCluster, EndpointMeta, set_weights};
use super::encode;
use super::hosts::Hosts;
use super::intern::Interner;
use super::records::{NameNode, RRset, Records};
use super::slice::Slice;
use super::snapshot::{NameTable, ServiceNames, Zone, ZoneNames};
use crate::model::{ClusterId, DnsLabel, ImportType, PolicyKind, Port, ServiceImport};

/// What building a service needs besides its objects: the writer's
/// interned localities and its health overlay.
pub(crate) struct BuildCtx<'a> {
    /// Cluster and zone ids.
    pub(crate) interner: &'a Interner,
    /// False when an endpoint (its cluster and addresses) is marked down.
    pub(crate) healthy: &'a dyn Fn(&ClusterId, &[IpAddr]) -> bool,
}

/// One endpoint of the service name's answer while it is assembled: the
/// IPv4 and IPv6 slices' entries for the same Pod merged.
struct Candidate {
    cluster: ClusterId,
    zone: Option<String>,
    name: String,
    /// Named by its `targetRef` or hostname, not by its address.
    named: bool,
    addrs: [Vec<IpAddr>; 2],
}

/// MCS DNS schema version answered at `dns-version.<zone>` (spec §2.2).
pub(crate) const SCHEMA_VERSION: &str = "1.0.0";
/// TTL of the `dns-version` TXT record, as the specification's example.
const SCHEMA_VERSION_TTL: u32 = 28800;
/// SOA timers: refresh, retry, expire (the serial and minimum vary).
const SOA_TIMERS: (i32, i32, i32) = (7200, 1800, 86400);

/// A name of a service while it is assembled: its labels in front of the
/// service name as [`prefix_key`] writes them (lower case), shared between
/// the drafts, the SRV targets and the targets' addresses. Names are
/// compared and hashed by these bytes rather than as hickory `Name`s, whose
/// hashing lower-cases label by label (a tenth of the start-up CPU when it
/// was used here).
type Key = Rc<[u8]>;

/// The data of one name while it is being assembled.
#[derive(Default)]
struct Draft {
    a: Vec<IpAddr>,
    /// (port, target).
    srv: Vec<(u16, Key)>,
}

/// The names of a service being assembled, keyed by prefix wire bytes.
struct Drafts {
    base: Name,
    /// Unordered: a headless service's endpoints look their names up here
    /// several times each. [`Drafts::in_order`] gives the order where it
    /// matters.
    nodes: FxHashMap<Key, (Name, Draft)>,
    /// Addresses of SRV targets, for the additional section.
    targets: FxHashMap<Key, Vec<IpAddr>>,
    /// Where `node` writes the key it looks up, so a lookup allocates
    /// nothing.
    scratch: Vec<u8>,
}

impl Drafts {
    /// The draft for `labels` in front of the service name, with its key,
    /// created (with every empty non-terminal between it and the service)
    /// when missing; `None` when the name would be too long.
    fn node(&mut self, labels: &[&str]) -> Option<(Key, &mut Draft)> {
        let mut key = std::mem::take(&mut self.scratch);
        key.clear();
        write_prefix_key(labels, &mut key);
        let found = match self.nodes.get_key_value(&key[..]) {
            Some((known, _)) => Some(known.clone()),
            None => self.create(labels, &key),
        };
        self.scratch = key;
        let key = found?;
        let draft = &mut self.nodes.get_mut(&key[..])?.1;
        Some((key, draft))
    }

    /// Creates the name `labels` (whose key is `key`) and every missing
    /// ancestor; its key, or `None` when the name would be too long.
    fn create(&mut self, labels: &[&str], key: &[u8]) -> Option<Key> {
        // Checked first: when the name fits, so does each ancestor.
        let name = child(labels, &self.base)?;
        // An ancestor's key is a suffix of the key. Ancestors are always
        // created with their descendants, so the nearest one that exists
        // ends the walk.
        let mut at = 0;
        for skip in 1..labels.len() {
            at += usize::from(key[at]) + 1;
            if self.nodes.contains_key(&key[at..]) {
                break;
            }
            let ent = child(&labels[skip..], &self.base)?;
            self.nodes.insert(key[at..].into(), (ent, Draft::default()));
        }
        let key: Key = key.into();
        self.nodes.insert(key.clone(), (name, Draft::default()));
        Some(key)
    }

    /// Every name, the service name first: a `_<port>._<proto>` name shares
    /// the service name's SRV records (`SrvAnswers`), so those must be
    /// encoded before it.
    fn in_order(&self) -> impl Iterator<Item = (&Key, &(Name, Draft))> {
        let service = self.nodes.get_key_value(&[][..]);
        service.into_iter().chain(self.nodes.iter().filter(|(key, _)| !key.is_empty()))
    }
}

/// An endpoint name: addresses and nothing else (not the service name).
fn is_host(key: &Key, draft: &Draft) -> bool {
    !key.is_empty() && draft.srv.is_empty() && !draft.a.is_empty()
}

/// An SRV RRset whose targets are all endpoint names (a headless
/// service's): written per query from `Hosts::srv`, not encoded.
fn srv_from_hosts(d: &Drafts, draft: &Draft) -> bool {
    !draft.srv.is_empty()
        && draft.srv.iter().all(|(_, target)| d.nodes.get(target).is_some_and(|(_, t)| is_host(target, t)))
}

/// Builds every name of one service. `None` means the service has no names at
/// all: a headless service without a ready endpoint is NXDOMAIN (spec §2.4.1).
pub(crate) fn service_names(
    zone: &Zone,
    import: &ServiceImport,
    slices: &[&Slice],
    cx: &BuildCtx<'_>,
) -> Option<ServiceNames> {
    let base = child(&[import.key.name.as_str(), import.key.namespace.as_str(), "svc"], &zone.config.origin)?;
    let mut d = Drafts {
        base: base.clone(),
        nodes: FxHashMap::default(),
        targets: FxHashMap::default(),
        scratch: Vec::new(),
    };
    let (base_key, _) = d.node(&[])?;
    let candidates = match import.kind {
        ImportType::ClusterSetIp => clusterset_ip(&mut d, import, slices, &zone.config.answers, &base_key)?,
        ImportType::Headless => {
            if !headless(&mut d, import, slices) {
                return None;
            }
            collect_candidates(slices)
        }
    };
    let ttl = zone.config.ttl;
    let mut srv_answers = SrvAnswers::default();
    let name_of = |key: &[u8]| d.nodes.get(key).map(|(name, _)| name.clone());
    let targets = Targets { addrs: &d.targets, name_of: &name_of };
    // An endpoint name has addresses and nothing else: it is answered from
    // `hosts` at query time instead of being encoded here (see `hosts`), and
    // so is an SRV RRset whose targets are all endpoint names.
    let mut names: FxHashMap<Box<[u8]>, NameNode> = d
        .in_order()
        .filter(|(key, (_, draft))| !is_host(key, draft))
        .filter_map(|(key, (owner, draft))| {
            let shared = (key.is_empty(), &mut srv_answers);
            let node = encode_node(owner, draft, ttl, targets, shared, srv_from_hosts(&d, draft));
            if node.is_none() {
                warn!(service = %import.key, name = %owner, "cannot encode name; leaving it out");
            }
            Some((Box::from(&key[..]), node?))
        })
        .collect();
    if let Some(also) = &zone.config.also {
        also_srv(&zone.config.origin, also, ttl, &d, &mut names);
    }
    let mut balance = None;
    if !candidates.is_empty() {
        let (sets, b) = balanced(zone, import, &base, &candidates, probe_port(import, slices), cx)?;
        if let Some(node) = names.get_mut(&[][..]) {
            let mut all = node.sets.to_vec();
            all.extend(sets);
            node.sets = all.into();
        }
        balance = Some(Arc::new(b));
    }
    let hosts = service_hosts(zone, import, &d);
    share_additional(&mut names);
    let names = NameTable::new(names.into_iter().collect());
    Some(ServiceNames { names, balance, hosts: Arc::new(hosts) })
}

/// The names of a ClusterSetIP service: its name answers its VIPs (or,
/// opted in, its ready endpoints) and SRV per port. Returns the endpoints
/// answered (none: the VIPs are).
fn clusterset_ip(
    d: &mut Drafts,
    import: &ServiceImport,
    slices: &[&Slice],
    cfg: &AnswerConfig,
    base_key: &Key,
) -> Option<Vec<Candidate>> {
    // Opt-in (annotation or flag): the endpoints instead of the VIP, for
    // fleets without a cross-cluster VIP data path. Without a ready
    // endpoint the VIP is still answered.
    let mut candidates = Vec::new();
    if import.answers.endpoint_answers.unwrap_or(cfg.endpoint_answers) {
        candidates = collect_candidates(slices);
    }
    let answered: Vec<IpAddr> = if candidates.is_empty() {
        import.ips.to_vec()
    } else {
        candidates.iter().flat_map(|c| c.addrs.iter().flatten().copied()).collect()
    };
    d.targets.insert(base_key.clone(), answered);
    let (_, service) = d.node(&[])?;
    if candidates.is_empty() {
        service.a.extend(import.ips.iter());
    }
    for port in import.ports.iter() {
        // The bare name answers every port; `_<port>._<proto>` only named ones.
        service_srv(d, &port_labels(port), base_key)?;
    }
    Some(candidates)
}

/// The port active probes connect to: the import's `probe_port`, else the
/// first TCP port the endpoints listen on (the slices' target ports, not
/// the service's), else the service's first TCP port.
fn probe_port(import: &ServiceImport, slices: &[&Slice]) -> Option<u16> {
    let tcp = |p: &&Port| p.protocol == crate::model::Protocol::Tcp;
    import.answers.probe_port.or_else(|| {
        slices
            .iter()
            .flat_map(|s| s.ports.iter())
            .find(tcp)
            .or_else(|| import.ports.iter().find(tcp))
            .map(|p| p.port)
    })
}

/// What a service answers per query rather than from encoded records: its
/// endpoint names and their SRV sets, and its reverse names.
fn service_hosts(zone: &Zone, import: &ServiceImport, d: &Drafts) -> Hosts {
    // Reverse names: a ClusterSetIP service's VIPs name the service (never
    // its endpoints, which are answered under no name of their own); a
    // headless endpoint's addresses name the endpoint.
    let vips = match import.kind {
        ImportType::ClusterSetIp => &import.ips[..],
        ImportType::Headless => &[],
    };
    let service_key = prefix_key(&[import.key.name.as_str(), import.key.namespace.as_str()]);
    let mut hosts: Vec<(&[u8], &[IpAddr])> = d
        .nodes
        .iter()
        .filter(|(key, (_, draft))| is_host(key, draft))
        .map(|(key, (_, draft))| (&key[..], &draft.a[..]))
        .collect();
    hosts.sort_unstable_by_key(|&(key, _)| key); // `Hosts` searches them by key
    let srv_sets =
        d.nodes.iter().filter(|(_, (_, draft))| srv_from_hosts(d, draft)).map(|(key, (_, draft))| {
            let mut srv: Vec<(u16, &[u8])> =
                draft.srv.iter().map(|(port, target)| (*port, &target[..])).collect();
            dedup_in_order(&mut srv);
            (&key[..], srv)
        });
    // A consumer cluster no client network names can have no client here.
    let consumers =
        import.answers.consumers.as_ref().map(|list| {
            list.iter().filter_map(|c| zone.localities.cluster_id(c.as_str())).collect::<Vec<u16>>()
        });
    Hosts::new(&service_key, vips, hosts).with_srv(srv_sets).with_consumers(consumers)
}

/// Makes each additional section that is the same records (same bytes,
/// same boundaries) as an answer of the service, or as an additional
/// section already seen, share that one allocation. A ClusterSetIP
/// service's SRV target is the service name itself, so its SRV additional
/// records are the service name's A answer byte for byte (the owner is
/// the question, `C0 0C`, in both): a second block of ~40 B in nine
/// services of ten.
fn share_additional(names: &mut FxHashMap<Box<[u8]>, NameNode>) {
    let mut kept: Vec<Records> = names
        .values()
        .flat_map(|node| node.sets.iter())
        .flat_map(|set| [Some(&set.answer), set.also.as_deref().map(|(answer, _)| answer)])
        .flatten()
        .filter(|r| !r.is_empty())
        .cloned()
        .collect();
    for set in names.values_mut().flat_map(|node| node.sets.iter_mut()) {
        let RRset { additional, also, .. } = set;
        let also = also.as_deref_mut().map(|(_, additional)| additional);
        for additional in std::iter::once(additional).chain(also).filter(|r| !r.is_empty()) {
            match kept.iter().find(|k| *k == additional) {
                Some(same) => *additional = same.clone(),
                None => kept.push(additional.clone()),
            }
        }
    }
}

/// The ready endpoints with an address, merged across a cluster's IPv4 and
/// IPv6 slices by identity (`targetRef`, else hostname; an endpoint with
/// neither is one per address), grouped by cluster.
fn collect_candidates(slices: &[&Slice]) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = Vec::new();
    let mut index: FxHashMap<(ClusterId, String), usize> = FxHashMap::default();
    for slice in slices {
        let fam = usize::from(slice.family == crate::model::AddressFamily::V6);
        for ep in slice.endpoints.iter().filter(|e| e.ready && !e.addresses.is_empty()) {
            let named = ep.target().is_some() || ep.hostname().is_some();
            let ids: Vec<(String, Vec<IpAddr>)> = match (ep.target(), ep.hostname()) {
                (Some(t), _) => vec![(t.to_string(), ep.addresses.to_vec())],
                (None, Some(h)) => vec![(h.to_string(), ep.addresses.to_vec())],
                (None, None) => ep.addresses.iter().map(|a| (a.to_string(), vec![*a])).collect(),
            };
            for (id, addrs) in ids {
                let i = *index.entry((slice.cluster.clone(), id.clone())).or_insert_with(|| {
                    out.push(Candidate {
                        cluster: slice.cluster.clone(),
                        zone: ep.zone().map(str::to_owned),
                        name: id,
                        named,
                        addrs: [Vec::new(), Vec::new()],
                    });
                    out.len() - 1
                });
                out[i].addrs[fam].extend(addrs);
            }
        }
    }
    // Grouped by cluster (stable: slice order within one), so a cluster's
    // endpoints are neighbours in the records.
    out.sort_by(|a, b| a.cluster.cmp(&b.cluster));
    out
}

/// The service name's A and AAAA RRsets, records in endpoint order, and
/// the [`Balance`] that says per query which of them to answer.
fn balanced(
    zone: &Zone,
    import: &ServiceImport,
    owner: &Name,
    candidates: &[Candidate],
    probe_port: Option<u16>,
    cx: &BuildCtx<'_>,
) -> Option<(Vec<RRset>, Balance)> {
    let cfg = &zone.config.answers;
    let o = &import.answers;
    let policy = o.policy.unwrap_or(if o.prefer_close { PolicyKind::Topology } else { cfg.policy });
    let (sets, ranges) = endpoint_address_sets(owner, candidates, zone.config.ttl)?;
    let mut clusters: Vec<BalanceCluster> = Vec::new();
    let mut endpoints = Vec::with_capacity(candidates.len());
    let mut healthy = Vec::with_capacity(candidates.len());
    for (c, range) in candidates.iter().zip(ranges) {
        if clusters.last().is_none_or(|l| l.name != c.cluster) {
            let id = cx.interner.cluster_id(&c.cluster);
            let region = zone.localities.region_of(id);
            let stat = zone.answer_stats.slot(&import.key, &c.cluster, id);
            clusters.push(BalanceCluster {
                id,
                name: c.cluster.clone(),
                region,
                weight: 0,
                stat,
                records: [(0, 0); 2],
            });
        }
        let addresses: Vec<IpAddr> = c.addrs.iter().flatten().copied().collect();
        healthy.push((cx.healthy)(&c.cluster, &addresses));
        endpoints.push(EndpointMeta {
            cluster: (clusters.len() - 1) as u16,
            zone: c.zone.as_deref().map(|z| cx.interner.zone_id(z)),
            records: range,
            name: c.named.then(|| c.name.as_str().into()),
        });
    }
    set_weights(&mut clusters, &endpoints, &healthy, o.weights.as_deref());
    let mut h = rustc_hash::FxHasher::default();
    import.key.hash(&mut h);
    let limits = (
        o.max_answers.unwrap_or(cfg.max_answers),
        o.local_min_healthy.unwrap_or(cfg.local_min_healthy),
        cfg.fail_open,
        o.boundary.unwrap_or(cfg.fallback_boundary),
    );
    let b = Balance::new(
        policy,
        limits,
        clusters.into(),
        endpoints.into(),
        healthy.into(),
        h.finish() as u32,
        (import.key.clone(), probe_port),
    );
    Some((sets, b))
}

/// Where an endpoint's records are in its service name's A and AAAA
/// RRsets: (first, count) per family ([`EndpointMeta::records`]).
type RecordRanges = [(u32, u16); 2];

/// The A and AAAA RRsets of `owner` answering `candidates`' addresses,
/// records in endpoint order, and where each candidate's records are in
/// them.
fn endpoint_address_sets(
    owner: &Name,
    candidates: &[Candidate],
    ttl: u32,
) -> Option<(Vec<RRset>, Vec<RecordRanges>)> {
    let mut sets = Vec::new();
    let mut ranges = vec![[(0u32, 0u16); 2]; candidates.len()];
    for (f, rtype) in [RecordType::A, RecordType::AAAA].into_iter().enumerate() {
        let mut seen: Vec<IpAddr> = Vec::new();
        let mut records = Vec::new();
        for (c, range) in candidates.iter().zip(ranges.iter_mut()) {
            let first = records.len() as u32;
            for ip in &c.addrs[f] {
                // The same address twice would be the same record twice.
                if !seen.contains(ip) {
                    seen.push(*ip);
                    records.push(address_record(owner, ttl, *ip));
                }
            }
            range[f] = (first, (records.len() as u32 - first) as u16);
        }
        if !records.is_empty() {
            sets.push(answer_only(rtype, encode::records(owner, rtype, &records)?));
        }
    }
    Some((sets, ranges))
}

/// Adds the SRV records one port gives: on the bare service name always, on
/// `_<port>._<proto>` when the port is named.
fn service_srv(d: &mut Drafts, (number, labels): &PortLabels, target: &Key) -> Option<()> {
    d.node(&[])?.1.srv.push((*number, target.clone()));
    if let Some([port, proto]) = labels {
        d.node(&[port, proto])?.1.srv.push((*number, target.clone()));
    }
    Some(())
}

/// A port's number and, when it is named, the labels of its SRV name
/// (`_<port>`, `_<proto>`): written once per port, not per endpoint.
type PortLabels = (u16, Option<[String; 2]>);

fn port_labels(port: &Port) -> PortLabels {
    let labels =
        port.name.as_ref().map(|name| [format!("_{name}"), format!("_{}", port.protocol.srv_label())]);
    (port.port, labels)
}

/// Adds a headless service's names; false when it has no ready endpoint.
fn headless(d: &mut Drafts, import: &ServiceImport, slices: &[&Slice]) -> bool {
    let mut any_ready = false;
    for slice in slices {
        let cluster: Vec<&str> = slice.cluster.labels().collect();
        let ports: Vec<PortLabels> = slice.ports.iter().map(port_labels).collect();
        for ep in slice.endpoints.iter().filter(|e| e.ready && !e.addresses.is_empty()) {
            any_ready = true;
            // An endpoint with a hostname is one name with all its addresses;
            // without, each address names itself (`10-3-0-10`).
            let named: Vec<(Cow<'_, str>, Vec<IpAddr>)> = match ep.hostname() {
                Some(h) => vec![(Cow::Borrowed(h), ep.addresses.to_vec())],
                None => {
                    let own = |a: &IpAddr| Cow::Owned(DnsLabel::from_address(*a).as_str().to_owned());
                    ep.addresses.iter().map(|a| (own(a), vec![*a])).collect()
                }
            };
            for (host, addrs) in named {
                let mut labels = vec![&*host];
                labels.extend(&cluster);
                let Some((target, node)) = d.node(&labels) else {
                    warn!(service = %import.key, slice = %slice.name, host = %host, "endpoint name too long; leaving it out");
                    continue;
                };
                // The service name's A/AAAA are built apart (`balanced`).
                node.a.extend(&addrs);
                d.targets.entry(target.clone()).or_default().extend(&addrs);
                for port in &ports {
                    // Absent only for names too long, already warned about.
                    let _ = service_srv(d, port, &target);
                }
            }
        }
    }
    any_ready
}

/// `name` of the zone `origin` moved to the zone `also` (the same labels in
/// front); `None` when it would be longer than a name can be.
fn rezone(name: &Name, origin: &Name, also: &Name) -> Option<Name> {
    let keep = usize::from(name.num_labels()).checked_sub(usize::from(origin.num_labels()))?;
    Name::from_labels(name.iter().take(keep)).ok()?.append_name(also).ok()
}

/// Encodes every SRV RRset of the service again for the zone `also`, with
/// owners, targets and the targets' addresses there, beside the original.
fn also_srv(origin: &Name, also: &Name, ttl: u32, d: &Drafts, names: &mut FxHashMap<Box<[u8]>, NameNode>) {
    let mut srv_answers = SrvAnswers::default();
    // The same targets (keys are relative to the service), named in `also`;
    // a target too long there leaves its RRset out.
    let name_of = |key: &[u8]| rezone(&d.nodes.get(key)?.0, origin, also);
    let targets = Targets { addrs: &d.targets, name_of: &name_of };
    for (key, (owner, draft)) in d.in_order() {
        if draft.srv.is_empty() {
            continue;
        }
        if srv_from_hosts(d, draft) {
            // Written per query in either zone; a target too long for the
            // second zone answers there as in the first (as below).
            if draft.srv.iter().any(|(_, target)| name_of(target).is_none()) {
                warn!(name = %owner, zone = %also, "SRV name too long for the second zone; left out there");
            }
            continue;
        }
        let encoded = rezone(owner, origin, also).and_then(|owner| {
            let draft = Draft { a: Vec::new(), srv: draft.srv.clone() };
            let node = encode_node(&owner, &draft, ttl, targets, (key.is_empty(), &mut srv_answers), false)?;
            let set = node.get(u16::from(RecordType::SRV))?;
            Some((set.answer.clone(), set.additional.clone(), set.shifted))
        });
        let set = names
            .get_mut(&key[..])
            .and_then(|node| node.sets.iter_mut().find(|s| s.rtype == u16::from(RecordType::SRV)));
        match (set, encoded) {
            // The same targets in either zone, so the same sharing; both
            // additional sections are moved alike (`RRset::shifted`).
            (Some(set), Some((answer, additional, shifted))) if shifted == set.shifted => {
                set.also = Some(Box::new((answer, additional)))
            }
            (Some(_), _) => {
                warn!(name = %owner, zone = %also, "SRV name too long for the second zone; left out there")
            }
            _ => {}
        }
    }
}

/// The SRV targets of a zone's names: their addresses, and their names in
/// that zone (the service's own, or the second zone's: `also_srv`).
#[derive(Clone, Copy)]
struct Targets<'a> {
    addrs: &'a FxHashMap<Key, Vec<IpAddr>>,
    name_of: &'a dyn Fn(&[u8]) -> Option<Name>,
}

/// The service name's SRV answer with the (port, target) list it was
/// encoded from. The owner of a pre-encoded record is a pointer to the
/// question and an SRV target is written in full (RFC 2782), so a
/// `_<port>._<proto>` name with the same list (a service with one named
/// port) answers the same bytes, kept once. Their additional sections
/// differ: the targets' owners are compressed against questions of
/// different lengths; but only in where their pointers into the question
/// point, so a `_<port>._<proto>` name with the service name's targets
/// keeps none of its own and the answer path moves those pointers
/// (`RRset::shifted`). The service name's distinct targets and additional
/// records are kept here for that.
#[derive(Default)]
struct SrvAnswers {
    answer: Option<(Vec<(u16, Key)>, Records)>,
    additional: Option<(Vec<Key>, Records)>,
}

fn encode_node(
    owner: &Name,
    draft: &Draft,
    ttl: u32,
    targets: Targets<'_>,
    (is_service, shared): (bool, &mut SrvAnswers),
    srv_from_hosts: bool,
) -> Option<NameNode> {
    let mut sets = Vec::new();
    let mut v4: Vec<IpAddr> = draft.a.iter().copied().filter(IpAddr::is_ipv4).collect();
    let mut v6: Vec<IpAddr> = draft.a.iter().copied().filter(IpAddr::is_ipv6).collect();
    dedup_in_order(&mut v4);
    dedup_in_order(&mut v6);
    for (rtype, addrs) in [(RecordType::A, &v4), (RecordType::AAAA, &v6)] {
        if !addrs.is_empty() {
            let records: Vec<Record> = addrs.iter().map(|ip| address_record(owner, ttl, *ip)).collect();
            sets.push(answer_only(rtype, encode::records(owner, rtype, &records)?));
        }
    }
    if srv_from_hosts {
        sets.push(RRset { from_hosts: true, ..answer_only(RecordType::SRV, Records::default()) });
    } else if !draft.srv.is_empty() {
        let mut srv = draft.srv.clone();
        dedup_in_order(&mut srv);
        let answer = srv_answer(owner, &srv, ttl, targets, (is_service, shared))?;
        let mut distinct: Vec<Key> = srv.iter().map(|(_, target)| target.clone()).collect();
        dedup_in_order(&mut distinct);
        let (additional, shifted) = srv_additional(owner, distinct, ttl, targets, (is_service, shared))?;
        sets.push(RRset { additional, shifted, ..answer_only(RecordType::SRV, answer) });
    }
    Some(NameNode { sets: sets.into() })
}

/// An RRset of answer records only, encoded once (no additional records,
/// none shared, none in the second zone).
fn answer_only(rtype: RecordType, answer: Records) -> RRset {
    RRset {
        rtype: u16::from(rtype),
        answer,
        additional: Records::default(),
        shifted: false,
        from_hosts: false,
        also: None,
    }
}

/// The SRV answer of `owner` for its distinct (port, target) pairs `srv`:
/// the service name's own when the list is the same, else encoded (and
/// kept, when `owner` is the service name).
fn srv_answer(
    owner: &Name,
    srv: &[(u16, Key)],
    ttl: u32,
    Targets { name_of, .. }: Targets<'_>,
    (is_service, shared): (bool, &mut SrvAnswers),
) -> Option<Records> {
    if let Some((known, answer)) = &shared.answer
        && *known == srv
    {
        return Some(answer.clone());
    }
    // Identical records must be identical, so the weight depends only on
    // how many distinct records the RRset has.
    let weight = (100 / srv.len()).max(1) as u16;
    let records = srv
        .iter()
        .map(|(port, target)| {
            let rdata = RData::SRV(SRV::new(0, weight, *port, name_of(target)?));
            Some(Record::from_rdata(owner.clone(), ttl, rdata))
        })
        .collect::<Option<Vec<Record>>>()?;
    let answer = encode::records(owner, RecordType::SRV, &records)?;
    if is_service {
        shared.answer = Some((srv.to_vec(), answer.clone()));
    }
    Some(answer)
}

/// The additional section of `owner`'s SRV answer, the addresses of its
/// `distinct` targets, and whether it is the service name's moved
/// (`RRset::shifted`); encoded (and kept, when `owner` is the service
/// name) when the targets differ from the service name's.
fn srv_additional(
    owner: &Name,
    distinct: Vec<Key>,
    ttl: u32,
    Targets { addrs: targets, name_of }: Targets<'_>,
    (is_service, shared): (bool, &mut SrvAnswers),
) -> Option<(Records, bool)> {
    if let Some((known, additional)) = &shared.additional
        && !is_service
        && *known == distinct
    {
        return Some((additional.clone(), true));
    }
    let mut extra = Vec::new();
    for target in &distinct {
        let mut addrs = targets.get(target).cloned().unwrap_or_default();
        dedup_in_order(&mut addrs);
        addrs.sort_by_key(IpAddr::is_ipv6); // A before AAAA, stable within a family
        let target = name_of(target)?;
        extra.extend(addrs.iter().map(|ip| address_record(&target, ttl, *ip)));
    }
    let additional = encode::records(owner, RecordType::SRV, &extra)?;
    if is_service {
        shared.additional = Some((distinct, additional.clone()));
    }
    Some((additional, false))
}

fn address_record(owner: &Name, ttl: u32, ip: IpAddr) -> Record {
    let rdata = match ip {
        IpAddr::V4(v4) => RData::A(A(v4)),
        IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
    };
    Record::from_rdata(owner.clone(), ttl, rdata)
}

/// Drops repeated values, keeping the first of each in place. Linear: a
/// headless service's RRsets hold one record per endpoint, and comparing
/// each with all before it (names compare label by label, case-blind) was
/// most of the start-up time at 10,000 headless services.
fn dedup_in_order<T: Hash + Eq>(v: &mut Vec<T>) {
    if v.len() < 2 {
        return;
    }
    let mut seen = rustc_hash::FxHashSet::default();
    let first: Vec<bool> = v.iter().map(|x| seen.insert(x)).collect();
    let mut keep = first.into_iter();
    v.retain(|_| keep.next().unwrap_or(true));
}

/// Lower-case wire bytes of `labels` (no root): the key of a name relative to
/// the service or the apex.
pub(crate) fn prefix_key(labels: &[&str]) -> Vec<u8> {
    let mut key = Vec::with_capacity(labels.iter().map(|l| l.len() + 1).sum());
    write_prefix_key(labels, &mut key);
    key
}

/// Appends [`prefix_key`] of `labels` to `key`.
fn write_prefix_key(labels: &[&str], key: &mut Vec<u8>) {
    for l in labels {
        key.push(l.len() as u8); // callers pass validated labels of at most 63 bytes
        key.extend(l.bytes().map(|b| b.to_ascii_lowercase()));
    }
}

/// `labels` in front of `base`; `None` when the result is not a valid name
/// (over 255 bytes).
fn child(labels: &[&str], base: &Name) -> Option<Name> {
    if labels.is_empty() {
        return Some(base.clone());
    }
    Name::from_labels(labels.iter().map(|l| l.as_bytes())).ok()?.append_name(base).ok()
}

/// Rebuilds the names outside services: the apex (SOA with the snapshot's
/// serial, NS), `dns-version`, the `svc` and `<ns>.svc` empty non-terminals,
/// and `ns.dns` when addresses are advertised.
pub(crate) fn zone_names<'a>(
    zone: &Zone,
    serial: u32,
    namespaces: impl Iterator<Item = &'a DnsLabel>,
) -> ZoneNames {
    let cfg = &zone.config;
    let origin = &cfg.origin;
    let ttl = cfg.ttl;
    let mut names: FxHashMap<Box<[u8]>, NameNode> = FxHashMap::default();
    let (Some(ns_host), Some(hostmaster)) = (child(&["ns", "dns"], origin), child(&["hostmaster"], origin))
    else {
        unreachable!("the zone origin was validated to leave room for ns.dns and hostmaster");
    };
    let soa = |ttl: u32| {
        let (refresh, retry, expire) = SOA_TIMERS;
        let rdata =
            SOA::new(ns_host.clone(), hostmaster.clone(), serial, refresh, retry, expire, cfg.negative_ttl);
        Record::from_rdata(origin.clone(), ttl, RData::SOA(rdata))
    };
    let glue: Vec<Record> = cfg.advertise.iter().map(|ip| address_record(&ns_host, ttl, *ip)).collect();
    let ns = Record::from_rdata(origin.clone(), ttl, RData::NS(NS(ns_host.clone())));
    let apex =
        vec![rrset(origin, RecordType::SOA, &[soa(ttl)], &[]), rrset(origin, RecordType::NS, &[ns], &glue)];
    names.insert(Box::default(), NameNode { sets: apex.into_iter().flatten().collect() });

    let version_name = child(&["dns-version"], origin);
    if let Some(version_name) = version_name {
        let txt = Record::from_rdata(
            version_name.clone(),
            SCHEMA_VERSION_TTL,
            RData::TXT(TXT::new(vec![SCHEMA_VERSION.into()])),
        );
        let sets = rrset(&version_name, RecordType::TXT, &[txt], &[]).into_iter().collect();
        names.insert(prefix_key(&["dns-version"]).into(), NameNode { sets });
    }
    let mut any_namespace = false;
    for ns in namespaces {
        any_namespace = true;
        names.insert(prefix_key(&[ns.as_str(), "svc"]).into(), NameNode::default());
    }
    if any_namespace {
        names.insert(prefix_key(&["svc"]).into(), NameNode::default());
    }
    if !glue.is_empty() {
        names.insert(prefix_key(&["dns"]).into(), NameNode::default());
        let v4: Vec<Record> = glue.iter().filter(|r| r.record_type() == RecordType::A).cloned().collect();
        let v6: Vec<Record> = glue.iter().filter(|r| r.record_type() == RecordType::AAAA).cloned().collect();
        let sets = [rrset(&ns_host, RecordType::A, &v4, &[]), rrset(&ns_host, RecordType::AAAA, &v6, &[])];
        names.insert(
            prefix_key(&["ns", "dns"]).into(),
            NameNode { sets: sets.into_iter().flatten().collect() },
        );
    }
    let negative_soa = encode::without_owner(&soa(cfg.negative_ttl)).unwrap_or_default();
    let hinfo =
        Record::from_rdata(origin.clone(), ttl, RData::HINFO(HINFO::new("RFC8482".into(), String::new())));
    let any_hinfo = encode::records(origin, RecordType::ANY, &[hinfo]).unwrap_or_default();
    ZoneNames { names, negative_soa, any_hinfo }
}

fn rrset(owner: &Name, rtype: RecordType, answer: &[Record], additional: &[Record]) -> Option<RRset> {
    if answer.is_empty() {
        return None;
    }
    Some(RRset {
        rtype: u16::from(rtype),
        answer: encode::records(owner, rtype, answer)?,
        additional: encode::records(owner, rtype, additional)?,
        shifted: false,
        from_hosts: false,
        also: None,
    })
}

/// The PTR record naming `target` for `ip`, TTL `ttl`, encoded as an
/// answer to a question for the address's reverse name: what
/// `hosts::write_ptr` must write.
#[cfg(test)]
pub(crate) fn ptr_record(ip: IpAddr, target: &Name, ttl: u32) -> Option<Records> {
    let owner = Name::from(ip);
    let record =
        Record::from_rdata(owner.clone(), ttl, RData::PTR(hickory_proto::rr::rdata::PTR(target.clone())));
    encode::records(&owner, RecordType::PTR, &[record])
}
