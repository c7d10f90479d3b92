//! Reading a query. The common shape (one question, no compression in it,
//! nothing but an optional OPT after it) is read in place; any other message
//! is parsed by hickory-proto, and its question re-encoded for the echo.
//! Either way the OPT record's options are read by one walker, so both
//! paths hold a query to the same rules.

use hickory_proto::op::Message;
use hickory_proto::rr::Name;
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder, BinEncodable, BinEncoder, NameEncoding};

use super::cookie::{self, ClientCookie};
use crate::answer::Rcode;

/// Header length.
pub(crate) const HEADER: usize = 12;
/// QR: the message is a response.
const QR: u16 = 0x8000;
/// OPT's record type.
const OPT: u16 = 41;
/// Longest domain name in wire form.
const MAX_NAME: usize = 255;

/// EDNS option code of Client Subnet (RFC 7871).
const ECS: u16 = 8;
/// EDNS option code of NSID (RFC 5001).
const NSID: u16 = 3;

/// What the client said in its OPT record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientEdns {
    /// Its UDP payload size.
    pub payload: u16,
    /// Its EDNS version.
    pub version: u8,
    /// The DO bit, which RFC 3225 says to copy into the response.
    pub dnssec_ok: bool,
    /// Its EDNS Client Subnet option, when it sent one.
    pub ecs: Option<ClientSubnet>,
    /// Its COOKIE option (RFC 7873), when it sent one.
    pub cookie: Option<ClientCookie>,
    /// It asked for our NSID (RFC 5001).
    pub nsid: bool,
}

/// An EDNS Client Subnet option (RFC 7871 §6) as the query carried it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientSubnet {
    /// FAMILY: 1 = IPv4, 2 = IPv6.
    pub family: u16,
    /// SOURCE PREFIX-LENGTH: how many leading bits of the address are given.
    pub source_prefix: u8,
    /// ADDRESS, `ceil(source_prefix / 8)` bytes of it used.
    pub addr: [u8; 16],
}

impl ClientSubnet {
    /// The address bytes the option carries.
    pub fn address(&self) -> &[u8] {
        &self.addr[..usize::from(self.source_prefix).div_ceil(8)]
    }

    /// Reads an option's data; `None` when RFC 7871 says FORMERR (§7.2.1:
    /// a wrongly formatted option is rejected; §6 names the ways): an
    /// unknown family (0 included: only 1 and 2 are defined), a prefix
    /// longer than the family's addresses, more or fewer address bytes than
    /// the prefix needs, bits set beyond it, or a SCOPE PREFIX-LENGTH other
    /// than 0, which §6 says a query MUST carry (BIND answers it FORMERR
    /// too). A SOURCE PREFIX-LENGTH of 0 is valid (§7.1.2: the client asks
    /// that no address be used) and its ADDRESS empty.
    fn read(data: &[u8]) -> Option<Self> {
        let family = u16_at(data, 0)?;
        let source_prefix = *data.get(2)?;
        let max = match family {
            1 => 32,
            2 => 128,
            _ => return None,
        };
        // ADDRESS may be empty; SCOPE PREFIX-LENGTH (byte 3) is 0 in queries.
        let (scope, addr_bytes) = (*data.get(3)?, data.get(4..)?);
        if scope != 0 || source_prefix > max || addr_bytes.len() != usize::from(source_prefix).div_ceil(8) {
            return None;
        }
        let rest = source_prefix % 8;
        if rest != 0 && addr_bytes.last().is_some_and(|last| last & (0xFF >> rest) != 0) {
            return None;
        }
        let mut addr = [0; 16];
        addr[..addr_bytes.len()].copy_from_slice(addr_bytes);
        Some(Self { family, source_prefix, addr })
    }
}

/// A query as the response needs it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'p> {
    /// Message ID, echoed.
    pub id: u16,
    /// The query's flags word (opcode, RD and CD are echoed).
    pub flags: u16,
    /// The question section's bytes (QNAME, QTYPE, QCLASS) to echo, when one
    /// could be read.
    pub question: Option<&'p [u8]>,
    /// Length of QNAME within `question`.
    pub qname_len: usize,
    /// QTYPE.
    pub qtype: u16,
    /// QCLASS.
    pub qclass: u16,
    /// The client's EDNS, when it sent an OPT.
    pub edns: Option<ClientEdns>,
    /// Set when the query is answered with an error code without lookup.
    pub error: Option<Rcode>,
}

