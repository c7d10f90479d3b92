//! The names a service's addresses give, answered at query time: a
//! headless service's endpoint names (`<host>.<cluster>.<svc>.<ns>.svc.<zone>`)
//! with their A/AAAA records, and the PTR records of every address a service
//! names (its endpoints' to their names, its VIPs to the service name).
//!
//! Encoded ahead, each endpoint name was a node of the service's map with an
//! RRset of its own, and each address a PTR record in two maps: about 300 B
//! per endpoint, two thirds of a headless service at fleet scale
//! (docs/benchmarks-history.md, "Endpoint names and PTR records written per
//! query"). These records are few bytes with nothing
//! to compress but the PTR target, so a [`Hosts`] keeps only the names'
//! prefixes and addresses, packed and sorted, and the answer path writes the
//! records itself, the same bytes `encode` would have produced:
//!
//! - A/AAAA: the owner a pointer to the question (`C0 0C`), type, class IN,
//!   TTL, length, the address.
//! - PTR: the same owner, and the target written out, compressed against
//!   the question as hickory-proto compresses it (only possible when the
//!   zone is under `arpa.`).

use std::net::IpAddr;
use std::sync::Arc;

use crate::model::Addresses;

/// `index` of a [`PtrTarget`] naming the service name itself.
const SERVICE: u32 = u32::MAX;
/// Marks, in a [`HostSrv`] record's target index, the first record naming
/// that target: its addresses go in the additional section, once.
const FIRST: u32 = 1 << 31;
/// The `svc` label between a service and the zone.
const SVC: &[u8] = b"\x03svc";
/// Offset of the question's name in a message (after the header).
const QNAME_AT: u16 = 12;

/// The endpoint names of one service and the addresses naming the service;
/// see the module docs. Immutable once built.
///
/// 48 bytes: a ClusterSetIP service (nine in ten of a fleet) has no
/// endpoint name and one VIP, so the endpoint names are one optional box
/// and one VIP is kept inline. As six boxed slices it was 96 bytes and a
/// heap block for the VIP (docs/benchmarks-history.md, "Packed endpoints,
/// addresses read from records, a slimmer index and reverse map").
#[derive(Debug, Default)]
pub struct Hosts {
    /// `<svc>.<ns>` in lower-case wire form (the service's key).
    service: Box<[u8]>,
    /// Addresses naming the service name (a ClusterSetIP service's VIPs).
    vips: Addresses,
    /// Its endpoint names (a headless service's); `None` when it has none.
    names: Option<Box<Names>>,
    /// The clusters whose clients see the service (centralized mode's
    /// consumer clusters, as `Localities` ids); `None`: everyone. Here
    /// rather than in `ServiceNames` because reverse answers reach a
    /// service only through its `Hosts`.
    consumers: Option<Box<Box<[u16]>>>,
}

/// The endpoint names of a [`Hosts`] and the SRV RRsets that target them.
#[derive(Debug, Default)]
struct Names {
    /// Every name's prefix (its lower-case wire labels in front of the
    /// service name), concatenated, the names in byte order of the prefixes.
    prefixes: Box<[u8]>,
    /// Per name: the end of its prefix in `prefixes`, and the ends of its
    /// IPv4 and of its IPv6 addresses in `addrs`.
    ends: Box<[[u32; 3]]>,
    /// Every name's IPv4 then IPv6 addresses, each family in the order
    /// given, without repeats.
    addrs: Box<[IpAddr]>,
    /// The SRV RRsets whose targets are these names (a headless service's).
    srv: Box<[HostSrv]>,
}

/// The SRV RRset of one name of a headless service (the service name, or a
/// `_<port>._<proto>` name) whose targets are the service's endpoint names
/// in [`Hosts`]: written per query (see the module docs).
#[derive(Debug)]
pub struct HostSrv {
    /// The owner's prefix key (empty for the service name).
    owner: Box<[u8]>,
    /// Per record, in answer order and without repeats: its port, and its
    /// target's index in the names, with [`FIRST`] on the first record of
    /// each target. The same list for two names (one named port) is kept
    /// once.
    records: Arc<[(u16, u32)]>,
    /// The longest target prefix: whether every target fits in another
    /// zone's name (at most 255 bytes).
    longest: u8,
}

