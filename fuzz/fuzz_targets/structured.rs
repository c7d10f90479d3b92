//! Queries built from a model ([`Query`]) rather than raw bytes, so the
//! fuzzer reaches every part of the query path: any header bits, opcode and
//! (lying) section counts, names that mostly hit the embedded zone, any
//! class and type, any number of OPT records with options of every code and
//! (lying) lengths, trailing garbage. Over UDP and TCP the server must never
//! panic, must answer every query and no response, and every response must
//! decode, echo the ID and OPCODE, and stay within the transport's limit:
//! 512 bytes over UDP when it carries no OPT (RFC 6891 §7: without EDNS the
//! classic limit holds), which it must not when hickory-proto reads the
//! query without one.
#![no_main]

use clusterset_dns::wire::Transport;
use clusterset_dns_fuzz::query::Query;
use clusterset_dns_fuzz::server::{MAX_UDP_PAYLOAD, answer_both};
use hickory_proto::op::{Message, MessageType};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|q: Query| {
    let packet = q.wire();
    for a in answer_both(&packet) {
        let t = a.transport;
        let Some(out) = a.response else {
            assert!(q.is_response(), "a query over {t:?} got no response");
            continue;
        };
        assert!(!q.is_response(), "a response was answered over {t:?}");
        let msg = Message::from_vec(&out).expect("the response decodes");
        assert_eq!(msg.metadata.id, q.id);
        assert_eq!(msg.metadata.message_type, MessageType::Response);
        assert_eq!(out[2] & 0x78, packet[2] & 0x78, "OPCODE echoed");
        let limit = match (t, &msg.edns) {
            (Transport::Tcp, _) => 65535,
            (Transport::Udp, None) => 512,
            (Transport::Udp, Some(_)) => usize::from(MAX_UDP_PAYLOAD),
        };
        assert!(out.len() <= limit, "{} bytes over {t:?}", out.len());
        // Whether the query has an OPT is what a parser finds, not what the
        // model meant: lying counts and trailing bytes can make one.
        if Message::from_vec(&packet).is_ok_and(|m| m.edns.is_none()) {
            assert!(msg.edns.is_none(), "an OPT in the response to a query without one");
        }
    }
});
