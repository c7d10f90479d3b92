//! The zone as a zone transfer lists it (RFC 5936): every name of one
//! snapshot with every record it can answer, decoded back from the
//! pre-encoded answers by hickory-proto.
//!
//! The snapshot keeps only wire bytes (each record placed behind a question
//! for its owner, see `snapshot`), so a transfer rebuilds the owner name
//! from the keys and lets hickory-proto read each record behind it: no
//! second copy of the zone is kept for a rare operation, and what is
//! transferred is exactly what is answered. Balanced A/AAAA sets are listed
//! whole (the answer policy picks from them per query), and additional
//! records are left out: each is listed under its own name.

use std::sync::Arc;

use hickory_proto::rr::{Name, Record};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};

use super::hosts::{HostSrv, Hosts};
use super::records::NameNode;
use super::snapshot::Snapshot;
use super::wire_key::WireKey;

/// SOA's record type.
const SOA: u16 = 6;
/// Length of the DNS header the records were encoded behind.
const HEADER_LEN: usize = 12;

/// Walks one snapshot name by name for a zone transfer: first the names
/// outside any service, then each service's names, in DNS canonical order
/// of the service names, so two transfers of the same data are identical.
pub struct ZoneWalk {
    snap: Arc<Snapshot>,
    /// Service keys (`<svc>.<ns>` wire bytes), in the order listed.
    services: Vec<WireKey>,
    /// Next service to list; `None` until the zone's own names are listed.
    next: Option<usize>,
}

impl ZoneWalk {
    /// Starts a walk of `snap` for a client of `cluster` (a `Localities`
    /// id; `None`: unknown): services restricted to consumer clusters it is
    /// not one of are left out, as its queries would not find them. The
    /// snapshot is held until the walk is dropped, so every message of a
    /// transfer comes from it.
    pub fn new(snap: Arc<Snapshot>, cluster: Option<u16>) -> Self {
        let mut keyed: Vec<(Name, WireKey)> = snap
            .services
            .iter()
            .filter(|(_, s)| s.hosts.visible_to(cluster))
            .map(|(k, _)| (name_of(&[k, b"\0".as_slice()]).unwrap_or_default(), k.clone()))
            .collect();
        keyed.sort_by(|a, b| a.0.cmp(&b.0));
        Self { snap, services: keyed.into_iter().map(|(_, k)| k).collect(), next: None }
    }

    /// The snapshot being walked.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snap
    }

    /// The apex SOA: the first and the last record of a transfer.
    pub fn soa(&self) -> Option<Record> {
        let apex = self.snap.zone_names.get(&[][..])?.get(SOA)?;
        decode(&self.snap.zone().wire, apex.answer.get(0))
    }

    /// Appends the records of the next group of names (the names outside
    /// services, then one service at a time) to `out`, the apex SOA left
    /// out. False once every name has been listed. A record hickory-proto
    /// cannot read back (none should exist) is left out.
    pub fn next_group(&mut self, out: &mut Vec<Record>) -> bool {
        let zone = &self.snap.zone().wire;
        let Some(i) = self.next else {
            let mut names: Vec<(Name, &[u8], &NameNode)> = self
                .snap
                .zone_names
                .iter()
                .filter_map(|(prefix, node)| Some((name_of(&[prefix, zone])?, &prefix[..], node)))
                .collect();
            names.sort_by(|a, b| a.0.cmp(&b.0));
            for (_, prefix, node) in names {
                let owner = [prefix, zone].concat();
                node_records(&owner, node, prefix.is_empty(), None, out);
            }
            self.next = Some(0);
            return true;
        };
        let Some(key) = self.services.get(i) else {
            return false;
        };
        self.next = Some(i + 1);
        let Some(service) = self.snap.services.get(&key[..]) else {
            return true;
        };
        let base = [&key[..], b"\x03svc", zone].concat();
        // Nodes, and endpoint names (`None`: their records are written per
        // query, so here too).
        let hosts = &service.hosts;
        let mut names: Vec<(Name, &[u8], Option<&NameNode>)> = service
            .names
            .iter()
            .map(|(prefix, node)| (prefix, Some(node)))
            .chain((0..hosts.len()).map(|i| (hosts.prefix(i), None)))
            .filter_map(|(prefix, node)| Some((name_of(&[prefix, &base])?, prefix, node)))
            .collect();
        names.sort_by(|a, b| a.0.cmp(&b.0));
        let ttl = self.snap.zone().config.ttl;
        for (_, prefix, node) in names {
            let owner = [prefix, &base].concat();
            match node {
                Some(node) => {
                    let srv = hosts.srv(prefix).map(|srv| (&**hosts, srv, &zone[..], ttl));
                    node_records(&owner, node, false, srv, out)
                }
                None => {
                    let Some(i) = hosts.find(prefix) else { continue };
                    for ip in (0..2).flat_map(|f| hosts.addresses(i, f)) {
                        let mut bytes = Vec::new();
                        super::hosts::write_address(&mut bytes, *ip, ttl);
                        out.extend(decode(&owner, &bytes));
                    }
                }
            }
        }
        true
    }
}

/// Every answer record of `node`, owned by `owner` (wire form); the apex
/// SOA is skipped at the apex (it opens and closes the transfer). An SRV
/// RRset written per query is written from `srv` (its endpoint names, the
/// RRset, the zone and TTL) here too.
fn node_records(
    owner: &[u8],
    node: &NameNode,
    apex: bool,
    srv: Option<(&Hosts, &HostSrv, &[u8], u32)>,
    out: &mut Vec<Record>,
) {
    for set in node.sets.iter().filter(|s| !(apex && s.rtype == SOA)) {
        match srv {
            Some((hosts, srv, zone, ttl)) if set.from_hosts => {
                for j in 0..srv.len() {
                    let mut bytes = Vec::new();
                    srv.write(hosts, j, zone, ttl, &mut bytes);
                    out.extend(decode(owner, &bytes));
                }
            }
            _ => out.extend((0..set.answer.len()).filter_map(|i| decode(owner, set.answer.get(i)))),
        }
    }
}

/// Reads the record `bytes`, encoded behind a question for `owner`
/// (lower-case wire form), back into a hickory-proto record.
fn decode(owner: &[u8], bytes: &[u8]) -> Option<Record> {
    let mut buf = Vec::with_capacity(HEADER_LEN + owner.len() + 4 + bytes.len());
    buf.extend_from_slice(&[0; HEADER_LEN]);
    buf.extend_from_slice(owner);
    // QTYPE and QCLASS: not read; only their room matters for the pointers.
    buf.extend_from_slice(&[0, 1, 0, 1]);
    let start = buf.len();
    buf.extend_from_slice(bytes);
    let mut decoder = BinDecoder::new(&buf);
    decoder.read_slice(start).ok()?;
    Record::read(&mut decoder).ok()
}

/// The name whose wire form is the concatenation of `parts`.
fn name_of(parts: &[&[u8]]) -> Option<Name> {
    let wire = parts.concat();
    let mut labels = Vec::new();
    let mut i = 0;
    while let Some(&len) = wire.get(i) {
        if len == 0 {
            break;
        }
        labels.push(wire.get(i + 1..i + 1 + usize::from(len))?);
        i += 1 + usize::from(len);
    }
    let mut name = Name::from_labels(labels).ok()?;
    name.set_fqdn(true);
    Some(name)
}