impl Hosts {
    /// The names of service `service` (its key's wire bytes): `vips` name
    /// the service, and each of `names` (prefix, addresses), given in byte
    /// order of the prefixes, is an endpoint name.
    pub(crate) fn new<'a>(
        service: &[u8],
        vips: &[IpAddr],
        names: impl IntoIterator<Item = (&'a [u8], &'a [IpAddr])>,
    ) -> Self {
        let mut prefixes = Vec::new();
        let mut ends = Vec::new();
        let mut addrs: Vec<IpAddr> = Vec::new();
        for (prefix, given) in names {
            debug_assert!(ends.is_empty() || prefixes[start_of(&ends, ends.len() - 1)..] < *prefix, "sorted");
            prefixes.extend_from_slice(prefix);
            let mut ends_here = [prefixes.len() as u32, 0, 0];
            for (f, v6) in [false, true].into_iter().enumerate() {
                let first = addrs.len();
                for ip in given.iter().filter(|ip| ip.is_ipv6() == v6) {
                    // The same address twice would be the same record twice.
                    if !addrs[first..].contains(ip) {
                        addrs.push(*ip);
                    }
                }
                ends_here[f + 1] = addrs.len() as u32;
            }
            ends.push(ends_here);
        }
        let mut vips = vips.to_vec();
        let mut seen = Vec::with_capacity(vips.len());
        vips.retain(|ip| {
            !seen.contains(ip) && {
                seen.push(*ip);
                true
            }
        });
        let names = (!ends.is_empty()).then(|| {
            Box::new(Names {
                prefixes: prefixes.into(),
                ends: ends.into(),
                addrs: addrs.into(),
                srv: Box::default(),
            })
        });
        Self { service: service.into(), vips: vips.into(), names, consumers: None }
    }

    /// The same names, seen only by clients of `consumers` (`Localities`
    /// ids; `None`: everyone).
    pub(crate) fn with_consumers(mut self, consumers: Option<Vec<u16>>) -> Self {
        self.consumers = consumers.map(|c| Box::new(c.into_boxed_slice()));
        self
    }

    /// True when a client of `cluster` (its `Localities` id; `None`: a
    /// client of no known cluster) may see the service: no consumer list,
    /// or its cluster is on it. An unknown client sees no restricted
    /// service: it cannot be shown to be a consumer.
    pub fn visible_to(&self, cluster: Option<u16>) -> bool {
        match &self.consumers {
            None => true,
            Some(list) => cluster.is_some_and(|c| list.contains(&c)),
        }
    }

    /// The consumer clusters (`Localities` ids) when the service has a list.
    pub fn consumers(&self) -> Option<&[u16]> {
        self.consumers.as_deref().map(|c| &c[..])
    }

    /// The same names with SRV RRsets: per owner (its prefix key), the
    /// (port, target prefix) of each record in answer order, without
    /// repeats, every target one of the names.
    pub(crate) fn with_srv<'a>(
        mut self,
        sets: impl IntoIterator<Item = (&'a [u8], Vec<(u16, &'a [u8])>)>,
    ) -> Self {
        let mut srv: Vec<HostSrv> = Vec::new();
        for (owner, given) in sets {
            let mut records = Vec::with_capacity(given.len());
            let mut longest = 0;
            let mut seen = vec![false; self.len()];
            for (port, target) in given {
                let Some(i) = self.find(target) else {
                    debug_assert!(false, "an SRV target is one of the names");
                    continue;
                };
                longest = longest.max(target.len());
                let first = !std::mem::replace(&mut seen[i], true);
                records.push((port, i as u32 | if first { FIRST } else { 0 }));
            }
            let records: Arc<[(u16, u32)]> = match srv.iter().find(|s| *s.records == records[..]) {
                Some(same) => same.records.clone(),
                None => records.into(),
            };
            // A prefix is part of a name: at most 255 bytes.
            srv.push(HostSrv { owner: owner.into(), records, longest: longest.min(255) as u8 });
        }
        if !srv.is_empty() {
            self.names.get_or_insert_default().srv = srv.into();
        }
        self
    }

    /// Per name: the ends of its prefix and addresses (`Names::ends`).
    fn ends(&self) -> &[[u32; 3]] {
        self.names.as_ref().map_or(&[], |n| &n.ends)
    }

    /// The SRV RRset of the name `owner` (a prefix key), when its targets
    /// are these names.
    pub fn srv(&self, owner: &[u8]) -> Option<&HostSrv> {
        self.names.as_ref()?.srv.iter().find(|s| *s.owner == *owner)
    }

    /// Number of endpoint names.
    pub fn len(&self) -> usize {
        self.ends().len()
    }

    /// True when there is none.
    pub fn is_empty(&self) -> bool {
        self.ends().is_empty()
    }

    /// The index of the endpoint name whose prefix (lower-case wire labels
    /// in front of the service name) is `prefix`.
    pub fn find(&self, prefix: &[u8]) -> Option<usize> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.prefix(mid).cmp(prefix) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    /// The prefix of name `i`.
    pub fn prefix(&self, i: usize) -> &[u8] {
        let Some(names) = &self.names else { return &[] };
        let end = names.ends.get(i).map_or(0, |e| e[0] as usize);
        names.prefixes.get(start_of(&names.ends, i)..end).unwrap_or(&[])
    }

    /// The addresses of name `i` of one family (0 = IPv4, 1 = IPv6).
    pub fn addresses(&self, i: usize, family: usize) -> &[IpAddr] {
        let Some(names) = &self.names else { return &[] };
        let Some(e) = names.ends.get(i) else { return &[] };
        let start = match (family, i.checked_sub(1).and_then(|p| names.ends.get(p))) {
            (0, Some(prev)) => prev[2] as usize,
            (0, None) => 0,
            _ => e[1] as usize,
        };
        let end = e[1 + family.min(1)] as usize;
        names.addrs.get(start..end).unwrap_or(&[])
    }

    /// Every address this service names with the name it names, the VIPs
    /// first, then each endpoint name's, in order.
    pub(crate) fn ptrs(self: &Arc<Self>) -> impl Iterator<Item = (IpAddr, PtrTarget)> + '_ {
        let vips = self.vips.iter().map(|ip| (*ip, PtrTarget { hosts: self.clone(), index: SERVICE }));
        let names = (0..self.len()).flat_map(move |i| {
            let both = [self.addresses(i, 0), self.addresses(i, 1)];
            both.into_iter()
                .flatten()
                .map(move |ip| (*ip, PtrTarget { hosts: self.clone(), index: i as u32 }))
        });
        vips.chain(names)
    }
}

