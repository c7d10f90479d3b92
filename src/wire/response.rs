//! Writing a response: header, echoed question, records copied until the
//! size limit, OPT last with its space reserved up front.

use super::cookie::{self, SERVER_LEN};
use super::request::{ClientEdns, HEADER, Request};
use crate::answer::{Answer, Pick, Synth};
use crate::store::{self, Records, Snapshot};

const QR: u16 = 0x8000;
const AA: u16 = 0x0400;
const TC: u16 = 0x0200;
/// Flags echoed from the query: opcode, RD, CD.
const ECHOED: u16 = 0x7800 | 0x0100 | 0x0010;
/// Size of our OPT record (root name, no options).
const OPT_LEN: usize = 11;
/// Option code and length, family, source and scope prefix of an ECS option.
const ECS_FIXED: usize = 8;

/// What the response needs besides the answer: the records a policy
/// listed, and the ECS scope to echo.
pub(crate) struct Written<'a> {
    pub(crate) picks: &'a [u32],
    pub(crate) ecs_scope: u8,
    /// The COOKIE option to send: the client's cookie and our server cookie.
    pub(crate) cookie: Option<(&'a [u8], &'a [u8; SERVER_LEN])>,
    /// Send TC and no records (a rate-limited response that slips).
    pub(crate) truncate: bool,
    /// The NSID option's payload (our server id), when the query asked.
    pub(crate) nsid: Option<&'a [u8]>,
}

/// Writes the response to `req` into `out`, never longer than `limit`.
pub(crate) fn write(
    out: &mut Vec<u8>,
    req: &Request<'_>,
    ans: &Answer<'_>,
    snap: &Snapshot,
    max_udp_payload: u16,
    limit: usize,
    extra: &Written<'_>,
) {
    out.extend_from_slice(&[0; HEADER]);
    let mut flags = QR | (req.flags & ECHOED) | (ans.rcode.code() & 0xF);
    if ans.authoritative {
        flags |= AA;
    }
    let budget = limit - opt_len(req.edns, extra);
    let mut qd = 0;
    if let Some(q) = req.question.filter(|q| HEADER + q.len() <= budget) {
        out.extend_from_slice(q);
        qd = 1;
    }
    let (an, complete) = match (ans.pick, ans.synth) {
        _ if extra.truncate => (0, false),
        (_, Some(synth)) => synthesize(out, synth, snap, budget),
        (pick, None) => match pick {
            Pick::All => copy(out, ans.answer, budget),
            Pick::Rotate(first) => rotate(out, ans.answer, first as usize, budget),
            Pick::Listed => listed(out, ans.answer, extra.picks, budget),
        },
    };
    let mut ns = 0;
    let mut ar = 0;
    if !complete {
        // RFC 2181 §9: TC when the answer itself did not fit; what did fit
        // is sent, whole records only.
        flags |= TC;
    } else {
        if let Some(apex) = ans.soa_owner {
            let soa = &snap.negative_soa;
            if out.len() + 2 + soa.len() <= budget {
                out.extend_from_slice(&(0xC000 | (HEADER as u16 + apex)).to_be_bytes());
                out.extend_from_slice(soa);
                ns = 1;
            } else {
                flags |= TC;
            }
        }
        // Additional records are optional; missing ones do not set TC.
        ar = match (ans.synth, ans.additional_shift) {
            (Some(Synth::Srv { hosts, srv, svc_at, .. }), _) => {
                srv.write_additional(hosts, svc_at, snap.zone().config.ttl, out, budget)
            }
            (_, 0) => copy(out, ans.additional, budget).0,
            (_, shift) => copy_shifted(out, ans.additional, shift, budget),
        };
    }
    if let Some(edns) = req.edns {
        write_opt(out, edns, ans.rcode.code(), max_udp_payload, extra);
        ar += 1;
    }
    out[0..2].copy_from_slice(&req.id.to_be_bytes());
    out[2..4].copy_from_slice(&flags.to_be_bytes());
    for (i, count) in [qd, an, ns, ar].into_iter().enumerate() {
        out[4 + 2 * i..6 + 2 * i].copy_from_slice(&count.to_be_bytes());
    }
}

/// The size of our OPT record with the options it will carry (none
/// without the client's OPT): reserved before any record is written.
#[inline]
fn opt_len(edns: Option<ClientEdns>, extra: &Written<'_>) -> usize {
    let Some(edns) = edns else { return 0 };
    OPT_LEN
        + edns.ecs.map_or(0, |e| ECS_FIXED + e.address().len())
        + extra.cookie.map_or(0, |(c, s)| 4 + c.len() + s.len())
        + extra.nsid.map_or(0, |id| 4 + id.len())
}