fn u16_at(p: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*p.get(i)?, *p.get(i + 1)?]))
}

/// Reads a query. `None`: no response at all (fewer than 12 bytes, or QR
/// set: a response is never answered). `slow` holds the re-encoded question
/// when hickory-proto had to parse the message.
pub fn parse<'p>(packet: &'p [u8], slow: &'p mut Vec<u8>) -> Option<Request<'p>> {
    if packet.len() < HEADER {
        return None;
    }
    let id = u16_at(packet, 0)?;
    let flags = u16_at(packet, 2)?;
    if flags & QR != 0 {
        return None;
    }
    let mut req =
        Request { id, flags, question: None, qname_len: 0, qtype: 0, qclass: 0, edns: None, error: None };
    let counts = [u16_at(packet, 4)?, u16_at(packet, 6)?, u16_at(packet, 8)?, u16_at(packet, 10)?];
    let opcode = (flags >> 11) & 0xF;
    match fast(packet, counts) {
        Fast::Done { qname_len, end, edns } => {
            req.question = Some(&packet[HEADER..end]);
            req.qname_len = qname_len;
            req.qtype = u16_at(packet, HEADER + qname_len)?;
            req.qclass = u16_at(packet, HEADER + qname_len + 2)?;
            req.edns = edns;
        }
        Fast::FormErr => req.error = Some(Rcode::FormErr),
        Fast::Slow => slow_path(packet, slow, &mut req),
    }
    if opcode != 0 {
        req.error = Some(Rcode::NotImp);
    } else if req.edns.is_some_and(|e| e.version > 0) {
        // RFC 6891 §6.1.3: a version we do not implement gets BADVERS.
        req.error = Some(Rcode::BadVers);
    }
    Some(req)
}

enum Fast {
    Done { qname_len: usize, end: usize, edns: Option<ClientEdns> },
    FormErr,
    Slow,
}

/// The in-place reader for the common shape.
fn fast(p: &[u8], [qd, an, ns, ar]: [u16; 4]) -> Fast {
    if qd != 1 || an != 0 || ns != 0 || ar > 1 {
        return Fast::Slow;
    }
    let mut i = HEADER;
    loop {
        let Some(&len) = p.get(i) else {
            return Fast::FormErr;
        };
        if len == 0 {
            i += 1;
            break;
        }
        if len & 0xC0 != 0 {
            return Fast::Slow; // compression or an extended label type
        }
        i += 1 + len as usize;
        // RFC 1035 §3.1: at most 255 bytes in wire form, the root's zero
        // byte (still to come) included.
        if i - HEADER >= MAX_NAME {
            return Fast::FormErr;
        }
    }
    let qname_len = i - HEADER;
    let end = i + 4;
    if p.len() < end {
        return Fast::FormErr;
    }
    if ar == 0 {
        return Fast::Done { qname_len, end, edns: None };
    }
    // One additional record: the fast path takes only an OPT for the root.
    let o = end;
    if p.get(o) != Some(&0) || u16_at(p, o + 1) != Some(OPT) {
        return Fast::Slow;
    }
    let (Some(payload), Some(ttl_hi), Some(rdlen)) = (u16_at(p, o + 3), u16_at(p, o + 5), u16_at(p, o + 9))
    else {
        return Fast::FormErr;
    };
    if p.len() < o + 11 + rdlen as usize {
        return Fast::FormErr;
    }
    let dnssec_ok = u16_at(p, o + 7).is_some_and(|f| f & 0x8000 != 0);
    let Ok(Options { ecs, cookie, nsid }) = options(&p[o + 11..o + 11 + rdlen as usize]) else {
        return Fast::FormErr;
    };
    Fast::Done {
        qname_len,
        end,
        edns: Some(ClientEdns { payload, version: (ttl_hi & 0xFF) as u8, dnssec_ok, ecs, cookie, nsid }),
    }
}