impl HostSrv {
    /// Number of records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Never true: an SRV RRset has records.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// True when every target, moved to the zone `zone` (wire form), is a
    /// name (at most 255 bytes).
    pub fn fits(&self, hosts: &Hosts, zone: &[u8]) -> bool {
        usize::from(self.longest) + hosts.service.len() + SVC.len() + zone.len() <= 255
    }

    /// Appends record `j`, its target in the zone `zone` (wire form).
    pub fn write(&self, hosts: &Hosts, j: usize, zone: &[u8], ttl: u32, out: &mut Vec<u8>) {
        let mut suffix = [0u8; 255];
        let suffix = target_suffix(hosts, zone, &mut suffix);
        self.write_with(hosts, j, suffix, ttl, out);
    }

    /// Appends record `j`, its target ending in `suffix` (the service,
    /// `svc` and the zone); returns false when it would pass `budget`.
    fn write_within(
        &self,
        hosts: &Hosts,
        j: usize,
        suffix: &[u8],
        ttl: u32,
        out: &mut Vec<u8>,
        budget: usize,
    ) -> bool {
        let Some(&(_, target)) = self.records.get(j) else { return false };
        let prefix = hosts.prefix((target & !FIRST) as usize);
        if out.len() + 18 + prefix.len() + suffix.len() > budget {
            return false;
        }
        self.write_with(hosts, j, suffix, ttl, out);
        true
    }