/// Writes our OPT record, answering the client's (`edns`): the extended
/// bits of `rcode`, the DO bit copied, and the ECS, COOKIE and NSID options
/// `extra` says.
#[inline]
fn write_opt(out: &mut Vec<u8>, edns: ClientEdns, rcode: u16, max_udp_payload: u16, extra: &Written<'_>) {
    out.push(0); // root
    out.extend_from_slice(&41u16.to_be_bytes());
    out.extend_from_slice(&max_udp_payload.to_be_bytes());
    out.push((rcode >> 4) as u8); // extended RCODE
    out.push(0); // version 0
    out.extend_from_slice(&(if edns.dnssec_ok { 0x8000u16 } else { 0 }).to_be_bytes());
    let rdlen_at = out.len();
    out.extend_from_slice(&0u16.to_be_bytes());
    if let Some(e) = edns.ecs {
        // RFC 7871 §7.2.1: echo FAMILY, SOURCE PREFIX-LENGTH and
        // ADDRESS; SCOPE PREFIX-LENGTH says how far the answer holds.
        let addr = e.address();
        out.extend_from_slice(&8u16.to_be_bytes());
        out.extend_from_slice(&((4 + addr.len()) as u16).to_be_bytes());
        out.extend_from_slice(&e.family.to_be_bytes());
        out.push(e.source_prefix);
        out.push(extra.ecs_scope);
        out.extend_from_slice(addr);
    }
    if let Some((client, server)) = extra.cookie {
        // RFC 7873 §5.2: the client's cookie and ours.
        out.extend_from_slice(&cookie::CODE.to_be_bytes());
        out.extend_from_slice(&((client.len() + server.len()) as u16).to_be_bytes());
        out.extend_from_slice(client);
        out.extend_from_slice(server);
    }
    if let Some(id) = extra.nsid {
        // RFC 5001 §2.2: the server's identifier, opaque bytes.
        out.extend_from_slice(&3u16.to_be_bytes());
        out.extend_from_slice(&(id.len() as u16).to_be_bytes());
        out.extend_from_slice(id);
    }
    let rdlen = (out.len() - rdlen_at - 2) as u16;
    out[rdlen_at..rdlen_at + 2].copy_from_slice(&rdlen.to_be_bytes());
}

/// Writes the records of `synth`, as many whole ones as fit; returns
/// (count, all fitted).
fn synthesize(out: &mut Vec<u8>, synth: Synth<'_>, snap: &Snapshot, budget: usize) -> (u16, bool) {
    let zone = snap.zone();
    let ttl = zone.config.ttl;
    match synth {
        Synth::Addresses(addrs) => {
            for (j, ip) in addrs.iter().enumerate() {
                if out.len() + store::address_len(*ip) > budget {
                    return (j as u16, false);
                }
                store::write_address(out, *ip, ttl);
            }
            (addrs.len() as u16, true)
        }
        Synth::Ptr(ip, ptrs, cluster) => {
            let mut written = 0;
            for target in ptrs.targets().filter(|t| t.visible_to(cluster)) {
                if !store::write_ptr(out, ip, target, &zone.wire, ttl, budget) {
                    return (written, false);
                }
                written += 1;
            }
            (written, true)
        }
        Synth::Srv { hosts, srv, zone, .. } => srv.write_answer(hosts, zone, ttl, out, budget),
    }
}

/// Copies every record starting at `first` and wrapping around, as many
/// whole records as fit; returns (count, all fitted).
fn rotate(out: &mut Vec<u8>, records: Option<&Records>, first: usize, budget: usize) -> (u16, bool) {
    let Some(records) = records else {
        return (0, true);
    };
    let n = records.len();
    if first == 0 || first >= n {
        return copy(out, Some(records), budget);
    }
    let bytes = records.bytes();
    let split = records.start(first);
    if out.len() + bytes.len() <= budget {
        // Two copies: the tail from `first`, then the head.
        out.extend_from_slice(&bytes[split..]);
        out.extend_from_slice(&bytes[..split]);
        return (n as u16, true);
    }
    for j in 0..n {
        let r = records.get((first + j) % n);
        if out.len() + r.len() > budget {
            return (j as u16, false);
        }
        out.extend_from_slice(r);
    }
    (n as u16, true)
}

/// Copies the listed records, as many whole ones as fit.
fn listed(out: &mut Vec<u8>, records: Option<&Records>, picks: &[u32], budget: usize) -> (u16, bool) {
    let Some(records) = records else {
        return (0, true);
    };
    for (j, &i) in picks.iter().enumerate() {
        let r = records.get(i as usize);
        if out.len() + r.len() > budget {
            return (j as u16, false);
        }
        out.extend_from_slice(r);
    }
    (picks.len() as u16, true)
}

/// Copies as many whole records as fit, each owner's closing pointer
/// moved `shift` bytes on (`Records::push_shifted`); returns the count.
fn copy_shifted(out: &mut Vec<u8>, records: Option<&Records>, shift: u16, budget: usize) -> u16 {
    let Some(records) = records else {
        return 0;
    };
    for i in 0..records.len() {
        if out.len() + records.get(i).len() > budget {
            return i as u16;
        }
        records.push_shifted(i, shift, out);
    }
    records.len() as u16
}

/// Copies as many whole records as fit; returns (count, all fitted).
fn copy(out: &mut Vec<u8>, records: Option<&Records>, budget: usize) -> (u16, bool) {
    let Some(records) = records else {
        return (0, true);
    };
    if out.len() + records.bytes().len() <= budget {
        out.extend_from_slice(records.bytes());
        return (records.len() as u16, true);
    }
    for i in 0..records.len() {
        let r = records.get(i);
        if out.len() + r.len() > budget {
            return (i as u16, false);
        }
        out.extend_from_slice(r);
    }
    (records.len() as u16, true)
}
