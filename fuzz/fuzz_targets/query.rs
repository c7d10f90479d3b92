//! Any bytes as a query, over UDP and TCP: the server must never panic, must
//! stay within the transport's size limit, and every response it sends must
//! be a DNS message hickory-proto can read, echoing the query's ID.
#![no_main]

use std::sync::OnceLock;

use clusterset_dns::source::embedded;
use clusterset_dns::store::{self, Reader, SourceId, Update, ZoneConfig};
use clusterset_dns::wire::{Scratch, Transport, WireConfig, respond};
use hickory_proto::op::Message;
use hickory_proto::rr::Name;
use libfuzzer_sys::fuzz_target;

fn reader() -> &'static Reader {
    static READER: OnceLock<Reader> = OnceLock::new();
    READER.get_or_init(|| {
        let (reader, mut writer) = store::new(ZoneConfig {
            origin: Name::from_ascii("clusterset.local.").expect("zone"),
            ttl: 5,
            negative_ttl: 5,
            advertise: vec!["192.0.2.53".parse().expect("ip")],
            answers: store::AnswerConfig::standard(),
            identity: Default::default(),
        });
        let objects = embedded::parse().expect("embedded example").objects;
        writer.apply(Update::Replace { source: SourceId(0), objects });
        writer.publish();
        reader
    })
}

fuzz_target!(|data: &[u8]| {
    let snap = reader().load();
    let cfg = WireConfig { max_udp_payload: 1232 };
    let mut scratch = Scratch::default();
    let mut out = Vec::new();
    for (transport, limit) in [(Transport::Udp, 1232), (Transport::Tcp, 65535)] {
        if respond(&snap, data, transport, &cfg, &mut scratch, &mut out).is_some() {
            assert!(out.len() <= limit, "{} bytes over {transport:?}", out.len());
            let msg = Message::from_vec(&out).expect("the response decodes");
            assert_eq!(msg.metadata.id, u16::from_be_bytes([data[0], data[1]]));
            assert_eq!(msg.metadata.message_type, hickory_proto::op::MessageType::Response);
        } else {
            // Only headerless input and responses are dropped.
            assert!(data.len() < 12 || data[2] & 0x80 != 0);
        }
    }
});
