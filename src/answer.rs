//! Deciding the answer: a pure function from a snapshot and a question to an
//! [`Answer`] that borrows pre-encoded records from the snapshot. No I/O, no
//! allocation; the wire layer turns an `Answer` into bytes.
//!
//! The rules are the contract of `docs/answers.md` (the MCS DNS
//! specification, with RFC 8020 and RFC 8482 where it is silent).
//!
//! The search, in order ([`lookup_for`]): CHAOS names go to the debug
//! answers, a class other than IN or ANY is REFUSED. Names of the zone come
//! first, the common case; only for a name outside it are the `svc`
//! subtree of `--also-zone` and the reverse names of the addresses the
//! services name (PTR) looked at, and anything else is REFUSED. In the
//! zone: the service map (a service restricted to consumer clusters does
//! not exist for other clients, and every answer under its name is
//! `client_dependent`), then the service's own names, then its endpoint
//! names (`Hosts`: their records, PTR records and a headless service's SRV
//! records are [`Answer::synth`], written per query by the wire layer).
//! A name not found is SERVFAIL until every source has synced, NXDOMAIN
//! after; ANY gets RFC 8482's one HINFO. A balanced A/AAAA answer is
//! chosen by the service's policy (`select`), into the caller's [`Picks`].

pub mod select;

pub use select::{Decision, MAX_PICKS, Pick, Picks};

use crate::store::{Balance, Client, HostSrv, Hosts, NameNode, Ptrs, Records, Snapshot};

/// Record and query types the answer path treats specially.
pub mod rtype {
    /// SOA.
    pub const SOA: u16 = 6;
    /// TXT.
    pub const TXT: u16 = 16;
    /// IXFR.
    pub const IXFR: u16 = 251;
    /// AXFR.
    pub const AXFR: u16 = 252;
    /// ANY (`*`).
    pub const ANY: u16 = 255;
    /// A.
    pub const A: u16 = 1;
    /// AAAA.
    pub const AAAA: u16 = 28;
    /// PTR.
    pub const PTR: u16 = 12;
}

/// Query classes.
pub mod class {
    /// IN.
    pub const IN: u16 = 1;
    /// CH (CHAOS): server identity (RFC 4892).
    pub const CH: u16 = 3;
    /// ANY.
    pub const ANY: u16 = 255;
}

/// A question, its name in lower-case, uncompressed wire format.
#[derive(Debug, Clone, Copy)]
pub struct Question<'q> {
    /// QNAME: length-prefixed labels ending with the root label, lower case.
    pub name: &'q [u8],
    /// QTYPE.
    pub qtype: u16,
    /// QCLASS.
    pub qclass: u16,
}

/// Response codes (RFC 1035, 6891).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rcode {
    /// NOERROR.
    NoError,
    /// FORMERR: the query could not be understood.
    FormErr,
    /// SERVFAIL: not ready to say a name does not exist.
    ServFail,
    /// NXDOMAIN: the name does not exist.
    NxDomain,
    /// NOTIMP: an opcode other than QUERY.
    NotImp,
    /// REFUSED: outside the zone, or a zone transfer.
    Refused,
    /// BADVERS: an EDNS version this server does not speak.
    BadVers,
    /// BADCOOKIE (RFC 7873 §8): over the rate limit without a valid
    /// server cookie; the response carries one to retry with.
    BadCookie,
}

impl Rcode {
    /// The full 12-bit code; the upper 8 bits travel in the OPT record.
    pub fn code(self) -> u16 {
        match self {
            Self::NoError => 0,
            Self::FormErr => 1,
            Self::ServFail => 2,
            Self::NxDomain => 3,
            Self::NotImp => 4,
            Self::Refused => 5,
            Self::BadVers => 16,
            Self::BadCookie => 23,
        }
    }
}

