//! The immutable snapshot and its pre-encoded answers.
//!
//! Every record is encoded as if it followed the lower-case question for its
//! name at offset 12 (the header's end): the owner name is the pointer
//! `C0 0C`, and names inside the record are compressed only against the
//! question. Records are therefore independent of each other and of the
//! query's letter case: a response may hold any subset of them in any order
//! (truncation, load balancing) and is valid for every spelling of the name.
//!
//! Not encoded: the records of a headless service's endpoint names and
//! every PTR record, a few bytes each but most of the fleet's records; they
//! are written per query from each service's [`Hosts`] (see `hosts`).

use std::net::IpAddr;
use std::sync::Arc;

use hickory_proto::rr::Name;
use rustc_hash::FxHashMap;

use super::answer_config::AnswerConfig;
use super::answer_stats::AnswerStats;
use super::balance::{Balance, EndpointMeta};
use super::encode;
use super::hosts::{Hosts, Ptrs};
use super::localities::Localities;
use super::records::{NameNode, Records};
use super::reverse::Reverse;
use super::shards::Shards;
use super::wire_key::WireKey;

/// What the operator configures about the zone.
#[derive(Debug, Clone)]
pub struct ZoneConfig {
    /// The zone apex, e.g. `clusterset.local.`.
    pub origin: Name,
    /// TTL of positive answers.
    pub ttl: u32,
    /// TTL of negative answers (the SOA minimum).
    pub negative_ttl: u32,
    /// Addresses of `ns.dns.<zone>`, given as glue with the apex NS.
    pub advertise: Vec<IpAddr>,
    /// How A/AAAA answers of endpoints are chosen (policies, client networks).
    pub answers: AnswerConfig,
    /// Who this server is, for CHAOS TXT queries and NSID.
    pub identity: Identity,
    /// A second zone answering the same service names (`--also-zone
    /// cluster.local`): `<...>.<svc>.<ns>.svc.<also>`, with owners and SRV
    /// targets in it; nothing else of it is ours.
    pub also: Option<Name>,
}

impl ZoneConfig {
    /// The zone `origin` with the command line's defaults (TTL 5 s for
    /// answers and negative answers, no NS glue, the default identity, no
    /// second zone) and `answers`: what tests and benches build a store on.
    pub fn with_defaults(origin: Name, answers: AnswerConfig) -> Self {
        Self {
            origin,
            ttl: 5,
            negative_ttl: 5,
            advertise: vec![],
            answers,
            identity: Identity::default(),
            also: None,
        }
    }
}

/// The server's identity (RFC 4892 CHAOS TXT names, RFC 5001 NSID).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Answered for `id.server.` and `hostname.bind.`, and as NSID.
    pub server_id: String,
    /// Answered for `version.server.` and `version.bind.`; `None` refuses.
    pub version: Option<String>,
}

impl Default for Identity {
    /// `clusterset-dns` and the build's version.
    fn default() -> Self {
        Self { server_id: "clusterset-dns".into(), version: Some(version()) }
    }
}

/// This build's version string, as `version.bind.` answers it.
pub fn version() -> String {
    format!("clusterset-dns {}", env!("CARGO_PKG_VERSION"))
}

/// The zone as the answer path needs it.
#[derive(Debug)]
pub struct Zone {
    /// The configuration.
    pub config: ZoneConfig,
    /// The apex in lower-case wire format, root label included.
    pub wire: Box<[u8]>,
    /// Number of labels of the apex, root excluded.
    pub labels: usize,
    /// The same for `config.also`.
    pub also_wire: Option<Box<[u8]>>,
    /// Number of labels of `config.also`.
    pub also_labels: usize,
    /// Client networks and localities of `config.answers`, interned.
    pub localities: Localities,
    /// Answers per (service, cluster), shared by every snapshot.
    pub answer_stats: Arc<AnswerStats>,
    /// The CHAOS TXT record of the server id; the owner is the question's
    /// name (`C0 0C`), so one encoding serves `id.server.` and
    /// `hostname.bind.`.
    pub id_txt: Records,
    /// The same for the version, unless hidden.
    pub version_txt: Option<Records>,
}

