//! Any bytes as a query, over UDP and TCP: the server must never panic, must
//! stay within the transport's size limit, and every response it sends must
//! be a DNS message hickory-proto can read, echoing the query's ID.
#![no_main]

use clusterset_dns::wire::Transport;
use clusterset_dns_fuzz::server::answer_both;
use hickory_proto::op::{Message, MessageType};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for a in answer_both(data) {
        let limit = match a.transport {
            Transport::Udp => 1232,
            Transport::Tcp => 65535,
        };
        if let Some(out) = a.response {
            assert!(out.len() <= limit, "{} bytes over {:?}", out.len(), a.transport);
            let msg = Message::from_vec(&out).expect("the response decodes");
            assert_eq!(msg.metadata.id, u16::from_be_bytes([data[0], data[1]]));
            assert_eq!(msg.metadata.message_type, MessageType::Response);
        } else {
            // Only headerless input and responses are dropped.
            assert!(data.len() < 12 || data[2] & 0x80 != 0);
        }
    }
});