/// What to answer.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'s> {
    /// The response code.
    pub rcode: Rcode,
    /// AA: set on every answer from the zone, clear outside it.
    pub authoritative: bool,
    /// The name is in the zone (for metrics: CoreDNS counts the rest as `dropped`).
    pub in_zone: bool,
    /// Answer-section records.
    pub answer: Option<&'s Records>,
    /// Additional-section records.
    pub additional: Option<&'s Records>,
    /// Added to the pointer that ends each additional record's owner: they
    /// are the service name's, and the service name starts this far into
    /// the question (`RRset::shifted`).
    pub additional_shift: u16,
    /// For NXDOMAIN and NODATA: the SOA goes into the authority section, its
    /// owner being the apex, which starts at this offset of the QNAME.
    pub soa_owner: Option<u16>,
    /// Which answer records, in which order (answer policies).
    pub pick: Pick,
    /// The answer depends on who asks: chosen by a policy that looks at
    /// the client, or about a service restricted to consumer clusters
    /// (its ECS scope is then the client's network, not 0).
    pub client_dependent: bool,
    /// The balanced service whose endpoints were chosen, for metrics.
    pub balance: Option<&'s Balance>,
    /// Answer records written per query instead of copied (`answer` is
    /// then `None`).
    pub synth: Option<Synth<'s>>,
}

/// Answer records the wire layer writes from the snapshot's compact data
/// (`store::Hosts`) rather than copies: the same bytes, not kept encoded.
#[derive(Debug, Clone, Copy)]
pub enum Synth<'s> {
    /// The A or AAAA records of an endpoint name: these addresses, in order.
    Addresses(&'s [std::net::IpAddr]),
    /// The PTR records of the reverse name of this address: those of
    /// services a client of this cluster may see.
    Ptr(std::net::IpAddr, &'s Ptrs, Option<u16>),
    /// A headless service's SRV records, and their targets' addresses as
    /// additional records.
    Srv {
        /// The service's endpoint names (the targets).
        hosts: &'s Hosts,
        /// The RRset.
        srv: &'s HostSrv,
        /// The zone the targets are named in (wire form).
        zone: &'s [u8],
        /// Where the service name starts in the question.
        svc_at: u16,
    },
}

impl Answer<'_> {
    /// An answer with no records and the given code.
    pub fn bare(rcode: Rcode, authoritative: bool) -> Self {
        Self {
            rcode,
            authoritative,
            in_zone: authoritative,
            answer: None,
            additional: None,
            additional_shift: 0,
            soa_owner: None,
            pick: Pick::All,
            client_dependent: false,
            balance: None,
            synth: None,
        }
    }

    fn negative(rcode: Rcode, apex_offset: usize) -> Self {
        Self { soa_owner: Some(apex_offset as u16), ..Self::bare(rcode, true) }
    }
}

/// CHAOS-class names (RFC 4892): the server's id and version as TXT.
/// Anything else in CHAOS is refused.
fn chaos<'s>(snap: &'s Snapshot, q: &Question<'_>) -> Answer<'s> {
    const ID: [&[u8]; 2] = [b"\x02id\x06server\x00", b"\x08hostname\x04bind\x00"];
    const VERSION: [&[u8]; 2] = [b"\x07version\x06server\x00", b"\x07version\x04bind\x00"];
    let zone = snap.zone();
    let records = if ID.contains(&q.name) {
        Some(&zone.id_txt)
    } else if VERSION.contains(&q.name) {
        zone.version_txt.as_ref()
    } else {
        None
    };
    // Outside the zone, so counted as `dropped` like other names not ours.
    let own = Answer { in_zone: false, ..Answer::bare(Rcode::NoError, true) };
    match (records, q.qtype) {
        (Some(txt), rtype::TXT | rtype::ANY) => Answer { answer: Some(txt), ..own },
        (Some(_), _) => own,
        (None, _) => Answer::bare(Rcode::Refused, false),
    }
}

