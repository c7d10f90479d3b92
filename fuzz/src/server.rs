//! The server side every query target drives: the embedded example zone
//! (`zones/`), published once per process, answered through
//! `wire::respond` over UDP and TCP exactly as the listeners call it, with
//! DNS cookies on and the debug answers reachable.

use std::sync::OnceLock;

use std::sync::Arc;

use clusterset_dns::ops::explain::Report;
use clusterset_dns::source::embedded;
use clusterset_dns::store::{self, Reader, SourceId, Update, ZoneConfig};
use clusterset_dns::wire::cookie::CookieSecret;
use clusterset_dns::wire::stats::TransferAsk;
use clusterset_dns::wire::transfer::Transfer;
use clusterset_dns::wire::{DebugAnswers, Scratch, Transport, WireConfig, respond};
use hickory_proto::rr::Name;

/// The cap on UDP responses to EDNS clients, as `serve` configures it by
/// default.
pub const MAX_UDP_PAYLOAD: u16 = 1232;

/// The peer of a transfer: loopback, which `serve` allows to transfer by
/// default (the transfer lists what its queries would find).
const LOOPBACK: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// The zone as `serve` configures it by default (TTL 5).
pub fn zone() -> ZoneConfig {
    ZoneConfig {
        origin: Name::from_ascii("clusterset.local.").expect("zone"),
        ttl: 5,
        negative_ttl: 5,
        advertise: vec!["192.0.2.53".parse().expect("ip")],
        answers: store::AnswerConfig::standard(),
        identity: store::Identity::default(),
        also: None,
    }
}

/// The store holding the embedded example, built on first use.
pub fn reader() -> &'static Reader {
    static READER: OnceLock<Reader> = OnceLock::new();
    READER.get_or_init(|| {
        let (reader, mut writer) = store::new(zone());
        let objects = embedded::parse(Default::default()).expect("embedded example").objects;
        writer.apply(Update::Replace { source: SourceId::Example, objects });
        writer.publish();
        reader
    })
}

/// One answer: the transport and the response bytes, if any.
pub struct Answered {
    /// How the query was sent.
    pub transport: Transport,
    /// What the server sent back; `None` when it sent nothing.
    pub response: Option<Vec<u8>>,
}

/// Answers `packet` over UDP and over TCP.
pub fn answer_both(packet: &[u8]) -> [Answered; 2] {
    let snap = reader().load();
    // As `serve` runs by default: cookies on; and the debug answers (CHAOS
    // TXT of zone names) reachable, since a query without a peer is trusted.
    let cfg = WireConfig {
        max_udp_payload: MAX_UDP_PAYLOAD,
        cookies: CookieSecret::from_hex("000102030405060708090a0b0c0d0e0f").ok(),
        debug: Some(Arc::new(DebugAnswers { allow: Vec::new(), explain: Arc::new(Report) })),
        ..WireConfig::default()
    };
    let mut scratch = Scratch::default();
    [Transport::Udp, Transport::Tcp].map(|transport| {
        let mut out = Vec::new();
        let response = respond(&snap, packet, transport, &cfg, &mut scratch, &mut out).map(|outcome| {
            if outcome.transfer != Some(TransferAsk::Stream) {
                return out;
            }
            // A zone transfer: the TCP connection streams it from here.
            // Every message is checked; the first stands for the response.
            let mut xfr = Transfer::new(Arc::clone(&*snap), packet, MAX_UDP_PAYLOAD, LOOPBACK)
                .expect("an accepted transfer starts");
            let mut first = Vec::new();
            assert!(xfr.next_message(&mut first).expect("first message"), "a transfer has a message");
            let mut next = Vec::new();
            while xfr.next_message(&mut next).expect("next message") {
                assert!(next.len() <= 65535, "{} bytes in one transfer message", next.len());
            }
            first
        });
        Answered { transport, response }
    })
}