    fn write_with(&self, hosts: &Hosts, j: usize, suffix: &[u8], ttl: u32, out: &mut Vec<u8>) {
        let Some(&(port, target)) = self.records.get(j) else { return };
        let prefix = hosts.prefix((target & !FIRST) as usize);
        let rdlen = (6 + prefix.len() + suffix.len()) as u16;
        // Identical records must be identical, so the weight depends only
        // on how many records the RRset has (as `names::encode_node`).
        let weight = (100 / self.records.len()).max(1) as u16;
        let mut head = [0xC0, QNAME_AT as u8, 0, 33, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        head[6..10].copy_from_slice(&ttl.to_be_bytes());
        head[10..12].copy_from_slice(&rdlen.to_be_bytes());
        head[14..16].copy_from_slice(&weight.to_be_bytes());
        head[16..18].copy_from_slice(&port.to_be_bytes());
        out.extend_from_slice(&head);
        out.extend_from_slice(prefix);
        out.extend_from_slice(suffix);
    }

    /// Appends the records, as many whole ones as fit in `budget`; returns
    /// (count, all fitted).
    pub fn write_answer(
        &self,
        hosts: &Hosts,
        zone: &[u8],
        ttl: u32,
        out: &mut Vec<u8>,
        budget: usize,
    ) -> (u16, bool) {
        let mut suffix = [0u8; 255];
        let suffix = target_suffix(hosts, zone, &mut suffix);
        for j in 0..self.records.len() {
            if !self.write_within(hosts, j, suffix, ttl, out, budget) {
                return (j as u16, false);
            }
        }
        (self.records.len() as u16, true)
    }

    /// Appends the additional records: each target's A then AAAA records,
    /// in the order of the targets' first records, the owner its prefix
    /// and a pointer to the service name, which starts `svc_at` bytes into
    /// the question; as many whole ones as fit in `budget`. Returns the
    /// count.
    pub fn write_additional(
        &self,
        hosts: &Hosts,
        svc_at: u16,
        ttl: u32,
        out: &mut Vec<u8>,
        budget: usize,
    ) -> u16 {
        let pointer = (0xC000 | (QNAME_AT + svc_at)).to_be_bytes();
        let mut n = 0;
        for &(_, target) in self.records.iter().filter(|(_, t)| t & FIRST != 0) {
            let i = (target & !FIRST) as usize;
            let prefix = hosts.prefix(i);
            for ip in (0..2).flat_map(|f| hosts.addresses(i, f)) {
                let mut record = [0u8; 28];
                record[..2].copy_from_slice(&pointer);
                let len = 2 + rdata_into(*ip, ttl, &mut record[2..]);
                if out.len() + prefix.len() + len > budget {
                    return n;
                }
                out.extend_from_slice(prefix);
                out.extend_from_slice(&record[..len]);
                n += 1;
            }
        }
        n
    }
}

/// The part of every SRV target after its prefix: the service, `svc`, and
/// `zone`, written into `buf`. Targets were checked to fit in a name
/// (`HostSrv::fits`, `names::child`); a longer one is cut, never written past.
fn target_suffix<'b>(hosts: &Hosts, zone: &[u8], buf: &'b mut [u8; 255]) -> &'b [u8] {
    let mut n = 0;
    for part in [&hosts.service[..], SVC, zone] {
        let take = part.len().min(buf.len() - n);
        buf[n..n + take].copy_from_slice(&part[..take]);
        n += take;
    }
    &buf[..n]
}

/// Where name `i`'s prefix starts in `Hosts::prefixes`.
fn start_of(ends: &[[u32; 3]], i: usize) -> usize {
    i.checked_sub(1).and_then(|p| ends.get(p)).map_or(0, |e| e[0] as usize)
}

/// The name a PTR record points to: an endpoint name of a service, or the
/// service name itself. Equal when it is the same name of the same build.
#[derive(Debug, Clone)]
pub struct PtrTarget {
    hosts: Arc<Hosts>,
    index: u32,
}

impl PartialEq for PtrTarget {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.hosts, &other.hosts) && self.index == other.index
    }
}

impl Eq for PtrTarget {}

impl PtrTargetRef<'_> {
    /// Writes the target's wire form (root included) into `out`: its
    /// prefix, the service, `svc`, then `zone` (the apex's wire form);
    /// returns its length.
    fn name_into(self, zone: &[u8], out: &mut [u8; 255]) -> usize {
        let prefix = match self.index {
            SERVICE => &[][..],
            i => self.hosts.prefix(i as usize),
        };
        let mut n = 0;
        for part in [prefix, &self.hosts.service, b"\x03svc", zone] {
            // Built names were checked to be at most 255 bytes (`names::child`).
            let take = part.len().min(out.len() - n);
            out[n..n + take].copy_from_slice(&part[..take]);
            n += take;
        }
        n
    }
}