/// The answer for the reverse name of `ip`: its PTR records when a
/// service names it (a clusterset VIP, a headless endpoint), NODATA for
/// other types of such a name (no SOA: the reverse zone is not ours), and
/// REFUSED for every other address, whose reverse names belong to the
/// cluster's own DNS or to no one. An address only services the client
/// may not see name (consumer clusters) is such another address: its
/// reverse name would tell the restricted name.
fn reverse<'s>(snap: &'s Snapshot, ip: std::net::IpAddr, qtype: u16, client: &Client) -> Answer<'s> {
    let named = snap.reverse(ip);
    let seen = named.filter(|p| p.targets().any(|t| t.visible_to(client.cluster)));
    let answer = match (seen, qtype) {
        (None, _) => Answer::bare(Rcode::Refused, false),
        (Some(ptrs), rtype::PTR | rtype::ANY) => {
            Answer { synth: Some(Synth::Ptr(ip, ptrs, client.cluster)), ..Answer::bare(Rcode::NoError, true) }
        }
        (Some(_), _) => Answer::bare(Rcode::NoError, true),
    };
    let client_dependent = named.is_some_and(|p| p.targets().any(|t| t.restricted()));
    Answer { client_dependent, ..answer }
}

/// The address whose reverse name `name` is (lower-case wire form, its
/// labels starting at `starts`): `d.c.b.a.in-addr.arpa.` with four decimal
/// octets written as `inet_ntoa` would (no leading zeros), or 32 single hex
/// digits then `ip6.arpa.`. Any other name, shorter (a reverse zone) or
/// longer, is not an address.
fn reverse_address(name: &[u8], starts: &[u8]) -> Option<std::net::IpAddr> {
    const V4: &[u8] = b"\x07in-addr\x04arpa\x00";
    const V6: &[u8] = b"\x03ip6\x04arpa\x00";
    let label = |j: usize| {
        let s = usize::from(*starts.get(j)?);
        name.get(s + 1..s + 1 + usize::from(*name.get(s)?))
    };
    let tail = |j: usize| name.get(usize::from(*starts.get(j)?)..);
    if starts.len() == 6 && tail(4) == Some(V4) {
        let mut octets = [0u8; 4];
        for (i, octet) in octets.iter_mut().rev().enumerate() {
            let digits = label(i)?;
            if digits.is_empty() || digits.len() > 3 || (digits.len() > 1 && digits[0] == b'0') {
                return None;
            }
            let mut v: u16 = 0;
            for &d in digits {
                v = v * 10 + u16::from(d.checked_sub(b'0').filter(|d| *d < 10)?);
            }
            *octet = u8::try_from(v).ok()?;
        }
        return Some(std::net::Ipv4Addr::from(octets).into());
    }
    if starts.len() == 34 && tail(32) == Some(V6) {
        let mut bits: u128 = 0;
        for i in (0..32).rev() {
            let [d] = label(i)? else { return None };
            bits = bits << 4 | u128::from(char::from(*d).to_digit(16)?);
        }
        return Some(std::net::Ipv6Addr::from(bits).into());
    }
    None
}

/// Most labels a 255-byte name can have.
const MAX_LABELS: usize = 128;

/// Finds the answer to `q` in `snap` for a client nothing is known about.
/// Balanced answers list their records in `picks`.
pub fn lookup<'s>(snap: &'s Snapshot, q: &Question<'_>, picks: &mut Picks) -> Answer<'s> {
    lookup_for(snap, q, &Client::default(), picks)
}

/// Finds the answer to `q` from `client` in `snap`: the answer policy of a
/// balanced service chooses its endpoints, listing them in `picks` when
/// `Answer::pick` is [`Pick::Listed`].
pub fn lookup_for<'s>(
    snap: &'s Snapshot,
    q: &Question<'_>,
    client: &Client,
    picks: &mut Picks,
) -> Answer<'s> {
    let mut restricted = false;
    let mut answer = find(snap, q, client, picks, &mut restricted);
    // Whether such a service exists depends on who asks, and so does every
    // answer under its name: a cache that keeps answers per client subnet
    // (RFC 7871 §7.3.1) must not hand one cluster's to another.
    answer.client_dependent |= restricted;
    answer
}