impl Zone {
    /// Derives the wire form of the apex.
    pub fn new(mut config: ZoneConfig) -> Self {
        config.origin = config.origin.to_lowercase();
        config.origin.set_fqdn(true);
        let wire = wire_of(&config.origin);
        let labels = config.origin.num_labels() as usize;
        config.also = config.also.map(|mut a| {
            a = a.to_lowercase();
            a.set_fqdn(true);
            a
        });
        let also_wire = config.also.as_ref().map(wire_of);
        let also_labels = config.also.as_ref().map_or(0, |a| a.num_labels() as usize);
        let localities = Localities::new(&config.answers);
        let id_txt = encode::chaos_txt(&config.identity.server_id);
        let version_txt = config.identity.version.as_deref().map(encode::chaos_txt);
        Self {
            config,
            wire,
            labels,
            also_wire,
            also_labels,
            localities,
            answer_stats: Arc::default(),
            id_txt,
            version_txt,
        }
    }
}

/// A name in lower-case wire form, root label included.
fn wire_of(name: &Name) -> Box<[u8]> {
    let mut wire = Vec::with_capacity(name.len() + 2);
    for label in name.iter() {
        wire.push(label.len() as u8); // labels are at most 63 bytes (hickory checks)
        wire.extend_from_slice(&label.to_ascii_lowercase());
    }
    wire.push(0);
    wire.into()
}

/// Every name at and below one service, keyed by the lower-case wire bytes
/// of the labels in front of `<svc>.<ns>.svc.<zone>` (empty for the service
/// name itself), and the answer policy of the service name's A/AAAA records.
#[derive(Debug, Default)]
pub struct ServiceNames {
    /// Shared with the next snapshot when only the health overlay changes.
    pub(crate) names: NameTable,
    /// Present when the service name answers endpoints: which records are
    /// answered, in which order, is chosen per query from this.
    pub(crate) balance: Option<Arc<Balance>>,
    /// Its endpoint names (a headless service's), answered at query time,
    /// and the addresses it names for reverse (PTR) answers: its
    /// clusterset VIPs to the service name, its headless endpoints to
    /// their own names.
    pub(crate) hosts: Arc<Hosts>,
}

impl ServiceNames {
    /// The node for a prefix (the endpoint names are not nodes: [`ServiceNames::hosts`]).
    pub fn get(&self, prefix: &[u8]) -> Option<&NameNode> {
        self.names.get(prefix)
    }

    /// The endpoint names, answered at query time.
    pub fn hosts(&self) -> &Hosts {
        &self.hosts
    }

    /// The answer policy and endpoint metadata of the service name's A/AAAA.
    pub fn balance(&self) -> Option<&Balance> {
        self.balance.as_deref()
    }

    /// The addresses of `endpoint`, one of [`ServiceNames::balance`]'s:
    /// read from its records in the service name's A and AAAA RRsets (where
    /// its `records` ranges point), IPv4 first. An address two endpoints
    /// share is one record, the first's.
    pub fn endpoint_addresses<'a>(&'a self, endpoint: &EndpointMeta) -> impl Iterator<Item = IpAddr> + 'a {
        let node = self.names.get(&[]);
        let [(a_first, a_count), (aaaa_first, aaaa_count)] = endpoint.records;
        let family = move |rtype: u16, first: u32, count: u16| {
            let records = node.and_then(|n| n.get(rtype)).map(|s| &s.answer);
            (first..first + u32::from(count)).filter_map(move |i| {
                let records = records.filter(|r| (i as usize) < r.len())?;
                address_of(records.get(i as usize))
            })
        };
        family(A, a_first, a_count).chain(family(AAAA, aaaa_first, aaaa_count))
    }

    /// What identifies `endpoint` (one of the balance's), for explain: its
    /// targetRef or hostname, else its first address.
    pub fn endpoint_label(&self, endpoint: &EndpointMeta) -> String {
        match (&endpoint.name, self.endpoint_addresses(endpoint).next()) {
            (Some(name), _) => name.to_string(),
            (None, Some(address)) => address.to_string(),
            (None, None) => String::new(),
        }
    }

    /// Number of names.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// Record types whose records [`ServiceNames::endpoint_addresses`] reads.