/// Walks an OPT record's options in place (on both paths); returns the
/// first Client Subnet and COOKIE options, or `Err` (FORMERR) when an
/// option overruns the data, or any ECS (RFC 7871 §6: each one, not only
/// the first) or COOKIE (RFC 7873 §5.2.2) option is malformed.
fn options(mut rdata: &[u8]) -> Result<Options, ()> {
    let mut found = Options { ecs: None, cookie: None, nsid: false };
    while !rdata.is_empty() {
        let (Some(code), Some(len)) = (u16_at(rdata, 0), u16_at(rdata, 2)) else {
            return Err(());
        };
        let (data, rest) = rdata.get(4..).and_then(|r| r.split_at_checked(usize::from(len))).ok_or(())?;
        match code {
            ECS => {
                let subnet = ClientSubnet::read(data).ok_or(())?;
                found.ecs.get_or_insert(subnet);
            }
            cookie::CODE => {
                let cookie = ClientCookie::read(data).ok_or(())?;
                found.cookie.get_or_insert(cookie);
            }
            // RFC 5001 §2.1: the query's NSID is empty; any payload is ignored.
            NSID => found.nsid = true,
            _ => {}
        }
        rdata = rest;
    }
    Ok(found)
}

/// The EDNS options the answer depends on.
struct Options {
    ecs: Option<ClientSubnet>,
    cookie: Option<ClientCookie>,
    nsid: bool,
}

/// The RDATA of the first OPT record of `packet`, a message hickory-proto
/// has read: its sections are walked again with hickory-proto's readers
/// (names may be compressed), keeping only where that record's bytes are.
fn opt_rdata(packet: &[u8]) -> Option<&[u8]> {
    let mut d = BinDecoder::new(packet);
    d.read_slice(HEADER).ok()?;
    for _ in 0..u16_at(packet, 4)? {
        hickory_proto::op::Query::read(&mut d).ok()?;
    }
    let records = [6, 8, 10].iter().map(|&i| u16_at(packet, i).map(usize::from)).sum::<Option<usize>>()?;
    for _ in 0..records {
        Name::read(&mut d).ok()?;
        let rtype = d.read_u16().ok()?.unverified();
        d.read_slice(6).ok()?; // CLASS, TTL
        let len = d.read_u16().ok()?.unverified();
        let rdata = d.read_slice(usize::from(len)).ok()?.unverified();
        if rtype == OPT {
            return Some(rdata);
        }
    }
    None
}

