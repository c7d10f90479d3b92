//! Writing a response: header, echoed question, records copied until the
//! size limit, OPT last with its space reserved up front.

use super::request::{HEADER, Request};
use crate::answer::Answer;
use crate::store::{Records, Snapshot};

const QR: u16 = 0x8000;
const AA: u16 = 0x0400;
const TC: u16 = 0x0200;
/// Flags echoed from the query: opcode, RD, CD.
const ECHOED: u16 = 0x7800 | 0x0100 | 0x0010;
/// Size of our OPT record (root name, no options).
const OPT_LEN: usize = 11;

/// Writes the response to `req` into `out`, never longer than `limit`.
pub(crate) fn write(
    out: &mut Vec<u8>,
    req: &Request<'_>,
    ans: &Answer<'_>,
    snap: &Snapshot,
    max_udp_payload: u16,
    limit: usize,
) {
    out.extend_from_slice(&[0; HEADER]);
    let mut flags = QR | (req.flags & ECHOED) | (ans.rcode.code() & 0xF);
    if ans.authoritative {
        flags |= AA;
    }
    let budget = limit - if req.edns.is_some() { OPT_LEN } else { 0 };
    let mut qd = 0;
    if let Some(q) = req.question.filter(|q| HEADER + q.len() <= budget) {
        out.extend_from_slice(q);
        qd = 1;
    }
    let (an, complete) = copy(out, ans.answer, budget);
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
        ar = copy(out, ans.additional, budget).0;
    }
    if let Some(edns) = req.edns {
        out.push(0); // root
        out.extend_from_slice(&41u16.to_be_bytes());
        out.extend_from_slice(&max_udp_payload.to_be_bytes());
        out.push((ans.rcode.code() >> 4) as u8); // extended RCODE
        out.push(0); // version 0
        out.extend_from_slice(&(if edns.dnssec_ok { 0x8000u16 } else { 0 }).to_be_bytes());
        out.extend_from_slice(&0u16.to_be_bytes());
        ar += 1;
    }
    out[0..2].copy_from_slice(&req.id.to_be_bytes());
    out[2..4].copy_from_slice(&flags.to_be_bytes());
    for (i, count) in [qd, an, ns, ar].into_iter().enumerate() {
        out[4 + 2 * i..6 + 2 * i].copy_from_slice(&count.to_be_bytes());
    }
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