const A: u16 = 1;
const AAAA: u16 = 28;

/// The address an encoded A or AAAA record (as `encode` writes it: owner,
/// type, class, TTL, length, then the address) ends with.
fn address_of(record: &[u8]) -> Option<IpAddr> {
    const FIXED: usize = 10; // type, class, TTL, RDLENGTH after the owner
    let rdata = record.get(2 + FIXED..)?;
    match rdata.len() {
        4 => <[u8; 4]>::try_from(rdata).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(rdata).ok().map(IpAddr::from),
        _ => None,
    }
}

/// A service's names and their nodes, sorted by key: one shared block.
///
/// A service has a handful of names (two for a ClusterSetIP service with a
/// named port, a dozen for a headless one in ten clusters), where a hash
/// table cost about 210 bytes in two heap blocks for the two
/// (docs/benchmarks-history.md, "Where the bytes go, by structure"); a
/// binary search over so few keys is no slower than hashing the prefix.
#[derive(Debug, Clone, Default)]
pub struct NameTable(Option<Arc<[NameEntry]>>);

/// A name's prefix key and its node.
type NameEntry = (Box<[u8]>, NameNode);

impl NameTable {
    /// The table of `names`, in any order, keys distinct.
    pub(crate) fn new(mut names: Vec<NameEntry>) -> Self {
        if names.is_empty() {
            return Self(None);
        }
        names.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        debug_assert!(names.windows(2).all(|w| w[0].0 != w[1].0), "distinct keys");
        Self(Some(names.into()))
    }

    fn entries(&self) -> &[NameEntry] {
        self.0.as_deref().unwrap_or(&[])
    }

    /// The node of `prefix`.
    pub fn get(&self, prefix: &[u8]) -> Option<&NameNode> {
        let entries = self.entries();
        if prefix.is_empty() {
            // The service name, most queries: its key sorts first. A binary
            // search would first compare another name's key, a heap block
            // the query has no other use for (a cache miss at fleet scale).
            return entries.first().filter(|(k, _)| k.is_empty()).map(|(_, n)| n);
        }
        entries.binary_search_by(|(k, _)| (**k).cmp(prefix)).ok().map(|i| &entries[i].1)
    }

    /// Every (prefix, node), in byte order of the prefixes.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &NameNode)> {
        self.entries().iter().map(|(k, n)| (&k[..], n))
    }

    /// Number of names.
    pub fn len(&self) -> usize {
        self.entries().len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// True when both are the same block (shared, not re-encoded).
    #[cfg(test)]
    pub(crate) fn shares(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (a, b) => a.is_none() && b.is_none(),
        }
    }
}

/// The names outside any service and the records every negative or ANY
/// answer needs; they depend on the serial and the namespaces only.
#[derive(Debug)]
pub(crate) struct ZoneNames {
    /// Keyed by the wire bytes of the labels in front of the apex.
    pub(crate) names: FxHashMap<Box<[u8]>, NameNode>,
    /// The SOA for negative answers from its TYPE field on.
    pub(crate) negative_soa: Box<[u8]>,
    /// RFC 8482's synthesized `HINFO "RFC8482" ""` answer to ANY.
    pub(crate) any_hinfo: Records,
}