/// What the reverse name of one address answers: the PTR records of the
/// names it names, in the order they were named. As small as the records
/// it replaces (16 bytes), since the snapshot holds one per address.
#[derive(Debug, Clone)]
pub enum Ptrs {
    /// Named once (nearly every address).
    One(Arc<Hosts>, u32),
    /// Named by several services (a Pod behind two headless services), or
    /// twice by one.
    Many(Arc<Vec<PtrTarget>>),
}

/// The same names of the same builds, in the same order.
impl PartialEq for Ptrs {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len()
            && self
                .targets()
                .zip(other.targets())
                .all(|(a, b)| Arc::ptr_eq(a.hosts, b.hosts) && a.index == b.index)
    }
}

impl Eq for Ptrs {}

impl Ptrs {
    /// The records of `targets`, in order.
    pub(crate) fn of(targets: &[PtrTarget]) -> Option<Self> {
        match targets {
            [] => None,
            [one] => Some(Self::One(one.hosts.clone(), one.index)),
            many => Some(Self::Many(Arc::new(many.to_vec()))),
        }
    }

    /// The targets, in order.
    pub fn targets(&self) -> impl Iterator<Item = PtrTargetRef<'_>> {
        let (one, many) = match self {
            Self::One(hosts, index) => (Some(PtrTargetRef { hosts, index: *index }), &[][..]),
            Self::Many(all) => (None, &all[..]),
        };
        one.into_iter().chain(many.iter().map(|t| PtrTargetRef { hosts: &t.hosts, index: t.index }))
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        match self {
            Self::One(..) => 1,
            Self::Many(all) => all.len(),
        }
    }

    /// Never true: an address named by nothing has no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when `target` is the one name answered.
    pub(crate) fn is_only(&self, target: &PtrTarget) -> bool {
        matches!(self, Self::One(hosts, index) if Arc::ptr_eq(hosts, &target.hosts) && *index == target.index)
    }

    /// The single target, or every target, owned.
    pub(crate) fn to_vec(&self) -> Vec<PtrTarget> {
        self.targets().map(|t| PtrTarget { hosts: t.hosts.clone(), index: t.index }).collect()
    }
}

/// A `PtrTarget` borrowed from a [`Ptrs`].
#[derive(Debug, Clone, Copy)]
pub struct PtrTargetRef<'a> {
    hosts: &'a Arc<Hosts>,
    index: u32,
}

impl PtrTargetRef<'_> {
    /// True when a client of `cluster` may see the service naming it.
    pub fn visible_to(&self, cluster: Option<u16>) -> bool {
        self.hosts.visible_to(cluster)
    }

    /// True when the service naming it is restricted to consumer clusters.
    pub fn restricted(&self) -> bool {
        self.hosts.consumers().is_some()
    }
}

/// Appends the A or AAAA record of `ip` with TTL `ttl`, owned by the
/// question's name.
pub fn write_address(out: &mut Vec<u8>, ip: IpAddr, ttl: u32) {
    out.extend_from_slice(&[0xC0, QNAME_AT as u8]);
    write_rdata(out, ip, ttl);
}

/// Appends what follows the owner of the A or AAAA record of `ip`.
fn write_rdata(out: &mut Vec<u8>, ip: IpAddr, ttl: u32) {
    let mut rest = [0u8; 26];
    let len = rdata_into(ip, ttl, &mut rest);
    out.extend_from_slice(&rest[..len]);
}

/// Writes what follows the owner of the A or AAAA record of `ip` (type,
/// class, TTL, length, address) to the front of `out`; returns its length.
fn rdata_into(ip: IpAddr, ttl: u32, out: &mut [u8]) -> usize {
    let (head, addr): ([u8; 2], &[u8]) = match &ip {
        IpAddr::V4(v4) => ([0, 1], &v4.octets()[..]),
        IpAddr::V6(v6) => ([0, 28], &v6.octets()[..]),
    };
    out[..2].copy_from_slice(&head);
    out[2..4].copy_from_slice(&[0, 1]);
    out[4..8].copy_from_slice(&ttl.to_be_bytes());
    out[8..10].copy_from_slice(&(addr.len() as u16).to_be_bytes());
    out[10..10 + addr.len()].copy_from_slice(addr);
    10 + addr.len()
}

/// Length of the A or AAAA record of `ip`.
pub fn address_len(ip: IpAddr) -> usize {
    if ip.is_ipv4() { 16 } else { 28 }
}