/// [`lookup_for`]'s search; `restricted` is set when the name is a service
/// restricted to consumer clusters, or under one.
fn find<'s>(
    snap: &'s Snapshot,
    q: &Question<'_>,
    client: &Client,
    picks: &mut Picks,
    restricted: &mut bool,
) -> Answer<'s> {
    let name = q.name;
    if q.qclass == class::CH {
        return chaos(snap, q);
    }
    if q.qclass != class::IN && q.qclass != class::ANY {
        return Answer::bare(Rcode::Refused, false);
    }
    let mut starts = [0u8; MAX_LABELS];
    let mut n = 0;
    let mut i = 0;
    while i < name.len() && name[i] != 0 && n < MAX_LABELS {
        starts[n] = i as u8; // names are at most 255 bytes
        n += 1;
        i += 1 + name[i] as usize;
    }
    let zone = snap.zone();
    let label = |j: usize| {
        let s = starts[j] as usize;
        &name[s..s + 1 + name[s] as usize]
    };
    // Labels in front of the apex, where the apex starts, and whether the
    // name is in the second zone (`--also-zone`).
    let within = |wire: &[u8], labels: usize| {
        let k = n.checked_sub(labels)?;
        let apex = if k == 0 { 0 } else { starts[k] as usize };
        (name.get(apex..) == Some(wire)).then_some((k, apex))
    };
    // Names of the zone are the common case: the second zone and reverse
    // names are looked at only for names outside it.
    let (k, apex, also) = match within(&zone.wire, zone.labels) {
        Some((k, apex)) => (k, apex, false),
        None => match zone.also_wire.as_deref().and_then(|w| within(w, zone.also_labels)) {
            // Of the second zone, only the service subtree is ours.
            Some((k, apex)) if k > 0 && label(k - 1) == b"\x03svc" => (k, apex, true),
            _ => {
                return match reverse_address(name, &starts[..n]) {
                    Some(ip) => reverse(snap, ip, q.qtype, client),
                    None => Answer::bare(Rcode::Refused, false),
                };
            }
        },
    };
    if q.qtype == rtype::AXFR || q.qtype == rtype::IXFR {
        return Answer { in_zone: true, ..Answer::bare(Rcode::Refused, false) };
    }
    let mut balance = None;
    let mut host = None;
    let mut hosts = None;
    let mut svc_at = 0;
    let node: Option<&NameNode> = if k >= 3 && label(k - 1) == b"\x03svc" {
        // <prefix>.<svc>.<ns>.svc.<zone>
        let svc = starts[k - 3] as usize;
        svc_at = svc as u16; // names are at most 255 bytes
        // A service restricted to consumer clusters does not exist for
        // other clients, with every name under it: NXDOMAIN, as in a member
        // that has no import.
        let found = snap.service(&name[svc..starts[k - 1] as usize]);
        *restricted = found.is_some_and(|s| s.hosts().consumers().is_some());
        let service = found.filter(|s| s.hosts().visible_to(client.cluster));
        if svc == 0 {
            balance = service.and_then(|s| s.balance());
        }
        let node = service.and_then(|s| s.get(&name[..svc]));
        hosts = service.map(|s| s.hosts());
        if node.is_none() {
            host = hosts.and_then(|h| Some((h, h.find(&name[..svc])?)));
        }
        node
    } else {
        snap.zone_name(&name[..apex])
    };
    if let Some((hosts, i)) = host {
        return endpoint_name(snap, hosts, i, q.qtype, apex);
    }
    let Some(node) = node else {
        // Before every source has synced, "not found" may only mean "not yet
        // known": SERVFAIL is not cached the way NXDOMAIN is.
        if !snap.is_ready() {
            return Answer::bare(Rcode::ServFail, true);
        }
        return Answer::negative(Rcode::NxDomain, apex);
    };
    if q.qtype == rtype::ANY {
        // RFC 8482 §4.2: answer ANY with one synthesized HINFO.
        if node.sets.is_empty() {
            return Answer::negative(Rcode::NoError, apex);
        }
        return Answer { answer: Some(&snap.any_hinfo), ..Answer::bare(Rcode::NoError, true) };
    }
    let family = match q.qtype {
        rtype::A => Some(0),
        rtype::AAAA => Some(1),
        _ => None,
    };
    if let (Some(b), Some(fam), Some(set)) = (balance, family, node.get(q.qtype)) {
        let Some((pick, _)) = select::choose(b, fam, client, b.next_seq(fam), set.answer.len(), picks) else {
            // Every endpoint is down and fail-open is off: the name
            // exists, nothing is answered.
            return Answer::negative(Rcode::NoError, apex);
        };
        return Answer {
            answer: Some(&set.answer),
            pick,
            client_dependent: select::depends_on_client(b),
            balance: Some(b),
            ..Answer::bare(Rcode::NoError, true)
        };
    }
    match node.get(q.qtype) {
        Some(set) if set.from_hosts => {
            let Some((hosts, srv)) = hosts.and_then(|h| Some((h, h.srv(&name[..svc_at as usize])?))) else {
                return Answer::negative(Rcode::NoError, apex);
            };
            // Targets name the zone asked, unless one would be too long there.
            let zone = match (also, zone.also_wire.as_deref()) {
                (true, Some(wire)) if srv.fits(hosts, wire) => wire,
                _ => &zone.wire[..],
            };
            Answer {
                synth: Some(Synth::Srv { hosts, srv, zone, svc_at }),
                ..Answer::bare(Rcode::NoError, true)
            }
        }
        Some(set) => {
            // SRV targets name the zone they are in: the second zone has
            // its own encoding of them.
            let (answer, additional) = match (&set.also, also) {
                (Some(a), true) => (&a.0, &a.1),
                _ => (&set.answer, &set.additional),
            };
            Answer {
                answer: Some(answer),
                additional: Some(additional).filter(|a| !a.is_empty()),
                additional_shift: if set.shifted { svc_at } else { 0 },
                ..Answer::bare(Rcode::NoError, true)
            }
        }
        // The name exists without this type (or is an empty non-terminal,
        // RFC 8020): NODATA.
        None => Answer::negative(Rcode::NoError, apex),
    }
}