/// An immutable view of the whole zone.
#[derive(Debug)]
pub struct Snapshot {
    pub(crate) zone: Arc<Zone>,
    pub(crate) serial: u32,
    pub(crate) ready: bool,
    /// Services keyed by the lower-case wire bytes of `<svc>.<ns>`.
    pub(crate) services: Shards<WireKey, Arc<ServiceNames>>,
    /// Names outside any service (apex, `dns-version`, `svc`, `<ns>.svc`, …),
    /// keyed by the wire bytes of the labels in front of the apex.
    pub(crate) zone_names: FxHashMap<Box<[u8]>, NameNode>,
    /// The SOA for negative answers from its TYPE field on; the owner (the
    /// apex) is a pointer written per query.
    pub(crate) negative_soa: Box<[u8]>,
    /// RFC 8482's synthesized `HINFO "RFC8482" ""` answer to ANY.
    pub(crate) any_hinfo: Records,
    /// PTR answers for the addresses the services name (`in-addr.arpa` and
    /// `ip6.arpa`): the names they point to, written per query.
    pub(crate) reverse: Reverse,
    /// The names of the interned topology zones (`EndpointMeta::zone`):
    /// the configuration's, then those slices name. Shared by snapshots
    /// until a new zone appears, so an endpoint keeps only the id.
    pub(crate) zones: Arc<[Box<str>]>,
}

impl Snapshot {
    /// The snapshot before any source delivered: no service, not ready,
    /// only the names outside services (`names::zone_names` at serial 0).
    pub(crate) fn empty(zone: Arc<Zone>, names: ZoneNames) -> Self {
        Self {
            zones: zone.localities.zones.iter().map(|z| z.as_str().into()).collect(),
            zone,
            serial: 0,
            ready: false,
            services: Shards::default(),
            zone_names: names.names,
            negative_soa: names.negative_soa,
            any_hinfo: names.any_hinfo,
            reverse: Reverse::default(),
        }
    }

    /// The zone.
    pub fn zone(&self) -> &Zone {
        &self.zone
    }

    /// The SOA serial; it increases on every published change.
    pub fn serial(&self) -> u32 {
        self.serial
    }

    /// True once every source has delivered its first complete state; until
    /// then, names not found are answered SERVFAIL, never NXDOMAIN.
    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// Number of services with names in the zone.
    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    /// The names of the service whose wire key (`<svc>.<ns>` labels) is given.
    pub fn service(&self, key: &[u8]) -> Option<&ServiceNames> {
        self.services.get(key).map(|s| &**s)
    }

    /// A node outside the services, by its prefix in front of the apex.
    pub fn zone_name(&self, prefix: &[u8]) -> Option<&NameNode> {
        self.zone_names.get(prefix)
    }

    /// The name of the interned topology zone `id` (an endpoint's zone).
    pub fn topology_zone(&self, id: u16) -> Option<&str> {
        self.zones.get(usize::from(id)).map(|z| &**z)
    }

    /// The PTR records of an address a service names (a clusterset VIP or
    /// a headless endpoint): the names they point to.
    pub fn reverse(&self, ip: IpAddr) -> Option<&Ptrs> {
        self.reverse.get(ip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::records::RRset;

    fn node(n: usize) -> NameNode {
        let sets = (0..n).map(|_| RRset {
            rtype: 1,
            answer: Records::default(),
            additional: Records::default(),
            shifted: false,
            from_hosts: false,
            also: None,
        });
        NameNode { sets: sets.collect() }
    }

    #[test]
    fn a_name_table_finds_every_key_and_nothing_else() {
        let keys: [&[u8]; 4] = [b"", b"\x05_http\x04_tcp", b"\x08cluster1", b"\x01a\x08cluster1"];
        // Given out of order; each node told apart by its number of sets.
        let table =
            NameTable::new(keys.iter().enumerate().rev().map(|(i, k)| (Box::from(*k), node(i))).collect());
        assert_eq!(table.len(), 4);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(table.get(k).map(|n| n.sets.len()), Some(i), "{k:?}");
        }
        assert!(table.get(b"\x01b").is_none() && table.get(b"\x08cluster2").is_none());
        let prefixes: Vec<&[u8]> = table.iter().map(|(k, _)| k).collect();
        assert!(prefixes.is_sorted());
        // Without the service name itself, the empty key finds nothing.
        let no_service = NameTable::new(vec![(Box::from(&b"\x08cluster1"[..]), node(0))]);
        assert!(no_service.get(b"").is_none());
        assert!(NameTable::default().get(b"").is_none() && NameTable::default().is_empty());
    }
}