/// The PTR record of `ip` (the question is its reverse name) pointing to
/// `target` in the zone `zone` (wire form), TTL `ttl`, written into `out`
/// unless it would pass `budget`; false then.
pub fn write_ptr(
    out: &mut Vec<u8>,
    ip: IpAddr,
    target: PtrTargetRef<'_>,
    zone: &[u8],
    ttl: u32,
    budget: usize,
) -> bool {
    const HEAD: [u8; 6] = [0xC0, QNAME_AT as u8, 0, 12, 0, 1];
    let prefix = match target.index {
        SERVICE => &[][..],
        i => target.hosts.prefix(i as usize),
    };
    let parts = [prefix, &target.hosts.service, b"\x03svc", zone];
    if !zone.ends_with(b"\x04arpa\x00") {
        // Nothing to compress against (see below): written out in place.
        let rdlen = parts.iter().map(|p| p.len()).sum::<usize>();
        if out.len() + 12 + rdlen > budget {
            return false;
        }
        out.extend_from_slice(&HEAD);
        out.extend_from_slice(&ttl.to_be_bytes());
        out.extend_from_slice(&(rdlen as u16).to_be_bytes());
        for part in parts {
            out.extend_from_slice(part);
        }
        return true;
    }
    let mut name = [0u8; 255];
    let len = target.name_into(zone, &mut name);
    let name = &name[..len];
    // The labels of the target written out, and a pointer to where the rest
    // is in the question, if anywhere. hickory-proto takes the longest
    // suffix (without the root) equal to a suffix of a name already in the
    // message, here the question's: only a zone under `arpa.` can share one.
    let mut written = name.len();
    let mut pointer = None;
    let mut question = [0u8; 74];
    let qlen = reverse_name(ip, &mut question);
    let question = &question[..qlen];
    let mut at = 0;
    while at + 1 < name.len() {
        let suffix = &name[at..name.len() - 1];
        if let Some(q) = label_starts(question).find(|&q| &question[q..qlen - 1] == suffix) {
            written = at;
            pointer = Some(0xC000 | (QNAME_AT + q as u16));
            break;
        }
        at += 1 + usize::from(name[at]);
    }
    let rdlen = written + if pointer.is_some() { 2 } else { 0 };
    if out.len() + 12 + rdlen > budget {
        return false;
    }
    out.extend_from_slice(&HEAD);
    out.extend_from_slice(&ttl.to_be_bytes());
    out.extend_from_slice(&(rdlen as u16).to_be_bytes());
    out.extend_from_slice(&name[..written]);
    if let Some(p) = pointer {
        out.extend_from_slice(&p.to_be_bytes());
    }
    true
}

/// Where each label of the wire name `name` starts.
fn label_starts(name: &[u8]) -> impl Iterator<Item = usize> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        let len = usize::from(*name.get(at)?);
        if len == 0 {
            return None;
        }
        let start = at;
        at += 1 + len;
        Some(start)
    })
}

