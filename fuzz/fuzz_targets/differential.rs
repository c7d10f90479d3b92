//! Our query parser against hickory-proto's, on queries built from the
//! model ([`Query`]). When hickory reads the query as a valid message, our
//! response must decode, echo the ID and the question (name compared
//! case-insensitively, type, class) and fit what the client allows; when
//! hickory rejects it, we answer FORMERR (NOTIMP for an unknown opcode, which
//! RFC 1035 §4.1.1 lets a server say without reading further) or nothing, and
//! never a NOERROR with records.
#![no_main]

use clusterset_dns::wire::Transport;
use clusterset_dns_fuzz::query::Query;
use clusterset_dns_fuzz::server::{MAX_UDP_PAYLOAD, answer_both};
use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::Name;
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};
use libfuzzer_sys::fuzz_target;

/// Whether an OPT record of `packet` (which hickory read as `msg`) has
/// options hickory-proto accepts but the RFCs call malformed:
/// - an option whose OPTION-LENGTH runs past the RDATA, or a header cut
///   short (RFC 6891 §6.1.2: the options fill RDLENGTH exactly; hickory
///   checks an option's length against the whole RDATA, not what is left);
/// - an EDNS Client Subnet option with an unknown family, a source prefix
///   longer than the family's addresses, more or fewer address bytes than
///   the prefix needs, or bits set beyond it (RFC 7871 §6: SHOULD FORMERR;
///   hickory reads the bytes it needs and ignores the rest), or a SCOPE
///   PREFIX-LENGTH other than 0 (§6: MUST be 0 in queries; §7.2.1: a
///   wrongly formatted option gets FORMERR; hickory reads any);
/// - a COOKIE option of other than 8 or 16-40 bytes (RFC 7873 §5.2.2).
fn malformed_edns(packet: &[u8], msg: &Message) -> bool {
    let mut d = BinDecoder::new(packet);
    let Ok(_) = d.read_slice(12) else { return false };
    for _ in &msg.queries {
        let Ok(_) = hickory_proto::op::Query::read(&mut d) else { return false };
    }
    let records =
        [6, 8, 10].map(|i| usize::from(u16::from_be_bytes([packet[i], packet[i + 1]]))).iter().sum();
    for _ in 0..records {
        let (Ok(_), Ok(rtype), Ok(_), Ok(_), Ok(len)) =
            (Name::read(&mut d), d.read_u16(), d.read_u16(), d.read_u32(), d.read_u16())
        else {
            return false;
        };
        let Ok(rdata) = d.read_slice(usize::from(len.unverified())) else { return false };
        let mut rdata = rdata.unverified();
        if rtype.unverified() != 41 {
            continue;
        }
        while !rdata.is_empty() {
            let [c0, c1, l0, l1, rest @ ..] = rdata else { return true };
            let (code, len) = (u16::from_be_bytes([*c0, *c1]), usize::from(u16::from_be_bytes([*l0, *l1])));
            let Some((data, next)) = rest.split_at_checked(len) else { return true };
            if code == 8 && !valid_subnet(data) {
                return true;
            }
            // RFC 7873 §5.2.2: a COOKIE of other than 8 or 16-40 bytes is
            // FORMERR; hickory-proto keeps it as an unknown option.
            if code == 10 && !(data.len() == 8 || (16..=40).contains(&data.len())) {
                return true;
            }
            rdata = next;
        }
    }
    false
}

/// RFC 7871 §6's rules for an ECS option's data in a query.
fn valid_subnet(data: &[u8]) -> bool {
    let [f0, f1, source, scope, address @ ..] = data else { return false };
    let max = match u16::from_be_bytes([*f0, *f1]) {
        1 => 32,
        2 => 128,
        _ => return false,
    };
    let source = usize::from(*source);
    let bits_beyond = match (source % 8, address.last()) {
        (0, _) | (_, None) => false,
        (used, Some(last)) => last & (0xFF >> used) != 0,
    };
    *scope == 0 && source <= max && address.len() == source.div_ceil(8) && !bits_beyond
}

fuzz_target!(|q: Query| {
    let packet = q.wire();
    let theirs = Message::from_vec(&packet);
    for a in answer_both(&packet) {
        let t = a.transport;
        let Some(out) = a.response else {
            // RFC 1035 §4.1.1: QR set means a response; never answered.
            assert!(q.is_response(), "no response over {t:?}");
            continue;
        };
        let ours = Message::from_vec(&out).expect("our response decodes");
        assert_eq!(ours.metadata.id, q.id, "ID echoed over {t:?}");
        let rcode = ours.metadata.response_code;
        match &theirs {
            Ok(query) => {
                let limit = match (t, &query.edns) {
                    (Transport::Tcp, _) => 65535,
                    (Transport::Udp, None) => 512,
                    (Transport::Udp, Some(e)) => usize::from(e.max_payload().clamp(512, MAX_UDP_PAYLOAD)),
                };
                assert!(out.len() <= limit, "{} bytes over {t:?}, the client allows {limit}", out.len());
                // EDNS options the RFCs call malformed and hickory-proto reads
                // anyway get FORMERR (without the question) from us.
                let edns_formerr = rcode == ResponseCode::FormErr && malformed_edns(&packet, query);
                // Only QUERY's format is ours to read (RFC 1035 §4.1.1); another
                // opcode gets NOTIMP, with the question when it was readable.
                let opcode_query = packet[2] & 0x78 == 0;
                if let ([question], false, true) = (query.queries.as_slice(), edns_formerr, opcode_query) {
                    let [echo] = ours.queries.as_slice() else {
                        panic!("question not echoed over {t:?}: {rcode:?}");
                    };
                    assert_eq!(echo.name().to_lowercase(), question.name().to_lowercase(), "QNAME echoed");
                    assert_eq!(echo.query_type(), question.query_type(), "QTYPE echoed");
                    assert_eq!(echo.query_class(), question.query_class(), "QCLASS echoed");
                }
            }
            Err(_) => {
                let allowed = rcode == ResponseCode::FormErr
                    || (rcode == ResponseCode::NotImp && packet[2] & 0x78 != 0);
                assert!(allowed, "hickory rejects the query, we answered {rcode:?} over {t:?}");
                assert!(ours.answers.is_empty(), "records for a query hickory rejects");
            }
        }
    }
});