/// hickory-proto reads what the fast path does not; its question is
/// re-encoded (names in full) so the response can echo it.
fn slow_path<'p>(packet: &[u8], slow: &'p mut Vec<u8>, req: &mut Request<'p>) {
    let Ok(msg) = Message::from_vec(packet) else {
        req.error = Some(Rcode::FormErr);
        return;
    };
    // The options are read from the OPT record's bytes by the in-place
    // reader's walker, not from hickory-proto's reading of them: it keeps
    // COOKIE as an unknown option, reads an ECS's address bytes up to its
    // prefix and ignores the rest, and any SCOPE PREFIX-LENGTH. So both
    // paths hold a query to the same rules (RFC 7871 §6, RFC 7873 §5.2.2).
    req.edns = match (msg.edns.as_ref(), opt_rdata(packet).map(options)) {
        (None, _) => None,
        (Some(e), Some(Ok(Options { ecs, cookie, nsid }))) => Some(ClientEdns {
            payload: e.max_payload(),
            version: e.version(),
            dnssec_ok: e.flags().dnssec_ok,
            ecs,
            cookie,
            nsid,
        }),
        // Malformed options; or no OPT where hickory-proto read one, which
        // cannot be, and is not answered as if it were valid.
        (Some(_), Some(Err(())) | None) => {
            req.error = Some(Rcode::FormErr);
            return;
        }
    };
    let [query] = msg.queries.as_slice() else {
        req.error = Some(Rcode::FormErr);
        return;
    };
    slow.clear();
    let mut enc = BinEncoder::new(slow);
    enc.set_name_encoding(NameEncoding::Uncompressed);
    if query.emit(&mut enc).is_err() {
        req.error = Some(Rcode::FormErr);
        return;
    }
    let question: &'p [u8] = slow;
    let Some(qname_len) = question.len().checked_sub(4) else {
        req.error = Some(Rcode::FormErr);
        return;
    };
    req.question = Some(question);
    req.qname_len = qname_len;
    req.qtype = u16::from(query.query_type());
    req.qclass = u16::from(query.query_class());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_subnet_of_every_short_length_is_rejected_not_a_panic() {
        // The option data that once killed a UDP worker: FAMILY 1, SOURCE 24, nothing else.
        assert_eq!(ClientSubnet::read(&[0, 1, 24]), None);
        for len in 0..4 {
            assert_eq!(ClientSubnet::read(&[0, 1, 0, 0][..len]), None, "{len} bytes");
        }
        // FAMILY 1, SOURCE 0, SCOPE 0, no address: valid (RFC 7871 §6).
        assert_eq!(
            ClientSubnet::read(&[0, 1, 0, 0]).map(|e| e.source_prefix),
            Some(0),
            "a /0 subnet has no address bytes"
        );
        assert!(ClientSubnet::read(&[0, 1, 24, 0, 198, 51, 100]).is_some());
        assert_eq!(ClientSubnet::read(&[0, 1, 23, 0, 198, 51, 101]), None, "bits beyond the prefix");
    }

    #[test]
    fn client_subnets_are_read_as_rfc_7871_says() {
        let source = |data: &[u8]| ClientSubnet::read(data).map(|e| (e.family, e.source_prefix));
        // A prefix longer than its family's addresses.
        assert_eq!(source(&[0, 1, 33, 0, 1, 2, 3, 4, 5]), None, "IPv4 /33");
        assert_eq!(source(&[0, 2, 129, 0].iter().copied().chain([0; 17]).collect::<Vec<_>>()), None);
        // A family that does not match its address: FAMILY 1 with an IPv6
        // address's bytes, or with those of a longer prefix than it says.
        assert_eq!(source(&[[0, 1, 32, 0].as_slice(), &[0x20; 16]].concat()), None, "16 bytes for IPv4");
        assert_eq!(source(&[0, 1, 24, 0, 198, 51, 100, 0]), None, "4 bytes for a /24");
        // Families 1 and 2 only (0 is reserved, not "none").
        for family in [0, 3, 0x2121] {
            let [f0, f1] = u16::to_be_bytes(family);
            assert_eq!(source(&[f0, f1, 0, 0]), None, "family {family}");
        }
        // FAMILY 2 with a short prefix is IPv6 even in 3 bytes.
        assert_eq!(source(&[0, 2, 24, 0, 0x20, 0x01, 0x0d]), Some((2, 24)));
        // A source prefix of 0: valid, no address, in either family.
        assert_eq!(source(&[0, 1, 0, 0]), Some((1, 0)));
        assert_eq!(source(&[0, 2, 0, 0]), Some((2, 0)));
        assert_eq!(source(&[0, 1, 0, 0, 0]), None, "a /0 carries no address byte");
        // SCOPE PREFIX-LENGTH set in a query.
        assert_eq!(source(&[0, 1, 24, 24, 198, 51, 100]), None, "scope 24 in a query");
        assert_eq!(source(&[0, 1, 0, 1]), None, "scope 1 with source 0");
    }

    #[test]
    fn a_malformed_client_subnet_after_a_valid_one_is_rejected() {
        // Found by the differential fuzz target: only the first ECS option
        // was checked, so a bad second one was answered instead of FORMERR.
        let v4_24 = [0, 8, 0, 7, 0, 1, 24, 0, 198, 51, 100];
        let bad = [0, 8, 0, 4, 0x21, 0x21, 0, 0];
        assert!(options(&[v4_24.as_slice(), &bad].concat()).is_err());
        let both = options(&[v4_24.as_slice(), &v4_24].concat());
        assert_eq!(
            both.map(|o| o.ecs.map(|e| e.source_prefix)),
            Ok(Some(24)),
            "two valid ones: the first is used"
        );
    }
}