/// The reverse name of `ip` in wire form, as hickory-proto writes it
/// (`Name::from(IpAddr)`: decimal octets, lower-case hex nibbles); returns
/// its length.
fn reverse_name(ip: IpAddr, out: &mut [u8; 74]) -> usize {
    let mut n = 0;
    let mut push = |bytes: &[u8]| {
        out[n..n + bytes.len()].copy_from_slice(bytes);
        n += bytes.len();
    };
    match ip {
        IpAddr::V4(v4) => {
            for o in v4.octets().into_iter().rev() {
                let digits = [o / 100, o / 10 % 10, o % 10];
                let skip = if o >= 100 {
                    0
                } else if o >= 10 {
                    1
                } else {
                    2
                };
                push(&[(3 - skip) as u8]);
                for d in &digits[skip..] {
                    push(&[b'0' + d]);
                }
            }
            push(b"\x07in-addr\x04arpa\x00");
        }
        IpAddr::V6(v6) => {
            for byte in v6.octets().into_iter().rev() {
                for nibble in [byte & 0xF, byte >> 4] {
                    push(&[1, b"0123456789abcdef"[usize::from(nibble)]]);
                }
            }
            push(b"\x03ip6\x04arpa\x00");
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use hickory_proto::rr::Name;

    use super::*;
    use crate::store::names::{prefix_key, ptr_record};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn hosts() -> Arc<Hosts> {
        let a = prefix_key(&["10-0-0-1", "east"]);
        let b = prefix_key(&["web-0", "west"]);
        let (va, vb) = ([ip("10.0.0.1"), ip("10.0.0.1")], [ip("fd00::1"), ip("10.0.0.2"), ip("fd00::2")]);
        Arc::new(Hosts::new(&prefix_key(&["db", "shop"]), &[], [(&b[..], &vb[..]), (&a[..], &va[..])]))
    }

    #[test]
    fn names_are_found_by_prefix_with_their_addresses_by_family() {
        let h = hosts();
        assert_eq!(h.len(), 2);
        let b = h.find(&prefix_key(&["web-0", "west"])).unwrap();
        assert_eq!(
            (h.addresses(b, 0), h.addresses(b, 1)),
            (&[ip("10.0.0.2")][..], &[ip("fd00::1"), ip("fd00::2")][..])
        );
        let a = h.find(&prefix_key(&["10-0-0-1", "east"])).unwrap();
        assert_eq!(
            (h.addresses(a, 0), h.addresses(a, 1)),
            (&[ip("10.0.0.1")][..], &[][..]),
            "repeats dropped"
        );
        for not in [&prefix_key(&["east"])[..], &prefix_key(&["web-0"]), b"", &prefix_key(&["zz", "west"])] {
            assert_eq!(h.find(not), None);
        }
        let ptrs: Vec<IpAddr> = h.ptrs().map(|(ip, _)| ip).collect();
        // In byte order of the prefixes (a length byte first): web-0's first.
        assert_eq!(ptrs, [ip("10.0.0.2"), ip("fd00::1"), ip("fd00::2"), ip("10.0.0.1")]);
    }

    #[test]
    fn address_records_are_what_the_encoder_writes() {
        let owner = Name::from_str("10-0-0-1.east.db.shop.svc.clusterset.local.").unwrap();
        for addr in [ip("10.1.2.3"), ip("fd00::7")] {
            let rdata = match addr {
                IpAddr::V4(v4) => hickory_proto::rr::RData::A(v4.into()),
                IpAddr::V6(v6) => hickory_proto::rr::RData::AAAA(v6.into()),
            };
            let rtype = rdata.record_type();
            let record = hickory_proto::rr::Record::from_rdata(owner.clone(), 30, rdata);
            let encoded = crate::store::encode::records(&owner, rtype, &[record]).unwrap();
            let mut out = Vec::new();
            write_address(&mut out, addr, 30);
            assert_eq!(out, encoded.get(0));
            assert_eq!(out.len(), address_len(addr));
        }
    }

    #[test]
    fn reverse_names_are_hickorys() {
        for addr in ["0.0.0.0", "10.9.100.255", "1.22.103.4", "fd00::1", "2001:db8::abcd:ef01"] {
            let mut out = [0u8; 74];
            let n = reverse_name(ip(addr), &mut out);
            let name = Name::from(ip(addr));
            let mut wire = Vec::new();
            for l in name.iter() {
                wire.push(l.len() as u8);
                wire.extend_from_slice(l);
            }
            wire.push(0);
            assert_eq!(&out[..n], &wire[..], "{addr}");
        }
    }

    #[test]
    fn ptr_records_are_what_the_encoder_writes_in_any_zone() {
        // Under `arpa.` the target may be compressed against the question.
        for zone in [
            "clusterset.local.",
            "arpa.",
            "in-addr.arpa.",
            "0.10.in-addr.arpa.",
            "ip6.arpa.",
            "d.f.ip6.arpa.",
        ] {
            let origin = Name::from_str(zone).unwrap();
            let mut wire = Vec::new();
            for l in origin.iter() {
                wire.push(l.len() as u8);
                wire.extend_from_slice(l);
            }
            wire.push(0);
            let h = hosts();
            let service = Name::from_str("db.shop.svc.").unwrap().append_name(&origin).unwrap();
            for (addr, target) in h.ptrs() {
                let name = match target.index {
                    SERVICE => service.clone(),
                    i => {
                        let labels: Vec<&str> =
                            if i == 0 { vec!["web-0", "west"] } else { vec!["10-0-0-1", "east"] };
                        Name::from_labels(labels.iter().map(|l| l.as_bytes()))
                            .unwrap()
                            .append_name(&service)
                            .unwrap()
                    }
                };
                let expected = ptr_record(addr, &name, 30).unwrap();
                let mut out = Vec::new();
                let t = PtrTargetRef { hosts: &target.hosts, index: target.index };
                assert!(write_ptr(&mut out, addr, t, &wire, 30, 512));
                assert_eq!(out, expected.get(0), "{addr} in {zone}");
                assert!(!write_ptr(&mut Vec::new(), addr, t, &wire, 30, out.len() - 1), "over the budget");
            }
        }
    }

    #[test]
    fn srv_lists_are_kept_once_and_each_target_is_additional_once() {
        let (a, b) = (prefix_key(&["10-0-0-1", "east"]), prefix_key(&["web-0", "west"]));
        let port = prefix_key(&["_http", "_tcp"]);
        let h = Arc::try_unwrap(hosts()).unwrap().with_srv([
            (&b""[..], vec![(80, &a[..]), (53, &a[..]), (80, &b[..])]),
            (&port[..], vec![(80, &a[..]), (53, &a[..]), (80, &b[..])]),
            (&b"\x04_dns\x04_udp"[..], vec![(53, &a[..])]),
        ]);
        let (bare, http) = (h.srv(b"").unwrap(), h.srv(&port).unwrap());
        assert!(Arc::ptr_eq(&bare.records, &http.records), "one named port: one list");
        assert_eq!(h.srv(b"\x04_dns\x04_udp").map(HostSrv::len), Some(1));
        assert!(h.srv(b"\x03_ftp\x04_tcp").is_none());
        let firsts: Vec<bool> = bare.records.iter().map(|(_, t)| t & FIRST != 0).collect();
        assert_eq!(firsts, [true, false, true]);
        // 10.0.0.1; 10.0.0.2, fd00::1, fd00::2: four additional records.
        let mut out = Vec::new();
        assert_eq!(bare.write_additional(&h, 0, 5, &mut out, usize::MAX), 4);
        // The longest target (14 bytes of prefix, 8 of service, 4 of `svc`)
        // in a zone of 229 bytes is 255 long; one byte more is no name.
        let zone = |last: u8| {
            [
                &[63u8][..],
                &[b'a'; 63],
                &[63],
                &[b'b'; 63],
                &[63],
                &[b'c'; 63],
                &[last],
                &vec![b'd'; last.into()],
                &[0],
            ]
            .concat()
        };
        assert_eq!(zone(35).len(), 229);
        assert!(bare.fits(&h, b"\x05local\x00") && bare.fits(&h, &zone(35)) && !bare.fits(&h, &zone(36)));
    }

    #[test]
    fn a_service_without_endpoint_names_keeps_one_vip_and_no_names_inline() {
        // Service key, one inline VIP, no names, no consumer list: a
        // ClusterSetIP service's 56 bytes (a 72-byte `Arc` block, no other).
        assert_eq!(std::mem::size_of::<Hosts>(), 56);
        let vip = ip("10.0.0.9");
        let h = Arc::new(Hosts::new(&prefix_key(&["web", "shop"]), &[vip, vip], []));
        assert!(h.names.is_none() && h.is_empty() && h.srv(b"").is_none());
        assert_eq!((h.find(b""), h.prefix(0), h.addresses(0, 0)), (None, &[][..], &[][..]));
        let ptrs: Vec<(IpAddr, u32)> = h.ptrs().map(|(ip, t)| (ip, t.index)).collect();
        assert_eq!(ptrs, [(vip, SERVICE)], "repeats dropped");
        let same = Arc::try_unwrap(h).unwrap().with_srv([]);
        assert!(same.names.is_none(), "no SRV RRset of its own names: still none");
    }

    #[test]
    fn ptrs_stay_as_small_as_the_records_they_replace() {
        assert_eq!(std::mem::size_of::<Ptrs>(), 16);
        let h = hosts();
        let all: Vec<PtrTarget> = h.ptrs().map(|(_, t)| t).collect();
        assert_eq!(Ptrs::of(&all[..1]).map(|p| p.len()), Some(1));
        let many = Ptrs::of(&all).unwrap();
        assert_eq!(many.len(), 4);
        assert_eq!(many.to_vec(), all);
        assert_eq!(Ptrs::of(&[]), None);
    }
}