/// The answer for endpoint name `i` of `hosts`: its addresses of the
/// type asked, written per query; a name with addresses only, so ANY is
/// the HINFO of RFC 8482 and any other type NODATA.
fn endpoint_name<'s>(snap: &'s Snapshot, hosts: &'s Hosts, i: usize, qtype: u16, apex: usize) -> Answer<'s> {
    let family = match qtype {
        rtype::ANY => return Answer { answer: Some(&snap.any_hinfo), ..Answer::bare(Rcode::NoError, true) },
        rtype::A => 0,
        rtype::AAAA => 1,
        _ => return Answer::negative(Rcode::NoError, apex),
    };
    match hosts.addresses(i, family) {
        [] => Answer::negative(Rcode::NoError, apex),
        addrs => Answer { synth: Some(Synth::Addresses(addrs)), ..Answer::bare(Rcode::NoError, true) },
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    /// `reverse_address` of a presentation-form name.
    fn parse(name: &str) -> Option<IpAddr> {
        let mut wire = Vec::new();
        let mut starts = Vec::new();
        for label in name.trim_end_matches('.').split('.') {
            starts.push(wire.len() as u8);
            wire.push(label.len() as u8);
            wire.extend_from_slice(label.to_ascii_lowercase().as_bytes());
        }
        wire.push(0);
        reverse_address(&wire, &starts)
    }

    #[test]
    fn reverse_names_are_read_as_addresses_and_nothing_else_is() {
        assert_eq!(parse("10.0.42.10.in-addr.arpa."), Some("10.42.0.10".parse().unwrap()));
        assert_eq!(parse("255.0.0.0.in-addr.arpa"), Some("0.0.0.255".parse().unwrap()));
        let v6 = "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.D.F.ip6.arpa.";
        assert_eq!(parse(v6), Some("fd00::1".parse().unwrap()));
        for not in [
            "0.42.10.in-addr.arpa.",      // a reverse zone, not an address
            "1.10.0.42.10.in-addr.arpa.", // one label too many
            "010.0.42.10.in-addr.arpa.",  // not how an octet is written
            "256.0.42.10.in-addr.arpa.",
            "a.0.42.10.in-addr.arpa.",
            ".0.42.10.in-addr.arpa.",
            "10.0.42.10.in-addr.arpa.example.",
            "10.0.42.10.ip6.arpa.",
            "10.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.",
            "g.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.",
            "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.",
            "web.shop.svc.clusterset.local.",
        ] {
            assert_eq!(parse(not), None, "{not}");
        }
    }
}

#[cfg(test)]
pub(crate) mod consumer_tests {
    use hickory_proto::rr::Name;

    use super::*;
    use crate::model::{
        AddressFamily, AnswerOverrides, ClusterId, DnsLabel, Endpoint, EndpointSet, ImportType, Port,
        Protocol, ServiceImport, ServiceKey, SliceKey, SliceOrigin,
    };
    use crate::store::{self, AnswerConfig, ClientNet, Object, Reader, SourceId, Update, Writer, ZoneConfig};

    fn wire(name: &str) -> Vec<u8> {
        let mut w = Vec::new();
        for label in name.trim_end_matches('.').split('.') {
            w.push(label.len() as u8);
            w.extend_from_slice(label.as_bytes());
        }
        w.push(0);
        w
    }

    /// `hl.ns` (restricted to `consumers`) and `pub.ns`, headless, each with
    /// one endpoint of cluster c1 with a named port; clients 10.<n>.0.0/16
    /// are in c<n>.
    pub(crate) fn fleet(consumers: Option<&[&str]>) -> (Reader, Writer) {
        let mut a = AnswerConfig::standard();
        a.clients = (1..=2)
            .map(|n| ClientNet {
                net: format!("10.{n}.0.0/16").parse().unwrap(),
                cluster: ClusterId::parse(&format!("c{n}")).unwrap(),
                zone: None,
            })
            .collect();
        let (reader, mut w) =
            store::new(ZoneConfig::with_defaults(Name::from_ascii("clusterset.local.").unwrap(), a));
        let key = |n: &str| ServiceKey {
            namespace: DnsLabel::parse("ns").unwrap(),
            name: DnsLabel::parse(n).unwrap(),
        };
        let port = Port { name: DnsLabel::parse("http").ok(), protocol: Protocol::Tcp, port: 80 };
        let mut objects = Vec::new();
        for (name, ip, restricted) in [("hl", "10.1.1.1", true), ("pub", "10.1.1.2", false)] {
            let consumers = consumers
                .filter(|_| restricted)
                .map(|c| c.iter().map(|c| ClusterId::parse(c).unwrap()).collect());
            objects.push(Object::Import(ServiceImport {
                key: key(name),
                kind: ImportType::Headless,
                ips: Default::default(),
                ports: vec![port.clone()].into(),
                answers: AnswerOverrides { consumers, ..Default::default() }.into(),
            }));
            let host = DnsLabel::parse("h0").unwrap();
            objects.push(Object::Slice(EndpointSet {
                slice: SliceKey { namespace: "ns".into(), name: format!("{name}-c1") },
                service: key(name),
                cluster: ClusterId::parse("c1").unwrap(),
                family: AddressFamily::V4,
                ports: vec![port.clone()],
                endpoints: vec![Endpoint::new(vec![ip.parse().unwrap()].into(), true).with_names(
                    Some(&host),
                    None,
                    None,
                )],
                origin: SliceOrigin::Mcs,
                trigger: Default::default(),
            }));
        }
        w.apply(Update::Replace { source: SourceId::Watch(1), objects });
        w.publish();
        (reader, w)
    }

    fn rcode(reader: &Reader, name: &str, qtype: u16, from: Option<&str>) -> (Rcode, bool) {
        let snap = reader.load();
        let client =
            from.map_or_else(Client::default, |ip| snap.zone().localities.client_at(ip.parse().unwrap()));
        let name = wire(name);
        let a =
            lookup_for(&snap, &Question { name: &name, qtype, qclass: 1 }, &client, &mut Picks::default());
        (a.rcode, a.answer.is_some() || a.synth.is_some())
    }

    #[test]
    fn a_restricted_service_exists_only_for_its_consumers_clients() {
        let (reader, _w) = fleet(Some(&["c2"]));
        let names = [
            ("hl.ns.svc.clusterset.local", rtype::A),
            ("hl.ns.svc.clusterset.local", 33), // SRV
            ("_http._tcp.hl.ns.svc.clusterset.local", 33),
            ("h0.c1.hl.ns.svc.clusterset.local", rtype::A),
            ("c1.hl.ns.svc.clusterset.local", rtype::A), // an empty non-terminal
        ];
        for (name, qtype) in names {
            assert_eq!(rcode(&reader, name, qtype, Some("10.2.0.9")).0, Rcode::NoError, "{name} from c2");
            // Not a consumer (the exporting cluster itself), or unknown: as if it did not exist.
            for from in [Some("10.1.0.9"), None] {
                assert_eq!(
                    rcode(&reader, name, qtype, from),
                    (Rcode::NxDomain, false),
                    "{name} from {from:?}"
                );
            }
        }
        // The unrestricted service is everyone's.
        assert_eq!(rcode(&reader, "pub.ns.svc.clusterset.local", rtype::A, None), (Rcode::NoError, true));
        // Reverse names do not tell the restricted name either.
        let ptr = "1.1.1.10.in-addr.arpa";
        assert_eq!(rcode(&reader, ptr, rtype::PTR, Some("10.2.0.9")), (Rcode::NoError, true));
        assert_eq!(rcode(&reader, ptr, rtype::PTR, Some("10.1.0.9")), (Rcode::Refused, false));
        assert_eq!(rcode(&reader, "2.1.1.10.in-addr.arpa", rtype::PTR, Some("10.1.0.9")).0, Rcode::NoError);
        // A transfer lists what the client's queries find.
        let listed = |cluster: Option<&str>| {
            let snap = reader.load_full();
            let id = cluster.and_then(|c| snap.zone().localities.cluster_id(c));
            let mut walk = store::ZoneWalk::new(snap, id);
            let mut out = Vec::new();
            while walk.next_group(&mut out) {}
            out.iter().any(|r| r.name.to_string().contains("hl.ns."))
        };
        assert!(listed(Some("c2")));
        assert!(!listed(Some("c1")) && !listed(None));
        // An empty list (one that did not parse) is no one's.
        let (reader, _w) = fleet(Some(&[]));
        assert_eq!(
            rcode(&reader, "hl.ns.svc.clusterset.local", rtype::A, Some("10.2.0.9")).0,
            Rcode::NxDomain
        );
        // No list: everyone's.
        let (reader, _w) = fleet(None);
        assert_eq!(rcode(&reader, "hl.ns.svc.clusterset.local", rtype::A, None), (Rcode::NoError, true));
    }

    /// Found by issue 40: a restricted service's answers were marked as the
    /// same for everyone, so their ECS scope was 0 and a cache keeping
    /// answers per client subnet would hand a consumer's to anyone.
    #[test]
    fn answers_about_a_restricted_service_depend_on_who_asks() {
        let (reader, _w) = fleet(Some(&["c2"]));
        let snap = reader.load();
        let depends = |name: &str, qtype: u16, from: &str| {
            let client = snap.zone().localities.client_at(from.parse().unwrap());
            let name = wire(name);
            let q = Question { name: &name, qtype, qclass: 1 };
            lookup_for(&snap, &q, &client, &mut Picks::default()).client_dependent
        };
        for from in ["10.2.0.9", "10.1.0.9"] {
            for (name, qtype) in [
                ("hl.ns.svc.clusterset.local", rtype::A),
                ("_http._tcp.hl.ns.svc.clusterset.local", 33),
                ("h0.c1.hl.ns.svc.clusterset.local", rtype::A),
                ("nope.hl.ns.svc.clusterset.local", rtype::A),
                ("1.1.1.10.in-addr.arpa", rtype::PTR),
            ] {
                assert!(depends(name, qtype, from), "{name} from {from}");
            }
            // Rotation over an unrestricted service is everyone's answer.
            for (name, qtype) in [
                ("pub.ns.svc.clusterset.local", rtype::A),
                ("2.1.1.10.in-addr.arpa", rtype::PTR),
                ("nope.ns.svc.clusterset.local", rtype::A),
            ] {
                assert!(!depends(name, qtype, from), "{name} from {from}");
            }
        }
    }
}
